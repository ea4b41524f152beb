#!/usr/bin/env python3
# vela-venv: torch
"""Tiny random qwen4_exp ("Qwen3.8 Flash Next") text checkpoints + transformers 5.23 oracle outputs.

Regenerate (re-runnable; overwrites the output):

    scripts/prepare-test-data.sh   # runs this in $VELA_CACHE/venv-torch (torch + transformers==5.23.0)
or by hand:
    $VELA_CACHE/venv-torch/bin/python scripts/gen-qwen4exp-fixtures.py [fixture names...]   # default: all
    (names: the FIXTURES keys below, `real_hash`, `gguf`)

One CPU thread (torch.set_num_threads(1)); about 25 s for everything, ~37 MB. The forward pass is
spelled out in docs/qwen4exp-spec.md (HF line numbers). Output, per fixture `<name>`:

    $VELA_CACHE/golden/qwen4exp/<name>/     (VELA_CACHE defaults to ~/.cache/vela)
        config.json, model.safetensors      Qwen4ExpForCausalLM.save_pretrained, float32, in the
                                            checkpoint layout HF writes (and the real checkpoint
                                            uses): experts per expert (`mlp.experts.<e>.{gate,up,
                                            down}_proj.weight`), the PLE table as `split_ngram_parts`
                                            row shards `ngram_embedding.shard_<i>.weight`, the PLE
                                            hash constants as int64 tensors
        generation_config.json              as save_pretrained wrote it
        tokenizer.json, tokenizer_config.json  synthetic (`<tN>` for id N, no merges): the tests feed
                                            token ids; only there so the directory loads like an HF
                                            checkpoint
        prompts.json                        {"prompts": {"long": [...], "mid": [...], "short": [...]},
                                             "generate": {"prompt": "mid", "tokens": [64 ids]}, ...}
        logits_<prompt>.f32                 little-endian f32 [len(prompt), vocab], every position,
                                            one no-cache forward (GDN: chunked path)
        streams_long.f32                    f32 [L+1, 128, hc_count*hidden]: the residual streams of
                                            `long` after the embedding ([0]) and after every layer
        mixed_long.f32                      f32 [128, hidden]: the final mixer output (lm_head input)
        logits_long_split<S>.f32            positions S.. of `long` from a cached forward of
                                            long[:S] then long[S:] (chunked prefill continuing from
                                            the GDN/PLE/QSA state)
        logits_gen.f32                      [64, vocab]: the logits `generate` (greedy, cache on,
                                            EOS ignored) saw at each step; row 0 is the prefill's
                                            last position (chunked GDN), rows 1.. are single-token
                                            decode steps (recurrent GDN, fused conv update)
        qsa_<prompt>.json                   the indexer's choice per QSA layer and query position:
                                            kept key positions (sorted), block scores, top-k blocks,
                                            the gap at the top-k cutoff (see "Ties" below)
        qsa_gen.json                        the same for the 63 decode steps of `generate`
        meta.json                           manifest (every file, dtype, shape), versions, config
                                            kwargs, PLE constants, conditioning and tie margins
        bf16/ (gdn_qsa, ple)                config.json + model.safetensors with the float weights
                                            rounded to bfloat16 (int64 constants unchanged) and
                                            logits_long.f32 of that checkpoint computed in float32
        model-f32.gguf (ple)                llama.cpp 0c1e570's converter on the checkpoint, see
                                            meta.json "gguf" (what it changed, or its error)

    $VELA_CACHE/golden/qwen4exp/real_hash/ngram_ids.json
        the PLE n-gram hash at the REAL config (vocab 248320, 8 heads per n-gram, base 20,000,000,
        seed 1234, eos 248044), computed by HF's own Qwen4ExpTextNGramEmbedding with the 51B table
        replaced by a probe: the hash constants for PLE layer index 0 and 1 and the table row ids of
        every head for a token sequence with EOS resets and ids near the vocabulary end, one-shot
        and with a cache fed one token at a time.

Fixtures (all: 8 layers, pattern [GDN, GDN, GDN, QSA] x 2 as in the real layer_types, hc_count
streams, MoE with a gated shared expert, vocab 512, QSA budget 16 tokens = 4 blocks of 4 with
prompts of 128/40/11 tokens, so the indexer drops blocks, keeps all of them (`short`), and runs
with an incomplete tail):
    gdn_qsa      real-model options (sigmoid output gate, GQA ratio 3 in the GDN, 4 indexer heads,
                 partial rotary 0.25 over a head dim larger than the indexer's rotary part), no PLE
    ple          + PLE on 1-indexed layer 2 (= layer index 1, as the real [2]), 16 hash heads,
                 ple_embed_dim != hidden_size; EOS inside the prompts (the hash resets after EOS)
    ple2_silu    PLE on two layers (1-indexed [2, 7]: the second one uses the next 16 primes and
                 other multipliers), output_gate_type unset (HF falls back to hidden_act = silu),
                 eos_token_id a LIST [503, 504]: HF resets on eos[0] only (llama.cpp uses eos[-1]);
                 both ids occur in the prompts; layer_types left as HF writes them
                 ("indexed_attention"); the other fixtures use the real config's "full_attention"
    variant_yarn HF-accepted knobs a sibling or a deployment plausibly changes: YaRN RoPE (factor
                 2, as the published long-context serving override of the real model; cos/sin
                 scaled by 0.1 ln 2 + 1, which also scales the indexer), hc_count 2,
                 norm_topk_prob false, top-3 routing, GDN key dim 16 != value dim 24, indexer
                 compress ratio 8 with budget 24 (3 blocks)

Ties: QSA keeps the top min(budget/ratio, n_complete_blocks) blocks by a ReLU-sum score; scores
are often exactly 0 and torch.topk's tie order is unspecified. Only ties AT the cutoff change the
kept set, so every fixture is checked to have a margin (k-th minus (k+1)-th best score) of at least
QSA_MIN_GAP at every query, and a router top-k margin of at least ROUTER_MIN_GAP at every token
(the weight seed is bumped until both hold, recorded in meta.json). The kept set is then unique;
its order is irrelevant (it becomes a mask).
"""

