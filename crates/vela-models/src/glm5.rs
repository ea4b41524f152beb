//! GLM 5.3 Flash (`glm5_next`, text), read side by side with transformers 5.23
//! `models/glm5_next/modeling_glm5_next.py`; docs/glm5-spec.md spells out every step with HF's
//! line numbers:
//!
//! ```text
//! X = E[ids] in S streams                                              [n, S·H]
//! for each layer:
//!     pre, post, C = mHC_attn(X); y = Mixer(rms(Σ pre_s X_s));  X_k = post_k·y + Σ_j C[j,k]·X_j
//!     pre, post, C = mHC_ffn(X);  y = FFN(rms(Σ pre_s X_s));    X_k = post_k·y + Σ_j C[j,k]·X_j
//! logits = head(rms(mean_s X_s))                                       (unweighted mean)
//! Mixer: KDA (gated delta rule with a decay per key channel, short convs; kda.rs) or NoPE MLA
//!        over the DSA indexer's selection (top-k pools of m tokens + the open pool; mla.rs)
//! FFN:   clamped SwiGLU, dense or MoE (sigmoid router with selection bias, shared expert; ffn.rs)
//! ```
//!
//! Against its neighbours: the mHC block is DeepSeek V4's (`blocks/mhc.rs`) but the head is a
//! plain mean of the streams; the norms are plain-gamma; there is no positional encoding.
//!
//! State per sequence ([`StateLayout`]): per KDA layer its convolution tail and its delta-rule
//! matrix (recurrent, with the state after each of the last [`SNAPSHOTS`] positions kept for
//! rollback), per MLA layer its latent rows, per full indexer its pooled keys with the raw
//! `[key | gate]` rows of the open pool; with the MTP block (`mtp.rs`), its own latent rows and
//! pools and a ring of the trunk's hiddens. Rollback up to `min(SNAPSHOTS, max_batch)` positions
//! without a checkpoint.

use crate::blocks::mhc::{self, Hc, HcBufs, HcDims};
use crate::state::{alloc_kv, ExtraState, LayerState, StateLayout};
use crate::stepper::{self, StepCtl, StepState};
use anyhow::{bail, Result};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use vela_compute::{Backend, KvType};

mod config;
mod ffn;
mod gguf;
mod kda;
mod load;
mod mla;
mod mtp;
pub mod synth;
pub mod synth_gguf;
pub mod vocab;

pub use config::{Glm5Config, Indexer, Mixer};

/// Per-position snapshots of every recurrent state (the rollback limit without a checkpoint).
pub const SNAPSHOTS: usize = 4;

enum Block<B: Backend> {
    Kda(kda::Kda<B>),
    Mla(mla::Mla<B>),
}

struct Layer<B: Backend> {
    attn_hc: Hc<B>,
    ffn_hc: Hc<B>,
    attn_norm: B::Vector,
    ffn_norm: B::Vector,
    mixer: Block<B>,
    ffn: ffn::Ffn<B>,
    /// This layer's entries in the state layout (KDA: conv tail, matrix; MLA: latent rows, and
    /// the indexer's pooled keys on a full layer).
    state: Vec<usize>,
}

/// A loaded model.
pub struct Glm5Model<B: Backend> {
    pub backend: Arc<B>,
    pub cfg: Glm5Config,
    embd: B::Weight,
    head: B::Weight,
    norm: B::Vector,
    layers: Vec<Layer<B>>,
    /// Ones as wide as the streams (the unweighted RMSNorm of mHC).
    ones: B::Vector,
    layout: StateLayout,
    weight_bytes_per_token: u64,
    /// The MTP block, when the weights have one.
    mtp: Option<mtp::Mtp<B>>,
    /// Whether a drafter is bound (forwards keep the block's cache only then).
    mtp_on: AtomicBool,
}

// Scratch buffers of a state (indices into `Glm5State::bufs`), `max_batch` rows each.
const X: usize = 0; // [S·H] streams
const F: usize = 1; // [S·H] normalised streams
const MIX: usize = 2; // [(2+S)·S] mHC weights
const C: usize = 3; // [H] collapsed block input
const XN: usize = 4; // [H] normalised block input
const Y: usize = 5; // [H] block output
                    // KDA (kda.rs)
const U: usize = 6; // [3·nk·dk] q|k|v projections
const UC: usize = 7; // [3·nk·dk] after the short convolution
const LOW: usize = 8; // [dk] f_a output
const LOW2: usize = 9; // [dk] g_a output
const G: usize = 10; // [nk·dk] log-decay
const BETA: usize = 11; // [nk]
const GATE: usize = 12; // [nk·dk] output gate
const O: usize = 13; // [nk·dk] delta-rule output
const ON: usize = 14; // [nk·dk] normalised, gated output
                      // MLA (mla.rs)
