//! 512-bit AVX-512 VNNI tile kernel for the 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1,
//! Q8_0), used by the `avx512` kernel family.
//!
//! Algorithm (per `R × T` tile): the blocks of a row are walked in groups of 8. For a group, the
//! 8 weight scales (and mins) of each row are fetched with one 32-bit gather and converted with
//! F16C (`vcvtph2ps`), and the 8 activation scales / sums of each token likewise — so no scalar
//! f16 decoding or scalar broadcast remains in the inner loop. Then the group is processed as 4
//! *pairs* of blocks, one pair per 512-bit register:
//!
//! * nibble types: the two 16-byte quant arrays are packed as `[lo(k), lo(k+1), hi(k), hi(k+1)]`
//!   (one 128-bit insert, one shift, one AND), and the activation pair is permuted to the same
//!   element order with one `vpermt2q`; Q5 fifth bits are added with one byte-masked add whose
//!   64-bit mask is assembled from the two `qh` words in scalar registers;
//! * Q8_0: the two 32-byte quant arrays are concatenated as is and shifted to unsigned (`^ 0x80`).
//!
//! One `vpdpbusd` per (row, token, pair) yields 16 i32 lanes, each a partial dot of one block.
//! The 4 pairs of a group are reduced with integer unpacks and adds ([`reduce`]) to the 8 exact
//! block dots, the zero-point correction `-OFF · Σa` is added per block, and then, exactly like
//! the scalar kernel: `sumf += isum as f32 * (d_w * d_a)` and `summ += m_w · s_a` (products
//! lane-wise, the sums block by block in order, no FMA), `y = sumf + summ`. Leftover blocks
//! (`nb % 8`) form a last, partial group (masked gathers) of whole pairs; a final odd block goes
//! through the scalar block step. So this kernel, the packed GEMM (`packed.rs`) and the scalar
//! kernel agree bit for bit: weights used in place (the output head, routed experts in host
//! memory) give the packed copies' results. Weights are software-prefetched [`PREFETCH`] bytes
//! ahead.

use std::arch::x86_64::*;

use super::act::ActQ8;
use super::decode::Q32;

/// Blocks per scale gather.
const G: usize = 8;

/// Bytes of one [`ActQ8`] block.
const AB: i32 = std::mem::size_of::<ActQ8>() as i32;

#[inline(always)]
unsafe fn gather8(p: *const u8, stride: i32) -> __m256i {
    let idx = _mm256_mullo_epi32(
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        _mm256_set1_epi32(stride),
    );
    _mm256_i32gather_epi32::<1>(p as *const i32, idx)
}

/// [`gather8`], or with lanes where `ok` is clear left zero (not loaded) unless `full`.
#[inline(always)]
unsafe fn gather_masked(p: *const u8, stride: i32, full: bool, ok: __m256i) -> __m256i {
    if full {
        return gather8(p, stride);
    }
    let idx = _mm256_mullo_epi32(
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        _mm256_set1_epi32(stride),
    );
    _mm256_mask_i32gather_epi32::<1>(_mm256_setzero_si256(), p as *const i32, idx, ok)
}

/// f16 values in the low (`HIGH = false`) or high halves of 8 i32 lanes → 8 f32.
#[inline(always)]
unsafe fn halves_to_f32<const HIGH: bool>(v: __m256i) -> __m256 {
    let v = if HIGH { _mm256_srli_epi32(v, 16) } else { v };
    _mm256_cvtph_ps(_mm256_cvtepi32_epi16(v))
}

/// The two blocks at `p` (block k) and `p + B::BYTES` (block k+1) as 64 unsigned bytes in the
/// pair order described in the module docs.
#[inline(always)]
unsafe fn load_pair<B: Q32>(p: *const u8) -> __m512i {
    let q = p.add(B::QS_AT);
    if B::SIGNED {
        let lo = _mm256_loadu_si256(q as *const __m256i);
        let hi = _mm256_loadu_si256(q.add(B::BYTES) as *const __m256i);
        let v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
        return _mm512_xor_si512(v, _mm512_set1_epi8(-128));
    }
    let t = _mm256_inserti128_si256::<1>(
        _mm256_castsi128_si256(_mm_loadu_si128(q as *const __m128i)),
        _mm_loadu_si128(q.add(B::BYTES) as *const __m128i),
    );
    let v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(t), _mm256_srli_epi16::<4>(t));
    let mut v = _mm512_and_si512(v, _mm512_set1_epi8(15));
    if B::QH_AT != 0 {
        let h0 = (p.add(B::QH_AT) as *const u32).read_unaligned() as u64;
        let h1 = (p.add(B::QH_AT + B::BYTES) as *const u32).read_unaligned() as u64;
        let m = (h0 & 0xffff) | ((h1 & 0xffff) << 16) | ((h0 >> 16) << 32) | ((h1 >> 16) << 48);
        v = _mm512_mask_add_epi8(v, m, v, _mm512_set1_epi8(16));
    }
    v
}