import json
import math
import os
import shutil
import sys
import time

import numpy as np
import torch
import transformers
from transformers import GenerationConfig, Qwen4ExpForCausalLM, Qwen4ExpTextConfig
from transformers.models.qwen4_exp import modeling_qwen4_exp as mq

torch.set_num_threads(1)

VELA_CACHE = os.environ.get("VELA_CACHE", os.path.expanduser("~/.cache/vela"))
OUT = os.path.join(VELA_CACHE, "golden", "qwen4exp")
LLAMA_CPP = os.path.join(VELA_CACHE, "llama-cpp-python", "vendor", "llama.cpp")

VOCAB = 512
EOS = 503
N_GEN = 64
SPLIT = 50  # chunked-prefill split of the long prompt (not a multiple of the block size 4)
QSA_MIN_GAP = 1e-4
ROUTER_MIN_GAP = 1e-5
GREEDY_MIN_GAP = 1e-4

LINEAR, FULL = "linear_attention", "full_attention"

BASE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    num_hidden_layers=8,
    layer_types=[LINEAR, LINEAR, LINEAR, FULL] * 2,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=64,
    rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
                     "mrope_section": [3, 3, 2], "mrope_interleaved": True},
    max_position_embeddings=4096,
    linear_conv_kernel_dim=4,
    linear_num_key_heads=2,
    linear_num_value_heads=6,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    hc_count=4,
    hc_lowrank=32,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
    norm_topk_prob=True,
    indexer_n_heads=4,
    indexer_kv_heads=1,
    indexer_head_dim=32,
    indexer_budget=16,
    indexer_compress_ratio=4,
    output_gate_type="sigmoid",
    ple_layer_ids=[],
    rms_norm_eps=1e-6,
    eos_token_id=EOS,
    bos_token_id=EOS,
    tie_word_embeddings=False,
)

PLE1 = dict(ple_layer_ids=[2], ple_embed_dim=128, heads_per_ngram=8, ngram_size=3, ple_conv_kernel_size=4,
            ngram_vocab_size_base=1000, make_ngram_vocab_size_divisible_by=128, split_ngram_parts=4, seed=1234)

FIXTURES = {
    "gdn_qsa": dict(BASE),
    "ple": {**BASE, **PLE1},
    "ple2_silu": {**BASE, **PLE1, "ple_layer_ids": [2, 7], "ple_embed_dim": None, "heads_per_ngram": 4,
                  "ngram_vocab_size_base": 700, "output_gate_type": None, "eos_token_id": [EOS, EOS + 1],
                  "_keep_hf_layer_types": True},
    "variant_yarn": {**BASE,
                     "rope_parameters": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 2048,
                                         "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
                                         "mrope_section": [3, 3, 2], "mrope_interleaved": True},
                     "hc_count": 2, "hc_lowrank": 24, "norm_topk_prob": False, "num_experts_per_tok": 3,
                     "linear_value_head_dim": 24, "indexer_compress_ratio": 8, "indexer_budget": 24},
}
BF16_FIXTURES = ("gdn_qsa", "ple")
GGUF_FIXTURE = "ple"


# --------------------------------------------------------------------------------------------
# prompts


def prompts_for(name: str, kw: dict) -> dict:
    rng = np.random.default_rng(7)
    # ids 3..VOCAB-16 (EOS and its neighbours only where placed on purpose)
    long = [int(t) for t in rng.integers(3, VOCAB - 16, 128)]
    mid = [int(t) for t in rng.integers(3, VOCAB - 16, 40)]
    short = [int(t) for t in rng.integers(3, VOCAB - 16, 11)]
    if kw.get("ple_layer_ids"):
        eos = kw["eos_token_id"]
        e0, e_last = (eos[0], eos[-1]) if isinstance(eos, list) else (eos, eos)
        # EOS twice in a row, a lone EOS, an EOS two before a block end; the 2nd id of an EOS list
        # (no reset in HF) where it would matter.
        for p in (30, 31, 77, 109):
            long[p] = e0
        mid[5] = e0
        mid[23] = e0
        short[0] = e0
        if e_last != e0:
            long[50] = e_last
            long[90] = e_last
            mid[12] = e_last
    return {"long": long, "mid": mid, "short": short}


# --------------------------------------------------------------------------------------------
# weights


