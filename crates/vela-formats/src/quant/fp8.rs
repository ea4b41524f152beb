//! The microscaled formats of DeepSeek V4's released checkpoint (docs/deepseekv4-spec.md §10),
//! decoded exactly into types the backends multiply:
//!
//! - **FP8**: e4m3 (`float8_e4m3fn`: no infinities, `S.1111.111` is NaN) with one e8m0 scale (a
//!   bare exponent, `2^(s − 127)`) per 128×128 block, the grid ceil-sized. Every value has at
//!   most 4 significant bits and a power-of-two scale, so BF16 holds it exactly.
//! - **MXFP4**: e2m1 nibbles (sign bit 3; magnitudes 0, ½, 1, 1½, 2, 3, 4, 6), two per byte
//!   (column 2j in the low nibble), one e8m0 scale per 32 consecutive columns. Doubled, the
//!   magnitudes are the integers 0..12, so a Q8_0 block (int8 × an f16 scale of `2^(s − 128)`)
//!   holds each 32-column block exactly whenever that scale is an f16 number.

use anyhow::{bail, Result};
use half::f16;

/// The value of an e4m3fn byte.
pub fn e4m3(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = ((b >> 3) & 0xF, b & 0x7);
    if e == 0xF && m == 0x7 {
        return f32::NAN;
    }
    let mag = if e == 0 {
        m as f32 / 8.0 * pow2(-6)
    } else {
        (1.0 + m as f32 / 8.0) * pow2(e as i32 - 7)
    };
    sign * mag
}

/// The value of an e8m0 scale byte, `2^(b − 127)` (255 is NaN).
pub fn e8m0(b: u8) -> f32 {
    if b == 255 {
        f32::NAN
    } else {
        pow2(b as i32 - 127)
    }
}

/// `2^e` exactly, subnormals included (`powi` goes through `2^−e` and loses `e ≤ −128`).
fn pow2(e: i32) -> f32 {
    if e >= -126 {
        f32::from_bits(((e + 127) as u32) << 23)
    } else if e >= -149 {
        f32::from_bits(1u32 << (e + 149))
    } else {
        0.0
    }
}

/// e2m1 magnitudes doubled (integers), by the nibble's low 3 bits.
const FP4_X2: [i8; 8] = [0, 1, 2, 3, 4, 6, 8, 12];

/// FP8 `q` (`rows × cols` e4m3 bytes) with e8m0 block scales `scale` (`⌈rows/128⌉ ×
/// ⌈cols/128⌉`) as f32, exactly.
pub fn dequant_fp8(q: &[u8], rows: usize, cols: usize, scale: &[u8]) -> Result<Vec<f32>> {
    const B: usize = 128;
    let (sr, sc) = (rows.div_ceil(B), cols.div_ceil(B));
    if q.len() != rows * cols || scale.len() != sr * sc {
        bail!(
            "FP8 tensor of {} bytes with {} scales for [{rows}, {cols}] (expected {} and {sr}×{sc})",
            q.len(),
            scale.len(),
            rows * cols
        );
    }
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        for c in 0..cols {
            out.push(e4m3(q[r * cols + c]) * e8m0(scale[(r / B) * sc + c / B]));
        }
    }
    if out.iter().any(|x| x.is_nan()) {
        bail!("FP8 tensor holds NaN codes");
    }
    Ok(out)
}

/// MXFP4 `q` (`rows × cols/2` bytes) with e8m0 scales (`rows × cols/32`) as Q8_0 rows (34-byte
/// blocks), exactly; `None` when a block's scale is no f16 number (the caller then decodes to
/// f32 with [`dequant_mxfp4`]).
pub fn mxfp4_to_q8_0(q: &[u8], rows: usize, cols: usize, scale: &[u8]) -> Result<Option<Vec<u8>>> {
    check_mxfp4(q, rows, cols, scale)?;
    let mut out = vec![0u8; rows * cols / 32 * 34];
    for (bi, blk) in out.chunks_exact_mut(34).enumerate() {
        let s = scale[bi];
        if s == 255 {
            bail!("MXFP4 tensor holds a NaN scale");
        }
        let d = pow2(s as i32 - 128);
        let h = f16::from_f32(d);
        if h.to_f32() != d {
            return Ok(None);
        }
        blk[..2].copy_from_slice(&h.to_le_bytes());
        let src = &q[bi * 16..bi * 16 + 16];
        for (j, &b) in src.iter().enumerate() {
            for (k, nib) in [b & 0xF, b >> 4].into_iter().enumerate() {
                let v = FP4_X2[(nib & 7) as usize];
                blk[2 + 2 * j + k] = (if nib & 8 != 0 { -v } else { v }) as u8;
            }
        }
    }
    Ok(Some(out))
}

