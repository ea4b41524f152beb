//! DeepSeek V4 Flash (`deepseek_v4`), read side by side with transformers 5.23
//! `models/deepseek_v4/modeling_deepseek_v4.py`; docs/deepseekv4-spec.md spells out every step
//! with HF's line numbers:
//!
//! ```text
//! X = E[ids] in S streams                                              [n, S·H]
//! for each layer:
//!     pre, post, C = mHC_attn(X); y = Attn(rms(Σ pre_s X_s));  X_k = post_k·y + Σ_j C[j,k]·X_j
//!     pre, post, C = mHC_ffn(X);  y = MoE(rms(Σ pre_s X_s));   X_k = post_k·y + Σ_j C[j,k]·X_j
//! logits = head(rms(Σ pre_s X_s)), pre from hc_head
//! Attn: q = rope(urms_head(rms(x·Wq_a)·Wq_b)); kv = rope(rms(x·Wkv)) (one K=V head);
//!       keys = the sliding window's rows + compressed entries (HCA: all visible; CSA: the
//!       Lightning indexer's top-k); softmax with a sink per head; inverse rope on the output;
//!       grouped low-rank output projection.
//! ```
//!
//! State per sequence ([`StateLayout`]), all [`LayerState::Blocks`] entries: per layer the
//! window's K=V rows (a raw ring only), per compressed layer its entries with the raw
//! `[values | gates]` rows of the open window (and the one before: CSA windows overlap), per
//! CSA layer also the indexer's keys likewise; with an MTP block its window and the target's
//! streams per position (`deepseekv4/mtp.rs`), with DSpark stages ([`dspark`]) each stage's
//! window. Rollback up to `max_batch` positions and checkpoints come with the kind.

use crate::state::{alloc_kv, store_ring, ExtraState, LayerState, StateLayout};
use crate::stepper::{self, StepCtl, StepState};
use anyhow::{anyhow, bail, Result};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use vela_compute::{Activation, Backend, KvType, LightningParams, RouteParams, Score};

mod config;
mod dspark;
mod gguf;
mod load;
mod mtp;
pub mod synth;

pub use config::{Attn, DeepseekV4Config, Rope, Routing, Scoring, Yarn};
pub use dspark::{DsparkConfig, DsparkHead};

use crate::blocks::mhc::{self, Hc, HcBufs, HcDims};

/// A compressor: `[values | gates]` projection, position bias, output norm.
struct Compressor<B: Backend> {
    /// `[wkv; wgate]` stacked: one product gives the raw row.
    proj: B::Weight,
    ape: B::Vector,
    norm: B::Vector,
    /// Output width and whether windows overlap (CSA, the indexer).
    width: usize,
    overlap: bool,
    /// Its entry in the state layout.
    entry: usize,
}

struct Indexer<B: Backend> {
    wq: B::Weight,
    weights: B::Weight,
    comp: Compressor<B>,
}

struct Attention<B: Backend> {
    kind: Attn,
    wq_a: B::Weight,
    q_norm: B::Vector,
    wq_b: B::Weight,
    wkv: B::Weight,
    kv_norm: B::Vector,
    sinks: B::Vector,
    /// `[G·r, nh·hd/G]` as G experts of r rows; `[H, G·r]`.
    wo_a: B::Weight,
    wo_b: B::Weight,
    comp: Option<Compressor<B>>,
    indexer: Option<Indexer<B>>,
    /// The window's entry in the state layout.
    window: usize,
}

struct Moe<B: Backend> {
    router: B::Weight,
    /// Selection bias (top-k layers) or the token → experts table (hash layers).
    bias: Option<B::Vector>,
    /// (`Ids` are not `Sync`: the model is shared between threads.)
    table: Option<std::sync::Mutex<B::Ids>>,
    experts: crate::blocks::experts::Experts<B>,
    sh_gate: B::Weight,
    sh_up: B::Weight,
    sh_down: B::Weight,
}

struct Layer<B: Backend> {
    attn_hc: Hc<B>,
    ffn_hc: Hc<B>,
    attn_norm: B::Vector,
    ffn_norm: B::Vector,
    attn: Attention<B>,
    moe: Moe<B>,
}

/// Each layer's (window, compressor, indexer) entries in the state layout.
pub(crate) type LayerEntries = Vec<[Option<usize>; 3]>;

