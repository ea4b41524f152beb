//! Helpers shared by the speculative-decoding tests: a speculative run, the exact distribution of
//! three sampled tokens under plain decoding and a χ² goodness-of-fit test against it.
#![allow(dead_code)]

pub mod hybrid;
pub mod mtp;

use std::collections::HashMap;
use vela_engine::speculative::{
    generate_speculative, position_dist, AcceptRule, Drafter, SpecOptions, SpecStats,
};
use vela_engine::{SamplerConfig, Session};

/// `n` tokens after `prompt` with `drafter`, `k` drafts per round (no depth model, no end
/// token); checks that every token went through the callback.
pub fn spec(
    s: &mut Session,
    drafter: &mut dyn Drafter,
    cfg: &SamplerConfig,
    prompt: &[u32],
    n: usize,
    k: usize,
    rule: AcceptRule,
) -> (Vec<u32>, SpecStats) {
    let opts = SpecOptions {
        depth: None,
        max_tokens: n,
        draft_max: k,
        is_eog: &|_| false,
        rule,
    };
    let mut streamed = Vec::new();
    let (out, _, stats) = generate_speculative(s, drafter, cfg, prompt, &opts, &mut |t| {
        streamed.push(t);
        true
    })
    .unwrap();
    assert_eq!(streamed, out, "every token goes through the callback");
    (out, stats)
}

/// Upper tail of the χ² distribution (Wilson–Hilferty normal approximation; fine for the
/// p-value scale these tests need).
pub fn chi2_sf(x: f64, df: f64) -> f64 {
    let z = ((x / df).powf(1.0 / 3.0) - (1.0 - 2.0 / (9.0 * df))) / (2.0 / (9.0 * df)).sqrt();
    0.5 * erfc(z / std::f64::consts::SQRT_2)
}

fn erfc(x: f64) -> f64 {
    // Numerical Recipes' erfc (fractional error < 1.2e-7).
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

/// Exact probabilities of the first three tokens after `prompt` under plain decoding with
/// `cfg` (`s` is a fresh session of the target).
pub fn exact_triples(
    s: &mut Session,
    cfg: &SamplerConfig,
    prompt: &[u32],
) -> HashMap<[u32; 3], f64> {
    let mut out = HashMap::new();
    let mut l0 = s.eval(prompt).unwrap();
    let d0 = position_dist(cfg, prompt, &[], &mut l0);
    for (&a, &pa) in d0.ids.iter().zip(&d0.probs) {
        s.truncate(prompt.len()).unwrap();
        let mut l1 = s.eval(&[a]).unwrap();
        let d1 = position_dist(cfg, prompt, &[a], &mut l1);
        for (&b, &pb) in d1.ids.iter().zip(&d1.probs) {
            s.truncate(prompt.len() + 1).unwrap();
            let mut l2 = s.eval(&[b]).unwrap();
            let d2 = position_dist(cfg, prompt, &[a, b], &mut l2);
            for (&c, &pc) in d2.ids.iter().zip(&d2.probs) {
                out.insert([a, b, c], pa * pb * pc);
            }
        }
    }
    out
}

/// χ² of `n` observed triples against `exact`: cells with an expected count ≥ 5, the rest
/// (and triples outside `exact`) pooled into one. Returns (χ², p-value, cells).
pub fn chi2_fit(
    exact: &HashMap<[u32; 3], f64>,
    counts: &HashMap<[u32; 3], usize>,
    n: usize,
) -> (f64, f64, usize) {
    let (mut chi2, mut cells) = (0.0, 0);
    let (mut pool_e, mut pool_o) = (0.0, 0usize);
    for (k, &p) in exact {
        let e = p * n as f64;
        let o = counts.get(k).copied().unwrap_or(0);
        if e >= 5.0 {
            chi2 += (o as f64 - e).powi(2) / e;
            cells += 1;
        } else {
            pool_e += e;
            pool_o += o;
        }
    }
    let outside: usize = counts
        .iter()
        .filter(|(k, _)| !exact.contains_key(*k))
        .map(|(_, &c)| c)
        .sum();
    pool_o += outside;
    if pool_e > 0.0 {
        chi2 += (pool_o as f64 - pool_e).powi(2) / pool_e.max(1e-9);
        cells += 1;
    }
    (chi2, chi2_sf(chi2, (cells - 1) as f64), cells)
}
