#!/usr/bin/env python3
"""llama.cpp as an in-process *oracle* (reference implementation) for vela's parity tests.

Nothing here is linked into vela: this module is used only by the fixture generators and checkers
in `scripts/`. It drives llama.cpp (commit 0c1e570, vendored in the PyPI llama-cpp-python==0.3.36
sdist) through the sdist's own ctypes bindings, *without* pip-installing llama-cpp-python (no
compilation): the bindings are imported from `$VELA_CACHE/llama-cpp-python/llama_cpp` and the
shared library `libllama.so` is taken from `$VELA_CACHE/llama.cpp-<flavor>/bin`, built by
`scripts/build-llama-cpp.sh <flavor>` (flavor = avx2 by default, `VELA_LLAMA_FLAVOR` overrides).

How the library is located: `llama_cpp/llama_cpp.py` reads the `LLAMA_CPP_LIB_PATH` env variable
at import time and `dlopen`s `<that dir>/libllama.so` (its dependencies libggml*.so sit next to it
and are found through the RUNPATH `$ORIGIN` that CMake sets). The package's `__init__` imports the
high-level `Llama` class, which needs extra PyPI deps (diskcache, ...); we avoid that by registering
a bare `llama_cpp` package object whose `__path__` points at the sdist directory and importing only
the `llama_cpp.llama_cpp` (low-level) submodule.

Public API (all functions take a model *path* or a loaded `Model`; paths are loaded once and
cached):

    tokenize(model, text, add_bos=None, parse_special=False) -> list[int]
        add_bos=None means "per model metadata" (tokenizer.ggml.add_bos_token, llama.cpp's rule).
    detokenize(model, ids, remove_special=False, unparse_special=False) -> str
    eval_logits(model, tokens, n_ctx=4096, n_batch=512, n_ubatch=512, n_threads=2,
                all_positions=False, **ctx_overrides) -> np.ndarray float32
        [n_vocab] logits of the last position, or [n_tokens, n_vocab] with all_positions=True.
    unload(model)                      free a model loaded through its path
    greedy_decode(model, tokens, n, ...) -> (ids, margins)
        n greedy (argmax) continuation tokens; stops after an end-of-generation token (included).
        margins[i] = top1 - top2 logit at the step that produced ids[i].
    nmse(a, ref) -> float       sum((a-ref)^2) / sum(ref^2), computed in float64.
    top2_margin(logits) -> float
    settings(**overrides) -> dict   the effective context settings (recorded in fixtures).

Fixed evaluation settings (ORACLE_SETTINGS, recorded in every fixture manifest):
    n_threads = n_threads_batch = 2, n_ubatch = 512 (physical batch: prompts longer than 512 tokens
    are evaluated in chunks of 512, which exercises the KV-cache path across ubatches), n_batch = 512,
    n_ctx = 4096, flash attention DISABLED (llama.cpp's default here is AUTO, which enables the
    CPU flash-attention kernel; we pin it off so attention is the plain softmax(QK^T)V path),
    KV cache type F16 (llama.cpp default) unless overridden (the E reference uses F32), fresh context
    per call (empty KV cache), one sequence (seq_id 0), positions 0..n-1, mmap on, no GPU layers.

Run `python3 scripts/llama_oracle.py MODEL.gguf "some text"` for a quick smoke test (prints the
tokens, the argmax and its piece, and 8 greedy tokens).
"""
from __future__ import annotations

import ctypes
import importlib
import os
import sys
import types
from pathlib import Path

import numpy as np

CACHE = Path(os.environ.get("VELA_CACHE", str(Path.home() / ".cache" / "vela")))
BINDINGS_DIR = CACHE / "llama-cpp-python"
LLAMA_CPP_COMMIT = "0c1e570"
LLAMA_CPP_PYTHON_VERSION = "0.3.36"

# GGML type ids used for KV cache overrides (ggml.h enum ggml_type).
GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1

