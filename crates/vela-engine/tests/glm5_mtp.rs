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
    let m = common::mtp::model(&dir);
    let _bound = m.load_mtp(&dir).unwrap();
    let long = common::mtp::prompt(&dir, "long");
    common::hybrid::follow_up_turn(&m, &long, 16, vela_models::glm5::SNAPSHOTS);
    let cfg = vela_engine::SamplerConfig::greedy();
    let turn2 = &long[70..120];
    let mut fresh = common::mtp::session(&m, 16);
    let mut d = common::mtp::drafter(&m, &dir, true);
    let conv: Vec<u32> = long[..70].iter().chain(turn2).copied().collect();
    let rule = vela_engine::speculative::AcceptRule::Exact;
    let (want, _) = common::spec(&mut fresh, &mut *d, &cfg, &conv, 24, 3, rule);
    let mut s = common::mtp::session(&m, 16);
    s.eval(&long[..70]).unwrap();
    let cp = s.checkpoint();
    s.eval(&[5, 6, 7, 8, 9]).unwrap();
    s.restore(&cp).unwrap();
    let (got, st) = common::spec(&mut s, &mut *d, &cfg, turn2, 24, 3, rule);
    assert_eq!(got, want, "turn 2 from the checkpoint vs a fresh run");
    assert!(st.accepted > 0 && st.drafted > st.accepted, "{st:?}");
    common::mtp::assert_cache_as_plain(&m, &dir, &mut s, "turn 2");
}

/// The depth cost model turns the random block off (a few probes) and keeps the output exact.
#[test]
fn depth_model_switches_a_useless_mtp_off() {
    let Some(dir) = common::mtp::fixture("glm5") else {
        return;
    };
    common::mtp::depth_model_switches_a_useless_drafter_off(&dir);
}
