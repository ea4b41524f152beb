#!/usr/bin/env python3
# vela-venv: torch
"""llama.cpp 0c1e570 on the GGUF `vela synth` writes for a qwen4_exp geometry, against vela.

    $VELA_CACHE/venv-torch/bin/python scripts/qwen4exp-synth-vs-llama.py [--vela target/release/vela]
        [--arch qwen4exp-tiny-llamacpp] [--seed 7] [--keep DIR]

0. The converter: the HF checkpoint `Qwen4ExpModel::synth` generates for qwen4exp-tiny (its
   generator, crate::synth::normal, reproduced here in numpy; the `ple` fixture's config and
   tokenizer, which have qwen4exp-tiny's shapes) converted by llama.cpp's convert_hf_to_gguf.py
   (scripts/gen-qwen4exp-fixtures.py --gguf-child) equals `vela synth --arch qwen4exp-tiny --type
   f32`: metadata (but the name and the tokenizer), tensor order, shapes, types and bytes (ssm_a,
   −exp(A_log), to 1 ulp: torch's exp vs Rust's).
1. llama-quantize: `vela synth --type f32` → llama-quantize Q8_0 / Q4_0 / Q4_K_M, compared with
   `vela synth --type q8_0 / q4_0 / q4_k_m` of the same seed: metadata (every key and value),
   tensor directory (names, order, shapes, types) and tensor bytes (vela's quantizers against
   ggml's on the same f32 values).
2. Logits: llama.cpp (scripts/llama_oracle.py, CPU, F32 KV) and vela (`vela logits`, F32 KV) on
   the same files, every position of a 40-token prompt with two EOS tokens (the n-gram hash resets
   inside it): f32 and q8_0, with the converter's zero compress ratios (llama.cpp attends densely
   on the QSA layers) and with `--compress-ratios` (llama.cpp runs its own QSA selection). Both
   engines agree while the indexer keeps every block (positions < indexer_budget + ratio − 1);
   after that llama.cpp's selection differs from HF's (docs/qwen4exp-spec.md §10), so the rest is
   reported, not asserted.
Exits non-zero when a check fails.
"""
import argparse, os, subprocess, sys, tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.environ.get("VELA_CACHE", os.path.expanduser("~/.cache/vela"))
LLAMA = os.path.join(CACHE, "llama-cpp-python/vendor/llama.cpp")
LLAMA_BIN = os.path.join(CACHE, "llama.cpp-avx2/bin")
sys.path[:0] = [HERE, os.path.join(LLAMA, "gguf-py")]
import gguf  # noqa: E402
import llama_oracle as lo  # noqa: E402

EOS, BUDGET, RATIO, VOCAB = 503, 16, 4, 512
FAILED = []


def check(ok: bool, what: str) -> None:
    print(("  ok   " if ok else "  FAIL ") + what)
    if not ok:
        FAILED.append(what)


def prompt() -> list:
    t = [(i * 131 + 17) % 500 for i in range(40)]
    t[9] = EOS
    t[25] = EOS
    return t


def synth(vela: str, arch: str, ty: str, seed: int, out: str, *extra) -> None:
    subprocess.run([vela, "synth", "--arch", arch, "--type", ty, "--seed", str(seed), "-o", out, *extra],
                   check=True, capture_output=True)


def fields(r):
    out = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF."):
            continue
        out[k] = ([gguf.GGUFValueType(t).name for t in f.types], f.contents())
    return out


