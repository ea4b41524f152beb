//! Scalar reference quantizers.
//!
//! * Activation formats used by the matmul kernels: [`quantize_q8_0`], [`quantize_q8_1`],
//!   [`quantize_q8_k`] — bit-exact with llama.cpp's `quantize_row_q8_0_ref`,
//!   `quantize_row_q8_1_ref` and `quantize_row_q8_K_ref` (ggml-quants.c at 0c1e570). Rounding
//!   matters: Q8_0/Q8_1 use C `roundf` (half away from zero, [`f32::round`]); Q8_K uses
//!   ggml's `nearest_int` (add 1.5 * 2^23 and read the mantissa: half to even).
//! * Weight formats, through [`quantize`]: the non-imatrix reference algorithms
//!   (`quantize_row_*_ref`) for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (the
//!   k-quant searches are in `kquant.rs`), plus F16 (round to nearest even) and BF16 (ggml's
//!   `GGML_FP32_TO_BF16`: NaNs quieted, round to nearest even).
//!
//! Verification (`tests/quant_golden.rs`, goldens from `scripts/gen-quant-golden.py`):
//! every quantizer here except F16/BF16 is bit-exact with llama.cpp's own
//! `quantize_row_*_ref` (its `libggml-base.so` called as an oracle; 8192 blocks of each 32-wide
//! type and 1024 super-blocks of each k-type); Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, BF16 and F16 are
//! also bit-exact with gguf-py 0.19.0 `gguf.quants.quantize`. Deliberate difference: for an
//! all-zero Q8_K block llama.cpp leaves `bsums` unwritten; here they are zeroed.

use super::dequant::f16_at;
use super::kquant;
use super::{GgmlType, QK_K};
use anyhow::{anyhow, bail, Result};
use half::f16;

/// IEEE half bits of `x`, round-to-nearest-even (what `GGML_FP32_TO_FP16` and numpy do).
#[inline]
pub(crate) fn f16_bytes(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_bits().to_le_bytes()
}

/// Round an f32 to the nearest f16 and back (the value a stored scale really has).
#[inline]
pub(crate) fn f16_round(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// ggml's `nearest_int`: round half to even by adding 1.5 * 2^23 and reading the mantissa.
/// Exact for |x| <= 4194303 (callers stay far inside that); garbage-but-no-panic outside.
#[inline]
pub(crate) fn nearest_int(x: f32) -> i32 {
    let v = x + 12582912.0;
    (v.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// C's `MAX(a, b)` macro, `a > b ? a : b` (differs from `f32::max` for NaN).
#[inline]
fn c_max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// ggml's fp32 -> bf16: NaNs are made quiet, everything else rounds to nearest even.
pub(crate) fn bf16_bits(x: f32) -> u16 {
    let u = x.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u as u64 + (0x7fff + ((u >> 16) & 1)) as u64) >> 16) as u16
}

fn check_lengths(ty: GgmlType, x: &[f32], out: &[u8]) -> Result<()> {
    let n = x.len();
    let need = ty.row_bytes(n as u64).ok_or_else(|| {
        anyhow!(
            "{n} elements is not a multiple of the {ty} block size {}",
            ty.block_size()
        )
    })?;
    if out.len() as u64 != need {
        bail!(
            "{ty}: {n} elements quantize to {need} bytes, output buffer has {}",
            out.len()
        );
    }
    Ok(())
}

/// Quantize `x` to `ty` into `out` (which must be exactly `ty.row_bytes(x.len())` bytes).
///
/// Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
/// Q8_K, using llama.cpp's non-imatrix reference algorithms (see the module docs for which are
/// checked bit-exact against which reference). Other types and length mismatches are errors.
pub fn quantize(ty: GgmlType, x: &[f32], out: &mut [u8]) -> Result<()> {
    check_lengths(ty, x, out)?;
    let bs = ty.block_size();
    let ts = ty.type_size();
    let per_block: fn(&[f32], &mut [u8]) = match ty {
        GgmlType::F32 => |x, o| o.copy_from_slice(&x[0].to_le_bytes()),
        GgmlType::F16 => |x, o| o.copy_from_slice(&f16_bytes(x[0])),
        GgmlType::BF16 => |x, o| o.copy_from_slice(&bf16_bits(x[0]).to_le_bytes()),
        GgmlType::Q4_0 => q4_0,
        GgmlType::Q4_1 => q4_1,
        GgmlType::Q5_0 => q5_0,
        GgmlType::Q5_1 => q5_1,
        GgmlType::Q8_0 => q8_0,
        GgmlType::Q8_1 => q8_1,
        GgmlType::Q2_K => kquant::q2_k,
        GgmlType::Q3_K => kquant::q3_k,
        GgmlType::Q4_K => kquant::q4_k,
        GgmlType::Q5_K => kquant::q5_k,
        GgmlType::Q6_K => kquant::q6_k,
        GgmlType::Q8_K => q8_k,
        other => bail!("quantizing to {other} is not supported"),
    };
    for (xb, ob) in x.chunks_exact(bs).zip(out.chunks_exact_mut(ts)) {
        per_block(xb, ob);
    }
    Ok(())
}

fn assert_lengths(ty: GgmlType, x: &[f32], out: &[u8]) {
    if let Err(e) = check_lengths(ty, x, out) {
        panic!("quantize_{}: {e}", ty.name());
    }
}

/// Quantize activations to Q8_0 (`quantize_row_q8_0_ref`, bit-exact).
///
/// # Panics
/// If `x.len()` is not a multiple of 32 or `out.len() != x.len() / 32 * 34` (a caller bug: the
/// kernels size these buffers themselves).
pub fn quantize_q8_0(x: &[f32], out: &mut [u8]) {
    assert_lengths(GgmlType::Q8_0, x, out);
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(34)) {
        q8_0(xb, ob);
    }
}

