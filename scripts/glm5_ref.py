#!/usr/bin/env python3
# vela-venv: torch
"""Independent re-implementation of glm5_next (GLM-5.3-Flash) from docs/glm5-spec.md (not HF code), float64.

    $VELA_CACHE/venv-torch/bin/python scripts/glm5_ref.py [FIXTURE_DIR...]   # default: every fixture

Checks a fixture of scripts/gen-glm5-fixtures.py: the no-cache logits of every prompt (against HF's
f32 and f64 runs), the residual streams of `long`, the DSA indexer's selections, the cached chunked
prefills and the 64 decode steps of `generate`, replayed through this file's own per-sequence state
(KDA conv rows + recurrent state, MLA latent rows, indexer key/gate rows); with an MTP block
(`mtp_rows_long.f32`, spec §9, which neither HF nor llama.cpp runs: `mtp_rows`, here the only
oracle), the block's logits at every row of `long`, in one pass and chunked, and the chained
greedy drafts of `mtp_chain.json`. Reads the checkpoint
names HF writes (the release's names). KDA runs its recurrent form only (the chunked form is the
same function). The only things taken from torch are tensors, matmul and elementwise math. Prints
one line per check; exits non-zero when one fails (logits: worst per-position NMSE <= 1e-9;
selections and greedy tokens: identical).
"""

import json
import math
import os
import sys

import numpy as np
import torch
from safetensors.torch import load_file

torch.set_num_threads(1)
D = torch.float64
KDA, MLA = "linear_attention", "indexed_attention"


# ----------------------------------------------------------------------------------------- config


def parse_config(cj: dict) -> dict:
    """The text fields (nested `text_config` or flat) with HF's defaults (spec §1)."""
    c = dict(cj.get("text_config") or cj)
    n = c.get("num_hidden_layers", 45)
    types = c.get("layer_types") or [MLA if i % 4 == 3 else KDA for i in range(n)]
    types = [MLA if t == "full_attention" else t for t in types[:n]]
    mlp = c.get("mlp_layer_types") or ["dense"] * min(3, n) + ["sparse"] * max(0, n - 3)
    itypes = c.get("indexer_types")
    if itypes is None:
        pat = c.get("index_topk_pattern")
        if pat is not None:
            itypes = [{"F": "full", "S": "shared"}[ch] for ch in pat] if isinstance(pat, str) else list(pat)
        else:
            freq, off = max(c.get("index_topk_freq", 1), 1), c.get("index_skip_topk_offset", 2)
            itypes = ["full" if max(i - off + 1, 0) % freq == 0 else "shared" for i in range(n)]
    lin = {"head_dim": c.get("linear_head_dim", 128), "num_heads": c.get("linear_num_heads", 64),
           "conv": c.get("linear_conv_kernel_dim", 4), "lb": c.get("linear_lower_bound", -5.0)}
    la = c.get("linear_attn_config")
    if la is not None:
        lin["head_dim"] = la.get("head_dim", lin["head_dim"])
        lin["num_heads"] = la.get("num_heads", lin["num_heads"])
        lin["conv"] = la.get("short_conv_kernel_size", lin["conv"])
        lin["lb"] = la.get("gate_lower_bound", lin["lb"])
        if la.get("safe_gate", True) and lin["lb"] is None:
            lin["lb"] = -5.0
    return {
        "n": n, "types": types, "mlp": list(mlp[:n]), "itypes": list(itypes[:n]), "lin": lin,
        "H": c.get("hidden_size", 4096), "V": c.get("vocab_size", 154880), "eps": c.get("rms_norm_eps", 1e-5),
        "nh": c.get("num_attention_heads", 64), "dn": c.get("qk_nope_head_dim", 256), "dv": c.get("v_head_dim", 256),
        "r": c.get("kv_lora_rank", 512), "nI": c.get("index_n_heads", 32), "dI": c.get("index_head_dim", 128),
        "topk": c.get("index_topk", 2048), "kp": c.get("index_kpool", 16),
        "tail": c.get("index_kpool_always_select_tail", True),
        "N": c.get("hc_mult", 4), "iters": c.get("hc_sinkhorn_iters", 20), "hc_eps": c.get("hc_eps", 1e-6),
        "E": c.get("n_routed_experts", 288), "k": c.get("num_experts_per_tok", 8), "groups": c.get("n_group", 1),
        "topk_group": c.get("topk_group", 1), "norm_topk": c.get("norm_topk_prob", True),
        "scale": c.get("routed_scaling_factor", 2.5), "L": c.get("swiglu_limit", 10.0),
    }