/// The state layout: per layer its window, then its compressor's and indexer's entries; with
/// `mtp`, the MTP block's window and the target's streams last (returned as the third value).
pub(crate) fn build_layout(
    c: &DeepseekV4Config,
    mtp: bool,
) -> (StateLayout, LayerEntries, Option<[usize; 2]>) {
    let mut entries = Vec::new();
    let mut per_layer = Vec::new();
    let mut push = |s: LayerState| {
        entries.push(s);
        entries.len() - 1
    };
    for &kind in &c.attn {
        let window = push(LayerState::Blocks {
            width: 0,
            ratio: c.window,
            raw_width: c.head_dim,
        });
        let blocks = |width: usize, ratio: usize, overlap: bool| LayerState::Blocks {
            width,
            ratio,
            raw_width: 2 * width * if overlap { 2 } else { 1 },
        };
        let (comp, idx) = match kind {
            Attn::Sliding => (None, None),
            Attn::Hca => (Some(push(blocks(c.head_dim, c.hca_rate, false))), None),
            Attn::Csa => (
                Some(push(blocks(c.head_dim, c.csa_rate, true))),
                Some(push(blocks(c.idx_dim, c.csa_rate, true))),
            ),
        };
        per_layer.push([Some(window), comp, idx]);
    }
    let mtp = mtp.then(|| {
        let window = push(LayerState::Blocks {
            width: 0,
            ratio: c.window,
            raw_width: c.head_dim,
        });
        // A ring of the streams of the last positions: a row waits for the token after it.
        let streams = push(LayerState::Blocks {
            width: 0,
            ratio: 1,
            raw_width: c.hc * c.hidden,
        });
        [window, streams]
    });
    (StateLayout::new(entries), per_layer, mtp)
}

/// `layout` with `n` DSpark stage windows appended; returns their entries.
fn with_stage_windows(
    c: &DeepseekV4Config,
    layout: StateLayout,
    n: usize,
) -> (StateLayout, Vec<usize>) {
    let mut entries = layout.layers;
    let first = entries.len();
    entries.extend((0..n).map(|_| LayerState::Blocks {
        width: 0,
        ratio: c.window,
        raw_width: c.head_dim,
    }));
    (StateLayout::new(entries), (first..first + n).collect())
}

/// A loaded model.
pub struct DeepseekV4Model<B: Backend> {
    pub backend: Arc<B>,
    pub cfg: DeepseekV4Config,
    embd: B::Weight,
    head: B::Weight,
    head_hc: Hc<B>,
    norm: B::Vector,
    layers: Vec<Layer<B>>,
    /// The MTP block, when the checkpoint (or an MTP GGUF beside the model's) has one.
    mtp: Option<mtp::Mtp<B>>,
    /// Set once a drafter is bound: forwards then keep the MTP block's cache.
    mtp_on: AtomicBool,
    /// Ones as wide as the widest unweighted RMSNorm.
    ones: B::Vector,
    /// Rotation frequencies of the main rope (sliding layers) and the compress rope.
    inv_main: Vec<f32>,
    inv_comp: Vec<f32>,
    layout: StateLayout,
    weight_bytes_per_token: u64,
    /// The checkpoint directory (a drafter must come from the same one).
    source: Option<PathBuf>,
    /// The DSpark drafter, when the checkpoint has one.
    dspark: Option<dspark::Dspark<B>>,
    /// Set once the drafter is bound: forwards then keep its context rows.
    dspark_on: AtomicBool,
    /// [`Self::dspark_p_min`] as bits.
    dspark_p_min: AtomicU32,
}

// Scratch buffers of a state (indices into `DeepseekV4State::bufs`).
const X: usize = 0; // [n, S·H] streams
const F: usize = 1; // [n, S·H] unweighted-normalised streams
const MIX: usize = 2; // [n, (2+S)·S] mHC weights
const C: usize = 3; // [n, H] collapsed block input
const XN: usize = 4; // [n, H] normalised block input
const QR: usize = 5; // [n, q_rank]
const Q: usize = 6; // [n, nh·hd]
const KV: usize = 7; // [n, hd]
const RAW: usize = 8; // [n, raw row] compressor projections
const ENT: usize = 9; // [windows, width] pooled entries
const ENT2: usize = 10; // [windows, width] normalised entries
const QI: usize = 11; // [n, nI·dI]
const WI: usize = 12; // [n, nI]
const O: usize = 13; // [n, nh·hd] attention output
const Z: usize = 14; // [n, G·r]
const Y: usize = 15; // [n, H] block output
const RL: usize = 16; // [n, E] router logits
const SG: usize = 17; // [n, I] shared gate
const SU: usize = 18; // [n, I] shared up
const EX: usize = 19; // [n, H] routed experts
const LOGITS: usize = 20;
const N_BUFS: usize = 21;

