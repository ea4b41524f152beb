//! The draft depth of each round, from a cost model measured while generating.
//!
//! With acceptance rate α per draft (each draft kept only if the ones before it were), a round of
//! K drafts yields E(K) = 1 + α + … + α^K tokens and costs T(K) = K·d + v(K): d the time of one
//! draft step, v(K) the time of a verification forward of K + 1 tokens (v(0) is a plain decode
//! step). The model picks the K in 0..=K_max with the most tokens per second, E(K)/T(K); K = 0
//! is plain decoding, so a drafter that does not pay is switched off, and re-probed with one
//! draft every [`PROBE_EVERY`] rounds in case the text turns predictable; in greedy decoding the
//! rounds in between run as plain decoding does (pipelined device steps,
//! [`DepthModel::plain_run`]), so switching a drafter off costs nothing beyond the probes.
//!
//! Everything is measured: v(K) per batch size (linear in K between measured sizes), d per
//! draft, α as a decayed ratio of kept drafts to tried ones (a round that kept m of k drafts
//! tried m + 1 if m < k, else m). The first rounds measure v(0) and then v(K_max) with d and α.
//! The state is shared by the requests of one drafter (a server's), behind a mutex.

use std::sync::Mutex;

/// Rounds between one-draft probes while plain decoding is the better choice.
pub const PROBE_EVERY: u64 = 16;
/// Weight of a new time measurement in its moving average.
const TIME_EMA: f64 = 0.2;
/// Decay of the acceptance counts per observed round (≈ the last 20 rounds count).
const ACCEPT_DECAY: f64 = 0.95;

#[derive(Clone, Debug, Default)]
struct Inner {
    /// Seconds of a verification of k + 1 tokens, index k.
    verify: Vec<Option<f64>>,
    /// Seconds per draft step.
    draft: Option<f64>,
    kept: f64,
    tried: f64,
    rounds: u64,
    last_probe: u64,
}

/// The measured cost model of one drafter with one target (see the module docs).
#[derive(Debug)]
pub struct DepthModel {
    k_max: usize,
    inner: Mutex<Inner>,
}

/// A snapshot of the model's estimates (for logs and reports).
#[derive(Clone, Debug)]
pub struct DepthEstimate {
    pub acceptance: Option<f64>,
    pub draft_s: Option<f64>,
    /// Measured verification seconds per K.
    pub verify_s: Vec<Option<f64>>,
    /// The depth the next unconstrained round would use.
    pub best: usize,
}

fn ema(old: Option<f64>, x: f64) -> Option<f64> {
    Some(old.map_or(x, |o| o + TIME_EMA * (x - o)))
}

impl Inner {
    fn alpha(&self) -> Option<f64> {
        (self.tried >= 1.0).then(|| (self.kept / self.tried).clamp(0.0, 0.999))
    }

    /// v(k): measured, else linear between the nearest measured sizes around it (beyond the
    /// largest: the slope of the two largest, at least flat).
    fn verify_at(&self, k: usize) -> Option<f64> {
        if let Some(v) = self.verify.get(k).copied().flatten() {
            return Some(v);
        }
        let known: Vec<(usize, f64)> = self
            .verify
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.map(|v| (i, v)))
            .collect();
        let lo = known.iter().rev().find(|(i, _)| *i < k).copied();
        let hi = known.iter().find(|(i, _)| *i > k).copied();
        match (lo, hi) {
            (Some((a, va)), Some((b, vb))) => {
                Some(va + (vb - va) * (k - a) as f64 / (b - a) as f64)
            }
            (Some((a, va)), None) => {
                let slope = match known.len() {
                    n if n >= 2 => {
                        let (p, vp) = known[n - 2];
                        ((va - vp) / (a - p) as f64).max(0.0)
                    }
                    _ => 0.0,
                };
                Some(va + slope * (k - a) as f64)
            }
            (None, Some((_, vb))) => Some(vb),
            (None, None) => None,
        }
    }

    /// The depth with the most expected tokens per second, 0 when anything is unmeasured.
    fn best(&self, cap: usize) -> usize {
        let (Some(a), Some(d), Some(v0)) = (self.alpha(), self.draft, self.verify_at(0)) else {
            return 0;
        };
        let mut best = (0, 1.0 / v0);
        let (mut e, mut floor) = (1.0, v0);
        for k in 1..=cap {
            e += a.powi(k as i32);
            let Some(v) = self.verify_at(k) else { break };
            // A verification of more tokens is never cheaper: noise in the measurements must
            // not make drafting look free.
            floor = floor.max(v);
            let rate = e / (k as f64 * d + floor);
            if rate > best.1 {
                best = (k, rate);
            }
        }
        best.0
    }
}

