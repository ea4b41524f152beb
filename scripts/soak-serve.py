#!/usr/bin/env python3
"""Soak test of `vela serve`: many streaming clients for minutes, with random lengths, random
disconnects and prefix-sharing conversations.

    cargo build --release -p vela-server --example serve
    python3 scripts/soak-serve.py [--model M.gguf] [--bin target/release/examples/serve]
        [--clients 64] [--minutes 10] [--parallel 8] [--queue 64] [--ctx 2048] [--threads 2]
        [--seed 1]

Each client loops until the time is up: it continues one of a few multi-turn conversations (a
shared system prompt, its earlier turns sent back, so prompts share prefixes with other clients'
and its own earlier requests) or starts a fresh one, asks for 1-96 tokens (greedy or sampled),
streams the answer, and in one request of five closes the connection after a random number of
chunks. Checked: every request ends with 200 and a well-formed stream (`[DONE]`), or 429 with
`Retry-After` (the queue is full: deliberate), or the client's own disconnect; nothing else
counts as an error. The server's RSS is sampled every 5 s: reported after warm-up (the first
quarter of the run), per minute and at the end. From the server's log (JSON lines): the engine
steps that ran
after each cancellation (`request cancelled during ...; N engine step(s) ran after the cancel`):
the most any cancellation saw must be 1. Exit status 1 when a check fails.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_harness import Server  # noqa: E402

CACHE = Path(os.environ.get("VELA_CACHE", str(Path.home() / ".cache" / "vela")))
SYSTEMS = [
    "You are a helpful assistant who answers briefly.",
    "You are a patient teacher of geography. Give one fact per answer.",
    "You are a Python expert. Answer with short code when useful.",
]
ASKS = ["Name a river in {x}.", "Write one line about {x}.", "What is {x} known for?",
        "Give a number between 1 and {n}.", "Translate 'good morning' for a visitor to {x}.",
        "Write a function that returns {n} squared.", "Summarise our talk so far in a sentence."]
PLACES = ["France", "Peru", "Japan", "Kenya", "Norway", "Chile", "Egypt", "Canada", "India"]


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.n = {"ok": 0, "429": 0, "disconnected": 0, "errors": 0, "tokens": 0}
        self.errors: list[str] = []

    def add(self, k: str, v: int = 1, err: str | None = None):
        with self.lock:
            self.n[k] += v
            if err and len(self.errors) < 20:
                self.errors.append(err)


def request(port: int, body: dict, drop_after: int | None, st: Stats) -> str | None:
    """One streamed chat request; the answer's text, or None when it did not complete."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    try:
        c.request("POST", "/v1/chat/completions", json.dumps(body),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status == 429:
            if not r.getheader("Retry-After"):
                st.add("errors", err="429 without Retry-After")
            else:
                st.add("429")
            r.read()
            return None
        if r.status != 200:
            st.add("errors", err=f"HTTP {r.status}: {r.read()[:200]!r}")
            return None
        text, chunks, done = [], 0, False
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            ev = json.loads(line[6:])
            if "error" in ev:
                st.add("errors", err=f"stream error: {ev['error']}")
                return None
            for ch in ev.get("choices") or []:
                d = ch.get("delta") or {}
                if d.get("content"):
                    text.append(d["content"])
                    chunks += 1
            if drop_after is not None and chunks >= drop_after:
                st.add("disconnected")
                return None
        if not done:
            st.add("errors", err="stream ended without [DONE]")
            return None
        st.add("ok")
        st.add("tokens", chunks)
        return "".join(text)
    except (OSError, http.client.HTTPException, json.JSONDecodeError) as e:
        st.add("errors", err=repr(e))
        return None
    finally:
        c.close()


def client(port: int, seed: int, until: float, st: Stats):
    rng = random.Random(seed)
    convo: list[dict] = []
    while time.time() < until:
        if not convo or len(convo) > 8 or rng.random() < 0.2:
            convo = [{"role": "system", "content": rng.choice(SYSTEMS)}]
        ask = rng.choice(ASKS).format(x=rng.choice(PLACES), n=rng.randint(2, 999))
        msgs = convo + [{"role": "user", "content": ask}]
        body = {"messages": msgs, "max_tokens": rng.randint(1, 96), "stream": True,
                "temperature": rng.choice([0, 0.7]), "seed": rng.randint(0, 1 << 30)}
        drop = rng.randint(1, 20) if rng.random() < 0.2 else None
        answer = request(port, body, drop, st)
        if answer is not None:
            convo = msgs + [{"role": "assistant", "content": answer}]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(CACHE / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
    ap.add_argument("--bin", default="target/release/examples/serve")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--queue", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    srv = Server(a, ["--parallel", str(a.parallel), "--queue", str(a.queue), "--ctx", str(a.ctx),
                     "--device", "cpu", "--log-format", "json"], tag="vela-soak")
    port = srv.port
    st = Stats()
    start = time.time()
    until = start + a.minutes * 60
    ts = [threading.Thread(target=client, args=(port, a.seed * 1000 + i, until, st), daemon=True)
          for i in range(a.clients)]
    for t in ts:
        t.start()
    samples = []
    while any(t.is_alive() for t in ts):
        samples.append((time.time() - start, srv.rss_kb()))
        time.sleep(5)
    for t in ts:
        t.join()
    metric = {k: srv.metric(k) for k in ("vela_prefix_cache_sessions",
                                         "vela_cached_prompt_tokens_total", "vela_prompt_tokens_total")}
    srv.stop()
    after = [int(m.group(1)) for m in re.finditer(r"(\d+) engine step\(s\) ran after the cancel",
                                                 srv.logtext())]
    warm = [kb for t, kb in samples if t >= a.minutes * 15]
    ok = st.n["errors"] == 0 and (not after or max(after) <= 1)
    print(json.dumps({
        "minutes": a.minutes, "clients": a.clients, "parallel": a.parallel, **st.n,
        "rss_mb_after_warmup": round(warm[0] / 1024, 1) if warm else None,
        "rss_mb_end": round(samples[-1][1] / 1024, 1) if samples else None,
        "rss_mb_max": round(max(kb for _, kb in samples) / 1024, 1) if samples else None,
        "rss_mb_per_minute": [round(kb / 1024) for t, kb in samples if int(t) % 60 < 5],
        "cancellations_logged": len(after), "max_steps_after_cancel": max(after, default=0),
        "prefix_cache_sessions": metric["vela_prefix_cache_sessions"],
        "cached_prompt_tokens": metric["vela_cached_prompt_tokens_total"],
        "prompt_tokens": metric["vela_prompt_tokens_total"],
        "first_errors": st.errors[:5],
    }, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