/// Quantize activations to Q8_1 (`quantize_row_q8_1_ref`, bit-exact): like Q8_0 plus
/// `s = f16(d * sum(q))` at bytes 2..4. Panics like [`quantize_q8_0`] on bad lengths.
pub fn quantize_q8_1(x: &[f32], out: &mut [u8]) {
    assert_lengths(GgmlType::Q8_1, x, out);
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(36)) {
        q8_1(xb, ob);
    }
}

/// Quantize activations to Q8_K (`quantize_row_q8_K_ref`, bit-exact): f32 `d`, 256 int8 and
/// 16 int16 sums of 16 consecutive quants. Panics like [`quantize_q8_0`] on bad lengths.
pub fn quantize_q8_k(x: &[f32], out: &mut [u8]) {
    assert_lengths(GgmlType::Q8_K, x, out);
    for (xb, ob) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(292)) {
        q8_k(xb, ob);
    }
}

/// `(amax, d, 1/d)` of a Q8_0/Q8_1 block: `d = amax / 127`.
fn q8_scale(x: &[f32]) -> (f32, f32) {
    let amax = x.iter().fold(0f32, |a, &v| c_max(a, v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    (d, id)
}

fn q8_0(x: &[f32], o: &mut [u8]) {
    let (d, id) = q8_scale(x);
    o[0..2].copy_from_slice(&f16_bytes(d));
    for (q, &v) in o[2..34].iter_mut().zip(x) {
        *q = (v * id).round() as i8 as u8;
    }
}

fn q8_1(x: &[f32], o: &mut [u8]) {
    let (d, id) = q8_scale(x);
    let mut sum = 0i32;
    for (q, &v) in o[4..36].iter_mut().zip(x) {
        let qi = (v * id).round() as i8;
        sum += qi as i32;
        *q = qi as u8;
    }
    o[0..2].copy_from_slice(&f16_bytes(d));
    o[2..4].copy_from_slice(&f16_bytes(sum as f32 * d));
}

fn q8_k(x: &[f32], o: &mut [u8]) {
    // Signed value with the largest magnitude (first one on ties).
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        o.fill(0);
        return;
    }
    let iscale = -127.0 / max;
    let mut q = [0i8; QK_K];
    for (qi, &v) in q.iter_mut().zip(x) {
        *qi = nearest_int(iscale * v).min(127) as i8;
    }
    o[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    for (b, &qi) in o[4..260].iter_mut().zip(&q) {
        *b = qi as u8;
    }
    for (j, s) in o[260..292].chunks_exact_mut(2).enumerate() {
        let sum: i32 = q[16 * j..16 * j + 16].iter().map(|&v| v as i32).sum();
        s.copy_from_slice(&(sum as i16).to_le_bytes());
    }
}

/// Signed value of largest magnitude (first on ties), as `quantize_row_q4_0_ref` picks it.
fn signed_absmax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// `(min, max)` with C's `v < min` / `v > max` updates from `FLT_MAX` / `-FLT_MAX`.
fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

fn inv(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

fn q4_0(x: &[f32], o: &mut [u8]) {
    let d = signed_absmax(x) / -8.0;
    let id = inv(d);
    o[0..2].copy_from_slice(&f16_bytes(d));
    for j in 0..16 {
        // C: MIN(15, (int8_t)(x*id + 8.5f)); the float->int conversion truncates.
        let a = ((x[j] * id + 8.5) as i8).min(15) as u8;
        let b = ((x[j + 16] * id + 8.5) as i8).min(15) as u8;
        o[2 + j] = a | (b << 4);
    }
}

fn q4_1(x: &[f32], o: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = inv(d);
    o[0..2].copy_from_slice(&f16_bytes(d));
    o[2..4].copy_from_slice(&f16_bytes(min));
    for j in 0..16 {
        let a = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
        let b = (((x[j + 16] - min) * id + 0.5) as i8).min(15) as u8;
        o[4 + j] = a | (b << 4);
    }
}

/// Pack 32 five-bit values as Q5 `qh` (bit j = 5th bit of element j) and `qs` nibbles.
fn pack_q5(q: &[u8; 32], qh: &mut [u8], qs: &mut [u8]) {
    let mut h = 0u32;
    for j in 0..16 {
        qs[j] = (q[j] & 0xF) | ((q[j + 16] & 0xF) << 4);
        h |= (((q[j] & 0x10) >> 4) as u32) << j;
        h |= (((q[j + 16] & 0x10) >> 4) as u32) << (j + 16);
    }
    qh.copy_from_slice(&h.to_le_bytes());
}

fn q5_0(x: &[f32], o: &mut [u8]) {
    let d = signed_absmax(x) / -16.0;
    let id = inv(d);
    o[0..2].copy_from_slice(&f16_bytes(d));
    let mut q = [0u8; 32];
    for (qi, &v) in q.iter_mut().zip(x) {
        *qi = ((v * id + 16.5) as i8).min(31) as u8;
    }
    let (qh, qs) = o[2..22].split_at_mut(4);
    pack_q5(&q, qh, qs);
}

fn q5_1(x: &[f32], o: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = inv(d);
    o[0..2].copy_from_slice(&f16_bytes(d));
    o[2..4].copy_from_slice(&f16_bytes(min));
    let mut q = [0u8; 32];
    for (qi, &v) in q.iter_mut().zip(x) {
        // C stores (uint8_t)(x + 0.5f) unclamped; values never exceed 31.5 -> 31. Clamp anyway
        // (as gguf-py does) so a pathological input cannot set bits outside the 5-bit field.
        *qi = (((v - min) * id + 0.5) as u8).min(31);
    }
    let (qh, qs) = o[4..24].split_at_mut(4);
    pack_q5(&q, qh, qs);
}

/// Dequantize a Q8_1 block (not a storage format, so not part of [`super::dequantize`]); used by
/// tests of the activation quantizer: returns `(values, s)`.
pub fn dequantize_q8_1_block(b: &[u8; 36]) -> ([f32; 32], f32) {
    let d = f16_at(b, 0);
    let s = f16_at(b, 2);
    let mut y = [0f32; 32];
    for (j, v) in y.iter_mut().enumerate() {
        *v = d * (b[4 + j] as i8) as f32;
    }
    (y, s)
}

#[cfg(test)]
mod tests;
