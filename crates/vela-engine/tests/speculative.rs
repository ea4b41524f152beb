//! Exact speculative decoding with the Gemma 4 assistant on tiny random checkpoints.
//!
//! Fixtures: `python scripts/gen-gemma4-assistant.py` → `$VELA_CACHE/golden/gemma4_assistant/`
//! (skipped when absent unless `VELA_REQUIRE_DATA=1`). Random weights make the assistant a poor
//! drafter, so rejections (and the residual path) happen constantly — what these tests need.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use vela_compute::cpu::CpuBackend;
use vela_compute::KvType;
use vela_engine::speculative::{
    generate_speculative, AcceptRule, Draft, Drafter, ModelDrafter, MtpDrafter, NgramDrafter,
    Propose, SpecOptions, SpecStats,
};
use vela_engine::{generate, GenerateOptions, Sampler, SamplerConfig, Session, SessionOptions};
use vela_formats::testdata;
use vela_models::gemma4::Gemma4Model;
use vela_models::gemma4_assistant::{Gemma4Assistant, Gemma4Mtp};
use vela_models::LanguageModel;

fn fixture(name: &str) -> Option<PathBuf> {
    testdata::require(
        testdata::golden_dir()
            .join("gemma4_assistant")
            .join(name)
            .join("tokens.json"),
    )
    .map(|p| p.parent().unwrap().to_path_buf())
}

struct Fixture {
    target: Arc<dyn LanguageModel>,
    assistant: Arc<Gemma4Assistant<CpuBackend>>,
    tokens: Vec<u32>,
    json: serde_json::Value,
}

fn load(dir: &Path) -> Fixture {
    let be = Arc::new(CpuBackend::new(1));
    let target = Arc::new(Gemma4Model::load_hf(be.clone(), &dir.join("target")).unwrap());
    let assistant = Arc::new(Gemma4Assistant::load_hf(be, &dir.join("assistant")).unwrap());
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokens.json")).unwrap()).unwrap();
    let tokens = ids(&json["tokens"]);
    Fixture {
        target,
        assistant,
        tokens,
        json,
    }
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn session(f: &Fixture, ubatch: usize) -> Session {
    let opts = SessionOptions {
        n_ctx: 512,
        ubatch,
        kv_type: KvType::F32,
    };
    Session::new(f.target.clone(), &opts).unwrap()
}

fn never(_: u32) -> bool {
    false
}

fn plain(f: &Fixture, cfg: &SamplerConfig, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut s = session(f, 8);
    let mut sampler = Sampler::new(cfg.clone());
    let opts = GenerateOptions {
        max_tokens: n,
        is_eog: &never,
    };
    generate(&mut s, &mut sampler, prompt, &opts, &mut |_| true)
        .unwrap()
        .0
}

/// A drafter close to the target but not equal to it: the target itself as a draft model, with
/// its logits flattened and shifted by a fixed random bias. Many drafts are accepted and many
/// rejected, so every branch of the acceptance rule runs (the random assistant is rejected
/// almost always).
struct Perturbed {
    inner: ModelDrafter,
    bias: Vec<f32>,
}

impl Perturbed {
    fn new(f: &Fixture) -> Perturbed {
        let mut rng = vela_engine::sampler::Rng::new(77);
        let bias = (0..f.target.n_vocab())
            .map(|_| (rng.uniform() as f32 - 0.5) * 2.0)
            .collect();
        Perturbed {
            inner: ModelDrafter {
                session: session(f, 8),
            },
            bias,
        }
    }
}

impl Drafter for Perturbed {
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
        let bias = &self.bias;
        self.inner.draft(target, last, k, &mut |mut lg: Vec<f32>| {
            for (l, b) in lg.iter_mut().zip(bias) {
                *l = *l * 0.7 + b;
            }
            propose(lg)
        })
    }
}

fn mtp(
    f: &Fixture,
    s: &mut Session,
    cfg: &SamplerConfig,
    prompt: &[u32],
    n: usize,
    k: usize,
    rule: AcceptRule,
) -> (Vec<u32>, SpecStats) {
    let target = s
        .model
        .as_any()
        .downcast_ref::<Gemma4Model<CpuBackend>>()
        .unwrap();
    let mut drafter = MtpDrafter::new(Box::new(
        Gemma4Mtp::new(f.assistant.clone(), target).unwrap(),
    ));
    spec(s, &mut drafter, cfg, prompt, n, k, rule)
}

use common::spec;

