//! The engine worker: one thread owning every sequence, serving jobs from a bounded FIFO.
//!
//! For each job it picks a cached session (prefix cache), prefills the new prompt tokens in
//! `ubatch` chunks and decodes token by token. Cancellation is an [`CancelToken`] set by the HTTP
//! side when the client goes away; it is checked after every prefill chunk and before every
//! decode step, so at most one forward pass runs after it is set (counted in
//! `vela_steps_after_cancel_total`).

use crate::cache::{Entry, PrefixCache, Reuse, EARLY_CHECKPOINT, EARLY_KEEP};
use crate::metrics::Metrics;
use crate::parser::{Event, OutputParser, ParserConfig, ToolCall};
use crate::stop::StopMatcher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;
use tokio::sync::mpsc;
use vela_engine::grammar::Constraint;
use vela_engine::loader::LoadedModel;
use vela_engine::speculative::{
    continue_speculative, AcceptRule, DepthModel, Drafter, SpecOptions,
};
use vela_engine::FinishReason;
use vela_engine::{sampler, EvalOutcome, Sampler, SamplerConfig, Session, SessionOptions};

/// Set when the client is gone; remembers when.
pub struct CancelToken {
    flag: AtomicBool,
    at_us: AtomicU64,
}

fn epoch() -> Instant {
    static E: OnceLock<Instant> = OnceLock::new();
    *E.get_or_init(Instant::now)
}

fn now_us() -> u64 {
    epoch().elapsed().as_micros() as u64 + 1
}

impl CancelToken {
    pub fn new() -> Arc<Self> {
        epoch();
        Arc::new(CancelToken {
            flag: AtomicBool::new(false),
            at_us: AtomicU64::new(0),
        })
    }
    pub fn cancel(&self) {
        if !self.flag.swap(true, Ordering::SeqCst) {
            self.at_us.store(now_us(), Ordering::SeqCst);
        }
    }
    pub fn is_cancelled(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }
    fn at(&self) -> u64 {
        self.at_us.load(Ordering::SeqCst)
    }
}

/// One token's log-probability with its alternatives.
#[derive(Debug, Clone)]
pub struct TokenLogprob {
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
    pub top: Vec<(String, Vec<u8>, f32)>,
}

/// Token accounting of a finished request.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
    pub timings: Timings,
}

/// Where the engine's time went for one request (the `timings` object of a response, named as
/// llama-server names them where it has the same quantity; docs/server.md defines each).
#[derive(Debug, Clone, Copy, Default)]
pub struct Timings {
    /// From the request's arrival at the HTTP side until the worker took it.
    pub queue_ms: f64,
    /// Returning the picked cached sequence to the shared prefix (truncate or checkpoint
    /// restore), and the bytes a restore copied back.
    pub restore_ms: f64,
    pub restore_bytes: usize,
    /// Prompt tokens evaluated (not taken from the cache) and the time of that evaluation,
    /// from the first chunk's start until the last chunk's logits are on the host.
    pub prompt_n: usize,
    pub prompt_ms: f64,
    /// The checkpoint taken after the prompt (what a follow-up turn restores).
    pub checkpoint_ms: f64,
    pub checkpoint_bytes: usize,
    /// The decode loop: from the prompt's logits to the loop's exit on any path (end of
    /// generation, stop string, length, cancellation), including sampling, stop matching and
    /// output parsing, before the final detokenizer flush.
    pub predicted_n: usize,
    pub predicted_ms: f64,
    /// Speculative decoding: drafted tokens and the drafts verification accepted.
    pub draft_n: usize,
    pub draft_n_accepted: usize,
    /// Structured output: time in the grammar (each step's token mask, applying it, advancing
    /// past the sampled token), part of `predicted_ms`.
    pub grammar_ms: f64,
    /// From the request's arrival until its first token was sampled (0: none was).
    pub ttft_ms: f64,
}

/// What the engine worker is doing ([`Metrics::phase`]), read by probes that attribute
/// latency to phases (`vela eval`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    Load = 0,
    Idle = 1,
    Prefill = 2,
    Decode = 3,
}

