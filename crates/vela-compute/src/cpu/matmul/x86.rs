//! x86-64 SIMD tile kernels: `R` weight rows × `T` activation rows per call.
//!
//! Each weight block is decoded once (into L1-resident stack buffers) and dotted against the `T`
//! activation rows, so prefill is compute-bound instead of re-streaming weights per token, and
//! decode (`T` = number of tokens ≤ 4) streams every weight row exactly once.
//!
//! The generic bodies are `#[inline(always)]` and carry no target features themselves; they are
//! instantiated inside two sets of `#[target_feature]` entry points:
//! * `avx2_*`: AVX2 + FMA + F16C, int8 dots with `vpmaddubsw` + `vpmaddwd`;
//! * `avx512_*`: additionally AVX-512F/BW/VL + VNNI: the same 256-bit data flow but with
//!   `vpdpbusd`/`vpdpwssd` fused dots and 32 vector registers (larger tiles). On Zen 4 512-bit
//!   ops are double-pumped, so 256-bit VNNI gives the same throughput with simpler code.
//!
//! All functions here are `unsafe`: callers guarantee the CPU features (checked once with
//! `is_x86_feature_detected!` in `super::Kernel::detect`) and the pointer extents documented on
//! [`super::TileFn`].

use std::arch::x86_64::*;

use super::act::{self, f16_to_f32, ActKind, ActQ8, ActQ8K};
use super::decode::{DecK, Q32, QK};
use super::scalar::FloatW;

/// Bytes ahead of the block being decoded that a one-token call prefetches: decode streams each
/// weight row once, and the hardware prefetcher alone left it well below the memory's bandwidth
/// (perf-log).
const PREFETCH: usize = 4096;

/// Prefetch the block at `p + PREFETCH` (`bytes` long).
#[inline(always)]
unsafe fn prefetch_block(p: *const u8, bytes: usize) {
    let mut o = 0;
    while o < bytes {
        _mm_prefetch::<_MM_HINT_T0>(p.add(PREFETCH + o) as *const i8);
        o += 64;
    }
}

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Σ of the 8 i32 lanes (exact).
#[inline(always)]
unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// 32 × (u8 · i8) → 8 i32 lanes (+ `acc`). Products of a 5-bit weight and an int8 activation
/// cannot saturate `vpmaddubsw`'s i16 pair sums.
#[inline(always)]
unsafe fn dot_u8i8<const VNNI: bool>(acc: __m256i, u: __m256i, a: __m256i) -> __m256i {
    if VNNI {
        _mm256_dpbusd_epi32(acc, u, a)
    } else {
        let p = _mm256_maddubs_epi16(u, a);
        _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)))
    }
}

/// The 32 quants of a 32-element block as bytes (the `q` of [`Q32::decode`], in registers).
#[inline(always)]
unsafe fn decode_q32<B: Q32>(p: *const u8) -> __m256i {
    if B::SIGNED {
        return _mm256_loadu_si256(p.add(B::QS_AT) as *const __m256i);
    }
    let t = _mm_loadu_si128(p.add(B::QS_AT) as *const __m128i);
    let mut v = _mm256_and_si256(
        _mm256_set_m128i(_mm_srli_epi16(t, 4), t),
        _mm256_set1_epi8(15),
    );
    if B::QH_AT != 0 {
        // Spread bit i of the u32 to byte i: byte i takes source byte i/8 and tests bit i%8.
        let qh = (p.add(B::QH_AT) as *const i32).read_unaligned();
        let sel = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        );
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(qh), sel);
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
        v = _mm256_or_si256(v, _mm256_and_si256(set, _mm256_set1_epi8(16)));
    }
    v
}

/// The 8 exact sums of `v[0..8]`'s lanes, in order.
#[inline(always)]
unsafe fn reduce8(v: &[__m256i; 8]) -> __m256i {
    let h01 = _mm256_hadd_epi32(v[0], v[1]);
    let h23 = _mm256_hadd_epi32(v[2], v[3]);
    let h45 = _mm256_hadd_epi32(v[4], v[5]);
    let h67 = _mm256_hadd_epi32(v[6], v[7]);
    // 128-bit lane k of h0..3: the sums of v[0..4]'s lane k.
    let h0 = _mm256_hadd_epi32(h01, h23);
    let h4 = _mm256_hadd_epi32(h45, h67);
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(h0, h4),
        _mm256_permute2x128_si256::<0x31>(h0, h4),
    )
}

