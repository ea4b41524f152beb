//! Speculative decoding with `qwen4_exp`'s own MTP layer on the tiny `mtp` fixture
//! (`scripts/gen-qwen4exp-mtp.py`): greedy output identical to plain decoding, sampled output
//! distributed as plain decoding (χ², with the always-accept control caught), and the MTP
//! layer's cache after speculation, rollbacks and a restored checkpoint equal to the one a
//! plain evaluation of the same tokens leaves.
//!
//! The checks every MTP layer passes are `common/mtp.rs`; here also the depth cost model with
//! the (useless) random layer.

mod common;

use common::mtp::{drafter, model, never, prompt, session};
use std::path::PathBuf;
use vela_engine::speculative::{generate_speculative, AcceptRule, SpecOptions};
use vela_engine::{generate, GenerateOptions, Sampler, SamplerConfig};

fn fixture() -> Option<PathBuf> {
    common::mtp::fixture("qwen4exp")
}

crate::mtp_tests!("qwen4exp", 80, 6000);

/// The depth cost model turns a useless drafter off (a few probes) and keeps the output exact.
#[test]
fn depth_model_switches_a_useless_mtp_off() {
    let Some(dir) = fixture() else { return };
    common::mtp::depth_model_switches_a_useless_drafter_off(&dir);
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
