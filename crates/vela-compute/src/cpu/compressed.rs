//! DeepSeek V4's ops on the CPU, the reference for every backend: the mHC stream mixing
//! (Sinkhorn-normalised weights, collapse, expansion), the rotation of trailing interleaved
//! pairs, the compressors' gated pooling of windows, the Lightning indexer's selection and
//! attention with sinks over two sets of K=V rows (the sliding window and the compressed
//! entries). docs/deepseekv4-spec.md gives the formulas with transformers' line numbers.

use crate::LightningParams;

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// In place, rows of `mix` become the mHC weights ([`crate::Backend::mhc_weights`]).
#[allow(clippy::too_many_arguments)]
pub fn mhc_weights(
    mix: &mut [f32],
    base: &[f32],
    scale: [f32; 3],
    n: usize,
    s: usize,
    iters: usize,
    eps: f32,
    head: bool,
) {
    let stride = if head { s } else { (2 + s) * s };
    for row in mix[..n * stride].chunks_exact_mut(stride) {
        for i in 0..s {
            row[i] = sigmoid(row[i] * scale[0] + base[i]) + eps;
        }
        if head {
            continue;
        }
        for i in s..2 * s {
            row[i] = 2.0 * sigmoid(row[i] * scale[1] + base[i]);
        }
        let c = &mut row[2 * s..];
        for (j, r) in c.chunks_exact_mut(s).enumerate() {
            let mut m = f32::NEG_INFINITY;
            for (k, v) in r.iter_mut().enumerate() {
                *v = *v * scale[2] + base[2 * s + j * s + k];
                m = m.max(*v);
            }
            let mut sum = 0f32;
            for v in r.iter_mut() {
                *v = (*v - m).exp();
                sum += *v;
            }
            for v in r.iter_mut() {
                *v = *v / sum + eps;
            }
        }
        let cols = |c: &mut [f32]| {
            for k in 0..s {
                let mut sum = 0f32;
                for j in 0..s {
                    sum += c[j * s + k];
                }
                for j in 0..s {
                    c[j * s + k] /= sum + eps;
                }
            }
        };
        cols(c);
        for _ in 1..iters {
            for r in c.chunks_exact_mut(s) {
                let sum: f32 = r.iter().sum();
                for v in r.iter_mut() {
                    *v /= sum + eps;
                }
            }
            cols(c);
        }
    }
}

/// `out[t] = Σ_s w[t, s] · x[t, s]`, the streams in ascending order ([`crate::Backend::mhc_collapse`]).
pub fn mhc_collapse(
    x: &[f32],
    w: &[f32],
    stride: usize,
    n: usize,
    s: usize,
    h: usize,
    out: &mut [f32],
) {
    for t in 0..n {
        let o = &mut out[t * h..(t + 1) * h];
        let xt = &x[t * s * h..(t + 1) * s * h];
        let wt = &w[t * stride..t * stride + s];
        for (i, v) in o.iter_mut().enumerate() {
            let mut acc = 0f32;
            for j in 0..s {
                acc += wt[j] * xt[j * h + i];
            }
            *v = acc;
        }
    }
}

/// `x[t, k] = post[t, k] · y[t] + Σ_j C[t, j, k] · x[t, j]` ([`crate::Backend::mhc_expand`]).
pub fn mhc_expand(x: &mut [f32], w: &[f32], y: &[f32], n: usize, s: usize, h: usize) {
    let stride = (2 + s) * s;
    let mut col = vec![0f32; s];
    for t in 0..n {
        let xt = &mut x[t * s * h..(t + 1) * s * h];
        let wt = &w[t * stride..(t + 1) * stride];
        let (post, c) = (&wt[s..2 * s], &wt[2 * s..]);
        let yt = &y[t * h..(t + 1) * h];
        for i in 0..h {
            for (j, v) in col.iter_mut().enumerate() {
                *v = xt[j * h + i];
            }
            for k in 0..s {
                let mut acc = 0f32;
                for j in 0..s {
                    acc += c[j * s + k] * col[j];
                }
                xt[k * h + i] = post[k] * yt[i] + acc;
            }
        }
    }
}

