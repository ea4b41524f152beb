#!/usr/bin/env python3
"""Golden files for vela's quant block dequantizers/quantizers (crates/vela-formats/src/quant).

Regenerate (re-runnable, deterministic; needs `pip install gguf==0.19.0 numpy`):

    python3 scripts/gen-quant-golden.py            # both outputs below
    python3 scripts/gen-quant-golden.py --random-only   # only the committed small goldens

Outputs:
  * crates/vela-formats/tests/data/quant_random.{json,bin} (committed, < 200 KB): for EVERY type
    vela supports, random blocks (fixed seed; random bytes with sane f16/f32 scale fields, except
    F32/F16/BF16 whose random bit patterns deliberately include NaN/inf/subnormals) and their
    values as dequantized by gguf-py `gguf.quants.dequantize`. gguf-py 0.19.0 has no Q8_K, so Q8_K
    expectations are computed here with ggml-quants.c `dequantize_row_q8_K` semantics
    (`y = (float)d * (float)qs[j]`, one f32 multiply). Also "quantize" cases: random f32 rows
    and the bytes gguf-py `gguf.quants.quantize` produces for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, BF16
    and F16 (gguf-py mirrors ggml's `quantize_row_*_ref` for these).
  * crates/vela-formats/tests/data/quant_ggml_ref.{json,bin} (committed, only rewritten when the
    llama.cpp oracle build exists): random rows quantized by llama.cpp's own
    `quantize_row_{q4_0,q4_1,q5_0,q5_1,q8_0,q8_1,q2_K,q3_K,q4_K,q5_K,q6_K,q8_K}_ref`, called
    through ctypes from $VELA_CACHE/llama.cpp-avx2/bin/libggml-base.so (built by
    scripts/build-llama-cpp.sh). An oracle only: vela never links it.
  * $VELA_CACHE/golden/quant/ggml_ref_large.{json,bin}: the same with 2^18 values per type.
  * $VELA_CACHE/golden/quant/{manifest.json,model_slices.bin} (VELA_CACHE defaults to
    ~/.cache/vela): for each tensor type present in the three real models in $VELA_CACHE/models,
    up to three real tensors (first, middle and last of that type), their first rows (at most
    16384 elements, whole rows, at least one row) dequantized by gguf-py.

Manifest format (both): {"blob": <file name next to the manifest>, "cases": [...]}, each case
{"name", "kind": "dequant"|"quantize"|"model", "type": ggml type name as vela/llama.cpp print it,
"n": element count, ...}: "dequant" has "raw" and "f32" = [offset, length] byte ranges in the blob;
"quantize" has "input" (f32 LE) and "bytes" ranges; "model" has "model" (file name), "tensor" and
"f32". All f32 values are raw little-endian bits.
"""
import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT / "crates" / "vela-formats" / "tests" / "data"
CACHE = Path(os.environ.get("VELA_CACHE", Path.home() / ".cache" / "vela"))
MODELS = ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf",
          "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"]
MAX_MODEL_ELEMS = 16384
SEED = 20240601

# ggml type name as llama.cpp prints it (GgmlType::name in vela).
NAMES = {T.F32: "f32", T.F16: "f16", T.BF16: "bf16", T.Q4_0: "q4_0", T.Q4_1: "q4_1",
         T.Q5_0: "q5_0", T.Q5_1: "q5_1", T.Q8_0: "q8_0", T.Q2_K: "q2_K", T.Q3_K: "q3_K",
         T.Q4_K: "q4_K", T.Q5_K: "q5_K", T.Q6_K: "q6_K", T.Q8_K: "q8_K"}
# Byte offsets of the f16 scale fields (d, dmin/m) inside one block.
F16_FIELDS = {T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
              T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208]}
N_BLOCKS = {**{t: 48 for t in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0)},
            **{t: 8 for t in (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_K)},
            T.F32: 512, T.F16: 512, T.BF16: 512}


class Blob:
    def __init__(self):
        self.parts, self.size = [], 0

    def add(self, b: bytes):
        off = self.size
        self.parts.append(b)
        self.size += len(b)
        return [off, len(b)]

    def write(self, path: Path):
        path.write_bytes(b"".join(self.parts))


