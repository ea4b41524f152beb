//! DeepSeek V4's released storage formats (FP8 e4m3 with 128×128 e8m0 block scales, MXFP4
//! experts with 1×32 e8m0 scales) decoded by the weight source exactly as transformers 5.23's
//! loader dequantizes them (`scripts/gen-deepseekv4-fixtures.py` → `flash_mini_fp8/deq_*.f32`).

mod common;
use common::*;
use std::sync::Arc;
use vela_formats::quant::GgmlType;
use vela_formats::safetensors::Checkpoint;
use vela_models::weights::WeightSource;

#[test]
fn fp8_and_mxfp4_decode_as_transformers_does() {
    let Some(dir) = golden_fixture("deepseekv4", "flash_mini_fp8", "deq_layers.2.attn.wq_b.f32")
    else {
        return;
    };
    let src = WeightSource::hf(Arc::new(Checkpoint::open(&dir).unwrap()), "");
    for (name, ty) in [
        ("layers.2.attn.wq_a", GgmlType::BF16),
        ("layers.2.attn.wq_b", GgmlType::BF16),
        ("layers.2.ffn.experts.1.w1", GgmlType::Q8_0),
        ("layers.2.ffn.experts.1.w3", GgmlType::Q8_0),
        ("layers.2.ffn.experts.1.w2", GgmlType::Q8_0),
    ] {
        let w = src.get(&format!("{name}.weight")).unwrap();
        assert_eq!(w.ty, ty, "{name}");
        let want = f32s(&dir.join(format!("deq_{name}.f32")));
        let got = w.to_f32().unwrap();
        assert_eq!(got.len(), want.len(), "{name}");
        assert!(
            got == want,
            "{name}: decoded values differ from transformers'"
        );
    }
    // A BF16 tensor next to them is read as stored.
    assert_eq!(src.get("embed.weight").unwrap().ty, GgmlType::BF16);
}
