//! The `qwen4_exp` MTP layer vs its reference assembled from transformers 5.23's modules
//! (`scripts/gen-qwen4exp-mtp.py` → `$VELA_CACHE/golden/qwen4exp/mtp/`): the first draft after
//! every prefix of a 128-token prompt (the layer's cache kept by the target's forwards, with the
//! indexer dropping blocks), evaluated token by token and in chunks, and chains of 4 drafts.

mod common;
use common::*;
use std::path::Path;
use std::sync::Arc;
use vela_compute::cpu::CpuBackend;
use vela_models::qwen4exp::Qwen4ExpModel;
use vela_models::{LanguageModel, MtpHead};

const BOUND: f64 = 1e-8;

fn load(dir: &Path) -> (Arc<dyn LanguageModel>, Box<dyn MtpHead>) {
    let m: Arc<dyn LanguageModel> = Arc::new(
        Qwen4ExpModel::load_hf(Arc::new(CpuBackend::new(2)), dir, &Default::default()).unwrap(),
    );
    let found = m
        .discover_mtp(dir)
        .expect("the checkpoint has an MTP layer");
    let head = m.load_mtp(&found).unwrap();
    (m, head)
}

#[test]
fn first_draft_after_every_prefix_matches_the_reference() {
    let Some(dir) = golden_fixture("qwen4exp", "mtp", "mtp_rows_long.f32") else {
        return;
    };
    let (m, mut head) = load(&dir);
    // One token per forward, and chunks of 7 and 50 (a forward's first row completes the
    // previous forward's last one): after each forward, one draft of the next prompt token.
    for chunk in [1usize, 7, 50] {
        let file = "mtp_rows_long.f32";
        let worst = mtp::first_drafts(&m, &mut *head, &dir, file, chunk, BOUND, &mut |_, _| {});
        eprintln!("chunks of {chunk}: worst first-draft NMSE {worst:.2e}");
    }
}

#[test]
fn chained_drafts_match_the_reference() {
    let Some(dir) = golden_fixture("qwen4exp", "mtp", "mtp_chain.json") else {
        return;
    };
    let (m, mut head) = load(&dir);
    mtp::chains(&m, &mut *head, &dir, 16, BOUND);
}

#[test]
fn mtp_needs_the_models_own_checkpoint() {
    let Some(dir) = golden_fixture("qwen4exp", "mtp", "mtp_chain.json") else {
        return;
    };
    let m: Arc<dyn LanguageModel> = Arc::new(
        Qwen4ExpModel::load_hf(Arc::new(CpuBackend::new(1)), &dir, &Default::default()).unwrap(),
    );
    let other = dir.parent().unwrap().join("gdn_qsa");
    let e = m.load_mtp(&other).err().unwrap().to_string();
    assert!(e.contains("loaded with the model"), "{e}");
    // A checkpoint without the layer has none to offer.
    if other.join("model.safetensors").exists() {
        let plain: Arc<dyn LanguageModel> = Arc::new(
            Qwen4ExpModel::load_hf(Arc::new(CpuBackend::new(1)), &other, &Default::default())
                .unwrap(),
        );
        assert!(plain.discover_mtp(&other).is_none());
        let e = plain.load_mtp(&other).err().unwrap().to_string();
        assert!(e.contains("no MTP layer"), "{e}");
    }
}
