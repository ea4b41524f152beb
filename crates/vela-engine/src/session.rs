//! A sequence being evaluated: its KV cache, the tokens in it, chunked prefill and
//! checkpoint/restore (the prefix cache and speculative decoding build on these).

use anyhow::{anyhow, bail, Result};
use std::any::Any;
use std::sync::Arc;
use vela_compute::{KvType, TopK};
use vela_models::{BatchItem, LanguageModel, ModelState, Select, Selected};

/// Options of a new session.
#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// Context size in tokens (0 = the model's training context, capped at 8192).
    pub n_ctx: usize,
    /// Prefill chunk size (tokens per forward pass).
    pub ubatch: usize,
    pub kv_type: KvType,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            n_ctx: 0,
            ubatch: 512,
            kv_type: KvType::F16,
        }
    }
}

/// What [`Session::eval_with`] reports after each chunk; returning `false` cancels.
pub type Progress<'a> = &'a mut dyn FnMut(usize, usize) -> bool;

/// The token of a step whose input is still being computed ([`Session::argmax_start`]).
const PLACEHOLDER: u32 = vela_compute::DEVICE_TOKEN;

/// The input of [`Session::argmax_start`].
pub enum StepInput<'a> {
    /// A token known on the host.
    Token(u32),
    /// The result of this step, started right before and not finished yet.
    After(&'a mut PendingArgmax),
}

/// A greedy step started by [`Session::argmax_start`]: finish it with
/// [`Session::argmax_finish`] or drop it with [`Session::argmax_discard`].
#[derive(Debug)]
pub struct PendingArgmax {
    /// Position of its input token.
    pos: usize,
    result: StepResult,
}

#[derive(Clone, Copy, Debug)]
enum StepResult {
    /// Computed already (a backend that does not pipeline).
    Ready(u32),
    /// On the way back from the device.
    Ticket(u64),
}

/// A saved point of a session that can be restored after more tokens were evaluated.
pub struct Checkpoint {
    n_past: usize,
    snapshot: Box<dyn Any + Send + Sync>,
    bytes: usize,
}

impl Checkpoint {
    pub fn n_past(&self) -> usize {
        self.n_past
    }
    /// Bytes the checkpoint copied ([`ModelState::snapshot_bytes`]).
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// One sequence of any [`LanguageModel`] on any backend.
pub struct Session {
    pub model: Arc<dyn LanguageModel>,
    state: Box<dyn ModelState>,
    tokens: Vec<u32>,
}

/// The outcome of evaluating a run of tokens.
#[derive(Debug)]
pub enum EvalOutcome {
    /// All tokens were evaluated; logits of the last position.
    Done(Vec<f32>),
    /// Cancelled by the progress callback after `n_done` tokens (the cache holds them, consistently).
    Cancelled { n_done: usize },
}

/// Prompt tokens of [`Session::warm_up`] at most.
pub const WARM_UP_TOKENS: usize = 80;

impl Session {
    /// Context size used when [`SessionOptions::n_ctx`] is 0: the training context capped at
    /// 8192 (8192 when the model does not say).
    pub fn default_n_ctx(model: &dyn LanguageModel) -> usize {
        match model.n_ctx_train() {
            0 => 8192,
            n => n.min(8192),
        }
    }

    /// A clear error when the KV cache of `n_ctx` tokens cannot fit the device's free memory
    /// (checked before anything is allocated; `vela serve` checks it once at start).
    pub fn check_memory(
        model: &dyn LanguageModel,
        n_ctx: usize,
        ubatch: usize,
        kv_type: KvType,
    ) -> Result<()> {
        if let Some(free) = model.memory_free() {
            let need = model.kv_bytes_estimate(n_ctx, ubatch.clamp(1, n_ctx.max(1)), kv_type);
            // Scratch buffers and the allocator's granularity need some room beyond the cache.
            if need + (64 << 20) > free {
                bail!(
                    "the KV cache for a context of {n_ctx} tokens needs {:.2} GiB but the device \
                     has {:.2} GiB free: use a smaller --ctx (or --kv-type f16)",
                    need as f64 / (1u64 << 30) as f64,
                    free as f64 / (1u64 << 30) as f64
                );
            }
        }
        Ok(())
    }

