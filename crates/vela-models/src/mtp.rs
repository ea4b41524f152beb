//! A model's own drafter (an MTP head, or an assistant model that reads the target's state):
//! what speculative decoding asks of it. A model that has one loads it through
//! [`crate::LanguageModel::load_mtp`]; the engine wraps it as a drafter without knowing the
//! architecture.

use crate::lm::{CausalLm, ModelState, Seq};
use anyhow::{anyhow, bail, Result};
use std::path::{Path, PathBuf};

/// Drafting from the target's own state.
pub trait MtpHead: Send {
    /// Called after every target forward pass: `row` is the index, among the rows that pass
    /// returned logits for, of the last position that stays in the sequence (the head reads
    /// that position's hidden state).
    fn sync(&mut self, target: &dyn ModelState, row: usize) -> Result<()>;

    /// `k` draft steps after `last`, the token at position `pos` (not evaluated by the target
    /// yet): each step's logits go to `next`, which returns the token the next step extends.
    /// A head whose cache is part of the target's state writes its draft rows there, past
    /// `pos` (the target's next forward overwrites them).
    fn draft(
        &mut self,
        target: &mut dyn ModelState,
        last: u32,
        pos: usize,
        k: usize,
        next: &mut dyn FnMut(Vec<f32>) -> Result<u32>,
    ) -> Result<()>;
}

/// The drafter file beside a GGUF model `D/NAME`, by llama.cpp's convention (`convert_hf_to_gguf.py
/// --mtp` names its output `mtp-NAME`): `D/mtp-NAME` when it is a regular file.
pub fn file_beside(model: &Path) -> Option<PathBuf> {
    let p = model
        .parent()?
        .join(format!("mtp-{}", model.file_name()?.to_str()?));
    (model.is_file() && p.is_file()).then_some(p)
}

/// Whether `path` names `source`, the file or directory a model's MTP layer was loaded from
/// (a generated model, `None`, has its layer whatever the path says).
pub(crate) fn same_source(source: Option<&Path>, path: &Path) -> bool {
    match (source, path.canonicalize()) {
        (None, _) => true,
        (Some(src), Ok(p)) => src.canonicalize().map(|s| s == p).unwrap_or(false),
        (Some(_), Err(_)) => false,
    }
}

/// A model whose MTP layer keeps its cache in the model's own sequence state: the target's
/// forwards write the cache rows, drafting runs the layer on one row at a time, chained.
pub(crate) trait ChainedMtp: CausalLm {
    /// Before the drafts after `pos` evaluated positions: the layer's input streams for row
    /// `pos − 1` (the target's streams of that position); returns how many of `k` drafts fit
    /// in the context.
    fn mtp_begin(&self, st: &mut Self::State, pos: usize, k: usize) -> Result<usize>;
    /// One draft: the layer on row `r` with `tok` the token after it; leaves its output streams
    /// as the next row's input and returns the logits.
    fn mtp_step(&self, st: &mut Self::State, tok: u32, r: usize) -> Result<Vec<f32>>;
}

/// The MTP layer of a [`ChainedMtp`] model as a drafter of that model's sequences.
struct OwnMtp<M> {
    _m: std::marker::PhantomData<fn() -> M>,
}

impl<M> OwnMtp<M> {
    fn new() -> Self {
        OwnMtp {
            _m: std::marker::PhantomData,
        }
    }
}

impl<M: ChainedMtp + 'static> MtpHead for OwnMtp<M> {
    fn sync(&mut self, _target: &dyn ModelState, _row: usize) -> Result<()> {
        // The target's forwards keep the layer's cache.
        Ok(())
    }

    fn draft(
        &mut self,
        target: &mut dyn ModelState,
        last: u32,
        pos: usize,
        k: usize,
        next: &mut dyn FnMut(Vec<f32>) -> Result<u32>,
    ) -> Result<()> {
        let seq = own_seq::<M>(target, pos, "an MTP layer")?;
        let model = seq.model.clone();
        let k = model.mtp_begin(&mut seq.state, pos, k)?;
        let mut tok = last;
        for j in 0..k {
            let logits = model.mtp_step(&mut seq.state, tok, pos - 1 + j)?;
            tok = next(logits)?;
        }
        Ok(())
    }
}

/// The sequence `target` of a model's own drafter (`what`, for errors), which drafts after
/// `pos` evaluated positions (at least one).
pub(crate) fn own_seq<'a, M: CausalLm + 'static>(
    target: &'a mut dyn ModelState,
    pos: usize,
    what: &str,
) -> Result<&'a mut Seq<M>> {
    let seq = target
        .as_any_mut()
        .downcast_mut::<Seq<M>>()
        .ok_or_else(|| anyhow!("{what} drafts for sequences of its own model only"))?;
    if pos == 0 {
        bail!("{what} drafts after an evaluated prompt only");
    }
    Ok(seq)
}

/// The weights that turn (a position's streams, the token after it) into an MTP layer's input.
pub(crate) struct InputProj<'a, B: vela_compute::Backend> {
    pub embd: &'a B::Weight,
    pub norm_emb: &'a B::Vector,
    pub fc_emb: &'a B::Weight,
    /// The streams' norm and the width of one normalised row: `H` (each stream on its own) or
    /// `S·H` (one RMS over all streams).
    pub norm_hidden: (&'a B::Vector, usize),
    pub fc_hidden: &'a B::Weight,
}

