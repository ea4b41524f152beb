//! Gemma 4 on the GPU (its own model file, `vela_models::gemma4`): a synth `gemma4-tiny` (6
//! layers: sliding and full attention, head dims 64 / 128, K = V, partial rotary, final softcap)
//! against the CPU in exact mode (every criterion asserted).
//! The synth needs llama.cpp's `ggml-vocab-gemma-4.gguf` (`$VELA_CACHE/vocab/`); without it the
//! tests are skipped with a message.

use super::*;
use vela_models::LanguageModel;

/// The synth model (written once per test process, also when tests run in parallel), or None
/// (with a message) without its tokenizer source.
fn tiny() -> Option<std::path::PathBuf> {
    use vela_models::synth::{find_tokenizer, geometry, synth_with, QuantScheme, SynthOptions};
    static PATH: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let g = geometry("gemma4-tiny").unwrap();
        if let Err(e) = find_tokenizer(g.tokenizer) {
            eprintln!("SKIP (gemma4-tiny): {e:#}");
            return None;
        }
        let name = format!("vela-gpu-gemma4-tiny-{}.gguf", std::process::id());
        let p = std::env::temp_dir().join(name);
        let scheme = QuantScheme::Mostly(GgmlType::Q8_0);
        synth_with(
            "gemma4-tiny",
            scheme,
            4,
            &p,
            &SynthOptions::default(),
            &mut |_, _| {},
        )
        .unwrap();
        Some(p)
    })
    .clone()
}

/// Prompt tokens (ids below the real vocabulary's 262,144 rows), past the 64-key window.
fn prompt() -> Vec<u32> {
    (0..100u32).map(|i| 1000 + (i * 7919) % 50_000).collect()
}

/// Logits of the last prompt position, then the ids of `n` greedy steps.
fn run(m: Arc<dyn LanguageModel>, prompt: &[u32], n: usize) -> (Vec<f32>, Vec<u32>) {
    let mut st = m.new_state(512, 32, KvType::F16).unwrap();
    let mut last = Vec::new();
    for (ci, chunk) in prompt.chunks(32).enumerate() {
        let pos: Vec<u32> = (0..chunk.len()).map(|i| (ci * 32 + i) as u32).collect();
        last = st.forward(chunk, &pos, chunk.len() - 1).unwrap();
    }
    let mut ids = vec![super::model::argmax(&last) as u32];
    for i in 0..n {
        let pos = [(prompt.len() + i) as u32];
        ids.push(st.forward_argmax(&[*ids.last().unwrap()], &pos, 0).unwrap()[0]);
    }
    (last, ids)
}

/// Exact mode on both backends: argmax and top-10 equal, NMSE <= 1e-4, 16 greedy ids equal.
#[test]
fn gemma4_exact_gpu_matches_cpu() {
    let Some(g) = gpu() else { return };
    let Some(path) = tiny() else { return };
    g.set_exact_matmul(true);
    vela_compute::cpu::matmul::exact::set_thread_override(Some(true));
    let file = Arc::new(GgufFile::open(&path).unwrap());
    let mg = vela_models::load_gguf_any(Arc::new(g), file.clone()).unwrap();
    let mc = vela_models::load_gguf_any(Arc::new(CpuBackend::new(0)), file).unwrap();
    let p = prompt();
    let (lg, ig) = run(mg, &p, 16);
    let (lc, ic) = run(mc, &p, 16);
    vela_compute::cpu::matmul::exact::set_thread_override(None);
    let (_, nmse) = err(&lg, &lc);
    let top = super::model::top_k(&lg, 10) == super::model::top_k(&lc, 10);
    let ok = ig == ic && top && nmse <= 1e-4;
    eprintln!(
        "RESULT | gemma4-tiny exact logits prompt {} | argmax {}/{} top10 {top} greedy {} | nmse {nmse:.2e} | {} |",
        p.len(),
        ig[0],
        ic[0],
        if ig == ic { "equal" } else { "DIFFER" },
        if ok { "ok" } else { "FAIL" }
    );
    assert!(
        ok,
        "gemma4-tiny exact: gpu {ig:?} cpu {ic:?}, top10 {top}, nmse {nmse:.3e}"
    );
}
