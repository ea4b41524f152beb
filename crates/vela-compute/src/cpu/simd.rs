//! Small vector helpers for attention and KV conversion: AVX2+FMA+F16C when the CPU has them
//! (detected once at run time), portable scalar code otherwise.

use half::f16;
use std::sync::OnceLock;

fn has_avx2() -> bool {
    static F: OnceLock<bool> = OnceLock::new();
    *F.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::env::var("VELA_KERNEL")
                .map(|v| v != "scalar")
                .unwrap_or(true)
                && is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// Σ a[i]·b[i].
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: features checked above; lengths equal.
        return unsafe { x86::dot_f32(a, b) };
    }
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Σ a[i]·b[i] with b in f16.
pub fn dot_f16(a: &[f32], b: &[f16]) -> f32 {
    assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: features checked above; lengths equal.
        return unsafe { x86::dot_f16(a, b) };
    }
    a.iter().zip(b).map(|(x, y)| x * y.to_f32()).sum()
}

/// y += a·x.
pub fn axpy_f32(a: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: features checked above; lengths equal.
        return unsafe { x86::axpy_f32(a, x, y) };
    }
    y.iter_mut().zip(x).for_each(|(y, x)| *y += a * x);
}

/// x[i] = e^(x[i] - m); returns Σ x[i] (accumulated in f64). The softmax numerator.
pub fn exp_sub_sum(x: &mut [f32], m: f32) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: features checked above.
        return unsafe { x86::exp_sub_sum(x, m) };
    }
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = (*v - m).exp();
        sum += *v as f64;
    }
    sum
}

/// Widen f16 to f32 (exact).
pub fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: features checked above; lengths equal.
        return unsafe { x86::f16_to_f32(src, dst) };
    }
    dst.iter_mut().zip(src).for_each(|(d, s)| *d = s.to_f32());
}

/// y += a·x with x in f16.
pub fn axpy_f16(a: f32, x: &[f16], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: features checked above; lengths equal.
        return unsafe { x86::axpy_f16(a, x, y) };
    }
    y.iter_mut().zip(x).for_each(|(y, x)| *y += a * x.to_f32());
}

/// Round f32 to f16 (round to nearest even, as F16C and ggml do).
pub fn f32_to_f16(src: &[f32], dst: &mut [f16]) {
    dst.iter_mut()
        .zip(src)
        .for_each(|(d, s)| *d = f16::from_f32(*s));
}

/// Widen bf16 to f32 (exact: the bf16 bits are the high half of the f32).
pub fn bf16_to_f32(src: &[half::bf16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len());
    dst.iter_mut()
        .zip(src)
        .for_each(|(d, s)| *d = f32::from_bits((s.to_bits() as u32) << 16));
}

/// Round f32 to bf16 (round to nearest even; NaN stays NaN).
pub fn f32_to_bf16(src: &[f32], dst: &mut [half::bf16]) {
    dst.iter_mut()
        .zip(src)
        .for_each(|(d, s)| *d = half::bf16::from_f32(*s));
}

/// gate[i] = gelu_tanh(gate[i]) * up[i], with gelu_tanh(x) = 0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³)))
/// evaluated as x·σ(2u) (the same function; no cancellation for negative x).
pub fn gelu_mul(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: features checked above; lengths equal.
        return unsafe { x86::act_mul(gate, up, true) };
    }
    gate.iter_mut()
        .zip(up)
        .for_each(|(g, u)| *g = gelu_scalar(*g) * u);
}

/// gate[i] = silu(gate[i]) * up[i], silu(x) = x·σ(x).
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: features checked above; lengths equal.
        return unsafe { x86::act_mul(gate, up, false) };
    }
    gate.iter_mut()
        .zip(up)
        .for_each(|(g, u)| *g = *g / (1.0 + (-*g).exp()) * u);
}

const GELU_K: f32 = 0.797_884_6; // √(2/π)
const GELU_A: f32 = 0.044715;

