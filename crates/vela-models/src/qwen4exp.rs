//! Qwen3.8 Flash Next (`qwen4_exp`, text), read side by side with transformers 5.23
//! `models/qwen4_exp/modeling_qwen4_exp.py`; docs/qwen4exp-spec.md spells out every step with
//! HF's line numbers:
//!
//! ```text
//! X = E[ids] repeated into S streams                                [n, S·H]
//! for each layer:
//!     [PLE layer] X += ngram_injection(X, ids)
//!     m, inj = HC_attn(X);  y = GDN(m) or QSA(m);  X_s += inj_s · y   (every stream s)
//!     m, inj = HC_mlp(X);   y = MoE(m);            X_s += inj_s · y
//! logits = lm_head(Mixer(X))
//! HC(X): Xn = rms1p_per_stream(X); a = σ(up(silu(down(Xn)/S))); m = mean_s(a ⊙ Xn);
//!        inj = 2σ(inject(Xn)/S)
//! ```
//!
//! State per sequence ([`StateLayout`]): per GDN layer its convolution tail and its delta-rule
//! matrix (recurrent), plus the n-gram injection's convolution tail on PLE layers; per QSA layer
//! its K and V rows and the indexer's pooled block keys with the raw keys of the open block.
//! The recurrent parts keep the state after each of the last [`SNAPSHOTS`] positions, so that
//! as many trailing positions can be dropped without a checkpoint (speculative verification, a
//! follow-up turn that re-renders the end of the previous answer). The n-gram ids need the
//! token history: kept on the host by position.

use crate::state::{alloc_kv, ExtraState, LayerState, StateLayout};
use crate::stepper::{self, StepCtl, StepState};
use anyhow::{bail, Result};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use vela_compute::{
    Activation, Backend, DeltaDims, IndexerParams, KvType, RopeParams, RouteParams, Score,
};

mod config;
mod gguf;
mod load;
mod mtp;
pub mod ple;
pub mod synth;
pub mod synth_gguf;

pub use config::{Mixer, PleConfig, Qwen4ExpConfig};

/// A GatedResidual hyper-connection (with `inject` for the blocks; the final mixer has none).
struct Hc<B: Backend> {
    /// `1 + hc_norm.weight`, `[S·H]`.
    norm: B::Vector,
    down: B::Weight,
    up: B::Weight,
    inject: Option<B::Weight>,
}

struct Gdn<B: Backend> {
    qkv: B::Weight,
    z: B::Weight,
    b: B::Weight,
    a: B::Weight,
    /// `[C, K]` depthwise kernel.
    conv: B::Vector,
    dt_bias: B::Vector,
    /// −exp(A_log).
    neg_a: B::Vector,
    /// Plain-weight RMSNorm over each value head.
    norm: B::Vector,
    out: B::Weight,
}

struct Qsa<B: Backend> {
    /// The query rows and the gate rows of `q_proj`, separated (HF interleaves them per head).
    wq: B::Weight,
    wgate: B::Weight,
    wk: B::Weight,
    wv: B::Weight,
    wo: B::Weight,
    q_norm: B::Vector,
    k_norm: B::Vector,
    idx_q: B::Weight,
    idx_k: B::Weight,
    idx_q_norm: B::Vector,
    idx_k_norm: B::Vector,
}

struct Moe<B: Backend> {
    router: B::Weight,
    experts: crate::blocks::experts::Experts<B>,
    sh_gate: B::Weight,
    sh_up: B::Weight,
    sh_down: B::Weight,
    /// `shared_expert_gate`, `[1, H]`.
    sh_scale: B::Weight,
}

struct Ple<B: Backend> {
    table: ple::NgramTable,
    key: B::Weight,
    value: B::Weight,
    norm_key: B::Vector,
    norm_query: B::Vector,
    norm_conv: B::Vector,
    conv: B::Vector,
}

enum Block<B: Backend> {
    Gdn(Gdn<B>),
    Qsa(Qsa<B>),
}

struct Layer<B: Backend> {
    attn_hc: Hc<B>,
    mlp_hc: Hc<B>,
    mixer: Block<B>,
    moe: Moe<B>,
    ple: Option<Ple<B>>,
    /// Indices of this layer's entries in the state layout.
    state: Vec<usize>,
}

