//! Weight block decoders shared by every kernel path.
//!
//! Each quantized weight block is unpacked into small unsigned integers plus float scales, so
//! that a dot product with a quantized activation block is an exact integer sum followed by a
//! few float multiplies (the zero points are folded in with the activation block sums):
//!
//! * 32-element types: `W[i] = d * (q[i] - OFF) + m`
//! * k-quants (256 elements, 16 groups of 16): `W[i] = d * sc[g] * q[i] - dmin * mn[g]`, g = i/16
//!
//! The decoders are plain Rust written so that LLVM vectorizes them for whatever target features
//! the calling kernel is compiled with (they are `#[inline(always)]`).

use super::act::f16_to_f32;

#[inline(always)]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[i], b[i + 1]]))
}

/// A 32-element block type.
pub(crate) trait Q32 {
    /// Bytes per block.
    const BYTES: usize;
    /// Zero offset subtracted from `q`.
    const OFF: i32;
    /// `q` holds signed bytes (`Q8_0`) instead of small unsigned values.
    const SIGNED: bool;
    /// The block has an additive min `m` (dot gains `m * s_act`).
    const HAS_MIN: bool;
    /// Byte offset of the quants (16 nibble bytes, or 32 signed bytes for `Q8_0`).
    const QS_AT: usize;
    /// Byte offset of the 32 fifth bits (little-endian u32), 0 if the type has none.
    const QH_AT: usize;
    /// Unpack the block at `p` into `q`; returns `(d, m)`.
    ///
    /// # Safety
    /// `p` must point to `BYTES` readable bytes.
    unsafe fn decode(p: *const u8, q: &mut [u8; 32]) -> (f32, f32);
}

pub(crate) struct Q4_0;
pub(crate) struct Q4_1;
pub(crate) struct Q5_0;
pub(crate) struct Q5_1;
pub(crate) struct Q8_0;

#[inline(always)]
fn nibbles(qs: &[u8], q: &mut [u8; 32]) {
    for j in 0..16 {
        q[j] = qs[j] & 15;
        q[j + 16] = qs[j] >> 4;
    }
}

#[inline(always)]
fn high_bits(qh: u32, q: &mut [u8; 32]) {
    for (j, v) in q.iter_mut().enumerate() {
        *v |= (((qh >> j) & 1) << 4) as u8;
    }
}

impl Q32 for Q4_0 {
    const QS_AT: usize = 2;
    const QH_AT: usize = 0;
    const BYTES: usize = 18;
    const OFF: i32 = 8;
    const SIGNED: bool = false;
    const HAS_MIN: bool = false;
    #[inline(always)]
    unsafe fn decode(p: *const u8, q: &mut [u8; 32]) -> (f32, f32) {
        let b = &*(p as *const [u8; 18]);
        nibbles(&b[2..18], q);
        (f16_at(b, 0), 0.0)
    }
}

impl Q32 for Q4_1 {
    const QS_AT: usize = 4;
    const QH_AT: usize = 0;
    const BYTES: usize = 20;
    const OFF: i32 = 0;
    const SIGNED: bool = false;
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn decode(p: *const u8, q: &mut [u8; 32]) -> (f32, f32) {
        let b = &*(p as *const [u8; 20]);
        nibbles(&b[4..20], q);
        (f16_at(b, 0), f16_at(b, 2))
    }
}

impl Q32 for Q5_0 {
    const QS_AT: usize = 6;
    const QH_AT: usize = 2;
    const BYTES: usize = 22;
    const OFF: i32 = 16;
    const SIGNED: bool = false;
    const HAS_MIN: bool = false;
    #[inline(always)]
    unsafe fn decode(p: *const u8, q: &mut [u8; 32]) -> (f32, f32) {
        let b = &*(p as *const [u8; 22]);
        nibbles(&b[6..22], q);
        high_bits(u32::from_le_bytes([b[2], b[3], b[4], b[5]]), q);
        (f16_at(b, 0), 0.0)
    }
}

impl Q32 for Q5_1 {
    const QS_AT: usize = 8;
    const QH_AT: usize = 4;
    const BYTES: usize = 24;
    const OFF: i32 = 0;
    const SIGNED: bool = false;
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn decode(p: *const u8, q: &mut [u8; 32]) -> (f32, f32) {
        let b = &*(p as *const [u8; 24]);
        nibbles(&b[8..24], q);
        high_bits(u32::from_le_bytes([b[4], b[5], b[6], b[7]]), q);
        (f16_at(b, 0), f16_at(b, 2))
    }
}

impl Q32 for Q8_0 {
    const QS_AT: usize = 2;
    const QH_AT: usize = 0;
    const BYTES: usize = 34;
    const OFF: i32 = 0;
    const SIGNED: bool = true;
    const HAS_MIN: bool = false;
    #[inline(always)]
    unsafe fn decode(p: *const u8, q: &mut [u8; 32]) -> (f32, f32) {
        let b = &*(p as *const [u8; 34]);
        q.copy_from_slice(&b[2..34]);
        (f16_at(b, 0), 0.0)
    }
}

/// A decoded k-quant super-block (see the module docs for the meaning of the fields).
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub(crate) struct DecK {
    pub q: [u8; 256],
    pub sc: [i16; 16],
    pub mn: [i16; 16],
    pub d: f32,
    pub dmin: f32,
}

impl DecK {
    pub const ZERO: DecK = DecK {
        q: [0; 256],
        sc: [0; 16],
        mn: [0; 16],
        d: 0.0,
        dmin: 0.0,
    };
}

/// A 256-element k-quant type (dot type `Q8_K`).
pub(crate) trait QK {
    const BYTES: usize;
    /// Selects a dedicated SIMD decoder where one exists: 4 = Q4_K, 6 = Q6_K, 0 = none.
    const KIND: u8 = 0;
    /// # Safety
    /// `p` must point to `BYTES` readable bytes.
    unsafe fn decode(p: *const u8, out: &mut DecK);
}

