#!/usr/bin/env python3
# vela-venv: torch
"""Independent re-implementation of deepseek_v4 from docs/deepseekv4-spec.md (not HF code), float64.

    $VELA_CACHE/venv-torch/bin/python scripts/deepseekv4_ref.py FIXTURE_DIR...

Checks a fixture of scripts/gen-deepseekv4-fixtures.py: the no-cache logits of every prompt, the
indexer's selections, and (where the fixture has them) the cached chunked prefills and the 64
decode steps of `generate`, replayed through this file's own per-sequence state (sliding-window
rows, per-window compressor entries, indexer keys). Reads both tensor namings (HF's save and the
release's) and dequantizes the release's FP8 / MXFP4 storage itself. The only things taken from
torch are tensors, matmul and elementwise math. Prints one line per check; exits non-zero when a
check fails (logits: worst per-position NMSE <= 1e-9; selections: identical).
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
SWA, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
FP4 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=D)


# ----------------------------------------------------------------------------------------- config


def parse_config(c: dict) -> dict:
    n = c["num_hidden_layers"]
    if c.get("layer_types"):
        types = list(c["layer_types"][:n])
    elif c.get("compress_ratios") is not None:
        types = [{0: SWA, 4: CSA, 128: HCA}[r] for r in c["compress_ratios"][:n]]
    else:
        types = [HCA] * min(n, 2) + [CSA if i % 2 else HCA for i in range(max(n - 2, 0))]
    rates = dict(c.get("compress_rates") or {CSA: 4, HCA: 128})
    if c.get("mlp_layer_types"):
        mlp = list(c["mlp_layer_types"][:n])
    else:
        nh = c.get("num_hash_layers", 3)
        mlp = ["hash_moe"] * min(n, nh) + ["moe"] * max(0, n - nh)
    hd = c["head_dim"]
    p = c.get("partial_rotary_factor")
    if p is None:
        p = c["qk_rope_head_dim"] / hd if c.get("qk_rope_head_dim") is not None else 64 / 512
    rot = int(hd * p)
    # rope: main = default at rope_theta; compress = compress_rope_theta, YaRN when configured
    rp = c.get("rope_parameters") or c.get("rope_scaling") or {}
    if isinstance(rp.get("compress"), dict):
        comp = rp["compress"]
    else:
        comp = dict(rp)
    yarn = None
    if comp.get("rope_type", comp.get("type")) == "yarn":
        yarn = {"factor": comp["factor"], "orig": comp["original_max_position_embeddings"],
                "beta_fast": comp.get("beta_fast") or 32, "beta_slow": comp.get("beta_slow") or 1}
    main_theta = rp["main"]["rope_theta"] if isinstance(rp.get("main"), dict) else c.get("rope_theta", 10000.0)
    comp_theta = comp.get("rope_theta", c.get("compress_rope_theta", 160000.0)) if isinstance(
        rp.get("compress"), dict) else c.get("compress_rope_theta", 160000.0)
    return dict(c=c, n=n, types=types, rates=rates, mlp=mlp, hd=hd, rot=rot, H=c["hidden_size"],
                nh=c["num_attention_heads"], N=c.get("hc_mult", 4), iters=c.get("hc_sinkhorn_iters", 20),
                hc_eps=c.get("hc_eps", 1e-6), eps=c.get("rms_norm_eps", 1e-6), W=c.get("sliding_window", 128),
                G=c.get("o_groups", 8), nI=c.get("index_n_heads", 64), dI=c.get("index_head_dim", 128),
                topk_I=c.get("index_topk", 512), E=c["n_routed_experts"], k=c["num_experts_per_tok"],
                score=c.get("scoring_func", "sqrtsoftplus"), rsf=c.get("routed_scaling_factor", 1.5),
                limit=c.get("swiglu_limit", 10.0), inv={"main": inv_freq(main_theta, rot, None),
                                                        "compress": inv_freq(comp_theta, rot, yarn)})


def inv_freq(theta, rot, yarn):
    """One angle per interleaved pair, in float32 as HF computes it (spec §6.1)."""
    base = theta ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot)
    inv = 1.0 / base
    if yarn is None:
        return inv
    f, orig = yarn["factor"], yarn["orig"]

    def cdim(nrot):
        return rot * math.log(orig / (nrot * 2 * math.pi)) / (2 * math.log(theta))

    lo, hi = max(math.floor(cdim(yarn["beta_fast"])), 0), min(math.ceil(cdim(yarn["beta_slow"])), rot - 1)
    if lo == hi:
        hi += 0.001
    ramp = ((torch.arange(rot // 2, dtype=torch.float32) - lo) / (hi - lo)).clamp(0, 1)
    extra = 1 - ramp  # weight of the unscaled frequency
    return (1.0 / (f * base)) * (1 - extra) + inv * extra


# ---------------------------------------------------------------------------------------- weights


def load_weights(d: str, cfg: dict) -> dict:
    raw = load_file(os.path.join(d, "model.safetensors"))
    q = cfg["c"].get("quantization_config") or {}
    blk = q.get("weight_block_size", [128, 128])
    W = {}
    for name, t in raw.items():
        if name.endswith(".scale") and name[:-6] + ".weight" in raw:
            continue
        if name.startswith("mtp."):
            continue
        sname = name[:-7] + ".scale" if name.endswith(".weight") else None
        if sname in raw:
            s = raw[sname].to(D)
            if t.dtype == torch.int8:  # MXFP4: two e2m1 per byte, low nibble = even column; scale per 1x32
                u = t.view(torch.uint8).long()
                v = torch.stack([FP4[u & 15], FP4[u >> 4]], -1).reshape(t.shape[0], -1)
                t = v * s.repeat_interleave(v.shape[1] // s.shape[1], 1)
            else:  # FP8 e4m3, one scale per blk[0] x blk[1] block (ceil-sized grid)
                r, cc = t.shape
                t = t.to(D) * s.repeat_interleave(blk[0], 0)[:r].repeat_interleave(blk[1], 1)[:, :cc]
        n = name[6:] if name.startswith("model.") else name
        n = {"embed_tokens.weight": "embed.weight", "hc_head.hc_fn": "hc_head_fn", "hc_head.hc_base": "hc_head_base",
             "hc_head.hc_scale": "hc_head_scale"}.get(n, n)
        n = n.replace(".attn.norm.weight", ".attn.kv_norm.weight")  # HF's save names kv_norm `attn.norm`
        W[n] = t.to(D) if t.is_floating_point() else t
    return W


# ------------------------------------------------------------------------------------------ model


def rms(x, w, eps):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def rope(x, pos, inv, sign=1.0):
    """Interleaved (GPT-J) rotation of the trailing 2*len(inv) channels; pos [T] -> x [T, ..., d]."""
    r = 2 * inv.shape[0]
    ang = (pos.to(torch.float32)[:, None] * inv[None, :]).to(D)  # f32 angles, like HF
    c, s = ang.cos(), sign * ang.sin()
    while c.dim() < x.dim():
        c, s = c.unsqueeze(1), s.unsqueeze(1)
    a, b = x[..., -r::2], x[..., -r + 1::2]
    out = x.clone()
    out[..., -r::2] = a * c - b * s
    out[..., -r + 1::2] = b * c + a * s
    return out


def mhc(X, fn, base, scale, cfg):
    N = cfg["N"]
    f = rms(X.reshape(X.shape[0], -1), None, cfg["eps"])
    m = f @ fn.T
    pre = torch.sigmoid(m[:, :N] * scale[0] + base[:N]) + cfg["hc_eps"]
    post = 2 * torch.sigmoid(m[:, N:2 * N] * scale[1] + base[N:2 * N])
    comb = torch.softmax(m[:, 2 * N:].reshape(-1, N, N) * scale[2] + base[2 * N:].reshape(N, N), -1) + cfg["hc_eps"]
    comb = comb / (comb.sum(-2, keepdim=True) + cfg["hc_eps"])
    for _ in range(cfg["iters"] - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + cfg["hc_eps"])
        comb = comb / (comb.sum(-2, keepdim=True) + cfg["hc_eps"])
    return (pre[:, :, None] * X).sum(1), post, comb


def hc_out(X, y, post, comb):
    return post[:, :, None] * y[:, None, :] + torch.einsum("tjk,tjd->tkd", comb, X)


class LayerState:
    def __init__(self):
        self.pos = torch.zeros(0, dtype=torch.long)
        self.kv = None  # K=V rows of every token so far (only the last W are read)
        self.raw = {}  # name -> (kv_proj, gate_proj) rows of every token so far
        self.entries = {}  # name -> list of compressed entries (one per complete window)


def compress(st, name, P, x, cfg, pe):
    """Append this chunk's projections and emit the entries of every window completed so far."""
    kvp, gp = x @ P[pe + "wkv.weight"].T, x @ P[pe + "wgate.weight"].T
    old = st.raw.get(name)
    st.raw[name] = (kvp, gp) if old is None else (torch.cat([old[0], kvp]), torch.cat([old[1], gp]))
    kvs, gs = st.raw[name]
    m = P[pe + "ape"].shape[0]
    ent = st.entries.setdefault(name, [])
    d = P[pe + "norm.weight"].shape[0]
    overlap = kvs.shape[1] == 2 * d
    inv = cfg["inv"]["compress"]
    while (len(ent) + 1) * m <= kvs.shape[0]:
        w = len(ent)
        cur = slice(w * m, w * m + m)
        if overlap:  # Ca half of window w-1 (ape[:, :d]), Cb half of window w (ape[:, d:])
            v = kvs[cur, d:]
            z = gs[cur, d:] + P[pe + "ape"][:, d:]
            if w > 0:
                prev = slice(w * m - m, w * m)
                v = torch.cat([kvs[prev, :d], v])
                z = torch.cat([gs[prev, :d] + P[pe + "ape"][:, :d], z])
        else:
            v, z = kvs[cur], gs[cur] + P[pe + "ape"]
        e = rms((torch.softmax(z, 0) * v).sum(0), P[pe + "norm.weight"], cfg["eps"])
        ent.append(rope(e[None], torch.tensor([w * m]), inv)[0])
    return torch.stack(ent) if ent else torch.zeros(0, d, dtype=D)


