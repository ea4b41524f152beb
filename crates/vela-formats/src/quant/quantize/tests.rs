use super::*;
use crate::quant::dequantize;

/// Deterministic pseudo-random data: sum of uniforms (roughly Gaussian) with occasional
/// outliers, like real weights.
fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..n)
        .map(|_| {
            let g = (0..4).map(|_| next()).sum::<f32>() - 2.0;
            if next() < 0.01 {
                g * 8.0
            } else {
                g * 0.05
            }
        })
        .collect()
}

fn round_trip(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    let mut q = vec![0u8; ty.row_bytes(x.len() as u64).unwrap() as usize];
    quantize(ty, x, &mut q).unwrap();
    let mut y = vec![0f32; x.len()];
    dequantize(ty, &q, &mut y).unwrap();
    y
}

/// Relative RMS error of the round trip, per block of `bs` (worst block).
fn worst_rel_rmse(x: &[f32], y: &[f32], bs: usize) -> f32 {
    x.chunks(bs)
        .zip(y.chunks(bs))
        .map(|(a, b)| {
            let e: f32 = a.iter().zip(b).map(|(p, q)| (p - q) * (p - q)).sum();
            let s: f32 = a.iter().map(|p| p * p).sum();
            (e / s).sqrt()
        })
        .fold(0.0, f32::max)
}

#[test]
fn round_trip_error_bounds() {
    // (type, bound on the worst block's relative RMS error). Measured values (blocks with an
    // outlier dominate) are about 70% of these; a mis-packed nibble or wrong scale gives errors
    // near or above 1.
    let cases = [
        (GgmlType::F32, 0.0),
        (GgmlType::F16, 1e-3),
        (GgmlType::BF16, 5e-3),
        (GgmlType::Q8_0, 0.02),
        (GgmlType::Q8_K, 0.05),
        (GgmlType::Q6_K, 0.055),
        (GgmlType::Q5_0, 0.13),
        (GgmlType::Q5_1, 0.13),
        (GgmlType::Q5_K, 0.09),
        (GgmlType::Q4_0, 0.28),
        (GgmlType::Q4_1, 0.3),
        (GgmlType::Q4_K, 0.13),
        (GgmlType::Q3_K, 0.26),
        (GgmlType::Q2_K, 0.38),
    ];
    let x = data(4096, 7);
    let mut bad = vec![];
    for (ty, bound) in cases {
        let y = round_trip(ty, &x);
        let bs = ty.block_size().max(32);
        let err = worst_rel_rmse(&x, &y, bs);
        eprintln!("{ty}: worst block relative rmse {err:.5}");
        bad.push((ty, err, bound));
    }
    bad.retain(|&(_, e, b)| e > b);
    assert!(bad.is_empty(), "{bad:?}");
}

#[test]
fn per_element_bounds_of_the_simple_formats() {
    let x = data(2048, 11);
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q4_1,
        GgmlType::Q5_1,
    ] {
        let y = round_trip(ty, &x);
        for (xb, yb) in x.chunks(32).zip(y.chunks(32)) {
            let (min, max) = xb
                .iter()
                .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
            let amax = min.abs().max(max.abs());
            // One quantization step, plus slack for the f16 rounding of the scale / min.
            let step = match ty {
                GgmlType::Q8_0 => amax / 127.0 * 0.5,
                GgmlType::Q4_0 => amax / 8.0,
                GgmlType::Q5_0 => amax / 16.0,
                GgmlType::Q4_1 => (max - min) / 15.0 * 0.5,
                _ => (max - min) / 31.0 * 0.5,
            };
            let tol = step * 1.02 + amax * 2e-3;
            for (a, b) in xb.iter().zip(yb) {
                assert!((a - b).abs() <= tol, "{ty}: {a} -> {b} (tol {tol})");
            }
        }
    }
}

#[test]
fn zeros_stay_zero() {
    let x = vec![0f32; 512];
    for ty in crate::quant::SUPPORTED_TYPES {
        let y = round_trip(ty, &x);
        assert!(y.iter().all(|&v| v == 0.0), "{ty}");
    }
}

#[test]
fn q8_0_hand_computed() {
    let mut x = [0f32; 32];
    x[0] = 127.0; // sets d = 1
    x[1] = 63.5; // roundf: half away from zero -> 64
    x[2] = -63.5; // -> -64
    x[3] = 62.5; // -> 63 (nearest_int would give 62)
    x[4] = 0.49;
    let mut o = [0u8; 34];
    quantize_q8_0(&x, &mut o);
    assert_eq!(&o[0..2], &f16::from_f32(1.0).to_bits().to_le_bytes());
    assert_eq!(
        o[2..7].iter().map(|&b| b as i8).collect::<Vec<_>>(),
        [127, 64, -64, 63, 0]
    );
    assert!(o[7..].iter().all(|&b| b == 0));
}

