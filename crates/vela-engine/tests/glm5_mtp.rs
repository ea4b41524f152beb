//! Speculative decoding with `glm5_next`'s own MTP block on the tiny `mtp` fixture
//! (`scripts/gen-glm5-fixtures.py`: `flash_mini` with a random block): greedy output identical to
//! plain decoding for K = 1..4, sampled output distributed as plain decoding (χ², with the
//! always-accept control caught), the block's cache after speculation, a rollback and a restored
//! checkpoint equal to the one a plain evaluation leaves (`common/mtp.rs`), a follow-up turn
//! from a checkpoint with the drafter bound bit-identical to a fresh run, and the depth cost
//! model switching the (useless) random block off.

mod common;

// 80 greedy tokens after the 100-token prompt: pools of the block's indexer complete while
// drafts are written and rolled back.
crate::mtp_tests!("glm5", 80, 6000);

/// The prefix cache's reuse with the drafter bound (the block's cache kept by every forward):
/// turn 2 from a checkpoint, or after a rollback within the snapshots, gives a fresh run's
/// logits; speculation from the restored state gives plain greedy decoding's tokens and leaves
/// the block's cache as a plain evaluation does.
#[test]
fn follow_up_turn_with_the_drafter_bound_equals_a_fresh_run() {
    let Some(dir) = common::mtp::fixture("glm5") else {
        return;
    };
    common::mtp::follow_up_turn_with_the_drafter(&dir, vela_models::glm5::SNAPSHOTS, true);
}

/// The depth cost model turns the random block off (a few probes) and keeps the output exact.
#[test]
fn depth_model_switches_a_useless_mtp_off() {
    let Some(dir) = common::mtp::fixture("glm5") else {
        return;
    };
    common::mtp::depth_model_switches_a_useless_drafter_off(&dir);
}