fn report(name: &str, st: &SpecStats) {
    eprintln!(
        "{name}: {} rounds, {} drafted, {} accepted ({:.1}%), kept-per-round histogram {:?}; \
         time: prefill {:.1} ms, draft {:.1} ms, verify {:.1} ms, sampling {:.1} ms",
        st.rounds,
        st.drafted,
        st.accepted,
        100.0 * st.acceptance(),
        st.per_round,
        st.prefill_time.as_secs_f64() * 1e3,
        st.draft_time.as_secs_f64() * 1e3,
        st.verify_time.as_secs_f64() * 1e3,
        st.sample_time.as_secs_f64() * 1e3,
    );
}

fn greedy_case(name: &str) {
    let Some(dir) = fixture(name) else { return };
    let f = load(&dir);
    let cfg = SamplerConfig::greedy();
    let plen = f.json["greedy_prompt_len"].as_u64().unwrap() as usize;
    let prompt = &f.tokens[..plen];
    let n = 240;
    let want = plain(&f, &cfg, prompt, n);
    // Plain decoding itself agrees with transformers' greedy continuation.
    let hf = ids(&f.json["greedy"]);
    assert_eq!(&want[..hf.len()], &hf[..], "plain greedy vs transformers");
    if let Some(a) = f.json["assisted_greedy"].as_array() {
        let a: Vec<u32> = a.iter().map(|x| x.as_u64().unwrap() as u32).collect();
        assert_eq!(&want[..a.len()], &a[..], "transformers' assisted greedy");
    }
    for k in [1, 3, 7] {
        let mut s = session(&f, 8);
        let (got, st) = mtp(&f, &mut s, &cfg, prompt, n, k, AcceptRule::Exact);
        report(&format!("{name} greedy K={k}"), &st);
        assert_eq!(
            got, want,
            "K={k}: MTP greedy output differs from plain decoding"
        );
        assert!(st.drafted > st.accepted, "K={k}: no rejection exercised");
        assert_eq!(s.tokens().len(), plen + n - 1);
        assert_eq!(&s.tokens()[plen..], &want[..n - 1]);
    }
    let mut s = session(&f, 8);
    let mut d = Perturbed::new(&f);
    let (got, st) = spec(&mut s, &mut d, &cfg, prompt, n, 5, AcceptRule::Exact);
    report(&format!("{name} greedy, perturbed self-draft K=5"), &st);
    assert_eq!(
        got, want,
        "perturbed drafter: output differs from plain decoding"
    );
    assert!(st.accepted > 0 && st.drafted > st.accepted);
    // An end token stops both at its first occurrence, wherever it falls in a round, and leaves
    // the same session contents.
    for stop_at in [30, 77, 151] {
        let eog_tok = want[stop_at];
        let is_eog = move |t: u32| t == eog_tok;
        let first = want.iter().position(|&t| t == eog_tok).unwrap();
        let mut sp = session(&f, 8);
        let mut sampler = Sampler::new(cfg.clone());
        let gopts = GenerateOptions {
            max_tokens: n,
            is_eog: &is_eog,
        };
        let (pw, pr) = generate(&mut sp, &mut sampler, prompt, &gopts, &mut |_| true).unwrap();
        let mut s = session(&f, 8);
        let mut d = Perturbed::new(&f);
        let opts = SpecOptions {
            depth: None,
            max_tokens: n,
            draft_max: 5,
            is_eog: &is_eog,
            rule: AcceptRule::Exact,
        };
        let (sw, sr, _) =
            generate_speculative(&mut s, &mut d, &cfg, prompt, &opts, &mut |_| true).unwrap();
        assert_eq!((&sw, sr), (&pw, pr), "stop token {eog_tok}");
        assert_eq!(sw.len(), first);
        assert_eq!(
            s.tokens(),
            sp.tokens(),
            "session after stopping at {eog_tok}"
        );
    }
}

#[test]
fn greedy_mtp_is_identical_to_plain_decoding_dense() {
    greedy_case("dense");
}

#[test]
fn greedy_mtp_is_identical_to_plain_decoding_ordered() {
    greedy_case("ordered");
}

#[test]
fn greedy_mtp_is_identical_to_plain_decoding_realdims() {
    greedy_case("realdims");
}