/// The activation quants of blocks `a` and `a + 1` in the weight pair order.
#[inline(always)]
unsafe fn act_pair<B: Q32>(a: *const ActQ8) -> __m512i {
    let lo = _mm512_castsi256_si512(_mm256_loadu_si256((*a).qs.as_ptr() as *const __m256i));
    let hi = _mm512_castsi256_si512(_mm256_loadu_si256((*a.add(1)).qs.as_ptr() as *const __m256i));
    if B::SIGNED {
        _mm512_inserti64x4::<1>(lo, _mm512_castsi512_si256(hi))
    } else {
        _mm512_permutex2var_epi64(lo, _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), hi)
    }
}

/// Weight bytes prefetched ahead of the group being decoded (per row stream): decode walks
/// `R` rows at once, and the scale gather that starts each group otherwise stalls on DRAM.
const PREFETCH: usize = 4096;

/// The 8 exact block dots of a group from its 4 pair registers (missing pairs zero), in the
/// block order 0, 2, 4, 6, 1, 3, 5, 7 ([`POS`]).
///
/// After the 32-bit and 64-bit unpack-adds, 128-bit lane `k` of `y` holds, for pairs 0..4, the
/// sum of lane `k` of that pair's register. A Q8_0 pair register has block `2p` in lanes 0, 1
/// and `2p + 1` in lanes 2, 3; a nibble pair register alternates them (0, 2 and 1, 3).
#[inline(always)]
unsafe fn reduce<B: Q32>(p: &[__m512i; 4]) -> __m256i {
    let x01 = _mm512_add_epi32(
        _mm512_unpacklo_epi32(p[0], p[1]),
        _mm512_unpackhi_epi32(p[0], p[1]),
    );
    let x23 = _mm512_add_epi32(
        _mm512_unpacklo_epi32(p[2], p[3]),
        _mm512_unpackhi_epi32(p[2], p[3]),
    );
    let y = _mm512_add_epi32(
        _mm512_unpacklo_epi64(x01, x23),
        _mm512_unpackhi_epi64(x01, x23),
    );
    if B::SIGNED {
        let a = _mm512_shuffle_i32x4::<0b00_00_10_00>(y, y);
        let b = _mm512_shuffle_i32x4::<0b00_00_11_01>(y, y);
        _mm512_castsi512_si256(_mm512_add_epi32(a, b))
    } else {
        _mm256_add_epi32(_mm512_castsi512_si256(y), _mm512_extracti64x4_epi64::<1>(y))
    }
}

/// Where block `j` of a group sits in [`reduce`]'s result.
const POS: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

