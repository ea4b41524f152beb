#!/usr/bin/env python3
# vela-venv: torch
"""Tiny random Gemma 4 targets + matching `gemma4_assistant` drafters, with transformers' draft
logits, for vela's assistant parity and speculative-decoding tests.

Regenerate (re-runnable; overwrites the output):

    scripts/prepare-test-data.sh   # runs this in $VELA_CACHE/venv-torch (torch + transformers==5.23.0)
or by hand:
    $VELA_CACHE/venv-torch/bin/python scripts/gen-gemma4-assistant.py [fixture names...]  # default: all

Output, per fixture `<name>` (dense, ordered: about 1 MB each; realdims: 55 MB):

    $VELA_CACHE/golden/gemma4_assistant/<name>/
        target/config.json, target/model.safetensors        Gemma4ForCausalLM, float32
        assistant/config.json, assistant/model.safetensors  Gemma4AssistantForCausalLM, float32
        assistant.gguf        the assistant through llama.cpp's converter (arch gemma4-assistant;
                              the converter drops the masked-embedding tensors), when it converts
        tokens.json           {"tokens": [...], "chains": [{"pos", "steps"}], "greedy": [...],
                               "assisted_greedy": [...] or null}
        target_logits.f32     little-endian f32 [len(tokens), vocab]: the target, every position
        draft_logits.f32      f32 [n_chains, steps, vocab]: the assistant's logits along each chain
        meta.json             configs, versions

A draft chain at position `pos` is what transformers' SinglePositionMultiTokenCandidateGenerator
computes after the target has processed `tokens[..pos]` and sampled `tokens[pos]`: step 0 feeds
`[E_target[tokens[pos]] · sqrt(H) ; h_target[pos-1]]` (h = the target's post-final-norm hidden
state), later steps feed the argmax of the previous step's logits and the assistant's projected
state, always at position `pos`, attending to the target's K/V of positions `0..pos` (the last
sliding and the last full non-shared layer) — we pass those K/V explicitly (a full-length cache,
so chains past the sliding window are well defined). `greedy` is the target's own greedy
continuation of `tokens`; `assisted_greedy` is `model.generate(..., assistant_model=...)`'s
(transformers needs a target that returns `shared_kv_states`, i.e. one with KV-sharing layers).

The script refuses an ill-conditioned fixture (a draft step whose torch f32 logits differ from
the same chain in float64 by NMSE > 1e-9): the chain feeds the assistant's projected state back
into itself, which with plain random weights amplifies f32 rounding ~10x per step, so the
assistant's post-projection is scaled by 0.1 and its q-norm weights by head_dim^-1/4.
"""

import json
import os
import sys

import numpy as np
import torch
import transformers
from transformers import DynamicCache, Gemma4ForCausalLM, Gemma4TextConfig
from transformers.models.gemma4_assistant import (Gemma4AssistantConfig,
                                                   Gemma4AssistantForCausalLM)

# Trap (transformers 5.23): `Gemma4TextConfig.kv_sharing_modes` raises for a config whose layers are
# *all* KV-shared ("The set of layer types producing a cache is different…"), which is exactly what
# Gemma4AssistantConfig makes of its text config, so no assistant can be built. Every layer of an
# assistant reuses the target's K/V: answer "reuse" for all of them in that case.
_kv_modes = Gemma4TextConfig.kv_sharing_modes


def _kv_modes_fixed(self):
    if self.num_kv_shared_layers and self.num_kv_shared_layers >= self.num_hidden_layers:
        return ["reuse"] * self.num_hidden_layers
    return _kv_modes.fget(self)


Gemma4TextConfig.kv_sharing_modes = property(_kv_modes_fixed)

CACHE = os.environ.get("VELA_CACHE", "/root/.cache/vela")
OUT = os.path.join(CACHE, "golden", "gemma4_assistant")
LLAMA_CPP = os.path.join(CACHE, "llama-cpp-python", "vendor", "llama.cpp")

ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                       "rope_theta": 1_000_000.0},
}

