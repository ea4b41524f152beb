#!/usr/bin/env python3
"""Throughput of the Flyweight runtime (PyPI `flyweight-llm`) on a GGUF, in bench-vs-llama.py's terms.

    python3 scripts/bench-flyweight.py MODEL.gguf [-p 512] [-n 128] [--reps 3] [--threads 2]
        [--flyweight 'PY'] [--fw-args='--expert-mode cpu'] [--fw-mode api|cli] [--out F] [--json-out F]

PY is a Python command that can `import flyweight` (default: the interpreter running this script;
e.g. `/tmp/fwvenv/bin/python`, or `env PYTHONPATH=/tmp/site python3`). Each repetition is a fresh
process (like `llama-bench -r 1` / `vela bench -r 1` in bench-vs-llama.py, which can also run
Flyweight interleaved with vela and llama.cpp: its `--flyweight PY`). Prints, per test, the median
and min-max t/s over the repetitions as a markdown row.

Two ways to measure (--fw-mode):

  api (default)  a small driver inside Flyweight's Python (the DRIVER below) parses --fw-args with
                 `flyweight benchmark`'s own parser (so every placement flag means what it means
                 there), opens the model, prepares it, runs a warm-up (one p-token prompt and 2
                 decode steps, like llama-bench's and vela bench's), then
                   pp: a fresh sequence of p random token ids, timed to its first output token
                       (prefill + LM head + sampling: llama-bench's pp);
                   tg: a fresh sequence of 1 random token, then n tokens one at a time, timed from
                       the first output token to the last (llama-bench's tg: depth ~0).
                 It also reports Flyweight's own counters: native prefill t/s, expert-cache hits /
                 misses / admissions (decode), bytes streamed during prefill, the placement.
                 DeepSeek-V4 (`deepseek4`) goes through Flyweight's separate Deepseek4Runtime,
                 as `flyweight serve/generate` do (`flyweight benchmark` does not: its runtime
                 says it cannot execute deepseek4).
  cli            runs the stock `PY -m flyweight benchmark MODEL --tokens <p random ids>
                 --warmup 3 --iterations n`: pp = prompt_tokens / prompt_and_first_token_seconds
                 (the first, cold prefill of the process: no warm-up), tg = decode_tokens_per_second
                 (decode *after* the p-token prompt, i.e. at depth p). A cross-check of `api`.

Placement (Flyweight's flags, via --fw-args; `flyweight benchmark --help` lists them; GPU lines
unverified here, where no GPU was available):
  all on the GPU       --expert-mode resident   (refuses to start unless every expert fits; prompt
                                                 and decode experts on the GPU)
                       Gemma 4: its runtime says "supports --moe-device cpu or hybrid", so resident
                       is refused; use --expert-mode auto -ngl all --hybrid-prefill split
                       (-ngl all: every MoE layer's whole expert set pinned on the GPU)
  experts on the CPU   --expert-mode cpu        (no GPU expert cache)
  CPU + GPU cache      --expert-mode auto --gpu-cache-mib M (--expert-mode auto is the default).
                       The help calls M the expert cache's VRAM; the code calls it the whole CUDA
                       budget (weights + KV + workspace + cache): check what M buys with
                       `flyweight plan MODEL --json --gpu-cache-mib M` (expert_cache_bytes, _slots);
                       0 = fit the cache to free VRAM. Under auto, prompt experts run on the CPU
                       unless --hybrid-prefill split (or --routed-moe).
  CPU backend          --backend cpu            (forces --expert-mode cpu; its kernels are the CUDA
                       ones emulated on fibers: a 6-layer 256-wide Gemma 4 decodes ~0.02 t/s on one
                       thread, so it is no performance peer)
  DeepSeek-V4: routed experts always on the host; --gpu-cache-mib M = the GPU expert-cache size
  (0 = fill free VRAM); FLYWEIGHT_DS4_EXPERT_CACHE_MIB=off (environment) = no GPU expert cache;
  --expert-mode, -ngl, --cpu-threads are refused. Untested (no DeepSeek-V4 GGUF here).
--threads T becomes --cpu-threads T (CPU expert workers) unless --fw-args sets it, plus
OMP_NUM_THREADS=T and FLYWEIGHT_CPU_THREADS=T in the environment (the CPU backend's pool).
The context is p + n + 64 (at least 2048, flyweight's default) unless --fw-args sets --context.

Installing Flyweight on a machine without network (Python >= 3.11; the wheel is
py3-none-manylinux_2_28 and carries its own C++ runtime, flyweight/_native/flyweight_v2.so). Here,
download the wheels for the target's Python (3.12 on the GPU machines; target/gpu-data/fw/ holds
flyweight-llm 0.23.1, Jinja2, MarkupSafe and numpy for cp312):

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d DIR flyweight-llm jinja2 markupsafe numpy

(numpy is needed only for DeepSeek-V4). There:

    pip install --no-index --no-deps --target /tmp/site DIR/flyweight*.whl DIR/jinja2*.whl \
        DIR/markupsafe*.whl DIR/numpy*.whl
    export PYTHONPATH=/tmp/site CUDA_PATH=/usr/local/cuda    # NVRTC + headers (cuda_fp16.h, CCCL)
    python3 -m flyweight doctor                               # says what is missing
    python3 scripts/bench-flyweight.py --flyweight python3 MODEL.gguf --fw-args='--expert-mode cpu'

Gotchas: nothing CUDA is in the wheel: at startup it dlopens libcuda.so.1 and libnvrtc.so(.12/.13),
compiles its kernel corpus with NVRTC in every process (no cache of its own; in open_s or
prepare_s, both reported) and reads the CUDA headers, CCCL included, from CUDA_PATH / CUDA_HOME /
/opt/cuda / /usr/local/cuda. It writes no cache for a GGUF
(FLYWEIGHT_HF_CACHE / $XDG_CACHE_HOME/flyweight only for packed safetensors checkpoints; the
driver's PTX JIT cache is ~/.nv/ComputeCache, CUDA_CACHE_PATH moves it). --gpu-cache-mib 0 sizes
the expert cache from free VRAM at load, so run alone on the card. Gemma 4 MoE needs Q4_0 routed
experts (the QAT release) and f32 expert scales.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

MARK = "FLYWEIGHT_BENCH_RESULT "

# Runs inside Flyweight's interpreter: argv = [SPEC_JSON, *flyweight benchmark flags].
DRIVER = r'''
import json, random, sys, time
spec = json.loads(sys.argv[1])
flags = sys.argv[2:]
from flyweight import cli
from flyweight.v2 import V2Model

p, n = spec["p"], spec["n"]
args = cli._parser().parse_args(["benchmark", spec["model"], *flags])
cli._validate_runtime_args(args)
if not any(f == "--context" or f.startswith("--context=") for f in flags):
    args.context = max(args.context, p + n + 64)
out = {"backend": cli._select_backend(args), "flags": flags}
rng = random.Random(spec["seed"])
clock = time.perf_counter
MIB = 1024 * 1024

def delta(before, after, keys):
    return {k: int(after.get(k, 0)) - int(before.get(k, 0)) for k in keys}

def rate(tokens, seconds):
    return tokens / seconds if seconds > 0 else 0.0

def qwen_family(model, rand):
    if args.cpu_threads == 0 and spec["threads"]:
        args.cpu_threads = spec["threads"]
    options = cli._runtime_options(args)
    options["context_limit"] = args.context
    keep = lambda t: True
    cache_keys = ("expert_cache_hits", "expert_cache_misses", "expert_cache_admissions",
                  "expert_cache_evictions", "prefill_streamed_bytes", "prefix_cache_reused_tokens",
                  "prefill_tokens", "prefill_nanoseconds", "decode_calls", "decode_nanoseconds",
                  "expert_page_nanoseconds", "expert_compute_nanoseconds")
    with model.native_runtime(**options) as rt:
        t = clock(); rt.prepare(); out["prepare_s"] = clock() - t
        info = rt.info
        out["placement"] = {k: info[k] for k in (
            "expert_mode", "expert_fallback_reason", "gpu_allocated_bytes", "static_tensor_bytes",
            "expert_tensor_bytes", "expert_cache_bytes", "expert_cache_slots", "host_ffn_layers",
            "cache_type_k", "cache_type_v", "context_limit")}
        try:
            placement = rt.placement
            out["placement"].update({k: placement[k] for k in (
                "gpu_budget_bytes", "gpu_expert_layers", "expert_bundles", "moe_layers")
                if k in placement})
        except Exception as error:  # the placement report is informational
            out["placement_error"] = str(error)
        bundles = out["placement"].get("expert_bundles") or 0
        bundle = info["expert_tensor_bytes"] // bundles if bundles else 0  # one layer's expert
        out["placement"]["expert_bundle_bytes"] = bundle
        rt.generate(rand(max(p, 8)), 3, keep)                     # warm-up
        if p:
            rt.reset(); before = rt.info
            t = clock(); rt.generate(rand(p), 1, keep); seconds = clock() - t
            d = delta(before, rt.info, cache_keys)
            out["pp"] = rate(p, seconds)
            out["pp_native"] = rate(d["prefill_tokens"], d["prefill_nanoseconds"] / 1e9)
            d["expert_upload_bytes_est"] = d["expert_cache_admissions"] * bundle
            out["pp_counters"] = d
        if n:
            rt.reset(); arrivals = []; before = rt.info
            rt.generate(rand(1), n + 1, lambda tok: arrivals.append(clock()) or True)
            d = delta(before, rt.info, cache_keys)
            out["tg"] = rate(n, arrivals[-1] - arrivals[0])
            lookups = d["expert_cache_hits"] + d["expert_cache_misses"]
            d["expert_cache_hit_rate"] = d["expert_cache_hits"] / lookups if lookups else None
            d["expert_upload_bytes_est"] = d["expert_cache_admissions"] * bundle
            out["tg_counters"] = d

def deepseek4(model, rand):
    import numpy as np
    from flyweight.deepseek4 import Deepseek4Runtime
    base = cli._parser().parse_args(["benchmark", spec["model"]])
    bad = [k for k in cli._DEEPSEEK4_UNSUPPORTED if getattr(args, k, None) != getattr(base, k, None)]
    if bad:
        raise SystemExit("flyweight's DeepSeek-V4 runtime does not take "
                         + ", ".join("--" + k.replace("_", "-") for k in sorted(bad)))
    ck, cv = (args.kv_dtype, args.kv_dtype) if args.kv_dtype else (args.cache_type_k, args.cache_type_v)
    rt = Deepseek4Runtime(model, args.context, cache_type_k=ck, cache_type_v=cv,
                          gpu_cache_bytes=args.gpu_cache_mib * MIB)
    keys = ("expert_cache_hits", "expert_cache_misses", "expert_cache_evictions",
            "routed_expert_bytes", "expert_prefetch_bytes", "prefill_tokens", "prefill_nanoseconds",
            "forward_calls")
    with rt:
        t = clock()
        if out["backend"] != "cpu":
            rt.use_gpu(args.device)
        out["prepare_s"] = clock() - t
        info = rt.info
        out["placement"] = {k: int(info[k]) for k in ("gpu_weight_bytes", "expert_cache_bytes",
                                                      "expert_cache_slots", "gpu_cache_bytes")}
        def prompt(tokens):
            rt.prefill(tokens[:-1]); return rt.forward(tokens[-1])
        rt.reset(); logits = prompt(rand(max(p, 8)))              # warm-up
        for _ in range(2):
            logits = rt.forward(int(np.argmax(logits)))
        if p:
            rt.reset(); before = rt.info
            t = clock(); prompt(rand(p)); seconds = clock() - t
            d = delta(before, rt.info, keys)
            out["pp"] = rate(p, seconds)
            out["pp_native"] = rate(d["prefill_tokens"], d["prefill_nanoseconds"] / 1e9)
            out["pp_counters"] = d
        if n:
            rt.reset(); logits = rt.forward(rand(1)[0]); before = rt.info
            t = clock()
            for _ in range(n):
                logits = rt.forward(int(np.argmax(logits)))
            seconds = clock() - t
            d = delta(before, rt.info, keys)
            out["tg"] = rate(n, seconds)
            lookups = d["expert_cache_hits"] + d["expert_cache_misses"]
            d["expert_cache_hit_rate"] = d["expert_cache_hits"] / lookups if lookups else None
            out["tg_counters"] = d

t = clock()
with V2Model(args.model) as model:
    out["open_s"] = clock() - t
    out["arch"] = str(model.config["architecture"])
    vocab = int(model.config["vocabulary_size"])
    rand = lambda k: [rng.randrange(vocab) for _ in range(k)]
    (deepseek4 if out["arch"] == "deepseek4" else qwen_family)(model, rand)
print("''' + MARK + r'''" + json.dumps(out), flush=True)
'''


def gguf_vocab_size(path: Path) -> int:
    """Length of `tokenizer.ggml.tokens` in a GGUF's metadata (stdlib only)."""
    scalar = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    with open(path, "rb") as f:
        def u(fmt):
            return struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))[0]

        def skip_string():
            f.seek(u("Q"), 1)

        def skip(vtype):
            if vtype in scalar:
                f.seek(scalar[vtype], 1)
            elif vtype == 8:
                skip_string()
            elif vtype == 9:
                etype, count = u("I"), u("Q")
                if etype in scalar:
                    f.seek(scalar[etype] * count, 1)
                else:
                    for _ in range(count):
                        skip(etype)
            else:
                raise ValueError(f"{path}: unknown GGUF value type {vtype}")

        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        u("I"), u("Q")
        for _ in range(u("Q")):
            key = f.read(u("Q")).decode()
            vtype = u("I")
            if key == "tokenizer.ggml.tokens" and vtype == 9:
                u("I")
                return u("Q")
            skip(vtype)
    raise ValueError(f"{path} has no tokenizer.ggml.tokens")


