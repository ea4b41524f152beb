//! The CPU reference of mixture-of-experts routing ([`crate::Backend::route`] and
//! [`crate::Backend::route_hash`]), following transformers 5.23: `DeepseekV3TopkRouter`
//! (sigmoid, selection bias, groups), `DeepseekV4TopKRouter` / `DeepseekV4HashRouter`
//! (sqrt-softplus, hash table), `Gemma4TextRouter` and Qwen3 MoE (softmax, top-k, renorm).
//! The CUDA kernels (`kit_route*` in kernels/kit.cu) follow the same steps in the same order.

use super::kit::{sigmoid1, softmax_row};
use crate::{RouteParams, Score};

/// torch's `softplus` (beta 1, threshold 20): `x` above 20, else `ln(1 + exp(x))`.
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// The scores of one logits row.
pub fn score_row(score: Score, logits: &[f32], s: &mut [f32]) {
    match score {
        Score::Softmax => {
            s.copy_from_slice(logits);
            softmax_row(s);
        }
        Score::Sigmoid => s
            .iter_mut()
            .zip(logits)
            .for_each(|(s, &x)| *s = sigmoid1(x)),
        Score::SqrtSoftplus => s
            .iter_mut()
            .zip(logits)
            .for_each(|(s, &x)| *s = softplus(x).sqrt()),
    }
}

/// NaN ranks as -inf in every selection.
fn key(v: f32) -> f32 {
    if v.is_nan() {
        f32::NEG_INFINITY
    } else {
        v
    }
}

/// Index of the largest of `v` not yet `taken`: the lowest index among equal values (also
/// among -inf); None when all are taken.
fn best(v: &[f32], taken: &[bool]) -> Option<usize> {
    let mut b: Option<usize> = None;
    for (i, &x) in v.iter().enumerate() {
        if !taken[i] && b.is_none_or(|j| x > v[j]) {
            b = Some(i);
        }
    }
    b
}

fn check(p: &RouteParams) {
    assert!(
        p.k >= 1 && p.k <= p.n_expert,
        "route: k = {} of {} experts",
        p.k,
        p.n_expert
    );
    assert!(
        p.n_group >= 1 && p.n_expert.is_multiple_of(p.n_group),
        "route: {} groups do not divide {} experts",
        p.n_group,
        p.n_expert
    );
}

/// The chosen experts' weights in place (`w` holds their scores): renormalised (sum in slot
/// order, plus [`RouteParams::renorm_eps`]; a zero sum, all weights 0, is left as is rather
/// than made NaN), times `scale`.
fn finish(p: &RouteParams, w: &mut [f32]) {
    if p.renorm {
        let sum: f32 = w.iter().fold(0.0, |a, &b| a + b);
        let d = sum + p.renorm_eps();
        if d != 0.0 {
            w.iter_mut().for_each(|v| *v /= d);
        }
    }
    w.iter_mut().for_each(|v| *v *= p.scale);
}

/// One token's slots in ascending expert id (stable: repeated ids keep their order).
fn sort_slots(ids: &mut [u32], w: &mut [f32]) {
    let mut p: Vec<(u32, f32)> = ids.iter().copied().zip(w.iter().copied()).collect();
    p.sort_by_key(|x| x.0);
    for (j, (e, v)) in p.into_iter().enumerate() {
        (ids[j], w[j]) = (e, v);
    }
}