/// Blocks `b0 .. b0 + 2 * NP` (`NP ≤ 4`, a constant so the pair loop unrolls) of an `R × T`
/// tile into the scalar kernel's running sums (see the module docs).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn group<B: Q32, const R: usize, const T: usize, const NP: usize>(
    w: *const u8,
    ws: usize,
    x: *const u8,
    xs: usize,
    b0: usize,
    sumf: &mut [[f32; T]; R],
    summ: &mut [[f32; T]; R],
) {
    // Offset folded into the integer dot: Q8_0 is shifted by +128 to unsigned.
    let off: i32 = if B::SIGNED { 128 } else { B::OFF };
    let n = (2 * NP) as i32;
    let full = NP == G / 2;
    let lanes_ok = _mm256_cmpgt_epi32(
        _mm256_set1_epi32(n),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    );
    // Per-block values in [`reduce`]'s block order.
    let order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    // (No closures here: they do not inherit the caller's target features, so intrinsics
    // inside one are not inlined.)
    let mut dw = [_mm256_setzero_ps(); R];
    let mut mw = [_mm256_setzero_ps(); R];
    for r in 0..R {
        let p = w.add(r * ws + b0 * B::BYTES);
        let mut o = 0;
        // Only decode streams weights from memory; prefill tiles re-read them from L2.
        while T == 1 && o < G * B::BYTES {
            _mm_prefetch::<_MM_HINT_T0>(p.add(PREFETCH + o) as *const i8);
            o += 64;
        }
        let hv = gather_masked(p, B::BYTES as i32, full, lanes_ok);
        dw[r] = _mm256_permutevar8x32_ps(halves_to_f32::<false>(hv), order);
        if B::HAS_MIN {
            mw[r] = _mm256_permutevar8x32_ps(halves_to_f32::<true>(hv), order);
        }
    }
    let mut da = [_mm256_setzero_ps(); T];
    let mut sa = [_mm256_setzero_ps(); T];
    let mut corr = [_mm256_setzero_si256(); T];
    let mut av = [[_mm512_setzero_si512(); 4]; T];
    for t in 0..T {
        let a = (x.add(t * xs) as *const ActQ8).add(b0);
        let ab = a as *const u8;
        da[t] = _mm256_permutevar8x32_ps(
            _mm256_castsi256_ps(gather_masked(ab, AB, full, lanes_ok)),
            order,
        );
        if B::HAS_MIN {
            sa[t] = _mm256_permutevar8x32_ps(
                _mm256_castsi256_ps(gather_masked(ab.add(4), AB, full, lanes_ok)),
                order,
            );
        }
        if off != 0 {
            let sums = gather_masked(ab.add(8), AB, full, lanes_ok);
            corr[t] = _mm256_permutevar8x32_epi32(
                _mm256_mullo_epi32(sums, _mm256_set1_epi32(-off)),
                order,
            );
        }
        for p in 0..NP {
            av[t][p] = act_pair::<B>(a.add(2 * p));
        }
    }
    let mut f = [[[0f32; G]; T]; R];
    let mut m = [[[0f32; G]; T]; R];
    for r in 0..R {
        let mut wv = [_mm512_setzero_si512(); 4];
        for p in 0..NP {
            wv[p] = load_pair::<B>(w.add(r * ws + (b0 + 2 * p) * B::BYTES));
        }
        for t in 0..T {
            let mut dp = [_mm512_setzero_si512(); 4];
            for p in 0..NP {
                dp[p] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[p], av[t][p]);
            }
            let isum = _mm256_add_epi32(reduce::<B>(&dp), corr[t]);
            let v = _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw[r], da[t]));
            _mm256_storeu_ps(f[r][t].as_mut_ptr(), v);
            if B::HAS_MIN {
                _mm256_storeu_ps(m[r][t].as_mut_ptr(), _mm256_mul_ps(mw[r], sa[t]));
            }
        }
    }
    for &k in &POS[..2 * NP] {
        for r in 0..R {
            for t in 0..T {
                sumf[r][t] += f[r][t][k];
                if B::HAS_MIN {
                    summ[r][t] += m[r][t][k];
                }
            }
        }
    }
}

/// The `R × T` tile kernel (see the module docs). Signature and safety as [`super::TileFn`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn tile_q32<B: Q32, const R: usize, const T: usize>(
    w: *const u8,
    ws: usize,
    x: *const u8,
    xs: usize,
    nb: usize,
    y: *mut f32,
    ys: usize,
) {
    let (mut sumf, mut summ) = ([[0f32; T]; R], [[0f32; T]; R]);
    let ng = nb / G;
    for g in 0..ng {
        group::<B, R, T, 4>(w, ws, x, xs, g * G, &mut sumf, &mut summ);
    }
    // A partial group of whole pairs (masked gathers), then at most one odd block.
    let mut done = ng * G;
    let pairs = (nb - done) / 2;
    match pairs {
        1 => group::<B, R, T, 1>(w, ws, x, xs, done, &mut sumf, &mut summ),
        2 => group::<B, R, T, 2>(w, ws, x, xs, done, &mut sumf, &mut summ),
        3 => group::<B, R, T, 3>(w, ws, x, xs, done, &mut sumf, &mut summ),
        _ => {}
    }
    done += 2 * pairs;
    if done < nb {
        let mut q = [0u8; 32];
        for r in 0..R {
            for t in 0..T {
                let a = &*(x.add(t * xs) as *const ActQ8).add(done);
                let p = w.add(r * ws + done * B::BYTES);
                super::scalar::q32_block::<B>(p, a, &mut q, &mut sumf[r][t], &mut summ[r][t]);
            }
        }
    }
    for r in 0..R {
        for t in 0..T {
            *y.add(t * ys + r) = sumf[r][t] + summ[r][t];
        }
    }
}

