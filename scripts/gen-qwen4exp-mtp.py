#!/usr/bin/env python3
# vela-venv: torch
"""A qwen4_exp checkpoint with an MTP layer, and the MTP head's outputs computed with transformers
5.23's own modules (HF drops `mtp.*` when it loads a checkpoint, so the head is assembled here from
the classes HF uses for the trunk; its structure is ../shared/notes/next-archs.md §1 "MTP").

Run after scripts/gen-qwen4exp-fixtures.py (it starts from that script's `gdn_qsa` fixture):

    $VELA_CACHE/venv-torch/bin/python scripts/gen-qwen4exp-mtp.py     (scripts/prepare-test-data.sh)

The head, for the target's pre-mixer streams X_r ([S·H]: the input of the trunk's
hyper_connection_mixer at position r) and the token t_{r+1} that follows position r:

    ep  = fc_embedding(rms1p_emb(E[t_{r+1}]))                        [H]
    hn  = rms1p_hidden(X_r)              one RMS over all S·H values  [S·H]
    x_s = fc_hidden(hn_s) + ep           every stream s               [S·H]
    O   = DecoderLayer(x)                one QSA + MoE layer with its two hyper-connections, no PLE;
                                         row r sits at RoPE position r; causal over the head's rows
    logits = lm_head(mtp.hyper_connection_mixer(O))                  (the target's lm_head, E)

A chained draft feeds the head's own O of the previous row as X. Output in
$VELA_CACHE/golden/qwen4exp/mtp/ (~3 MB):

    config.json, tokenizer*, prompts.json   as gdn_qsa (+ "mtp_num_hidden_layers": 1)
    model.safetensors                        gdn_qsa's tensors + the head's `mtp.*` tensors (experts
                                             per expert, as HF writes the trunk's)
    mtp_rows_long.f32     f32 [T-1, vocab]: the head's logits for rows r = 0..T-2 of prompts["long"]
                          (X_r, t_{r+1}), one causal pass over those rows (what a first draft reads
                          after the target evaluated long[:r+1] and sampled long[r+1])
    mtp_chain.json        for n in CHAIN_N: target evaluated long[:n], `last` = long[n]; K greedy
                          drafts, each row's input the previous row's O and the previous draft
    mtp_chain_<n>.f32     f32 [K, vocab]: the logits of those K drafts
    meta.json             seeds, margins (indexer cutoff, router, greedy top-2), versions

The head's weights are random with the trunk's recipe; the weight seed is bumped until the indexer's
top-k cutoff, the router's top-k and every greedy draft have a margin (as for the trunk fixtures).
"""

import copy
import importlib.util
import json
import math
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import Qwen4ExpForCausalLM
from transformers.models.qwen4_exp import modeling_qwen4_exp as mq

torch.set_num_threads(1)

VELA_CACHE = os.environ.get("VELA_CACHE", os.path.expanduser("~/.cache/vela"))
ROOT = os.path.join(VELA_CACHE, "golden", "qwen4exp")
SRC, OUT = os.path.join(ROOT, "gdn_qsa"), os.path.join(ROOT, "mtp")
K = 4
CHAIN_N = [1, 5, 37, 64, 100, 127]
GREEDY_MIN_GAP = 1e-4

_spec = importlib.util.spec_from_file_location(
    "fixtures", os.path.join(os.path.dirname(os.path.abspath(__file__)), "gen-qwen4exp-fixtures.py"))
fx = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fx)


