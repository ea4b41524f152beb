//! One request in the engine: its session taken from the prefix cache, the prompt tokens still to
//! evaluate, and the decoding state (sampler, grammar, detokenizer, stop strings, output parser)
//! that turns each step's output into events for the client.

use super::{
    log_cancel, logprob_of, ms, send_events, Job, Metrics, Out, StepClock, Timings, TokenLogprob,
    Usage,
};
use crate::cache::{Entry, PrefixCache, Reuse, EARLY_CHECKPOINT, EARLY_KEEP};
use crate::error::ApiError;
use crate::parser::OutputParser;
use crate::stop::StopMatcher;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use vela_compute::TopK;
use vela_engine::grammar::Constraint;
use vela_engine::loader::LoadedModel;
use vela_engine::speculative::{
    continue_speculative, AcceptRule, DepthModel, Drafter, SpecOptions,
};
use vela_engine::{FinishReason, Sampler, Session, SessionOptions};
use vela_tokenizer::{Detokenizer, Tokenizer};

/// What a sequence needs next.
pub(super) enum Stage {
    /// Prompt tokens from `Seq::fed` on are still to be evaluated.
    Prefill,
    /// A sampled (and already reported) token to evaluate.
    Pending(u32),
    /// Finished and reported; its entry goes back to the cache.
    Done,
}

/// The next token's distribution after a forward pass, in the form the step returned it.
pub(super) enum Next {
    Logits(Vec<f32>),
    /// The argmax, computed by the backend (plain greedy).
    Id(u32),
    /// The backend's top-k selection (it decides the token exactly: `Sampler::top_k_suffices`).
    Top(TopK),
}

/// What a decode step needs of a sequence's logits row ([`Seq::batch_parts`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Want {
    Logits,
    Argmax,
    TopK(usize),
}

impl Next {
    /// A batched step's result for one sequence (one logits row).
    pub fn from_selected(sel: vela_engine::Selected) -> anyhow::Result<Next> {
        use vela_engine::Selected;
        let next = match sel {
            Selected::Logits(l) => Some(Next::Logits(l)),
            Selected::Argmax(ids) => ids.last().map(|&t| Next::Id(t)),
            Selected::TopK(mut v) => v.pop().map(|(top, row)| match row {
                Some(row) => Next::Logits(row),
                None => Next::Top(top),
            }),
        };
        next.ok_or_else(|| anyhow::anyhow!("the batched step returned no row"))
    }
}

/// How a request ends: the finish reason and the stop string that matched.
type Finish = (&'static str, Option<String>);

pub(super) struct Seq<'m> {
    pub entry: Entry,
    /// The request and what reports its tokens.
    em: Emitter<'m>,
    grammar: Option<Constraint>,
    sampler: Sampler,
    /// Prompt tokens taken from the cache.
    reused: usize,
    /// Prompt tokens evaluated so far (cached ones included).
    fed: usize,
    /// Prompt length at which an early checkpoint is kept (0: none).
    early_at: usize,
    pub stage: Stage,
    t_prefill: Instant,
    t_decode: Instant,
    /// A decode step that runs this sequence alone may return only the top-k selection, or
    /// only the argmax.
    device_k: Option<usize>,
    device_argmax: bool,
    /// Requests with the same prompt that arrived while it was being evaluated (`n` > 1, or
    /// identical requests): each gets a copy of the session once the prompt is in.
    pub followers: Vec<Job>,
    /// The prompt's last logits row, until the first decode step: a request with the same
    /// prompt arriving meanwhile copies the session and samples from it.
    prompt_logits: Option<Vec<f32>>,
}

/// The request's job and the state that turns its tokens into output events, apart from the
/// session (a speculative run's callback reports while the run holds the session).
struct Emitter<'m> {
    job: Job,
    tok: &'m Tokenizer,
    timings: Timings,
    clock: StepClock,
    detok: Detokenizer<'m>,
    stop: StopMatcher,
    parser: OutputParser,
    n_gen: usize,
    any_tool: bool,
    first: bool,
    step_start: Instant,
}