/// The f16 at `p + o` as f32 (F16C). Helpers are functions, not closures: closures do not
/// inherit the caller's target features, so intrinsics inside them would not be inlined.
#[inline(always)]
unsafe fn f16_at(p: *const u8, o: usize) -> f32 {
    let h = (p.add(o) as *const u16).read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

/// 8 i16 → 16 i16 with every value repeated twice.
#[inline(always)]
unsafe fn dup16(v: __m128i) -> __m256i {
    _mm256_set_m128i(_mm_unpackhi_epi16(v, v), _mm_unpacklo_epi16(v, v))
}

/// 256-element k-quant super-blocks with a native 512-bit decoder (`Q4_K`, `Q6_K`).
///
/// Per super-block and row the decoder yields the 256 unsigned quants as 4 registers in element
/// order (`Q4_K`: one 32-byte nibble chunk → 64 elements; `Q6_K`: 64 low-nibble bytes plus 32
/// `qh` bytes → 2 × 64 elements), the 16 per-16-element scales and "mins" as i16 (Q4_K's 6-bit
/// pairs unpacked with a few u32 mask/shift operations, no loop), and the two f32 multipliers, so
/// that `dot = d · Σ_g sc_g Σ q·a − dmin · Σ_g mn_g · bsum_g`. The integer dot uses `vpmaddubsw`
/// (pair sums fit i16: 63 · 127 · 2 < 2¹⁵) followed by `vpdpwssd` with the lane-expanded scales.
#[inline(always)]
unsafe fn decode_k<B: super::decode::QK>(
    p: *const u8,
    q: &mut [__m512i; 4],
) -> (__m256i, __m256i, f32, f32) {
    let m15 = _mm512_set1_epi8(15);
    if B::KIND == 4 {
        for k in 0..4 {
            let x = _mm256_loadu_si256(p.add(16 + 32 * k) as *const __m256i);
            let v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(x), _mm256_srli_epi16::<4>(x));
            q[k] = _mm512_and_si512(v, m15);
        }
        let s = p.add(4) as *const u32;
        let (a, b, c) = (
            s.read_unaligned(),
            s.add(1).read_unaligned(),
            s.add(2).read_unaligned(),
        );
        let sc_lo = a & 0x3f3f_3f3f;
        let sc_hi = (c & 0x0f0f_0f0f) | (((a >> 6) & 0x0303_0303) << 4);
        let mn_lo = b & 0x3f3f_3f3f;
        let mn_hi = ((c >> 4) & 0x0f0f_0f0f) | (((b >> 6) & 0x0303_0303) << 4);
        let sc = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(
            (sc_lo as u64 | (sc_hi as u64) << 32) as i64,
        ));
        let mn = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(
            (mn_lo as u64 | (mn_hi as u64) << 32) as i64,
        ));
        (dup16(sc), dup16(mn), f16_at(p, 0), f16_at(p, 2))
    } else {
        // Q6_K: ql[128], qh[64], sc[16] (i8), d.
        let m3 = _mm512_set1_epi8(3);
        for n in 0..2 {
            let ql = _mm512_loadu_si512(p.add(64 * n) as *const _);
            let qh = _mm256_loadu_si256(p.add(128 + 32 * n) as *const __m256i);
            let h01 =
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(qh), _mm256_srli_epi16::<2>(qh));
            let h23 = _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_srli_epi16::<4>(qh)),
                _mm256_srli_epi16::<6>(qh),
            );
            q[2 * n] = _mm512_or_si512(
                _mm512_and_si512(ql, m15),
                _mm512_slli_epi16::<4>(_mm512_and_si512(h01, m3)),
            );
            q[2 * n + 1] = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m15),
                _mm512_slli_epi16::<4>(_mm512_and_si512(h23, m3)),
            );
        }
        let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(192) as *const __m128i));
        let d = f16_at(p, 208);
        (sc, sc, d, 32.0 * d)
    }
}

