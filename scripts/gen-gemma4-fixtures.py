#!/usr/bin/env python3
# vela-venv: torch
"""Tiny random Gemma 4 text checkpoints + transformers logits, for vela's HF-safetensors parity test.

Regenerate (re-runnable; overwrites the output):

    scripts/prepare-test-data.sh   # runs this in $VELA_CACHE/venv-torch (torch + transformers==5.23.0)
or by hand:
    $VELA_CACHE/venv-torch/bin/python scripts/gen-gemma4-fixtures.py [fixture names...]   # default: all

(torch from PyPI is the CUDA build; it runs on the CPU fine.) Output, per fixture `<name>`:

    $VELA_CACHE/golden/gemma4/<name>/        (VELA_CACHE defaults to /root/.cache/vela)
        config.json, model.safetensors       Gemma4ForCausalLM.save_pretrained, float32
        tokens.json                          {"tokens": [...40 ids...], "greedy": [...16 ids...]}
        logits.f32                           little-endian f32 [len(tokens), vocab] — every position
        logits_f64.f32                       the same from model.double() (rounded to f32)
        meta.json                            branches exercised, versions, f64-vs-f32 logit deviation
        model-f32.gguf                       the same weights through llama.cpp's converter
                                             ($VELA_CACHE/llama-cpp-python/vendor/llama.cpp)
        model-f16.gguf                       the converter's --outtype f16 (norms etc. stay F32)
        model-q8_0.gguf                      model-f32.gguf through llama-quantize Q8_0 (if built)
        bf16/                                (BF16_FIXTURES) the checkpoint in bfloat16: config.json,
                                             model.safetensors, the converter's model-bf16.gguf and
                                             llama-quantize's Q8_0 of it, model-q8_0.gguf — for
                                             vela's quantization at load (`--quant`)
        llama-{f32,f16,q8_0}.f32             llama.cpp 0c1e570's logits on those files, every
                                             position (scripts/llama_oracle.py, F32 KV cache),
                                             computed in a child process: llama.cpp aborts on
                                             ple_kvshare (recorded as meta.json llama_cpp.error)

The checkpoints cover: sliding + full layer types, a sliding window (16) crossed by the 40-token
sequence, different RoPE parameters per layer type (default / proportional with partial rotation),
different head dims for sliding and full layers, attention_k_eq_v (with its own kv-head count),
num_kv_shared_layers, use_double_wide_mlp, per-layer input embeddings (PLE), final logit
soft-capping, random norm weights and layer scalars, and the MoE block (router with random scale
and per-expert scales, 3-D expert tensors, shared MLP + experts with their extra norms; fixtures
`moe` and `moe_swa_softcap`, refused when a router top-k choice is a near tie). No tokenizer:
the tests feed token ids. Every fixture has a sliding layer (llama.cpp asserts one for gemma4).

Trap (transformers 5.23): KV sharing without PLE crashes in a multi-token forward unless
`output_hidden_states=True` (see shared arch notes §6.2), so every forward here passes it and the
greedy continuation recomputes the full sequence each step (no cache; cache parity is vela's own test).
"""

import json
import os
import sys

import numpy as np
import torch
import transformers
from transformers import Gemma4ForCausalLM, Gemma4TextConfig

OUT = os.path.join(os.environ.get("VELA_CACHE", "/root/.cache/vela"), "golden", "gemma4")

