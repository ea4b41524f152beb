//! Gemma 4 (text decoder) from a Hugging Face checkpoint directory (config.json + safetensors).
//!
//! Reads side by side with transformers 5.23 `models/gemma4/modeling_gemma4.py`
//! (`Gemma4TextModel` / `Gemma4ForCausalLM`):
//!
//! ```text
//! x = E[ids] · sqrt(H)                                  (Gemma4TextScaledWordEmbedding)
//! [PLE] pli = (norm_P(W_ple · x · H^-0.5) + E_ple[ids] · sqrt(P)) · 2^-0.5   → [n, L, P]
//! for each layer i:
//!     h = norm(x); q = q_norm(h·Wq) → rope
//!     if the layer owns K/V:  k = k_norm(h·Wk) → rope ; v = v_norm(h·Wv or raw h·Wk)   (v_norm: no weight)
//!     a = attention(q, K/V of this layer or of its KV-sharing producer), scale 1.0
//!     x += post_attn_norm(a·Wo)
//!     x += post_ffn_norm(down(gelu_tanh(gate(pre_ffn_norm(x))) ⊙ up(…)))
//!     [PLE] x += post_ple_norm(W_proj · (gelu_tanh(W_gate · x) ⊙ pli_i))
//!     x *= layer_scalar
//! logits = softcap(norm(x) · Eᵀ)
//! ```
//!
//! Norms are `x · (mean(x²)+eps)^-0.5 · w` (no `1 + w` offset, unlike Gemma 1-3). Sliding layers
//! use the default RoPE over their whole head; full layers use *proportional* RoPE: with head dim
//! `gd` and `partial_rotary_factor` p, `n = ⌊p·gd/2⌋` frequencies `θ^(-2i/gd)` (the exponent's
//! denominator is the full head dim) and the remaining `gd/2 - n` frequencies are zero, in the
//! rotate-half layout over the whole head. We express that with the backend's NEOX RoPE over
//! `gd` dims and per-frequency divisors of `+∞` for the identity part.
//!
//! Weights: the checkpoint's tensors are read in place where the files are mapped
//! ([`crate::weights::WeightSource`]); `--quant` converts the float matrices at load.
//!
//! MoE blocks (`enable_moe_block`, 26B-A4B style) are supported: the routed-experts branch is in
//! `gemma4/moe.rs`. Not supported (clear errors at load): attention biases, bidirectional
//! attention, RoPE types other than `default`/`proportional`, activations other than
//! `gelu_pytorch_tanh`; multimodal towers are ignored (only the text weights are read).

use crate::state::{alloc_kv, ExtraState, LayerState, StateLayout};
use crate::stepper::{self, StepCtl, StepState};
use anyhow::{anyhow, bail, Result};
use std::path::Path;
use std::sync::Arc;
use vela_compute::{Activation, AttnParams, Backend, KvType, TopK};
use vela_formats::gguf::GgufFile;

mod batch;
mod config;
mod load;
mod moe;

pub use config::{Gemma4Config, Gemma4Layer, LayerKind, MoeConfig};
pub use load::gguf_name;

/// K/V projections of a layer that owns its cache.
struct OwnKv<B: Backend> {
    wk: B::Weight,
    /// `None` with `attention_k_eq_v`: V is the raw K projection.
    wv: Option<B::Weight>,
    k_norm: B::Vector,
}

struct Layer<B: Backend> {
    input_norm: B::Vector,
    wq: B::Weight,
    q_norm: B::Vector,
    /// `None` for KV-sharing consumers.
    kv: Option<OwnKv<B>>,
    wo: B::Weight,
    post_attn_norm: B::Vector,
    pre_ffn_norm: B::Vector,
    w_gate: B::Weight,
    w_up: B::Weight,
    w_down: B::Weight,
    post_ffn_norm: B::Vector,
    /// `(per_layer_input_gate, per_layer_projection, post_per_layer_input_norm)`.
    ple: Option<(B::Weight, B::Weight, B::Vector)>,
    scalar: f32,
    /// All-ones weight of the scale-free `v_norm`.
    ones: B::Vector,
    /// Router + experts + extra norms (`enable_moe_block`).
    moe: Option<moe::MoeLayer<B>>,
}