/// Scalar GELU (tanh approximation) in the σ form.
pub fn gelu_scalar(x: f32) -> f32 {
    let u = GELU_K * x * (1.0 + GELU_A * x * x);
    x / (1.0 + (-2.0 * u).exp())
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use half::f16;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len();
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut i = 0;
        while i + 16 <= n {
            acc0 = _mm256_fmadd_ps(
                _mm256_loadu_ps(a.as_ptr().add(i)),
                _mm256_loadu_ps(b.as_ptr().add(i)),
                acc0,
            );
            acc1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(a.as_ptr().add(i + 8)),
                _mm256_loadu_ps(b.as_ptr().add(i + 8)),
                acc1,
            );
            i += 16;
        }
        let mut s = hsum(_mm256_add_ps(acc0, acc1));
        while i < n {
            s += a[i] * b[i];
            i += 1;
        }
        s
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_f16(a: &[f32], b: &[f16]) -> f32 {
        let n = a.len();
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut i = 0;
        let bp = b.as_ptr() as *const __m128i;
        while i + 16 <= n {
            let b0 = _mm256_cvtph_ps(_mm_loadu_si128(bp.add(i / 8)));
            let b1 = _mm256_cvtph_ps(_mm_loadu_si128(bp.add(i / 8 + 1)));
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(i)), b0, acc0);
            acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(i + 8)), b1, acc1);
            i += 16;
        }
        let mut s = hsum(_mm256_add_ps(acc0, acc1));
        while i < n {
            s += a[i] * b[i].to_f32();
            i += 1;
        }
        s
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn axpy_f16(a: f32, x: &[f16], y: &mut [f32]) {
        let n = x.len();
        let av = _mm256_set1_ps(a);
        let xp = x.as_ptr() as *const __m128i;
        let mut i = 0;
        while i + 8 <= n {
            let xv = _mm256_cvtph_ps(_mm_loadu_si128(xp.add(i / 8)));
            let yv = _mm256_loadu_ps(y.as_ptr().add(i));
            _mm256_storeu_ps(y.as_mut_ptr().add(i), _mm256_fmadd_ps(av, xv, yv));
            i += 8;
        }
        while i < n {
            y[i] += a * x[i].to_f32();
            i += 1;
        }
    }

    /// e^x for 8 lanes: Cody-Waite range reduction to |r| ≤ ln2/2 and a degree-7 Taylor
    /// polynomial (relative error < 1e-7), inputs clamped to ±88.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn exp8(x: __m256) -> __m256 {
        let x = _mm256_max_ps(
            _mm256_min_ps(x, _mm256_set1_ps(88.0)),
            _mm256_set1_ps(-88.0),
        );
        let n = _mm256_round_ps(
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
            0x08,
        );
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_145_75), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428_606_8e-6), r);
        let mut p = _mm256_set1_ps(1.0 / 5040.0);
        for c in [
            1.0 / 720.0,
            1.0 / 120.0,
            1.0 / 24.0,
            1.0 / 6.0,
            0.5,
            1.0,
            1.0,
        ] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let e = _mm256_slli_epi32(
            _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
            23,
        );
        _mm256_mul_ps(p, _mm256_castsi256_ps(e))
    }

    /// gate = act(gate) * up with act = gelu_tanh (gelu) or silu, both as x·σ(s·x').
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn act_mul(gate: &mut [f32], up: &[f32], gelu: bool) {
        let n = gate.len();
        let one = _mm256_set1_ps(1.0);
        let mut i = 0;
        while i + 8 <= n {
            let x = _mm256_loadu_ps(gate.as_ptr().add(i));
            let z = if gelu {
                // -2u = -2·k·x·(1 + a·x²)
                let x2 = _mm256_mul_ps(x, x);
                let t = _mm256_fmadd_ps(x2, _mm256_set1_ps(super::GELU_A), one);
                _mm256_mul_ps(_mm256_mul_ps(x, t), _mm256_set1_ps(-2.0 * super::GELU_K))
            } else {
                _mm256_sub_ps(_mm256_setzero_ps(), x)
            };
            let y = _mm256_div_ps(x, _mm256_add_ps(one, exp8(z)));
            let u = _mm256_loadu_ps(up.as_ptr().add(i));
            _mm256_storeu_ps(gate.as_mut_ptr().add(i), _mm256_mul_ps(y, u));
            i += 8;
        }
        while i < n {
            let x = gate[i];
            let a = if gelu {
                super::gelu_scalar(x)
            } else {
                x / (1.0 + (-x).exp())
            };
            gate[i] = a * up[i];
            i += 1;
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn axpy_f32(a: f32, x: &[f32], y: &mut [f32]) {
        let n = x.len();
        let av = _mm256_set1_ps(a);
        let mut i = 0;
        while i + 8 <= n {
            let yv = _mm256_loadu_ps(y.as_ptr().add(i));
            let xv = _mm256_loadu_ps(x.as_ptr().add(i));
            _mm256_storeu_ps(y.as_mut_ptr().add(i), _mm256_fmadd_ps(av, xv, yv));
            i += 8;
        }
        while i < n {
            y[i] += a * x[i];
            i += 1;
        }
    }

    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
        let n = src.len();
        let sp = src.as_ptr() as *const __m128i;
        let mut i = 0;
        while i + 8 <= n {
            _mm256_storeu_ps(
                dst.as_mut_ptr().add(i),
                _mm256_cvtph_ps(_mm_loadu_si128(sp.add(i / 8))),
            );
            i += 8;
        }
        while i < n {
            dst[i] = src[i].to_f32();
            i += 1;
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn exp_sub_sum(x: &mut [f32], m: f32) -> f64 {
        let n = x.len();
        let mv = _mm256_set1_ps(m);
        let mut sum = 0f64;
        let mut i = 0;
        while i + 8 <= n {
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x.as_ptr().add(i)), mv));
            _mm256_storeu_ps(x.as_mut_ptr().add(i), e);
            sum += hsum(e) as f64;
            i += 8;
        }
        while i < n {
            x[i] = (x[i] - m).exp();
            sum += x[i] as f64;
            i += 1;
        }
        sum
    }
}

