"""Independent re-implementation of qwen4_exp from the spec (not HF code), float64, recurrent GDN.
Usage: ref.py FIXTURE_DIR"""
import json, math, sys, os
import numpy as np
import torch
from safetensors.torch import load_file
torch.set_num_threads(1)
D = torch.float64

d = sys.argv[1]
cfg = json.load(open(os.path.join(d, "config.json")))
W = {k: (v.to(D) if v.is_floating_point() else v) for k, v in load_file(os.path.join(d, "model.safetensors")).items()}
P = json.load(open(os.path.join(d, "prompts.json")))
H = cfg["hidden_size"]; NS = cfg["hc_count"]; eps = cfg["rms_norm_eps"]; V = cfg["vocab_size"]
act_name = cfg.get("output_gate_type") or cfg["hidden_act"]
types = ["qsa" if t in ("full_attention", "indexed_attention") else "gdn" for t in cfg["layer_types"]]
ple_ids = sorted(set(cfg.get("ple_layer_ids") or []))
eos = cfg["eos_token_id"]; eos = eos[0] if isinstance(eos, list) else eos

def rms1p(x, w, group=None):  # (1+w) RMSNorm, optionally per group of `group`
    sh = x.shape
    if group: x = x.reshape(*sh[:-1], -1, group)
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y.reshape(sh) * (1 + w)

silu = torch.nn.functional.silu
sig = torch.sigmoid