/// One sequence: scratch buffers, the entries and windows, selections.
pub struct DeepseekV4State<B: Backend> {
    kv: B::Kv,
    extra: ExtraState<B>,
    n_ctx: usize,
    max_batch: usize,
    bufs: Vec<B::Buf>,
    /// Rows `bufs[LOGITS]` holds ([`crate::stepper::logits_room`]).
    logits_rows: usize,
    experts: crate::blocks::experts::ExpertScratch<B>,
    /// Window rows per query (`[n, win_width]`), entries per query (`[n, ent_width]`).
    sel_w: B::Ids,
    /// The window plus a DSpark block (its queries read the whole block).
    win_width: usize,
    cnt_w: B::Ids,
    sel_e: B::Ids,
    cnt_e: B::Ids,
    ent_width: usize,
    /// Group g of every token's attention output (`[n·G]`), for the grouped projection.
    groups: B::Ids,
    /// Row t of the embedding for stream row t·S + s.
    stream_rows: B::Ids,
    tokens: B::Ids,
    /// `[max_batch, S·H]`: the MTP block's input streams (models with an MTP block).
    mtp_in: Option<B::Buf>,
    key: u64,
    /// When set, every CSA layer's selection is read back: (layer, position, entries).
    pub selections: Option<Vec<(usize, u32, Vec<u32>)>>,
    dspark: Option<dspark::DsparkScratch<B>>,
}

fn pick2<T>(v: &mut [T], a: usize, b: usize) -> [&mut T; 2] {
    v.get_disjoint_mut([a, b]).expect("distinct buffers")
}

fn pick3<T>(v: &mut [T], a: usize, b: usize, c: usize) -> [&mut T; 3] {
    v.get_disjoint_mut([a, b, c]).expect("distinct buffers")
}

/// Rotation frequencies of one interleaved pair each, in f32 as transformers computes them
/// (spec §4.2; YaRN with its ramp between the beta_fast and beta_slow dims).
pub fn inv_freq(r: &Rope, rot: usize) -> Vec<f32> {
    let theta = r.theta;
    let base: Vec<f32> = (0..rot / 2)
        .map(|i| theta.powf((2 * i) as f32 / rot as f32))
        .collect();
    let inv: Vec<f32> = base.iter().map(|b| 1.0 / b).collect();
    let Some(y) = &r.yarn else {
        return inv;
    };
    let cdim = |n: f32| {
        rot as f64 * (y.original_max as f64 / (n as f64 * 2.0 * std::f64::consts::PI)).ln()
            / (2.0 * (theta as f64).ln())
    };
    let lo = cdim(y.beta_fast).floor().max(0.0);
    let mut hi = cdim(y.beta_slow).ceil().min(rot as f64 - 1.0);
    if lo == hi {
        hi += 0.001;
    }
    (0..rot / 2)
        .map(|i| {
            let ramp = ((i as f32 - lo as f32) / (hi - lo) as f32).clamp(0.0, 1.0);
            let extra = 1.0 - ramp;
            (1.0 / (y.factor * base[i])) * (1.0 - extra) + inv[i] * extra
        })
        .collect()
}

impl<B: Backend> DeepseekV4Model<B> {
    /// Entries a query can read at most: the indexer's budget, or every HCA entry.
    fn ent_width(&self, n_ctx: usize) -> usize {
        let c = &self.cfg;
        let hca = if c.attn.contains(&Attn::Hca) {
            n_ctx / c.hca_rate + 1
        } else {
            0
        };
        hca.max(c.idx_topk).max(1)
    }

