#!/usr/bin/env python3
"""GPU against CPU: vela's logits and greedy text on the CUDA backend vs the CPU backend.

    python3 scripts/gpu-vs-cpu.py --vela target/release/vela [--models smollm2,gemma3,qwen25]
        [--modes exact,default] [--out results.md]

Run on a machine with an NVIDIA GPU (scripts/gpu-suite.sh does). For every model of the llama.cpp
parity fixtures ($VELA_CACHE/golden/parity/<model>/manifest.json: 6 prompts, one of them over
1,500 tokens) and every mode it runs `vela logits --device cuda` and `--device cpu` on the same
token ids and reports NMSE, max |diff|, argmax equality and top-10 set equality of the last
position's logits; then `vela run --temperature 0 --max-tokens 32` on both devices for the
non-chat prompts and compares the text.

Modes: `exact` sets VELA_MATMUL=f32 for both devices (weights dequantized to f32, f32 activations:
the two backends then differ only by float summation order, so the criterion NMSE <= 1e-4, equal
argmax and top-10 set applies); `default` is the production int8-activation path, where vela's own
CPU kernel families already differ from each other by NMSE up to ~2e-3 on these models (activation
rounding flips amplified over the layers), so it is reported, not gated.
Exit status 1 if an exact-mode check fails.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

CACHE = Path(os.environ.get("VELA_CACHE", str(Path.home() / ".cache" / "vela")))


def run(cmd: list[str], env: dict, timeout=1200) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... exited {r.returncode}: {r.stderr.strip()[-400:]}")
    return r.stdout


def logits(vela: str, model: Path, toks: list[int], device: str, env: dict) -> np.ndarray:
    out = run([vela, "logits", "--model", str(model), "--device", device, "--tokens",
               ",".join(map(str, toks)), "--ctx", str(max(len(toks) + 8, 256))], env)
    return np.asarray(json.loads(out)["logits"], dtype=np.float64)


def compare(g: np.ndarray, c: np.ndarray) -> dict:
    nmse = float(np.sum((g - c) ** 2) / max(np.sum(c ** 2), 1e-30))
    t10g, t10c = set(np.argsort(-g)[:10].tolist()), set(np.argsort(-c)[:10].tolist())
    return {"nmse": nmse, "maxabs": float(np.max(np.abs(g - c))), "argmax": int(np.argmax(g)) == int(np.argmax(c)),
            "top10": t10g == t10c, "finite": bool(np.all(np.isfinite(g)))}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vela", required=True)
    ap.add_argument("--models", default="smollm2,gemma3,qwen25")
    ap.add_argument("--modes", default="exact,default")
    ap.add_argument("--out")
    a = ap.parse_args()
    lines = [f"# vela GPU vs CPU ({time.strftime('%Y-%m-%d %H:%M')})", "",
             "| model | mode | prompt | tokens | NMSE | max abs | argmax | top-10 set | pass |",
             "|---|---|---|---:|---:|---:|---|---|---|"]
    greedy = ["", "| model | mode | prompt | greedy 32 tokens GPU == CPU |", "|---|---|---|---|"]
    failed = False
    for key in a.models.split(","):
        mdir = CACHE / "golden" / "parity" / key
        man = json.loads((mdir / "manifest.json").read_text())
        model = CACHE / "models" / man["model_file"]
        if not model.exists():
            lines.append(f"| {key} | - | - | - | model {model.name} missing | | | | SKIP |")
            continue
        for mode in a.modes.split(","):
            env = dict(os.environ)
            if mode == "exact":
                env["VELA_MATMUL"] = "f32"
            else:
                env.pop("VELA_MATMUL", None)
            for p in man["prompts"]:
                toks = p["tokens"]
                try:
                    g = logits(a.vela, model, toks, "cuda", env)
                    c = logits(a.vela, model, toks, "cpu", env)
                except Exception as ex:  # noqa: BLE001 - report and go on
                    lines.append(f"| {key} | {mode} | {p['name']} | {len(toks)} | error: {str(ex)[:120]} | | | | FAIL |")
                    failed |= mode == "exact"
                    continue
                r = compare(g, c)
                ok = r["finite"] and r["argmax"] and r["top10"] and r["nmse"] <= 1e-4
                verdict = ("PASS" if ok else "FAIL") if mode == "exact" else ("ok" if ok else "differs")
                failed |= mode == "exact" and not ok
                lines.append(f"| {key} | {mode} | {p['name']} | {len(toks)} | {r['nmse']:.2e} | {r['maxabs']:.3g} | "
                             f"{r['argmax']} | {r['top10']} | {verdict} |")
                print(lines[-1], flush=True)
                if "chat" in p.get("kind", "") or not p.get("text") or len(toks) > 1000:
                    continue
                outs = []
                for dev in ("cuda", "cpu"):
                    outs.append(run([a.vela, "run", "--model", str(model), "--device", dev, "--prompt", p["text"],
                                     "--max-tokens", "32", "--temperature", "0"], env))
                same = outs[0] == outs[1]
                failed |= mode == "exact" and not same
                greedy.append(f"| {key} | {mode} | {p['name']} | {'equal' if same else 'DIFFERENT'} |")
                print(greedy[-1], flush=True)
    report = "\n".join(lines + greedy) + "\n"
    print(report)
    if a.out:
        Path(a.out).write_text(report)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