/// [`crate::Backend::route`] on host slices.
pub fn route(
    logits: &[f32],
    n_tokens: usize,
    p: &RouteParams,
    bias: Option<&[f32]>,
    expert_scale: Option<&[f32]>,
    ids: &mut [u32],
    weights: &mut [f32],
) {
    check(p);
    let (e_n, k) = (p.n_expert, p.k);
    let gs = e_n / p.n_group;
    let mut s = vec![0f32; e_n];
    let mut sel = vec![0f32; e_n];
    let mut taken = vec![false; e_n];
    let mut gscore = vec![0f32; p.n_group];
    let mut gtaken = vec![false; p.n_group];
    for t in 0..n_tokens {
        score_row(p.score, &logits[t * e_n..(t + 1) * e_n], &mut s);
        for e in 0..e_n {
            sel[e] = key(bias.map_or(s[e], |b| s[e] + b[e]));
        }
        if p.topk_group < p.n_group {
            // Group score: the sum of its two largest keys (its one key for groups of one).
            for (g, gv) in gscore.iter_mut().enumerate() {
                let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
                for &v in &sel[g * gs..(g + 1) * gs] {
                    if v > a {
                        (a, b) = (v, a);
                    } else if v > b {
                        b = v;
                    }
                }
                *gv = if gs == 1 { a } else { a + b };
            }
            gtaken.fill(false);
            for _ in 0..p.topk_group {
                let g = best(&gscore, &gtaken).expect("topk_group < n_group");
                gtaken[g] = true;
            }
            for (g, &keep) in gtaken.iter().enumerate() {
                if !keep {
                    sel[g * gs..(g + 1) * gs].fill(f32::NEG_INFINITY);
                }
            }
        }
        taken.fill(false);
        let (ids_t, w_t) = (
            &mut ids[t * k..(t + 1) * k],
            &mut weights[t * k..(t + 1) * k],
        );
        for j in 0..k {
            let e = best(&sel, &taken).expect("k <= n_expert");
            taken[e] = true;
            ids_t[j] = e as u32;
            w_t[j] = s[e];
        }
        finish(p, w_t);
        if let Some(es) = expert_scale {
            for j in 0..k {
                w_t[j] *= es[ids_t[j] as usize];
            }
        }
        sort_slots(ids_t, w_t);
    }
}