def load_weights(d: str) -> dict:
    W = {}
    for k, v in load_file(os.path.join(d, "model.safetensors")).items():
        for pre in ("model.language_model.", "model."):
            if k.startswith(pre):
                k = k[len(pre):]
                break
        W[k] = v.to(D)
    return W


# ------------------------------------------------------------------------------------------ blocks


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 if w is None else w)


def layernorm(x, w, b, eps=1e-6):
    m = x.mean(-1, keepdim=True)
    v = (x - m).pow(2).mean(-1, keepdim=True)
    return (x - m) * torch.rsqrt(v + eps) * w + b


def lin(x, w):
    return x @ w.T


def mhc(X, P, pfx, cfg):
    """X [T, N, H] -> (post [T, N], comb [T, N, N] (comb[t, i, j]: stream i into stream j), y [T, H])."""
    T, N, H = X.shape
    flat = rms(X.reshape(T, N * H), None, cfg["eps"])
    mix = lin(flat, P[pfx + "_fn"])
    base, sc = P[pfx + "_base"], P[pfx + "_scale"]
    pre = torch.sigmoid(mix[:, :N] * sc[0] + base[:N]) + cfg["hc_eps"]
    post = 2 * torch.sigmoid(mix[:, N:2 * N] * sc[1] + base[N:2 * N])
    comb = torch.softmax(mix[:, 2 * N:].view(T, N, N) * sc[2] + base[2 * N:].view(N, N), dim=-1) + cfg["hc_eps"]
    comb = comb / (comb.sum(-2, keepdim=True) + cfg["hc_eps"])
    for _ in range(cfg["iters"] - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + cfg["hc_eps"])
        comb = comb / (comb.sum(-2, keepdim=True) + cfg["hc_eps"])
    y = (pre.unsqueeze(-1) * X).sum(1)
    return post, comb, y


def hc_out(X, out, post, comb):
    return post.unsqueeze(-1) * out.unsqueeze(1) + torch.einsum("tij,tih->tjh", comb, X)


class KdaState:
    def __init__(self):
        self.conv = None  # [K-1, 3*nh*dk] last pre-conv q|k|v rows
        self.S = None     # [nh, dk, dv]


class MlaState:
    def __init__(self):
        self.c = None     # [L, r] latent rows (post kv_a_layernorm)
        self.ik = None    # [L, dI] indexer keys (post LayerNorm)
        self.iz = None    # [L, dI] indexer pool-gate logits


def cat(a, b):
    return b if a is None else torch.cat([a, b])


def kda(x, st: KdaState, P, pfx, cfg):
    lc = cfg["lin"]
    nh, dk, K = lc["num_heads"], lc["head_dim"], lc["conv"]
    T = x.shape[0]
    qkv = torch.cat([lin(x, P[pfx + f"{n}_proj.weight"]) for n in "qkv"], -1)  # [T, 3C]
    w = torch.cat([P[pfx + f"{n}_conv1d.weight"][:, 0, :] for n in "qkv"])  # [3C, K]
    prev = st.conv if st.conv is not None else torch.zeros(K - 1, qkv.shape[1], dtype=D)
    full = torch.cat([prev, qkv])  # [K-1+T, 3C]
    conv = sum(full[j:j + T] * w[:, j] for j in range(K))
    st.conv = full[-(K - 1):].clone()
    conv = torch.nn.functional.silu(conv)
    C = nh * dk
    q, k, v = (conv[:, i * C:(i + 1) * C].view(T, nh, dk) for i in range(3))
    g = lin(lin(x, P[pfx + "f_a_proj.weight"]), P[pfx + "f_b_proj.weight"]) + P[pfx + "dt_bias"]
    g = g.view(T, nh, dk)
    a = torch.exp(P[pfx + "A_log"]).view(1, nh, 1)
    if lc["lb"] is not None:
        g = lc["lb"] * torch.sigmoid(a * g)
    else:
        g = -a * torch.nn.functional.softplus(g)  # HF: x above 20 passes through (same value in f64)
    beta = torch.sigmoid(lin(x, P[pfx + "b_proj.weight"]))  # [T, nh]
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6) * dk ** -0.5
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    S = st.S if st.S is not None else torch.zeros(nh, dk, dk, dtype=D)
    o = torch.empty(T, nh, dk, dtype=D)
    for t in range(T):
        S = S * torch.exp(g[t]).unsqueeze(-1)
        delta = (v[t] - torch.einsum("hkv,hk->hv", S, k[t])) * beta[t].unsqueeze(-1)
        S = S + k[t].unsqueeze(-1) * delta.unsqueeze(1)
        o[t] = torch.einsum("hkv,hk->hv", S, q[t])
    st.S = S
    gate = lin(lin(x, P[pfx + "g_a_proj.weight"]), P[pfx + "g_b_proj.weight"]).view(T, nh, dk)
    o = rms(o, P[pfx + "o_norm.weight"], cfg["eps"]) * torch.sigmoid(gate)
    return lin(o.reshape(T, nh * dk), P[pfx + "o_proj.weight"])


