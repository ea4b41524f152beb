#!/usr/bin/env python3
# vela-venv: torch
"""Real-shape Gemma 4 check: a random-weight checkpoint with the 31B *layer geometry* but 6 layers,
and transformers 5.23 logits on a 2,048-token prompt that crosses the 1,024-token sliding window.

Regenerate (re-runnable; overwrites the output; 5.9 GB BF16 checkpoint + 11.8 GB F32 GGUF on disk,
peak RAM 9.4 GB, ~11 min on 2 busy cores; `--gguf-only` redoes just the GGUF conversion):

    $VELA_CACHE/venv-torch/bin/python scripts/gen-gemma4-realshape.py

Geometry (Gemma 4 31B, shared notes gem.md §2.1 / ggml-org GGUF headers): hidden 5,376, FFN 21,504,
32 query heads; sliding layers 16 KV heads × 256, window 1,024, RoPE θ 1e4; the full layer k_eq_v
with 4 KV heads × 512, proportional RoPE (partial 0.25, θ 1e6); final soft-cap 30; tied embeddings.
Only 6 layers (5 sliding + 1 full) and a 4,096-token vocabulary: the vocabulary size is not layer
geometry (it only sizes the embedding / lm_head matmul, which the tiny fixtures already cover).

Output `$VELA_CACHE/golden/gemma4-realshape/`:
    config.json, model-0000N-of-0000M.safetensors, model.safetensors.index.json   BF16 weights
    tokens.json        {"tokens": [2048 ids], "checked": [positions]}
    logits.f32         little-endian f32 [len(checked), vocab]: transformers, f32 compute, with
                       every nn.Linear input rounded to bf16 (see below)
    logits_plain.f32   the same without that rounding (pure f32 activations)
    meta.json          versions, timings, geometry, plain-vs-rounded NMSE
    model-f32.gguf     the same weights (bf16 values, exact) as F32 through llama.cpp's converter

Why two references: vela's CPU kernels for BF16 weights round the activations to bf16 before the
dot products (ggml's convention, docs/gemma4.md), so with BF16 weights vela computes
`linear(bf16(x), W)`. `logits.f32` is transformers with that rounding (a forward pre-hook on every
nn.Linear); `logits_plain.f32` is pure f32. bf16 rounding is discontinuous and this random model
amplifies it (plain vs rounded: NMSE 3.4e-5), so two correct implementations of "rounded" differ
by ~1e-5 already; the tight (≤ 1e-6) check is therefore vela on `model-f32.gguf` (f32 activations)
vs `logits_plain.f32`, and the BF16 checkpoint is compared loosely (gemma4_realshape.rs).

Memory: the model is built in bf16 (6.2 GB); each decoder layer is cast to f32 just before it runs
and back after (exact: the weights are bf16 values), embeddings / final norm stay f32, RoPE tables
and the embedding scale are rebuilt in f32. torch.set_num_threads(2).
"""

import json
import os
import time

import numpy as np
import torch
import transformers
from transformers import Gemma4ForCausalLM, Gemma4TextConfig
from transformers.models.gemma4 import modeling_gemma4 as mg

OUT = os.path.join(os.environ.get("VELA_CACHE", "/root/.cache/vela"), "golden", "gemma4-realshape")
N_TOKENS = 2048
CHECKED = sorted(set(range(0, N_TOKENS, 64)) | set(range(N_TOKENS - 8, N_TOKENS)) | {1023, 1024, 1025})

CONFIG = dict(
    vocab_size=4096,
    hidden_size=5376,
    intermediate_size=21504,
    num_hidden_layers=6,
    num_attention_heads=32,
    num_key_value_heads=16,
    head_dim=256,
    global_head_dim=512,
    num_global_key_value_heads=4,
    attention_k_eq_v=True,
    layer_types=["sliding_attention"] * 5 + ["full_attention"],
    sliding_window=1024,
    rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                           "rope_theta": 1_000_000.0},
    },
    final_logit_softcapping=30.0,
    hidden_size_per_layer_input=0,
    vocab_size_per_layer_input=4096,
    num_kv_shared_layers=0,
    tie_word_embeddings=True,
)


