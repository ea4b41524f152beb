//! Exact speculative decoding: a cheap drafter proposes tokens, the target verifies them in one
//! batched pass, and the accept/residual rule ([`accept`]) keeps the output distributed exactly
//! as plain decoding of the target (greedy: byte-identical).
//!
//! One round, with `t` the token the target just produced at position `n` (not yet evaluated):
//!
//! ```text
//! emit t
//! d1..dk  = drafter.draft(t)                    each d_i ~ q_i, q_i kept for verification
//! rows    = target.eval_all_logits([t, d1..dk])  one batch of k+1 positions n..n+k
//! for i in 1..=k: p_i = dist(rows[i-1]); keep d_i with prob min(1, p_i(d_i)/q_i(d_i)) → emit,
//!                 else t' ~ normalize(max(0, p_i − q_i)); stop
//! all kept:       t' ~ dist(rows[k])             (bonus token)
//! target.truncate(n + 1 + kept)                  rejected positions dropped (within the state's
//!                                                 rollback limit: k + 1 ≤ max_batch)
//! drafter.sync(row = kept)                        e.g. the MTP assistant reads that hidden state
//! ```
//!
//! `dist` is exactly what plain decoding samples from (logit bias, penalties over the tokens
//! before that position, top-k/top-p/min-p/temperature: [`accept::position_dist`]) and the
//! drafter's logits go through the same transformation, so both distributions are filtered
//! identically. Verified tokens are handed to the callback before the next round is computed.
//!
//! Drafters plug in through [`Drafter`]: the target model's own drafter ([`MtpDrafter`], e.g.
//! the Gemma 4 assistant) and any small language model with the target's vocabulary
//! ([`ModelDrafter`]).

pub mod accept;
mod depth;
mod drafters;
mod ngram;

pub use accept::{position_dist, Dist};
pub use depth::{DepthEstimate, DepthModel, PROBE_EVERY};
pub use drafters::{load_mtp, ModelDrafter, MtpDrafter};
pub use ngram::NgramDrafter;

use crate::generate::FinishReason;
use crate::sampler::{Rng, SamplerConfig};
use crate::session::{EvalOutcome, Session, StepInput};
use anyhow::{bail, Result};
use std::time::{Duration, Instant};

/// One proposed token and the distribution it was drawn from (after the sampler's filtering).
#[derive(Clone, Debug)]
pub struct Draft {
    pub token: u32,
    /// The proposal distribution `token` was drawn from (one-hot when greedy).
    pub q: Dist,
}

/// Turns a drafter's logits into a [`Draft`] (filters them as the target's and draws a token).
pub type Propose<'a> = &'a mut dyn FnMut(Vec<f32>) -> Result<Draft>;

/// A source of draft tokens for [`generate_speculative`].
pub trait Drafter {
    /// Called after every target forward pass (prompt prefill or verification): `row` is the
    /// index, among the rows that pass returned logits for, of the last position that stays in
    /// the sequence (the one whose logits produced the next token). Called before any other
    /// target forward.
    fn sync(&mut self, target: &Session, row: usize) -> Result<()>;

    /// Propose up to `k` tokens following `target.tokens() ++ [last]` (`last` sits at position
    /// `target.n_past()`, not evaluated yet). Each token must come from `propose(logits)`, called
    /// in order, so that its proposal distribution is the one verification uses.
    /// The target's state may be written past `target.n_past()` (a head whose cache lives
    /// there); the next target forward overwrites it.
    fn draft(
        &mut self,
        target: &mut Session,
        last: u32,
        k: usize,
        propose: Propose,
    ) -> Result<Vec<Draft>>;
}

/// The acceptance rule. Only [`AcceptRule::Exact`] is correct; the other one exists as the
/// negative control of the statistical tests (a test must be able to fail).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcceptRule {
    Exact,
    /// Keep every draft (outputs the drafter's distribution — wrong on purpose).
    AlwaysAccept,
}

/// Options of [`generate_speculative`].
pub struct SpecOptions<'a> {
    /// Generated tokens at most (as [`crate::GenerateOptions::max_tokens`]).
    pub max_tokens: usize,
    /// Drafts per round (K); clamped to the session's `ubatch - 1` (a verification batch is one
    /// forward) and to its rollback limit (rejected drafts are dropped without a checkpoint).
    pub draft_max: usize,
    /// The cost model choosing each round's depth up to `draft_max` (`None`: always
    /// `draft_max`); it keeps learning across calls.
    pub depth: Option<&'a DepthModel>,
    /// Whether a token ends generation (EOS/EOT/EOG).
    pub is_eog: &'a dyn Fn(u32) -> bool,
    pub rule: AcceptRule,
}

