//! The packed layout and AVX-512 VNNI GEMM kernel for the k-quants (Q2_K … Q6_K) against
//! [`ActQ8K`] activations (see `packed.rs` for the 32-element types and the shared tiling).
//!
//! # Layout
//! Every 256-element super-block of a tile of 16 rows is decoded once at load time with the
//! shared decoders (`decode.rs`: unsigned quants `q`, 16 per-16-element scales `sc` and "mins"
//! `mn`, float `d` / `dmin`) and stored as one 5,760-byte record:
//!
//! | offset | bytes | content |
//! |---|---|---|
//! | 0 | 64 | `d` of the 16 rows (f32) |
//! | 64 | 64 | `dmin` of the 16 rows (f32) |
//! | 128 | 1024 | `sc[g]` as i32, one register (16 rows) per group `g` |
//! | 1152 | 512 | `(mn[2k], mn[2k+1])` as i16 pairs, one register per `k < 8` |
//! | 1664 | 4096 | quants as bytes: register `4g + k`, lane `r` = elements `16g + 4k ..+4` of row `r` |
//!
//! The quants are unpacked to bytes, so the packed copy is larger than the GGUF data; it is
//! only used for batches (prefill), decode keeps streaming the GGUF layout.
//!
//! # Kernel
//! Per group `g` and token: 4 `vpdpbusd` give the exact 16-element group dots of all 16 rows,
//! multiplied by `sc[g]` (`vpmulld`) and summed into the super-block's integer dot; the min
//! correction `Σ mn·bsum` is 8 `vpdpwssd` against the token's block sums. Then, exactly as the
//! scalar reference: `sumf += a.d * d * isum as f32 - a.d * dmin * corr as f32` (no FMA), so the
//! result is bit-identical to the scalar kernel.

use super::packed::{PackedMatrix, ROWS};
use super::{Line, QMatrix};
use vela_formats::quant::GgmlType;

/// Bytes of one super-block record of a tile.
pub(crate) const SB_BYTES: usize = 5760;
const SC_AT: usize = 128;
const MN_AT: usize = 1152;
const Q_AT: usize = 1664;

/// Repack a k-quant matrix (`None` for other types or an invalid shape).
pub(crate) fn pack(w: &QMatrix) -> Option<PackedMatrix> {
    use super::decode::*;
    use GgmlType as G;
    let decode: unsafe fn(*const u8, &mut DecK) = match w.ty {
        G::Q2_K => Q2K::decode,
        G::Q3_K => Q3K::decode,
        G::Q4_K => Q4K::decode,
        G::Q5_K => Q5K::decode,
        G::Q6_K => Q6K::decode,
        _ => return None,
    };
    if w.cols == 0 || !w.cols.is_multiple_of(256) || w.rows == 0 {
        return None;
    }
    let nb = w.cols / 256;
    let bytes = w.ty.type_size();
    let wrow = nb * bytes;
    if w.data.len() < w.rows * wrow {
        return None;
    }
    let tile_bytes = nb * SB_BYTES;
    let n_tiles = w.rows.div_ceil(ROWS);
    let mut data = vec![Line([0; 64]); n_tiles * tile_bytes / 64];
    // SAFETY: `data` is `n_tiles * tile_bytes` initialized bytes.
    let out = unsafe {
        std::slice::from_raw_parts_mut(data.as_mut_ptr() as *mut u8, n_tiles * tile_bytes)
    };
    let mut dec = DecK::ZERO;
    for (tile, dst) in out.chunks_exact_mut(tile_bytes).enumerate() {
        for r in 0..ROWS.min(w.rows - tile * ROWS) {
            let row = &w.data[(tile * ROWS + r) * wrow..][..wrow];
            for b in 0..nb {
                // SAFETY: the block lies inside `row` (length checked above).
                unsafe { decode(row[b * bytes..][..bytes].as_ptr(), &mut dec) };
                let sb = &mut dst[b * SB_BYTES..][..SB_BYTES];
                sb[4 * r..][..4].copy_from_slice(&dec.d.to_le_bytes());
                sb[64 + 4 * r..][..4].copy_from_slice(&dec.dmin.to_le_bytes());
                for g in 0..16 {
                    let o = SC_AT + 64 * g + 4 * r;
                    sb[o..o + 4].copy_from_slice(&(dec.sc[g] as i32).to_le_bytes());
                }
                for k in 0..8 {
                    let o = MN_AT + 64 * k + 4 * r;
                    sb[o..o + 2].copy_from_slice(&dec.mn[2 * k].to_le_bytes());
                    sb[o + 2..o + 4].copy_from_slice(&dec.mn[2 * k + 1].to_le_bytes());
                }
                for j in 0..64 {
                    let o = Q_AT + 64 * j + 4 * r;
                    sb[o..o + 4].copy_from_slice(&dec.q[4 * j..4 * j + 4]);
                }
            }
        }
    }
    Some(PackedMatrix::from_parts(
        w.ty, w.rows, w.cols, tile_bytes, data,
    ))
}