    fn new_state(
        &self,
        kv: B::Kv,
        extra: ExtraState<B>,
        n_ctx: usize,
        max_batch: usize,
    ) -> DeepseekV4State<B> {
        let be = &*self.backend;
        let c = &self.cfg;
        let (s, h, nb) = (c.hc, c.hidden, max_batch);
        let raw = 4 * c.head_dim.max(c.idx_dim);
        let windows = nb + 1;
        let sizes = [
            nb * s * h,
            nb * s * h,
            nb * (2 + s) * s,
            nb * h,
            nb * h,
            nb * c.q_rank,
            nb * c.n_head * c.head_dim,
            nb * c.head_dim,
            nb * raw,
            windows * c.head_dim.max(c.idx_dim),
            windows * c.head_dim.max(c.idx_dim),
            nb * c.idx_heads * c.idx_dim,
            nb * c.idx_heads,
            nb * c.n_head * c.head_dim,
            nb * c.o_groups * c.o_rank,
            nb * h,
            nb * c.n_expert,
            nb * c.n_ff,
            nb * c.n_ff,
            nb * h,
            c.n_vocab, // one row, grown by need (`logits_rows`)
        ];
        debug_assert_eq!(sizes.len(), N_BUFS);
        let ent_width = self.ent_width(n_ctx);
        let win_width = c.window + self.dspark.as_ref().map_or(0, |d| d.cfg.block);
        let ids = |v: Vec<u32>| {
            let mut d = be.alloc_ids(v.len().max(1));
            be.write_ids(&mut d, &v);
            d
        };
        DeepseekV4State {
            kv,
            extra,
            n_ctx,
            max_batch,
            bufs: sizes.iter().map(|&n| be.alloc(n.max(1))).collect(),
            logits_rows: 1,
            experts: crate::blocks::experts::ExpertScratch::new(be, c.top_k, c.n_ff, h, nb),
            sel_w: be.alloc_ids(nb * win_width),
            win_width,
            cnt_w: be.alloc_ids(nb),
            sel_e: be.alloc_ids(nb * ent_width),
            cnt_e: be.alloc_ids(nb),
            ent_width,
            groups: ids((0..nb * c.o_groups)
                .map(|i| (i % c.o_groups) as u32)
                .collect()),
            stream_rows: ids((0..nb * s).map(|r| (r / s) as u32).collect()),
            tokens: be.alloc_ids(nb),
            mtp_in: self.mtp.as_ref().map(|_| be.alloc(nb * s * h)),
            key: StepCtl::new().key,
            selections: None,
            dspark: self.dspark_scratch(nb),
        }
    }

    fn hc_dims(&self) -> HcDims {
        let c = &self.cfg;
        HcDims {
            streams: c.hc,
            width: c.hidden,
            sinkhorn_iters: c.sinkhorn_iters,
            hc_eps: c.hc_eps,
            eps: c.eps,
        }
    }

    /// mHC before a block: `MIX` = the weights, `XN` = the normalised block input.
    fn hc_pre(&self, b: &mut [B::Buf], hc: &Hc<B>, norm: &B::Vector, n: usize) {
        let [x, f, mix, c, xn] = b.get_disjoint_mut([X, F, MIX, C, XN]).expect("distinct");
        let bufs = HcBufs { x, f, mix, c, xn };
        mhc::pre(
            &*self.backend,
            hc,
            self.hc_dims(),
            (&self.ones, norm),
            n,
            bufs,
        );
    }

    /// mHC after a block: the streams from `Y` and the weights in `MIX`.
    fn hc_post(&self, b: &mut [B::Buf], n: usize) {
        let [x, mix, y] = pick3(b, X, MIX, Y);
        mhc::post(&*self.backend, self.hc_dims(), n, x, mix, y);
    }

    /// The layers and the head (see the module docs).
    fn layers(
        &self,
        st: &mut DeepseekV4State<B>,
        tokens: &[u32],
        positions: &[u32],
        logits_from: usize,
    ) -> Result<usize> {
        let be = &*self.backend;
        let c = &self.cfg;
        let n = tokens.len();
        let (s, h) = (c.hc, c.hidden);
        let p0 = positions[0] as usize;
        if positions
            .iter()
            .enumerate()
            .any(|(i, &p)| p as usize != p0 + i)
        {
            bail!("deepseek_v4: a batch's positions must be consecutive");
        }
        be.write_ids(&mut st.tokens, tokens);
        be.get_rows(&self.embd, tokens, 1.0, &mut st.bufs[C])?;
        {
            let [e, x] = pick2(&mut st.bufs, C, X);
            be.gather_rows(e, &st.stream_rows, n * s, h, x);
        }
        if let Some(first) = self.layers.first() {
            self.write_windows(st, positions, first.attn.window)?;
        }
        let ds = self.active_dspark();
        for (il, l) in self.layers.iter().enumerate() {
            self.block(st, l, il, positions)?;
            if let Some(ds) = ds {
                self.dspark_tap(st, ds, il, n);
            }
        }
        if let Some(ds) = ds {
            self.dspark_inject(st, ds, positions)?;
        }
        let mtp = self.active_mtp();
        if let Some(mt) = mtp {
            self.mtp_stage(st, mt, p0, n)?;
        }
        let (be, nv) = (&*self.backend, self.cfg.n_vocab);
        let rows = n - logits_from.min(n);
        crate::stepper::logits_room(be, &mut st.bufs[LOGITS], &mut st.logits_rows, rows, nv);
        let rows = self.head(&mut st.bufs, (&self.head_hc, &self.norm), n, logits_from);
        if let Some(mt) = mtp {
            self.mtp_cache(st, mt, tokens, p0)?;
        }
        Ok(rows)
    }

