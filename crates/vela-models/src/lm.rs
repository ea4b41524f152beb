//! Object-safe model interface: what the engine needs from any causal language model on any
//! backend, so sequences, the CLI and the server are written once for every architecture
//! (shared decoder, Gemma 4, …) and every backend (CPU, CUDA).
//!
//! A [`LanguageModel`] is the immutable, shared part (weights on a backend); a [`ModelState`] is
//! one sequence's mutable part (KV cache, scratch buffers) bound to its model. Architecture- or
//! backend-specific users (e.g. a drafter that reads the target's hidden states) downcast through
//! [`ModelState::as_any_mut`] to the concrete type ([`DecoderSeq`], [`Gemma4Seq`]).

use anyhow::{anyhow, Result};
use std::any::Any;
use std::sync::Arc;
use vela_compute::{Backend, KvType, TopK};

use crate::decoder::{DecoderModel, ForwardState};
use crate::gemma4::{Gemma4Model, Gemma4State, LayerKind};

/// A loaded causal language model (weights on a backend), shared by its sequences.
pub trait LanguageModel: Send + Sync {
    /// Architecture name (`llama`, `gemma3`, `gemma4`, …).
    fn arch(&self) -> &str;
    /// Name of the backend the weights live on (`cpu (avx512, 2 threads)`, `cuda:0 (…)`).
    fn backend_name(&self) -> String;
    fn n_vocab(&self) -> usize;
    /// Context length the model was trained for (0 when unknown).
    fn n_ctx_train(&self) -> usize;
    /// Whether some layer keeps only a sliding window of keys (its cache is a ring).
    fn has_sliding_window(&self) -> bool;
    /// Bytes of weights read per decoded token (for bandwidth reports; 0 when unknown).
    fn weight_bytes_per_token(&self) -> u64;
    /// Bytes of the KV cache a state for `n_ctx` tokens and `max_batch`-token forwards holds.
    fn kv_bytes_estimate(&self, n_ctx: usize, max_batch: usize, kv: KvType) -> u64;
    /// Free memory of the backend's device, when it has a fixed one (GPUs).
    fn memory_free(&self) -> Option<u64>;
    /// A fresh sequence state for up to `n_ctx` tokens, evaluated `max_batch` at a time (the state
    /// keeps a handle on the model, hence `Arc<Self>`).
    fn new_state(
        self: Arc<Self>,
        n_ctx: usize,
        max_batch: usize,
        kv: KvType,
    ) -> Result<Box<dyn ModelState>>;
    fn as_any(&self) -> &dyn Any;
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
    /// An independent copy (same cache contents).
    fn fork(&self) -> Result<Box<dyn ModelState>>;
    /// Bytes held by the cache.
    fn kv_bytes(&self) -> usize;
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// Cache bytes of a layout (K and V elements of every slot of every layer).
fn layout_bytes(layers: &[vela_compute::KvLayerSpec], kv: KvType) -> u64 {
    let elem = kv.bytes();
    layers
        .iter()
        .map(|l| (l.capacity * l.n_head_kv * (l.head_dim_k + l.head_dim_v) * elem) as u64)
        .sum()
}

fn restore_kv<B: Backend + 'static>(
    be: &B,
    kv: &mut B::Kv,
    snap: &(dyn Any + Send + Sync),
) -> Result<()> {
    let s = snap
        .downcast_ref::<B::KvSnapshot>()
        .ok_or_else(|| anyhow!("checkpoint belongs to a different model or backend"))?;
    be.kv_restore(kv, s);
    Ok(())
}

/// `ModelState` for a `{ model: Arc<M>, state: S }` sequence type whose state has `kv`, `n_ctx`
/// and `max_batch` and whose model has `backend`, `forward`, `forward_argmax` and
/// `forward_top_k` (each taking `&mut state` first); `$with_kv`
/// builds a state around a copied cache (for `fork`); with `pipelined`, the model also has
/// `argmax_start` / `argmax_finish` (pipelined greedy decoding).
macro_rules! impl_model_state {
    ($seq:ident, $with_kv:expr $(, $pipelined:ident)?) => {
        impl<B: Backend + 'static> ModelState for $seq<B> {
            $(
            fn argmax_start(&mut self, token: Option<u32>, pos: u32) -> Result<Option<u64>> {
                let _ = stringify!($pipelined);
                self.model.argmax_start(&mut self.state, token, pos)
            }
            fn argmax_finish(&mut self, ticket: u64) -> Result<u32> {
                self.model.argmax_finish(ticket)
            }
            )?
            fn forward_argmax(
                &mut self,
                tokens: &[u32],
                pos: &[u32],
                logits_from: usize,
            ) -> Result<Vec<u32>> {
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
                self.model
                    .forward_top_k(&mut self.state, tokens, pos, logits_from, k, need_row)
            }
            fn forward(
                &mut self,
                tokens: &[u32],
                pos: &[u32],
                logits_from: usize,
            ) -> Result<Vec<f32>> {
                self.model
                    .forward(&mut self.state, tokens, pos, logits_from)
            }
            fn n_ctx(&self) -> usize {
                self.state.n_ctx
            }
            fn max_batch(&self) -> usize {
                self.state.max_batch
            }
            fn checkpoint(&self, n_past: usize) -> Box<dyn Any + Send + Sync> {
                Box::new(self.model.backend.kv_checkpoint(&self.state.kv, n_past))
            }
            fn restore(&mut self, snap: &(dyn Any + Send + Sync)) -> Result<()> {
                restore_kv(&*self.model.backend, &mut self.state.kv, snap)
            }
            fn fork(&self) -> Result<Box<dyn ModelState>> {
                let kv = self.model.backend.kv_clone(&self.state.kv);
                let state = IntoResult::into_result(($with_kv)(self, kv))?;
                Ok(Box::new($seq {
                    model: self.model.clone(),
                    state,
                }))
            }
            fn kv_bytes(&self) -> usize {
                self.model.backend.kv_bytes(&self.state.kv)
            }
            fn as_any(&self) -> &dyn Any {
                self
            }
            fn as_any_mut(&mut self) -> &mut dyn Any {
                self
            }
        }
    };
}

