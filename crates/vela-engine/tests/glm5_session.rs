//! GLM 5.3 (`glm5_next`) through the engine's sessions on the tiny fixtures of
//! `scripts/gen-glm5-fixtures.py` (`flash_mini`; `knobs` with a shared indexer layer): a
//! follow-up turn that restores the checkpoint taken after the previous prompt gives the bits
//! of a fresh run over the whole conversation (KDA conv tails and matrices, MLA latent rows,
//! indexer pooled keys and raw rows included); dropping up to the snapshot limit of trailing
//! positions needs no checkpoint, beyond it is refused; speculative decoding gives plain
//! greedy decoding's tokens (`common/hybrid.rs`).

mod common;
use std::sync::Arc;
use vela_compute::cpu::CpuBackend;
use vela_formats::testdata;
use vela_models::LanguageModel;

const FIXTURES: &[&str] = &["flash_mini", "knobs"];

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn fixture(name: &str) -> Option<(Arc<dyn LanguageModel>, serde_json::Value)> {
    let dir = testdata::require(
        testdata::golden_dir()
            .join("glm5")
            .join(name)
            .join("config.json"),
    )?;
    let dir = dir.parent().unwrap();
    let m = vela_models::load_hf_any(Arc::new(CpuBackend::new(2)), dir).unwrap();
    let p = serde_json::from_str(&std::fs::read_to_string(dir.join("prompts.json")).unwrap());
    Some((m, p.unwrap()))
}

#[test]
fn follow_up_turn_from_a_checkpoint_equals_a_fresh_run() {
    for name in FIXTURES {
        let Some((m, p)) = fixture(name) else {
            continue;
        };
        let limit = vela_models::glm5::SNAPSHOTS;
        common::hybrid::follow_up_turn(&m, &ids(&p["prompts"]["long"]), 16, limit);
    }
}

/// A repetitive prompt, so lookup drafts get accepted.
#[test]
fn speculative_greedy_equals_plain_greedy() {
    for name in FIXTURES {
        let Some((m, p)) = fixture(name) else {
            continue;
        };
        let base = ids(&p["prompts"]["short"]);
        let prompt: Vec<u32> = base.iter().chain(&base).chain(&base).copied().collect();
        let limit = vela_models::glm5::SNAPSHOTS;
        common::hybrid::speculative_equals_plain(&m, &prompt, 16, limit, name);
    }
}
