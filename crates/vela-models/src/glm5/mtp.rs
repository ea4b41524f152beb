//! The MTP block of `glm5_next` (layer `num_hidden_layers` of the release; HF ignores it and
//! llama.cpp 0c1e570 loads it without a graph: docs/glm5-spec.md §9; the reference is
//! `scripts/glm5_ref.py`'s `mtp_rows`):
//!
//! ```text
//! row r (h_r = the trunk's hidden at position r after its final norm, t_{r+1} the token after r):
//!     x = eh_proj([enorm(E[t_{r+1}]); hnorm(h_r)])       embedding half first; [H]
//!     x = x + MLA(rms(x; input_layernorm))               NoPE MLA over its own DSA indexer's
//!                                                        selection among the rows 0..=r
//!     x = x + MoE(rms(x; post_attention_layernorm))      no mHC: plain pre-norm residuals
//!     g = rms(x; shared_head.norm);  logits = head(g)    shared_head.head, else the model's head
//! a chained draft: row r + 1 from (g_r, the draft drawn from row r's logits)
//! ```
//!
//! The post-norm hidden feeds the block (llama.cpp's `t_h_nextn`, glm5-next.cpp 662-669) and
//! the post-norm `g` feeds the next draft, as llama.cpp's GLM-DSA MTP graph chains
//! (glm-dsa.cpp 747-756). Row r sits at position r for the indexer's pools and causality, as
//! DeepSeek V4's block does (`deepseekv4/mtp.rs` on the row convention).
//!
//! The block's cache is sequence state ([`super::build_layout`]): its latent rows, its indexer's
//! pooled keys with their raw ring, and a ring of the trunk's hiddens (a row waits for the token
//! after it). A target forward over positions `p0..p0+n` writes rows `p0−1..p0+n−2` (row `p0−1`
//! from the ring, with the batch's first token), only what the cache needs (no attention, no
//! FFN); prefix reuse, rollback and checkpoints then cover the block with no code of their own.
//! Drafting runs the whole block on the rows from `n_past − 1` on; the verification forward
//! rewrites them.
//!
//! Weights: `layers.{n}.*` of the checkpoint (`eh_proj`, `enorm`, `hnorm`, `shared_head.norm`,
//! optional `shared_head.head` and `embed_tokens`, the MLA layer with its indexer, the MoE), or
//! llama.cpp's GGUF with the block (`blk.{n}.nextn.*` beside the block's `blk.{n}.*`).

use super::ffn::Ffn;
use super::load::Loader;
use super::mla::Mla;
use super::*;
use crate::mtp::{ChainedMtp, InputProj};
use anyhow::anyhow;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

/// The MTP block's weights.
pub(super) struct Mtp<B: Backend> {
    enorm: B::Vector,
    hnorm: B::Vector,
    /// `eh_proj`'s columns over the embedding, and over the hidden.
    e_proj: B::Weight,
    h_proj: B::Weight,
    /// The block's own embedding table, when it has one.
    embd: Option<B::Weight>,
    attn_norm: B::Vector,
    ffn_norm: B::Vector,
    mla: Mla<B>,
    moe: Ffn<B>,
    head_norm: B::Vector,
    /// `shared_head.head`, when the block has its own.
    head: Option<B::Weight>,
    /// State entries: latent rows, the indexer's pools, the ring of trunk hiddens.
    state: [usize; 3],
    /// The checkpoint directory or GGUF file it came from (`None`: generated).
    source: Option<PathBuf>,
}

