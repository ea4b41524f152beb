#!/usr/bin/env python3
# vela-venv: torch
"""Tiny random deepseek_v4 ("DeepSeek V4 Flash") checkpoints + transformers 5.23 oracle outputs.

Regenerate (re-runnable; overwrites the output):

    scripts/prepare-test-data.sh   # runs this in $VELA_CACHE/venv-torch (torch + transformers==5.23.0)
or by hand:
    $VELA_CACHE/venv-torch/bin/python scripts/gen-deepseekv4-fixtures.py [fixture names...]   # default: all
    (names: the FIXTURES keys below, `flash_mini_fp8` (builds `flash_mini` too) and `flash_lcpp`)

One CPU thread (torch.set_num_threads(1)); about a minute for everything, ~37 MB. The forward pass is
spelled out in docs/deepseekv4-spec.md (HF line numbers); scripts/deepseekv4_ref.py re-implements it
from that document and checks every file below. Output, per fixture `<name>`:

    $VELA_CACHE/golden/deepseekv4/<name>/     (VELA_CACHE defaults to ~/.cache/vela)
        config.json, model.safetensors      DeepseekV4ForCausalLM.save_pretrained, float32, in the
                                            layout HF writes: per-expert `ffn.experts.<e>.{w1,w2,w3}`,
                                            upstream leaf names (`attn.wq_a`, `attn.norm`, `hc_attn_fn`,
                                            `ffn.gate.{weight,bias,tid2eid}`, `head.weight`, ...) under
                                            HF's `model.` prefix (spec §10). `flash_mini` has its
                                            config.json rewritten in the upstream style (the real
                                            file's keys: compress_ratios, num_hash_layers,
                                            qk_rope_head_dim, rope_scaling, ...; HF reload checked);
                                            the others keep what HF writes (layer_types,
                                            mlp_layer_types, nested rope_parameters)
        generation_config.json              as save_pretrained wrote it
        tokenizer.json, tokenizer_config.json  synthetic (`<tN>` for id N, no merges): the tests feed
                                            token ids; only there so the directory loads like an HF
                                            checkpoint
        prompts.json                        {"prompts": {"long": [...], "mid": [...], "short": [...]},
                                             "generate": {"prompt": "mid", "tokens": [64 ids]},
                                             "split": S, "chunks": [...]}
        logits_<prompt>.f32                 little-endian f32 [len(prompt), vocab], every position,
                                            one no-cache forward
        streams_long.f32                    f32 [L+1, T, hc_mult, hidden]: the residual streams of
                                            `long` after the embedding ([0], hc_mult copies) and after
                                            every decoder layer
        streams_mid_long.f32                f32 [L, T, hc_mult, hidden]: the streams after the
                                            attention half of each layer (the ffn_hc input)
        head_long.f32                       f32 [T, hidden]: hc_head output (before model.norm)
        entries_long.json                   per compressed layer: the compressor's entries for `long`
                                            (post kv_norm + RoPE) and, for CSA, the indexer's
                                            compressed keys: file names of f32 blobs entries_L<i>.f32
                                            [n, head_dim] / index_keys_L<i>.f32 [n, index_head_dim]
        logits_long_split<S>.f32            positions S.. of `long` from a cached forward of long[:S]
                                            then long[S:] (S a multiple of no compression rate)
        logits_long_chunks.f32              positions chunks[0].. of `long` fed as the cached chunks
                                            `chunks` (includes a 3- and a 1-token chunk that complete
                                            a CSA window out of buffered tokens)
        logits_gen.f32                      [64, vocab]: the logits `generate` (greedy, cache on, EOS
                                            ignored) saw at each step; row 0 is the prefill's last
                                            position, rows 1.. are single-token decode steps
        indexer_<prompt>.json               the Lightning indexer's choice per CSA layer and query:
                                            selected compressed entries (sorted), the scores of all
                                            visible entries, the gap at the top-k cutoff
        indexer_gen.json                    the same for the 63 decode steps of `generate`
        meta.json                           manifest (every file, dtype, shape), versions, config
                                            kwargs, effective HF config, margins, deviations between
                                            equivalent paths, f32-vs-f64 conditioning, SwiGLU clamp
                                            activity

    $VELA_CACHE/golden/deepseekv4/flash_mini_fp8/
        the flash_mini weights stored the way the released checkpoint stores them: upstream tensor
        names without HF's prefix (`embed.weight`, `layers.<i>.attn.wq_a.weight`, `hc_head_fn`, ...),
        FP8 e4m3 matrices with ue8m0 (float8_e8m0fnu) 128x128 block scales `<w>.scale`, MXFP4 routed
        experts (int8, two e2m1 nibbles per byte, low nibble first, ue8m0 scale per 1x32 block), BF16
        for the tensors the release keeps in BF16, F32 for hc/sink/ape/gate-bias, plus an `mtp.0.*`
        block (random, HF drops it on load) and the unused `ffn.gate.bias` of the hash layers;
        config.json with the release's quantization_config / expert_dtype. HF 5.23 loads it on CPU
        by dequantizing (FineGrainedFP8HfQuantizer, no GPU => dequantize=True); the oracle is that
        model cast to float32: logits_<prompt>.f32, indexer_long.json, and logits_long_bf16.f32
        (HF's own dtype="auto" load, i.e. bf16 compute, for information). meta.json says how the
        weights were quantized and that HF's dequantized weights equal the spec's exactly.
        model-llamacpp.gguf: llama.cpp 0c1e570's convert_hf_to_gguf.py of this directory (--outtype
        f32; a synthetic vocabulary, the tests feed ids): MXFP4 experts repacked as GGML MXFP4,
        FP8 matrices dequantized and requantized to Q8_0, BF16 / F32 as stored.
        logits_<prompt>_gguf.f32: HF's logits with the GGUF's values of those Q8_0 matrices (the
        oracle of a GGUF loader; every other tensor decodes to the release's values), and
        indexer_long_gguf.json: that model's indexer choices and scores.
        deq_<name>.f32: HF's dequantization of a few FP8 and MXFP4 matrices (release names), for a
        loader's own decoding.

    $VELA_CACHE/golden/deepseekv4/flash_lcpp/
        the same files for flash_lcpp (below; no f32 twin is kept), plus llama.cpp 0c1e570's own
        logits of every prompt at every position (scripts/llama_oracle.py's settings, each
        evaluated twice and bit-identical): logits_<prompt>_llamacpp.f32 on model-llamacpp.gguf as
        converted with llama.cpp's default F16 caches, logits_<prompt>_llamacpp_exact.f32 on that
        GGUF with every tensor dequantized to F32 (gguf-py) and F32 caches.
        scripts/deepseekv4-vs-llamacpp.py compares HF, vela and llama.cpp on it.

Fixtures (hidden 64, vocab 512, eager attention, eager experts):
    flash_mini   the real Flash layer pattern in miniature: compress_ratios [0, 0, 4, 128, 4] (two
                 sliding-window-only layers, CSA m=4 with the Lightning indexer, HCA m=128; the real
                 rates, so llama.cpp's hard-coded 4/128 apply), hash-routed MoE on the first 3 layers
                 (tid2eid), sqrt-softplus top-k routing with a selection bias on the rest, 4 mHC
                 streams with 20 Sinkhorn iterations, YaRN x16 (orig 65536) on the compress rope only,
                 routed scale 1.5, SwiGLU limit 10. Sliding window 32, index_topk 16 (= 64 tokens),
                 prompts of 300/100/11 tokens: `long` spans 2 HCA windows, 75 CSA entries of which 16
                 are kept, 9x the window; `generate` from `mid` (100) crosses the first HCA window end.
    flash_lcpp   flash_mini at head sizes llama.cpp 0c1e570's runtime takes: index_head_dim 64 (its
                 indexer's Hadamard rotation is at least 64x64: 32 aborts in a reshape,
                 models/deepseek4.cpp:1066 via llama-impl.h:68) and head_dim 128 (not the indexer's
                 64: llama.cpp rotates every cache whose head size equals the indexer's,
                 llama-kv-cache.cpp:327; the release has 512 vs 128). Release storage only.
    pro_mini     HF's default layer schedule (its docstring's V4-Pro pattern: HCA, HCA, then CSA/HCA
                 alternating = [HCA, HCA, HCA, CSA, HCA, CSA]): no sliding-only layer, hash MoE on HCA
                 layers; 8 heads in 4 output groups, 6 of 16 experts, window 16, index_topk 8;
                 config.json as HF writes it.
    knobs        other values HF accepts: scoring_func sigmoid, hc_mult 2 with 3 Sinkhorn
                 iterations and hc_eps 1e-4, compress rates CSA 8 / HCA 32, plain (non-YaRN) compress
                 rope, partial rotary 0.25, o_groups 1, routed scale 2.5, norm_topk_prob false (HF
                 ignores it and always renormalises), SwiGLU limit 1.5 so the clamps are active
                 (fractions in meta.json), rms_norm_eps 1e-5, window 8, index_topk 4, layer order
                 [CSA, SWA, HCA, CSA].

Ties: the indexer keeps the top min(index_topk, n_entries) compressed entries by
sum_h w_h relu(q_h . k)/... and torch.topk's order among equal values is unspecified; the router
picks top-k of score + bias. Only ties AT the cutoff change a choice, so every fixture is checked to
have a margin (k-th minus (k+1)-th) of at least INDEXER_MIN_GAP at every query that drops entries
and ROUTER_MIN_GAP at every token, and a greedy top-1/top-2 logit gap of GREEDY_MIN_GAP (the weight
seed is bumped until all hold, recorded in meta.json). The hash layers make no choice (table).
"""

