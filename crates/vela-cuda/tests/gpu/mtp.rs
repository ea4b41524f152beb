//! A model's own MTP layer on the GPU (its cache kept by the target's forwards): the first
//! draft after every prefix of the fixture's `long` prompt against the reference rows of
//! `scripts/gen-*-mtp.py` (GLM 5.3: `scripts/gen-glm5-fixtures.py`'s `mtp` set).

use super::*;
use std::path::Path;
use vela_models::{LanguageModel, MtpHead};

/// For target forwards of 1 and 7 tokens, the worst NMSE of the first draft after each
/// forward against row `n − 1` of `mtp_rows_long.f32` (`[T − 1, vocab]`), reported as `what`
/// and within `bound`.
pub fn first_drafts(m: &Arc<dyn LanguageModel>, dir: &Path, what: &str, bound: f64) {
    let mut head = m.load_mtp(dir).unwrap();
    for (chunk, worst) in [1usize, 7]
        .into_iter()
        .zip(worst(m, &mut *head, dir, &[1, 7]))
    {
        eprintln!(
            "RESULT | {what} MTP GPU vs reference, chunks of {chunk} | worst NMSE {worst:.3e} |"
        );
        assert!(
            worst <= bound,
            "{what}, chunks of {chunk}: worst NMSE {worst:.3e}"
        );
    }
}

fn worst(
    m: &Arc<dyn LanguageModel>,
    head: &mut dyn MtpHead,
    dir: &Path,
    chunks: &[usize],
) -> Vec<f64> {
    let toks = long_prompt(dir);
    let want = f32s(&dir.join("mtp_rows_long.f32"));
    let nv = m.n_vocab();
    chunks
        .iter()
        .map(|&chunk| {
            let mut st = m
                .clone()
                .new_state(toks.len() + 16, chunk.max(8), KvType::F32)
                .unwrap();
            let (mut n, mut worst) = (0, 0f64);
            while n < toks.len() - 1 {
                let c = chunk.min(toks.len() - 1 - n);
                let pos: Vec<u32> = (n..n + c).map(|i| i as u32).collect();
                st.forward(&toks[n..n + c], &pos, c).unwrap();
                n += c;
                let mut got = Vec::new();
                head.draft(&mut *st, toks[n], n, 1, &mut |lg| {
                    got = lg;
                    Ok(0)
                })
                .unwrap();
                let (_, nmse) = err(&got, &want[(n - 1) * nv..n * nv]);
                worst = worst.max(nmse);
            }
            worst
        })
        .collect()
}