def indexer(x, qr, st: MlaState, P, pfx, cfg, pos0, layer, rec):
    # rec rows also carry "gap": the k-th minus the (k+1)-th visible pool score (None: all kept)
    """Per query: the sorted token positions it attends to (spec §4)."""
    nI, dI, kp = cfg["nI"], cfg["dI"], cfg["kp"]
    T = x.shape[0]
    q = lin(qr, P[pfx + "wq_b.weight"]).view(T, nI, dI)
    k = layernorm(lin(x, P[pfx + "wk.weight"]), P[pfx + "k_norm.weight"], P[pfx + "k_norm.bias"])
    z = lin(x, P[pfx + "index_kpool_compress_gate"])
    st.ik, st.iz = cat(st.ik, k), cat(st.iz, z)
    L = st.ik.shape[0]
    n_pool = L // kp  # complete pools in the cache
    kk = st.ik[:n_pool * kp].view(n_pool, kp, dI)
    zz = st.iz[:n_pool * kp].view(n_pool, kp, dI) + P[pfx + "index_kpool_compress_ape"]
    pk = (torch.softmax(zz, dim=1) * kk).sum(1)  # [n_pool, dI]
    w = lin(x, P[pfx + "weights_proj.weight"]) * nI ** -0.5  # [T, nI]
    sc = (torch.relu(torch.einsum("thd,pd->thp", q, pk) * dI ** -0.5) * w.unsqueeze(-1)).sum(1)  # [T, n_pool]
    kmax = cfg["topk"] // kp
    sels = []
    for i in range(T):
        t = pos0 + i
        nv = (t + 1) // kp
        s = sc[i, :nv]
        keep = min(kmax, nv)
        order = torch.sort(s, descending=True, stable=True).indices[:keep]
        pools = sorted(int(p) for p in order)
        toks = [p * kp + j for p in pools for j in range(kp)]
        if cfg["tail"]:
            toks += list(range(nv * kp, t + 1))
        sels.append(sorted(toks))
        ss = torch.sort(s, descending=True).values
        gap = float(ss[keep - 1] - ss[keep]) if nv > keep else None
        rec.append({"layer": layer, "pos": t, "selected": sels[-1], "gap": gap})
    return sels


def mla(x, st: MlaState, P, pfx, cfg, pos0, layer, full, prev_sel, rec):
    nh, dn, dv = cfg["nh"], cfg["dn"], cfg["dv"]
    T = x.shape[0]
    qr = rms(lin(x, P[pfx + "q_a_proj.weight"]), P[pfx + "q_a_layernorm.weight"], cfg["eps"])
    q = lin(qr, P[pfx + "q_b_proj.weight"]).view(T, nh, dn)
    c = rms(lin(x, P[pfx + "kv_a_proj_with_mqa.weight"]), P[pfx + "kv_a_layernorm.weight"], cfg["eps"])
    st.c = cat(st.c, c)
    kv = lin(st.c, P[pfx + "kv_b_proj.weight"]).view(-1, nh, dn + dv)
    kn, v = kv[..., :dn], kv[..., dn:]
    sels = indexer(x, qr, st, P, pfx + "indexer.", cfg, pos0, layer, rec) if full else prev_sel
    out = torch.empty(T, nh, dv, dtype=D)
    for i in range(T):
        idx = torch.tensor(sels[i])
        a = torch.einsum("hd,lhd->hl", q[i], kn[idx]) * dn ** -0.5
        out[i] = torch.einsum("hl,lhd->hd", torch.softmax(a, -1), v[idx])
    return lin(out.reshape(T, nh * dv), P[pfx + "o_proj.weight"]), sels


