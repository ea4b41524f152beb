//! DSpark drafting for `deepseek_v4` on the tiny `dspark` fixture (`scripts/gen-deepseekv4-with-dspark.py`:
//! `flash_mini` with three DSpark stages, an independent float64 reference of the drafter): each
//! drafted block's logits and greedy chain equal the reference's, the confidence head stops a
//! block where the reference's confidence falls below the threshold, greedy speculation equals
//! plain decoding, sampled speculation is distributed as plain decoding, and the stages' context
//! rows survive rollbacks and checkpoints (`common/mtp.rs`).

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use vela_compute::cpu::CpuBackend;
use vela_formats::testdata;
use vela_models::deepseekv4::DeepseekV4Model;
use vela_models::LanguageModel;

fn fixture() -> Option<PathBuf> {
    testdata::require(testdata::golden_dir().join("deepseekv4/dspark/dspark.json"))
        .map(|p| p.parent().unwrap().to_path_buf())
}

fn model(dir: &Path, p_min: f32) -> Arc<dyn LanguageModel> {
    let m = vela_models::load_hf_any(Arc::new(CpuBackend::new(1)), dir).unwrap();
    m.as_any()
        .downcast_ref::<DeepseekV4Model<CpuBackend>>()
        .expect("a deepseek_v4 model")
        .set_dspark_p_min(p_min);
    // Bound before any evaluation: forwards keep the stages' context rows from then on.
    m.load_mtp(dir).unwrap();
    m
}

fn json(dir: &Path, f: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join(f)).unwrap()).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn prompt(dir: &Path, name: &str) -> Vec<u32> {
    ids(&json(dir, "prompts.json")["prompts"][name])
}

#[test]
fn drafts_match_the_reference() {
    let Some(dir) = fixture() else { return };
    vela_compute::cpu::matmul::exact::set_thread_override(Some(true));
    let m = model(&dir, 0.0);
    let want_j = json(&dir, "dspark.json");
    let block = want_j["block"].as_u64().unwrap() as usize;
    let v = m.n_vocab();
    let raw = std::fs::read(dir.join("dspark_logits.f32")).unwrap();
    let want: Vec<f32> = raw
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let long = prompt(&dir, "long");
    let points = ids(&want_j["points"]);
    let mut worst = 0f64;
    for (i, &p) in points.iter().enumerate() {
        let p = p as usize;
        let mut s = common::mtp::session(&m, 16);
        for c in long[..p].chunks(16) {
            s.eval(c).unwrap();
        }
        let got = common::mtp::drafts(&m, &dir, &mut s, long[p], block);
        assert_eq!(got.len(), block, "point {p}: a whole block");
        let mut chain = Vec::new();
        for (j, row) in got.iter().enumerate() {
            let w = &want[(i * block + j) * v..][..v];
            let (mut e, mut n) = (0f64, 0f64);
            for (a, b) in row.iter().zip(w) {
                e += (*a as f64 - *b as f64).powi(2);
                n += (*b as f64).powi(2);
            }
            worst = worst.max(e / n);
            let am = row
                .iter()
                .enumerate()
                .fold(
                    (0, f32::NEG_INFINITY),
                    |b, (i, &x)| if x > b.1 { (i, x) } else { b },
                )
                .0;
            chain.push(am as u32);
        }
        assert_eq!(chain, ids(&want_j["drafts"][i]), "point {p}: greedy chain");
    }
    eprintln!("DSpark drafts at {points:?}: worst per-row NMSE {worst:.2e}");
    assert!(worst <= 1e-8, "NMSE {worst:.2e}");
}

/// A block stops at the first position whose reference confidence is below the threshold.
#[test]
fn confidence_stops_a_block() {
    let Some(dir) = fixture() else { return };
    vela_compute::cpu::matmul::exact::set_thread_override(Some(true));
    let want_j = json(&dir, "dspark.json");
    let block = want_j["block"].as_u64().unwrap() as usize;
    let long = prompt(&dir, "long");
    let points = ids(&want_j["points"]);
    let mut stops = Vec::new();
    for p_min in [0.5f32, 0.9, 0.999] {
        let m = model(&dir, p_min);
        for (i, &p) in points.iter().enumerate() {
            let p = p as usize;
            let conf: Vec<f64> = want_j["confidence"][i]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            // Thresholds within 1e-5 of a confidence would make the test depend on rounding.
            assert!(conf.iter().all(|c| (c - p_min as f64).abs() > 1e-5));
            let want = conf.iter().position(|&c| c < p_min as f64).unwrap_or(block);
            let mut s = common::mtp::session(&m, 16);
            for c in long[..p].chunks(16) {
                s.eval(c).unwrap();
            }
            let got = common::mtp::drafts(&m, &dir, &mut s, long[p], block).len();
            assert_eq!(got, want, "p_min {p_min}, point {p}");
            stops.push(got);
        }
    }
    eprintln!("drafts per block at p_min 0.5, 0.9, 0.999: {stops:?}");
    assert!(stops.contains(&0) && stops.iter().any(|&n| n > 0 && n < block));
}

#[test]
fn greedy_dspark_is_identical_to_plain_decoding() {
    let Some(dir) = fixture() else { return };
    let m = model(&dir, 0.0);
    common::mtp::greedy_equals_plain_with(&m, &dir, &prompt(&dir, "mid"), 48, 5, 0.05);
}

#[test]
fn dspark_rows_survive_checkpoints_and_rollbacks() {
    let Some(dir) = fixture() else { return };
    let m = model(&dir, 0.0);
    common::mtp::cache_survives_with(&m, &dir, &prompt(&dir, "long"));
}

#[test]
fn stochastic_dspark_is_distributed_as_plain_decoding() {
    let Some(dir) = fixture() else { return };
    let m = model(&dir, 0.0);
    common::mtp::sampled_with(&m, &dir, &prompt(&dir, "short"), 4000);
}