# Targets: the `dense_keqv` / `ple_kvshare` shapes of gen-gemma4-fixtures.py.
DENSE = dict(
    vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
    num_global_key_value_heads=1, attention_k_eq_v=True,
    layer_types=["sliding_attention", "sliding_attention", "full_attention",
                 "sliding_attention", "sliding_attention", "full_attention"],
    sliding_window=16, rope_parameters=ROPE, final_logit_softcapping=30.0,
    hidden_size_per_layer_input=0, vocab_size_per_layer_input=256, num_kv_shared_layers=0,
)
KVSHARE = dict(
    vocab_size=256, hidden_size=64, intermediate_size=80, num_hidden_layers=7,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=24,
    attention_k_eq_v=False,
    layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                 "full_attention", "sliding_attention", "full_attention"],
    sliding_window=16,
    rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 5_000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5,
                           "rope_theta": 100_000.0},
    },
    final_logit_softcapping=None, hidden_size_per_layer_input=16, vocab_size_per_layer_input=256,
    num_kv_shared_layers=3, use_double_wide_mlp=True,
)

# The 12B attention geometry (16 query heads; sliding 8 kv heads × 256; full k_eq_v 1 kv head ×
# 512, proportional RoPE 0.25) on a narrow residual stream, as realdims_12b in
# gen-gemma4-fixtures.py: the assistant's query-only attention at the real head sizes.
REALDIMS = dict(
    vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=6,
    num_attention_heads=16, num_key_value_heads=8, head_dim=256, global_head_dim=512,
    num_global_key_value_heads=1, attention_k_eq_v=True,
    layer_types=["sliding_attention"] * 5 + ["full_attention"], sliding_window=16,
    rope_parameters=ROPE, final_logit_softcapping=30.0, hidden_size_per_layer_input=0,
    vocab_size_per_layer_input=512, num_kv_shared_layers=0,
)


def assistant_text(target: dict, hidden: int, heads: int, ff: int) -> dict:
    """An assistant text config whose query-only layers match the target's K/V geometry:
    3 sliding + 1 full layer (as the official assistants), every layer KV-shared."""
    full_kv = target.get("num_global_key_value_heads") if target.get("attention_k_eq_v") else None
    return dict(
        vocab_size=target["vocab_size"], hidden_size=hidden, intermediate_size=ff,
        num_hidden_layers=4, num_attention_heads=heads,
        num_key_value_heads=target["num_key_value_heads"], head_dim=target["head_dim"],
        global_head_dim=target["global_head_dim"],
        num_global_key_value_heads=full_kv or target["num_key_value_heads"],
        attention_k_eq_v=True,  # only selects the full layers' kv-head count here
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        sliding_window=target["sliding_window"], rope_parameters=target["rope_parameters"],
        final_logit_softcapping=None, hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=0, num_kv_shared_layers=4,
    )


FIXTURES = {
    # Dense k_eq_v target, plain tied lm_head assistant.
    "dense": dict(target=DENSE, hidden=32, heads=4, ff=64, ordered=None),
    # KV-sharing + PLE target, assistant with ordered embeddings (16 centroids of 16 tokens,
    # top 4 centroids → 64 of 256 tokens scored per step).
    "ordered": dict(target=KVSHARE, hidden=48, heads=2, ff=96, ordered=(16, 4)),
    # Real 12B head geometry, 16 query heads in the assistant too, ordered embeddings
    # (32 centroids of 16 tokens, top 8).
    "realdims": dict(target=REALDIMS, hidden=64, heads=16, ff=128, ordered=(32, 8)),
}

N_TOKENS = 40
CHAIN_POS = [1, 9, 17, 39]  # before / just past / well past the window of 16
CHAIN_STEPS = 4
N_GREEDY = 24


def randomize(model: torch.nn.Module, gen: torch.Generator, qk_scale: bool = False) -> None:
    """Random weights that keep activations O(1); norms and scalars around 1 (q/k norms
    × head_dim^-1/4 with `qk_scale`, so q·k stays O(1) at head dims 256/512)."""
    with torch.no_grad():
        for name, p in list(model.named_parameters()):
            if not p.is_floating_point():
                continue
            if name.endswith("layer_scalar"):
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
            elif "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
                if qk_scale and ("q_norm" in name or "k_norm" in name):
                    p.mul_(p.shape[-1] ** -0.25)
            elif "embed_tokens" in name and p.dim() == 2:
                p.copy_(0.5 * torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)


def target_pass(model, ids):
    """Logits, post-norm hidden states and a full-length K/V cache of every layer."""
    cache = DynamicCache()  # no config: every layer keeps all positions (no sliding ring)
    out = model(torch.tensor([ids]), past_key_values=cache, use_cache=True,
                output_hidden_states=True)
    return out.logits[0], out.hidden_states[-1][0], cache


def producers(cfg: Gemma4TextConfig) -> dict:
    """Last non-KV-shared layer of each type (the layers the assistant reads)."""
    first_shared = cfg.num_hidden_layers - (cfg.num_kv_shared_layers or 0)
    return {t: max(i for i in range(first_shared) if cfg.layer_types[i] == t)
            for t in ("sliding_attention", "full_attention")}


