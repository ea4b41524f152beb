//! `glm5_next` geometries generated in memory (`vela_models::glm5::synth`): the real geometry's
//! config is HF's defaults (which are GLM 5.3 Flash's) with the release's pool size, the reduced
//! depth its first 12 layers; the memory plan's parameters and state; the tiny geometry runs on
//! the CPU (finite, spread, token-dependent logits; deterministic from the seed; quantized close
//! to f32).

mod common;
use common::*;
use std::sync::Arc;
use vela_compute::cpu::CpuBackend;
use vela_compute::KvType;
use vela_formats::quant::GgmlType;
use vela_models::glm5::synth;
use vela_models::glm5::{Glm5Config, Glm5Model, Indexer, Mixer};
use vela_models::LanguageModel;

fn geometry(name: &str) -> Glm5Config {
    Glm5Config::from_json(&synth::config(name).unwrap()).unwrap()
}

#[test]
fn real_geometries_are_the_published_config() {
    let g = geometry("glm5-flash");
    // transformers' defaults are the real Flash but for the pool size (spec §1) and the MTP
    // block, a key HF does not read.
    let hf = Glm5Config::from_json(&serde_json::json!({"text_config": {"index_kpool": 4}}));
    assert_eq!(g.nextn, 1);
    assert_eq!(
        g,
        Glm5Config {
            nextn: 1,
            ..hf.unwrap()
        }
    );
    let mla: Vec<usize> = (0..45).filter(|&i| g.mixers[i] == Mixer::Mla).collect();
    assert_eq!(mla, (0..11).map(|k| 4 * k + 3).collect::<Vec<_>>());
    assert_eq!(g.dense.iter().filter(|&&d| d).count(), 3);
    assert!(g.dense[..3].iter().all(|&d| d));
    assert!(g.indexers.iter().all(|&i| i == Indexer::Full));
    let dims = (g.hidden, g.n_head, g.nope_dim, g.v_dim, g.q_rank, g.kv_rank);
    assert_eq!(dims, (4096, 64, 256, 256, 1536, 512));
    let kda = (g.kda_heads, g.kda_dim, g.conv_k, g.lower_bound);
    assert_eq!(kda, (64, 128, 4, Some(-5.0)));
    let idx = (g.idx_heads, g.idx_dim, g.idx_topk, g.idx_pool);
    assert_eq!(idx, (32, 128, 2048, 4));
    let ffn = (g.n_ff, g.n_expert, g.top_k, g.n_ff_exp, g.n_shared);
    assert_eq!(ffn, (12288, 288, 8, 2048, 1));
    let rest = (g.routed_scale, g.swiglu_limit, g.n_vocab, g.hc);
    assert_eq!(rest, (2.5, 10.0, 154_880, 4));
    // The reduced depth: the first 12 layers, as they are.
    let r = geometry("glm5-flash-12l");
    assert_eq!(r.mixers, g.mixers[..12]);
    assert_eq!(r.dense, g.dense[..12]);
    assert_eq!(r.mixers.iter().filter(|&&m| m == Mixer::Mla).count(), 3);
    let (mut r2, mut g2) = (r.clone(), g.clone());
    (r2.mixers, r2.dense, r2.indexers) = (vec![], vec![], vec![]);
    (g2.mixers, g2.dense, g2.indexers) = (vec![], vec![], vec![]);
    assert_eq!(r2, g2);
    assert!(synth::config("glm5-huge").is_err());
}