/// Blocks `b0 .. b0 + n` (`n ≤ 8`; `FULL`: `n` = 8, a constant so the loops unroll) of
/// [`tile_q32`] into its running sums.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn group32<B: Q32, const R: usize, const T: usize, const FULL: bool>(
    w: *const u8,
    ws: usize,
    x: *const u8,
    xs: usize,
    b0: usize,
    n: usize,
    sumf: &mut [[f32; T]; R],
    summ: &mut [[f32; T]; R],
) {
    let n = if FULL { 8 } else { n };
    for r in 0..R {
        let mut dw = [0f32; 8];
        let mut mw = [0f32; 8];
        let mut wv = [_mm256_setzero_si256(); 8];
        for j in 0..n {
            let p = w.add(r * ws + (b0 + j) * B::BYTES);
            if T == 1 {
                prefetch_block(p, B::BYTES);
            }
            dw[j] = f16_ptr(p, 0);
            if B::HAS_MIN {
                mw[j] = f16_ptr(p, 2);
            }
            wv[j] = decode_q32::<B>(p);
        }
        for t in 0..T {
            let a = (x.add(t * xs) as *const ActQ8).add(b0);
            let mut v = [_mm256_setzero_si256(); 8];
            for j in 0..n {
                let a = &*a.add(j);
                let av = _mm256_loadu_si256(a.qs.as_ptr() as *const __m256i);
                // Signed Q8_0 weights by the sign trick (|w| · sign(a, w)); the others' zero
                // point as `-OFF · Σa` in the first lane.
                v[j] = if B::SIGNED {
                    let ax = _mm256_sign_epi8(wv[j], wv[j]);
                    let sy = _mm256_sign_epi8(av, wv[j]);
                    dot_u8i8::<false>(_mm256_setzero_si256(), ax, sy)
                } else {
                    let corr = _mm256_zextsi128_si256(_mm_cvtsi32_si128(-B::OFF * a.sum));
                    dot_u8i8::<false>(corr, wv[j], av)
                };
            }
            let mut isum = [0i32; 8];
            _mm256_storeu_si256(isum.as_mut_ptr() as *mut __m256i, reduce8(&v));
            for j in 0..n {
                let a = &*a.add(j);
                sumf[r][t] += isum[j] as f32 * (dw[j] * a.d);
                if B::HAS_MIN {
                    summ[r][t] += mw[j] * a.s;
                }
            }
        }
    }
}

/// Tile kernel for the 32-element block types against [`ActQ8`] activations, in the scalar
/// kernel's order: per group of 8 blocks the integer dots are reduced to exact block sums
/// ([`reduce8`]), then `sumf += isum as f32 * (d_w * d_a)` and `summ += m_w · s_a` block by block
/// (no FMA), `y = sumf + summ`. So it gives the scalar kernel's bits, like the packed GEMMs:
/// weights used in place (the output head, routed experts in host memory) and packed copies agree.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_q32<B: Q32, const R: usize, const T: usize>(
    w: *const u8,
    ws: usize,
    x: *const u8,
    xs: usize,
    nb: usize,
    y: *mut f32,
    ys: usize,
) {
    let (mut sumf, mut summ) = ([[0f32; T]; R], [[0f32; T]; R]);
    let mut b0 = 0;
    while b0 + 8 <= nb {
        group32::<B, R, T, true>(w, ws, x, xs, b0, 8, &mut sumf, &mut summ);
        b0 += 8;
    }
    if b0 < nb {
        group32::<B, R, T, false>(w, ws, x, xs, b0, nb - b0, &mut sumf, &mut summ);
    }
    for r in 0..R {
        for t in 0..T {
            *y.add(t * ys + r) = sumf[r][t] + summ[r][t];
        }
    }
}