impl<'a, B: vela_compute::Backend> InputProj<'a, B> {
    /// The weights: the embedding table, its norm and projection, the hidden's norm (and the
    /// width of one normalised row) and projection.
    pub(crate) fn new(
        embd: &'a B::Weight,
        (norm_emb, fc_emb): (&'a B::Vector, &'a B::Weight),
        (norm_hidden, fc_hidden): ((&'a B::Vector, usize), &'a B::Weight),
    ) -> Self {
        InputProj {
            embd,
            norm_emb,
            fc_emb,
            norm_hidden,
            fc_hidden,
        }
    }

    /// [`Self::apply`] with `x` and its scratch taken from `bufs` (indices `[x, a, b, c]`), the
    /// streams `src` and their `stream_rows`.
    pub(crate) fn apply_in(
        &self,
        be: &B,
        (src, stream_rows): (&B::Buf, &B::Ids),
        tokens: &[u32],
        dims: (usize, usize, f32),
        bufs: &mut [B::Buf],
        [x, a, b, c]: [usize; 4],
    ) -> Result<()> {
        let [x, a, b, c] = bufs.get_disjoint_mut([x, a, b, c]).expect("distinct");
        self.apply(be, src, tokens, stream_rows, dims, x, [a, b, c])
    }

    /// `x_s = fc_hidden(norm_hidden(streams)_s) + fc_emb(norm_emb(E[t]))` for every stream `s`
    /// of `tokens.len()` rows of `s` streams of `h` (`stream_rows`: row `t` for stream row
    /// `t·s + j`; unread for one stream); scratch `a` as wide as `x`, `b` and `c` a row of `h`
    /// per token.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn apply(
        &self,
        be: &B,
        streams: &B::Buf,
        tokens: &[u32],
        stream_rows: &B::Ids,
        (s, h, eps): (usize, usize, f32),
        x: &mut B::Buf,
        [a, b, c]: [&mut B::Buf; 3],
    ) -> Result<()> {
        let m = tokens.len();
        let (norm, width) = self.norm_hidden;
        be.rms_norm(streams, norm, m * s * h / width, width, eps, a);
        be.matmul(self.fc_hidden, a, m * s, x);
        be.get_rows(self.embd, tokens, 1.0, b)?;
        be.rms_norm(b, self.norm_emb, m, h, eps, c);
        be.matmul(self.fc_emb, c, m, b);
        if s == 1 {
            be.add(x, b, m * h);
        } else {
            be.gather_rows(b, stream_rows, m * s, h, a);
            be.add(x, a, m * s * h);
        }
        Ok(())
    }
}

/// The streams of a forward's cache rows into `dst` (`w` wide): `prev` (a buffer and its row
/// holding the streams of the position before the forward; `None` when the forward starts the
/// sequence), then rows `0..n − 1` of the forward's streams `x`.
pub(crate) fn stage_rows<B: vela_compute::Backend>(
    be: &B,
    prev: Option<(&B::Buf, usize)>,
    (x, n, w): (&B::Buf, usize, usize),
    dst: &mut B::Buf,
) {
    let r = match prev {
        Some((b, row)) => {
            be.copy_rows(b, row, 1, w, dst, 0);
            1
        }
        None => 0,
    };
    if n > 1 {
        be.copy_rows(x, 0, n - 1, w, dst, r);
    }
}

/// The cache rows a target forward over `tokens` at positions `p0..` writes: the first row and
/// the token after each row (row `p0 − 1` waits for the batch's first token; at `p0 = 0` the
/// rows start at 0 with the second token); `None` when there is none.
pub(crate) fn cache_rows(tokens: &[u32], p0: usize) -> Option<(usize, &[u32])> {
    let (r0, next) = if p0 > 0 {
        (p0 - 1, tokens)
    } else {
        (0, tokens.get(1..).unwrap_or(&[]))
    };
    (!next.is_empty()).then_some((r0, next))
}

/// Where a model loaded its own MTP layer from (`Ok(None)`: generated; `Err`: the model has
/// none, why).
pub(crate) type Source<'a> = std::result::Result<Option<&'a Path>, &'a str>;

/// [`crate::lm::CausalLm::discover_mtp`] of a model whose MTP layer is loaded with it: where it
/// came from, or the model's own path when generated.
pub(crate) fn discover_own(source: Source<'_>, model_path: &Path) -> Option<PathBuf> {
    Some(source.ok()?.unwrap_or(model_path).to_path_buf())
}

/// Bind a model's own MTP layer as its drafter: `source` is where the model loaded it from,
/// which `path` must name; `on` turns the layer's cache on in the model's forwards.
pub(crate) fn bind_own<M: ChainedMtp + 'static>(
    arch: &str,
    source: Source<'_>,
    path: &Path,
    on: &std::sync::atomic::AtomicBool,
) -> Result<Box<dyn MtpHead>> {
    let source = source.map_err(|why| anyhow!("this {arch} model has no MTP layer ({why})"))?;
    if !same_source(source, path) {
        bail!(
            "{arch}'s MTP layer is loaded with the model (from {}): --mtp takes that path, not {}",
            source.unwrap_or(path).display(),
            path.display()
        );
    }
    on.store(true, std::sync::atomic::Ordering::Relaxed);
    Ok(Box::new(OwnMtp::<M>::new()))
}
