//! Drafters: the Gemma 4 assistant (MTP) and a plain small draft model.

use super::{Draft, Drafter, Propose};
use crate::session::Session;
use anyhow::{anyhow, bail, Result};
use std::path::Path;
use std::sync::Arc;
use vela_compute::cpu::CpuBackend;
use vela_compute::Backend;
use vela_models::gemma4::Gemma4Model;
use vela_models::gemma4_assistant::{AssistantState, Gemma4Assistant};
use vela_models::lm::Gemma4Seq;

/// The Gemma 4 assistant drafting for a Gemma 4 target session on backend `B`: it reads the
/// target's last hidden state and its K/V (no cache of its own), all drafts of a round at the
/// position of the token being extended.
pub struct Gemma4Mtp<B: Backend> {
    pub assistant: Arc<Gemma4Assistant<B>>,
    state: AssistantState<B>,
    /// The target's post-norm hidden state of the last position kept (set by `sync`).
    hidden: Vec<f32>,
}

fn target_seq<B: Backend + 'static>(target: &Session) -> Result<&Gemma4Seq<B>> {
    target
        .state()
        .as_any()
        .downcast_ref::<Gemma4Seq<B>>()
        .ok_or_else(|| anyhow!("the Gemma 4 assistant needs a Gemma 4 target on the same backend"))
}

impl<B: Backend + 'static> Gemma4Mtp<B> {
    /// Bind `assistant` to `target` (checks width, vocabulary and head geometry).
    pub fn new(assistant: Arc<Gemma4Assistant<B>>, target: &Session) -> Result<Self> {
        let seq = target_seq::<B>(target)?;
        let state = assistant.new_state(&seq.model.cfg)?;
        Ok(Gemma4Mtp {
            assistant,
            state,
            hidden: Vec::new(),
        })
    }
}

impl<B: Backend + 'static> Drafter for Gemma4Mtp<B> {
    fn sync(&mut self, target: &Session, row: usize) -> Result<()> {
        let seq = target_seq::<B>(target)?;
        self.hidden = seq.model.output_hidden(&seq.state, row)?;
        Ok(())
    }

    fn draft(
        &mut self,
        target: &Session,
        last: u32,
        k: usize,
        propose: Propose,
    ) -> Result<Vec<Draft>> {
        if self.hidden.is_empty() {
            bail!("Gemma 4 assistant: draft before the first sync");
        }
        let seq = target_seq::<B>(target)?;
        let pos = target.n_past();
        let mut tok = last;
        let mut hidden = self.hidden.clone();
        let mut out = Vec::with_capacity(k);
        for _ in 0..k {
            let step = self.assistant.step(
                &mut self.state,
                &seq.model,
                &seq.state.kv,
                tok,
                &hidden,
                pos,
            )?;
            let d = propose(step.logits)?;
            tok = d.token;
            hidden = step.hidden;
            out.push(d);
        }
        Ok(out)
    }
}

/// Load a Gemma 4 assistant (HF directory or `gemma4-assistant` GGUF) onto the backend of a
/// Gemma 4 target session (CPU, or CUDA in builds with the `cuda` feature), checking that it fits
/// the target (width, vocabulary, head geometry).
pub fn load_gemma4_mtp(target: &Session, path: &Path) -> Result<Box<dyn Drafter>> {
    if let Some(r) = try_load::<CpuBackend>(target, path) {
        return r;
    }
    #[cfg(feature = "cuda")]
    if let Some(r) = try_load::<vela_cuda::CudaBackend>(target, path) {
        return r;
    }
    bail!(
        "a Gemma 4 assistant drafts for Gemma 4 targets only (the target is '{}' on {})",
        target.model.arch(),
        target.model.backend_name()
    )
}

fn try_load<B: Backend + 'static>(
    target: &Session,
    path: &Path,
) -> Option<Result<Box<dyn Drafter>>> {
    let model = target.model.as_any().downcast_ref::<Gemma4Model<B>>()?;
    let load = || -> Result<Box<dyn Drafter>> {
        let asst = Gemma4Assistant::load(model.backend.clone(), path)?;
        Ok(Box::new(Gemma4Mtp::new(Arc::new(asst), target)?))
    };
    Some(load())
}

/// A small language model with the target's vocabulary as the drafter: its own session follows
/// the target's tokens (re-evaluating what changed) and drafts autoregressively.
pub struct ModelDrafter {
    pub session: Session,
}

impl Drafter for ModelDrafter {
    fn sync(&mut self, _target: &Session, _row: usize) -> Result<()> {
        Ok(())
    }

    fn draft(
        &mut self,
        target: &Session,
        last: u32,
        k: usize,
        propose: Propose,
    ) -> Result<Vec<Draft>> {
        if self.session.model.n_vocab() != target.model.n_vocab() {
            bail!(
                "draft model vocabulary {} differs from the target's {}",
                self.session.model.n_vocab(),
                target.model.n_vocab()
            );
        }
        let want = target.tokens();
        let own = self.session.tokens();
        let common = own.iter().zip(want).take_while(|(a, b)| a == b).count();
        if common < own.len() && self.session.truncate(common).is_err() {
            // A sliding-window ring cannot drop that much: start over.
            self.session.reset();
        }
        let have = self.session.n_past();
        if have < want.len() {
            self.session.eval(&want[have..])?;
        }
        let mut logits = self.session.eval(&[last])?;
        let mut out = Vec::with_capacity(k);
        for i in 0..k {
            let d = propose(logits)?;
            let tok = d.token;
            out.push(d);
            if i + 1 < k {
                logits = self.session.eval(&[tok])?;
            } else {
                logits = Vec::new();
            }
        }
        drop(logits);
        Ok(out)
    }
}