/// [`crate::Backend::route_hash`] on host slices: `table` is `[n_vocab, k]`.
pub fn route_hash(
    logits: &[f32],
    tokens: &[u32],
    table: &[u32],
    n_tokens: usize,
    p: &RouteParams,
    ids: &mut [u32],
    weights: &mut [f32],
) {
    check(p);
    let (e_n, k) = (p.n_expert, p.k);
    let n_vocab = table.len() / k;
    let mut s = vec![0f32; e_n];
    for t in 0..n_tokens {
        score_row(p.score, &logits[t * e_n..(t + 1) * e_n], &mut s);
        let tok = tokens[t] as usize;
        debug_assert!(tok < n_vocab, "route_hash: token {tok} past the table");
        let (ids_t, w_t) = (
            &mut ids[t * k..(t + 1) * k],
            &mut weights[t * k..(t + 1) * k],
        );
        for j in 0..k {
            let e = if tok < n_vocab {
                table[tok * k + j]
            } else {
                u32::MAX
            };
            debug_assert!(
                tok >= n_vocab || (e as usize) < e_n,
                "route_hash: expert {e}"
            );
            (ids_t[j], w_t[j]) = match s.get(e as usize) {
                Some(&v) => (e, v),
                None => (0, 0.0),
            };
        }
        finish(p, w_t);
        sort_slots(ids_t, w_t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kit::tests::Rng;

    /// A straightforward reference: sort all experts by (key descending, id ascending) after
    /// masking groups, computed in f64 where it does not change the f32 result's meaning.
    fn reference(
        logits: &[f32],
        p: &RouteParams,
        bias: Option<&[f32]>,
        es: Option<&[f32]>,
    ) -> (Vec<u32>, Vec<f32>) {
        let e_n = p.n_expert;
        let s: Vec<f32> = match p.score {
            Score::Softmax => {
                let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let z: f64 = logits.iter().map(|&x| ((x - m) as f64).exp()).sum();
                logits
                    .iter()
                    .map(|&x| (((x - m) as f64).exp() / z) as f32)
                    .collect()
            }
            Score::Sigmoid => logits
                .iter()
                .map(|&x| (1.0 / (1.0 + (-(x as f64)).exp())) as f32)
                .collect(),
            Score::SqrtSoftplus => logits
                .iter()
                .map(|&x| {
                    let sp = if x > 20.0 {
                        x as f64
                    } else {
                        (x as f64).exp().ln_1p()
                    };
                    sp.sqrt() as f32
                })
                .collect(),
        };
        let mut sel: Vec<f32> = (0..e_n)
            .map(|e| s[e] + bias.map_or(0.0, |b| b[e]))
            .collect();
        let gs = e_n / p.n_group;
        if p.topk_group < p.n_group {
            let mut groups: Vec<(f32, usize)> = (0..p.n_group)
                .map(|g| {
                    let mut v = sel[g * gs..(g + 1) * gs].to_vec();
                    v.sort_by(|a, b| b.total_cmp(a));
                    (v.iter().take(2).sum(), g)
                })
                .collect();
            groups.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            for &(_, g) in &groups[p.topk_group..] {
                sel[g * gs..(g + 1) * gs].fill(f32::NEG_INFINITY);
            }
        }
        let mut order: Vec<usize> = (0..e_n).collect();
        order.sort_by(|&a, &b| sel[b].total_cmp(&sel[a]).then(a.cmp(&b)));
        let ids: Vec<u32> = order[..p.k].iter().map(|&e| e as u32).collect();
        let mut w: Vec<f32> = ids.iter().map(|&e| s[e as usize]).collect();
        if p.renorm {
            let sum: f32 = w.iter().sum();
            w.iter_mut().for_each(|v| *v /= sum + p.renorm_eps());
        }
        for (v, &e) in w.iter_mut().zip(&ids) {
            *v *= p.scale * es.map_or(1.0, |es| es[e as usize]);
        }
        // Slots in ascending expert id.
        let mut pairs: Vec<(u32, f32)> = ids.into_iter().zip(w).collect();
        pairs.sort_by_key(|x| x.0);
        pairs.into_iter().unzip()
    }

    fn params(n_expert: usize, k: usize, score: Score, groups: (usize, usize)) -> RouteParams {
        RouteParams {
            n_expert,
            k,
            score,
            n_group: groups.0,
            topk_group: groups.1,
            renorm: true,
            scale: 1.0,
        }
    }

    /// Every score kind, with and without groups, bias, expert scales, renorm and scale, on
    /// odd expert counts: the same experts as the reference and weights within 1e-6.
    #[test]
    fn route_matches_reference() {
        let mut rng = Rng(77);
        let cases = [
            params(8, 2, Score::Softmax, (1, 1)),
            params(7, 3, Score::Softmax, (1, 1)),
            params(64, 6, Score::Sigmoid, (8, 3)),
            params(60, 4, Score::Sigmoid, (4, 2)),
            params(33, 5, Score::SqrtSoftplus, (1, 1)),
            params(128, 8, Score::Sigmoid, (8, 4)),
            params(6, 6, Score::Softmax, (3, 1)),
            params(5, 1, Score::SqrtSoftplus, (5, 2)),
        ];
        let mut n = 0;
        for (ci, base) in cases.iter().enumerate() {
            for variant in 0..4 {
                let mut p = base.clone();
                p.renorm = variant != 1;
                p.scale = if variant == 2 { 2.5 } else { 1.0 };
                let e_n = p.n_expert;
                let n_tokens = 1 + ci % 4;
                let logits: Vec<f32> = (0..n_tokens * e_n).map(|_| rng.f() * 8.0).collect();
                let bias: Vec<f32> = (0..e_n).map(|_| rng.f() * 0.1).collect();
                let es: Vec<f32> = (0..e_n).map(|_| 1.0 + rng.f()).collect();
                let bias = (variant == 3).then_some(&bias[..]);
                let es = (variant == 2).then_some(&es[..]);
                let mut ids = vec![u32::MAX; n_tokens * p.k];
                let mut w = vec![f32::NAN; n_tokens * p.k];
                route(&logits, n_tokens, &p, bias, es, &mut ids, &mut w);
                for t in 0..n_tokens {
                    let row = &logits[t * e_n..(t + 1) * e_n];
                    let (ri, rw) = reference(row, &p, bias, es);
                    let sl = t * p.k..(t + 1) * p.k;
                    assert_eq!(ids[sl.clone()], ri[..], "case {ci} variant {variant} t {t}");
                    for (a, b) in w[sl].iter().zip(&rw) {
                        assert!((a - b).abs() <= 1e-6 * b.abs().max(1e-3), "{a} vs {b}");
                    }
                    n += 1;
                }
            }
        }
        assert!(n > 50);
    }

    /// Ties go to the lowest expert id, NaN never beats a number, groups of equal score keep the
    /// lowest group, and an all -inf softmax row routes to experts 0..k with weight 0.
    #[test]
    fn route_ties_and_specials() {
        let p = params(6, 3, Score::Sigmoid, (1, 1));
        let logits = [1.0, 2.0, 2.0, f32::NAN, 2.0, 0.0];
        let (mut ids, mut w) = (vec![0u32; 3], vec![0f32; 3]);
        route(&logits, 1, &p, None, None, &mut ids, &mut w);
        assert_eq!(ids, vec![1, 2, 4]);
        assert!(w.iter().all(|&v| (v - 1.0 / 3.0).abs() < 1e-7));
        // Two groups of equal score: the lower is kept.
        let p = params(4, 2, Score::Sigmoid, (2, 1));
        route(&[0.5, 0.25, 0.25, 0.5], 1, &p, None, None, &mut ids, &mut w);
        assert_eq!(ids[..2], [0, 1]);
        for renorm in [false, true] {
            let mut p = params(4, 2, Score::Softmax, (1, 1));
            p.renorm = renorm;
            route(&[f32::NEG_INFINITY; 4], 1, &p, None, None, &mut ids, &mut w);
            assert_eq!((&ids[..2], &w[..2]), (&[0u32, 1][..], &[0f32, 0.0][..]));
        }
    }

    /// Hash routing: the table's experts in ascending id, weights their renormalised, scaled
    /// scores; an out-of-range token (release builds) gives expert 0 with weight 0.
    #[test]
    fn route_hash_matches_reference() {
        let mut rng = Rng(99);
        for score in [Score::SqrtSoftplus, Score::Sigmoid, Score::Softmax] {
            let (e_n, k, n_vocab, n_tokens) = (16, 3, 11, 5);
            let mut p = params(e_n, k, score, (1, 1));
            p.scale = 1.5;
            let table: Vec<u32> = (0..n_vocab * k)
                .map(|_| (rng.next() % e_n as u64) as u32)
                .collect();
            let tokens: Vec<u32> = (0..n_tokens)
                .map(|_| (rng.next() % n_vocab as u64) as u32)
                .collect();
            let logits: Vec<f32> = (0..n_tokens * e_n).map(|_| rng.f() * 5.0).collect();
            let (mut ids, mut w) = (vec![0u32; n_tokens * k], vec![0f32; n_tokens * k]);
            route_hash(&logits, &tokens, &table, n_tokens, &p, &mut ids, &mut w);
            for t in 0..n_tokens {
                let tok = tokens[t] as usize;
                let mut want_ids = table[tok * k..(tok + 1) * k].to_vec();
                want_ids.sort();
                assert_eq!(ids[t * k..(t + 1) * k], want_ids[..]);
                let mut s = vec![0f32; e_n];
                score_row(score, &logits[t * e_n..(t + 1) * e_n], &mut s);
                let sel: Vec<f32> = ids[t * k..(t + 1) * k]
                    .iter()
                    .map(|&e| s[e as usize])
                    .collect();
                let sum: f32 = sel.iter().sum();
                for j in 0..k {
                    let want = sel[j] / (sum + p.renorm_eps()) * 1.5;
                    assert!((w[t * k + j] - want).abs() <= 1e-6 * want);
                }
            }
        }
        if !cfg!(debug_assertions) {
            let p = params(4, 2, Score::Sigmoid, (1, 1));
            let (mut ids, mut w) = (vec![9u32; 2], vec![9f32; 2]);
            route_hash(&[0.0; 4], &[5], &[1, 2], 1, &p, &mut ids, &mut w);
            assert_eq!((ids, w), (vec![0, 0], vec![0.0, 0.0]));
        }
    }
}
