#!/usr/bin/env python3
"""Tiny random Gemma 4 text checkpoints + transformers logits, for vela's HF-safetensors parity test.

Regenerate (re-runnable; overwrites the output):

    python3 -m venv /tmp/g4venv
    /tmp/g4venv/bin/pip install torch "transformers==5.23.0" safetensors numpy
    /tmp/g4venv/bin/python scripts/gen-gemma4-fixtures.py

(torch from PyPI is the CUDA build; it runs on the CPU fine.) Output, per fixture `<name>`:

    $VELA_CACHE/golden/gemma4/<name>/        (VELA_CACHE defaults to /root/.cache/vela)
        config.json, model.safetensors       Gemma4ForCausalLM.save_pretrained, float32
        tokens.json                          {"tokens": [...40 ids...], "greedy": [...16 ids...]}
        logits.f32                           little-endian f32 [len(tokens), vocab] — every position
        meta.json                            branches exercised, versions, f64-vs-f32 logit deviation

The checkpoints cover: sliding + full layer types, a sliding window (16) crossed by the 40-token
sequence, different RoPE parameters per layer type (default / proportional with partial rotation),
different head dims for sliding and full layers, attention_k_eq_v (with its own kv-head count),
num_kv_shared_layers, use_double_wide_mlp, per-layer input embeddings (PLE), final logit
soft-capping, random norm weights and layer scalars. No tokenizer: the tests feed token ids.

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
        hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=256,
        num_kv_shared_layers=3,
        use_double_wide_mlp=True,
    ),
}

N_TOKENS = 40
N_GREEDY = 16


def randomize(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Random weights that keep activations O(1) in a tiny model; norms and scalars around 1."""
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if not p.is_floating_point():
                continue
            if name.endswith("layer_scalar"):
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
            elif "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name and p.dim() == 2:
                p.copy_(0.5 * torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)


def logits_of(model, ids: list[int]) -> torch.Tensor:
    out = model(torch.tensor([ids]), use_cache=False, output_hidden_states=True)
    return out.logits[0]


def build(name: str, kw: dict) -> None:
    torch.manual_seed(0)
    cfg = Gemma4TextConfig(**kw)
    cfg._attn_implementation = "eager"
    model = Gemma4ForCausalLM(cfg).eval().float()
    gen = torch.Generator().manual_seed(1234)
    randomize(model, gen)
    model.tie_weights()
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)

    rng = np.random.default_rng(7)
    tokens = [int(t) for t in rng.integers(3, kw["vocab_size"], N_TOKENS)]
    with torch.no_grad():
        logits = logits_of(model, tokens)
        greedy, seq = [], list(tokens)
        for _ in range(N_GREEDY):
            nxt = int(logits_of(model, seq)[-1].argmax())
            greedy.append(nxt)
            seq.append(nxt)
        # Reload from disk to make sure the saved checkpoint is what produced the logits.
        reloaded = Gemma4ForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()
        re_logits = logits_of(reloaded, tokens)
        reload_dev = float((re_logits - logits).abs().max())
        dbl = Gemma4ForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval().double()
        d_logits = logits_of(dbl, tokens).float()
        f64_dev = float((d_logits - logits).abs().max())
    if reload_dev > 1e-5:
        sys.exit(f"{name}: reloaded checkpoint differs from the in-memory model by {reload_dev}")
    logits.numpy().astype("<f4").tofile(os.path.join(d, "logits.f32"))
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
        "config_kwargs": kw,
    }
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1, default=str)
    print(f"{name}: logits {tuple(logits.shape)}, greedy {greedy}, f64 dev {f64_dev:.2e}")


def main() -> None:
    for name, kw in FIXTURES.items():
        build(name, dict(kw))


if __name__ == "__main__":
    main()
