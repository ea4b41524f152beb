//! `deepseek_v4` geometries generated in memory (`vela_models::deepseekv4::synth`): the real
//! geometry's config is the release config.json's parse, the tiny one loads and runs on the CPU
//! (finite logits, deterministic from the seed, quantized close to f32), and the memory plan
//! gives the release's sizes.

mod common;
use common::*;
use std::sync::Arc;
use vela_compute::cpu::CpuBackend;
use vela_compute::KvType;
use vela_formats::quant::GgmlType;
use vela_models::deepseekv4::synth::{self, Storage};
use vela_models::deepseekv4::{Attn, DeepseekV4Config, DeepseekV4Model, Routing};
use vela_models::LanguageModel;

/// The release's config.json as published (spec §1; next-archs.md §2): 46 `compress_ratios`
/// (the trailing three are the MTP / DSpark stages), FP8 storage.
fn release_config() -> serde_json::Value {
    let mut ratios = vec![0, 0];
    for _ in 0..20 {
        ratios.extend([4, 128]);
    }
    ratios.extend([4, 0, 0, 0]);
    let mut j: serde_json::Value = serde_json::from_str(
        r#"{
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
        "vocab_size": 129280, "hidden_size": 4096, "num_hidden_layers": 43,
        "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512,
        "qk_rope_head_dim": 64, "q_lora_rank": 1024, "o_groups": 8, "o_lora_rank": 1024,
        "sliding_window": 128, "num_hash_layers": 3,
        "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512,
        "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 6,
        "moe_intermediate_size": 2048, "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc",
        "norm_topk_prob": true, "routed_scaling_factor": 1.5, "swiglu_limit": 10.0,
        "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
        "rope_theta": 10000, "compress_rope_theta": 160000,
        "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                         "beta_fast": 32, "beta_slow": 1},
        "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": false,
        "max_position_embeddings": 1048576, "expert_dtype": "fp4",
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                "weight_block_size": [128, 128], "scale_fmt": "ue8m0"}
        }"#,
    )
    .unwrap();
    j["compress_ratios"] = serde_json::json!(ratios);
    j
}

#[test]
fn real_geometries_are_the_release_config() {
    let mut release = DeepseekV4Config::from_json(&release_config()).unwrap();
    assert!(release.fp8);
    // The geometry is generated in the requested type, not stored as FP8.
    release.fp8 = false;
    let g = DeepseekV4Config::from_json(&synth::config("deepseek-v4-flash").unwrap()).unwrap();
    assert_eq!(g, release);
    let count = |a: Attn| g.attn.iter().filter(|&&x| x == a).count();
    assert_eq!(
        (count(Attn::Sliding), count(Attn::Csa), count(Attn::Hca)),
        (2, 21, 20)
    );
    assert_eq!(g.rope_compress.yarn.as_ref().unwrap().factor, 16.0);
    // The reduced depth: the first 12 layers, as they are.
    let r = DeepseekV4Config::from_json(&synth::config("deepseek-v4-flash-12l").unwrap()).unwrap();
    assert_eq!(r.attn, release.attn[..12]);
    assert_eq!(r.routing, release.routing[..12]);
    assert_eq!(r.routing.iter().filter(|&&x| x == Routing::Hash).count(), 3);
    let (mut r2, mut rel) = (r.clone(), release.clone());
    (r2.attn, r2.routing, rel.attn, rel.routing) = (vec![], vec![], vec![], vec![]);
    assert_eq!(r2, rel);
    assert!(synth::config("deepseek-v9").is_err());
}

#[test]
fn memory_plan_of_the_release() {
    let c = DeepseekV4Config::from_json(&synth::config("deepseek-v4-flash").unwrap()).unwrap();
    let p = synth::parameters(&c) as f64;
    assert!((283e9..286e9).contains(&p), "{p}");
    // The release's files are ~160 GB.
    let rel = synth::weight_bytes(&c, Storage::Release) as f64;
    assert!((150e9..165e9).contains(&rel), "{rel}");
    let q4 = synth::weight_bytes(&c, Storage::Quant(GgmlType::Q4_0)) as f64;
    assert!((p * 0.5625..p * 0.57).contains(&q4), "{q4}");
    // 1M positions: every CSA layer holds 256K entries of 512 f32 plus its indexer's of 128.
    let [win, comp, idx] = synth::state_bytes(&c, 1 << 20);
    assert_eq!(
        idx,
        21 * (1 << 18) * 128 * 4 + 21 * (2 * 4 + 512) * 2 * 128 * 2 * 4
    );
    assert!(
        comp > 21 * (1 << 18) * 512 * 4 && win < 1 << 27,
        "{comp} {win}"
    );
    assert!(synth::memory_plan(&c).contains("| 1M |"));
}