def randomize(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Random weights keeping activations O(1); every norm gamma, conv and PLE weight non-trivial
    (HF initialises the 1+w gammas and the PLE conv to zero)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):  # plain w (no 1+w)
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif "norm" in name:  # (1+w) RMSNorms: hc_norm, q/k_norm, indexer q/k_layernorm, PLE norms
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.02, 1.5, generator=gen).log())
            elif name.endswith("dt_bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif name.endswith("conv1d.weight"):  # [C, 1, K]
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
            elif "embed_tokens" in name or "ngram_embedding" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            elif p.dim() in (2, 3):  # Linear [out, in]; experts [E, out, in]
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
            else:
                raise SystemExit(f"randomize: unhandled parameter {name} {tuple(p.shape)}")


# --------------------------------------------------------------------------------------------
# QSA / router probes


class Probe:
    """Forward hooks on every QSA indexer and MoE router. The indexer hook takes HF's own output
    (the selection mask) as the kept set and recomputes the block scores with the same ops as
    HF's per-query loop (modeling_qwen4_exp.py 726-756) to record the cutoff margin."""

    def __init__(self, model):
        self.on = True
        self.qsa: list[dict] = []
        self.router_gap = math.inf
        self.hooks = []
        for m in model.modules():
            if isinstance(m, mq.Qwen4ExpTextQSAIndexer):
                self.hooks.append(m.register_forward_hook(self._indexer_hook))
            elif isinstance(m, mq.Qwen4ExpTextTopKRouter):
                self.hooks.append(m.register_forward_hook(self._router_hook))

    def reset(self):
        self.qsa = []
        self.router_gap = math.inf

    def _router_hook(self, mod, _inp, out):
        if not self.on:
            return
        probs = torch.softmax(out[0].double(), dim=-1)
        top = probs.topk(mod.top_k + 1, dim=-1).values
        self.router_gap = min(self.router_gap, float((top[:, mod.top_k - 1] - top[:, mod.top_k]).min()))

    @torch.no_grad()
    def _indexer_hook(self, mod, args, out):
        if not self.on:
            return
        hidden, (full_cos, full_sin), mask, pkv = args
        b, s, _ = hidden.shape
        assert b == 1
        qk = mod.index_qk_proj(hidden)
        q, token_k = torch.split(qk, [mod.index_n_heads * mod.index_head_dim, mod.index_head_dim], dim=-1)
        q = mod.q_layernorm(q.reshape(b, s, -1, mod.index_head_dim))
        q = mq.apply_rotary_pos_emb(q, cos=full_cos[:, -s:], sin=full_sin[:, -s:], unsqueeze_dim=2)
        raw = pkv.layers[mod.layer_idx].indexer_keys if pkv is not None else token_k.reshape(b, s, -1)
        visible = mask if mask.dtype == torch.bool else mask == 0
        r, k = mod.compress_ratio, mod.block_topk
        kv_len = mask.shape[-1]
        rows = []
        for qi in range(s):
            vis = torch.nonzero(visible[0, 0, qi]).flatten()
            n = vis.shape[-1] // r
            kept = torch.nonzero(out[0, 0, qi]).flatten().tolist()
            row = {"pos": kv_len - s + qi, "n_complete": n, "selected": kept}
            if n > 0:
                blocks = vis[: n * r].view(n, r)
                pooled = raw[0].index_select(0, blocks.flatten()).view(n, r, -1).float().mean(1).to(raw.dtype)
                pooled = mod.k_layernorm(pooled)
                kb = mq.apply_rotary_pos_emb(pooled.unsqueeze(1), cos=full_cos[0].index_select(0, blocks[:, 0]),
                                             sin=full_sin[0].index_select(0, blocks[:, 0])).squeeze(1)
                sc = torch.matmul(q[0, qi].float(), kb.float().transpose(-1, -2)).transpose(-1, -2)
                sc = torch.relu(sc).sum(-1) / math.sqrt(mod.index_head_dim)
                order = torch.sort(sc.double(), descending=True, stable=True)
                kk = min(k, n)
                top_blocks = sorted(order.indices[:kk].tolist())
                gap = float(order.values[kk - 1] - order.values[kk]) if n > kk else None
                expect = sorted(set(blocks[top_blocks].flatten().tolist()) | set(vis[n * r:].tolist()))
                if gap is None or gap > 0:
                    assert expect == kept, f"layer {mod.layer_idx} query {row['pos']}: HF kept {kept}, scores say {expect}"
                row.update(block_scores=[float(x) for x in sc], top_blocks=top_blocks, cutoff_gap=gap,
                           n_zero_scores=int((sc == 0).sum()))
            else:
                assert kept == vis.tolist()
                row.update(block_scores=[], top_blocks=[], cutoff_gap=None, n_zero_scores=0)
            row["layer"] = mod.layer_idx
            rows.append(row)
        self.qsa.extend(rows)

    def min_qsa_gap(self):
        gaps = [r["cutoff_gap"] for r in self.qsa if r["cutoff_gap"] is not None]
        return min(gaps) if gaps else None


def qsa_json(rows: list[dict], cfg) -> dict:
    layers = {}
    for r in rows:
        layers.setdefault(str(r["layer"]), []).append({k: v for k, v in r.items() if k != "layer"})
    return {
        "compress_ratio": cfg.indexer_compress_ratio,
        "block_topk": cfg.indexer_budget // cfg.indexer_compress_ratio,
        "note": "selected = sorted key positions the QSA layer attends to for the query at `pos` (the "
                "mask HF ANDs with the causal mask: the top_blocks' tokens plus the incomplete tail). "
                "block_scores[b] = sum_h relu(q_h . k_b)/sqrt(indexer_head_dim) for complete block b "
                "(tokens 4b..4b+3 for ratio 4), f32 as HF computes it; cutoff_gap = k-th minus "
                "(k+1)-th largest score (null when every complete block is kept). Any choice with the "
                "same scores at the cutoff is tie-equivalent; every gap here is >= min_cutoff_gap.",
        "min_cutoff_gap": min([r["cutoff_gap"] for r in rows if r["cutoff_gap"] is not None], default=None),
        "layers": layers,
    }


# --------------------------------------------------------------------------------------------


def write_f32(path: str, t: torch.Tensor) -> list[int]:
    a = t.detach().to(torch.float32).contiguous().numpy().astype("<f4")
    a.tofile(path)
    return list(a.shape)


def synthetic_tokenizer(d: str, n: int, eos: int) -> None:
    vocab = {f"<t{i}>": i for i in range(n)}
    tj = {"version": "1.0", "truncation": None, "padding": None,
          "added_tokens": [{"id": eos, "content": f"<t{eos}>", "single_word": False, "lstrip": False,
                            "rstrip": False, "normalized": False, "special": True}],
          "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
          "decoder": None,
          "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                    "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                    "ignore_merges": False, "vocab": vocab, "merges": []}}
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(tj, f)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": f"<t{eos}>",
                   "model_max_length": 4096, "comment": "synthetic: token <tN> is id N; tests feed ids"}, f,
                  indent=1)


def make_model(kw: dict, seed: int):
    torch.manual_seed(0)
    cfg = Qwen4ExpTextConfig(**{k: v for k, v in kw.items() if not k.startswith("_") and v is not None})
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    model = Qwen4ExpForCausalLM(cfg).eval().float()
    randomize(model, torch.Generator().manual_seed(seed))
    return cfg, model


def logits_nocache(model, ids):
    return model(torch.tensor([ids]), use_cache=False).logits[0]


def ple_constants(model) -> list[dict]:
    out = []
    for i, layer in enumerate(model.model.layers):
        if layer.ple is not None:
            e = layer.ple.ple_embedding
            out.append({"layer": i, "ple_layer_index": e.ple_layer_index,
                        "layer_multipliers": e.layer_multipliers.tolist(),
                        "head_vocab_sizes": e.ngram_heads_vocab_sizes.tolist(),
                        "head_offsets": e.ngram_heads_offsets.tolist(),
                        "table_rows": e.ngram_embedding.weight.shape[0],
                        "row_width": e.ngram_embedding.weight.shape[1],
                        "eos_used_by_hf": e.eos_token_id})
    return out


