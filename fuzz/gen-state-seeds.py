#!/usr/bin/env python3
"""Seeds of the `state_file` fuzz target: valid prefix-cache files (vela_engine::persist's
layout, standard library only), with and without extra state, and a few cut short.

Usage (from the repo root):  python3 fuzz/gen-state-seeds.py   -> fuzz/corpus/state_file/
"""
import json
import os
import struct
import zlib


def u64(v):
    return struct.pack("<Q", v)


def f32s(vals):
    return u64(len(vals)) + b"".join(struct.pack("<f", v) for v in vals)


def kv(ty, n_past, layers):
    out = bytes([ty]) + u64(n_past) + struct.pack("<I", len(layers))
    for first, k_row, v_row in layers:
        n = n_past - first
        out += u64(first) + u64(k_row) + u64(v_row)
        out += u64(n * k_row) + bytes((i * 7) & 255 for i in range(n * k_row))
        out += u64(n * v_row) + bytes((i * 3) & 255 for i in range(n * v_row))
    return out


def extra(n_past, layers):
    out = u64(n_past) + struct.pack("<I", len(layers))
    for l in layers:
        if l is None:
            out += b"\x00"
        elif l[0] == "rec":
            out += b"\x01" + struct.pack("<I", len(l[1])) + b"".join(f32s(s) for s in l[1])
        else:
            _, rows, raw_first, raw = l
            out += b"\x02" + f32s(rows) + u64(raw_first) + f32s(raw)
    return out


def file(identity, tokens, payload):
    header = json.dumps({"identity": identity, "tokens": len(tokens), "payload": len(payload)},
                        separators=(",", ":")).encode()
    body = b"VELAPC\x00\x01" + struct.pack("<I", len(header)) + header
    body += b"".join(struct.pack("<I", t) for t in tokens) + payload
    return body + struct.pack("<I", zlib.crc32(body) & 0xFFFFFFFF)


def main():
    d = os.path.join("fuzz", "corpus", "state_file")
    os.makedirs(d, exist_ok=True)
    seeds = {
        "kv_only": file("llama on cpu", [1, 2, 3, 4],
                        kv(1, 4, [(0, 8, 8), (2, 4, 4)]) + b"\x00"),
        "hybrid": file("qwen4exp on cpu", [9, 8, 7],
                       kv(0, 3, [(3, 4, 4)]) + b"\x01" +
                       extra(3, [None, ("rec", [[1.0, 2.0], [0.5, -1.0]]),
                                 ("blk", [0.25] * 4, 0, [1.5] * 6)])),
        "empty": file("", [], kv(2, 0, []) + b"\x00"),
    }
    for name, b in seeds.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(b)
        with open(os.path.join(d, name + "_cut"), "wb") as f:
            f.write(b[: len(b) * 2 // 3])
    print(f"state_file: {2 * len(seeds)} seeds in {d}")


if __name__ == "__main__":
    main()