    pub fn new(model: Arc<dyn LanguageModel>, opts: &SessionOptions) -> Result<Self> {
        let n_ctx = if opts.n_ctx == 0 {
            Self::default_n_ctx(&*model)
        } else {
            opts.n_ctx
        };
        let ubatch = opts.ubatch.clamp(1, n_ctx);
        Self::check_memory(&*model, n_ctx, ubatch, opts.kv_type)?;
        let state = model.clone().new_state(n_ctx, ubatch, opts.kv_type)?;
        Ok(Session {
            model,
            state,
            tokens: Vec::new(),
        })
    }

    /// Run once what a first request runs, on a throwaway sequence: a prompt of up to
    /// [`WARM_UP_TOKENS`] tokens (past the CUDA backend's several-token products, so its large
    /// batch path and cuBLAS are initialised) and two decode steps. Reads mapped weights in.
    pub fn warm_up(model: Arc<dyn LanguageModel>, opts: &SessionOptions) -> Result<()> {
        let n = opts.ubatch.clamp(1, WARM_UP_TOKENS);
        let n_vocab = model.n_vocab().max(1) as u64;
        let tokens: Vec<u32> = (0..n as u64)
            .map(|i| ((1 + 31 * i) % n_vocab) as u32)
            .collect();
        let mut s = Session::new(
            model,
            &SessionOptions {
                n_ctx: n + 2,
                ubatch: opts.ubatch,
                kv_type: opts.kv_type,
            },
        )?;
        let mut next = s.eval_argmax(&tokens)?;
        for _ in 0..2 {
            next = s.eval_argmax(&[next])?;
        }
        Ok(())
    }

    pub fn n_ctx(&self) -> usize {
        self.state.n_ctx()
    }

    pub fn n_past(&self) -> usize {
        self.tokens.len()
    }

    /// The tokens whose K/V are in the cache.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn ubatch(&self) -> usize {
        self.state.max_batch()
    }

    /// Evaluate `tokens` after the current ones; returns the last position's logits.
    pub fn eval(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        match self.eval_with(tokens, &mut |_, _| true)? {
            EvalOutcome::Done(l) => Ok(l),
            EvalOutcome::Cancelled { .. } => unreachable!("never cancelled"),
        }
    }

    /// Evaluate `tokens` in chunks of `ubatch`, calling `progress(done, total)` after each chunk.
    pub fn eval_with(&mut self, tokens: &[u32], progress: Progress) -> Result<EvalOutcome> {
        if tokens.is_empty() {
            bail!("nothing to evaluate");
        }
        self.check_room(tokens.len())?;
        let mut done = 0;
        let mut last = Vec::new();
        for chunk in tokens.chunks(self.state.max_batch()) {
            let start = self.tokens.len() as u32;
            let pos: Vec<u32> = (start..start + chunk.len() as u32).collect();
            last = self.state.forward(chunk, &pos, chunk.len() - 1)?;
            self.tokens.extend_from_slice(chunk);
            done += chunk.len();
            if done < tokens.len() && !progress(done, tokens.len()) {
                return Ok(EvalOutcome::Cancelled { n_done: done });
            }
        }
        progress(done, tokens.len());
        Ok(EvalOutcome::Done(last))
    }