def candidate(name: str, kw: dict, prompts: dict, seed: int):
    """All oracle outputs for one weight seed, or (None, why) when a margin is too small."""
    cfg, model = make_model(kw, seed)
    probe = Probe(model)
    r = {"seed": seed, "cfg": cfg, "model": model, "logits": {}, "qsa": {}, "router_gap": math.inf}
    # 1. no-cache forward of every prompt; router and QSA cutoffs need a margin
    for p, ids in prompts.items():
        probe.reset()
        with torch.no_grad():
            r["logits"][p] = logits_nocache(model, ids)
        r["qsa"][p] = probe.qsa
        r["router_gap"] = min(r["router_gap"], probe.router_gap)
        g = probe.min_qsa_gap()
        if probe.router_gap < ROUTER_MIN_GAP or (g is not None and g < QSA_MIN_GAP):
            return None, f"prompt {p}: router gap {probe.router_gap:.1e}, QSA gap {g}"

    # residual streams after every decoder layer and the final mixer output, for the long prompt
    probe.on = False
    taps = []
    hooks = [l.register_forward_hook(lambda m, a, o: taps.append(o[0].detach().clone()))
             for l in model.model.layers]
    hooks.append(model.model.hyper_connection_mixer.register_forward_hook(
        lambda m, a, o: taps.append(o[0].detach().clone())))
    with torch.no_grad():
        emb = model.model.embed_tokens(torch.tensor([prompts["long"]]))[0]
        again = logits_nocache(model, prompts["long"])
    for h in hooks:
        h.remove()
    assert torch.equal(again, r["logits"]["long"])
    r["streams"] = torch.stack([emb.repeat(1, cfg.hc_count)] + taps[:-1])  # [L+1, T, hc*H]
    r["mixed"] = taps[-1]  # [T, H]
    probe.on = True

    # 2. generate (greedy, cache on, EOS ignored) from `mid`
    gprompt = prompts["mid"]
    probe.reset()
    gcfg = GenerationConfig(max_new_tokens=N_GEN, do_sample=False, eos_token_id=None, pad_token_id=0,
                            bos_token_id=None, use_cache=True, output_logits=True, return_dict_in_generate=True)
    # generate merges an unset (None) eos_token_id from the model's generation_config: clear it there
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(torch.tensor([gprompt]), generation_config=gcfg)
    gen = out.sequences[0, len(gprompt):].tolist()
    assert len(gen) == N_GEN
    r["gen"] = gen
    r["gen_logits"] = torch.stack([x[0] for x in out.logits])  # [N_GEN, V]
    # prefill queries have pos < len(gprompt); decode step i (feeding gen[i-1]) has pos len+i-1
    r["gen_qsa"] = [q for q in probe.qsa if q["pos"] >= len(gprompt)]
    r["gen_router_gap"] = probe.router_gap
    r["gen_qsa_gap"] = min([q["cutoff_gap"] for q in r["gen_qsa"] if q["cutoff_gap"] is not None], default=None)
    top2 = r["gen_logits"].topk(2, dim=-1).values
    r["greedy_gap"] = float((top2[:, 0] - top2[:, 1]).min())
    if r["gen_router_gap"] < ROUTER_MIN_GAP or (r["gen_qsa_gap"] is not None and r["gen_qsa_gap"] < QSA_MIN_GAP):
        return None, f"generate: router gap {r['gen_router_gap']:.1e}, QSA gap {r['gen_qsa_gap']}"
    if r["greedy_gap"] < GREEDY_MIN_GAP:
        return None, f"generate: greedy top-2 logit gap {r['greedy_gap']:.1e}"
    # teacher forcing without a cache: same argmax? how far are the recurrent decode logits?
    with torch.no_grad():
        tf = logits_nocache(model, gprompt + gen[:-1])[len(gprompt) - 1:]
    r["tf_same"] = tf.argmax(-1).tolist() == gen
    r["tf_dev"] = float((tf - r["gen_logits"]).abs().max())

    # 3. chunked prefill: long[:SPLIT] then long[SPLIT:] through one cache
    probe.reset()
    with torch.no_grad():
        o1 = model(torch.tensor([prompts["long"][:SPLIT]]), use_cache=True)
        o2 = model(torch.tensor([prompts["long"][SPLIT:]]), past_key_values=o1.past_key_values, use_cache=True)
    split_sel = {(q["layer"], q["pos"]): q["selected"] for q in probe.qsa if q["pos"] >= SPLIT}
    one_sel = {(q["layer"], q["pos"]): q["selected"] for q in r["qsa"]["long"] if q["pos"] >= SPLIT}
    assert split_sel == one_sel, "chunked prefill selected other QSA blocks than the one-shot forward"
    r["split_logits"] = o2.logits[0]
    r["split_dev"] = float((r["split_logits"] - r["logits"]["long"][SPLIT:]).abs().max())

    # 4. conditioning: the same weights in float64 (NB HF still runs the RMSNorms, the gated
    # RMSNorm, the GDN core and the router softmax in float32 there: explicit casts)
    probe.on = False
    dbl = Qwen4ExpForCausalLM(cfg).eval()
    dbl.load_state_dict(model.state_dict())
    dbl = dbl.double()
    with torch.no_grad():
        ref = logits_nocache(dbl, prompts["long"]).double()
    lg = r["logits"]["long"].double()
    r["nmse"] = float((((lg - ref) ** 2).sum(-1) / (ref ** 2).sum(-1)).max())
    r["f64_dev"] = float((lg - ref).abs().max())
    if r["nmse"] > 1e-9:
        return None, f"ill-conditioned: f32 vs f64 worst-position NMSE {r['nmse']:.1e}"
    return r, None