/// After a long stochastic MTP run (the window of 16 crossed many times, rejected drafts
/// rolled back out of the sliding rings), the session's cache must be exactly that of plain
/// evaluation of the same tokens.
#[test]
fn rollback_past_the_sliding_window_leaves_the_plain_cache() {
    let Some(dir) = fixture("ordered") else {
        return;
    };
    let f = load(&dir);
    let cfg = SamplerConfig {
        temperature: 1.0,
        top_k: 20,
        top_p: 0.95,
        min_p: 0.0,
        seed: 3,
        ..Default::default()
    };
    let prompt = &f.tokens[..5];
    let mut s = session(&f, 8);
    let (out, st) = mtp(&f, &mut s, &cfg, prompt, 150, 6, AcceptRule::Exact);
    report("ordered T=1 K=6", &st);
    assert!(st.accepted > 0 && st.drafted > st.accepted);
    assert_eq!(out.len(), 150);
    let last = *out.last().unwrap();
    let got = s.eval(&[last]).unwrap();
    let mut all = prompt.to_vec();
    all.extend(&out);
    let mut fresh = session(&f, 8);
    let want = fresh.eval(&all).unwrap();
    let num: f64 = got
        .iter()
        .zip(&want)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum();
    let den: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum();
    eprintln!(
        "rollback: logits after {} tokens, NMSE vs plain {:.3e}",
        all.len(),
        num / den
    );
    assert!(
        num / den < 1e-12,
        "cache after MTP differs from plain: NMSE {}",
        num / den
    );
}

/// Exact probabilities of the first three tokens under plain decoding.
fn exact_triples(f: &Fixture, cfg: &SamplerConfig, prompt: &[u32]) -> HashMap<[u32; 3], f64> {
    common::exact_triples(&mut session(f, 8), cfg, prompt)
}

/// χ² goodness of fit of `n` MTP samples (3 tokens: one target sample, then a round of two
/// drafts → accepted drafts / residual / bonus) against the exact plain-decoding distribution.
fn chi2_of_mtp(
    f: &Fixture,
    perturbed: bool,
    rule: AcceptRule,
    n: usize,
) -> (f64, f64, usize, SpecStats) {
    let prompt = f.tokens[..20].to_vec(); // past the window of 16
    let kind = if perturbed {
        DraftKind::Perturbed
    } else {
        DraftKind::Assistant
    };
    chi2_of(f, kind, &prompt, rule, n)
}

#[derive(Clone, Copy, PartialEq)]
enum DraftKind {
    Assistant,
    Perturbed,
    Ngram,
}

/// [`chi2_of_mtp`] for any drafter kind and prompt.
fn chi2_of(
    f: &Fixture,
    kind: DraftKind,
    prompt: &[u32],
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
    let exact = exact_triples(f, &base, prompt);
    let mut counts: HashMap<[u32; 3], usize> = HashMap::new();
    let mut s = session(f, 4);
    s.eval(&prompt[..prompt.len() - 1]).unwrap();
    let mut total = SpecStats::default();
    let mut pert = Perturbed::new(f);
    for i in 0..n {
        s.truncate(prompt.len() - 1).unwrap();
        let cfg = SamplerConfig {
            seed: 1000 + i as u64,
            ..base.clone()
        };
        let last = &prompt[prompt.len() - 1..];
        let (out, st) = match kind {
            DraftKind::Perturbed => spec(&mut s, &mut pert, &cfg, last, 3, 2, rule),
            DraftKind::Assistant => mtp(f, &mut s, &cfg, last, 3, 2, rule),
            DraftKind::Ngram => {
                let mut d = NgramDrafter::new(1, 3).unwrap();
                spec(&mut s, &mut d, &cfg, last, 3, 2, rule)
            }
        };
        total.drafted += st.drafted;
        total.accepted += st.accepted;
        total.draft_time += st.draft_time;
        total.verify_time += st.verify_time;
        *counts.entry([out[0], out[1], out[2]]).or_default() += 1;
    }
    let (chi2, p, cells) = common::chi2_fit(&exact, &counts, n);
    (chi2, p, cells, total)
}

