//! Activation quantization: each token row of `x` is converted once per matmul to the weight
//! type's `vec_dot_type`, exactly as ggml's x86 CPU backend does it (bit-exact quants and
//! scales), but stored in vela's own padded layouts that also carry the integer block sums the
//! kernels use to fold the weights' zero offsets into integer arithmetic.

/// A 32-element activation block (ggml `block_q8_0` / `block_q8_1` content).
#[repr(C, align(16))]
#[derive(Clone, Copy)]
pub(crate) struct ActQ8 {
    /// Scale, already rounded through f16 as ggml stores it.
    pub d: f32,
    /// `fp16(d_unrounded * sum(qs))` as f32 (the `s` field of `block_q8_1`).
    pub s: f32,
    /// Σ qs (exact).
    pub sum: i32,
    pub _pad: i32,
    pub qs: [i8; 32],
}

/// A 256-element activation block (ggml `block_q8_K`).
#[repr(C, align(32))]
#[derive(Clone, Copy)]
pub(crate) struct ActQ8K {
    /// Scale (f32, as in ggml).
    pub d: f32,
    pub _pad: [u32; 7],
    /// Σ of each group of 16 quants.
    pub bsums: [i16; 16],
    pub qs: [i8; 256],
}

/// How activations are stored for a weight type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ActKind {
    Q8,
    Q8K,
    /// f32 values (already rounded to f16 / bf16 when the weight type asks for it).
    F32,
    F16,
    Bf16,
}

impl ActKind {
    /// Bytes of one activation row of `cols` elements.
    pub fn row_bytes(self, cols: usize) -> usize {
        match self {
            ActKind::Q8 => cols / 32 * std::mem::size_of::<ActQ8>(),
            ActKind::Q8K => cols / 256 * std::mem::size_of::<ActQ8K>(),
            ActKind::F32 | ActKind::F16 | ActKind::Bf16 => cols * 4,
        }
    }
}

/// IEEE half → f32 (exact, including subnormals, inf and NaN).
#[inline(always)]
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let em = (h as u32) & 0x7fff;
    let bits = if em >= 0x7c00 {
        (em << 13) | 0x7f80_0000
    } else if em >= 0x0400 {
        (em << 13) + 0x3800_0000
    } else {
        // Subnormal: em * 2^-24 is exact in f32.
        (em as f32 * (1.0 / 16_777_216.0)).to_bits()
    };
    f32::from_bits(sign | bits)
}

/// f32 → IEEE half with round-to-nearest-even (what F16C `vcvtps2ph` with imm 0 does).
#[inline]
pub(crate) fn f32_to_f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

/// f32 → bf16 bits with ggml's rounding (nearest-even, NaN forced quiet).
#[inline]
pub(crate) fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

/// Quantize one row to 32-element blocks like ggml's AVX2 `quantize_row_q8_0/q8_1`:
/// `d = amax/127`, multiplier `127/amax` (not `1/d`), round half to even.
#[inline(always)]
pub(crate) fn quantize_q8(x: &[f32], out: &mut [ActQ8]) {
    for (xb, o) in x.chunks_exact(32).zip(out.iter_mut()) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in o.qs.iter_mut().zip(xb) {
            let r = (v * id).round_ties_even() as i32;
            *q = r as i8;
            sum += r;
        }
        o.d = f16_to_f32(f32_to_f16(d));
        o.s = f16_to_f32(f32_to_f16(d * sum as f32));
        o.sum = sum;
        o._pad = 0;
    }
}

/// Quantize one row to 256-element blocks exactly like ggml's `quantize_row_q8_K_ref`
/// (scale from the signed value of largest magnitude, `-127/max`, round half to even).
#[inline(always)]
pub(crate) fn quantize_q8k(x: &[f32], out: &mut [ActQ8K]) {
    for (xb, o) in x.chunks_exact(256).zip(out.iter_mut()) {
        let mut amax = 0f32;
        let mut max = 0f32;
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        o._pad = [0; 7];
        if amax == 0.0 {
            o.d = 0.0;
            o.qs = [0; 256];
            o.bsums = [0; 16];
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in o.qs.iter_mut().zip(xb) {
            *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
        }
        for (g, b) in o.bsums.iter_mut().enumerate() {
            *b = o.qs[g * 16..g * 16 + 16].iter().map(|&q| q as i16).sum();
        }
        o.d = 1.0 / iscale;
    }
}

/// Write one activation row in `kind`'s layout into `out` (which has `kind.row_bytes(x.len())`
/// bytes, aligned for the layout's block type).
#[inline(always)]
pub(crate) fn quantize_row(kind: ActKind, x: &[f32], out: &mut [u8]) {
    debug_assert_eq!(out.len(), kind.row_bytes(x.len()));
    // SAFETY (all arms): `out` is aligned for the block type and exactly long enough for the blocks of
    // `x`; every bit pattern is a valid value of these plain-old-data types.
    match kind {
        ActKind::Q8 => {
            assert_eq!(out.as_ptr() as usize % std::mem::align_of::<ActQ8>(), 0);
            let o = unsafe {
                std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut ActQ8, x.len() / 32)
            };
            quantize_q8(x, o);
        }
        ActKind::Q8K => {
            assert_eq!(out.as_ptr() as usize % std::mem::align_of::<ActQ8K>(), 0);
            let o = unsafe {
                std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut ActQ8K, x.len() / 256)
            };
            quantize_q8k(x, o);
        }
        ActKind::F32 | ActKind::F16 | ActKind::Bf16 => {
            assert_eq!(out.as_ptr() as usize % 4, 0);
            let o =
                unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut f32, x.len()) };
            match kind {
                ActKind::F16 => o
                    .iter_mut()
                    .zip(x)
                    .for_each(|(o, &v)| *o = f16_to_f32(f32_to_f16(v))),
                ActKind::Bf16 => o
                    .iter_mut()
                    .zip(x)
                    .for_each(|(o, &v)| *o = f32::from_bits((f32_to_bf16(v) as u32) << 16)),
                _ => o.copy_from_slice(x),
            }
        }
    }
}