def sane_scale(rng, n):
    """f16-representable scales: magnitudes 2^-14..2^3 with random sign, plus a few zeros and
    f16 subnormals so those paths are covered."""
    mag = np.exp2(rng.uniform(-14, 3, size=n))
    s = (mag * rng.choice([-1.0, 1.0], size=n)).astype(np.float16)
    special = rng.random(n)
    s[special < 0.03] = np.float16(0.0)
    s[(special >= 0.03) & (special < 0.06)] = np.float16(3e-6)  # subnormal
    return s


def random_blocks(rng, qtype):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    nb = N_BLOCKS[qtype]
    raw = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    if qtype == T.F32:
        vals = (rng.standard_normal(nb) * np.exp2(rng.uniform(-20, 20, nb))).astype(np.float32)
        vals[:6] = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-40, 3.4e38], dtype=np.float32)
        raw = vals.view(np.uint8).reshape(nb, 4)
    for off in F16_FIELDS.get(qtype, []):
        raw[:, off:off + 2] = sane_scale(rng, nb).view(np.uint8).reshape(nb, 2)
    if qtype == T.Q8_K:
        d = (rng.standard_normal(nb) * np.exp2(rng.uniform(-16, 2, nb))).astype(np.float32)
        raw[:, 0:4] = d.view(np.uint8).reshape(nb, 4)
    return raw


def dequant_reference(raw, qtype):
    if qtype == T.Q8_K:
        # gguf-py 0.19.0 has no Q8_K: ggml-quants.c dequantize_row_q8_K, y = d * qs[j] in f32.
        d = raw[:, 0:4].copy().view(np.float32)  # (nb, 1)
        qs = raw[:, 4:260].copy().view(np.int8).astype(np.float32)
        return (d * qs).astype(np.float32).reshape(-1)
    return np.asarray(gguf.quants.dequantize(raw, qtype), dtype=np.float32).reshape(-1)


def quant_inputs(rng, n):
    x = (rng.standard_normal(n) * 0.05).astype(np.float32)
    out = rng.random(n) < 0.01
    x[out] *= 40
    x[0:32] = 0.0  # all-zero block: d = 0
    x[32:64] = 0.25  # constant block: Q4_1/Q5_1 d = 0
    x[64:96] = np.linspace(-1, 0.5, 32, dtype=np.float32)  # negative extreme
    x[96:128] = np.round(x[96:128] * 64) / 64  # values on a coarse grid (rounding ties)
    return x.astype(np.float32)


def gen_random(out_dir: Path):
    rng = np.random.default_rng(SEED)
    blob, cases = Blob(), []
    for qtype, name in NAMES.items():
        raw = random_blocks(rng, qtype)
        y = dequant_reference(raw, qtype)
        cases.append({"name": f"random/{name}", "kind": "dequant", "type": name, "n": int(y.size),
                      "raw": blob.add(raw.tobytes()), "f32": blob.add(y.astype("<f4").tobytes())})
    x = quant_inputs(rng, 1024)
    xr = blob.add(x.astype("<f4").tobytes())
    for qtype in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.BF16, T.F16):
        q = np.asarray(gguf.quants.quantize(x.reshape(4, 256), qtype))
        cases.append({"name": f"quantize/{NAMES[qtype]}", "kind": "quantize",
                      "type": NAMES[qtype], "n": int(x.size), "input": xr,
                      "bytes": blob.add(q.view(np.uint8).tobytes())})
    out_dir.mkdir(parents=True, exist_ok=True)
    blob.write(out_dir / "quant_random.bin")
    manifest = {"generator": "scripts/gen-quant-golden.py", "gguf_py": gguf_version(),
                "seed": SEED, "blob": "quant_random.bin", "cases": cases}
    (out_dir / "quant_random.json").write_text(json.dumps(manifest, indent=1) + "\n")
    counts = {c["name"]: c["n"] for c in cases}
    print(f"random goldens: {len(cases)} cases, {blob.size} bytes -> {out_dir}")
    for c in cases:
        if c["kind"] == "dequant":
            bs = gguf.GGML_QUANT_SIZES[T[c["type"].upper()]][0]
            print(f"  {c['name']}: {c['n'] // bs} blocks ({c['n']} values)")
    return counts


GGML_REF = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q8_1", "q2_K", "q3_K", "q4_K", "q5_K",
            "q6_K", "q8_K"]


