//! A model's own MTP layer against its reference (`scripts/gen-*-mtp.py`): the first draft after
//! every prefix of the `long` prompt, evaluated in chunks, and chains of greedy drafts.

use super::{argmax, f32s, id_list, nmse, prompts};
use std::path::Path;
use std::sync::Arc;
use vela_compute::KvType;
use vela_models::{LanguageModel, ModelState, MtpHead};

/// Evaluate `tokens` from position `from` in chunks of `chunk`; every position's logits.
pub fn eval(st: &mut dyn ModelState, tokens: &[u32], from: usize, chunk: usize) -> Vec<f32> {
    let mut out = Vec::new();
    for (ci, c) in tokens.chunks(chunk).enumerate() {
        let pos: Vec<u32> = (0..c.len())
            .map(|i| (from + ci * chunk + i) as u32)
            .collect();
        out.extend(st.forward(c, &pos, 0).unwrap());
    }
    out
}

/// `k` greedy drafts after `last` at `pos`: (tokens, logits rows).
pub fn drafts(
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

/// After each forward of the `long` prompt in chunks of `chunk`, one draft of the next prompt
/// token: its logits against row `n − 1` of `want` (`[T − 1, vocab]`), each within `bound`
/// NMSE; returns the worst. `check` sees each forward's logits with the positions they cover.
pub fn first_drafts(
    m: &Arc<dyn LanguageModel>,
    head: &mut dyn MtpHead,
    dir: &Path,
    want: &str,
    chunk: usize,
    bound: f64,
    check: &mut dyn FnMut(&[f32], std::ops::Range<usize>),
) -> f64 {
    let nv = m.n_vocab();
    let long = id_list(&prompts(dir)["prompts"]["long"]);
    let want = f32s(&dir.join(want));
    assert_eq!(want.len(), (long.len() - 1) * nv);
    let mut st = m
        .clone()
        .new_state(long.len() + 16, chunk.max(5), KvType::F32)
        .unwrap();
    let mut worst = 0f64;
    let mut n = 0;
    while n < long.len() - 1 {
        let c = chunk.min(long.len() - 1 - n);
        let lg = eval(&mut *st, &long[n..n + c], n, c);
        check(&lg, n..n + c);
        n += c;
        let (_, rows) = drafts(head, &mut *st, long[n], n, 1);
        let e = nmse(&rows[0], &want[(n - 1) * nv..n * nv]);
        worst = worst.max(e);
        assert!(e < bound, "chunk {chunk}: row {} NMSE {e:.2e}", n - 1);
    }
    worst
}

/// The reference's chains (`mtp_chain.json`, `mtp_chain_<n>.f32`): after `long[..n]`, the
/// drafts from `long[n]` equal its greedy tokens with each row within `bound` NMSE, twice (the
/// first chain's rows past the sequence must not change the second); returns the worst NMSE.
pub fn chains(
    m: &Arc<dyn LanguageModel>,
    head: &mut dyn MtpHead,
    dir: &Path,
    chunk: usize,
    bound: f64,
) -> f64 {
    let long = id_list(&prompts(dir)["prompts"]["long"]);
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("mtp_chain.json")).unwrap())
            .unwrap();
    let k = j["k"].as_u64().unwrap() as usize;
    let mut worst = 0f64;
    for (n, c) in j["chains"].as_object().unwrap() {
        let n: usize = n.parse().unwrap();
        let want_toks = id_list(&c["drafts"]);
        let want = f32s(&dir.join(format!("mtp_chain_{n}.f32")));
        let mut st = m
            .clone()
            .new_state(long.len() + 16, chunk, KvType::F32)
            .unwrap();
        eval(&mut *st, &long[..n], 0, chunk);
        for round in 0..2 {
            let (toks, rows) = drafts(head, &mut *st, long[n], n, k);
            assert_eq!(toks, want_toks, "n = {n}, round {round}");
            for (i, r) in rows.iter().enumerate() {
                let e = nmse(r, &want[i * r.len()..(i + 1) * r.len()]);
                worst = worst.max(e);
                assert!(e < bound, "n = {n}, draft {i}: NMSE {e:.2e}");
            }
        }
    }
    worst
}

/// The model's own drafter: its MTP layer found from `path` and bound.
pub fn bind(m: Arc<dyn LanguageModel>, path: &Path) -> (Arc<dyn LanguageModel>, Box<dyn MtpHead>) {
    let found = m.discover_mtp(path).expect("the model has an MTP layer");
    let head = m.load_mtp(&found).unwrap();
    (m, head)
}

/// [`first_drafts`] after target forwards of each of `chunks` tokens, with the target's logits
/// of every position checked against `trunk` (`[T, vocab]`) within `bound` too; prints the worst
/// NMSE of both per chunk size.
pub fn first_drafts_and_target(
    (m, head): (&Arc<dyn LanguageModel>, &mut dyn MtpHead),
    dir: &Path,
    (rows, trunk): (&str, &str),
    chunks: &[usize],
    bound: f64,
) {
    let nv = m.n_vocab();
    let want = f32s(&dir.join(trunk));
    for &chunk in chunks {
        let mut worst_trunk = 0f64;
        let worst = first_drafts(m, head, dir, rows, chunk, bound, &mut |lg, at| {
            for (i, p) in at.enumerate() {
                let e = nmse(&lg[i * nv..(i + 1) * nv], &want[p * nv..(p + 1) * nv]);
                assert!(e < bound, "target position {p}: NMSE {e:.2e}");
                worst_trunk = worst_trunk.max(e);
            }
        });
        eprintln!(
            "chunks of {chunk}: worst first-draft NMSE {worst:.2e}; target's logits \
             {worst_trunk:.2e}"
        );
    }
}