    /// One layer on the streams `X` of the queries at `positions` (`il`: its index, for the
    /// recorded selections).
    fn block(
        &self,
        st: &mut DeepseekV4State<B>,
        l: &Layer<B>,
        il: usize,
        positions: &[u32],
    ) -> Result<()> {
        let n = positions.len();
        self.hc_pre(&mut st.bufs, &l.attn_hc, &l.attn_norm, n);
        self.attention(st, &l.attn, il, positions)?;
        self.hc_post(&mut st.bufs, n);
        self.hc_pre(&mut st.bufs, &l.ffn_hc, &l.ffn_norm, n);
        self.moe(st, &l.moe, n);
        self.hc_post(&mut st.bufs, n);
        Ok(())
    }

    /// The head's mHC collapse of the streams in `X` into `C`, normalised with `norm` into `XN`.
    fn collapse_head(&self, b: &mut [B::Buf], hc: &Hc<B>, norm: &B::Vector, n: usize) {
        let be = &*self.backend;
        let c = &self.cfg;
        let (s, h) = (c.hc, c.hidden);
        {
            let [x, f] = pick2(b, X, F);
            be.rms_norm(x, &self.ones, n, s * h, c.eps, f);
        }
        {
            let [f, mix] = pick2(b, F, MIX);
            be.matmul(&hc.mix, f, n, mix);
            be.mhc_weights(mix, &hc.base, hc.scale, n, s, 0, c.hc_eps, true);
        }
        {
            let [x, mix, cc] = pick3(b, X, MIX, C);
            be.mhc_collapse(x, mix, s, n, s, h, cc);
        }
        let [cc, xn] = pick2(b, C, XN);
        be.rms_norm(cc, norm, n, h, c.eps, xn);
    }

    /// The logits of rows `logits_from..n` of the streams `X` into `LOGITS` through an hc_head
    /// and its norm (the trunk's, or the MTP block's own); returns the number of rows.
    fn head(
        &self,
        b: &mut [B::Buf],
        (hc, norm): (&Hc<B>, &B::Vector),
        n: usize,
        logits_from: usize,
    ) -> usize {
        let be = &*self.backend;
        let h = self.cfg.hidden;
        let rows = n - logits_from;
        if rows == 0 {
            return 0;
        }
        self.collapse_head(b, hc, norm, n);
        {
            let [xn, cc] = pick2(b, XN, C);
            be.copy_rows(xn, logits_from, rows, h, cc, 0);
        }
        let [cc, lg] = pick2(b, C, LOGITS);
        be.matmul(&self.head, cc, rows, lg);
        rows
    }

    /// The window rows every query reads (ring slots of positions p − window + 1 ..= p), the
    /// same for every layer of the forward (their window rings, like `window`'s, have the same
    /// number of slots).
    fn write_windows(
        &self,
        st: &mut DeepseekV4State<B>,
        positions: &[u32],
        window: usize,
    ) -> Result<()> {
        let be = &*self.backend;
        let c = &self.cfg;
        let slots = st.extra.block_raw(window)?.1;
        let ww = st.win_width;
        let mut sel = vec![0u32; positions.len() * ww];
        let mut cnt = vec![0u32; positions.len()];
        for (t, &p) in positions.iter().enumerate() {
            let p = p as usize;
            let first = (p + 1).saturating_sub(c.window);
            for (j, q) in (first..=p).enumerate() {
                sel[t * ww + j] = (q % slots) as u32;
            }
            cnt[t] = (p + 1 - first) as u32;
        }
        be.write_ids(&mut st.sel_w, &sel);
        be.write_ids(&mut st.cnt_w, &cnt);
        Ok(())
    }

