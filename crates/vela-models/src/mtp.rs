//! A model's own drafter (an MTP head, or an assistant model that reads the target's state):
//! what speculative decoding asks of it. A model that has one loads it through
//! [`crate::LanguageModel::load_mtp`]; the engine wraps it as a drafter without knowing the
//! architecture.

use crate::lm::ModelState;
use anyhow::Result;

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