/// A loaded model.
pub struct Qwen4ExpModel<B: Backend> {
    pub backend: Arc<B>,
    pub cfg: Qwen4ExpConfig,
    embd: B::Weight,
    head: B::Weight,
    mixer: Hc<B>,
    layers: Vec<Layer<B>>,
    /// The MTP layer, when the checkpoint has one (`mtp.*`).
    mtp: Option<mtp::Mtp<B>>,
    /// Set once a drafter is bound to the model: forwards then keep the MTP layer's cache.
    mtp_on: AtomicBool,
    /// The checkpoint directory the model (and its MTP layer) came from.
    source: Option<PathBuf>,
    layout: StateLayout,
    weight_bytes_per_token: u64,
    /// The RoPE frequency factors, one vector for the model's life (a backend keeps its device
    /// copy by this vector).
    rope_factors: Option<Arc<Vec<f32>>>,
}

/// One sequence: scratch buffers, the recurrent/block state, the token history.
pub struct Qwen4ExpState<B: Backend> {
    kv: B::Kv,
    extra: ExtraState<B>,
    n_ctx: usize,
    max_batch: usize,
    bufs: Vec<B::Buf>,
    /// Rows `bufs[LOGITS]` holds ([`crate::stepper::logits_room`]).
    logits_rows: usize,
    experts: crate::blocks::experts::ExpertScratch<B>,
    sel: B::Ids,
    /// `t` for row `t·S + s` (the embedding gathered into every stream), and zeros `[nb, S·H]`.
    stream_rows: B::Ids,
    zeros: B::Buf,
    counts: B::Ids,
    /// `[max_batch, S·H]`: the MTP layer's input streams (models with an MTP layer).
    mtp_in: Option<B::Buf>,
    /// Per PLE layer, `[max_batch, D]`: the n-gram rows gathered on the host (only that layer's
    /// injection reads them, so a recorded step may upload them ahead of its launches).
    ple_in: Vec<B::Buf>,
    /// Token at each position (the n-gram hash reads predecessors).
    history: Vec<u32>,
    key: u64,
    /// When set, every QSA layer's selection is read back: (layer, position, positions).
    pub selections: Option<Vec<(usize, u32, Vec<u32>)>>,
}

/// Per-position snapshots of every recurrent state (the rollback limit without a checkpoint).
pub const SNAPSHOTS: usize = 4;

/// [`crate::state::segments`] with this model's [`SNAPSHOTS`].
fn segments<B: Backend>(
    be: &B,
    extra: &mut ExtraState<B>,
    ent: usize,
    k: usize,
    n: usize,
    step: &mut dyn FnMut(usize, usize, &mut B::Buf),
) -> Result<()> {
    crate::state::segments(be, extra, (ent, SNAPSHOTS), k, n, step)
}

// Scratch buffer indices.
const X: usize = 0; // [n, S·H] residual streams
const XN: usize = 1; // [n, S·H] normalised streams
const A: usize = 2; // [n, S·H] mix weights
const M: usize = 3; // [n, H] block input
const Y: usize = 4; // [n, max(H, …)] block output
const T1: usize = 5; // scratch
const T2: usize = 6;
const T3: usize = 7;
const T4: usize = 8;
const INJ: usize = 9; // [n, S]
const LOW: usize = 10; // [n, R]
const LOGITS: usize = 11;
const N_BUFS: usize = 12;

fn pick2<T>(v: &mut [T], a: usize, b: usize) -> [&mut T; 2] {
    v.get_disjoint_mut([a, b]).expect("distinct buffers")
}

fn pick3<T>(v: &mut [T], a: usize, b: usize, c: usize) -> [&mut T; 3] {
    v.get_disjoint_mut([a, b, c]).expect("distinct buffers")
}

impl<B: Backend> Qwen4ExpModel<B> {
    fn rope(&self) -> RopeParams {
        RopeParams {
            n_rot: self.cfg.n_rot,
            freq_base: self.cfg.rope_theta,
            freq_scale: 1.0,
            neox: true,
            freq_factors: self.rope_factors.clone(),
        }
    }

    fn idx_params(&self) -> IndexerParams {
        let c = &self.cfg;
        IndexerParams {
            n_head: c.idx_heads,
            head_dim: c.idx_dim,
            block: c.idx_block,
            max_blocks: c.idx_blocks,
        }
    }