import copy
import json
import math
import os
import shutil
import sys
import time

import numpy as np
import torch
import transformers
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM, GenerationConfig
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as md

torch.set_num_threads(1)

VELA_CACHE = os.environ.get("VELA_CACHE", os.path.expanduser("~/.cache/vela"))
OUT = os.path.join(VELA_CACHE, "golden", "deepseekv4")
LLAMA_CPP = os.path.join(VELA_CACHE, "llama-cpp-python", "vendor", "llama.cpp")

VOCAB = 512
BOS, EOS = 0, 1  # the real config's ids
N_GEN = 64
LENS = {"long": 300, "mid": 100, "short": 11}
SPLIT = 150  # not a multiple of 4, 8, 32 or 128
CHUNKS = [150, 3, 1, 146]  # cached chunks: 2 CSA tokens buffered, then 3 (completes a window), 1, rest
INDEXER_MIN_GAP = 1e-4
ROUTER_MIN_GAP = 1e-5
GREEDY_MIN_GAP = 1e-4

SWA, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
YARN16 = {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536, "beta_fast": 32, "beta_slow": 1}

COMMON = dict(
    vocab_size=VOCAB, hidden_size=64, num_key_value_heads=1, bos_token_id=BOS, eos_token_id=EOS,
    tie_word_embeddings=False, max_position_embeddings=1048576, hidden_act="silu", rms_norm_eps=1e-6,
    n_shared_experts=1, num_nextn_predict_layers=1,
)

