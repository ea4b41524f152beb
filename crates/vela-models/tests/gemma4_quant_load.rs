//! Quantization at load (`--quant`): an HF safetensors checkpoint served as Q8_0 gives the same
//! logits, bit for bit, as llama.cpp's own GGUF of that quantization (the converter's output
//! through `llama-quantize Q8_0`) — for the float32 fixtures and their bfloat16 copies; served as
//! BF16, a bfloat16 checkpoint matches the converter's `--outtype bf16` GGUF the same way.
//!
//! Fixtures: `scripts/gen-gemma4-fixtures.py` (`model-q8_0.gguf`, `bf16/`).

mod common;
use common::*;
use std::path::Path;
use std::sync::Arc;
use vela_compute::cpu::CpuBackend;
use vela_formats::gguf::GgufFile;
use vela_formats::quant::GgmlType;
use vela_models::gemma4::Gemma4Model;

fn hf(dir: &Path, quant: Option<GgmlType>) -> Vec<f32> {
    let spec = vela_models::LoadSpec::quant(quant);
    let m = Gemma4Model::load_hf_with(Arc::new(CpuBackend::new(2)), dir, &spec).unwrap();
    run_chunked(&m, &tokens(dir), 8)
}

fn gguf(path: &Path, tokens_dir: &Path) -> Vec<f32> {
    let g = Arc::new(GgufFile::open(path).unwrap());
    let m = Gemma4Model::load_gguf(Arc::new(CpuBackend::new(2)), g).unwrap();
    run_chunked(&m, &tokens(tokens_dir), 8)
}

/// Bit-identical, or a panic naming the first difference (not the whole vectors).
fn same(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    if let Some(i) = (0..a.len()).find(|&i| a[i].to_bits() != b[i].to_bits()) {
        panic!(
            "{what}: first difference at {i}: {} vs {}; NMSE {:.3e}",
            a[i],
            b[i],
            nmse(a, b)
        );
    }
}

fn tokens(dir: &Path) -> Vec<u32> {
    let d = if dir.join("tokens.json").exists() {
        dir.to_path_buf()
    } else {
        dir.parent().unwrap().to_path_buf()
    };
    ids(&tokens_json(&d), "tokens")
}

#[test]
fn hf_quantized_at_load_matches_the_gguf_of_that_quantization() {
    for name in ["dense_keqv", "moe"] {
        let Some(b) = golden_fixture("gemma4", name, "bf16/model-q8_0.gguf") else {
            continue;
        };
        let dir = b.parent().unwrap().to_path_buf();
        let q8 = Some(GgmlType::Q8_0);
        let want = gguf(&dir.join("model-q8_0.gguf"), &dir);
        same(
            &hf(&dir, q8),
            &want,
            &format!("{name}: f32 checkpoint as Q8_0"),
        );
        // `--quant bf16` gives the converter's `--outtype bf16` (the router in F32).
        let want = gguf(&b.join("model-bf16.gguf"), &dir);
        let bf16 = Some(GgmlType::BF16);
        same(
            &hf(&b, bf16),
            &want,
            &format!("{name}: bf16 checkpoint as bf16"),
        );
        let want = gguf(&b.join("model-q8_0.gguf"), &dir);
        let got = hf(&b, q8);
        same(&got, &want, &format!("{name}: bf16 checkpoint as Q8_0"));
        // Not a tautology: the quantized logits differ from the unquantized ones.
        assert!(nmse(&got, &hf(&b, None)) > 0.0, "{name}");
    }
}