FIXTURES = {
    # Dense-style: no PLE, no sharing; full layers use k_eq_v with 1 global kv head and head dim 32.
    "dense_keqv": dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        global_head_dim=32,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        layer_types=["sliding_attention", "sliding_attention", "full_attention",
                     "sliding_attention", "sliding_attention", "full_attention"],
        sliding_window=16,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1_000_000.0},
        },
        final_logit_softcapping=30.0,
        hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=256,
        num_kv_shared_layers=0,
    ),
    # E2B-style: PLE, KV sharing of the last 3 layers, double-wide MLP in the shared layers,
    # no k_eq_v, no soft-capping, other RoPE thetas / partial factor.
    "ple_kvshare": dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=80,
        num_hidden_layers=7,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        global_head_dim=24,
        attention_k_eq_v=False,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                     "full_attention", "sliding_attention", "full_attention"],
        sliding_window=16,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 5_000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5,
                               "rope_theta": 100_000.0},
        },
        final_logit_softcapping=None,
        hidden_size_per_layer_input=16,
        vocab_size_per_layer_input=256,
        num_kv_shared_layers=3,
        use_double_wide_mlp=True,
    ),
    # Real attention geometry of Gemma 4 12B (16 query heads; sliding: 8 kv heads × 256;
    # full: k_eq_v, 1 kv head × 512, proportional RoPE 0.25 at θ=1e6; 5:1 pattern; softcap 30)
    # on a narrow residual stream, so the backend ops run at the real head sizes.
    "realdims_12b": dict(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=6,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=256,
        global_head_dim=512,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        layer_types=["sliding_attention"] * 5 + ["full_attention"],
        sliding_window=16,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1_000_000.0},
        },
        final_logit_softcapping=30.0,
        hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=512,
        num_kv_shared_layers=0,
        # q/k norm weights × head_dim^-1/4, so q·k stays O(1) at head dim 512 as in trained
        # models (with the random ~1 weights the scores reach ~20 and f32 rounding noise decides).
        _qk_norm_scale=True,
    ),
    # MoE (26B-A4B style block: shared GeGLU MLP + router + 8 experts, top-2), no soft-capping,
    # no k_eq_v (llama.cpp 0c1e570 asserts at least one sliding layer for gemma4).
    "moe": dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        global_head_dim=32,
        attention_k_eq_v=False,
        layer_types=["sliding_attention", "full_attention"] * 2,
        sliding_window=16,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5,
                               "rope_theta": 1_000_000.0},
        },
        final_logit_softcapping=None,
        hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=256,
        num_kv_shared_layers=0,
        enable_moe_block=True,
        num_experts=8,
        top_k_experts=2,
        moe_intermediate_size=32,
    ),
    # MoE with sliding + full layers (window 16 crossed), k_eq_v full layers with their own head
    # dim / kv-head count, soft-capping, top-3 of 6 experts.
    "moe_swa_softcap": dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        global_head_dim=32,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        layer_types=["sliding_attention", "sliding_attention", "full_attention",
                     "sliding_attention", "sliding_attention", "full_attention"],
        sliding_window=16,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1_000_000.0},
        },
        final_logit_softcapping=30.0,
        hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=256,
        num_kv_shared_layers=0,
        enable_moe_block=True,
        num_experts=6,
        top_k_experts=3,
        moe_intermediate_size=24,
    ),
}

N_TOKENS = 40
N_GREEDY = 16


def randomize(model: torch.nn.Module, gen: torch.Generator, qk_norm_scale: bool) -> None:
    """Random weights that keep activations O(1) in a tiny model; norms and scalars around 1."""
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if not p.is_floating_point():
                continue
            if name.endswith("layer_scalar") or name.endswith("per_expert_scale"):
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
            elif name.endswith("router.scale"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
                if qk_norm_scale and ("q_norm" in name or "k_norm" in name):
                    p.mul_(p.shape[-1] ** -0.25)
            elif "embed_tokens" in name and p.dim() == 2:
                p.copy_(0.5 * torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
            elif p.dim() in (2, 3):  # 3-D: experts [E, out, in]
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)


def logits_of(model, ids: list[int]) -> torch.Tensor:
    out = model(torch.tensor([ids]), use_cache=False, output_hidden_states=True)
    return out.logits[0]


def build(name: str, kw: dict) -> None:
    qk_norm_scale = kw.pop("_qk_norm_scale", False)
    torch.manual_seed(0)
    cfg = Gemma4TextConfig(**kw)
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"  # grouped_mm refuses float64 (arch notes §0.5)
    model = Gemma4ForCausalLM(cfg).eval().float()
    gen = torch.Generator().manual_seed(1234)
    randomize(model, gen, qk_norm_scale)
    model.tie_weights()
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)

    rng = np.random.default_rng(7)
    tokens = [int(t) for t in rng.integers(3, kw["vocab_size"], N_TOKENS)]
    # MoE: the top-k expert choice is discontinuous, so a near tie between the k-th and the
    # (k+1)-th router probability would let f32 rounding pick other experts. Record the smallest
    # gap over every token and MoE layer and refuse fixtures where it is tiny.
    gaps = []

    def router_hook(mod, _inp, out):
        probs = out[0].double()
        k = mod.config.top_k_experts
        top = probs.topk(k + 1, dim=-1).values
        gaps.append(float((top[:, k - 1] - top[:, k]).min()))

    hooks = [m.register_forward_hook(router_hook) for m in model.modules()
             if type(m).__name__ == "Gemma4TextRouter"]
    with torch.no_grad():
        logits = logits_of(model, tokens)
        for h in hooks:
            h.remove()
        greedy, seq = [], list(tokens)
        for _ in range(N_GREEDY):
            nxt = int(logits_of(model, seq)[-1].argmax())
            greedy.append(nxt)
            seq.append(nxt)
        # Reload from disk to make sure the saved checkpoint is what produced the logits.
        reloaded = Gemma4ForCausalLM.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager",
            experts_implementation="eager").eval()
        re_logits = logits_of(reloaded, tokens)
        reload_dev = float((re_logits - logits).abs().max())
        dbl = Gemma4ForCausalLM.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager",
            experts_implementation="eager").eval().double()
        d_logits = logits_of(dbl, tokens).float()
        f64_dev = float((d_logits - logits).abs().max())
    ref = d_logits.double()
    cond = (((logits.double() - ref) ** 2).sum(-1) / (ref**2).sum(-1)).max().item()
    if cond > 1e-9:
        # f32 rounding alone moves some position by more than the 1e-8 parity budget allows
        # (e.g. a near-zero input to an RMSNorm): pick another seed/shape for this fixture.
        sys.exit(f"{name}: ill-conditioned, torch f32 vs f64 worst-position NMSE {cond:.2e} > 1e-9")
    router_gap = min(gaps) if gaps else None
    if router_gap is not None and router_gap < 1e-5:
        sys.exit(f"{name}: ill-conditioned, router top-k probability gap {router_gap:.2e} < 1e-5")
    if reload_dev > 1e-5:
        sys.exit(f"{name}: reloaded checkpoint differs from the in-memory model by {reload_dev}")
    logits.numpy().astype("<f4").tofile(os.path.join(d, "logits.f32"))
    # The same checkpoint run in float64 (norms/RoPE/softmax still upcast internally, arch notes
    # §0.4): tells f32 rounding noise apart from real mismatches.
    d_logits.numpy().astype("<f4").tofile(os.path.join(d, "logits_f64.f32"))
    with open(os.path.join(d, "tokens.json"), "w") as f:
        json.dump({"tokens": tokens, "greedy": greedy}, f)
    meta = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "shape": list(logits.shape),
        "layer_types": cfg.layer_types,
        "kv_sharing_modes": cfg.kv_sharing_modes,
        "per_layer_head_dim": [cfg.per_layer_config[i].head_dim for i in range(cfg.num_hidden_layers)],
        "per_layer_kv_heads": [cfg.per_layer_config[i].num_key_value_heads
                               for i in range(cfg.num_hidden_layers)],
        "reload_max_abs_dev": reload_dev,
        "f64_vs_f32_max_abs_dev": f64_dev,
        "f64_vs_f32_worst_position_nmse": cond,
        "config_kwargs": kw,
        "qk_norm_scale": qk_norm_scale,
        "moe_min_router_topk_gap": router_gap,
    }
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1, default=str)
    print(f"{name}: logits {tuple(logits.shape)}, greedy {greedy}, f64 dev {f64_dev:.2e}")


