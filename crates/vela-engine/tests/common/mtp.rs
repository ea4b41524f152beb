//! Speculative decoding with a model's own drafter whose cache is part of the sequence state (an
//! MTP layer, DSpark's stages), on a tiny fixture with random drafter weights: greedy output identical to plain decoding, sampled
//! output distributed as plain decoding (χ², with the always-accept control caught), and the MTP
//! layer's cache after speculation, rollbacks and a restored checkpoint equal to the one a plain
//! evaluation of the same tokens leaves.
//!
//! Random MTP weights make drafts that are nearly always rejected; a second drafter blends their
//! logits with the target's own (evaluated by a second session), so that rounds also keep one,
//! several or all drafts while the layer still runs every step.

use super::{chi2_fit, exact_triples, spec};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use vela_compute::cpu::CpuBackend;
use vela_compute::KvType;
use vela_engine::speculative::{load_mtp, AcceptRule, Draft, Drafter, Propose, SpecStats};
use vela_engine::{generate, GenerateOptions, Sampler, SamplerConfig, Session, SessionOptions};
use vela_formats::testdata;
use vela_models::LanguageModel;

/// `$VELA_CACHE/golden/<set>/mtp/` when it holds `mtp_chain.json`.
pub fn fixture(set: &str) -> Option<PathBuf> {
    testdata::require(testdata::golden_dir().join(set).join("mtp/mtp_chain.json"))
        .map(|p| p.parent().unwrap().to_path_buf())
}

pub fn model(dir: &Path) -> Arc<dyn LanguageModel> {
    vela_models::load_hf_any(Arc::new(CpuBackend::new(1)), dir).unwrap()
}

/// A prompt of the fixture's `prompts.json`.
pub fn prompt(dir: &Path, name: &str) -> Vec<u32> {
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("prompts.json")).unwrap()).unwrap();
    j["prompts"][name]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

pub fn session(m: &Arc<dyn LanguageModel>, ubatch: usize) -> Session {
    let opts = SessionOptions {
        n_ctx: 512,
        ubatch,
        kv_type: KvType::F32,
    };
    Session::new(m.clone(), &opts).unwrap()
}

pub fn never(_: u32) -> bool {
    false
}

/// The MTP drafter with its logits blended with the target's (`w`: the MTP's weight).
struct Guided {
    mtp: Box<dyn Drafter>,
    oracle: Session,
    w: f32,
}

