//! Drafters: a model's own drafter (MTP head or assistant, [`MtpDrafter`]) and a plain small
//! draft model ([`ModelDrafter`]).

use super::{Draft, Drafter, Propose};
use crate::session::Session;
use anyhow::{bail, Result};
use std::path::Path;
use vela_models::MtpHead;

/// A target model's own drafter ([`vela_models::LanguageModel::load_mtp`]) as a [`Drafter`].
pub struct MtpDrafter {
    head: Box<dyn MtpHead>,
}

impl MtpDrafter {
    pub fn new(head: Box<dyn MtpHead>) -> Self {
        MtpDrafter { head }
    }
}

impl Drafter for MtpDrafter {
    fn sync(&mut self, target: &Session, row: usize) -> Result<()> {
        self.head.sync(target.state(), row)
    }

    fn draft(
        &mut self,
        target: &mut Session,
        last: u32,
        k: usize,
        propose: Propose,
    ) -> Result<Vec<Draft>> {
        let mut out = Vec::with_capacity(k);
        let pos = target.n_past();
        self.head
            .draft(target.state_mut(), last, pos, k, &mut |logits| {
                let d = propose(logits)?;
                let t = d.token;
                out.push(d);
                Ok(t)
            })?;
        Ok(out)
    }
}

/// Load the target model's own drafter from `path` (an MTP head or assistant model, e.g. Gemma
/// 4's assistant as an HF directory or GGUF file) onto the target's backend, checked against
/// the target (width, vocabulary, head geometry).
pub fn load_mtp(target: &Session, path: &Path) -> Result<Box<dyn Drafter>> {
    let head = target.model.load_mtp(path)?;
    Ok(Box::new(MtpDrafter::new(head)))
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
        target: &mut Session,
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
        self.session.follow(target.tokens())?;
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
