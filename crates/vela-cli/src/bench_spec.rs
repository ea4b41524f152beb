//! `vela bench --spec-cost` / `--spec-accept`: the numbers of speculative decoding's cost model.
//!
//! `--spec-cost`: at `--depth` tokens of context, the time of one forward over K + 1 tokens
//! (a verification of K drafts) for K = 0..=`--draft-max`, relative to K = 0 (one decode step);
//! sizes interleaved, `-r` rounds, the state restored from a checkpoint before each forward.
//!
//! `--spec-accept 0.5,0.7,0.9`: greedy generation of `-n` tokens after a `--depth`-token prompt,
//! plain and speculative, interleaved, `-r` rounds. The drafter is the model's own (its MTP
//! head, so drafting costs what it really costs) with its proposals replaced by the plain greedy
//! answer, each draft right with that probability (else a wrong token); without an MTP head the
//! drafts are free. Each acceptance runs at every fixed K = 1..=`--draft-max` and with the depth
//! cost model (`adaptive`). Output identical to plain decoding is checked on every run.

use crate::bench::{stats, BenchArgs};
use crate::common::Loaded;
use anyhow::{bail, Result};
use std::time::Instant;
use vela_engine::sampler::Rng;
use vela_engine::speculative::{
    generate_speculative, AcceptRule, DepthModel, Draft, Drafter, Propose, SpecOptions,
};
use vela_engine::{generate, GenerateOptions, Sampler, SamplerConfig, Session};

fn random_tokens(rng: &mut Rng, n_vocab: usize, n: usize) -> Vec<u32> {
    (0..n)
        .map(|_| (rng.next_u64() % n_vocab as u64) as u32)
        .collect()
}

/// `--spec-cost`.
pub fn spec_cost(a: &BenchArgs, l: &Loaded) -> Result<()> {
    let mut s = l.session()?;
    let k_max = a.draft_max.min(s.ubatch().saturating_sub(1));
    if k_max == 0 {
        bail!("--spec-cost needs --draft-max ≥ 1 and --ubatch ≥ 2");
    }
    let mut rng = Rng::new(7);
    let nv = l.model.n_vocab();
    s.eval(&random_tokens(&mut rng, nv, a.depth.max(1)))?;
    let cp = s.checkpoint();
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); k_max + 1];
    // One warm-up round (each size once), then the measured ones; the order of the sizes
    // alternates between rounds.
    for rep in 0..=a.reps {
        let order: Vec<usize> = if rep % 2 == 0 {
            (0..=k_max).collect()
        } else {
            (0..=k_max).rev().collect()
        };
        for k in order {
            s.restore(&cp)?;
            let batch = random_tokens(&mut rng, nv, k + 1);
            let t = Instant::now();
            s.eval_all_logits(&batch)?;
            if rep > 0 {
                times[k].push(t.elapsed().as_secs_f64());
            }
        }
    }
    let med = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let base = med(&times[0]);
    println!(
        "| K | forward of K+1 tokens, ms (median, min–max) | / one decode step |\n|---:|---|---:|"
    );
    for (k, v) in times.iter().enumerate() {
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, 0f64), |(a, b), &x| (a.min(x), b.max(x)));
        println!(
            "| {k} | {:.3} ({:.3}–{:.3}) | {:.3} |",
            med(v) * 1e3,
            lo * 1e3,
            hi * 1e3,
            med(v) / base
        );
    }
    println!(
        "(depth {}, {} rounds, {})",
        a.depth,
        a.reps,
        l.model.backend_name()
    );
    Ok(())
}

/// Drafts the plain answer, each draft right with probability `p`, through the model's own
/// drafter when it has one (its compute runs, its proposals are replaced).
struct Forced {
    inner: Option<Box<dyn Drafter>>,
    answer: Vec<u32>,
    prompt_len: usize,
    p: f64,
    rng: Rng,
    n_vocab: usize,
}

impl Forced {
    fn one_hot(&mut self, at: usize) -> Vec<f32> {
        let want = self.answer.get(at).copied().unwrap_or(0);
        let tok = if self.rng.uniform() < self.p {
            want
        } else {
            (want + 1) % self.n_vocab as u32
        };
        let mut lg = vec![-1e9f32; self.n_vocab];
        lg[tok as usize] = 0.0;
        lg
    }
}

impl Drafter for Forced {
    fn sync(&mut self, target: &Session, row: usize) -> Result<()> {
        match &mut self.inner {
            Some(d) => d.sync(target, row),
            None => Ok(()),
        }
    }
    fn draft(
        &mut self,
        target: &mut Session,
        last: u32,
        k: usize,
        propose: Propose,
    ) -> Result<Vec<Draft>> {
        // The answer's index of the first draft: the target holds prompt + answer[..i], `last`
        // is answer[i].
        let first = target.n_past() + 1 - self.prompt_len;
        let mut inner = self.inner.take();
        let mut i = 0;
        let out = match &mut inner {
            Some(d) => d.draft(target, last, k, &mut |_lg| {
                let lg = self.one_hot(first + i);
                i += 1;
                propose(lg)
            }),
            None => (0..k)
                .map(|j| {
                    let lg = self.one_hot(first + j);
                    propose(lg)
                })
                .collect(),
        };
        self.inner = inner;
        out
    }
}

