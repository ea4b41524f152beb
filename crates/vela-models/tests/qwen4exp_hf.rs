//! Qwen3.8 Flash Next (`qwen4_exp`) vs transformers 5.23 on tiny random f32 checkpoints
//! (`scripts/gen-qwen4exp-fixtures.py` → `$VELA_CACHE/golden/qwen4exp/<name>/`): logits at
//! every position of three prompts (the indexer dropping blocks, keeping all, an open tail),
//! any split of a prompt into chunks, and the 64-step greedy continuation.

mod common;
use common::*;
use std::path::Path;
use std::sync::Arc;
use vela_compute::cpu::CpuBackend;
use vela_compute::KvType;
use vela_models::qwen4exp::Qwen4ExpModel;
use vela_models::LanguageModel;

/// Every fixture: the real options, PLE on one and two layers with EOS resets and a SiLU gate,
/// and YaRN with 2 streams, top-3 unnormalised routing, dk ≠ dv and blocks of 8.
const FIXTURES: &[&str] = &["gdn_qsa", "ple", "ple2_silu", "variant_yarn"];

fn load(dir: &Path) -> Arc<Qwen4ExpModel<CpuBackend>> {
    Arc::new(
        Qwen4ExpModel::load_hf(Arc::new(CpuBackend::new(2)), dir, &Default::default()).unwrap(),
    )
}

/// Every position's logits, `chunk` tokens per forward.
fn logits(m: &Arc<Qwen4ExpModel<CpuBackend>>, tokens: &[u32], chunk: usize) -> Vec<f32> {
    let lm: Arc<dyn LanguageModel> = m.clone();
    let mut st = lm.new_state(256, chunk, KvType::F32).unwrap();
    let mut out = Vec::new();
    for (ci, c) in tokens.chunks(chunk).enumerate() {
        let pos: Vec<u32> = (0..c.len()).map(|i| (ci * chunk + i) as u32).collect();
        out.extend(st.forward(c, &pos, 0).unwrap());
    }
    out
}

#[test]
fn logits_match_transformers() {
    for name in FIXTURES {
        let Some(dir) = golden_fixture("qwen4exp", name, "logits_long.f32") else {
            continue;
        };
        let m = load(&dir);
        let nv = m.cfg.n_vocab;
        let p = prompts(&dir);
        for prompt in ["long", "mid", "short"] {
            let toks = id_list(&p["prompts"][prompt]);
            let want = f32s(&dir.join(format!("logits_{prompt}.f32")));
            let ours = logits(&m, &toks, toks.len());
            assert_eq!(ours.len(), want.len(), "{name} {prompt}");
            let mut worst = 0f64;
            for t in 0..toks.len() {
                let e = nmse(&ours[t * nv..(t + 1) * nv], &want[t * nv..(t + 1) * nv]);
                worst = worst.max(e);
                assert!(e <= 1e-8, "{name} {prompt} position {t}: NMSE {e:.3e}");
            }
            eprintln!(
                "{name} {prompt}: {} positions, worst NMSE {worst:.3e}",
                toks.len()
            );
        }
    }
}

/// Chunked prefill gives the one-pass logits bit for bit (the recurrent form, position-exact
/// blocks), and matches HF's cached continuation.
#[test]
fn any_split_gives_the_same_logits() {
    for name in FIXTURES {
        let Some(dir) = golden_fixture("qwen4exp", name, "logits_long.f32") else {
            continue;
        };
        let m = load(&dir);
        let toks = id_list(&prompts(&dir)["prompts"]["long"]);
        let whole = logits(&m, &toks, toks.len());
        for chunk in [1, 7, 50] {
            assert_eq!(logits(&m, &toks, chunk), whole, "{name}: chunks of {chunk}");
        }
        let nv = m.cfg.n_vocab;
        let split = f32s(&dir.join("logits_long_split50.f32"));
        let e = nmse(&whole[50 * nv..], &split);
        assert!(e <= 1e-8, "{name}: vs HF's split prefill NMSE {e:.3e}");
    }
}