impl DepthModel {
    /// A model choosing depths up to `k_max`.
    pub fn new(k_max: usize) -> Self {
        DepthModel {
            k_max,
            inner: Mutex::new(Inner {
                verify: vec![None; k_max + 1],
                ..Default::default()
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The state is a handful of numbers: a panic elsewhere cannot leave it inconsistent.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The depth of the next round, at most `cap` (this round's limit: tokens left, context,
    /// rollback).
    pub fn choose(&self, cap: usize) -> usize {
        let cap = cap.min(self.k_max);
        if cap == 0 {
            return 0;
        }
        let mut s = self.lock();
        s.rounds += 1;
        if s.verify[0].is_none() {
            return 0;
        }
        if s.draft.is_none() || s.alpha().is_none() {
            return cap;
        }
        let k = s.best(cap);
        if k == 0 && s.rounds - s.last_probe >= PROBE_EVERY {
            s.last_probe = s.rounds;
            return 1;
        }
        k
    }

    /// Rounds until the next one-draft probe (at least 1): how long a run of plain steps may
    /// last once [`DepthModel::choose`] picked plain decoding.
    pub fn plain_run(&self) -> usize {
        let s = self.lock();
        PROBE_EVERY.saturating_sub(s.rounds - s.last_probe).max(1) as usize
    }

    /// A run of `n` plain decoding steps (the first counted by `choose` already) that took
    /// `secs` in all: the cost of a step without drafts, v(0).
    pub fn observe_plain(&self, n: usize, secs: f64) {
        if n == 0 {
            return;
        }
        let mut s = self.lock();
        s.rounds += n as u64 - 1;
        s.verify[0] = ema(s.verify[0], secs / n as f64);
    }

    /// A finished round: `k` drafts (as many as the drafter returned), `kept` of them accepted,
    /// the drafting and verification times.
    pub fn observe(&self, k: usize, kept: usize, draft_s: f64, verify_s: f64) {
        let mut s = self.lock();
        if let Some(v) = s.verify.get_mut(k) {
            *v = ema(*v, verify_s);
        }
        if k > 0 {
            s.draft = ema(s.draft, draft_s / k as f64);
            s.kept = s.kept * ACCEPT_DECAY + kept as f64;
            s.tried = s.tried * ACCEPT_DECAY + (kept + usize::from(kept < k)) as f64;
        }
    }

    pub fn estimate(&self) -> DepthEstimate {
        let s = self.lock();
        DepthEstimate {
            acceptance: s.alpha(),
            draft_s: s.draft,
            verify_s: s.verify.clone(),
            best: s.best(self.k_max),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::Rng;

    /// Simulated rounds: acceptance `alpha`, draft cost `d`, verify cost `1 + slope·k`.
    /// Returns the histogram of chosen depths.
    fn simulate(alpha: f64, d: f64, slope: f64, k_max: usize, rounds: usize) -> Vec<usize> {
        let m = DepthModel::new(k_max);
        let mut rng = Rng::new(5);
        let mut hist = vec![0; k_max + 1];
        for _ in 0..rounds {
            let k = m.choose(k_max);
            hist[k] += 1;
            let mut kept = 0;
            while kept < k && rng.uniform() < alpha {
                kept += 1;
            }
            m.observe(k, kept, d * k as f64, 1.0 + slope * k as f64);
        }
        hist
    }

    #[test]
    fn a_good_drafter_drafts_deep() {
        // α 0.9, cheap drafts, flat verification: E(7)/T(7) beats every shorter round.
        // (2.78 tokens per step-time at K = 7, 2.75 at K = 6)
        let h = simulate(0.9, 0.05, 0.1, 7, 400);
        assert!(h[7] + h[6] > 300, "{h:?}");
    }

    #[test]
    fn a_useless_drafter_is_switched_off_but_probed() {
        let h = simulate(0.0, 0.1, 0.1, 5, 800);
        assert!(h[0] > 700, "{h:?}");
        let probes: usize = h[1..].iter().sum();
        assert!(
            probes > 0 && probes <= 800 / PROBE_EVERY as usize + 3,
            "{h:?}"
        );
    }

    #[test]
    fn an_expensive_drafter_does_not_pay() {
        // α 0.6 but each draft costs 0.6 of a step: no depth beats plain decoding.
        let h = simulate(0.6, 0.6, 0.1, 4, 400);
        assert!(h[0] > 330, "{h:?}");
    }

    #[test]
    fn a_middling_drafter_picks_a_middle_depth() {
        // α 0.7, d 0.15, v(k) = 1 + 0.15k: E(K)/T(K) peaks at K = 2 (1.37, vs 1.31 at K = 1 and
        // 1.33 at K = 3).
        let h = simulate(0.7, 0.15, 0.15, 7, 600);
        let top = h.iter().enumerate().max_by_key(|(_, &c)| c).unwrap().0;
        assert!((1..=3).contains(&top), "{h:?}");
    }

    #[test]
    fn noisy_times_do_not_make_drafting_free() {
        // v(1) measured below v(0) (noise), nothing accepted: plain decoding stays best.
        let m = DepthModel::new(4);
        m.observe(0, 0, 0.0, 1.0);
        m.observe(4, 0, 0.2, 1.5);
        m.observe(1, 0, 0.05, 0.6);
        assert_eq!(m.estimate().best, 0);
    }

    #[test]
    fn verification_cost_is_interpolated() {
        let m = DepthModel::new(8);
        m.observe(0, 0, 0.0, 1.0);
        m.observe(8, 0, 0.8, 3.0);
        let s = m.lock();
        assert_eq!(s.verify_at(4), Some(2.0));
        assert_eq!(s.verify_at(0), Some(1.0));
    }
}
