//! The engine worker: one thread owning every sequence, serving jobs from a bounded FIFO with
//! continuous batching ([`run`]).
//!
//! Each admitted job takes a cached session (prefix cache); its new prompt tokens are evaluated
//! in chunks and its tokens decoded one per step, in forward passes shared with the other active
//! requests. Cancellation is a [`CancelToken`] set by the HTTP side when the client goes away;
//! it is checked before every step, so at most one forward pass runs after it is set (counted in
//! `vela_steps_after_cancel_total`).

mod seq;

use crate::cache::PrefixCache;
use crate::metrics::Metrics;
use crate::parser::{Event, ParserConfig, ToolCall};
use seq::{Next, Seq, Stage, Want};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;
use tokio::sync::mpsc;
use vela_engine::grammar::Constraint;
use vela_engine::loader::LoadedModel;
use vela_engine::speculative::{DepthModel, Drafter};
use vela_engine::{sampler, SamplerConfig, Select, Session, SessionOptions};

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
    /// Making a new sequence state for the request (its buffers), when no cached one was used.
    pub session_ms: f64,
    /// Returning the picked cached sequence to the shared prefix (truncate or checkpoint
    /// restore), and the bytes a restore copied back.
    pub restore_ms: f64,
    pub restore_bytes: usize,
    /// Loading the sequence's saved state from `--cache-dir` (0 when none was loaded).
    pub cache_load_ms: f64,
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
    Progress { done: usize, total: usize },
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
    /// The request failed in the engine (a 400, or a 503 when memory ran out).
    Error(crate::error::ApiError),
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
    /// Admitted once already (a follower put back): not counted in the queue again.
    pub requeued: bool,
    /// End-of-generation tokens do not end the output ([`crate::request::GenParams`]).
    pub ignore_eos: bool,
}

impl Job {
    /// An empty job that only wakes an idle worker (at shutdown); never evaluated.
    pub fn wake() -> Job {
        Job {
            prompt: Vec::new(),
            sampling: SamplerConfig::default(),
            max_tokens: 0,
            stop: Vec::new(),
            logprobs: None,
            parser: ParserConfig::default(),
            constraint: None,
            cancel: CancelToken::new(),
            out: mpsc::unbounded_channel().0,
            received: Instant::now(),
            requeued: true,
            ignore_eos: false,
        }
    }
}

/// Settings of the worker.
pub struct WorkerConfig {
    pub session: SessionOptions,
    pub cache_bytes: usize,
    /// The persistent prefix cache (`--cache-dir`).
    pub disk: Option<crate::disk_cache::DiskCache>,
    /// Shutdown: the loop ends once this is set and no request is running (a [`Job::wake`]
    /// wakes an idle worker); then `done` is signalled.
    pub stop: Arc<std::sync::atomic::AtomicBool>,
    pub done: Option<std::sync::mpsc::Sender<()>>,
    /// Sequences evaluated together at most (continuous batching); more requests wait in the
    /// queue.
    pub parallel: usize,
    /// The context of every session, and the sequence-state bytes the running requests may
    /// reserve together: each reserves the state of `prompt + max_tokens` positions at
    /// admission ([`vela_models::StateLayout::bytes`]); a request that would exceed the budget
    /// waits at the head of the queue (one alone always runs).
    pub n_ctx: usize,
    pub kv_budget: u64,
    /// Speculative decoding (requests without logprobs or grammar, while they run alone): the
    /// drafter and drafts per round.
    pub drafter: Option<Box<dyn Drafter>>,
    pub draft_max: usize,
    /// The depth cost model shared by every request (`None`: always `draft_max`).
    pub depth: Option<DepthModel>,
}