fn chi2_case(perturbed: bool) {
    let Some(dir) = fixture("dense") else { return };
    let f = load(&dir);
    let n = 10_000;
    let name = if perturbed {
        "perturbed self-draft"
    } else {
        "assistant"
    };
    let (chi2, p, cells, st) = chi2_of_mtp(&f, perturbed, AcceptRule::Exact, n);
    eprintln!(
        "{name}, exact rule: χ² {chi2:.1} over {cells} cells, p = {p:.3}; {} drafted, {} \
         accepted; draft {:.0} ms, verify {:.0} ms",
        st.drafted,
        st.accepted,
        st.draft_time.as_secs_f64() * 1e3,
        st.verify_time.as_secs_f64() * 1e3
    );
    assert!(st.drafted > st.accepted, "rejections exercised");
    if perturbed {
        assert!(st.accepted > st.drafted / 5, "acceptances exercised");
    }
    assert!(
        p > 1e-3,
        "MTP samples do not follow plain decoding: χ² {chi2:.1}, p {p:.2e}"
    );
    // Negative control: the same test rejects a wrong acceptance rule.
    let (chi2, p, cells, _) = chi2_of_mtp(&f, perturbed, AcceptRule::AlwaysAccept, n);
    eprintln!("{name}, always-accept: χ² {chi2:.1} over {cells} cells, p = {p:.3e}");
    assert!(
        p < 1e-6,
        "the χ² test cannot tell a wrong acceptance rule apart: p {p:.2e}"
    );
}

/// Prompt lookup (deterministic one-hot proposals) keeps the distribution exact too: a prompt that
/// repeats itself, so the n-gram drafter proposes at every round; always-accept is caught.
#[test]
fn stochastic_prompt_lookup_is_distributed_as_plain_decoding() {
    let Some(dir) = fixture("dense") else { return };
    let f = load(&dir);
    // 10 tokens, then the same 10 again: the last tokens' n-grams occurred before.
    let mut prompt = f.tokens[..10].to_vec();
    prompt.extend_from_slice(&f.tokens[..10]);
    let (chi2, p, cells, st) = chi2_of(&f, DraftKind::Ngram, &prompt, AcceptRule::Exact, 10_000);
    eprintln!(
        "prompt lookup, exact rule: χ² {chi2:.1} over {cells} cells, p = {p:.3}; {} drafted, {} \
         accepted",
        st.drafted, st.accepted
    );
    assert!(st.drafted > 2_000 && st.accepted > 0 && st.drafted > st.accepted);
    assert!(
        p > 1e-3,
        "prompt lookup samples do not follow plain decoding: p {p:.2e}"
    );
    let (chi2, p, cells, _) = chi2_of(
        &f,
        DraftKind::Ngram,
        &prompt,
        AcceptRule::AlwaysAccept,
        10_000,
    );
    eprintln!("prompt lookup, always-accept: χ² {chi2:.1} over {cells} cells, p = {p:.3e}");
    assert!(
        p < 1e-6,
        "the χ² test cannot tell a wrong acceptance rule apart: p {p:.2e}"
    );
}

/// Greedy prompt lookup on a real model is plain decoding, token for token, and it does accept.
#[test]
fn greedy_prompt_lookup_on_a_real_model_is_identical_to_plain_decoding() {
    use vela_engine::loader::load_gguf;
    let Some(path) = testdata::model(testdata::SMOLLM2) else {
        return;
    };
    let m = load_gguf(&path, 2).unwrap();
    let text = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n\
                Rewrite the two functions above with docstrings:\n\ndef add(a, b):\n";
    let prompt = m.tokenizer.encode(text, true, false).unwrap();
    let mk = || {
        let opts = SessionOptions {
            n_ctx: 512,
            ubatch: 8,
            kv_type: KvType::F16,
        };
        Session::new(m.model.clone(), &opts).unwrap()
    };
    let cfg = SamplerConfig::greedy();
    let n = 96;
    let mut s = mk();
    let mut sampler = Sampler::new(cfg.clone());
    let gopts = GenerateOptions {
        max_tokens: n,
        is_eog: &never,
    };
    let want = generate(&mut s, &mut sampler, &prompt, &gopts, &mut |_| true)
        .unwrap()
        .0;
    let mut d = NgramDrafter::new(2, 4).unwrap();
    let mut s = mk();
    let (got, st) = spec(&mut s, &mut d, &cfg, &prompt, n, 5, AcceptRule::Exact);
    report("SmolLM2 greedy, prompt lookup K=5", &st);
    assert_eq!(
        got, want,
        "prompt lookup greedy differs from plain decoding"
    );
    assert!(st.accepted > 0, "no draft was accepted: {st:?}");
}

#[test]
fn stochastic_mtp_is_distributed_as_plain_decoding() {
    chi2_case(false);
}

#[test]
fn stochastic_speculation_with_a_close_drafter_is_distributed_as_plain_decoding() {
    chi2_case(true);
}

