#!/usr/bin/env python3
"""Generate the seed corpora of the text fuzz targets from real files (standard library only).

Usage (from the repo root):  python3 fuzz/gen-text-seeds.py [TARGET ...]
TARGET is any of tokenizer_json, chat_template, template_source, request_bodies, output_parsers,
config_json (default: all); seeds go to fuzz/corpus/<TARGET>. Re-runnable and deterministic.

Sources ($VELA_CACHE, default ~/.cache/vela; missing sources are skipped with a note):
  tokenizer_json  the tokenizer.json files of hf-tokenizers/{llama3,qwen3,gemma3} shrunk to a few
                  hundred tokens (every byte token kept, merges and added tokens cut to match),
                  plus tiny hand-made BPE / WordLevel / WordPiece / Unigram tokenizers; each
                  followed by NUL and a payload of text and token ids.
  chat_template   choice streams (the target builds messages from bytes) for every template of
                  llama.cpp's models/templates, three per template.
  template_source every template of llama.cpp's models/templates as it is, and cut at a few
                  points (the target renders the bytes as a template's source).
  request_bodies  OpenAI chat, completions and responses and Anthropic messages bodies built from the
                  conversations of golden/templates/manifest.json and the tool-call fixtures,
                  plus the rejected-request cases of scripts/test-server.py.
  output_parsers  model outputs from the tool-call fixtures' recorded answers and the string
                  literals of the server's parser tests, under several parser configurations.
  config_json     every config.json under golden/, and the scalar metadata of the GGUF models in
                  models/ and llama.cpp's vocab files as JSON objects (GGUF-only architectures).
"""
import json
import os
import random
import re
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"
CACHE = Path(os.environ.get("VELA_CACHE", Path.home() / ".cache" / "vela"))
LLAMA = CACHE / "llama-cpp-python" / "vendor" / "llama.cpp" / "models"
GOLDEN = CACHE / "golden"
rng = random.Random(1234)


def out_dir(target):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    return d


def note(msg):
    print(f"  note: {msg}", file=sys.stderr)


def byte_chars():
    """GPT-2's byte -> printable character map."""
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


# ---------------------------------------------------------------- tokenizer_json

def shrink_tokenizer(tj, keep=400, n_merges=300, n_added=16):
    model = tj.get("model", {})
    vocab = model.get("vocab")
    if isinstance(vocab, dict):
        byte_set = set(byte_chars().values())
        kept = {t: i for t, i in vocab.items() if i < keep or t in byte_set
                or re.fullmatch(r"<0x[0-9A-F]{2}>", t)}
        model["vocab"] = kept
        merges = []
        for m in model.get("merges", []):
            a, b = m.split(" ", 1) if isinstance(m, str) else m
            if a in kept and b in kept and (a + b) in kept:
                merges.append(m)
            if len(merges) >= n_merges:
                break
        model["merges"] = merges
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...]
        model["vocab"] = vocab[:keep]
    tj["added_tokens"] = [t for t in tj.get("added_tokens", [])][:n_added]
    return tj


def tiny_tokenizers():
    bc = byte_chars()
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    vocab = {bc[b]: b for b in range(256)}
    for i, (a, b) in enumerate([("h", "e"), ("l", "l"), ("he", "ll"), ("Ġ", "w")]):
        vocab[a + b] = 256 + i
    base = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
            "normalizer": None, "post_processor": None}
    yield "bytebpe", {**base, "pre_tokenizer": bl, "decoder": bl,
                      "model": {"type": "BPE", "dropout": None, "unk_token": None,
                                "continuing_subword_prefix": None, "end_of_word_suffix": None,
                                "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                                "vocab": vocab, "merges": ["h e", "l l", "he ll", "Ġ w"]}}
    split = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": False},
        {**bl, "use_regex": False}]}
    yield "bytebpe-split", {**base, "pre_tokenizer": split, "decoder": bl,
                            "added_tokens": [{"id": 300, "content": "<|im_end|>", "single_word": False,
                                              "lstrip": False, "rstrip": False, "normalized": False,
                                              "special": True}],
                            "model": {"type": "BPE", "vocab": vocab, "merges": [["h", "e"]]}}
    words = {"[UNK]": 0, "hello": 1, "world": 2, "!": 3, "##s": 4}
    yield "wordlevel", {**base, "pre_tokenizer": {"type": "Whitespace"}, "decoder": None,
                        "model": {"type": "WordLevel", "vocab": words, "unk_token": "[UNK]"}}
    yield "wordpiece", {**base, "normalizer": {"type": "BertNormalizer", "clean_text": True,
                                               "handle_chinese_chars": True, "strip_accents": None,
                                               "lowercase": True},
                        "pre_tokenizer": {"type": "BertPreTokenizer"},
                        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
                        "model": {"type": "WordPiece", "unk_token": "[UNK]",
                                  "continuing_subword_prefix": "##",
                                  "max_input_chars_per_word": 100, "vocab": words}}
    yield "unigram", {**base, "normalizer": {"type": "Replace", "pattern": {"String": " "},
                                             "content": "\u2581"},
                      "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581",
                                        "prepend_scheme": "always", "split": True},
                      "decoder": {"type": "Metaspace", "replacement": "\u2581",
                                  "prepend_scheme": "always", "split": True},
                      "model": {"type": "Unigram", "unk_id": 0, "byte_fallback": True,
                                "vocab": [["<unk>", 0.0], ["\u2581hello", -1.0], ["o", -2.0],
                                          ["<0x41>", -5.0]]}}