impl Phase {
    pub fn from_u8(v: u8) -> Phase {
        match v {
            1 => Phase::Idle,
            2 => Phase::Prefill,
            3 => Phase::Decode,
            _ => Phase::Load,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Phase::Load => "load",
            Phase::Idle => "idle",
            Phase::Prefill => "prefill",
            Phase::Decode => "decode",
        }
    }
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// What the worker reports for a job.
#[derive(Debug)]
pub enum Out {
    /// A prefill chunk finished (`done` of `total` new prompt tokens).
    Progress {
        done: usize,
        total: usize,
    },
    /// Parsed output.
    Delta {
        content: String,
        reasoning: String,
        tool_calls: Vec<ToolCall>,
        logprobs: Vec<TokenLogprob>,
    },
    /// Finished: `stop`, `length` or `tool_calls`; the matched stop string, if one.
    Done {
        finish: &'static str,
        stop_word: Option<String>,
        usage: Usage,
    },
    Error(String),
}

/// A generation request for the worker.
pub struct Job {
    pub prompt: Vec<u32>,
    pub sampling: SamplerConfig,
    pub max_tokens: usize,
    pub stop: Vec<String>,
    /// Some(n): report log-probabilities with `n` alternatives.
    pub logprobs: Option<usize>,
    pub parser: ParserConfig,
    /// Structured output: the grammar every sampled token must follow.
    pub constraint: Option<Constraint>,
    pub cancel: Arc<CancelToken>,
    pub out: mpsc::UnboundedSender<Out>,
    pub received: Instant,
}

/// Settings of the worker.
pub struct WorkerConfig {
    pub session: SessionOptions,
    pub cache_bytes: usize,
    /// Speculative decoding (requests without logprobs): the drafter and drafts per round.
    pub drafter: Option<Box<dyn Drafter>>,
    pub draft_max: usize,
    /// The depth cost model shared by every request (`None`: always `draft_max`).
    pub depth: Option<DepthModel>,
}

/// Run the worker loop until the job channel closes.
pub fn run(
    model: Arc<LoadedModel>,
    mut cfg: WorkerConfig,
    mut jobs: mpsc::Receiver<Job>,
    metrics: Arc<Metrics>,
) {
    let mut cache = PrefixCache::new(cfg.cache_bytes);
    // Trailing positions a session can drop without a checkpoint (the same for every session).
    let rollback_limit = model
        .model
        .state_layout()
        .rollback_limit(cfg.session.ubatch.max(1));
    metrics.set_phase(Phase::Idle);
    while let Some(job) = jobs.blocking_recv() {
        metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
        if job.cancel.is_cancelled() || job.out.is_closed() {
            metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let out = job.out.clone();
        let mut drafter = cfg.drafter.take();
        let r = serve_job(
            &model,
            &cfg,
            &mut cache,
            rollback_limit,
            job,
            &metrics,
            &mut drafter,
        );
        cfg.drafter = drafter;
        metrics.set_phase(Phase::Idle);
        if let Err(e) = r {
            tracing::error!("request failed: {e:#}");
            let _ = out.send(Out::Error(format!("{e:#}")));
        }
        metrics
            .cache_sessions
            .store(cache.entries.len() as u64, Ordering::Relaxed);
        metrics
            .cache_bytes
            .store(cache.total_bytes() as u64, Ordering::Relaxed);
    }
}

/// Steps recorded for the cancellation metric.
struct StepClock {
    ends: Vec<u64>,
}

impl StepClock {
    fn step(&mut self) {
        self.ends.push(now_us());
    }
    /// Steps that completed after the cancel flag was set.
    fn after(&self, c: &CancelToken) -> u64 {
        let at = c.at();
        self.ends.iter().filter(|&&t| t > at).count() as u64
    }
}

fn log_cancel(metrics: &Metrics, clock: &StepClock, job: &Job, phase: &str) {
    let n = clock.after(&job.cancel);
    metrics.cancelled.fetch_add(1, Ordering::Relaxed);
    metrics.steps_after_cancel.fetch_add(n, Ordering::Relaxed);
    tracing::info!("request cancelled during {phase}; {n} engine step(s) ran after the cancel");
}

fn serve_job(
    model: &Arc<LoadedModel>,
    cfg: &WorkerConfig,
    cache: &mut PrefixCache,
    rollback_limit: usize,
    job: Job,
    metrics: &Metrics,
    drafter: &mut Option<Box<dyn Drafter>>,
) -> anyhow::Result<()> {
    let mut timings = Timings {
        queue_ms: ms(job.received),
        ..Timings::default()
    };
    // Pick a session.
    let (mut entry, mut reuse) = match cache.take_best(rollback_limit, &job.prompt) {
        Some(x) => x,
        None => {
            let per = cache
                .entries
                .first()
                .map(|e| e.session.kv_bytes())
                .unwrap_or(0);
            let e = if !cache.entries.is_empty() && cache.total_bytes() + per > cache.budget {
                cache.take_lru()
            } else {
                None
            };
            let e = match e {
                Some(e) => e,
                None => Entry::new(Session::new(model.model.clone(), &cfg.session)?),
            };
            (e, Reuse::Reset)
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
                    None => Entry::new(Session::new(model.model.clone(), &cfg.session)?),
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
    // Constrained requests decode without drafts: the grammar masks one position at a time.
    let spec = match drafter {
        Some(d) if job.logprobs.is_none() && job.constraint.is_none() => {
            Some((&mut **d, cfg.draft_max, cfg.depth.as_ref()))
        }
        _ => None,
    };
    let result = generate(model, &mut entry, reused, job, metrics, spec, timings);
    cache.put(entry);
    result
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

fn generate(
    model: &LoadedModel,
    entry: &mut Entry,
    reused: usize,
    mut job: Job,
    metrics: &Metrics,
    spec: Option<(&mut (dyn Drafter + 'static), usize, Option<&DepthModel>)>,
    mut timings: Timings,
) -> anyhow::Result<()> {
    let session = &mut entry.session;
    let tok = &model.tokenizer;
    let n_ctx = session.n_ctx();
    if job.prompt.len() >= n_ctx {
        anyhow::bail!(
            "prompt of {} tokens does not fit the context of {n_ctx} tokens",
            job.prompt.len()
        );
    }
    let mut clock = StepClock { ends: Vec::new() };
    let new = &job.prompt[reused..];
    let total = new.len();
    let mut grammar = job.constraint.take();
    let job = &job;
    let out = &job.out;
    let cancel = &job.cancel;
    metrics.set_phase(Phase::Prefill);
    let t_prefill = Instant::now();
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
    let split = if session.rollback_limit() < EARLY_CHECKPOINT && early > reused {
        early - reused
    } else {
        0
    };
    let mut progress = |done: usize, total: usize| {
        clock.step();
        let _ = out.send(Out::Progress { done, total });
        !(cancel.is_cancelled() || out.is_closed())
    };
    let mut outcome = EvalOutcome::Cancelled { n_done: 0 };
    let mut first_done = true;
    if split > 0 {
        outcome = session.eval_with(&new[..split], &mut progress)?;
        first_done = matches!(outcome, EvalOutcome::Done(_));
        if first_done {
            if entry.early.len() >= EARLY_KEEP {
                entry.early.remove(0);
            }
            entry.early.push(session.checkpoint());
        }
    }
    if first_done {
        outcome = session.eval_with(&new[split..], &mut progress)?;
    }
    let mut logits = match outcome {
        EvalOutcome::Done(l) => l,
        EvalOutcome::Cancelled { .. } => {
            if out.is_closed() {
                cancel.cancel();
            }
            log_cancel(metrics, &clock, job, "prefill");
            return Ok(());
        }
    };
    timings.prompt_n = total;
    timings.prompt_ms = ms(t_prefill);
    let t_cp = Instant::now();
    let cp = session.checkpoint();
    timings.checkpoint_ms = ms(t_cp);
    timings.checkpoint_bytes = cp.bytes();
    entry.prompt_cp = Some(cp);
    metrics.set_phase(Phase::Decode);
    let t_decode = Instant::now();
    metrics
        .prompt_tokens
        .fetch_add(job.prompt.len() as u64, Ordering::Relaxed);
    metrics
        .cached_prompt_tokens
        .fetch_add(reused as u64, Ordering::Relaxed);

    let mut sampler = Sampler::new(job.sampling.clone());
    for &t in &job.prompt {
        sampler.accept(t);
    }
    let mut detok = tok.detokenizer(true);
    let mut stop = StopMatcher::new(job.stop.clone());
    let mut parser = OutputParser::new(job.parser.clone());
    let mut n_gen = 0usize;
    let mut any_tool = false;
    let mut first = true;
    let mut ttft_ms = 0.0;
    let mut step_start = Instant::now();
    let (finish, stop_word) = if let Some((drafter, draft_max, depth)) = spec {
        // Speculative decoding: verified tokens arrive through the callback, in order.
        drafter.sync(session, 0)?;
        let mut stop_word = None;
        let mut cancelled = false;
        let is_eog = |t: u32| tok.is_eog(t);
        let opts = SpecOptions {
            depth,
            max_tokens: job.max_tokens.min(n_ctx - 1 - session.n_past()).max(1),
            draft_max,
            is_eog: &is_eog,
            rule: AcceptRule::Exact,
        };
        let (_, reason, stats) =
            continue_speculative(session, drafter, &job.sampling, logits, &opts, &mut |t| {
                if first {
                    let t = job.received.elapsed().as_secs_f64();
                    metrics.ttft.observe(t);
                    ttft_ms = t * 1e3;
                    first = false;
                } else {
                    metrics
                        .token_latency
                        .observe(step_start.elapsed().as_secs_f64());
                }
                step_start = Instant::now();
                clock.step();
                n_gen += 1;
                let piece = detok.push(t);
                let (text, hit) = stop.push(&piece);
                send_events(out, parser.push(&text), Vec::new(), &mut any_tool);
                if hit.is_some() {
                    stop_word = hit;
                    return false;
                }
                if cancel.is_cancelled() || out.is_closed() {
                    cancelled = true;
                    return false;
                }
                true
            })?;
        timings.draft_n = stats.drafted;
        timings.draft_n_accepted = stats.accepted;
        metrics
            .draft_tokens
            .fetch_add(stats.drafted as u64, Ordering::Relaxed);
        metrics
            .draft_accepted
            .fetch_add(stats.accepted as u64, Ordering::Relaxed);
        if cancelled {
            cancel.cancel();
            log_cancel(metrics, &clock, job, "decode");
            return Ok(());
        }
        match (reason, stop_word.is_some()) {
            (_, true) => ("stop", stop_word),
            (FinishReason::Stop, _) => ("stop", None),
            _ => ("length", None),
        }
    } else {
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
        let mut top = None;
        let mut next_id: Option<u32> = None;
        loop {
            if cancel.is_cancelled() || out.is_closed() {
                cancel.cancel();
                log_cancel(metrics, &clock, job, "decode");
                return Ok(());
            }
            let raw = job.logprobs.map(|_| logits.clone());
            let t = match (next_id.take(), top.take()) {
                (Some(id), _) => {
                    sampler.accept(id);
                    id
                }
                (None, Some(sel)) => sampler
                    .sample_top_k(&sel)
                    .expect("the top-k selection was checked to suffice"),
                (None, None) => match &mut grammar {
                    Some(g) => {
                        let t0 = Instant::now();
                        g.apply(&mut logits)?;
                        let t1 = Instant::now();
                        let t = sampler.sample(&mut logits);
                        let t2 = Instant::now();
                        g.accept(t)?;
                        timings.grammar_ms += ((t1 - t0) + t2.elapsed()).as_secs_f64() * 1e3;
                        t
                    }
                    None => sampler.sample(&mut logits),
                },
            };
            if first {
                let t = job.received.elapsed().as_secs_f64();
                metrics.ttft.observe(t);
                ttft_ms = t * 1e3;
                first = false;
            } else {
                metrics
                    .token_latency
                    .observe(step_start.elapsed().as_secs_f64());
            }
            if tok.is_eog(t) {
                break ("stop", None);
            }
            n_gen += 1;
            let mut lps = Vec::new();
            if let (Some(k), Some(raw)) = (job.logprobs, raw) {
                lps.push(logprob_of(tok, &raw, t, k));
            }
            let piece = detok.push(t);
            let (text, hit) = stop.push(&piece);
            send_events(out, parser.push(&text), lps, &mut any_tool);
            if hit.is_some() {
                break ("stop", hit);
            }
            if n_gen >= job.max_tokens || session.n_past() + 1 >= n_ctx {
                break ("length", None);
            }
            step_start = Instant::now();
            match device_k {
                _ if device_argmax => next_id = Some(session.eval_argmax(&[t])?),
                Some(k) => {
                    let (sel, row) =
                        session.eval_top_k(&[t], k, &|sel| !sampler.top_k_suffices(sel))?;
                    match row {
                        Some(row) => logits = row,
                        None => top = Some(sel),
                    }
                }
                None => logits = session.eval(&[t])?,
            }
            clock.step();
        }
    };
    timings.predicted_n = n_gen;
    timings.predicted_ms = ms(t_decode);
    timings.ttft_ms = ttft_ms;
    if stop_word.is_none() {
        let rest = detok.flush();
        let (mut text, hit) = stop.push(&rest);
        if hit.is_none() {
            text.push_str(&stop.finish());
        }
        send_events(out, parser.push(&text), Vec::new(), &mut any_tool);
    }
    send_events(out, parser.finish(), Vec::new(), &mut any_tool);
    metrics
        .generated_tokens
        .fetch_add(n_gen as u64, Ordering::Relaxed);
    let finish = if any_tool && finish == "stop" {
        "tool_calls"
    } else {
        finish
    };
    let usage = Usage {
        prompt_tokens: job.prompt.len(),
        completion_tokens: n_gen,
        cached_tokens: reused,
        timings,
    };
    let _ = out.send(Out::Done {
        finish,
        stop_word,
        usage,
    });
    Ok(())
}

fn send_events(
    out: &mpsc::UnboundedSender<Out>,
    events: Vec<Event>,
    logprobs: Vec<TokenLogprob>,
    any_tool: &mut bool,
) {
    let (mut content, mut reasoning, mut tool_calls) = (String::new(), String::new(), Vec::new());
    for e in events {
        match e {
            Event::Content(s) => content.push_str(&s),
            Event::Reasoning(s) => reasoning.push_str(&s),
            Event::ToolCall(c) => tool_calls.push(c),
        }
    }
    *any_tool |= !tool_calls.is_empty();
    if content.is_empty() && reasoning.is_empty() && tool_calls.is_empty() && logprobs.is_empty() {
        return;
    }
    let _ = out.send(Out::Delta {
        content,
        reasoning,
        tool_calls,
        logprobs,
    });
}

/// Log-probability of `t` and the `k` most likely tokens under the model's own distribution.
fn logprob_of(tok: &vela_tokenizer::Tokenizer, logits: &[f32], t: u32, k: usize) -> TokenLogprob {
    let max = logits
        .iter()
        .cloned()
        .filter(|x| !x.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    let lse = max as f64
        + logits
            .iter()
            .filter(|x| !x.is_nan())
            .map(|&l| ((l - max) as f64).exp())
            .sum::<f64>()
            .ln();
    let piece = |id: u32| {
        let b = tok.token_to_piece(id, true);
        (String::from_utf8_lossy(&b).into_owned(), b)
    };
    let lp = |id: u32| {
        (logits
            .get(id as usize)
            .copied()
            .unwrap_or(f32::NEG_INFINITY) as f64
            - lse) as f32
    };
    let (token, bytes) = piece(t);
    let top = sampler::top_k(logits, k)
        .into_iter()
        .map(|c| {
            let (s, b) = piece(c.id);
            (s, b, lp(c.id))
        })
        .collect();
    TokenLogprob {
        token,
        bytes,
        logprob: lp(t),
        top,
    }
}
