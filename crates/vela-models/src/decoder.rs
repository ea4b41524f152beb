//! The shared pre-norm decoder used by the Llama, Qwen2/3 and Gemma 3 families.
//!
//! ```text
//! x = embed(tokens) * embed_scale
//! for each layer:
//!     h = rms_norm(x) ; q,k,v = h·Wq,Wk,Wv (+bias) ; [q,k = rms_norm per head] ; rope(q,k)
//!     a = attention(q, cache ∪ k,v) ; o = a·Wo ; [o = rms_norm(o)] ; x += o
//!     h = rms_norm(x) ; f = (act(h·Wg) * h·Wu)·Wd ; [f = rms_norm(f)] ; x += f
//! logits = rms_norm(x)·Wout [softcap]
//! ```

use crate::config::DecoderConfig;
use crate::lm::{Select, Selected};
use crate::state::{alloc_kv, ExtraState, LayerState, StateLayout};
use crate::stepper::{self, StepCtl, StepState};
use crate::weights::WeightSource;
use anyhow::{anyhow, bail, Result};
use std::sync::Arc;
use vela_compute::{AttnParams, Backend, KvType};
use vela_formats::gguf::GgufFile;

mod batch;
pub(crate) use batch::{batch_tokens, select_rows, wants};

struct Layer<B: Backend> {
    attn_norm: B::Vector,
    wq: B::Weight,
    wk: B::Weight,
    wv: B::Weight,
    wo: B::Weight,
    bq: Option<B::Vector>,
    bk: Option<B::Vector>,
    bv: Option<B::Vector>,
    q_norm: Option<B::Vector>,
    k_norm: Option<B::Vector>,
    post_attn_norm: Option<B::Vector>,
    ffn_norm: B::Vector,
    w_gate: B::Weight,
    w_up: B::Weight,
    w_down: B::Weight,
    post_ffn_norm: Option<B::Vector>,
}

/// Each of the `rows` logits rows of `logits` (width `nv`): its `k` best tokens and statistics
/// ([`Backend::top_k_rows`]) and, only where `need_row` asks for it, the row itself (the
/// `forward_top_k` of every model).
pub(crate) fn select_top_k<B: Backend>(
    be: &B,
    logits: &B::Buf,
    rows: usize,
    nv: usize,
    k: usize,
    need_row: &dyn Fn(&vela_compute::TopK) -> bool,
) -> Vec<(vela_compute::TopK, Option<Vec<f32>>)> {
    match batch::select_rows(be, logits, nv, &[(rows, Select::TopK(k, need_row))]).pop() {
        Some(Selected::TopK(v)) => v,
        _ => unreachable!("a top-k selection gives top-k rows"),
    }
}

pub(crate) use crate::stepper::check_batch;

/// A loaded decoder-only transformer.
pub struct DecoderModel<B: Backend> {
    pub backend: Arc<B>,
    pub cfg: DecoderConfig,
    pub gguf: Arc<GgufFile>,
    embd: B::Weight,
    output_norm: B::Vector,
    /// The output head; `None` when it is the token embedding (tied: uploaded once).
    output: Option<B::Weight>,
    layers: Vec<Layer<B>>,
    /// Bytes of weights read per decoded token (for bandwidth reports).
    pub weight_bytes_per_token: u64,
    /// Activations of the last multi-sequence batch (`batch.rs`), kept for the next one: (rows
    /// it holds, buffers).
    batch: std::sync::Mutex<Option<(usize, Bufs<B>)>>,
}

/// Per-sequence state: the KV cache and scratch buffers for up to `max_batch` tokens.
pub struct ForwardState<B: Backend> {
    pub kv: B::Kv,
    pub n_ctx: usize,
    pub max_batch: usize,
    b: Bufs<B>,
    /// Unique per state (the key of its prepared decode steps, `Backend::decode_step_prepare`).
    id: u64,
    /// Record the next position's step while the device runs this one (single-token steps).
    pub prepare_ahead: bool,
}

/// Activations of a forward pass over up to `rows` tokens.
pub(crate) struct Bufs<B: Backend> {
    x: B::Buf,
    h: B::Buf,
    q: B::Buf,
    k: B::Buf,
    v: B::Buf,
    a: B::Buf,
    o: B::Buf,
    g: B::Buf,
    u: B::Buf,
    /// `logits_rows` rows of logits ([`crate::stepper::logits_room`]).
    logits: B::Buf,
    logits_rows: usize,
}

