//! Gemma 4 assistant drafter vs transformers 5.23 on tiny random f32 checkpoints.
//!
//! Fixtures: `python scripts/gen-gemma4-assistant.py` → `$VELA_CACHE/golden/gemma4_assistant/<name>/`
//! (skipped when absent unless `VELA_REQUIRE_DATA=1`).

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use vela_compute::cpu::CpuBackend;
use vela_compute::KvType;
use vela_formats::testdata;
use vela_models::gemma4::Gemma4Model;
use vela_models::gemma4_assistant::{AssistantConfig, Gemma4Assistant};

fn fixture(name: &str) -> Option<PathBuf> {
    golden_fixture("gemma4_assistant", name, "draft_logits.f32")
}

fn argmax_id(v: &[f32]) -> u32 {
    argmax(v) as u32
}

/// Run every draft chain of the fixture; returns the worst per-step NMSE vs transformers.
fn check_chains(dir: &Path, asst: &Gemma4Assistant<CpuBackend>, exact_head: bool) -> f64 {
    let be = Arc::new(CpuBackend::new(2));
    let target = Gemma4Model::load_hf(be, &dir.join("target")).unwrap();
    let j = tokens_json(dir);
    let tokens = ids(&j, "tokens");
    let n = tokens.len();
    let v = target.cfg.n_vocab;
    // Target: every position in one batch (the ring keeps window + batch ≥ all 40 positions).
    let mut st = target.new_state(64, n, KvType::F32).unwrap();
    let pos: Vec<u32> = (0..n as u32).collect();
    let logits = target.forward(&mut st, &tokens, &pos, 0).unwrap();
    let t_nmse = nmse(&logits, &f32s(&dir.join("target_logits.f32")));
    assert!(t_nmse < 1e-8, "target logits NMSE {t_nmse:.3e}");
    let want = f32s(&dir.join("draft_logits.f32"));
    let mut ast = asst.new_state(&target.cfg).unwrap();
    let mut worst = 0f64;
    let mut k = 0;
    for c in j["chains"].as_array().unwrap() {
        let p = c["pos"].as_u64().unwrap() as usize;
        let steps = c["steps"].as_u64().unwrap() as usize;
        let mut tok = tokens[p];
        let mut hidden = target.output_hidden(&st, p - 1).unwrap();
        for s in 0..steps {
            let out = asst
                .step(&mut ast, &target, &st.kv, tok, &hidden, p)
                .unwrap();
            let r = &want[k * v..(k + 1) * v];
            k += 1;
            let e = nmse(&out.logits, r);
            eprintln!("  chain pos {p} step {s}: NMSE {e:.3e}");
            if exact_head {
                assert_eq!(
                    argmax_id(&out.logits),
                    argmax_id(r),
                    "pos {p} step {s}: argmax"
                );
            }
            worst = worst.max(e);
            tok = argmax_id(r);
            hidden = out.hidden;
        }
    }
    worst
}

#[test]
fn dense_assistant_matches_transformers() {
    let Some(dir) = fixture("dense") else { return };
    let asst =
        Gemma4Assistant::load_hf(Arc::new(CpuBackend::new(2)), &dir.join("assistant")).unwrap();
    assert!(!asst.uses_ordered_embeddings());
    let worst = check_chains(&dir, &asst, true);
    eprintln!("dense: worst draft-step NMSE {worst:.3e}");
    assert!(worst <= 1e-8, "worst NMSE {worst:.3e}");
}

#[test]
fn ordered_embedding_assistant_matches_transformers() {
    let Some(dir) = fixture("ordered") else {
        return;
    };
    let asst =
        Gemma4Assistant::load_hf(Arc::new(CpuBackend::new(2)), &dir.join("assistant")).unwrap();
    assert!(asst.uses_ordered_embeddings());
    let worst = check_chains(&dir, &asst, true);
    eprintln!("ordered: worst draft-step NMSE {worst:.3e}");
    assert!(worst <= 1e-8, "worst NMSE {worst:.3e}");
}

#[test]
fn gguf_assistant_equals_safetensors() {
    let Some(dir) = fixture("dense") else { return };
    let Some(gguf) = testdata::require(dir.join("assistant.gguf")) else {
        return;
    };
    let be = Arc::new(CpuBackend::new(2));
    let asst = Gemma4Assistant::load(be, &gguf).unwrap();
    let hf: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("assistant").join("config.json")).unwrap(),
    )
    .unwrap();
    let want = AssistantConfig::from_json(&hf).unwrap();
    let (a, b) = (format!("{:?}", asst.cfg), format!("{want:?}"));
    assert_eq!(a, b, "GGUF metadata must give the HF config");
    let worst = check_chains(&dir, &asst, true);
    eprintln!("dense GGUF: worst draft-step NMSE {worst:.3e}");
    assert!(worst <= 1e-8, "worst NMSE {worst:.3e}");
}