    /// Entries `0..⌊(p+1)/m⌋` for every query (HCA layers).
    fn all_entries(&self, st: &mut DeepseekV4State<B>, positions: &[u32], m: usize) {
        let w = st.ent_width;
        let mut sel = vec![0u32; positions.len() * w];
        let mut cnt = vec![0u32; positions.len()];
        for (t, &p) in positions.iter().enumerate() {
            let nv = (p as usize + 1) / m;
            for j in 0..nv.min(w) {
                sel[t * w + j] = j as u32;
            }
            cnt[t] = nv.min(w) as u32;
        }
        self.backend.write_ids(&mut st.sel_e, &sel);
        self.backend.write_ids(&mut st.cnt_e, &cnt);
    }

    /// Project this chunk's raw rows into the compressor's ring and pool every window the
    /// chunk completes into its entry rows (normalised, rotated at the window's start).
    fn compress(
        &self,
        st: &mut DeepseekV4State<B>,
        cp: &Compressor<B>,
        p0: usize,
        n: usize,
        m: usize,
    ) -> Result<()> {
        let be = &*self.backend;
        let raw_width = 2 * cp.width * if cp.overlap { 2 } else { 1 };
        {
            let [xn, raw] = pick2(&mut st.bufs, XN, RAW);
            be.matmul(&cp.proj, xn, n, raw);
        }
        let blk = st.extra.blocks_mut(cp.entry)?;
        let slots = blk.raw_slots;
        store_ring(be, &st.bufs[RAW], (n, raw_width), blk.raw, slots, p0);
        let (first, last) = (p0 / m, (p0 + n) / m);
        if last > first {
            let k = last - first;
            let [ent, ent2] = pick2(&mut st.bufs, ENT, ENT2);
            be.compress_pool(
                blk.raw, slots, raw_width, cp.width, &cp.ape, m, cp.overlap, first, k, ent,
            );
            be.rms_norm(ent, &cp.norm, k, cp.width, self.cfg.eps, ent2);
            let pos: Vec<u32> = (first..last).map(|w| (w * m) as u32).collect();
            be.rope_trailing(ent2, 1, cp.width, &pos, &self.inv_comp, false);
            be.copy_rows(ent2, 0, k, cp.width, blk.rows, first);
        }
        Ok(())
    }

    /// The layer's rope table: main for sliding layers, compress for CSA / HCA.
    fn inv(&self, kind: Attn) -> &[f32] {
        if kind == Attn::Sliding {
            &self.inv_main
        } else {
            &self.inv_comp
        }
    }

    /// The K=V rows of the normalised block input `XN` at `positions` (projection, norm,
    /// rotation) into `KV` and the layer's window ring.
    fn store_kv(
        &self,
        st: &mut DeepseekV4State<B>,
        a: &Attention<B>,
        positions: &[u32],
    ) -> Result<()> {
        let be = &*self.backend;
        let c = &self.cfg;
        let (n, hd) = (positions.len(), c.head_dim);
        {
            let [xn, kv] = pick2(&mut st.bufs, XN, KV);
            be.matmul(&a.wkv, xn, n, kv);
            be.rms_norm_inplace(kv, &a.kv_norm, n, hd, c.eps);
            be.rope_trailing(kv, 1, hd, positions, self.inv(a.kind), false);
        }
        let win = st.extra.blocks_mut(a.window)?;
        let slots = win.raw_slots;
        store_ring(
            be,
            &st.bufs[KV],
            (n, hd),
            win.raw,
            slots,
            positions[0] as usize,
        );
        Ok(())
    }