def build(name: str, kw: dict) -> None:
    t0 = time.time()
    d = os.path.join(OUT, name)
    prompts = prompts_for(name, kw)
    files = {}
    # the first weight seed whose router, QSA and greedy choices all have a margin
    for seed in range(1234, 1234 + 40):
        r, why = candidate(name, kw, prompts, seed)
        if r is not None:
            break
        print(f"  {name}: seed {seed} rejected: {why}")
    else:
        sys.exit(f"{name}: no seed with clear margins")
    cfg, model, logits, qsa = r["cfg"], r["model"], r["logits"], r["qsa"]
    gen, gen_logits, gen_qsa, split_logits = r["gen"], r["gen_logits"], r["gen_qsa"], r["split_logits"]

    # 5. write the checkpoint, reload it, check it reproduces the logits
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    model.save_pretrained(d, safe_serialization=True)
    cpath = os.path.join(d, "config.json")
    cj = json.load(open(cpath))
    if not kw.get("_keep_hf_layer_types"):
        # The real checkpoint's config.json says "full_attention" (HF maps it to "indexed_attention",
        # configuration_qwen4_exp.py 179-183); save_pretrained writes the mapped name.
        cj["layer_types"] = [FULL if t == "indexed_attention" else t for t in cj["layer_types"]]
        json.dump(cj, open(cpath, "w"), indent=2)
    synthetic_tokenizer(d, cfg.vocab_size, EOS)
    reloaded = Qwen4ExpForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager",
                                                   experts_implementation="eager").eval()
    with torch.no_grad():
        reload_dev = max(float((logits_nocache(reloaded, ids) - logits[p]).abs().max()) for p, ids in prompts.items())
    assert reload_dev == 0.0, f"{name}: reloaded checkpoint differs by {reload_dev}"
    del reloaded

    for p in prompts:
        files[f"logits_{p}.f32"] = {"dtype": "f32", "shape": write_f32(os.path.join(d, f"logits_{p}.f32"), logits[p]),
                                    "what": f"no-cache forward of prompts[{p!r}], every position"}
        with open(os.path.join(d, f"qsa_{p}.json"), "w") as f:
            json.dump(qsa_json(qsa[p], cfg), f)
        files[f"qsa_{p}.json"] = {"what": f"QSA selections for prompts[{p!r}]"}
    files["streams_long.f32"] = {
        "dtype": "f32", "shape": write_f32(os.path.join(d, "streams_long.f32"), r["streams"]),
        "what": "prompts['long']: [0] = embedding repeated into hc_count streams, [i+1] = residual streams "
                "after decoder layer i (stream s = columns s*H..(s+1)*H)"}
    files["mixed_long.f32"] = {
        "dtype": "f32", "shape": write_f32(os.path.join(d, "mixed_long.f32"), r["mixed"]),
        "what": "prompts['long']: hyper_connection_mixer output (the lm_head input)"}
    files[f"logits_long_split{SPLIT}.f32"] = {
        "dtype": "f32", "shape": write_f32(os.path.join(d, f"logits_long_split{SPLIT}.f32"), split_logits),
        "what": f"positions {SPLIT}.. of prompts['long'] from forward(long[:{SPLIT}]) then forward(long[{SPLIT}:]) "
                "with one DynamicCache"}
    files["logits_gen.f32"] = {"dtype": "f32", "shape": write_f32(os.path.join(d, "logits_gen.f32"), gen_logits),
                               "what": "generate's logits per step: row 0 = prefill of prompts['mid'] (last "
                                       "position), row i = decode step feeding generated token i-1"}
    with open(os.path.join(d, "qsa_gen.json"), "w") as f:
        json.dump(qsa_json(gen_qsa, cfg), f)
    files["qsa_gen.json"] = {"what": "QSA selections of the decode steps of generate (one query each)"}
    with open(os.path.join(d, "prompts.json"), "w") as f:
        json.dump({"prompts": prompts,
                   "generate": {"prompt": "mid", "max_new_tokens": N_GEN, "greedy": True, "eos_ignored": True,
                                "tokens": gen},
                   "split": SPLIT}, f)
    files["prompts.json"] = {"what": "token ids of the prompts and of the greedy continuation"}

    bf16 = None
    if name in BF16_FIXTURES:
        bf16 = bf16_variant(d, cfg, model, prompts["long"], logits["long"])

    meta = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "model_class": "Qwen4ExpForCausalLM",
        "attn_implementation": "eager",
        "experts_implementation": "eager",
        "weight_seed": r["seed"],
        "config_kwargs": {k: v for k, v in kw.items() if not k.startswith("_")},
        "config_json_layer_types": cj["layer_types"],
        "hf_layer_types": cfg.layer_types,
        "output_gate_type_effective": cfg.output_gate_type or cfg.hidden_act,
        "ple": ple_constants(model),
        "files": files,
        "margins": {
            "qsa_min_cutoff_gap_prompts": min([g for g in (probe_min(qsa[p]) for p in prompts) if g is not None],
                                              default=None),
            "router_min_topk_prob_gap_prompts": r["router_gap"],
            "qsa_min_cutoff_gap_generate": r["gen_qsa_gap"],
            "router_min_topk_prob_gap_generate": r["gen_router_gap"],
            "greedy_min_top1_top2_logit_gap": r["greedy_gap"],
            "qsa_zero_score_blocks_long": sum(r["n_zero_scores"] for r in qsa["long"]),
            "qsa_queries_dropping_blocks_long": sum(1 for r in qsa["long"] if r["cutoff_gap"] is not None),
        },
        "deviations": {
            "reload_max_abs": reload_dev,
            "split_prefill_vs_one_shot_max_abs": r["split_dev"],
            "generate_vs_nocache_teacher_forced_max_abs": r["tf_dev"],
            "generate_equals_nocache_argmax": r["tf_same"],
            "f64_vs_f32_long_max_abs": r["f64_dev"],
            "f64_vs_f32_long_worst_position_nmse": r["nmse"],
        },
        "bf16": bf16,
    }
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1, default=str)
    size = sum(os.path.getsize(os.path.join(r, x)) for r, _, fs in os.walk(d) for x in fs)
    print(f"{name}: seed {r['seed']}, QSA gap {meta['margins']['qsa_min_cutoff_gap_prompts']:.2e}, "
          f"greedy gap {r['greedy_gap']:.2e}, split dev {r['split_dev']:.1e}, gen dev {r['tf_dev']:.1e}, "
          f"f64 nmse {r['nmse']:.1e}, "
          f"{size / 1e6:.1f} MB, {time.time() - t0:.0f} s")


