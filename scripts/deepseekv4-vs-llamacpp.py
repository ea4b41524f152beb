#!/usr/bin/env python3
# vela-venv: torch
"""DeepSeek V4: transformers vs vela vs llama.cpp 0c1e570 on the same GGUF, each difference
taken apart.

    $VELA_CACHE/venv-torch/bin/python scripts/deepseekv4-vs-llamacpp.py \\
        [--vela target/release/vela] [--build-patched] [--prompt long] [--json OUT]

Input: the `flash_lcpp` fixture (scripts/gen-deepseekv4-fixtures.py): the release's FP8 / MXFP4
storage of a tiny Flash-pattern model, `model-llamacpp.gguf` (llama.cpp's converter: MXFP4 experts
as GGML MXFP4, FP8 matrices requantized to Q8_0, BF16 / F32 as stored) and `logits_<p>_gguf.f32`,
transformers' f32 forward with exactly the GGUF's values — the reference of every row below.

Every row is the logits of the prompt at every position (one pass from an empty cache unless
said), compared with that reference: worst and median per-position NMSE, positions whose argmax
equals the reference's, and for llama.cpp (through its eval callback) the CSA-layer queries whose
indexer selection differs from transformers' (`lid_top_k`; 2 layers × prompt length), the largest
error of its indexer scores (`lid_score_masked`, the visible entries) and the tokens of the
top-k-routed layers whose experts differ (`ffn_moe_topk`; 2 layers × prompt length).

Rows (the variants that prove each mechanism):
  vela                exact products (VELA_MATMUL=f32); its default (activations rounded to 8 bits
                      for the quantized products); its DeepSeek V4 state is f32 either way (window
                      rows, entries and indexer keys, whatever --kv-type says)
  llama.cpp exact     the GGUF with every tensor dequantized to F32 and F32 caches: no rounding of
                      llama.cpp's own; then the same fed in ubatches of 1 and 7 tokens (its
                      compressor state carried across ubatches)
  weights one by one  each stored type kept (Q8_0, MXFP4, BF16), the rest F32, F32 caches: the
                      activation rounding its products apply for that type
  caches              F32 weights with llama.cpp's default F16 caches (window, compressed entries,
                      indexer keys), and with Q8_0 caches (which need flash attention)
  as shipped          the GGUF as converted with F32 caches, then with F16 caches (its defaults)
  dense indexer       the GGUF's indexer top-k raised to 128 (>= every entry of the prompt, so no
                      selection happens) against transformers with index_topk 128: what is left of
                      a gap when no selection can differ
  no rotation         (--build-patched) a copy of llama.cpp whose Lightning indexer skips the
                      Hadamard rotation of its queries and compressed keys, with F32, F16 and Q8_0
                      caches and as shipped; the patched build with the rotation on must equal the
                      stock build bit for bit

After the table: vela against llama.cpp directly, and per cache type whether turning the
rotation off changes the logits, the selections, and by how much the scores.

The patched build (--build-patched): the vendored source copied to
$VELA_CACHE/src-dsv4-norot/llama.cpp with the rotation made switchable (LLAMA_DSV4_LID_NO_ROT=1 turns
it off; deepseek4.cpp lines 619 and 1065), built as $VELA_CACHE/llama.cpp-dsv4-norot/bin: the avx2
build tree is copied and pointed at the copy (its absolute paths rewritten), so CMake recompiles
libllama and the CPU backend only, 3-8 min on 2 cores; without that tree, a fresh configure and
build of libllama.
"""
import argparse
import ctypes
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.environ.get("VELA_CACHE", os.path.expanduser("~/.cache/vela"))
FIXTURE = os.path.join(CACHE, "golden", "deepseekv4", "flash_lcpp")
NOROT = "dsv4-norot"  # the patched build's flavor for scripts/llama_oracle.py
DENSE_TOPK = 128