/// A loaded Gemma 4 text model.
pub struct Gemma4Model<B: Backend> {
    pub backend: Arc<B>,
    pub cfg: Gemma4Config,
    embd: B::Weight,
    /// The output head; `None` when it is the token embedding (tied: uploaded once).
    lm_head: Option<B::Weight>,
    norm: B::Vector,
    /// `(embed_tokens_per_layer, per_layer_model_projection, per_layer_projection_norm)`.
    ple: Option<(B::Weight, B::Weight, B::Vector)>,
    layers: Vec<Layer<B>>,
    /// Weight bytes one decoded token reads (the products and the output head; experts at
    /// their active share).
    pub weight_bytes_per_token: u64,
    /// The scratch of [`Gemma4Model::forward_batch`] (a state of as many rows as the largest
    /// batch so far).
    batch: std::sync::Mutex<Option<Gemma4State<B>>>,
}

/// Per-sequence state: KV cache and scratch buffers for up to `max_batch` tokens.
pub struct Gemma4State<B: Backend> {
    pub kv: B::Kv,
    pub n_ctx: usize,
    pub max_batch: usize,
    bufs: Vec<B::Buf>,
    /// Rows `bufs[LOGITS]` holds ([`crate::stepper::logits_room`]).
    logits_rows: usize,
    /// The key of this state's recorded steps ([`crate::stepper`]).
    key: u64,
    /// Record the next position's step while the device runs this one.
    pub prepare_ahead: bool,
    /// The MoE blocks' scratch (MoE models).
    moe: Option<moe::MoeScratch<B>>,
    /// Per-layer inputs `[n, P]` of each layer (PLE models) and, for layer il, the rows
    /// `t·L + il` (t < max_batch) of the `[n·L, P]` projection they are gathered from.
    pli: Vec<B::Buf>,
    pli_rows: Vec<B::Ids>,
}

// Indices into `Gemma4State::bufs`.
const X: usize = 0;
const H: usize = 1;
const Q: usize = 2;
const K: usize = 3;
const V: usize = 4;
const A: usize = 5;
const O: usize = 6;
const G: usize = 7;
const U: usize = 8;
const LOGITS: usize = 9;
const PA: usize = 10;
const PB: usize = 11;

impl<B: Backend> Gemma4Model<B> {
    /// The state a sequence keeps: K/V per layer (sliding layers in a ring); KV-sharing
    /// consumers keep nothing (they read their producer's layer).
    pub fn state_layout(&self) -> StateLayout {
        let c = &self.cfg;
        StateLayout::new(
            c.layers
                .iter()
                .map(|l| match l.kv_from {
                    Some(from) => LayerState::Shared { from },
                    None => {
                        let window = (l.kind == LayerKind::Sliding).then_some(c.sliding_window);
                        LayerState::kv(l.n_head_kv, l.head_dim, l.head_dim, window)
                    }
                })
                .collect(),
        )
    }

    /// A fresh sequence state.
    pub fn new_state(
        &self,
        n_ctx: usize,
        max_batch: usize,
        kv_type: KvType,
    ) -> Result<Gemma4State<B>> {
        let kv = alloc_kv(
            &*self.backend,
            &self.state_layout(),
            n_ctx,
            max_batch,
            kv_type,
        )?;
        Ok(self.state_with_kv(kv, n_ctx, max_batch))
    }