ORACLE_SETTINGS = {
    "n_ctx": 4096,
    "n_batch": 512,
    "n_ubatch": 512,
    "n_threads": 2,
    "n_threads_batch": 2,
    "flash_attn": "disabled",
    "type_k": "f16",
    "type_v": "f16",
    "n_seq": 1,
    "fresh_context_per_eval": True,
    "n_gpu_layers": 0,
}

_L = None  # the llama_cpp.llama_cpp module once loaded
_FLAVOR = None
_LOG_CB = None  # keep the ctypes callback alive
_MODELS: dict[str, "Model"] = {}


def lib_dir(flavor: str | None = None) -> Path:
    """Directory holding libllama.so for a llama.cpp build flavor (avx2 | avx512)."""
    flavor = flavor or os.environ.get("VELA_LLAMA_FLAVOR", "avx2")
    return CACHE / f"llama.cpp-{flavor}" / "bin"


def load(flavor: str | None = None):
    """Import the low-level bindings against the given flavor's libllama.so (once per process)."""
    global _L, _FLAVOR, _LOG_CB
    flavor = flavor or os.environ.get("VELA_LLAMA_FLAVOR", "avx2")
    if _L is not None:
        if flavor != _FLAVOR:
            raise RuntimeError(f"llama.cpp {_FLAVOR} already loaded in this process; cannot switch to {flavor}")
        return _L
    d = lib_dir(flavor)
    if not (d / "libllama.so").exists():
        raise RuntimeError(f"{d}/libllama.so missing: run scripts/build-llama-cpp.sh {flavor}")
    pkg_dir = BINDINGS_DIR / "llama_cpp"
    if not (pkg_dir / "llama_cpp.py").exists():
        raise RuntimeError(f"{pkg_dir}/llama_cpp.py missing: run scripts/build-llama-cpp.sh {flavor}")
    os.environ["LLAMA_CPP_LIB_PATH"] = str(d)
    if "llama_cpp" not in sys.modules:
        pkg = types.ModuleType("llama_cpp")
        pkg.__path__ = [str(pkg_dir)]  # bare package: skip __init__ (needs diskcache etc.)
        sys.modules["llama_cpp"] = pkg
    L = importlib.import_module("llama_cpp.llama_cpp")

    verbose = os.environ.get("VELA_ORACLE_VERBOSE") == "1"

    @L.llama_log_callback
    def _log(level, text, _user):  # ggml.h: 1 DEBUG, 2 INFO, 3 WARN, 4 ERROR, 5 CONT
        if verbose or level == 4:
            sys.stderr.write(text.decode("utf-8", "replace"))

    _LOG_CB = _log
    L.llama_log_set(_LOG_CB, ctypes.c_void_p(0))
    L.llama_backend_init()
    _L, _FLAVOR = L, flavor
    return L


def system_info() -> str:
    return load().llama_print_system_info().decode().strip()


class Model:
    """A loaded llama.cpp model (weights mmapped, CPU only)."""

    def __init__(self, path: str | os.PathLike):
        L = load()
        self.path = str(path)
        if not Path(self.path).is_file():
            raise FileNotFoundError(self.path)
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        mp.use_mmap = True
        self.ptr = L.llama_model_load_from_file(self.path.encode(), mp)
        if not self.ptr:
            raise RuntimeError(f"llama.cpp failed to load {self.path}")
        self.vocab = L.llama_model_get_vocab(self.ptr)
        self.n_vocab = int(L.llama_vocab_n_tokens(self.vocab))
        self.add_bos = bool(L.llama_vocab_get_add_bos(self.vocab))
        self.bos = int(L.llama_vocab_bos(self.vocab))

    def meta(self, key: str) -> str | None:
        L = load()
        buf = ctypes.create_string_buffer(4096)
        n = L.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def is_eog(self, tok: int) -> bool:
        return bool(load().llama_vocab_is_eog(self.vocab, tok))

    def piece(self, tok: int, special: bool = True) -> str:
        L = load()
        buf = ctypes.create_string_buffer(256)
        n = L.llama_token_to_piece(self.vocab, tok, buf, len(buf), 0, special)
        return buf.raw[: max(n, 0)].decode("utf-8", "replace")