def gen_tokenizer_json():
    d = out_dir("tokenizer_json")
    payloads = [b"Hello world! 123 <|im_end|> caf\xc3\xa9 \xf0\x9f\x91\x8b\n\tx",
                b"<s>[INST] hi [/INST]" + struct.pack("<6I", 0, 1, 2, 255, 256, 10 ** 6)]
    n = 0
    items = list(tiny_tokenizers())
    for name in ["llama3", "qwen3", "gemma3"]:
        p = CACHE / "hf-tokenizers" / name / "tokenizer.json"
        if not p.exists():
            note(f"{p} missing")
            continue
        items.append((name, shrink_tokenizer(json.loads(p.read_text()))))
    for name, tj in items:
        body = json.dumps(tj, ensure_ascii=False).encode()
        for i, pl in enumerate(payloads):
            (d / f"{name}-{i}").write_bytes(body + b"\0" + pl)
            n += 1
    return n


# ---------------------------------------------------------------- chat_template

def gen_chat_template():
    d = out_dir("chat_template")
    tdir = LLAMA / "templates"
    names = sorted(p.name for p in tdir.glob("*.jinja")) if tdir.exists() else []
    if not names:
        note(f"no templates in {tdir}")
    n = 0
    for i in range(max(len(names), 1)):
        for k in range(3):
            # Template index (u16 big-endian, as the target reads it), then choices.
            body = bytes([i >> 8, i & 0xFF]) + bytes(rng.randrange(256) for _ in range(40 + 40 * k))
            (d / f"t{i:03d}-{k}").write_bytes(body)
            n += 1
    return n


# ---------------------------------------------------------------- template_source

def gen_template_source():
    d = out_dir("template_source")
    tdir = LLAMA / "templates"
    paths = sorted(tdir.glob("*.jinja")) if tdir.exists() else []
    if not paths:
        note(f"no templates in {tdir}")
    n = 0
    for p in paths:
        src = p.read_bytes()[:4096]
        (d / p.stem).write_bytes(src)
        # A cut template: unbalanced blocks and expressions are the common malformed inputs.
        (d / f"{p.stem}-cut").write_bytes(src[: rng.randrange(1, max(2, len(src)))])
        n += 2
    return n


# ---------------------------------------------------------------- request_bodies

def conversations():
    convs = []
    man = GOLDEN / "templates" / "manifest.json"
    if man.exists():
        convs += json.loads(man.read_text())["conversations"]
    else:
        note(f"{man} missing")
    for fx in ["qwen4exp_toolcall", "gemma4_toolcall"]:
        p = GOLDEN / fx / "expected.json"
        if not p.exists():
            continue
        e = json.loads(p.read_text())
        call = {"id": "call_1", "type": "function",
                "function": {"name": e["call"]["name"], "arguments": json.dumps(e["call"]["arguments"])}}
        convs.append({"name": fx, "tools": e["tools"], "extra": {"enable_thinking": True},
                      "messages": [{"role": "system", "content": e["system"]},
                                   {"role": "user", "content": e["question"]},
                                   {"role": "assistant", "content": "", "reasoning_content": e["reasoning"],
                                    "tool_calls": [call]},
                                   {"role": "tool", "tool_call_id": "call_1", "content": e["tool_result"]}]})
    return convs