class Mtp(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, s = cfg.hidden_size, cfg.hc_count
        self.h, self.s = h, s
        self.pre_fc_norm_embedding = mq.Qwen4ExpTextRMSNorm(h, eps=cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = mq.Qwen4ExpTextRMSNorm(s * h, eps=cfg.rms_norm_eps)
        self.fc_embedding = nn.Linear(h, h, bias=False)
        self.fc_hidden = nn.Linear(h, h, bias=False)
        one = copy.deepcopy(cfg)
        one.num_hidden_layers = 1
        one.layer_types = ["indexed_attention"]
        one.ple_layer_ids = []
        self.layers = nn.ModuleList([mq.Qwen4ExpTextDecoderLayer(one, 0)])
        self.hyper_connection_mixer = mq.Qwen4ExpTextGatedResidual(cfg, use_combine=False)

    def inputs(self, x, tokens, embed):
        n = x.shape[0]
        ep = self.fc_embedding(self.pre_fc_norm_embedding(embed(torch.tensor(tokens))))
        hn = self.pre_fc_norm_hidden(x).view(n, self.s, self.h)
        return (self.fc_hidden(hn) + ep[:, None, :]).reshape(n, self.s * self.h)

    def layer(self, x, rotary):
        n = x.shape[0]
        pos = torch.arange(n).view(1, 1, -1).expand(3, 1, -1)
        pe = rotary(x[None], pos)
        mask = torch.full((n, n), torch.finfo(torch.float32).min).triu(1)[None, None]
        return self.layers[0](x[None], position_embeddings=pe, attention_mask=mask)[0]

    def logits(self, o, head):
        return head(self.hyper_connection_mixer(o))


def checkpoint_tensors(mtp: Mtp, cfg) -> dict:
    """The head's tensors named as a checkpoint stores them (experts one by one)."""
    out = {}
    f = cfg.moe_intermediate_size
    for k, v in mtp.state_dict().items():
        if k.endswith("mlp.experts.gate_up_proj"):
            base = k[: -len("gate_up_proj")]
            for e in range(v.shape[0]):
                out[f"mtp.{base}{e}.gate_proj.weight"] = v[e, :f].contiguous()
                out[f"mtp.{base}{e}.up_proj.weight"] = v[e, f:].contiguous()
        elif k.endswith("mlp.experts.down_proj"):
            base = k[: -len("down_proj")]
            for e in range(v.shape[0]):
                out[f"mtp.{base}{e}.down_proj.weight"] = v[e].contiguous()
        else:
            out[f"mtp.{k}"] = v.contiguous()
    return out


def candidate(model, cfg, long, x_long, seed):
    torch.manual_seed(0)
    mtp = Mtp(cfg).eval().float()
    fx.randomize(mtp, torch.Generator().manual_seed(seed))
    probe = fx.Probe(mtp)
    embed, head, rotary = model.model.embed_tokens, model.lm_head, model.model.rotary_emb
    r = {"seed": seed, "mtp": mtp}
    with torch.no_grad():
        rows = mtp.inputs(x_long[:-1], long[1:], embed)  # row r: (X_r, t_{r+1})
        r["rows"] = mtp.logits(mtp.layer(rows, rotary), head)
        r["chain"] = {}
        for n in CHAIN_N:
            cur = rows[:n]
            toks, lgs = [], []
            for j in range(K):
                o = mtp.layer(cur, rotary)
                lg = mtp.logits(o[-1:], head)[0]
                top2 = lg.topk(2).values
                if float(top2[0] - top2[1]) < GREEDY_MIN_GAP:
                    return None, f"chain {n} draft {j}: greedy gap {float(top2[0] - top2[1]):.1e}"
                d = int(lg.argmax())
                toks.append(d)
                lgs.append(lg)
                cur = torch.cat([cur, mtp.inputs(o[-1:], [d], embed)])
            r["chain"][n] = (toks, torch.stack(lgs))
    g = probe.min_qsa_gap()
    if probe.router_gap < fx.ROUTER_MIN_GAP or (g is not None and g < fx.QSA_MIN_GAP):
        return None, f"router gap {probe.router_gap:.1e}, QSA gap {g}"
    r["qsa_gap"], r["router_gap"] = g, probe.router_gap
    for h in probe.hooks:
        h.remove()
    return r, None


def main() -> None:
    if not os.path.isfile(os.path.join(SRC, "model.safetensors")):
        sys.exit(f"{SRC} missing: run scripts/gen-qwen4exp-fixtures.py first")
    model = Qwen4ExpForCausalLM.from_pretrained(SRC, dtype=torch.float32, attn_implementation="eager",
                                                experts_implementation="eager").eval()
    cfg = model.config
    prompts = json.load(open(os.path.join(SRC, "prompts.json")))
    long = prompts["prompts"]["long"]
    cap = []
    hook = model.model.hyper_connection_mixer.register_forward_pre_hook(
        lambda m, a: cap.append(a[0][0].detach().clone()))
    with torch.no_grad():
        model(torch.tensor([long]), use_cache=False)
    hook.remove()
    x_long = cap[0]  # [T, S·H] pre-mixer streams
    for seed in range(4321, 4321 + 40):
        r, why = candidate(model, cfg, long, x_long, seed)
        if r is not None:
            break
        print(f"  mtp: seed {seed} rejected: {why}")
    else:
        sys.exit("mtp: no seed with clear margins")

    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    for f in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "prompts.json"):
        shutil.copy(os.path.join(SRC, f), OUT)
    cj = json.load(open(os.path.join(OUT, "config.json")))
    cj["mtp_num_hidden_layers"] = 1
    json.dump(cj, open(os.path.join(OUT, "config.json"), "w"), indent=2)
    tensors = load_file(os.path.join(SRC, "model.safetensors"))
    tensors.update(checkpoint_tensors(r["mtp"], cfg))
    save_file(tensors, os.path.join(OUT, "model.safetensors"), metadata={"format": "pt"})
    files = {"mtp_rows_long.f32": fx.write_f32(os.path.join(OUT, "mtp_rows_long.f32"), r["rows"])}
    chain = {}
    for n, (toks, lgs) in r["chain"].items():
        files[f"mtp_chain_{n}.f32"] = fx.write_f32(os.path.join(OUT, f"mtp_chain_{n}.f32"), lgs)
        chain[str(n)] = {"last": long[n], "drafts": toks}
    json.dump({"k": K, "chains": chain}, open(os.path.join(OUT, "mtp_chain.json"), "w"), indent=1)
    meta = {"source": "gdn_qsa", "seed": r["seed"], "files": files, "min_qsa_cutoff_gap": r["qsa_gap"],
            "min_router_gap": r["router_gap"], "greedy_min_gap": GREEDY_MIN_GAP,
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}
    json.dump(meta, open(os.path.join(OUT, "meta.json"), "w"), indent=1)
    print(f"done: {OUT} (seed {r['seed']}, QSA gap {r['qsa_gap']}, router gap {r['router_gap']:.1e})")


if __name__ == "__main__":
    main()
