//! Speculative decoding with `qwen4_exp`'s own MTP layer on the tiny `mtp` fixture
//! (`scripts/gen-qwen4exp-mtp.py`): greedy output identical to plain decoding, sampled output
//! distributed as plain decoding (χ², with the always-accept control caught), and the MTP
//! layer's cache after speculation, rollbacks and a restored checkpoint equal to the one a
//! plain evaluation of the same tokens leaves.
//!
//! The shared checks are in `common/heads.rs`; the depth cost model's are here.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use vela_compute::cpu::CpuBackend;
use vela_engine::speculative::{generate_speculative, AcceptRule, SpecOptions};
use vela_engine::{generate, GenerateOptions, Sampler, SamplerConfig};
use vela_formats::testdata;
use vela_models::LanguageModel;

fn fixture() -> Option<PathBuf> {
    testdata::require(testdata::golden_dir().join("qwen4exp/mtp/mtp_chain.json"))
        .map(|p| p.parent().unwrap().to_path_buf())
}

fn model(dir: &Path) -> Arc<dyn LanguageModel> {
    vela_models::load_hf_any(Arc::new(CpuBackend::new(1)), dir).unwrap()
}

fn prompt(dir: &Path, name: &str) -> Vec<u32> {
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("prompts.json")).unwrap()).unwrap();
    j["prompts"][name]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

use common::heads::{drafter, session};
use common::spec;

#[test]
fn greedy_mtp_is_identical_to_plain_decoding() {
    let Some(dir) = fixture() else { return };
    let m = model(&dir);
    common::heads::greedy_matches_plain(&m, &dir, &prompt(&dir, "mid"), 80, 4, 0.5);
}

#[test]
fn mtp_cache_survives_a_restored_checkpoint() {
    let Some(dir) = fixture() else { return };
    let m = model(&dir);
    common::heads::cache_survives_checkpoints(&m, &dir, &prompt(&dir, "long"));
}

#[test]
fn stochastic_mtp_is_distributed_as_plain_decoding() {
    let Some(dir) = fixture() else { return };
    let m = model(&dir);
    common::heads::sampled_matches_plain(&m, &dir, &prompt(&dir, "short"), 6000);
}

fn never(_: u32) -> bool {
    false
}

/// The depth cost model turns a useless drafter off (a few probes) and keeps the output exact.
#[test]
fn depth_model_switches_a_useless_mtp_off() {
    use vela_engine::speculative::{DepthModel, PROBE_EVERY};
    let Some(dir) = fixture() else { return };
    let m = model(&dir);
    let cfg = SamplerConfig::greedy();
    let p = prompt(&dir, "mid");
    let n = 96;
    let want = {
        let mut s = session(&m, 8);
        let mut d = drafter(&m, &dir, false);
        spec(&mut s, &mut *d, &cfg, &p, n, 0, AcceptRule::Exact).0
    };
    let dm = DepthModel::new(4);
    let mut s = session(&m, 8);
    let mut d = drafter(&m, &dir, false);
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

/// With a useless drafter the depth model decodes in runs of plain pipelined steps: an end
/// token inside a run, and the token limit, stop as plain decoding does with the same session.
#[test]
fn plain_runs_stop_as_plain_decoding() {
    use vela_engine::speculative::DepthModel;
    let Some(dir) = fixture() else { return };
    let m = model(&dir);
    let cfg = SamplerConfig::greedy();
    let p = prompt(&dir, "mid");
    let full = {
        let mut s = session(&m, 8);
        let mut sampler = Sampler::new(cfg.clone());
        let o = GenerateOptions {
            max_tokens: 90,
            is_eog: &never,
        };
        generate(&mut s, &mut sampler, &p, &o, &mut |_| true)
            .unwrap()
            .0
    };
    for (stop_at, max_tokens) in [(Some(41), 90), (Some(70), 90), (None, 37), (None, 90)] {
        let eog_tok = stop_at.map(|i| full[i]);
        let is_eog = move |t: u32| Some(t) == eog_tok;
        let mut sp = session(&m, 8);
        let mut sampler = Sampler::new(cfg.clone());
        let gopts = GenerateOptions {
            max_tokens,
            is_eog: &is_eog,
        };
        let (want, wr) = generate(&mut sp, &mut sampler, &p, &gopts, &mut |_| true).unwrap();
        let dm = DepthModel::new(4);
        let mut s = session(&m, 8);
        let mut d = drafter(&m, &dir, false);
        let opts = SpecOptions {
            depth: Some(&dm),
            max_tokens,
            draft_max: 4,
            is_eog: &is_eog,
            rule: AcceptRule::Exact,
        };
        let mut streamed = Vec::new();
        let (got, gr, st) = generate_speculative(&mut s, &mut *d, &cfg, &p, &opts, &mut |t| {
            streamed.push(t);
            true
        })
        .unwrap();
        assert_eq!(
            (&got, gr),
            (&want, wr),
            "stop at {stop_at:?}, max {max_tokens}"
        );
        assert_eq!(streamed, got);
        assert_eq!(s.tokens(), sp.tokens(), "session, stop at {stop_at:?}");
        assert!(st.drafted < 12, "{st:?}");
    }
}