FIXTURES = {
    # the real config's keys (legacy names HF folds in at __post_init__, configuration_deepseek_v4.py 239-291)
    "flash_mini": {**COMMON,
                   "num_hidden_layers": 5, "compress_ratios": [0, 0, 4, 128, 4, 0], "num_hash_layers": 3,
                   "num_attention_heads": 4, "head_dim": 64, "qk_rope_head_dim": 16, "q_lora_rank": 32,
                   "o_groups": 2, "o_lora_rank": 16, "sliding_window": 32,
                   "index_n_heads": 16, "index_head_dim": 32, "index_topk": 16,
                   "n_routed_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 32,
                   "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc", "norm_topk_prob": True,
                   "routed_scaling_factor": 1.5, "swiglu_limit": 10.0,
                   "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
                   "rope_theta": 10000, "compress_rope_theta": 160000, "rope_scaling": dict(YARN16),
                   "_upstream_config": True},
    # HF's default schedules (layer_types / mlp_layer_types unset)
    "pro_mini": {**COMMON,
                 "num_hidden_layers": 6, "num_attention_heads": 8, "head_dim": 32, "partial_rotary_factor": 0.5,
                 "q_lora_rank": 48, "o_groups": 4, "o_lora_rank": 8, "sliding_window": 16,
                 "index_n_heads": 8, "index_head_dim": 32, "index_topk": 8,
                 "n_routed_experts": 16, "num_experts_per_tok": 6, "moe_intermediate_size": 24,
                 "routed_scaling_factor": 1.5, "swiglu_limit": 10.0,
                 "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
                 "rope_theta": 10000, "compress_rope_theta": 160000,
                 "rope_parameters": {"rope_type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                                     "beta_fast": 32, "beta_slow": 1}},
    "knobs": {**COMMON,
              "num_hidden_layers": 4, "layer_types": [CSA, SWA, HCA, CSA],
              "mlp_layer_types": ["hash_moe", "moe", "moe", "moe"],
              "compress_rates": {CSA: 8, HCA: 32},
              "num_attention_heads": 2, "head_dim": 32, "partial_rotary_factor": 0.25, "q_lora_rank": 16,
              "o_groups": 1, "o_lora_rank": 24, "sliding_window": 8,
              "index_n_heads": 16, "index_head_dim": 16, "index_topk": 4,
              "n_routed_experts": 8, "num_experts_per_tok": 3, "moe_intermediate_size": 32,
              "scoring_func": "sigmoid", "norm_topk_prob": False, "routed_scaling_factor": 2.5, "swiglu_limit": 1.5,
              "hc_mult": 2, "hc_sinkhorn_iters": 3, "hc_eps": 1e-4, "rms_norm_eps": 1e-5,
              "rope_theta": 5000, "compress_rope_theta": 40000},
}
# Geometries made only in the release's storage (no f32 twin): `flash_lcpp` is flash_mini with the
# head sizes llama.cpp 0c1e570's runtime needs (see the docstring).
RELEASE_ONLY = {
    "flash_lcpp": {**FIXTURES["flash_mini"], "head_dim": 128, "index_head_dim": 64},
}
# fixture whose weights are stored in the release's FP8 / MXFP4 format -> that copy's directory
RELEASE_DIR = {"flash_mini": "flash_mini_fp8", "flash_lcpp": "flash_lcpp"}
FP8_FROM = "flash_mini"  # the base of flash_mini_fp8 (and of scripts/gen-deepseekv4-mtp.py)
FP8_SEED = 4321  # the MTP block's and the hash layers' unused gate.bias random values


# --------------------------------------------------------------------------------------------
# prompts


def prompts_for() -> dict:
    rng = np.random.default_rng(7)
    # ids 2..VOCAB-1 (BOS/EOS have no special role in the forward pass; left out anyway)
    return {p: [int(t) for t in rng.integers(2, VOCAB, n)] for p, n in LENS.items()}


# --------------------------------------------------------------------------------------------
# weights


def randomize(model: torch.nn.Module, cfg, gen: torch.Generator) -> None:
    """Random weights keeping activations O(1); every norm gamma, hc base/scale, sink, position
    bias and router bias non-trivial (HF initialises them to 1/0/0/0/0), a random distinct-expert
    tid2eid table for the hash layers."""
    def rn(shape):
        return torch.randn(shape, generator=gen)

    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if name.endswith("norm.weight"):  # weighted RMSNorms (no 1+w): plain gamma
                p.copy_(1.0 + 0.2 * rn(p.shape))
            elif leaf == "sinks":
                p.copy_(rn(p.shape))
            elif leaf == "position_bias":
                p.copy_(0.5 * rn(p.shape))
            elif leaf in ("fn", "hc_fn"):  # input is an RMS-normalised [hc*H] row
                p.copy_(rn(p.shape) / p.shape[-1] ** 0.5)
            elif leaf in ("base", "hc_base"):
                p.copy_(0.5 * rn(p.shape))
            elif leaf in ("scale", "hc_scale"):
                p.copy_(torch.empty(p.shape).uniform_(0.5, 1.5, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(rn(p.shape))
            elif name.endswith(("indexer.q_b_proj.weight", "scorer.weights_proj.weight", "mlp.gate.weight")):
                # wider indexer scores / router logits (selection only): clearer top-k margins
                p.copy_(2.0 * rn(p.shape) / p.shape[-1] ** 0.5)
            elif p.dim() in (2, 3):  # Linear [out, in]; experts [E, out, in]; grouped o_a [G*r, in/G]
                p.copy_(rn(p.shape) / p.shape[-1] ** 0.5)
            else:
                raise SystemExit(f"randomize: unhandled parameter {name} {tuple(p.shape)}")
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.3 * rn(b.shape))
            elif name.endswith("tid2eid"):
                v, k = b.shape
                b.copy_(torch.stack([torch.randperm(cfg.n_routed_experts, generator=gen)[:k] for _ in range(v)]))


# --------------------------------------------------------------------------------------------
# indexer / router probes


class Probe:
    """Forward hooks on every Lightning indexer (and its scorer) and top-k router. The indexer hook
    takes HF's own output (the top-k entry indices, -1 = invalid) as the choice and the scorer's
    output as the scores, and records the cutoff margin among the visible entries."""

    def __init__(self, model):
        self.on = True
        self.rows: list[dict] = []
        self.router_gap = math.inf
        self.mask_none = 0
        self._scores = None
        self.hooks = []
        for m in model.modules():
            if isinstance(m, md.DeepseekV4IndexerScorer):
                self.hooks.append(m.register_forward_hook(self._scorer_hook))
            elif isinstance(m, md.DeepseekV4Indexer):
                self.hooks.append(m.register_forward_hook(self._indexer_hook))
            elif isinstance(m, md.DeepseekV4TopKRouter):
                self.hooks.append(m.register_forward_hook(self._router_hook))
            elif isinstance(m, md.DeepseekV4Attention):
                self.hooks.append(m.register_forward_pre_hook(self._attn_hook, with_kwargs=True))

    def reset(self):
        self.rows = []
        self.router_gap = math.inf

    def _attn_hook(self, mod, args, kwargs):
        # a None mask would make HF drop the compressor's block_bias (modeling 851-855)
        if not isinstance(kwargs.get("attention_mask"), torch.Tensor):
            self.mask_none += 1

    def _router_hook(self, mod, _inp, out):
        if not self.on:
            return
        logits = out[0]
        sel = (mod.score_fn(logits) + mod.e_score_correction_bias).double()
        top = sel.topk(mod.top_k + 1, dim=-1).values
        self.router_gap = min(self.router_gap, float((top[:, mod.top_k - 1] - top[:, mod.top_k]).min()))

    def _scorer_hook(self, mod, args, out):
        self._scores = out.detach()

    @torch.no_grad()
    def _indexer_hook(self, mod, args, out):
        if not self.on:
            return
        hidden, _q_res, position_ids, _pkv, layer_idx = args
        scores = self._scores
        assert hidden.shape[0] == 1 and scores is not None
        m, K = mod.compress_rate, mod.index_topk
        n_entries = scores.shape[-1]
        k = min(K, n_entries)
        for qi in range(hidden.shape[1]):
            pos = int(position_ids[0, qi])
            nv = min((pos + 1) // m, n_entries)
            picked = sorted(int(i) for i in out[0, qi].tolist() if i >= 0)
            sc = scores[0, qi, :nv]
            row = {"layer": layer_idx, "pos": pos, "n_visible": nv, "selected": picked,
                   "scores": [float(x) for x in sc]}
            if nv > k:
                order = torch.sort(sc.double(), descending=True, stable=True)
                gap = float(order.values[k - 1] - order.values[k])
                expect = sorted(order.indices[:k].tolist())
                if gap > 0:
                    assert expect == picked, f"layer {layer_idx} pos {pos}: HF picked {picked}, scores say {expect}"
                row["cutoff_gap"] = gap
            else:
                assert picked == list(range(nv)), f"layer {layer_idx} pos {pos}: {picked} != all {nv} visible"
                row["cutoff_gap"] = None
            self.rows.append(row)

    def min_gap(self, rows=None):
        gaps = [r["cutoff_gap"] for r in (self.rows if rows is None else rows) if r["cutoff_gap"] is not None]
        return min(gaps) if gaps else None


def min_gap(rows):
    gaps = [r["cutoff_gap"] for r in rows if r["cutoff_gap"] is not None]
    return min(gaps) if gaps else None


def indexer_json(rows: list[dict], cfg) -> dict:
    layers = {}
    for r in rows:
        layers.setdefault(str(r["layer"]), []).append({k: v for k, v in r.items() if k != "layer"})
    m = cfg.compress_rates[CSA]
    return {
        "compress_rate": m,
        "index_topk": cfg.index_topk,
        "note": "per CSA layer, per query position `pos`: n_visible = (pos+1)//compress_rate compressed entries "
                "(entry w covers tokens w*m .. w*m+m-1, overlapping the previous window through its Ca half); "
                "scores[w] = sum_h (weights_proj(x)_h * index_n_heads^-0.5) * relu(q_h . K_w) * "
                "index_head_dim^-0.5 for the visible entries, f32 as HF computes it; selected = the sorted entries "
                "the query attends to (HF's top-k with the invalid -1 picks dropped); cutoff_gap = k-th minus "
                "(k+1)-th largest visible score, k = min(index_topk, entries in the cache), null when every "
                "visible entry is kept. Every gap here is >= min_cutoff_gap.",
        "min_cutoff_gap": min_gap(rows),
        "layers": layers,
    }


class ClampStats:
    """How often the clamped SwiGLU clamps (gate > limit, |up| > limit), routed and shared."""

    def __init__(self, model):
        self.n = {"routed_gate": 0, "routed_up": 0, "routed": 0, "shared_gate": 0, "shared_up": 0, "shared": 0}
        self.on = False
        self.hooks = []
        for m in model.modules():
            if isinstance(m, md.DeepseekV4Experts):
                orig = m._apply_gate

                def wrapped(gate_up, _orig=orig, _lim=m.limit):
                    if self.on:
                        g, u = gate_up.chunk(2, dim=-1)
                        self.n["routed_gate"] += int((g > _lim).sum())
                        self.n["routed_up"] += int((u.abs() > _lim).sum())
                        self.n["routed"] += g.numel()
                    return _orig(gate_up)

                m._apply_gate = wrapped
            elif isinstance(m, md.DeepseekV4MLP):
                self.hooks.append(m.register_forward_pre_hook(self._shared))

    def _shared(self, mod, args):
        if self.on:
            x = args[0]
            g, u = mod.gate_proj(x), mod.up_proj(x)
            self.n["shared_gate"] += int((g > mod.limit).sum())
            self.n["shared_up"] += int((u.abs() > mod.limit).sum())
            self.n["shared"] += g.numel()

    def fractions(self):
        return {k: self.n[k] / max(1, self.n[k.split("_")[0]]) for k in ("routed_gate", "routed_up", "shared_gate",
                                                                           "shared_up")}


# --------------------------------------------------------------------------------------------


def write_f32(path: str, t: torch.Tensor) -> list[int]:
    a = t.detach().to(torch.float32).contiguous().numpy().astype("<f4")
    a.tofile(path)
    return list(a.shape)


def synthetic_tokenizer(d: str, n: int) -> None:
    vocab = {f"<t{i}>": i for i in range(n)}
    special = [{"id": i, "content": f"<t{i}>", "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True} for i in (BOS, EOS)]
    tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": special,
          "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
          "decoder": None,
          "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                    "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                    "ignore_merges": False, "vocab": vocab, "merges": []}}
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(tj, f)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": f"<t{BOS}>", "eos_token": f"<t{EOS}>",
                   "model_max_length": 1048576, "comment": "synthetic: token <tN> is id N; tests feed ids"}, f,
                  indent=1)


def config_kwargs(kw: dict) -> dict:
    # a deep copy: DeepseekV4Config edits nested dicts it is given (rope_scaling gains rope_type/rope_theta)
    return copy.deepcopy({k: v for k, v in kw.items() if not k.startswith("_")})


def make_model(kw: dict, seed: int):
    torch.manual_seed(0)
    cfg = DeepseekV4Config(**config_kwargs(kw))
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    model = DeepseekV4ForCausalLM(cfg).eval().float()
    randomize(model, cfg, torch.Generator().manual_seed(seed))
    return cfg, model


def logits_nocache(model, ids):
    return model(torch.tensor([ids]), use_cache=False).logits[0]


def cached_chunks(model, ids, chunks):
    """Logits of positions chunks[0].. from feeding `ids` as consecutive cached forwards."""
    pkv, outs, at = None, [], 0
    for n in chunks:
        o = model(torch.tensor([ids[at:at + n]]), past_key_values=pkv, use_cache=True)
        pkv = o.past_key_values
        if at >= chunks[0]:
            outs.append(o.logits[0])
        at += n
    assert at == len(ids)
    return torch.cat(outs)


def capture_long(model, cfg, ids):
    """Residual streams after the embedding, after each attention half and after each layer, the
    hc_head output and the compressors' entries, for one no-cache forward."""
    taps, mids, entries, hooks = [], [], {}, []
    for i, layer in enumerate(model.model.layers):
        hooks.append(layer.register_forward_hook(lambda m, a, o: taps.append(o.detach().clone())))
        hooks.append(layer.ffn_hc.register_forward_pre_hook(lambda m, a: mids.append(a[0].detach().clone())))
        comp = layer.self_attn.compressor
        if comp is not None:
            hooks.append(comp.register_forward_hook(
                lambda m, a, o, i=i: entries.__setitem__(("entries", i), o[0][0, 0].detach().clone())))
            if isinstance(comp, md.DeepseekV4CSACompressor):
                hooks.append(comp.indexer.scorer.register_forward_hook(
                    lambda m, a, o, i=i: entries.__setitem__(("index_keys", i), a[1][0].detach().clone())))
    head = []
    hooks.append(model.model.hc_head.register_forward_hook(lambda m, a, o: head.append(o[0].detach().clone())))
    with torch.no_grad():
        emb = model.model.embed_tokens(torch.tensor([ids]))[0]
        lg = logits_nocache(model, ids)
    for h in hooks:
        h.remove()
    streams = torch.stack([emb.unsqueeze(1).expand(-1, cfg.hc_mult, -1)] + [t[0] for t in taps])
    return lg, streams, torch.stack([t[0] for t in mids]), head[0], entries


def candidate(name: str, kw: dict, prompts: dict, seed: int):
    """All oracle outputs for one weight seed, or (None, why) when a margin is too small."""
    cfg, model = make_model(kw, seed)
    probe = Probe(model)
    r = {"seed": seed, "cfg": cfg, "model": model, "logits": {}, "indexer": {}, "router_gap": math.inf}
    # 1. no-cache forward of every prompt; router and indexer cutoffs need a margin
    for p, ids in prompts.items():
        probe.reset()
        with torch.no_grad():
            r["logits"][p] = logits_nocache(model, ids)
        r["indexer"][p] = probe.rows
        r["router_gap"] = min(r["router_gap"], probe.router_gap)
        g = probe.min_gap()
        if probe.router_gap < ROUTER_MIN_GAP or (g is not None and g < INDEXER_MIN_GAP):
            return None, f"prompt {p}: router gap {probe.router_gap:.1e}, indexer gap {g}"

    # streams etc. of the long prompt (hooks only; the same forward again)
    probe.on = False
    clamp = ClampStats(model)
    clamp.on = True
    again, r["streams"], r["streams_mid"], r["head"], r["entries"] = capture_long(model, cfg, prompts["long"])
    clamp.on = False
    r["clamp"] = clamp.fractions()
    assert torch.equal(again, r["logits"]["long"])
    probe.on = True

    # 2. generate (greedy, cache on, EOS ignored) from `mid`
    gprompt = prompts["mid"]
    probe.reset()
    gcfg = GenerationConfig(max_new_tokens=N_GEN, do_sample=False, eos_token_id=None, pad_token_id=EOS,
                            bos_token_id=None, use_cache=True, output_logits=True, return_dict_in_generate=True)
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(torch.tensor([gprompt]), generation_config=gcfg)
    gen = out.sequences[0, len(gprompt):].tolist()
    assert len(gen) == N_GEN
    r["gen"] = gen
    r["gen_logits"] = torch.stack([x[0] for x in out.logits])  # [N_GEN, V]
    r["gen_indexer"] = [q for q in probe.rows if q["pos"] >= len(gprompt)]
    r["gen_router_gap"] = probe.router_gap
    r["gen_indexer_gap"] = min_gap(r["gen_indexer"])
    top2 = r["gen_logits"].topk(2, dim=-1).values
    r["greedy_gap"] = float((top2[:, 0] - top2[:, 1]).min())
    if r["gen_router_gap"] < ROUTER_MIN_GAP or (r["gen_indexer_gap"] is not None
                                                 and r["gen_indexer_gap"] < INDEXER_MIN_GAP):
        return None, f"generate: router gap {r['gen_router_gap']:.1e}, indexer gap {r['gen_indexer_gap']}"
    if r["greedy_gap"] < GREEDY_MIN_GAP:
        return None, f"generate: greedy top-2 logit gap {r['greedy_gap']:.1e}"
    # the prefill's selections equal the no-cache forward's
    pre = {(q["layer"], q["pos"]): q["selected"] for q in probe.rows if q["pos"] < len(gprompt)}
    assert pre == {(q["layer"], q["pos"]): q["selected"] for q in r["indexer"]["mid"]}
    # teacher forcing without a cache: same argmax? how far are the decode logits?
    probe.reset()
    with torch.no_grad():
        tf = logits_nocache(model, gprompt + gen[:-1])[len(gprompt) - 1:]
    tf_sel = {(q["layer"], q["pos"]): q["selected"] for q in probe.rows if q["pos"] >= len(gprompt)}
    r["tf_same_selection"] = tf_sel == {(q["layer"], q["pos"]): q["selected"] for q in r["gen_indexer"]}
    r["tf_same"] = tf.argmax(-1).tolist() == gen
    r["tf_dev"] = float((tf - r["gen_logits"]).abs().max())

    # 3. chunked prefill through one cache: long[:SPLIT] + long[SPLIT:], and CHUNKS
    one_sel = {(q["layer"], q["pos"]): q["selected"] for q in r["indexer"]["long"] if q["pos"] >= SPLIT}
    for key, chunks in (("split", [SPLIT, len(prompts["long"]) - SPLIT]), ("chunks", CHUNKS)):
        probe.reset()
        with torch.no_grad():
            lg = cached_chunks(model, prompts["long"], chunks)
        sel = {(q["layer"], q["pos"]): q["selected"] for q in probe.rows if q["pos"] >= SPLIT}
        assert sel == one_sel, f"{key}: cached prefill selected other entries than the one-shot forward"
        r[key + "_logits"] = lg
        r[key + "_dev"] = float((lg - r["logits"]["long"][chunks[0]:]).abs().max())

    # 4. conditioning: the same weights in float64 (NB HF still computes in float32 there: the
    # RMSNorms, the mHC/hc_head weights, the compressor softmax, the indexer scores, the RoPE
    # tables and the rotation itself; explicit casts, spec §11)
    probe.on = False
    dbl = DeepseekV4ForCausalLM(cfg).eval()
    dbl.load_state_dict(model.state_dict())
    dbl = dbl.double()
    with torch.no_grad():
        ref = logits_nocache(dbl, prompts["long"]).double()
    lg = r["logits"]["long"].double()
    r["nmse"] = float((((lg - ref) ** 2).sum(-1) / (ref ** 2).sum(-1)).max())
    r["f64_dev"] = float((lg - ref).abs().max())
    r["mask_none"] = probe.mask_none
    for h in probe.hooks:
        h.remove()
    if r["nmse"] > 1e-9:
        return None, f"ill-conditioned: f32 vs f64 worst-position NMSE {r['nmse']:.1e}"

    # 5. the release-format copy must keep the margins too
    if name in RELEASE_DIR:
        q = DeepseekV4ForCausalLM(cfg).eval()
        q.load_state_dict(model.state_dict())
        _, ref, _, _ = release_layout(q, cfg, torch.Generator().manual_seed(FP8_SEED))
        q.load_state_dict(ref)
        qprobe = Probe(q)
        for p, ids in prompts.items():
            qprobe.reset()
            with torch.no_grad():
                logits_nocache(q, ids)
            g = qprobe.min_gap()
            if qprobe.router_gap < ROUTER_MIN_GAP or (g is not None and g < INDEXER_MIN_GAP):
                return None, f"FP8/MXFP4 copy, prompt {p}: router gap {qprobe.router_gap:.1e}, indexer gap {g}"
    return r, None


def upstream_config_json(kw: dict, cfg, torch_dtype: str) -> dict:
    """config.json in the released checkpoint's style (its keys, legacy names)."""
    keep = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
            "q_lora_rank", "qk_rope_head_dim", "o_groups", "o_lora_rank", "sliding_window", "compress_ratios",
            "compress_rope_theta", "rope_theta", "rope_scaling", "num_hash_layers", "n_routed_experts",
            "n_shared_experts", "num_experts_per_tok", "moe_intermediate_size", "scoring_func", "topk_method",
            "norm_topk_prob", "routed_scaling_factor", "swiglu_limit", "hc_mult", "hc_sinkhorn_iters", "hc_eps",
            "index_n_heads", "index_head_dim", "index_topk", "num_nextn_predict_layers", "rms_norm_eps",
            "hidden_act", "max_position_embeddings", "bos_token_id", "eos_token_id", "tie_word_embeddings")
    cj = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4"}
    cj.update(copy.deepcopy({k: kw[k] for k in keep}))
    cj.update(attention_bias=False, attention_dropout=0.0, initializer_range=0.02, use_cache=True,
              torch_dtype=torch_dtype, transformers_version="4.57.1")
    return cj


def release_config_json(kw: dict, cfg) -> dict:
    """config.json of the release's storage: its keys, quantization_config and expert_dtype."""
    cj = upstream_config_json(kw, cfg, "bfloat16")
    cj["expert_dtype"] = "fp4"
    cj["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                 "scale_fmt": "ue8m0", "weight_block_size": [FP8_BLOCK, FP8_BLOCK]}
    return cj


def effective_config(cfg) -> dict:
    keys = ("layer_types", "mlp_layer_types", "compress_rates", "rope_parameters", "partial_rotary_factor",
            "qk_rope_head_dim", "scoring_func", "norm_topk_prob", "routed_scaling_factor", "swiglu_limit", "hc_mult",
            "hc_sinkhorn_iters", "hc_eps", "sliding_window", "index_topk", "rms_norm_eps")
    return {k: getattr(cfg, k) for k in keys}


def find_seed(name: str, kw: dict, prompts: dict) -> dict:
    """The first weight seed from 1234 whose oracle outputs keep every margin (candidate)."""
    for seed in range(1234, 1234 + 40):
        r, why = candidate(name, kw, prompts, seed)
        if r is not None:
            return r
        print(f"  {name}: seed {seed} rejected: {why}")
    sys.exit(f"{name}: no seed with clear margins")


def build(name: str, kw: dict) -> dict:
    t0 = time.time()
    d = os.path.join(OUT, name)
    prompts = prompts_for()
    files = {}
    r = find_seed(name, kw, prompts)
    cfg, model, logits, idx = r["cfg"], r["model"], r["logits"], r["indexer"]

    # 5. write the checkpoint, reload it, check it reproduces the logits
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    model.save_pretrained(d, safe_serialization=True)
    cpath = os.path.join(d, "config.json")
    if kw.get("_upstream_config"):
        json.dump(upstream_config_json(kw, cfg, "float32"), open(cpath, "w"), indent=2)
    cj = json.load(open(cpath))
    synthetic_tokenizer(d, cfg.vocab_size)
    reloaded = DeepseekV4ForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager",
                                                     experts_implementation="eager").eval()
    assert effective_config(reloaded.config) == effective_config(cfg), "config.json does not round-trip"
    with torch.no_grad():
        reload_dev = max(float((logits_nocache(reloaded, ids) - logits[p]).abs().max()) for p, ids in prompts.items())
    assert reload_dev == 0.0, f"{name}: reloaded checkpoint differs by {reload_dev}"
    del reloaded

    for p in prompts:
        files[f"logits_{p}.f32"] = {"dtype": "f32", "shape": write_f32(os.path.join(d, f"logits_{p}.f32"), logits[p]),
                                    "what": f"no-cache forward of prompts[{p!r}], every position"}
        with open(os.path.join(d, f"indexer_{p}.json"), "w") as f:
            json.dump(indexer_json(idx[p], cfg), f)
        files[f"indexer_{p}.json"] = {"what": f"Lightning-indexer selections for prompts[{p!r}]"}
    files["streams_long.f32"] = {
        "dtype": "f32", "shape": write_f32(os.path.join(d, "streams_long.f32"), r["streams"]),
        "what": "prompts['long']: [0] = embedding copied into hc_mult streams, [i+1] = the streams after decoder "
                "layer i; layout [layer, token, stream, hidden]"}
    files["streams_mid_long.f32"] = {
        "dtype": "f32", "shape": write_f32(os.path.join(d, "streams_mid_long.f32"), r["streams_mid"]),
        "what": "prompts['long']: [i] = the streams of layer i after its attention half (input of ffn_hc)"}
    files["head_long.f32"] = {
        "dtype": "f32", "shape": write_f32(os.path.join(d, "head_long.f32"), r["head"]),
        "what": "prompts['long']: hc_head output (the collapsed stream before model.norm and lm_head)"}
    ent = {}
    for (kind, i), t in sorted(r["entries"].items(), key=lambda x: (x[0][1], x[0][0])):
        fn = f"{kind}_L{i}.f32"
        shape = write_f32(os.path.join(d, fn), t)
        ent.setdefault(str(i), {})[kind] = {"file": fn, "shape": shape}
        files[fn] = {"dtype": "f32", "shape": shape}
    with open(os.path.join(d, "entries_long.json"), "w") as f:
        json.dump({"note": "entries = the layer compressor's compressed KV entries for prompts['long'] after kv_norm "
                           "and RoPE at position w*compress_rate (row w); index_keys = the CSA indexer's compressed "
                           "keys, same convention. Only complete windows exist in a no-cache forward.",
                   "layers": ent}, f, indent=1)
    files["entries_long.json"] = {"what": "index of the entries_L*/index_keys_L* blobs"}
    files[f"logits_long_split{SPLIT}.f32"] = {
        "dtype": "f32", "shape": write_f32(os.path.join(d, f"logits_long_split{SPLIT}.f32"), r["split_logits"]),
        "what": f"positions {SPLIT}.. of prompts['long'] from forward(long[:{SPLIT}]) then forward(long[{SPLIT}:]) "
                "with one DynamicCache"}
    files["logits_long_chunks.f32"] = {
        "dtype": "f32", "shape": write_f32(os.path.join(d, "logits_long_chunks.f32"), r["chunks_logits"]),
        "what": f"positions {CHUNKS[0]}.. of prompts['long'] fed as cached chunks of {CHUNKS} tokens"}
    files["logits_gen.f32"] = {"dtype": "f32", "shape": write_f32(os.path.join(d, "logits_gen.f32"), r["gen_logits"]),
                               "what": "generate's logits per step: row 0 = prefill of prompts['mid'] (last "
                                       "position), row i = decode step feeding generated token i-1"}
    with open(os.path.join(d, "indexer_gen.json"), "w") as f:
        json.dump(indexer_json(r["gen_indexer"], cfg), f)
    files["indexer_gen.json"] = {"what": "indexer selections of the decode steps of generate (one query each)"}
    with open(os.path.join(d, "prompts.json"), "w") as f:
        json.dump({"prompts": prompts,
                   "generate": {"prompt": "mid", "max_new_tokens": N_GEN, "greedy": True, "eos_ignored": True,
                                "tokens": r["gen"]},
                   "split": SPLIT, "chunks": CHUNKS}, f)
    files["prompts.json"] = {"what": "token ids of the prompts and of the greedy continuation"}

    meta = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "model_class": "DeepseekV4ForCausalLM",
        "attn_implementation": "eager",
        "experts_implementation": "eager",
        "weight_seed": r["seed"],
        "config_kwargs": config_kwargs(kw),
        "config_json_style": "upstream (release keys)" if kw.get("_upstream_config") else "as save_pretrained wrote it",
        "hf_effective_config": effective_config(cfg),
        "files": files,
        "margins": {
            "indexer_min_cutoff_gap_prompts": min([g for g in (min_gap(idx[p]) for p in prompts) if g is not None],
                                                  default=None),
            "router_min_topk_gap_prompts": r["router_gap"],
            "indexer_min_cutoff_gap_generate": r["gen_indexer_gap"],
            "router_min_topk_gap_generate": r["gen_router_gap"],
            "greedy_min_top1_top2_logit_gap": r["greedy_gap"],
            "indexer_queries_dropping_entries_long": sum(1 for q in idx["long"] if q["cutoff_gap"] is not None),
            "indexer_zero_scores_long": sum(sum(1 for s in q["scores"] if s == 0.0) for q in idx["long"]),
        },
        "swiglu_clamp_fraction_long": r["clamp"],
        "deviations": {
            "reload_max_abs": reload_dev,
            f"split{SPLIT}_prefill_vs_one_shot_max_abs": r["split_dev"],
            "chunks_prefill_vs_one_shot_max_abs": r["chunks_dev"],
            "generate_vs_nocache_teacher_forced_max_abs": r["tf_dev"],
            "generate_equals_nocache_argmax": r["tf_same"],
            "generate_selections_equal_nocache": r["tf_same_selection"],
            "f64_vs_f32_long_max_abs": r["f64_dev"],
            "f64_vs_f32_long_worst_position_nmse": r["nmse"],
        },
        "attention_calls_without_tensor_mask": r["mask_none"],
    }
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1, default=str)
    size = sum(os.path.getsize(os.path.join(rt, x)) for rt, _, fs in os.walk(d) for x in fs)
    g = meta["margins"]["indexer_min_cutoff_gap_prompts"]
    print(f"{name}: seed {r['seed']}, indexer gap {g:.2e}, router gap {r['router_gap']:.1e}, "
          f"greedy gap {r['greedy_gap']:.2e}, split dev {r['split_dev']:.1e}, chunks dev {r['chunks_dev']:.1e}, "
          f"gen dev {r['tf_dev']:.1e}, f64 nmse {r['nmse']:.1e}, {size / 1e6:.1f} MB, {time.time() - t0:.0f} s")
    return r