LLAMA_CPP = os.path.join(os.environ.get("VELA_CACHE", "/root/.cache/vela"),
                         "llama-cpp-python", "vendor", "llama.cpp")


def to_gguf(d: str, types=("f32", "f16")) -> None:
    """Convert the checkpoint with llama.cpp's own converter (vendored, commit 0c1e570) to
    `model-f32.gguf`, with a synthetic vocabulary (`<tN>`): the converter needs a tokenizer but
    the tests feed token ids."""
    import shutil
    import tempfile
    sys.path[:0] = [LLAMA_CPP, os.path.join(LLAMA_CPP, "gguf-py")]
    import convert_hf_to_gguf
    from conversion import gemma

    def set_vocab(self):
        n = self.hparams["vocab_size"]
        self.gguf_writer.add_tokenizer_model("gemma4")
        self.gguf_writer.add_token_list([f"<t{i}>".encode() for i in range(n)])
        self.gguf_writer.add_token_scores([0.0] * n)
        self.gguf_writer.add_token_types([1] * n)
        # llama.cpp's gemma4 (BPE) vocabulary loader insists on a merges key.
        self.gguf_writer.add_token_merges(["<t 1>"])

    gemma.Gemma4Model.set_vocab = set_vocab
    with tempfile.TemporaryDirectory() as tmp:
        for f in ("config.json", "model.safetensors"):
            shutil.copy(os.path.join(d, f), tmp)
        n = json.load(open(os.path.join(d, "config.json")))["vocab_size"]
        # Only read for the vocabulary size (embedding rows beyond it are cut).
        with open(os.path.join(tmp, "tokenizer.json"), "w") as f:
            json.dump({"model": {"type": "BPE", "vocab": {f"<t{i}>": i for i in range(n)}},
                       "added_tokens": []}, f)
        argv = sys.argv
        try:
            for ty in types:
                out = os.path.join(d, f"model-{ty}.gguf")
                sys.argv = ["convert", tmp, "--outfile", out, "--outtype", ty]
                convert_hf_to_gguf.main()
        finally:
            sys.argv = argv