def gen_ggml_ref(out_dir: Path, n: int = 4096, stem: str = "quant_ggml_ref"):
    import ctypes
    lib_path = CACHE / "llama.cpp-avx2" / "bin" / "libggml-base.so"
    if not lib_path.exists():
        print(f"SKIP ggml reference quantizers: {lib_path} missing (kept existing goldens)",
              file=sys.stderr)
        return
    lib = ctypes.CDLL(str(lib_path))
    rng = np.random.default_rng(SEED + 1)
    x = quant_inputs(rng, n)
    blob, cases = Blob(), []
    xr = blob.add(x.astype("<f4").tobytes())
    for name in GGML_REF:
        qtype = T[name.upper()]
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        if qtype == T.Q8_1:
            size = 36  # gguf-py 0.19.0 still lists the old 40-byte f32 layout; ggml's is f16 d, s
        out = np.zeros(x.size // block * size, dtype=np.uint8)
        fn = getattr(lib, f"quantize_row_{name}_ref")
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        fn(x.ctypes.data, out.ctypes.data, ctypes.c_int64(x.size))
        if qtype == T.Q8_K:
            # quantize_row_q8_K_ref leaves bsums unwritten for an all-zero block; vela zeroes them.
            blocks = out.reshape(-1, size)
            zero = ~blocks[:, 4:260].any(axis=1) & ~blocks[:, 0:4].any(axis=1)
            blocks[zero, 260:] = 0
        cases.append({"name": f"ggml_ref/{name}", "kind": "quantize", "type": name,
                      "n": int(x.size), "input": xr, "bytes": blob.add(out.tobytes())})
    out_dir.mkdir(parents=True, exist_ok=True)
    blob.write(out_dir / f"{stem}.bin")
    manifest = {"generator": "scripts/gen-quant-golden.py", "oracle": str(lib_path.name),
                "seed": SEED + 1, "blob": f"{stem}.bin", "cases": cases}
    (out_dir / f"{stem}.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"ggml reference quantizer goldens: {len(cases)} types x {x.size} values, "
          f"{blob.size} bytes -> {out_dir}")


def gen_models(out_dir: Path):
    blob, cases = Blob(), []
    for model in MODELS:
        path = CACHE / "models" / model
        if not path.exists():
            print(f"SKIP model {path} (missing; run scripts/fetch-models.sh)", file=sys.stderr)
            continue
        r = gguf.GGUFReader(str(path))
        by_type = {}
        for t in r.tensors:
            by_type.setdefault(t.tensor_type, []).append(t)
        for qtype, ts in sorted(by_type.items(), key=lambda kv: int(kv[0])):
            if qtype not in NAMES:
                print(f"  {model}: type {qtype.name} not supported by vela, skipped")
                continue
            picks = {id(t): t for t in (ts[0], ts[len(ts) // 2], ts[-1])}.values()
            for t in picks:
                ne0 = int(t.shape[0])
                total_rows = int(t.n_elements) // ne0
                rows = max(1, min(total_rows, MAX_MODEL_ELEMS // ne0))
                block, size = gguf.GGML_QUANT_SIZES[qtype]
                row_bytes = ne0 // block * size
                raw = np.asarray(t.data).reshape(-1).view(np.uint8)[: rows * row_bytes]
                y = dequant_reference(raw.reshape(rows, row_bytes), qtype)
                cases.append({"name": f"{model}/{t.name}", "kind": "model", "model": model,
                              "tensor": t.name, "type": NAMES[qtype], "n": int(y.size),
                              "f32": blob.add(y.astype("<f4").tobytes())})
    out_dir.mkdir(parents=True, exist_ok=True)
    blob.write(out_dir / "model_slices.bin")
    manifest = {"generator": "scripts/gen-quant-golden.py", "gguf_py": gguf_version(),
                "blob": "model_slices.bin", "cases": cases}
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    summary = {}
    for c in cases:
        key = (c["model"], c["type"])
        summary[key] = summary.get(key, 0) + 1
    print(f"model goldens: {len(cases)} tensors, {blob.size} bytes -> {out_dir}")
    for (m, ty), k in summary.items():
        print(f"  {m}: {ty}: {k} tensors")


def gguf_version():
    try:
        from importlib.metadata import version
        return version("gguf")
    except Exception:
        return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--random-only", action="store_true")
    args = ap.parse_args()
    gen_random(DATA_DIR)
    gen_ggml_ref(DATA_DIR)
    if not args.random_only:
        gen_ggml_ref(CACHE / "golden" / "quant", 1 << 18, "ggml_ref_large")
        gen_models(CACHE / "golden" / "quant")


if __name__ == "__main__":
    main()
