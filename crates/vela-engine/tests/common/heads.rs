//! Tests of a model's own drafter (an MTP layer, DSpark) on a tiny fixture directory whose
//! checkpoint carries it: greedy speculation equal to plain decoding, sampled speculation
//! distributed as plain decoding (χ², always-accept caught), and the drafter's cache after
//! speculation, rollbacks and restored checkpoints equal to a plain evaluation's.
//!
//! Fixture drafters have random weights, so their drafts are nearly always rejected; [`Guided`]
//! blends their logits with the target's own (evaluated by a second session), so that rounds
//! also keep one, several or all drafts while the drafter still runs every step.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use vela_compute::KvType;
use vela_engine::speculative::{load_mtp, AcceptRule, Draft, Drafter, Propose, SpecStats};
use vela_engine::{generate, GenerateOptions, Sampler, SamplerConfig, Session, SessionOptions};
use vela_models::LanguageModel;

pub fn session(m: &Arc<dyn LanguageModel>, ubatch: usize) -> Session {
    let opts = SessionOptions {
        n_ctx: 512,
        ubatch,
        kv_type: KvType::F32,
    };
    Session::new(m.clone(), &opts).unwrap()
}

fn never(_: u32) -> bool {
    false
}

/// A drafter with its logits blended with the target's (`w`: the drafter's weight).
pub struct Guided {
    inner: Box<dyn Drafter>,
    oracle: Session,
    w: f32,
}

impl Drafter for Guided {
    fn sync(&mut self, target: &Session, row: usize) -> anyhow::Result<()> {
        self.inner.sync(target, row)
    }
    fn draft(
        &mut self,
        target: &mut Session,
        last: u32,
        k: usize,
        propose: Propose,
    ) -> anyhow::Result<Vec<Draft>> {
        self.oracle.follow(target.tokens())?;
        let mut target_logits = self.oracle.eval(&[last])?;
        let (oracle, w) = (&mut self.oracle, self.w);
        self.inner.draft(target, last, k, &mut |lg: Vec<f32>| {
            let mix = lg
                .iter()
                .zip(&target_logits)
                .map(|(a, b)| w * a + b)
                .collect();
            let d = propose(mix)?;
            target_logits = oracle.eval(&[d.token])?;
            Ok(d)
        })
    }
}

/// The model's own drafter from `dir`, guided (weight 0.5) or not.
pub fn drafter(m: &Arc<dyn LanguageModel>, dir: &Path, guided: bool) -> Box<dyn Drafter> {
    guided_drafter(m, dir, guided.then_some(0.5))
}

/// The model's own drafter from `dir`, guided with weight `w` when given.
pub fn guided_drafter(m: &Arc<dyn LanguageModel>, dir: &Path, w: Option<f32>) -> Box<dyn Drafter> {
    let probe = session(m, 8);
    let inner = load_mtp(&probe, dir).unwrap();
    match w {
        Some(w) => Box::new(Guided {
            inner,
            oracle: session(m, 8),
            w,
        }),
        None => inner,
    }
}

/// The drafter's logits of up to `k` greedy drafts after `s`'s tokens, `last` following them.
pub fn drafts(
    m: &Arc<dyn LanguageModel>,
    dir: &Path,
    s: &mut Session,
    last: u32,
    k: usize,
) -> Vec<Vec<f32>> {
    let mut head = m.load_mtp(dir).unwrap();
    let pos = s.n_past();
    let mut out = Vec::new();
    head.draft(s.state_mut(), last, pos, k, &mut |lg| {
        let t = lg
            .iter()
            .enumerate()
            .fold(
                (0, f32::NEG_INFINITY),
                |b, (i, &x)| if x > b.1 { (i, x) } else { b },
            )
            .0;
        out.push(lg);
        Ok(t as u32)
    })
    .unwrap();
    out
}

/// The same drafts from a fresh session that evaluated `s`'s tokens 16 at a time.
pub fn assert_cache_as_plain(m: &Arc<dyn LanguageModel>, dir: &Path, s: &mut Session, what: &str) {
    let toks = s.tokens().to_vec();
    let mut fresh = session(m, 16);
    for c in toks.chunks(16) {
        fresh.eval(c).unwrap();
    }
    let last = toks[toks.len() / 2];
    let a = drafts(m, dir, s, last, 2);
    let b = drafts(m, dir, &mut fresh, last, 2);
    assert!(!a.is_empty(), "{what}: no draft");
    assert_eq!(
        a, b,
        "{what}: the drafter's cache differs from a plain evaluation's"
    );
}

