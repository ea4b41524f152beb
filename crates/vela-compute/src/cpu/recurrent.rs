//! Ops of recurrent (linear-attention) layers on the CPU, the reference for every backend:
//! the causal depthwise convolution with a carried state, row L2 normalisation and the gated
//! delta rule in its recurrent (token-by-token) form.
//!
//! Every result depends only on the tokens before it, never on how a sequence was split into
//! calls (prefill chunks, verify batches, single steps): the recurrent form evaluates token by
//! token, and every sum runs in one fixed order with each product and sum rounded to f32.

use super::pool::ThreadPool;

/// Raw pointer shared across pool threads writing disjoint ranges.
#[derive(Clone, Copy)]
struct SyncPtr(*mut f32);
unsafe impl Send for SyncPtr {}
unsafe impl Sync for SyncPtr {}

impl SyncPtr {
    fn get(&self) -> *mut f32 {
        self.0
    }
}

/// Depthwise causal convolution: see [`crate::Backend::conv1d_causal`].
#[allow(clippy::too_many_arguments)]
pub fn conv1d_causal(
    x: &[f32],
    from: usize,
    n: usize,
    width: usize,
    w: &[f32],
    k: usize,
    dilation: usize,
    silu: bool,
    state: &mut [f32],
    out: &mut [f32],
) {
    let (x, out) = (&x[from * width..], &mut out[from * width..]);
    let s = (k - 1) * dilation;
    assert!(
        k >= 1 && dilation >= 1,
        "conv1d_causal: kernel and dilation at least 1"
    );
    assert!(
        w.len() >= width * k && state.len() >= s * width,
        "conv1d_causal: buffer too small"
    );
    assert!(
        x.len() >= n * width && out.len() >= n * width,
        "conv1d_causal: buffer too small"
    );
    // Row r of [state; x].
    let row = |r: usize| -> &[f32] {
        if r < s {
            &state[r * width..(r + 1) * width]
        } else {
            &x[(r - s) * width..(r - s + 1) * width]
        }
    };
    for t in 0..n {
        let o = &mut out[t * width..(t + 1) * width];
        for (c, oc) in o.iter_mut().enumerate() {
            let mut acc = 0.0f32;
            for j in 0..k {
                acc += w[c * k + j] * row(t + j * dilation)[c];
            }
            *oc = if silu {
                acc / (1.0 + (-acc).exp())
            } else {
                acc
            };
        }
    }
    // The state becomes the last s rows of [state; x].
    if s > 0 {
        let mut next = vec![0f32; s * width];
        for (i, dst) in next.chunks_exact_mut(width).enumerate() {
            dst.copy_from_slice(row(n + i));
        }
        state[..s * width].copy_from_slice(&next);
    }
}

/// x · 1/sqrt(Σx² + eps), Σ ascending in f32, times `scale`.
fn l2_normalize(x: &[f32], eps: f32, scale: f32, out: &mut [f32]) {
    let mut ss = 0.0f32;
    for v in x {
        ss += v * v;
    }
    let inv = 1.0 / (ss + eps).sqrt();
    for (o, v) in out.iter_mut().zip(x) {
        *o = *v * inv * scale;
    }
}

/// See [`crate::Backend::sum_rows`].
pub fn sum_rows(x: &[f32], n_rows: usize, width: usize, out: &mut [f32]) {
    for (r, o) in x[..n_rows * width].chunks_exact(width).zip(out.iter_mut()) {
        let mut s = 0.0f32;
        for v in r {
            s += v;
        }
        *o = s;
    }
}

/// See [`crate::Backend::decay_gate`].
pub fn decay_gate(x: &mut [f32], bias: &[f32], scale: &[f32], n_rows: usize, width: usize) {
    for r in x[..n_rows * width].chunks_exact_mut(width) {
        for ((v, b), s) in r.iter_mut().zip(bias).zip(scale) {
            let y = *v + b;
            let sp = if y > 20.0 { y } else { y.exp().ln_1p() };
            *v = s * sp;
        }
    }
}

/// See [`crate::Backend::signed_sqrt_gate`].
pub fn signed_sqrt_gate(x: &mut [f32], scale: f32) {
    for v in x.iter_mut() {
        let y = *v * scale;
        let m = y.abs().max(1e-6).sqrt();
        let g = if y > 0.0 {
            m
        } else if y < 0.0 {
            -m
        } else {
            0.0
        };
        *v = 1.0 / (1.0 + (-g).exp());
    }
}