/// Rotation of the trailing `2·inv_freq.len()` channels of each head in interleaved pairs
/// ([`crate::Backend::rope_trailing`]).
pub fn rope_trailing(
    x: &mut [f32],
    n_head: usize,
    hd: usize,
    positions: &[u32],
    inv_freq: &[f32],
    inverse: bool,
) {
    let r = 2 * inv_freq.len();
    let sign = if inverse { -1.0f32 } else { 1.0 };
    let mut cs = vec![(0f32, 0f32); inv_freq.len()];
    for (t, &p) in positions.iter().enumerate() {
        for (i, f) in inv_freq.iter().enumerate() {
            let a = p as f32 * f;
            cs[i] = (a.cos(), sign * a.sin());
        }
        for hh in 0..n_head {
            let v = &mut x[(t * n_head + hh) * hd + hd - r..(t * n_head + hh + 1) * hd];
            for (i, &(c, s)) in cs.iter().enumerate() {
                let (a, b) = (v[2 * i], v[2 * i + 1]);
                v[2 * i] = a * c - b * s;
                v[2 * i + 1] = b * c + a * s;
            }
        }
    }
}

/// The compressor's pooling of windows `first..first + n_windows` ([`crate::Backend::compress_pool`]).
#[allow(clippy::too_many_arguments)]
pub fn compress_pool(
    raw: &[f32],
    raw_slots: usize,
    raw_width: usize,
    d: usize,
    ape: &[f32],
    m: usize,
    overlap: bool,
    first: usize,
    n_windows: usize,
    out: &mut [f32],
) {
    // Row layout: [values (d, or 2d with overlap) | gates (same)].
    let half = if overlap { 2 * d } else { d };
    debug_assert!(raw_width >= 2 * half);
    let row = |p: usize| &raw[(p % raw_slots) * raw_width..][..raw_width];
    let mut logit = Vec::with_capacity(2 * m);
    let mut value = Vec::with_capacity(2 * m);
    for (wi, o) in out[..n_windows * d].chunks_exact_mut(d).enumerate() {
        let w = first + wi;
        for c in 0..d {
            logit.clear();
            value.clear();
            if overlap {
                if w > 0 {
                    for j in 0..m {
                        let r = row((w - 1) * m + j);
                        value.push(r[c]);
                        logit.push(r[half + c] + ape[j * 2 * d + c]);
                    }
                }
                for j in 0..m {
                    let r = row(w * m + j);
                    value.push(r[d + c]);
                    logit.push(r[half + d + c] + ape[j * 2 * d + d + c]);
                }
            } else {
                for j in 0..m {
                    let r = row(w * m + j);
                    value.push(r[c]);
                    logit.push(r[half + c] + ape[j * d + c]);
                }
            }
            let mx = logit.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let mut sum = 0f32;
            for l in logit.iter_mut() {
                *l = (*l - mx).exp();
                sum += *l;
            }
            let mut acc = 0f32;
            for (l, v) in logit.iter().zip(&value) {
                acc += l / sum * v;
            }
            o[c] = acc;
        }
    }
}

