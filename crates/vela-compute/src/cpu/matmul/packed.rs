//! Repacked weights and a register-blocked AVX-512 VNNI GEMM for the 32-element block types
//! (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) against [`ActQ8`] activations; the k-quants have their own
//! packed layout and kernel in `packed_k.rs` behind the same [`PackedMatrix`].
//!
//! # Layout
//! At load time the rows are cut into tiles of [`ROWS`] = 16 rows (the last one zero-padded)
//! and every tile is rewritten so that one 512-bit register holds *the same 4 consecutive
//! elements of all 16 rows* (i32 lane `r` = row `r`). A tile of `nb` blocks is stored as
//!
//! | section | per block | content |
//! |---|---|---|
//! | `d` | 32 B | the 16 rows' f16 scales |
//! | `m` | 32 B | the 16 rows' f16 mins (Q4_1/Q5_1 only) |
//! | `qh` | 64 B | 8 × u64 byte masks of the fifth bits (Q5_0/Q5_1 only) |
//! | `q` | 256 / 512 B | quants (nibble types: 4 registers; Q8_0: 8 registers) |
//!
//! each section block-major, every section start 64-byte aligned. Nibble register `j` (0..4),
//! lane `r` holds the 4 bytes `qs[4j .. 4j+4]` of row `r` as stored in GGUF, so its low nibbles are
//! elements `4j .. 4j+4` and its high nibbles elements `16+4j ..`: `v & 15` is quant register
//! `j`, `(v >> 4) & 15` quant register `j + 4`, and register `g` covers elements `4g .. 4g+4`.
//! The Q5 mask of register `g` has bit `4r + i` set when element `4g + i` of row `r` has its fifth
//! bit set (one masked byte add of 16). Q8_0 quants are stored `+ 128` (unsigned). The packed
//! size equals the GGUF size (plus padding), so decode streams the same number of bytes.
//!
//! # Kernel
//! Per block the 8 quant registers are decoded once and reused for `T ≤ 8` tokens; per token the
//! integer block dot of all 16 rows is 8 `vpdpbusd` with the token's 4-byte activation groups
//! broadcast, starting from `-OFF · Σa` (the zero point folded into integer arithmetic). Then,
//! exactly like the scalar reference: `sumf += isum as f32 * (d_w * d_a)` and `summ += m_w · s_a`
//! lane-wise (no FMA), `y = sumf + summ`. The packed path is therefore bit-identical to the
//! scalar kernel, independent of tiling and thread split.

use super::act::ActQ8;
use super::decode::Q32;
use super::{Line, QMatrix};
use vela_formats::quant::GgmlType;

/// Rows per tile (i32 lanes of a 512-bit register).
pub(crate) const ROWS: usize = 16;

/// Most tokens per kernel call (register budget: 8 quant registers + `T` accumulators, two per
/// token for Q4_1/Q5_1). 16 tokens measured slower (spills): 540-565 vs 600-700 GFLOP/s.
pub(crate) const TOKENS: usize = 8;

/// The kernels of one type: `fns[T - 1]` for `T ≤ t_max`.
pub(crate) struct Kernels {
    pub fns: [PackedFn; TOKENS],
    pub t_max: usize,
}

/// A weight matrix repacked into tiles of 16 interleaved rows for the AVX-512 VNNI GEMM (see
/// the module docs; k-quants: `packed_k.rs`). Built once per weight at load time with
/// [`PackedMatrix::new`].
pub struct PackedMatrix {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    /// Bytes of one tile.
    tile_bytes: usize,
    data: Vec<Line>,
}

