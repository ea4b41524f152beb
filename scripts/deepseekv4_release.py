#!/usr/bin/env python3
"""The released DeepSeek V4 checkpoint's storage for the fixtures of scripts/gen-deepseekv4-fixtures.py
(and gen-deepseekv4-mtp.py): FP8 e4m3 with ue8m0 128x128 block scales, MXFP4 routed experts, BF16 /
F32 as the release stores them, from a transformers model's parameters."""

import math

import torch
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as md

E8M0 = torch.float8_e8m0fnu
FP4_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
FP8_BLOCK = 128
FP4_BLOCK = 32


def quant_fp8(w: torch.Tensor):
    """e4m3 with one power-of-two (ue8m0) scale per 128x128 block (ceil-sized grid); returns
    (fp8 weight, e8m0 scale [ceil(r/128), ceil(c/128)], dequantized f32)."""
    r, c = w.shape
    R, C = -(-r // FP8_BLOCK), -(-c // FP8_BLOCK)
    q = torch.empty(r, c, dtype=torch.float8_e4m3fn)
    s = torch.empty(R, C)
    for i in range(R):
        for j in range(C):
            blk = w[i * FP8_BLOCK:(i + 1) * FP8_BLOCK, j * FP8_BLOCK:(j + 1) * FP8_BLOCK]
            amax = float(blk.abs().max())
            sc = 2.0 ** math.ceil(math.log2(amax / 448.0)) if amax > 0 else 1.0
            q[i * FP8_BLOCK:(i + 1) * FP8_BLOCK, j * FP8_BLOCK:(j + 1) * FP8_BLOCK] = (blk / sc).to(torch.float8_e4m3fn)
            s[i, j] = sc
    full = s.repeat_interleave(FP8_BLOCK, 0)[:r].repeat_interleave(FP8_BLOCK, 1)[:, :c]
    return q, s.to(E8M0), q.float() * full


def quant_fp4(w: torch.Tensor):
    """MXFP4: e2m1 values, one ue8m0 scale 2^(floor(log2 amax) - 2) per 1x32 block along the input
    dim, saturating at +-6; packed two per byte, the even column in the low nibble. Returns
    (int8 [r, c/2], e8m0 scale [r, c/32], dequantized f32)."""
    r, c = w.shape
    b = w.reshape(r, c // FP4_BLOCK, FP4_BLOCK)
    amax = b.abs().amax(-1, keepdim=True)
    sc = torch.exp2(torch.floor(torch.log2(amax.clamp_min(1e-30))) - 2)
    x = (b / sc).clamp(-6.0, 6.0)
    idx = (x.abs().unsqueeze(-1) - FP4_VALUES).abs().argmin(-1)
    neg = (x < 0) & (idx > 0)
    code = (idx | (neg.long() << 3)).reshape(r, c)
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8).view(torch.int8)
    deq = (FP4_VALUES[idx] * torch.where(neg, -1.0, 1.0) * sc).reshape(r, c)
    return packed, sc.reshape(r, c // FP4_BLOCK).to(E8M0), deq


FP8_HF: dict = {}  # release name of each FP8 matrix -> its HF parameter (filled by release_layout)


class Release:
    """Tensors in the released checkpoint's names and storage (`sd`), the HF state dict they
    dequantize to (`ref`), each tensor's storage kind, and the HF parameter of each FP8 matrix."""

    def __init__(self):
        self.sd, self.ref, self.kinds, self.fp8_hf = {}, {}, {}, {}

    def fp8(self, up, hf, w):
        q, s, deq = quant_fp8(w.detach())
        self.sd[up + ".weight"], self.sd[up + ".scale"], self.ref[hf] = q, s, deq
        self.kinds[up + ".weight"] = "F8_E4M3 + .scale F8_E8M0 [ceil(r/128), ceil(c/128)]"
        self.fp8_hf[up + ".weight"] = hf

    def bf16(self, up, hf, w):
        self.sd[up] = w.detach().to(torch.bfloat16)
        self.ref[hf] = self.sd[up].float()
        self.kinds[up] = "BF16"

    def f32(self, up, hf, w):
        self.sd[up] = w.detach().clone()
        if hf is not None:
            self.ref[hf] = self.sd[up]
        self.kinds[up] = "F32" if w.is_floating_point() else "I64"

    def layer(self, layer, P: str, R: str, cfg, gen: torch.Generator):
        """One decoder layer: release prefix P (`layers.<i>.`), HF prefix R."""
        fp8, bf16, f32 = self.fp8, self.bf16, self.f32
        E, I = cfg.n_routed_experts, cfg.moe_intermediate_size
        for hc, up in ((layer.attn_hc, "hc_attn"), (layer.ffn_hc, "hc_ffn")):
            hn = "attn_hc" if up == "hc_attn" else "ffn_hc"
            for leaf in ("fn", "base", "scale"):
                f32(f"{P}{up}_{leaf}", f"{R}{hn}.{leaf}", getattr(hc, leaf))
        bf16(P + "attn_norm.weight", R + "input_layernorm.weight", layer.input_layernorm.weight)
        bf16(P + "ffn_norm.weight", R + "post_attention_layernorm.weight", layer.post_attention_layernorm.weight)
        a, A = layer.self_attn, R + "self_attn."
        f32(P + "attn.attn_sink", A + "sinks", a.sinks)
        fp8(P + "attn.wq_a", A + "q_a_proj.weight", a.q_a_proj.weight)
        bf16(P + "attn.q_norm.weight", A + "q_a_norm.weight", a.q_a_norm.weight)
        fp8(P + "attn.wq_b", A + "q_b_proj.weight", a.q_b_proj.weight)
        fp8(P + "attn.wkv", A + "kv_proj.weight", a.kv_proj.weight)
        bf16(P + "attn.kv_norm.weight", A + "kv_norm.weight", a.kv_norm.weight)
        fp8(P + "attn.wo_a", A + "o_a_proj.weight", a.o_a_proj.weight)
        fp8(P + "attn.wo_b", A + "o_b_proj.weight", a.o_b_proj.weight)
        c = a.compressor
        if c is not None:
            C = A + "compressor."
            f32(P + "attn.compressor.ape", C + "position_bias", c.position_bias)
            bf16(P + "attn.compressor.wkv.weight", C + "kv_proj.weight", c.kv_proj.weight)
            bf16(P + "attn.compressor.wgate.weight", C + "gate_proj.weight", c.gate_proj.weight)
            bf16(P + "attn.compressor.norm.weight", C + "kv_norm.weight", c.kv_norm.weight)
            if isinstance(c, md.DeepseekV4CSACompressor):
                ix, X = c.indexer, C + "indexer."
                fp8(P + "attn.indexer.wq_b", X + "q_b_proj.weight", ix.q_b_proj.weight)
                bf16(P + "attn.indexer.weights_proj.weight", X + "scorer.weights_proj.weight",
                     ix.scorer.weights_proj.weight)
                f32(P + "attn.indexer.compressor.ape", X + "position_bias", ix.position_bias)
                bf16(P + "attn.indexer.compressor.wkv.weight", X + "kv_proj.weight", ix.kv_proj.weight)
                bf16(P + "attn.indexer.compressor.wgate.weight", X + "gate_proj.weight", ix.gate_proj.weight)
                bf16(P + "attn.indexer.compressor.norm.weight", X + "kv_norm.weight", ix.kv_norm.weight)
        mlp, F = layer.mlp, R + "mlp."
        bf16(P + "ffn.gate.weight", F + "gate.weight", mlp.gate.weight)
        if mlp.is_hash:
            f32(P + "ffn.gate.tid2eid", F + "gate.tid2eid", mlp.gate.tid2eid)
            # present in the release for the hash layers too (unused there; llama.cpp's converter skips it)
            f32(P + "ffn.gate.bias", None, 0.3 * torch.randn(E, generator=gen))
        else:
            f32(P + "ffn.gate.bias", F + "gate.e_score_correction_bias", mlp.gate.e_score_correction_bias)
        gu, dn = mlp.experts.gate_up_proj.detach(), mlp.experts.down_proj.detach()
        dgu, ddn = torch.empty_like(gu), torch.empty_like(dn)
        for e in range(E):
            for wn, w, rows in (("w1", gu[e, :I], slice(0, I)), ("w3", gu[e, I:], slice(I, 2 * I)), ("w2", dn[e], None)):
                q, s, deq = quant_fp4(w)
                self.sd[f"{P}ffn.experts.{e}.{wn}.weight"], self.sd[f"{P}ffn.experts.{e}.{wn}.scale"] = q, s
                self.kinds[f"{P}ffn.experts.{e}.{wn}.weight"] = "MXFP4: I8 [r, c/2] + .scale F8_E8M0 [r, c/32]"
                if rows is None:
                    ddn[e] = deq
                else:
                    dgu[e, rows] = deq
        self.ref[F + "experts.gate_up_proj"], self.ref[F + "experts.down_proj"] = dgu, ddn
        se = mlp.shared_experts
        fp8(P + "ffn.shared_experts.w1", F + "shared_experts.gate_proj.weight", se.gate_proj.weight)
        fp8(P + "ffn.shared_experts.w3", F + "shared_experts.up_proj.weight", se.up_proj.weight)
        fp8(P + "ffn.shared_experts.w2", F + "shared_experts.down_proj.weight", se.down_proj.weight)


def release_layout(model, cfg, gen: torch.Generator):
    """(tensors in the released checkpoint's names/dtypes, the HF state dict they dequantize to,
    per-tensor storage kinds, the names of the random MTP block)."""
    rel = Release()
    sd, kinds = rel.sd, rel.kinds
    M = model.model
    rel.bf16("embed.weight", "model.embed_tokens.weight", M.embed_tokens.weight)
    rel.bf16("head.weight", "lm_head.weight", model.lm_head.weight)
    rel.bf16("norm.weight", "model.norm.weight", M.norm.weight)
    rel.f32("hc_head_fn", "model.hc_head.hc_fn", M.hc_head.hc_fn)
    rel.f32("hc_head_base", "model.hc_head.hc_base", M.hc_head.hc_base)
    rel.f32("hc_head_scale", "model.hc_head.hc_scale", M.hc_head.hc_scale)
    E, I = cfg.n_routed_experts, cfg.moe_intermediate_size
    for i, layer in enumerate(M.layers):
        rel.layer(layer, f"layers.{i}.", f"model.layers.{i}.", cfg, gen)
    FP8_HF.clear()  # one fixture's names (several are built in one process)
    FP8_HF.update(rel.fp8_hf)

    # an MTP block (random; no oracle: HF drops ^mtp.* on load, modeling 1266): e_proj/h_proj/enorm/
    # hnorm/norm/hc_head_* + one sliding-window block with a top-k (non-hash) MoE, as layer N would be
    H, hc = cfg.hidden_size, cfg.hc_mult
    src = M.layers[-1]

    def rnd(shape, s=1.0):
        return s * torch.randn(shape, generator=gen)

    mtp = {}
    for nm in ("e_proj", "h_proj"):
        q, s, _ = quant_fp8(rnd((H, H), H ** -0.5))
        mtp[f"mtp.0.{nm}.weight"], mtp[f"mtp.0.{nm}.scale"] = q, s
    for nm in ("enorm", "hnorm", "norm", "attn_norm", "ffn_norm", "attn.q_norm", "attn.kv_norm"):
        n = cfg.q_lora_rank if nm == "attn.q_norm" else cfg.head_dim if nm == "attn.kv_norm" else H
        mtp[f"mtp.0.{nm}.weight"] = (1 + rnd(n, 0.2)).to(torch.bfloat16)
    mtp["mtp.0.hc_head_fn"], mtp["mtp.0.hc_head_base"], mtp["mtp.0.hc_head_scale"] = \
        rnd((hc, hc * H), (hc * H) ** -0.5), rnd(hc, 0.5), torch.ones(1)
    for up in ("hc_attn", "hc_ffn"):
        mtp[f"mtp.0.{up}_fn"] = rnd(((2 + hc) * hc, hc * H), (hc * H) ** -0.5)
        mtp[f"mtp.0.{up}_base"], mtp[f"mtp.0.{up}_scale"] = rnd((2 + hc) * hc, 0.5), torch.ones(3)
    mtp["mtp.0.attn.attn_sink"] = rnd(cfg.num_attention_heads)
    for up, hf in (("wq_a", "q_a_proj"), ("wq_b", "q_b_proj"), ("wkv", "kv_proj"), ("wo_a", "o_a_proj"),
                   ("wo_b", "o_b_proj")):
        w = getattr(src.self_attn, hf).weight
        q, s, _ = quant_fp8(rnd(w.shape, w.shape[-1] ** -0.5))
        mtp[f"mtp.0.attn.{up}.weight"], mtp[f"mtp.0.attn.{up}.scale"] = q, s
    mtp["mtp.0.ffn.gate.weight"] = rnd((E, H), H ** -0.5).to(torch.bfloat16)
    mtp["mtp.0.ffn.gate.bias"] = rnd(E, 0.3)
    for e in range(E):
        for wn, shape in (("w1", (I, H)), ("w3", (I, H)), ("w2", (H, I))):
            q, s, _ = quant_fp4(rnd(shape, shape[1] ** -0.5))
            mtp[f"mtp.0.ffn.experts.{e}.{wn}.weight"], mtp[f"mtp.0.ffn.experts.{e}.{wn}.scale"] = q, s
    for wn, shape in (("w1", (I, H)), ("w3", (I, H)), ("w2", (H, I))):
        q, s, _ = quant_fp8(rnd(shape, shape[1] ** -0.5))
        mtp[f"mtp.0.ffn.shared_experts.{wn}.weight"], mtp[f"mtp.0.ffn.shared_experts.{wn}.scale"] = q, s
    sd.update(mtp)
    return sd, rel.ref, kinds, sorted(mtp)
