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
pub(crate) struct OwnMtp<M> {
    _m: std::marker::PhantomData<fn() -> M>,
}

impl<M> OwnMtp<M> {
    pub(crate) fn new() -> Self {
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
        let seq = target
            .as_any_mut()
            .downcast_mut::<Seq<M>>()
            .ok_or_else(|| anyhow!("an MTP layer drafts for sequences of its own model only"))?;
        if pos == 0 {
            bail!("MTP drafting needs an evaluated prompt");
        }
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