# The release's storage format (FP8 / MXFP4 / BF16): scripts/deepseekv4_release.py.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deepseekv4_release import (  # noqa: E402
    E8M0, FP4_BLOCK, FP4_VALUES, FP8_BLOCK, FP8_HF, Release, quant_fp4, quant_fp8, release_layout)


def allow_fp8_load_without_accelerate() -> bool:
    """HF's FP8 quantizer refuses to start without `accelerate` installed
    (quantizer_finegrained_fp8.py 32-33) although its CPU dequantize path uses nothing of it; our
    venv has no accelerate. Lift only that availability check. Returns whether it was lifted."""
    try:
        import accelerate  # noqa: F401
        return False
    except ImportError:
        from transformers.quantizers import quantizer_finegrained_fp8 as qf
        qf.is_accelerate_available = lambda: True
        return True


def f32_copy(base: dict):
    """A fresh f32 model with the base fixture's weights (the saved checkpoint reloads to these
    exactly: build() checks it)."""
    model = DeepseekV4ForCausalLM(base["cfg"]).eval()
    model.load_state_dict(base["model"].state_dict())
    return model


def build_fp8(base_name: str, kw: dict, base: dict) -> None:
    t0 = time.time()
    name = RELEASE_DIR[base_name]
    d = os.path.join(OUT, name)
    prompts = prompts_for()
    cfg = base["cfg"]
    model = f32_copy(base)
    sd, ref, kinds, mtp_names = release_layout(model, cfg, torch.Generator().manual_seed(FP8_SEED))

    # the spec's dequantized weights in the f32 model: the reference
    missing = set(model.state_dict()) - set(ref)
    assert not missing, f"release layout misses {sorted(missing)}"
    model.load_state_dict(ref, strict=True)
    probe = Probe(model)
    want = {}
    for p, ids in prompts.items():
        probe.reset()
        with torch.no_grad():
            want[p] = logits_nocache(model, ids)
        g = probe.min_gap()
        assert probe.router_gap >= ROUTER_MIN_GAP and (g is None or g >= INDEXER_MIN_GAP), \
            f"{name}: quantized weights lost a margin (router {probe.router_gap:.1e}, indexer {g})"

    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in sd.items()}, os.path.join(d, "model.safetensors"),
              metadata={"format": "pt"})
    json.dump(release_config_json(kw, cfg), open(os.path.join(d, "config.json"), "w"), indent=2)
    synthetic_tokenizer(d, cfg.vocab_size)

    lifted = allow_fp8_load_without_accelerate()
    # HF's own way: dtype "auto" (the config's bfloat16), FP8/FP4 dequantized on load
    hf = DeepseekV4ForCausalLM.from_pretrained(d, attn_implementation="eager", experts_implementation="eager").eval()
    dtypes = sorted({str(p.dtype) for p in hf.state_dict().values()})
    with torch.no_grad():
        bf16_logits = logits_nocache(hf, prompts["long"]).float()
    # dtype=torch.float32 instead fails in forward (BF16-stored tensors stay BF16 next to f32 ones)
    try:
        f32load = DeepseekV4ForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager",
                                                        experts_implementation="eager").eval()
        with torch.no_grad():
            logits_nocache(f32load, prompts["short"])
        f32load_note = "works"
    except Exception as e:  # noqa: BLE001
        f32load_note = f"{type(e).__name__}: {e}"
    hf = hf.float()
    got_sd = hf.state_dict()
    weight_diff = [k for k, v in ref.items() if not torch.equal(got_sd[k].to(v.dtype), v)]
    assert not weight_diff, f"HF dequantized differently: {weight_diff[:5]}"
    files = {}
    # a few of HF's dequantized matrices, for a loader's own FP8 / MXFP4 decoding (release names)
    I = cfg.moe_intermediate_size
    gu, dn = got_sd["model.layers.2.mlp.experts.gate_up_proj"], got_sd["model.layers.2.mlp.experts.down_proj"]
    for up, t in (("layers.2.attn.wq_a", got_sd["model.layers.2.self_attn.q_a_proj.weight"]),
                  ("layers.2.attn.wq_b", got_sd["model.layers.2.self_attn.q_b_proj.weight"]),
                  ("layers.2.ffn.experts.1.w1", gu[1, :I]), ("layers.2.ffn.experts.1.w3", gu[1, I:]),
                  ("layers.2.ffn.experts.1.w2", dn[1])):
        files[f"deq_{up}.f32"] = {"dtype": "f32", "shape": write_f32(os.path.join(d, f"deq_{up}.f32"), t),
                                  "what": f"{up}.weight as HF's loader dequantizes it (FP8 / MXFP4 + e8m0 scale)"}
    probe = Probe(hf)
    rows, router_gap = {}, math.inf
    for p, ids in prompts.items():
        probe.reset()
        with torch.no_grad():
            lg = logits_nocache(hf, ids)
        rows[p] = probe.rows
        router_gap = min(router_gap, probe.router_gap)
        assert torch.equal(lg, want[p]), f"{name}: HF's load differs from the spec's dequantization on {p}"
        files[f"logits_{p}.f32"] = {"dtype": "f32", "shape": write_f32(os.path.join(d, f"logits_{p}.f32"), lg),
                                    "what": f"prompts[{p!r}], no-cache forward of the HF-loaded model cast to f32"}
    with open(os.path.join(d, "indexer_long.json"), "w") as f:
        json.dump(indexer_json(rows["long"], cfg), f)
    files["indexer_long.json"] = {"what": "indexer selections for prompts['long'] (f32 compute)"}
    files["logits_long_bf16.f32"] = {
        "dtype": "f32", "shape": write_f32(os.path.join(d, "logits_long_bf16.f32"), bf16_logits),
        "what": "prompts['long'] with HF's default load (dtype auto = bfloat16 compute); for information only"}
    with open(os.path.join(d, "prompts.json"), "w") as f:
        json.dump({"prompts": prompts}, f)
    files["prompts.json"] = {"what": "token ids of the prompts (the same for every fixture)"}
    n_kinds = {}
    for v in kinds.values():
        n_kinds[v] = n_kinds.get(v, 0) + 1
    meta = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "from_fixture": base_name if base_name in FIXTURES else f"{base_name} (its f32 weights are not kept)",
        "config_json_style": "upstream (release keys) + quantization_config + expert_dtype",
        "storage": {"kinds": kinds, "counts": n_kinds,
                    "fp8": "e4m3fn, scale = 2^ceil(log2(amax/448)) per 128x128 block (grid ceil-sized), stored "
                           "float8_e8m0fnu; w = fp8 * scale",
                    "fp4": "e2m1 {0,.5,1,1.5,2,3,4,6} with sign bit 3, two per byte (column 2j low nibble, 2j+1 "
                           "high), scale = 2^(floor(log2 amax) - 2) per 32 consecutive input columns, stored "
                           "float8_e8m0fnu; w = e2m1 * scale",
                    "mtp_tensors_dropped_by_hf": mtp_names,
                    "hash_layer_gate_bias": "ffn.gate.bias of the hash layers is stored but unused (HF: unexpected "
                                            "key, dropped)"},
        "hf_load": {"accelerate_check_lifted": lifted,
                    "how": "DeepseekV4ForCausalLM.from_pretrained(dir) on CPU: FineGrainedFP8HfQuantizer sets "
                           "dequantize=True without a GPU; FP8 and MXFP4 weights are dequantized at load "
                           "(Fp8Dequantize) into the config's bfloat16; then .float()",
                    "param_dtypes_after_default_load": dtypes,
                    "from_pretrained_dtype_float32": f32load_note,
                    "dequantized_weights_equal_spec": True,
                    "logits_equal_spec_dequantized_f32_model": True},
        "deviations": {"bf16_compute_vs_f32_long_max_abs": float((bf16_logits - want["long"]).abs().max()),
                       "fp8_vs_f32_fixture_long_max_abs": float((want["long"] - base["logits"]["long"]).abs().max())},
        "margins": {"indexer_min_cutoff_gap_prompts": min([g for g in (min_gap(rows[p]) for p in prompts)
                                                           if g is not None], default=None),
                    "router_min_topk_gap_prompts": router_gap},
        "files": files,
    }
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1, default=str)
    size = sum(os.path.getsize(os.path.join(rt, x)) for rt, _, fs in os.walk(d) for x in fs)
    print(f"{name}: {n_kinds}, bf16-compute dev {meta['deviations']['bf16_compute_vs_f32_long_max_abs']:.2e}, "
          f"dtype=float32 load: {f32load_note[:60]}, {size / 1e6:.1f} MB, {time.time() - t0:.0f} s")


