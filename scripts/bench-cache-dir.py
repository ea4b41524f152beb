#!/usr/bin/env python3
"""The persistent prefix cache (`vela serve --cache-dir`) against re-evaluating the prompt.

One round: a server with a fresh cache directory evaluates a long prompt (turn one) and is
stopped with SIGTERM (it saves the sequence); a new server on the same directory answers turn
two (the same prompt plus a few tokens) from the saved sequence: load time (`timings.
cache_load_ms`) plus the new tokens' evaluation. Against it, a server without the directory
answers turn two from scratch (`timings.prompt_ms`). Rounds interleave; the median, min and max
of each, and the ratio, are printed as a Markdown table.

  python3 scripts/bench-cache-dir.py --vela target/release/vela --model MODEL.gguf \
      [--tokens 4096] [--rounds 3] [--device cpu] [--threads 2]
"""
import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Server:
    def __init__(self, a, cache_dir=None):
        self.port = free_port()
        cmd = [a.vela, "serve", "--model", a.model, "--port", str(self.port),
               "--ctx", str(2 * a.tokens + 256), "--device", a.device, "--threads", str(a.threads)]
        if cache_dir:
            cmd += ["--cache-dir", cache_dir]
        self.p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t0 = time.time()
        while time.time() - t0 < 300:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception:
                time.sleep(0.2)
        raise RuntimeError("server did not start")

    def post(self, path, body, timeout):
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.load(r)

    def complete(self, prompt):
        return self.post("/v1/completions", {"prompt": prompt, "max_tokens": 1, "temperature": 0}, 1800)

    def tokenize(self, text):
        return self.post("/tokenize", {"content": text}, 60)["tokens"]

    def detokenize(self, tokens):
        return self.post("/detokenize", {"tokens": tokens}, 60)["content"]

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        self.p.wait(timeout=300)


def stats(v):
    return f"{statistics.median(v):,.0f} [{min(v):,.0f}–{max(v):,.0f}]"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vela", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    # Trimmed to the count by the server's own tokenizer.
    text = "the tide turned slowly under a pale sky while gulls circled the harbour " * (a.tokens // 8)
    s = Server(a)
    turn1 = s.detokenize(s.tokenize(text)[: a.tokens])
    s.stop()
    turn2 = turn1 + " and then the wind rose"
    load, cold, size, n_cached, n_prompt = [], [], [], [], [], []
    for r in range(a.rounds):
        d = tempfile.mkdtemp(prefix="vela-cache-bench-")
        try:
            s = Server(a, d)
            s.complete(turn1)
            s.stop()
            size.append(sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)))
            s = Server(a, d)
            v = s.complete(turn2)
            s.stop()
            t = v["timings"]
            load.append(t["cache_load_ms"] + t["prompt_ms"])
            parts = f"load {t['cache_load_ms']:,.0f} ms + {t['prompt_n']} tokens {t['prompt_ms']:,.0f} ms"
            n_cached.append(v["usage"]["prompt_tokens_details"]["cached_tokens"])
            s = Server(a)
            v = s.complete(turn2)
            s.stop()
            cold.append(v["timings"]["prompt_ms"])
            n_prompt.append(v["usage"]["prompt_tokens"])
            print(f"round {r + 1}: {parts}, "
                  f"re-evaluating {n_prompt[-1]} tokens {cold[-1]:,.0f} ms", flush=True)
        finally:
            shutil.rmtree(d, ignore_errors=True)
    print()
    print(f"| model | prompt tokens | cached after restart | file MiB | load + rest ms | re-evaluate ms | speed-up |")
    print("|---|---:|---:|---:|---|---|---:|")
    print(f"| {os.path.basename(a.model)} ({a.device}, {a.threads} threads) | {n_prompt[0]} | "
          f"{n_cached[0]} | {statistics.median(size) / 2**20:.1f} | {stats(load)} | {stats(cold)} | "
          f"{statistics.median(cold) / statistics.median(load):.1f}x |")


if __name__ == "__main__":
    main()
