//! Qwen3.8 Flash Next (`qwen4_exp`) through the engine's sessions on the tiny `ple` fixture
//! (`scripts/gen-qwen4exp-fixtures.py`): a follow-up turn that restores the checkpoint taken after
//! the previous prompt and evaluates only its new tokens gives the bits of a fresh run over the
//! whole conversation (recurrent, n-gram and indexer state included); dropping up to the
//! snapshot limit of trailing positions needs no checkpoint, beyond it is refused; speculative
//! decoding (prompt lookup) gives plain greedy decoding's tokens.

use std::sync::Arc;
use vela_compute::cpu::CpuBackend;
use vela_compute::KvType;
use vela_engine::{Session, SessionOptions};
use vela_formats::testdata;

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn follow_up_turn_from_a_checkpoint_equals_a_fresh_run() {
    let Some(dir) = testdata::require(testdata::golden_dir().join("qwen4exp/ple/config.json"))
    else {
        return;
    };
    let dir = dir.parent().unwrap();
    let m = vela_models::load_hf_any(Arc::new(CpuBackend::new(2)), dir).unwrap();
    let p: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("prompts.json")).unwrap()).unwrap();
    let conv = ids(&p["prompts"]["long"]);
    let opts = SessionOptions {
        n_ctx: 256,
        ubatch: 16,
        kv_type: KvType::F32,
    };
    let mut fresh = Session::new(m.clone(), &opts).unwrap();
    let want = fresh.eval(&conv).unwrap();

    // Turn 1: the first 70 tokens, a checkpoint, then an answer the next turn renders
    // differently (a detour of other tokens).
    let mut s = Session::new(m.clone(), &opts).unwrap();
    s.eval(&conv[..70]).unwrap();
    let cp = s.checkpoint();
    s.eval(&[5, 6, 7, 8, 9, 10, 11]).unwrap();
    let limit = vela_models::qwen4exp::SNAPSHOTS;
    assert_eq!(s.rollback_limit(), limit);
    assert!(!s.can_truncate(70), "7 positions are past the snapshots");
    assert!(s.truncate(70).is_err());
    s.restore(&cp).unwrap();
    let got = s.eval(&conv[70..]).unwrap();
    assert_eq!(got, want, "turn 2 from the checkpoint vs a fresh run");
    assert!(cp.bytes() > 0, "the checkpoint copies the recurrent state");
    // Within the snapshots: drop a detour of `limit` tokens without a checkpoint.
    let mut t = Session::new(m.clone(), &opts).unwrap();
    t.eval(&conv[..70]).unwrap();
    t.eval(&[5, 6, 7, 8][..limit.min(4)]).unwrap();
    t.truncate(70).unwrap();
    let again = t.eval(&conv[70..]).unwrap();
    assert_eq!(again, want, "turn 2 after a rollback within the snapshots");
    // A fork continues identically.
    let mut f = s.fork().unwrap();
    let (a, b) = (s.eval(&[3]).unwrap(), f.eval(&[3]).unwrap());
    assert_eq!(a, b, "fork");
}

/// Prompt lookup drafts (n-grams of the context) verified in batches, rolled back within the
/// recurrent snapshots: the same tokens as plain greedy decoding.
#[test]
fn speculative_greedy_equals_plain_greedy() {
    use vela_engine::speculative::{
        generate_speculative, AcceptRule, Draft, Drafter, NgramDrafter, Propose, SpecOptions,
    };
    use vela_engine::{generate, GenerateOptions, Sampler, SamplerConfig};
    let Some(dir) = testdata::require(testdata::golden_dir().join("qwen4exp/ple/config.json"))
    else {
        return;
    };
    let dir = dir.parent().unwrap();
    let m = vela_models::load_hf_any(Arc::new(CpuBackend::new(2)), dir).unwrap();
    let p: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("prompts.json")).unwrap()).unwrap();
    // A repetitive prompt, so lookup drafts get accepted.
    let base = ids(&p["prompts"]["short"]);
    let prompt: Vec<u32> = base.iter().chain(&base).chain(&base).copied().collect();
    let opts = SessionOptions {
        n_ctx: 256,
        ubatch: 16,
        kv_type: KvType::F32,
    };
    let never = |_: u32| false;
    let cfg = SamplerConfig::greedy();
    let mut s = Session::new(m.clone(), &opts).unwrap();
    let mut sampler = Sampler::new(cfg.clone());
    let gopts = GenerateOptions {
        max_tokens: 48,
        is_eog: &never,
    };
    let want = generate(&mut s, &mut sampler, &prompt, &gopts, &mut |_| true)
        .unwrap()
        .0;
    let mut s = Session::new(m.clone(), &opts).unwrap();
    let mut d = NgramDrafter::new(1, 3).unwrap();
    let sopts = SpecOptions {
        depth: None,
        max_tokens: 48,
        draft_max: 8,
        is_eog: &never,
        rule: AcceptRule::Exact,
    };
    let (got, _, st) =
        generate_speculative(&mut s, &mut d, &cfg, &prompt, &sopts, &mut |_| true).unwrap();
    eprintln!(
        "qwen4_exp prompt lookup: {} drafted, {} accepted",
        st.drafted, st.accepted
    );
    assert_eq!(got, want, "speculative greedy differs from plain greedy");
    assert!(st.drafted > 0, "no drafts: {st:?}");

    // A drafter that knows the answer but gets every third draft wrong: long accepted runs
    // (verify batches of several tokens) and rejections (rollback inside the snapshots).
    struct Oracle {
        prompt_len: usize,
        answer: Vec<u32>,
        n_vocab: usize,
        count: usize,
    }
    impl Drafter for Oracle {
        fn sync(&mut self, _: &Session, _: usize) -> anyhow::Result<()> {
            Ok(())
        }
        fn draft(
            &mut self,
            target: &mut Session,
            _last: u32,
            k: usize,
            propose: Propose,
        ) -> anyhow::Result<Vec<Draft>> {
            let at = target.n_past() + 1 - self.prompt_len;
            let mut out = Vec::new();
            for i in 0..k {
                let Some(&t) = self.answer.get(at + i) else {
                    break;
                };
                self.count += 1;
                let t = if self.count.is_multiple_of(3) {
                    (t + 1) % self.n_vocab as u32
                } else {
                    t
                };
                let mut logits = vec![-1e9f32; self.n_vocab];
                logits[t as usize] = 0.0;
                out.push(propose(logits)?);
            }
            Ok(out)
        }
    }
    let mut d = Oracle {
        prompt_len: prompt.len(),
        answer: want.clone(),
        n_vocab: m.n_vocab(),
        count: 0,
    };
    let mut s = Session::new(m.clone(), &opts).unwrap();
    let (got, _, st) =
        generate_speculative(&mut s, &mut d, &cfg, &prompt, &sopts, &mut |_| true).unwrap();
    eprintln!(
        "qwen4_exp oracle drafts: {} drafted, {} accepted",
        st.drafted, st.accepted
    );
    assert_eq!(
        got, want,
        "speculative greedy (oracle drafts) differs from plain greedy"
    );
    // Every third draft is wrong: rounds keep 0, 1 or 2 drafts (several verified at once), at
    // most SNAPSHOTS drafts per round (the rollback limit).
    assert!(st.per_round.get(2).is_some_and(|&r| r > 0), "{st:?}");
    assert!(
        st.drafted <= st.rounds * vela_models::qwen4exp::SNAPSHOTS,
        "{st:?}"
    );
}