def to_gguf(name: str) -> None:
    """llama.cpp's converter on the fixture (in a child process: it imports llama.cpp's gguf-py)
    -> model-llamacpp.gguf; its tensor list and metadata are recorded in meta.json["gguf"]."""
    import subprocess
    d = os.path.join(OUT, name)
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--gguf-child", d],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"llama.cpp's converter failed on {name}:\n{r.stderr[-3000:]}")
    meta_path = os.path.join(d, "meta.json")
    meta = json.load(open(meta_path))
    meta["gguf"] = json.loads(r.stdout.strip().splitlines()[-1])
    meta["files"]["model-llamacpp.gguf"] = {"what": "llama.cpp 0c1e570 convert_hf_to_gguf.py --outtype f32 "
                                                    "(synthetic vocabulary)"}
    json.dump(meta, open(meta_path, "w"), indent=1, default=str)
    print(f"  gguf: {meta['gguf']['tensor_count']} tensors, types {meta['gguf']['types']}")


# llama.cpp's names of the release's FP8 matrices (the ones its converter requantizes to Q8_0).
GGUF_FP8 = {"attn.wq_a": "attn_q_a", "attn.wq_b": "attn_q_b", "attn.wkv": "attn_kv",
            "attn.wo_a": "attn_output_a", "attn.wo_b": "attn_output_b",
            "attn.indexer.wq_b": "indexer.attn_q_b", "ffn.shared_experts.w1": "ffn_gate_shexp",
            "ffn.shared_experts.w2": "ffn_down_shexp", "ffn.shared_experts.w3": "ffn_up_shexp"}


