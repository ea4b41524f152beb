#!/usr/bin/env python3
# vela-venv: torch
"""A deepseek_v4 checkpoint in the release's storage with an MTP block, and the MTP block's outputs
computed with transformers 5.23's own modules (HF drops `mtp.*` when it loads a checkpoint, so the
block is assembled here from the classes HF uses for the trunk; its structure is the upstream
`MTPBlock`, DeepSeek's inference/model.py 738-767, ../shared/notes/next-archs.md §2 "MTP").

Run after scripts/gen-deepseekv4-fixtures.py (it starts from that script's `flash_mini` fixture and
its release-storage conversion, the one `flash_mini_fp8` holds):

    $VELA_CACHE/venv-torch/bin/python scripts/gen-deepseekv4-mtp.py     (scripts/prepare-test-data.sh)

The block, for the target's residual streams X_r ([S, H]: the input of the trunk's hc_head at
position r) and the token t_{r+1} that follows position r:

    e   = e_proj(enorm(E[t_{r+1}]))                                   [H]
    x_s = h_proj(hnorm(X_r,s)) + e       every stream s; hnorm an RMSNorm over one stream [S, H]
    O   = DecoderLayer(x)                one DeepSeek V4 layer: mHC for attention and FFN, sliding-
                                         window attention only (main rope), top-k (non-hash) MoE with
                                         the shared expert; row r sits at RoPE position r and reads
                                         the block's rows r-W+1..r (W = sliding_window)
    logits = head(norm(hc_head_mtp(O)))  its own hc_head and norm, the target's head

(DeepSeek-V3's MTP module k likewise runs its block over the rows i = 1..T-k at positions i.) A
chained draft feeds the block's own O of the previous row as X. Output in
$VELA_CACHE/golden/deepseekv4/mtp/ (~5 MB):

    config.json, tokenizer*, prompts.json   flash_mini_fp8's (release keys, num_nextn_predict_layers 1)
    model.safetensors     flash_mini_fp8's trunk + this `mtp.0.*` block, stored as the release stores
                          them (FP8 e4m3 + ue8m0 128x128 scales, MXFP4 experts, BF16, F32)
    logits_long.f32       f32 [T, vocab]: the trunk's logits of prompts["long"] (flash_mini_fp8's)
    mtp_rows_long.f32     f32 [T-1, vocab]: the block's logits for rows r = 0..T-2 of prompts["long"]
                          (X_r, t_{r+1}), one pass over those rows (what a first draft reads after the
                          target evaluated long[:r+1] and sampled long[r+1])
    mtp_chain.json        for n in CHAIN_N: target evaluated long[:n], `last` = long[n]; K greedy
                          drafts, each row's input the previous row's O and the previous draft
    mtp_chain_<n>.f32     f32 [K, vocab]: the logits of those K drafts
    model-llamacpp.gguf   llama.cpp 0c1e570 convert_hf_to_gguf.py --outtype f32 of this directory
    mtp-model-llamacpp.gguf  the same converter with --mtp: the block alone (e_proj | h_proj as
                          nextn.eh_proj, requantized to Q8_0 like every FP8 matrix; its hc_head as the
                          root output_hc_*; its norm as nextn.shared_head_norm)
    mtp_rows_long_gguf.f32  mtp_rows_long with the GGUFs' values of the matrices the converter
                          requantized (trunk and block; every other tensor holds the release's values)
    meta.json             seeds, margins (router top-k, greedy top-2), versions

The block's weights are random with the trunk's recipe (random gammas, mHC scales and bases, sinks,
router bias); the weight seed is bumped until the router's top-k and every greedy draft have a
margin, in the release's and in the GGUFs' values.
"""

import copy
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import torch
import transformers
from safetensors.torch import save_file
from torch import nn
from transformers import DeepseekV4ForCausalLM
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as md

torch.set_num_threads(1)

_spec = importlib.util.spec_from_file_location(
    "fixtures", os.path.join(os.path.dirname(os.path.abspath(__file__)), "gen-deepseekv4-fixtures.py"))