/// Lets `impl_model_state!`'s state constructor return a state or a `Result` of one.
trait IntoResult<T> {
    fn into_result(self) -> Result<T>;
}
impl<B: Backend> IntoResult<ForwardState<B>> for ForwardState<B> {
    fn into_result(self) -> Result<ForwardState<B>> {
        Ok(self)
    }
}
impl<B: Backend> IntoResult<Gemma4State<B>> for Gemma4State<B> {
    fn into_result(self) -> Result<Gemma4State<B>> {
        Ok(self)
    }
}
impl<T> IntoResult<T> for Result<T> {
    fn into_result(self) -> Result<T> {
        self
    }
}

/// A sequence of the shared decoder ([`DecoderModel`]).
pub struct DecoderSeq<B: Backend> {
    pub model: Arc<DecoderModel<B>>,
    pub state: ForwardState<B>,
}

impl<B: Backend + 'static> LanguageModel for DecoderModel<B> {
    fn arch(&self) -> &str {
        &self.cfg.arch
    }
    fn backend_name(&self) -> String {
        self.backend.name()
    }
    fn n_vocab(&self) -> usize {
        self.cfg.n_vocab
    }
    fn n_ctx_train(&self) -> usize {
        self.cfg.n_ctx_train
    }
    fn has_sliding_window(&self) -> bool {
        self.cfg.layers.iter().any(|l| l.window.is_some())
    }
    fn weight_bytes_per_token(&self) -> u64 {
        self.weight_bytes_per_token
    }
    fn kv_bytes_estimate(&self, n_ctx: usize, max_batch: usize, kv: KvType) -> u64 {
        layout_bytes(&self.kv_layout(n_ctx, max_batch), kv)
    }
    fn memory_free(&self) -> Option<u64> {
        self.backend.memory_free()
    }
    fn new_state(
        self: Arc<Self>,
        n_ctx: usize,
        max_batch: usize,
        kv: KvType,
    ) -> Result<Box<dyn ModelState>> {
        let state = DecoderModel::new_state(&self, n_ctx, max_batch, kv)?;
        Ok(Box::new(DecoderSeq { model: self, state }))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl_model_state!(
    DecoderSeq,
    |seq: &DecoderSeq<B>, kv| seq
        .model
        .state_with_kv(kv, seq.state.n_ctx, seq.state.max_batch),
    pipelined
);

impl<B: Backend + 'static> LanguageModel for Gemma4Model<B> {
    fn arch(&self) -> &str {
        "gemma4"
    }
    fn backend_name(&self) -> String {
        self.backend.name()
    }
    fn n_vocab(&self) -> usize {
        self.cfg.n_vocab
    }
    fn n_ctx_train(&self) -> usize {
        0
    }
    fn has_sliding_window(&self) -> bool {
        self.cfg.layers.iter().any(|l| l.kind == LayerKind::Sliding)
    }
    fn weight_bytes_per_token(&self) -> u64 {
        self.weight_bytes_per_token
    }
    fn kv_bytes_estimate(&self, n_ctx: usize, max_batch: usize, kv: KvType) -> u64 {
        layout_bytes(&self.kv_layout(n_ctx, max_batch), kv)
    }
    fn memory_free(&self) -> Option<u64> {
        self.backend.memory_free()
    }
    fn new_state(
        self: Arc<Self>,
        n_ctx: usize,
        max_batch: usize,
        kv: KvType,
    ) -> Result<Box<dyn ModelState>> {
        let state = Gemma4Model::new_state(&self, n_ctx, max_batch, kv)?;
        Ok(Box::new(Gemma4Seq { model: self, state }))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A sequence of a [`Gemma4Model`].
pub struct Gemma4Seq<B: Backend> {
    pub model: Arc<Gemma4Model<B>>,
    pub state: Gemma4State<B>,
}

impl_model_state!(Gemma4Seq, |seq: &Gemma4Seq<B>, kv| seq.model.state_with_kv(
    kv,
    seq.state.n_ctx,
    seq.state.max_batch
));