impl<B: Backend> Bufs<B> {
    fn new(be: &B, c: &DecoderConfig, rows: usize) -> Self {
        let nb = rows;
        Bufs {
            x: be.alloc(nb * c.n_embd),
            h: be.alloc(nb * c.n_embd),
            q: be.alloc(nb * c.n_head * c.head_dim_k.max(c.head_dim_v)),
            k: be.alloc(nb * c.n_head_kv * c.head_dim_k),
            v: be.alloc(nb * c.n_head_kv * c.head_dim_v),
            a: be.alloc(nb * c.n_head * c.head_dim_k.max(c.head_dim_v)),
            o: be.alloc(nb * c.n_embd),
            g: be.alloc(nb * c.n_ff),
            u: be.alloc(nb * c.n_ff),
            logits: be.alloc(c.n_vocab),
            logits_rows: 1,
        }
    }
}

/// What a layer's attention part ([`DecoderModel::pass`]) leaves.
pub(crate) struct Attended {
    /// Rows the rest of the pass runs on (the last layer keeps the logits rows only; 0: none).
    rows: usize,
    /// Whether the attention part swapped `q`↔`a` (and `x`↔`h`) to move those rows to the front.
    swap_qa: bool,
    swap_xh: bool,
}

/// A matrix `[rows, cols]` on the backend (converted to the source's load-time type) and its
/// bytes.
fn weight<B: Backend>(
    be: &B,
    src: &WeightSource,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<(B::Weight, u64)> {
    let w = src.matrix(name, false)?;
    if w.rows != rows || w.cols != cols {
        bail!(
            "tensor {name} has shape [{}, {}], expected [{cols}, {rows}]",
            w.cols,
            w.rows
        );
    }
    Ok((be.upload_weight(&w)?, w.bytes().len() as u64))
}

fn vector<B: Backend>(
    be: &B,
    src: &WeightSource,
    name: &str,
    len: usize,
) -> Result<Option<B::Vector>> {
    let Some(w) = src.get(name) else {
        return Ok(None);
    };
    if w.rows * w.cols != len {
        bail!(
            "tensor {name} has {} elements, expected {len}",
            w.rows * w.cols
        );
    }
    Ok(Some(be.upload_vector(&w.to_f32()?)?))
}

fn req<T>(v: Option<T>, name: &str) -> Result<T> {
    v.ok_or_else(|| anyhow!("missing tensor {name}"))
}

impl<B: Backend> DecoderModel<B> {
    pub fn load(backend: Arc<B>, g: Arc<GgufFile>, cfg: DecoderConfig) -> Result<Self> {
        Self::load_from(backend, &WeightSource::gguf(g), cfg)
    }

    /// Load from a GGUF weight source (llama.cpp tensor names).
    pub fn load_from(backend: Arc<B>, src: &WeightSource, cfg: DecoderConfig) -> Result<Self> {
        let g = src
            .gguf_file()
            .ok_or_else(|| anyhow!("the shared decoder loads GGUF files only"))?
            .clone();
        let be = &*backend;
        let (d, q_dim, kv_k, kv_v) = (
            cfg.n_embd,
            cfg.n_head * cfg.head_dim_k,
            cfg.n_head_kv * cfg.head_dim_k,
            cfg.n_head_kv * cfg.head_dim_v,
        );
        let (embd, embd_bytes) = weight(be, src, "token_embd.weight", cfg.n_vocab, d)?;
        let output_norm = req(
            vector(be, src, "output_norm.weight", d)?,
            "output_norm.weight",
        )?;
        // Bytes a decoded token reads: the products and the head (the tied embedding counted
        // once, as the head).
        let (output, mut bytes) = if src.has("output.weight") {
            let (w, b) = weight(be, src, "output.weight", cfg.n_vocab, d)?;
            (Some(w), b)
        } else {
            (None, embd_bytes)
        };
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for il in 0..cfg.n_layer {
            let n = |s: &str| format!("blk.{il}.{s}");
            let mut w = |s: &str, rows: usize, cols: usize| -> Result<B::Weight> {
                let (w, b) = weight(be, src, &n(s), rows, cols)?;
                bytes += b;
                Ok(w)
            };
            let (wq, wk, wv) = (
                w("attn_q.weight", q_dim, d)?,
                w("attn_k.weight", kv_k, d)?,
                w("attn_v.weight", kv_v, d)?,
            );
            let wo = w("attn_output.weight", d, cfg.n_head * cfg.head_dim_v)?;
            let (w_gate, w_up, w_down) = (
                w("ffn_gate.weight", cfg.n_ff, d)?,
                w("ffn_up.weight", cfg.n_ff, d)?,
                w("ffn_down.weight", d, cfg.n_ff)?,
            );
            let l = Layer {
                attn_norm: req(
                    vector(be, src, &n("attn_norm.weight"), d)?,
                    &n("attn_norm.weight"),
                )?,
                wq,
                wk,
                wv,
                wo,
                bq: vector(be, src, &n("attn_q.bias"), q_dim)?,
                bk: vector(be, src, &n("attn_k.bias"), kv_k)?,
                bv: vector(be, src, &n("attn_v.bias"), kv_v)?,
                q_norm: if cfg.qk_norm {
                    Some(req(
                        vector(be, src, &n("attn_q_norm.weight"), cfg.head_dim_k)?,
                        &n("attn_q_norm.weight"),
                    )?)
                } else {
                    None
                },
                k_norm: if cfg.qk_norm {
                    Some(req(
                        vector(be, src, &n("attn_k_norm.weight"), cfg.head_dim_k)?,
                        &n("attn_k_norm.weight"),
                    )?)
                } else {
                    None
                },
                post_attn_norm: if cfg.post_norms {
                    Some(req(
                        vector(be, src, &n("post_attention_norm.weight"), d)?,
                        &n("post_attention_norm.weight"),
                    )?)
                } else {
                    None
                },
                ffn_norm: req(
                    vector(be, src, &n("ffn_norm.weight"), d)?,
                    &n("ffn_norm.weight"),
                )?,
                w_gate,
                w_up,
                w_down,
                post_ffn_norm: if cfg.post_norms {
                    Some(req(
                        vector(be, src, &n("post_ffw_norm.weight"), d)?,
                        &n("post_ffw_norm.weight"),
                    )?)
                } else {
                    None
                },
            };
            layers.push(l);
        }
        Ok(DecoderModel {
            backend,
            cfg,
            gguf: g,
            embd,
            output_norm,
            output,
            layers,
            weight_bytes_per_token: bytes,
            batch: std::sync::Mutex::new(None),
        })
    }

    /// The state a sequence keeps: K/V per layer, sliding layers in a ring.
    pub fn state_layout(&self) -> StateLayout {
        let c = &self.cfg;
        StateLayout::new(
            c.layers
                .iter()
                .map(|l| LayerState::kv(c.n_head_kv, c.head_dim_k, c.head_dim_v, l.window))
                .collect(),
        )
    }

    /// A fresh sequence state.
    pub fn new_state(
        &self,
        n_ctx: usize,
        max_batch: usize,
        kv_type: KvType,
    ) -> Result<ForwardState<B>> {
        let kv = alloc_kv(
            &*self.backend,
            &self.state_layout(),
            n_ctx,
            max_batch,
            kv_type,
        )?;
        Ok(self.state_with_kv(kv, n_ctx, max_batch))
    }

    /// A sequence state around an existing cache (made for the same `n_ctx`/`max_batch`).
    pub fn state_with_kv(&self, kv: B::Kv, n_ctx: usize, max_batch: usize) -> ForwardState<B> {
        let be = &*self.backend;
        let c = &self.cfg;
        let nb = max_batch;
        ForwardState {
            kv,
            n_ctx,
            max_batch,
            b: Bufs::new(be, c, nb),
            id: StepCtl::new().key,
            prepare_ahead: true,
        }
    }

    /// Run `tokens` at `positions` (≤ `max_batch` of them) through the model, appending their K/V
    /// to the cache, and return the logits of rows `logits_from..` (row-major `[rows, n_vocab]`).
    /// All positions below `positions[0]` must already be in the cache.
    pub fn forward(
        &self,
        st: &mut ForwardState<B>,
        tokens: &[u32],
        positions: &[u32],
        logits_from: usize,
    ) -> Result<Vec<f32>> {
        let rows = self.run(st, tokens, positions, logits_from)?;
        let mut out = vec![0f32; rows * self.cfg.n_vocab];
        if rows > 0 {
            self.backend.read(&st.b.logits, &mut out);
        }
        Ok(out)
    }

    /// [`Self::forward`] returning only the argmax token of each logits row (lowest index on
    /// ties): a GPU backend computes it on the device and copies back only the ids.
    pub fn forward_argmax(
        &self,
        st: &mut ForwardState<B>,
        tokens: &[u32],
        positions: &[u32],
        logits_from: usize,
    ) -> Result<Vec<u32>> {
        let rows = self.run(st, tokens, positions, logits_from)?;
        Ok(self
            .backend
            .argmax_rows(&st.b.logits, rows, self.cfg.n_vocab))
    }

    /// [`Self::forward`] returning each logits row's `k` best tokens and statistics
    /// ([`Backend::top_k_rows`]: selected on the device by a GPU) and, only for the rows where
    /// `need_row` asks for it, the row itself.
    pub fn forward_top_k(
        &self,
        st: &mut ForwardState<B>,
        tokens: &[u32],
        positions: &[u32],
        logits_from: usize,
        k: usize,
        need_row: &dyn Fn(&vela_compute::TopK) -> bool,
    ) -> Result<Vec<(vela_compute::TopK, Option<Vec<f32>>)>> {
        let rows = self.run(st, tokens, positions, logits_from)?;
        Ok(select_top_k(
            &*self.backend,
            &st.b.logits,
            rows,
            self.cfg.n_vocab,
            k,
            need_row,
        ))
    }

    /// The forward pass up to the logits in `st.b.logits`; returns their number of rows
    /// (single-token steps recorded and prepared ahead: [`crate::stepper::run`]).
    fn run(
        &self,
        st: &mut ForwardState<B>,
        tokens: &[u32],
        positions: &[u32],
        logits_from: usize,
    ) -> Result<usize> {
        let nv = self.cfg.n_vocab;
        let layers =
            |st: &mut ForwardState<B>, t: &[u32], p: &[u32], lf: usize| self.layers(st, t, p, lf);
        stepper::run(
            &*self.backend,
            st,
            tokens,
            positions,
            logits_from,
            nv,
            true,
            &layers,
        )
    }

    /// Pipelined greedy decoding ([`crate::stepper::argmax_start`]): the one-token step of
    /// `token` at `pos` (`None`: the token the previous step left on the device) with its argmax,
    /// not waited for. Returns the ticket for [`Self::argmax_finish`], or `None` when the backend
    /// cannot (nothing was run; use [`Self::forward_argmax`]).
    pub fn argmax_start(
        &self,
        st: &mut ForwardState<B>,
        token: Option<u32>,
        pos: u32,
    ) -> Result<Option<u64>> {
        let nv = self.cfg.n_vocab;
        let layers =
            |st: &mut ForwardState<B>, t: &[u32], p: &[u32], lf: usize| self.layers(st, t, p, lf);
        stepper::argmax_start(&*self.backend, st, token, pos, nv, true, &layers)
    }

    /// The token of an [`Self::argmax_start`] ticket (waits for its step).
    pub fn argmax_finish(&self, ticket: u64) -> Result<u32> {
        self.backend.argmax_finish(ticket)
    }

    /// The forward pass between a step's begin and end (see [`Self::run`]).
    fn layers(
        &self,
        st: &mut ForwardState<B>,
        tokens: &[u32],
        positions: &[u32],
        logits_from: usize,
    ) -> Result<usize> {
        let be = &*self.backend;
        let c = &self.cfg;
        let n = tokens.len();
        let kv = &mut st.kv;
        self.pass(&mut st.b, tokens, &mut |b, il| {
            self.rope_store(il, &mut b.q, &mut b.k, &mut b.v, kv, positions);
            // The last layer past its K/V serves only the rows whose logits are returned: the
            // others are dropped (llama.cpp does the same), and those rows take the backend's
            // precise products up to the head (`Backend::precise_products`).
            let (mut rows, mut swapped, mut pos) = (n, false, positions);
            if il + 1 == self.layers.len() {
                if logits_from == n {
                    return Ok(Attended {
                        rows: 0,
                        swap_qa: false,
                        swap_xh: false,
                    });
                }
                if logits_from > 0 {
                    // q's rows go to `a` (both hold the larger head dim's width).
                    rows = n - logits_from;
                    be.copy_rows(
                        &b.q,
                        logits_from,
                        rows,
                        c.n_head * c.head_dim_k,
                        &mut b.a,
                        0,
                    );
                    std::mem::swap(&mut b.q, &mut b.a);
                    // (x already holds the previous layer's output: the Q/K/V op added it.)
                    be.copy_rows(&b.x, logits_from, rows, c.n_embd, &mut b.h, 0);
                    std::mem::swap(&mut b.x, &mut b.h);
                    swapped = true;
                    pos = &positions[logits_from..];
                }
                be.precise_products(true);
            }
            let l = &self.layers[il];
            let ap = self.attn_params(il);
            be.attention_matmul(&b.q, kv, il, pos, &ap, &mut b.a, &l.wo, &mut b.o);
            Ok(Attended {
                rows,
                swap_qa: swapped,
                swap_xh: swapped,
            })
        })
    }

    /// RoPE of layer `il`'s q and k rows (after their per-head norms, when the model has them)
    /// and the store of k and v into the cache at `positions`.
    #[allow(clippy::too_many_arguments)]
    fn rope_store(
        &self,
        il: usize,
        q: &mut B::Buf,
        k: &mut B::Buf,
        v: &mut B::Buf,
        kv: &mut B::Kv,
        positions: &[u32],
    ) {
        let be = &*self.backend;
        let c = &self.cfg;
        let (l, lc) = (&self.layers[il], &c.layers[il]);
        let (heads, dim) = (c.n_head, c.head_dim_k);
        match (&l.q_norm, &l.k_norm) {
            (Some(qn), Some(kn)) => be.norm_rope_qk_store(
                q,
                k,
                v,
                kv,
                il,
                heads,
                c.n_head_kv,
                dim,
                positions,
                &lc.rope,
                (qn, kn, c.rms_eps),
                None,
            ),
            _ => be.rope_qk_store(
                q,
                k,
                v,
                kv,
                il,
                heads,
                c.n_head_kv,
                dim,
                positions,
                &lc.rope,
            ),
        }
    }

    /// The attention geometry of layer `il`.
    fn attn_params(&self, il: usize) -> AttnParams {
        let c = &self.cfg;
        AttnParams {
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            head_dim_k: c.head_dim_k,
            head_dim_v: c.head_dim_v,
            scale: c.attn_scale,
            window: c.layers[il].window,
            softcap: c.attn_softcap,
        }
    }

    /// The layers and the head over `tokens` in `b`, with each layer's attention part (RoPE,
    /// K/V store, attention and its output projection into `b.o`) left to `attend`; returns
    /// the number of logits rows in `b.logits`.
    pub(crate) fn pass(
        &self,
        b: &mut Bufs<B>,
        tokens: &[u32],
        attend: &mut dyn FnMut(&mut Bufs<B>, usize) -> Result<Attended>,
    ) -> Result<usize> {
        let mut n = tokens.len();
        let be = &*self.backend;
        let c = &self.cfg;
        let d = c.n_embd;
        // Whether the last layer moved the logits rows to the front (and swapped buffers).
        let (mut swap_qa, mut swap_xh) = (false, false);
        be.get_rows(&self.embd, tokens, c.embed_scale, &mut b.x)?;
        for (il, l) in self.layers.iter().enumerate() {
            // The previous layer's FFN output is added here (after its post-FFN norm, Gemma),
            // fused with the norm (and, on a GPU, with the activation quantization of the Q/K/V
            // products); then the biases (Qwen2), which a backend may add in the products.
            let biases = [l.bq.as_ref(), l.bk.as_ref(), l.bv.as_ref()];
            let mut qkv = [&mut b.q, &mut b.k, &mut b.v];
            let prev_post = il
                .checked_sub(1)
                .map(|p| self.layers[p].post_ffn_norm.as_ref());
            match prev_post {
                Some(Some(pn)) => be.post_norm_matmul_many(
                    &mut b.x,
                    &mut b.o,
                    pn,
                    1.0,
                    &l.attn_norm,
                    n,
                    d,
                    c.rms_eps,
                    &mut b.h,
                    &[&l.wq, &l.wk, &l.wv],
                    &biases,
                    &mut qkv,
                ),
                _ => be.norm_matmul_many(
                    &mut b.x,
                    (il > 0).then_some(&b.o),
                    &l.attn_norm,
                    n,
                    d,
                    c.rms_eps,
                    &mut b.h,
                    &[&l.wq, &l.wk, &l.wv],
                    &biases,
                    &mut qkv,
                ),
            }
            let att = attend(b, il);
            let att = match att {
                Ok(a) => a,
                Err(e) => {
                    be.precise_products(false);
                    return Err(e);
                }
            };
            swap_qa |= att.swap_qa;
            swap_xh |= att.swap_xh;
            n = att.rows;
            if n == 0 {
                return Ok(0);
            }
            // The attention output is added to x here (after its post-attention norm, Gemma).
            let mut gu = [&mut b.g, &mut b.u];
            match &l.post_attn_norm {
                Some(pn) => be.post_norm_matmul_many(
                    &mut b.x,
                    &mut b.o,
                    pn,
                    1.0,
                    &l.ffn_norm,
                    n,
                    d,
                    c.rms_eps,
                    &mut b.h,
                    &[&l.w_gate, &l.w_up],
                    &[],
                    &mut gu,
                ),
                None => be.norm_matmul_many(
                    &mut b.x,
                    Some(&b.o),
                    &l.ffn_norm,
                    n,
                    d,
                    c.rms_eps,
                    &mut b.h,
                    &[&l.w_gate, &l.w_up],
                    &[],
                    &mut gu,
                ),
            }
            be.act_mul_matmul(&mut b.g, &b.u, n, c.n_ff, c.act, &l.w_down, &mut b.o);
        }
        // The last layer's post-FFN norm (the others' are applied where the next layer adds
        // the output).
        if let Some(pn) = self.layers.last().and_then(|l| l.post_ffn_norm.as_ref()) {
            be.rms_norm_inplace(&mut b.o, pn, n, d, c.rms_eps);
        }
        // The last layer's FFN output (the others were added by the next layer's first op).
        // Rows 0..n of x are now the logits rows.
        be.add(&mut b.x, &b.o, n * d);
        be.precise_products(false);
        be.rms_norm(&b.x, &self.output_norm, n, d, c.rms_eps, &mut b.h);
        let head = self.output.as_ref().unwrap_or(&self.embd);
        crate::stepper::logits_room(be, &mut b.logits, &mut b.logits_rows, n, c.n_vocab);
        be.matmul(head, &b.h, n, &mut b.logits);
        if let Some(cap) = c.final_softcap {
            be.softcap(&mut b.logits, n * c.n_vocab, cap);
        }
        // Each buffer back to its own allocation (their sizes may differ).
        if swap_qa {
            std::mem::swap(&mut b.q, &mut b.a);
        }
        if swap_xh {
            std::mem::swap(&mut b.x, &mut b.h);
        }
        Ok(n)
    }
}

impl<B: Backend> StepState<B> for ForwardState<B> {
    fn ctl(&self) -> StepCtl {
        StepCtl {
            key: self.id,
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
        &self.b.logits
    }
}

impl<B: Backend + 'static> crate::lm::CausalLm for DecoderModel<B> {
    type Be = B;
    type State = ForwardState<B>;
    fn arch(&self) -> &str {
        &self.cfg.arch
    }
    fn backend(&self) -> &Arc<B> {
        &self.backend
    }
    fn n_vocab(&self) -> usize {
        self.cfg.n_vocab
    }
    fn n_ctx_train(&self) -> usize {
        self.cfg.n_ctx_train
    }
    fn weight_bytes_per_token(&self) -> u64 {
        self.weight_bytes_per_token
    }
    fn state_layout(&self) -> StateLayout {
        DecoderModel::state_layout(self)
    }
    fn state_with(
        &self,
        kv: B::Kv,
        extra: ExtraState<B>,
        n_ctx: usize,
        max_batch: usize,
    ) -> Result<ForwardState<B>> {
        debug_assert!(extra.is_empty(), "this model declares K/V layers only");
        Ok(DecoderModel::state_with_kv(self, kv, n_ctx, max_batch))
    }
    fn kv(st: &ForwardState<B>) -> &B::Kv {
        &st.kv
    }
    fn kv_mut(st: &mut ForwardState<B>) -> &mut B::Kv {
        &mut st.kv
    }
    fn run(
        &self,
        st: &mut ForwardState<B>,
        tokens: &[u32],
        positions: &[u32],
        logits_from: usize,
    ) -> Result<usize> {
        DecoderModel::run(self, st, tokens, positions, logits_from)
    }
    fn argmax_start(
        &self,
        st: &mut ForwardState<B>,
        token: Option<u32>,
        pos: u32,
    ) -> Result<Option<u64>> {
        DecoderModel::argmax_start(self, st, token, pos)
    }
    fn argmax_finish(&self, ticket: u64) -> Result<u32> {
        DecoderModel::argmax_finish(self, ticket)
    }
    fn forward_batch(
        &self,
        items: &mut [crate::lm::BatchItem<'_, ForwardState<B>>],
    ) -> Result<Vec<Selected>> {
        DecoderModel::forward_batch(self, items)
    }
}