pub(crate) struct Q2K;
pub(crate) struct Q3K;
pub(crate) struct Q4K;
pub(crate) struct Q5K;
pub(crate) struct Q6K;

/// The 6-bit (scale, min) pair `j` of a Q4_K/Q5_K scale array (ggml `get_scale_min_k4`).
#[inline(always)]
fn scale_min_k4(j: usize, s: &[u8]) -> (i16, i16) {
    if j < 4 {
        ((s[j] & 63) as i16, (s[j + 4] & 63) as i16)
    } else {
        (
            ((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4)) as i16,
            ((s[j + 4] >> 4) | ((s[j] >> 6) << 4)) as i16,
        )
    }
}

#[inline(always)]
fn k4_scales(s: &[u8], out: &mut DecK) {
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, s);
        out.sc[2 * j] = sc;
        out.sc[2 * j + 1] = sc;
        out.mn[2 * j] = m;
        out.mn[2 * j + 1] = m;
    }
}

impl QK for Q4K {
    const BYTES: usize = 144;
    const KIND: u8 = 4;
    #[inline(always)]
    unsafe fn decode(p: *const u8, out: &mut DecK) {
        let b = &*(p as *const [u8; 144]);
        out.d = f16_at(b, 0);
        out.dmin = f16_at(b, 2);
        k4_scales(&b[4..16], out);
        let qs = &b[16..144];
        for c in 0..4 {
            for l in 0..32 {
                out.q[64 * c + l] = qs[32 * c + l] & 15;
                out.q[64 * c + 32 + l] = qs[32 * c + l] >> 4;
            }
        }
    }
}

impl QK for Q5K {
    const BYTES: usize = 176;
    #[inline(always)]
    unsafe fn decode(p: *const u8, out: &mut DecK) {
        let b = &*(p as *const [u8; 176]);
        out.d = f16_at(b, 0);
        out.dmin = f16_at(b, 2);
        k4_scales(&b[4..16], out);
        let qh = &b[16..48];
        let qs = &b[48..176];
        for c in 0..4 {
            for l in 0..32 {
                out.q[64 * c + l] = (qs[32 * c + l] & 15) | (((qh[l] >> (2 * c)) & 1) << 4);
                out.q[64 * c + 32 + l] =
                    (qs[32 * c + l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4);
            }
        }
    }
}

impl QK for Q6K {
    const BYTES: usize = 210;
    const KIND: u8 = 6;
    #[inline(always)]
    unsafe fn decode(p: *const u8, out: &mut DecK) {
        let b = &*(p as *const [u8; 210]);
        let (ql, rest) = b.split_at(128);
        let (qh, rest) = rest.split_at(64);
        let d = f16_at(rest, 16);
        for g in 0..16 {
            out.sc[g] = rest[g] as i8 as i16;
        }
        out.mn = out.sc;
        out.d = d;
        // W = d * sc * (u - 32): the offset becomes a "min" of 32 * d * sc.
        out.dmin = 32.0 * d;
        for n in 0..2 {
            let (ql, qh, q) = (&ql[64 * n..], &qh[32 * n..], &mut out.q[128 * n..]);
            for l in 0..32 {
                let h = qh[l];
                q[l] = (ql[l] & 15) | ((h & 3) << 4);
                q[l + 32] = (ql[l + 32] & 15) | (((h >> 2) & 3) << 4);
                q[l + 64] = (ql[l] >> 4) | (((h >> 4) & 3) << 4);
                q[l + 96] = (ql[l + 32] >> 4) | (((h >> 6) & 3) << 4);
            }
        }
    }
}

impl QK for Q2K {
    const BYTES: usize = 84;
    #[inline(always)]
    unsafe fn decode(p: *const u8, out: &mut DecK) {
        let b = &*(p as *const [u8; 84]);
        for g in 0..16 {
            out.sc[g] = (b[g] & 15) as i16;
            out.mn[g] = (b[g] >> 4) as i16;
        }
        let qs = &b[16..80];
        out.d = f16_at(b, 80);
        out.dmin = f16_at(b, 82);
        for n in 0..2 {
            for s in 0..4 {
                for l in 0..32 {
                    out.q[128 * n + 32 * s + l] = (qs[32 * n + l] >> (2 * s)) & 3;
                }
            }
        }
    }
}

impl QK for Q3K {
    const BYTES: usize = 110;
    #[inline(always)]
    unsafe fn decode(p: *const u8, out: &mut DecK) {
        let b = &*(p as *const [u8; 110]);
        let hm = &b[0..32];
        let qs = &b[32..96];
        let s = &b[96..108];
        let d = f16_at(b, 108);
        // Unpack the 16 6-bit scales (low 4 bits from s[0..8], high 2 bits from s[8..12]).
        for g in 0..16 {
            let lo = if g < 8 { s[g] & 15 } else { s[g - 8] >> 4 };
            let hi = (s[8 + (g % 4)] >> (2 * (g / 4))) & 3;
            let v = (lo | (hi << 4)) as i16 - 32;
            out.sc[g] = v;
            out.mn[g] = v;
        }
        out.d = d;
        // W = d * sc * (low2 + 4*hbit - 4): the -4 becomes a "min" of 4 * d * sc.
        out.dmin = 4.0 * d;
        for n in 0..2 {
            for sh in 0..4 {
                let bit = 4 * n + sh;
                for l in 0..32 {
                    out.q[128 * n + 32 * sh + l] =
                        ((qs[32 * n + l] >> (2 * sh)) & 3) | (((hm[l] >> bit) & 1) << 2);
                }
            }
        }
    }
}