    /// The state layout and each layer's entries in it; with `mtp`, the MTP layer's entries
    /// last (its QSA rows, then the target's pre-mixer streams after each position).
    fn build_layout(cfg: &Qwen4ExpConfig, mtp: bool) -> (StateLayout, Vec<Vec<usize>>) {
        let recurrent = |floats| LayerState::Recurrent {
            floats,
            snapshots: SNAPSHOTS,
        };
        let qsa = || {
            let rows = LayerState::Blocks {
                width: cfg.n_head_kv * cfg.head_dim,
                ratio: 1,
                raw_width: 0,
            };
            let idx = LayerState::Blocks {
                width: cfg.idx_dim,
                ratio: cfg.idx_block,
                raw_width: cfg.idx_dim,
            };
            vec![rows.clone(), rows, idx]
        };
        let mut entries = Vec::new();
        let mut per_layer = Vec::new();
        let push = |states: Vec<LayerState>, entries: &mut Vec<LayerState>| {
            let first = entries.len();
            entries.extend(states);
            (first..entries.len()).collect::<Vec<usize>>()
        };
        for (il, m) in cfg.mixers.iter().enumerate() {
            let mut states = match m {
                Mixer::Gdn => vec![
                    recurrent((cfg.conv_k - 1) * cfg.qkv_width()),
                    recurrent(cfg.n_v * cfg.dk * cfg.dv),
                ],
                Mixer::Qsa => qsa(),
            };
            if let Some(p) = cfg.ple.as_ref().filter(|p| p.layers.contains(&il)) {
                states.push(recurrent(
                    (p.conv_k - 1) * p.ngram * cfg.streams * cfg.hidden,
                ));
            }
            per_layer.push(push(states, &mut entries));
        }
        if mtp {
            let mut states = qsa();
            states.push(recurrent(cfg.streams * cfg.hidden));
            per_layer.push(push(states, &mut entries));
        }
        (StateLayout::new(entries), per_layer)
    }

    fn new_state(
        &self,
        kv: B::Kv,
        extra: ExtraState<B>,
        n_ctx: usize,
        max_batch: usize,
    ) -> Qwen4ExpState<B> {
        let be = &*self.backend;
        let c = &self.cfg;
        let (s, h, nb) = (c.streams, c.hidden, max_batch);
        let wide = [
            s * h,
            c.qkv_width(),
            c.n_v * c.dv,
            2 * c.n_head * c.head_dim,
            (c.idx_heads + 1) * c.idx_dim,
            c.n_expert,
            c.n_ff_shared * 2,
            c.ple.as_ref().map_or(0, |p| p.dim.max(s * h)),
            c.idx_block * c.idx_dim,
        ]
        .into_iter()
        .max()
        .unwrap_or(0);
        // A and XN also hold a block's raw indexer keys and their mean during the mixer, and A
        // the GDN decay.
        let sizes = [
            nb * s * h,
            (nb * s * h).max(c.idx_dim),
            (nb * s * h).max(c.idx_block * c.idx_dim).max(nb * c.n_v),
            nb * h,
            nb * wide.max(h),
            nb * wide,
            nb * wide,
            nb * wide,
            nb * wide,
            nb * s.max(c.n_v),
            nb * c.lowrank.max(c.n_v),
            c.n_vocab, // one row, grown by need (`logits_rows`)
        ];
        debug_assert_eq!(sizes.len(), N_BUFS);
        let p = self.idx_params();
        Qwen4ExpState {
            kv,
            extra,
            n_ctx,
            max_batch,
            bufs: sizes.iter().map(|&n| be.alloc(n.max(1))).collect(),
            logits_rows: 1,
            experts: crate::blocks::experts::ExpertScratch::new(be, c.top_k, c.n_ff_exp, h, nb),
            sel: be.alloc_ids(nb * p.max_selected()),
            stream_rows: {
                let mut ids = be.alloc_ids(nb * s);
                let rows: Vec<u32> = (0..nb * s).map(|r| (r / s) as u32).collect();
                be.write_ids(&mut ids, &rows);
                ids
            },
            zeros: {
                let mut z = be.alloc(nb * s * h);
                be.write(&mut z, &vec![0f32; nb * s * h]);
                z
            },
            counts: be.alloc_ids(nb),
            mtp_in: self.mtp.as_ref().map(|_| be.alloc(nb * s * h)),
            ple_in: self
                .layers
                .iter()
                .filter(|l| l.ple.is_some())
                .map(|_| be.alloc(nb * c.ple.as_ref().map_or(1, |p| p.dim)))
                .collect(),
            history: vec![0; n_ctx],
            key: StepCtl::new().key,
            selections: None,
        }
    }

