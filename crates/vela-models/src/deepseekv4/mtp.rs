//! The MTP block of `deepseek_v4` (transformers drops `mtp.*`; the structure is upstream's
//! `MTPBlock`, DeepSeek's inference/model.py 738-767, ../shared/notes/next-archs.md §2 "MTP";
//! the reference is `scripts/gen-deepseekv4-mtp.py`):
//!
//! ```text
//! row r (the target's streams X_r before its hc_head, the token t_{r+1} after position r),
//! at RoPE position r:
//!     x_s = h_proj(hnorm(X_r,s)) + e_proj(enorm(E[t_{r+1}]))   hnorm per stream, every stream s
//!     O   = one layer on x: mHC, sliding-window attention over the rows r−W+1..=r (main rope),
//!           top-k MoE + shared expert, as the trunk's non-hash layers
//!     logits = head(norm(hc_head_mtp(O)))     its own hc_head and norm, the target's head
//! a chained draft: row r + 1 from (O_r, the draft drawn from row r's logits)
//! ```
//!
//! Rows and positions. Row r pairs position r's streams with the token at r + 1 and sits at
//! RoPE position r, the rows of one sequence attending causally within the window, as
//! DeepSeek-V3's MTP module runs its block over the rows i = 1..T−k at positions i (and
//! upstream's `MTPBlock.forward(x, start_pos, …)` takes the position of `x`'s first row).
//! llama.cpp 0c1e570 (common/speculative.cpp 1511-1526, 1604, 1704) puts the same row at the
//! token's position r + 1: the attention is relative within the block, so only the rounding
//! of the rotation angles differs; it also pairs a sequence's first token with zero streams
//! (`pending_h` starts as zeros, 1433), a row 0 this block does not have.
//!
//! The block's cache is sequence state ([`build_layout`]): its window of K=V rows (as a
//! sliding layer's) and a ring of the target's streams per position (a row waits for the
//! token after it). A target forward over positions `p0..p0+n` writes rows `p0−1..p0+n−2`
//! (row `p0−1` from the streams of position `p0−1` in the ring, the batch's first token) and
//! only what the cache needs of them (their K=V rows); prefix reuse, rollback within a batch
//! and checkpoints then cover it with no code of their own. Drafting runs the whole block on
//! the rows from `n_past − 1` on; the verification forward rewrites those rows.
//!
//! Weights: the checkpoint's `mtp.0.*` (release names at its root), or llama.cpp's
//! `convert_hf_to_gguf.py --mtp` file beside a GGUF model as `mtp-NAME` (conversion/deepseek.py
//! 575-620, 770-800: the block as layer `num_hidden_layers`, `e_proj | h_proj` as one
//! `nextn.eh_proj` of 2·H columns, its hc_head as the root `output_hc_*`, its norm as
//! `nextn.shared_head_norm`); the GGUF is loaded with the model, since its cache is part of
//! the state layout.

use super::*;
use crate::mtp::{ChainedMtp, MtpHead};
use crate::weights::WeightSource;
use std::path::{Path, PathBuf};
use vela_formats::gguf::GgufFile;

/// The MTP block's weights.
pub(super) struct Mtp<B: Backend> {
    enorm: B::Vector,
    hnorm: B::Vector,
    e_proj: B::Weight,
    h_proj: B::Weight,
    /// Sliding attention, top-k MoE; its window is a state entry of its own.
    block: Layer<B>,
    head_hc: Hc<B>,
    norm: B::Vector,
    /// The state entry holding the target's streams after each position.
    streams: usize,
    /// The checkpoint directory or the GGUF file it came from (`None`: generated).
    source: Option<PathBuf>,
}

/// Where a model's MTP block is: a checkpoint (`mtp.0.*`) or llama.cpp's `--mtp` GGUF.
pub(super) struct MtpFrom<'a> {
    pub(super) src: &'a WeightSource,
    pub(super) gguf: bool,
    pub(super) source: Option<PathBuf>,
}

