//! Gemma 4's batched forward (`LanguageModel::forward_batch`): several sequences in one ragged
//! pass (prefill chunks and decode tokens mixed, a sequence joining late) give every sequence
//! the logits it gets alone, bit for bit on the CPU (its products give each row the same
//! result in any batch), and the device-side selections of a batch equal the host selection of
//! those rows. On the tiny random fixtures: PLE with KV sharing, `attention_k_eq_v`, MoE,
//! sliding windows with softcaps (safetensors, and the Q8_0 GGUFs where present).
//!
//! Fixtures: `python scripts/gen-gemma4-fixtures.py` → `$VELA_CACHE/golden/gemma4/<name>/`
//! (skipped when absent unless `VELA_REQUIRE_DATA=1`).

mod common;
use common::{fixture, ids, q8_0_model, tokens_json, FIXTURES};
use std::path::Path;
use std::sync::Arc;
use vela_compute::cpu::CpuBackend;
use vela_compute::{argmax, top_k_row, KvType};
use vela_models::gemma4::Gemma4Model;
use vela_models::lm::{BatchItem, LanguageModel, ModelState, Select, Selected};

/// Sequence i: the fixture's tokens rotated by 5 i, a first chunk of `FIRST[i]` tokens (logits
/// of its last row only), then one token per step.
const FIRST: [usize; 4] = [9, 14, 1, 20];
const STEPS: usize = 8;

fn stream(tokens: &[u32], i: usize) -> Vec<u32> {
    let mut t = tokens.to_vec();
    t.rotate_left(5 * i % tokens.len());
    t
}

/// (tokens, positions, logits_from) of sequence i's call `step` (0: the first chunk).
fn call(t: &[u32], i: usize, step: usize) -> (Vec<u32>, Vec<u32>, usize) {
    let (start, len) = if step == 0 {
        (0, FIRST[i])
    } else {
        (FIRST[i] + step - 1, 1)
    };
    let pos = (start as u32..(start + len) as u32).collect();
    (t[start..start + len].to_vec(), pos, len - 1)
}

fn check_model(tag: &str, m: Arc<dyn LanguageModel>, tokens: &[u32]) {
    let nv = m.n_vocab();
    let streams: Vec<Vec<u32>> = (0..4).map(|i| stream(tokens, i)).collect();
    let mk = || m.clone().new_state(64, 32, KvType::F32).unwrap();
    // Alone: every call's logits rows.
    let alone: Vec<Vec<Vec<f32>>> = (0..4)
        .map(|i| {
            let mut st = mk();
            (0..=STEPS)
                .map(|s| {
                    let (t, p, lf) = call(&streams[i], i, s);
                    st.forward(&t, &p, lf).unwrap()
                })
                .collect()
        })
        .collect();
    // Batched: sequence 3 joins two rounds late (its first chunk among the others' decode
    // tokens); the selection of each item varies by round.
    let mut sts: Vec<Box<dyn ModelState>> = (0..4).map(|_| mk()).collect();
    let mut step = [0usize; 4];
    let mut batched_rounds = 0;
    for round in 0..STEPS + 3 {
        let active: Vec<usize> = (0..4)
            .filter(|&i| (i != 3 || round >= 2) && step[i] <= STEPS)
            .collect();
        if active.is_empty() {
            break;
        }
        let calls: Vec<_> = active
            .iter()
            .map(|&i| call(&streams[i], i, step[i]))
            .collect();
        let k = 3 + round;
        let never = |_: &vela_compute::TopK| false;
        let select = |j: usize| match (j + round) % 3 {
            0 => Select::Logits,
            1 => Select::Argmax,
            _ => Select::TopK(k, &never),
        };
        let mut refs: Vec<&mut Box<dyn ModelState>> = sts
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| active.contains(i))
            .map(|(_, s)| s)
            .collect();
        let mut items: Vec<BatchItem<'_, dyn ModelState>> = refs
            .iter_mut()
            .zip(&calls)
            .enumerate()
            .map(|(j, (s, (t, p, lf)))| BatchItem {
                state: &mut ***s,
                tokens: t,
                positions: p,
                logits_from: *lf,
                select: select(j),
            })
            .collect();
        let out = m.forward_batch(&mut items).unwrap();
        batched_rounds += (active.len() > 1) as usize;
        for (j, (&i, got)) in active.iter().zip(out).enumerate() {
            let want = &alone[i][step[i]];
            let what = format!("{tag} sequence {i} step {} round {round}", step[i]);
            match got {
                Selected::Logits(l) => assert!(l == *want, "{what}: logits differ"),
                Selected::Argmax(ids) => {
                    let w: Vec<u32> = want.chunks_exact(nv).map(argmax).collect();
                    assert_eq!(ids, w, "{what}: argmax");
                }
                Selected::TopK(v) => {
                    assert_eq!(v.len(), want.len() / nv, "{what}: rows");
                    for (r, (t, row)) in v.iter().enumerate() {
                        assert_eq!(*t, top_k_row(&want[r * nv..(r + 1) * nv], k), "{what}");
                        assert!(row.is_none(), "{what}: unrequested row");
                    }
                }
            }
            let _ = j;
            step[i] += 1;
        }
    }
    assert!(step.iter().all(|&s| s == STEPS + 1), "{tag}: {step:?}");
    assert!(
        batched_rounds >= STEPS,
        "{tag}: {batched_rounds} batched rounds"
    );
}

fn prompt_and_greedy(dir: &Path) -> Vec<u32> {
    let j = tokens_json(dir);
    let mut t = ids(&j, "tokens");
    t.extend(ids(&j, "greedy"));
    assert!(t.len() >= FIRST[3] + STEPS, "fixture too short");
    t
}

#[test]
fn batched_sequences_match_each_alone() {
    for name in FIXTURES {
        let Some(dir) = fixture(name) else { continue };
        let m = Arc::new(Gemma4Model::load_hf(Arc::new(CpuBackend::new(2)), &dir).unwrap());
        check_model(name, m, &prompt_and_greedy(&dir));
    }
}

#[test]
fn batched_sequences_match_each_alone_on_q8_0_gguf() {
    for name in ["dense_keqv", "moe_swa_softcap"] {
        let Some((dir, m)) = q8_0_model(name) else {
            continue;
        };
        check_model(&format!("{name} q8_0"), m, &prompt_and_greedy(&dir));
    }
}