const QR: usize = 15; // [q_rank]
const Q: usize = 16; // [nh·dn]
const LAT: usize = 17; // [r] latent rows
const QL: usize = 18; // [nh·r] absorbed queries
const OL: usize = 19; // [nh·r] attention output in the latent space
const OV: usize = 20; // [nh·dv]
const QI: usize = 21; // [nI·dI] indexer queries
const KI: usize = 22; // [dI] indexer keys
const ZI: usize = 23; // [dI] indexer pool-gate logits
const WI: usize = 24; // [nI] indexer head weights
const ENT: usize = 25; // [max_batch / m + 1, dI] pooled keys completed in a forward
                       // FFN (ffn.rs)
const RL: usize = 26; // [E] router logits
const SG: usize = 27; // [max(Id, I·n_shared)] gate
const SU: usize = 28; // [max(Id, I·n_shared)] up
const EX: usize = 29; // [H] routed experts
const KZ: usize = 30; // [2·dI] indexer [key | gate] rows for the ring
const LOGITS: usize = 31; // [V]
const N_BUFS: usize = 32;

/// One sequence: scratch buffers, the declared state, the selections.
pub struct Glm5State<B: Backend> {
    kv: B::Kv,
    extra: ExtraState<B>,
    n_ctx: usize,
    max_batch: usize,
    bufs: Vec<B::Buf>,
    /// Rows `bufs[LOGITS]` holds ([`crate::stepper::logits_room`]).
    logits_rows: usize,
    experts: crate::blocks::experts::ExpertScratch<B>,
    /// Row t·S + s of the streams starts as embedding row t.
    stream_rows: B::Ids,
    /// Head h for slot t·nh + h (the per-head absorbed products).
    heads: B::Ids,
    /// The tokens each query attends to (`[n, max_selected]`), their counts: the last full
    /// indexer's selection, which a shared layer reuses.
    sel: B::Ids,
    counts: B::Ids,
    key: u64,
    /// `[max_batch, H]`: the hiddens of the MTP block's rows (a draft: its input hidden).
    mtp_in: Option<B::Buf>,
    /// When set, every full indexer's selection is recorded: (layer, position, tokens).
    pub selections: Option<Vec<(usize, u32, Vec<u32>)>>,
}

fn pick2<T>(v: &mut [T], a: usize, b: usize) -> [&mut T; 2] {
    v.get_disjoint_mut([a, b]).expect("distinct buffers")
}

fn pick3<T>(v: &mut [T], a: usize, b: usize, c: usize) -> [&mut T; 3] {
    v.get_disjoint_mut([a, b, c]).expect("distinct buffers")
}

/// An MLA layer's state: its latent rows and, with an indexer, the pooled keys over the raw
/// `[key | gate]` rows of the open pool.
fn mla_states(c: &Glm5Config, full: bool) -> Vec<LayerState> {
    let mut v = vec![LayerState::Blocks {
        width: c.kv_rank,
        ratio: 1,
        raw_width: 0,
    }];
    if full {
        v.push(LayerState::Blocks {
            width: c.idx_dim,
            ratio: c.idx_pool,
            raw_width: 2 * c.idx_dim,
        });
    }
    v
}

/// The state layout and each layer's entries in it; with `mtp`, the MTP block's latent rows,
/// pools and ring of trunk hiddens last (the third value).
fn build_layout(c: &Glm5Config, mtp: bool) -> (StateLayout, Vec<Vec<usize>>, Option<[usize; 3]>) {
    let recurrent = |floats| LayerState::Recurrent {
        floats,
        snapshots: SNAPSHOTS,
    };
    let mut entries = Vec::new();
    let mut per_layer = Vec::new();
    for (il, m) in c.mixers.iter().enumerate() {
        let states = match m {
            Mixer::Kda => vec![
                recurrent((c.conv_k - 1) * 3 * c.kda_heads * c.kda_dim),
                recurrent(c.kda_heads * c.kda_dim * c.kda_dim),
            ],
            Mixer::Mla => mla_states(c, c.indexers[il] == Indexer::Full),
        };
        let first = entries.len();
        entries.extend(states);
        per_layer.push((first..entries.len()).collect());
    }
    let mtp = mtp.then(|| {
        let first = entries.len();
        entries.extend(mla_states(c, true));
        // A ring of the hiddens of the last positions: a row waits for the token after it.
        entries.push(LayerState::Blocks {
            width: 0,
            ratio: 1,
            raw_width: c.hidden,
        });
        [first, first + 1, first + 2]
    });
    (StateLayout::new(entries), per_layer, mtp)
}