/// See [`crate::Backend::mean_streams`].
pub fn mean_streams(x: &[f32], n: usize, streams: usize, width: usize, out: &mut [f32]) {
    for (xr, o) in x[..n * streams * width]
        .chunks_exact(streams * width)
        .zip(out[..n * width].chunks_exact_mut(width))
    {
        o.copy_from_slice(&xr[..width]);
        for s in 1..streams {
            for (a, b) in o.iter_mut().zip(&xr[s * width..(s + 1) * width]) {
                *a += *b;
            }
        }
        let d = streams as f32;
        o.iter_mut().for_each(|a| *a /= d);
    }
}

/// See [`crate::Backend::inject_streams`].
pub fn inject_streams(x: &mut [f32], w: &[f32], y: &[f32], n: usize, streams: usize, width: usize) {
    for t in 0..n {
        let yr = &y[t * width..(t + 1) * width];
        for s in 0..streams {
            let wt = w[t * streams + s];
            let xr = &mut x[(t * streams + s) * width..][..width];
            for (a, b) in xr.iter_mut().zip(yr) {
                *a += wt * *b;
            }
        }
    }
}

/// Shapes of a gated-delta-rule call.
#[derive(Clone, Copy, Debug)]
pub struct DeltaDims {
    pub n: usize,
    pub n_k: usize,
    pub n_v: usize,
    pub dk: usize,
    pub dv: usize,
    /// Value head h reads key head h % n_k (llama.cpp's reordered "tiled" heads) instead of
    /// h / (n_v / n_k) (HF's grouping).
    pub tiled: bool,
    /// The first row of the inputs and the output to process.
    pub from: usize,
}

impl DeltaDims {
    /// The key head of value head `h`.
    pub fn key_head(&self, h: usize) -> usize {
        if self.tiled {
            h % self.n_k
        } else {
            h / (self.n_v / self.n_k)
        }
    }
}

/// The gated delta rule: see [`crate::Backend::gated_delta_rule`]. Heads run in parallel;
/// within a head every sum is in ascending key index.
pub fn gated_delta_rule(
    pool: &ThreadPool,
    qkv: &[f32],
    g: &[f32],
    beta: &[f32],
    d: DeltaDims,
    state: &mut [f32],
    out: &mut [f32],
) {
    delta_rule(pool, qkv, g, false, beta, d, state, out);
}

/// The gated delta rule with a decay per key channel (KDA): see
/// [`crate::Backend::gated_delta_rule_channels`].
pub fn gated_delta_rule_channels(
    pool: &ThreadPool,
    qkv: &[f32],
    g: &[f32],
    beta: &[f32],
    d: DeltaDims,
    state: &mut [f32],
    out: &mut [f32],
) {
    delta_rule(pool, qkv, g, true, beta, d, state, out);
}