/// Section offsets of a tile with `nb` blocks: `(m, qh, q, tile_bytes)`.
pub(crate) fn offsets(ty: GgmlType, nb: usize) -> (usize, usize, usize, usize) {
    let (has_min, q5, nq) = match ty {
        GgmlType::Q4_0 => (false, false, 4),
        GgmlType::Q4_1 => (true, false, 4),
        GgmlType::Q5_0 => (false, true, 4),
        GgmlType::Q5_1 => (true, true, 4),
        _ => (false, false, 8),
    };
    let sc = (nb * 32).next_multiple_of(64);
    let m = sc;
    let qh = m + if has_min { sc } else { 0 };
    let q = qh + if q5 { nb * 64 } else { 0 };
    (m, qh, q, q + nb * nq * 64)
}

impl PackedMatrix {
    /// Repack `w`; `None` when the type has no packed layout or the shape is invalid (the caller
    /// then keeps using the GGUF layout).
    pub fn new(w: &QMatrix) -> Option<PackedMatrix> {
        use GgmlType as G;
        if w.ty.block_size() == 256 {
            #[cfg(target_arch = "x86_64")]
            return super::packed_k::pack(w);
            #[cfg(not(target_arch = "x86_64"))]
            return None;
        }
        let (bytes, qs_at, qh_at, has_min) = match w.ty {
            G::Q4_0 => (18, 2, 0, false),
            G::Q4_1 => (20, 4, 0, true),
            G::Q5_0 => (22, 6, 2, false),
            G::Q5_1 => (24, 8, 4, true),
            G::Q8_0 => (34, 2, 0, false),
            _ => return None,
        };
        if w.cols == 0 || !w.cols.is_multiple_of(32) || w.rows == 0 {
            return None;
        }
        let nb = w.cols / 32;
        let wrow = nb * bytes;
        if w.data.len() < w.rows * wrow {
            return None;
        }
        let (m_off, qh_off, q_off, tile_bytes) = offsets(w.ty, nb);
        let n_tiles = w.rows.div_ceil(ROWS);
        let mut data = vec![Line([0; 64]); n_tiles * tile_bytes / 64];
        // SAFETY: `data` is `n_tiles * tile_bytes` initialized bytes.
        let out = unsafe {
            std::slice::from_raw_parts_mut(data.as_mut_ptr() as *mut u8, n_tiles * tile_bytes)
        };
        for (tile, dst) in out.chunks_exact_mut(tile_bytes).enumerate() {
            for r in 0..ROWS.min(w.rows - tile * ROWS) {
                let row = &w.data[(tile * ROWS + r) * wrow..][..wrow];
                for b in 0..nb {
                    let p = &row[b * bytes..][..bytes];
                    dst[b * 32 + 2 * r..][..2].copy_from_slice(&p[0..2]);
                    if has_min {
                        dst[m_off + b * 32 + 2 * r..][..2].copy_from_slice(&p[2..4]);
                    }
                    if w.ty == G::Q8_0 {
                        for g in 0..8 {
                            let o = q_off + (b * 8 + g) * 64 + 4 * r;
                            for i in 0..4 {
                                dst[o + i] = p[qs_at + 4 * g + i] ^ 0x80;
                            }
                        }
                        continue;
                    }
                    for j in 0..4 {
                        let o = q_off + (b * 4 + j) * 64 + 4 * r;
                        dst[o..o + 4].copy_from_slice(&p[qs_at + 4 * j..qs_at + 4 * j + 4]);
                    }
                    if qh_at != 0 {
                        let qh = u32::from_le_bytes(p[qh_at..qh_at + 4].try_into().unwrap());
                        for g in 0..8 {
                            let o = qh_off + (b * 8 + g) * 8;
                            let mut mask = u64::from_le_bytes(dst[o..o + 8].try_into().unwrap());
                            mask |= (((qh >> (4 * g)) & 15) as u64) << (4 * r);
                            dst[o..o + 8].copy_from_slice(&mask.to_le_bytes());
                        }
                    }
                }
            }
        }
        Some(PackedMatrix::from_parts(
            w.ty, w.rows, w.cols, tile_bytes, data,
        ))
    }

    pub(crate) fn from_parts(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        tile_bytes: usize,
        data: Vec<Line>,
    ) -> PackedMatrix {
        PackedMatrix {
            ty,
            rows,
            cols,
            tile_bytes,
            data,
        }
    }