# ---- rope
rp = cfg["rope_parameters"]; hd = cfg["head_dim"]; rot = int(hd * rp.get("partial_rotary_factor", 1.0))
theta = rp["rope_theta"]
inv = 1.0 / (theta ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
mscale = 1.0
if rp["rope_type"] == "yarn":
    f = rp["factor"]; omax = rp["original_max_position_embeddings"]
    bf, bs = rp.get("beta_fast") or 32, rp.get("beta_slow") or 1
    def cdim(nr): return (rot * math.log(omax / (nr * 2 * math.pi))) / (2 * math.log(theta))
    lo, hi = math.floor(cdim(bf)), math.ceil(cdim(bs))
    lo, hi = max(lo, 0), min(hi, rot - 1)
    if lo == hi: hi += 0.001
    ramp = ((torch.arange(rot // 2, dtype=torch.float32) - lo) / (hi - lo)).clamp(0, 1)
    pos_freqs = theta ** (torch.arange(0, rot, 2).float() / rot)
    extra = 1.0 / pos_freqs; interp = 1.0 / (f * pos_freqs)
    extra_factor = 1 - ramp
    inv = interp * (1 - extra_factor) + extra * extra_factor
    mscale = 0.1 * math.log(f) + 1.0
def cos_sin(pos):  # f32 like HF, then used in f64
    fr = torch.tensor(pos, dtype=torch.float32)[:, None] * inv[None]
    e = torch.cat([fr, fr], -1)
    return (e.cos() * mscale).to(D), (e.sin() * mscale).to(D)
def rope(x, c, s):  # x [..., T?, d]; rotate first rot dims NeoX
    xr, xp = x[..., :rot], x[..., rot:]
    h = rot // 2
    rh = torch.cat([-xr[..., h:], xr[..., :h]], -1)
    return torch.cat([xr * c + rh * s, xp], -1)

# ---- PLE hash
M64 = (1 << 64) - 1; G = 0x9E3779B97F4A7C15; M1 = 0xBF58476D1CE4E5B9; M2 = 0x94D049BB133111EB
def splitmix(v):
    v = (v + G) & M64; v = ((v ^ (v >> 30)) * M1) & M64; v = ((v ^ (v >> 27)) * M2) & M64
    return (v ^ (v >> 31)) & M64
def is_prime(n):
    if n < 2: return False
    if n % 2 == 0: return n == 2
    i = 3
    while i * i <= n:
        if n % i == 0: return False
        i += 2
    return True
def ple_consts(li):
    n = cfg["ngram_size"]; hpn = cfg["heads_per_ngram"]; NH = (n - 1) * hpn
    half = max(1, ((2**63 - 1) // max(V, 1)) // 2)
    base = cfg["seed"] + 10007 * li
    mult = [2 * (splitmix((base + G * (i + 1)) & M64) % half) + 1 for i in range(n)]
    primes = []; p = cfg["ngram_vocab_size_base"] - 1; cnt = 0
    while len(primes) < NH * (li + 1):
        p += 1
        if is_prime(p): primes.append(p)
    primes = primes[NH * li:]
    offs = [sum(primes[:j]) for j in range(NH)]
    return mult, primes, offs
def ple_rows(toks, li):
    n = cfg["ngram_size"]; hpn = cfg["heads_per_ngram"]
    mult, primes, offs = ple_consts(li)
    rows = []
    for t in range(len(toks)):
        last_eos = max([p for p in range(t) if toks[p] == eos], default=-1)
        def sh(s):
            return toks[t - s] if t - s > last_eos else eos
        r = []
        for order in range(2, n + 1):
            mix = 0
            for s in range(order):
                mix ^= sh(s) * mult[s]
            for j in range((order - 2) * hpn, (order - 1) * hpn):
                r.append(mix % primes[j] + offs[j])
        rows.append(r)
    return rows

def hc(X, pre, inject=True):
    Xn = rms1p(X, W[pre + "hc_norm.weight"], H)
    a = silu(Xn @ W[pre + "input_mix_weight_down.weight"].T / NS)
    a = sig(a @ W[pre + "input_mix_weight_up.weight"].T)
    m = (a * Xn).reshape(-1, NS, H).mean(1)
    if not inject: return m
    inj = 2 * sig(Xn @ W[pre + "block_inject_weight.weight"].T / NS)  # [T, NS]
    return m, inj

def gdn(x, pre):
    hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]; K = cfg["linear_conv_kernel_dim"]
    T = x.shape[0]
    qkv = x @ W[pre + "in_proj_qkv.weight"].T
    cw = W[pre + "conv1d.weight"][:, 0, :]  # [C, K]
    pad = torch.cat([torch.zeros(K - 1, qkv.shape[1], dtype=D), qkv])
    conv = torch.stack([(pad[t:t + K] * cw.T).sum(0) for t in range(T)])
    conv = silu(conv) if cfg["hidden_act"] == "silu" else None
    q, k, v = conv[:, :hk * dk].reshape(T, hk, dk), conv[:, hk * dk:2 * hk * dk].reshape(T, hk, dk), conv[:, 2 * hk * dk:].reshape(T, hv, dv)
    z = (x @ W[pre + "in_proj_z.weight"].T).reshape(T, hv, dv)
    beta = sig(x @ W[pre + "in_proj_b.weight"].T)
    g = -W[pre + "A_log"].exp() * torch.nn.functional.softplus(x @ W[pre + "in_proj_a.weight"].T + W[pre + "dt_bias"])
    l2 = lambda u: u * torch.rsqrt((u * u).sum(-1, keepdim=True) + 1e-6)
    q, k = l2(q) * dk ** -0.5, l2(k)
    r = hv // hk
    S = torch.zeros(hv, dk, dv, dtype=D)
    out = torch.zeros(T, hv, dv, dtype=D)
    for t in range(T):
        for j in range(hv):
            kk, qq = k[t, j // r], q[t, j // r]
            S[j] = S[j] * g[t, j].exp()
            delta = (v[t, j] - S[j].T @ kk) * beta[t, j]
            S[j] = S[j] + torch.outer(kk, delta)
            out[t, j] = S[j].T @ qq
    y = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + eps) * W[pre + "norm.weight"]
    y = y * (sig(z) if act_name == "sigmoid" else silu(z))
    return y.reshape(T, -1) @ W[pre + "out_proj.weight"].T

def qsa(x, pre, cs, sel_out):
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    ih, idim, ratio, budget = cfg["indexer_n_heads"], cfg["indexer_head_dim"], cfg["indexer_compress_ratio"], cfg["indexer_budget"]
    T = x.shape[0]; c, s = cs
    qk = x @ W[pre + "indexer.index_qk_proj.weight"].T
    iq = rope(rms1p(qk[:, :ih * idim].reshape(T, ih, idim), W[pre + "indexer.q_layernorm.weight"]), c[:, None], s[:, None])
    rawk = qk[:, ih * idim:]
    nb_all = T // ratio
    pk = rms1p(rawk[:nb_all * ratio].reshape(nb_all, ratio, idim).mean(1), W[pre + "indexer.k_layernorm.weight"])
    starts = torch.arange(nb_all) * ratio
    pk = rope(pk, c[starts], s[starts])
    mask = torch.zeros(T, T, dtype=torch.bool)
    for t in range(T):
        n = (t + 1) // ratio
        keep = list(range(n * ratio, t + 1))
        if n:
            sc = torch.relu(iq[t] @ pk[:n].T).sum(0) / math.sqrt(idim)
            kk = min(budget // ratio, n)
            top = torch.sort(sc, descending=True, stable=True).indices[:kk].tolist()
            for b in top: keep += list(range(b * ratio, b * ratio + ratio))
        mask[t, keep] = True
        sel_out.append(sorted(keep))
    qg = (x @ W[pre + "q_proj.weight"].T).reshape(T, nh, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:].reshape(T, nh * hd)
    q = rope(rms1p(q, W[pre + "q_norm.weight"]), c[:, None], s[:, None])
    k = rope(rms1p((x @ W[pre + "k_proj.weight"].T).reshape(T, nkv, hd), W[pre + "k_norm.weight"]), c[:, None], s[:, None])
    v = (x @ W[pre + "v_proj.weight"].T).reshape(T, nkv, hd)
    grp = nh // nkv
    o = torch.zeros(T, nh, hd, dtype=D)
    for h in range(nh):
        sc = q[:, h] @ k[:, h // grp].T * hd ** -0.5
        sc = sc.masked_fill(~mask, float("-inf"))
        o[:, h] = torch.softmax(sc, -1) @ v[:, h // grp]
    o = o.reshape(T, -1) * sig(gate)
    return o @ W[pre + "o_proj.weight"].T

def moe(x, pre):
    E, k = cfg["num_experts"], cfg["num_experts_per_tok"]
    p = torch.softmax(x @ W[pre + "gate.weight"].T, -1)
    tv, ti = p.topk(k, -1)
    if cfg.get("norm_topk_prob", True): tv = tv / tv.sum(-1, keepdim=True)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(k):
            e = int(ti[t, j]); pe = f"{pre}experts.{e}."
            h = silu(x[t] @ W[pe + "gate_proj.weight"].T) * (x[t] @ W[pe + "up_proj.weight"].T)
            out[t] += tv[t, j] * (h @ W[pe + "down_proj.weight"].T)
    sh = silu(x @ W[pre + "shared_expert.gate_proj.weight"].T) * (x @ W[pre + "shared_expert.up_proj.weight"].T)
    sh = sh @ W[pre + "shared_expert.down_proj.weight"].T
    return out + sig(x @ W[pre + "shared_expert_gate.weight"].T) * sh

def ple(X, toks, i, li):
    pre = f"model.layers.{i}.ple."
    n_parts = cfg["split_ngram_parts"]
    table = torch.cat([W[f"{pre}ple_embedding.ngram_embedding.shard_{k}.weight"] for k in range(n_parts)])
    rows = torch.tensor(ple_rows(toks, li))
    assert W[pre + "ple_embedding.layer_multipliers"].tolist() == ple_consts(li)[0]
    e = table[rows].reshape(len(toks), -1)
    key = rms1p(e @ W[pre + "key_proj.weight"].T, W[pre + "norm_key.weight"], H).reshape(-1, NS, H)
    val = e @ W[pre + "value_proj.weight"].T
    qn = rms1p(X, W[pre + "norm_query.weight"], H).reshape(-1, NS, H)
    g = (key * qn).sum(-1, keepdim=True) / math.sqrt(H)
    g = g.abs().clamp_min(1e-6).sqrt() * g.sign()
    gv = (sig(g) * val[:, None]).reshape(-1, NS * H)
    gn = rms1p(gv, W[pre + "norm_conv.weight"], H)
    cw = W[pre + "conv1d.weight"][:, 0, :]; K = cw.shape[1]; dil = cfg["ngram_size"]
    T = X.shape[0]
    conv = torch.zeros_like(gn)
    for t in range(T):
        for j in range(K):
            src = t - (K - 1 - j) * dil
            if src >= 0: conv[t] += cw[:, j] * gn[src]
    return gv + silu(conv)

def forward(toks):
    T = len(toks)
    X = W["model.embed_tokens.weight"][toks].repeat(1, NS)
    cs = cos_sin(list(range(T)))
    sels = {}
    streams = [X.clone()]
    for i, ty in enumerate(types):
        pre = f"model.layers.{i}."
        if i + 1 in ple_ids:
            X = X + ple(X, toks, i, ple_ids.index(i + 1))
        m, inj = hc(X, pre + "attn_hyper_connection.")
        if ty == "gdn":
            y = gdn(m, pre + "linear_attn.")
        else:
            sels[i] = []
            y = qsa(m, pre + "self_attn.", cs, sels[i])
        X = X + (inj[:, :, None] * y[:, None, :]).reshape(T, -1)
        m, inj = hc(X, pre + "mlp_hyper_connection.")
        y = moe(m, pre + "mlp.")
        X = X + (inj[:, :, None] * y[:, None, :]).reshape(T, -1)
        streams.append(X.clone())
    m = hc(X, "model.hyper_connection_mixer.", inject=False)
    return m @ W["lm_head.weight"].T, sels, streams

for name in sys.argv[2:] or ["short", "mid", "long"]:
    toks = P["prompts"][name]
    lg, sels, streams = forward(toks)
    ref = torch.from_numpy(np.fromfile(os.path.join(d, f"logits_{name}.f32"), dtype="<f4").reshape(len(toks), -1)).to(D)
    q = json.load(open(os.path.join(d, f"qsa_{name}.json")))
    sel_ok = all(sels[int(l)][r["pos"]] == r["selected"] for l, rows in q["layers"].items() for r in rows)
    nmse = (((lg - ref) ** 2).sum(-1) / (ref ** 2).sum(-1)).max().item()
    print(f"{os.path.basename(d)} {name}: max|dlogit| {(lg - ref).abs().max().item():.2e}, worst NMSE {nmse:.2e}, QSA selections equal: {sel_ok}")
    if name == "long":
        st = torch.from_numpy(np.fromfile(os.path.join(d, "streams_long.f32"), dtype="<f4")).reshape(len(streams), len(toks), -1).to(D)
        print("   streams max dev per layer:", ["%.1e" % (a - b).abs().max().item() for a, b in zip(streams, st)])
