//! The `deepseek_v4` MTP block vs its reference assembled from transformers 5.23's modules
//! (`scripts/gen-deepseekv4-mtp.py` → `$VELA_CACHE/golden/deepseekv4/mtp/`, the release's
//! FP8 / MXFP4 storage at load type F32, exact products): the first draft after every prefix of
//! the 300-token prompt (the block's cache kept by the target's forwards across its 32-row
//! window), evaluated token by token and in chunks, with the target's own logits unchanged;
//! chains of 4 drafts; llama.cpp's `--mtp` GGUF beside its GGUF of the model against the same
//! reference with the GGUFs' values; which paths bind the block.

mod common;
use common::*;
use std::path::Path;
use std::sync::Arc;
use vela_compute::cpu::CpuBackend;
use vela_formats::gguf::GgufFile;
use vela_formats::quant::GgmlType;
use vela_models::deepseekv4::DeepseekV4Model;
use vela_models::{LanguageModel, MtpHead};

const BOUND: f64 = 1e-8;

fn bind(m: DeepseekV4Model<CpuBackend>, path: &Path) -> (Arc<dyn LanguageModel>, Box<dyn MtpHead>) {
    mtp::bind(Arc::new(m), path)
}

/// The checkpoint at load type F32 (the release's exact values), its block bound.
fn load(dir: &Path) -> (Arc<dyn LanguageModel>, Box<dyn MtpHead>) {
    let be = Arc::new(CpuBackend::new(2));
    bind(
        DeepseekV4Model::load_hf(be, dir, &vela_models::LoadSpec::quant(Some(GgmlType::F32)))
            .unwrap(),
        dir,
    )
}

/// `f` with exact matmul products (`VELA_MATMUL=f32`): the Q8_0 matrices' values without the
/// activations' rounding.
fn exact<T>(f: impl FnOnce() -> T) -> T {
    vela_compute::cpu::matmul::exact::set_thread_override(Some(true));
    let r = f();
    vela_compute::cpu::matmul::exact::set_thread_override(None);
    r
}

#[test]
fn first_draft_after_every_prefix_matches_the_reference() {
    let Some(dir) = golden_fixture("deepseekv4", "mtp", "mtp_rows_long.f32") else {
        return;
    };
    let (m, mut head) = load(&dir);
    // One token per forward, and chunks of 7 and 50 (a forward's first row completes the
    // previous forward's last one); the target's logits as without the block.
    let files = ("mtp_rows_long.f32", "logits_long.f32");
    exact(|| mtp::first_drafts_and_target((&m, &mut *head), &dir, files, &[1, 7, 50], BOUND));
}

#[test]
fn chained_drafts_match_the_reference() {
    let Some(dir) = golden_fixture("deepseekv4", "mtp", "mtp_chain.json") else {
        return;
    };
    let (m, mut head) = load(&dir);
    let worst = exact(|| mtp::chains(&m, &mut *head, &dir, 16, BOUND));
    eprintln!("chains of 4 drafts: greedy tokens equal, worst NMSE {worst:.2e}");
}

/// llama.cpp's GGUF of the model with its `--mtp` export beside it (`mtp-model-llamacpp.gguf`,
/// found and loaded with the model): the first drafts against HF's with the GGUFs' values of
/// the matrices the converter requantized to Q8_0.
#[test]
fn llama_cpp_mtp_gguf_matches_the_reference() {
    let Some(dir) = golden_fixture("deepseekv4", "mtp", "mtp_rows_long_gguf.f32") else {
        return;
    };
    let path = dir.join("model-llamacpp.gguf");
    let g = Arc::new(GgufFile::open(&path).unwrap());
    let be = Arc::new(CpuBackend::new(2));
    let mg = DeepseekV4Model::load_gguf(be, g, &vela_models::LoadSpec::quant(Some(GgmlType::F32)))
        .unwrap();
    let (m, mut head) = bind(mg, &path);
    assert_eq!(
        m.discover_mtp(&path),
        Some(dir.join("mtp-model-llamacpp.gguf"))
    );
    let file = "mtp_rows_long_gguf.f32";
    for chunk in [1usize, 16] {
        let worst =
            exact(|| mtp::first_drafts(&m, &mut *head, &dir, file, chunk, BOUND, &mut |_, _| {}));
        eprintln!("GGUF, chunks of {chunk}: worst first-draft NMSE {worst:.2e} over 299 rows");
    }
    let release = f32s(&dir.join("mtp_rows_long.f32"));
    let gguf = f32s(&dir.join(file));
    eprintln!(
        "(the converter's Q8_0 requantization moves the reference rows by NMSE up to {:.2e})",
        (0..release.len() / m.n_vocab())
            .map(|r| {
                let nv = m.n_vocab();
                nmse(&gguf[r * nv..(r + 1) * nv], &release[r * nv..(r + 1) * nv])
            })
            .fold(0f64, f64::max)
    );
}

/// The block binds from where it was loaded only; models without one say how to get it.
#[test]
fn mtp_is_loaded_with_the_model() {
    let Some(dir) = golden_fixture("deepseekv4", "mtp", "mtp_chain.json") else {
        return;
    };
    let be = Arc::new(CpuBackend::new(1));
    let m: Arc<dyn LanguageModel> =
        Arc::new(DeepseekV4Model::load_hf(be.clone(), &dir, &Default::default()).unwrap());
    assert_eq!(m.discover_mtp(&dir).as_deref(), Some(dir.as_path()));
    let e = m
        .load_mtp(&dir.join("mtp-model-llamacpp.gguf"))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("loaded with the model"), "{e}");
    // A checkpoint without the block (HF's save drops it) and a GGUF without an export beside.
    let plain = dir.parent().unwrap().join("flash_mini");
    if plain.join("model.safetensors").exists() {
        let p: Arc<dyn LanguageModel> =
            Arc::new(DeepseekV4Model::load_hf(be.clone(), &plain, &Default::default()).unwrap());
        assert!(p.discover_mtp(&plain).is_none());
        let e = p.load_mtp(&plain).err().unwrap().to_string();
        assert!(e.contains("no MTP layer"), "{e}");
    }
    let lone = dir
        .parent()
        .unwrap()
        .join("flash_mini_fp8/model-llamacpp.gguf");
    if lone.exists() {
        let g = Arc::new(GgufFile::open(&lone).unwrap());
        let p: Arc<dyn LanguageModel> =
            Arc::new(DeepseekV4Model::load_gguf(be, g, &Default::default()).unwrap());
        assert!(p.discover_mtp(&lone).is_none());
    }
}