impl<B: Backend> Loader<'_, B> {
    /// Whether the source has the block `layers.{n}` (its `enorm` decides).
    pub(super) fn has_mtp(&self, c: &Glm5Config) -> Result<bool> {
        self.has(&format!("layers.{}.enorm.weight", c.mixers.len()))
    }

    /// The block `layers.{n}` with its state entries.
    pub(super) fn mtp(
        &mut self,
        c: &Glm5Config,
        state: [usize; 3],
        source: Option<PathBuf>,
    ) -> Result<Mtp<B>> {
        let (n, h, v) = (c.mixers.len(), c.hidden, c.n_vocab);
        let p = format!("layers.{n}");
        let eh = self.host(&format!("{p}.eh_proj.weight"), h, 2 * h)?;
        let (e, hp) = (eh.col_range(0, h, "e_proj")?, eh.col_range(h, h, "h_proj")?);
        let table = |ld: &mut Self, name: &str| -> Result<Option<B::Weight>> {
            if !ld.has(name)? {
                return Ok(None);
            }
            let w = ld.host(name, v, h)?.as_head(true);
            ld.upload(&w, 1.0).map(Some)
        };
        Ok(Mtp {
            enorm: self.vector(&format!("{p}.enorm.weight"), h)?,
            hnorm: self.vector(&format!("{p}.hnorm.weight"), h)?,
            e_proj: self.upload(&e, 1.0)?,
            h_proj: self.upload(&hp, 1.0)?,
            embd: table(self, &format!("{p}.embed_tokens.weight"))?,
            attn_norm: self.vector(&format!("{p}.input_layernorm.weight"), h)?,
            ffn_norm: self.vector(&format!("{p}.post_attention_layernorm.weight"), h)?,
            mla: self.mla(&format!("{p}.self_attn"), c, true)?,
            moe: Ffn::Moe(self.moe(&format!("{p}.mlp"), n, c)?),
            head_norm: self.vector(&format!("{p}.shared_head.norm.weight"), h)?,
            head: table(self, &format!("{p}.shared_head.head.weight"))?,
            state,
            source,
        })
    }
}

fn no_mtp_state() -> anyhow::Error {
    anyhow!("glm5_next: this sequence state was made without the MTP block")
}

impl<B: Backend> Glm5Model<B> {
    /// The MTP block, when a drafter is bound (forwards keep its cache only then).
    pub(super) fn active_mtp(&self) -> Option<&Mtp<B>> {
        self.mtp
            .as_ref()
            .filter(|_| self.mtp_on.load(Ordering::Relaxed))
    }

    /// After the head of a forward at positions `p0..p0+n` (the post-norm hiddens in `XN`): the
    /// cache rows' hiddens into `mtp_in` (the ring's hidden of `p0 − 1`, then rows `0..n−1`),
    /// and every row into the ring.
    fn mtp_stage(&self, st: &mut Glm5State<B>, mt: &Mtp<B>, p0: usize, n: usize) -> Result<()> {
        let be = &*self.backend;
        let h = self.cfg.hidden;
        let dst = st.mtp_in.as_mut().ok_or_else(no_mtp_state)?;
        let ring = st.extra.blocks_mut(mt.state[2])?;
        let prev = (p0 > 0).then(|| (&*ring.raw, (p0 - 1) % ring.raw_slots));
        crate::mtp::stage_rows(be, prev, (&st.bufs[XN], n, h), dst);
        crate::state::store_ring(be, &st.bufs[XN], (n, h), ring.raw, ring.raw_slots, p0);
        Ok(())
    }

    /// The block's input `x` into `C` for the hiddens in `mtp_in` and `tokens` (one row each).
    fn mtp_input(&self, st: &mut Glm5State<B>, mt: &Mtp<B>, tokens: &[u32]) -> Result<()> {
        let (h, eps) = (self.cfg.hidden, self.cfg.eps);
        let embd = mt.embd.as_ref().unwrap_or(&self.embd);
        let w = InputProj::new(embd, (&mt.enorm, &mt.e_proj), ((&mt.hnorm, h), &mt.h_proj));
        let src = st.mtp_in.as_ref().ok_or_else(no_mtp_state)?;
        let (rows, bufs, at) = ((src, &st.stream_rows), &mut st.bufs, [C, F, Y, EX]);
        w.apply_in(&*self.backend, rows, tokens, (1, h, eps), bufs, at)
    }

