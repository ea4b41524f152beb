//! Qwen3.8 Flash Next (`qwen4_exp`) through the engine's sessions on the tiny `ple` fixture
//! (`scripts/gen-qwen4exp-fixtures.py`): a follow-up turn that restores the checkpoint taken after
//! the previous prompt and evaluates only its new tokens gives the bits of a fresh run over the
//! whole conversation (recurrent, n-gram and indexer state included); dropping up to the
//! snapshot limit of trailing positions needs no checkpoint, beyond it is refused; speculative
//! decoding gives plain greedy decoding's tokens (`common/hybrid.rs`).

mod common;
use std::sync::Arc;
use vela_compute::cpu::CpuBackend;
use vela_formats::testdata;
use vela_models::LanguageModel;

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn fixture() -> Option<(Arc<dyn LanguageModel>, serde_json::Value)> {
    let dir = testdata::require(testdata::golden_dir().join("qwen4exp/ple/config.json"))?;
    let dir = dir.parent().unwrap();
    let m = vela_models::load_hf_any(Arc::new(CpuBackend::new(2)), dir).unwrap();
    let p = serde_json::from_str(&std::fs::read_to_string(dir.join("prompts.json")).unwrap());
    Some((m, p.unwrap()))
}

#[test]
fn follow_up_turn_from_a_checkpoint_equals_a_fresh_run() {
    let Some((m, p)) = fixture() else { return };
    let limit = vela_models::qwen4exp::SNAPSHOTS;
    common::hybrid::follow_up_turn(&m, &ids(&p["prompts"]["long"]), 16, limit);
}

/// A repetitive prompt, so lookup drafts get accepted.
#[test]
fn speculative_greedy_equals_plain_greedy() {
    let Some((m, p)) = fixture() else { return };
    let base = ids(&p["prompts"]["short"]);
    let prompt: Vec<u32> = base.iter().chain(&base).chain(&base).copied().collect();
    let limit = vela_models::qwen4exp::SNAPSHOTS;
    common::hybrid::speculative_equals_plain(&m, &prompt, 16, limit, "qwen4_exp");
}
