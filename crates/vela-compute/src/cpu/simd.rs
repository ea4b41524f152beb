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
    y.iter_mut().zip(x).for_each(|(y, x)| *y += a * x);
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
