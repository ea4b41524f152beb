//! A Gemma 4 GGUF with the real Gemma 4 tokenizer and chat template (random weights) through the
//! engine's generic loader and session, against llama.cpp 0c1e570 on the same file.
//!
//! Fixture: `scripts/gen-gemma4-e2e.py` → `$VELA_CACHE/golden/gemma4_e2e/` (skipped when absent
//! unless `VELA_REQUIRE_DATA=1`).

use vela_compute::KvType;
use vela_engine::loader::load_gguf;
use vela_engine::{Session, SessionOptions};
use vela_formats::testdata;

#[test]
fn gemma4_gguf_tokenizer_and_greedy_match_llama_cpp() {
    let Some(refs) = testdata::require(
        testdata::golden_dir()
            .join("gemma4_e2e")
            .join("llama_greedy.json"),
    ) else {
        return;
    };
    let dir = refs.parent().unwrap();
    let m = load_gguf(&dir.join("model-f32.gguf"), 2).unwrap();
    assert_eq!(m.model.arch(), "gemma4");
    // Sliding-window rings: only a batch of positions can be dropped without a checkpoint.
    assert_eq!(m.model.state_layout().rollback_limit(8), 8);
    assert!(m.chat_template.as_deref().unwrap_or("").contains("<|turn>"));
    let refs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&refs).unwrap()).unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let mut checked = 0;
    for r in refs.as_array().unwrap() {
        let text = r["text"].as_str().unwrap();
        let want_toks = ids(&r["tokens"]);
        let toks = m.tokenizer.encode(text, true, false).unwrap();
        assert_eq!(toks, want_toks, "tokenization of {text:?}");
        let want = ids(&r["greedy"]);
        let margins: Vec<f64> = r["margins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        let mut s = Session::new(
            m.model.clone(),
            &SessionOptions {
                n_ctx: 512,
                ubatch: 16,
                kv_type: KvType::F32,
            },
        )
        .unwrap();
        let mut logits = s.eval(&toks).unwrap();
        for (step, &w) in want.iter().enumerate() {
            let got = vela_engine::sampler::argmax(&logits);
            if got != w {
                // Only a near-tie of llama.cpp's own logits may flip the choice.
                assert!(
                    margins[step] < 1e-3,
                    "{text:?}: step {step}: vela {got} vs llama.cpp {w} (margin {})",
                    margins[step]
                );
                break;
            }
            checked += 1;
            logits = s.eval(&[w]).unwrap();
        }
    }
    // Three prompts × 32 tokens, unless a near-tie cut one short.
    assert!(checked >= 64, "only {checked} greedy tokens compared");
}

/// A forked Gemma 4 session (cache copied, scratch buffers fresh) continues exactly like the
/// original, and the two stay independent.
#[test]
fn gemma4_fork_is_independent() {
    let Some(p) = testdata::require(
        testdata::golden_dir()
            .join("gemma4_e2e")
            .join("model-f32.gguf"),
    ) else {
        return;
    };
    let m = load_gguf(&p, 2).unwrap();
    let opts = SessionOptions {
        n_ctx: 128,
        ubatch: 8,
        kv_type: KvType::F16,
    };
    let ids: Vec<u32> = (0..40).map(|i| 1000 + 37 * i).collect();
    let mut a = Session::new(m.model.clone(), &opts).unwrap();
    a.eval(&ids[..30]).unwrap(); // past the 32-token window soon after
    let mut b = a.fork().unwrap();
    let la = a.eval(&ids[30..]).unwrap();
    let lb = b.eval(&ids[30..]).unwrap();
    assert_eq!(la, lb);
    let other = b.eval(&[5, 6, 7]).unwrap();
    assert_eq!(a.eval(&[5, 6, 7]).unwrap(), other);
    assert_eq!(a.kv_bytes(), b.kv_bytes());
}