def probe_min(rows):
    gaps = [r["cutoff_gap"] for r in rows if r["cutoff_gap"] is not None]
    return min(gaps) if gaps else None


def bf16_variant(d: str, cfg, model, ids, f32_logits) -> dict:
    """`d/bf16/`: the float tensors rounded to bfloat16 (int64 hash constants unchanged) and that
    checkpoint's logits on the long prompt computed in float32."""
    from safetensors.torch import load_file, save_file
    b = os.path.join(d, "bf16")
    os.makedirs(b, exist_ok=True)
    for f in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(d, f), b)
    cj = json.load(open(os.path.join(b, "config.json")))
    cj["dtype"] = "bfloat16"
    json.dump(cj, open(os.path.join(b, "config.json"), "w"), indent=2)
    t = load_file(os.path.join(d, "model.safetensors"))
    save_file({k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous() for k, v in t.items()},
              os.path.join(b, "model.safetensors"), metadata={"format": "pt"})
    m = Qwen4ExpForCausalLM.from_pretrained(b, dtype=torch.float32, attn_implementation="eager",
                                            experts_implementation="eager").eval()
    with torch.no_grad():
        lg = logits_nocache(m, ids)
    shape = write_f32(os.path.join(b, "logits_long.f32"), lg)
    return {"files": {"bf16/model.safetensors": "bf16 weights", "bf16/logits_long.f32": {"dtype": "f32", "shape": shape}},
            "max_abs_vs_f32_weights": float((lg - f32_logits).abs().max())}


# --------------------------------------------------------------------------------------------
# real-config PLE hash