    fn attention(
        &self,
        st: &mut DeepseekV4State<B>,
        a: &Attention<B>,
        il: usize,
        positions: &[u32],
    ) -> Result<()> {
        let be = &*self.backend;
        let c = &self.cfg;
        let n = positions.len();
        let p0 = positions[0] as usize;
        let (nh, hd) = (c.n_head, c.head_dim);
        let inv = self.inv(a.kind);
        {
            let b = &mut st.bufs;
            {
                let [xn, qr] = pick2(b, XN, QR);
                be.matmul(&a.wq_a, xn, n, qr);
                be.rms_norm_inplace(qr, &a.q_norm, n, c.q_rank, c.eps);
            }
            let [qr, q] = pick2(b, QR, Q);
            be.matmul(&a.wq_b, qr, n, q);
            be.rms_norm_inplace(q, &self.ones, n * nh, hd, c.eps);
            be.rope_trailing(q, nh, hd, positions, inv, false);
        }
        self.store_kv(st, a, positions)?;
        match a.kind {
            Attn::Sliding => be.write_ids(&mut st.cnt_e, &vec![0u32; n]),
            Attn::Hca => {
                let cp = a
                    .comp
                    .as_ref()
                    .ok_or_else(|| anyhow!("HCA layer without a compressor"))?;
                self.compress(st, cp, p0, n, c.hca_rate)?;
                self.all_entries(st, positions, c.hca_rate);
            }
            Attn::Csa => {
                let m = c.csa_rate;
                let cp = a
                    .comp
                    .as_ref()
                    .ok_or_else(|| anyhow!("CSA layer without a compressor"))?;
                self.compress(st, cp, p0, n, m)?;
                let ix = a
                    .indexer
                    .as_ref()
                    .ok_or_else(|| anyhow!("CSA layer without an indexer"))?;
                self.compress(st, &ix.comp, p0, n, m)?;
                let b = &mut st.bufs;
                {
                    let [qr, qi] = pick2(b, QR, QI);
                    be.matmul(&ix.wq, qr, n, qi);
                    be.rope_trailing(qi, c.idx_heads, c.idx_dim, positions, &self.inv_comp, false);
                }
                {
                    let [xn, wi] = pick2(b, XN, WI);
                    be.matmul(&ix.weights, xn, n, wi);
                    be.scale(wi, n * c.idx_heads, (c.idx_heads as f32).powf(-0.5));
                }
                let p = LightningParams {
                    n_head: c.idx_heads,
                    head_dim: c.idx_dim,
                    ratio: m,
                    top_k: c.idx_topk,
                    scale: (c.idx_dim as f32).powf(-0.5),
                    expand: false,
                };
                let keys = st.extra.block_rows(ix.comp.entry)?;
                be.lightning_select(
                    &b[QI],
                    &b[WI],
                    keys,
                    positions,
                    &p,
                    &mut st.sel_e,
                    &mut st.cnt_e,
                );
                if let Some(log) = &mut st.selections {
                    let mut sel = vec![0u32; n * c.idx_topk];
                    let mut cnt = vec![0u32; n];
                    be.read_ids(&st.sel_e, &mut sel);
                    be.read_ids(&st.cnt_e, &mut cnt);
                    for (t, &p) in positions.iter().enumerate() {
                        let row = &sel[t * c.idx_topk..][..cnt[t] as usize];
                        log.push((il, p, row.to_vec()));
                    }
                }
            }
        }
        let ent_rows = match &a.comp {
            Some(cp) => st.extra.block_rows(cp.entry)?,
            None => st.extra.block_rows(a.window)?,
        };
        let ent_w = if a.kind == Attn::Csa {
            c.idx_topk
        } else {
            st.ent_width
        };
        let (win_rows, _) = st.extra.block_raw(a.window)?;
        let b = &mut st.bufs;
        let [q, o] = pick2(b, Q, O);
        be.attention_sink(
            q,
            (win_rows, &st.sel_w, &st.cnt_w, st.win_width),
            (ent_rows, &st.sel_e, &st.cnt_e, ent_w),
            &a.sinks,
            n,
            nh,
            hd,
            (hd as f32).powf(-0.5),
            o,
        );
        be.rope_trailing(o, nh, hd, positions, inv, true);
        {
            let [o, z] = pick2(b, O, Z);
            let g = c.o_groups;
            be.matmul_experts(&a.wo_a, c.o_rank, o, true, &st.groups, n, g, z);
        }
        let [z, y] = pick2(b, Z, Y);
        be.matmul(&a.wo_b, z, n, y);
        Ok(())
    }