def get_model(model) -> Model:
    if isinstance(model, Model):
        return model
    key = str(Path(model).resolve())
    if key not in _MODELS:
        _MODELS[key] = Model(key)
    return _MODELS[key]


def unload(model) -> None:
    """Free a model loaded through a path (no-op if it is not loaded)."""
    key = model.path if isinstance(model, Model) else str(Path(model).resolve())
    m = _MODELS.pop(key, None)
    if m is not None and m.ptr:
        load().llama_model_free(m.ptr)
        m.ptr = None


def tokenize(model, text: str, add_bos: bool | None = None, parse_special: bool = False) -> list[int]:
    """Tokenize with llama.cpp. add_bos=None -> the model's metadata decides (llama_vocab_get_add_bos,
    plus add_eos where the vocab asks for it, i.e. llama.cpp's add_special=true)."""
    L = load()
    m = get_model(model)
    raw = text.encode("utf-8")
    if add_bos is None:
        add_special = True
    else:
        add_special = bool(add_bos)
    n_max = len(raw) + 16
    buf = (L.llama_token * n_max)()
    n = L.llama_tokenize(m.vocab, raw, len(raw), buf, n_max, add_special, parse_special)
    if n < 0:
        raise RuntimeError(f"llama_tokenize: buffer too small ({-n} needed)")
    ids = list(buf[:n])
    if add_bos is True and (not ids or ids[0] != m.bos) and not m.add_bos:
        ids.insert(0, m.bos)  # explicit BOS for a vocab whose metadata says no BOS
    return ids


def detokenize(model, ids, remove_special: bool = False, unparse_special: bool = False) -> str:
    L = load()
    m = get_model(model)
    arr = (L.llama_token * max(len(ids), 1))(*ids)
    cap = 64 + 32 * len(ids)
    buf = ctypes.create_string_buffer(cap)
    n = L.llama_detokenize(m.vocab, arr, len(ids), buf, cap, remove_special, unparse_special)
    if n < 0:
        cap = -n + 1
        buf = ctypes.create_string_buffer(cap)
        n = L.llama_detokenize(m.vocab, arr, len(ids), buf, cap, remove_special, unparse_special)
    return buf.raw[:n].decode("utf-8", "replace")


def settings(**overrides) -> dict:
    s = dict(ORACLE_SETTINGS)
    s.update(overrides)
    return s


class _Ctx:
    """A fresh llama_context (empty KV cache) plus a reusable batch."""

    def __init__(self, m: Model, n_ctx, n_batch, n_ubatch, n_threads, kv_f32=False, flash_attn=False):
        L = load()
        if n_ubatch > n_batch:
            raise ValueError("n_ubatch must be <= n_batch")
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_batch
        cp.n_ubatch = n_ubatch
        cp.n_seq_max = 1
        cp.n_threads = n_threads
        cp.n_threads_batch = n_threads
        cp.flash_attn_type = 1 if flash_attn else 0  # LLAMA_FLASH_ATTN_TYPE_{ENABLED,DISABLED}
        cp.no_perf = True
        if kv_f32:
            cp.type_k = GGML_TYPE_F32
            cp.type_v = GGML_TYPE_F32
        self.L, self.m, self.n_ctx, self.n_batch = L, m, n_ctx, n_batch
        self.ptr = L.llama_init_from_model(m.ptr, cp)
        if not self.ptr:
            raise RuntimeError("llama_init_from_model failed")
        self.batch = L.llama_batch_init(n_batch, 0, 1)
        self.n_past = 0

    def close(self):
        if self.ptr:
            self.L.llama_batch_free(self.batch)
            self.L.llama_free(self.ptr)
            self.ptr = None

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()

    def feed(self, tokens, all_positions=False):
        """Decode tokens (in chunks of n_batch) after what is already in the KV cache; returns the
        logits of the last token ([n_vocab]) or of all fed tokens ([n, n_vocab])."""
        L, nv = self.L, self.m.n_vocab
        if self.n_past + len(tokens) > self.n_ctx:
            raise ValueError(f"{self.n_past + len(tokens)} tokens exceed n_ctx={self.n_ctx}")
        out = []
        last = None
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            b = self.batch
            b.n_tokens = len(chunk)
            is_last_chunk = start + self.n_batch >= len(tokens)
            for i, t in enumerate(chunk):
                b.token[i] = int(t)
                b.pos[i] = self.n_past + i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = 0
                b.logits[i] = 1 if (all_positions or (is_last_chunk and i == len(chunk) - 1)) else 0
            rc = L.llama_decode(self.ptr, b)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
            self.n_past += len(chunk)
            if all_positions:
                for i in range(len(chunk)):
                    p = L.llama_get_logits_ith(self.ptr, i)
                    out.append(np.ctypeslib.as_array(p, shape=(nv,)).copy())
            elif is_last_chunk:
                p = L.llama_get_logits_ith(self.ptr, -1)
                last = np.ctypeslib.as_array(p, shape=(nv,)).copy()
        if all_positions:
            return np.stack(out).astype(np.float32)
        return last.astype(np.float32)