impl Emitter<'_> {
    fn cancelled(&self) -> bool {
        self.job.cancel.is_cancelled() || self.job.out.is_closed()
    }

    /// Time to first token and inter-token latency of a token just decided.
    fn observe_token(&mut self, metrics: &Metrics) {
        if self.first {
            let t = self.job.received.elapsed().as_secs_f64();
            metrics.ttft.observe(t);
            self.timings.ttft_ms = t * 1e3;
            self.first = false;
        } else {
            metrics
                .token_latency
                .observe(self.step_start.elapsed().as_secs_f64());
        }
        self.step_start = Instant::now();
    }

    /// Report token `t` (not an end of generation); `Some` when a stop string ends the request.
    fn emit(&mut self, t: u32, logprobs: Vec<TokenLogprob>) -> Option<Finish> {
        self.n_gen += 1;
        let piece = self.detok.push(t);
        let (text, hit) = self.stop.push(&piece);
        send_events(
            &self.job.out,
            self.parser.push(&text),
            logprobs,
            &mut self.any_tool,
        );
        hit.map(|w| ("stop", Some(w)))
    }
}

/// Take the cached session sharing the longest prefix with `prompt` (or a fresh or recycled
/// one) and roll it back to what it shares; returns the entry and the tokens reused.
fn pick_session(
    model: &Arc<LoadedModel>,
    opts: &SessionOptions,
    cache: &mut PrefixCache,
    rollback_limit: usize,
    prompt: &[u32],
    timings: &mut Timings,
) -> anyhow::Result<(Entry, usize)> {
    let mut best = cache.take_best(rollback_limit, prompt);
    // A saved sequence sharing more (`--cache-dir`): loaded into a fresh or recycled session.
    let in_memory = best.as_ref().map_or(0, |(_, r)| r.reused());
    let on_disk = cache
        .disk
        .as_ref()
        .and_then(|d| d.best(rollback_limit, prompt, in_memory));
    if on_disk.is_some() {
        if let Some((e, _)) = best.take() {
            cache.put(e);
        }
    }
    let (mut entry, mut reuse) = match best {
        Some(x) => x,
        None => {
            let per = cache
                .entries
                .first()
                .map(|e| e.session.kv_bytes())
                .unwrap_or(0);
            let full = cache.total_bytes() + per > cache.budget
                || cache.entries.len() >= crate::cache::MAX_ENTRIES;
            let e = if !cache.entries.is_empty() && full {
                cache.take_lru()
            } else {
                None
            };
            let mut e = match e {
                Some(e) => e,
                None => new_entry(model, opts, timings)?,
            };
            let mut reuse = Reuse::Reset;
            if let (Some(path), Some(d)) = (&on_disk, &cache.disk) {
                let t = Instant::now();
                if d.load_into(path, &mut e.session).is_ok() {
                    timings.cache_load_ms = ms(t);
                    reuse = crate::cache::plan(e.session.tokens(), &[], rollback_limit, prompt);
                }
            }
            (e, reuse)
        }
    };
    // A request that shares only part of a cached sequence (e.g. just the system prompt) must not
    // destroy it. A large overlap is worth a copy of the cache when the budget allows; a small one
    // is cheaper to recompute on another session, leaving the longer sequence cached.
    if let Reuse::Truncate(n) = reuse {
        let (bytes, n_past) = (entry.session.kv_bytes(), entry.session.n_past());
        if n < n_past {
            let fits_two = cache.total_bytes() + 2 * bytes <= cache.budget;
            if n >= 256 && fits_two {
                if let Ok(copy) = entry.session.fork() {
                    let copy = Entry::new(copy);
                    cache.put(std::mem::replace(&mut entry, copy));
                }
            } else if n < n_past / 2 && !follow_up(&entry, n) {
                // The original is out of the cache now, so take_lru never returns it.
                let fits_one = cache.total_bytes() + 2 * bytes <= cache.budget;
                let recycled = if fits_one { None } else { cache.take_lru() };
                let replacement = match recycled {
                    Some(e) => e,
                    None => new_entry(model, opts, timings)?,
                };
                cache.put(std::mem::replace(&mut entry, replacement));
                reuse = Reuse::Reset;
            }
        }
    }
    let t_restore = Instant::now();
    let reused = match reuse {
        Reuse::Truncate(n) => entry.session.truncate(n).map(|_| n).unwrap_or_else(|_| {
            entry.session.reset();
            0
        }),
        Reuse::Restore(n) => {
            let Entry {
                session,
                prompt_cp,
                early,
                ..
            } = &mut entry;
            let cp = prompt_cp
                .iter()
                .chain(early.iter())
                .find(|c| c.n_past() == n);
            let restored = match cp {
                Some(cp) => session.restore(cp).map(|_| cp.bytes()),
                None => Err(anyhow::anyhow!("no checkpoint at {n}")),
            };
            match restored {
                Ok(bytes) => {
                    timings.restore_bytes = bytes;
                    n
                }
                Err(_) => {
                    entry.session.reset();
                    0
                }
            }
        }
        Reuse::Reset => {
            entry.session.reset();
            0
        }
    };
    timings.restore_ms = ms(t_restore);
    Ok((entry, reused))
}