    /// HC: `XN` = normalised streams, `M` = block input, `INJ` = injection weights (when the
    /// module has them).
    fn hc(&self, b: &mut [B::Buf], hc: &Hc<B>, n: usize) {
        let be = &*self.backend;
        let c = &self.cfg;
        let (s, h, r) = (c.streams, c.hidden, c.lowrank);
        let inv_s = 1.0 / s as f32;
        {
            let [x, xn] = pick2(b, X, XN);
            be.rms_norm_grouped(x, &hc.norm, n * s, h, s, c.eps, xn);
        }
        {
            // down and inject read the same normalised streams (one activation quantization).
            let [xn, low, w] = pick3(b, XN, LOW, INJ);
            match &hc.inject {
                Some(inj) => be.matmul_many(&[&hc.down, inj], xn, n, &mut [low, w]),
                None => be.matmul(&hc.down, xn, n, low),
            }
            be.silu_scaled(low, n * r, inv_s);
        }
        {
            let [low, a] = pick2(b, LOW, A);
            be.matmul(&hc.up, low, n, a);
        }
        {
            let [a, xn, m] = pick3(b, A, XN, M);
            be.sigmoid_mix_streams(a, xn, n, s, h, m);
        }
        if hc.inject.is_some() {
            be.sigmoid_scaled(&mut b[INJ], n * s, inv_s, 2.0);
        }
    }

    /// The layers and the head (see the module docs).
    fn layers(
        &self,
        st: &mut Qwen4ExpState<B>,
        tokens: &[u32],
        positions: &[u32],
        logits_from: usize,
    ) -> Result<usize> {
        let be = &*self.backend;
        let c = &self.cfg;
        let n = tokens.len();
        let (s, h) = (c.streams, c.hidden);
        let p0 = positions[0] as usize;
        if positions
            .iter()
            .enumerate()
            .any(|(i, &p)| p as usize != p0 + i)
        {
            bail!("qwen4_exp: a batch's positions must be consecutive");
        }
        for (i, &t) in tokens.iter().enumerate() {
            st.history[p0 + i] = t;
        }
        st.extra.begin(be, p0);
        // The embedding into every stream.
        be.get_rows(&self.embd, tokens, 1.0, &mut st.bufs[M])?;
        {
            // Every stream starts as the embedding: row t·S + s of X = row t.
            let [m, x] = pick2(&mut st.bufs, M, X);
            be.gather_rows(m, &st.stream_rows, n * s, h, x);
        }
        for (il, l) in self.layers.iter().enumerate() {
            self.layer(st, l, il, tokens, positions)?;
        }
        let mtp = self.active_mtp();
        if let Some(mt) = mtp {
            self.mtp_stage(st, mt, p0, n)?;
        }
        let rows = n - logits_from;
        if rows > 0 {
            self.hc(&mut st.bufs, &self.mixer, n);
            let nv = self.cfg.n_vocab;
            crate::stepper::logits_room(be, &mut st.bufs[LOGITS], &mut st.logits_rows, rows, nv);
            let b = &mut st.bufs;
            {
                let [m, t1] = pick2(b, M, T1);
                be.copy_rows(m, logits_from, rows, h, t1, 0);
            }
            let [t1, lg] = pick2(b, T1, LOGITS);
            be.matmul(&self.head, t1, rows, lg);
        }
        if let Some(mt) = mtp {
            self.mtp_cache(st, mt, tokens, p0)?;
        }
        Ok(rows)
    }

    /// One decoder layer on the streams `X` of `tokens` at `positions` (`il`: its index, for
    /// the recorded selections).
    fn layer(
        &self,
        st: &mut Qwen4ExpState<B>,
        l: &Layer<B>,
        il: usize,
        tokens: &[u32],
        positions: &[u32],
    ) -> Result<()> {
        let be = &*self.backend;
        let (n, s, h) = (tokens.len(), self.cfg.streams, self.cfg.hidden);
        let p0 = positions[0] as usize;
        if let Some(p) = &l.ple {
            self.ple(st, l, p, tokens, p0)?;
        }
        self.hc(&mut st.bufs, &l.attn_hc, n);
        match &l.mixer {
            Block::Gdn(g) => self.gdn(st, g, &l.state, p0, n)?,
            Block::Qsa(q) => {
                self.qsa(st, q, &l.state, positions)?;
                self.record_selection(st, il, positions);
            }
        }
        {
            let [x, w, y] = pick3(&mut st.bufs, X, INJ, Y);
            be.inject_streams(x, w, y, n, s, h);
        }
        self.hc(&mut st.bufs, &l.mlp_hc, n);
        self.moe(st, &l.moe, n);
        let [x, w, y] = pick3(&mut st.bufs, X, INJ, Y);
        be.inject_streams(x, w, y, n, s, h);
        Ok(())
    }

