//! Loading DeepSeek V4 as transformers 5.23 does (`scripts/gen-deepseekv4-fixtures.py` →
//! `$VELA_CACHE/golden/deepseekv4/`): the config in both key styles with HF's defaults and
//! precedence, and the release's storage formats (FP8 e4m3 with 128×128 e8m0 block scales, MXFP4
//! experts with 1×32 e8m0 scales) decoded by the weight source exactly as HF's loader
//! dequantizes them (`flash_mini_fp8/deq_*.f32`).

mod common;
use common::*;
use std::sync::Arc;
use vela_formats::quant::GgmlType;
use vela_formats::safetensors::Checkpoint;
use vela_models::deepseekv4::{Attn, DeepseekV4Config, Routing, Scoring};
use vela_models::weights::WeightSource;

fn json(p: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// Every fixture's config.json read as HF's effective config says (meta.json).
#[test]
fn configs_read_as_transformers_reads_them() {
    for name in ["flash_mini", "pro_mini", "knobs", "flash_mini_fp8"] {
        let Some(dir) = golden_fixture("deepseekv4", name, "config.json") else {
            continue;
        };
        let c = DeepseekV4Config::from_json(&json(&dir.join("config.json"))).unwrap();
        let meta = json(&dir.join("meta.json"));
        let base = if name == "flash_mini_fp8" {
            json(&dir.parent().unwrap().join("flash_mini/meta.json"))
        } else {
            meta.clone()
        };
        let hf = &base["hf_effective_config"];
        let kinds: Vec<Attn> = hf["layer_types"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| match t.as_str().unwrap() {
                "sliding_attention" => Attn::Sliding,
                "compressed_sparse_attention" => Attn::Csa,
                _ => Attn::Hca,
            })
            .collect();
        assert_eq!(c.attn, kinds, "{name}");
        let routing: Vec<Routing> = hf["mlp_layer_types"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                if t == "hash_moe" {
                    Routing::Hash
                } else {
                    Routing::TopK
                }
            })
            .collect();
        assert_eq!(c.routing, routing, "{name}");
        let rates = &hf["compress_rates"];
        assert_eq!(
            c.csa_rate as u64,
            rates["compressed_sparse_attention"].as_u64().unwrap()
        );
        assert_eq!(
            c.hca_rate as u64,
            rates["heavily_compressed_attention"].as_u64().unwrap()
        );
        assert_eq!(
            c.n_rot as u64,
            hf["qk_rope_head_dim"].as_u64().unwrap(),
            "{name}"
        );
        let rp = &hf["rope_parameters"];
        assert_eq!(
            c.rope_main.theta as f64,
            rp["main"]["rope_theta"].as_f64().unwrap()
        );
        assert!(c.rope_main.yarn.is_none());
        assert_eq!(
            c.rope_compress.theta as f64,
            rp["compress"]["rope_theta"].as_f64().unwrap()
        );
        match &c.rope_compress.yarn {
            Some(y) => {
                assert_eq!(rp["compress"]["rope_type"], "yarn", "{name}");
                assert_eq!(y.factor as f64, rp["compress"]["factor"].as_f64().unwrap());
                assert_eq!(y.attention_factor, 1.0);
            }
            None => assert_ne!(rp["compress"]["rope_type"], "yarn", "{name}"),
        }
        let sc = if hf["scoring_func"] == "sigmoid" {
            Scoring::Sigmoid
        } else {
            Scoring::SqrtSoftplus
        };
        assert_eq!(c.scoring, sc);
        for (ours, key) in [
            (c.routed_scale, "routed_scaling_factor"),
            (c.swiglu_limit, "swiglu_limit"),
            (c.hc_eps, "hc_eps"),
            (c.eps, "rms_norm_eps"),
        ] {
            assert_eq!(ours, hf[key].as_f64().unwrap() as f32, "{name} {key}");
        }
        assert_eq!(c.hc as u64, hf["hc_mult"].as_u64().unwrap());
        assert_eq!(
            c.sinkhorn_iters as u64,
            hf["hc_sinkhorn_iters"].as_u64().unwrap()
        );
        assert_eq!(c.window as u64, hf["sliding_window"].as_u64().unwrap());
        assert_eq!(c.idx_topk as u64, hf["index_topk"].as_u64().unwrap());
        assert_eq!(c.fp8, name == "flash_mini_fp8");
    }
}

/// The release's own config.json (next-archs.md §2): 43 layers from a 46-entry
/// `compress_ratios`, three hash layers, YaRN ×16 on the compress rope; and the refusals.
#[test]
fn the_release_config_and_refusals() {
    let mut ratios = vec![0, 0];
    for _ in 0..20 {
        ratios.extend([4, 128]);
    }
    ratios.extend([4, 0, 0, 0]);
    let mut j = serde_json::json!({
        "num_hidden_layers": 43, "compress_ratios": ratios, "num_hash_layers": 3,
        "qk_rope_head_dim": 64, "head_dim": 512,
        "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                         "beta_fast": 32, "beta_slow": 1},
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3"}
    });
    let c = DeepseekV4Config::from_json(&j).unwrap();
    let count = |a: Attn| c.attn.iter().filter(|&&x| x == a).count();
    assert_eq!(
        (count(Attn::Sliding), count(Attn::Csa), count(Attn::Hca)),
        (2, 21, 20)
    );
    assert_eq!(c.routing.iter().filter(|&&r| r == Routing::Hash).count(), 3);
    assert_eq!(c.n_rot, 64);
    assert_eq!(c.rope_compress.yarn.as_ref().unwrap().factor, 16.0);
    assert!(c.rope_main.yarn.is_none() && c.fp8);
    assert!(c.summary().contains("21 CSA"));
    j["compress_ratios"][5] = serde_json::json!(8);
    let e = DeepseekV4Config::from_json(&j).unwrap_err().to_string();
    assert!(e.contains("compress_ratios"), "{e}");
    j["compress_ratios"][5] = serde_json::json!(4);
    j["scoring_func"] = serde_json::json!("softmax");
    assert!(DeepseekV4Config::from_json(&j).is_err());
    j["scoring_func"] = serde_json::json!("sigmoid");
    j["num_hidden_layers"] = serde_json::json!(50);
    let e = DeepseekV4Config::from_json(&j).unwrap_err().to_string();
    assert!(e.contains("layer types for 50"), "{e}");
    // Neither key: HF's default pattern (2 HCA, then HCA/CSA alternating).
    let d = DeepseekV4Config::from_json(&serde_json::json!({"num_hidden_layers": 6})).unwrap();
    use Attn::{Csa, Hca};
    assert_eq!(d.attn, [Hca, Hca, Hca, Csa, Hca, Csa]);
}

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