#[test]
fn q8_1_hand_computed() {
    let mut x = [0f32; 32];
    x[0] = -254.0; // d = 2
    x[17] = 101.0; // 50.5 -> 51
    x[31] = 3.0; // 1.5 -> 2
    let mut o = [0u8; 36];
    quantize_q8_1(&x, &mut o);
    let (y, s) = dequantize_q8_1_block(&o);
    assert_eq!(f16_at(&o, 0), 2.0);
    assert_eq!(o[4] as i8, -127);
    assert_eq!(o[4 + 17] as i8, 51);
    assert_eq!(o[4 + 31] as i8, 2);
    // s = d * sum(q) = 2 * (-127 + 51 + 2)
    assert_eq!(s, -148.0);
    assert_eq!(y[17], 102.0);
}

#[test]
fn q8_k_hand_computed() {
    let mut x = [0f32; QK_K];
    x[0] = -254.0; // max (signed) -> iscale = -127 / -254 = 0.5, d = 2
    x[1] = 125.0; // 62.5 -> 62 (ties to even)
    x[2] = 127.0; // 63.5 -> 64
    x[16] = -3.0; // -1.5 -> -2
    x[255] = 1.0; // 0.5 -> 0
    let mut o = [0u8; 292];
    quantize_q8_k(&x, &mut o);
    assert_eq!(f32::from_le_bytes(o[0..4].try_into().unwrap()), 2.0);
    let q = |i: usize| o[4 + i] as i8;
    assert_eq!([q(0), q(1), q(2), q(16), q(255)], [-127, 62, 64, -2, 0]);
    let bsum = |j: usize| i16::from_le_bytes([o[260 + 2 * j], o[261 + 2 * j]]);
    assert_eq!(bsum(0), -127 + 62 + 64);
    assert_eq!(bsum(1), -2);
    assert_eq!(bsum(15), 0);
    let mut y = [0f32; QK_K];
    dequantize(GgmlType::Q8_K, &o, &mut y).unwrap();
    assert_eq!(y[2], 128.0);
}

#[test]
fn q8_k_negative_max_sign() {
    // A positive maximum gives a negative iscale, so d stays positive with the sign in qs.
    let mut x = [0f32; QK_K];
    x[5] = 127.0; // iscale = -1
    x[6] = -63.5;
    let mut o = [0u8; 292];
    quantize_q8_k(&x, &mut o);
    let d = f32::from_le_bytes(o[0..4].try_into().unwrap());
    assert!(d < 0.0, "d = 1/iscale with iscale = -127/max: {d}");
    assert_eq!(o[4 + 5] as i8, -127);
    assert_eq!(o[4 + 6] as i8, 64); // 63.5 -> 64 (even)
}

#[test]
fn nearest_int_is_round_half_even() {
    assert_eq!(
        [0.5, 1.5, 2.5, -0.5, -1.5, 2.4999, 3.7].map(nearest_int),
        [0, 2, 2, 0, -2, 2, 4]
    );
}

#[test]
fn bf16_rounding_and_nan() {
    assert_eq!(bf16_bits(1.0), 0x3F80);
    // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (down).
    assert_eq!(bf16_bits(1.0 + 1.0 / 256.0), 0x3F80);
    assert_eq!(bf16_bits(1.0 + 3.0 / 256.0), 0x3F82);
    // A signalling NaN becomes quiet.
    assert_eq!(bf16_bits(f32::from_bits(0x7F80_0001)), 0x7FC0);
}

#[test]
fn quantize_errors() {
    let x = [0f32; 32];
    let e = quantize(GgmlType::IQ4_NL, &x, &mut [0u8; 18])
        .unwrap_err()
        .to_string();
    assert!(e.contains("iq4_nl"), "{e}");
    let e = quantize(GgmlType::Q4_0, &x, &mut [0u8; 17])
        .unwrap_err()
        .to_string();
    assert!(e.contains("18 bytes"), "{e}");
    let e = quantize(GgmlType::Q4_K, &x, &mut [0u8; 144])
        .unwrap_err()
        .to_string();
    assert!(e.contains("block size 256"), "{e}");
}

#[test]
#[should_panic(expected = "quantize_q8_0")]
fn q8_length_mismatch_panics() {
    quantize_q8_0(&[0.0; 32], &mut [0u8; 33]);
}