/// A speculative variant: the acceptance probability and a fixed depth (`None`: adaptive).
type Forcing = (f64, Option<usize>);

/// `--spec-accept`.
pub fn spec_accept(a: &BenchArgs, l: &Loaded) -> Result<()> {
    if a.n_gen < 2 {
        bail!("--spec-accept needs -n ≥ 2");
    }
    if a.spec_accept.iter().any(|p| !(0.0..=1.0).contains(p)) {
        bail!("--spec-accept takes probabilities in [0, 1]");
    }
    let nv = l.model.n_vocab();
    let mut rng = Rng::new(11);
    let prompt = random_tokens(&mut rng, nv, a.depth.max(1));
    let cfg = SamplerConfig::greedy();
    let never = |_: u32| false;
    // Every run starts after the prompt but its last token (not timed).
    let (head, last) = prompt.split_at(prompt.len() - 1);
    let plain = |s: &mut Session| -> Result<Vec<u32>> {
        let mut sampler = Sampler::new(cfg.clone());
        let o = GenerateOptions {
            max_tokens: a.n_gen,
            is_eog: &never,
        };
        Ok(generate(s, &mut sampler, last, &o, &mut |_| true)?.0)
    };
    let mut s = l.session()?;
    if !head.is_empty() {
        s.eval(head)?;
    }
    let answer = plain(&mut s)?;
    // The model's own drafter where it was found (an assistant or MTP file beside the model).
    let mtp = l.model.discover_mtp(&l.path);
    let k_max = a
        .draft_max
        .min(s.ubatch().saturating_sub(1))
        .min(s.rollback_limit());
    // Variants: plain, then per acceptance every fixed K and the cost model.
    let mut variants: Vec<(String, Option<Forcing>)> = vec![("plain".into(), None)];
    for &p in &a.spec_accept {
        for k in 1..=k_max {
            variants.push((format!("p={p} K={k}"), Some((p, Some(k)))));
        }
        variants.push((format!("p={p} adaptive"), Some((p, None))));
    }
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    let mut accepted: Vec<(usize, usize)> = vec![(0, 0); variants.len()];
    let depths: Vec<DepthModel> = variants.iter().map(|_| DepthModel::new(k_max)).collect();
    for rep in 0..=a.reps {
        for (vi, (name, v)) in variants.iter().enumerate() {
            s.reset();
            if !head.is_empty() {
                s.eval(head)?;
            }
            let t = Instant::now();
            let out = match v {
                None => plain(&mut s)?,
                Some((p, k)) => {
                    let inner = match &mtp {
                        Some(p) => Some(vela_engine::speculative::load_mtp(&s, p)?),
                        None => None,
                    };
                    let mut d = Forced {
                        inner,
                        answer: answer.clone(),
                        prompt_len: prompt.len(),
                        p: *p,
                        rng: Rng::new(1000 + rep as u64),
                        n_vocab: nv,
                    };
                    let opts = SpecOptions {
                        max_tokens: a.n_gen,
                        draft_max: k.unwrap_or(k_max),
                        depth: k.is_none().then(|| &depths[vi]),
                        is_eog: &never,
                        rule: AcceptRule::Exact,
                    };
                    let (out, _, st) =
                        generate_speculative(&mut s, &mut d, &cfg, last, &opts, &mut |_| true)?;
                    if rep > 0 {
                        accepted[vi].0 += st.accepted;
                        accepted[vi].1 += st.drafted;
                    }
                    out
                }
            };
            let dt = t.elapsed().as_secs_f64();
            if out != answer {
                bail!("{name}: the output differs from plain greedy decoding");
            }
            if rep > 0 {
                rates[vi].push(a.n_gen as f64 / dt);
            }
        }
    }
    let (base, _) = stats(&rates[0]);
    println!(
        "| variant | t/s (mean ± sd, {} tokens) | / plain | drafts kept |\n|---|---|---:|---|",
        a.n_gen
    );
    for (vi, (name, _)) in variants.iter().enumerate() {
        let (m, sd) = stats(&rates[vi]);
        let (k, d) = accepted[vi];
        let kept = if d > 0 {
            format!("{k}/{d} ({:.0} %)", 100.0 * k as f64 / d as f64)
        } else {
            "-".into()
        };
        println!("| {name} | {m:.2} ± {sd:.2} | {:.3} | {kept} |", m / base);
    }
    println!(
        "(drafter: {}; prompt {} tokens; {} rounds; {})",
        if mtp.is_some() {
            "the model's MTP head, proposals forced"
        } else {
            "free oracle drafts"
        },
        prompt.len(),
        a.reps,
        l.model.backend_name()
    );
    Ok(())
}