def compare_quantize(vela: str, arch: str, seed: int, work: str) -> None:
    f32 = os.path.join(work, "f32.gguf")
    for ty, lq in [("q8_0", "Q8_0"), ("q4_0", "Q4_0"), ("q4_k_m", "Q4_K_M")]:
        ours, theirs = os.path.join(work, f"vela-{ty}.gguf"), os.path.join(work, f"lq-{ty}.gguf")
        synth(vela, arch, ty, seed, ours)
        subprocess.run([os.path.join(LLAMA_BIN, "llama-quantize"), f32, theirs, lq], check=True, capture_output=True)
        a, b = gguf.GGUFReader(ours), gguf.GGUFReader(theirs)
        fa, fb = fields(a), fields(b)
        check(list(fa) == list(fb) and all(fa[k] == fb[k] for k in fa),
              f"{ty}: metadata equals llama-quantize's ({len(fa)} keys)")
        da = [(t.name, [int(x) for x in t.shape], t.tensor_type.name) for t in a.tensors]
        db = [(t.name, [int(x) for x in t.shape], t.tensor_type.name) for t in b.tensors]
        check(da == db, f"{ty}: tensor directory equals llama-quantize's ({len(da)} tensors, "
                        f"types {sorted(set(x[2] for x in da))})")
        if da != db:
            for x, y in zip(da, db):
                if x != y:
                    print(f"     first difference: vela {x} llama-quantize {y}")
                    break
        same = sum(1 for x, y in zip(a.tensors, b.tensors) if bytes(x.data.tobytes()) == bytes(y.data.tobytes()))
        check(same == len(a.tensors), f"{ty}: tensor bytes identical for {same}/{len(a.tensors)} tensors")


M64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def _mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def tensor_key(seed: int, name: str) -> int:
    h = 0xCBF29CE484222325
    for b in name.encode():
        h = ((h ^ b) * 0x100000001B3) & M64
    return _mix64(h ^ _mix64((seed + GAMMA) & M64))


