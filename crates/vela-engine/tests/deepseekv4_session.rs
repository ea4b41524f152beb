//! DeepSeek V4 (`deepseek_v4`) through the engine's sessions on the tiny `flash_mini` fixture
//! (`scripts/gen-deepseekv4-fixtures.py`: sliding, CSA and HCA layers): a follow-up turn from a
//! checkpoint gives the bits of a fresh run over the whole conversation (windows, compressed
//! entries, indexer keys and the compressors' open windows included); dropping up to a batch of
//! trailing positions needs no checkpoint, beyond it is refused; speculative decoding gives
//! plain greedy decoding's tokens (`common/hybrid.rs`).

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
    let dir = testdata::require(testdata::golden_dir().join("deepseekv4/flash_mini/config.json"))?;
    let dir = dir.parent().unwrap();
    let m = vela_models::load_hf_any(Arc::new(CpuBackend::new(2)), dir).unwrap();
    let p = serde_json::from_str(&std::fs::read_to_string(dir.join("prompts.json")).unwrap());
    Some((m, p.unwrap()))
}

#[test]
fn follow_up_turn_from_a_checkpoint_equals_a_fresh_run() {
    let Some((m, p)) = fixture() else { return };
    // The raw rings keep a batch of positions beyond what the model reads.
    common::hybrid::follow_up_turn(&m, &ids(&p["prompts"]["long"]), 16, 16);
}

/// A repetitive prompt, so lookup drafts get accepted.
#[test]
fn speculative_greedy_equals_plain_greedy() {
    let Some((m, p)) = fixture() else { return };
    let base = ids(&p["prompts"]["short"]);
    let prompt: Vec<u32> = base.iter().chain(&base).chain(&base).copied().collect();
    common::hybrid::speculative_equals_plain(&m, &prompt, 16, 16, "deepseek_v4");
}