    /// For [`Session::eval_argmax`] and [`Session::eval_top_k`]: check the room, evaluate every
    /// whole batch of `tokens` before the last one (which holds the last token) and return that
    /// last batch with its positions; the caller runs it and appends it to `self.tokens`.
    fn eval_all_but_last_batch<'t>(&mut self, tokens: &'t [u32]) -> Result<(&'t [u32], Vec<u32>)> {
        if tokens.is_empty() {
            bail!("nothing to evaluate");
        }
        self.check_room(tokens.len())?;
        let mb = self.state.max_batch();
        let split = (tokens.len() - 1) / mb * mb;
        if split > 0 {
            self.eval(&tokens[..split])?;
        }
        let last = &tokens[split..];
        let start = self.tokens.len() as u32;
        Ok((last, (start..start + last.len() as u32).collect()))
    }

    /// Evaluate `tokens` like [`Session::eval`] and return only the argmax of the last position's
    /// logits (lowest id on ties): a GPU backend copies back one id instead of the vocabulary.
    pub fn eval_argmax(&mut self, tokens: &[u32]) -> Result<u32> {
        let (last, pos) = self.eval_all_but_last_batch(tokens)?;
        let ids = self.state.forward_argmax(last, &pos, last.len() - 1)?;
        self.tokens.extend_from_slice(last);
        ids.last()
            .copied()
            .ok_or_else(|| anyhow::anyhow!("no logits row returned"))
    }

    /// Evaluate `tokens` like [`Session::eval`] and return the `k` best tokens of the last
    /// position's logits with the row's statistics ([`vela_compute::top_k_row`]), plus the logits
    /// row itself only when `need_row` asks for it after seeing them: a GPU backend selects on
    /// the device and otherwise copies back `k` pairs instead of the vocabulary.
    pub fn eval_top_k(
        &mut self,
        tokens: &[u32],
        k: usize,
        need_row: &dyn Fn(&TopK) -> bool,
    ) -> Result<(TopK, Option<Vec<f32>>)> {
        let (last, pos) = self.eval_all_but_last_batch(tokens)?;
        let rows = self
            .state
            .forward_top_k(last, &pos, last.len() - 1, k, need_row)?;
        self.tokens.extend_from_slice(last);
        rows.into_iter()
            .last()
            .ok_or_else(|| anyhow::anyhow!("no logits row returned"))
    }

    /// Evaluate a run of tokens on each of several sessions of one model in one batched forward
    /// ([`vela_models::LanguageModel::forward_batch`]: the products run once over every
    /// session's rows): `inputs[i]` (1..=ubatch tokens) follows the tokens of `sessions[i]`.
    /// Returns each session's last-position logits. Prefill chunks and decode tokens mix freely.
    pub fn eval_batch(sessions: &mut [&mut Session], inputs: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        let selects = vec![Select::Logits; inputs.len()];
        Self::eval_batch_select(sessions, inputs, &selects)?
            .into_iter()
            .map(Selected::into_logits)
            .collect()
    }

    /// [`Self::eval_batch`] returning, per session, what `selects[i]` asks of its
    /// last-position logits (the row, its argmax, or its top-k: selected on the device by a
    /// GPU, so that only what the sampler needs is copied back).
    pub fn eval_batch_select(
        sessions: &mut [&mut Session],
        inputs: &[&[u32]],
        selects: &[Select<'_>],
    ) -> Result<Vec<Selected>> {
        if sessions.len() != inputs.len() || selects.len() != inputs.len() {
            bail!(
                "eval_batch: {} sessions, {} inputs and {} selections",
                sessions.len(),
                inputs.len(),
                selects.len()
            );
        }
        let Some(first) = sessions.first() else {
            return Ok(Vec::new());
        };
        let model = first.model.clone();
        for (s, t) in sessions.iter().zip(inputs) {
            if !Arc::ptr_eq(&s.model, &model) {
                bail!("eval_batch: the sessions belong to different models");
            }
            if t.is_empty() || t.len() > s.ubatch() {
                bail!(
                    "eval_batch takes 1..={} tokens per session, not {}",
                    s.ubatch(),
                    t.len()
                );
            }
            s.check_room(t.len())?;
        }
        let positions: Vec<Vec<u32>> = sessions
            .iter()
            .zip(inputs)
            .map(|(s, t)| {
                let p = s.tokens.len() as u32;
                (p..p + t.len() as u32).collect()
            })
            .collect();
        let mut items: Vec<BatchItem<'_, dyn ModelState>> = sessions
            .iter_mut()
            .zip(inputs)
            .zip(&positions)
            .zip(selects)
            .map(|(((s, t), p), &select)| BatchItem {
                state: &mut *s.state,
                tokens: t,
                positions: p,
                logits_from: t.len() - 1,
                select,
            })
            .collect();
        let out = model.forward_batch(&mut items)?;
        drop(items);
        for (s, t) in sessions.iter_mut().zip(inputs) {
            s.tokens.extend_from_slice(t);
        }
        Ok(out)
    }

    /// Evaluate `tokens` (at most `ubatch`) and return the logits of every one of them
    /// (`[tokens.len(), n_vocab]`), as speculative verification needs.
    pub fn eval_all_logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        if tokens.is_empty() || tokens.len() > self.state.max_batch() {
            bail!(
                "eval_all_logits takes 1..={} tokens",
                self.state.max_batch()
            );
        }
        self.check_room(tokens.len())?;
        let start = self.tokens.len() as u32;
        let pos: Vec<u32> = (start..start + tokens.len() as u32).collect();
        let out = self.state.forward(tokens, &pos, 0)?;
        self.tokens.extend_from_slice(tokens);
        Ok(out)
    }

    /// Hold exactly `tokens`: keep the common prefix (dropping the rest, or starting over when
    /// the state cannot drop that much without a checkpoint) and evaluate what follows it.
    pub fn follow(&mut self, tokens: &[u32]) -> Result<()> {
        let common = self
            .tokens
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count();
        if common < self.tokens.len() && self.truncate(common).is_err() {
            self.reset();
        }
        let have = self.n_past();
        if have < tokens.len() {
            self.eval(&tokens[have..])?;
        }
        Ok(())
    }

    /// [`Session::eval_all_logits`] returning each row's argmax instead of the rows (lowest id on
    /// ties): a GPU copies back one id per row, not the vocabulary.
    pub fn eval_all_argmax(&mut self, tokens: &[u32]) -> Result<Vec<u32>> {
        if tokens.is_empty() || tokens.len() > self.state.max_batch() {
            bail!(
                "eval_all_argmax takes 1..={} tokens",
                self.state.max_batch()
            );
        }
        self.check_room(tokens.len())?;
        let start = self.tokens.len() as u32;
        let pos: Vec<u32> = (start..start + tokens.len() as u32).collect();
        let out = self.state.forward_argmax(tokens, &pos, 0)?;
        self.tokens.extend_from_slice(tokens);
        Ok(out)
    }

    /// Pipelined greedy decoding: evaluate one more token and start its argmax without waiting
    /// for it. `input` is the token, or the unfinished step whose result it is: a GPU backend
    /// then runs this step on the id its previous step left on the device, so the host records
    /// and launches this step while the GPU still runs the previous one. On a backend that cannot,
    /// the step runs plainly here (the result is ready). Pass the result to
    /// [`Session::argmax_finish`] (or drop the step with [`Session::argmax_discard`]); until the
    /// input's step is finished the session holds a placeholder for its token.
    pub fn argmax_start(&mut self, input: StepInput) -> Result<PendingArgmax> {
        self.check_room(1)?;
        let pos = self.tokens.len();
        let mut prev = match input {
            StepInput::Token(t) => Err(t),
            StepInput::After(prev) => Ok(prev),
        };
        let mut token = match &prev {
            Err(t) => Some(*t),
            Ok(prev) => {
                if prev.pos + 1 != pos {
                    bail!(
                        "argmax_start: the step before is at {}, not {}",
                        prev.pos,
                        pos - 1
                    );
                }
                match prev.result {
                    StepResult::Ready(t) => Some(t),
                    StepResult::Ticket(_) => None,
                }
            }
        };
        let mut started = self.state.argmax_start(token, pos as u32);
        if let (Ok(None), None, Ok(prev)) = (&started, token, &mut prev) {
            // The backend cannot chain here: wait for the previous token, then start normally.
            let t = self.finish_result(prev.result)?;
            prev.result = StepResult::Ready(t);
            token = Some(t);
            started = self.state.argmax_start(token, pos as u32);
        }
        let result = match started? {
            Some(ticket) => StepResult::Ticket(ticket),
            None => {
                let t = token.expect("a plain step has its token");
                let ids = self.state.forward_argmax(&[t], &[pos as u32], 0)?;
                StepResult::Ready(
                    ids.last()
                        .copied()
                        .ok_or_else(|| anyhow!("no logits row"))?,
                )
            }
        };
        self.tokens.push(token.unwrap_or(PLACEHOLDER));
        Ok(PendingArgmax { pos, result })
    }

    /// The token of a step started by [`Session::argmax_start`] (waits for it). The step after
    /// it, if started, gets it as its input token.
    pub fn argmax_finish(&mut self, step: PendingArgmax) -> Result<u32> {
        let t = match self.finish_result(step.result) {
            Ok(t) => t,
            Err(e) => {
                // The step did not complete: drop its input and every step after it.
                self.tokens.truncate(step.pos.min(self.tokens.len()));
                return Err(e);
            }
        };
        if let Some(x) = self.tokens.get_mut(step.pos + 1) {
            if *x == PLACEHOLDER {
                *x = t;
            }
        }
        Ok(t)
    }

    /// Drop the last started step (its input token leaves the session; whatever it wrote into
    /// the cache is beyond the session's tokens, as after [`Session::truncate`] by one).
    pub fn argmax_discard(&mut self, step: PendingArgmax) {
        if step.pos < self.tokens.len() {
            self.tokens.truncate(step.pos);
        }
    }

    fn finish_result(&mut self, r: StepResult) -> Result<u32> {
        match r {
            StepResult::Ready(t) => Ok(t),
            StepResult::Ticket(ticket) => self.state.argmax_finish(ticket),
        }
    }

    fn check_room(&self, n: usize) -> Result<()> {
        if self.tokens.last() == Some(&PLACEHOLDER) {
            bail!("a pipelined decode step's token is not known yet (argmax_finish first)");
        }
        if self.tokens.len() + n > self.state.n_ctx() {
            bail!(
                "context overflow: {} tokens in the cache + {n} new > context size {}",
                self.tokens.len(),
                self.state.n_ctx()
            );
        }
        Ok(())
    }

    /// Save the current state.
    pub fn checkpoint(&self) -> Checkpoint {
        let snapshot = self.state.checkpoint(self.tokens.len());
        Checkpoint {
            n_past: self.tokens.len(),
            bytes: self.state.snapshot_bytes(&*snapshot),
            snapshot,
        }
    }

    /// Return to a checkpoint taken earlier on this session (and not invalidated by an earlier
    /// restore to a point before it).
    pub fn restore(&mut self, cp: &Checkpoint) -> Result<()> {
        if cp.n_past > self.tokens.len() {
            bail!(
                "checkpoint at {} is ahead of the session ({} tokens)",
                cp.n_past,
                self.tokens.len()
            );
        }
        self.state.restore(&*cp.snapshot)?;
        self.tokens.truncate(cp.n_past);
        self.state.release(cp.n_past);
        Ok(())
    }

    /// Drop tokens after `n` without a checkpoint, within the state's rollback limit
    /// ([`ModelState::rollback_limit`]: any number for full-attention caches, `ubatch` with
    /// sliding-window layers, whose ring keeps that much slack beyond the window); beyond it,
    /// use [`Session::checkpoint`].
    pub fn truncate(&mut self, n: usize) -> Result<()> {
        if self.tokens[..n.min(self.tokens.len())].contains(&PLACEHOLDER) {
            bail!("a pipelined decode step's token is not known yet (argmax_finish first)");
        }
        if n >= self.tokens.len() {
            return Ok(());
        }
        if !self.can_truncate(n) {
            bail!(
                "cannot drop {} tokens from this model's state without a checkpoint (max {})",
                self.tokens.len() - n,
                self.state.rollback_limit()
            );
        }
        self.tokens.truncate(n);
        self.state.release(n);
        Ok(())
    }

    /// Trailing tokens [`Session::truncate`] can drop without a checkpoint
    /// ([`ModelState::rollback_limit`]; `usize::MAX`: any number).
    pub fn rollback_limit(&self) -> usize {
        self.state.rollback_limit()
    }

    /// Whether [`Session::truncate`] to `n` tokens is possible (without a checkpoint).
    pub fn can_truncate(&self, n: usize) -> bool {
        n >= self.tokens.len() || self.tokens.len() - n <= self.state.rollback_limit()
    }

    /// Clear the sequence.
    pub fn reset(&mut self) {
        self.tokens.clear();
        self.state.release(0);
    }

    /// An independent copy of this session (same tokens, copied cache).
    pub fn fork(&self) -> Result<Self> {
        if self.tokens.contains(&PLACEHOLDER) {
            bail!("a pipelined decode step's token is not known yet (argmax_finish first)");
        }
        Ok(Session {
            model: self.model.clone(),
            state: self.state.fork()?,
            tokens: self.tokens.clone(),
        })
    }

    /// Everything the state holds for the tokens so far, to be written to disk
    /// ([`crate::persist`]).
    pub fn export(&self) -> Result<vela_models::StateExport> {
        if self.tokens.contains(&PLACEHOLDER) {
            bail!("a pipelined decode step's token is not known yet (argmax_finish first)");
        }
        self.state.export(&self.tokens)
    }

    /// Take back a saved state of the sequence `tokens` (same model and layout; any context
    /// that holds it). On an error the session is reset (empty), never half loaded.
    pub fn import(&mut self, tokens: &[u32], e: &vela_models::StateExport) -> Result<()> {
        self.tokens.clear();
        if tokens.len() >= self.state.n_ctx() {
            bail!(
                "{} saved tokens do not fit a context of {}",
                tokens.len(),
                self.state.n_ctx()
            );
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= self.model.n_vocab()) {
            bail!("saved token {t} is outside the vocabulary");
        }
        self.state.import(e, tokens)?;
        self.tokens = tokens.to_vec();
        Ok(())
    }

    /// The model's state of this sequence (e.g. for the model's own drafter, which reads it).
    pub fn state(&self) -> &dyn ModelState {
        &*self.state
    }

    /// Mutable access to the model-specific state. Evaluating tokens through it directly
    /// bypasses the session's token list: callers must keep the two consistent.
    pub fn state_mut(&mut self) -> &mut dyn ModelState {
        &mut *self.state
    }

    /// Bytes held by the KV cache.
    pub fn kv_bytes(&self) -> usize {
        self.state.kv_bytes()
    }

    /// The session goes idle: its scratch buffers are given back until its next evaluation
    /// ([`ModelState::park`]).
    pub fn park(&mut self) {
        self.state.park();
    }
}

