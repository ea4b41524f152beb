#!/usr/bin/env python3
# vela-venv: torch
"""A tiny Gemma 4 (real tokenizer and chat template) *trained* to answer a weather question with
thinking + a tool call, and to answer from the tool result — so the server's Gemma 4 tool-call and
thinking round trip runs on model output, not only on parser unit tests.

Regenerate (re-runnable; overwrites the output; ~2-4 minutes on 2 cores):

    scripts/prepare-test-data.sh      # runs this in $VELA_CACHE/venv-torch
or  $VELA_CACHE/venv-torch/bin/python scripts/gen-gemma4-toolcall.py

The geometry is gen-gemma4-e2e.py's (4 layers, width 64, 262,144-token Gemma 4 vocabulary). Two
conversations are rendered with the chat template the GGUF carries (the one in llama.cpp's
models/ggml-vocab-gemma-4.gguf, Gemma 4's interleaved variant: tool results as `<|turn>tool`
turns) exactly as the server renders them (jinja2 set up like HF: scripts/gen-template-golden.py,
which vela-template matches byte for byte), tokenized by llama.cpp on the GGUF, and the model is
fitted (Adam, cross-entropy on the answer tokens only) until greedy decoding reproduces both
answers with a top-2 margin >= 3 (llama.cpp's greedy decode of the written GGUF is checked too):

    1. system + get_weather tool + "What is the weather in Paris?" (thinking on) ->
       "<|channel>thought\\nThe user asks for the weather in Paris.\\n<channel|>
        <|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|><|tool_response>"
       (<|tool_response> is an end-of-generation token: the model hands over to the tool)
    2. the same + the assistant's call + the tool result -> "It is 18 degrees and sunny in Paris.<turn|>"

Output: $VELA_CACHE/golden/gemma4_toolcall/{hf/, model-f32.gguf, expected.json}.
"""
import copy
import importlib.util
import json
import os
import shutil
import sys

import torch
from transformers import Gemma4ForCausalLM, Gemma4TextConfig

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.environ.get("VELA_CACHE", "/root/.cache/vela")
OUT = os.path.join(CACHE, "golden", "gemma4_toolcall")


def load(name: str):
    spec = importlib.util.spec_from_file_location(name.replace("-", "_"), os.path.join(HERE, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
SYSTEM = "You are a helpful assistant."
QUESTION = "What is the weather in Paris?"
REASONING = "The user asks for the weather in Paris."
CALL_ARGS = {"city": "Paris"}
TOOL_RESULT = json.dumps({"temperature_c": 18, "sky": "sunny"})
FINAL = "It is 18 degrees and sunny in Paris."
ANSWER_1 = (f"<|channel>thought\n{REASONING}\n<channel|>"
            "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|><|tool_response>")
ANSWER_2 = FINAL + "<turn|>"


def conversations():
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    second = first + [
        {"role": "assistant", "content": "", "reasoning_content": REASONING,
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": CALL_ARGS}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": TOOL_RESULT},
    ]
    return [(first, ANSWER_1), (second, ANSWER_2)]


def main() -> None:
    e2e = load("gen-gemma4-e2e")
    golden = load("gen-template-golden")
    n_vocab, field = e2e.vocab_field()
    env = golden.make_env()
    template = env.from_string(field("tokenizer.chat_template"))
    bos = "<bos>"
    texts = []
    for messages, answer in conversations():
        conv = {"messages": copy.deepcopy(messages), "tools": TOOLS, "add_generation_prompt": True,
                "extra": {"enable_thinking": True}}
        texts.append((golden.render(template, bos, "<eos>", conv), answer))

    tkw = e2e.target_kwargs(n_vocab, field)
    torch.manual_seed(7)
    model = Gemma4ForCausalLM(Gemma4TextConfig(**tkw)).float()
    os.makedirs(OUT, exist_ok=True)
    # Tokenize with llama.cpp on a GGUF carrying the real vocabulary (any weights will do).
    hf = os.path.join(OUT, "hf")
    shutil.rmtree(hf, ignore_errors=True)
    model.save_pretrained(hf, safe_serialization=True)
    gguf_path = os.path.join(OUT, "model-f32.gguf")
    e2e.to_gguf_real_vocab(hf, gguf_path, n_vocab, field)
    sys.path.insert(0, HERE)
    import llama_oracle
    seqs = []
    for prompt, answer in texts:
        p = llama_oracle.tokenize(gguf_path, prompt, add_bos=False, parse_special=True)
        full = llama_oracle.tokenize(gguf_path, prompt + answer, add_bos=False, parse_special=True)
        assert full[:len(p)] == p, "the answer's tokenization changes the prompt's"
        seqs.append((p, full))
    llama_oracle.unload(gguf_path)

    # Fit the answers (cross-entropy on the answer tokens; the prompt is context only).
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    def margins():
        model.eval()
        worst = float("inf")
        with torch.no_grad():
            for p, full in seqs:
                n_ans = len(full) - len(p)
                logits = model(torch.tensor([full[:-1]]), logits_to_keep=n_ans).logits[0]
                target = torch.tensor(full[len(p):])
                top2 = logits.topk(2, dim=-1)
                ok = top2.indices[:, 0] == target
                m = (top2.values[:, 0] - top2.values[:, 1]).min().item()
                worst = min(worst, m if bool(ok.all()) else -1.0)
        model.train()
        return worst

    for step in range(600):
        opt.zero_grad()
        loss = 0.0
        for p, full in seqs:
            n_ans = len(full) - len(p)
            logits = model(torch.tensor([full[:-1]]), logits_to_keep=n_ans).logits[0]
            loss = loss + torch.nn.functional.cross_entropy(logits, torch.tensor(full[len(p):]))
        loss.backward()
        opt.step()
        if step % 20 == 19:
            m = margins()
            print(f"step {step + 1}: loss {loss.item():.4f}, worst greedy margin {m:.2f}", flush=True)
            if m >= 3.0:
                break
    else:
        raise SystemExit("did not fit the answers in 600 steps")

    shutil.rmtree(hf, ignore_errors=True)
    model.eval().save_pretrained(hf, safe_serialization=True)
    e2e.to_gguf_real_vocab(hf, gguf_path, n_vocab, field)
    # llama.cpp's greedy decode of the GGUF reproduces both answers (the file is right).
    for (p, full), (_, answer) in zip(seqs, texts):
        ids, _ = llama_oracle.greedy_decode(gguf_path, p, len(full) - len(p), n_ctx=1024, kv_f32=True)
        assert ids == full[len(p):], f"llama.cpp greedy on the GGUF: {ids} != {full[len(p):]}"
    llama_oracle.unload(gguf_path)
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump({"tools": TOOLS, "system": SYSTEM, "question": QUESTION, "reasoning": REASONING,
                   "call": {"name": "get_weather", "arguments": CALL_ARGS}, "tool_result": TOOL_RESULT,
                   "final": FINAL, "prompt_tokens": [len(p) for p, _ in seqs]}, f, indent=1)
    print(f"gemma4_toolcall: {gguf_path}")


if __name__ == "__main__":
    main()
