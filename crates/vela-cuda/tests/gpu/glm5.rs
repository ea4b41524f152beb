//! GLM 5.3 (`glm5_next`) on the GPU, exact mode, on the `mtp` fixture of
//! `scripts/gen-glm5-fixtures.py` (`flash_mini` with an MTP block; skipped when absent): the
//! trunk's logits at every position against transformers' f32 run, and the MTP block's first
//! draft after every prefix of the 300-token prompt against `scripts/glm5_ref.py`'s rows.

use super::*;
use vela_models::glm5::Glm5Model;
use vela_models::LanguageModel;

#[test]
fn glm5_trunk_and_mtp_gpu_match_the_references() {
    let Some(g) = gpu() else { return };
    let dir = vela_formats::testdata::golden_dir().join("glm5/mtp");
    if vela_formats::testdata::require(dir.join("mtp_rows_long.f32")).is_none() {
        return;
    }
    g.set_exact_matmul(true);
    let m: Arc<dyn LanguageModel> =
        Arc::new(Glm5Model::load_hf(Arc::new(g), &dir, &Default::default()).unwrap());
    let toks = long_prompt(&dir);
    let want = f32s(&dir.join("logits_long.f32"));
    let nv = m.n_vocab();
    let mut st = m.clone().new_state(512, 16, KvType::F32).unwrap();
    let mut worst = 0f64;
    for (ci, c) in toks.chunks(16).enumerate() {
        let pos: Vec<u32> = (0..c.len()).map(|i| (ci * 16 + i) as u32).collect();
        let lg = st.forward(c, &pos, 0).unwrap();
        for (i, row) in lg.chunks(nv).enumerate() {
            let p = ci * 16 + i;
            worst = worst.max(err(row, &want[p * nv..(p + 1) * nv]).1);
        }
    }
    eprintln!(
        "RESULT | glm5 flash_mini GPU (exact, chunks of 16) vs HF | worst NMSE {worst:.3e} |"
    );
    assert!(worst <= 1e-8, "worst position NMSE {worst:.3e}");
    super::mtp::first_drafts(&m, &dir, "glm5", 1e-8);
}

/// One-token steps of the tiny synthetic geometry (KDA, MLA with the indexer past its budget,
/// pools completing every 4 positions) as recorded graphs give the same logits bit for bit as
/// plain launches, and are replayed (the recurrent snapshot slots cycle through a few distinct
/// steps), in default and exact mode.
#[test]
fn glm5_graph_decode_matches_plain() {
    let Some(g) = gpu() else { return };
    let g = Arc::new(g);
    let m: Arc<dyn LanguageModel> =
        Arc::new(Glm5Model::synth(g.clone(), "glm5-tiny", GgmlType::Q4_0, 7).unwrap());
    super::model::hybrid_graph_decode_matches_plain(&g, &m, "glm5");
}
