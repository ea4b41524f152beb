//! Portable kernels (one weight row × one activation row): the only path on non-x86 targets
//! and the yardstick the SIMD paths are tested against.
//!
//! All tile kernels share the signature of [`super::TileFn`]: `w` points at the first weight
//! row (rows `ws` bytes apart), `x` at the first activation row (rows `xs` bytes apart), `nb` is
//! the number of weight blocks per row (elements for float types) and the result for row `r`,
//! token `t` goes to `y[t * ys + r]`.

use super::act::{f16_to_f32, ActQ8, ActQ8K};
use super::decode::{DecK, Q32, QK};

/// One 32-element-block row dot: exact integer block sums, then `d_w * d_x` in f32.
///
/// # Safety
/// Pointers must cover `nb` weight blocks, `nb` [`ActQ8`] blocks and one output.
pub(crate) unsafe fn q32<B: Q32>(
    w: *const u8,
    _ws: usize,
    x: *const u8,
    _xs: usize,
    nb: usize,
    y: *mut f32,
    _ys: usize,
) {
    let acts = std::slice::from_raw_parts(x as *const ActQ8, nb);
    let mut q = [0u8; 32];
    let (mut sumf, mut summ) = (0f32, 0f32);
    for (b, a) in acts.iter().enumerate() {
        q32_block::<B>(w.add(b * B::BYTES), a, &mut q, &mut sumf, &mut summ);
    }
    *y = sumf + summ;
}

/// One block of [`q32`]: the exact integer dot, then `sumf += isum · (d_w · d_x)` and
/// `summ += m_w · s_x` (no FMA). The SIMD kernels finish odd blocks with it, so their sums follow
/// the same steps.
///
/// # Safety
/// `w` must point to one weight block.
#[inline(always)]
pub(crate) unsafe fn q32_block<B: Q32>(
    w: *const u8,
    a: &ActQ8,
    q: &mut [u8; 32],
    sumf: &mut f32,
    summ: &mut f32,
) {
    let (d, m) = B::decode(w, q);
    let mut isum = 0i32;
    for i in 0..32 {
        let wq = if B::SIGNED {
            q[i] as i8 as i32
        } else {
            q[i] as i32
        };
        isum += wq * a.qs[i] as i32;
    }
    isum -= B::OFF * a.sum;
    *sumf += isum as f32 * (d * a.d);
    if B::HAS_MIN {
        *summ += m * a.s;
    }
}

/// One k-quant row dot against `Q8_K` activations.
///
/// # Safety
/// As for [`q32`] with [`ActQ8K`] blocks.
pub(crate) unsafe fn qk<B: QK>(
    w: *const u8,
    _ws: usize,
    x: *const u8,
    _xs: usize,
    nb: usize,
    y: *mut f32,
    _ys: usize,
) {
    let acts = std::slice::from_raw_parts(x as *const ActQ8K, nb);
    let mut dec = DecK::ZERO;
    let mut sumf = 0f32;
    for (b, a) in acts.iter().enumerate() {
        B::decode(w.add(b * B::BYTES), &mut dec);
        let (mut isum, mut corr) = (0i32, 0i32);
        for g in 0..16 {
            let mut gs = 0i32;
            for i in 16 * g..16 * g + 16 {
                gs += dec.q[i] as i32 * a.qs[i] as i32;
            }
            isum += gs * dec.sc[g] as i32;
            corr += dec.mn[g] as i32 * a.bsums[g] as i32;
        }
        sumf += a.d * dec.d * isum as f32 - a.d * dec.dmin * corr as f32;
    }
    *y = sumf;
}

/// Float weight element types.
pub(crate) trait FloatW {
    const BYTES: usize;
    /// IEEE half (as opposed to bf16 when `BYTES == 2`).
    const IS_F16: bool;
    /// # Safety
    /// `p` must point to element `i` of a readable row.
    unsafe fn get(p: *const u8, i: usize) -> f32;
}

pub(crate) struct WF32;
pub(crate) struct WF16;
pub(crate) struct WBf16;

impl FloatW for WF32 {
    const BYTES: usize = 4;
    const IS_F16: bool = false;
    #[inline(always)]
    unsafe fn get(p: *const u8, i: usize) -> f32 {
        (p as *const f32).add(i).read_unaligned()
    }
}
impl FloatW for WF16 {
    const BYTES: usize = 2;
    const IS_F16: bool = true;
    #[inline(always)]
    unsafe fn get(p: *const u8, i: usize) -> f32 {
        f16_to_f32((p as *const u16).add(i).read_unaligned())
    }
}
impl FloatW for WBf16 {
    const BYTES: usize = 2;
    const IS_F16: bool = false;
    #[inline(always)]
    unsafe fn get(p: *const u8, i: usize) -> f32 {
        f32::from_bits(((p as *const u16).add(i).read_unaligned() as u32) << 16)
    }
}

/// Float row dot with 8 interleaved f32 accumulators (the lane layout of the SIMD paths).
///
/// # Safety
/// `w` must cover `n` elements of `W`, `x` `n` f32 values.
pub(crate) unsafe fn float<W: FloatW>(
    w: *const u8,
    _ws: usize,
    x: *const u8,
    _xs: usize,
    n: usize,
    y: *mut f32,
    _ys: usize,
) {
    let xv = std::slice::from_raw_parts(x as *const f32, n);
    let mut lanes = [0f32; 8];
    let n8 = n / 8 * 8;
    for i in (0..n8).step_by(8) {
        for (l, acc) in lanes.iter_mut().enumerate() {
            *acc = W::get(w, i + l).mul_add(xv[i + l], *acc);
        }
    }
    let mut tail = 0f32;
    for (i, &xi) in xv.iter().enumerate().skip(n8) {
        tail += W::get(w, i) * xi;
    }
    *y = lanes.iter().sum::<f32>() + tail;
}