def anthropic_of(conv):
    msgs, system = [], None
    for m in conv["messages"]:
        role, content = m.get("role"), m.get("content")
        if role == "system":
            system = content
        elif role == "tool":
            msgs.append({"role": "user", "content": [{"type": "tool_result",
                                                      "tool_use_id": m.get("tool_call_id"),
                                                      "content": content}]})
        elif role == "assistant" and m.get("tool_calls"):
            blocks = [{"type": "text", "text": content or ""}]
            for c in m["tool_calls"]:
                f = c.get("function", {})
                args = f.get("arguments")
                blocks.append({"type": "tool_use", "id": c.get("id"), "name": f.get("name"),
                               "input": json.loads(args) if isinstance(args, str) else args})
            msgs.append({"role": "assistant", "content": blocks})
        else:
            msgs.append({"role": role, "content": content})
    body = {"model": "m", "max_tokens": 64, "messages": msgs}
    if system is not None:
        body["system"] = system
    if conv.get("tools"):
        body["tools"] = [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
                          "input_schema": t["function"].get("parameters", {})}
                         for t in conv["tools"] if isinstance(t, dict) and "function" in t]
    return body


def responses_of(conv):
    """A chat conversation as a `/v1/responses` body."""
    items, instructions = [], None
    for m in conv["messages"]:
        role, content = m.get("role"), m.get("content")
        if role == "system":
            instructions = content
        elif role == "tool":
            items.append({"type": "function_call_output", "call_id": m.get("tool_call_id"), "output": content})
        else:
            if content:
                kind = "output_text" if role == "assistant" else "input_text"
                items.append({"type": "message", "role": role, "content": [{"type": kind, "text": content}]})
            for c in m.get("tool_calls") or []:
                f = c.get("function", {})
                items.append({"type": "function_call", "call_id": c.get("id"), "name": f.get("name"),
                              "arguments": f.get("arguments")})
    body = {"model": "m", "max_output_tokens": 64, "input": items}
    if instructions is not None:
        body["instructions"] = instructions
    if conv.get("tools"):
        body["tools"] = [dict(t["function"], type="function") for t in conv["tools"]
                         if isinstance(t, dict) and "function" in t]
    return body