/// Tile kernel for the k-quants against [`ActQ8K`] activations.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_qk<B: QK, const R: usize, const T: usize, const VNNI: bool>(
    w: *const u8,
    ws: usize,
    x: *const u8,
    xs: usize,
    nb: usize,
    y: *mut f32,
    ys: usize,
) {
    // Per (row, token) f32 sums in the scalar kernel's exact order.
    let mut acc = [[0f32; T]; R];
    let mut dec = [DecK::ZERO; R];
    // Per-32-chunk scale vectors: i16 lanes 0..8 = sc[2k], lanes 8..16 = sc[2k+1].
    let mut scx = [[0i16; 128]; R];
    for b in 0..nb {
        for r in 0..R {
            let p = w.add(r * ws + b * B::BYTES);
            if T == 1 {
                prefetch_block(p, B::BYTES);
            }
            B::decode(p, &mut dec[r]);
            for g in 0..16 {
                for l in 0..8 {
                    scx[r][8 * g + l] = dec[r].sc[g];
                }
            }
        }
        for t in 0..T {
            let a = &*(x.add(t * xs) as *const ActQ8K).add(b);
            let bs = _mm256_load_si256(a.bsums.as_ptr() as *const __m256i);
            for r in 0..R {
                let mut isum = _mm256_setzero_si256();
                for k in 0..8 {
                    let u = _mm256_load_si256(dec[r].q.as_ptr().add(32 * k) as *const __m256i);
                    let av = _mm256_loadu_si256(a.qs.as_ptr().add(32 * k) as *const __m256i);
                    let s = _mm256_loadu_si256(scx[r].as_ptr().add(16 * k) as *const __m256i);
                    let p = _mm256_maddubs_epi16(u, av);
                    isum = if VNNI {
                        _mm256_dpwssd_epi32(isum, p, s)
                    } else {
                        _mm256_add_epi32(isum, _mm256_madd_epi16(p, s))
                    };
                }
                let mn = _mm256_load_si256(dec[r].mn.as_ptr() as *const __m256i);
                let corr = hsum_epi32(_mm256_madd_epi16(mn, bs));
                let isum = hsum_epi32(isum);
                // Exact integer totals, then the scalar kernel's expression (no FMA): results
                // do not depend on the kernel path or on how tokens are batched.
                acc[r][t] += a.d * dec[r].d * isum as f32 - a.d * dec[r].dmin * corr as f32;
            }
        }
    }
    for r in 0..R {
        for t in 0..T {
            *y.add(t * ys + r) = acc[r][t];
        }
    }
}

/// The f16 at `p + o` as f32 (F16C).
#[inline(always)]
unsafe fn f16_ptr(p: *const u8, o: usize) -> f32 {
    let h = (p.add(o) as *const u16).read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

/// A 256-bit decoder of Q4_K ([`QK::KIND`] 4), the AVX-512 decoder's data flow in 256-bit
/// registers: the 256 unsigned quants as 8 chunks of 32 in element order (`q`), per chunk its
/// scale in every i16 lane (`s`), and returns the 16 "mins" as i16 (each sub-block's twice, for
/// the 16 bsums) and the two multipliers `d`, `dmin`. What [`QK::decode`] yields, without the
/// byte round trip. (Q6_K keeps [`tile_qk`]: this form measured no faster for it, perf-log.)
#[inline(always)]
unsafe fn decode_q4k(
    p: *const u8,
    q: &mut [__m256i; 8],
    s: &mut [__m256i; 8],
) -> (__m256i, f32, f32) {
    let m15 = _mm256_set1_epi8(15);
    for k in 0..4 {
        let x = _mm256_loadu_si256(p.add(16 + 32 * k) as *const __m256i);
        q[2 * k] = _mm256_and_si256(x, m15);
        q[2 * k + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(x), m15);
    }
    let w = p.add(4) as *const u32;
    let (a, b, c) = (
        w.read_unaligned(),
        w.add(1).read_unaligned(),
        w.add(2).read_unaligned(),
    );
    let sc_lo = a & 0x3f3f_3f3f;
    let sc_hi = (c & 0x0f0f_0f0f) | (((a >> 6) & 0x0303_0303) << 4);
    let mn_lo = b & 0x3f3f_3f3f;
    let mn_hi = ((c >> 4) & 0x0f0f_0f0f) | (((b >> 6) & 0x0303_0303) << 4);
    let sc = (sc_lo as u64 | (sc_hi as u64) << 32).to_le_bytes();
    for (v, &x) in s.iter_mut().zip(&sc) {
        *v = _mm256_set1_epi16(x as i16);
    }
    let mn = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(
        (mn_lo as u64 | (mn_hi as u64) << 32) as i64,
    ));
    let mn = _mm256_set_m128i(_mm_unpackhi_epi16(mn, mn), _mm_unpacklo_epi16(mn, mn));
    (mn, f16_ptr(p, 0), f16_ptr(p, 2))
}