def _env(threads: int) -> dict:
    env = dict(os.environ)
    if threads:
        env.setdefault("OMP_NUM_THREADS", str(threads))
        env.setdefault("FLYWEIGHT_CPU_THREADS", str(threads))
    return env


def _run(cmd: list[str], env: dict) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"flyweight failed ({r.returncode}): {(r.stderr or r.stdout).strip()[-600:]}")
    return r


def flyweight_bench(py: str, model: Path, p: int, n: int, threads: int, extra: list[str] = (),
                    depth: int = 0, mode: str = "api", seed: int = 42) -> dict:
    """One fresh-process measurement: {"pp": t/s, "tg": t/s, ...Flyweight's counters}."""
    if depth:
        raise RuntimeError("flyweight: --depth is not supported (its prefix reuse is not driven here)")
    extra = list(extra)
    if threads and mode == "cli" and not any(a.startswith("--cpu-threads") for a in extra):
        extra += ["--cpu-threads", str(threads)]
    if mode == "api":
        spec = {"model": str(model), "p": p, "n": n, "threads": threads, "seed": seed}
        r = _run(shlex.split(py) + ["-c", DRIVER, json.dumps(spec)] + extra, _env(threads))
        line = next((ln for ln in reversed(r.stdout.splitlines()) if ln.startswith(MARK)), None)
        if line is None:
            raise RuntimeError(f"flyweight driver printed no result: {r.stdout[-300:]!r}")
        return json.loads(line[len(MARK):])
    if n < 3:
        raise RuntimeError("flyweight benchmark (cli mode) needs -n >= 3")
    rng = random.Random(seed)
    vocab = gguf_vocab_size(model)
    tokens = ",".join(str(rng.randrange(vocab)) for _ in range(max(p, 1)))
    context = [] if any(a.startswith("--context") for a in extra) else ["--context", str(max(2048, p + n + 64))]
    cmd = shlex.split(py) + ["-m", "flyweight", "benchmark", str(model), "--tokens", tokens, "--warmup", "3",
                             "--iterations", str(n)] + context + extra
    r = _run(cmd, _env(threads))
    obj = json.loads(r.stdout)
    counters = obj.get("request_counters") or {}
    if counters and not counters["expert_cache_hits"] + counters["expert_cache_misses"]:
        counters["expert_cache_hit_rate"] = None      # flyweight prints 0.0 when nothing was looked up
    res = {"tg": float(obj["decode_tokens_per_second"]), "prepare_s": obj["prepare_seconds"],
           "backend": "cpu" if "running on the CPU backend" in r.stderr else "gpu",
           "execution": obj["execution"], "tg_counters": counters}
    if p:
        res["pp"] = obj["prompt_tokens"] / obj["prompt_and_first_token_seconds"]
    return res