    /// Fewest tokens of a batch for which this copy is used: the k-quant copy stores unpacked
    /// bytes (more bytes than the GGUF data), so single-token decode keeps the GGUF layout.
    pub fn min_tokens(&self) -> usize {
        if self.ty.block_size() == 256 {
            2
        } else {
            super::PACKED_MIN_TOKENS
        }
    }

    /// The weight type.
    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    /// Rows of the original matrix.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Elements per row.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes held (all tiles, padding included).
    pub fn bytes(&self) -> usize {
        self.data.len() * 64
    }

    pub(crate) fn ptr(&self) -> *const u8 {
        self.data.as_ptr() as *const u8
    }
}

/// A packed tile kernel: `(tile, nb, x, xs, y, ys, valid_rows)` computes `y[t * ys + r]` for
/// `r < valid_rows`, `t < T`.
pub(crate) type PackedFn = unsafe fn(*const u8, usize, *const u8, usize, *mut f32, usize, usize);

/// The GGUF type of a 32-element block type.
pub(crate) fn type_of<B: Q32>() -> GgmlType {
    if B::SIGNED {
        GgmlType::Q8_0
    } else if B::HAS_MIN {
        if B::QH_AT != 0 {
            GgmlType::Q5_1
        } else {
            GgmlType::Q4_1
        }
    } else if B::QH_AT != 0 {
        GgmlType::Q5_0
    } else {
        GgmlType::Q4_0
    }
}

/// The kernels of `kernel`'s family for `ty`, indexed by `T - 1` (every type
/// [`PackedMatrix::new`] packs for that family: [`super::packs`]).
#[cfg(target_arch = "x86_64")]
pub(crate) fn kernels(kernel: super::Kernel, ty: GgmlType) -> Kernels {
    use super::decode::*;
    use super::packed_avx2 as a2;
    macro_rules! k {
        ($B:ty) => {
            if kernel == super::Kernel::Avx512 {
                Kernels {
                    fns: [
                        x86::tile::<$B, 1>,
                        x86::tile::<$B, 2>,
                        x86::tile::<$B, 3>,
                        x86::tile::<$B, 4>,
                        x86::tile::<$B, 5>,
                        x86::tile::<$B, 6>,
                        x86::tile::<$B, 7>,
                        x86::tile::<$B, 8>,
                    ],
                    t_max: TOKENS,
                }
            } else {
                // `t_max` keeps calls at T ≤ 4; the unused entries repeat the widest kernel.
                let w: PackedFn = a2::tile::<$B, 4>;
                Kernels {
                    fns: [
                        a2::tile::<$B, 1>,
                        a2::tile::<$B, 2>,
                        a2::tile::<$B, 3>,
                        w,
                        w,
                        w,
                        w,
                        w,
                    ],
                    t_max: a2::TOKENS,
                }
            }
        };
    }
    match ty {
        GgmlType::Q4_0 => k!(Q4_0),
        GgmlType::Q4_1 => k!(Q4_1),
        GgmlType::Q5_0 => k!(Q5_0),
        GgmlType::Q5_1 => k!(Q5_1),
        GgmlType::Q8_0 => k!(Q8_0),
        _ => super::packed_k::kernels(ty),
    }
}

