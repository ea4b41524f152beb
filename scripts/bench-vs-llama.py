#!/usr/bin/env python3
"""Side-by-side throughput benchmark: vela vs llama.cpp (interleaved repetitions).

    python3 scripts/bench-vs-llama.py --vela target/release/vela [--reps 3] [--threads 2]
        [--models smollm2,gemma3,qwen25 | --models /path/a.gguf,...] [--flavors avx2,avx512]
        [-p 512] [-n 128] [--out bench.md] [--json-out bench.json]
    python3 scripts/bench-vs-llama.py --llama-only ...      # llama.cpp columns only
    python3 scripts/bench-vs-llama.py ... --flyweight PY [--fw-args '--expert-mode cpu'] [--fw-mode api|cli]
                                                             # + Flyweight (see scripts/bench-flyweight.py)

For each repetition, for each model, it runs (alternating which engine goes first, so slow drifts
of the shared machine hit both engines equally):

    llama-bench -m M -p 512 -n 128 -t 2 -r 1 -o json         (once per available llama.cpp flavor)
    vela bench --model M -p 512 -n 128 -r 1 --threads 2 --json

(with --flyweight PY, a Python command that can import the `flyweight-llm` package, also the driver
of scripts/bench-flyweight.py, in a fresh process: the same p/n/threads, --fw-args passed on;
llama.cpp may then be missing) and reports, per model and test (pp512 = prompt processing of 512
tokens, tg128 = generating 128 tokens one at a time, both in tokens/s), the median and min-max
over the repetitions for vela and for the *best* llama.cpp flavor of that model/test (highest
median; the flavor is named), and the ratio vela/llama (> 1 = vela faster); with --flyweight also Flyweight's t/s and the ratios
flyweight/llama and vela/flyweight. The markdown table goes to stdout and to --out.

llama.cpp flavors: `$VELA_CACHE/llama.cpp-<flavor>/bin/llama-bench` built by
`scripts/build-llama-cpp.sh avx2` / `scripts/build-llama-cpp.sh avx512`; missing flavors are
skipped with a note. llama-bench runs with its defaults otherwise (n_batch 2048, n_ubatch 512,
F16 KV cache, flash attention auto, repack on, one warmup run).

vela bench JSON contract (what `vela bench ... --json` must print on stdout, one object):

    {"pp": {"n": 512, "tps_mean": <float>, "tps_std": <float>, "samples": [<float>...]},
     "tg": {"n": 128, "tps_mean": <float>, "tps_std": <float>, "samples": [<float>...]}, ...any other keys}

tps = tokens per second; mean/std over vela's own -r repetitions (here -r 1, so std = 0); "pp" is
the -p test from an empty cache, "tg" the -n test (decode one token at a time from an empty cache,
as llama-bench's tg does). Only tps_mean is read; n, tps_std, samples and other keys are optional.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

CACHE = Path(os.environ.get("VELA_CACHE", str(Path.home() / ".cache" / "vela")))
MODELS = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
    "qwen25": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
}


def llama_bench(flavor: str, model: Path, p: int, n: int, threads: int, extra: list[str] = (),
                depth: int = 0) -> dict:
    bindir = CACHE / f"llama.cpp-{flavor}" / "bin"
    env = dict(os.environ, LD_LIBRARY_PATH=str(bindir))
    cmd = [str(bindir / "llama-bench"), "-m", str(model), "-p", str(p), "-n", str(n), "-t", str(threads),
           "-r", "1", "-o", "json"] + (["-d", str(depth)] if depth else []) + list(extra)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"llama-bench ({flavor}) failed: {r.stderr.strip()[-400:]}")
    res = {}
    for t in json.loads(r.stdout):
        if t.get("n_prompt", 0) > 0 and t.get("n_gen", 0) == 0:
            res["pp"] = float(t["avg_ts"])
        elif t.get("n_gen", 0) > 0 and t.get("n_prompt", 0) == 0:
            res["tg"] = float(t["avg_ts"])
        res.setdefault("build", t.get("build_commit"))
    return res


def vela_bench(vela: str, model: Path, p: int, n: int, threads: int, extra: list[str] = (),
               depth: int = 0) -> dict:
    cmd = [vela, "bench", "--model", str(model), "-p", str(p), "-n", str(n), "-r", "1", "--threads",
           str(threads), "--json"] + (["--depth", str(depth)] if depth else []) + list(extra)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"vela bench failed ({r.returncode}): {r.stderr.strip()[-400:]}")
    try:
        obj = json.loads(r.stdout)
        return {t: float(obj[t]["tps_mean"]) for t in ("pp", "tg") if obj[t]["n"]}
    except (json.JSONDecodeError, KeyError, TypeError) as ex:
        raise RuntimeError(f"vela bench --json printed an unexpected shape ({ex}): {r.stdout[:300]!r}")


def load_flyweight_bench():
    """`flyweight_bench` of scripts/bench-flyweight.py (a file name that is no module name)."""
    spec = importlib.util.spec_from_file_location("bench_flyweight", Path(__file__).with_name("bench-flyweight.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.flyweight_bench


def ratio(a: list[float], b: list[float]) -> str:
    return f"{statistics.median(a) / statistics.median(b):.2f}" if a and b else "n/a"


def summary(xs: list[float]) -> str:
    if not xs:
        return "n/a"
    return f"{statistics.median(xs):.1f} [{min(xs):.1f}–{max(xs):.1f}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vela", help="vela binary (needs `vela bench --json`)")
    ap.add_argument("--llama-only", action="store_true", help="benchmark llama.cpp only")
    ap.add_argument("--models", default=",".join(MODELS), help="model keys or .gguf paths, comma separated")
    ap.add_argument("--flavors", default="avx2,avx512", help="llama.cpp build flavors to try")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--depth", type=int, default=0, help="tokens in the cache before the tests (llama-bench -d)")
    ap.add_argument("--vela-args", default="", help="extra arguments for `vela bench`, e.g. '--device cuda'")
    ap.add_argument("--llama-args", default="", help="extra arguments for llama-bench, e.g. '-ngl 99'")
    ap.add_argument("--flyweight", metavar="PY", help="also benchmark Flyweight: a Python command that can "
                    "import flyweight, e.g. /tmp/fwvenv/bin/python or 'env PYTHONPATH=/tmp/site python3'")
    ap.add_argument("--fw-args", default="", help="extra `flyweight benchmark` flags, e.g. '--expert-mode cpu'")
    ap.add_argument("--fw-mode", choices=("api", "cli"), default="api", help="see scripts/bench-flyweight.py")
    ap.add_argument("--out", help="also write the markdown report here")
    ap.add_argument("--json-out", help="write all raw samples as JSON here")
    a = ap.parse_args()
    if a.reps < 1:
        ap.error("--reps must be >= 1")
    if a.flyweight and a.depth:
        ap.error("--depth is not supported with --flyweight")
    flyweight_bench = load_flyweight_bench() if a.flyweight else None

    vela = None
    if not a.llama_only:
        if not a.vela:
            ap.error("--vela PATH required (or --llama-only)")
        if not (Path(a.vela).is_file() and os.access(a.vela, os.X_OK)):
            sys.exit(f"error: vela binary {a.vela} not found or not executable (or use --llama-only)")
        probe = subprocess.run([a.vela, "bench", "--help"], capture_output=True, text=True)
        if probe.returncode != 0:
            sys.exit(f"error: `{a.vela} bench` is not implemented yet: {(probe.stderr or probe.stdout).strip()[:300]}")
        vela = a.vela

    flavors, notes = [], []
    for f in a.flavors.split(","):
        if (CACHE / f"llama.cpp-{f}" / "bin" / "llama-bench").exists():
            flavors.append(f)
        else:
            notes.append(f"llama.cpp {f} not built (scripts/build-llama-cpp.sh {f}); skipped")
    if not flavors and not flyweight_bench:
        sys.exit("error: no llama.cpp build found: run scripts/build-llama-cpp.sh avx2")

    models = []
    for m in a.models.split(","):
        path = Path(m) if m.endswith(".gguf") else CACHE / "models" / MODELS.get(m, m)
        if not path.exists():
            sys.exit(f"error: model {path} missing (scripts/fetch-models.sh)")
        models.append((m if m in MODELS else path.stem, path))

    tests = [t for t, k in (("pp", a.p), ("tg", a.n)) if k > 0]
    if not tests:
        ap.error("-p and -n are both 0")
    vargs, largs, fargs = a.vela_args.split(), a.llama_args.split(), a.fw_args.split()
    # samples[model][engine][test] -> list of t/s; engine = "vela" | "llama-<flavor>" | "flyweight"
    samples: dict = {k: {} for k, _ in models}
    builds, fw_raw = {}, []
    for rep in range(a.reps):
        for mi, (key, path) in enumerate(models):
            engines = [f"llama-{f}" for f in flavors] + (["vela"] if vela else []) + (
                ["flyweight"] if flyweight_bench else [])
            if (rep + mi) % 2 == 1:
                engines.reverse()
            for eng in engines:
                t0 = time.time()
                if eng == "vela":
                    r = vela_bench(vela, path, a.p, a.n, a.threads, vargs, a.depth)
                elif eng == "flyweight":
                    r = flyweight_bench(a.flyweight, path, a.p, a.n, a.threads, fargs, mode=a.fw_mode)
                    fw_raw.append({"model": key, "rep": rep, **r})
                else:
                    r = llama_bench(eng[6:], path, a.p, a.n, a.threads, largs, a.depth)
                    builds[eng] = r.pop("build", None)
                for t in tests:
                    samples[key].setdefault(eng, {}).setdefault(t, []).append(r[t])
                shown = "  ".join(f"{t}{a.p if t == 'pp' else a.n} {r[t]:8.1f} t/s" for t in tests)
                print(f"rep {rep + 1}/{a.reps} {key:8s} {eng:12s} {shown}  ({time.time() - t0:.0f}s)",
                      file=sys.stderr, flush=True)

    lines = []
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
               platform.processor())
    lines.append(f"# vela vs llama.cpp{' vs flyweight' if flyweight_bench else ''} ({time.strftime('%Y-%m-%d %H:%M')})\n")
    lines.append(f"CPU: {cpu}, {os.cpu_count()} logical cores, threads={a.threads}, reps={a.reps} (interleaved), "
                 f"depth={a.depth}, vela args '{a.vela_args}', llama-bench args '{a.llama_args}', "
                 f"load avg at end {os.getloadavg()[0]:.2f}; llama.cpp flavors: "
                 + ", ".join(f"{f} ({builds.get('llama-' + f)})" for f in flavors)
                 + (f"; flyweight args '{a.fw_args}' ({a.fw_mode} mode)" if flyweight_bench else "") + "\n")
    for n in notes:
        lines.append(f"- note: {n}")
    lines.append("")
    hdr = "| model | test | llama.cpp best (flavor) t/s median [min–max] |"
    sep = "|---|---|---|"
    if vela:
        hdr += " vela t/s median [min–max] | vela/llama |"
        sep += "---|---:|"
    if flyweight_bench:
        hdr += " flyweight t/s median [min–max] | flyweight/llama |" + (" vela/flyweight |" if vela else "")
        sep += "---|---:|" + ("---:|" if vela else "")
    if len(flavors) > 1:
        for f in flavors:
            hdr += f" llama {f} |"
            sep += "---|"
    lines += [hdr, sep]
    for key, _ in models:
        at = f" @ d{a.depth}" if a.depth else ""
        for t, label in [(t, f"{t}{a.p if t == 'pp' else a.n}{at}") for t in tests]:
            if flavors:
                best = max(flavors, key=lambda f: statistics.median(samples[key][f"llama-{f}"][t]))
                ls = samples[key][f"llama-{best}"][t]
                row = f"| {key} | {label} | {summary(ls)} ({best}) |"
            else:
                ls, row = [], f"| {key} | {label} | n/a |"
            if vela:
                vs = samples[key]["vela"][t]
                row += f" {summary(vs)} | {ratio(vs, ls)} |"
            if flyweight_bench:
                fs = samples[key]["flyweight"][t]
                row += f" {summary(fs)} | {ratio(fs, ls)} |" + (f" {ratio(vs, fs)} |" if vela else "")
            if len(flavors) > 1:
                for f in flavors:
                    row += f" {summary(samples[key][f'llama-{f}'][t])} |"
            lines.append(row)
    report = "\n".join(lines) + "\n"
    print(report)
    if a.out:
        Path(a.out).write_text(report)
    if a.json_out:
        Path(a.json_out).write_text(json.dumps({"samples": samples, "builds": builds, "threads": a.threads,
                                                "p": a.p, "n": a.n, "reps": a.reps}
                                               | ({"flyweight": fw_raw} if flyweight_bench else {}), indent=1))


if __name__ == "__main__":
    main()