def normal(key: int, n: int) -> np.ndarray:
    """crate::synth::normal(key, j) for j < n (Irwin-Hall of four 16-bit uniforms), f32."""
    j = np.arange(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np.uint64(key) ^ (j * np.uint64(GAMMA))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    m = np.uint64(0xFFFF)
    s = (z & m) + ((z >> np.uint64(16)) & m) + ((z >> np.uint64(32)) & m) + (z >> np.uint64(48))
    return (s.astype(np.float32) - np.float32(131070.0)) * (np.float32(1.7320508) / np.float32(65536.0))


def hf_checkpoint(cfg: dict, seed: int, meta: dict) -> dict:
    """The tensors `Qwen4ExpModel::synth` generates (qwen4exp/synth.rs `plan`, `vector_make`),
    HF names, f32; the MTP layer left out (the converter drops it); the hash constants from
    `meta` (vela's GGUF; they are checked against transformers by tests/qwen4exp_synth.rs)."""
    H, S, R = cfg["hidden_size"], cfg["hc_count"], cfg["hc_lowrank"]
    sh, V = S * H, cfg["vocab_size"]
    hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv, K = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
    C = 2 * hk * dk + hv * dv
    nq, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    ni, di = cfg["indexer_n_heads"], cfg["indexer_head_dim"]
    E, I, Is = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
    D, Kp = cfg["ple_embed_dim"], cfg["ple_conv_kernel_size"]
    t = {}

    def gen(name, shape, mean, std):
        key = tensor_key(seed, name.removeprefix("model."))
        n = int(np.prod(shape))
        t[name] = (np.float32(mean) + np.float32(std) * normal(key, n)).reshape(shape)

    def mat(name, rows, cols, std=None):
        gen(name, (rows, cols), 0.0, std if std is not None else np.float32(1) / np.sqrt(np.float32(cols)))

    mat("lm_head.weight", V, H)
    mat("model.embed_tokens.weight", V, H, np.float32(1.0))
    for hc in ["model.hyper_connection_mixer"]:
        gen(hc + ".hc_norm.weight", (sh,), 0.0, 0.02)
        mat(hc + ".input_mix_weight_down.weight", R, sh)
        mat(hc + ".input_mix_weight_up.weight", sh, R)
    for i, lt in enumerate(cfg["layer_types"]):
        p = f"model.layers.{i}"
        for hc in ["attn_hyper_connection", "mlp_hyper_connection"]:
            gen(f"{p}.{hc}.hc_norm.weight", (sh,), 0.0, 0.02)
            mat(f"{p}.{hc}.input_mix_weight_down.weight", R, sh)
            mat(f"{p}.{hc}.input_mix_weight_up.weight", sh, R)
            mat(f"{p}.{hc}.block_inject_weight.weight", S, sh)
        if lt == "linear_attention":
            a = f"{p}.linear_attn"
            mat(f"{a}.in_proj_qkv.weight", C, H)
            mat(f"{a}.in_proj_z.weight", hv * dv, H)
            mat(f"{a}.in_proj_b.weight", hv, H)
            mat(f"{a}.in_proj_a.weight", hv, H)
            mat(f"{a}.out_proj.weight", H, hv * dv)
            gen(f"{a}.conv1d.weight", (C, 1, K), 0.0, 0.5)
            gen(f"{a}.A_log", (hv,), -0.7, 0.1)
            gen(f"{a}.dt_bias", (hv,), 0.0, 0.1)
            gen(f"{a}.norm.weight", (dv,), 1.0, 0.02)
        else:
            a = f"{p}.self_attn"
            mat(f"{a}.q_proj.weight", 2 * nq * hd, H)
            mat(f"{a}.k_proj.weight", nkv * hd, H)
            mat(f"{a}.v_proj.weight", nkv * hd, H)
            mat(f"{a}.o_proj.weight", H, nq * hd)
            mat(f"{a}.indexer.index_qk_proj.weight", (ni + 1) * di, H)
            for n, d in [("q_norm", hd), ("k_norm", hd), ("indexer.q_layernorm", di), ("indexer.k_layernorm", di)]:
                gen(f"{a}.{n}.weight", (d,), 0.0, 0.02)
        e = f"{p}.mlp"
        mat(f"{e}.gate.weight", E, H)
        for x in range(E):
            mat(f"{e}.experts.{x}.gate_proj.weight", I, H)
            mat(f"{e}.experts.{x}.up_proj.weight", I, H)
            mat(f"{e}.experts.{x}.down_proj.weight", H, I)
        mat(f"{e}.shared_expert.gate_proj.weight", Is, H)
        mat(f"{e}.shared_expert.up_proj.weight", Is, H)
        mat(f"{e}.shared_expert.down_proj.weight", H, Is)
        mat(f"{e}.shared_expert_gate.weight", 1, H)
        if i + 1 in cfg["ple_layer_ids"]:
            q = f"{p}.ple"
            mat(f"{q}.key_proj.weight", sh, D)
            mat(f"{q}.value_proj.weight", H, D)
            for n in ["norm_key", "norm_query", "norm_conv"]:
                gen(f"{q}.{n}.weight", (sh,), 0.0, 0.02)
            gen(f"{q}.conv1d.weight", (sh, 1, Kp), 0.0, 0.5)
            sizes = [int(x) for x in meta["qwen4exp.ple.head_vocab_sizes"]]
            div = cfg["make_ngram_vocab_size_divisible_by"]
            rows = -(-sum(sizes) // div) * div
            w = D // len(sizes)
            table = normal(tensor_key(seed, f"{q}.ple_embedding.ngram_embedding".removeprefix("model.")),
                           rows * w).reshape(rows, w)
            parts = cfg["split_ngram_parts"]
            for k, shard in enumerate(np.split(table, parts)):
                t[f"{q}.ple_embedding.ngram_embedding.shard_{k}.weight"] = shard
            for n, key in [("layer_multipliers", "ple.layer_multipliers"), ("ngram_heads_vocab_sizes", "ple.head_vocab_sizes"),
                           ("ngram_heads_offsets", "ple.head_offsets")]:
                t[f"{q}.ple_embedding.{n}"] = np.asarray([int(x) for x in meta["qwen4exp." + key]], dtype=np.int64)
    return t


def compare_converter(vela: str, seed: int, work: str) -> None:
    import json, shutil
    from safetensors.numpy import save_file
    fix = os.path.join(CACHE, "golden/qwen4exp/ple")
    if not os.path.exists(os.path.join(fix, "config.json")):
        print("  skip (no $VELA_CACHE/golden/qwen4exp/ple: scripts/gen-qwen4exp-fixtures.py)")
        return
    ours = os.path.join(work, "tiny-f32.gguf")
    synth(vela, "qwen4exp-tiny", "f32", seed, ours)
    a = gguf.GGUFReader(ours)
    meta = {k: f.contents() for k, f in a.fields.items()}
    d = os.path.join(work, "hf-tiny")
    os.makedirs(d, exist_ok=True)
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(fix, f), d)
    cfg = json.load(open(os.path.join(d, "config.json")))
    save_file(hf_checkpoint(cfg, seed, meta), os.path.join(d, "model.safetensors"))
    subprocess.run([sys.executable, os.path.join(HERE, "gen-qwen4exp-fixtures.py"), "--gguf-child", d],
                   check=True, capture_output=True)
    b = gguf.GGUFReader(os.path.join(d, "model-f32.gguf"))
    keep = lambda fs: {k: v for k, v in fs.items() if not k.startswith("tokenizer.") and k not in ("general.name", "GGUF.kv_count")}
    fa, fb = keep(fields(a)), keep(fields(b))
    check(list(fa) == list(fb) and all(fa[k] == fb[k] for k in fa),
          f"converter: metadata equals convert_hf_to_gguf.py's ({len(fa)} keys but the name and tokenizer)")
    da = [(t.name, [int(x) for x in t.shape], t.tensor_type.name) for t in a.tensors]
    db = [(t.name, [int(x) for x in t.shape], t.tensor_type.name) for t in b.tensors]
    check(da == db, f"converter: tensor directory equals convert_hf_to_gguf.py's ({len(da)} tensors)")
    same, ulp = 0, []
    for x, y in zip(a.tensors, b.tensors):
        if x.data.tobytes() == y.data.tobytes():
            same += 1
        elif x.name.endswith("ssm_a"):
            ulp.append(int(np.max(np.abs(np.asarray(x.data).view(np.int32) - np.asarray(y.data).view(np.int32)))))
        else:
            print(f"     differs: {x.name}")
    check(same + len(ulp) == len(a.tensors) and all(u <= 1 for u in ulp),
          f"converter: tensor bytes identical for {same}/{len(a.tensors)} tensors, "
          f"the other {len(ulp)} (ssm_a) within {max(ulp, default=0)} ulp")


def vela_logits(vela: str, model: str, toks: list, exact: bool = False) -> np.ndarray:
    """vela's logits at every position (`vela logits` on each prefix; F32 KV); `exact`: exact
    matmul mode (VELA_MATMUL=f32: weights dequantized, no activation rounding)."""
    import json
    env = dict(os.environ, VELA_MATMUL="f32" if exact else "")
    rows = []
    for n in range(1, len(toks) + 1):
        out = subprocess.run([vela, "logits", "-m", model, "--device", "cpu", "-t", "2", "--kv-type", "f32",
                              "--tokens", ",".join(map(str, toks[:n]))], check=True, capture_output=True,
                             text=True, env=env)
        rows.append(np.asarray(json.loads(out.stdout)["logits"], dtype=np.float32))
    return np.stack(rows)


def gmean(v) -> float:
    return float(np.exp(np.mean(np.log(np.maximum(np.asarray(v), 1e-30)))))


def compare_logits(vela: str, arch: str, seed: int, work: str) -> None:
    toks = prompt()
    dense = BUDGET + RATIO - 1
    print(f"prompt: {len(toks)} tokens, EOS at 9 and 25; every block kept below position {dense}")
    for ty in ["f32", "q8_0", "q4_0"]:
        for ratios in [False, True]:
            path = os.path.join(work, f"lg-{ty}-{int(ratios)}.gguf")
            synth(vela, arch, ty, seed, path, *(["--compress-ratios"] if ratios else []))
            what = f"{ty} compress_ratios={'ratio' if ratios else 0}"
            ll = lo.eval_logits(path, toks, all_positions=True, kv_f32=True)
            lo.unload(path)
            if ty == "f32":
                vl = vela_logits(vela, path, toks)
                per = [lo.nmse(vl[t], ll[t]) for t in range(len(toks))]
                head, tail = max(per[:dense]), per[dense:]
                agree = int((ll.argmax(1) == vl.argmax(1)).sum())
                check(head <= 1e-9, f"{what}: positions 0..{dense - 1} worst NMSE {head:.2e} (≤ 1e-9); "
                                    f"positions {dense}..{len(toks) - 1}: worst {max(tail):.2e}, "
                                    f"{sum(1 for e in tail if e > 1e-6)} above 1e-6; argmax equal at {agree}/{len(toks)}")
                continue
            # E: llama.cpp on the same weights dequantized to F32 (llama-quantize), against vela's
            # exact mode on the quantized file: the same arithmetic on the same weights.
            e_path = os.path.join(work, f"lg-{ty}-{int(ratios)}-as-f32.gguf")
            subprocess.run([os.path.join(LLAMA_BIN, "llama-quantize"), "--allow-requantize", path, e_path, "F32"],
                           check=True, capture_output=True)
            le = lo.eval_logits(e_path, toks, all_positions=True, kv_f32=True)
            lo.unload(e_path)
            vx = vela_logits(vela, path, toks, exact=True)
            per = [lo.nmse(vx[t], le[t]) for t in range(len(toks))]
            check(max(per[:dense]) <= 1e-9,
                  f"{what}: vela exact mode vs llama.cpp on the file dequantized to F32: positions 0..{dense - 1} "
                  f"worst NMSE {max(per[:dense]):.2e} (≤ 1e-9); after: worst {max(per[dense:]):.2e}")
            # The quantized paths as shipped (both round activations to Q8 blocks), against E.
            vq = vela_logits(vela, path, toks)
            v_e = [lo.nmse(vq[t], le[t]) for t in range(dense)]
            q_e = [lo.nmse(ll[t], le[t]) for t in range(dense)]
            v_q = [lo.nmse(vq[t], ll[t]) for t in range(dense)]
            ratio = gmean(v_e) / gmean(q_e)
            check(ratio <= 3.0, f"{what}: quantized paths, positions 0..{dense - 1}: geomean NMSE vela–E "
                                f"{gmean(v_e):.1e}, llama.cpp–E {gmean(q_e):.1e} (ratio {ratio:.2f} ≤ 3), "
                                f"vela–llama.cpp {gmean(v_q):.1e} (worst {max(v_q):.1e})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vela", default=os.path.join(HERE, "..", "target/release/vela"))
    ap.add_argument("--arch", default="qwen4exp-tiny-llamacpp")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--keep", default=None)
    a = ap.parse_args()
    work = a.keep or tempfile.mkdtemp(prefix="q4synth-")
    os.makedirs(work, exist_ok=True)
    synth(a.vela, a.arch, "f32", a.seed, os.path.join(work, "f32.gguf"))
    print(f"{a.arch}, seed {a.seed} ({work})")
    print("llama.cpp's converter vs vela synth (qwen4exp-tiny):")
    compare_converter(a.vela, a.seed, work)
    print("llama-quantize vs vela synth:")
    compare_quantize(a.vela, a.arch, a.seed, work)
    print("llama.cpp vs vela logits:")
    compare_logits(a.vela, a.arch, a.seed, work)
    print("FAILED: " + "; ".join(FAILED) if FAILED else "all checks passed")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