/// A cache entry around a new session (its state's buffers made now: `timings.session_ms`).
fn new_entry(
    model: &Arc<LoadedModel>,
    opts: &SessionOptions,
    timings: &mut Timings,
) -> anyhow::Result<Entry> {
    let t = Instant::now();
    let e = Entry::new(Session::new(model.model.clone(), opts)?);
    timings.session_ms += ms(t);
    Ok(e)
}

/// Whether a prompt sharing `n` tokens with `entry` continues that entry's conversation: the
/// shared part covers its last prompt up to a few tokens (a chat template may render the previous
/// generation prompt differently in the history, e.g. Gemma 4's empty thinking channel). Such a
/// sequence is rolled back in place instead of being kept for other requests.
fn follow_up(entry: &Entry, n: usize) -> bool {
    const SLACK: usize = 16;
    entry
        .prompt_cp
        .as_ref()
        .is_some_and(|cp| n + SLACK >= cp.n_past())
}

/// Report a request that cannot start.
fn fail<T>(job: &Job, e: anyhow::Error) -> Option<T> {
    tracing::error!("request failed: {e:#}");
    let _ = job.out.send(Out::Error(engine_error(&e)));
    None
}

/// The client's view of an engine error: memory running out is the server's load (503 with
/// `Retry-After`), anything else is the request's (400).
pub(crate) fn engine_error(e: &anyhow::Error) -> ApiError {
    let msg = format!("{e:#}");
    if vela_compute::OutOfMemory::in_chain(e) {
        ApiError::new(axum::http::StatusCode::SERVICE_UNAVAILABLE, msg).with_retry_after(1)
    } else {
        ApiError::invalid(msg)
    }
}