def quantize(d: str, src: str = "model-f32.gguf") -> None:
    """`model-q8_0.gguf` from `src` with llama.cpp's llama-quantize when it has been built
    (scripts/build-llama-cpp.sh); skipped otherwise."""
    import subprocess
    tool = os.path.join(os.environ.get("VELA_CACHE", "/root/.cache/vela"),
                        "llama.cpp-avx2", "bin", "llama-quantize")
    if not os.path.exists(tool):
        print(f"skipping Q8_0: {tool} not built")
        return
    subprocess.run([tool, os.path.join(d, src), os.path.join(d, "model-q8_0.gguf"),
                    "Q8_0"], check=True, capture_output=True)


# Fixtures that also get a bfloat16 copy (`<name>/bf16/`).
BF16_FIXTURES = ("dense_keqv", "moe")


def bf16_variant(d: str) -> None:
    """`d/bf16/`: the checkpoint cast to bfloat16, its GGUF by the converter (--outtype bf16)
    and llama-quantize's Q8_0 of that GGUF."""
    import shutil
    from safetensors.torch import load_file, save_file
    b = os.path.join(d, "bf16")
    os.makedirs(b, exist_ok=True)
    shutil.copy(os.path.join(d, "config.json"), b)
    t = load_file(os.path.join(d, "model.safetensors"))
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in t.items()},
              os.path.join(b, "model.safetensors"), metadata={"format": "pt"})
    to_gguf(b, types=("bf16",))
    quantize(b, src="model-bf16.gguf")
    print(f"  bf16 copy: {sorted(os.listdir(b))}")


def llama_logits(d: str) -> None:
    """llama.cpp 0c1e570's own logits on each GGUF of the fixture (every position, one batch, F32
    KV cache, no flash attention; scripts/llama_oracle.py) → `llama-<type>.f32`, so the Rust tests
    compare vela against llama.cpp on the same file without running it."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import llama_oracle
    tokens = json.load(open(os.path.join(d, "tokens.json")))["tokens"]
    ref = np.fromfile(os.path.join(d, "logits.f32"), dtype="<f4").reshape(len(tokens), -1)
    report = {}
    for ty in ("f32", "f16", "q8_0"):
        path = os.path.join(d, f"model-{ty}.gguf")
        if not os.path.exists(path):
            continue
        lg = llama_oracle.eval_logits(path, tokens, n_ctx=256, n_batch=64, n_ubatch=64,
                                      all_positions=True, kv_f32=True)
        llama_oracle.unload(path)
        lg.astype("<f4").tofile(os.path.join(d, f"llama-{ty}.f32"))
        report[ty] = llama_oracle.nmse(lg, ref)
        print(f"  llama.cpp {ty}: NMSE vs transformers f32 {report[ty]:.3e}")
    mp = os.path.join(d, "meta.json")
    meta = json.load(open(mp))
    meta["llama_cpp"] = {"commit": llama_oracle.LLAMA_CPP_COMMIT, "nmse_vs_torch_f32": report,
                         "settings": llama_oracle.settings(n_ctx=256, n_batch=64, n_ubatch=64,
                                                           type_k="f32", type_v="f32")}
    json.dump(meta, open(mp, "w"), indent=1, default=str)


def llama_logits_isolated(d: str) -> None:
    """[`llama_logits`] in a child process: llama.cpp aborts (GGML_ASSERT) on some Gemma 4
    variants, which must not take the fixture run down. A failure is recorded in meta.json."""
    import subprocess
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--llama-logits", d],
                       capture_output=True, text=True)
    for line in r.stdout.splitlines():
        if line.startswith("  llama.cpp"):
            print(line)
    if r.returncode != 0:
        asserts = [l for l in r.stderr.splitlines() if "GGML_ASSERT" in l or "error" in l.lower()]
        why = asserts[0].strip() if asserts else f"exit status {r.returncode}"
        print(f"  llama.cpp failed on {os.path.basename(d)}: {why}")
        mp = os.path.join(d, "meta.json")
        meta = json.load(open(mp))
        meta["llama_cpp"] = {"error": why}
        json.dump(meta, open(mp, "w"), indent=1, default=str)


def main() -> None:
    if sys.argv[1:2] == ["--llama-logits"]:
        llama_logits(sys.argv[2])
        return
    only = sys.argv[1:]
    for name, kw in FIXTURES.items():
        if only and name not in only:
            continue
        build(name, dict(kw))
        to_gguf(os.path.join(OUT, name))
        quantize(os.path.join(OUT, name))
        llama_logits_isolated(os.path.join(OUT, name))
        if name in BF16_FIXTURES:
            bf16_variant(os.path.join(OUT, name))


if __name__ == "__main__":
    main()