    /// Gated DeltaNet on `M` → `Y` (§5).
    fn gdn(
        &self,
        st: &mut Qwen4ExpState<B>,
        g: &Gdn<B>,
        ent: &[usize],
        p0: usize,
        n: usize,
    ) -> Result<()> {
        let be = &*self.backend;
        let c = &self.cfg;
        let (cw, hv, dv) = (c.qkv_width(), c.n_v, c.dv);
        let b = &mut st.bufs;
        {
            // The four input products at once (one activation quantization): qkv in T1, z in
            // Y (free until the output product), b in LOW, a in A (free during the mixer; INJ
            // holds the injection weights).
            let [m, t1, y, lo, ga] = b.get_disjoint_mut([M, T1, Y, LOW, A]).expect("distinct");
            be.matmul_many(&[&g.qkv, &g.z, &g.b, &g.a], m, n, &mut [t1, y, lo, ga]);
            // β = σ(b), g = −exp(A_log)·softplus(a + dt_bias).
            be.delta_gates(lo, ga, &g.dt_bias, &g.neg_a, n, hv);
        }
        {
            let [t1, t2] = pick2(b, T1, T2);
            segments(be, &mut st.extra, ent[0], p0, n, &mut |from, m, state| {
                be.conv1d_causal(t1, from, m, cw, &g.conv, c.conv_k, 1, true, state, t2)
            })?;
        }
        {
            let [t2, lo, inj, t3] = b.get_disjoint_mut([T2, LOW, A, T3]).expect("distinct");
            segments(be, &mut st.extra, ent[1], p0, n, &mut |from, m, state| {
                let dims = DeltaDims {
                    n: m,
                    n_k: c.n_k,
                    n_v: hv,
                    dk: c.dk,
                    dv,
                    tiled: c.tiled_heads,
                    from,
                };
                be.gated_delta_rule(t2, inj, lo, dims, state, t3)
            })?;
        }
        // y = rms(o)·w ⊙ gate(z), per value head.
        {
            let [t3, t4] = pick2(b, T3, T4);
            be.rms_norm(t3, &g.norm, n * hv, dv, c.eps, t4);
        }
        {
            let [y, t4] = pick2(b, Y, T4);
            if c.gate_sigmoid {
                be.sigmoid_mul(t4, y, n * hv * dv);
            } else {
                be.act_mul(y, t4, n * hv * dv, Activation::Silu);
                be.copy_rows(y, 0, n, hv * dv, t4, 0);
            }
        }
        let [t4, y] = pick2(b, T4, Y);
        be.matmul(&g.out, t4, n, y);
        Ok(())
    }

    /// QSA on `M` → `Y` (§6).
    fn qsa(
        &self,
        st: &mut Qwen4ExpState<B>,
        q: &Qsa<B>,
        ent: &[usize],
        positions: &[u32],
    ) -> Result<()> {
        self.qsa_cache(st, q, ent, positions)?;
        let be = &*self.backend;
        let c = &self.cfg;
        let n = positions.len();
        let (nh, nkv, hd, di) = (c.n_head, c.n_head_kv, c.head_dim, c.idx_dim);
        let rope = self.rope();
        let b = &mut st.bufs;
        // Attention q (T1), gate (T2).
        {
            // Indexer queries in T4; one activation quantization for the three products.
            let [m, t1, t2, t4] = b.get_disjoint_mut([M, T1, T2, T4]).expect("distinct");
            be.matmul_many(&[&q.wq, &q.wgate, &q.idx_q], m, n, &mut [t1, t2, t4]);
            be.rms_norm_inplace(t1, &q.q_norm, n * nh, hd, c.eps);
            be.rope(t1, nh, hd, positions, &rope);
        }
        {
            let t4 = &mut b[T4];
            be.rms_norm_inplace(t4, &q.idx_q_norm, n * c.idx_heads, di, c.eps);
            be.rope(t4, c.idx_heads, di, positions, &rope);
        }
        let p = self.idx_params();
        {
            let blk = st.extra.blocks_mut(ent[2])?;
            be.indexer_select(&b[T4], blk.rows, positions, &p, &mut st.sel, &mut st.counts);
        }
        {
            let (k, v) = (st.extra.block_rows(ent[0])?, st.extra.block_rows(ent[1])?);
            let [t1, t3] = pick2(b, T1, T3);
            let scale = 1.0 / (hd as f32).sqrt();
            be.attention_selected(
                t1,
                k,
                v,
                &st.sel,
                &st.counts,
                n,
                p.max_selected(),
                (nh, nkv, hd),
                scale,
                t3,
            );
        }
        {
            // The output gate σ(gate).
            let [t2, t3] = pick2(b, T2, T3);
            be.sigmoid_mul(t3, t2, n * nh * hd);
        }
        let [t3, y] = pick2(b, T3, Y);
        be.matmul(&q.wo, t3, n, y);
        Ok(())
    }

