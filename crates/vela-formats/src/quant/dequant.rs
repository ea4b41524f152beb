//! Scalar reference dequantizers for the GGML block formats.
//!
//! These are the *reference* against which the SIMD kernels in `vela-compute` are tested, so they
//! are written for obvious correctness: one function per block format, working on one block at a
//! time with fixed-size arrays, using exactly the floating-point operation order of llama.cpp
//! (`ggml/src/ggml-quants.c`, `dequantize_row_*`, commit 0c1e570) and gguf-py 0.19.0
//! (`gguf/quants.py`, `dequantize_blocks`). Both references agree on the operation order for every
//! type here, and Rust never contracts `a * b + c` into a fused multiply-add, so the results are
//! bit-exact with both (checked by `tests/quant_golden.rs`).
//!
//! Block layouts (little-endian, `d`/`dmin`/`m`/`s` are IEEE half unless noted):
//!
//! | type | bytes | layout |
//! |------|-------|--------|
//! | Q4_0 | 18  | `d`, `qs[16]` (element `j` in the low nibble of `qs[j]`, `j+16` in the high one) |
//! | Q4_1 | 20  | `d`, `m`, `qs[16]` |
//! | Q5_0 | 22  | `d`, `qh: u32` (5th bit of element `j` is bit `j`), `qs[16]` |
//! | Q5_1 | 24  | `d`, `m`, `qh: u32`, `qs[16]` |
//! | Q8_0 | 34  | `d`, `qs: [i8; 32]` |
//! | Q2_K | 84  | `scales[16]` (low nibble scale, high nibble min), `qs[64]`, `d`, `dmin` |
//! | Q3_K | 110 | `hmask[32]`, `qs[64]`, `scales[12]` (16 packed 6-bit scales), `d` |
//! | Q4_K | 144 | `d`, `dmin`, `scales[12]` (8 packed 6-bit scale/min pairs), `qs[128]` |
//! | Q5_K | 176 | `d`, `dmin`, `scales[12]`, `qh[32]`, `qs[128]` |
//! | Q6_K | 210 | `ql[128]`, `qh[64]`, `scales: [i8; 16]`, `d` |
//! | Q8_K | 292 | `d: f32`, `qs: [i8; 256]`, `bsums: [i16; 16]` (ignored when dequantizing) |

use super::{GgmlType, QK_K};
use anyhow::{anyhow, bail, Result};
use half::{bf16, f16};

/// Every type [`dequantize`] accepts (the same set as [`GgmlType::is_supported`]).
pub const SUPPORTED_TYPES: [GgmlType; 14] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_K,
];

/// Fail with a one-line message naming `ty` (and the supported types) unless vela can compute
/// with it.
pub fn check_supported(ty: GgmlType) -> Result<()> {
    if ty.is_supported() {
        return Ok(());
    }
    let names: Vec<&str> = SUPPORTED_TYPES.iter().map(|t| t.name()).collect();
    bail!(
        "tensor type {} is not supported (supported: {})",
        ty.name(),
        names.join(", ")
    )
}

