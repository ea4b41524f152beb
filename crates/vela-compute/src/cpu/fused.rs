//! Fused elementwise chains (see the `Backend` methods of the same names): each computes the
//! values of the op sequence it replaces with the same f32 operations in the same order, so the
//! CPU results are bit-identical to the unfused ops.

use super::kit::sigmoid1;
use super::recurrent::decay_gate;

/// x = v·σ(v), v = x·s.
pub fn silu_scaled(x: &mut [f32], s: f32) {
    for v in x.iter_mut() {
        let y = *v * s;
        *v = y * sigmoid1(y);
    }
}

/// x = post·σ(pre·x).
pub fn sigmoid_scaled(x: &mut [f32], pre: f32, post: f32) {
    for v in x.iter_mut() {
        *v = sigmoid1(*v * pre) * post;
    }
}

/// x *= σ(g).
pub fn sigmoid_mul(x: &mut [f32], g: &[f32]) {
    x.iter_mut().zip(g).for_each(|(v, &g)| *v *= sigmoid1(g));
}

/// out row t = (Σ_s σ(a[t, s]) ⊙ xn[t, s]) / streams, summed in ascending s.
pub fn sigmoid_mix_streams(
    a: &[f32],
    xn: &[f32],
    n: usize,
    streams: usize,
    width: usize,
    out: &mut [f32],
) {
    let w = streams * width;
    for ((ar, xr), o) in a[..n * w]
        .chunks_exact(w)
        .zip(xn[..n * w].chunks_exact(w))
        .zip(out[..n * width].chunks_exact_mut(width))
    {
        for (i, o) in o.iter_mut().enumerate() {
            let mut acc = sigmoid1(ar[i]) * xr[i];
            for s in 1..streams {
                acc += sigmoid1(ar[s * width + i]) * xr[s * width + i];
            }
            *o = acc / streams as f32;
        }
    }
}

/// b = σ(b); a = decay_gate(a).
pub fn delta_gates(
    b: &mut [f32],
    a: &mut [f32],
    bias: &[f32],
    scale: &[f32],
    n_rows: usize,
    width: usize,
) {
    super::kit::sigmoid(&mut b[..n_rows * width]);
    decay_gate(a, bias, scale, n_rows, width);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::{kit, recurrent};

    fn data(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 8) as f32 / (1u32 << 24) as f32 * 16.0 - 8.0
            })
            .collect()
    }

    /// Every fused chain gives the unfused ops' bits.
    #[test]
    fn fused_chains_equal_the_unfused_ops() {
        let (n, s, h) = (3, 4, 37);
        let x = data(n * s * h, 1);
        let g = data(n * s * h, 2);
        let (mut f, mut u) = (x.clone(), x.clone());
        silu_scaled(&mut f, 0.25);
        u.iter_mut().for_each(|v| *v *= 0.25);
        let mut t = u.clone();
        kit::sigmoid(&mut t);
        kit::mul(&mut u, &t);
        assert_eq!(f, u, "silu_scaled");

        let (mut f, mut u) = (x.clone(), x.clone());
        sigmoid_scaled(&mut f, 0.25, 2.0);
        u.iter_mut().for_each(|v| *v *= 0.25);
        kit::sigmoid(&mut u);
        u.iter_mut().for_each(|v| *v *= 2.0);
        assert_eq!(f, u, "sigmoid_scaled");

        let (mut f, mut u) = (x.clone(), x.clone());
        sigmoid_mul(&mut f, &g);
        let mut sg = g.clone();
        kit::sigmoid(&mut sg);
        kit::mul(&mut u, &sg);
        assert_eq!(f, u, "sigmoid_mul");

        let (mut fo, mut uo) = (vec![0.0; n * h], vec![0.0; n * h]);
        sigmoid_mix_streams(&g, &x, n, s, h, &mut fo);
        let mut a = g.clone();
        kit::sigmoid(&mut a);
        kit::mul(&mut a, &x);
        recurrent::mean_streams(&a, n, s, h, &mut uo);
        assert_eq!(fo, uo, "sigmoid_mix_streams");

        let (bias, scale) = (data(h, 3), data(h, 4));
        let (mut fb, mut fa) = (x.clone(), g.clone());
        delta_gates(&mut fb, &mut fa, &bias, &scale, n, h);
        let (mut ub, mut ua) = (x.clone(), g.clone());
        kit::sigmoid(&mut ub[..n * h]);
        recurrent::decay_gate(&mut ua, &bias, &scale, n, h);
        assert_eq!((fb, fa), (ub, ua), "delta_gates");
    }
}