def build(name: str, fx: dict) -> None:
    d = os.path.join(OUT, name)
    os.makedirs(os.path.join(d, "target"), exist_ok=True)
    os.makedirs(os.path.join(d, "assistant"), exist_ok=True)
    torch.manual_seed(0)
    tkw = dict(fx["target"])
    tcfg = Gemma4TextConfig(**tkw)
    tcfg._attn_implementation = "eager"
    target = Gemma4ForCausalLM(tcfg).eval().float()
    randomize(target, torch.Generator().manual_seed(1234), qk_scale=tkw["head_dim"] >= 128)
    target.tie_weights()
    target.save_pretrained(os.path.join(d, "target"), safe_serialization=True)

    akw = assistant_text(tkw, fx["hidden"], fx["heads"], fx["ff"])
    atext = Gemma4TextConfig(**akw)
    extra = {}
    if fx["ordered"]:
        extra = dict(use_ordered_embeddings=True, num_centroids=fx["ordered"][0],
                     centroid_intermediate_top_k=fx["ordered"][1])
    acfg = Gemma4AssistantConfig(text_config=atext, backbone_hidden_size=tkw["hidden_size"],
                                 **extra)
    acfg._attn_implementation = "eager"
    acfg.text_config._attn_implementation = "eager"
    asst = Gemma4AssistantForCausalLM(acfg).eval().float()
    randomize(asst, torch.Generator().manual_seed(4321))
    with torch.no_grad():
        # The draft chain feeds W_post·y back through W_pre: with plain 1/sqrt(fan_in) weights
        # that loop has a gain of ~3 per step and amplifies f32 rounding ~10x (in NMSE) per
        # step, so later steps would measure the fixture's conditioning, not the code.
        asst.post_projection.weight.mul_(0.1)
        # Softer attention (q·k of O(1) as in trained models; random ~1 q norms give sharp
        # softmaxes whose f32 rounding dominates after a few steps).
        for n_, p in asst.named_parameters():
            if "q_norm" in n_:
                p.mul_(p.shape[-1] ** -0.25)
    if fx["ordered"]:
        perm = torch.randperm(tkw["vocab_size"], generator=torch.Generator().manual_seed(99))
        asst.masked_embedding.token_ordering.copy_(perm)
    asst.tie_weights()
    asst.save_pretrained(os.path.join(d, "assistant"), safe_serialization=True)
    asst = Gemma4AssistantForCausalLM.from_pretrained(os.path.join(d, "assistant"),
                                                      attn_implementation="eager").eval().float()

    rng = np.random.default_rng(11)
    tokens = [int(t) for t in rng.integers(3, tkw["vocab_size"], N_TOKENS)]
    prod = producers(tcfg)
    embed = target.get_input_embeddings()
    chains, drafts = [], []
    import copy
    target64, asst64 = copy.deepcopy(target).double(), copy.deepcopy(asst).double()
    cond = 0.0
    with torch.no_grad():
        logits, hidden, cache = target_pass(target, tokens)
        _, hidden64, cache64 = target_pass(target64, tokens)
        for pos in CHAIN_POS:
            kv = {t: (cache.layers[j].keys[:, :, :pos], cache.layers[j].values[:, :, :pos])
                  for t, j in prod.items()}
            tok = torch.tensor([[tokens[pos]]])
            h = hidden[pos - 1].view(1, 1, -1)
            steps = []
            for _ in range(CHAIN_STEPS):
                emb = torch.cat([embed(tok), h], dim=-1)
                o = asst(inputs_embeds=emb, position_ids=torch.tensor([[pos]]),
                         shared_kv_states=kv, use_cache=False)
                steps.append(o.logits[0, 0])
                tok = o.logits.argmax(-1)
                h = o.last_hidden_state
            drafts.append(torch.stack(steps))
            # The same chain in float64: f32 rounding alone must stay far below the test bound.
            h64, tok64 = hidden64[pos - 1].view(1, 1, -1), torch.tensor([[tokens[pos]]])
            kv64 = {t: (cache64.layers[j].keys[:, :, :pos], cache64.layers[j].values[:, :, :pos])
                    for t, j in prod.items()}
            for s_i in range(CHAIN_STEPS):
                emb = torch.cat([target64.get_input_embeddings()(tok64), h64], dim=-1)
                o = asst64(inputs_embeds=emb, position_ids=torch.tensor([[pos]]),
                           shared_kv_states=kv64, use_cache=False)
                ref = o.logits[0, 0]
                e = float(((steps[s_i].double() - ref) ** 2).sum() / (ref ** 2).sum())
                cond = max(cond, e)
                tok64 = steps[s_i].argmax().view(1, 1)
                h64 = o.last_hidden_state
            chains.append({"pos": pos, "steps": CHAIN_STEPS})
        seq = list(tokens[:12])
        greedy = []
        for _ in range(N_GREEDY):
            nxt = int(target(torch.tensor([seq]), use_cache=False,
                             output_hidden_states=True).logits[0, -1].argmax())
            greedy.append(nxt)
            seq.append(nxt)
        assisted = None
        try:
            asst.generation_config.num_assistant_tokens = 3
            g = target.generate(torch.tensor([tokens[:12]]), assistant_model=asst,
                                max_new_tokens=N_GREEDY, do_sample=False)
            assisted = [int(t) for t in g[0, 12:]]
        except Exception as e:  # dense targets return no shared_kv_states in transformers
            print(f"  {name}: transformers assisted generation unavailable: {type(e).__name__}: "
                  f"{str(e)[:120]}")
    if cond > 1e-9:
        sys.exit(f"{name}: ill-conditioned draft chain, torch f32 vs f64 NMSE {cond:.2e} > 1e-9")
    logits.numpy().astype("<f4").tofile(os.path.join(d, "target_logits.f32"))
    torch.stack(drafts).numpy().astype("<f4").tofile(os.path.join(d, "draft_logits.f32"))
    with open(os.path.join(d, "tokens.json"), "w") as f:
        json.dump({"tokens": tokens, "chains": chains, "greedy_prompt_len": 12,
                   "greedy": greedy, "assisted_greedy": assisted}, f)
    meta = {"transformers": transformers.__version__, "torch": torch.__version__,
            "target_kwargs": tkw, "assistant_text_kwargs": akw, "ordered": fx["ordered"],
            "producers": prod, "draft_f32_vs_f64_worst_nmse": cond}
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1, default=str)
    print(f"{name}: drafts {tuple(torch.stack(drafts).shape)} (f32 vs f64 NMSE {cond:.1e}), "
          f"greedy {greedy}, assisted {assisted}")


