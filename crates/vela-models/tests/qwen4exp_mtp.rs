//! The `qwen4_exp` MTP layer vs its reference assembled from transformers 5.23's modules
//! (`scripts/gen-qwen4exp-mtp.py` → `$VELA_CACHE/golden/qwen4exp/mtp/`): the first draft after
//! every prefix of a 128-token prompt (the layer's cache kept by the target's forwards, with the
//! indexer dropping blocks), evaluated token by token and in chunks, and chains of 4 drafts.

mod common;
use common::*;
use std::path::Path;
use std::sync::Arc;
use vela_compute::cpu::CpuBackend;
use vela_compute::KvType;
use vela_models::qwen4exp::Qwen4ExpModel;
use vela_models::{LanguageModel, ModelState, MtpHead};

const BOUND: f64 = 1e-8;

fn load(dir: &Path) -> (Arc<dyn LanguageModel>, Box<dyn MtpHead>) {
    let m: Arc<dyn LanguageModel> =
        Arc::new(Qwen4ExpModel::load_hf(Arc::new(CpuBackend::new(2)), dir, None).unwrap());
    let found = m
        .discover_mtp(dir)
        .expect("the checkpoint has an MTP layer");
    let head = m.load_mtp(&found).unwrap();
    (m, head)
}

fn long_prompt(dir: &Path) -> Vec<u32> {
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("prompts.json")).unwrap()).unwrap();
    j["prompts"]["long"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Evaluate `tokens` from position `from` in chunks of `chunk`.
fn eval(st: &mut dyn ModelState, tokens: &[u32], from: usize, chunk: usize) {
    for (ci, c) in tokens.chunks(chunk).enumerate() {
        let pos: Vec<u32> = (0..c.len())
            .map(|i| (from + ci * chunk + i) as u32)
            .collect();
        st.forward(c, &pos, c.len()).unwrap();
    }
}

/// `k` greedy drafts after `last` at `pos`: (tokens, logits rows).
fn drafts(
    head: &mut dyn MtpHead,
    st: &mut dyn ModelState,
    last: u32,
    pos: usize,
    k: usize,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let (mut toks, mut rows) = (Vec::new(), Vec::new());
    head.draft(st, last, pos, k, &mut |lg| {
        let t = argmax(&lg) as u32;
        toks.push(t);
        rows.push(lg);
        Ok(t)
    })
    .unwrap();
    (toks, rows)
}

#[test]
fn first_draft_after_every_prefix_matches_the_reference() {
    let Some(dir) = golden_fixture("qwen4exp", "mtp", "mtp_rows_long.f32") else {
        return;
    };
    let (m, mut head) = load(&dir);
    let nv = m.n_vocab();
    let long = long_prompt(&dir);
    let want = f32s(&dir.join("mtp_rows_long.f32"));
    assert_eq!(want.len(), (long.len() - 1) * nv);
    // One token per forward, and chunks of 7 and 50 (a forward's first row completes the
    // previous forward's last one): after each forward, one draft of the next prompt token.
    for chunk in [1usize, 7, 50] {
        let mut st = m.clone().new_state(256, chunk.max(5), KvType::F32).unwrap();
        let mut worst = 0f64;
        let mut n = 0;
        while n < long.len() - 1 {
            let c = chunk.min(long.len() - 1 - n);
            eval(&mut *st, &long[n..n + c], n, c);
            n += c;
            let (_, rows) = drafts(&mut *head, &mut *st, long[n], n, 1);
            let r = &want[(n - 1) * nv..n * nv];
            let e = nmse(&rows[0], r);
            worst = worst.max(e);
            assert!(e < BOUND, "chunk {chunk}: row {} NMSE {e:.2e}", n - 1);
        }
        eprintln!("chunks of {chunk}: worst first-draft NMSE {worst:.2e}");
    }
}

#[test]
fn chained_drafts_match_the_reference() {
    let Some(dir) = golden_fixture("qwen4exp", "mtp", "mtp_chain.json") else {
        return;
    };
    let (m, mut head) = load(&dir);
    let long = long_prompt(&dir);
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("mtp_chain.json")).unwrap())
            .unwrap();
    let k = j["k"].as_u64().unwrap() as usize;
    for (n, c) in j["chains"].as_object().unwrap() {
        let n: usize = n.parse().unwrap();
        let want_toks: Vec<u32> = c["drafts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        let want = f32s(&dir.join(format!("mtp_chain_{n}.f32")));
        let mut st = m.clone().new_state(256, 16, KvType::F32).unwrap();
        eval(&mut *st, &long[..n], 0, 16);
        // Twice: the first chain's rows past n_past must not change the second.
        for round in 0..2 {
            let (toks, rows) = drafts(&mut *head, &mut *st, long[n], n, k);
            assert_eq!(toks, want_toks, "n = {n}, round {round}");
            for (i, r) in rows.iter().enumerate() {
                let e = nmse(r, &want[i * r.len()..(i + 1) * r.len()]);
                assert!(e < BOUND, "n = {n}, draft {i}: NMSE {e:.2e}");
            }
        }
    }
}

#[test]
fn mtp_needs_the_models_own_checkpoint() {
    let Some(dir) = golden_fixture("qwen4exp", "mtp", "mtp_chain.json") else {
        return;
    };
    let m: Arc<dyn LanguageModel> =
        Arc::new(Qwen4ExpModel::load_hf(Arc::new(CpuBackend::new(1)), &dir, None).unwrap());
    let other = dir.parent().unwrap().join("gdn_qsa");
    let e = m.load_mtp(&other).err().unwrap().to_string();
    assert!(e.contains("part of its checkpoint"), "{e}");
    // A checkpoint without the layer has none to offer.
    if other.join("model.safetensors").exists() {
        let plain: Arc<dyn LanguageModel> =
            Arc::new(Qwen4ExpModel::load_hf(Arc::new(CpuBackend::new(1)), &other, None).unwrap());
        assert!(plain.discover_mtp(&other).is_none());
        let e = plain.load_mtp(&other).err().unwrap().to_string();
        assert!(e.contains("no MTP layer"), "{e}");
    }
}
