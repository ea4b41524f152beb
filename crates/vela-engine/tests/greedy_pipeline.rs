//! Pipelined greedy decoding (`Session::argmax_start` / `argmax_finish` / `argmax_discard`, used
//! by `generate` and `greedy_steps`) against the plain loop of `eval_argmax` steps, on a fake
//! model whose states pipeline like the CUDA backend: tickets that are read only later, a chained
//! step that takes its token from the "device" (the previous step's result) and exists only
//! right after that step, and at most `ARGMAX_TICKETS` tickets in flight. The next token depends
//! on every cached token, so a placeholder or a wrong token in the cache changes the output.

use anyhow::{bail, Result};
use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;
use vela_compute::{KvType, ARGMAX_TICKETS};
use vela_engine::generate::greedy_steps;
use vela_engine::{generate, FinishReason, GenerateOptions, Sampler, SamplerConfig};
use vela_engine::{Session, SessionOptions};
use vela_models::{LanguageModel, ModelState};

const VOCAB: usize = 16;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    /// No pipelining (like the CPU backend): `argmax_start` returns `None`.
    Plain,
    /// Tickets and chained steps (like the CUDA backend).
    Pipelined,
    /// Tickets, but chained steps refused (as a backend that cannot pipeline does).
    NoChain,
}

struct Fake {
    mode: Mode,
}