impl Drafter for Guided {
    fn sync(&mut self, target: &Session, row: usize) -> anyhow::Result<()> {
        self.mtp.sync(target, row)
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
        self.mtp.draft(target, last, k, &mut |lg: Vec<f32>| {
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

/// The model's MTP drafter (bound through a small session), or the guided one.
pub fn drafter(m: &Arc<dyn LanguageModel>, dir: &Path, guided: bool) -> Box<dyn Drafter> {
    guided_drafter(m, dir, guided.then_some(0.5))
}

/// The model's own drafter, guided with weight `w` when given.
pub fn guided_drafter(m: &Arc<dyn LanguageModel>, dir: &Path, w: Option<f32>) -> Box<dyn Drafter> {
    let probe = session(m, 8);
    let mtp = load_mtp(&probe, dir).unwrap();
    match w {
        Some(w) => Box::new(Guided {
            mtp,
            oracle: session(m, 8),
            w,
        }),
        None => mtp,
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
        let t = (0..lg.len()).fold(0, |b, j| if lg[j] > lg[b] { j } else { b });
        out.push(lg);
        Ok(t as u32)
    })
    .unwrap();
    out
}

/// The MTP layer's first-draft logits after `s`'s tokens, `last` following them.
fn first_draft(m: &Arc<dyn LanguageModel>, dir: &Path, s: &mut Session, last: u32) -> Vec<f32> {
    let mut head = m.load_mtp(dir).unwrap();
    let pos = s.n_past();
    let mut out = Vec::new();
    head.draft(s.state_mut(), last, pos, 1, &mut |lg| {
        out = lg;
        Ok(0)
    })
    .unwrap();
    out
}

/// The same first draft from a fresh session that evaluated `s`'s tokens 16 at a time.
pub fn assert_cache_as_plain(m: &Arc<dyn LanguageModel>, dir: &Path, s: &mut Session, what: &str) {
    let toks = s.tokens().to_vec();
    let mut fresh = session(m, 16);
    for c in toks.chunks(16) {
        fresh.eval(c).unwrap();
    }
    let last = toks[toks.len() / 2];
    let a = first_draft(m, dir, s, last);
    let b = first_draft(m, dir, &mut fresh, last);
    assert_eq!(
        a, b,
        "{what}: the MTP cache differs from a plain evaluation's"
    );
}

/// Greedy speculation with the MTP drafter and the guided one, K = 1..=4, after the `mid`
/// prompt: plain greedy decoding's tokens, rejections (and, guided, whole rounds accepted)
/// exercised, the MTP cache afterwards as a plain evaluation leaves it.
pub fn greedy_equals_plain(dir: &Path, n: usize) {
    greedy_equals_plain_with(&model(dir), dir, &prompt(dir, "mid"), n, 4, 0.5);
}

/// [`greedy_equals_plain`] for a loaded model, a prompt, K = 1..=`k_max` and the guided
/// drafter's weight `w`.
pub fn greedy_equals_plain_with(
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
            let (got, st) = spec(&mut s, &mut *d, &cfg, p, n, k, AcceptRule::Exact);
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

/// With the drafter bound: a detour undone by restoring a checkpoint, then one dropped within
/// the rollback limit; each time the MTP cache as a plain evaluation leaves it.
pub fn cache_survives_a_restored_checkpoint(dir: &Path) {
    cache_survives_with(&model(dir), dir, &prompt(dir, "long"));
}

/// [`cache_survives_a_restored_checkpoint`] for a loaded model and a prompt of > 100 tokens.
pub fn cache_survives_with(m: &Arc<dyn LanguageModel>, dir: &Path, long: &[u32]) {
    let _head = m.load_mtp(dir).unwrap();
    let mut s = session(m, 16);
    s.eval(&long[..70]).unwrap();
    let cp = s.checkpoint();
    s.eval(&[5, 6, 7, 8, 9, 10, 11]).unwrap();
    s.restore(&cp).unwrap();
    s.eval(&long[70..100]).unwrap();
    assert_cache_as_plain(m, dir, &mut s, "after a restored checkpoint");
    s.eval(&[5, 6, 7]).unwrap();
    s.truncate(100).unwrap();
    s.eval(&long[100..]).unwrap();
    assert_cache_as_plain(m, dir, &mut s, "after a rollback");
}

fn chi2_run(
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
    let exact = exact_triples(&mut session(m, 8), &base, p);
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
        let (out, st) = spec(&mut s, &mut *d, &cfg, &p[p.len() - 1..], 3, 2, rule);
        total.drafted += st.drafted;
        total.accepted += st.accepted;
        *counts.entry([out[0], out[1], out[2]]).or_default() += 1;
    }
    let (chi2, pv, cells) = chi2_fit(&exact, &counts, n);
    (chi2, pv, cells, total)
}

/// `n` sampled triples after the `short` prompt with each drafter: χ² against the exact
/// distribution of plain decoding; the always-accept rule must be caught.
pub fn sampled_is_distributed_as_plain(dir: &Path, n: usize) {
    sampled_with(&model(dir), dir, &prompt(dir, "short"), n);
}

/// [`sampled_is_distributed_as_plain`] for a loaded model and a prompt.
pub fn sampled_with(m: &Arc<dyn LanguageModel>, dir: &Path, prompt: &[u32], n: usize) {
    for guided in [false, true] {
        let (chi2, p, cells, st) = chi2_run(m, dir, prompt, guided, AcceptRule::Exact, n);
        eprintln!(
            "guided {guided}, exact rule: χ² {chi2:.1} over {cells} cells, p = {p:.3}; {}/{} \
             accepted",
            st.accepted, st.drafted
        );
        assert!(st.drafted > st.accepted, "rejections exercised");
        if guided {
            assert!(st.accepted > st.drafted / 5, "acceptances exercised");
        }
        assert!(p > 1e-3, "guided {guided}: χ² {chi2:.1}, p {p:.2e}");
    }
    // Negative control: the test rejects a wrong acceptance rule.
    let (chi2, p, cells, _) = chi2_run(m, dir, prompt, true, AcceptRule::AlwaysAccept, n);
    eprintln!("always-accept: χ² {chi2:.1} over {cells} cells, p = {p:.3e}");
    assert!(p < 1e-6, "always-accept not caught: p {p:.2e}");
}

/// The checks above as the tests of one fixture set (`$VELA_CACHE/golden/<set>/mtp/`): greedy
/// speculation over `n` tokens, the cache after a checkpoint and a rollback, `samples` sampled
/// triples per drafter.
#[macro_export]
macro_rules! mtp_tests {
    ($set:literal, $n:expr, $samples:expr) => {
        #[test]
        fn greedy_mtp_is_identical_to_plain_decoding() {
            let Some(dir) = $crate::common::mtp::fixture($set) else {
                return;
            };
            $crate::common::mtp::greedy_equals_plain(&dir, $n);
        }

        #[test]
        fn mtp_cache_survives_a_restored_checkpoint() {
            let Some(dir) = $crate::common::mtp::fixture($set) else {
                return;
            };
            $crate::common::mtp::cache_survives_a_restored_checkpoint(&dir);
        }

        #[test]
        fn stochastic_mtp_is_distributed_as_plain_decoding() {
            let Some(dir) = $crate::common::mtp::fixture($set) else {
                return;
            };
            $crate::common::mtp::sampled_is_distributed_as_plain(&dir, $samples);
        }
    };
}

/// The depth cost model turns a useless drafter (random MTP weights) off after one exploration
/// round and a few probes, and keeps plain greedy decoding's tokens.
pub fn depth_model_switches_a_useless_drafter_off(dir: &Path) {
    use vela_engine::speculative::{generate_speculative, DepthModel, SpecOptions, PROBE_EVERY};
    let m = model(dir);
    let cfg = SamplerConfig::greedy();
    let p = prompt(dir, "mid");
    let n = 96;
    let want = {
        let mut s = session(&m, 8);
        let mut d = drafter(&m, dir, false);
        spec(&mut s, &mut *d, &cfg, &p, n, 0, AcceptRule::Exact).0
    };
    let dm = DepthModel::new(4);
    let mut s = session(&m, 8);
    let mut d = drafter(&m, dir, false);
    let opts = SpecOptions {
        depth: Some(&dm),
        max_tokens: n,
        draft_max: 4,
        is_eog: &never,
        rule: AcceptRule::Exact,
    };
    let (got, _, st) =
        generate_speculative(&mut s, &mut *d, &cfg, &p, &opts, &mut |_| true).unwrap();
    eprintln!("adaptive, random MTP: {st:?}; {:?}", dm.estimate());
    assert_eq!(got, want);
    // One exploration round of 4, then only probes of one draft.
    assert!(
        st.drafted <= 4 + st.rounds / PROBE_EVERY as usize + 1,
        "{st:?}"
    );
    assert_eq!(dm.estimate().best, 0);
}

/// The prefix cache's reuse with the drafter bound (the layer's cache kept by every forward):
/// turn 2 from a checkpoint, or after a rollback within `limit`, gives a fresh run's logits;
/// speculation (`guided`: with the blended drafter) from the restored state gives the tokens of
/// the same speculation over the whole conversation, and leaves the layer's cache as a plain
/// evaluation does.
pub fn follow_up_turn_with_the_drafter(dir: &Path, limit: usize, guided: bool) {
    let m = model(dir);
    let _bound = m.load_mtp(dir).unwrap();
    let long = prompt(dir, "long");
    super::hybrid::follow_up_turn(&m, &long, 16, limit);
    let cfg = SamplerConfig::greedy();
    let turn2 = &long[70..120];
    let mut fresh = session(&m, 16);
    let mut d = drafter(&m, dir, guided);
    let conv: Vec<u32> = long[..70].iter().chain(turn2).copied().collect();
    let (want, _) = spec(&mut fresh, &mut *d, &cfg, &conv, 24, 3, AcceptRule::Exact);
    let mut s = session(&m, 16);
    s.eval(&long[..70]).unwrap();
    let cp = s.checkpoint();
    s.eval(&[5, 6, 7, 8, 9]).unwrap();
    s.restore(&cp).unwrap();
    let (got, st) = spec(&mut s, &mut *d, &cfg, turn2, 24, 3, AcceptRule::Exact);
    assert_eq!(got, want, "turn 2 from the checkpoint vs a fresh run");
    assert!(st.drafted > 0 && (!guided || st.accepted > 0), "{st:?}");
    assert_cache_as_plain(&m, dir, &mut s, "turn 2");
}