def summary(xs: list[float]) -> str:
    if not xs:
        return "n/a"
    f = ".1f" if min(xs) >= 1 else ".3g"
    return f"{statistics.median(xs):{f}} [{min(xs):{f}}–{max(xs):{f}}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", help=".gguf paths, comma separated")
    ap.add_argument("--flyweight", default=shlex.quote(sys.executable), metavar="PY",
                    help="Python command that can import flyweight (default: this interpreter)")
    ap.add_argument("--fw-args", default="", help="extra `flyweight benchmark` flags, e.g. '--expert-mode cpu'")
    ap.add_argument("--fw-mode", choices=("api", "cli"), default="api")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="CPU threads (0: flyweight picks)")
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--out", help="also write the markdown report here")
    ap.add_argument("--json-out", help="write every sample (with Flyweight's counters) as JSON here")
    a = ap.parse_args()
    if a.reps < 1:
        ap.error("--reps must be >= 1")
    tests = [t for t, k in (("pp", a.p), ("tg", a.n)) if k > 0]
    if not tests:
        ap.error("-p and -n are both 0")
    models = [(Path(m).stem, Path(m)) for m in a.models.split(",")]
    for _, path in models:
        if not path.is_file():
            sys.exit(f"error: model {path} missing")
    fargs = shlex.split(a.fw_args)
    samples: dict = {k: {t: [] for t in tests} for k, _ in models}
    raw: dict = {k: [] for k, _ in models}
    for rep in range(a.reps):
        for key, path in models:
            t0 = time.time()
            r = flyweight_bench(a.flyweight, path, a.p, a.n, a.threads, fargs, mode=a.fw_mode)
            raw[key].append(r)
            for t in tests:
                samples[key][t].append(r[t])
            shown = "  ".join(f"{t}{a.p if t == 'pp' else a.n} {r[t]:8.{'1f' if r[t] >= 1 else '3g'}} t/s"
                              for t in tests)
            hit = (r.get("tg_counters") or {}).get("expert_cache_hit_rate")
            print(f"rep {rep + 1}/{a.reps} {key:8s} flyweight    {shown}  (prepare {r.get('prepare_s', 0):.1f}s"
                  + (f", tg expert-cache hit rate {hit:.1%}" if hit is not None else "")
                  + f", {time.time() - t0:.0f}s)", file=sys.stderr, flush=True)

    first = raw[models[0][0]][0]
    lines = [f"# flyweight ({time.strftime('%Y-%m-%d %H:%M')})\n",
             f"{os.cpu_count()} logical cores, threads={a.threads}, reps={a.reps}, mode {a.fw_mode}, "
             f"backend {first.get('backend', '?')}, flyweight args '{a.fw_args}', "
             f"load avg at end {os.getloadavg()[0]:.2f}\n",
             "| model | test | flyweight t/s median [min–max] |", "|---|---|---|"]
    for key, _ in models:
        for t in tests:
            lines.append(f"| {key} | {t}{a.p if t == 'pp' else a.n} | {summary(samples[key][t])} |")
    report = "\n".join(lines) + "\n"
    print(report)
    if a.out:
        Path(a.out).write_text(report)
    if a.json_out:
        Path(a.json_out).write_text(json.dumps({"samples": samples, "raw": raw, "threads": a.threads, "p": a.p,
                                                "n": a.n, "reps": a.reps, "fw_args": a.fw_args}, indent=1))


if __name__ == "__main__":
    main()
