//! The Gemma 4 assistant drafting for its target ([`MtpHead`]): it reads the target's last
//! hidden state and its K/V (no cache of its own); all drafts of a round sit at the position of
//! the token being extended.

use super::{AssistantState, Gemma4Assistant};
use crate::gemma4::Gemma4Model;
use crate::lm::{Gemma4Seq, ModelState};
use crate::mtp::MtpHead;
use anyhow::{anyhow, bail, Result};
use std::sync::Arc;
use vela_compute::Backend;

/// The assistant bound to a Gemma 4 target.
pub struct Gemma4Mtp<B: Backend> {
    pub assistant: Arc<Gemma4Assistant<B>>,
    state: AssistantState<B>,
    /// The target's post-norm hidden state of the last position kept (set by `sync`).
    hidden: Vec<f32>,
}

/// The target's sequence: this head drafts only for the Gemma 4 model it was bound to.
fn target_seq<B: Backend + 'static>(target: &dyn ModelState) -> Result<&Gemma4Seq<B>> {
    target
        .as_any()
        .downcast_ref::<Gemma4Seq<B>>()
        .ok_or_else(|| anyhow!("the Gemma 4 assistant needs a Gemma 4 target on the same backend"))
}

impl<B: Backend + 'static> Gemma4Mtp<B> {
    /// Bind `assistant` to `target` (checks width, vocabulary and head geometry).
    pub fn new(assistant: Arc<Gemma4Assistant<B>>, target: &Gemma4Model<B>) -> Result<Self> {
        let state = assistant.new_state(&target.cfg)?;
        Ok(Gemma4Mtp {
            assistant,
            state,
            hidden: Vec::new(),
        })
    }
}

impl<B: Backend + 'static> MtpHead for Gemma4Mtp<B> {
    fn sync(&mut self, target: &dyn ModelState, row: usize) -> Result<()> {
        let seq = target_seq::<B>(target)?;
        self.hidden = seq.model.output_hidden(&seq.state, row)?;
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
        if self.hidden.is_empty() {
            bail!("Gemma 4 assistant: draft before the first sync");
        }
        let seq = target_seq::<B>(&*target)?;
        let mut tok = last;
        let mut hidden = self.hidden.clone();
        for _ in 0..k {
            let step = self.assistant.step(
                &mut self.state,
                &seq.model,
                &seq.state.kv,
                tok,
                &hidden,
                pos,
            )?;
            tok = next(step.logits)?;
            hidden = step.hidden;
        }
        Ok(())
    }
}