/// Tiles `tile0..tile1` of `p` for all `n_tokens` activation rows (`xq`, rows `xrow` bytes
/// apart), in cache-sized tile blocks × token groups × tiles. The outputs are rows
/// `row0..row0 + rows` of `p` (the whole matrix: 0 and `p.rows()`): weight row `r` of token `t`
/// goes to `y[t * rows + r - row0]`; the tiles must overlap that range.
///
/// # Safety
/// The kernels' CPU features available; `xq` covers `n_tokens` activation rows of `p.cols` elements in the
/// type's activation layout, `y` `n_tokens * rows` floats, and the tiles lie in the row range.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn run_tiles(
    p: &PackedMatrix,
    ks: &Kernels,
    tile0: usize,
    tile1: usize,
    xq: *const u8,
    xrow: usize,
    n_tokens: usize,
    y: *mut f32,
    row0: usize,
    rows: usize,
) {
    let nb = p.cols / p.ty.block_size();
    // Two-level cache blocking for L2 (1 MiB on Zen 4): a block of tiles (~384 KiB of packed
    // weights) × a chunk of tokens (~384 KiB of activations); inside, each token group passes
    // over the tile block. Activations are re-read from L3 once per tile block instead of once
    // per tile, which matters for wide rows (ffn_down: 7 KiB of activations per token).
    const BUDGET: usize = 384 * 1024;
    let tb = (BUDGET / p.tile_bytes).max(1);
    let tm = ks.t_max;
    let tc = ((BUDGET / xrow.max(1)) / tm * tm).max(tm);
    let mut b0 = tile0;
    while b0 < tile1 {
        let b1 = (b0 + tb).min(tile1);
        let mut c0 = 0;
        while c0 < n_tokens {
            let c1 = (c0 + tc).min(n_tokens);
            let mut t0 = c0;
            while t0 < c1 {
                let tn = tm.min(c1 - t0);
                let x = xq.add(t0 * xrow);
                for tile in b0..b1 {
                    // The range's rows lo..hi (of the packed matrix) in this tile.
                    let first = tile * ROWS;
                    let (lo, hi) = (first.max(row0), (first + ROWS).min(row0 + rows));
                    let w = p.ptr().add(tile * p.tile_bytes);
                    if lo == first {
                        let yt = y.add(t0 * rows + first - row0);
                        (ks.fns[tn - 1])(w, nb, x, xrow, yt, rows, hi - lo);
                    } else {
                        // The range starts inside this tile: all its rows into a buffer, then
                        // the range's part (the same values: every row is computed alone).
                        let mut buf = [0f32; ROWS * TOKENS];
                        (ks.fns[tn - 1])(w, nb, x, xrow, buf.as_mut_ptr(), ROWS, ROWS);
                        for t in 0..tn {
                            for r in lo..hi {
                                *y.add((t0 + t) * rows + r - row0) = buf[t * ROWS + r - first];
                            }
                        }
                    }
                }
                t0 += tn;
            }
            c0 = c1;
        }
        b0 = b1;
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::prefetch_ahead;

#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)]
mod x86 {
    use super::*;
    use std::arch::x86_64::*;

    /// Blocks ahead that single-token calls prefetch.
    const PF: usize = 8;

    /// Decode streams the weights from DRAM: block `b`'s sections (scales, fifth bits, mins,
    /// `qb` quant bytes) `PF` blocks ahead, into the next tile (which `run_tiles` visits next)
    /// past the end of this one. `offs` = [`offsets`] of the tile. Shared by the AVX2 kernel.
    #[inline(always)]
    pub(crate) unsafe fn prefetch_ahead<B: Q32>(
        w: *const u8,
        b: usize,
        nb: usize,
        offs: (usize, usize, usize, usize),
        qb: usize,
    ) {
        let (m_off, qh_off, q_off, tile_bytes) = offs;
        let (t, bb) = if b + PF < nb {
            (0, b + PF)
        } else {
            (tile_bytes, b + PF - nb)
        };
        let base = w.add(t);
        for o in (0..qb).step_by(64) {
            _mm_prefetch::<_MM_HINT_T0>(base.add(q_off + bb * qb + o) as *const i8);
        }
        _mm_prefetch::<_MM_HINT_T0>(base.add(bb * 32) as *const i8);
        if B::QH_AT != 0 {
            _mm_prefetch::<_MM_HINT_T0>(base.add(qh_off + bb * 64) as *const i8);
        }
        if B::HAS_MIN {
            _mm_prefetch::<_MM_HINT_T0>(base.add(m_off + bb * 32) as *const i8);
        }
    }

    /// Packed zero offset: Q8_0 quants are stored `+ 128`.
    const fn off<B: Q32>() -> i32 {
        if B::SIGNED {
            128
        } else {
            B::OFF
        }
    }

    /// One tile × `T` tokens (see the module docs). Signature as [`PackedFn`].
    ///
    /// # Safety
    /// AVX-512 F/BW/VNNI + F16C; `w` is a tile of `nb` blocks in the packed layout of `B`, `x`
    /// covers `T` rows (`xs` bytes apart) of `nb` [`ActQ8`] blocks, `y` the outputs.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn tile<B: Q32, const T: usize>(
        w: *const u8,
        nb: usize,
        x: *const u8,
        xs: usize,
        y: *mut f32,
        ys: usize,
        valid: usize,
    ) {
        let (m_off, qh_off, q_off, tile_bytes) = offsets(type_of::<B>(), nb);
        let nibble = !B::SIGNED;
        let q5 = B::QH_AT != 0;
        let off = off::<B>();
        let m15 = _mm512_set1_epi8(15);
        let c16 = _mm512_set1_epi8(16);
        let mut sumf = [_mm512_setzero_ps(); T];
        let mut summ = [_mm512_setzero_ps(); T];
        let qb = if nibble { 256 } else { 512 };
        for b in 0..nb {
            if T == 1 {
                prefetch_ahead::<B>(w, b, nb, (m_off, qh_off, q_off, tile_bytes), qb);
            }
            let dw = _mm512_cvtph_ps(_mm256_load_si256(w.add(b * 32) as *const __m256i));
            let mut q = [_mm512_setzero_si512(); 8];
            if nibble {
                let base = w.add(q_off + b * 256);
                for j in 0..4 {
                    let v = _mm512_load_si512(base.add(64 * j) as *const _);
                    q[j] = _mm512_and_si512(v, m15);
                    q[j + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m15);
                }
                if q5 {
                    let hm = w.add(qh_off + b * 64) as *const u64;
                    for g in 0..8 {
                        q[g] = _mm512_mask_add_epi8(q[g], hm.add(g).read(), q[g], c16);
                    }
                }
            } else {
                let base = w.add(q_off + b * 512);
                for g in 0..8 {
                    q[g] = _mm512_load_si512(base.add(64 * g) as *const _);
                }
            }
            for t in 0..T {
                let a = &*(x.add(t * xs) as *const ActQ8).add(b);
                let mut isum = if off != 0 {
                    _mm512_set1_epi32(-off * a.sum)
                } else {
                    _mm512_setzero_si512()
                };
                let qa = a.qs.as_ptr() as *const i32;
                for g in 0..8 {
                    isum = _mm512_dpbusd_epi32(isum, q[g], _mm512_set1_epi32(qa.add(g).read()));
                }
                let scale = _mm512_mul_ps(dw, _mm512_set1_ps(a.d));
                sumf[t] = _mm512_add_ps(sumf[t], _mm512_mul_ps(_mm512_cvtepi32_ps(isum), scale));
            }
            if B::HAS_MIN {
                let mw =
                    _mm512_cvtph_ps(_mm256_load_si256(w.add(m_off + b * 32) as *const __m256i));
                for t in 0..T {
                    let a = &*(x.add(t * xs) as *const ActQ8).add(b);
                    summ[t] = _mm512_add_ps(summ[t], _mm512_mul_ps(mw, _mm512_set1_ps(a.s)));
                }
            }
        }
        let k: __mmask16 = if valid >= 16 {
            0xffff
        } else {
            (1u16 << valid) - 1
        };
        for t in 0..T {
            // `+ summ` also for types without mins, as the scalar kernel does (-0.0 + 0.0).
            _mm512_mask_storeu_ps(y.add(t * ys), k, _mm512_add_ps(sumf[t], summ[t]));
        }
    }
}