def gguf_reference(name: str, base: dict) -> None:
    """HF's logits of every prompt with the GGUF's own values of the matrices the converter
    requantized (FP8 -> Q8_0), every other weight the release's (the GGUF holds those exactly):
    the oracle of a GGUF loader -> logits_<prompt>_gguf.f32, and that model's indexer choices for
    the long prompt -> indexer_long_gguf.json."""
    import subprocess
    d = os.path.join(OUT, name)
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--gguf-values", d],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"reading the GGUF failed:\n{r.stderr[-3000:]}")
    vals = torch.load(os.path.join(d, ".gguf-values.pt"))
    os.remove(os.path.join(d, ".gguf-values.pt"))
    model = f32_copy(base)
    cfg = base["cfg"]
    _, ref, _, _ = release_layout(model, cfg, torch.Generator().manual_seed(FP8_SEED))
    n = 0
    for up, hf in FP8_HF.items():
        i, rest = up.removeprefix("layers.").split(".", 1)
        g = f"blk.{i}.{GGUF_FP8[rest.removesuffix('.weight')]}.weight"
        assert vals[g].shape == ref[hf].shape, (g, vals[g].shape, ref[hf].shape)
        ref[hf] = vals[g]
        n += 1
    model.load_state_dict(ref, strict=True)
    meta_path = os.path.join(d, "meta.json")
    meta = json.load(open(meta_path))
    probe = Probe(model)
    gaps = {}
    for p, ids in prompts_for().items():
        probe.reset()
        with torch.no_grad():
            out = logits_nocache(model, ids)
        gaps[p] = probe.min_gap()
        write_f32(os.path.join(d, f"logits_{p}_gguf.f32"), out)
        meta["files"][f"logits_{p}_gguf.f32"] = {
            "dtype": "f32", "shape": list(out.shape),
            "what": f"no-cache forward of prompts[{p!r}] with the GGUF's values of the {n} matrices its "
                    "converter requantized to Q8_0 (every other tensor decodes to the release's values)"}
        if p == "long":
            with open(os.path.join(d, "indexer_long_gguf.json"), "w") as f:
                json.dump(indexer_json(probe.rows, cfg), f)
            meta["files"]["indexer_long_gguf.json"] = {"what": "indexer selections and scores of that forward "
                                                               "for prompts['long']"}
            release = torch.tensor(np.fromfile(os.path.join(d, "logits_long.f32"), dtype=np.float32))
            moved = float((out - release.reshape(out.shape)).abs().max())
    meta["margins_gguf_values"] = {"indexer_min_cutoff_gap": gaps}
    json.dump(meta, open(meta_path, "w"), indent=1, default=str)
    print(f"  gguf reference: {n} requantized matrices, max |logit - release logit| {moved:.3e}, "
          f"indexer gaps {gaps}")