def load_gen():
    spec = importlib.util.spec_from_file_location("gen_dsv4", os.path.join(HERE, "gen-deepseekv4-fixtures.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def f32s(path: str, n: int) -> np.ndarray:
    return np.fromfile(path, dtype="<f4").reshape(n, -1).astype(np.float64)


def nmse_rows(a: np.ndarray, ref: np.ndarray) -> np.ndarray:
    return ((a - ref) ** 2).sum(-1) / (ref ** 2).sum(-1)


# --------------------------------------------------------------------------------------------
# llama.cpp, in a child process per build (the library is bound to one directory per process)


class GgmlTensor(ctypes.Structure):
    """struct ggml_tensor of ggml 0c1e570 (ggml/include/ggml.h:685)."""
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
                ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8)]


GGML_TYPE_F32, GGML_TYPE_I32 = 0, 26  # ggml.h enum ggml_type


CACHE_TYPES = {"f32": 0, "f16": 1, "q8_0": 8}  # ggml.h enum ggml_type


def llama_run(lo, model: str, ids: list, cache: str, n_ubatch: int):
    """Logits of every position, the indexer's picks per CSA layer and query ({layer: [sorted
    entries]}), its scores of the visible entries ({layer: [[score per entry]]}) and each
    layer's experts per token ({layer: [sorted experts]}), one pass of `ids` from an empty
    cache."""
    L = lo.load()
    m = lo.get_model(model)
    picks: dict = {}

    errors = []
    scores: dict = {}
    experts: dict = {}

    @L.ggml_backend_sched_eval_callback
    def cb(tp, ask, _ud):
        # asked: observe only the indexer's top-k and scores ("lid_top_k-<layer>",
        # "lid_score_masked-<layer>") and the routers' experts ("ffn_moe_topk-<layer>", the
        # hash layers' included: their table's rows); told: copy them out, and always let the
        # computation go on
        t = ctypes.cast(tp, ctypes.POINTER(GgmlTensor)).contents
        mt = re.fullmatch(r"(lid_top_k|lid_score_masked|ffn_moe_topk)-(\d+)", t.name.decode())
        if ask or mt is None:
            return mt is not None if ask else True
        try:
            want = GGML_TYPE_F32 if mt.group(1) == "lid_score_masked" else GGML_TYPE_I32
            assert t.type == want and t.ne[2] == t.ne[3] == 1, t.name
            k, n = int(t.ne[0]), int(t.ne[1])  # a 2-D view: [n rows of k], strides nb[1], nb[0]
            span = (n - 1) * t.nb[1] + (k - 1) * t.nb[0] + 4
            raw = np.frombuffer((ctypes.c_char * span).from_address(t.data), dtype=np.uint8)
            a = np.lib.stride_tricks.as_strided(raw.view(np.int32 if want == GGML_TYPE_I32 else np.float32),
                                                shape=(n, k), strides=(t.nb[1], t.nb[0])).copy()
            dst = {"lid_top_k": picks, "lid_score_masked": scores, "ffn_moe_topk": experts}[mt.group(1)]
            dst.setdefault(int(mt.group(2)), []).extend(list(a))
        except Exception as e:  # noqa: BLE001 (an exception must not cross into C)
            errors.append(repr(e))
        return True

    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = 4096, 512, n_ubatch, 1
    cp.n_threads = cp.n_threads_batch = 2
    # disabled, as scripts/llama_oracle.py; a quantized cache needs it (and quantizes V too)
    cp.flash_attn_type = 1 if cache == "q8_0" else 0
    cp.no_perf = True
    # the K type is every DSV4 cache's (raw window, compressed entries, indexer keys: K = V)
    cp.type_k = cp.type_v = CACHE_TYPES[cache]
    cp.cb_eval = cb
    cp.cb_eval_user_data = None
    ctx = L.llama_init_from_model(m.ptr, cp)
    assert ctx, "llama_init_from_model failed"
    b = L.llama_batch_init(len(ids), 0, 1)
    b.n_tokens = len(ids)
    for i, t in enumerate(ids):
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = int(t), i, 1, 1
        b.seq_id[i][0] = 0
    assert L.llama_decode(ctx, b) == 0, "llama_decode failed"
    nv = m.n_vocab
    logits = np.stack([np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(nv,)).copy()
                       for i in range(len(ids))])
    L.llama_batch_free(b)
    L.llama_free(ctx)
    assert not errors, errors
    # the visible picks (a query with fewer visible entries than k also gets masked ones)
    sel = {il: [sorted(int(e) for e in row if 0 <= e < (pos + 1) // 4) for pos, row in enumerate(rows)]
           for il, rows in picks.items()}
    sc = {il: [[float(x) for x in row[:(pos + 1) // 4]] for pos, row in enumerate(rows)] for il, rows in scores.items()}
    ex = {il: [sorted(int(e) for e in row) for row in rows] for il, rows in experts.items()}
    return logits.astype(np.float32), sel, sc, ex


def llama_child(job_path: str) -> None:
    sys.path.insert(0, HERE)
    import llama_oracle as lo
    jobs = json.load(open(job_path))
    out = {}
    for j in jobs:
        if j.get("no_rot"):
            os.environ["LLAMA_DSV4_LID_NO_ROT"] = "1"
        else:
            os.environ.pop("LLAMA_DSV4_LID_NO_ROT", None)
        lg, sel, sc, ex = llama_run(lo, j["model"], j["ids"], j["cache"], j["ubatch"])
        lg.astype("<f4").tofile(j["out"])
        out[j["key"]] = {"selected": {str(k): v for k, v in sel.items()},
                         "scores": {str(k): v for k, v in sc.items()},
                         "experts": {str(k): v for k, v in ex.items()}}
    json.dump(out, open(job_path + ".sel", "w"))


def run_llama(flavor: str, jobs: list, tmp: str) -> dict:
    path = os.path.join(tmp, f"jobs-{flavor}.json")
    json.dump(jobs, open(path, "w"))
    env = dict(os.environ, VELA_LLAMA_FLAVOR=flavor)
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--llama-child", path], env=env,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"llama.cpp ({flavor}) failed (rc {r.returncode}):\n{r.stderr[-3000:]}")
    return json.load(open(path + ".sel"))


# --------------------------------------------------------------------------------------------
# the patched build


PATCH = [
    ("static constexpr int64_t DSV4_HCA_RATIO  = 128;\n",
     "static constexpr int64_t DSV4_HCA_RATIO  = 128;\n\n"
     "// patched: LLAMA_DSV4_LID_NO_ROT=1 skips the Lightning indexer's Hadamard rotation\n"
     "static bool dsv4_lid_rot() { return getenv(\"LLAMA_DSV4_LID_NO_ROT\") == nullptr; }\n"),
    ("    indexer_q = llama_mul_mat_hadamard(ctx0, indexer_q, inp_lid.k_rot);\n",
     "    if (dsv4_lid_rot()) {\n        indexer_q = llama_mul_mat_hadamard(ctx0, indexer_q, inp_lid.k_rot);\n    }\n"),
    ("        if (inp_dsv4->get_lid().k_rot) {\n            kv_comp_lid_state",
     "        if (inp_dsv4->get_lid().k_rot && dsv4_lid_rot()) {\n            kv_comp_lid_state"),
]


def build_patched() -> str:
    src = os.path.realpath(os.path.join(CACHE, "llama-cpp-python", "vendor", "llama.cpp"))
    psrc = os.path.join(CACHE, "src-dsv4-norot", "llama.cpp")
    stock_build = os.path.realpath(os.path.join(CACHE, "build-llama.cpp-avx2"))
    pbuild = os.path.join(CACHE, "build-llama.cpp-dsv4-norot")
    out = os.path.join(CACHE, f"llama.cpp-{NOROT}", "bin")
    if not os.path.isdir(psrc):
        os.makedirs(os.path.dirname(psrc), exist_ok=True)
        shutil.copytree(src, psrc, symlinks=True)
        f = os.path.join(psrc, "src", "models", "deepseek4.cpp")
        s = open(f).read()
        for old, new in PATCH:
            assert s.count(old) == 1, f"patch anchor not found once: {old!r}"
            s = s.replace(old, new)
        s = s.replace("#include <cmath>\n", "#include <cmath>\n#include <cstdlib>\n", 1)
        open(f, "w").write(s)
    if not os.path.isdir(pbuild):
        if os.path.isdir(stock_build):
            # the stock build tree pointed at the copy: its objects stay valid, so only libllama
            # (whose sources differ) is rebuilt
            shutil.copytree(stock_build, pbuild, symlinks=True)
            for root, _, files in os.walk(pbuild):
                for fn in files:
                    p = os.path.join(root, fn)
                    try:
                        t = open(p, encoding="utf-8").read()
                    except (UnicodeDecodeError, OSError):
                        continue
                    if src in t or stock_build in t:
                        open(p, "w", encoding="utf-8").write(t.replace(src, psrc).replace(stock_build, pbuild))
        else:
            subprocess.run(["cmake", "-S", psrc, "-B", pbuild, "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON",
                            "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                            "-DLLAMA_BUILD_SERVER=OFF", "-DGGML_NATIVE=OFF", "-DGGML_OPENMP=ON", "-DGGML_AVX=ON",
                            "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_BMI2=ON"], check=True)
    subprocess.run(["cmake", "--build", pbuild, "--target", "llama", f"-j{os.cpu_count()}"], check=True)
    os.makedirs(out, exist_ok=True)
    for root, _, files in os.walk(os.path.join(pbuild, "bin")):
        for fn in files:
            if ".so" in fn:
                dst = os.path.join(out, fn)
                if os.path.lexists(dst):
                    os.remove(dst)
                shutil.copy2(os.path.join(root, fn), dst, follow_symlinks=False)
    return out


# --------------------------------------------------------------------------------------------
# transformers with the GGUF's values and a dense indexer


def hf_runs(gen, ids: list, want_default: np.ndarray):
    """transformers' f32 forward with the GGUF's values (the fixture's construction, checked to
    reproduce logits_<p>_gguf.f32 bit for bit): its top-k routers' experts per token ({layer:
    [sorted experts]}), and the logits with every indexer keeping DENSE_TOPK entries."""
    import torch
    from transformers import DeepseekV4ForCausalLM
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as md
    sys.path[:0] = [os.path.join(gen.LLAMA_CPP, "gguf-py")]
    import gguf
    from gguf.quants import dequantize
    gen.allow_fp8_load_without_accelerate()
    model = DeepseekV4ForCausalLM.from_pretrained(FIXTURE, attn_implementation="eager",
                                                  experts_implementation="eager").eval().float()
    gen.release_layout(model, model.config, torch.Generator().manual_seed(gen.FP8_SEED))  # fills FP8_HF
    rd = gguf.GGUFReader(os.path.join(FIXTURE, "model-llamacpp.gguf"))
    q8 = {t.name: t for t in rd.tensors if t.tensor_type == gguf.GGMLQuantizationType.Q8_0}
    sd = model.state_dict()
    for up, hf in gen.FP8_HF.items():
        i, rest = up.removeprefix("layers.").split(".", 1)
        t = q8[f"blk.{i}.{gen.GGUF_FP8[rest.removesuffix('.weight')]}.weight"]
        a = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        sd[hf] = torch.tensor(a.reshape([int(x) for x in reversed(t.shape)]))
    model.load_state_dict(sd)
    experts, hooks = {}, []
    for il, layer in enumerate(model.model.layers):
        if isinstance(layer.mlp.gate, md.DeepseekV4TopKRouter):
            hooks.append(layer.mlp.gate.register_forward_hook(
                lambda _m, _a, o, il=il: experts.__setitem__(il, [sorted(r) for r in o[2].tolist()])))
    with torch.no_grad():
        lg = model(torch.tensor([ids]), use_cache=False).logits[0].numpy()
    for h in hooks:
        h.remove()
    assert np.array_equal(lg, want_default.astype(np.float32)), "rebuilt HF-on-GGUF model differs"
    for mod in model.modules():
        if isinstance(mod, md.DeepseekV4Indexer):
            mod.index_topk = DENSE_TOPK
    with torch.no_grad():
        dense = model(torch.tensor([ids]), use_cache=False).logits[0].numpy().astype(np.float64)
    return experts, dense


# --------------------------------------------------------------------------------------------
# vela


def vela_logits(vela: str, model: str, ids: list, exact: bool, kv: str) -> np.ndarray:
    env = dict(os.environ)
    if exact:
        env["VELA_MATMUL"] = "f32"
    else:
        env.pop("VELA_MATMUL", None)
    r = subprocess.run([vela, "logits", "-m", model, "--tokens", ",".join(map(str, ids)), "--all-positions",
                        "--kv-type", kv, "--threads", "2", "--device", "cpu"], env=env, capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise SystemExit(f"vela failed: {r.stderr[-2000:]}")
    j = json.loads(r.stdout)
    return np.asarray(j["logits"], dtype=np.float64).reshape(len(ids), j["n_vocab"])


# --------------------------------------------------------------------------------------------


def main() -> None:
    if sys.argv[1:2] == ["--llama-child"]:
        llama_child(sys.argv[2])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--vela", help="vela binary (rows of vela are left out without it)")
    ap.add_argument("--build-patched", action="store_true",
                    help="build llama.cpp with the indexer rotation switchable, if not built yet")
    ap.add_argument("--prompt", default="long", choices=["long", "mid", "short"])
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args()

    gen = load_gen()
    prompts = json.load(open(os.path.join(FIXTURE, "prompts.json")))["prompts"]
    ids = prompts[a.prompt]
    T = len(ids)
    ref = f32s(os.path.join(FIXTURE, f"logits_{a.prompt}_gguf.f32"), T)
    # transformers' indexer choices and scores with the GGUF's values (long prompt only)
    hf_ix, hf_gap = None, float("nan")
    if a.prompt == "long":
        j = json.load(open(os.path.join(FIXTURE, "indexer_long_gguf.json")))
        hf_ix = {int(k): v for k, v in j["layers"].items()}
        hf_gap = j["min_cutoff_gap"]
    gguf_path = os.path.join(FIXTURE, "model-llamacpp.gguf")
    norot_lib = os.path.join(CACHE, f"llama.cpp-{NOROT}", "bin", "libllama.so")
    if a.build_patched:
        build_patched()
    have_norot = os.path.isfile(norot_lib)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        def g(name, keep=(), fields=None):
            p = os.path.join(tmp, name)
            gen.dequantized_gguf(gguf_path, p, keep=keep, set_fields=fields)
            return p
        topk_key = "deepseek4.attention.indexer.top_k"
        f32_all = g("f32.gguf")
        as_shipped_dense = g("dense.gguf", keep=("Q8_0", "MXFP4", "BF16"), fields={topk_key: DENSE_TOPK})
        f32_dense = g("f32-dense.gguf", fields={topk_key: DENSE_TOPK})
        hf_experts, ref_dense = hf_runs(gen, ids, ref)

        def v(key, what, model, cache, ubatch=512, ref="hf", no_rot=False):
            return {"key": key, "what": what, "model": model, "ids": ids, "cache": cache, "ubatch": ubatch,
                    "ref": ref, "no_rot": no_rot, "out": os.path.join(tmp, key + ".f32")}
        dense = f"dense indexer (top-k {DENSE_TOPK})"
        spec = [
            v("exact", "llama.cpp: every tensor dequantized to F32, F32 caches", f32_all, "f32"),
            v("exact_ub1", "  the same fed one token per ubatch", f32_all, "f32", ubatch=1),
            v("exact_ub7", "  the same in ubatches of 7 tokens", f32_all, "f32", ubatch=7),
            v("keep_q8", "llama.cpp: Q8_0 matrices kept (activations rounded to Q8_0), rest F32, F32 caches",
              g("q8.gguf", keep=("Q8_0",)), "f32"),
            v("keep_mxfp4", "llama.cpp: MXFP4 experts kept (activations rounded to Q8_0), rest F32, F32 caches",
              g("mxfp4.gguf", keep=("MXFP4",)), "f32"),
            v("keep_bf16", "llama.cpp: BF16 matrices kept (activations rounded to BF16), rest F32, F32 caches",
              g("bf16.gguf", keep=("BF16",)), "f32"),
            v("f16_cache", "llama.cpp: F32 weights, F16 caches (its default cache type)", f32_all, "f16"),
            v("q8_cache", "llama.cpp: F32 weights, Q8_0 caches (and flash attention, which they need)", f32_all,
              "q8_0"),
            v("shipped_f32c", "llama.cpp: the GGUF as converted, F32 caches", gguf_path, "f32"),
            v("shipped", "llama.cpp: the GGUF as converted, F16 caches (its defaults)", gguf_path, "f16"),
            v("dense_exact", f"{dense}: F32 weights, F32 caches", f32_dense, "f32", ref="dense"),
            v("dense_f16_cache", f"{dense}: F32 weights, F16 caches", f32_dense, "f16", ref="dense"),
            v("dense_shipped", f"{dense}: as converted, F16 caches", as_shipped_dense, "f16", ref="dense"),
        ]
        ix = run_llama("avx2", spec, tmp)
        outs = {j["key"]: f32s(j["out"], T) for j in spec}
        if have_norot:
            nr = "no indexer rotation (patched)"
            extra = [
                v("norot_exact", f"{nr}: F32 weights, F32 caches", f32_all, "f32", no_rot=True),
                v("norot_f16_cache", f"{nr}: F32 weights, F16 caches", f32_all, "f16", no_rot=True),
                v("norot_q8_cache", f"{nr}: F32 weights, Q8_0 caches, flash attention", f32_all, "q8_0",
                  no_rot=True),
                v("norot_shipped", f"{nr}: as converted, F16 caches", gguf_path, "f16", no_rot=True),
                v("patched_rot_shipped", "patched build, rotation on: as converted, F16 caches", gguf_path, "f16"),
            ]
            ix.update(run_llama(NOROT, extra, tmp))
            outs.update({j["key"]: f32s(j["out"], T) for j in extra})
            assert np.array_equal(outs["patched_rot_shipped"], outs["shipped"]), \
                "the patched build with the rotation on differs from the stock build"
            spec += extra
        refs = {"hf": ref, "dense": ref_dense}

        def row(key, what, lg, refname, ix=None):
            e = nmse_rows(lg, refs[refname])
            r = {"key": key, "what": what, "reference": "transformers" + (
                f" (index_topk {DENSE_TOPK})" if refname == "dense" else ""),
                 "worst_nmse": float(e.max()), "median_nmse": float(np.median(e)),
                 "argmax_equal": int((lg.argmax(1) == refs[refname].argmax(1)).sum()), "positions": T}
            if ix is not None and refname == "hf":
                r["router_tokens_differing"] = sum(
                    1 for il, qs in hf_experts.items() for t, q in enumerate(qs) if ix["experts"][str(il)][t] != q)
                r["router_tokens"] = sum(len(qs) for qs in hf_experts.values())
            if ix is not None and refname == "hf" and hf_ix is not None:
                r["indexer_queries_differing"] = sum(
                    1 for il, qs in ix["selected"].items() for pos, q in enumerate(qs)
                    if q != hf_ix[int(il)][pos]["selected"])
                r["indexer_queries"] = sum(len(qs) for qs in ix["selected"].values())
                r["indexer_score_max_abs_err"] = max(
                    float(np.abs(np.asarray(q) - np.asarray(hf_ix[int(il)][pos]["scores"])).max(initial=0.0))
                    for il, qs in ix["scores"].items() for pos, q in enumerate(qs))
            rows.append(r)
            return lg

        vela = {}
        if a.vela:
            for key, what, model, exact, kv, refname in (
                    ("vela_exact", "vela on the GGUF: exact products (VELA_MATMUL=f32), f32 state", gguf_path, True,
                     "f32", "hf"),
                    ("vela_default", "vela on the GGUF: default products (activations rounded to 8 bits), f32 "
                                     "state", gguf_path, False, "f16", "hf"),
                    ("vela_dense_exact", f"vela, dense indexer (top-k {DENSE_TOPK}): exact products", f32_dense,
                     True, "f32", "dense")):
                vela[key] = row(key, what, vela_logits(a.vela, model, ids, exact, kv), refname)
        for j in spec:
            if j["key"] != "patched_rot_shipped":
                row(j["key"], j["what"], outs[j["key"]], j["ref"], ix.get(j["key"]))

    print(f"prompt {a.prompt!r} ({T} tokens); reference: transformers 5.23, f32, with the GGUF's values; "
          f"its smallest indexer cutoff gap (k-th minus (k+1)-th score) {hf_gap:.2e}\n")
    print("| variant | NMSE vs HF: worst | median | argmax = HF | indexer picks ≠ HF | indexer score max abs err "
          "| routed experts ≠ HF |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        picks = (f"{r['indexer_queries_differing']}/{r['indexer_queries']}" if "indexer_queries" in r else "")
        err = f"{r['indexer_score_max_abs_err']:.1e}" if "indexer_score_max_abs_err" in r else ""
        rt = f"{r['router_tokens_differing']}/{r['router_tokens']}" if "router_tokens" in r else ""
        print(f"| {r['what']} | {r['worst_nmse']:.1e} | {r['median_nmse']:.1e} | {r['argmax_equal']}/{r['positions']} "
              f"| {picks} | {err} | {rt} |")
    print()
    if "vela_exact" in vela:
        e = nmse_rows(vela["vela_exact"], outs["exact"])
        print(f"vela exact vs llama.cpp exact, directly: worst NMSE {e.max():.1e}; vela default vs llama.cpp's "
              f"defaults: median {np.median(nmse_rows(vela['vela_default'], outs['shipped'])):.1e}, argmax equal at "
              f"{int((vela['vela_default'].argmax(1) == outs['shipped'].argmax(1)).sum())}/{T}")
    if have_norot:
        for rot, norot in (("exact", "norot_exact"), ("f16_cache", "norot_f16_cache"),
                           ("q8_cache", "norot_q8_cache"), ("shipped", "norot_shipped")):
            same = np.array_equal(outs[rot], outs[norot])
            line = f"indexer rotation off vs on ({rot}): logits bit-identical {same}"
            if hf_ix is not None:
                d = max(float(np.abs(np.asarray(q) - np.asarray(ix[rot]["scores"][il][pos])).max(initial=0.0))
                        for il, qs in ix[norot]["scores"].items() for pos, q in enumerate(qs))
                line += (f", same selections {ix[rot]['selected'] == ix[norot]['selected']}, "
                         f"scores max abs difference {d:.1e}")
            print(line)
        print("patched build with the rotation on: bit-identical to the stock build (checked)")
    else:
        print("(no-rotation rows: run with --build-patched)")
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