#[cfg(test)]
mod tests {

    /// bf16 storage rounds to nearest even like `half` (ties to even, NaN stays NaN, overflow
    /// to infinity) and widening is exact.
    #[test]
    fn bf16_round_trip() {
        let xs = [
            0.0f32,
            -0.0,
            1.0,
            1.0 + 1.0 / 256.0, // a tie, rounds to even (1.0)
            1.0 + 3.0 / 256.0, // a tie, rounds to even (1 + 2^-6)
            -2.71,
            f32::MAX,
            f32::MIN_POSITIVE,
            f32::INFINITY,
            f32::NAN,
            1e-40,
        ];
        let mut b = vec![half::bf16::ZERO; xs.len()];
        f32_to_bf16(&xs, &mut b);
        let mut back = vec![0f32; xs.len()];
        bf16_to_f32(&b, &mut back);
        for ((x, b), y) in xs.iter().zip(&b).zip(&back) {
            assert_eq!(b.to_bits(), half::bf16::from_f32(*x).to_bits(), "{x}");
            assert_eq!(y.to_bits(), b.to_f32().to_bits(), "{x}");
        }
        assert_eq!(back[3], 1.0);
        assert_eq!(back[4], 1.015625);
        assert!(back[9].is_nan());
        assert_eq!(back[6], f32::INFINITY);
    }

    use super::*;

    #[test]
    fn exp_sub_sum_matches_libm() {
        let xs: Vec<f32> = (0..1003).map(|i| -(i as f32) * 0.05).collect();
        let mut a = xs.clone();
        let sum = exp_sub_sum(&mut a, 0.5);
        let want: f64 = xs.iter().map(|&x| ((x - 0.5) as f64).exp()).sum();
        assert!((sum - want).abs() < 1e-6 * want);
        for (x, y) in xs.iter().zip(&a) {
            let e = ((x - 0.5) as f64).exp();
            assert!((*y as f64 - e).abs() <= 2e-7 * e + 1e-30, "{x}: {y} vs {e}");
        }
    }

    #[test]
    fn activations_match_f64_reference() {
        let xs: Vec<f32> = (0..4001)
            .map(|i| (i as f32 - 2000.0) * 0.01 + 0.003)
            .chain([-90.0, -20.0, 20.0, 95.0, 0.0])
            .collect();
        let ups: Vec<f32> = xs.iter().map(|x| 1.0 + 0.1 * x.sin()).collect();
        let mut g = xs.clone();
        gelu_mul(&mut g, &ups);
        let mut s = xs.clone();
        silu_mul(&mut s, &ups);
        for i in 0..xs.len() {
            let x = xs[i] as f64;
            let gelu = 0.5 * x * (1.0 + (0.7978845608028654 * (x + 0.044715 * x * x * x)).tanh());
            let silu = x / (1.0 + (-x).exp());
            let (eg, es) = (gelu * ups[i] as f64, silu * ups[i] as f64);
            assert!(
                (g[i] as f64 - eg).abs() <= 1e-6 * eg.abs() + 1e-7,
                "gelu({x}) {} vs {eg}",
                g[i]
            );
            assert!(
                (s[i] as f64 - es).abs() <= 1e-6 * es.abs() + 1e-7,
                "silu({x}) {} vs {es}",
                s[i]
            );
        }
    }

    #[test]
    fn simd_matches_scalar_with_tails() {
        for n in [1usize, 7, 8, 15, 16, 17, 64, 100, 256] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let bh: Vec<f16> = b.iter().map(|&x| f16::from_f32(x)).collect();
            let r32: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            let r16: f32 = a.iter().zip(&bh).map(|(x, y)| x * y.to_f32()).sum();
            assert!((dot_f32(&a, &b) - r32).abs() < 1e-4);
            assert!((dot_f16(&a, &bh) - r16).abs() < 1e-4);
            let mut y = vec![1.0f32; n];
            axpy_f16(0.5, &bh, &mut y);
            for i in 0..n {
                assert!((y[i] - (1.0 + 0.5 * bh[i].to_f32())).abs() < 1e-6);
            }
        }
    }
}
