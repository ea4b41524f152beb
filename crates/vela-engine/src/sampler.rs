//! Token sampling: greedy, temperature, top-k (bounded heap), top-p, min-p, penalties, logit bias,
//! seeded RNG.
//!
//! The order follows llama.cpp's default chain: logit bias → penalties → top-k → top-p → min-p →
//! temperature → draw. top-k/top-p never sort the whole vocabulary: candidates are selected with a
//! bounded min-heap (O(V log k)); top-p without top-k grows k geometrically until the kept mass
//! reaches p.
//!
//! [`Sampler::sample_top_k`] draws the same token from a top-k selection of the row (made on the
//! device by a GPU backend, [`vela_compute::Backend::top_k_rows`]) whenever that selection
//! determines the candidates, so that only k pairs, not the vocabulary, come back per token.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
pub use vela_compute::TopK;

/// Relative clearance between the top-p threshold and the cumulative probabilities around the
/// cut that [`Sampler::sample_top_k`] requires when top-p uses the full-row normalizer: a device
/// sums it in another order (relative difference ~1e-16, checked ≤ 1e-12 on the GPU), which must
/// not be able to move the cut.
const TOP_P_MARGIN: f64 = 1e-9;

/// Sampling settings (defaults: llama.cpp's).
#[derive(Clone, Debug)]
pub struct SamplerConfig {
    /// ≤ 0 means greedy.
    pub temperature: f32,
    /// 0 disables.
    pub top_k: usize,
    /// ≥ 1 disables.
    pub top_p: f32,
    /// ≤ 0 disables.
    pub min_p: f32,
    /// 1 disables. Applied to the last `penalty_last_n` tokens.
    pub repeat_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub penalty_last_n: usize,
    pub logit_bias: Vec<(u32, f32)>,
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            logit_bias: Vec::new(),
            seed: 0xC0FFEE,
        }
    }
}

impl SamplerConfig {
    /// Greedy with nothing that changes logits (no penalties, no bias): the next token is the
    /// argmax of the raw logits, which a GPU backend computes on the device.
    pub fn is_plain_greedy(&self) -> bool {
        self.temperature <= 0.0
            && self.repeat_penalty == 1.0
            && self.presence_penalty == 0.0
            && self.frequency_penalty == 0.0
            && self.logit_bias.is_empty()
    }

    /// Whether logit bias or penalties change the logits before selection (then sampling needs
    /// the whole row).
    pub fn changes_logits(&self) -> bool {
        self.repeat_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
            || !self.logit_bias.is_empty()
    }

    pub fn greedy() -> Self {
        SamplerConfig {
            temperature: 0.0,
            ..Default::default()
        }
    }
}

/// A candidate token with its (possibly modified) logit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub id: u32,
    pub logit: f32,
}

/// Min-heap entry ordered by logit then by id (reverse), so that ties keep the lower id.
#[derive(PartialEq)]
struct HeapItem(Candidate);
impl Eq for HeapItem {}
impl PartialOrd for HeapItem {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for HeapItem {
    fn cmp(&self, o: &Self) -> Ordering {
        // Reverse: the heap's max is the *worst* candidate.
        o.0.logit
            .total_cmp(&self.0.logit)
            .then(self.0.id.cmp(&o.0.id))
    }
}

/// The `k` highest logits, sorted descending (ties: lower id first).
pub fn top_k(logits: &[f32], k: usize) -> Vec<Candidate> {
    let k = k.min(logits.len());
    let mut heap: BinaryHeap<HeapItem> = BinaryHeap::with_capacity(k + 1);
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() {
            continue;
        }
        let c = Candidate {
            id: i as u32,
            logit: l,
        };
        if heap.len() < k {
            heap.push(HeapItem(c));
        } else if let Some(worst) = heap.peek() {
            if HeapItem(c).cmp(worst) == Ordering::Less {
                heap.pop();
                heap.push(HeapItem(c));
            }
        }
    }
    let mut v: Vec<Candidate> = heap.into_iter().map(|h| h.0).collect();
    v.sort_by(|a, b| b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id)));
    v
}

/// Index of the maximum logit (lowest id on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] || logits[best].is_nan() {
            best = i;
        }
    }
    best as u32
}

/// Softmax of sorted candidates (probabilities in the same order).
fn softmax(c: &[Candidate], temp: f32) -> Vec<f64> {
    let max = c.first().map(|c| c.logit).unwrap_or(0.0) as f64;
    let e: Vec<f64> = c
        .iter()
        .map(|c| ((c.logit as f64 - max) / temp as f64).exp())
        .collect();
    let z: f64 = e.iter().sum();
    e.into_iter().map(|x| x / z).collect()
}