/// llama.cpp's `--mtp` export beside the GGUF model `g` (`mtp-NAME`), checked against the
/// model's config: the same geometry, one more block, which is sliding and top-k routed.
pub(super) fn gguf_beside(
    g: &GgufFile,
    cfg: &DeepseekV4Config,
) -> Result<Option<(Arc<GgufFile>, PathBuf)>> {
    let Some(path) = g.path().and_then(crate::mtp::file_beside) else {
        return Ok(None);
    };
    let mg = Arc::new(GgufFile::open(&path)?);
    let bad = |why: &str| anyhow!("{}: not this model's MTP block ({why})", path.display());
    if mg.arch_u64_opt("nextn_predict_layers")?.unwrap_or(0) == 0 {
        return Err(bad("no deepseek4.nextn_predict_layers"));
    }
    let mut m = DeepseekV4Config::from_gguf(&mg)?;
    let n = cfg.attn.len();
    if m.attn.len() != n + 1 || m.attn[n] != Attn::Sliding || m.routing[n] != Routing::TopK {
        return Err(bad(&format!(
            "{} blocks, expected {} with a sliding, top-k routed last one",
            m.attn.len(),
            n + 1
        )));
    }
    m.attn.truncate(n);
    m.routing.truncate(n);
    m.mtp_attn = cfg.mtp_attn;
    m.fp8 = cfg.fp8;
    if &m != cfg {
        return Err(bad("its metadata describes another geometry"));
    }
    Ok(Some((mg, path)))
}

impl<B: Backend> Mtp<B> {
    /// The block with its state entries `[window, streams]`.
    pub(super) fn load(
        be: &B,
        from: MtpFrom<'_>,
        c: &DeepseekV4Config,
        [window, streams]: [usize; 2],
    ) -> Result<Self> {
        if c.mtp_attn != Attn::Sliding {
            bail!("deepseek_v4: an MTP block with compressed attention is not supported");
        }
        let mut ld = load::Loader {
            be,
            src: from.src,
            top: from.src,
            gguf: from.gguf,
            bytes: 0,
        };
        let (s, h, n) = (c.hc, c.hidden, c.attn.len());
        // Release names under the block's prefix; the GGUF's hc_head is at its root.
        let (p, head) = if from.gguf {
            (format!("layers.{n}"), "hc_head".to_string())
        } else {
            ("mtp.0".to_string(), "mtp.0.hc_head".to_string())
        };
        let (e_proj, h_proj) = if from.gguf {
            let eh = ld.host(&format!("{p}.eh_proj.weight"), false)?;
            if eh.rows != h || eh.cols != 2 * h {
                bail!(
                    "{p}.eh_proj: [{}, {}], expected [{h}, {}]",
                    eh.rows,
                    eh.cols,
                    2 * h
                );
            }
            let (e, hp) = (eh.col_range(0, h, "e_proj")?, eh.col_range(h, h, "h_proj")?);
            (ld.upload(&e, 1.0)?, ld.upload(&hp, 1.0)?)
        } else {
            (
                ld.matrix(&format!("{p}.e_proj.weight"))?,
                ld.matrix(&format!("{p}.h_proj.weight"))?,
            )
        };
        let kinds = (Attn::Sliding, Routing::TopK);
        Ok(Mtp {
            enorm: ld.vector(&format!("{p}.enorm.weight"), h)?,
            hnorm: ld.vector(&format!("{p}.hnorm.weight"), h)?,
            e_proj,
            h_proj,
            block: ld.layer(&p, n, kinds, c, [Some(window), None, None])?,
            head_hc: ld.hc(&head, s, s * h)?,
            norm: ld.vector(&format!("{p}.norm.weight"), h)?,
            streams,
            source: from.source,
        })
    }
}

fn no_mtp_state() -> anyhow::Error {
    anyhow!("deepseek_v4: this sequence state was made without the MTP block")
}

impl<B: Backend> DeepseekV4Model<B> {
    /// The MTP block, when a drafter is bound (forwards keep its cache only then).
    pub(super) fn active_mtp(&self) -> Option<&Mtp<B>> {
        self.mtp
            .as_ref()
            .filter(|_| self.mtp_on.load(Ordering::Relaxed))
    }

    /// After the layers of a forward at positions `p0..p0+n` (their streams in `X`): the
    /// cache rows' streams into `mtp_in` (the ring's streams of `p0 − 1`, then rows `0..n−1`
    /// of `X`), and every row of `X` into the ring.
    pub(super) fn mtp_stage(
        &self,
        st: &mut DeepseekV4State<B>,
        mt: &Mtp<B>,
        p0: usize,
        n: usize,
    ) -> Result<()> {
        let be = &*self.backend;
        let w = self.cfg.hc * self.cfg.hidden;
        let dst = st.mtp_in.as_mut().ok_or_else(no_mtp_state)?;
        let ring = st.extra.blocks_mut(mt.streams)?;
        let prev = (p0 > 0).then(|| (&*ring.raw, (p0 - 1) % ring.raw_slots));
        crate::mtp::stage_rows(be, prev, (&st.bufs[X], n, w), dst);
        store_ring(be, &st.bufs[X], (n, w), ring.raw, ring.raw_slots, p0);
        Ok(())
    }