def real_hash() -> None:
    """HF's Qwen4ExpTextNGramEmbedding at the real config, its 51B-row table replaced by a probe
    that records the row ids it is asked for."""
    d = os.path.join(OUT, "real_hash")
    os.makedirs(d, exist_ok=True)
    real = dict(vocab_size=248320, hidden_size=2560, num_hidden_layers=48, ple_layer_ids=[2], ple_embed_dim=2560,
                ngram_size=3, heads_per_ngram=8, ngram_vocab_size_base=20_000_000,
                make_ngram_vocab_size_divisible_by=128, split_ngram_parts=128, seed=1234, eos_token_id=248044,
                num_attention_heads=24, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
                linear_num_value_heads=48, hc_count=4, hc_lowrank=320, num_experts=512, num_experts_per_tok=10,
                moe_intermediate_size=640, shared_expert_intermediate_size=640, indexer_n_heads=4,
                indexer_kv_heads=1, indexer_head_dim=128, indexer_budget=2048, indexer_compress_ratio=4,
                rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
                                 "mrope_section": [11, 11, 10]})
    cfg = Qwen4ExpTextConfig(**real)
    eos = cfg.eos_token_id
    toks = [17, 248319, 248318, eos, 5, 248043, 0, 1, eos, eos, 99999, 151643, 248319, 248319, 248319,
            248045, 3, eos, 123456, 7, 7, 7, 248000, 11, 12, 13, eos, 248319, 0, 0]

    class Rows(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.empty(0)
            self.seen = None

        def forward(self, ids):
            self.seen = ids.clone()
            return torch.zeros(*ids.shape, 1)

    layers = []
    for ple_layer_index in (0, 1):
        with torch.device("meta"):
            emb = mq.Qwen4ExpTextNGramEmbedding(cfg, cfg.ple_embed_dim, layer_idx=1, ple_layer_index=ple_layer_index)
        emb.layer_multipliers = mq._build_layer_multipliers(emb.unigram_vocab_size, emb.ngram_size,
                                                            emb.ple_layer_index, emb.seed)
        emb.ngram_heads_vocab_sizes = torch.tensor(emb.head_vocab_sizes, dtype=torch.long)
        emb.ngram_heads_offsets = torch.tensor(emb.head_offsets, dtype=torch.long)
        emb.ngram_embedding = Rows()
        ids = torch.tensor([toks])
        emb(ids, None)
        one_shot = emb.ngram_embedding.seen[0].tolist()
        # cached: prefill of 5 tokens, then one token at a time (the n-gram context lives in the
        # cache's conv state 2)
        cache = transformers.DynamicCache(config=cfg)
        emb.layer_idx = 1
        stepped = []
        emb(ids[:, :5], cache)
        stepped += emb.ngram_embedding.seen[0].tolist()
        for t in range(5, len(toks)):
            emb(ids[:, t:t + 1], cache)
            stepped += emb.ngram_embedding.seen[0].tolist()
        assert stepped == one_shot
        # a 1-token prefill (shorter than the 2-token context: HF pads the cached ids with EOS)
        cache = transformers.DynamicCache(config=cfg)
        stepped1 = []
        for t in range(len(toks)):
            emb(ids[:, t:t + 1], cache)
            stepped1 += emb.ngram_embedding.seen[0].tolist()
        assert stepped1 == one_shot
        total = emb.total_vocab_size
        padded = math.ceil(total / cfg.make_ngram_vocab_size_divisible_by) * cfg.make_ngram_vocab_size_divisible_by
        layers.append({"ple_layer_index": ple_layer_index,
                       "layer_multipliers": emb.layer_multipliers.tolist(),
                       "head_vocab_sizes": emb.head_vocab_sizes,
                       "head_offsets": emb.head_offsets,
                       "total_rows": total, "padded_rows": padded,
                       "row_width": cfg.ple_embed_dim // emb.ngram_heads,
                       "rows": one_shot})
    doc = {"transformers": transformers.__version__,
           "config": {k: real[k] for k in ("vocab_size", "ple_embed_dim", "ngram_size", "heads_per_ngram",
                                            "ngram_vocab_size_base", "make_ngram_vocab_size_divisible_by",
                                            "split_ngram_parts", "seed", "eos_token_id")},
           "source": "real config values: transformers configuration defaults + the published text_config "
                     "(vocab 248320, ple_embed_dim 2560, 8 heads/n-gram, base 2e7, split 128; eos 248044 from a "
                     "third-party copy of the text_config, not verified against the official file)",
           "tokens": toks,
           "note": "rows[t][h] = table row (offset included) that head h (h < heads_per_ngram: bigram, else trigram) "
                   "reads for token t; identical one-shot, with a 5-token prefill + 1-token steps, and with "
                   "1-token steps from the start. ple_layer_index 1 = a hypothetical second PLE layer.",
           "layers": layers}
    with open(os.path.join(d, "ngram_ids.json"), "w") as f:
        json.dump(doc, f, indent=1)
    print(f"real_hash: multipliers {layers[0]['layer_multipliers']}, rows {layers[0]['padded_rows']}")


# --------------------------------------------------------------------------------------------
# llama.cpp converter


def to_gguf(name: str) -> None:
    """llama.cpp 0c1e570's convert_hf_to_gguf.py on the fixture → model-f32.gguf (synthetic
    vocabulary; the tests feed ids). Any failure is recorded in meta.json["gguf"]."""
    import subprocess
    d = os.path.join(OUT, name)
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--gguf-child", d], capture_output=True, text=True)
    meta_path = os.path.join(d, "meta.json")
    meta = json.load(open(meta_path))
    if r.returncode == 0 and os.path.exists(os.path.join(d, "model-f32.gguf")):
        info = json.loads(r.stdout.strip().splitlines()[-1])
        meta["gguf"] = info
        meta["files"]["model-f32.gguf"] = {"what": "llama.cpp 0c1e570 convert_hf_to_gguf.py --outtype f32"}
        print(f"  gguf: {info['tensor_count']} tensors")
    else:
        lines = [l for l in r.stderr.splitlines() if l.strip()]
        err = next((l for l in reversed(lines) if "Error" in l or "error" in l), lines[-1] if lines else "?")
        meta["gguf"] = {"error": err.strip(), "stderr_tail": lines[-15:]}
        print(f"  gguf failed: {err.strip()}")
    json.dump(meta, open(meta_path, "w"), indent=1, default=str)


def gguf_child(d: str) -> None:
    import tempfile
    sys.path[:0] = [LLAMA_CPP, os.path.join(LLAMA_CPP, "gguf-py")]
    import gguf
    import convert_hf_to_gguf
    from conversion import qwen4exp

    def set_vocab(self):
        n = self.hparams["vocab_size"]
        self.gguf_writer.add_tokenizer_model("gpt2")
        self.gguf_writer.add_tokenizer_pre("qwen35")
        self.gguf_writer.add_token_list([f"<t{i}>" for i in range(n)])
        self.gguf_writer.add_token_types([1] * n)
        self.gguf_writer.add_token_merges([])
        eos = self.hparams["eos_token_id"]
        self.gguf_writer.add_eos_token_id(eos[0] if isinstance(eos, list) else eos)

    qwen4exp.Qwen4ExpTextModel.set_vocab = set_vocab
    out = os.path.join(d, "model-f32.gguf")
    with tempfile.TemporaryDirectory() as tmpd:
        # a fixed directory name: the converter writes it as general.name
        tmp = os.path.join(tmpd, f"qwen4exp-{os.path.basename(d)}")
        os.makedirs(tmp)
        for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(d, f), tmp)
        argv = sys.argv
        sys.argv = ["convert", tmp, "--outfile", out, "--outtype", "f32"]
        try:
            convert_hf_to_gguf.main()
        finally:
            sys.argv = argv
    rd = gguf.GGUFReader(out)
    kv = {}
    for f in rd.fields.values():
        if f.name.startswith(("general.", "tokenizer.")):
            continue
        kv[f.name] = f.contents()
    tensors = {t.name: [int(x) for x in t.shape] for t in rd.tensors}
    checked = check_gguf_tensors(d, {t.name: np.asarray(t.data) for t in rd.tensors})
    print(json.dumps({"tensor_count": len(tensors), "kv": kv, "tensors": tensors, "transforms_verified": checked},
                     default=str))


