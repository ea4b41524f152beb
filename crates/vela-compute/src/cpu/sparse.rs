//! Block-sparse attention on the CPU, the reference for every backend: the indexer's choice of
//! key blocks per query and attention over the chosen positions (Qwen3.8's QSA; the same shape
//! as DeepSeek V4's and GLM 5.3's sparse attention).

use crate::IndexerParams;

/// See [`crate::Backend::indexer_select`].
#[allow(clippy::too_many_arguments)]
pub fn indexer_select(
    q: &[f32],
    keys: &[f32],
    positions: &[u32],
    p: &IndexerParams,
    sel: &mut [u32],
    counts: &mut [u32],
) {
    let (c, di, nh) = (p.block, p.head_dim, p.n_head);
    let width = p.max_selected();
    let scale = 1.0 / (di as f32).sqrt();
    let mut scores: Vec<(f32, usize)> = Vec::new();
    for (t, &pos) in positions.iter().enumerate() {
        let pos = pos as usize;
        let nb = (pos + 1) / c;
        let qt = &q[t * nh * di..(t + 1) * nh * di];
        let row = &mut sel[t * width..(t + 1) * width];
        let mut n = 0;
        let mut push = |x: usize, n: &mut usize| {
            row[*n] = x as u32;
            *n += 1;
        };
        if nb <= p.max_blocks {
            for x in 0..=pos {
                push(x, &mut n);
            }
        } else {
            scores.clear();
            for b in 0..nb {
                let kb = &keys[b * di..(b + 1) * di];
                let mut s = 0.0f32;
                for h in 0..nh {
                    let mut dot = 0.0f32;
                    for (a, k) in qt[h * di..(h + 1) * di].iter().zip(kb) {
                        dot += a * k;
                    }
                    s += dot.max(0.0);
                }
                scores.push((s * scale, b));
            }
            // The best `max_blocks` by score, the lowest block first among equal scores (NaN
            // ranks lowest); then in position order.
            let key = |x: &(f32, usize)| if x.0.is_nan() { f32::NEG_INFINITY } else { x.0 };
            scores.sort_by(|a, b| key(b).total_cmp(&key(a)).then(a.1.cmp(&b.1)));
            let mut kept: Vec<usize> = scores[..p.max_blocks].iter().map(|x| x.1).collect();
            kept.sort_unstable();
            for b in kept {
                for x in b * c..(b + 1) * c {
                    push(x, &mut n);
                }
            }
            for x in nb * c..=pos {
                push(x, &mut n);
            }
        }
        counts[t] = n as u32;
    }
}

/// See [`crate::Backend::attention_selected`].
#[allow(clippy::too_many_arguments)]
pub fn attention_selected(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    sel: &[u32],
    counts: &[u32],
    n: usize,
    width: usize,
    n_head: usize,
    n_head_kv: usize,
    hd: usize,
    scale: f32,
    out: &mut [f32],
) {
    let group = n_head / n_head_kv;
    let kv_w = n_head_kv * hd;
    let mut s = Vec::new();
    for t in 0..n {
        let ids = &sel[t * width..t * width + counts[t] as usize];
        for h in 0..n_head {
            let kh = h / group;
            let qh = &q[(t * n_head + h) * hd..][..hd];
            s.clear();
            let mut m = f32::NEG_INFINITY;
            for &p in ids {
                let kr = &k[p as usize * kv_w + kh * hd..][..hd];
                let mut dot = 0.0f32;
                for (a, b) in qh.iter().zip(kr) {
                    dot += a * b;
                }
                let x = dot * scale;
                m = m.max(x);
                s.push(x);
            }
            let mut sum = 0.0f64;
            for x in s.iter_mut() {
                *x = (*x - m).exp();
                sum += *x as f64;
            }
            let sum = sum as f32;
            let o = &mut out[(t * n_head + h) * hd..][..hd];
            o.iter_mut().for_each(|x| *x = 0.0);
            for (&p, &w) in ids.iter().zip(&s) {
                let w = w / sum;
                let vr = &v[p as usize * kv_w + kh * hd..][..hd];
                for (a, b) in o.iter_mut().zip(vr) {
                    *a += w * b;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(max_blocks: usize) -> IndexerParams {
        IndexerParams {
            n_head: 2,
            head_dim: 2,
            block: 2,
            max_blocks,
        }
    }

    #[test]
    fn dense_until_the_budget_then_top_blocks_plus_tail() {
        // Block keys: block 0 scores high for head 0, block 1 zero (relu), block 2 medium.
        let keys = [1.0, 0.0, -1.0, 0.0, 0.5, 0.0];
        let q = [2.0, 0.0, 1.0, 0.0]; // one query, two heads
        let p = params(2);
        let w = p.max_selected();
        let (mut sel, mut n) = (vec![0u32; w], vec![0u32; 1]);
        // Position 3: two complete blocks ≤ budget: everything visible.
        indexer_select(&q, &keys, &[3], &p, &mut sel, &mut n);
        assert_eq!(&sel[..n[0] as usize], &[0, 1, 2, 3]);
        // Position 6: three complete blocks, keep blocks 0 and 2, plus the tail (6).
        indexer_select(&q, &keys, &[6], &p, &mut sel, &mut n);
        assert_eq!(&sel[..n[0] as usize], &[0, 1, 4, 5, 6]);
        // Ties at zero: the lowest blocks win.
        let zeros = [0.0f32; 6];
        indexer_select(&q, &zeros, &[5], &p, &mut sel, &mut n);
        assert_eq!(&sel[..n[0] as usize], &[0, 1, 2, 3]);
    }

    #[test]
    fn attention_over_a_selection_is_softmax_over_it() {
        // One head, head dim 1, keys at positions 0..3; select 0 and 2.
        let (k, v) = ([1.0f32, 5.0, 2.0], [10.0f32, 100.0, 20.0]);
        let mut out = [0f32];
        attention_selected(&[1.0], &k, &v, &[0, 2], &[2], 1, 2, 1, 1, 1, 1.0, &mut out);
        let (a, b) = (1f32.exp(), 2f32.exp());
        let want = (a * 10.0 + b * 20.0) / (a + b);
        assert!((out[0] - want).abs() < 1e-5, "{} vs {want}", out[0]);
    }
}