/// The Lightning indexer's selection ([`crate::Backend::lightning_select`]).
#[allow(clippy::too_many_arguments)]
pub fn lightning_select(
    q: &[f32],
    w: &[f32],
    keys: &[f32],
    positions: &[u32],
    p: &LightningParams,
    sel: &mut [u32],
    counts: &mut [u32],
) {
    let (nh, di, width) = (p.n_head, p.head_dim, p.width());
    let mut scores: Vec<(f32, u32)> = Vec::new();
    for (t, &pos) in positions.iter().enumerate() {
        let nv = (pos as usize + 1) / p.ratio;
        let row = &mut sel[t * width..(t + 1) * width];
        if nv <= p.top_k {
            // Every entry; expanded, every position up to pos.
            let all = if p.expand { pos as usize + 1 } else { nv };
            for (i, v) in row.iter_mut().take(all).enumerate() {
                *v = i as u32;
            }
            counts[t] = all as u32;
            continue;
        }
        scores.clear();
        let qt = &q[t * nh * di..(t + 1) * nh * di];
        let wt = &w[t * nh..(t + 1) * nh];
        for e in 0..nv {
            let k = &keys[e * di..(e + 1) * di];
            let mut s = 0f32;
            for h in 0..nh {
                let dot: f32 = qt[h * di..(h + 1) * di]
                    .iter()
                    .zip(k)
                    .map(|(a, b)| a * b)
                    .sum();
                s += dot.max(0.0) * p.scale * wt[h];
            }
            scores.push((if s.is_nan() { f32::NEG_INFINITY } else { s }, e as u32));
        }
        // The largest scores, the lower entry first among equal ones; then ascending order.
        scores.select_nth_unstable_by(p.top_k - 1, |a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut kept: Vec<u32> = scores[..p.top_k].iter().map(|s| s.1).collect();
        kept.sort_unstable();
        if !p.expand {
            row.copy_from_slice(&kept);
            counts[t] = p.top_k as u32;
            continue;
        }
        let r = p.ratio;
        let tail = nv * r..=pos as usize;
        let expanded = kept
            .iter()
            .flat_map(|&e| e as usize * r..(e as usize + 1) * r);
        let mut j = 0;
        for (v, x) in row.iter_mut().zip(expanded.chain(tail)) {
            *v = x as u32;
            j += 1;
        }
        counts[t] = j as u32;
    }
}

/// One set of K=V rows an attention reads: row t of `sel` (`width` wide) lists `counts[t]` rows of
/// `rows`.
pub struct RowSet<'a> {
    pub rows: &'a [f32],
    pub sel: &'a [u32],
    pub counts: &'a [u32],
    pub width: usize,
}

impl<'a> From<(&'a Vec<f32>, &'a Vec<u32>, &'a Vec<u32>, usize)> for RowSet<'a> {
    fn from(s: (&'a Vec<f32>, &'a Vec<u32>, &'a Vec<u32>, usize)) -> Self {
        RowSet {
            rows: s.0,
            sel: s.1,
            counts: s.2,
            width: s.3,
        }
    }
}