def attention(i, x, st, P, cfg, ids_pos, rec):
    t = x.shape[0]
    nh, hd, H = cfg["nh"], cfg["hd"], cfg["H"]
    kind = cfg["types"][i]
    inv = cfg["inv"]["main" if kind == SWA else "compress"]
    a = f"layers.{i}.attn."
    qr = rms(x @ P[a + "wq_a.weight"].T, P[a + "q_norm.weight"], cfg["eps"])
    q = rms((qr @ P[a + "wq_b.weight"].T).reshape(t, nh, hd), None, cfg["eps"])
    q = rope(q, ids_pos, inv)
    kv = rope(rms(x @ P[a + "wkv.weight"].T, P[a + "kv_norm.weight"], cfg["eps"]), ids_pos, inv)
    st.kv = kv if st.kv is None else torch.cat([st.kv, kv])
    st.pos = torch.cat([st.pos, ids_pos])
    ent, sel = None, None
    if kind != SWA:
        m = cfg["rates"][kind]
        ent = compress(st, "kv", P, x, cfg, a + "compressor.")
        if kind == CSA:
            keys = compress(st, "index", P, x, cfg, a + "indexer.compressor.")
            qI = rope((qr @ P[a + "indexer.wq_b.weight"].T).reshape(t, cfg["nI"], cfg["dI"]), ids_pos,
                      cfg["inv"]["compress"])
            wts = (x @ P[a + "indexer.weights_proj.weight"].T) * cfg["nI"] ** -0.5
            sc = (torch.relu(torch.einsum("thd,nd->thn", qI, keys)) * cfg["dI"] ** -0.5 * wts[:, :, None]).sum(1)
            sel = []
            for j in range(t):
                nv = (int(ids_pos[j]) + 1) // m
                s = sc[j, :nv]
                pick = list(range(nv)) if nv <= cfg["topk_I"] else sorted(
                    torch.topk(s, cfg["topk_I"]).indices.tolist())
                sel.append(pick)
                rec.append({"layer": i, "pos": int(ids_pos[j]), "selected": pick})
    out = torch.empty(t, nh, hd, dtype=D)
    sink = P[a + "attn_sink"]
    for j in range(t):
        p = int(ids_pos[j])
        win = (st.pos <= p) & (st.pos > p - cfg["W"])
        keys = st.kv[win]
        if kind == HCA:
            keys = torch.cat([keys, ent[:(p + 1) // cfg["rates"][HCA]]])
        elif kind == CSA:
            keys = torch.cat([keys, ent[sel[j]]])
        lg = q[j] @ keys.T * hd ** -0.5  # [nh, n]
        pr = torch.softmax(torch.cat([lg, sink[:, None]], 1), 1)[:, :-1]
        out[j] = pr @ keys
    out = rope(out, ids_pos, inv, sign=-1.0)  # de-rotate at the query position
    G = cfg["G"]
    og = out.reshape(t, G, -1)
    wa = P[a + "wo_a.weight"].reshape(G, -1, og.shape[-1])
    z = torch.einsum("tgi,gri->tgr", og, wa).reshape(t, -1)
    return z @ P[a + "wo_b.weight"].T


def moe(i, x, ids, P, cfg):
    f = f"layers.{i}.ffn."
    lg = x @ P[f + "gate.weight"].T
    s = torch.sqrt(torch.where(lg > 20, lg, torch.log1p(torch.exp(lg)))) if cfg["score"] == "sqrtsoftplus" \
        else torch.sigmoid(lg)
    if cfg["mlp"][i] == "hash_moe":
        idx = P[f + "gate.tid2eid"][ids]
    else:
        idx = torch.topk(s + P[f + "gate.bias"], cfg["k"], -1).indices
    w = s.gather(1, idx)
    w = w / (w.sum(-1, keepdim=True) + 1e-20) * cfg["rsf"]
    L = cfg["limit"]

    def swiglu(v, p):
        g = (v @ P[p + "w1.weight"].T).clamp(max=L)
        u = (v @ P[p + "w3.weight"].T).clamp(-L, L)
        return (torch.nn.functional.silu(g) * u) @ P[p + "w2.weight"].T

    y = swiglu(x, f + "shared_experts.")
    for t in range(x.shape[0]):
        for j in range(idx.shape[1]):
            y[t] += w[t, j] * swiglu(x[t:t + 1], f"{f}experts.{int(idx[t, j])}.")[0]
    return y


def forward(ids, states, P, cfg, rec, taps=None):
    """Logits of the chunk `ids` continuing the sequence held in `states` (one LayerState per layer);
    with `taps` (a list), the mean over the streams after every layer is appended to it."""
    start = int(states[0].pos.shape[0])
    pos = torch.arange(start, start + len(ids))
    ids_t = torch.tensor(ids)
    X = P["embed.weight"][ids_t][:, None, :].expand(-1, cfg["N"], -1).clone()
    for i in range(cfg["n"]):
        L = f"layers.{i}."
        c, post, comb = mhc(X, P[L + "hc_attn_fn"], P[L + "hc_attn_base"], P[L + "hc_attn_scale"], cfg)
        y = attention(i, rms(c, P[L + "attn_norm.weight"], cfg["eps"]), states[i], P, cfg, pos, rec)
        X = hc_out(X, y, post, comb)
        c, post, comb = mhc(X, P[L + "hc_ffn_fn"], P[L + "hc_ffn_base"], P[L + "hc_ffn_scale"], cfg)
        y = moe(i, rms(c, P[L + "ffn_norm.weight"], cfg["eps"]), ids_t, P, cfg)
        X = hc_out(X, y, post, comb)
        if taps is not None:
            taps.append(X.mean(1))
    f = rms(X.reshape(X.shape[0], -1), None, cfg["eps"])
    pre = torch.sigmoid(f @ P["hc_head_fn"].T * P["hc_head_scale"] + P["hc_head_base"]) + cfg["hc_eps"]
    h = rms((pre[:, :, None] * X).sum(1), P["norm.weight"], cfg["eps"])
    return h @ P["head.weight"].T


# ------------------------------------------------------------------------------------------ check


def read_f32(path, shape_last):
    return torch.from_numpy(np.fromfile(path, dtype="<f4").astype(np.float64)).reshape(-1, shape_last)


def compare(tag, got, path, ok):
    want = read_f32(path, got.shape[-1])
    nmse = float((((got - want) ** 2).sum(-1) / (want ** 2).sum(-1)).max())
    dev = float((got - want).abs().max())
    good = nmse <= 1e-9
    print(f"  {tag:34s} nmse {nmse:.1e}  max|d| {dev:.1e}  {'ok' if good else 'FAIL'}")
    ok.append(good)


def check(d: str) -> bool:
    cj = json.load(open(os.path.join(d, "config.json")))
    cfg = parse_config(cj)
    P = load_weights(d, cfg)
    pj = json.load(open(os.path.join(d, "prompts.json")))
    ok = []
    print(os.path.basename(d.rstrip("/")))

    def fresh():
        return [LayerState() for _ in range(cfg["n"])]

    for p, ids in pj["prompts"].items():
        rec = []
        lg = forward(ids, fresh(), P, cfg, rec)
        compare(f"logits_{p}", lg, os.path.join(d, f"logits_{p}.f32"), ok)
        ij = os.path.join(d, f"indexer_{p}.json")
        if os.path.exists(ij):
            want = {(int(L), r["pos"]): r["selected"] for L, rows in json.load(open(ij))["layers"].items()
                    for r in rows}
            got = {(r["layer"], r["pos"]): r["selected"] for r in rec}
            same = got == want
            print(f"  {'indexer_' + p:34s} {len(got)} queries  {'identical' if same else 'DIFFERENT'}")
            ok.append(same)
    long = pj["prompts"]["long"]
    chunk_sets = []
    if "split" in pj:
        chunk_sets.append((f"logits_long_split{pj['split']}", [pj["split"], len(long) - pj["split"]]))
    if "chunks" in pj:
        chunk_sets.append(("logits_long_chunks", pj["chunks"]))
    for tag, chunks in chunk_sets:
        st, at, outs = fresh(), 0, []
        for n in chunks:
            lg = forward(long[at:at + n], st, P, cfg, [])
            if at >= chunks[0]:
                outs.append(lg)
            at += n
        compare(tag, torch.cat(outs), os.path.join(d, tag + ".f32"), ok)
    if "generate" in pj:
        g = pj["generate"]
        prompt, toks = pj["prompts"][g["prompt"]], g["tokens"]
        st, rec = fresh(), []
        rows = [forward(prompt, st, P, cfg, [])[-1]]
        for tkn in toks[:-1]:
            rows.append(forward([tkn], st, P, cfg, rec)[-1])
        lg = torch.stack(rows)
        compare("logits_gen (1-token steps)", lg, os.path.join(d, "logits_gen.f32"), ok)
        same = lg.argmax(-1).tolist() == toks
        print(f"  {'greedy tokens':34s} {'identical' if same else 'DIFFERENT'}")
        ok.append(same)
        want = {(int(L), r["pos"]): r["selected"] for L, rws in
                json.load(open(os.path.join(d, "indexer_gen.json")))["layers"].items() for r in rws}
        same = {(r["layer"], r["pos"]): r["selected"] for r in rec} == want
        print(f"  {'indexer_gen':34s} {len(want)} queries  {'identical' if same else 'DIFFERENT'}")
        ok.append(same)
    return all(ok)


def main():
    dirs = sys.argv[1:]
    if not dirs:
        base = os.path.join(os.environ.get("VELA_CACHE", os.path.expanduser("~/.cache/vela")), "golden", "deepseekv4")
        dirs = [os.path.join(base, x) for x in sorted(os.listdir(base))]
    good = [check(d) for d in dirs]
    sys.exit(0 if all(good) else 1)


if __name__ == "__main__":
    main()