/// A plain draft model (here the target itself) through the same loop: with identical
/// distributions every greedy draft is accepted and the bonus token is used every round.
#[test]
fn model_drafter_with_the_target_accepts_everything() {
    let Some(dir) = fixture("dense") else { return };
    let f = load(&dir);
    let cfg = SamplerConfig::greedy();
    let prompt = &f.tokens[..12];
    let want = plain(&f, &cfg, prompt, 60);
    let mut s = session(&f, 8);
    let mut drafter = ModelDrafter {
        session: session(&f, 8),
    };
    let opts = SpecOptions {
        depth: None,
        max_tokens: 60,
        draft_max: 4,
        is_eog: &never,
        rule: AcceptRule::Exact,
    };
    let (got, _, st) =
        generate_speculative(&mut s, &mut drafter, &cfg, prompt, &opts, &mut |_| true).unwrap();
    report("self-draft greedy K=4", &st);
    assert_eq!(got, want);
    assert_eq!(st.accepted, st.drafted);
}

/// On real quantized models the verification batch (K+1 rows) must give the same logits as
/// one-token decoding, or greedy speculation could flip near-ties: check the identity with a
/// perturbed self-drafter, on SmolLM2 (Q4_1) and across Gemma 3's 512-token sliding window.
#[test]
fn greedy_speculation_on_real_models_is_identical_to_plain_decoding() {
    use vela_engine::loader::load_gguf;
    for (name, prompt_len, n) in [(testdata::SMOLLM2, 8, 120), (testdata::GEMMA3, 500, 40)] {
        let Some(path) = testdata::model(name) else {
            continue;
        };
        let m = load_gguf(&path, 2).unwrap();
        let mut rng = vela_engine::sampler::Rng::new(5);
        let v = m.model.n_vocab() as u64;
        let prompt: Vec<u32> = (0..prompt_len)
            .map(|_| (rng.next_u64() % (v / 4)) as u32 + 10)
            .collect();
        let mk = || {
            let opts = SessionOptions {
                n_ctx: 1024,
                ubatch: 8,
                kv_type: KvType::F16,
            };
            Session::new(m.model.clone(), &opts).unwrap()
        };
        let cfg = SamplerConfig::greedy();
        let mut s = mk();
        let mut sampler = Sampler::new(cfg.clone());
        let gopts = GenerateOptions {
            max_tokens: n,
            is_eog: &never,
        };
        let want = generate(&mut s, &mut sampler, &prompt, &gopts, &mut |_| true)
            .unwrap()
            .0;
        let bias = (0..v).map(|_| (rng.uniform() as f32 - 0.5) * 4.0).collect();
        let mut d = Perturbed {
            inner: ModelDrafter { session: mk() },
            bias,
        };
        let mut s = mk();
        let (got, st) = spec(&mut s, &mut d, &cfg, &prompt, n, 4, AcceptRule::Exact);
        report(&format!("{name} greedy, perturbed self-draft K=4"), &st);
        assert_eq!(
            got, want,
            "{name}: speculative greedy differs from plain decoding"
        );
        assert!(
            st.accepted > 0 && st.drafted > st.accepted,
            "{name}: both paths"
        );
    }
}

#[test]
fn load_gemma4_mtp_validates_the_assistant_against_the_target() {
    use vela_engine::speculative::load_mtp as load_gemma4_mtp;
    let (Some(dir), Some(other)) = (fixture("dense"), fixture("ordered")) else {
        return;
    };
    let f = load(&dir);
    let s = session(&f, 8);
    assert!(load_gemma4_mtp(&s, &dir.join("assistant")).is_ok());
    if dir.join("assistant.gguf").exists() {
        assert!(load_gemma4_mtp(&s, &dir.join("assistant.gguf")).is_ok());
    }
    let e = load_gemma4_mtp(&s, &other.join("assistant")).err().unwrap();
    let msg = format!("{e:#}");
    assert!(msg.contains("does not match target layer"), "{msg}");
    let e = load_gemma4_mtp(&s, &dir.join("no-such-assistant.gguf"))
        .err()
        .unwrap();
    assert!(format!("{e:#}").contains("no-such-assistant"), "{e:#}");
    // A target of another architecture is refused with a one-line error.
    if let Some(p) = testdata::model(testdata::SMOLLM2) {
        let m = vela_engine::loader::load_gguf(&p, 1).unwrap();
        let opts = SessionOptions {
            n_ctx: 64,
            ubatch: 8,
            kv_type: KvType::F16,
        };
        let s = Session::new(m.model.clone(), &opts).unwrap();
        let e = load_gemma4_mtp(&s, &dir.join("assistant")).err().unwrap();
        let msg = format!("{e:#}");
        assert!(msg.contains("targets only") && !msg.contains('\n'), "{msg}");
    }
}