fx = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fx)

SRC, OUT = os.path.join(fx.OUT, fx.FP8_FROM), os.path.join(fx.OUT, "mtp")
K = 4
# Window 32: chains inside the first window, across its edge and far past it (the last token).
CHAIN_N = [1, 5, 33, 64, 150, 299]


class Mtp(nn.Module):
    """The upstream MTPBlock from transformers' modules (embedding and head are the target's)."""

    def __init__(self, cfg):
        super().__init__()
        h = cfg.hidden_size
        self.window = cfg.sliding_window
        self.e_proj = nn.Linear(h, h, bias=False)
        self.h_proj = nn.Linear(h, h, bias=False)
        self.enorm = md.DeepseekV4RMSNorm(h, eps=cfg.rms_norm_eps)
        self.hnorm = md.DeepseekV4RMSNorm(h, eps=cfg.rms_norm_eps)
        self.norm = md.DeepseekV4RMSNorm(h, eps=cfg.rms_norm_eps)
        one = copy.deepcopy(cfg)
        one.num_hidden_layers = 1
        one.layer_types = ["sliding_attention"]
        one.mlp_layer_types = ["moe"]
        self.block = md.DeepseekV4DecoderLayer(one, 0)
        self.hc_head = md.DeepseekV4HyperHead(cfg)

    def inputs(self, x, tokens, embed):
        """x [n, S, H] streams, tokens [n] -> the block's input streams [n, S, H]."""
        e = self.e_proj(self.enorm(embed(torch.tensor(tokens))))
        return self.h_proj(self.hnorm(x)) + e[:, None, :]

    def layer(self, x, rotary):
        """The block over rows 0..n-1 at positions 0..n-1 (sliding causal mask)."""
        n = x.shape[0]
        pos = torch.arange(n)[None]
        pe = {k: rotary(x, pos, layer_type=k) for k in ("main", "compress")}
        i = torch.arange(n)
        d = i[:, None] - i[None, :]
        mask = torch.where((d >= 0) & (d < self.window), 0.0, torch.finfo(torch.float32).min)[None, None]
        return self.block(x[None], position_embeddings=pe, position_ids=pos, attention_mask=mask,
                          input_ids=None, past_key_values=None)[0]

    def logits(self, o, head):
        return head(self.norm(self.hc_head(o[None])))[0]


def release_tensors(mtp: Mtp, cfg, gen: torch.Generator) -> "fx.Release":
    """The block in the release's names (`mtp.0.*`) and storage; `ref` is its dequantization as a
    state dict of `mtp`."""
    rel = fx.Release()
    rel.fp8("mtp.0.e_proj", "e_proj.weight", mtp.e_proj.weight)
    rel.fp8("mtp.0.h_proj", "h_proj.weight", mtp.h_proj.weight)
    for nm in ("enorm", "hnorm", "norm"):
        rel.bf16(f"mtp.0.{nm}.weight", f"{nm}.weight", getattr(mtp, nm).weight)
    for leaf in ("fn", "base", "scale"):
        rel.f32(f"mtp.0.hc_head_{leaf}", f"hc_head.hc_{leaf}", getattr(mtp.hc_head, f"hc_{leaf}"))
    rel.layer(mtp.block, "mtp.0.", "block.", cfg, gen)
    return rel


def streams(model, ids):
    """The trunk's residual streams before hc_head, [T, S, H]."""
    cap = []
    hook = model.model.hc_head.register_forward_pre_hook(lambda m, a: cap.append(a[0][0].detach().clone()))
    with torch.no_grad():
        lg = fx.logits_nocache(model, ids)
    hook.remove()
    return cap[0], lg


