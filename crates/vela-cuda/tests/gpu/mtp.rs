//! A model's own MTP layer on the GPU (its cache kept by the target's forwards): the first
//! draft after every prefix of the fixture's `long` prompt against the reference rows of
//! `scripts/gen-*-mtp.py`.

use super::*;
use std::path::Path;
use vela_models::{LanguageModel, MtpHead};

/// For each chunk size (tokens per target forward), the worst NMSE of the first draft after
/// each forward against row `n − 1` of `want` (`[T − 1, vocab]` f32).
pub fn first_drafts(
    m: &Arc<dyn LanguageModel>,
    head: &mut dyn MtpHead,
    dir: &Path,
    want: &str,
    chunks: &[usize],
) -> Vec<f64> {
    let toks = long_prompt(dir);
    let want = f32s(&dir.join(want));
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
