//! Session checks every architecture with declared (non-K/V) state passes: a follow-up turn
//! from a checkpoint, rollback within the declared limit (and refused beyond it), forks, and
//! speculative greedy decoding (prompt lookup, and a drafter that is wrong every third draft)
//! giving plain greedy decoding's tokens.

use std::sync::Arc;
use vela_compute::KvType;
use vela_engine::speculative::{
    generate_speculative, AcceptRule, Draft, Drafter, NgramDrafter, Propose, SpecOptions,
};
use vela_engine::{generate, GenerateOptions, Sampler, SamplerConfig, Session, SessionOptions};
use vela_models::LanguageModel;

fn opts(ubatch: usize) -> SessionOptions {
    SessionOptions {
        n_ctx: 512,
        ubatch,
        kv_type: KvType::F32,
    }
}

/// Turn 1 is `conv[..70]` then a detour of `limit + 3` other tokens; turn 2 restores the
/// checkpoint taken after turn 1 and evaluates `conv[70..]`: the bits of a fresh run. A detour
/// within `limit` is dropped without a checkpoint; a fork continues identically.
pub fn follow_up_turn(m: &Arc<dyn LanguageModel>, conv: &[u32], ubatch: usize, limit: usize) {
    let opts = opts(ubatch);
    let mut fresh = Session::new(m.clone(), &opts).unwrap();
    let want = fresh.eval(conv).unwrap();
    let detour: Vec<u32> = (0..limit as u32 + 3).map(|i| 5 + i).collect();
    let mut s = Session::new(m.clone(), &opts).unwrap();
    s.eval(&conv[..70]).unwrap();
    let cp = s.checkpoint();
    s.eval(&detour).unwrap();
    assert_eq!(s.rollback_limit(), limit);
    assert!(!s.can_truncate(70), "the detour is past the rollback limit");
    assert!(s.truncate(70).is_err());
    s.restore(&cp).unwrap();
    let got = s.eval(&conv[70..]).unwrap();
    assert_eq!(got, want, "turn 2 from the checkpoint vs a fresh run");
    assert!(cp.bytes() > 0, "the checkpoint copies the declared state");
    let mut t = Session::new(m.clone(), &opts).unwrap();
    t.eval(&conv[..70]).unwrap();
    t.eval(&detour[..limit.min(4)]).unwrap();
    t.truncate(70).unwrap();
    let again = t.eval(&conv[70..]).unwrap();
    assert_eq!(again, want, "turn 2 after a rollback within the limit");
    let mut f = s.fork().unwrap();
    let (a, b) = (s.eval(&[3]).unwrap(), f.eval(&[3]).unwrap());
    assert_eq!(a, b, "fork");
}

/// A drafter that knows the answer but gets every third draft wrong.
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

/// Prompt lookup drafts (n-grams of the context) and the oracle's, verified in batches and
/// rolled back within `limit`: the tokens of plain greedy decoding.
pub fn speculative_equals_plain(
    m: &Arc<dyn LanguageModel>,
    prompt: &[u32],
    ubatch: usize,
    limit: usize,
    name: &str,
) {
    let opts = opts(ubatch);
    let never = |_: u32| false;
    let cfg = SamplerConfig::greedy();
    let mut s = Session::new(m.clone(), &opts).unwrap();
    let mut sampler = Sampler::new(cfg.clone());
    let gopts = GenerateOptions {
        max_tokens: 48,
        is_eog: &never,
    };
    let want = generate(&mut s, &mut sampler, prompt, &gopts, &mut |_| true)
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
        generate_speculative(&mut s, &mut d, &cfg, prompt, &sopts, &mut |_| true).unwrap();
    eprintln!(
        "{name} prompt lookup: {} drafted, {} accepted",
        st.drafted, st.accepted
    );
    assert_eq!(got, want, "speculative greedy differs from plain greedy");
    assert!(st.drafted > 0, "no drafts: {st:?}");
    let mut d = Oracle {
        prompt_len: prompt.len(),
        answer: want.clone(),
        n_vocab: m.n_vocab(),
        count: 0,
    };
    let mut s = Session::new(m.clone(), &opts).unwrap();
    let (got, _, st) =
        generate_speculative(&mut s, &mut d, &cfg, prompt, &sopts, &mut |_| true).unwrap();
    eprintln!(
        "{name} oracle drafts: {} drafted, {} accepted",
        st.drafted, st.accepted
    );
    assert_eq!(
        got, want,
        "speculative greedy (oracle drafts) differs from plain greedy"
    );
    // Rounds keep 0, 1 or 2 drafts (several verified at once), at most `limit` drafts a round.
    assert!(st.per_round.get(2).is_some_and(|&r| r > 0), "{st:?}");
    assert!(
        st.drafted <= st.rounds * limit.min(sopts.draft_max),
        "{st:?}"
    );
}