def rows_and_chains(model, mtp, long, x, chains: bool):
    """The block's logits for every row of `long`, and (with `chains`) the greedy chains; the
    smallest router gap and greedy top-2 gap seen."""
    probe = fx.Probe(mtp)
    embed, head, rotary = model.model.embed_tokens, model.lm_head, model.model.rotary_emb
    out = {"chain": {}, "greedy_gap": math.inf}
    with torch.no_grad():
        rows = mtp.inputs(x[:-1], long[1:], embed)  # row r: (X_r, t_{r+1})
        out["rows"] = mtp.logits(mtp.layer(rows, rotary), head)
        for n in CHAIN_N if chains else []:
            cur = rows[:n]
            toks, lgs = [], []
            for _ in range(K):
                o = mtp.layer(cur, rotary)
                lg = mtp.logits(o[-1:], head)[0]
                top2 = lg.topk(2).values
                out["greedy_gap"] = min(out["greedy_gap"], float(top2[0] - top2[1]))
                d = int(lg.argmax())
                toks.append(d)
                lgs.append(lg)
                cur = torch.cat([cur, mtp.inputs(o[-1:], [d], embed)])
            out["chain"][n] = (toks, torch.stack(lgs))
    out["router_gap"] = probe.router_gap
    for h in probe.hooks:
        h.remove()
    return out


def gguf_values(d: str) -> dict:
    """The Q8_0 tensors of both GGUFs, dequantized by llama.cpp's gguf-py (in a child process)."""
    r = subprocess.run([sys.executable, fx.__file__, "--gguf-values", d], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"reading the GGUF failed:\n{r.stderr[-3000:]}")
    vals = torch.load(os.path.join(d, ".gguf-values.pt"))
    os.remove(os.path.join(d, ".gguf-values.pt"))
    return vals