#[cfg(test)]
mod memory_tests {
    use super::*;

    /// A model on a device with `free` bytes whose cache needs `need` bytes.
    struct Tiny {
        free: u64,
        need: u64,
    }

    impl LanguageModel for Tiny {
        fn arch(&self) -> &str {
            "tiny"
        }
        fn backend_name(&self) -> String {
            "test".into()
        }
        fn n_vocab(&self) -> usize {
            4
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
            self.need
        }
        fn memory_free(&self) -> Option<u64> {
            Some(self.free)
        }
        fn new_state(
            self: Arc<Self>,
            _: usize,
            _: usize,
            _: KvType,
        ) -> Result<Box<dyn ModelState>> {
            bail!("allocated")
        }
        fn as_any(&self) -> &dyn Any {
            self
        }
    }

    #[test]
    fn kv_cache_too_big_for_the_device_is_refused_before_allocating() {
        let opts = SessionOptions {
            n_ctx: 1000,
            ..Default::default()
        };
        let big = Arc::new(Tiny {
            free: 1 << 30,
            need: 2 << 30,
        });
        let e = Session::new(big, &opts).err().unwrap().to_string();
        assert!(e.contains("needs 2.00 GiB") && e.contains("--ctx"), "{e}");
        let fits = Arc::new(Tiny {
            free: 4 << 30,
            need: 1 << 30,
        });
        let e = Session::new(fits, &opts).err().unwrap().to_string();
        assert_eq!(e, "allocated");
    }
}