    /// The block's input streams into `X` for the streams in `mtp_in` and `tokens` (one row
    /// each).
    fn mtp_input(&self, st: &mut DeepseekV4State<B>, mt: &Mtp<B>, tokens: &[u32]) -> Result<()> {
        let c = &self.cfg;
        let w = crate::mtp::InputProj::<B> {
            embd: &self.embd,
            norm_emb: &mt.enorm,
            fc_emb: &mt.e_proj,
            norm_hidden: (&mt.hnorm, c.hidden),
            fc_hidden: &mt.h_proj,
        };
        let src = st.mtp_in.as_ref().ok_or_else(no_mtp_state)?;
        let [x, a, b, xn] = st.bufs.get_disjoint_mut([X, F, C, XN]).expect("distinct");
        let dims = (c.hc, c.hidden, c.eps);
        w.apply(
            &*self.backend,
            src,
            tokens,
            &st.stream_rows,
            dims,
            x,
            [a, b, xn],
        )
    }

    /// The cache-only pass of a forward at positions `p0..p0+n` ([`Self::mtp_stage`] ran): the
    /// K=V rows `p0−1..p0+n−2` (from row 0 when `p0 = 0`) of the block's window.
    pub(super) fn mtp_cache(
        &self,
        st: &mut DeepseekV4State<B>,
        mt: &Mtp<B>,
        tokens: &[u32],
        p0: usize,
    ) -> Result<()> {
        let Some((r0, next)) = crate::mtp::cache_rows(tokens, p0) else {
            return Ok(());
        };
        self.mtp_input(st, mt, next)?;
        let l = &mt.block;
        self.hc_pre(&mut st.bufs, &l.attn_hc, &l.attn_norm, next.len());
        let rows: Vec<u32> = (r0..r0 + next.len()).map(|p| p as u32).collect();
        self.store_kv(st, &l.attn, &rows)
    }

    /// [`crate::lm::CausalLm::discover_mtp`]: where the block came from, when there is one.
    pub(super) fn mtp_path(&self, model_path: &Path) -> Option<PathBuf> {
        let mt = self.mtp.as_ref()?;
        Some(
            mt.source
                .clone()
                .unwrap_or_else(|| model_path.to_path_buf()),
        )
    }

    /// [`crate::lm::CausalLm::load_mtp`]: the block loaded with the model, bound as a drafter.
    pub(super) fn bind_mtp(&self, path: &Path) -> Result<Box<dyn MtpHead>>
    where
        B: 'static,
    {
        let source = match &self.mtp {
            Some(mt) => Ok(mt.source.as_deref()),
            None => Err(
                "no mtp.* tensors in its checkpoint; for a GGUF model, llama.cpp's \
                         `convert_hf_to_gguf.py --mtp` output named mtp-NAME beside it",
            ),
        };
        crate::mtp::bind_own::<Self>("deepseek_v4", source, path, &self.mtp_on)
    }
}

impl<B: Backend + 'static> ChainedMtp for DeepseekV4Model<B> {
    fn mtp_begin(&self, st: &mut DeepseekV4State<B>, pos: usize, k: usize) -> Result<usize> {
        let mt = self.active_mtp().ok_or_else(no_mtp_state)?;
        let w = self.cfg.hc * self.cfg.hidden;
        let dst = st.mtp_in.as_mut().ok_or_else(no_mtp_state)?;
        let (ring, slots) = st.extra.block_raw(mt.streams)?;
        self.backend
            .copy_rows(ring, (pos - 1) % slots, 1, w, dst, 0);
        Ok(k.min(st.n_ctx.saturating_sub(pos)))
    }

    /// The whole block on row `r` (its streams in `mtp_in` row 0, `tok` the token after it);
    /// leaves its output streams in `mtp_in` row 0 for the next draft.
    fn mtp_step(&self, st: &mut DeepseekV4State<B>, tok: u32, r: usize) -> Result<Vec<f32>> {
        let mt = self.active_mtp().ok_or_else(no_mtp_state)?;
        let be = &*self.backend;
        let c = &self.cfg;
        self.mtp_input(st, mt, &[tok])?;
        let pos = [r as u32];
        self.write_windows(st, &pos, mt.block.attn.window)?;
        self.block(st, &mt.block, self.layers.len(), &pos)?;
        let dst = st.mtp_in.as_mut().ok_or_else(no_mtp_state)?;
        be.copy_rows(&st.bufs[X], 0, 1, c.hc * c.hidden, dst, 0);
        self.head(&mut st.bufs, (&mt.head_hc, &mt.norm), 1, 0);
        let mut out = vec![0f32; c.n_vocab];
        be.read(&st.bufs[LOGITS], &mut out);
        Ok(out)
    }
}
