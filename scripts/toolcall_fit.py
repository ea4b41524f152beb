"""Shared by the gen-*-toolcall.py scripts: fit a tiny random model to two scripted answers and
check that HF's cached greedy decoding reproduces them."""
import time

import torch


def fit_answers(model, seqs, max_steps, min_margin, lr=3e-3):
    """Train `model` until greedy decoding of both answers holds with a worst top-1 margin of
    `min_margin`. `seqs` = [(prompt1, full1), (prompt2, full2)], sequence 2 extending sequence 1,
    so one forward over sequence 2 scores both answers (the logits from answer 1's first position
    on, at the answer positions). Returns the final worst margin; leaves the model in eval mode."""
    (p1, full1), (p2, full2) = seqs
    assert full2[:len(full1)] == full1, "sequence 2 does not extend sequence 1 token for token"
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    keep = len(full2) - len(p1)
    rows = [i - len(p1) for i in list(range(len(p1), len(full1))) + list(range(len(p2), len(full2)))]
    rows_t = torch.tensor(rows)
    target = torch.tensor([full2[len(p1) + r] for r in rows])
    inputs = torch.tensor([full2[:-1]])

    def answer_logits():
        return model(inputs, use_cache=False, logits_to_keep=keep).logits[0][rows_t]

    def margins():
        model.eval()
        with torch.no_grad():
            top2 = answer_logits().topk(2, dim=-1)
        model.train()
        if not bool((top2.indices[:, 0] == target).all()):
            return -1.0
        return (top2.values[:, 0] - top2.values[:, 1]).min().item()

    t1 = time.time()
    for step in range(max_steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(answer_logits(), target)
        loss.backward()
        opt.step()
        if step % 5 == 4:
            m = margins()
            print(f"step {step + 1}: loss {loss.item():.4f}, worst greedy margin {m:.2f} "
                  f"({time.time() - t1:.0f} s)", flush=True)
            if m >= min_margin:
                break
    else:
        raise SystemExit(f"did not fit the answers in {max_steps} steps")
    final = margins()
    model.eval()
    return final


def check_greedy(model, seqs, eos, pad):
    """HF greedy decoding with the cache, as a server runs it, reproduces every answer."""
    for p, full in seqs:
        with torch.no_grad():
            out = model.generate(torch.tensor([p]), max_new_tokens=len(full) - len(p) + 4, do_sample=False,
                                 eos_token_id=eos, pad_token_id=pad)
        ids = out[0, len(p):].tolist()
        assert ids == full[len(p):], f"HF generate: {ids} != {full[len(p):]}"


def first_fitting(seeds, attempt):
    """The first seed whose model fits: `attempt(seed)` returns `(value, None)` when it does and
    `(None, reason)` when not (an indexer selection or a router choice at a near-tie). The
    margins depend on the CPU's float rounding (torch's kernels differ between AVX2 and AVX-512
    machines), so a seed that fits on one machine can leave a near-tie on another; every machine
    walks the same list and keeps the first seed that fits there (the fixture records it).
    Returns `(seed, value)`."""
    for seed in seeds:
        value, why = attempt(seed)
        if why is None:
            return seed, value
        print(f"seed {seed}: {why}; trying the next seed", flush=True)
    raise SystemExit(f"no seed of {list(seeds)} fits: each left a near-tie")


def fit_and_probe(fx, kw, seed, seqs, max_steps, min_margin, eos, pad, prepare=None):
    """One seed's model of fixture module `fx`: made (`prepare(model)` then, if given), fitted to
    the answers, checked by HF's cached greedy decoding, then probed (`fx.Probe`: router margins,
    indexer choices) over one forward of sequence 2. Returns `(cfg, model, margin, probe, logits)`
    with the logits of that forward."""
    cfg, model = fx.make_model(kw, seed)
    if prepare:
        prepare(model)
    margin = fit_answers(model, seqs, max_steps, min_margin)
    probe = fx.Probe(model)
    probe.on = False
    check_greedy(model, seqs, eos, pad)
    probe.on = True
    probe.reset()
    with torch.no_grad():
        logits = model(torch.tensor([seqs[1][1]]), use_cache=False).logits[0]
    return cfg, model, margin, probe, logits