/// Both delta rules: `g` holds one log-decay per value head (`[n, n_v]`) or, with `channels`,
/// one per value head and key channel (`[n, n_v·dk]`). A per-head decay multiplies every row
/// of the state by the same factor, so both forms share the loop (and its bits).
#[allow(clippy::too_many_arguments)]
fn delta_rule(
    pool: &ThreadPool,
    qkv: &[f32],
    g: &[f32],
    channels: bool,
    beta: &[f32],
    d: DeltaDims,
    state: &mut [f32],
    out: &mut [f32],
) {
    let DeltaDims {
        n,
        n_k,
        n_v,
        dk,
        dv,
        from,
        ..
    } = d;
    let row = 2 * n_k * dk + n_v * dv;
    let gw = if channels { n_v * dk } else { n_v };
    let (qkv, g, beta) = (&qkv[from * row..], &g[from * gw..], &beta[from * n_v..]);
    let out = &mut out[from * n_v * dv..];
    assert!(
        n_k > 0 && n_v % n_k == 0,
        "gated_delta_rule: value heads must be a multiple of key heads"
    );
    assert!(
        qkv.len() >= n * row && out.len() >= n * n_v * dv,
        "gated_delta_rule: buffer too small"
    );
    assert!(
        g.len() >= n * gw && beta.len() >= n * n_v,
        "gated_delta_rule: g/beta too small"
    );
    assert!(
        state.len() >= n_v * dk * dv,
        "gated_delta_rule: state too small"
    );
    let q_scale = 1.0 / (dk as f32).sqrt();
    let (sp, op) = (SyncPtr(state.as_mut_ptr()), SyncPtr(out.as_mut_ptr()));
    let head = |h: usize| {
        // SAFETY: head h owns state[h·dk·dv ..][..dk·dv] and the h-th dv-wide column block of
        // every output row; heads are disjoint.
        let s = unsafe { std::slice::from_raw_parts_mut(sp.get().add(h * dk * dv), dk * dv) };
        let kh = d.key_head(h);
        let (mut qt, mut kt, mut kv) = (vec![0f32; dk], vec![0f32; dk], vec![0f32; dv]);
        let mut decay = vec![0f32; dk];
        for t in 0..n {
            let r = &qkv[t * row..(t + 1) * row];
            l2_normalize(&r[kh * dk..(kh + 1) * dk], 1e-6, q_scale, &mut qt);
            l2_normalize(&r[(n_k + kh) * dk..(n_k + kh + 1) * dk], 1e-6, 1.0, &mut kt);
            let vt = &r[2 * n_k * dk + h * dv..][..dv];
            if channels {
                let gt = &g[(t * n_v + h) * dk..][..dk];
                decay.iter_mut().zip(gt).for_each(|(a, x)| *a = x.exp());
            } else {
                decay.fill(g[t * n_v + h].exp());
            }
            let b = beta[t * n_v + h];
            kv.iter_mut().for_each(|x| *x = 0.0);
            for (i, srow) in s.chunks_exact_mut(dv).enumerate() {
                let (ki, ai) = (kt[i], decay[i]);
                for (sj, kj) in srow.iter_mut().zip(kv.iter_mut()) {
                    *sj *= ai;
                    *kj += *sj * ki;
                }
            }
            for (kj, vj) in kv.iter_mut().zip(vt) {
                *kj = b * (vj - *kj);
            }
            // SAFETY: see above.
            let o = unsafe { std::slice::from_raw_parts_mut(op.get().add((t * n_v + h) * dv), dv) };
            o.iter_mut().for_each(|x| *x = 0.0);
            for (i, srow) in s.chunks_exact_mut(dv).enumerate() {
                let (ki, qi) = (kt[i], qt[i]);
                for ((sj, dj), oj) in srow.iter_mut().zip(&kv).zip(o.iter_mut()) {
                    *sj += ki * dj;
                    *oj += *sj * qi;
                }
            }
        }
    };
    if n_v >= 2 && pool.n_threads() >= 2 {
        pool.run_chunks(n_v, head);
    } else {
        (0..n_v).for_each(head);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rng(seed: u64) -> impl FnMut() -> f32 {
        let mut s = seed;
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        }
    }

    /// The convolution written as HF writes it: pad the sequence with the state, convolve.
    #[test]
    fn conv_matches_a_direct_convolution_and_any_split() {
        let (width, k, dil, n) = (5, 4, 3, 17);
        let mut r = rng(1);
        let x: Vec<f32> = (0..n * width).map(|_| r()).collect();
        let w: Vec<f32> = (0..width * k).map(|_| r()).collect();
        let s = (k - 1) * dil;
        // Direct: zero history.
        let mut want = vec![0f32; n * width];
        for t in 0..n {
            for c in 0..width {
                let mut acc = 0.0f32;
                for j in 0..k {
                    let src = t as isize + (j * dil) as isize - s as isize;
                    if src >= 0 {
                        acc += w[c * k + j] * x[src as usize * width + c];
                    }
                }
                want[t * width + c] = acc;
            }
        }
        for split in [1, 2, 5, 16, 17] {
            let mut state = vec![0f32; s * width];
            let mut got = vec![0f32; n * width];
            let mut t = 0;
            while t < n {
                let m = split.min(n - t);
                let mut o = vec![0f32; m * width];
                conv1d_causal(
                    &x[t * width..(t + m) * width],
                    0,
                    m,
                    width,
                    &w,
                    k,
                    dil,
                    false,
                    &mut state,
                    &mut o,
                );
                got[t * width..(t + m) * width].copy_from_slice(&o);
                t += m;
            }
            assert_eq!(got, want, "split {split}");
            // The state is the last s input rows.
            assert_eq!(state, x[(n - s) * width..].to_vec());
        }
    }

    #[test]
    fn streams() {
        // Two tokens, three streams of width 2.
        let x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 0.5, 0.5, 1.0, 1.0, 1.5, 1.5];
        let mut m = [0f32; 4];
        mean_streams(&x, 2, 3, 2, &mut m);
        assert_eq!(m, [3.0, 4.0, 1.0, 1.0]);
        let mut xx = x;
        inject_streams(
            &mut xx,
            &[1.0, 0.0, 2.0, 0.5, 0.5, 0.5],
            &[10.0, 20.0, 2.0, 4.0],
            2,
            3,
            2,
        );
        assert_eq!(
            xx,
            [11.0, 22.0, 3.0, 4.0, 25.0, 46.0, 1.5, 2.5, 2.0, 3.0, 2.5, 3.5]
        );
    }

    #[test]
    fn small_ops() {
        let mut o = [0f32; 2];
        sum_rows(&[1.0, 2.0, 3.0, 4.0], 2, 2, &mut o);
        assert_eq!(o, [3.0, 7.0]);
        let mut x = [0.0f32, 30.0];
        decay_gate(&mut x, &[0.0, 0.0], &[-2.0, -1.0], 1, 2);
        assert_eq!(x, [-2.0 * 2f32.ln(), -30.0]);
        let mut y = [4.0f32, -4.0, 0.0];
        signed_sqrt_gate(&mut y, 0.25);
        let sg = |v: f32| 1.0 / (1.0 + (-v).exp());
        assert_eq!(y, [sg(1.0), sg(-1.0), 0.5]);
    }

    /// The recurrence in f64 from its definition (q, k normalised first), against the f32 op;
    /// and every split of the sequence into calls gives the same bits.
    /// The gated delta rule in f64 from its definition: per token and value head, q and k
    /// l2-normalised (q scaled by 1/√dk), the state's row i decayed by exp(`decay(t, h, i)`),
    /// then the delta update with β and the readout by q. Value head h reads key head
    /// h / (n_v / n_k).
    fn delta_reference(
        d: DeltaDims,
        qkv: &[f32],
        beta: &[f32],
        decay: impl Fn(usize, usize, usize) -> f32,
    ) -> Vec<f64> {
        let row = 2 * d.n_k * d.dk + d.n_v * d.dv;
        let norm = |x: &[f32], s: f64| -> Vec<f64> {
            let n: f64 = x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() + 1e-6;
            x.iter().map(|v| *v as f64 / n.sqrt() * s).collect()
        };
        let mut s64 = vec![0f64; d.n_v * d.dk * d.dv];
        let mut want = vec![0f64; d.n * d.n_v * d.dv];
        for t in 0..d.n {
            let rr = &qkv[t * row..(t + 1) * row];
            for h in 0..d.n_v {
                let kh = h / (d.n_v / d.n_k);
                let q = norm(&rr[kh * d.dk..(kh + 1) * d.dk], 1.0 / (d.dk as f64).sqrt());
                let k = norm(&rr[(d.n_k + kh) * d.dk..(d.n_k + kh + 1) * d.dk], 1.0);
                let v = &rr[2 * d.n_k * d.dk + h * d.dv..][..d.dv];
                let s = &mut s64[h * d.dk * d.dv..][..d.dk * d.dv];
                for i in 0..d.dk {
                    let a = (decay(t, h, i) as f64).exp();
                    s[i * d.dv..(i + 1) * d.dv].iter_mut().for_each(|x| *x *= a);
                }
                for j in 0..d.dv {
                    let mem: f64 = (0..d.dk).map(|i| s[i * d.dv + j] * k[i]).sum();
                    let delta = beta[t * d.n_v + h] as f64 * (v[j] as f64 - mem);
                    for i in 0..d.dk {
                        s[i * d.dv + j] += k[i] * delta;
                    }
                }
                for j in 0..d.dv {
                    want[(t * d.n_v + h) * d.dv + j] =
                        (0..d.dk).map(|i| s[i * d.dv + j] * q[i]).sum();
                }
            }
        }
        want
    }

    #[test]
    fn delta_rule_matches_the_definition_and_any_split() {
        let d = DeltaDims {
            n: 9,
            n_k: 2,
            n_v: 4,
            dk: 8,
            dv: 6,
            tiled: false,
            from: 0,
        };
        let row = 2 * d.n_k * d.dk + d.n_v * d.dv;
        let mut r = rng(7);
        let qkv: Vec<f32> = (0..d.n * row).map(|_| r()).collect();
        let g: Vec<f32> = (0..d.n * d.n_v).map(|_| -0.5 * (r() + 1.0)).collect();
        let beta: Vec<f32> = (0..d.n * d.n_v).map(|_| 0.5 * (r() + 1.0)).collect();
        let want = delta_reference(d, &qkv, &beta, |t, h, _| g[t * d.n_v + h]);
        let pool = ThreadPool::new(2);
        let run = |split: usize| {
            let mut state = vec![0f32; d.n_v * d.dk * d.dv];
            let mut out = vec![0f32; d.n * d.n_v * d.dv];
            let mut t = 0;
            while t < d.n {
                let m = split.min(d.n - t);
                let dd = DeltaDims { n: m, ..d };
                let mut o = vec![0f32; m * d.n_v * d.dv];
                let gi = t * d.n_v;
                gated_delta_rule(
                    &pool,
                    &qkv[t * row..],
                    &g[gi..],
                    &beta[gi..],
                    dd,
                    &mut state,
                    &mut o,
                );
                out[t * d.n_v * d.dv..][..o.len()].copy_from_slice(&o);
                t += m;
            }
            (out, state)
        };
        let (whole, st) = run(d.n);
        for (a, b) in whole.iter().zip(&want) {
            assert!((*a as f64 - b).abs() < 1e-5, "{a} vs {b}");
        }
        for split in [1, 2, 4] {
            assert_eq!(run(split), (whole.clone(), st.clone()), "split {split}");
        }
    }

    /// The per-channel (KDA) rule in f64 from its definition, against the f32 op; any split of
    /// the sequence gives the same bits; equal decays across channels give the per-head rule's
    /// bits.
    #[test]
    fn channel_delta_rule_matches_the_definition_and_any_split() {
        let d = DeltaDims {
            n: 11,
            n_k: 3,
            n_v: 3,
            dk: 5,
            dv: 5,
            tiled: false,
            from: 0,
        };
        let row = 2 * d.n_k * d.dk + d.n_v * d.dv;
        let gw = d.n_v * d.dk;
        let mut r = rng(11);
        let qkv: Vec<f32> = (0..d.n * row).map(|_| r()).collect();
        let g: Vec<f32> = (0..d.n * gw).map(|_| -2.0 * (r() + 1.0)).collect();
        let beta: Vec<f32> = (0..d.n * d.n_v).map(|_| 0.5 * (r() + 1.0)).collect();
        let want = delta_reference(d, &qkv, &beta, |t, h, i| g[t * gw + h * d.dk + i]);
        let pool = ThreadPool::new(2);
        let run = |split: usize| {
            let mut state = vec![0f32; d.n_v * d.dk * d.dv];
            let mut out = vec![0f32; d.n * d.n_v * d.dv];
            let mut t = 0;
            while t < d.n {
                let m = split.min(d.n - t);
                let dd = DeltaDims { n: m, from: t, ..d };
                gated_delta_rule_channels(&pool, &qkv, &g, &beta, dd, &mut state, &mut out);
                t += m;
            }
            (out, state)
        };
        let (whole, st) = run(d.n);
        for (a, b) in whole.iter().zip(&want) {
            assert!((*a as f64 - b).abs() < 1e-5, "{a} vs {b}");
        }
        for split in [1, 3, 4] {
            assert_eq!(run(split), (whole.clone(), st.clone()), "split {split}");
        }
        // One decay per head, repeated over its channels: the per-head rule's bits.
        let gh: Vec<f32> = (0..d.n * d.n_v).map(|i| g[i * d.dk]).collect();
        let gc: Vec<f32> = gh.iter().flat_map(|&x| [x; 5]).collect();
        let (mut s1, mut o1) = (vec![0f32; st.len()], vec![0f32; whole.len()]);
        let (mut s2, mut o2) = (vec![0f32; st.len()], vec![0f32; whole.len()]);
        gated_delta_rule(&pool, &qkv, &gh, &beta, d, &mut s1, &mut o1);
        gated_delta_rule_channels(&pool, &qkv, &gc, &beta, d, &mut s2, &mut o2);
        assert_eq!((o1, s1), (o2, s2));
    }
}
