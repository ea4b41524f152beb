#!/usr/bin/env python3
"""Generate the seed corpus for the `safetensors_parse` fuzz target (standard library only).

Usage (from the repo root):  python3 fuzz/gen-safetensors-seeds.py [OUT_DIR]
OUT_DIR defaults to fuzz/corpus/safetensors_parse. Deterministic; files are overwritten.

Seeds: small files with every dtype the reader accepts (F32, F16, BF16, I32, I64, I8, F8_E4M3,
F8_E8M0), a DeepSeek V4 release-style FP8 pair (`w.weight` F8_E4M3 + `w.scale` F8_E8M0) and an
MXFP4 pair (I8 + F8_E8M0 per 32 columns), a `__metadata__` map, and the real headers of the
checkpoints the tests generate ($VELA_CACHE/golden/{qwen4exp/mtp,deepseekv4/flash_mini_fp8}) with
every tensor shrunk to at most 2 x 64 elements (real names, dtypes and layouts, small files).
"""
import json
import os
import random
import struct
import sys
from pathlib import Path

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "corpus" / "safetensors_parse")
CACHE = Path(os.environ.get("VELA_CACHE", Path.home() / ".cache" / "vela"))
SIZE = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4, "I64": 8, "I8": 1, "F8_E4M3": 1, "F8_E8M0": 1}
rnd = random.Random(1234)


def write(path, tensors, metadata=None):
    """tensors: [(name, dtype, shape)]; random data."""
    header, data = {}, b""
    for name, dt, shape in tensors:
        n = SIZE[dt]
        for d in shape:
            n *= d
        blob = bytes(rnd.randrange(256) for _ in range(n))
        if dt == "F8_E8M0":
            blob = bytes(rnd.randrange(110, 135) for _ in range(n))  # sane scales
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + n]}
        data += blob
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


def shrink(src, dst):
    with open(src, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    tensors = []
    for name, e in list(header.items())[:48]:
        if name == "__metadata__":
            continue
        shape = [min(d, 64 if i == len(e["shape"]) - 1 else 2) for i, d in enumerate(e["shape"])]
        tensors.append((name, e["dtype"], shape))
    write(dst, tensors, header.get("__metadata__"))


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    write(OUT / "every-dtype.safetensors", [(f"t.{dt}", dt, [2, 3]) for dt in SIZE], {"format": "pt"})
    write(OUT / "fp8-pair.safetensors", [("l.0.wq.weight", "F8_E4M3", [130, 8]), ("l.0.wq.scale", "F8_E8M0", [2, 1])])
    write(OUT / "mxfp4-pair.safetensors", [("l.0.e.w1.weight", "I8", [3, 32]), ("l.0.e.w1.scale", "F8_E8M0", [3, 2])])
    write(OUT / "empty.safetensors", [])
    write(OUT / "scalar-and-zero.safetensors", [("s", "F32", []), ("z", "BF16", [0, 4])])
    n = 5
    for rel in ("qwen4exp/mtp/model.safetensors", "deepseekv4/flash_mini_fp8/model.safetensors"):
        src = CACHE / "golden" / rel
        if src.exists():
            shrink(src, OUT / (rel.replace("/", "-")))
            n += 1
    print(f"{n} seeds in {OUT}")


if __name__ == "__main__":
    main()
