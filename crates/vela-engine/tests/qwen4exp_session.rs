//! Qwen3.8 Flash Next (`qwen4_exp`) through the engine's sessions on the tiny `ple` fixture
//! (`scripts/gen-qwen4exp-fixtures.py`): a follow-up turn that restores the checkpoint taken after
//! the previous prompt and evaluates only its new tokens gives the bits of a fresh run over the
//! whole conversation (recurrent, n-gram and indexer state included); rollback without a
//! checkpoint is refused, since the recurrent layers keep no per-position snapshots.

use std::sync::Arc;
use vela_compute::cpu::CpuBackend;
use vela_compute::KvType;
use vela_engine::{Session, SessionOptions};
use vela_formats::testdata;

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn follow_up_turn_from_a_checkpoint_equals_a_fresh_run() {
    let Some(dir) = testdata::require(testdata::golden_dir().join("qwen4exp/ple/config.json"))
    else {
        return;
    };
    let dir = dir.parent().unwrap();
    let m = vela_models::load_hf_any(Arc::new(CpuBackend::new(2)), dir).unwrap();
    let p: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("prompts.json")).unwrap()).unwrap();
    let conv = ids(&p["prompts"]["long"]);
    let opts = SessionOptions {
        n_ctx: 256,
        ubatch: 16,
        kv_type: KvType::F32,
    };
    let mut fresh = Session::new(m.clone(), &opts).unwrap();
    let want = fresh.eval(&conv).unwrap();

    // Turn 1: the first 70 tokens, a checkpoint, then an answer the next turn renders
    // differently (a detour of other tokens).
    let mut s = Session::new(m.clone(), &opts).unwrap();
    s.eval(&conv[..70]).unwrap();
    let cp = s.checkpoint();
    s.eval(&[5, 6, 7, 8, 9, 10, 11]).unwrap();
    assert!(
        !s.can_truncate(70),
        "recurrent state cannot drop positions without a checkpoint"
    );
    assert!(s.truncate(70).is_err());
    s.restore(&cp).unwrap();
    let got = s.eval(&conv[70..]).unwrap();
    assert_eq!(got, want, "turn 2 from the checkpoint vs a fresh run");
    assert!(cp.bytes() > 0, "the checkpoint copies the recurrent state");
    // A fork continues identically.
    let mut f = s.fork().unwrap();
    let (a, b) = (s.eval(&[3]).unwrap(), f.eval(&[3]).unwrap());
    assert_eq!(a, b, "fork");
}