impl<'m> Seq<'m> {
    /// Admit `job`: a session from the cache rolled back to the shared prefix. A prompt that
    /// cannot fit the context (the HTTP side refuses it first) or a session that cannot be made
    /// is reported to the client as an error: `None`.
    pub fn start(
        model: &'m Arc<LoadedModel>,
        opts: &SessionOptions,
        cache: &mut PrefixCache,
        rollback_limit: usize,
        job: Job,
    ) -> Option<Seq<'m>> {
        let mut timings = Timings {
            queue_ms: ms(job.received),
            ..Timings::default()
        };
        let picked = pick_session(
            model,
            opts,
            cache,
            rollback_limit,
            &job.prompt,
            &mut timings,
        );
        let (entry, reused) = match picked {
            Ok(x) => x,
            Err(e) => return fail(&job, e),
        };
        Seq::build(model, cache, entry, reused, job, timings)
    }

    /// A follower of a sequence whose prompt is in: `session` is a copy of that sequence's,
    /// holding exactly `job`'s prompt; `logits` are its last row. The request then continues as
    /// any other (its first token sampled here).
    pub fn forked(
        model: &'m Arc<LoadedModel>,
        cache: &mut PrefixCache,
        session: Session,
        job: Job,
        logits: Vec<f32>,
        metrics: &Metrics,
    ) -> Option<Seq<'m>> {
        let timings = Timings {
            queue_ms: ms(job.received),
            ..Timings::default()
        };
        let n = session.n_past();
        let mut entry = Entry::new(session);
        entry.prompt_cp = Some(entry.session.checkpoint());
        let mut s = Seq::build(model, cache, entry, n, job, timings)?;
        let prompt_len = s.em.job.prompt.len();
        metrics
            .prompt_tokens
            .fetch_add(prompt_len as u64, Ordering::Relaxed);
        metrics
            .cached_prompt_tokens
            .fetch_add(prompt_len as u64, Ordering::Relaxed);
        metrics.prompt_copies.fetch_add(1, Ordering::Relaxed);
        s.t_decode = Instant::now();
        if let Err(e) = s.advance(Next::Logits(logits), metrics) {
            s.fail(&e);
        }
        Some(s)
    }

    /// The request's sequence around `entry`, whose session holds the first `reused` prompt
    /// tokens.
    fn build(
        model: &'m Arc<LoadedModel>,
        cache: &mut PrefixCache,
        mut entry: Entry,
        reused: usize,
        mut job: Job,
        timings: Timings,
    ) -> Option<Seq<'m>> {
        let n_ctx = entry.session.n_ctx();
        if job.prompt.len() >= n_ctx {
            let n = job.prompt.len();
            cache.put(entry);
            let e =
                anyhow::anyhow!("prompt of {n} tokens does not fit the context of {n_ctx} tokens");
            return fail(&job, e);
        }
        // Checkpoints past the tokens kept are stale.
        if entry
            .prompt_cp
            .as_ref()
            .is_some_and(|c| c.n_past() > reused)
        {
            entry.prompt_cp = None;
        }
        entry.early.retain(|c| c.n_past() <= reused);
        // A state that cannot drop many positions also keeps a checkpoint shortly before the
        // prompt's end (the part a template renders differently once the turn is history).
        let early = job.prompt.len().saturating_sub(EARLY_CHECKPOINT);
        let early_at = if entry.session.rollback_limit() < EARLY_CHECKPOINT && early > reused {
            early
        } else {
            0
        };
        let grammar = job.constraint.take();
        let mut sampler = Sampler::new(job.sampling.clone());
        for &t in &job.prompt {
            sampler.accept(t);
        }
        // Decode steps return only the top-k selection (made on the device by a GPU) when it
        // decides the token exactly like the full row would (no logprobs, no penalties or bias,
        // see `Sampler::sample_top_k`); otherwise, and at the steps it does not decide, the row.
        // A grammar masks the whole row, so constrained steps always take it.
        let device_k = match (job.logprobs, &grammar) {
            (None, None) => sampler.device_top_k(vela_engine::generate::SAMPLE_TOP_K_CAP),
            _ => None,
        };
        // Plain greedy without logprobs: only the argmax comes back (computed on the device by
        // a GPU), not the logits row.
        let device_argmax =
            job.logprobs.is_none() && grammar.is_none() && sampler.cfg.is_plain_greedy();
        let tok = &model.tokenizer;
        let now = Instant::now();
        let em = Emitter {
            tok,
            timings,
            clock: StepClock { ends: Vec::new() },
            detok: tok.detokenizer(true),
            stop: StopMatcher::new(job.stop.clone()),
            parser: OutputParser::new(job.parser.clone()),
            n_gen: 0,
            any_tool: false,
            first: true,
            step_start: now,
            job,
        };
        Some(Seq {
            entry,
            em,
            grammar,
            sampler,
            reused,
            fed: reused,
            early_at,
            stage: Stage::Prefill,
            t_prefill: now,
            t_decode: now,
            device_k,
            device_argmax,
            followers: Vec::new(),
            prompt_logits: None,
        })
    }

    /// The request's prompt.
    pub fn prompt(&self) -> &[u32] {
        &self.em.job.prompt
    }

    pub fn job(&self) -> &Job {
        &self.em.job
    }

    /// The prompt is in (`logits`, its last row): copies of the session, which holds just the
    /// prompt, for the followers; the row is kept for requests that follow before the first
    /// decode step.
    pub fn prompt_done(&mut self, logits: &[f32]) -> Vec<(Job, anyhow::Result<Session>)> {
        self.prompt_logits = Some(logits.to_vec());
        let jobs = std::mem::take(&mut self.followers);
        jobs.into_iter()
            .map(|j| (j, self.entry.session.fork()))
            .collect()
    }

    /// A copy of the session holding just the prompt, and the prompt's last logits row, while
    /// the first decode step has not run.
    pub fn copy_prompt(&self) -> Option<(anyhow::Result<Session>, Vec<f32>)> {
        let fresh = matches!(self.stage, Stage::Pending(_))
            && self.entry.session.n_past() == self.em.job.prompt.len();
        let logits = self.prompt_logits.as_ref().filter(|_| fresh)?;
        Some((self.entry.session.fork(), logits.clone()))
    }

    /// The client went away or cancelled.
    pub fn cancelled(&self) -> bool {
        self.em.cancelled()
    }

    /// Stop a cancelled request (before a forward pass that would include it).
    pub fn cancel(&mut self, metrics: &Metrics) {
        self.em.job.cancel.cancel();
        let phase = match self.stage {
            Stage::Prefill => "prefill",
            _ => "decode",
        };
        log_cancel(metrics, &self.em.clock, &self.em.job, phase);
        self.stage = Stage::Done;
    }

    /// Report an engine error; the session is reset (a failed pass may have written part of
    /// its state).
    pub fn fail(&mut self, e: &anyhow::Error) {
        tracing::error!("request failed: {e:#}");
        let _ = self.em.job.out.send(Out::Error(engine_error(e)));
        self.entry.session.reset();
        self.entry.prompt_cp = None;
        self.entry.early.clear();
        self.stage = Stage::Done;
    }

    /// The next prompt chunk of at most `budget` tokens: up to the session's batch and never
    /// past the early checkpoint.
    pub fn prefill_chunk(&self, budget: usize) -> &[u32] {
        let prompt = &self.em.job.prompt;
        let mut end = prompt.len();
        if self.early_at > self.fed {
            end = end.min(self.early_at);
        }
        let n = (end - self.fed)
            .min(budget)
            .min(self.entry.session.ubatch());
        &prompt[self.fed..self.fed + n]
    }

    /// A decode step of this sequence alone through the backend's argmax or top-k selection
    /// (a GPU copies back an id or `k` pairs instead of the vocabulary); `None` when the request
    /// needs the logits row.
    /// The session, what a batched decode step asks of its logits row (the argmax or the
    /// top-k where [`Self::eval_alone`] would take them, else the row) and the sampler that
    /// decides whether a top-k selection suffices.
    pub fn batch_parts(&mut self) -> (&mut Session, Want, &Sampler) {
        let want = match (self.device_argmax, self.device_k) {
            (true, _) => Want::Argmax,
            (false, Some(k)) => Want::TopK(k),
            (false, None) => Want::Logits,
        };
        (&mut self.entry.session, want, &self.sampler)
    }

    pub fn eval_alone(&mut self, t: &[u32]) -> Option<anyhow::Result<Next>> {
        let session = &mut self.entry.session;
        if self.device_argmax {
            return Some(session.eval_argmax(t).map(Next::Id));
        }
        let k = self.device_k?;
        let sampler = &self.sampler;
        let r = session.eval_top_k(t, k, &|sel| !sampler.top_k_suffices(sel));
        Some(r.map(|(sel, row)| match row {
            Some(row) => Next::Logits(row),
            None => Next::Top(sel),
        }))
    }

    /// Speculative decoding may serve this request (no logprobs, no grammar).
    pub fn speculable(&self) -> bool {
        self.em.job.logprobs.is_none() && self.grammar.is_none()
    }

    /// A prefill chunk of `n` tokens was evaluated; returns `logits` (of its last row) when
    /// that completed the prompt.
    pub fn prefilled(&mut self, n: usize, logits: Vec<f32>, metrics: &Metrics) -> Option<Vec<f32>> {
        self.em.clock.step();
        self.fed += n;
        let prompt_len = self.em.job.prompt.len();
        let (done, total) = (self.fed - self.reused, prompt_len - self.reused);
        let _ = self.em.job.out.send(Out::Progress { done, total });
        if self.fed == self.early_at {
            if self.entry.early.len() >= EARLY_KEEP {
                self.entry.early.remove(0);
            }
            self.entry.early.push(self.entry.session.checkpoint());
        }
        if self.fed < prompt_len {
            return None;
        }
        let tm = &mut self.em.timings;
        tm.prompt_n = total;
        tm.prompt_ms = ms(self.t_prefill);
        let t_cp = Instant::now();
        let cp = self.entry.session.checkpoint();
        tm.checkpoint_ms = ms(t_cp);
        tm.checkpoint_bytes = cp.bytes();
        self.entry.prompt_cp = Some(cp);
        self.t_decode = Instant::now();
        metrics
            .prompt_tokens
            .fetch_add(prompt_len as u64, Ordering::Relaxed);
        metrics
            .cached_prompt_tokens
            .fetch_add(self.reused as u64, Ordering::Relaxed);
        Some(logits)
    }

    /// A decode step's forward pass included this sequence.
    pub fn stepped(&mut self) {
        self.em.clock.step();
        self.prompt_logits = None;
    }

    /// Whether the request is out of tokens or of context.
    fn at_length(&self) -> bool {
        let s = &self.entry.session;
        self.em.n_gen >= self.em.job.max_tokens || s.n_past() + 1 >= s.n_ctx()
    }

    /// Decide the next token from a forward pass's output, report it, and either end the
    /// request or leave the token pending for the next step.
    pub fn advance(&mut self, next: Next, metrics: &Metrics) -> anyhow::Result<()> {
        let (t, lps) = match next {
            Next::Id(id) => {
                self.sampler.accept(id);
                (id, Vec::new())
            }
            Next::Top(sel) => {
                let t = self
                    .sampler
                    .sample_top_k(&sel)
                    .expect("the top-k selection was checked to suffice");
                (t, Vec::new())
            }
            Next::Logits(mut logits) => {
                let raw = self.em.job.logprobs.map(|_| logits.clone());
                let t = match &mut self.grammar {
                    Some(g) => {
                        let t0 = Instant::now();
                        g.apply(&mut logits)?;
                        let t1 = Instant::now();
                        let t = self.sampler.sample(&mut logits);
                        let t2 = Instant::now();
                        g.accept(t)?;
                        self.em.timings.grammar_ms +=
                            ((t1 - t0) + t2.elapsed()).as_secs_f64() * 1e3;
                        t
                    }
                    None => self.sampler.sample(&mut logits),
                };
                let mut lps = Vec::new();
                if let (Some(k), Some(raw)) = (self.em.job.logprobs, raw) {
                    lps.push(logprob_of(self.em.tok, &raw, t, k));
                }
                (t, lps)
            }
        };
        self.em.observe_token(metrics);
        if self.em.tok.is_eog(t) && !self.em.job.ignore_eos {
            self.finish(("stop", None), metrics);
        } else if let Some(f) = self.em.emit(t, lps) {
            self.finish(f, metrics);
        } else if self.at_length() {
            self.finish(("length", None), metrics);
        } else {
            self.stage = Stage::Pending(t);
        }
        Ok(())
    }

    /// Decode by speculative rounds from `logits` (the next token's distribution) until the
    /// request ends or `yield_now()` asks for the engine (another request waits); then the last
    /// reported token is left pending for plain (batched) steps. The tokens are the target's
    /// exact distribution either way (greedy: the same tokens).
    #[allow(clippy::too_many_arguments)]
    pub fn speculate(
        &mut self,
        logits: Vec<f32>,
        drafter: &mut dyn Drafter,
        draft_max: usize,
        depth: Option<&DepthModel>,
        metrics: &Metrics,
        yield_now: &dyn Fn() -> bool,
    ) -> anyhow::Result<()> {
        drafter.sync(&self.entry.session, 0)?;
        let tok = self.em.tok;
        let ignore_eos = self.em.job.ignore_eos;
        let is_eog = |t: u32| !ignore_eos && tok.is_eog(t);
        let session = &mut self.entry.session;
        let opts = SpecOptions {
            depth,
            max_tokens: (self.em.job.max_tokens - self.em.n_gen)
                .min(session.n_ctx() - 1 - session.n_past())
                .max(1),
            draft_max,
            is_eog: &is_eog,
            rule: AcceptRule::Exact,
        };
        let (mut finish, mut cancelled, mut yielded) = (None, false, false);
        let mut emitted = Vec::new();
        let sampling = self.em.job.sampling.clone();
        let em = &mut self.em;
        let (_, reason, stats) =
            continue_speculative(session, drafter, &sampling, logits, &opts, &mut |t| {
                em.observe_token(metrics);
                em.clock.step();
                emitted.push(t);
                if let Some(f) = em.emit(t, Vec::new()) {
                    finish = Some(f);
                    return false;
                }
                if em.cancelled() {
                    cancelled = true;
                    return false;
                }
                if yield_now() {
                    yielded = true;
                    return false;
                }
                true
            })?;
        self.em.timings.draft_n += stats.drafted;
        self.em.timings.draft_n_accepted += stats.accepted;
        metrics
            .draft_tokens
            .fetch_add(stats.drafted as u64, Ordering::Relaxed);
        metrics
            .draft_accepted
            .fetch_add(stats.accepted as u64, Ordering::Relaxed);
        for &t in &emitted {
            self.sampler.accept(t);
        }
        match (finish, emitted.last()) {
            (Some(f), _) => self.finish(f, metrics),
            _ if cancelled => self.cancel(metrics),
            (None, Some(_)) if yielded && self.at_length() => {
                self.finish(("length", None), metrics)
            }
            (None, Some(&t)) if yielded => self.stage = Stage::Pending(t),
            _ => match reason {
                FinishReason::Stop => self.finish(("stop", None), metrics),
                _ => self.finish(("length", None), metrics),
            },
        }
        Ok(())
    }

    /// End the request: flush the detokenizer, stop matcher and parser; report `Done`.
    fn finish(&mut self, (finish, stop_word): Finish, metrics: &Metrics) {
        let em = &mut self.em;
        em.timings.predicted_n = em.n_gen;
        em.timings.predicted_ms = ms(self.t_decode);
        if stop_word.is_none() {
            let rest = em.detok.flush();
            let (mut text, hit) = em.stop.push(&rest);
            if hit.is_none() {
                text.push_str(&em.stop.finish());
            }
            send_events(
                &em.job.out,
                em.parser.push(&text),
                Vec::new(),
                &mut em.any_tool,
            );
        }
        send_events(
            &em.job.out,
            em.parser.finish(),
            Vec::new(),
            &mut em.any_tool,
        );
        metrics
            .generated_tokens
            .fetch_add(em.n_gen as u64, Ordering::Relaxed);
        let finish = if em.any_tool && finish == "stop" {
            "tool_calls"
        } else {
            finish
        };
        let usage = Usage {
            prompt_tokens: em.job.prompt.len(),
            completion_tokens: em.n_gen,
            cached_tokens: self.reused,
            timings: em.timings,
        };
        let _ = em.job.out.send(Out::Done {
            finish,
            stop_word,
            usage,
        });
        self.stage = Stage::Done;
    }
}

#[cfg(test)]
mod tests {
    use super::engine_error;
    use anyhow::Context;

    #[test]
    fn memory_running_out_is_overloaded_other_engine_errors_are_the_requests() {
        let oom = Err::<(), _>(vela_compute::OutOfMemory("no pages left".into()))
            .context("decode step")
            .unwrap_err();
        let e = engine_error(&oom);
        assert_eq!(e.status.as_u16(), 503);
        assert_eq!(e.retry_after, Some(1));
        assert_eq!(e.openai_type(), "server_overloaded");
        assert_eq!(e.message, "decode step: no pages left");
        let other = engine_error(&anyhow::anyhow!("token 7 out of range"));
        assert_eq!(other.status.as_u16(), 400);
        assert_eq!(other.retry_after, None);
    }
}