#[test]
fn tiny_geometry_loads_runs_and_is_deterministic() {
    let run = |seed: u64, ty: GgmlType| {
        let be = Arc::new(CpuBackend::new(2));
        let m: Arc<dyn LanguageModel> =
            Arc::new(DeepseekV4Model::synth(be, "deepseek-v4-tiny", ty, seed).unwrap());
        let mut st = m.clone().new_state(256, 32, KvType::F32).unwrap();
        // More tokens than an HCA window would pool is not needed here; enough for CSA entries
        // beyond the indexer's 16.
        let toks: Vec<u32> = (0..96).map(|i| (i * 37 + 5) % 500).collect();
        let pos: Vec<u32> = (0..96).collect();
        let a = st.forward(&toks[..32], &pos[..32], 0).unwrap();
        let b = st.forward(&toks[32..64], &pos[32..64], 0).unwrap();
        let c = st.forward(&toks[64..], &pos[64..], 0).unwrap();
        let mut all = a;
        all.extend(b);
        all.extend(&c);
        assert!(all.iter().all(|x| x.is_finite()));
        c
    };
    let a = run(1, GgmlType::F32);
    let b = run(1, GgmlType::F32);
    let c = run(2, GgmlType::F32);
    assert_eq!(a, b, "same seed, same logits");
    assert_ne!(a, c, "another seed, other weights");
    let q = run(1, GgmlType::Q8_0);
    let e = nmse(&q, &a);
    assert!(e < 1e-2, "Q8_0 vs f32 NMSE {e:.2e}");
    let rms = (a.iter().map(|x| x * x).sum::<f32>() / a.len() as f32).sqrt();
    assert!((0.05..50.0).contains(&rms), "logit rms {rms}");
    // Q4_0, the default: runs too.
    let q4 = run(1, GgmlType::Q4_0);
    assert!(nmse(&q4, &a) < 0.2);
}

/// The geometries carry the MTP block (generated like the rest): it binds, drafts from the
/// target's state (finite logits, the same for the same seed) and leaves the target's logits as
/// they are without it.
#[test]
fn tiny_geometry_drafts_with_its_mtp_block() {
    let toks: Vec<u32> = (0..70).map(|i| (i * 37 + 5) % 500).collect();
    let run = |bind: bool| {
        let be = Arc::new(CpuBackend::new(2));
        let m: Arc<dyn LanguageModel> =
            Arc::new(DeepseekV4Model::synth(be, "deepseek-v4-tiny", GgmlType::Q8_0, 1).unwrap());
        let path = std::path::Path::new("synth:deepseek-v4-tiny");
        let found = m.discover_mtp(path).expect("the geometry has an MTP block");
        let mut head = bind.then(|| m.load_mtp(&found).unwrap());
        let mut st = m.clone().new_state(256, 16, KvType::F32).unwrap();
        let mut logits = Vec::new();
        for (i, c) in toks.chunks(16).enumerate() {
            let pos: Vec<u32> = (0..c.len()).map(|j| (i * 16 + j) as u32).collect();
            logits.extend(st.forward(c, &pos, 0).unwrap());
        }
        let mut drafts = Vec::new();
        if let Some(h) = head.as_mut() {
            h.draft(&mut *st, 7, toks.len(), 3, &mut |lg| {
                assert!(lg.iter().all(|x| x.is_finite()));
                drafts.push(lg);
                Ok(argmax(drafts.last().unwrap()) as u32)
            })
            .unwrap();
        }
        (logits, drafts)
    };
    let (plain, none) = run(false);
    assert!(none.is_empty());
    let (a, da) = run(true);
    let (_, db) = run(true);
    assert_eq!(a, plain, "the target's logits with the block bound");
    assert_eq!(da.len(), 3);
    assert_eq!(da, db, "same seed, same drafts");
}