def eval_logits(model, tokens, n_ctx=4096, n_batch=512, n_ubatch=512, n_threads=2,
                all_positions=False, kv_f32=False, flash_attn=False) -> np.ndarray:
    """Evaluate `tokens` from an empty cache; logits of the last position ([n_vocab] float32) or of
    all positions ([n_tokens, n_vocab]) with all_positions=True."""
    if not tokens:
        raise ValueError("eval_logits: empty token list")
    m = get_model(model)
    with _Ctx(m, n_ctx, n_batch, n_ubatch, n_threads, kv_f32, flash_attn) as c:
        return c.feed(list(tokens), all_positions)


def greedy_decode(model, tokens, n, n_ctx=4096, n_batch=512, n_ubatch=512, n_threads=2,
                  kv_f32=False, flash_attn=False, stop_at_eog=True, return_prompt_logits=False):
    """Greedy continuation of `tokens`: returns (ids, margins), or (ids, margins, prompt_logits)
    with return_prompt_logits (the last-position logits of the prompt, identical to eval_logits
    with the same settings). Ties break to the lowest id (np.argmax). Stops after an
    end-of-generation token (which is included) when stop_at_eog."""
    m = get_model(model)
    ids, margins = [], []
    with _Ctx(m, n_ctx, n_batch, n_ubatch, n_threads, kv_f32, flash_attn) as c:
        logits = c.feed(list(tokens))
        prompt_logits = logits
        for step in range(n):
            t = int(np.argmax(logits))
            ids.append(t)
            margins.append(top2_margin(logits))
            if (stop_at_eog and m.is_eog(t)) or step == n - 1:
                break
            logits = c.feed([t])
    if return_prompt_logits:
        return ids, margins, prompt_logits
    return ids, margins


def nmse(a, ref) -> float:
    """Normalized mean squared error sum((a-ref)^2)/sum(ref^2) in float64; `ref` is the reference."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(ref, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"nmse: shape mismatch {a.shape} vs {b.shape}")
    return float(np.sum((a - b) ** 2) / np.sum(b * b))


def top2_margin(logits) -> float:
    """Difference between the largest and second-largest logit."""
    x = np.asarray(logits, dtype=np.float64)
    top = np.partition(x, -2)[-2:]
    return float(top[1] - top[0])


def topk(logits, k=10) -> list[int]:
    """Indices of the k largest logits, largest first (ties: lower id first)."""
    x = np.asarray(logits)
    idx = np.argsort(-x, kind="stable")[:k]
    return [int(i) for i in idx]


if __name__ == "__main__":
    if len(sys.argv) < 3:
        print(__doc__)
        sys.exit(2)
    path, text = sys.argv[1], sys.argv[2]
    ids = tokenize(path, text)
    lg = eval_logits(path, ids)
    a = int(np.argmax(lg))
    print("system:", system_info())
    print("tokens:", ids)
    print(f"argmax: {a} {get_model(path).piece(a)!r} margin {top2_margin(lg):.4f}")
    g, _ = greedy_decode(path, ids, 8)
    print("greedy:", g, repr(detokenize(path, g)))