/// Tile kernel for Q4_K against [`ActQ8K`] activations with [`decode_q4k`]: the same exact
/// integer totals and float expression as [`tile_qk`], so the same bits.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_q4k<B: QK, const R: usize, const T: usize, const VNNI: bool>(
    w: *const u8,
    ws: usize,
    x: *const u8,
    xs: usize,
    nb: usize,
    y: *mut f32,
    ys: usize,
) {
    let mut acc = [[0f32; T]; R];
    let z = _mm256_setzero_si256();
    let (mut q, mut s) = ([[z; 8]; R], [[z; 8]; R]);
    let (mut mn, mut dd) = ([z; R], [(0f32, 0f32); R]);
    for b in 0..nb {
        for r in 0..R {
            let p = w.add(r * ws + b * B::BYTES);
            if T == 1 {
                prefetch_block(p, B::BYTES);
            }
            let (m, d, dmin) = decode_q4k(p, &mut q[r], &mut s[r]);
            mn[r] = m;
            dd[r] = (d, dmin);
        }
        for t in 0..T {
            let a = &*(x.add(t * xs) as *const ActQ8K).add(b);
            let bs = _mm256_load_si256(a.bsums.as_ptr() as *const __m256i);
            for r in 0..R {
                let mut isum = z;
                for c in 0..8 {
                    let av = _mm256_loadu_si256(a.qs.as_ptr().add(32 * c) as *const __m256i);
                    let p = _mm256_maddubs_epi16(q[r][c], av);
                    isum = if VNNI {
                        _mm256_dpwssd_epi32(isum, p, s[r][c])
                    } else {
                        _mm256_add_epi32(isum, _mm256_madd_epi16(p, s[r][c]))
                    };
                }
                let corr = hsum_epi32(_mm256_madd_epi16(mn[r], bs));
                let isum = hsum_epi32(isum);
                acc[r][t] += a.d * dd[r].0 * isum as f32 - a.d * dd[r].1 * corr as f32;
            }
        }
    }
    for r in 0..R {
        for t in 0..T {
            *y.add(t * ys + r) = acc[r][t];
        }
    }
}

/// Load 8 weights of type `W` starting at element `i` as f32.
#[inline(always)]
unsafe fn load8<W: FloatW>(p: *const u8, i: usize) -> __m256 {
    match W::BYTES {
        4 => _mm256_loadu_ps((p as *const f32).add(i)),
        _ => {
            let h = _mm_loadu_si128((p as *const u16).add(i) as *const __m128i);
            if W::IS_F16 {
                _mm256_cvtph_ps(h)
            } else {
                _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
            }
        }
    }
}

/// Tile kernel for float weights against f32 activations (f16/bf16-rounded as required).
#[inline(always)]
unsafe fn tile_f<W: FloatW, const R: usize, const T: usize>(
    w: *const u8,
    ws: usize,
    x: *const u8,
    xs: usize,
    n: usize,
    y: *mut f32,
    ys: usize,
) {
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    let n8 = n / 8 * 8;
    let mut i = 0;
    while i < n8 {
        let mut wv = [_mm256_setzero_ps(); R];
        for r in 0..R {
            wv[r] = load8::<W>(w.add(r * ws), i);
        }
        for t in 0..T {
            let xv = _mm256_loadu_ps((x.add(t * xs) as *const f32).add(i));
            for r in 0..R {
                acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
            }
        }
        i += 8;
    }
    for r in 0..R {
        for t in 0..T {
            let xt = x.add(t * xs) as *const f32;
            let mut tail = 0f32;
            for j in n8..n {
                tail += W::get(w.add(r * ws), j) * *xt.add(j);
            }
            *y.add(t * ys + r) = hsum(acc[r][t]) + tail;
        }
    }
}