impl<B: Backend> Glm5Model<B> {
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

    fn new_state(
        &self,
        kv: B::Kv,
        extra: ExtraState<B>,
        n_ctx: usize,
        max_batch: usize,
    ) -> Glm5State<B> {
        let be = &*self.backend;
        let c = &self.cfg;
        let (s, h, nb) = (c.hc, c.hidden, max_batch);
        let kc = c.kda_heads * c.kda_dim;
        let ff = c.n_ff.max(c.n_ff_exp * c.n_shared);
        let widths = [
            s * h,
            s * h,
            (2 + s) * s,
            h,
            h,
            h,
            3 * kc,
            3 * kc,
            c.kda_dim,
            c.kda_dim,
            kc,
            c.kda_heads,
            kc,
            kc,
            kc,
            c.q_rank,
            c.n_head * c.nope_dim,
            c.kv_rank,
            c.n_head * c.kv_rank,
            c.n_head * c.kv_rank,
            c.n_head * c.v_dim,
            c.idx_heads * c.idx_dim,
            c.idx_dim,
            c.idx_dim,
            c.idx_heads,
            0,
            c.n_expert,
            ff,
            ff,
            h,
            2 * c.idx_dim,
            c.n_vocab,
        ];
        debug_assert_eq!(widths.len(), N_BUFS);
        let mut bufs: Vec<B::Buf> = widths.iter().map(|&w| be.alloc((nb * w).max(1))).collect();
        bufs[ENT] = be.alloc((nb / c.idx_pool + 1) * c.idx_dim);
        // One row of logits, grown by need (`logits_rows`).
        bufs[LOGITS] = be.alloc(c.n_vocab);
        let ids = |v: Vec<u32>| {
            let mut d = be.alloc_ids(v.len().max(1));
            be.write_ids(&mut d, &v);
            d
        };
        Glm5State {
            kv,
            extra,
            n_ctx,
            max_batch,
            bufs,
            logits_rows: 1,
            experts: crate::blocks::experts::ExpertScratch::new(be, c.top_k, c.n_ff_exp, h, nb),
            stream_rows: ids((0..nb * s).map(|r| (r / s) as u32).collect()),
            heads: ids((0..nb * c.n_head).map(|i| (i % c.n_head) as u32).collect()),
            sel: be.alloc_ids(nb * c.max_selected()),
            counts: be.alloc_ids(nb),
            key: StepCtl::new().key,
            mtp_in: self.mtp.as_ref().map(|_| be.alloc(nb * h)),
            selections: None,
        }
    }

    /// The layers and the head (see the module docs).
    fn layers(
        &self,
        st: &mut Glm5State<B>,
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
            bail!("glm5_next: a batch's positions must be consecutive");
        }
        st.extra.begin(be, p0);
        be.get_rows(&self.embd, tokens, 1.0, &mut st.bufs[C])?;
        {
            let [e, x] = pick2(&mut st.bufs, C, X);
            be.gather_rows(e, &st.stream_rows, n * s, h, x);
        }
        let d = self.hc_dims();
        for (il, l) in self.layers.iter().enumerate() {
            self.hc_pre(&mut st.bufs, &l.attn_hc, &l.attn_norm, n);
            match &l.mixer {
                Block::Kda(k) => self.kda(st, k, &l.state, p0, n)?,
                Block::Mla(m) => self.mla(st, m, &l.state, il, positions)?,
            }
            {
                let [x, mix, y] = pick3(&mut st.bufs, X, MIX, Y);
                mhc::post(be, d, n, x, mix, y);
            }
            self.hc_pre(&mut st.bufs, &l.ffn_hc, &l.ffn_norm, n);
            self.ffn(st, &l.ffn, n);
            let [x, mix, y] = pick3(&mut st.bufs, X, MIX, Y);
            mhc::post(be, d, n, x, mix, y);
        }
        let mtp = self.active_mtp();
        let (be, nv) = (&*self.backend, self.cfg.n_vocab);
        let rows = n - logits_from.min(n);
        crate::stepper::logits_room(be, &mut st.bufs[LOGITS], &mut st.logits_rows, rows, nv);
        let rows = self.head(&mut st.bufs, n, logits_from, mtp.is_some());
        if let Some(mt) = mtp {
            self.mtp_forward(st, mt, tokens, p0)?;
        }
        Ok(rows)
    }

    /// Whether a one-token step runs the same launches at every position, reading its token
    /// and position on the device (`stepper`): the latent rows, the indexer's ring and pools and
    /// its selection take the positions there, and the recurrent states cycle through their
    /// snapshot slots (a few distinct steps). Not with the MTP block bound (its ring is
    /// written by position on the host), a selections log (read back), or routed experts in
    /// host memory (read back mid-step).
    fn graph_safe(&self, st: &Glm5State<B>) -> bool {
        self.active_mtp().is_none()
            && st.selections.is_none()
            && !self.layers.iter().any(|l| match &l.ffn {
                ffn::Ffn::Moe(m) => m.experts.on_host(),
                ffn::Ffn::Dense(_) => false,
            })
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

    /// The logits of rows `logits_from..n` into `LOGITS`: the streams' mean, normalised (every
    /// row's into `XN` when one is asked for or `hiddens`), times the output head; returns the
    /// number of rows.
    fn head(&self, b: &mut [B::Buf], n: usize, logits_from: usize, hiddens: bool) -> usize {
        let be = &*self.backend;
        let c = &self.cfg;
        let rows = n - logits_from;
        if rows == 0 && !hiddens {
            return 0;
        }
        {
            let [x, cc] = pick2(b, X, C);
            be.mean_streams(x, n, c.hc, c.hidden, cc);
        }
        {
            let [cc, xn] = pick2(b, C, XN);
            be.rms_norm(cc, &self.norm, n, c.hidden, c.eps, xn);
            if rows == 0 {
                return 0;
            }
            be.copy_rows(xn, logits_from, rows, c.hidden, cc, 0);
        }
        let [cc, lg] = pick2(b, C, LOGITS);
        be.matmul(&self.head, cc, rows, lg);
        rows
    }
}

