#!/usr/bin/env python3
"""K/V memory by use: what N short conversations cost a server's prefix cache.

    python3 scripts/kv-by-use.py --vela BIN [--vela BIN2 ...] --model M.gguf [--device cuda]
        [--ctx 32768] [--n 20] [--max-tokens 16]

Each binary is started in turn as `vela serve --ctx CTX --cache-mb 1048576` (a cache budget that
evicts nothing), then N distinct ~150-token prompts run one after another (`/v1/completions`: a
synth model has no chat template). Printed per binary: the prefix cache's sessions and bytes
(`/metrics`), the bytes per cached session, the
GPU memory in use (nvidia-smi, with --device cuda) before the first request and after the last,
and the wall time of the requests. A cache allocated whole costs CTX positions per session; one
held by use costs the positions it has (rounded up to a block or page per layer).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
bench = __import__("bench-serve")


def metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        out = {}
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#") and " " in line:
                k, v = line.rsplit(" ", 1)
                try:
                    out[k] = float(v)
                except ValueError:
                    pass
        return out


def gpu_used_mib() -> float | None:
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=20)
        return float(q.stdout.split()[0])
    except Exception:
        return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vela", action="append", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=16)
    a = ap.parse_args()
    print("| binary | sessions | cache MB | MB / session | GPU MiB before | GPU MiB after | requests s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for binary in a.vela:
        port = bench.free_port()
        cmd = [binary, "serve", "--model", a.model, "--port", str(port), "--device", a.device,
               "--ctx", str(a.ctx), "--parallel", "1", "--cache-mb", "1048576"]
        srv = bench.Server(cmd, port)
        try:
            before = gpu_used_mib()
            t0 = time.time()
            for i in range(a.n):
                r = bench.one_request(port, bench.prompt(i, i), a.max_tokens, "completions")
                if not r["tokens"]:
                    raise SystemExit(f"request {i} generated nothing")
            took = time.time() - t0
            m = metrics(port)
            after = gpu_used_mib()
        finally:
            srv.stop()
        n, b = m.get("vela_prefix_cache_sessions", 0), m.get("vela_prefix_cache_bytes", 0)
        fmt = lambda x: "-" if x is None else f"{x:,.0f}"  # noqa: E731
        print(f"| {binary} | {n:.0f} | {b / 2**20:,.1f} | {b / 2**20 / max(n, 1):,.1f} | "
              f"{fmt(before)} | {fmt(after)} | {took:.1f} |", flush=True)


if __name__ == "__main__":
    main()