    /// The MTP part of a forward over `tokens` at `p0..` after its head (the post-norm hiddens
    /// in `XN`): the hidden ring, and the cache rows `p0−1..p0+n−2` (from row 0 when `p0 = 0`)
    /// of the block's MLA layer.
    pub(super) fn mtp_forward(
        &self,
        st: &mut Glm5State<B>,
        mt: &Mtp<B>,
        tokens: &[u32],
        p0: usize,
    ) -> Result<()> {
        self.mtp_stage(st, mt, p0, tokens.len())?;
        let Some((r0, next)) = crate::mtp::cache_rows(tokens, p0) else {
            return Ok(());
        };
        self.mtp_input(st, mt, next)?;
        let (be, h, m) = (&*self.backend, self.cfg.hidden, next.len());
        {
            let [x, xn] = pick2(&mut st.bufs, C, XN);
            be.rms_norm(x, &mt.attn_norm, m, h, self.cfg.eps, xn);
        }
        let rows: Vec<u32> = (r0..r0 + m).map(|p| p as u32).collect();
        self.mla_cache(st, &mt.mla, &mt.state, &rows)
    }

    /// Where the block was loaded from (`Ok(None)`: generated), or why the model has none.
    pub(super) fn mtp_source(&self) -> crate::mtp::Source<'_> {
        let why = "no layers.{num_hidden_layers}.eh_proj / blk.N.nextn.* tensors";
        self.mtp.as_ref().map(|mt| mt.source.as_deref()).ok_or(why)
    }
}

impl<B: Backend + 'static> ChainedMtp for Glm5Model<B> {
    fn mtp_begin(&self, st: &mut Glm5State<B>, pos: usize, k: usize) -> Result<usize> {
        let mt = self.active_mtp().ok_or_else(no_mtp_state)?;
        let dst = st.mtp_in.as_mut().ok_or_else(no_mtp_state)?;
        let (ring, slots) = st.extra.block_raw(mt.state[2])?;
        self.backend
            .copy_rows(ring, (pos - 1) % slots, 1, self.cfg.hidden, dst, 0);
        Ok(k.min(st.n_ctx.saturating_sub(pos)))
    }

    /// The whole block on row `r` (its hidden in `mtp_in` row 0, `tok` the token after it);
    /// leaves its normalised output in `mtp_in` row 0 for the next draft.
    fn mtp_step(&self, st: &mut Glm5State<B>, tok: u32, r: usize) -> Result<Vec<f32>> {
        let mt = self.active_mtp().ok_or_else(no_mtp_state)?;
        let (be, c) = (&*self.backend, &self.cfg);
        let h = c.hidden;
        self.mtp_input(st, mt, &[tok])?;
        let il = self.layers.len();
        // x in C; each block reads XN and writes Y.
        for attn in [true, false] {
            {
                let norm = if attn { &mt.attn_norm } else { &mt.ffn_norm };
                let [x, xn] = pick2(&mut st.bufs, C, XN);
                be.rms_norm(x, norm, 1, h, c.eps, xn);
            }
            match attn {
                true => self.mla(st, &mt.mla, &mt.state, il, &[r as u32])?,
                false => self.ffn(st, &mt.moe, 1),
            }
            let [x, y] = pick2(&mut st.bufs, C, Y);
            be.add(x, y, h);
        }
        let dst = st.mtp_in.as_mut().ok_or_else(no_mtp_state)?;
        {
            let [x, xn] = pick2(&mut st.bufs, C, XN);
            be.rms_norm(x, &mt.head_norm, 1, h, c.eps, xn);
            be.copy_rows(xn, 0, 1, h, dst, 0);
        }
        {
            let [xn, lg] = pick2(&mut st.bufs, XN, LOGITS);
            be.matmul(mt.head.as_ref().unwrap_or(&self.head), xn, 1, lg);
        }
        let mut out = vec![0f32; c.n_vocab];
        be.read(&st.bufs[LOGITS], &mut out);
        Ok(out)
    }
}
