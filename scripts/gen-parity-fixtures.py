#!/usr/bin/env python3
"""Logit-parity fixtures: llama.cpp reference logits for vela's end-to-end numerical checks.

Regenerate (re-runnable; skips a model whose fixtures are up to date, i.e. whose manifest
fingerprint matches FIXTURE_VERSION, settings, prompts, model sha256 and llama.cpp build; `--force`
redoes it):

    python3 scripts/gen-parity-fixtures.py [--force] [--models smollm2,gemma3,qwen25] [--flavor avx2]

Needs: `scripts/fetch-models.sh` (models) and `scripts/build-llama-cpp.sh avx2` (libllama.so,
llama-quantize, the sdist's ctypes bindings). Uses `scripts/llama_oracle.py` (settings documented
there: 2 threads, n_batch = n_ubatch = 512, n_ctx 4096, flash attention off).

For each real model and each prompt (short factual, code, chat-formatted with the model's own turn
tokens, multilingual, few-shot numbers, and a >= 1,500-token text built from the llama.cpp and
llama-cpp-python READMEs of the sdist, which crosses Gemma 3's 512-token sliding window and several
512-token ubatches) two references are computed:

  Q  llama.cpp on the quantized GGUF as shipped (default F16 KV cache).
  E  llama.cpp on the *same* weights dequantized to F32 (`llama-quantize --allow-requantize IN OUT
     F32`, cached as `$VELA_CACHE/models/<stem>.f32.gguf`, ~0.5-2.5 GB, never in git) with an F32
     KV cache: the "exact" math on the quantized weights, without llama.cpp's activation
     quantization (Q8 dot products) and F16 KV rounding.

NMSE (used everywhere): nmse(a, ref) = sum((a - ref)^2) / sum(ref^2), in float64, ref = reference.

Output: `$VELA_CACHE/golden/parity/<model>/` (<model> = smollm2 | gemma3 | qwen25)

    manifest.json
      {"version": 1, "model_key", "model_file" (name in $VELA_CACHE/models), "model_sha256",
       "f32_file", "n_vocab", "add_bos", "bos", "llama_cpp": {commit, flavor, system_info},
       "settings_q", "settings_e" (oracle settings), "nmse": "sum((a-b)^2)/sum(b^2), b = reference",
       "fingerprint" (inputs hash used to skip up-to-date work),
       "prompts": [{"name", "kind", "text", "add_bos", "parse_special", "tokens", "n_tokens",
                    "q_logits": "<name>.q.f32", "e_logits": "<name>.e.f32",
                    "argmax_q", "argmax_e", "top10_q", "top10_e",
                    "q_top2_margin", "e_top2_margin", "nmse_q_e",
                    "nmse_q_variants" ({"kv_f32", "ubatch_1" (prompts <= 512 tokens)}: llama.cpp's
                    distance to E with an F32 KV cache / one token per ubatch),
                    "greedy_q", "greedy_e" (<= 32 ids, stop after an EOG token, which is included),
                    "greedy_q_margins", "greedy_e_margins", "greedy_q_text", "greedy_e_text"}]}
    <name>.q.f32, <name>.e.f32   raw little-endian float32, n_vocab values (last-position logits)

Plus `$VELA_CACHE/golden/parity/index.json` listing the model keys. Greedy texts are
llama_detokenize(remove_special=False, unparse_special=False) of the generated ids only.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llama_oracle as O  # noqa: E402
import parity_prompts  # noqa: E402

CACHE = O.CACHE
MODELS_DIR = CACHE / "models"
OUT_ROOT = CACHE / "golden" / "parity"
N_GREEDY = 32
FIXTURE_VERSION = 2  # bump when the generation semantics change (forces regeneration)
MIN_LONG_TOKENS = 1500

MODELS = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
    "qwen25": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
}

CODE = (
    "def fibonacci(n: int) -> int:\n"
    '    """Return the n-th Fibonacci number."""\n'
    "    if n < 2:\n"
    "        return n\n"
    "    a, b = 0, 1\n"
    "    for _ in range(n - 1):\n"
)
MULTILINGUAL = (
    "English: The weather is nice today.\n"
    "Français : Il fait beau aujourd'hui.\n"
    "Deutsch: Das Wetter ist heute schön.\n"
    "Español: Hoy hace buen tiempo.\n"
    "Русский: Сегодня хорошая погода.\n"
    "日本語: 今日はいい天気です。\n"
    "中文:"
)
CHAT_QUESTION = "What is the boiling point of water at sea level, in degrees Fahrenheit?"


def long_text() -> tuple[str, list[str]]:
    """A deterministic long English/markdown text from files of the llama-cpp-python 0.3.36 sdist."""
    srcs = [O.BINDINGS_DIR / "vendor" / "llama.cpp" / "README.md", O.BINDINGS_DIR / "README.md"]
    text = "\n\n".join(p.read_text(encoding="utf-8") for p in srcs)
    text = text[:5000]  # ~1.7k-1.95k tokens for the three models
    text = text[: text.rfind("\n\n")]  # cut at a paragraph boundary
    return text, [str(p.relative_to(O.BINDINGS_DIR)) for p in srcs]


def chat_text(arch: str) -> str:
    if arch.startswith("gemma"):
        return f"<start_of_turn>user\n{CHAT_QUESTION}<end_of_turn>\n<start_of_turn>model\n"
    return (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        f"<|im_start|>user\n{CHAT_QUESTION}<|im_end|>\n<|im_start|>assistant\n"
    )


def prompts_for(arch: str) -> list[dict]:
    lt, _ = long_text()
    return [
        {"name": "factual", "kind": "short factual", "text": "The capital of France is", "parse_special": False},
        {"name": "code", "kind": "code", "text": CODE, "parse_special": False},
        {"name": "chat", "kind": "chat template tokens", "text": chat_text(arch), "parse_special": True},
        {"name": "multilingual", "kind": "multilingual", "text": MULTILINGUAL, "parse_special": False},
        {"name": "numbers", "kind": "few-shot numbers", "text": "1, 1, 2, 3, 5, 8, 13, 21,", "parse_special": False},
        {"name": "long", "kind": f">= {MIN_LONG_TOKENS} tokens (sdist READMEs)", "text": lt, "parse_special": False},
    ] + [
        # The wide set: logits only (no greedy continuation, which costs 64 more evaluations).
        {"name": k, "kind": parity_prompts.KINDS[k], "text": t, "parse_special": False, "greedy": False}
        for k, t in parity_prompts.P.items()
    ]


def common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def sha256_file(path: Path, memo: dict) -> str:
    st = path.stat()
    key = f"{path}:{st.st_size}:{st.st_mtime_ns}"
    if key in memo:
        return memo[key]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    memo[key] = h.hexdigest()
    return memo[key]


def ensure_f32(model: Path, flavor: str) -> Path:
    """Dequantize `model` to all-F32 with llama-quantize (cached; redone if the source is newer)."""
    out = model.with_name(model.name[: -len(".gguf")] + ".f32.gguf")
    if out.exists() and out.stat().st_mtime >= model.stat().st_mtime:
        return out
    bindir = O.lib_dir(flavor)
    q = bindir / "llama-quantize"
    if not q.exists():
        raise SystemExit(f"{q} missing: run scripts/build-llama-cpp.sh {flavor}")
    tmp = out.with_name(out.name + ".tmp")
    print(f"  dequantizing {model.name} -> {out.name}", flush=True)
    env = dict(os.environ, LD_LIBRARY_PATH=str(bindir))
    r = subprocess.run(["nice", "-n", "10", str(q), "--allow-requantize", str(model), str(tmp), "F32", "2"],
                       env=env, capture_output=True, text=True)
    if r.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise SystemExit(f"llama-quantize failed:\n{r.stderr[-2000:]}")
    tmp.replace(out)
    return out


def fingerprint(model_sha: str, flavor: str, prompts: list[dict]) -> str:
    """Hash of everything the fixtures depend on. Bump FIXTURE_VERSION when the generation
    semantics change (the script text itself is not hashed, so cosmetic edits do not force a
    ~15-minute regeneration)."""
    h = hashlib.sha256()
    h.update(str(FIXTURE_VERSION).encode())
    h.update(json.dumps(O.ORACLE_SETTINGS, sort_keys=True).encode())
    h.update(str(N_GREEDY).encode())
    h.update(model_sha.encode())
    h.update(flavor.encode())
    h.update(O.LLAMA_CPP_COMMIT.encode())
    lib = O.lib_dir(flavor) / "libllama.so"
    h.update(str(lib.resolve().stat().st_size).encode())
    h.update(json.dumps(prompts, sort_keys=True).encode())
    return h.hexdigest()


def up_to_date(out: Path, fp: str) -> bool:
    mf = out / "manifest.json"
    if not mf.exists():
        return False
    try:
        m = json.loads(mf.read_text())
    except json.JSONDecodeError:
        return False
    if m.get("fingerprint") != fp:
        return False
    return all((out / p[k]).exists() for p in m["prompts"] for k in ("q_logits", "e_logits"))


# llama.cpp's own spread on a prompt: the same quantized model under settings just as valid as
# the default (an F32 KV cache; one token per ubatch, for prompts up to UB1_MAX_TOKENS). Its
# distance to E moves by up to ~30x between them (docs/testing.md, "Accuracy of the quantized
# path"); check-parity.py's per-prompt rule compares vela with their geometric mean.
UB1_MAX_TOKENS = 512


def variant_keys(n_tokens: int) -> set:
    return {"kv_f32", "ubatch_1"} if n_tokens <= UB1_MAX_TOKENS else {"kv_f32"}


def q_variants(mq, toks, e) -> dict:
    v = {"kv_f32": O.nmse(O.eval_logits(mq, toks, kv_f32=True), e)}
    if len(toks) <= UB1_MAX_TOKENS:
        v["ubatch_1"] = O.nmse(O.eval_logits(mq, toks, n_batch=1, n_ubatch=1), e)
    return v


def add_variants(key: str, out: Path, mq) -> dict:
    """Fill in `nmse_q_variants` where a manifest lacks it (fixtures made before it existed)."""
    m = json.loads((out / "manifest.json").read_text())
    todo = [p for p in m["prompts"] if set(p.get("nmse_q_variants", {})) != variant_keys(p["n_tokens"])]
    for p in todo:
        e = np.fromfile(out / p["e_logits"], dtype="<f4")
        p["nmse_q_variants"] = q_variants(mq, p["tokens"], e)
        print(f"  {key:8s} {p['name']:12s} llama.cpp spread {p['nmse_q_e']:.3e} {p['nmse_q_variants']}", flush=True)
    if todo:
        tmp = out / "manifest.json.tmp"
        tmp.write_text(json.dumps(m, indent=1, ensure_ascii=False))
        tmp.replace(out / "manifest.json")
    return m


def gen_model(key: str, fname: str, flavor: str, force: bool, memo: dict) -> dict | None:
    path = MODELS_DIR / fname
    if not path.exists():
        raise SystemExit(f"{path} missing: run scripts/fetch-models.sh")
    out = OUT_ROOT / key
    model_sha = sha256_file(path, memo)
    mq = O.get_model(path)
    arch = mq.meta("general.architecture") or "?"
    prompts = prompts_for(arch)
    fp = fingerprint(model_sha, flavor, prompts)
    if not force and up_to_date(out, fp):
        print(f"{key}: up to date ({out})")
        return add_variants(key, out, mq)
    f32 = ensure_f32(path, flavor)
    me = O.get_model(f32)
    if me.n_vocab != mq.n_vocab:
        raise SystemExit(f"{key}: n_vocab differs between Q ({mq.n_vocab}) and E ({me.n_vocab})")
    out.mkdir(parents=True, exist_ok=True)
    settings_q = O.settings()
    settings_e = O.settings(type_k="f32", type_v="f32")
    entries = []
    for p in prompts:
        t0 = time.time()
        toks = O.tokenize(mq, p["text"], add_bos=None, parse_special=p["parse_special"])
        toks_e = O.tokenize(me, p["text"], add_bos=None, parse_special=p["parse_special"])
        if toks != toks_e:
            raise SystemExit(f"{key}/{p['name']}: Q and E tokenizations differ")
        if p["name"] == "long" and len(toks) < MIN_LONG_TOKENS:
            raise SystemExit(f"{key}: long prompt has only {len(toks)} tokens (< {MIN_LONG_TOKENS})")
        # prompt logits and greedy continuation from one context (same as eval_logits)
        n_greedy = N_GREEDY if p.get("greedy", True) else 0
        gq, gqm, lq = O.greedy_decode(mq, toks, n_greedy, return_prompt_logits=True)
        ge, gem, le = O.greedy_decode(me, toks, n_greedy, kv_f32=True, return_prompt_logits=True)
        qf, ef = f"{p['name']}.q.f32", f"{p['name']}.e.f32"
        lq.astype("<f4").tofile(out / qf)
        le.astype("<f4").tofile(out / ef)
        e = {
            "name": p["name"],
            "kind": p["kind"],
            "text": p["text"],
            "add_bos": mq.add_bos,
            "parse_special": p["parse_special"],
            "tokens": toks,
            "n_tokens": len(toks),
            "q_logits": qf,
            "e_logits": ef,
            "argmax_q": int(np.argmax(lq)),
            "argmax_e": int(np.argmax(le)),
            "top10_q": O.topk(lq, 10),
            "top10_e": O.topk(le, 10),
            "q_top2_margin": O.top2_margin(lq),
            "e_top2_margin": O.top2_margin(le),
            "nmse_q_e": O.nmse(lq, le),
            "nmse_q_variants": q_variants(mq, toks, le),
            "greedy_q": gq,
            "greedy_e": ge,
            "greedy_q_margins": gqm,
            "greedy_e_margins": gem,
            "greedy_q_text": O.detokenize(mq, gq),
            "greedy_e_text": O.detokenize(me, ge),
        }
        entries.append(e)
        same = common_prefix(gq, ge)
        print(f"  {key:8s} {p['name']:12s} n={len(toks):5d} nmse(Q,E)={e['nmse_q_e']:.3e} "
              f"E-margin={e['e_top2_margin']:.3f} argmax Q/E={e['argmax_q']}/{e['argmax_e']} "
              f"greedy common prefix {same}/{max(len(gq), len(ge))} ({time.time() - t0:.1f}s)", flush=True)
    manifest = {
        "version": 1,
        "model_key": key,
        "model_file": fname,
        "model_sha256": model_sha,
        "architecture": arch,
        "f32_file": f32.name,
        "n_vocab": mq.n_vocab,
        "add_bos": mq.add_bos,
        "bos": mq.bos,
        "llama_cpp": {"commit": O.LLAMA_CPP_COMMIT, "bindings": f"llama-cpp-python=={O.LLAMA_CPP_PYTHON_VERSION}",
                      "flavor": flavor, "system_info": O.system_info()},
        "settings_q": settings_q,
        "settings_e": settings_e,
        "nmse": "sum((a-b)^2)/sum(b^2), b = reference, float64",
        "long_text_sources": long_text()[1],
        "n_greedy": N_GREEDY,
        "fingerprint": fp,
        "prompts": entries,
    }
    tmp = out / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1, ensure_ascii=False))
    tmp.replace(out / "manifest.json")
    O.unload(f32)
    return manifest


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--force", action="store_true", help="regenerate even if up to date")
    ap.add_argument("--models", default=",".join(MODELS), help="comma list of " + ",".join(MODELS))
    ap.add_argument("--flavor", default=os.environ.get("VELA_LLAMA_FLAVOR", "avx2"))
    a = ap.parse_args()
    O.load(a.flavor)
    memo: dict = {}
    keys = [k for k in a.models.split(",") if k]
    for k in keys:
        if k not in MODELS:
            raise SystemExit(f"unknown model key {k!r} (known: {', '.join(MODELS)})")
    for k in keys:
        gen_model(k, MODELS[k], a.flavor, a.force, memo)
    OUT_ROOT.mkdir(parents=True, exist_ok=True)
    idx = OUT_ROOT / "index.json"
    known = sorted(p.name for p in OUT_ROOT.iterdir() if (p / "manifest.json").exists())
    idx.write_text(json.dumps({"models": known, "files": {k: MODELS[k] for k in known if k in MODELS}}, indent=1))
    print(f"fixtures in {OUT_ROOT}")


if __name__ == "__main__":
    main()