/// Deterministic RNG (SplitMix64): same seed → same stream on every platform.
#[derive(Clone, Debug)]
pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A stateful sampler (keeps the penalty history and the RNG).
pub struct Sampler {
    pub cfg: SamplerConfig,
    rng: Rng,
    history: Vec<u32>,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Self {
        let rng = Rng::new(cfg.seed);
        Sampler {
            cfg,
            rng,
            history: Vec::new(),
        }
    }

    /// Record tokens (e.g. the prompt) for the repetition penalties.
    pub fn accept(&mut self, tok: u32) {
        self.history.push(tok);
    }

    /// Apply logit bias and penalties in place.
    pub fn apply_penalties(&self, logits: &mut [f32]) {
        for &(id, b) in &self.cfg.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += b;
            }
        }
        let c = &self.cfg;
        if c.repeat_penalty == 1.0 && c.presence_penalty == 0.0 && c.frequency_penalty == 0.0 {
            return;
        }
        let start = self.history.len().saturating_sub(c.penalty_last_n);
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &t in &self.history[start..] {
            *counts.entry(t).or_default() += 1;
        }
        for (&t, &n) in &counts {
            let Some(l) = logits.get_mut(t as usize) else {
                continue;
            };
            if c.repeat_penalty != 1.0 {
                if *l <= 0.0 {
                    *l *= c.repeat_penalty;
                } else {
                    *l /= c.repeat_penalty;
                }
            }
            *l -= n as f32 * c.frequency_penalty + c.presence_penalty;
        }
    }

    /// The candidate set after top-k/top-p/min-p with probabilities at the configured
    /// temperature (what [`Sampler::sample`] draws from). Exposed for tests and speculative decoding.
    pub fn candidates(&self, logits: &[f32]) -> (Vec<Candidate>, Vec<f64>) {
        let c = &self.cfg;
        let mut k = if c.top_k > 0 { c.top_k } else { logits.len() };
        let mut cand;
        let mut norm = None;
        if c.top_k == 0 && c.top_p < 1.0 {
            // Grow k until the kept mass (at temperature 1, as llama.cpp's top-p) reaches p.
            let (max, z) = full_norm(logits);
            norm = Some((max, z));
            k = 64.min(logits.len());
            loop {
                cand = top_k(logits, k);
                let kept: f64 = full_probs(&cand, max, z).iter().sum();
                if kept >= c.top_p as f64 || k >= logits.len() {
                    break;
                }
                k = (k * 4).min(logits.len());
            }
        } else {
            cand = top_k(logits, k);
        }
        self.filter(cand, norm)
    }

    /// The steps after top-k of [`Sampler::candidates`] on the sorted candidates `cand`: top-p
    /// (probabilities from the full-row softmax `norm = (max, sum exp(l - max))` when top-k is
    /// off, else over `cand`), min-p, then the probabilities at the temperature.
    fn filter(
        &self,
        mut cand: Vec<Candidate>,
        norm: Option<(f64, f64)>,
    ) -> (Vec<Candidate>, Vec<f64>) {
        let c = &self.cfg;
        if c.top_p < 1.0 {
            // llama.cpp normalizes over the current candidates (after top-k).
            let p = match norm {
                Some((max, z)) if c.top_k == 0 => full_probs(&cand, max, z),
                _ => softmax(&cand, 1.0),
            };
            let keep = top_p_keep(&p, c.top_p).unwrap_or(cand.len());
            cand.truncate(keep.max(1));
        }
        if c.min_p > 0.0 && !cand.is_empty() {
            let thresh = cand[0].logit + (c.min_p).ln();
            let keep = cand.iter().take_while(|x| x.logit >= thresh).count();
            cand.truncate(keep.max(1));
        }
        let probs = softmax(&cand, c.temperature.max(1e-6));
        (cand, probs)
    }

    /// The `k` that [`Sampler::sample_top_k`] needs from the device for this configuration
    /// (`cap`: the largest `k` the caller can get), or `None` when only the full logits do:
    /// greedy, logit bias or penalties, `top_k > cap`, or neither top-k, top-p nor min-p.
    pub fn device_top_k(&self, cap: usize) -> Option<usize> {
        let c = &self.cfg;
        if c.temperature <= 0.0 || c.changes_logits() || cap == 0 {
            return None;
        }
        if c.top_k > 0 {
            return (c.top_k <= cap).then_some(c.top_k);
        }
        (c.top_p < 1.0 || c.min_p > 0.0).then_some(cap)
    }

    /// The candidates [`Sampler::candidates`] would give for the full logits row that `t` was
    /// selected from (by [`vela_compute::top_k_row`] or a device), when `t` determines them:
    /// - top-k on: `t` holds the `top_k` best (`k ≥ top_k` was asked);
    /// - top-k off, top-p on: the cumulative full-row probability of `t`'s prefix reaches p
    ///   (or `t` is the whole row), clear of p by a relative margin of `TOP_P_MARGIN`, so that a
    ///   normalizer summed in another order cannot move the cut;
    /// - top-k and top-p off, min-p on: `t` reaches below the min-p threshold (or is the whole row).
    ///
    /// `None` otherwise (also for configurations [`Sampler::device_top_k`] rejects).
    pub fn candidates_from_top_k(&self, t: &TopK) -> Option<(Vec<Candidate>, Vec<f64>)> {
        let c = &self.cfg;
        if c.temperature <= 0.0 || c.changes_logits() {
            return None;
        }
        let complete = t.items.len() == t.n_valid;
        let mut cand: Vec<Candidate> = t
            .items
            .iter()
            .map(|&(id, logit)| Candidate { id, logit })
            .collect();
        if c.top_k > 0 {
            if cand.len() < c.top_k.min(t.n_valid) {
                return None;
            }
            cand.truncate(c.top_k);
            return Some(self.filter(cand, None));
        }
        if c.top_p < 1.0 {
            let norm = (t.max as f64, t.sum_exp);
            let p = full_probs(&cand, norm.0, norm.1);
            let top_p = c.top_p as f64;
            let mut cum = 0.0;
            let mut below = 0.0; // cumulative probability before the cut
            let mut keep = None;
            for (i, pi) in p.iter().enumerate() {
                below = cum;
                cum += pi;
                if cum >= top_p {
                    keep = Some(i + 1);
                    break;
                }
            }
            let clear = match keep {
                Some(_) => {
                    cum >= top_p * (1.0 + TOP_P_MARGIN) && below < top_p * (1.0 - TOP_P_MARGIN)
                }
                None => complete && cum < top_p * (1.0 - TOP_P_MARGIN),
            };
            if !clear {
                return None;
            }
            if let Some(keep) = keep {
                cand.truncate(keep);
            }
            return Some(self.filter(cand, Some(norm)));
        }
        if c.min_p > 0.0 && !complete {
            let thresh = cand.first()?.logit + (c.min_p).ln();
            if cand.last()?.logit >= thresh {
                return None;
            }
        } else if !complete {
            return None;
        }
        Some(self.filter(cand, None))
    }

    /// Whether [`Sampler::sample_top_k`] can draw from `t` (else the full logits are needed).
    pub fn top_k_suffices(&self, t: &TopK) -> bool {
        self.candidates_from_top_k(t).is_some()
    }

    /// Draw the next token from the top-k selection `t` of a logits row: exactly the token
    /// [`Sampler::sample`] would draw from the row (same RNG use and history), or `None`, with
    /// nothing consumed, when `t` does not determine it ([`Sampler::candidates_from_top_k`]).
    pub fn sample_top_k(&mut self, t: &TopK) -> Option<u32> {
        let (cand, probs) = self.candidates_from_top_k(t)?;
        let tok = self.draw(&cand, &probs);
        self.history.push(tok);
        Some(tok)
    }

    /// One draw from the candidates' probabilities.
    fn draw(&mut self, cand: &[Candidate], probs: &[f64]) -> u32 {
        let u = self.rng.uniform();
        let mut cum = 0.0;
        let mut pick = cand.last().map(|c| c.id).unwrap_or(0);
        for (c, p) in cand.iter().zip(probs) {
            cum += p;
            if u < cum {
                pick = c.id;
                break;
            }
        }
        pick
    }

    /// Pick the next token from `logits` (modified in place by bias/penalties).
    pub fn sample(&mut self, logits: &mut [f32]) -> u32 {
        self.apply_penalties(logits);
        let tok = if self.cfg.temperature <= 0.0 {
            argmax(logits)
        } else {
            let (cand, probs) = self.candidates(logits);
            self.draw(&cand, &probs)
        };
        self.history.push(tok);
        tok
    }
}