/// Run the worker loop until the job channel closes and every admitted request has finished.
///
/// Continuous batching: every step is one forward pass over the active sequences (at most
/// `parallel`): one token for each decoding sequence, and chunks of the prompts being prefilled
/// in the rest of a budget of `ubatch` tokens (oldest request first), so decode latency stays
/// bounded while long prompts are ingested. New requests are admitted between steps. A request
/// running alone, with a drafter, decodes by speculative rounds until another one arrives.
pub fn run(
    model: Arc<LoadedModel>,
    mut cfg: WorkerConfig,
    mut jobs: mpsc::Receiver<Job>,
    metrics: Arc<Metrics>,
) {
    let mut cache = PrefixCache::new(cfg.cache_bytes);
    cache.disk = cfg.disk.take();
    // Trailing positions a session can drop without a checkpoint (the same for every session).
    let rollback_limit = model
        .model
        .state_layout()
        .rollback_limit(cfg.session.ubatch.max(1));
    let parallel = cfg.parallel.max(1);
    let layout = model.model.state_layout();
    let (n_ctx, ubatch, kv_type) = (cfg.n_ctx, cfg.session.ubatch.max(1), cfg.session.kv_type);
    let need = |j: &Job| layout.bytes((j.prompt.len() + j.max_tokens).min(n_ctx), ubatch, kv_type);
    let reserved = |a: &[Seq]| -> u64 {
        a.iter()
            .map(|s| need(s.job()) + s.followers.iter().map(need).sum::<u64>())
            .sum()
    };
    metrics.kv_budget.store(cfg.kv_budget, Ordering::Relaxed);
    let mut active: Vec<Seq> = Vec::new();
    // Followers whose leader stopped before its prompt was in, or whose copy failed: admitted
    // again before new requests.
    let mut requeue: VecDeque<Job> = VecDeque::new();
    let mut open = true;
    metrics.set_phase(Phase::Idle);
    loop {
        // The request at the head of the queue waits for state memory.
        let mut no_room = false;
        // Admit waiting requests between steps; block only when idle. Followers count as the
        // sequences they become.
        let load = |a: &[Seq]| a.len() + a.iter().map(|s| s.followers.len()).sum::<usize>();
        while load(&active) < parallel {
            let job = if let Some(j) = requeue.pop_front() {
                j
            } else if active.is_empty() && cfg.stop.load(Ordering::Relaxed) {
                break;
            } else if active.is_empty() {
                match open.then(|| jobs.blocking_recv()).flatten() {
                    Some(j) => j,
                    None => {
                        open = false;
                        break;
                    }
                }
            } else {
                match jobs.try_recv() {
                    Ok(j) => j,
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            };
            if job.prompt.is_empty() {
                // A wake-up (shutdown): the loop below sees the flag.
                break;
            }
            if !job.requeued {
                metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
            }
            if job.cancel.is_cancelled() || job.out.is_closed() {
                metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if !active.is_empty() && reserved(&active) + need(&job) > cfg.kv_budget {
                // First in line again (counted in the queue again): admitted when a running
                // request's reservation is released.
                let mut job = job;
                job.requeued = false;
                metrics.queue_depth.fetch_add(1, Ordering::Relaxed);
                requeue.push_front(job);
                no_room = true;
                break;
            }
            // The same prompt as one being evaluated (`n` > 1, identical requests): wait for a
            // copy of its session instead of evaluating it again; or copy it now, when it is in
            // and the first token not yet evaluated.
            let same = |s: &&mut Seq| s.prompt() == &job.prompt[..];
            if let Some(l) = active
                .iter_mut()
                .filter(same)
                .find(|s| matches!(s.stage, Stage::Prefill))
            {
                l.followers.push(job);
                continue;
            }
            let copy = active
                .iter()
                .find(|s| s.prompt() == &job.prompt[..])
                .and_then(|s| s.copy_prompt());
            if let Some((Ok(session), logits)) = copy {
                active.extend(Seq::forked(
                    &model, &mut cache, session, job, logits, &metrics,
                ));
                continue;
            }
            if let Some(s) = Seq::start(&model, &cfg.session, &mut cache, rollback_limit, job) {
                active.push(s);
            }
        }
        if active.is_empty() {
            if !open || cfg.stop.load(Ordering::Relaxed) {
                break;
            }
            continue;
        }
        let can_admit = load(&active) < parallel && !no_room;
        let forks = step(&mut active, &mut cfg, &metrics, can_admit);
        for (mut job, session, logits) in forks {
            match session {
                Ok(session) => {
                    let s = Seq::forked(&model, &mut cache, session, job, logits, &metrics);
                    active.extend(s);
                }
                Err(e) => {
                    tracing::warn!("copying a session for an identical prompt failed: {e:#}");
                    job.requeued = true;
                    requeue.push_back(job);
                }
            }
        }
        let mut i = 0;
        while i < active.len() {
            if matches!(active[i].stage, Stage::Done) {
                let mut s = active.remove(i);
                for mut j in s.followers.drain(..) {
                    j.requeued = true;
                    requeue.push_back(j);
                }
                cache.put(s.entry);
            } else {
                i += 1;
            }
        }
        if active.is_empty() {
            metrics.set_phase(Phase::Idle);
        }
        metrics
            .running
            .store(active.len() as u64, Ordering::Relaxed);
        metrics
            .kv_reserved
            .store(reserved(&active), Ordering::Relaxed);
        metrics.kv_held.store(
            active
                .iter()
                .map(|s| s.entry.session.kv_bytes() as u64)
                .sum(),
            Ordering::Relaxed,
        );
        metrics
            .cache_sessions
            .store(cache.entries.len() as u64, Ordering::Relaxed);
        metrics
            .cache_bytes
            .store(cache.total_bytes() as u64, Ordering::Relaxed);
    }
    // Shutdown: every cached sequence to disk (`--cache-dir`), the writes finished.
    if let Some(d) = &cache.disk {
        tracing::info!(
            "prefix cache: saving {} sequence(s) to {}",
            cache.entries.len(),
            d.dir().display()
        );
    }
    cache.spill_all();
    metrics.set_phase(Phase::Idle);
    if let Some(d) = cfg.done.take() {
        let _ = d.send(());
    }
}

/// A follower's job, a copy of its leader's session, and the prompt's last logits row.
type Fork = (Job, anyhow::Result<Session>, Vec<f32>);

/// One engine step over the active sequences (see [`run`]); `can_admit`: another request could be
/// admitted (a speculative run yields only then). Returns the followers of sequences whose
/// prompt this step completed, with copies of their sessions.
fn step(
    active: &mut [Seq],
    cfg: &mut WorkerConfig,
    metrics: &Metrics,
    can_admit: bool,
) -> Vec<Fork> {
    // Cancelled requests stop before the pass.
    for s in active.iter_mut() {
        if !matches!(s.stage, Stage::Done) && s.cancelled() {
            s.cancel(metrics);
        }
    }
    let live: Vec<usize> = (0..active.len())
        .filter(|&i| !matches!(active[i].stage, Stage::Done))
        .collect();
    let mut forks = Vec::new();
    if live.is_empty() {
        return forks;
    }
    // The step's inputs, in request order (oldest first; the pass below pairs them with the
    // sessions in that order): every pending token, and prompt chunks within what the budget
    // leaves (at least one chunk, so a prompt always progresses).
    let budget = cfg.session.ubatch.max(1);
    let mut used = live
        .iter()
        .filter(|&&i| matches!(active[i].stage, Stage::Pending(_)))
        .count();
    let mut items: Vec<(usize, Vec<u32>, bool)> = Vec::new();
    for &i in &live {
        match active[i].stage {
            Stage::Pending(t) => items.push((i, vec![t], false)),
            Stage::Prefill => {
                let room = budget.saturating_sub(used);
                let has_prefill = items.iter().any(|it| it.2);
                if room == 0 && has_prefill {
                    continue;
                }
                let chunk = active[i].prefill_chunk(room.max(1)).to_vec();
                used += chunk.len();
                items.push((i, chunk, true));
            }
            Stage::Done => {}
        }
    }
    let prefill = items.iter().any(|it| it.2);
    metrics.steps.fetch_add(1, Ordering::Relaxed);
    metrics
        .step_sequences
        .fetch_add(items.len() as u64, Ordering::Relaxed);
    metrics.set_phase(if prefill {
        Phase::Prefill
    } else {
        Phase::Decode
    });
    // A single decoding sequence: the backend's argmax or top-k instead of the logits row.
    let lone = live.len() == 1;
    let speculate = lone && cfg.drafter.is_some() && active[live[0]].speculable();
    let alone = match &items[..] {
        [(i, t, false)] if lone && !speculate => active[*i].eval_alone(t),
        _ => None,
    };
    let outs: anyhow::Result<Vec<Next>> = match alone {
        Some(r) => r.map(|n| vec![n]),
        _ => {
            // Prompt chunks need their logits row (a completed prompt keeps it for its
            // followers); decode rows take what their sampler needs, selected on the device.
            let mut sessions: Vec<&mut Session> = Vec::with_capacity(items.len());
            let mut wants = Vec::with_capacity(items.len());
            let mut samplers = Vec::with_capacity(items.len());
            let mut k = 0;
            for (i, s) in active.iter_mut().enumerate() {
                if let Some(it) = items.get(k).filter(|it| it.0 == i) {
                    let (session, want, sampler) = s.batch_parts();
                    sessions.push(session);
                    wants.push(if it.2 { Want::Logits } else { want });
                    samplers.push(sampler);
                    k += 1;
                }
            }
            let suffices: Vec<_> = samplers
                .iter()
                .map(|s| move |t: &vela_compute::TopK| !s.top_k_suffices(t))
                .collect();
            let selects: Vec<Select> = wants
                .iter()
                .zip(&suffices)
                .map(|(w, f)| match *w {
                    Want::Logits => Select::Logits,
                    Want::Argmax => Select::Argmax,
                    Want::TopK(k) => Select::TopK(k, f),
                })
                .collect();
            let inputs: Vec<&[u32]> = items.iter().map(|it| &it.1[..]).collect();
            Session::eval_batch_select(&mut sessions, &inputs, &selects)
                .and_then(|out| out.into_iter().map(Next::from_selected).collect())
        }
    };
    let outs = match outs {
        Ok(o) => o,
        Err(e) => {
            for it in &items {
                active[it.0].fail(&e);
            }
            return forks;
        }
    };
    let yield_now = || can_admit && metrics.queue_depth.load(Ordering::Relaxed) > 0;
    for ((i, tokens, is_prefill), next) in items.into_iter().zip(outs) {
        let s = &mut active[i];
        let next = if is_prefill {
            let Next::Logits(l) = next else {
                unreachable!("prefill steps return logits")
            };
            match s.prefilled(tokens.len(), l, metrics) {
                Some(l) => {
                    // Before the first token: the session holds just the prompt.
                    for (job, session) in s.prompt_done(&l) {
                        forks.push((job, session, l.clone()));
                    }
                    Next::Logits(l)
                }
                None => continue,
            }
        } else {
            s.stepped();
            next
        };
        let r = match (next, cfg.drafter.as_deref_mut()) {
            (Next::Logits(l), Some(d)) if speculate => {
                let depth = cfg.depth.as_ref();
                s.speculate(l, d, cfg.draft_max, depth, metrics, &yield_now)
            }
            (next, _) => s.advance(next, metrics),
        };
        if let Err(e) = r {
            s.fail(&e);
        }
    }
    forks
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