    /// A sequence state around an existing cache (made for the same `n_ctx`/`max_batch`), e.g. a
    /// copy for a forked sequence: only the scratch buffers are allocated.
    pub fn state_with_kv(&self, kv: B::Kv, n_ctx: usize, max_batch: usize) -> Gemma4State<B> {
        let be = &*self.backend;
        let c = &self.cfg;
        let nb = max_batch;
        let max = |f: &dyn Fn(&Gemma4Layer) -> usize| c.layers.iter().map(f).max().unwrap_or(0);
        let qd = max(&|l| c.n_head * l.head_dim);
        let kvd = max(&|l| l.n_head_kv * l.head_dim);
        let ff = max(&|l| l.n_ff).max(c.ple_dim);
        let lp = c.n_layer * c.ple_dim;
        let sizes = [
            c.n_embd, c.n_embd, qd, kvd, kvd, qd, c.n_embd, ff, ff, c.n_vocab, lp, lp,
        ];
        Gemma4State {
            kv,
            n_ctx,
            max_batch,
            // The logits buffer is made for one row and grown by need.
            bufs: (sizes.iter().enumerate())
                .map(|(i, &s)| be.alloc(if i == LOGITS { 1 } else { nb } * s.max(1)))
                .collect(),
            logits_rows: 1,
            key: StepCtl::new().key,
            prepare_ahead: true,
            moe: c.moe.map(|m| moe::MoeScratch::new(be, &m, c.n_embd, nb)),
            pli: (0..if c.ple_dim > 0 { c.n_layer } else { 0 })
                .map(|_| be.alloc(nb * c.ple_dim))
                .collect(),
            pli_rows: (0..if c.ple_dim > 0 { c.n_layer } else { 0 })
                .map(|il| {
                    let rows: Vec<u32> = (0..nb).map(|t| (t * c.n_layer + il) as u32).collect();
                    let mut ids = be.alloc_ids(nb);
                    be.write_ids(&mut ids, &rows);
                    ids
                })
                .collect(),
        }
    }

    /// Per-layer inputs `pli[i] : [n, P]` for the batch (see the module docs).
    fn per_layer_inputs(&self, st: &mut Gemma4State<B>, tokens: &[u32]) -> Result<()> {
        let Some((table, proj, pnorm)) = &self.ple else {
            return Ok(());
        };
        let be = &*self.backend;
        let c = &self.cfg;
        let (n, p, l) = (tokens.len(), c.ple_dim, c.n_layer);
        // (A step's token still on the device is an argmax of the logits: below n_vocab, which
        // graph_safe requires to be within the per-layer vocabulary.)
        let on_device = |t: u32| t == vela_compute::DEVICE_TOKEN;
        if let Some(&t) = tokens
            .iter()
            .find(|&&t| !on_device(t) && t as usize >= c.ple_vocab)
        {
            bail!(
                "token id {t} is outside the per-layer embedding vocabulary ({})",
                c.ple_vocab
            );
        }
        let [x, pa, pb] = pick3(&mut st.bufs, X, PA, PB);
        be.get_rows(table, tokens, (p as f32).sqrt(), pb)?;
        be.matmul(proj, x, n, pa);
        be.scale(pa, n * l * p, (c.n_embd as f32).powf(-0.5));
        be.rms_norm_inplace(pa, pnorm, n * l, p, c.rms_eps);
        be.add(pa, pb, n * l * p);
        be.scale(pa, n * l * p, std::f32::consts::FRAC_1_SQRT_2);
        // Layer il's rows t·L + il, gathered on the device (no round trip).
        for (buf, idx) in st.pli.iter_mut().zip(&st.pli_rows) {
            be.gather_rows(pa, idx, n, p, buf);
        }
        Ok(())
    }

    /// Run `tokens` at `positions` (≤ `max_batch`, all earlier positions already cached), append
    /// their K/V, and return the logits of rows `logits_from..` (row-major `[rows, n_vocab]`).
    pub fn forward(
        &self,
        st: &mut Gemma4State<B>,
        tokens: &[u32],
        positions: &[u32],
        logits_from: usize,
    ) -> Result<Vec<f32>> {
        let rows = self.run(st, tokens, positions, logits_from)?;
        let mut out = vec![0f32; rows * self.cfg.n_vocab];
        if rows > 0 {
            self.backend.read(&st.bufs[LOGITS], &mut out);
        }
        Ok(out)
    }

    /// [`Self::forward`] returning only the argmax token of each logits row (lowest index on
    /// ties, NaN skipped): a GPU backend computes it on the device and copies back only the ids.
    pub fn forward_argmax(
        &self,
        st: &mut Gemma4State<B>,
        tokens: &[u32],
        positions: &[u32],
        logits_from: usize,
    ) -> Result<Vec<u32>> {
        let rows = self.run(st, tokens, positions, logits_from)?;
        if rows == 0 {
            return Ok(Vec::new());
        }
        let nv = self.cfg.n_vocab;
        Ok(self.backend.argmax_rows(&st.bufs[LOGITS], rows, nv))
    }

