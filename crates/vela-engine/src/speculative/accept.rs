//! The exact acceptance rule of speculative sampling (Leviathan et al. 2023, Chen et al. 2023).
//!
//! A draft token `d` drawn from the proposal `q` is kept with probability `min(1, p(d) / q(d))`
//! (`p`: the target's distribution at that position). On rejection the token is drawn from the
//! residual `normalize(max(0, p − q))`. Whatever `q` is, the kept-or-replaced token is then
//! distributed exactly as `p`:
//!
//! ```text
//! P(x) = q(x)·min(1, p(x)/q(x)) + (1 − Σ_y min(p(y), q(y))) · max(0, p(x) − q(x)) / Σ_y max(0, p(y) − q(y))
//!      = min(p(x), q(x)) + max(0, p(x) − q(x))                 (the two sums are equal)
//!      = p(x)
//! ```
//!
//! Greedy decoding is the special case of one-hot `p` and `q`: accept iff the draft is the
//! target's argmax, otherwise the residual is the target's argmax itself.

use crate::sampler::{argmax, Rng, Sampler, SamplerConfig};
use std::collections::HashMap;

/// A sparse probability distribution over token ids (probabilities sum to 1).
#[derive(Clone, Debug, PartialEq)]
pub struct Dist {
    pub ids: Vec<u32>,
    pub probs: Vec<f64>,
}

impl Dist {
    /// All mass on one token.
    pub fn one_hot(id: u32) -> Dist {
        Dist {
            ids: vec![id],
            probs: vec![1.0],
        }
    }

    /// Probability of `id` (0 outside the support).
    pub fn prob(&self, id: u32) -> f64 {
        self.ids
            .iter()
            .position(|&i| i == id)
            .map_or(0.0, |k| self.probs[k])
    }

    /// Draw with one uniform number (inverse CDF in support order, as [`Sampler::sample`]).
    pub fn sample(&self, rng: &mut Rng) -> u32 {
        if self.ids.len() == 1 {
            return self.ids[0];
        }
        let u = rng.uniform();
        let mut cum = 0.0;
        for (&id, &p) in self.ids.iter().zip(&self.probs) {
            cum += p;
            if u < cum {
                return id;
            }
        }
        *self.ids.last().expect("non-empty distribution")
    }
}

/// The distribution plain decoding draws from at one position: logit bias and penalties over
/// `history ++ extra` (the tokens before that position), then the greedy argmax (temperature ≤ 0)
/// or the sampler's top-k/top-p/min-p/temperature candidates. `logits` is modified in place.
pub fn position_dist(
    cfg: &SamplerConfig,
    history: &[u32],
    extra: &[u32],
    logits: &mut [f32],
) -> Dist {
    let penalties =
        cfg.repeat_penalty != 1.0 || cfg.presence_penalty != 0.0 || cfg.frequency_penalty != 0.0;
    if penalties || !cfg.logit_bias.is_empty() {
        let mut s = Sampler::new(cfg.clone());
        if penalties {
            let n = history.len() + extra.len();
            let skip = n.saturating_sub(cfg.penalty_last_n);
            for &t in history.iter().chain(extra).skip(skip) {
                s.accept(t);
            }
        }
        s.apply_penalties(logits);
    }
    if cfg.temperature <= 0.0 {
        return Dist::one_hot(argmax(logits));
    }
    let s = Sampler::new(cfg.clone());
    let (cand, probs) = s.candidates(logits);
    Dist {
        ids: cand.iter().map(|c| c.id).collect(),
        probs,
    }
}

/// Probability of keeping draft `d` proposed by `q` when the target says `p`: `min(1, p(d)/q(d))`.
pub fn accept_prob(p: &Dist, q: &Dist, d: u32) -> f64 {
    let qd = q.prob(d);
    if qd <= 0.0 {
        // Not drawn from q (cannot happen with a consistent drafter): keep it iff p allows it.
        return if p.prob(d) > 0.0 { 1.0 } else { 0.0 };
    }
    (p.prob(d) / qd).min(1.0)
}

/// `normalize(max(0, p − q))`; `p` itself when the residual has no mass (p ≤ q everywhere,
/// i.e. p = q up to rounding, where a rejection has probability ~0 anyway).
pub fn residual(p: &Dist, q: &Dist) -> Dist {
    let qm: HashMap<u32, f64> = q.ids.iter().copied().zip(q.probs.iter().copied()).collect();
    let r: Vec<f64> = p
        .ids
        .iter()
        .zip(&p.probs)
        .map(|(id, &pp)| (pp - qm.get(id).copied().unwrap_or(0.0)).max(0.0))
        .collect();
    let z: f64 = r.iter().sum();
    if z <= 1e-12 {
        return p.clone();
    }
    let keep: Vec<usize> = (0..r.len()).filter(|&i| r[i] > 0.0).collect();
    Dist {
        ids: keep.iter().map(|&i| p.ids[i]).collect(),
        probs: keep.iter().map(|&i| r[i] / z).collect(),
    }
}