/// The `R × T` k-quant tile kernel for types with [`super::decode::QK::KIND`] 4 or 6 (see
/// [`decode_k`]). Signature and safety as [`super::TileFn`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn tile_qk<B: super::decode::QK, const R: usize, const T: usize>(
    w: *const u8,
    ws: usize,
    x: *const u8,
    xs: usize,
    nb: usize,
    y: *mut f32,
    ys: usize,
) {
    use super::act::ActQ8K;
    // Per (row, token) f32 sums in the scalar kernel's exact order (see below).
    let mut acc = [[0f32; T]; R];
    // i16 lane L of register k covers elements 64k + 2L, +1: 16-element group 4k + L/8.
    let mut sidx = [_mm512_setzero_si512(); 4];
    for (k, s) in sidx.iter_mut().enumerate() {
        let mut lanes = [0i16; 32];
        for (l, v) in lanes.iter_mut().enumerate() {
            *v = (4 * k + l / 8) as i16;
        }
        *s = _mm512_loadu_si512(lanes.as_ptr() as *const _);
    }
    for b in 0..nb {
        for r in 0..R {
            let p = w.add(r * ws + b * B::BYTES);
            let mut o = 0;
            while T == 1 && o < B::BYTES {
                _mm_prefetch::<_MM_HINT_T0>(p.add(PREFETCH + o) as *const i8);
                o += 64;
            }
            let mut q = [_mm512_setzero_si512(); 4];
            let (sc, mn, d, dmin) = decode_k::<B>(p, &mut q);
            let mut scz = [_mm512_setzero_si512(); 4];
            for k in 0..4 {
                scz[k] = _mm512_permutexvar_epi16(sidx[k], _mm512_castsi256_si512(sc));
            }
            for t in 0..T {
                let a = &*(x.add(t * xs) as *const ActQ8K).add(b);
                let mut isum = _mm512_setzero_si512();
                for k in 0..4 {
                    let av = _mm512_loadu_si512(a.qs.as_ptr().add(64 * k) as *const _);
                    let p = _mm512_maddubs_epi16(q[k], av);
                    isum = _mm512_dpwssd_epi32(isum, p, scz[k]);
                }
                let bs = _mm256_load_si256(a.bsums.as_ptr() as *const __m256i);
                // Exact integer totals, then the scalar kernel's float expression (no FMA), so
                // this path, the packed GEMM and the scalar kernel agree bit for bit and a
                // model's logits do not depend on how a prompt is split into batches.
                let isum = _mm512_reduce_add_epi32(isum);
                let corr = hsum_epi32(_mm256_madd_epi16(mn, bs));
                acc[r][t] += a.d * d * isum as f32 - a.d * dmin * corr as f32;
            }
        }
    }
    for r in 0..R {
        for t in 0..T {
            *y.add(t * ys + r) = acc[r][t];
        }
    }
}

/// Σ of the 8 i32 lanes (exact).
#[inline(always)]
unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// [`super::act::quantize_q8k`] with AVX-512: bit-identical (same first-largest-magnitude scale
/// selection, same products, round half to even via `vcvtps2dq`, same clamp at 127).
///
/// # Safety
/// AVX-512 F/BW; `out` holds `x.len() / 256` blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn quantize_q8k(x: &[f32], out: &mut [super::act::ActQ8K]) {
    let abs_mask = _mm512_set1_epi32(0x7fff_ffff);
    for (xb, o) in x.chunks_exact(256).zip(out.iter_mut()) {
        let p = xb.as_ptr();
        let mut vmax = _mm512_setzero_ps();
        for i in 0..16 {
            let v = _mm512_castsi512_ps(_mm512_and_si512(
                _mm512_castps_si512(_mm512_loadu_ps(p.add(16 * i))),
                abs_mask,
            ));
            vmax = _mm512_max_ps(vmax, v);
        }
        let amax = _mm512_reduce_max_ps(vmax);
        o._pad = [0; 7];
        if amax == 0.0 || !amax.is_finite() {
            // Zero, NaN or infinite inputs: the scalar code (whatever it does, do the same).
            super::act::quantize_q8k(xb, std::slice::from_mut(o));
            continue;
        }
        // The first element whose magnitude is `amax` (the scalar scan keeps the first).
        let av = _mm512_set1_ps(amax);
        let mut max = 0f32;
        for i in 0..16 {
            let v = _mm512_loadu_ps(p.add(16 * i));
            let a = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), abs_mask));
            let m = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(a, av);
            if m != 0 {
                max = *p.add(16 * i + m.trailing_zeros() as usize);
                break;
            }
        }
        let iscale = -127.0 / max;
        let is = _mm512_set1_ps(iscale);
        let c127 = _mm512_set1_epi32(127);
        for g in 0..16 {
            let v = _mm512_loadu_ps(p.add(16 * g));
            let q = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(is, v)), c127);
            _mm_storeu_si128(
                o.qs.as_mut_ptr().add(16 * g) as *mut __m128i,
                _mm512_cvtepi32_epi8(q),
            );
            o.bsums[g] = _mm512_reduce_add_epi32(q) as i16;
        }
        o.d = 1.0 / iscale;
    }
}
