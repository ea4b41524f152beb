#!/usr/bin/env python3
"""Generate the seed corpus of the `safetensors_index` fuzz target (standard library only).

Usage (from the repo root):  python3 fuzz/gen-safetensors-index-seeds.py [OUT_DIR]
OUT_DIR defaults to fuzz/corpus/safetensors_index. Deterministic; files are overwritten.

A seed is a sharded checkpoint: u32 little-endian length + `model.safetensors.index.json`, u32
length + `model-00001-of-00002.safetensors`, then `model-00002-of-00002.safetensors`. Seeds: a
valid two-shard checkpoint of every dtype; the real layout of the checkpoints the tests generate
($VELA_CACHE/golden/{qwen4exp/mtp,deepseekv4/flash_mini_fp8}/model.safetensors, its tensors split
over two shards and shrunk to at most 2 x 64 elements); and the broken cases the reader must
refuse: a missing shard, a tensor listed in the wrong shard or in no shard, a tensor in both
shards, shard names that are paths (`../outside.safetensors`, absolute, `./`, `..`), a weight map
that is not an object or holds a non-string, an index that is not JSON, and bad offsets.
"""
import json
import os
import random
import struct
import sys
from pathlib import Path

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "corpus" / "safetensors_index")
CACHE = Path(os.environ.get("VELA_CACHE", Path.home() / ".cache" / "vela"))
SIZE = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4, "I64": 8, "I8": 1, "F8_E4M3": 1, "F8_E8M0": 1}
S1, S2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
rnd = random.Random(1234)


def shard(tensors, offsets=None):
    """tensors: [(name, dtype, shape)]; random data. offsets: {name: [begin, end]} overrides."""
    header, data = {}, b""
    for name, dt, shape in tensors:
        n = SIZE[dt]
        for d in shape:
            n *= d
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + n]}
        data += bytes(rnd.randrange(256) for _ in range(n))
    for name, off in (offsets or {}).items():
        header[name]["data_offsets"] = off
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def seed(index, s1, s2=b""):
    if not isinstance(index, bytes):
        index = json.dumps(index).encode()
    return struct.pack("<I", len(index)) + index + struct.pack("<I", len(s1)) + s1 + s2


def wmap(t1, t2, extra=None):
    m = {n: S1 for n, _, _ in t1}
    m.update({n: S2 for n, _, _ in t2})
    m.update(extra or {})
    return {"metadata": {"total_size": 0}, "weight_map": m}


def real_layout(src):
    """The tensors of a real checkpoint, shrunk, split over two shards."""
    with open(src, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    ts = []
    for name, e in list(header.items())[:48]:
        if name == "__metadata__":
            continue
        shape = [min(d, 64 if i == len(e["shape"]) - 1 else 2) for i, d in enumerate(e["shape"])]
        ts.append((name, e["dtype"], shape))
    return ts[: len(ts) // 2], ts[len(ts) // 2:]


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    t1 = [(f"a.{dt}", dt, [2, 3]) for dt in ("F32", "F16", "BF16", "I32")]
    t2 = [(f"b.{dt}", dt, [3, 2]) for dt in ("I64", "I8", "F8_E4M3", "F8_E8M0")] + [("b.s", "F32", [])]
    seeds = {
        "valid": seed(wmap(t1, t2), shard(t1), shard(t2)),
        "one-shard": seed(wmap(t1, []), shard(t1)),
        "empty-map": seed({"weight_map": {}}, shard(t1), shard(t2)),
        "missing-shard": seed(wmap(t1, t2), shard(t1)),
        "wrong-shard": seed(wmap(t1, t2, {"a.F32": S2}), shard(t1), shard(t2)),
        "not-in-any-shard": seed(wmap(t1, t2, {"ghost": S1}), shard(t1), shard(t2)),
        "in-both-shards": seed(wmap(t1, t2), shard(t1), shard(t2 + t1[:1])),
        "unlisted-tensor": seed(wmap(t1[1:], t2), shard(t1), shard(t2)),
        "traversal": seed(wmap(t1, t2, {"outside.secret": "../outside.safetensors"}), shard(t1), shard(t2)),
        "traversal-only": seed({"weight_map": {"outside.secret": "../outside.safetensors"}}, b""),
        "absolute": seed(wmap(t1, t2, {"x": "/etc/passwd"}), shard(t1), shard(t2)),
        "dot-slash": seed(wmap(t1, t2, {"a.F32": "./" + S1}), shard(t1), shard(t2)),
        "dotdot": seed(wmap(t1, t2, {"x": ".."}), shard(t1), shard(t2)),
        "dot": seed(wmap(t1, t2, {"x": "."}), shard(t1), shard(t2)),
        "empty-name": seed(wmap(t1, t2, {"x": ""}), shard(t1), shard(t2)),
        "index-as-shard": seed(wmap(t1, t2, {"x": "model.safetensors.index.json"}), shard(t1), shard(t2)),
        "non-string": seed(wmap(t1, t2, {"x": 1}), shard(t1), shard(t2)),
        "map-not-object": seed({"weight_map": [S1, S2]}, shard(t1), shard(t2)),
        "no-map": seed({"metadata": {}}, shard(t1), shard(t2)),
        "not-json": seed(b'{"weight_map": {"a.F32": "' + S1.encode() + b'"', shard(t1), shard(t2)),
        "newline-name": seed(wmap(t1, t2, {"x\ny": S2}), shard(t1), shard(t2)),
        "bad-offsets": seed(wmap(t1, t2), shard(t1, {"a.F32": [0, 1 << 40]}), shard(t2, {"b.I64": [48, 0]})),
        "overlap": seed(wmap(t1, t2), shard(t1, {"a.F16": [0, 12]}), shard(t2)),
        "empty-shards": seed(wmap([], []), b"", b""),
    }
    for rel in ("qwen4exp/mtp/model.safetensors", "deepseekv4/flash_mini_fp8/model.safetensors"):
        src = CACHE / "golden" / rel
        if src.exists():
            r1, r2 = real_layout(src)
            seeds[rel.replace("/", "-")] = seed(wmap(r1, r2), shard(r1), shard(r2))
    for name, data in seeds.items():
        (OUT / name).write_bytes(data)
    print(f"{len(seeds)} seeds in {OUT}")


if __name__ == "__main__":
    main()
