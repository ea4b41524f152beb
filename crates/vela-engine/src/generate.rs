//! The decode loop: prefill the prompt, then sample one token at a time until an end token, a
//! stop condition or the token limit.

use crate::grammar::Constraint;
use crate::sampler::Sampler;
use crate::session::{PendingArgmax, Session, StepInput};
use anyhow::{bail, Result};

/// The most candidates sampled generation asks the backend to select per step (the CUDA
/// backend's device limit): top-k up to this uses the device selection, and top-p without top-k
/// uses it whenever this many candidates reach the mass p.
pub const SAMPLE_TOP_K_CAP: usize = 1024;

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token was sampled (not emitted).
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The callback asked to stop (stop string, client gone).
    Cancelled,
}

/// Options of [`generate`].
pub struct GenerateOptions<'a> {
    pub max_tokens: usize,
    /// Whether a token ends generation (EOS/EOT/EOG).
    pub is_eog: &'a dyn Fn(u32) -> bool,
}

/// Generate after `prompt` (which is appended to whatever the session holds). `on_token` gets each
/// sampled token and returns `false` to stop. Returns the generated tokens and the reason.
pub fn generate(
    session: &mut Session,
    sampler: &mut Sampler,
    prompt: &[u32],
    opts: &GenerateOptions,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<(Vec<u32>, FinishReason)> {
    check(session, prompt, opts)?;
    for &t in session.tokens().iter().chain(prompt) {
        sampler.accept(t);
    }
    if sampler.cfg.is_plain_greedy() {
        // Only the token ids come back from the backend (device argmax on a GPU), and each step
        // is launched before the previous token is read back.
        return decode_greedy(session, prompt, opts, on_token);
    }
    if let Some(k) = sampler.device_top_k(SAMPLE_TOP_K_CAP) {
        // Only the k best tokens and the row's statistics come back from the backend (selected
        // on the device by a GPU); the logits row only at the steps they do not decide.
        return decode(session, prompt, opts, on_token, &mut |s, toks| {
            let (t, row) = s.eval_top_k(toks, k, &|t| !sampler.top_k_suffices(t))?;
            Ok(match row {
                Some(mut logits) => sampler.sample(&mut logits),
                None => sampler
                    .sample_top_k(&t)
                    .expect("the top-k selection was checked to suffice"),
            })
        });
    }
    decode(session, prompt, opts, on_token, &mut |s, toks| {
        let mut logits = s.eval(toks)?;
        Ok(sampler.sample(&mut logits))
    })
}

/// [`generate`] under a grammar: each step evaluates the whole logits row, sets what `grammar`
/// forbids to -inf, samples (bias, penalties, truncation and temperature then apply to the
/// allowed tokens only) and advances the grammar. An end token is sampled only where the
/// grammar can end.
pub fn generate_constrained(
    session: &mut Session,
    sampler: &mut Sampler,
    prompt: &[u32],
    opts: &GenerateOptions,
    grammar: &mut Constraint,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<(Vec<u32>, FinishReason)> {
    check(session, prompt, opts)?;
    for &t in session.tokens().iter().chain(prompt) {
        sampler.accept(t);
    }
    decode(session, prompt, opts, on_token, &mut |s, toks| {
        let mut logits = s.eval(toks)?;
        grammar.apply(&mut logits)?;
        let t = sampler.sample(&mut logits);
        grammar.accept(t)?;
        Ok(t)
    })
}

fn check(session: &Session, prompt: &[u32], opts: &GenerateOptions) -> Result<()> {
    if opts.max_tokens == 0 {
        bail!("max_tokens must be at least 1");
    }
    if prompt.is_empty() {
        bail!("the prompt is empty");
    }
    if session.n_past() + prompt.len() >= session.n_ctx() {
        bail!(
            "prompt too long: {} tokens (+{} cached) leave no room in the context of {} tokens",
            prompt.len(),
            session.n_past(),
            session.n_ctx()
        );
    }
    Ok(())
}

/// The loop shared by the three ways of picking a token: `next(session, tokens)` evaluates
/// `tokens` (the prompt, then each emitted token) and returns the next token.
fn decode(
    session: &mut Session,
    prompt: &[u32],
    opts: &GenerateOptions,
    on_token: &mut dyn FnMut(u32) -> bool,
    next: &mut dyn FnMut(&mut Session, &[u32]) -> Result<u32>,
) -> Result<(Vec<u32>, FinishReason)> {
    let mut tok = next(session, prompt)?;
    let mut out = Vec::new();
    loop {
        if (opts.is_eog)(tok) {
            return Ok((out, FinishReason::Stop));
        }
        out.push(tok);
        if !on_token(tok) {
            return Ok((out, FinishReason::Cancelled));
        }
        if out.len() >= opts.max_tokens || session.n_past() + 1 >= session.n_ctx() {
            return Ok((out, FinishReason::Length));
        }
        tok = next(session, &[tok])?;
    }
}

/// [`decode`] for plain greedy decoding, pipelined ([`Session::argmax_start`]): the step of the
/// next token is started before the current token is read back and handled, whenever the limits
/// leave room for it. If the current token ends generation, that step is dropped
/// ([`Session::argmax_discard`]). The tokens, the reasons and the session's tokens are the same
/// as [`decode`]'s with `eval_argmax`.
fn decode_greedy(
    session: &mut Session,
    prompt: &[u32],
    opts: &GenerateOptions,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<(Vec<u32>, FinishReason)> {
    let mut tok = session.eval_argmax(prompt)?;
    let mut out = Vec::new();
    // The step whose input is `tok`, started before `tok` was known.
    let mut ahead: Option<PendingArgmax> = None;
    loop {
        let reason = if (opts.is_eog)(tok) {
            Some(FinishReason::Stop)
        } else {
            out.push(tok);
            if !on_token(tok) {
                Some(FinishReason::Cancelled)
            } else if ahead.is_none()
                && (out.len() >= opts.max_tokens || session.n_past() + 1 >= session.n_ctx())
            {
                // (A started step was started only if these limits leave room for it.)
                Some(FinishReason::Length)
            } else {
                None
            }
        };
        if let Some(r) = reason {
            if let Some(a) = ahead {
                session.argmax_discard(a);
            }
            return Ok((out, r));
        }
        let mut cur = match ahead.take() {
            Some(a) => a,
            None => session.argmax_start(StepInput::Token(tok))?,
        };
        // The step after `cur`, whose token `cur` computes: needed unless that token ends
        // generation, so started now, while the device still runs `cur`.
        if out.len() + 1 < opts.max_tokens && session.n_past() + 1 < session.n_ctx() {
            match session.argmax_start(StepInput::After(&mut cur)) {
                Ok(a) => ahead = Some(a),
                Err(e) => {
                    let _ = session.argmax_finish(cur);
                    return Err(e);
                }
            }
        }
        tok = match session.argmax_finish(cur) {
            Ok(t) => t,
            Err(e) => {
                if let Some(a) = ahead {
                    session.argmax_discard(a);
                }
                return Err(e);
            }
        };
    }
}

/// Evaluate `first` and then each greedy result, `n` steps in all, pipelined like
/// [`generate`]'s greedy decoding (no end token or other stop); returns the last step's result
/// (not evaluated). What `vela bench` times as text generation.
pub fn greedy_steps(session: &mut Session, first: u32, n: usize) -> Result<u32> {
    if n == 0 {
        return Ok(first);
    }
    let mut cur = session.argmax_start(StepInput::Token(first))?;
    for _ in 1..n {
        let next = session.argmax_start(StepInput::After(&mut cur))?;
        session.argmax_finish(std::mem::replace(&mut cur, next))?;
    }
    session.argmax_finish(cur)
}