/// Greedy speculation with K = 1..=`k_max`, plain and guided (weight `w`), gives plain greedy
/// decoding's `n` tokens after `p`, and leaves the drafter's cache as a plain evaluation does.
pub fn greedy_matches_plain(
    m: &Arc<dyn LanguageModel>,
    dir: &Path,
    p: &[u32],
    n: usize,
    k_max: usize,
    w: f32,
) {
    let cfg = SamplerConfig::greedy();
    let want = {
        let mut s = session(m, 8);
        let mut sampler = Sampler::new(cfg.clone());
        let o = GenerateOptions {
            max_tokens: n,
            is_eog: &never,
        };
        generate(&mut s, &mut sampler, p, &o, &mut |_| true)
            .unwrap()
            .0
    };
    for guided in [false, true] {
        for k in 1..=k_max {
            let mut s = session(m, 8);
            let mut d = guided_drafter(m, dir, guided.then_some(w));
            let (got, st) = super::spec(&mut s, &mut *d, &cfg, p, n, k, AcceptRule::Exact);
            eprintln!(
                "guided {guided} K={k}: {} rounds, {}/{} accepted, per round {:?}",
                st.rounds, st.accepted, st.drafted, st.per_round
            );
            assert_eq!(
                got, want,
                "guided {guided} K={k}: differs from plain greedy"
            );
            assert!(st.drafted > st.accepted, "rejections exercised");
            if guided && k > 1 {
                assert!(st.per_round[k] > 0, "whole rounds accepted: {st:?}");
            }
            assert_cache_as_plain(m, dir, &mut s, &format!("guided {guided} K={k}"));
        }
    }
}

/// The drafter's cache after a restored checkpoint and after a rollback (`long`: ≥ 110 tokens).
pub fn cache_survives_checkpoints(m: &Arc<dyn LanguageModel>, dir: &Path, long: &[u32]) {
    let _head = m.load_mtp(dir).unwrap();
    let mut s = session(m, 16);
    s.eval(&long[..70]).unwrap();
    let cp = s.checkpoint();
    s.eval(&[5, 6, 7, 8, 9, 10, 11]).unwrap();
    s.restore(&cp).unwrap();
    s.eval(&long[70..100]).unwrap();
    assert_cache_as_plain(m, dir, &mut s, "after a restored checkpoint");
    // Within the rollback limit, without a checkpoint.
    s.eval(&[5, 6, 7]).unwrap();
    s.truncate(100).unwrap();
    s.eval(&long[100..110]).unwrap();
    assert_cache_as_plain(m, dir, &mut s, "after a rollback");
}

/// χ² of three tokens sampled after `p` with speculation (K = 2) against plain decoding's
/// exact distribution: (χ², p-value, cells, counters).
pub fn chi2_run(
    m: &Arc<dyn LanguageModel>,
    dir: &Path,
    p: &[u32],
    guided: bool,
    rule: AcceptRule,
    n: usize,
) -> (f64, f64, usize, SpecStats) {
    let base = SamplerConfig {
        temperature: 1.0,
        top_k: 6,
        top_p: 0.9,
        min_p: 0.0,
        ..Default::default()
    };
    let exact = super::exact_triples(&mut session(m, 8), &base, p);
    let mut counts: HashMap<[u32; 3], usize> = HashMap::new();
    let mut s = session(m, 4);
    s.eval(&p[..p.len() - 1]).unwrap();
    let mut d = drafter(m, dir, guided);
    let mut total = SpecStats::default();
    for i in 0..n {
        s.truncate(p.len() - 1).unwrap();
        let cfg = SamplerConfig {
            seed: 1000 + i as u64,
            ..base.clone()
        };
        let (out, st) = super::spec(&mut s, &mut *d, &cfg, &p[p.len() - 1..], 3, 2, rule);
        total.drafted += st.drafted;
        total.accepted += st.accepted;
        *counts.entry([out[0], out[1], out[2]]).or_default() += 1;
    }
    let (chi2, pv, cells) = super::chi2_fit(&exact, &counts, n);
    (chi2, pv, cells, total)
}

/// [`chi2_run`] plain and guided with the exact rule (p > 1e-3), then the always-accept rule
/// caught (p < 1e-6).
pub fn sampled_matches_plain(m: &Arc<dyn LanguageModel>, dir: &Path, p: &[u32], n: usize) {
    for guided in [false, true] {
        let (chi2, pv, cells, st) = chi2_run(m, dir, p, guided, AcceptRule::Exact, n);
        eprintln!(
            "guided {guided}, exact rule: χ² {chi2:.1} over {cells} cells, p = {pv:.3}; {}/{} accepted",
            st.accepted, st.drafted
        );
        assert!(st.drafted > st.accepted, "rejections exercised");
        if guided {
            assert!(st.accepted > st.drafted / 5, "acceptances exercised");
        }
        assert!(pv > 1e-3, "guided {guided}: χ² {chi2:.1}, p {pv:.2e}");
    }
    let (chi2, pv, cells, _) = chi2_run(m, dir, p, true, AcceptRule::AlwaysAccept, n);
    eprintln!("always-accept: χ² {chi2:.1} over {cells} cells, p = {pv:.3e}");
    assert!(pv < 1e-6, "always-accept not caught: p {pv:.2e}");
}