/// MXFP4 as f32 (see [`mxfp4_to_q8_0`]).
pub fn dequant_mxfp4(q: &[u8], rows: usize, cols: usize, scale: &[u8]) -> Result<Vec<f32>> {
    check_mxfp4(q, rows, cols, scale)?;
    let mut out = Vec::with_capacity(rows * cols);
    for (i, &b) in q.iter().enumerate() {
        let s = e8m0(scale[i / 16]) / 2.0;
        for nib in [b & 0xF, b >> 4] {
            let v = FP4_X2[(nib & 7) as usize] as f32 * s;
            out.push(if nib & 8 != 0 { -v } else { v });
        }
    }
    Ok(out)
}

/// GGML's MXFP4 blocks (17 bytes: the e8m0 scale, then 16 bytes holding element `j` in the low
/// nibble and `j + 16` in the high one; llama.cpp `dequantize_row_mxfp4`) as Q8_0 blocks, exactly:
/// the e2m1 codes doubled are the int8 values, the scale 2^(e−128) the f16 `d`. `None` when a
/// block's scale is no f16 number (the caller then decodes to f32 with [`dequant_ggml_mxfp4`]).
pub fn ggml_mxfp4_to_q8_0(blocks: &[u8]) -> Result<Option<Vec<u8>>> {
    if !blocks.len().is_multiple_of(17) {
        bail!(
            "MXFP4 data of {} bytes is not whole 17-byte blocks",
            blocks.len()
        );
    }
    let mut out = vec![0u8; blocks.len() / 17 * 34];
    for (src, blk) in blocks.chunks_exact(17).zip(out.chunks_exact_mut(34)) {
        if src[0] == 255 {
            bail!("MXFP4 tensor holds a NaN scale");
        }
        let d = pow2(src[0] as i32 - 128);
        let h = f16::from_f32(d);
        if h.to_f32() != d {
            return Ok(None);
        }
        blk[..2].copy_from_slice(&h.to_le_bytes());
        for (j, &b) in src[1..].iter().enumerate() {
            for (k, nib) in [b & 0xF, b >> 4].into_iter().enumerate() {
                let v = FP4_X2[(nib & 7) as usize];
                blk[2 + j + 16 * k] = (if nib & 8 != 0 { -v } else { v }) as u8;
            }
        }
    }
    Ok(Some(out))
}

/// GGML's MXFP4 blocks as f32 (see [`ggml_mxfp4_to_q8_0`]).
pub fn dequant_ggml_mxfp4(blocks: &[u8]) -> Result<Vec<f32>> {
    if !blocks.len().is_multiple_of(17) {
        bail!(
            "MXFP4 data of {} bytes is not whole 17-byte blocks",
            blocks.len()
        );
    }
    let mut out = vec![0f32; blocks.len() / 17 * 32];
    for (src, y) in blocks.chunks_exact(17).zip(out.chunks_exact_mut(32)) {
        let s = e8m0(src[0]) / 2.0;
        for (j, &b) in src[1..].iter().enumerate() {
            for (k, nib) in [b & 0xF, b >> 4].into_iter().enumerate() {
                let v = FP4_X2[(nib & 7) as usize] as f32 * s;
                y[j + 16 * k] = if nib & 8 != 0 { -v } else { v };
            }
        }
    }
    Ok(out)
}