def gen_request_bodies():
    d = out_dir("request_bodies")
    x = [{"role": "user", "content": "x"}]
    bodies = [
        # The rejected requests of scripts/test-server.py, and their accepted neighbours.
        {"messages": x, "temperature": "hot"}, {"messages": x, "max_tokens": -1},
        {"messages": x, "max_tokens": 10 ** 30}, {"messages": x, "top_p": 5}, {"messages": x, "n": 3},
        {"messages": x, "response_format": {"type": "json_object"}},
        {"messages": x, "stream_options": {"foo": 1}}, {"messages": x, "logit_bias": {"99999999": 5}},
        {"messages": x, "stop": 5}, {"messages": x, "tools": [{"type": "code"}]},
        {"model": "gpt-9", "messages": x}, {"prompt": {"a": 1}}, {"prompt": "a", "echo": True},
        {"model": "m", "messages": x}, {"model": "m", "max_tokens": 5,
                                         "messages": [{"role": "system", "content": "x"}]},
        {"messages": x, "logprobs": True, "top_logprobs": 50},
        {"messages": x, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 42,
         "presence_penalty": 0.5, "frequency_penalty": -0.5, "repeat_penalty": 1.1, "stop": ["\n", "END"],
         "max_completion_tokens": 16, "stream": True, "stream_options": {"include_usage": True},
         "logit_bias": {"5": -100, "7": 2.5}, "logprobs": True, "top_logprobs": 3,
         "response_format": {"type": "text"}, "tool_choice": "auto"},
        {"prompt": "Once upon a time", "max_tokens": 8, "logprobs": 2, "best_of": 1, "suffix": None},
        {"prompt": [1, 2, 3, 999], "max_tokens": 8}, {"prompt": ["one string"]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                   {"type": "image_url", "image_url": {"url": "x"}}]}]},
    ]
    for c in conversations():
        chat = {"model": "m", "messages": c["messages"], "max_tokens": 32}
        if c.get("tools"):
            chat["tools"] = c["tools"]
        if c.get("extra"):
            chat["chat_template_kwargs"] = c["extra"]
        bodies.append(chat)
        bodies.append(anthropic_of(c))
        bodies.append(responses_of(c))
    # A Codex CLI request's shape (`/v1/responses`).
    dev = {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are a coding agent."}]}
    fn = {"type": "function", "name": "exec_command", "strict": False,
          "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
    bodies.append({"model": "m", "instructions": "", "stream": True, "store": False, "tool_choice": "auto",
                   "parallel_tool_calls": True, "reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"],
                   "input": [dev, {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "ls"}]},
                             {"type": "reasoning", "summary": [], "encrypted_content": None},
                             {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": "{\"cmd\":\"ls\"}"},
                             {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
                             {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch"},
                             {"type": "custom_tool_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "ok"}]}],
                   "tools": [fn, {"type": "namespace", "name": "agents", "tools": [dict(fn, name="spawn_agent")]},
                             {"type": "custom", "name": "apply_patch", "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
                             {"type": "web_search"}],
                   "text": {"format": {"type": "json_schema", "name": "o", "schema": {"type": "object"}}},
                   "max_output_tokens": 64})
    bodies.append({"input": "hi", "previous_response_id": "resp_1"})
    n = 0
    for i, b in enumerate(bodies):
        (d / f"body-{i:03d}.json").write_text(json.dumps(b, ensure_ascii=False))
        n += 1
    return n


# ---------------------------------------------------------------- output_parsers

# Indexes into the target's TEMPLATES list (output_parsers.rs) and its selector layout.
N_TEMPLATES = 10


def rust_string_literals(path):
    """The plain "..." literals of a Rust test file (common escapes only)."""
    out = []
    for m in re.finditer(r'(?<![A-Za-z0-9_#])"((?:[^"\\]|\\.)*)"', path.read_text()):
        s = m.group(1)
        s = re.sub(r"\\u\{([0-9a-fA-F]+)\}", lambda u: chr(int(u.group(1), 16)), s)
        s = s.replace("\\n", "\n").replace("\\t", "\t").replace('\\"', '"').replace("\\\\", "\\")
        if len(s) >= 4:
            out.append(s)
    return out


def gen_output_parsers():
    d = out_dir("output_parsers")
    texts = []
    for fx in ["qwen4exp_toolcall", "gemma4_toolcall"]:
        p = GOLDEN / fx / "expected.json"
        if p.exists():
            texts += json.loads(p.read_text()).get("answers", [])
    for f in ["parser_tests.rs", "parser_gemma4_tests.rs"]:
        p = ROOT / "crates" / "vela-server" / "src" / f
        if p.exists():
            texts += rust_string_literals(p)
    texts = list(dict.fromkeys(texts))
    n = 0
    for i, t in enumerate(texts):
        raw = t.encode()
        for k in range(4):
            tpl = rng.randrange(N_TEMPLATES)
            sel = tpl + N_TEMPLATES * (1 if k else 0) + 2 * N_TEMPLATES * (k == 3)
            splits = [rng.randrange(len(raw) + 1) for _ in range(k * 2)]
            body = bytes([sel, len(splits)]) + b"".join(struct.pack("<H", s) for s in splits) + raw
            (d / f"out-{i:03d}-{k}").write_bytes(body)
            n += 1
    return n


# ---------------------------------------------------------------- config_json

def gguf_metadata_json(path):
    """Scalar and short-array metadata of a GGUF file as a JSON object (needs gguf-py)."""
    import gguf  # noqa: PLC0415 (optional dependency)
    r = gguf.GGUFReader(str(path))
    o = {}
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name.startswith("tokenizer."):
            continue
        try:
            v = f.contents()
        except Exception:  # a field gguf-py cannot decode is skipped
            continue
        if isinstance(v, list) and len(v) > 64:
            continue
        o[name] = v
    return o


def gen_config_json():
    d = out_dir("config_json")
    n = 0
    for p in sorted(GOLDEN.rglob("config.json")) if GOLDEN.exists() else []:
        rel = "-".join(p.relative_to(GOLDEN).parts[:-1])
        (d / f"hf-{rel}.json").write_bytes(p.read_bytes())
        n += 1
    try:
        import gguf  # noqa: F401
        ggufs = sorted((CACHE / "models").glob("*.gguf")) + sorted(LLAMA.glob("ggml-vocab-*.gguf"))
        for p in ggufs:
            if p.name.endswith(".f32.gguf"):
                continue
            try:
                o = gguf_metadata_json(p)
            except Exception as e:  # an unreadable file is just skipped
                note(f"skip {p.name}: {e}")
                continue
            (d / f"gguf-{p.stem}.json").write_text(json.dumps(o, ensure_ascii=False))
            n += 1
    except ImportError:
        note("gguf-py not installed: no GGUF-metadata seeds (pip install gguf)")
    if n == 0:
        (d / "minimal.json").write_text('{"model_type": "gemma4_text"}')
        n = 1
    return n


TARGETS = {
    "tokenizer_json": gen_tokenizer_json,
    "chat_template": gen_chat_template,
    "template_source": gen_template_source,
    "request_bodies": gen_request_bodies,
    "output_parsers": gen_output_parsers,
    "config_json": gen_config_json,
}


def main():
    names = sys.argv[1:] or list(TARGETS)
    for t in names:
        if t not in TARGETS:
            sys.exit(f"unknown target {t} (known: {', '.join(TARGETS)})")
        print(f"{t}: {TARGETS[t]()} seeds in {CORPUS / t}")


if __name__ == "__main__":
    main()
