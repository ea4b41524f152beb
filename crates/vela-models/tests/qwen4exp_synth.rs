//! `qwen4_exp` geometries generated in memory (`vela_models::qwen4exp::synth`): the PLE hash
//! constants as transformers computes them at the real config, a test-sized geometry that loads,
//! runs and drafts, deterministic from the seed, and the real configs' sizes.

mod common;
use common::*;
use std::sync::Arc;
use vela_compute::cpu::CpuBackend;
use vela_compute::KvType;
use vela_formats::quant::GgmlType;
use vela_models::qwen4exp::synth::{config, ple_constants};
use vela_models::qwen4exp::{Qwen4ExpConfig, Qwen4ExpModel};
use vela_models::LanguageModel;

#[test]
fn ple_constants_match_transformers_at_the_real_config() {
    let Some(dir) = golden_fixture("qwen4exp", "real_hash", "ngram_ids.json") else {
        return;
    };
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("ngram_ids.json")).unwrap())
            .unwrap();
    let c = &j["config"];
    let u = |k: &str| c[k].as_u64().unwrap();
    let ints = |v: &serde_json::Value| -> Vec<u64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect()
    };
    for l in j["layers"].as_array().unwrap() {
        let idx = l["ple_layer_index"].as_u64().unwrap() as usize;
        let (mult, sizes, offsets) = ple_constants(
            u("vocab_size"),
            u("ngram_size") as usize,
            u("heads_per_ngram") as usize,
            u("ngram_vocab_size_base"),
            idx,
            u("seed"),
        );
        assert_eq!(mult, ints(&l["layer_multipliers"]), "layer {idx}");
        assert_eq!(sizes, ints(&l["head_vocab_sizes"]), "layer {idx}");
        assert_eq!(offsets, ints(&l["head_offsets"]), "layer {idx}");
    }
}

#[test]
fn real_configs_parse_with_the_published_sizes() {
    let c = Qwen4ExpConfig::from_json(&config("qwen3.8-flash-next").unwrap()).unwrap();
    assert_eq!(c.mixers.len(), 48);
    assert_eq!(c.qkv_width(), 2048 + 2048 + 6144);
    // Experts: 48 layers × 512 × 3 × 640 × 2560 ≈ 121B of the 125B trunk.
    let experts = 48 * c.n_expert * 3 * c.n_ff_exp * c.hidden;
    assert!((120e9..122e9).contains(&(experts as f64)), "{experts}");
    let r = Qwen4ExpConfig::from_json(&config("qwen3.8-flash-next-12l").unwrap()).unwrap();
    assert_eq!(r.mixers.len(), 12);
    assert_eq!(r.ple.as_ref().unwrap().layers, vec![1]);
    assert!(config("qwen9").is_err());
}

#[test]
fn tiny_geometry_loads_runs_drafts_and_is_deterministic() {
    let run = |seed: u64, ty: GgmlType| {
        let be = Arc::new(CpuBackend::new(2));
        let m: Arc<dyn LanguageModel> =
            Arc::new(Qwen4ExpModel::synth(be, "qwen4exp-tiny", ty, seed).unwrap());
        let mut st = m.clone().new_state(128, 24, KvType::F32).unwrap();
        let toks: Vec<u32> = (0..40).map(|i| (i * 37 + 5) % 500).collect();
        let pos: Vec<u32> = (0..40).collect();
        let lg = st.forward(&toks[..16], &pos[..16], 0).unwrap();
        let lg2 = st.forward(&toks[16..], &pos[16..], 0).unwrap();
        assert!(lg.iter().chain(&lg2).all(|x| x.is_finite()));
        // The MTP layer is part of the geometry.
        let found = m.discover_mtp(std::path::Path::new("synth")).is_some();
        (lg2, found)
    };
    let (a, mtp) = run(1, GgmlType::F32);
    let (b, _) = run(1, GgmlType::F32);
    let (c, _) = run(2, GgmlType::F32);
    assert!(mtp);
    assert_eq!(a, b, "same seed, same logits");
    assert_ne!(a, c, "another seed, other weights");
    // Quantized at generation: close to the f32 model.
    let (q, _) = run(1, GgmlType::Q8_0);
    let e = nmse(&q, &a);
    assert!(e < 1e-2, "Q8_0 vs f32 NMSE {e:.2e}");
    // Logits of unit scale (weights N(0, 1/fan_in)).
    let rms = (a.iter().map(|x| x * x).sum::<f32>() / a.len() as f32).sqrt();
    assert!((0.05..50.0).contains(&rms), "logit rms {rms}");
}