fn check_mxfp4(q: &[u8], rows: usize, cols: usize, scale: &[u8]) -> Result<()> {
    if !cols.is_multiple_of(32) || q.len() != rows * cols / 2 || scale.len() != rows * cols / 32 {
        bail!(
            "MXFP4 tensor of {} bytes with {} scales for [{rows}, {cols}] (expected {} and {})",
            q.len(),
            scale.len(),
            rows * cols / 2,
            rows * cols / 32
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ggml_mxfp4_blocks_as_q8_0_and_f32() {
        // Scale byte 127 (d = 2^-1: the doubled codes times ½); element 0 = +1 (code 2),
        // element 16 = −6 (code 0xF), element 5 = +0.5 (code 1), element 21 = −0 (code 8).
        let mut b = [0u8; 17];
        b[0] = 127;
        b[1] = 0xF2;
        b[6] = 0x81;
        let f = dequant_ggml_mxfp4(&b).unwrap();
        assert_eq!((f[0], f[16], f[5], f[21]), (1.0, -6.0, 0.5, -0.0));
        let q = ggml_mxfp4_to_q8_0(&b).unwrap().unwrap();
        let mut back = [0f32; 32];
        crate::quant::dequantize(crate::quant::GgmlType::Q8_0, &q, &mut back).unwrap();
        for (x, y) in back.iter().zip(&f) {
            assert_eq!(x, y);
        }
        // A scale outside f16: no Q8_0 form.
        b[0] = 250;
        assert!(ggml_mxfp4_to_q8_0(&b).unwrap().is_none());
        assert!(ggml_mxfp4_to_q8_0(&b[..16]).is_err());
    }

    #[test]
    fn e4m3_codes() {
        assert_eq!(e4m3(0x7E), 448.0);
        assert_eq!(e4m3(0xFE), -448.0);
        assert_eq!(e4m3(0x01), 2f32.powi(-9));
        assert_eq!(e4m3(0x08), 2f32.powi(-6));
        assert_eq!(e4m3(0x38), 1.0);
        assert_eq!(e4m3(0x39), 1.125);
        assert!(e4m3(0x7F).is_nan() && e4m3(0xFF).is_nan());
        assert_eq!(e4m3(0x80), 0.0);
        // Every finite code is a BF16 number (at most 4 significant bits).
        for b in 0..=255u8 {
            let v = e4m3(b);
            if v.is_finite() {
                assert_eq!(half::bf16::from_f32(v).to_f32(), v, "{b:#x}");
            }
        }
        assert_eq!(e8m0(127), 1.0);
        assert_eq!(e8m0(120), 2f32.powi(-7));
    }

    #[test]
    fn fp8_blocks_scale_their_own_tiles() {
        // 130 × 3: two row blocks.
        let (rows, cols) = (130, 3);
        let q = vec![0x38u8; rows * cols]; // 1.0
        let d = dequant_fp8(&q, rows, cols, &[127, 129]).unwrap();
        assert_eq!(d[0], 1.0);
        assert_eq!(d[127 * cols], 1.0);
        assert_eq!(d[128 * cols], 4.0);
        assert!(dequant_fp8(&q, rows, cols, &[127]).is_err());
    }

    #[test]
    fn mxfp4_as_q8_0_is_exact() {
        let (rows, cols) = (3, 64);
        let q: Vec<u8> = (0..rows * cols / 2).map(|i| (i * 37 + 11) as u8).collect();
        let scale: Vec<u8> = (0..rows * cols / 32).map(|i| 120 + i as u8).collect();
        let want = dequant_mxfp4(&q, rows, cols, &scale).unwrap();
        let blocks = mxfp4_to_q8_0(&q, rows, cols, &scale).unwrap().unwrap();
        let mut got = vec![0f32; rows * cols];
        crate::quant::dequantize(crate::quant::GgmlType::Q8_0, &blocks, &mut got).unwrap();
        assert_eq!(got, want);
        // Low nibble first: byte 0x21 is (1 → ½·s, 2 → 1·s).
        let one = dequant_mxfp4(&[0x21; 16], 1, 32, &[127]).unwrap();
        assert_eq!((one[0], one[1]), (0.5, 1.0));
        // A scale beyond f16: no Q8_0, the f32 path still decodes.
        assert!(mxfp4_to_q8_0(&[0x21; 16], 1, 32, &[10]).unwrap().is_none());
        // The smallest scales are subnormal, not zero (found by fuzzing: `powi` flushed
        // 2^−128 to 0, and Q8_0 then took the block as exact zeros).
        assert_eq!(e8m0(0), f32::from_bits(1 << 22));
        assert!(mxfp4_to_q8_0(&[0x21; 16], 1, 32, &[0]).unwrap().is_none());
        let tiny = dequant_mxfp4(&[0x21; 16], 1, 32, &[0]).unwrap();
        assert_eq!(
            (tiny[0], tiny[1]),
            (f32::from_bits(1 << 21), f32::from_bits(1 << 22))
        );
        for e in -149..=127 {
            assert_eq!(pow2(e) as f64, 2f64.powi(e), "2^{e}");
        }
    }
}