def to_gguf(d: str) -> None:
    """The assistant through llama.cpp's converter (synthetic `<tN>` vocabulary, as in
    gen-gemma4-fixtures.py); leaves no file when the converter refuses."""
    import shutil
    import tempfile
    if not os.path.exists(os.path.join(LLAMA_CPP, "convert_hf_to_gguf.py")):
        print(f"  no assistant GGUF: llama.cpp source not found at {LLAMA_CPP}")
        return
    sys.path[:0] = [LLAMA_CPP, os.path.join(LLAMA_CPP, "gguf-py")]
    import convert_hf_to_gguf
    from conversion import gemma

    def set_vocab(self):
        n = self.hparams["vocab_size"]
        self.gguf_writer.add_tokenizer_model("gemma4")
        self.gguf_writer.add_token_list([f"<t{i}>".encode() for i in range(n)])
        self.gguf_writer.add_token_scores([0.0] * n)
        self.gguf_writer.add_token_types([1] * n)

    gemma.Gemma4Model.set_vocab = set_vocab
    src = os.path.join(d, "assistant")
    out = os.path.join(d, "assistant.gguf")
    with tempfile.TemporaryDirectory() as tmp:
        for f in ("config.json", "model.safetensors"):
            shutil.copy(os.path.join(src, f), tmp)
        n = json.load(open(os.path.join(src, "config.json")))["text_config"]["vocab_size"]
        with open(os.path.join(tmp, "tokenizer.json"), "w") as f:
            json.dump({"model": {"type": "BPE", "vocab": {f"<t{i}>": i for i in range(n)}},
                       "added_tokens": []}, f)
        argv = sys.argv
        try:
            sys.argv = ["convert", tmp, "--outfile", out, "--outtype", "f32"]
            convert_hf_to_gguf.main()
        except BaseException as e:  # noqa: BLE001 — the converter exits on refusal
            print(f"  no assistant GGUF: {type(e).__name__}: {e}")
            if os.path.exists(out):
                os.remove(out)
        finally:
            sys.argv = argv


def main() -> None:
    only = sys.argv[1:]
    for name, fx in FIXTURES.items():
        if only and name not in only:
            continue
        build(name, fx)
        to_gguf(os.path.join(OUT, name))


if __name__ == "__main__":
    main()