    /// [`Self::forward`] returning each logits row's `k` best tokens and statistics
    /// ([`Backend::top_k_rows`]: selected on the device by a GPU) and, only for the rows where
    /// `need_row` asks for it, the row itself. Selection runs on the softcapped logits, the
    /// values [`Self::forward`] returns.
    pub fn forward_top_k(
        &self,
        st: &mut Gemma4State<B>,
        tokens: &[u32],
        positions: &[u32],
        logits_from: usize,
        k: usize,
        need_row: &dyn Fn(&TopK) -> bool,
    ) -> Result<Vec<(TopK, Option<Vec<f32>>)>> {
        let rows = self.run(st, tokens, positions, logits_from)?;
        Ok(crate::decoder::select_top_k(
            &*self.backend,
            &st.bufs[LOGITS],
            rows,
            self.cfg.n_vocab,
            k,
            need_row,
        ))
    }

    /// The forward pass up to the (softcapped) logits of rows `logits_from..` in the state's
    /// logits buffer, left on the device; returns their number of rows.
    fn run(
        &self,
        st: &mut Gemma4State<B>,
        tokens: &[u32],
        positions: &[u32],
        logits_from: usize,
    ) -> Result<usize> {
        let nv = self.cfg.n_vocab;
        let layers =
            |st: &mut Gemma4State<B>, t: &[u32], p: &[u32], lf: usize| self.layers(st, t, p, lf);
        let be = &*self.backend;
        stepper::run(
            be,
            st,
            tokens,
            positions,
            logits_from,
            nv,
            self.graph_safe(),
            &layers,
        )
    }

    /// Whether the stepper may record a single-token step as a graph and prepare the next one
    /// ahead (no host round trip in it). PLE models have none either since their per-layer
    /// inputs are gathered on the device, but no GPU test covers their recorded steps yet: they
    /// stay on plain launches until one does.
    /// Experts in host memory read back mid-step: no graph either.
    fn graph_safe(&self) -> bool {
        self.ple.is_none()
            && !self
                .layers
                .iter()
                .any(|l| l.moe.as_ref().is_some_and(|m| m.experts.on_host()))
    }

    /// Pipelined greedy decoding ([`crate::stepper::argmax_start`]).
    pub fn argmax_start(
        &self,
        st: &mut Gemma4State<B>,
        token: Option<u32>,
        pos: u32,
    ) -> Result<Option<u64>> {
        let nv = self.cfg.n_vocab;
        let layers =
            |st: &mut Gemma4State<B>, t: &[u32], p: &[u32], lf: usize| self.layers(st, t, p, lf);
        let be = &*self.backend;
        stepper::argmax_start(be, st, token, pos, nv, self.graph_safe(), &layers)
    }

    /// The layers and the head: the logits of rows `logits_from..` into the state's logits
    /// buffer, left on the device; returns their number of rows.
    fn layers(
        &self,
        st: &mut Gemma4State<B>,
        tokens: &[u32],
        positions: &[u32],
        logits_from: usize,
    ) -> Result<usize> {
        let n = tokens.len();
        let be = &*self.backend;
        self.embed_inputs(st, tokens)?;
        let Gemma4State {
            kv,
            bufs,
            moe,
            pli,
            logits_rows,
            ..
        } = st;
        self.trunk(bufs, moe.as_mut(), pli, n, &mut |b, il| {
            self.rope_store(b, kv, il, n, positions);
            let (l, ap) = (&self.layers[il], self.attn_params(il));
            let layer = self.cfg.layers[il].kv_from.unwrap_or(il);
            let [q, a, o] = pick3(b, Q, A, O);
            be.attention_matmul(q, kv, layer, positions, &ap, a, &l.wo, o);
        });
        let rows = n - logits_from;
        if rows == 0 {
            return Ok(0);
        }
        {
            let [x, o] = pick2(bufs, X, O);
            be.copy_rows(x, logits_from, rows, self.cfg.n_embd, o, 0);
        }
        self.head(bufs, logits_rows, rows);
        Ok(rows)
    }

    /// The scaled token embeddings of `tokens` in `bufs[X]` and, for PLE models, the per-layer
    /// inputs.
    fn embed_inputs(&self, st: &mut Gemma4State<B>, tokens: &[u32]) -> Result<()> {
        let d = self.cfg.n_embd;
        let be = &*self.backend;
        be.get_rows(&self.embd, tokens, (d as f32).sqrt(), &mut st.bufs[X])?;
        self.per_layer_inputs(st, tokens)
    }

