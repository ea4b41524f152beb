//! The packed GEMM of `packed.rs` for CPUs with AVX2 but without AVX-512: the same tiles of 16
//! interleaved rows, read as two halves of 8 rows (i32 lane `r` of a 256-bit register = row
//! `8h + r`), so the layout and the bit-identical results do not depend on the kernel family.
//!
//! Per block and half, each quant group (4 consecutive elements of the 8 rows) is decoded once
//! and dotted with each of the `T ≤ 4` tokens' broadcast 4-byte activation group by `vpmaddubsw`
//! and `vpmaddwd` (AVX2 has no `vpdpbusd`). Nibble quants (≤ 31) cannot saturate `vpmaddubsw`'s
//! i16 pair sums, and their zero point enters as `-OFF · Σa` as in the AVX-512 kernel; Q8_0
//! (stored `+ 128`) is turned back into signed bytes and dotted with the sign trick
//! (`|w| · sign(a, w)`), which needs no correction. The integer block dots are exact, and the
//! float steps are the scalar reference's: `sumf += isum · (d_w · d_a)`, `summ += m_w · s_a`,
//! `y = sumf + summ`.

use std::arch::x86_64::*;

use super::act::ActQ8;
use super::decode::Q32;
use super::packed::{offsets, prefetch_ahead, type_of, ROWS};

/// Most tokens per call (registers: 2 quant groups, `T` i32 sums, the activation, constants).
pub(crate) const TOKENS: usize = 4;

/// Bytes `k` (0..32) = 16 where bit `k` of `m` is set, else 0: a Q5 group's fifth bits.
#[inline(always)]
unsafe fn fifth_bits(m: u32) -> __m256i {
    let sel = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3,
        3, 3,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(m as i32), sel);
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
    _mm256_and_si256(set, _mm256_set1_epi8(16))
}

/// `acc + Σ` over 4-byte groups of `q · a` per i32 lane (`q` unsigned, or `|w|` with `a` signed
/// by `w` for Q8_0).
#[inline(always)]
unsafe fn dot(acc: __m256i, q: __m256i, a: __m256i) -> __m256i {
    _mm256_add_epi32(
        acc,
        _mm256_madd_epi16(_mm256_maddubs_epi16(q, a), _mm256_set1_epi16(1)),
    )
}

/// Token `t`'s activation group `g` (4 bytes) of block `b`, in every i32 lane.
#[inline(always)]
unsafe fn group(x: *const u8, xs: usize, t: usize, b: usize, g: usize) -> __m256i {
    let a = &*(x.add(t * xs) as *const ActQ8).add(b);
    _mm256_set1_epi32((a.qs.as_ptr() as *const i32).add(g).read_unaligned())
}

/// One tile × `T` tokens. Signature as [`super::packed::PackedFn`].
///
/// # Safety
/// AVX2 + FMA + F16C; `w` is a tile of `nb` blocks in the packed layout of `B` (64-byte aligned),
/// `x` covers `T` rows (`xs` bytes apart) of `nb` [`ActQ8`] blocks, `y` the outputs.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)]
pub(crate) unsafe fn tile<B: Q32, const T: usize>(
    w: *const u8,
    nb: usize,
    x: *const u8,
    xs: usize,
    y: *mut f32,
    ys: usize,
    valid: usize,
) {
    let (m_off, qh_off, q_off, tile_bytes) = offsets(type_of::<B>(), nb);
    let q5 = B::QH_AT != 0;
    let m15 = _mm256_set1_epi8(15);
    let mut sumf = [[_mm256_setzero_ps(); T]; 2];
    let mut summ = [[_mm256_setzero_ps(); T]; 2];
    let qb = if B::SIGNED { 512 } else { 256 };
    let act = |t: usize, b: usize| &*(x.add(t * xs) as *const ActQ8).add(b);
    for b in 0..nb {
        if T == 1 {
            prefetch_ahead::<B>(w, b, nb, (m_off, qh_off, q_off, tile_bytes), qb);
        }
        for h in 0..2 {
            let mut isum = [_mm256_setzero_si256(); T];
            if !B::SIGNED && B::OFF != 0 {
                for (t, s) in isum.iter_mut().enumerate() {
                    *s = _mm256_set1_epi32(-B::OFF * act(t, b).sum);
                }
            }
            if B::SIGNED {
                let base = w.add(q_off + b * 512 + 32 * h);
                for g in 0..8 {
                    let v = _mm256_load_si256(base.add(64 * g) as *const __m256i);
                    let q = _mm256_xor_si256(v, _mm256_set1_epi8(-128));
                    let qa = _mm256_sign_epi8(q, q);
                    for (t, s) in isum.iter_mut().enumerate() {
                        *s = dot(*s, qa, _mm256_sign_epi8(group(x, xs, t, b, g), q));
                    }
                }
            } else {
                let base = w.add(q_off + b * 256 + 32 * h);
                let hm = w.add(qh_off + b * 64 + 4 * h);
                for j in 0..4 {
                    let v = _mm256_load_si256(base.add(64 * j) as *const __m256i);
                    let mut lo = _mm256_and_si256(v, m15);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m15);
                    if q5 {
                        let m = |g: usize| (hm.add(8 * g) as *const u32).read();
                        lo = _mm256_add_epi8(lo, fifth_bits(m(j)));
                        hi = _mm256_add_epi8(hi, fifth_bits(m(j + 4)));
                    }
                    for (t, s) in isum.iter_mut().enumerate() {
                        *s = dot(
                            dot(*s, lo, group(x, xs, t, b, j)),
                            hi,
                            group(x, xs, t, b, j + 4),
                        );
                    }
                }
            }
            let dw = _mm256_cvtph_ps(_mm_load_si128(w.add(b * 32 + 16 * h) as *const __m128i));
            for t in 0..T {
                let scale = _mm256_mul_ps(dw, _mm256_set1_ps(act(t, b).d));
                sumf[h][t] = _mm256_add_ps(
                    sumf[h][t],
                    _mm256_mul_ps(_mm256_cvtepi32_ps(isum[t]), scale),
                );
            }
            if B::HAS_MIN {
                let mw = _mm256_cvtph_ps(_mm_load_si128(
                    w.add(m_off + b * 32 + 16 * h) as *const __m128i
                ));
                for t in 0..T {
                    let s = _mm256_set1_ps(act(t, b).s);
                    summ[h][t] = _mm256_add_ps(summ[h][t], _mm256_mul_ps(mw, s));
                }
            }
        }
    }
    for t in 0..T {
        // `+ summ` also for types without mins, as the scalar kernel does (-0.0 + 0.0).
        let mut out = [0f32; ROWS];
        for h in 0..2 {
            _mm256_storeu_ps(
                out.as_mut_ptr().add(8 * h),
                _mm256_add_ps(sumf[h][t], summ[h][t]),
            );
        }
        std::ptr::copy_nonoverlapping(out.as_ptr(), y.add(t * ys), valid.min(ROWS));
    }
}