def convert(d: str, mtp: bool) -> dict:
    args = [sys.executable, fx.__file__, "--gguf-child", d] + (["--mtp"] if mtp else [])
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"llama.cpp's converter failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    if not os.path.isfile(os.path.join(SRC, "model.safetensors")):
        sys.exit(f"{SRC} missing: run scripts/gen-deepseekv4-fixtures.py first")
    kw = fx.FIXTURES[fx.FP8_FROM]
    model = DeepseekV4ForCausalLM.from_pretrained(SRC, dtype=torch.float32, attn_implementation="eager",
                                                  experts_implementation="eager").eval()
    cfg = model.config
    # the trunk in the release's storage (flash_mini_fp8's tensors) and its dequantized weights
    trunk_sd, trunk_ref, _, fp8_mtp = fx.release_layout(model, cfg, torch.Generator().manual_seed(fx.FP8_SEED))
    trunk_fp8 = dict(fx.FP8_HF)
    for k in fp8_mtp:
        del trunk_sd[k]
    model.load_state_dict(trunk_ref, strict=True)
    prompts = fx.prompts_for()
    long = prompts["long"]
    x_long, trunk_logits = streams(model, long)

    for seed in range(4321, 4321 + 40):
        torch.manual_seed(0)
        mtp = Mtp(cfg).eval().float()
        fx.randomize(mtp, cfg, torch.Generator().manual_seed(seed))
        rel = release_tensors(mtp, cfg, torch.Generator().manual_seed(seed))
        missing = set(mtp.state_dict()) - set(rel.ref)
        assert not missing, f"release layout misses {sorted(missing)}"
        mtp.load_state_dict(rel.ref, strict=True)
        r = rows_and_chains(model, mtp, long, x_long, True)
        if r["router_gap"] < fx.ROUTER_MIN_GAP or r["greedy_gap"] < fx.GREEDY_MIN_GAP:
            print(f"  mtp: seed {seed} rejected: router gap {r['router_gap']:.1e}, greedy gap {r['greedy_gap']:.1e}")
            continue

        if os.path.isdir(OUT):
            shutil.rmtree(OUT)
        os.makedirs(OUT)
        json.dump(fx.release_config_json(kw, cfg), open(os.path.join(OUT, "config.json"), "w"), indent=2)
        fx.synthetic_tokenizer(OUT, cfg.vocab_size)
        json.dump({"prompts": prompts}, open(os.path.join(OUT, "prompts.json"), "w"))
        save_file({k: v.contiguous() for k, v in {**trunk_sd, **rel.sd}.items()},
                  os.path.join(OUT, "model.safetensors"), metadata={"format": "pt"})
        gguf = {"model": convert(OUT, False), "mtp": convert(OUT, True)}

        # the same forward with the GGUFs' values of the requantized matrices
        vals = gguf_values(OUT)
        L, H = cfg.num_hidden_layers, cfg.hidden_size
        gref = dict(trunk_ref)
        for up, hf in trunk_fp8.items():
            i, rest = up.removeprefix("layers.").split(".", 1)
            gref[hf] = vals[f"blk.{i}.{fx.GGUF_FP8[rest.removesuffix('.weight')]}.weight"]
        gmodel = DeepseekV4ForCausalLM(cfg).eval()
        gmodel.load_state_dict(gref, strict=True)
        mref = dict(rel.ref)
        eh = vals[f"blk.{L}.nextn.eh_proj.weight"]
        mref["e_proj.weight"], mref["h_proj.weight"] = eh[:, :H], eh[:, H:]
        for up, hf in rel.fp8_hf.items():
            rest = up.removeprefix("mtp.0.").removesuffix(".weight")
            if rest in fx.GGUF_FP8:
                mref[hf] = vals[f"blk.{L}.{fx.GGUF_FP8[rest]}.weight"]
        assert len([k for k in rel.fp8_hf if k.removeprefix("mtp.0.").removesuffix(".weight") in fx.GGUF_FP8]) \
            == len(rel.fp8_hf) - 2, "every FP8 matrix of the block has a GGUF counterpart"
        gmtp = copy.deepcopy(mtp)
        gmtp.load_state_dict(mref, strict=True)
        gx, _ = streams(gmodel, long)
        g = rows_and_chains(gmodel, gmtp, long, gx, False)
        if g["router_gap"] < fx.ROUTER_MIN_GAP:
            print(f"  mtp: seed {seed} rejected: router gap {g['router_gap']:.1e} with the GGUF values")
            continue
        break
    else:
        sys.exit("mtp: no seed with clear margins")

    files = {"logits_long.f32": fx.write_f32(os.path.join(OUT, "logits_long.f32"), trunk_logits),
             "mtp_rows_long.f32": fx.write_f32(os.path.join(OUT, "mtp_rows_long.f32"), r["rows"]),
             "mtp_rows_long_gguf.f32": fx.write_f32(os.path.join(OUT, "mtp_rows_long_gguf.f32"), g["rows"])}
    chain = {}
    for n, (toks, lgs) in r["chain"].items():
        files[f"mtp_chain_{n}.f32"] = fx.write_f32(os.path.join(OUT, f"mtp_chain_{n}.f32"), lgs)
        chain[str(n)] = {"last": long[n], "drafts": toks}
    json.dump({"k": K, "chains": chain}, open(os.path.join(OUT, "mtp_chain.json"), "w"), indent=1)
    dev = float((g["rows"] - r["rows"]).abs().max())
    meta = {"source": fx.FP8_FROM + " in the release's storage (flash_mini_fp8's tensors)", "seed": seed,
            "files": files, "min_router_gap": r["router_gap"], "min_router_gap_gguf": g["router_gap"],
            "greedy_min_gap": r["greedy_gap"], "chain_n": CHAIN_N, "k": K, "gguf": gguf,
            "gguf_vs_release_rows_max_abs": dev,
            "mtp_tensors": sorted(rel.sd),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}
    json.dump(meta, open(os.path.join(OUT, "meta.json"), "w"), indent=1)
    print(f"done: {OUT} (seed {seed}, router gap {r['router_gap']:.1e} / GGUF {g['router_gap']:.1e}, greedy gap "
          f"{r['greedy_gap']:.1e}, GGUF rows vs release max |d| {dev:.2e})")


if __name__ == "__main__":
    main()