    /// Every layer over the `n` rows of `b[X]` (embedded by [`Self::embed_inputs`]), leaving the
    /// residual stream in `b[X]`. `attend(b, il)` takes layer `il`'s projections `b[Q]`, `b[K]`,
    /// `b[V]` (K and V only in layers with their own cache) and leaves the attention output
    /// projected by `wo` in `b[O]`: one sequence's cache, or each sequence of a batch in turn.
    fn trunk(
        &self,
        b: &mut [B::Buf],
        mut moe: Option<&mut moe::MoeScratch<B>>,
        pli: &[B::Buf],
        n: usize,
        attend: &mut dyn FnMut(&mut [B::Buf], usize),
    ) {
        let be = &*self.backend;
        let c = &self.cfg;
        let d = c.n_embd;
        // The layer whose post-FFN norm, residual add and layer scalar the next layer's input
        // norm applies (one call a backend may fuse; the last layer's are applied after it).
        let mut pending: Option<&Layer<B>> = None;
        for (il, (l, lc)) in self.layers.iter().zip(&c.layers).enumerate() {
            // Input norm and projections in one call a backend may fuse (on a GPU the norm
            // also quantizes for the products); K and V only in layers with their own cache.
            {
                let [x, o, h, q, k, v] = b.get_disjoint_mut([X, O, H, Q, K, V]).expect("buffers");
                let (norm, eps, prev) = (&l.input_norm, c.rms_eps, pending.take());
                let mut input = |ws: &[&B::Weight], ys: &mut [&mut B::Buf]| match prev {
                    Some(p) => be.post_norm_matmul_many(
                        x,
                        o,
                        &p.post_ffn_norm,
                        p.scalar,
                        norm,
                        n,
                        d,
                        eps,
                        h,
                        ws,
                        &[],
                        ys,
                    ),
                    None => be.norm_matmul_many(x, None, norm, n, d, eps, h, ws, &[], ys),
                };
                match &l.kv {
                    Some(OwnKv { wk, wv, .. }) => {
                        let wv = wv.as_ref().unwrap_or(wk);
                        input(&[&l.wq, wk, wv], &mut [q, k, v]);
                    }
                    None => input(&[&l.wq], &mut [q]),
                }
            }
            attend(b, il);
            // x += post_attn_norm(o), the pre-FFN norm and the gate/up products in one call.
            {
                let [x, o, h, g, u] = b.get_disjoint_mut([X, O, H, G, U]).expect("buffers");
                let (post, pre) = (&l.post_attn_norm, &l.pre_ffn_norm);
                let ws = [&l.w_gate, &l.w_up];
                be.post_norm_matmul_many(
                    x,
                    o,
                    post,
                    1.0,
                    pre,
                    n,
                    d,
                    c.rms_eps,
                    h,
                    &ws,
                    &[],
                    &mut [g, u],
                );
            }
            {
                let [g, u, o] = pick3(b, G, U, O);
                be.act_mul_matmul(g, u, n, lc.n_ff, Activation::GeluTanh, &l.w_down, o);
            }
            if let (Some(m), Some(mc)) = (&l.moe, &c.moe) {
                be.rms_norm_inplace(&mut b[O], &m.post_norm_1, n, d, c.rms_eps);
                let ms = moe.as_deref_mut().expect("MoE models have MoE scratch");
                m.forward(be, b, ms, mc, n, d, c.rms_eps, (X, H, O));
            }
            if l.ple.is_none() && il + 1 < self.layers.len() {
                pending = Some(l);
                continue;
            }
            be.rms_norm_inplace(&mut b[O], &l.post_ffn_norm, n, d, c.rms_eps);
            {
                let [x, o] = pick2(b, X, O);
                be.add(x, o, n * d);
            }
            if let Some((w_gate, w_proj, pnorm)) = &l.ple {
                let p = c.ple_dim;
                {
                    let [x, g] = pick2(b, X, G);
                    be.matmul(w_gate, x, n, g);
                    be.act_mul(g, &pli[il], n * p, Activation::GeluTanh);
                }
                {
                    let [g, o] = pick2(b, G, O);
                    be.matmul(w_proj, g, n, o);
                }
                be.rms_norm_inplace(&mut b[O], pnorm, n, d, c.rms_eps);
                let [x, o] = pick2(b, X, O);
                be.add(x, o, n * d);
            }
            if l.scalar != 1.0 {
                be.scale(&mut b[X], n * d, l.scalar);
            }
        }
    }

