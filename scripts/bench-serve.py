#!/usr/bin/env python3
"""Serving under load: vela serve vs llama-server, interleaved, same GGUF.

    python3 scripts/bench-serve.py --model M.gguf [--vela target/release/vela]
        [--llama-server PATH] [--clients 1,4,16,64] [--reps 3] [--requests 2] [--max-tokens 64]
        [--threads 2] [--ctx 1024] [--device cpu|cuda] [--engines vela,llama]
        [--endpoint chat|completions] [--ignore-eos] [--timings] [--out FILE.md]

For each concurrency C and repetition (the engines' order alternates per repetition), each engine
is started with C sequences (vela: `--parallel C --ctx CTX`; llama-server: `-np C -c C*CTX`, its
continuous batching), then C streaming clients each send `--requests` chat requests one after
another (distinct prompts of ~150-250 tokens, greedy, `max_tokens`). Reported per engine and C:
aggregate generated tokens/s over the run's wall time, TTFT p50/p99 and inter-token latency p99
(gaps between streamed content chunks), median over the repetitions with the min-max spread, and
vela/llama ratios. llama-server: `bash scripts/build-llama-cpp.sh server` (llama.cpp 0c1e570);
with `--device cuda` vela runs on the GPU and llama-server offloads every layer (`-ngl 99`; its
CUDA build: scripts/build-llama-cpp-cuda.sh, run by scripts/gpu-serve.sh).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

CACHE = Path(os.environ.get("VELA_CACHE", str(Path.home() / ".cache" / "vela")))
TOPICS = ["a lighthouse keeper", "a robot learning to paint", "the last bookshop in a city",
          "a cat who runs a bakery", "two rival chess players", "a storm at sea", "a lost key",
          "an old map", "a garden on Mars", "a violin maker", "a winter market", "a night train"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prompt(client: int, i: int) -> str:
    topic = TOPICS[(client * 7 + i) % len(TOPICS)]
    ctx = " ".join(f"Note {k}: the story should mention {TOPICS[(client + k) % len(TOPICS)]}."
                   for k in range(8 + (client + i) % 6))
    return f"Client {client}, request {i}. {ctx} Write a short story about {topic}."


class Server:
    def __init__(self, cmd: list[str], port: int):
        self.port = port
        self.p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t0 = time.time()
        while time.time() - t0 < 120:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception:
                pass
            if self.p.poll() is not None:
                raise SystemExit(f"server exited: {' '.join(cmd)}")
            time.sleep(0.3)
        self.stop()
        raise SystemExit(f"server not ready: {' '.join(cmd)}")

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()


IGNORE_EOS = False


def one_request(port: int, text: str, max_tokens: int, endpoint: str = "chat") -> dict:
    """One streamed greedy request: a chat message, or the raw text as a `/v1/completions` prompt
    (models without a chat template, such as `vela synth` files)."""
    body = {"max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if IGNORE_EOS:
        body["ignore_eos"] = True
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": text}]
        route = "chat/completions"
    else:
        body["prompt"] = text
        route = "completions"
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/{route}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    times, usage, timings = [], None, None
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            if isinstance(ev.get("timings"), dict):
                timings = ev["timings"]
            for c in ev.get("choices") or []:
                d = c.get("delta") or {}
                if d.get("content") or d.get("reasoning_content") or c.get("text"):
                    times.append(time.perf_counter())
    n = (usage or {}).get("completion_tokens") or len(times)
    return {"ttft": (times[0] - t0) if times else None,
            "gaps": [b - a for a, b in zip(times, times[1:])], "tokens": n, "timings": timings or {}}


def run_load(port: int, clients: int, requests: int, max_tokens: int, endpoint: str) -> dict:
    results, errors = [], []
    lock = threading.Lock()

    def client(c: int):
        for i in range(requests):
            try:
                r = one_request(port, prompt(c, i), max_tokens, endpoint)
                with lock:
                    results.append(r)
            except Exception as e:  # noqa: BLE001 - counted and reported
                with lock:
                    errors.append(repr(e))

    t0 = time.perf_counter()
    ts = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    ttft = sorted(r["ttft"] for r in results if r["ttft"] is not None)
    gaps = sorted(g for r in results for g in r["gaps"])
    pct = lambda xs, q: xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")
    # The server's own account of each request (`timings` of the last chunk: vela's queue /
    # session / restore / prompt / checkpoint / ttft, llama-server's prompt and predicted times).
    keys = sorted({k for r in results for k, v in r["timings"].items() if isinstance(v, (int, float))})
    timings = {k: [r["timings"][k] for r in results if k in r["timings"]] for k in keys}
    return {"tps": sum(r["tokens"] for r in results) / wall, "ttft50": pct(ttft, 0.5),
            "ttft99": pct(ttft, 0.99), "itl99": pct(gaps, 0.99), "errors": len(errors),
            "wall": wall, "timings": timings}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--vela", default="target/release/vela")
    ap.add_argument("--llama-server", default=str(CACHE / "llama-server" / "bin" / "llama-server"))
    ap.add_argument("--clients", default="1,4,16,64")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--requests", type=int, default=2, help="requests per client per run")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=1024, help="context per sequence")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--engines", default="vela,llama", help="which engines run, in this order")
    ap.add_argument("--endpoint", default="chat", choices=["chat", "completions"],
                    help="completions: raw prompts, for models without a chat template (vela synth)")
    ap.add_argument("--ignore-eos", action="store_true",
                    help="every request generates max_tokens (both engines take `ignore_eos`)")
    ap.add_argument("--timings", action="store_true",
                    help="print the servers' per-request `timings` (medians) after each run")
    ap.add_argument("--out")
    a = ap.parse_args()
    global IGNORE_EOS
    IGNORE_EOS = a.ignore_eos
    gpu = ["-ngl", "99"] if a.device == "cuda" else []
    engines = {
        "vela": lambda c, port: [a.vela, "serve", "--model", a.model, "--port", str(port),
                                 "--threads", str(a.threads), "--parallel", str(c),
                                 "--ctx", str(a.ctx), "--device", a.device],
        "llama": lambda c, port: [a.llama_server, "-m", a.model, "--port", str(port),
                                  "-t", str(a.threads), "-tb", str(a.threads), "-np", str(c),
                                  "-c", str(c * a.ctx), "--no-webui", *gpu],
    }
    engines = {e: engines[e] for e in a.engines.split(",")}
    res: dict = {}
    for c in [int(x) for x in a.clients.split(",")]:
        for rep in range(a.reps):
            order = list(engines) if rep % 2 == 0 else list(engines)[::-1]
            for name in order:
                port = free_port()
                srv = Server(engines[name](c, port), port)
                try:
                    one_request(port, "Warm up.", 4, a.endpoint)
                    r = run_load(port, c, a.requests, a.max_tokens, a.endpoint)
                finally:
                    srv.stop()
                res.setdefault((name, c), []).append(r)
                print(f"C={c} rep {rep} {name}: {r['tps']:.1f} tok/s, TTFT p50 {r['ttft50']*1e3:.0f} ms "
                      f"p99 {r['ttft99']*1e3:.0f} ms, ITL p99 {r['itl99']*1e3:.0f} ms, "
                      f"{r['errors']} errors, {r['wall']:.1f} s", flush=True)
                if a.timings:
                    keep = ("queue_ms", "session_ms", "restore_ms", "cache_load_ms", "prompt_n",
                            "prompt_ms", "checkpoint_ms", "ttft_ms", "predicted_n", "predicted_ms")
                    print("    server timings, median (max): " + ", ".join(
                        f"{k} {statistics.median(v):.1f} ({max(v):.1f})"
                        for k, v in r["timings"].items() if k in keep), flush=True)
    med = lambda xs: statistics.median(xs)
    lines = ["| clients | engine | tok/s (median, min-max) | TTFT p50 ms | TTFT p99 ms | ITL p99 ms | errors |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for (name, c), rs in res.items():
        tps = [r["tps"] for r in rs]
        lines.append(f"| {c} | {name} | {med(tps):.1f} ({min(tps):.1f}-{max(tps):.1f}) | "
                     f"{med([r['ttft50'] for r in rs])*1e3:.0f} | {med([r['ttft99'] for r in rs])*1e3:.0f} | "
                     f"{med([r['itl99'] for r in rs])*1e3:.0f} | {sum(r['errors'] for r in rs)} |")
    lines.append("")
    for c in sorted({c for _, c in res}):
        v, l = res.get(("vela", c)), res.get(("llama", c))
        if v and l:
            lines.append(f"C={c}: vela/llama tok/s {med([r['tps'] for r in v]) / med([r['tps'] for r in l]):.2f}, "
                         f"TTFT p50 {med([r['ttft50'] for r in v]) / med([r['ttft50'] for r in l]):.2f}")
    for name in engines:
        one = res.get((name, 1))
        for c in sorted({c for _, c in res if c > 1}):
            if one and res.get((name, c)):
                lines.append(f"{name}: C={c} aggregate / C=1 = "
                             f"{med([r['tps'] for r in res[(name, c)]]) / med([r['tps'] for r in one]):.2f}x")
    text = "\n".join(lines)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