def swiglu(x, g, u, dn, L):
    a = lin(x, g).clamp(max=L)
    b = lin(x, u).clamp(-L, L)
    return lin(torch.nn.functional.silu(a) * b, dn)


def ffn(x, P, pfx, cfg, dense, gaps=None):
    """The FFN; `gaps` (a list) gets the router's smallest top-k margin of the rows."""
    L = cfg["L"]
    if dense:
        return swiglu(x, P[pfx + "gate_proj.weight"], P[pfx + "up_proj.weight"], P[pfx + "down_proj.weight"], L)
    E, k = cfg["E"], cfg["k"]
    s = torch.sigmoid(lin(x, P[pfx + "gate.weight"]))
    choice = s + P[pfx + "gate.e_score_correction_bias"]
    G = cfg["groups"]
    if G > 1:
        gs = choice.view(-1, G, E // G).topk(2, dim=-1).values.sum(-1)
        keep = torch.zeros_like(gs).scatter_(1, gs.topk(cfg["topk_group"], dim=-1).indices, 1.0)
        keep = keep.repeat_interleave(E // G, dim=1)
        choice = choice.masked_fill(keep == 0, -math.inf)
    idx = choice.topk(k, dim=-1).indices
    if gaps is not None and k < E:
        top = choice.topk(k + 1, dim=-1).values
        gaps.append(float((top[:, k - 1] - top[:, k]).min()))
    w = s.gather(1, idx)
    if cfg["norm_topk"]:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    w = w * cfg["scale"]
    out = swiglu(x, P[pfx + "shared_experts.gate_proj.weight"], P[pfx + "shared_experts.up_proj.weight"],
                 P[pfx + "shared_experts.down_proj.weight"], L)
    for t in range(x.shape[0]):
        for j in range(k):
            e = int(idx[t, j])
            ep = f"{pfx}experts.{e}."
            out[t] += w[t, j] * swiglu(x[t:t + 1], P[ep + "gate_proj.weight"], P[ep + "up_proj.weight"],
                                       P[ep + "down_proj.weight"], L)[0]
    return out


def forward(ids, states, P, cfg, pos0, rec, taps=None, hidden=None):
    """Logits [T, V] of tokens `ids` at positions pos0.., updating `states` (one per layer);
    `hidden` (a list) gets the post-norm hiddens [T, H] that feed the MTP block."""
    x = P["embed_tokens.weight"][torch.tensor(ids)]
    X = x.unsqueeze(1).expand(-1, cfg["N"], -1).clone()
    if taps is not None:
        taps.append(X.clone())
    prev_sel = None
    for i in range(cfg["n"]):
        pfx = f"layers.{i}."
        post, comb, y = mhc(X, P, pfx + "hc_attn", cfg)
        h = rms(y, P[pfx + "input_layernorm.weight"], cfg["eps"])
        if cfg["types"][i] == KDA:
            out, prev_sel = kda(h, states[i], P, pfx + "self_attn.", cfg), None
        else:
            full = cfg["itypes"][i] == "full"
            assert full or prev_sel is not None, f"layer {i}: shared indexer without a full DSA layer before it"
            out, prev_sel = mla(h, states[i], P, pfx + "self_attn.", cfg, pos0, i, full, prev_sel, rec)
        X = hc_out(X, out, post, comb)
        post, comb, y = mhc(X, P, pfx + "hc_ffn", cfg)
        h = rms(y, P[pfx + "post_attention_layernorm.weight"], cfg["eps"])
        X = hc_out(X, ffn(h, P, pfx + "mlp.", cfg, cfg["mlp"][i] == "dense"), post, comb)
        if taps is not None:
            taps.append(X.clone())
    h = rms(X.mean(1), P["norm.weight"], cfg["eps"])
    if hidden is not None:
        hidden.append(h)
    return lin(h, P["lm_head.weight"])


def mtp_rows(h, nxt, st: MlaState, P, cfg, r0, rec, gaps=None):
    """The MTP block (spec §9) on rows r0.. (h [T, H]: each row's hidden; nxt: the token after each
    row), its cache in `st`: (logits [T, V], the post-norm outputs g [T, H] that chain a draft)."""
    pfx, eps = f"layers.{cfg['n']}.", cfg["eps"]
    e = rms(P.get(pfx + "embed_tokens.weight", P["embed_tokens.weight"])[torch.tensor(nxt)],
            P[pfx + "enorm.weight"], eps)
    x = lin(torch.cat([e, rms(h, P[pfx + "hnorm.weight"], eps)], -1), P[pfx + "eh_proj.weight"])
    a, _ = mla(rms(x, P[pfx + "input_layernorm.weight"], eps), st, P, pfx + "self_attn.", cfg, r0, cfg["n"], True,
               None, rec)
    x = x + a
    x = x + ffn(rms(x, P[pfx + "post_attention_layernorm.weight"], eps), P, pfx + "mlp.", cfg, False, gaps)
    g = rms(x, P[pfx + "shared_head.norm.weight"], eps)
    return lin(g, P.get(pfx + "shared_head.head.weight", P["lm_head.weight"])), g


def mtp_chain(h_last, last, st: MlaState, P, cfg, r, k, rec=None, gaps=None):
    """k greedy drafts from row r (its hidden h_last [H], `last` the token after it), each row's
    input the previous row's g and draft: (draft tokens, logits [k, V], smallest top-2 gap)."""
    toks, rows, gap = [], [], math.inf
    h, t = h_last.unsqueeze(0), last
    for j in range(k):
        lg, g = mtp_rows(h, [t], st, P, cfg, r + j, [] if rec is None else rec, gaps)
        top = lg[0].topk(2).values
        gap = min(gap, float(top[0] - top[1]))
        t = int(lg[0].argmax())
        toks.append(t)
        rows.append(lg[0])
        h = g
    return toks, torch.stack(rows), gap


def fresh(cfg):
    return [KdaState() if t == KDA else MlaState() for t in cfg["types"]]



# ------------------------------------------------------------------------------------------ check


def read(path, shape_last, dtype="<f4"):
    return torch.from_numpy(np.fromfile(path, dtype=dtype).astype(np.float64)).reshape(-1, shape_last)


def compare(tag, got, path, ok, dtype="<f4", tol=1e-9):
    want = read(path, got.shape[-1], dtype)
    nmse = float((((got - want) ** 2).sum(-1) / (want ** 2).sum(-1)).max())
    dev = float((got - want).abs().max())
    good = nmse <= tol
    print(f"  {tag:34s} nmse {nmse:.1e}  max|d| {dev:.1e}  {'ok' if good else 'FAIL'}")
    ok.append(good)
    return nmse


def want_sel(path):
    return {(int(L), r["pos"]): r["selected"] for L, rows in json.load(open(path))["layers"].items() for r in rows}


def check(d: str) -> bool:
    cfg = parse_config(json.load(open(os.path.join(d, "config.json"))))
    P = load_weights(d)
    pj = json.load(open(os.path.join(d, "prompts.json")))
    ok = []
    print(os.path.basename(d.rstrip("/")))
    for p, ids in pj["prompts"].items():
        if not os.path.exists(os.path.join(d, f"logits_{p}.f32")):  # the mtp fixture keeps `long` only
            continue
        rec, taps = [], ([] if p == "long" else None)
        lg = forward(ids, fresh(cfg), P, cfg, 0, rec, taps)
        compare(f"logits_{p}", lg, os.path.join(d, f"logits_{p}.f32"), ok)
        f64 = os.path.join(d, f"logits_{p}_f64.f64")
        if os.path.exists(f64):
            compare(f"logits_{p}_f64 (HF cast to f64)", lg, f64, ok, "<f8")
        if taps is not None and os.path.exists(os.path.join(d, "streams_long.f32")):
            got = torch.stack(taps)
            compare("streams_long", got.reshape(-1, got.shape[-1]), os.path.join(d, "streams_long.f32"), ok)
        ij = os.path.join(d, f"indexer_{p}.json")
        if os.path.exists(ij):
            got = {(r["layer"], r["pos"]): r["selected"] for r in rec}
            same = got == want_sel(ij)
            print(f"  {'indexer_' + p:34s} {len(got)} queries  {'identical' if same else 'DIFFERENT'}")
            ok.append(same)
    long = pj["prompts"]["long"]
    chunk_sets = []
    if "split" in pj:
        chunk_sets.append((f"logits_long_split{pj['split']}", [pj["split"], len(long) - pj["split"]]))
    if "chunks" in pj:
        chunk_sets.append(("logits_long_chunks", pj["chunks"]))
    for tag, chunks in chunk_sets:
        st, at, outs = fresh(cfg), 0, []
        for n in chunks:
            lg = forward(long[at:at + n], st, P, cfg, at, [])
            if at >= chunks[0]:
                outs.append(lg)
            at += n
        compare(tag, torch.cat(outs), os.path.join(d, tag + ".f32"), ok)
    if "generate" in pj:
        g = pj["generate"]
        prompt, toks = pj["prompts"][g["prompt"]], g["tokens"]
        st, rec = fresh(cfg), []
        rows = [forward(prompt, st, P, cfg, 0, [])[-1]]
        for i, tkn in enumerate(toks[:-1]):
            rows.append(forward([tkn], st, P, cfg, len(prompt) + i, rec)[-1])
        lg = torch.stack(rows)
        compare("logits_gen (1-token steps)", lg, os.path.join(d, "logits_gen.f32"), ok)
        same = lg.argmax(-1).tolist() == toks
        print(f"  {'greedy tokens':34s} {'identical' if same else 'DIFFERENT'}")
        ok.append(same)
        same = {(r["layer"], r["pos"]): r["selected"] for r in rec} == want_sel(os.path.join(d, "indexer_gen.json"))
        print(f"  {'indexer_gen':34s} {len(rec)} queries  {'identical' if same else 'DIFFERENT'}")
        ok.append(same)
    if os.path.exists(os.path.join(d, "mtp_rows_long.f32")):
        check_mtp(d, cfg, P, long, ok)
    return all(ok)


def check_mtp(d, cfg, P, long, ok):
    """The MTP files: every row of `long` in one pass and in chunks of 7 (the block's cache kept
    across), and the chains of mtp_chain.json."""
    hid = []
    forward(long, fresh(cfg), P, cfg, 0, [], hidden=hid)
    h = hid[0]
    lg, _ = mtp_rows(h[:-1], long[1:], MlaState(), P, cfg, 0, [])
    compare("mtp_rows_long", lg, os.path.join(d, "mtp_rows_long.f32"), ok)
    st, outs = MlaState(), []
    for r0 in range(0, len(long) - 1, 7):
        r1 = min(r0 + 7, len(long) - 1)
        outs.append(mtp_rows(h[r0:r1], long[r0 + 1:r1 + 1], st, P, cfg, r0, [])[0])
    compare("mtp_rows_long (chunks of 7)", torch.cat(outs), os.path.join(d, "mtp_rows_long.f32"), ok)
    j = json.load(open(os.path.join(d, "mtp_chain.json")))
    for n, c in j["chains"].items():
        n = int(n)
        st = MlaState()
        if n > 1:
            mtp_rows(h[:n - 1], long[1:n], st, P, cfg, 0, [])
        toks, rows, _ = mtp_chain(h[n - 1], long[n], st, P, cfg, n - 1, j["k"])
        compare(f"mtp_chain_{n}", rows, os.path.join(d, f"mtp_chain_{n}.f32"), ok)
        same = toks == c["drafts"]
        print(f"  {'mtp_chain_' + str(n) + ' drafts':34s} {'identical' if same else 'DIFFERENT'}")
        ok.append(same)


def main():
    dirs = sys.argv[1:]
    if not dirs:
        base = os.path.join(os.environ.get("VELA_CACHE", os.path.expanduser("~/.cache/vela")), "golden", "glm5")
        dirs = [os.path.join(base, x) for x in sorted(os.listdir(base))]
    good = [check(d) for d in dirs]
    sys.exit(0 if all(good) else 1)


if __name__ == "__main__":
    main()