/// One verification step: `None` keeps the draft, `Some(t)` replaces it with `t` drawn from the
/// residual.
pub fn verify(p: &Dist, q: &Dist, d: u32, rng: &mut Rng) -> Option<u32> {
    let a = accept_prob(p, q, d);
    if a >= 1.0 || rng.uniform() < a {
        None
    } else {
        Some(residual(p, q).sample(rng))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dist(pairs: &[(u32, f64)]) -> Dist {
        Dist {
            ids: pairs.iter().map(|x| x.0).collect(),
            probs: pairs.iter().map(|x| x.1).collect(),
        }
    }

    /// The output distribution of draft-then-verify, computed exactly (no sampling).
    fn exact_output(p: &Dist, q: &Dist) -> HashMap<u32, f64> {
        let mut out = HashMap::new();
        let mut reject = 0.0;
        for (&d, &qd) in q.ids.iter().zip(&q.probs) {
            let a = accept_prob(p, q, d);
            *out.entry(d).or_insert(0.0) += qd * a;
            reject += qd * (1.0 - a);
        }
        let r = residual(p, q);
        for (&t, &rt) in r.ids.iter().zip(&r.probs) {
            *out.entry(t).or_insert(0.0) += reject * rt;
        }
        out
    }

    #[test]
    fn draft_then_verify_reproduces_the_target_exactly() {
        let p = dist(&[(1, 0.5), (2, 0.3), (3, 0.2)]);
        for q in [
            dist(&[(1, 0.1), (2, 0.1), (4, 0.8)]),
            dist(&[(3, 1.0)]),
            dist(&[(1, 0.5), (2, 0.3), (3, 0.2)]),
            dist(&[(2, 0.6), (1, 0.4)]),
        ] {
            let out = exact_output(&p, &q);
            for (&id, &pp) in p.ids.iter().zip(&p.probs) {
                let got = out.get(&id).copied().unwrap_or(0.0);
                assert!(
                    (got - pp).abs() < 1e-12,
                    "q {q:?}: token {id}: {got} vs {pp}"
                );
            }
            assert!(
                out.get(&4).copied().unwrap_or(0.0) < 1e-12,
                "q {q:?}: mass outside p"
            );
        }
    }

    #[test]
    fn always_accepting_gives_the_draft_distribution_not_the_target() {
        // The negative control of the statistical test, computed exactly.
        let p = dist(&[(1, 0.5), (2, 0.5)]);
        let q = dist(&[(1, 0.9), (2, 0.1)]);
        assert!((exact_output(&p, &q)[&1] - 0.5).abs() < 1e-12);
        assert!((q.prob(1) - p.prob(1)).abs() > 0.3);
    }

    #[test]
    fn residual_removes_the_draft_mass() {
        let p = dist(&[(1, 0.5), (2, 0.3), (3, 0.2)]);
        let q = dist(&[(1, 0.7), (2, 0.3)]);
        let r = residual(&p, &q);
        assert_eq!(r.ids, vec![3]);
        assert!((r.probs[0] - 1.0).abs() < 1e-12);
        assert_eq!(residual(&p, &p), p, "no residual mass: fall back to p");
    }

    #[test]
    fn greedy_is_a_prefix_match() {
        let mut rng = Rng::new(1);
        let (p, q) = (Dist::one_hot(5), Dist::one_hot(5));
        assert_eq!(verify(&p, &q, 5, &mut rng), None);
        let q = Dist::one_hot(6);
        assert_eq!(verify(&p, &q, 6, &mut rng), Some(5));
    }

    #[test]
    fn position_dist_applies_bias_and_penalties_like_the_sampler() {
        let mut cfg = SamplerConfig::greedy();
        cfg.repeat_penalty = 4.0;
        cfg.logit_bias = vec![(0, -1.0)];
        let logits = [2.0f32, 1.9, 1.0, 0.5];
        // History [1] penalizes token 1 (1.9 / 4); bias lowers token 0 to 1.0: argmax is 0 or 2.
        let d = position_dist(&cfg, &[1], &[], &mut logits.clone());
        let mut s = Sampler::new(cfg.clone());
        s.accept(1);
        assert_eq!(d, Dist::one_hot(s.sample(&mut logits.clone())));
        // The penalty window counts `extra` as the most recent tokens.
        cfg.penalty_last_n = 1;
        let d = position_dist(&cfg, &[1], &[2], &mut logits.clone());
        let mut s = Sampler::new(cfg);
        s.accept(2);
        assert_eq!(d, Dist::one_hot(s.sample(&mut logits.clone())));
    }

    #[test]
    fn sampling_follows_the_probabilities() {
        let d = dist(&[(7, 0.25), (8, 0.75)]);
        let mut rng = Rng::new(42);
        let n = 20_000;
        let hits = (0..n).filter(|_| d.sample(&mut rng) == 7).count() as f64 / n as f64;
        assert!((hits - 0.25).abs() < 0.015, "{hits}");
    }
}
