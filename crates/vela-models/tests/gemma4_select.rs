//! Gemma 4's device-side selection (`ModelState::forward_argmax` / `forward_top_k`, routed to
//! `Backend::argmax_rows` / `Backend::top_k_rows` on the logits buffer) returns exactly what the
//! host selection returns on the rows of `ModelState::forward` — the soft-capped logits — for
//! prefill batches (`logits_from` 0, inside the batch, and at its end: no rows) and single
//! decode steps, on the tiny random fixtures (safetensors and a Q8_0 GGUF); `need_row` gets the
//! row exactly when it asks for it.
//!
//! Fixtures: `python scripts/gen-gemma4-fixtures.py` → `$VELA_CACHE/golden/gemma4/<name>/`
//! (skipped when absent unless `VELA_REQUIRE_DATA=1`).

mod common;
use common::{fixture, ids, q8_0_model, tokens_json, FIXTURES};
use std::cell::Cell;
use std::path::Path;
use std::sync::Arc;
use vela_compute::cpu::CpuBackend;
use vela_compute::{argmax, top_k_row, KvType, TopK};
use vela_models::gemma4::Gemma4Model;
use vela_models::lm::{Gemma4Seq, LanguageModel, ModelState};

/// One call of the schedule: `tokens[range]` at their positions, logits from `logits_from`.
struct Step {
    start: usize,
    len: usize,
    logits_from: usize,
}

/// Prefill chunks (every row, rows from the middle, the last row only, no rows), then single
/// decode steps.
fn schedule(n_tokens: usize) -> Vec<Step> {
    let mut s = vec![
        Step {
            start: 0,
            len: 9,
            logits_from: 0,
        },
        Step {
            start: 9,
            len: 11,
            logits_from: 4,
        },
        Step {
            start: 20,
            len: 7,
            logits_from: 6,
        },
        Step {
            start: 27,
            len: 5,
            logits_from: 5,
        },
    ];
    s.extend((32..n_tokens).map(|start| Step {
        start,
        len: 1,
        logits_from: 0,
    }));
    s
}

/// Drive three lockstep states of `model` through `tokens` (the prompt and its greedy
/// continuation): one by `forward`, one by `forward_argmax`, one by `forward_top_k`, and check
/// each selection against the host selection of the `forward` rows. Returns the rows checked.
fn check_model(tag: &str, model: Arc<dyn LanguageModel>, tokens: &[u32]) -> usize {
    let nv = model.n_vocab();
    let mk = || model.clone().new_state(64, 16, KvType::F32).unwrap();
    let (mut full, mut amax, mut topk) = (mk(), mk(), mk());
    let mut checked = 0;
    for (si, st) in schedule(tokens.len()).iter().enumerate() {
        let toks = &tokens[st.start..st.start + st.len];
        let pos: Vec<u32> = (st.start as u32..(st.start + st.len) as u32).collect();
        let rows = full.forward(toks, &pos, st.logits_from).unwrap();
        let n_rows = st.len - st.logits_from;
        assert_eq!(rows.len(), n_rows * nv, "{tag} step {si}");

        let want: Vec<u32> = rows.chunks_exact(nv).map(argmax).collect();
        let got = amax.forward_argmax(toks, &pos, st.logits_from).unwrap();
        assert_eq!(got, want, "{tag} step {si}: forward_argmax");

        // k cycles through 1, a handful, and more than the vocabulary; every other row asks
        // for its logits (the decision sees the selection, like the sampler's).
        let k = [1, 5, nv + 3][si % 3];
        let asked = Cell::new(0usize);
        let need = |t: &TopK| {
            assert!(t.items.len() <= k);
            asked.set(asked.get() + 1);
            asked.get() % 2 == si % 2
        };
        let got = topk
            .forward_top_k(toks, &pos, st.logits_from, k, &need)
            .unwrap();
        assert_eq!(got.len(), n_rows, "{tag} step {si}: forward_top_k rows");
        assert_eq!(asked.get(), n_rows, "{tag} step {si}: need_row calls");
        for (r, (t, row)) in got.iter().enumerate() {
            let want_row = &rows[r * nv..(r + 1) * nv];
            assert_eq!(*t, top_k_row(want_row, k), "{tag} step {si} row {r}: top-k");
            assert_eq!(t.items[0].0, want[r], "{tag} step {si} row {r}: top-1");
            if (r + 1) % 2 == si % 2 {
                assert_eq!(row.as_deref(), Some(want_row), "{tag} step {si} row {r}");
            } else {
                assert!(row.is_none(), "{tag} step {si} row {r}: unrequested row");
            }
        }
        // The drafter's hidden states are left in place by the selecting paths too.
        if n_rows > 0 {
            let hidden = |s: &mut Box<dyn ModelState>| {
                let seq = s
                    .as_any_mut()
                    .downcast_mut::<Gemma4Seq<CpuBackend>>()
                    .unwrap();
                seq.model.output_hidden(&seq.state, n_rows - 1).unwrap()
            };
            let h = hidden(&mut full);
            assert_eq!(hidden(&mut amax), h, "{tag} step {si}: hidden after argmax");
            assert_eq!(hidden(&mut topk), h, "{tag} step {si}: hidden after top-k");
        }
        checked += n_rows;
    }
    checked
}

/// The prompt followed by its greedy continuation (decode steps feed real next tokens).
fn prompt_and_greedy(dir: &Path) -> Vec<u32> {
    let j = tokens_json(dir);
    let mut t = ids(&j, "tokens");
    t.extend(ids(&j, "greedy"));
    assert!(t.len() > 32, "fixture too short for the schedule");
    t
}

#[test]
fn selection_equals_host_selection_of_forward_rows() {
    for name in FIXTURES {
        let Some(dir) = fixture(name) else { continue };
        let be = Arc::new(CpuBackend::new(2));
        let m = Arc::new(Gemma4Model::load_hf(be, &dir).unwrap());
        let softcap = m.cfg.final_softcap;
        let n = check_model(name, m, &prompt_and_greedy(&dir));
        eprintln!("{name} (softcap {softcap:?}): {n} rows checked");
    }
}

#[test]
fn selection_equals_host_selection_on_q8_0_gguf() {
    for name in ["dense_keqv", "moe_swa_softcap"] {
        let Some((dir, m)) = q8_0_model(name) else {
            continue;
        };
        let n = check_model(&format!("{name} q8_0"), m, &prompt_and_greedy(&dir));
        eprintln!("{name} q8_0: {n} rows checked");
    }
}