    /// What a QSA layer keeps of the rows of `M` at `positions`: their K and V rows, their raw
    /// indexer keys, and the pooled keys of the blocks they complete.
    fn qsa_cache(
        &self,
        st: &mut Qwen4ExpState<B>,
        q: &Qsa<B>,
        ent: &[usize],
        positions: &[u32],
    ) -> Result<()> {
        let be = &*self.backend;
        let c = &self.cfg;
        let n = positions.len();
        let (nkv, hd, di, cb) = (c.n_head_kv, c.head_dim, c.idx_dim, c.idx_block);
        let rope = self.rope();
        let b = &mut st.bufs;
        // k (T3), v (T4), the indexer's raw keys (T1); one activation quantization.
        {
            let [m, t1, t3, t4] = b.get_disjoint_mut([M, T1, T3, T4]).expect("distinct");
            be.matmul_many(&[&q.wk, &q.wv, &q.idx_k], m, n, &mut [t3, t4, t1]);
            be.rms_norm_inplace(t3, &q.k_norm, n * nkv, hd, c.eps);
            be.rope(t3, nkv, hd, positions, &rope);
        }
        // K and V rows by position.
        be.store_rows_at(
            &b[T3],
            nkv * hd,
            positions,
            0,
            st.extra.blocks_mut(ent[0])?.rows,
        );
        be.store_rows_at(
            &b[T4],
            nkv * hd,
            positions,
            0,
            st.extra.blocks_mut(ent[1])?.rows,
        );
        // Indexer: raw keys into the ring, pooled keys of the blocks completed here.
        {
            let blk = st.extra.blocks_mut(ent[2])?;
            let slots = blk.raw_slots;
            be.store_rows_at(&b[T1], di, positions, slots, blk.raw);
            // The blocks completed here (scratch: A and XN, free during the mixer).
            let [raw, pooled] = pick2(b, A, XN);
            let norm = (&q.idx_k_norm, c.eps);
            be.pool_blocks(
                blk.raw,
                slots,
                di,
                cb,
                positions,
                norm,
                &rope,
                [raw, pooled],
                blk.rows,
            );
        }
        Ok(())
    }

    /// The last QSA layer's selection to the host, when the state records them (tests).
    fn record_selection(&self, st: &mut Qwen4ExpState<B>, layer: usize, positions: &[u32]) {
        let Some(rec) = st.selections.as_mut() else {
            return;
        };
        let be = &*self.backend;
        let (n, w) = (positions.len(), self.idx_params().max_selected());
        let (mut sel, mut counts) = (vec![0u32; n * w], vec![0u32; n]);
        be.read_ids(&st.sel, &mut sel);
        be.read_ids(&st.counts, &mut counts);
        for (t, &p) in positions.iter().enumerate() {
            rec.push((layer, p, sel[t * w..t * w + counts[t] as usize].to_vec()));
        }
    }

    /// MoE on `M` → `Y` (§7).
    fn moe(&self, st: &mut Qwen4ExpState<B>, m: &Moe<B>, n: usize) {
        let be = &*self.backend;
        let c = &self.cfg;
        let h = c.hidden;
        let b = &mut st.bufs;
        let rp = RouteParams {
            n_expert: c.n_expert,
            k: c.top_k,
            score: Score::Softmax,
            n_group: 1,
            topk_group: 1,
            renorm: c.norm_topk,
            scale: 1.0,
        };
        let f = c.n_ff_shared;
        {
            // The router and the shared expert's gate, up and scale products at once (one
            // activation quantization): router logits in T1, gate T2, up T3, scale T4.
            let [mm, t1, t2, t3, t4] = b.get_disjoint_mut([M, T1, T2, T3, T4]).expect("distinct");
            let ws = [&m.router, &m.sh_gate, &m.sh_up, &m.sh_scale];
            be.matmul_many(&ws, mm, n, &mut [t1, t2, t3, t4]);
            st.experts.route(be, t1, n, &rp, None, None);
        }
        {
            let [mm, y] = pick2(b, M, Y);
            be.copy_rows(mm, 0, n, h, y, 0);
            m.experts.forward(be, y, n, h, &mut st.experts);
        }
        // Shared expert, gated by σ(m·w).
        {
            let [t2, t3, t1] = pick3(b, T2, T3, T1);
            be.act_mul_matmul(t2, t3, n, f, Activation::Silu, &m.sh_down, t1);
        }
        be.sigmoid(&mut b[T4], n);
        let [y, t4, t1] = pick3(b, Y, T4, T1);
        be.inject_streams(y, t4, t1, n, 1, h);
    }