/// Counters and the time split of a speculative run.
#[derive(Clone, Debug, Default)]
pub struct SpecStats {
    /// Verification rounds.
    pub rounds: usize,
    pub drafted: usize,
    pub accepted: usize,
    /// `per_round[m]`: rounds that kept exactly `m` drafts.
    pub per_round: Vec<usize>,
    pub prefill_time: Duration,
    pub draft_time: Duration,
    pub verify_time: Duration,
    /// Distributions, acceptance and sampling on the host.
    pub sample_time: Duration,
}

impl SpecStats {
    /// Fraction of drafted tokens kept.
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }
}

/// Generate after `prompt` like [`crate::generate`], drafting with `drafter` and verifying in
/// batches. The output is distributed exactly as plain decoding with `cfg` (identical for
/// greedy); the random stream differs, so sampled outputs are not the same tokens.
/// `on_token` gets each verified token (before the next round is computed) and returns `false`
/// to stop. On return the session holds the prompt and every generated token but the last,
/// as after [`crate::generate`].
pub fn generate_speculative(
    session: &mut Session,
    drafter: &mut dyn Drafter,
    cfg: &SamplerConfig,
    prompt: &[u32],
    opts: &SpecOptions,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<(Vec<u32>, FinishReason, SpecStats)> {
    if opts.max_tokens == 0 {
        bail!("max_tokens must be at least 1");
    }
    if prompt.is_empty() {
        bail!("the prompt is empty");
    }
    let n_ctx = session.n_ctx();
    if session.n_past() + prompt.len() >= n_ctx {
        bail!(
            "prompt too long: {} tokens (+{} cached) leave no room in the context of {n_ctx} tokens",
            prompt.len(),
            session.n_past(),
        );
    }
    let t0 = Instant::now();
    let logits = match session.eval_with(prompt, &mut |_, _| true)? {
        EvalOutcome::Done(l) => l,
        EvalOutcome::Cancelled { .. } => unreachable!("never cancelled"),
    };
    drafter.sync(session, 0)?;
    let prefill = t0.elapsed();
    let (out, r, mut stats) = continue_speculative(session, drafter, cfg, logits, opts, on_token)?;
    stats.prefill_time = prefill;
    Ok((out, r, stats))
}

/// [`generate_speculative`] after the caller evaluated the prompt itself (e.g. with progress and
/// cancellation): `logits` are the last prompt position's, and `drafter.sync(session, row)` must
/// already have been called for that forward pass. Same contract otherwise.
pub fn continue_speculative(
    session: &mut Session,
    drafter: &mut dyn Drafter,
    cfg: &SamplerConfig,
    mut logits: Vec<f32>,
    opts: &SpecOptions,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<(Vec<u32>, FinishReason, SpecStats)> {
    if opts.max_tokens == 0 {
        bail!("max_tokens must be at least 1");
    }
    let n_ctx = session.n_ctx();
    if session.n_past() == 0 || session.n_past() >= n_ctx {
        bail!(
            "speculative decoding needs an evaluated prompt with room after it ({} of {n_ctx})",
            session.n_past()
        );
    }
    let k_max = opts
        .draft_max
        .min(session.ubatch().saturating_sub(1))
        .min(session.rollback_limit());
    let mut stats = SpecStats {
        per_round: vec![0; k_max + 1],
        ..Default::default()
    };
    let mut rng = Rng::new(cfg.seed);
    let greedy = cfg.is_plain_greedy();
    let mut hist: Vec<u32> = session.tokens().to_vec();
    let v = session.model.n_vocab();
    let mut out = Vec::new();
    // Emit a verified token at position `pos`; `Some(reason)` ends generation.
    let mut emit = |tok: u32, pos: usize, out: &mut Vec<u32>| -> Option<FinishReason> {
        if (opts.is_eog)(tok) {
            return Some(FinishReason::Stop);
        }
        out.push(tok);
        if !on_token(tok) {
            return Some(FinishReason::Cancelled);
        }
        if out.len() >= opts.max_tokens || pos + 1 >= n_ctx {
            return Some(FinishReason::Length);
        }
        None
    };
    let ts = Instant::now();
    let mut t = position_dist(cfg, &hist, &[], &mut logits).sample(&mut rng);
    stats.sample_time += ts.elapsed();
    loop {
        let pos = session.n_past();
        if let Some(r) = emit(t, pos, &mut out) {
            session.truncate(pos)?;
            return Ok((out, r, stats));
        }
        hist.push(t);
        let mut k = k_max.min(opts.max_tokens - out.len()).min(n_ctx - pos - 1);
        if let Some(dm) = opts.depth {
            k = dm.choose(k);
            // Plain decoding is the better choice: until the next probe, the pipelined greedy
            // steps of plain decoding (the device computes the next step while the host handles
            // this one), not rounds of one verification each.
            let run = dm
                .plain_run()
                .min(opts.max_tokens - out.len())
                .min(n_ctx - pos - 1);
            if k == 0 && greedy && run >= 2 {
                let tr = Instant::now();
                let mut cur = session.argmax_start(StepInput::Token(t))?;
                for done in 1..=run {
                    let ahead = if done < run {
                        match session.argmax_start(StepInput::After(&mut cur)) {
                            Ok(a) => Some(a),
                            Err(e) => {
                                let _ = session.argmax_finish(cur);
                                return Err(e);
                            }
                        }
                    } else {
                        None
                    };
                    let tn = match session.argmax_finish(cur) {
                        Ok(tn) => tn,
                        Err(e) => {
                            if let Some(a) = ahead {
                                session.argmax_discard(a);
                            }
                            return Err(e);
                        }
                    };
                    count_round(&mut stats, 0, 0);
                    let Some(a) = ahead else {
                        // The run's last token: emitted at the top of the next round.
                        t = tn;
                        break;
                    };
                    if let Some(r) = emit(tn, pos + done, &mut out) {
                        session.argmax_discard(a);
                        session.truncate(pos + done)?;
                        dm.observe_plain(done, tr.elapsed().as_secs_f64());
                        return Ok((out, r, stats));
                    }
                    hist.push(tn);
                    cur = a;
                }
                let el = tr.elapsed();
                stats.verify_time += el;
                dm.observe_plain(run, el.as_secs_f64());
                drafter.sync(session, 0)?;
                continue;
            }
        }
        let td = Instant::now();
        let drafts = if k > 0 {
            let (hist_ref, rng_ref) = (&hist, &mut rng);
            let mut extra: Vec<u32> = Vec::new();
            let mut propose = |mut lg: Vec<f32>| -> Result<Draft> {
                if lg.len() != v {
                    bail!(
                        "drafter logits have {} entries, the target vocabulary {v}",
                        lg.len()
                    );
                }
                let q = position_dist(cfg, hist_ref, &extra, &mut lg);
                let token = q.sample(rng_ref);
                extra.push(token);
                Ok(Draft { token, q })
            };
            drafter.draft(session, t, k, &mut propose)?
        } else {
            Vec::new()
        };
        if drafts.len() > k {
            bail!("drafter returned {} drafts for k = {k}", drafts.len());
        }
        let draft_s = td.elapsed();
        stats.draft_time += draft_s;
        let mut batch = vec![t];
        batch.extend(drafts.iter().map(|d| d.token));
        let tv = Instant::now();
        // Greedy: the target's distributions are one-hot at each row's argmax, so only the ids
        // come back (the rule then keeps a draft iff it is that id, and the residual is the id).
        let (rows, ids) = if greedy {
            (Vec::new(), session.eval_all_argmax(&batch)?)
        } else {
            (session.eval_all_logits(&batch)?, Vec::new())
        };
        let verify_s = tv.elapsed();
        stats.verify_time += verify_s;
        let ts = Instant::now();
        let mut kept = 0;
        let mut next = None;
        for (i, d) in drafts.iter().enumerate() {
            let verdict = if greedy {
                match opts.rule {
                    AcceptRule::Exact => (d.token != ids[i]).then_some(ids[i]),
                    AcceptRule::AlwaysAccept => None,
                }
            } else {
                let mut row = rows[i * v..(i + 1) * v].to_vec();
                let p = position_dist(cfg, &hist, &[], &mut row);
                match opts.rule {
                    AcceptRule::Exact => accept::verify(&p, &d.q, d.token, &mut rng),
                    AcceptRule::AlwaysAccept => None,
                }
            };
            match verdict {
                None => {
                    kept += 1;
                    if let Some(r) = emit(d.token, pos + 1 + i, &mut out) {
                        session.truncate(pos + 1 + i)?;
                        stats.sample_time += ts.elapsed();
                        count_round(&mut stats, drafts.len(), kept);
                        return Ok((out, r, stats));
                    }
                    hist.push(d.token);
                }
                Some(tok) => {
                    next = Some(tok);
                    break;
                }
            }
        }
        let t_next = match next {
            Some(tok) => tok,
            None if greedy => ids[drafts.len()],
            None => {
                let n = drafts.len();
                let mut row = rows[n * v..(n + 1) * v].to_vec();
                position_dist(cfg, &hist, &[], &mut row).sample(&mut rng)
            }
        };
        stats.sample_time += ts.elapsed();
        count_round(&mut stats, drafts.len(), kept);
        if let Some(dm) = opts.depth {
            dm.observe(
                drafts.len(),
                kept,
                draft_s.as_secs_f64(),
                verify_s.as_secs_f64(),
            );
        }
        session.truncate(pos + 1 + kept)?;
        drafter.sync(session, kept)?;
        t = t_next;
    }
}

fn count_round(stats: &mut SpecStats, drafted: usize, kept: usize) {
    stats.rounds += 1;
    stats.drafted += drafted;
    stats.accepted += kept;
    if let Some(c) = stats.per_round.get_mut(kept) {
        *c += 1;
    }
}