def llama_logits(name: str) -> None:
    """llama.cpp 0c1e570's own logits of every prompt, every position, in a child process (the
    library is loaded there; an abort cannot take this one down), scripts/llama_oracle.py's
    settings (2 threads, one 512-token ubatch, no flash attention, a fresh context):
    logits_<prompt>_llamacpp.f32 on model-llamacpp.gguf as converted with llama.cpp's default F16
    caches (what its users get), and logits_<prompt>_llamacpp_exact.f32 on that GGUF with every
    tensor dequantized to F32 (dequantized_gguf) and F32 caches: no weight or activation rounding
    of llama.cpp's own. Each is evaluated twice and must repeat bit for bit."""
    import subprocess
    d = os.path.join(OUT, name)
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--llama-child", d],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"llama.cpp failed on {name} (rc {r.returncode}):\n{r.stderr[-3000:]}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    meta_path = os.path.join(d, "meta.json")
    meta = json.load(open(meta_path))
    for fn, shape in res["files"].items():
        how = ("every tensor dequantized to F32 (GGML's own dequantization), F32 KV / compressed / indexer "
               "caches" if fn.endswith("_exact.f32") else "as converted (Q8_0 / MXFP4 / BF16 / F32), llama.cpp's "
               "default F16 KV / compressed / indexer caches")
        meta["files"][fn] = {"dtype": "f32", "shape": shape,
                             "what": f"llama.cpp's logits of prompts[{fn.split('_')[1]!r}] on model-llamacpp.gguf, "
                                     f"every position, one pass from an empty cache; weights {how}"}
    meta["llamacpp"] = {"commit": res["commit"], "settings": res["settings"],
                        "deterministic": "each file evaluated twice, bit-identical"}
    json.dump(meta, open(meta_path, "w"), indent=1, default=str)
    print(f"  llama.cpp: {len(res['files'])} logit files")