    /// Layer `il`'s q (and, in a layer with its own cache, k and v) norms and RoPE for the `n`
    /// rows of `b[Q]`, `b[K]`, `b[V]` at `positions`, K and V stored in `kv`: one call a backend
    /// may fuse.
    fn rope_store(&self, b: &mut [B::Buf], kv: &mut B::Kv, il: usize, n: usize, positions: &[u32]) {
        let be = &*self.backend;
        let c = &self.cfg;
        let (l, lc) = (&self.layers[il], &c.layers[il]);
        let hd = lc.head_dim;
        match &l.kv {
            Some(OwnKv { k_norm, .. }) => {
                // The q, k and v norms (v's without weights), the RoPE and the cache store.
                let [q, k, v] = pick3(b, Q, K, V);
                let norms = (&l.q_norm, k_norm, c.rms_eps);
                let (heads, kv_heads) = (c.n_head, lc.n_head_kv);
                let (rope, vn) = (&lc.rope, Some(&l.ones));
                be.norm_rope_qk_store(
                    q, k, v, kv, il, heads, kv_heads, hd, positions, rope, norms, vn,
                );
            }
            None => {
                be.rms_norm_inplace(&mut b[Q], &l.q_norm, n * c.n_head, hd, c.rms_eps);
                be.rope(&mut b[Q], c.n_head, hd, positions, &lc.rope);
            }
        }
    }

    /// Layer `il`'s attention parameters.
    fn attn_params(&self, il: usize) -> AttnParams {
        let c = &self.cfg;
        let lc = &c.layers[il];
        AttnParams {
            n_head: c.n_head,
            n_head_kv: lc.n_head_kv,
            head_dim_k: lc.head_dim,
            head_dim_v: lc.head_dim,
            scale: 1.0,
            window: (lc.kind == LayerKind::Sliding).then_some(c.sliding_window),
            softcap: None,
        }
    }

    /// The final norm of the `rows` rows of `b[O]` and the (softcapped) logits into
    /// `b[LOGITS]` (grown to hold them; `logits_rows` its row capacity).
    fn head(&self, b: &mut [B::Buf], logits_rows: &mut usize, rows: usize) {
        let be = &*self.backend;
        let c = &self.cfg;
        {
            let [o, h] = pick2(b, O, H);
            be.rms_norm(o, &self.norm, rows, c.n_embd, c.rms_eps, h);
        }
        crate::stepper::logits_room(be, &mut b[LOGITS], logits_rows, rows, c.n_vocab);
        {
            let [h, lg] = pick2(b, H, LOGITS);
            be.matmul(self.lm_head.as_ref().unwrap_or(&self.embd), h, rows, lg);
        }
        if let Some(cap) = c.final_softcap {
            be.softcap(&mut b[LOGITS], rows * c.n_vocab, cap);
        }
    }

    /// The scaled input embeddings `E[tokens] · sqrt(hidden)` (`[n, hidden]` into `out`), as the
    /// assistant drafter concatenates them with the hidden state.
    // used by gemma4_assistant
    pub fn embed_scaled(&self, tokens: &[u32], out: &mut B::Buf) -> Result<()> {
        let d = self.cfg.n_embd as f32;
        self.backend.get_rows(&self.embd, tokens, d.sqrt(), out)
    }

    /// Row `row` (counted from `logits_from`) of the post-final-norm hidden states of the last
    /// [`Gemma4Model::forward`] (or `forward_argmax` / `forward_top_k`) on `st` — HF's
    /// `hidden_states[-1]`.
    // used by gemma4_assistant
    pub fn output_hidden(&self, st: &Gemma4State<B>, row: usize) -> Result<Vec<f32>> {
        let d = self.cfg.n_embd;
        if row >= st.max_batch {
            bail!(
                "hidden-state row {row} is outside the batch of {}",
                st.max_batch
            );
        }
        let mut all = vec![0f32; (row + 1) * d];
        self.backend.read(&st.bufs[H], &mut all);
        Ok(all.split_off(row * d))
    }
}