def check_gguf_tensors(d: str, g: dict) -> dict:
    """Every GGUF tensor against the HF checkpoint under the converter's transforms (numpy shapes
    are the PyTorch ones; GGUF lists them reversed). Returns {rule: [gguf names]}; raises on any
    tensor left unexplained or different."""
    from safetensors.numpy import load_file
    hf = load_file(os.path.join(d, "model.safetensors"))
    cfg = json.load(open(os.path.join(d, "config.json")))
    hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    r = hv // hk

    def tiled(x, dim, hd):  # V heads grouped by K head -> tiled (converter qwen.py _reorder_v_heads)
        x = np.moveaxis(x, dim, 0)
        sh = x.shape
        x = x.reshape(hk, r, hd, *sh[1:]).swapaxes(0, 1).reshape(sh)
        return np.moveaxis(x, 0, dim)

    exp = {"token_embd.weight": ("copy", hf["model.embed_tokens.weight"]),
           "output.weight": ("copy", hf["lm_head.weight"])}
    mix = "model.hyper_connection_mixer."
    exp["output_hc_norm.weight"] = ("norm +1", hf[mix + "hc_norm.weight"] + 1)
    exp["output_hc_down.weight"] = ("copy", hf[mix + "input_mix_weight_down.weight"])
    exp["output_hc_up.weight"] = ("copy", hf[mix + "input_mix_weight_up.weight"])
    for i, lt in enumerate(cfg["layer_types"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        for hc, short in (("attn_hyper_connection.", "hc_attn_"), ("mlp_hyper_connection.", "hc_ffn_")):
            exp[b + short + "norm.weight"] = ("norm +1", hf[p + hc + "hc_norm.weight"] + 1)
            exp[b + short + "down.weight"] = ("copy", hf[p + hc + "input_mix_weight_down.weight"])
            exp[b + short + "up.weight"] = ("copy", hf[p + hc + "input_mix_weight_up.weight"])
            exp[b + short + "inject.weight"] = ("copy", hf[p + hc + "block_inject_weight.weight"])
        m = p + "mlp."
        exp[b + "ffn_gate_inp.weight"] = ("copy", hf[m + "gate.weight"])
        E = cfg["num_experts"]
        for w, gname in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
            exp[b + gname + ".weight"] = ("experts stacked [E, out, in]",
                                          np.stack([hf[f"{m}experts.{e}.{w}.weight"] for e in range(E)]))
        for w, gname in (("gate_proj", "ffn_gate_shexp"), ("up_proj", "ffn_up_shexp"), ("down_proj", "ffn_down_shexp")):
            exp[b + gname + ".weight"] = ("copy", hf[f"{m}shared_expert.{w}.weight"])
        exp[b + "ffn_gate_inp_shexp.weight"] = ("copy", hf[m + "shared_expert_gate.weight"])
        if lt == "linear_attention":
            a = p + "linear_attn."
            qkv = hf[a + "in_proj_qkv.weight"]
            exp[b + "attn_qkv.weight"] = ("GDN: V rows of in_proj_qkv grouped->tiled",
                                          np.concatenate([qkv[:2 * hk * dk], tiled(qkv[2 * hk * dk:], 0, dv)]))
            exp[b + "attn_gate.weight"] = ("GDN: rows grouped->tiled", tiled(hf[a + "in_proj_z.weight"], 0, dv))
            exp[b + "ssm_alpha.weight"] = ("GDN: rows grouped->tiled", tiled(hf[a + "in_proj_a.weight"], 0, 1))
            exp[b + "ssm_beta.weight"] = ("GDN: rows grouped->tiled", tiled(hf[a + "in_proj_b.weight"], 0, 1))
            exp[b + "ssm_a"] = ("GDN: -exp(A_log), grouped->tiled", -np.exp(tiled(hf[a + "A_log"], 0, 1)))
            exp[b + "ssm_dt.bias"] = ("GDN: dt_bias grouped->tiled", tiled(hf[a + "dt_bias"], 0, 1))
            cw = hf[a + "conv1d.weight"][:, 0, :]
            exp[b + "ssm_conv1d.weight"] = ("GDN: conv [C,1,K]->[C,K], V channels grouped->tiled",
                                            np.concatenate([cw[:2 * hk * dk], tiled(cw[2 * hk * dk:], 0, dv)]))
            exp[b + "ssm_norm.weight"] = ("copy (gated norm, no +1)", hf[a + "norm.weight"])
            exp[b + "ssm_out.weight"] = ("GDN: out_proj columns grouped->tiled", tiled(hf[a + "out_proj.weight"], 1, dv))
        else:
            a = p + "self_attn."
            for w, gname in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")):
                exp[b + gname + ".weight"] = ("copy", hf[a + w + ".weight"])
            exp[b + "attn_q_norm.weight"] = ("norm +1", hf[a + "q_norm.weight"] + 1)
            exp[b + "attn_k_norm.weight"] = ("norm +1", hf[a + "k_norm.weight"] + 1)
            nq = cfg["indexer_n_heads"] * cfg["indexer_head_dim"]
            w = hf[a + "indexer.index_qk_proj.weight"]
            exp[b + "indexer.q_proj.weight"] = ("indexer: index_qk_proj split q|k", w[:nq])
            exp[b + "indexer.k_proj.weight"] = ("indexer: index_qk_proj split q|k", w[nq:])
            exp[b + "indexer.q_norm.weight"] = ("norm +1", hf[a + "indexer.q_layernorm.weight"] + 1)
            exp[b + "indexer.k_norm.weight"] = ("norm +1", hf[a + "indexer.k_layernorm.weight"] + 1)
        if i + 1 in cfg["ple_layer_ids"]:
            e = p + "ple."
            n_parts = cfg["split_ngram_parts"]
            exp["per_layer_token_embd.weight"] = (
                "PLE: shards concatenated by index (rows = HF table rows, offsets included)",
                np.concatenate([hf[f"{e}ple_embedding.ngram_embedding.shard_{k}.weight"] for k in range(n_parts)]))
            exp[b + "ple_key.weight"] = ("copy", hf[e + "key_proj.weight"])
            exp[b + "ple_value.weight"] = ("copy", hf[e + "value_proj.weight"])
            for n in ("norm_key", "norm_query", "norm_conv"):
                exp[b + f"ple_{n}.weight"] = ("norm +1", hf[e + n + ".weight"] + 1)
            exp[b + "ple_conv1d.weight"] = ("PLE conv [C,1,K]->[C,K]", hf[e + "conv1d.weight"][:, 0, :])
    missing = sorted(set(g) - set(exp))
    if missing:
        raise SystemExit(f"GGUF tensors not explained: {missing}")
    rules: dict = {}
    for n, (rule, want) in exp.items():
        if n not in g:
            raise SystemExit(f"GGUF lacks {n}")
        got = g[n].reshape(want.shape) if g[n].size == want.size else g[n]
        want = want.astype(np.float32)
        # -exp(): torch's and numpy's float32 exp may differ in the last bit
        same = np.array_equal(got, want) if "exp" not in rule else np.allclose(got, want, rtol=3e-7, atol=0)
        if got.shape != want.shape or not same:
            raise SystemExit(f"GGUF {n}: not '{rule}' of the HF tensor")
        rules.setdefault(rule, []).append(n)
    return {k: sorted(v) for k, v in rules.items()}


def main() -> None:
    if sys.argv[1:2] == ["--gguf-child"]:
        gguf_child(sys.argv[2])
        return
    only = sys.argv[1:]
    t0 = time.time()
    os.makedirs(OUT, exist_ok=True)
    for name, kw in FIXTURES.items():
        if only and name not in only:
            continue
        build(name, dict(kw))
    if not only or "real_hash" in only:
        real_hash()
    if not only or "gguf" in only or GGUF_FIXTURE in only:
        to_gguf(GGUF_FIXTURE)
    print(f"done in {time.time() - t0:.0f} s: {OUT}")


if __name__ == "__main__":
    main()