def dequantized_gguf(src: str, dst: str, keep=(), set_fields=None) -> None:
    """A copy of a GGUF with every tensor not of a type in `keep` (GGML type names) dequantized to
    F32 by gguf-py (GGML's own decoding); integer tensors as they are; `set_fields` replaces the
    values of some scalar metadata keys."""
    sys.path[:0] = [os.path.join(LLAMA_CPP, "gguf-py")]
    import gguf
    from gguf.quants import dequantize
    Q = gguf.GGMLQuantizationType
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, arch=r.fields["general.architecture"].contents())
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            w.add_key_value(k, f.contents(), t, sub_type=f.types[1] if len(f.types) > 1 else None)
        else:
            w.add_key_value(k, (set_fields or {}).get(k, f.contents()), t)
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape)]
        if t.tensor_type in (Q.F32, Q.I32):
            w.add_tensor(t.name, np.array(t.data), raw_shape=shape, raw_dtype=t.tensor_type)
        elif t.tensor_type.name in keep:  # the reader's bytes, shaped [..., bytes per row]
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
        else:
            w.add_tensor(t.name, np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llama_child(d: str) -> None:
    import tempfile
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import llama_oracle as lo
    model = os.path.join(d, "model-llamacpp.gguf")
    prompts = json.load(open(os.path.join(d, "prompts.json")))["prompts"]
    files = {}
    with tempfile.TemporaryDirectory() as tmp:
        exact = os.path.join(tmp, "model-f32.gguf")
        dequantized_gguf(model, exact)
        for p, ids in prompts.items():
            for tag, path, kv_f32 in (("", model, False), ("_exact", exact, True)):
                a = lo.eval_logits(path, ids, all_positions=True, kv_f32=kv_f32)
                b = lo.eval_logits(path, ids, all_positions=True, kv_f32=kv_f32)
                assert np.array_equal(a, b), f"llama.cpp is not deterministic on {p}{tag}"
                fn = f"logits_{p}_llamacpp{tag}.f32"
                a.astype("<f4").tofile(os.path.join(d, fn))
                files[fn] = list(a.shape)
    print(json.dumps({"files": files, "commit": lo.LLAMA_CPP_COMMIT, "settings": lo.settings()}))


def gguf_values(d: str) -> None:
    sys.path[:0] = [os.path.join(LLAMA_CPP, "gguf-py")]
    import gguf
    from gguf.quants import dequantize
    vals = {}
    # the model and, where there is one, its MTP block's GGUF (their Q8_0 tensors are disjoint)
    for f in ("model-llamacpp.gguf", "mtp-model-llamacpp.gguf"):
        if not os.path.isfile(os.path.join(d, f)):
            continue
        for t in gguf.GGUFReader(os.path.join(d, f)).tensors:
            if t.tensor_type == gguf.GGMLQuantizationType.Q8_0:
                a = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
                vals[t.name] = torch.tensor(a.reshape([int(x) for x in reversed(t.shape)]))
    torch.save(vals, os.path.join(d, ".gguf-values.pt"))


def gguf_child(d: str, mtp: bool = False) -> None:
    """convert_hf_to_gguf.py on `d` -> model-llamacpp.gguf; with `mtp`, its `--mtp` export of the
    MTP block alone -> mtp-model-llamacpp.gguf."""
    import tempfile
    sys.path[:0] = [LLAMA_CPP, os.path.join(LLAMA_CPP, "gguf-py")]
    import gguf
    import convert_hf_to_gguf
    from conversion import deepseek

    def set_vocab(self):
        n = self.hparams["vocab_size"]
        self.gguf_writer.add_tokenizer_model("gpt2")
        self.gguf_writer.add_tokenizer_pre("deepseek-v3")
        self.gguf_writer.add_token_list([f"<t{i}>" for i in range(n)])
        self.gguf_writer.add_token_types([1] * n)
        self.gguf_writer.add_token_merges(["<t0> <t1>"])  # llama.cpp refuses a BPE vocab without merges
        self.gguf_writer.add_bos_token_id(BOS)
        self.gguf_writer.add_eos_token_id(EOS)

    deepseek.DeepseekV4Model.set_vocab = set_vocab
    out = os.path.join(d, ("mtp-" if mtp else "") + "model-llamacpp.gguf")
    with tempfile.TemporaryDirectory() as tmpd:
        # a fixed directory name: the converter writes it as general.name
        tmp = os.path.join(tmpd, f"deepseekv4-{os.path.basename(d)}")
        os.makedirs(tmp)
        for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(d, f), tmp)
        argv = sys.argv
        sys.argv = ["convert", tmp, "--outfile", out, "--outtype", "f32"] + (["--mtp"] if mtp else [])
        try:
            convert_hf_to_gguf.main()
        finally:
            sys.argv = argv
    rd = gguf.GGUFReader(out)
    types = {}
    for t in rd.tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    print(json.dumps({"tensor_count": len(rd.tensors), "types": types}))


def main() -> None:
    if sys.argv[1:2] == ["--gguf-child"]:
        gguf_child(sys.argv[2], "--mtp" in sys.argv[3:])
        return
    if sys.argv[1:2] == ["--gguf-values"]:
        gguf_values(sys.argv[2])
        return
    if sys.argv[1:2] == ["--llama-child"]:
        llama_child(sys.argv[2])
        return
    only = sys.argv[1:]
    t0 = time.time()
    os.makedirs(OUT, exist_ok=True)
    built = {}
    for name, kw in FIXTURES.items():
        if only and name not in only and not (name in RELEASE_DIR and RELEASE_DIR[name] in only):
            continue
        built[name] = build(name, dict(kw))
    for name, kw in RELEASE_ONLY.items():
        if only and name not in only:
            continue
        built[name] = find_seed(name, dict(kw), prompts_for())
    for name, base in built.items():
        if name not in RELEASE_DIR:
            continue
        kw = FIXTURES.get(name) or RELEASE_ONLY[name]
        build_fp8(name, kw, base)
        to_gguf(RELEASE_DIR[name])
        gguf_reference(RELEASE_DIR[name], base)
        if name in RELEASE_ONLY:
            llama_logits(RELEASE_DIR[name])
    print(f"done in {time.time() - t0:.0f} s: {OUT}")


if __name__ == "__main__":
    main()