#[test]
fn memory_plan_of_the_real_geometry() {
    let c = geometry("glm5-flash");
    let p = synth::parameters(&c) as f64;
    let mtp = synth::mtp_parameters(&c) as f64;
    eprintln!("{}", synth::memory_plan(&c));
    assert!((313.0e9..314.0e9).contains(&p), "{p}");
    // The public ~320B (next-archs.md §4: 320.8B with the MTP block), ~17-18B active.
    assert!((320.5e9..321.1e9).contains(&(p + mtp)), "{}", p + mtp);
    let active = synth::active_parameters(&c) as f64;
    assert!((17e9..18e9).contains(&active), "{active}");
    // The weights held: the trunk and the MTP block.
    let all = p + mtp;
    let q4 = synth::weight_bytes(&c, GgmlType::Q4_0) as f64;
    assert!((all * 0.5625..all * 0.57).contains(&q4), "{q4}");
    let bf16 = synth::weight_bytes(&c, GgmlType::BF16) as f64;
    assert!((all * 2.0..all * 2.02).contains(&bf16), "{bf16}");
    // The placement sizes: 42 MoE layers and the block's, the same total.
    let s = synth::sizes("glm5-flash", GgmlType::Q4_0).unwrap();
    assert_eq!(s.experts.len(), 43);
    assert_eq!(s.total(), q4 as u64);
    // 1M positions: per KDA layer the conv tail and matrix with 4 snapshots; per MLA layer (11
    // and the MTP block's) a 512-wide latent row per token and the indexer's 128-wide key per
    // pool of 4 plus the raw [key | gate] rows of 2·4 + 512 positions; the block's ring of
    // hiddens (2 + 512 rows of 4096).
    let n = 1usize << 20;
    let [kda, lat, idx] = synth::state_bytes(&c, n);
    assert_eq!(kda, 34 * (3 * 3 * 8192 + 64 * 128 * 128) * 4 * 5);
    assert_eq!(lat, 12 * n as u64 * 512 * 4 + 514 * 4096 * 4);
    assert_eq!(idx, 12 * ((n as u64 / 4) * 128 + 520 * 256) * 4);
    let plan = synth::memory_plan(&c);
    for row in [
        "| 1M |",
        "| 8K |",
        "| Q4_0 (",
        "| BF16 (",
        "| llama.cpp GGUF Q4_0",
    ] {
        assert!(plan.contains(row), "{row}: {plan}");
    }
}

/// Every position's logits of `toks`, fed in chunks of `chunk`.
fn logits(m: Arc<dyn LanguageModel>, toks: &[u32], chunk: usize) -> Vec<f32> {
    let mut st = m.new_state(256, chunk, KvType::F32).unwrap();
    let mut out = Vec::new();
    for (i, c) in toks.chunks(chunk).enumerate() {
        let pos: Vec<u32> = (0..c.len()).map(|j| (i * chunk + j) as u32).collect();
        out.extend(st.forward(c, &pos, 0).unwrap());
    }
    out
}

fn tiny(ty: GgmlType, seed: u64) -> Arc<dyn LanguageModel> {
    let be = Arc::new(CpuBackend::new(2));
    Arc::new(Glm5Model::synth(be, "glm5-tiny", ty, seed).unwrap())
}

#[test]
fn tiny_geometry_runs_and_is_deterministic() {
    // 80 tokens: 20 pools, more than the indexer's 8.
    let toks: Vec<u32> = (0..80).map(|i| (i * 37 + 5) % 512).collect();
    let a = logits(tiny(GgmlType::F32, 1), &toks, 80);
    assert_eq!(a.len(), 80 * 512);
    let mut argmax = std::collections::BTreeSet::new();
    for r in a.chunks(512) {
        assert!(r.iter().all(|x| x.is_finite()));
        let mean = r.iter().sum::<f32>() / 512.0;
        let sd = (r.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / 512.0).sqrt();
        assert!((0.2..20.0).contains(&sd), "logit stdev {sd}");
        argmax.insert(common::argmax(r));
    }
    assert!(argmax.len() > 20, "{} distinct argmax", argmax.len());
    assert_eq!(a, logits(tiny(GgmlType::F32, 1), &toks, 80), "same seed");
    assert_eq!(a, logits(tiny(GgmlType::F32, 1), &toks, 16), "chunks of 16");
    let other = logits(tiny(GgmlType::F32, 2), &toks, 80);
    assert!(nmse(&other, &a) > 0.1, "another seed, other weights");
    // Q8_0 only loosely: the random router's and indexer's top-k gaps are small enough for Q8_0
    // to flip choices, which the tiny random model amplifies (docs/glm5.md: the fixture's Q8_0
    // is at median position NMSE 0.11-0.40 from f32).
    let q8 = logits(tiny(GgmlType::Q8_0, 1), &toks, 80);
    let e = nmse(&q8, &a);
    eprintln!("Q8_0 vs f32 NMSE {e:.2e}");
    assert!(e < 0.2, "Q8_0 vs f32 NMSE {e:.2e}");
}
