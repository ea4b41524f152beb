//! Row kernels of the CPU backend's norms and RoPE (`ops.rs`): the f64 sum of squares, RMS norm
//! rows and the rotary cache.

use crate::RopeParams;

/// Σ x² in f64 (as ggml, which sums in f64), in 8 interleaved lanes combined in a fixed order:
/// the lanes vectorize, and the f64 sum of f32 squares differs from a sequential sum only far
/// below f32 resolution.
fn sum_sq_f64(x: &[f32]) -> f64 {
    let mut lanes = [0f64; 8];
    let mut it = x.chunks_exact(8);
    for c in &mut it {
        for i in 0..8 {
            lanes[i] += (c[i] * c[i]) as f64;
        }
    }
    let mut sum = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
        + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
    for &v in it.remainder() {
        sum += (v * v) as f64;
    }
    sum
}

/// y = x * (1 / sqrt(mean(x²) + eps)) * w, with the sum of squares in f64 as ggml does.
pub(super) fn rms_norm_row(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    let mean = (sum_sq_f64(x) / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for i in 0..x.len() {
        y[i] = (x[i] * scale) * w[i];
    }
}

/// [`rms_norm_row`] in place.
pub(super) fn rms_norm_row_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let mean = (sum_sq_f64(x) / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for (v, &wi) in x.iter_mut().zip(w) {
        *v = (*v * scale) * wi;
    }
}

/// cos/sin table for one position, built as ggml's rope cache (repeated f32 multiplication).
pub(super) fn rope_cache(pos: u32, p: &RopeParams, cache: &mut [f32]) {
    let theta_scale = p.freq_base.powf(-2.0 / p.n_rot as f32);
    let mut theta = pos as f32;
    for i0 in (0..p.n_rot).step_by(2) {
        let ff = p.freq_factors.as_ref().map(|f| f[i0 / 2]).unwrap_or(1.0);
        let t = p.freq_scale * (theta / ff);
        cache[i0] = t.cos();
        cache[i0 + 1] = t.sin();
        theta *= theta_scale;
    }
}

pub(super) fn rope_head(x: &mut [f32], cache: &[f32], n_rot: usize, neox: bool) {
    for i0 in (0..n_rot).step_by(2) {
        let (c, s) = (cache[i0], cache[i0 + 1]);
        let (a, b) = if neox {
            (i0 / 2, i0 / 2 + n_rot / 2)
        } else {
            (i0, i0 + 1)
        };
        let (x0, x1) = (x[a], x[b]);
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}