#[test]
fn ordered_gguf_loads_with_the_full_head() {
    // llama.cpp's converter drops masked_embedding.*: the GGUF assistant scores every token.
    let Some(dir) = fixture("ordered") else {
        return;
    };
    let Some(gguf) = testdata::require(dir.join("assistant.gguf")) else {
        return;
    };
    let asst = Gemma4Assistant::load(Arc::new(CpuBackend::new(2)), &gguf).unwrap();
    assert!(!asst.uses_ordered_embeddings());
    assert_eq!(asst.cfg.backbone, 64);
}

#[test]
fn mismatched_target_is_refused_with_a_clear_error() {
    let (Some(a), Some(b)) = (fixture("dense"), fixture("ordered")) else {
        return;
    };
    let be = Arc::new(CpuBackend::new(2));
    let asst = Gemma4Assistant::load_hf(be.clone(), &a.join("assistant")).unwrap();
    let other = Gemma4Model::load_hf(be, &b.join("target")).unwrap();
    let e = asst.new_state(&other.cfg).err().expect("geometry differs");
    let msg = e.to_string();
    assert!(msg.contains("does not match target layer"), "{msg}");
    assert!(!msg.contains('\n'));
}

#[test]
fn realdims_assistant_matches_transformers() {
    // 12B head geometry: sliding 8 kv heads × 256, full k_eq_v 1 kv head × 512, 16 query heads.
    let Some(dir) = fixture("realdims") else {
        return;
    };
    let asst =
        Gemma4Assistant::load_hf(Arc::new(CpuBackend::new(2)), &dir.join("assistant")).unwrap();
    assert!(asst.uses_ordered_embeddings());
    let worst = check_chains(&dir, &asst, true);
    eprintln!("realdims: worst draft-step NMSE {worst:.3e}");
    assert!(worst <= 1e-8, "worst NMSE {worst:.3e}");
}

/// The assistant reads the target's sliding ring as speculative decoding leaves it: a small
/// batch (ring = window + 8 slots) and the rejected tail of a full verification batch already
/// written past the draft position (the worst case: 7 of 7 drafts rejected). Same logits as with
/// the roomy cache above.
#[test]
fn assistant_reads_the_sliding_ring_as_speculation_leaves_it() {
    for name in ["dense", "realdims"] {
        let Some(dir) = fixture(name) else { continue };
        let be = Arc::new(CpuBackend::new(2));
        let target = Gemma4Model::load_hf(be.clone(), &dir.join("target")).unwrap();
        let asst = Gemma4Assistant::load_hf(be, &dir.join("assistant")).unwrap();
        let j = tokens_json(&dir);
        let tokens = ids(&j, "tokens");
        let v = target.cfg.n_vocab;
        let want = f32s(&dir.join("draft_logits.f32"));
        let mut ast = asst.new_state(&target.cfg).unwrap();
        for (ci, c) in j["chains"].as_array().unwrap().iter().enumerate() {
            let p = c["pos"].as_u64().unwrap() as usize;
            let steps = c["steps"].as_u64().unwrap() as usize;
            // The target evaluated positions 0..p-1 in batches of 8, the last batch being a
            // verification that kept its first token (position p-1) and rejected 7 drafts at
            // p..p+6: the hidden state is that batch's row 0.
            let mut st = target.new_state(64, 8, KvType::F32).unwrap();
            let mut done = 0;
            while done < p - 1 {
                let end = (done + 8).min(p - 1);
                let pos: Vec<u32> = (done as u32..end as u32).collect();
                target
                    .forward(&mut st, &tokens[done..end], &pos, end - done - 1)
                    .unwrap();
                done = end;
            }
            let end = (p + 7).min(tokens.len());
            let pos: Vec<u32> = (p as u32 - 1..end as u32).collect();
            target
                .forward(&mut st, &tokens[p - 1..end], &pos, 0)
                .unwrap();
            let mut hidden = target.output_hidden(&st, 0).unwrap();
            let mut tok = tokens[p];
            for s in 0..steps {
                let out = asst
                    .step(&mut ast, &target, &st.kv, tok, &hidden, p)
                    .unwrap();
                let r = &want[(ci * steps + s) * v..(ci * steps + s + 1) * v];
                let e = nmse(&out.logits, r);
                assert!(e <= 1e-8, "{name} pos {p} step {s}: NMSE {e:.3e}");
                tok = argmax_id(r);
                hidden = out.hidden;
            }
        }
    }
}