    /// Which of the PLE layers `l` is (its `ple_in` buffer).
    fn ple_index(&self, l: &Layer<B>) -> usize {
        self.layers
            .iter()
            .filter(|x| x.ple.is_some())
            .position(|x| std::ptr::eq(x, l))
            .expect("a PLE layer")
    }

    /// Whether a one-token step runs the same launches at every position, reading its token and
    /// position on the device (`stepper`): the QSA stores and selection take the positions on
    /// the device, the recurrent states cycle through their snapshot slots (a few distinct
    /// steps), and the n-gram rows are gathered on the host from the token (`host_token`: the
    /// step's token is known there, not left on the device by the previous step) and uploaded
    /// ahead of the step. The MTP layer's cache is written by position on the host: not with it.
    /// Nor with routed experts in host memory (read back mid-step).
    fn graph_safe(&self, host_token: bool) -> bool {
        self.active_mtp().is_none()
            && (host_token || self.cfg.ple.is_none())
            && !self.layers.iter().any(|l| l.moe.experts.on_host())
    }

    /// The n-gram injection into `X` (§4.3).
    fn ple(
        &self,
        st: &mut Qwen4ExpState<B>,
        l: &Layer<B>,
        p: &Ple<B>,
        tokens: &[u32],
        p0: usize,
    ) -> Result<()> {
        let be = &*self.backend;
        let c = &self.cfg;
        let pc = c.ple.as_ref().expect("PLE layers have a PLE config");
        let (n, s, h, d) = (tokens.len(), c.streams, c.hidden, pc.dim);
        let w = p.table.width;
        // e [n, D] gathered on the host.
        let mut e = vec![0f32; n * d];
        let mut ids = Vec::new();
        for t in 0..n {
            p.table.row_ids(&st.history, p0 + t, pc.eos, &mut ids);
            for (j, &r) in ids.iter().enumerate() {
                p.table.row(r, &mut e[t * d + j * w..t * d + (j + 1) * w])?;
            }
        }
        let ple_in = &mut st.ple_in[self.ple_index(l)];
        be.write_step_input(ple_in, &e);
        let b = &mut st.bufs;
        // key [n, S·H] (T2), val [n, H] (T3), query = normalised X (XN).
        {
            let [t2, t4] = pick2(b, T2, T4);
            be.matmul(&p.key, ple_in, n, t4);
            be.rms_norm_grouped(t4, &p.norm_key, n * s, h, s, c.eps, t2);
        }
        be.matmul(&p.value, ple_in, n, &mut b[T3]);
        {
            let [x, xn] = pick2(b, X, XN);
            be.rms_norm_grouped(x, &p.norm_query, n * s, h, s, c.eps, xn);
        }
        {
            let [t2, xn, inj] = pick3(b, T2, XN, INJ);
            be.mul(t2, xn, n * s * h);
            be.sum_rows(t2, n * s, h, inj);
            be.signed_sqrt_gate(inj, n * s, 1.0 / (h as f32).sqrt());
        }
        // gv = σ(g_s)·val per stream (A), gn = norm_conv(gv) (T2), cv = silu(conv(gn)) (T4).
        be.copy_rows(&st.zeros, 0, n, s * h, &mut b[A], 0);
        {
            let [a, inj, t3] = pick3(b, A, INJ, T3);
            be.inject_streams(a, inj, t3, n, s, h);
        }
        {
            let [a, t2] = pick2(b, A, T2);
            be.rms_norm_grouped(a, &p.norm_conv, n * s, h, s, c.eps, t2);
        }
        let ent = *l.state.last().expect("a PLE layer has its conv state");
        {
            let [t2, t4] = pick2(b, T2, T4);
            segments(be, &mut st.extra, ent, p0, n, &mut |from, m, state| {
                let (k, dil) = (pc.conv_k, pc.ngram);
                be.conv1d_causal(t2, from, m, s * h, &p.conv, k, dil, true, state, t4)
            })?;
        }
        let [x, a, t4] = pick3(b, X, A, T4);
        be.add(a, t4, n * s * h);
        be.add(x, a, n * s * h);
        Ok(())
    }
}

