//! The MTP layer of `qwen4_exp` (transformers drops `mtp.*`; the structure is
//! ../shared/notes/next-archs.md §1 "MTP", the reference `scripts/gen-qwen4exp-mtp.py`):
//!
//! ```text
//! row r (the target's pre-mixer streams X_r, the token t_{r+1} after position r), at RoPE position r:
//!     x_s = fc_hidden(rms1p(X_r)_s) + fc_embedding(rms1p(E[t_{r+1}]))   one RMS over all S·H
//!     O   = one QSA + MoE decoder layer (its two hyper-connections, no PLE) over the rows 0..=r
//!     logits = lm_head(Mixer_mtp(O))
//! a chained draft: row r + 1 from (O_r, the draft drawn from row r's logits)
//! ```
//!
//! The layer's cache (K/V rows, indexer keys) holds one row per target position, so it is
//! sequence state like any other ([`Qwen4ExpModel::build_layout`]): a target forward over
//! positions `p0..p0+n` writes rows `p0−1..p0+n−1` (row `p0−1` from the streams of position
//! `p0−1`, kept as a recurrent entry with snapshots, and the batch's first token), touching only
//! what the cache needs; the last row waits for the token that follows. Prefix reuse, rollback
//! and checkpoints then cover it with no code of their own. Drafting runs the whole layer on the
//! rows from `n_past − 1` on; those rows are rewritten by the verification forward.

use super::*;
use crate::mtp::{ChainedMtp, MtpHead};
use anyhow::anyhow;
use std::path::Path;

/// The MTP layer's weights.
pub(super) struct Mtp<B: Backend> {
    /// `1 + pre_fc_norm_embedding.weight`, `[H]`.
    norm_emb: B::Vector,
    /// `1 + pre_fc_norm_hidden.weight`, `[S·H]` (one RMS over every stream).
    norm_hidden: B::Vector,
    fc_emb: B::Weight,
    fc_hidden: B::Weight,
    /// QSA + MoE; its state entries are the QSA rows.
    layer: Layer<B>,
    mixer: Hc<B>,
    /// The state entry holding the target's pre-mixer streams after each position.
    pending: usize,
}

impl<B: Backend> load::Loader<'_, B> {
    /// The MTP layer of an HF checkpoint (`mtp.*`), with its state entries `ent`
    /// (QSA rows, then the pending streams).
    pub(super) fn mtp(&mut self, c: &Qwen4ExpConfig, ent: Vec<usize>) -> Result<Mtp<B>> {
        let (h, sh) = (c.hidden, c.streams * c.hidden);
        let pending = *ent.last().expect("MTP state entries");
        let layer = Layer {
            attn_hc: self.hc("mtp.layers.0.attn_hyper_connection", c, true)?,
            mlp_hc: self.hc("mtp.layers.0.mlp_hyper_connection", c, true)?,
            mixer: Block::Qsa(self.qsa("mtp.layers.0.self_attn", c)?),
            moe: self.moe("mtp.layers.0.mlp", None, c)?,
            ple: None,
            state: ent[..ent.len() - 1].to_vec(),
        };
        Ok(Mtp {
            norm_emb: self.norm1p("mtp.pre_fc_norm_embedding.weight", h)?,
            norm_hidden: self.norm1p("mtp.pre_fc_norm_hidden.weight", sh)?,
            fc_emb: self.matrix("mtp.fc_embedding.weight")?,
            fc_hidden: self.matrix("mtp.fc_hidden.weight")?,
            layer,
            mixer: self.hc("mtp.hyper_connection_mixer", c, false)?,
            pending,
        })
    }
}

impl<B: Backend> Qwen4ExpModel<B> {
    /// The MTP layer, when a drafter is bound (forwards keep its cache only then).
    pub(super) fn active_mtp(&self) -> Option<&Mtp<B>> {
        self.mtp
            .as_ref()
            .filter(|_| self.mtp_on.load(Ordering::Relaxed))
    }

    /// After the trunk of a forward at positions `p0..p0+n` (its pre-mixer streams in `X`):
    /// the cache rows' streams into `mtp_in` (the pending streams of `p0 − 1`, then rows
    /// `0..n−1` of `X`), and the streams after each position into the pending entry.
    pub(super) fn mtp_stage(
        &self,
        st: &mut Qwen4ExpState<B>,
        mt: &Mtp<B>,
        p0: usize,
        n: usize,
    ) -> Result<()> {
        let be = &*self.backend;
        let w = self.cfg.streams * self.cfg.hidden;
        let dst = st.mtp_in.as_mut().ok_or_else(no_mtp_state)?;
        let prev = if p0 > 0 {
            Some((st.extra.recurrent(mt.pending, p0)?, 0))
        } else {
            None
        };
        crate::mtp::stage_rows(be, prev, (&st.bufs[X], n, w), dst);
        // As `segments` writes a recurrent state: the last SNAPSHOTS positions one by one.
        let bulk = n - n.min(SNAPSHOTS);
        if bulk > 0 {
            let slot = st.extra.recurrent_mut(mt.pending, p0 + bulk)?;
            be.copy_rows(&st.bufs[X], bulk - 1, 1, w, slot, 0);
        }
        for j in bulk..n {
            let slot = st.extra.recurrent_mut(mt.pending, p0 + j + 1)?;
            be.copy_rows(&st.bufs[X], j, 1, w, slot, 0);
        }
        Ok(())
    }