    fn moe(&self, st: &mut DeepseekV4State<B>, m: &Moe<B>, n: usize) {
        let be = &*self.backend;
        let c = &self.cfg;
        let h = c.hidden;
        let b = &mut st.bufs;
        {
            let [xn, rl] = pick2(b, XN, RL);
            be.matmul(&m.router, xn, n, rl);
        }
        let p = RouteParams {
            n_expert: c.n_expert,
            k: c.top_k,
            score: match c.scoring {
                Scoring::SqrtSoftplus => Score::SqrtSoftplus,
                Scoring::Sigmoid => Score::Sigmoid,
            },
            n_group: 1,
            topk_group: 1,
            renorm: true,
            scale: c.routed_scale,
        };
        match &m.table {
            Some(t) => {
                let x = &mut st.experts;
                let t = t.lock().unwrap_or_else(|e| e.into_inner());
                be.route_hash(&b[RL], &st.tokens, &t, n, &p, &mut x.ids, &mut x.weights)
            }
            None => st.experts.route(be, &b[RL], n, &p, m.bias.as_ref(), None),
        }
        let act = Activation::SiluLimit(c.swiglu_limit);
        {
            let [xn, sg, su] = pick3(b, XN, SG, SU);
            be.matmul(&m.sh_gate, xn, n, sg);
            be.matmul(&m.sh_up, xn, n, su);
            be.act_mul(sg, su, n * c.n_ff, act);
        }
        {
            let [sg, y] = pick2(b, SG, Y);
            be.matmul(&m.sh_down, sg, n, y);
        }
        {
            let [xn, ex] = pick2(b, XN, EX);
            be.copy_rows(xn, 0, n, h, ex, 0);
        }
        m.experts.forward(be, &mut b[EX], n, h, &mut st.experts);
        let [y, ex] = pick2(b, Y, EX);
        be.add(y, ex, n * h);
    }
}

impl<B: Backend> StepState<B> for DeepseekV4State<B> {
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

impl<B: Backend + 'static> crate::lm::CausalLm for DeepseekV4Model<B> {
    type Be = B;
    type State = DeepseekV4State<B>;
    fn arch(&self) -> &str {
        "deepseek_v4"
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
    ) -> Result<DeepseekV4State<B>> {
        Ok(self.new_state(kv, extra, n_ctx, max_batch))
    }
    fn fork_state(
        &self,
        _st: &DeepseekV4State<B>,
        kv: B::Kv,
        extra: ExtraState<B>,
        n_ctx: usize,
        max_batch: usize,
    ) -> Result<DeepseekV4State<B>> {
        Ok(self.new_state(kv, extra, n_ctx, max_batch))
    }
    fn kv(st: &DeepseekV4State<B>) -> &B::Kv {
        &st.kv
    }
    fn kv_mut(st: &mut DeepseekV4State<B>) -> &mut B::Kv {
        &mut st.kv
    }
    fn extra(st: &DeepseekV4State<B>) -> Option<&ExtraState<B>> {
        Some(&st.extra)
    }
    fn extra_mut(st: &mut DeepseekV4State<B>) -> Option<&mut ExtraState<B>> {
        Some(&mut st.extra)
    }
    fn run(
        &self,
        st: &mut DeepseekV4State<B>,
        tokens: &[u32],
        positions: &[u32],
        logits_from: usize,
    ) -> Result<usize> {
        let layers = |st: &mut DeepseekV4State<B>, t: &[u32], p: &[u32], lf: usize| {
            self.layers(st, t, p, lf)
        };
        stepper::run(
            &*self.backend,
            st,
            tokens,
            positions,
            logits_from,
            self.cfg.n_vocab,
            false,
            &layers,
        )
    }
    fn argmax_start(
        &self,
        st: &mut DeepseekV4State<B>,
        token: Option<u32>,
        pos: u32,
    ) -> Result<Option<u64>> {
        let layers = |st: &mut DeepseekV4State<B>, t: &[u32], p: &[u32], lf: usize| {
            self.layers(st, t, p, lf)
        };
        stepper::argmax_start(
            &*self.backend,
            st,
            token,
            pos,
            self.cfg.n_vocab,
            false,
            &layers,
        )
    }
    fn argmax_finish(&self, ticket: u64) -> Result<u32> {
        self.backend.argmax_finish(ticket)
    }
    fn discover_mtp(&self, model_path: &std::path::Path) -> Option<PathBuf> {
        match &self.dspark {
            Some(_) => Some(model_path.to_path_buf()),
            None => self.mtp_path(model_path),
        }
    }
    fn load_mtp(&self, path: &std::path::Path) -> Option<Result<Box<dyn crate::mtp::MtpHead>>> {
        Some(match &self.dspark {
            Some(_) => self.bind_dspark(path),
            None => self.bind_mtp(path),
        })
    }
}

/// A fresh state outside the engine (tests).
pub fn new_state<B: Backend + 'static>(
    m: &Arc<DeepseekV4Model<B>>,
    n_ctx: usize,
    max_batch: usize,
) -> Result<DeepseekV4State<B>> {
    let be = &*m.backend;
    let kv = alloc_kv(be, &m.layout, n_ctx, max_batch, KvType::F32)?;
    let extra = ExtraState::new(be, &m.layout, n_ctx, max_batch);
    Ok(m.new_state(kv, extra, n_ctx, max_batch))
}