/// Two distinct mutable elements of a slice (the decode buffers; also used by the assistant).
pub(crate) fn pick2<T>(v: &mut [T], i: usize, j: usize) -> [&mut T; 2] {
    v.get_disjoint_mut([i, j]).expect("distinct buffer indices")
}

/// Three distinct mutable elements of a slice.
pub(crate) fn pick3<T>(v: &mut [T], i: usize, j: usize, k: usize) -> [&mut T; 3] {
    v.get_disjoint_mut([i, j, k])
        .expect("distinct buffer indices")
}

/// Load a llama.cpp `gemma4` GGUF file.
pub fn load_gguf_gemma4<B: Backend>(backend: Arc<B>, g: Arc<GgufFile>) -> Result<Gemma4Model<B>> {
    Gemma4Model::load_gguf(backend, g)
}

/// Load a Gemma 4 text model from a Hugging Face checkpoint directory.
pub fn load_hf_gemma4<B: Backend>(backend: Arc<B>, dir: &Path) -> Result<Gemma4Model<B>> {
    Gemma4Model::load_hf(backend, dir)
}

impl<B: Backend> StepState<B> for Gemma4State<B> {
    fn ctl(&self) -> StepCtl {
        StepCtl {
            key: self.key,
            prepare_ahead: self.prepare_ahead,
        }
    }
    fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    fn max_batch(&self) -> usize {
        self.max_batch
    }
    fn logits(&self) -> &B::Buf {
        &self.bufs[LOGITS]
    }
}

impl<B: Backend + 'static> crate::lm::CausalLm for Gemma4Model<B> {
    type Be = B;
    type State = Gemma4State<B>;
    fn arch(&self) -> &str {
        "gemma4"
    }
    fn backend(&self) -> &Arc<B> {
        &self.backend
    }
    fn n_vocab(&self) -> usize {
        self.cfg.n_vocab
    }
    fn n_ctx_train(&self) -> usize {
        0
    }
    fn weight_bytes_per_token(&self) -> u64 {
        self.weight_bytes_per_token
    }
    fn state_layout(&self) -> StateLayout {
        Gemma4Model::state_layout(self)
    }
    fn state_with(
        &self,
        kv: B::Kv,
        extra: ExtraState<B>,
        n_ctx: usize,
        max_batch: usize,
    ) -> Result<Gemma4State<B>> {
        debug_assert!(extra.is_empty(), "this model declares K/V layers only");
        Ok(Gemma4Model::state_with_kv(self, kv, n_ctx, max_batch))
    }
    fn kv(st: &Gemma4State<B>) -> &B::Kv {
        &st.kv
    }
    fn kv_mut(st: &mut Gemma4State<B>) -> &mut B::Kv {
        &mut st.kv
    }
    fn run(
        &self,
        st: &mut Gemma4State<B>,
        tokens: &[u32],
        positions: &[u32],
        logits_from: usize,
    ) -> Result<usize> {
        Gemma4Model::run(self, st, tokens, positions, logits_from)
    }
    fn argmax_start(
        &self,
        st: &mut Gemma4State<B>,
        token: Option<u32>,
        pos: u32,
    ) -> Result<Option<u64>> {
        Gemma4Model::argmax_start(self, st, token, pos)
    }
    fn argmax_finish(&self, ticket: u64) -> Result<u32> {
        self.backend.argmax_finish(ticket)
    }
    fn forward_batch(
        &self,
        items: &mut [crate::lm::BatchItem<'_, Gemma4State<B>>],
    ) -> Result<Vec<crate::lm::Selected>> {
        Gemma4Model::forward_batch(self, items)
    }
    fn discover_mtp(&self, model_path: &Path) -> Option<std::path::PathBuf> {
        crate::gemma4_assistant::discover_assistant(model_path)
    }
    fn load_mtp(&self, path: &Path) -> Option<Result<Box<dyn crate::mtp::MtpHead>>> {
        use crate::gemma4_assistant::{Gemma4Assistant, Gemma4Mtp};
        let load = || -> Result<Box<dyn crate::mtp::MtpHead>> {
            let asst = Gemma4Assistant::load(self.backend.clone(), path)?;
            Ok(Box::new(Gemma4Mtp::new(Arc::new(asst), self)?))
        };
        Some(load())
    }
}
