//! Object-safe model interface: what the engine needs from any causal language model on any
//! backend, so sequences, the CLI and the server are written once for every architecture
//! (shared decoder, Gemma 4, …) and every backend (CPU, CUDA).
//!
//! A [`LanguageModel`] is the immutable, shared part (weights on a backend); a [`ModelState`] is
//! one sequence's mutable part (its state as the model declares it, [`StateLayout`], and
//! scratch buffers) bound to its model. An architecture implements [`CausalLm`]; the
//! [`LanguageModel`] and its sequences ([`Seq`]) come from that, written once here. What only
//! some architectures have (an MTP drafter) is a capability of the interface
//! ([`LanguageModel::load_mtp`]), so the engine, the CLI and the server never ask which
//! architecture they run nor downcast to its types.

use anyhow::{anyhow, bail, Result};
use std::any::Any;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use vela_compute::{Backend, KvType, TopK};

use crate::mtp::MtpHead;
use crate::state::{ExtraSnapshot, ExtraState, StateLayout};
use crate::stepper::StepState;

/// A loaded causal language model (weights on a backend), shared by its sequences.
pub trait LanguageModel: Send + Sync {
    /// Architecture name (`llama`, `gemma3`, `gemma4`, …).
    fn arch(&self) -> &str;
    /// Name of the backend the weights live on (`cpu (avx512, 2 threads)`, `cuda:0 (…)`).
    fn backend_name(&self) -> String;
    fn n_vocab(&self) -> usize;
    /// Context length the model was trained for (0 when unknown).
    fn n_ctx_train(&self) -> usize;
    /// The state one sequence keeps, layer by layer: what it costs and what it can undo.
    fn state_layout(&self) -> StateLayout;
    /// Bytes of weights read per decoded token (for bandwidth reports; 0 when unknown).
    fn weight_bytes_per_token(&self) -> u64;
    /// Bytes of the state a sequence of `n_ctx` tokens evaluated `max_batch` at a time holds.
    fn kv_bytes_estimate(&self, n_ctx: usize, max_batch: usize, kv: KvType) -> u64 {
        self.state_layout().bytes(n_ctx, max_batch, kv)
    }
    /// Free memory of the backend's device, when it has a fixed one (GPUs).
    fn memory_free(&self) -> Option<u64>;
    /// The backend's device probe ([`vela_compute::Backend::device_probe`]).
    fn device_probe(&self) -> Option<Box<dyn vela_compute::DeviceProbe>> {
        None
    }
    /// A fresh sequence state for up to `n_ctx` tokens, evaluated `max_batch` at a time (the state
    /// keeps a handle on the model, hence `Arc<Self>`).
    fn new_state(
        self: Arc<Self>,
        n_ctx: usize,
        max_batch: usize,
        kv: KvType,
    ) -> Result<Box<dyn ModelState>>;
    /// One forward pass over several sequences of this model (each at most once): per item,
    /// what its [`BatchItem::select`] asks of its rows `logits_from..` (the rows, as
    /// [`ModelState::forward`] returns them, their argmax or their top-k). A model that
    /// batches runs the products once over every sequence's rows and selects on the device;
    /// the default evaluates the items one after the other.
    fn forward_batch(&self, items: &mut [BatchItem<'_, dyn ModelState>]) -> Result<Vec<Selected>> {
        items
            .iter_mut()
            .map(|it| {
                let (t, p, lf) = (it.tokens, it.positions, it.logits_from);
                Ok(match it.select {
                    Select::Logits => Selected::Logits(it.state.forward(t, p, lf)?),
                    Select::Argmax => Selected::Argmax(it.state.forward_argmax(t, p, lf)?),
                    Select::TopK(k, need) => {
                        Selected::TopK(it.state.forward_top_k(t, p, lf, k, need)?)
                    }
                })
            })
            .collect()
    }
    /// The model's own drafter (an MTP head or assistant) found next to the model at
    /// `model_path`, for architectures that have one.
    fn discover_mtp(&self, model_path: &Path) -> Option<PathBuf> {
        let _ = model_path;
        None
    }
    /// Load this model's drafter from `path`, checked against the model (width, vocabulary,
    /// geometry). Architectures without one refuse.
    fn load_mtp(&self, path: &Path) -> Result<Box<dyn MtpHead>> {
        let _ = path;
        Err(no_drafter(self.arch(), &self.backend_name()))
    }
    fn as_any(&self) -> &dyn Any;
}

/// The error of `load_mtp` for a model without its own drafter.
fn no_drafter(arch: &str, backend: &str) -> anyhow::Error {
    anyhow!(
        "an MTP drafter drafts for {} targets only (the target is '{arch}' on {backend})",
        crate::registry::mtp_arch_names().join(", ")
    )
}

/// One sequence of a [`LanguageModel`]: its cache and scratch buffers.
pub trait ModelState: Send {
    /// Run `tokens` at `positions` (≤ [`ModelState::max_batch`], all earlier positions already in
    /// the cache), append their K/V, and return the logits of rows `logits_from..`
    /// (row-major `[rows, n_vocab]`).
    fn forward(
        &mut self,
        tokens: &[u32],
        positions: &[u32],
        logits_from: usize,
    ) -> Result<Vec<f32>>;
    /// [`ModelState::forward`] returning the argmax of each logits row instead of the rows
    /// (lowest id on ties, NaN skipped); a GPU backend computes it on the device.
    fn forward_argmax(
        &mut self,
        tokens: &[u32],
        positions: &[u32],
        logits_from: usize,
    ) -> Result<Vec<u32>> {
        let rows = self.forward(tokens, positions, logits_from)?;
        let n = tokens.len() - logits_from;
        if n == 0 {
            return Ok(Vec::new());
        }
        let width = rows.len() / n;
        Ok(rows.chunks_exact(width).map(vela_compute::argmax).collect())
    }
    /// [`ModelState::forward`] returning, for each logits row, its `k` best tokens and statistics
    /// ([`vela_compute::top_k_row`]) and, only where `need_row` says so after seeing them, the
    /// row itself; a GPU backend selects on the device and copies back the row only when asked.
    fn forward_top_k(
        &mut self,
        tokens: &[u32],
        positions: &[u32],
        logits_from: usize,
        k: usize,
        need_row: &dyn Fn(&TopK) -> bool,
    ) -> Result<Vec<(TopK, Option<Vec<f32>>)>> {
        let rows = self.forward(tokens, positions, logits_from)?;
        let n = tokens.len() - logits_from;
        if n == 0 {
            return Ok(Vec::new());
        }
        let width = rows.len() / n;
        Ok((0..n)
            .map(|i| {
                let r = &rows[i * width..(i + 1) * width];
                let t = vela_compute::top_k_row(r, k);
                let row = need_row(&t).then(|| r.to_vec());
                (t, row)
            })
            .collect())
    }
    /// Pipelined greedy decoding: run the one-token step of `token` at `pos` (`None`: the token
    /// the previous step's `argmax_start` produced, still on the device) and start its argmax
    /// without waiting. Returns the ticket for [`ModelState::argmax_finish`], or `None` when
    /// this model or backend cannot (nothing was run: use [`ModelState::forward_argmax`]).
    fn argmax_start(&mut self, token: Option<u32>, pos: u32) -> Result<Option<u64>> {
        let _ = (token, pos);
        Ok(None)
    }
    /// The token of an [`ModelState::argmax_start`] ticket (waits for its step).
    fn argmax_finish(&mut self, ticket: u64) -> Result<u32> {
        Err(anyhow!(
            "argmax ticket {ticket}: this model state does not pipeline"
        ))
    }
    fn n_ctx(&self) -> usize;
    fn max_batch(&self) -> usize;
    /// Save what later writes could overwrite in a cache holding positions `0..n_past`.
    fn checkpoint(&self, n_past: usize) -> Box<dyn Any + Send + Sync>;
    /// Undo every cache write made since `snap` (from [`ModelState::checkpoint`] of this state).
    fn restore(&mut self, snap: &(dyn Any + Send + Sync)) -> Result<()>;
    /// The sequence now holds only positions `0..n_past` (rolled back or reset): free the
    /// storage of the rest where the backend allocates by use ([`Backend::kv_release`]).
    fn release(&mut self, n_past: usize) {
        let _ = n_past;
    }
    /// The sequence goes idle (into the prefix cache): give back its scratch buffers where the
    /// backend allocates by use ([`Backend::scratch_by_use`]); its next forward makes them
    /// again. The cache and everything the sequence holds stay as they are.
    fn park(&mut self) {}
    /// Bytes a checkpoint copied (recurrent states, raw rings); an attention cache's checkpoint
    /// is a position mark and copies nothing.
    fn snapshot_bytes(&self, _snap: &(dyn Any + Send + Sync)) -> usize {
        0
    }
    /// An independent copy (same cache contents).
    fn fork(&self) -> Result<Box<dyn ModelState>>;
    /// Everything this state holds for the sequence `tokens` (its first `tokens.len()`
    /// positions), to be written to disk ([`StateExport`]).
    fn export(&self, tokens: &[u32]) -> Result<StateExport> {
        let _ = tokens;
        bail!("this model's sequence state cannot be saved")
    }
    /// Take back an export of a state of the same model and layout, the sequence `tokens`
    /// (checked before anything is written).
    fn import(&mut self, e: &StateExport, tokens: &[u32]) -> Result<()> {
        let _ = (e, tokens);
        bail!("this model's sequence state cannot be loaded")
    }
    /// Trailing positions that can be dropped without a checkpoint (the tokens after them are
    /// simply forgotten; `usize::MAX`: any number): [`StateLayout::rollback_limit`].
    fn rollback_limit(&self) -> usize {
        usize::MAX
    }
    /// Bytes held by the cache.
    fn kv_bytes(&self) -> usize;
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// One sequence's part of a batched forward ([`LanguageModel::forward_batch`]).
pub struct BatchItem<'a, S: ?Sized> {
    pub state: &'a mut S,
    pub tokens: &'a [u32],
    pub positions: &'a [u32],
    pub logits_from: usize,
    /// What comes back of its logits rows.
    pub select: Select<'a>,
}

/// What a batched item wants of its logits rows: the rows themselves, or only what the
/// sampler needs of them, selected on the device by a GPU (the batch's counterparts of
/// [`ModelState::forward`], [`ModelState::forward_argmax`] and [`ModelState::forward_top_k`]).
#[derive(Clone, Copy)]
pub enum Select<'a> {
    Logits,
    /// Each row's argmax (lowest id on ties, NaN skipped).
    Argmax,
    /// Each row's `k` best tokens and statistics and, where the function asks for it after
    /// seeing them, the row itself.
    TopK(usize, &'a dyn Fn(&TopK) -> bool),
}

/// A batched item's result, by its [`Select`].
#[derive(Clone, Debug, PartialEq)]
pub enum Selected {
    /// Row-major `[rows, n_vocab]`.
    Logits(Vec<f32>),
    Argmax(Vec<u32>),
    TopK(Vec<(TopK, Option<Vec<f32>>)>),
}

impl Selected {
    /// The logits rows ([`Select::Logits`]); an error for the other selections.
    pub fn into_logits(self) -> Result<Vec<f32>> {
        match self {
            Selected::Logits(l) => Ok(l),
            _ => bail!("the batched item asked for a selection, not its logits"),
        }
    }
}

/// What an architecture implements to become a [`LanguageModel`] (through the blanket impl
/// below): its weights on backend `Be`, the state it declares, and its forward pass over a
/// sequence state `State` that holds the backend cache the declaration allocates.
pub trait CausalLm: Send + Sync + 'static {
    type Be: Backend + 'static;
    /// One sequence's cache and scratch buffers.
    type State: StepState<Self::Be> + Send + 'static;
    /// Architecture name (`general.architecture` of its GGUF files).
    fn arch(&self) -> &str;
    fn backend(&self) -> &Arc<Self::Be>;
    fn n_vocab(&self) -> usize;
    /// Context length the model was trained for (0 when unknown).
    fn n_ctx_train(&self) -> usize;
    fn weight_bytes_per_token(&self) -> u64;
    /// The state one sequence keeps, layer by layer.
    fn state_layout(&self) -> StateLayout;
    /// A sequence state around `kv` (allocated from [`StateLayout::kv_specs`] for the same
    /// `n_ctx` and `max_batch`) and `extra` (the recurrent and block storage of the layout,
    /// empty when it has none): the scratch buffers are allocated here.
    fn state_with(
        &self,
        kv: <Self::Be as Backend>::Kv,
        extra: ExtraState<Self::Be>,
        n_ctx: usize,
        max_batch: usize,
    ) -> Result<Self::State>;
    /// A copy of `st` around `kv` and `extra` (copies of its backend storage): by default a
    /// fresh state around them ([`CausalLm::state_with`]); a model that keeps more per sequence
    /// (host-side history) copies that too.
    fn fork_state(
        &self,
        st: &Self::State,
        kv: <Self::Be as Backend>::Kv,
        extra: ExtraState<Self::Be>,
        n_ctx: usize,
        max_batch: usize,
    ) -> Result<Self::State> {
        let _ = st;
        self.state_with(kv, extra, n_ctx, max_batch)
    }
    fn kv(st: &Self::State) -> &<Self::Be as Backend>::Kv;
    fn kv_mut(st: &mut Self::State) -> &mut <Self::Be as Backend>::Kv;
    /// A state whose cache was loaded for the sequence `tokens`: the host-side record of its
    /// tokens, for models that keep one (default: none).
    fn set_history(&self, st: &mut Self::State, tokens: &[u32]) {
        let _ = (st, tokens);
    }
    /// The state's recurrent and block storage (`None`: the model keeps none).
    fn extra(st: &Self::State) -> Option<&ExtraState<Self::Be>> {
        let _ = st;
        None
    }
    fn extra_mut(st: &mut Self::State) -> Option<&mut ExtraState<Self::Be>> {
        let _ = st;
        None
    }
    /// The forward pass through the decode stepper ([`crate::stepper::run`]): the logits of
    /// rows `logits_from..` left in [`StepState::logits`]; returns their number.
    fn run(
        &self,
        st: &mut Self::State,
        tokens: &[u32],
        positions: &[u32],
        logits_from: usize,
    ) -> Result<usize>;
    /// [`ModelState::forward`].
    fn forward(
        &self,
        st: &mut Self::State,
        tokens: &[u32],
        positions: &[u32],
        logits_from: usize,
    ) -> Result<Vec<f32>> {
        let rows = self.run(st, tokens, positions, logits_from)?;
        let mut out = vec![0f32; rows * self.n_vocab()];
        if rows > 0 {
            self.backend().read(st.logits(), &mut out);
        }
        Ok(out)
    }
    /// [`ModelState::forward_argmax`].
    fn forward_argmax(
        &self,
        st: &mut Self::State,
        tokens: &[u32],
        positions: &[u32],
        logits_from: usize,
    ) -> Result<Vec<u32>> {
        let rows = self.run(st, tokens, positions, logits_from)?;
        if rows == 0 {
            return Ok(Vec::new());
        }
        Ok(self
            .backend()
            .argmax_rows(st.logits(), rows, self.n_vocab()))
    }
    /// [`ModelState::forward_top_k`].
    fn forward_top_k(
        &self,
        st: &mut Self::State,
        tokens: &[u32],
        positions: &[u32],
        logits_from: usize,
        k: usize,
        need_row: &dyn Fn(&TopK) -> bool,
    ) -> Result<Vec<(TopK, Option<Vec<f32>>)>> {
        let rows = self.run(st, tokens, positions, logits_from)?;
        let (be, nv) = (&**self.backend(), self.n_vocab());
        Ok(crate::decoder::select_top_k(
            be,
            st.logits(),
            rows,
            nv,
            k,
            need_row,
        ))
    }
    /// [`ModelState::argmax_start`] (default: this model does not pipeline).
    fn argmax_start(
        &self,
        st: &mut Self::State,
        token: Option<u32>,
        pos: u32,
    ) -> Result<Option<u64>> {
        let _ = (st, token, pos);
        Ok(None)
    }
    /// [`ModelState::argmax_finish`].
    fn argmax_finish(&self, ticket: u64) -> Result<u32> {
        Err(anyhow!(
            "argmax ticket {ticket}: this model state does not pipeline"
        ))
    }
    /// [`LanguageModel::forward_batch`] over this model's states (default: one after the other).
    fn forward_batch(&self, items: &mut [BatchItem<'_, Self::State>]) -> Result<Vec<Selected>> {
        items.iter_mut().map(|it| self.forward_one(it)).collect()
    }
    /// One batch item on its own: [`CausalLm::forward`], `forward_argmax` or `forward_top_k`
    /// by its selection.
    fn forward_one(&self, it: &mut BatchItem<'_, Self::State>) -> Result<Selected> {
        let (t, p, lf) = (it.tokens, it.positions, it.logits_from);
        Ok(match it.select {
            Select::Logits => Selected::Logits(self.forward(it.state, t, p, lf)?),
            Select::Argmax => Selected::Argmax(self.forward_argmax(it.state, t, p, lf)?),
            Select::TopK(k, need) => {
                Selected::TopK(self.forward_top_k(it.state, t, p, lf, k, need)?)
            }
        })
    }
    /// [`LanguageModel::discover_mtp`].
    fn discover_mtp(&self, model_path: &Path) -> Option<PathBuf> {
        let _ = model_path;
        None
    }
    /// [`LanguageModel::load_mtp`]; `None`: this architecture has no drafter.
    fn load_mtp(&self, path: &Path) -> Option<Result<Box<dyn MtpHead>>> {
        let _ = path;
        None
    }
}

/// A fresh sequence state of `m` for up to `n_ctx` tokens evaluated `max_batch` at a time.
pub fn new_state<M: CausalLm>(
    m: &M,
    n_ctx: usize,
    max_batch: usize,
    kv: KvType,
) -> Result<M::State> {
    let layout = CausalLm::state_layout(m);
    let be = &**m.backend();
    let cache = crate::state::alloc_kv(be, &layout, n_ctx, max_batch, kv)?;
    let extra = ExtraState::new(be, &layout, n_ctx, max_batch);
    m.state_with(cache, extra, n_ctx, max_batch)
}

impl<M: CausalLm> LanguageModel for M {
    fn arch(&self) -> &str {
        CausalLm::arch(self)
    }
    fn backend_name(&self) -> String {
        self.backend().name()
    }
    fn n_vocab(&self) -> usize {
        CausalLm::n_vocab(self)
    }
    fn n_ctx_train(&self) -> usize {
        CausalLm::n_ctx_train(self)
    }
    fn state_layout(&self) -> StateLayout {
        CausalLm::state_layout(self)
    }
    fn weight_bytes_per_token(&self) -> u64 {
        CausalLm::weight_bytes_per_token(self)
    }
    fn memory_free(&self) -> Option<u64> {
        self.backend().memory_free()
    }
    fn device_probe(&self) -> Option<Box<dyn vela_compute::DeviceProbe>> {
        self.backend().device_probe()
    }
    fn new_state(
        self: Arc<Self>,
        n_ctx: usize,
        max_batch: usize,
        kv: KvType,
    ) -> Result<Box<dyn ModelState>> {
        let state = new_state(&*self, n_ctx, max_batch, kv)?;
        let rollback_limit = CausalLm::state_layout(&*self).rollback_limit(max_batch);
        Ok(Box::new(Seq {
            model: self,
            state,
            n_ctx,
            max_batch,
            rollback_limit,
            kv_type: kv,
            parked: false,
        }))
    }
    fn forward_batch(&self, items: &mut [BatchItem<'_, dyn ModelState>]) -> Result<Vec<Selected>> {
        let mut typed = Vec::with_capacity(items.len());
        for it in items.iter_mut() {
            let seq = it
                .state
                .as_any_mut()
                .downcast_mut::<Seq<M>>()
                .filter(|s| std::ptr::eq(&*s.model, self))
                .ok_or_else(|| anyhow!("a batched sequence belongs to another model"))?;
            seq.begin(it.positions)?;
            typed.push(BatchItem {
                state: &mut seq.state,
                tokens: it.tokens,
                positions: it.positions,
                logits_from: it.logits_from,
                select: it.select,
            });
        }
        CausalLm::forward_batch(self, &mut typed)
    }
    fn discover_mtp(&self, model_path: &Path) -> Option<PathBuf> {
        CausalLm::discover_mtp(self, model_path)
    }
    fn load_mtp(&self, path: &Path) -> Result<Box<dyn MtpHead>> {
        match CausalLm::load_mtp(self, path) {
            Some(r) => r,
            None => Err(no_drafter(CausalLm::arch(self), &self.backend().name())),
        }
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// One sequence of a [`CausalLm`] model: the model and the sequence's state.
pub struct Seq<M: CausalLm> {
    pub model: Arc<M>,
    pub state: M::State,
    n_ctx: usize,
    max_batch: usize,
    rollback_limit: usize,
    kv_type: KvType,
    /// The state's scratch buffers are made for no rows ([`ModelState::park`]).
    parked: bool,
}

/// A sequence of the shared decoder.
pub type DecoderSeq<B> = Seq<crate::decoder::DecoderModel<B>>;
/// A sequence of a Gemma 4 model.
pub type Gemma4Seq<B> = Seq<crate::gemma4::Gemma4Model<B>>;

/// A sequence state's contents: the backend cache's rows and the extra storage.
#[derive(Clone, Debug, PartialEq)]
pub struct StateExport {
    pub kv: vela_compute::KvExport,
    pub extra: Option<crate::state::ExtraExport>,
}

impl StateExport {
    /// Bytes of values.
    pub fn bytes(&self) -> usize {
        self.kv.bytes() + self.extra.as_ref().map_or(0, |e| e.bytes())
    }
}

/// A checkpoint of a [`Seq`]: the backend cache's and the extra storage's.
struct SeqSnapshot<S> {
    kv: S,
    extra: Option<ExtraSnapshot>,
}

type Snapshot<M> = SeqSnapshot<<<M as CausalLm>::Be as Backend>::KvSnapshot>;

impl<M: CausalLm> Seq<M> {
    /// Before a forward at `positions`: K/V storage for every position up to the last one (a
    /// paged cache grows here, and an allocation failure is an error before anything is
    /// written); recurrent states restart from zeros when a forward starts at position 0.
    fn begin(&mut self, positions: &[u32]) -> Result<()> {
        if self.parked {
            self.rescratch(self.max_batch)?;
            self.parked = false;
        }
        let end = positions.iter().max().map_or(0, |&p| p as usize + 1);
        let be = &**self.model.backend();
        be.kv_reserve(M::kv_mut(&mut self.state), end)?;
        if let (Some(e), Some(&p)) = (M::extra_mut(&mut self.state), positions.first()) {
            e.begin(be, p as usize);
        }
        Ok(())
    }

    /// Remake the state's scratch buffers for `max_batch` rows (0: none), keeping its cache,
    /// extra storage and host-side record: a state around empty storage is made first (the
    /// fallible part), then the storage moves over.
    fn rescratch(&mut self, max_batch: usize) -> Result<()> {
        let be = &**self.model.backend();
        let kv = be.new_kv(&[], self.kv_type)?;
        let extra = ExtraState::new(be, &StateLayout::default(), self.n_ctx, 0);
        let mut fresh = self
            .model
            .fork_state(&self.state, kv, extra, self.n_ctx, max_batch)?;
        std::mem::swap(M::kv_mut(&mut fresh), M::kv_mut(&mut self.state));
        if let (Some(a), Some(b)) = (M::extra_mut(&mut fresh), M::extra_mut(&mut self.state)) {
            std::mem::swap(a, b);
        }
        self.state = fresh;
        Ok(())
    }
}

impl<M: CausalLm> ModelState for Seq<M> {
    fn forward(&mut self, tokens: &[u32], pos: &[u32], logits_from: usize) -> Result<Vec<f32>> {
        self.begin(pos)?;
        self.model
            .forward(&mut self.state, tokens, pos, logits_from)
    }
    fn forward_argmax(
        &mut self,
        tokens: &[u32],
        pos: &[u32],
        logits_from: usize,
    ) -> Result<Vec<u32>> {
        self.begin(pos)?;
        self.model
            .forward_argmax(&mut self.state, tokens, pos, logits_from)
    }
    fn forward_top_k(
        &mut self,
        tokens: &[u32],
        pos: &[u32],
        logits_from: usize,
        k: usize,
        need_row: &dyn Fn(&TopK) -> bool,
    ) -> Result<Vec<(TopK, Option<Vec<f32>>)>> {
        self.begin(pos)?;
        self.model
            .forward_top_k(&mut self.state, tokens, pos, logits_from, k, need_row)
    }
    fn argmax_start(&mut self, token: Option<u32>, pos: u32) -> Result<Option<u64>> {
        self.begin(&[pos])?;
        CausalLm::argmax_start(&*self.model, &mut self.state, token, pos)
    }
    fn argmax_finish(&mut self, ticket: u64) -> Result<u32> {
        CausalLm::argmax_finish(&*self.model, ticket)
    }
    fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    fn max_batch(&self) -> usize {
        self.max_batch
    }
    fn checkpoint(&self, n_past: usize) -> Box<dyn Any + Send + Sync> {
        let be = &**self.model.backend();
        Box::new(SeqSnapshot {
            kv: be.kv_checkpoint(M::kv(&self.state), n_past),
            extra: M::extra(&self.state).map(|e| e.checkpoint(be, n_past)),
        })
    }
    fn restore(&mut self, snap: &(dyn Any + Send + Sync)) -> Result<()> {
        let s = snap
            .downcast_ref::<Snapshot<M>>()
            .ok_or_else(|| anyhow!("checkpoint belongs to a different model or backend"))?;
        let be = &**self.model.backend();
        match (M::extra_mut(&mut self.state), &s.extra) {
            (Some(e), Some(x)) => e.restore(be, x)?,
            (None, None) => {}
            _ => bail!("checkpoint belongs to a different model or backend"),
        }
        be.kv_restore(M::kv_mut(&mut self.state), &s.kv);
        Ok(())
    }
    fn release(&mut self, n_past: usize) {
        self.model
            .backend()
            .kv_release(M::kv_mut(&mut self.state), n_past);
    }
    fn park(&mut self) {
        // Failing to make the small state is harmless: the sequence keeps its buffers.
        if !self.parked && self.model.backend().scratch_by_use() && self.rescratch(0).is_ok() {
            self.parked = true;
        }
    }
    fn snapshot_bytes(&self, snap: &(dyn Any + Send + Sync)) -> usize {
        snap.downcast_ref::<Snapshot<M>>()
            .and_then(|s| s.extra.as_ref())
            .map_or(0, ExtraSnapshot::bytes)
    }
    fn fork(&self) -> Result<Box<dyn ModelState>> {
        let be = &**self.model.backend();
        let kv = be.kv_clone(M::kv(&self.state))?;
        let extra = match M::extra(&self.state) {
            Some(e) => e.fork(be),
            None => ExtraState::new(be, &StateLayout::default(), self.n_ctx, self.max_batch),
        };
        Ok(Box::new(Seq {
            model: self.model.clone(),
            state: self
                .model
                .fork_state(&self.state, kv, extra, self.n_ctx, self.max_batch)?,
            n_ctx: self.n_ctx,
            max_batch: self.max_batch,
            rollback_limit: self.rollback_limit,
            kv_type: self.kv_type,
            parked: false,
        }))
    }
    fn export(&self, tokens: &[u32]) -> Result<StateExport> {
        let be = &**self.model.backend();
        let n = tokens.len();
        Ok(StateExport {
            kv: be.kv_export(M::kv(&self.state), n),
            extra: M::extra(&self.state).map(|e| e.export(be, n)),
        })
    }
    fn import(&mut self, e: &StateExport, tokens: &[u32]) -> Result<()> {
        let n = tokens.len();
        if e.kv.n_past != n || e.extra.as_ref().is_some_and(|x| x.n_past != n) {
            bail!("the saved state holds another number of positions");
        }
        if n > self.n_ctx {
            bail!("{n} positions do not fit a context of {}", self.n_ctx);
        }
        let be = &**self.model.backend();
        match (M::extra_mut(&mut self.state), &e.extra) {
            (Some(x), Some(v)) => x.import(be, v)?,
            (None, None) => {}
            (Some(x), None) if x.is_empty() => {}
            _ => bail!("the saved state has another layout"),
        }
        be.kv_import(M::kv_mut(&mut self.state), &e.kv)?;
        self.model.set_history(&mut self.state, tokens);
        Ok(())
    }
    fn rollback_limit(&self) -> usize {
        self.rollback_limit
    }
    fn kv_bytes(&self) -> usize {
        self.model.backend().kv_bytes(M::kv(&self.state))
            + M::extra(&self.state).map_or(0, |e| e.bytes())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
