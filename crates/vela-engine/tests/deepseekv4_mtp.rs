//! Speculative decoding with `deepseek_v4`'s own MTP block on the tiny `mtp` fixture
//! (`scripts/gen-deepseekv4-mtp.py`: the release's storage, a sliding window of 32): greedy
//! output identical to plain decoding, sampled output distributed as plain decoding (χ², with
//! the always-accept control caught), the block's cache after speculation, rollbacks and a
//! restored checkpoint equal to the one a plain evaluation leaves (`common/mtp.rs`), and a
//! follow-up turn from a checkpoint with the drafter bound bit-identical to a fresh run.

mod common;

// 80 greedy tokens after the 100-token prompt: past the 32-row window, so the block's ring
// wraps while drafts are written and rolled back.
crate::mtp_tests!("deepseekv4", 80, 6000);

/// The prefix cache's reuse with the drafter bound (the block's cache kept by every forward):
/// turn 2 from a checkpoint, or after a rollback within a batch, gives a fresh run's logits;
/// then speculation from the restored state gives plain greedy decoding's tokens and leaves
/// the block's cache as a plain evaluation does.
#[test]
fn follow_up_turn_with_the_drafter_bound_equals_a_fresh_run() {
    let Some(dir) = common::mtp::fixture("deepseekv4") else {
        return;
    };
    common::mtp::follow_up_turn_with_the_drafter(&dir, 16, false);
}
