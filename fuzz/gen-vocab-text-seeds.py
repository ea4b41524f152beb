#!/usr/bin/env python3
"""Generate the seed corpus of the `gguf_vocab_text` fuzz target (standard library only).

Usage (from the repo root):  python3 fuzz/gen-vocab-text-seeds.py [OUT_DIR]
OUT_DIR defaults to fuzz/corpus/gguf_vocab_text. Deterministic; files are overwritten.

A seed is one byte picking the vocabulary, then text (also read as little-endian u32 ids). The
vocabularies are listed as the target lists them ($VELA_CACHE, default ~/.cache/vela):
llama-cpp-python/vendor/llama.cpp/models/ggml-vocab-*.gguf, golden/tokenizer/*.gguf, then the
three real models of models/, each group sorted by name. Texts: the test strings of each llama.cpp
vocabulary (`.gguf.inp`, the cases of its tokenizer test), the strings of the tokenizer goldens
(golden/tokenizer/*.json, written by scripts/gen-tokenizer-golden.py) and the vocabulary's own
control-token texts inside a chat turn; plus id lists (every id 0..15, the last ids, and ids out of
range) for each vocabulary.
"""
import json
import os
import struct
import sys
from pathlib import Path

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "corpus" / "gguf_vocab_text")
CACHE = Path(os.environ.get("VELA_CACHE", Path.home() / ".cache" / "vela"))
LLAMA = CACHE / "llama-cpp-python" / "vendor" / "llama.cpp" / "models"
GOLDEN = CACHE / "golden" / "tokenizer"
MODELS = ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf",
          "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"]
SEP = "\n__ggml_vocab_test__\n"


def vocab_files():
    """Same order as the target's `vocab_files`."""
    files = sorted(p for p in LLAMA.glob("ggml-vocab-*.gguf")) if LLAMA.is_dir() else []
    files += sorted(GOLDEN.glob("*.gguf")) if GOLDEN.is_dir() else []
    files += sorted(CACHE / "models" / m for m in MODELS if (CACHE / "models" / m).exists())
    return files


def inp_texts(f):
    inp = Path(str(f) + ".inp")
    if not inp.exists():
        return []
    return inp.read_text(encoding="utf-8").split(SEP)


def golden_texts():
    texts = []
    for j in sorted(GOLDEN.glob("*.json")) if GOLDEN.is_dir() else []:
        for c in json.loads(j.read_text(encoding="utf-8"))["cases"]:
            if c["text"] not in texts:
                texts.append(c["text"])
    return texts


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    files = vocab_files()
    if not files:
        print(f"  note: no GGUF vocabularies under {CACHE}", file=sys.stderr)
        return
    if len(files) > 256:
        files = files[:256]
    golden = golden_texts()
    chat = ["<|im_start|>user\nHi<|im_end|>\n", "<s>[INST] x [/INST]</s>", "<start_of_turn>user\n",
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>", "<|endoftext|>", "<unk>"]
    n = 0
    for i, f in enumerate(files):
        texts = inp_texts(f)[:24] + golden[i % 4::4][:12] + chat
        for k, t in enumerate(texts):
            (OUT / f"{f.stem}-text-{k:02d}").write_bytes(bytes([i]) + t.encode("utf-8"))
            n += 1
        ids = list(range(16)) + [0x7FFFFFFF, 0xFFFFFFFF, 1 << 20, 70000, 150000, 260000]
        (OUT / f"{f.stem}-ids").write_bytes(bytes([i]) + struct.pack(f"<{len(ids)}I", *ids))
        n += 1
    print(f"{n} seeds in {OUT} ({len(files)} vocabularies)")


if __name__ == "__main__":
    main()