def randomize(model, gen):
    """As scripts/gen-gemma4-fixtures.py (realdims_12b): weights ~ N(0, 1/fan_in), norms ~1,
    q/k norms × head_dim^-1/4 so q·k stays O(1) at head dim 512, layer scalars in [0.5, 1.5)."""
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if not p.is_floating_point() or "inv_freq" in name or name.endswith("embed_scale"):
                continue
            if name.endswith("layer_scalar"):
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
            elif "norm" in name:
                v = 1.0 + 0.2 * torch.randn(p.shape, generator=gen)
                if "q_norm" in name or "k_norm" in name:
                    v *= p.shape[-1] ** -0.25
                p.copy_(v)
            elif "embed_tokens" in name and p.dim() == 2:
                p.copy_(0.5 * torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
            elif p.dim() == 2:
                for r in range(0, p.shape[0], 1024):  # in slabs: no full-size f32 temporary
                    blk = torch.randn((min(1024, p.shape[0] - r), p.shape[1]), generator=gen)
                    p[r:r + blk.shape[0]].copy_(blk / p.shape[-1] ** 0.5)


LLAMA_CPP = os.path.join(os.environ.get("VELA_CACHE", "/root/.cache/vela"),
                         "llama-cpp-python", "vendor", "llama.cpp")


def to_gguf_f32() -> None:
    """`model-f32.gguf`: the same weights (exact bf16 values) as F32 through llama.cpp's own
    converter (lazy, memory-light), with a synthetic `<tN>` vocabulary. vela reads it in place
    (mmap), and its F32 kernels keep the activations in f32, so it is compared with the pure-f32
    reference at the tight bound (see the Rust test)."""
    import shutil
    import sys
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
        self.gguf_writer.add_token_merges(["<t 1>"])

    gemma.Gemma4Model.set_vocab = set_vocab
    with tempfile.TemporaryDirectory() as tmp:
        for f in os.listdir(OUT):
            if f.endswith(".safetensors") or f in ("config.json", "model.safetensors.index.json"):
                os.symlink(os.path.join(OUT, f), os.path.join(tmp, f))
        n = CONFIG["vocab_size"]
        with open(os.path.join(tmp, "tokenizer.json"), "w") as f:
            json.dump({"model": {"type": "BPE", "vocab": {f"<t{i}>": i for i in range(n)}},
                       "added_tokens": []}, f)
        argv = sys.argv
        sys.argv = ["convert", tmp, "--outfile", os.path.join(OUT, "model-f32.gguf"),
                    "--outtype", "f32"]
        try:
            convert_hf_to_gguf.main()
        finally:
            sys.argv = argv


def main() -> None:
    import sys
    if sys.argv[1:] == ["--gguf-only"]:
        to_gguf_f32()
        return
    torch.set_num_threads(2)
    t0 = time.time()
    cfg = Gemma4TextConfig(**CONFIG)
    cfg._attn_implementation = "eager"
    torch.set_default_dtype(torch.bfloat16)
    model = Gemma4ForCausalLM(cfg).eval()
    torch.set_default_dtype(torch.float32)
    randomize(model, torch.Generator().manual_seed(4321))
    model.tie_weights()
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        if f.endswith(".safetensors") or f.endswith(".json"):
            os.remove(os.path.join(OUT, f))
    model.save_pretrained(OUT, safe_serialization=True, max_shard_size="2GB")
    t_save = time.time() - t0
    print(f"saved bf16 checkpoint in {t_save:.0f}s", flush=True)

    # f32 compute around the bf16 storage.
    inner = model.model
    inner.embed_tokens.float()
    inner.embed_tokens.embed_scale = torch.tensor(cfg.hidden_size ** 0.5, dtype=torch.float32)
    inner.norm.float()
    if model.lm_head.weight is not inner.embed_tokens.weight:
        model.lm_head.weight = inner.embed_tokens.weight
    assert model.lm_head.weight.dtype == torch.float32
    inner.rotary_emb = mg.Gemma4TextRotaryEmbedding(cfg)
    for layer in inner.layers:
        layer.register_forward_pre_hook(lambda m, a, kw: (m.float(), None)[1], with_kwargs=True)
        layer.register_forward_hook(lambda m, a, o: (m.to(torch.bfloat16), None)[1])

    rounding = {"on": True}

    def round_input(_m, args):
        if rounding["on"]:
            return (args[0].to(torch.bfloat16).to(torch.float32),) + tuple(args[1:])
        return None

    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            m.register_forward_pre_hook(round_input)

    rng = np.random.default_rng(11)
    tokens = [int(t) for t in rng.integers(3, cfg.vocab_size, N_TOKENS)]
    ids = torch.tensor([tokens])
    idx = torch.tensor(CHECKED)
    out = {}
    timings = {}
    for key, on in (("logits", True), ("logits_plain", False)):
        rounding["on"] = on
        t = time.time()
        with torch.no_grad():
            hs = model.model(ids, use_cache=False).last_hidden_state[0, idx]
            lg = model.lm_head(hs)
            if cfg.final_logit_softcapping:
                c = cfg.final_logit_softcapping
                lg = torch.tanh(lg / c) * c
        out[key] = lg.float().numpy()
        timings[key] = time.time() - t
        print(f"{key}: {timings[key]:.0f}s", flush=True)
        out[key].astype("<f4").tofile(os.path.join(OUT, f"{key}.f32"))
    a, b = out["logits_plain"].astype(np.float64), out["logits"].astype(np.float64)
    dev = float(((a - b) ** 2).sum() / (b ** 2).sum())
    same = int((a.argmax(-1) == b.argmax(-1)).sum())
    with open(os.path.join(OUT, "tokens.json"), "w") as f:
        json.dump({"tokens": tokens, "checked": CHECKED}, f)
    meta = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "config": CONFIG,
        "n_tokens": N_TOKENS,
        "n_checked": len(CHECKED),
        "plain_vs_bf16_rounded_inputs_nmse": dev,
        "plain_vs_bf16_rounded_inputs_argmax_equal": same,
        "seconds": {"build_and_save": t_save, **timings},
    }
    with open(os.path.join(OUT, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"plain f32 vs bf16-rounded-input reference: NMSE {dev:.3e}, argmax {same}/{len(CHECKED)}")
    del model, inner
    to_gguf_f32()


if __name__ == "__main__":
    main()
