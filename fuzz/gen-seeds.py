#!/usr/bin/env python3
"""Generate the seed corpus for the `gguf_parse` fuzz target.

Usage (from the repo root):  python3 fuzz/gen-seeds.py [OUT_DIR]
OUT_DIR defaults to fuzz/corpus/gguf_parse. Re-runnable: files are overwritten and the output is
deterministic (fixed seed). Needs gguf-py (`pip install gguf==0.19.0`) and numpy.

Seeds:
  * small valid GGUFs written with gguf.GGUFWriter: every metadata value type (including nested
    arrays) and one or two tensors of each GGML type vela knows (plus a few it does not support),
    with random data and sane f16 scales;
  * the metadata of llama.cpp's models/ggml-vocab-*.gguf files rewritten with every array cut to
    16 entries (the real files are MBs of vocabulary, too big for useful fuzzing), so the seeds
    carry real key names and tokenizer layouts.
"""
import os
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T, GGUFValueType as V

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "corpus" / "gguf_parse")
CACHE = Path(os.environ.get("VELA_CACHE", Path.home() / ".cache" / "vela"))
VOCAB_DIR = CACHE / "llama-cpp-python" / "vendor" / "llama.cpp" / "models"
rng = np.random.default_rng(1234)

TYPES = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K,
         T.Q5_K, T.Q6_K, T.Q8_K, T.IQ4_NL, T.IQ2_XXS, T.TQ2_0, T.I32]


def raw_tensor(qtype, n_blocks):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks * size,), dtype=np.uint8)
    if qtype not in (T.F32, T.F16, T.BF16, T.I32):
        # Sane f16 scale at the start of every block (not exact for every layout; fine for fuzzing).
        d = np.array([rng.uniform(-1, 1)], dtype=np.float16).view(np.uint8)
        for b in range(n_blocks):
            raw[b * size:b * size + 2] = d
    return raw.reshape(1, -1), block * n_blocks  # (byte rows, element count)


def write_small(path, qtypes, align=None, v2=False):
    w = gguf.GGUFWriter(str(path), "llama")
    if align:
        w.add_custom_alignment(align)
    w.add_uint32("llama.block_count", 2)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_bool("llama.use_parallel_residual", True)
    w.add_key_value("t.u8", 7, V.UINT8)
    w.add_key_value("t.i8", -7, V.INT8)
    w.add_key_value("t.u16", 700, V.UINT16)
    w.add_key_value("t.i16", -700, V.INT16)
    w.add_key_value("t.i32", -70000, V.INT32)
    w.add_key_value("t.u64", 1 << 40, V.UINT64)
    w.add_key_value("t.i64", -(1 << 40), V.INT64)
    w.add_key_value("t.f64", 0.125, V.FLOAT64)
    w.add_string("t.str", "héllo")
    w.add_array("t.arr_i32", [1, 2, 3])
    w.add_array("t.arr_str", ["a", "bb", ""])
    w.add_array("t.arr_nested", [[1, 2], [3]])
    for i, q in enumerate(qtypes):
        raw, n = raw_tensor(q, 1 + i % 2)
        w.add_tensor(f"blk.{i}.{q.name.lower()}", raw, raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def vocab_header(src, dst):
    r = gguf.GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = f.types[0]
        val = f.contents()
        sub = None
        if vtype == V.ARRAY:
            sub = f.types[1] if len(f.types) > 1 else None
            val = val[:16]
            if sub == V.ARRAY or not val:
                continue
        w.add_key_value(name, val, vtype, sub_type=sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    n = 0
    for q in TYPES:
        write_small(OUT / f"small-{q.name.lower()}.gguf", [q])
        n += 1
    write_small(OUT / "small-mixed.gguf", [T.Q4_K, T.Q6_K, T.F32, T.Q8_0])
    write_small(OUT / "small-align64.gguf", [T.Q4_0, T.F16], align=64)
    write_small(OUT / "small-none.gguf", [])
    n += 3
    for src in sorted(VOCAB_DIR.glob("ggml-vocab-*.gguf")):
        try:
            vocab_header(src, OUT / f"vocab-{src.stem[len('ggml-vocab-'):]}.gguf")
            n += 1
        except Exception as e:  # a seed we cannot rewrite is just skipped
            print(f"skip {src.name}: {e}", file=sys.stderr)
    sizes = [p.stat().st_size for p in OUT.iterdir()]
    print(f"wrote {n} seeds to {OUT} (largest {max(sizes)} bytes)")


if __name__ == "__main__":
    main()