impl<B: Backend> StepState<B> for Glm5State<B> {
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

impl<B: Backend + 'static> crate::lm::CausalLm for Glm5Model<B> {
    type Be = B;
    type State = Glm5State<B>;
    fn arch(&self) -> &str {
        "glm5_next"
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
    ) -> Result<Glm5State<B>> {
        Ok(self.new_state(kv, extra, n_ctx, max_batch))
    }
    fn kv(st: &Glm5State<B>) -> &B::Kv {
        &st.kv
    }
    fn kv_mut(st: &mut Glm5State<B>) -> &mut B::Kv {
        &mut st.kv
    }
    fn extra(st: &Glm5State<B>) -> Option<&ExtraState<B>> {
        Some(&st.extra)
    }
    fn extra_mut(st: &mut Glm5State<B>) -> Option<&mut ExtraState<B>> {
        Some(&mut st.extra)
    }
    fn run(
        &self,
        st: &mut Glm5State<B>,
        tokens: &[u32],
        positions: &[u32],
        logits_from: usize,
    ) -> Result<usize> {
        let layers =
            |st: &mut Glm5State<B>, t: &[u32], p: &[u32], lf: usize| self.layers(st, t, p, lf);
        let safe = self.graph_safe(st);
        stepper::run(
            &*self.backend,
            st,
            tokens,
            positions,
            logits_from,
            self.cfg.n_vocab,
            safe,
            &layers,
        )
    }
    fn argmax_start(
        &self,
        st: &mut Glm5State<B>,
        token: Option<u32>,
        pos: u32,
    ) -> Result<Option<u64>> {
        let layers =
            |st: &mut Glm5State<B>, t: &[u32], p: &[u32], lf: usize| self.layers(st, t, p, lf);
        let safe = self.graph_safe(st);
        stepper::argmax_start(
            &*self.backend,
            st,
            token,
            pos,
            self.cfg.n_vocab,
            safe,
            &layers,
        )
    }
    fn argmax_finish(&self, ticket: u64) -> Result<u32> {
        self.backend.argmax_finish(ticket)
    }
    fn discover_mtp(&self, model_path: &std::path::Path) -> Option<PathBuf> {
        crate::mtp::discover_own(self.mtp_source(), model_path)
    }
    fn load_mtp(&self, path: &std::path::Path) -> Option<Result<Box<dyn crate::mtp::MtpHead>>> {
        let on = &self.mtp_on;
        Some(crate::mtp::bind_own::<Self>(
            "glm5_next",
            self.mtp_source(),
            path,
            on,
        ))
    }
}

/// A fresh state outside the engine (tests).
pub fn new_state<B: Backend + 'static>(
    m: &Arc<Glm5Model<B>>,
    n_ctx: usize,
    max_batch: usize,
) -> Result<Glm5State<B>> {
    let be = &*m.backend;
    let kv = alloc_kv(be, &m.layout, n_ctx, max_batch, KvType::F32)?;
    let extra = ExtraState::new(be, &m.layout, n_ctx, max_batch);
    Ok(m.new_state(kv, extra, n_ctx, max_batch))
}