/// Greedy decoding token by token equals HF `generate` (64 tokens, cache on, EOS ignored).
#[test]
fn greedy_continuation_matches_generate() {
    for name in FIXTURES {
        let Some(dir) = golden_fixture("qwen4exp", name, "logits_gen.f32") else {
            continue;
        };
        let m = load(&dir);
        let p = prompts(&dir);
        let mut toks = id_list(&p["prompts"]["mid"]);
        let want = id_list(&p["generate"]["tokens"]);
        let lm: Arc<dyn LanguageModel> = m.clone();
        let mut st = lm.new_state(256, 64, KvType::F32).unwrap();
        let pos: Vec<u32> = (0..toks.len() as u32).collect();
        let mut row = st.forward(&toks, &pos, toks.len() - 1).unwrap();
        let mut got = Vec::new();
        for _ in 0..want.len() {
            let t = argmax(&row) as u32;
            got.push(t);
            toks.push(t);
            let p = (toks.len() - 1) as u32;
            row = st.forward(&[t], &[p], 0).unwrap();
        }
        assert_eq!(got, want, "{name}");
    }
}

/// The indexer keeps the same positions as HF for every QSA layer and query (the fixtures keep
/// a score margin at every cutoff, so any correct top-k gives HF's set), in one pass and token
/// by token.
#[test]
fn qsa_selections_match_transformers() {
    use vela_models::CausalLm;
    for name in FIXTURES {
        let Some(dir) = golden_fixture("qwen4exp", name, "qsa_long.json") else {
            continue;
        };
        let m = load(&dir);
        let toks = id_list(&prompts(&dir)["prompts"]["long"]);
        let q: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("qsa_long.json")).unwrap())
                .unwrap();
        for chunk in [toks.len(), 1] {
            let mut st = vela_models::qwen4exp::new_state(&m, 256, chunk).unwrap();
            st.selections = Some(Vec::new());
            for (ci, c) in toks.chunks(chunk).enumerate() {
                let pos: Vec<u32> = (0..c.len()).map(|i| (ci * chunk + i) as u32).collect();
                m.forward(&mut st, c, &pos, c.len()).unwrap();
            }
            let got = st.selections.take().unwrap();
            let mut checked = 0;
            for (layer, rows) in q["layers"].as_object().unwrap() {
                let layer: usize = layer.parse().unwrap();
                for r in rows.as_array().unwrap() {
                    let pos = r["pos"].as_u64().unwrap() as u32;
                    let want = id_list(&r["selected"]);
                    let ours = got
                        .iter()
                        .find(|(l, p, _)| *l == layer && *p == pos)
                        .map(|x| &x.2)
                        .unwrap_or_else(|| {
                            panic!("{name}: no selection for layer {layer} position {pos}")
                        });
                    assert_eq!(
                        ours, &want,
                        "{name} layer {layer} position {pos} (chunk {chunk})"
                    );
                    checked += 1;
                }
            }
            assert!(
                checked >= 2 * toks.len(),
                "{name}: {checked} selections checked"
            );
            eprintln!("{name}: {checked} QSA selections equal to HF's (chunk {chunk})");
        }
    }
}

/// llama.cpp 0c1e570's conversion of the `ple` fixture (tiled value heads, −exp(A_log) and the
/// (1+w) offsets applied, the experts stacked, the n-gram table flattened) gives the logits of
/// the safetensors checkpoint (only the order of sums over permuted heads differs).
#[test]
fn gguf_conversion_matches_the_checkpoint() {
    let Some(dir) = golden_fixture("qwen4exp", "ple", "model-f32.gguf") else {
        return;
    };
    let g = Arc::new(vela_formats::gguf::GgufFile::open(dir.join("model-f32.gguf")).unwrap());
    let gm: Arc<dyn LanguageModel> =
        vela_models::load_gguf_any(Arc::new(CpuBackend::new(2)), g).unwrap();
    let hm = load(&dir);
    let toks = id_list(&prompts(&dir)["prompts"]["long"]);
    let a = logits(&hm, &toks, toks.len());
    let mut st = gm.new_state(256, toks.len(), KvType::F32).unwrap();
    let pos: Vec<u32> = (0..toks.len() as u32).collect();
    let b = st.forward(&toks, &pos, 0).unwrap();
    let e = nmse(&b, &a);
    eprintln!("ple: GGUF vs safetensors NMSE {e:.3e}");
    assert!(e <= 1e-10, "GGUF vs safetensors NMSE {e:.3e}");
}