    /// The layer's input streams into `X` for the streams in `mtp_in` and `tokens` (one row
    /// each).
    fn mtp_input(&self, st: &mut Qwen4ExpState<B>, mt: &Mtp<B>, tokens: &[u32]) -> Result<()> {
        let c = &self.cfg;
        let w = crate::mtp::InputProj::<B> {
            embd: &self.embd,
            norm_emb: &mt.norm_emb,
            fc_emb: &mt.fc_emb,
            norm_hidden: (&mt.norm_hidden, c.streams * c.hidden),
            fc_hidden: &mt.fc_hidden,
        };
        let src = st.mtp_in.as_ref().ok_or_else(no_mtp_state)?;
        let [x, a, b, t1] = st.bufs.get_disjoint_mut([X, XN, M, T1]).expect("distinct");
        let dims = (c.streams, c.hidden, c.eps);
        w.apply(
            &*self.backend,
            src,
            tokens,
            &st.stream_rows,
            dims,
            x,
            [a, b, t1],
        )
    }

    /// The cache-only pass of a forward at positions `p0..p0+n` ([`Self::mtp_stage`] ran):
    /// rows `p0−1..p0+n−1` (from row 0 when `p0 = 0`) of the layer's K/V and indexer keys.
    pub(super) fn mtp_cache(
        &self,
        st: &mut Qwen4ExpState<B>,
        mt: &Mtp<B>,
        tokens: &[u32],
        p0: usize,
    ) -> Result<()> {
        let Some((r0, next)) = crate::mtp::cache_rows(tokens, p0) else {
            return Ok(());
        };
        self.mtp_input(st, mt, next)?;
        self.hc(&mut st.bufs, &mt.layer.attn_hc, next.len());
        let Block::Qsa(q) = &mt.layer.mixer else {
            unreachable!("the MTP layer is a QSA layer")
        };
        let rows: Vec<u32> = (r0..r0 + next.len()).map(|p| p as u32).collect();
        self.qsa_cache(st, q, &mt.layer.state, &rows)
    }

    /// [`crate::lm::CausalLm::discover_mtp`]: the checkpoint itself, when it has the layer.
    pub(super) fn mtp_path(&self, model_path: &Path) -> Option<PathBuf> {
        self.mtp.as_ref().map(|_| model_path.to_path_buf())
    }

    /// [`crate::lm::CausalLm::load_mtp`]: the layer loaded with the model, bound as a drafter.
    pub(super) fn bind_mtp(&self, path: &Path) -> Result<Box<dyn MtpHead>>
    where
        B: 'static,
    {
        let source = match &self.mtp {
            Some(_) => Ok(self.source.as_deref()),
            None => Err(
                "no mtp.* tensors; llama.cpp's GGUF conversion drops them: use the HF \
                         checkpoint directory",
            ),
        };
        crate::mtp::bind_own::<Self>("qwen4_exp", source, path, &self.mtp_on)
    }
}

fn no_mtp_state() -> anyhow::Error {
    anyhow!("qwen4_exp: this sequence state was made without the MTP layer")
}

impl<B: Backend + 'static> ChainedMtp for Qwen4ExpModel<B> {
    fn mtp_begin(&self, st: &mut Qwen4ExpState<B>, pos: usize, k: usize) -> Result<usize> {
        let mt = self.active_mtp().ok_or_else(no_mtp_state)?;
        let w = self.cfg.streams * self.cfg.hidden;
        let dst = st.mtp_in.as_mut().ok_or_else(no_mtp_state)?;
        let src = st.extra.recurrent(mt.pending, pos)?;
        self.backend.copy_rows(src, 0, 1, w, dst, 0);
        Ok(k.min(st.n_ctx.saturating_sub(pos)))
    }

    /// One draft: the whole layer on row `r` (its streams in `mtp_in` row 0, `tok` the token
    /// after it); leaves the layer's output streams in `mtp_in` row 0 for the next draft and
    /// returns the logits.
    fn mtp_step(&self, st: &mut Qwen4ExpState<B>, tok: u32, r: usize) -> Result<Vec<f32>> {
        let mt = self.active_mtp().ok_or_else(no_mtp_state)?;
        let be = &*self.backend;
        let c = &self.cfg;
        self.mtp_input(st, mt, &[tok])?;
        self.layer(st, &mt.layer, self.layers.len(), &[tok], &[r as u32])?;
        let w = c.streams * c.hidden;
        let dst = st.mtp_in.as_mut().ok_or_else(no_mtp_state)?;
        be.copy_rows(&st.bufs[X], 0, 1, w, dst, 0);
        self.hc(&mut st.bufs, &mt.mixer, 1);
        {
            let [mm, lg] = pick2(&mut st.bufs, M, LOGITS);
            be.matmul(&self.head, mm, 1, lg);
        }
        let mut out = vec![0f32; c.n_vocab];
        be.read(&st.bufs[LOGITS], &mut out);
        Ok(out)
    }
}