/// Attention with sinks over the selected rows of two sets ([`crate::Backend::attention_sink`]).
#[allow(clippy::too_many_arguments)]
pub fn attention_sink(
    q: &[f32],
    sets: [&RowSet; 2],
    sinks: &[f32],
    n: usize,
    nh: usize,
    hd: usize,
    scale: f32,
    out: &mut [f32],
) {
    let mut rows: Vec<&[f32]> = Vec::new();
    let mut p = Vec::new();
    for t in 0..n {
        rows.clear();
        for s in sets {
            let c = s.counts[t] as usize;
            for &r in &s.sel[t * s.width..t * s.width + c] {
                rows.push(&s.rows[r as usize * hd..(r as usize + 1) * hd]);
            }
        }
        for h in 0..nh {
            let qh = &q[(t * nh + h) * hd..(t * nh + h + 1) * hd];
            p.clear();
            let mut m = sinks[h];
            for r in &rows {
                let dot: f32 = qh.iter().zip(r.iter()).map(|(a, b)| a * b).sum();
                let s = dot * scale;
                m = m.max(s);
                p.push(s);
            }
            let mut z = ((sinks[h] - m).exp()) as f64;
            for v in p.iter_mut() {
                *v = (*v - m).exp();
                z += *v as f64;
            }
            let z = z as f32;
            let o = &mut out[(t * nh + h) * hd..(t * nh + h + 1) * hd];
            o.fill(0.0);
            for (r, &e) in rows.iter().zip(&p) {
                let pr = e / z;
                for (ov, rv) in o.iter_mut().zip(r.iter()) {
                    *ov += pr * rv;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sinkhorn_columns_sum_to_one() {
        let s = 4;
        let mut mix: Vec<f32> = (0..(2 + s) * s).map(|i| (i as f32 * 0.37).sin()).collect();
        let base = vec![0.1f32; (2 + s) * s];
        mhc_weights(&mut mix, &base, [1.0, 0.5, 2.0], 1, s, 20, 1e-6, false);
        let c = &mix[2 * s..];
        for k in 0..s {
            let sum: f32 = (0..s).map(|j| c[j * s + k]).sum();
            assert!((sum - 1.0).abs() < 1e-4, "column {k}: {sum}");
        }
        assert!(mix[..s].iter().all(|&p| p > 0.0 && p < 1.0 + 1e-6));
        assert!(mix[s..2 * s].iter().all(|&p| p > 0.0 && p < 2.0));
    }

    #[test]
    fn inverse_rotation_undoes_the_rotation() {
        let inv = [1.0f32, 0.1, 0.01];
        let x0: Vec<f32> = (0..2 * 8).map(|i| i as f32 - 3.5).collect();
        let mut x = x0.clone();
        rope_trailing(&mut x, 2, 8, &[37], &inv, false);
        assert_ne!(x, x0);
        // The leading 2 channels of each head are not rotated.
        assert_eq!(&x[..2], &x0[..2]);
        rope_trailing(&mut x, 2, 8, &[37], &inv, true);
        for (a, b) in x.iter().zip(&x0) {
            assert!((a - b).abs() < 1e-4);
        }
    }

    #[test]
    fn lightning_keeps_the_best_entries_lower_first_on_ties() {
        let p = LightningParams {
            n_head: 1,
            head_dim: 1,
            ratio: 1,
            top_k: 2,
            scale: 1.0,
            expand: false,
        };
        // Keys 3, 5, 5, 1: entry 1 and 2 tie at the top.
        let keys = [3.0f32, 5.0, 5.0, 1.0];
        let (mut sel, mut counts) = (vec![0u32; 2], vec![0u32; 1]);
        lightning_select(&[1.0], &[1.0], &keys, &[3], &p, &mut sel, &mut counts);
        assert_eq!((sel.as_slice(), counts[0]), (&[1u32, 2][..], 2));
        let keys = [5.0f32, 3.0, 5.0, 5.0];
        lightning_select(&[1.0], &[1.0], &keys, &[3], &p, &mut sel, &mut counts);
        assert_eq!(sel, [0, 2]);
        // Few entries visible: all of them.
        lightning_select(&[1.0], &[1.0], &keys, &[1], &p, &mut sel, &mut counts);
        assert_eq!((sel[..2].to_vec(), counts[0]), (vec![0, 1], 2));
    }

    #[test]
    fn lightning_expands_pools_to_positions_and_the_open_tail() {
        // Pools of 3: at position 13 pools 0..4 are complete (keys 3, 5, 1, 5), 12..=13 open.
        let p = LightningParams {
            n_head: 1,
            head_dim: 1,
            ratio: 3,
            top_k: 2,
            scale: 1.0,
            expand: true,
        };
        assert_eq!(p.width(), 8);
        let keys = [3.0f32, 5.0, 1.0, 5.0];
        let (mut sel, mut counts) = (vec![0u32; 16], vec![0u32; 2]);
        lightning_select(
            &[1.0; 2],
            &[1.0; 2],
            &keys,
            &[13, 5],
            &p,
            &mut sel,
            &mut counts,
        );
        assert_eq!(counts, [8, 6]);
        assert_eq!(sel[..8], [3, 4, 5, 9, 10, 11, 12, 13]);
        // Two complete pools fit the budget: every position up to 5.
        assert_eq!(sel[8..14], [0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn sink_takes_probability_without_value() {
        // One row of ones, a query of zeros: logits 0 and the sink 0 → half the weight each.
        let rows = vec![1.0f32; 4];
        let set = RowSet {
            rows: &rows,
            sel: &[0],
            counts: &[1],
            width: 1,
        };
        let none = RowSet {
            rows: &[],
            sel: &[0],
            counts: &[0],
            width: 1,
        };
        let mut out = vec![0f32; 4];
        attention_sink(&[0.0; 4], [&set, &none], &[0.0], 1, 1, 4, 1.0, &mut out);
        assert_eq!(out, vec![0.5; 4]);
    }
}