/// Dequantize `out.len()` elements of type `ty` from `data` into `out`.
///
/// `data.len()` must equal `ty.row_bytes(out.len())`; any mismatch, an element count that is
/// not a multiple of the block size, or an unsupported type is a one-line error (never a panic).
/// Values are bit-exact with gguf-py's `gguf.quants.dequantize` and llama.cpp's
/// `dequantize_row_*`, including NaN/infinity propagation from the scales.
pub fn dequantize(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<()> {
    check_supported(ty)?;
    let n = out.len();
    let need = ty.row_bytes(n as u64).ok_or_else(|| {
        anyhow!(
            "{n} elements is not a multiple of the {ty} block size {}",
            ty.block_size()
        )
    })?;
    if data.len() as u64 != need {
        bail!(
            "{ty}: {n} elements need {need} bytes of data, got {}",
            data.len()
        );
    }
    match ty {
        GgmlType::F32 => {
            for (y, b) in out.iter_mut().zip(data.chunks_exact(4)) {
                *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => {
            for (y, b) in out.iter_mut().zip(data.chunks_exact(2)) {
                *y = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
        }
        GgmlType::BF16 => {
            for (y, b) in out.iter_mut().zip(data.chunks_exact(2)) {
                *y = bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
        }
        GgmlType::Q4_0 => blocks(data, out, q4_0),
        GgmlType::Q4_1 => blocks(data, out, q4_1),
        GgmlType::Q5_0 => blocks(data, out, q5_0),
        GgmlType::Q5_1 => blocks(data, out, q5_1),
        GgmlType::Q8_0 => blocks(data, out, q8_0),
        GgmlType::Q2_K => blocks(data, out, q2_k),
        GgmlType::Q3_K => blocks(data, out, q3_k),
        GgmlType::Q4_K => blocks(data, out, q4_k),
        GgmlType::Q5_K => blocks(data, out, q5_k),
        GgmlType::Q6_K => blocks(data, out, q6_k),
        GgmlType::Q8_K => blocks(data, out, q8_k),
        other => unreachable!("check_supported accepted {other}"),
    }
    Ok(())
}

/// Apply a per-block function over whole blocks. The caller has checked the lengths, so the
/// `chunks_exact` pieces always convert to the fixed-size arrays.
fn blocks<const TS: usize, const BS: usize>(
    data: &[u8],
    out: &mut [f32],
    f: fn(&[u8; TS], &mut [f32; BS]),
) {
    for (b, y) in data.chunks_exact(TS).zip(out.chunks_exact_mut(BS)) {
        f(
            b.try_into().expect("TS-byte chunk"),
            y.try_into().expect("BS-element chunk"),
        );
    }
}

/// The IEEE half at byte offset `i`, widened to f32 (exact).
#[inline]
pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

fn q4_0(b: &[u8; 18], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        y[j] = d * ((qs[j] & 0xF) as i32 - 8) as f32;
        y[j + 16] = d * ((qs[j] >> 4) as i32 - 8) as f32;
    }
}

fn q4_1(b: &[u8; 20], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qs = &b[4..20];
    for j in 0..16 {
        y[j] = d * (qs[j] & 0xF) as f32 + m;
        y[j + 16] = d * (qs[j] >> 4) as f32 + m;
    }
}

/// Combine the 4 low bits and the `qh` high bit of the two elements `j` and `j + 16` of a
/// Q5 block: returns their unsigned 5-bit values.
#[inline]
fn q5_pair(qs: &[u8], qh: u32, j: usize) -> (u8, u8) {
    let h0 = ((qh >> j) & 1) as u8;
    let h1 = ((qh >> (j + 16)) & 1) as u8;
    ((qs[j] & 0xF) | (h0 << 4), (qs[j] >> 4) | (h1 << 4))
}

fn q5_0(b: &[u8; 22], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for j in 0..16 {
        let (a, c) = q5_pair(qs, qh, j);
        y[j] = d * (a as i32 - 16) as f32;
        y[j + 16] = d * (c as i32 - 16) as f32;
    }
}

fn q5_1(b: &[u8; 24], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for j in 0..16 {
        let (a, c) = q5_pair(qs, qh, j);
        y[j] = d * a as f32 + m;
        y[j + 16] = d * c as f32 + m;
    }
}

fn q8_0(b: &[u8; 34], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    for j in 0..32 {
        y[j] = d * (b[2 + j] as i8) as f32;
    }
}

fn q2_k(b: &[u8; 84], y: &mut [f32; QK_K]) {
    let scales = &b[0..16];
    let qs = &b[16..80];
    let d = f16_at(b, 80);
    let dmin = f16_at(b, 82);
    // Two halves of 128 elements; each uses 32 bytes of qs, read 4 times with shifts 0,2,4,6.
    // Every 16 consecutive outputs share one scale byte.
    for half in 0..2 {
        let q = &qs[32 * half..32 * half + 32];
        for j in 0..4 {
            let shift = 2 * j;
            for sub in 0..2 {
                let sc = scales[8 * half + 2 * j + sub];
                let dl = d * (sc & 0xF) as f32;
                let ml = dmin * (sc >> 4) as f32;
                let base = 128 * half + 32 * j + 16 * sub;
                for l in 0..16 {
                    let v = (q[16 * sub + l] >> shift) & 3;
                    y[base + l] = dl * v as f32 - ml;
                }
            }
        }
    }
}

/// Unpack the 16 signed 6-bit scales of a Q3_K block (`scales[12]`), already minus 32.
///
/// Scale `j` has its low nibble in byte `j` (`j < 8`, low nibble) or byte `j - 8` (high
/// nibble), and its top two bits in byte `8 + j % 4` at bit `2 * (j / 4)`.
fn q3_k_scales(s: &[u8]) -> [i32; 16] {
    let mut out = [0i32; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = (low | (high << 4)) as i32 - 32;
    }
    out
}

fn q3_k(b: &[u8; 110], y: &mut [f32; QK_K]) {
    let hmask = &b[0..32];
    let qs = &b[32..96];
    let scales = q3_k_scales(&b[96..108]);
    let d = f16_at(b, 108);
    // Same walk as Q2_K; the third bit of element (half, j, l) is bit 4*half + j of hmask[l],
    // and a *cleared* bit means "subtract 4".
    for half in 0..2 {
        let q = &qs[32 * half..32 * half + 32];
        for j in 0..4 {
            let shift = 2 * j;
            let m = 1u8 << (4 * half + j);
            for sub in 0..2 {
                let dl = d * scales[8 * half + 2 * j + sub] as f32;
                let base = 128 * half + 32 * j + 16 * sub;
                for l in 0..16 {
                    let idx = 16 * sub + l;
                    let low = ((q[idx] >> shift) & 3) as i32;
                    let v = low - if hmask[idx] & m != 0 { 0 } else { 4 };
                    y[base + l] = dl * v as f32;
                }
            }
        }
    }
}

/// Scale and min number `j` (0..8) of a Q4_K/Q5_K block from its packed 12 bytes: the first
/// four pairs are the low 6 bits of bytes `j` / `j + 4`; the last four combine a nibble of byte
/// `j + 4` with the top two bits of bytes `j - 4` / `j`.
#[inline]
pub(crate) fn k4_scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

fn q4_k(b: &[u8; 144], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    // Four chunks of 64 elements: 32 bytes each, low nibbles first then high nibbles.
    for c in 0..4 {
        let q = &qs[32 * c..32 * c + 32];
        let (sc1, m1) = k4_scale_min(2 * c, scales);
        let (sc2, m2) = k4_scale_min(2 * c + 1, scales);
        let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
        for l in 0..32 {
            y[64 * c + l] = d1 * (q[l] & 0xF) as f32 - m1;
            y[64 * c + 32 + l] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

fn q5_k(b: &[u8; 176], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    // As Q4_K; the 5th bit of chunk c comes from bits 2c (low nibbles) and 2c+1 (high) of qh.
    for c in 0..4 {
        let q = &qs[32 * c..32 * c + 32];
        let (u1, u2) = (1u8 << (2 * c), 2u8 << (2 * c));
        let (sc1, m1) = k4_scale_min(2 * c, scales);
        let (sc2, m2) = k4_scale_min(2 * c + 1, scales);
        let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
        for l in 0..32 {
            let v1 = (q[l] & 0xF) + if qh[l] & u1 != 0 { 16 } else { 0 };
            let v2 = (q[l] >> 4) + if qh[l] & u2 != 0 { 16 } else { 0 };
            y[64 * c + l] = d1 * v1 as f32 - m1;
            y[64 * c + 32 + l] = d2 * v2 as f32 - m2;
        }
    }
}

fn q6_k(b: &[u8; 210], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 208);
    // Two halves of 128: 64 bytes of ql, 32 of qh and 8 scales each. Output l + 32*k of a half
    // takes nibble (k / 2) of ql[l + 32 * (k % 2)] and bits 2k..2k+2 of qh[l].
    for half in 0..2 {
        let ql = &b[64 * half..64 * half + 64];
        let qh = &b[128 + 32 * half..128 + 32 * half + 32];
        let sc = &b[192 + 8 * half..192 + 8 * half + 8];
        for l in 0..32 {
            let is = l / 16;
            let q = [
                (ql[l] & 0xF) | ((qh[l] & 3) << 4),
                (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4),
                (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
            ];
            for (k, &qk) in q.iter().enumerate() {
                let s = sc[is + 2 * k] as i8;
                y[128 * half + 32 * k + l] = d * s as f32 * (qk as i32 - 32) as f32;
            }
        }
    }
}

fn q8_k(b: &[u8; 292], y: &mut [f32; QK_K]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for j in 0..QK_K {
        y[j] = d * (b[4 + j] as i8) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16b(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_bits().to_le_bytes()
    }

    #[test]
    fn errors_are_one_line_and_name_the_type() {
        let mut out = [0f32; 32];
        let e = dequantize(GgmlType::IQ2_XXS, &[0; 66], &mut [0f32; 256]).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with("tensor type iq2_xxs is not supported (supported: f32"),
            "{msg}"
        );
        assert!(!msg.contains('\n'));
        let e = dequantize(GgmlType::Q4_0, &[0; 17], &mut out)
            .unwrap_err()
            .to_string();
        assert!(e.contains("need 18 bytes"), "{e}");
        let e = dequantize(GgmlType::Q4_0, &[0; 18], &mut out[..31])
            .unwrap_err()
            .to_string();
        assert!(e.contains("block size 32"), "{e}");
        assert!(dequantize(GgmlType::Q8_1, &[0; 36], &mut out).is_err());
        assert!(dequantize(GgmlType::Q4_0, &[], &mut []).is_ok());
    }

    #[test]
    fn hand_computed_small_blocks() {
        // Q4_0: d = 0.5, nibbles 0..15 -> (q - 8) * 0.5.
        let mut b = vec![];
        b.extend_from_slice(&f16b(0.5));
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let mut y = [0f32; 32];
        dequantize(GgmlType::Q4_0, &b, &mut y).unwrap();
        assert_eq!(y[0], -4.0);
        assert_eq!(y[15], 3.5);
        assert_eq!(y[16], 3.5);
        assert_eq!(y[31], -4.0);
        // Q5_1: d = 1, m = -16, element 17 has its 5th bit set and low nibble 1 -> 17 - 16.
        let mut b = vec![];
        b.extend_from_slice(&f16b(1.0));
        b.extend_from_slice(&f16b(-16.0));
        b.extend_from_slice(&(1u32 << 17).to_le_bytes());
        b.extend([0x10u8; 16]);
        dequantize(GgmlType::Q5_1, &b, &mut y).unwrap();
        assert_eq!(y[1], -16.0);
        assert_eq!(y[16], -15.0);
        assert_eq!(y[17], 1.0);
        // Q8_0: d = 2, qs = -128 -> -256.
        let mut b = f16b(2.0).to_vec();
        b.extend([0x80u8; 32]);
        dequantize(GgmlType::Q8_0, &b, &mut y).unwrap();
        assert!(y.iter().all(|&v| v == -256.0));
    }

    #[test]
    fn q4_k_scale_unpacking() {
        // Scale/min 5 (index 5) = low nibble of byte 9 | top bits of byte 1 (scale) / byte 5 (min).
        let mut s = [0u8; 12];
        s[9] = 0x3A; // scale low nibble 0xA, min low nibble 0x3
        s[1] = 0b1100_0000; // scale high bits 3 -> 0x3A
        s[5] = 0b0100_0000; // min high bits 1 -> 0x13
        assert_eq!(k4_scale_min(5, &s), (0x3A, 0x13));
        s[2] = 0x7F; // index 2: low 6 bits only
        s[6] = 0xC1;
        assert_eq!(k4_scale_min(2, &s), (0x3F, 0x01));
    }

    #[test]
    fn q3_k_scale_unpacking() {
        let mut s = [0u8; 12];
        s[1] = 0x5C; // scale 1 low nibble C, scale 9 low nibble 5
        s[9] = 0b1000_0100; // scale 1 high bits (shift 0) = 0, scale 13 (shift 6) = 2, scale 5 = 1
        s[5] = 0x07; // scale 5 low nibble 7
        let sc = q3_k_scales(&s);
        assert_eq!(sc[1], 0x0C - 32);
        assert_eq!(sc[9], 0x05 - 32);
        assert_eq!(sc[5], 0x17 - 32);
        assert_eq!(sc[13], 0x20 - 32);
        assert_eq!(sc[0], -32);
    }
}