/// Index after the first candidate at which the cumulative probability reaches `top_p`.
fn top_p_keep(p: &[f64], top_p: f32) -> Option<usize> {
    let mut cum = 0.0;
    for (i, pi) in p.iter().enumerate() {
        cum += pi;
        if cum >= top_p as f64 {
            return Some(i + 1);
        }
    }
    None
}

/// The full-vocabulary softmax's max and normalizer at temperature 1 (NaNs skipped).
fn full_norm(logits: &[f32]) -> (f64, f64) {
    let max = logits
        .iter()
        .cloned()
        .filter(|x| !x.is_nan())
        .fold(f32::NEG_INFINITY, f32::max) as f64;
    let z: f64 = logits
        .iter()
        .filter(|x| !x.is_nan())
        .map(|&l| (l as f64 - max).exp())
        .sum();
    (max, z)
}

/// Probabilities of the candidates under the full-vocabulary softmax ([`full_norm`]).
fn full_probs(cand: &[Candidate], max: f64, z: f64) -> Vec<f64> {
    cand.iter()
        .map(|c| (c.logit as f64 - max).exp() / z)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits(n: usize, seed: u64) -> Vec<f32> {
        let mut r = Rng::new(seed);
        (0..n).map(|_| (r.uniform() * 20.0 - 10.0) as f32).collect()
    }

    /// Reference: full sort, then the textbook filters.
    fn reference(l: &[f32], cfg: &SamplerConfig) -> Vec<u32> {
        let mut all: Vec<Candidate> = l
            .iter()
            .enumerate()
            .map(|(i, &x)| Candidate {
                id: i as u32,
                logit: x,
            })
            .collect();
        all.sort_by(|a, b| b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id)));
        if cfg.top_k > 0 {
            all.truncate(cfg.top_k);
        }
        if cfg.top_p < 1.0 {
            let max = all[0].logit as f64;
            let z: f64 = all.iter().map(|c| (c.logit as f64 - max).exp()).sum();
            let mut cum = 0.0;
            let mut keep = all.len();
            for (i, c) in all.iter().enumerate() {
                cum += (c.logit as f64 - max).exp() / z;
                if cum >= cfg.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            all.truncate(keep);
        }
        if cfg.min_p > 0.0 {
            let top = all[0].logit;
            all.retain(|c| c.logit >= top + cfg.min_p.ln());
        }
        all.iter().map(|c| c.id).collect()
    }

    #[test]
    fn candidate_sets_equal_full_sort() {
        for seed in 0..40u64 {
            let l = logits(5000 + seed as usize * 37, seed);
            for (k, p, m) in [
                (40, 1.0, 0.0),
                (0, 0.9, 0.0),
                (0, 0.5, 0.05),
                (50, 0.95, 0.05),
                (0, 1.0, 0.1),
                (1, 1.0, 0.0),
                (7, 0.3, 0.0),
            ] {
                let cfg = SamplerConfig {
                    top_k: k,
                    top_p: p,
                    min_p: m,
                    temperature: 1.0,
                    ..Default::default()
                };
                let s = Sampler::new(cfg.clone());
                let (c, probs) = s.candidates(&l);
                let got: Vec<u32> = c.iter().map(|c| c.id).collect();
                assert_eq!(got, reference(&l, &cfg), "seed {seed} k {k} p {p} m {m}");
                assert!((probs.iter().sum::<f64>() - 1.0).abs() < 1e-9);
            }
        }
    }

    #[test]
    fn same_seed_same_stream_and_greedy_is_argmax() {
        let l = logits(1000, 3);
        let draw = |seed| {
            let mut s = Sampler::new(SamplerConfig {
                seed,
                temperature: 1.0,
                ..Default::default()
            });
            (0..50)
                .map(|_| s.sample(&mut l.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
        let mut g = Sampler::new(SamplerConfig::greedy());
        assert_eq!(g.sample(&mut l.clone()), argmax(&l));
    }

    #[test]
    fn sampling_frequencies_follow_probabilities() {
        let l = vec![1.0f32, 2.0, 3.0, 0.5];
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..Default::default()
        });
        let mut counts = [0usize; 4];
        let n = 200_000;
        for _ in 0..n {
            counts[s.sample(&mut l.clone()) as usize] += 1;
        }
        let z: f64 = l.iter().map(|&x| (x as f64).exp()).sum();
        for i in 0..4 {
            let p = (l[i] as f64).exp() / z;
            let f = counts[i] as f64 / n as f64;
            assert!((p - f).abs() < 0.005, "token {i}: p {p} f {f}");
        }
    }

    #[test]
    fn penalties_and_bias() {
        let mut s = Sampler::new(SamplerConfig {
            repeat_penalty: 2.0,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            logit_bias: vec![(3, -100.0)],
            ..SamplerConfig::greedy()
        });
        s.accept(0);
        s.accept(0);
        s.accept(1);
        let mut l = vec![4.0f32, -2.0, 1.0, 50.0];
        s.apply_penalties(&mut l);
        assert_eq!(
            l,
            vec![4.0 / 2.0 - 0.5 - 0.5, -2.0 * 2.0 - 0.25 - 0.5, 1.0, -50.0]
        );
    }
}