macro_rules! entry_points {
    ($feat:literal, $vnni:expr, $q32body:path, $wide:expr, $q32:ident, $qk:ident, $f:ident) => {
        /// # Safety
        /// CPU features and pointer extents as documented in the module header.
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn $q32<B: Q32, const R: usize, const T: usize>(
            w: *const u8,
            ws: usize,
            x: *const u8,
            xs: usize,
            nb: usize,
            y: *mut f32,
            ys: usize,
        ) {
            $q32body(w, ws, x, xs, nb, y, ys)
        }

        /// # Safety
        /// CPU features and pointer extents as documented in the module header.
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn $qk<B: QK, const R: usize, const T: usize>(
            w: *const u8,
            ws: usize,
            x: *const u8,
            xs: usize,
            nb: usize,
            y: *mut f32,
            ys: usize,
        ) {
            if $wide && B::KIND != 0 {
                super::x86_512::tile_qk::<B, R, T>(w, ws, x, xs, nb, y, ys)
            } else if B::KIND == 4 {
                tile_q4k::<B, R, T, { $vnni }>(w, ws, x, xs, nb, y, ys)
            } else {
                tile_qk::<B, R, T, { $vnni }>(w, ws, x, xs, nb, y, ys)
            }
        }

        /// # Safety
        /// CPU features and pointer extents as documented in the module header.
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn $f<W: FloatW, const R: usize, const T: usize>(
            w: *const u8,
            ws: usize,
            x: *const u8,
            xs: usize,
            n: usize,
            y: *mut f32,
            ys: usize,
        ) {
            tile_f::<W, R, T>(w, ws, x, xs, n, y, ys)
        }
    };
}

entry_points!(
    "avx2,fma,f16c",
    false,
    tile_q32::<B, R, T>,
    false,
    avx2_q32,
    avx2_qk,
    avx2_f
);
entry_points!(
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    true,
    super::x86_512::tile_q32::<B, R, T>,
    true,
    avx512_q32,
    avx512_qk,
    avx512_f
);

/// [`act::quantize_row`] compiled for AVX2 (vectorized rounding; identical results).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `out` as for [`act::quantize_row`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_row(kind: ActKind, x: &[f32], out: &mut [u8]) {
    if kind == ActKind::Q8 {
        assert_eq!(out.len(), kind.row_bytes(x.len()));
        assert_eq!(out.as_ptr() as usize % std::mem::align_of::<ActQ8>(), 0);
        let o = std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut ActQ8, x.len() / 32);
        return quantize_q8(x, o);
    }
    act::quantize_row(kind, x, out)
}

/// [`act::quantize_q8`] with explicit AVX2 (bit-identical for finite inputs: the max is
/// order-independent, `vroundps` with round-to-nearest rounds half to even like
/// `round_ties_even`, and the integer sum is exact).
#[inline(always)]
unsafe fn quantize_q8(x: &[f32], out: &mut [ActQ8]) {
    let sign = _mm256_set1_ps(-0.0);
    for (xb, o) in x.chunks_exact(32).zip(out.iter_mut()) {
        let p = xb.as_ptr();
        let v = [
            _mm256_loadu_ps(p),
            _mm256_loadu_ps(p.add(8)),
            _mm256_loadu_ps(p.add(16)),
            _mm256_loadu_ps(p.add(24)),
        ];
        let m = _mm256_max_ps(
            _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
            _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])),
        );
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
        let mut q = [_mm256_setzero_si256(); 4];
        for i in 0..4 {
            let r = _mm256_round_ps(_mm256_mul_ps(v[i], id), _MM_FROUND_TO_NEAREST_INT);
            q[i] = _mm256_cvtps_epi32(r);
        }
        let s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
        let sum = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 1)));
        // i32 → i8 (values are within ±127, so the saturating packs are exact); the packs work
        // per 128-bit lane, which a final dword permute undoes.
        let w01 = _mm256_packs_epi32(q[0], q[1]);
        let w23 = _mm256_packs_epi32(q[2], q[3]);
        let b = _mm256_packs_epi16(w01, w23);
        let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(o.qs.as_mut_ptr() as *mut __m256i, b);
        o.d = f16_to_f32(act::f32_to_f16(d));
        o.s = f16_to_f32(act::f32_to_f16(d * sum as f32));
        o.sum = sum;
        o._pad = 0;
    }
}