/// The kernels for k-quant type `ty` indexed by `T - 1` (the layout is type-independent).
pub(crate) fn kernels(_ty: GgmlType) -> super::packed::Kernels {
    let t8 = x86::tile::<8> as super::packed::PackedFn;
    super::packed::Kernels {
        fns: [
            x86::tile::<1>,
            x86::tile::<2>,
            x86::tile::<3>,
            x86::tile::<4>,
            x86::tile::<5>,
            x86::tile::<6>,
            x86::tile::<7>,
            t8,
        ],
        t_max: 8,
    }
}

#[allow(clippy::needless_range_loop)]
mod x86 {
    use super::super::act::ActQ8K;
    use super::*;
    use std::arch::x86_64::*;

    /// One tile × `T` tokens (see the module docs). Signature as
    /// [`super::super::packed::PackedFn`].
    ///
    /// # Safety
    /// AVX-512 F/BW/VNNI; `w` is a tile of `nb` super-block records, `x` covers `T` rows (`xs`
    /// bytes apart) of `nb` [`ActQ8K`] blocks, `y` the outputs.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn tile<const T: usize>(
        w: *const u8,
        nb: usize,
        x: *const u8,
        xs: usize,
        y: *mut f32,
        ys: usize,
        valid: usize,
    ) {
        let mut sumf = [_mm512_setzero_ps(); T];
        for b in 0..nb {
            let sb = w.add(b * SB_BYTES);
            let mut acts = [std::ptr::null::<ActQ8K>(); T];
            for t in 0..T {
                acts[t] = (x.add(t * xs) as *const ActQ8K).add(b);
            }
            let mut isum = [_mm512_setzero_si512(); T];
            for g in 0..16 {
                let sc = _mm512_load_si512(sb.add(SC_AT + 64 * g) as *const _);
                let qp = sb.add(Q_AT + 256 * g);
                let q = [
                    _mm512_load_si512(qp as *const _),
                    _mm512_load_si512(qp.add(64) as *const _),
                    _mm512_load_si512(qp.add(128) as *const _),
                    _mm512_load_si512(qp.add(192) as *const _),
                ];
                for t in 0..T {
                    let qa = ((*acts[t]).qs.as_ptr() as *const i32).add(4 * g);
                    let mut gs = _mm512_setzero_si512();
                    for k in 0..4 {
                        gs = _mm512_dpbusd_epi32(gs, q[k], _mm512_set1_epi32(qa.add(k).read()));
                    }
                    isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(gs, sc));
                }
            }
            let dw = _mm512_load_ps(sb as *const f32);
            let dm = _mm512_load_ps(sb.add(64) as *const f32);
            for t in 0..T {
                let a = &*acts[t];
                let bs = a.bsums.as_ptr() as *const i32;
                let mut corr = _mm512_setzero_si512();
                for k in 0..8 {
                    let mn = _mm512_load_si512(sb.add(MN_AT + 64 * k) as *const _);
                    corr = _mm512_dpwssd_epi32(corr, mn, _mm512_set1_epi32(bs.add(k).read()));
                }
                let ad = _mm512_set1_ps(a.d);
                let t1 = _mm512_mul_ps(_mm512_mul_ps(ad, dw), _mm512_cvtepi32_ps(isum[t]));
                let t2 = _mm512_mul_ps(_mm512_mul_ps(ad, dm), _mm512_cvtepi32_ps(corr));
                sumf[t] = _mm512_add_ps(sumf[t], _mm512_sub_ps(t1, t2));
            }
        }
        let k: __mmask16 = if valid >= 16 {
            0xffff
        } else {
            (1u16 << valid) - 1
        };
        for t in 0..T {
            _mm512_mask_storeu_ps(y.add(t * ys), k, sumf[t]);
        }
    }
}