impl<B: Backend> StepState<B> for Qwen4ExpState<B> {
    fn ctl(&self) -> StepCtl {
        StepCtl {
            key: self.key,
            prepare_ahead: false,
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

impl<B: Backend + 'static> crate::lm::CausalLm for Qwen4ExpModel<B> {
    type Be = B;
    type State = Qwen4ExpState<B>;
    fn arch(&self) -> &str {
        "qwen4_exp"
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
        self.layout.clone()
    }
    fn state_with(
        &self,
        kv: B::Kv,
        extra: ExtraState<B>,
        n_ctx: usize,
        max_batch: usize,
    ) -> Result<Qwen4ExpState<B>> {
        Ok(self.new_state(kv, extra, n_ctx, max_batch))
    }
    fn fork_state(
        &self,
        st: &Qwen4ExpState<B>,
        kv: B::Kv,
        extra: ExtraState<B>,
        n_ctx: usize,
        max_batch: usize,
    ) -> Result<Qwen4ExpState<B>> {
        let mut s = self.new_state(kv, extra, n_ctx, max_batch);
        s.history.clone_from(&st.history);
        Ok(s)
    }
    fn set_history(&self, st: &mut Qwen4ExpState<B>, tokens: &[u32]) {
        let n = tokens.len().min(st.history.len());
        st.history[..n].copy_from_slice(&tokens[..n]);
    }
    fn kv(st: &Qwen4ExpState<B>) -> &B::Kv {
        &st.kv
    }
    fn kv_mut(st: &mut Qwen4ExpState<B>) -> &mut B::Kv {
        &mut st.kv
    }
    fn extra(st: &Qwen4ExpState<B>) -> Option<&ExtraState<B>> {
        Some(&st.extra)
    }
    fn extra_mut(st: &mut Qwen4ExpState<B>) -> Option<&mut ExtraState<B>> {
        Some(&mut st.extra)
    }
    fn run(
        &self,
        st: &mut Qwen4ExpState<B>,
        tokens: &[u32],
        positions: &[u32],
        logits_from: usize,
    ) -> Result<usize> {
        let layers =
            |st: &mut Qwen4ExpState<B>, t: &[u32], p: &[u32], lf: usize| self.layers(st, t, p, lf);
        stepper::run(
            &*self.backend,
            st,
            tokens,
            positions,
            logits_from,
            self.cfg.n_vocab,
            self.graph_safe(true),
            &layers,
        )
    }
    fn argmax_start(
        &self,
        st: &mut Qwen4ExpState<B>,
        token: Option<u32>,
        pos: u32,
    ) -> Result<Option<u64>> {
        let layers =
            |st: &mut Qwen4ExpState<B>, t: &[u32], p: &[u32], lf: usize| self.layers(st, t, p, lf);
        stepper::argmax_start(
            &*self.backend,
            st,
            token,
            pos,
            self.cfg.n_vocab,
            self.graph_safe(token.is_some()),
            &layers,
        )
    }
    fn argmax_finish(&self, ticket: u64) -> Result<u32> {
        self.backend.argmax_finish(ticket)
    }
    fn discover_mtp(&self, model_path: &std::path::Path) -> Option<PathBuf> {
        self.mtp_path(model_path)
    }
    fn load_mtp(&self, path: &std::path::Path) -> Option<Result<Box<dyn crate::mtp::MtpHead>>> {
        Some(self.bind_mtp(path))
    }
}

/// A fresh state outside the engine (tests).
pub fn new_state<B: Backend + 'static>(
    m: &Arc<Qwen4ExpModel<B>>,
    n_ctx: usize,
    max_batch: usize,
) -> Result<Qwen4ExpState<B>> {
    let be = &*m.backend;
    let kv = alloc_kv(be, &m.layout, n_ctx, max_batch, KvType::F32)?;
    let extra = ExtraState::new(be, &m.layout, n_ctx, max_batch);
    Ok(m.new_state(kv, extra, n_ctx, max_batch))
}