impl LanguageModel for Fake {
    fn arch(&self) -> &str {
        "fake"
    }
    fn backend_name(&self) -> String {
        "fake".into()
    }
    fn n_vocab(&self) -> usize {
        VOCAB
    }
    fn n_ctx_train(&self) -> usize {
        0
    }
    fn state_layout(&self) -> vela_models::StateLayout {
        vela_models::StateLayout::default()
    }
    fn weight_bytes_per_token(&self) -> u64 {
        0
    }
    fn kv_bytes_estimate(&self, _: usize, _: usize, _: KvType) -> u64 {
        0
    }
    fn memory_free(&self) -> Option<u64> {
        None
    }
    fn new_state(
        self: Arc<Self>,
        n_ctx: usize,
        max_batch: usize,
        _: KvType,
    ) -> Result<Box<dyn ModelState>> {
        Ok(Box::new(FakeState {
            mode: self.mode,
            n_ctx,
            max_batch,
            cache: vec![None; n_ctx],
            device: None,
            tickets: HashMap::new(),
            next_ticket: 0,
        }))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

struct FakeState {
    mode: Mode,
    n_ctx: usize,
    max_batch: usize,
    /// The token at each position (the "KV cache").
    cache: Vec<Option<u32>>,
    /// (position, id): the last started step's result, still "on the device", for a chained
    /// step at that position.
    device: Option<(u32, u32)>,
    tickets: HashMap<u64, u32>,
    next_ticket: u64,
}

impl FakeState {
    /// Write `token` at `pos` and return the greedy next token: a hash of every cached token up
    /// to `pos` (all must be present).
    fn step(&mut self, token: u32, pos: u32) -> Result<u32> {
        if token as usize >= VOCAB {
            bail!("token {token} out of range");
        }
        self.cache[pos as usize] = Some(token);
        let mut h = 7u64;
        for (i, t) in self.cache[..=pos as usize].iter().enumerate() {
            let Some(t) = t else {
                bail!("position {i} missing from the cache before {pos}");
            };
            h = h.wrapping_mul(31).wrapping_add(*t as u64 * 17 + i as u64);
        }
        Ok(((h >> 7) % VOCAB as u64) as u32)
    }
}

impl ModelState for FakeState {
    fn forward(&mut self, tokens: &[u32], positions: &[u32], from: usize) -> Result<Vec<f32>> {
        let mut out = Vec::new();
        for (i, (&t, &p)) in tokens.iter().zip(positions).enumerate() {
            let next = self.step(t, p)?;
            if i >= from {
                let mut row = vec![0f32; VOCAB];
                row[next as usize] = 1.0;
                out.extend(row);
            }
        }
        // Evaluating anything else overwrites the "device" id.
        self.device = None;
        Ok(out)
    }
    fn argmax_start(&mut self, token: Option<u32>, pos: u32) -> Result<Option<u64>> {
        if self.mode == Mode::Plain {
            return Ok(None);
        }
        let token = match token {
            Some(t) => t,
            None => match self.device {
                Some((p, t)) if p == pos && self.mode == Mode::Pipelined => t,
                _ => return Ok(None),
            },
        };
        let next = self.step(token, pos)?;
        self.device = Some((pos + 1, next));
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.tickets.insert(ticket, next);
        self.tickets.retain(|&k, _| k + ARGMAX_TICKETS > ticket);
        Ok(Some(ticket))
    }
    fn argmax_finish(&mut self, ticket: u64) -> Result<u32> {
        match self.tickets.get(&ticket) {
            Some(&t) => Ok(t),
            None => bail!("ticket {ticket} is not outstanding"),
        }
    }
    fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    fn max_batch(&self) -> usize {
        self.max_batch
    }
    fn checkpoint(&self, _: usize) -> Box<dyn Any + Send + Sync> {
        Box::new(self.cache.clone())
    }
    fn restore(&mut self, snap: &(dyn Any + Send + Sync)) -> Result<()> {
        self.cache = snap.downcast_ref::<Vec<Option<u32>>>().unwrap().clone();
        Ok(())
    }
    fn fork(&self) -> Result<Box<dyn ModelState>> {
        bail!("not needed")
    }
    fn kv_bytes(&self) -> usize {
        0
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

fn session(mode: Mode, n_ctx: usize) -> Session {
    let opts = SessionOptions {
        n_ctx,
        ubatch: 4,
        kv_type: KvType::F32,
    };
    Session::new(Arc::new(Fake { mode }), &opts).unwrap()
}

/// The plain loop `generate` ran before pipelining.
fn reference(
    s: &mut Session,
    prompt: &[u32],
    max: usize,
    eog: u32,
    cancel_at: usize,
) -> (Vec<u32>, FinishReason) {
    let mut tok = s.eval_argmax(prompt).unwrap();
    let mut out = Vec::new();
    loop {
        if tok == eog {
            return (out, FinishReason::Stop);
        }
        out.push(tok);
        if out.len() == cancel_at {
            return (out, FinishReason::Cancelled);
        }
        if out.len() >= max || s.n_past() + 1 >= s.n_ctx() {
            return (out, FinishReason::Length);
        }
        tok = s.eval_argmax(&[tok]).unwrap();
    }
}

#[test]
fn pipelined_greedy_equals_plain_steps() {
    let greedy = SamplerConfig {
        temperature: 0.0,
        ..SamplerConfig::default()
    };
    let mut cases = 0;
    for n_ctx in [9, 13, 64] {
        for max in [1, 2, 3, 5, 40] {
            for eog in [3, 11, 99] {
                for cancel_at in [0, 1, 2, 4] {
                    for prompt in [&[1u32][..], &[2, 5, 9, 4, 4, 1][..]] {
                        for mode in [Mode::Plain, Mode::Pipelined, Mode::NoChain] {
                            let mut r = session(Mode::Plain, n_ctx);
                            let want = reference(&mut r, prompt, max, eog, cancel_at);
                            let mut s = session(mode, n_ctx);
                            let mut sampler = Sampler::new(greedy.clone());
                            let mut n = 0;
                            let is_eog = |t: u32| t == eog;
                            let opts = GenerateOptions {
                                max_tokens: max,
                                is_eog: &is_eog,
                            };
                            let got = generate(&mut s, &mut sampler, prompt, &opts, &mut |_| {
                                n += 1;
                                n != cancel_at
                            })
                            .unwrap();
                            let ctx = format!("{mode:?} n_ctx {n_ctx} max {max} eog {eog} cancel {cancel_at} prompt {prompt:?}");
                            assert_eq!(got, want, "{ctx}");
                            assert_eq!(s.tokens(), r.tokens(), "{ctx}");
                            // The session continues from there like the plain one.
                            if s.n_past() + 2 < n_ctx {
                                assert_eq!(
                                    s.eval_argmax(&[1]).unwrap(),
                                    r.eval_argmax(&[1]).unwrap(),
                                    "{ctx}"
                                );
                            }
                            cases += 1;
                        }
                    }
                }
            }
        }
    }
    assert_eq!(cases, 3 * 5 * 3 * 4 * 2 * 3);
}

#[test]
fn greedy_steps_equal_eval_argmax_steps() {
    for mode in [Mode::Plain, Mode::Pipelined, Mode::NoChain] {
        for n in [0, 1, 2, 7, 30] {
            let (mut s, mut r) = (session(mode, 64), session(Mode::Plain, 64));
            s.eval(&[4, 2]).unwrap();
            r.eval(&[4, 2]).unwrap();
            let got = greedy_steps(&mut s, 5, n).unwrap();
            let mut want = 5;
            for _ in 0..n {
                want = r.eval_argmax(&[want]).unwrap();
            }
            assert_eq!(got, want, "{mode:?} n {n}");
            assert_eq!(s.tokens(), r.tokens(), "{mode:?} n {n}");
        }
    }
}

#[test]
fn unfinished_steps_block_other_evaluation() {
    use vela_engine::StepInput;
    let mut s = session(Mode::Pipelined, 64);
    let mut a = s.argmax_start(StepInput::Token(1)).unwrap();
    let b = s.argmax_start(StepInput::After(&mut a)).unwrap();
    // b's input (a's result) is not known yet: nothing else may be evaluated.
    assert!(s.eval(&[2]).is_err());
    let t = s.argmax_finish(a).unwrap();
    assert_eq!(s.tokens(), &[1, t]);
    s.argmax_discard(b);
    assert_eq!(s.tokens(), &[1]);
    // A step may only follow the step right before it.
    let mut x = s.argmax_start(StepInput::Token(3)).unwrap();
    let y = s.argmax_start(StepInput::Token(4)).unwrap();
    assert!(s.argmax_start(StepInput::After(&mut x)).is_err());
    assert_eq!(s.tokens(), &[1, 3, 4]);
    s.argmax_finish(x).unwrap();
    s.argmax_finish(y).unwrap();
}
