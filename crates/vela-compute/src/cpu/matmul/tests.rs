//! Kernel tests: every supported type × every kernel family available on this CPU against an
//! f64 reference built from independently written (ggml-literal) dequantizers and the
//! *quantized* activations, SIMD paths against the scalar path, thread-count invariance, and
//! real GGUF tensors.

use super::act::{self, f16_to_f32, ActKind, ActQ8, ActQ8K};
use super::*;
use vela_formats::quant::GgmlType as G;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // SplitMix64.
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

fn h(v: f32) -> [u8; 2] {
    act::f32_to_f16(v).to_le_bytes()
}

/// Offsets of the f16 scale fields that must hold sane values (the rest is random bits).
fn f16_fields(ty: G) -> &'static [usize] {
    match ty {
        G::Q4_0 | G::Q5_0 | G::Q8_0 => &[0],
        G::Q4_1 | G::Q5_1 | G::Q4_K | G::Q5_K => &[0, 2],
        G::Q2_K => &[80, 82],
        G::Q3_K => &[108],
        G::Q6_K => &[208],
        _ => &[],
    }
}

/// Random weights: random bits with sane f16 scales (or random floats for float types).
fn random_weights(rng: &mut Rng, ty: G, rows: usize, cols: usize) -> Vec<u8> {
    let rb = ty.row_bytes(cols as u64).unwrap() as usize;
    let mut data: Vec<u8> = (0..rows * rb).map(|_| rng.next() as u8).collect();
    let (bs, ts) = (ty.block_size(), ty.type_size());
    match ty {
        G::F32 => {
            for c in data.chunks_exact_mut(4) {
                c.copy_from_slice(&rng.f().to_le_bytes());
            }
        }
        G::F16 => {
            for c in data.chunks_exact_mut(2) {
                c.copy_from_slice(&h(rng.f()));
            }
        }
        G::BF16 => {
            for c in data.chunks_exact_mut(2) {
                c.copy_from_slice(&act::f32_to_bf16(rng.f()).to_le_bytes());
            }
        }
        _ => {
            for blk in data.chunks_exact_mut(ts) {
                for &o in f16_fields(ty) {
                    let scale = if bs == 256 { 0.002 } else { 0.02 };
                    blk[o..o + 2].copy_from_slice(&h(scale * (0.2 + rng.f().abs())));
                }
            }
        }
    }
    data
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[i], b[i + 1]]))
}

fn k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Dequantize one block, written after ggml's `dequantize_row_*` loops.
fn dequant_block(ty: G, b: &[u8], y: &mut Vec<f64>) {
    match ty {
        G::Q4_0 | G::Q4_1 => {
            let (d, m, qs) = if ty == G::Q4_0 {
                (f16_at(b, 0), -8.0 * f16_at(b, 0), &b[2..18])
            } else {
                (f16_at(b, 0), f16_at(b, 2), &b[4..20])
            };
            let mut out = [0f64; 32];
            for j in 0..16 {
                out[j] = (d * (qs[j] & 15) as f32) as f64 + m as f64;
                out[j + 16] = (d * (qs[j] >> 4) as f32) as f64 + m as f64;
            }
            y.extend_from_slice(&out);
        }
        G::Q5_0 | G::Q5_1 => {
            let d = f16_at(b, 0) as f64;
            let (m, qh, qs) = if ty == G::Q5_0 {
                (-16.0 * d, &b[2..6], &b[6..22])
            } else {
                (f16_at(b, 2) as f64, &b[4..8], &b[8..24])
            };
            let qh = u32::from_le_bytes(qh.try_into().unwrap());
            let mut out = [0f64; 32];
            for j in 0..16 {
                let xh0 = ((qh >> j) << 4) & 0x10;
                let xh1 = (qh >> (j + 12)) & 0x10;
                out[j] = d * (((qs[j] & 15) as u32 | xh0) as f64) + m;
                out[j + 16] = d * (((qs[j] >> 4) as u32 | xh1) as f64) + m;
            }
            y.extend_from_slice(&out);
        }
        G::Q8_0 => {
            let d = f16_at(b, 0) as f64;
            y.extend(b[2..34].iter().map(|&q| d * (q as i8) as f64));
        }
        G::Q4_K | G::Q5_K => {
            let (d, dmin) = (f16_at(b, 0) as f64, f16_at(b, 2) as f64);
            let sc = &b[4..16];
            let (qh, qs) = if ty == G::Q5_K {
                (&b[16..48], &b[48..176])
            } else {
                (&b[0..0], &b[16..144])
            };
            for j in 0..4 {
                let (s1, m1) = k4(2 * j, sc);
                let (s2, m2) = k4(2 * j + 1, sc);
                for l in 0..32 {
                    let hb = if ty == G::Q5_K {
                        ((qh[l] >> (2 * j)) & 1) * 16
                    } else {
                        0
                    };
                    y.push(d * s1 as f64 * ((qs[32 * j + l] & 15) + hb) as f64 - dmin * m1 as f64);
                }
                for l in 0..32 {
                    let hb = if ty == G::Q5_K {
                        ((qh[l] >> (2 * j + 1)) & 1) * 16
                    } else {
                        0
                    };
                    y.push(d * s2 as f64 * ((qs[32 * j + l] >> 4) + hb) as f64 - dmin * m2 as f64);
                }
            }
        }
        G::Q6_K => {
            let d = f16_at(b, 208) as f64;
            let mut out = [0f64; 256];
            for n in 0..2 {
                let (ql, qh, sc) = (&b[64 * n..], &b[128 + 32 * n..], &b[192 + 8 * n..]);
                for l in 0..32 {
                    let is = l / 16;
                    let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                    let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                    let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                    let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                    let s = |k: usize| sc[is + k] as i8 as f64;
                    out[128 * n + l] = d * s(0) * q1 as f64;
                    out[128 * n + l + 32] = d * s(2) * q2 as f64;
                    out[128 * n + l + 64] = d * s(4) * q3 as f64;
                    out[128 * n + l + 96] = d * s(6) * q4 as f64;
                }
            }
            y.extend_from_slice(&out);
        }
        G::Q2_K => {
            let (d, dmin) = (f16_at(b, 80) as f64, f16_at(b, 82) as f64);
            let mut is = 0;
            for n in 0..2 {
                let q = &b[16 + 32 * n..];
                for shift in [0, 2, 4, 6] {
                    for half in 0..2 {
                        let sc = b[is];
                        is += 1;
                        let (dl, ml) = (d * (sc & 15) as f64, dmin * (sc >> 4) as f64);
                        for l in 0..16 {
                            y.push(dl * ((q[16 * half + l] >> shift) & 3) as f64 - ml);
                        }
                    }
                }
            }
        }
        G::Q3_K => {
            let d = f16_at(b, 108) as f64;
            let mut aux = [0u32; 4];
            for (i, a) in aux.iter_mut().take(3).enumerate() {
                *a = u32::from_le_bytes(b[96 + 4 * i..100 + 4 * i].try_into().unwrap());
            }
            let (k1, k2, tmp) = (0x0303_0303u32, 0x0f0f_0f0fu32, aux[2]);
            aux[2] = ((aux[0] >> 4) & k2) | (((tmp >> 4) & k1) << 4);
            aux[3] = ((aux[1] >> 4) & k2) | (((tmp >> 6) & k1) << 4);
            aux[0] = (aux[0] & k2) | ((tmp & k1) << 4);
            aux[1] = (aux[1] & k2) | (((tmp >> 2) & k1) << 4);
            let scales: Vec<i8> = aux
                .iter()
                .flat_map(|a| a.to_le_bytes())
                .map(|v| v as i8)
                .collect();
            let hm = &b[0..32];
            let (mut m, mut is) = (1u8, 0);
            for n in 0..2 {
                let q = &b[32 + 32 * n..];
                for shift in [0, 2, 4, 6] {
                    for half in 0..2 {
                        let dl = d * (scales[is] as i32 - 32) as f64;
                        is += 1;
                        for l in 16 * half..16 * half + 16 {
                            let v =
                                ((q[l] >> shift) & 3) as i32 - if hm[l] & m != 0 { 0 } else { 4 };
                            y.push(dl * v as f64);
                        }
                    }
                    m <<= 1;
                }
            }
        }
        _ => unreachable!(),
    }
}

fn dequant_rows(ty: G, data: &[u8], rows: usize, cols: usize) -> Vec<f64> {
    let mut y = Vec::with_capacity(rows * cols);
    match ty {
        G::F32 => y.extend(
            data.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64),
        ),
        G::F16 => y.extend(data.chunks_exact(2).map(|c| f16_at(c, 0) as f64)),
        G::BF16 => y.extend(
            data.chunks_exact(2)
                .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16) as f64),
        ),
        _ => data
            .chunks_exact(ty.type_size())
            .take(rows * cols / ty.block_size())
            .for_each(|b| dequant_block(ty, b, &mut y)),
    }
    y.truncate(rows * cols);
    y
}

/// The activations as the kernels see them, dequantized, plus per-32-block `s - d*Σq` for the
/// Q8_1 min correction.
fn quantized_acts(ty: G, x: &[f32], cols: usize) -> (Vec<f64>, Vec<f64>) {
    let kind = act_kind(ty).unwrap();
    let xrow = kind.row_bytes(cols);
    let mut lines = vec![Line([0; 64]); xrow.div_ceil(64)];
    let (mut vals, mut scorr) = (Vec::new(), Vec::new());
    for row in x.chunks_exact(cols) {
        let buf = unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr() as *mut u8, xrow) };
        act::quantize_row(kind, row, buf);
        match kind {
            ActKind::Q8 => {
                let b =
                    unsafe { std::slice::from_raw_parts(buf.as_ptr() as *const ActQ8, cols / 32) };
                for blk in b {
                    vals.extend(blk.qs.iter().map(|&q| blk.d as f64 * q as f64));
                    let sum: i32 = blk.qs.iter().map(|&q| q as i32).sum();
                    assert_eq!(sum, blk.sum);
                    scorr.push(blk.s as f64 - blk.d as f64 * sum as f64);
                }
            }
            ActKind::Q8K => {
                let b = unsafe {
                    std::slice::from_raw_parts(buf.as_ptr() as *const ActQ8K, cols / 256)
                };
                for blk in b {
                    vals.extend(blk.qs.iter().map(|&q| blk.d as f64 * q as f64));
                    for g in 0..16 {
                        let s: i32 = blk.qs[16 * g..16 * g + 16].iter().map(|&q| q as i32).sum();
                        assert_eq!(s, blk.bsums[g] as i32);
                    }
                }
            }
            _ => {
                let b = unsafe { std::slice::from_raw_parts(buf.as_ptr() as *const f32, cols) };
                vals.extend(b.iter().map(|&v| v as f64));
            }
        }
    }
    (vals, scorr)
}

/// f64 reference `y[t*rows+r]` and the magnitude `Σ|w·x|` used for the tolerance.
fn reference(
    ty: G,
    data: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
) -> (Vec<f64>, Vec<f64>) {
    let w = dequant_rows(ty, data, rows, cols);
    let (a, scorr) = quantized_acts(ty, x, cols);
    let has_min = matches!(ty, G::Q4_1 | G::Q5_1);
    let rb = ty.row_bytes(cols as u64).unwrap() as usize;
    let (mut y, mut mag) = (vec![0f64; n * rows], vec![0f64; n * rows]);
    for t in 0..n {
        for r in 0..rows {
            let (mut s, mut m) = (0f64, 0f64);
            for c in 0..cols {
                s += w[r * cols + c] * a[t * cols + c];
                m += (w[r * cols + c] * a[t * cols + c]).abs();
            }
            if has_min {
                for blk in 0..cols / 32 {
                    let bm = f16_at(&data[r * rb + blk * ty.type_size()..], 2) as f64;
                    s += bm * scorr[t * cols / 32 + blk];
                    m += (bm * scorr[t * cols / 32 + blk]).abs();
                }
            }
            y[t * rows + r] = s;
            mag[t * rows + r] = m;
        }
    }
    (y, mag)
}

const TYPES: [G; 13] = [
    G::F32,
    G::F16,
    G::BF16,
    G::Q4_0,
    G::Q4_1,
    G::Q5_0,
    G::Q5_1,
    G::Q8_0,
    G::Q2_K,
    G::Q3_K,
    G::Q4_K,
    G::Q5_K,
    G::Q6_K,
];

fn col_options(ty: G) -> Vec<usize> {
    match ty.block_size() {
        1 => vec![1, 7, 33, 100],
        32 => vec![32, 64, 96, 320, 416, 576],
        _ => vec![256, 512, 768, 2304],
    }
}

#[allow(clippy::too_many_arguments)]
fn run(
    kernel: Kernel,
    pool: &ThreadPool,
    ty: G,
    data: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
) -> Vec<f32> {
    let mut y = vec![f32::NAN; n * rows];
    matmul_with(
        kernel,
        pool,
        &QMatrix {
            ty,
            rows,
            cols,
            data,
        },
        x,
        n,
        &mut y,
    );
    y
}

#[test]
fn all_types_all_kernels_match_f64_reference() {
    let pool = ThreadPool::new(2);
    let mut rng = Rng(42);
    let mut cases = 0;
    for ty in TYPES {
        assert!(supported(ty), "{}", ty.name());
        for cols in col_options(ty) {
            for (i, rows) in [1usize, 3, 17, 96].into_iter().enumerate() {
                let data = random_weights(&mut rng, ty, rows, cols);
                // Vary n_tokens with the shape to keep the run time small.
                for n in [1usize, 2, 3, 5, 8, 13]
                    .into_iter()
                    .skip(i % 2)
                    .step_by(2 - (cols > 1000) as usize)
                {
                    let x: Vec<f32> = (0..n * cols).map(|_| rng.f() * 3.0).collect();
                    let (yr, mag) = reference(ty, &data, rows, cols, &x, n);
                    let y_scalar = run(Kernel::Scalar, &pool, ty, &data, rows, cols, &x, n);
                    for k in Kernel::all_available() {
                        let y = run(k, &pool, ty, &data, rows, cols, &x, n);
                        for j in 0..n * rows {
                            let tol = 2e-6 * mag[j] + 1e-6;
                            assert!(
                                (y[j] as f64 - yr[j]).abs() <= tol,
                                "{} {} rows={rows} cols={cols} n={n} j={j}: got {} want {} (tol {tol})",
                                k.name(), ty.name(), y[j], yr[j]
                            );
                            assert!(
                                (y[j] as f64 - y_scalar[j] as f64).abs() <= tol,
                                "{} vs scalar {} rows={rows} cols={cols} n={n} j={j}: {} vs {}",
                                k.name(),
                                ty.name(),
                                y[j],
                                y_scalar[j]
                            );
                        }
                        cases += 1;
                    }
                }
            }
        }
    }
    eprintln!(
        "{cases} (type, shape, kernel) cases checked; kernels: {:?}",
        Kernel::all_available()
    );
    assert!(cases > 100);
}

#[test]
fn thread_count_does_not_change_results() {
    let pools: Vec<ThreadPool> = (1..=3).map(ThreadPool::new).collect();
    let mut rng = Rng(7);
    for ty in [G::Q4_0, G::Q4_1, G::Q5_0, G::Q4_K, G::Q6_K, G::Q8_0, G::F16] {
        // 320 = 8-block groups plus a tail in the 512-bit 32-element kernel.
        let (rows, cols) = (37, if ty.block_size() == 256 { 512 } else { 320 });
        let data = random_weights(&mut rng, ty, rows, cols);
        for n in [1, 6] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f()).collect();
            for k in Kernel::all_available() {
                let ys: Vec<Vec<f32>> = pools
                    .iter()
                    .map(|p| run(k, p, ty, &data, rows, cols, &x, n))
                    .collect();
                assert!(ys[0].iter().all(|v| v.is_finite()));
                assert_eq!(ys[0], ys[1], "{} {} 1 vs 2 threads", k.name(), ty.name());
                assert_eq!(ys[0], ys[2], "{} {} 1 vs 3 threads", k.name(), ty.name());
            }
        }
    }
}

#[test]
fn activation_rounding_is_ggml_x86() {
    // amax 127 → multiplier 1: ties round to even (ggml's AVX2 `_mm256_round_ps`).
    let mut x = vec![0f32; 32];
    x[0] = 127.0;
    x[1] = 2.5;
    x[2] = 3.5;
    x[3] = -2.5;
    let mut q = [ActQ8 {
        d: 0.0,
        s: 0.0,
        sum: 0,
        _pad: 0,
        qs: [0; 32],
    }];
    act::quantize_q8(&x, &mut q);
    assert_eq!(&q[0].qs[..4], &[127, 2, 4, -2]);
    assert_eq!(q[0].d, 1.0);
    assert_eq!(q[0].sum, 131);
    // Q8_K: scale from the signed max: max = -127 → iscale = -127/max = 1, d = 1.
    let mut x = vec![0f32; 256];
    x[5] = -127.0;
    x[6] = 0.5;
    x[7] = 1.5;
    x[20] = 126.6;
    let mut k = [ActQ8K {
        d: 0.0,
        _pad: [0; 7],
        bsums: [0; 16],
        qs: [0; 256],
    }];
    act::quantize_q8k(&x, &mut k);
    assert_eq!(k[0].d, 1.0);
    assert_eq!(&k[0].qs[5..8], &[-127, 0, 2]);
    assert_eq!(k[0].qs[20], 127);
    assert_eq!(k[0].bsums[0], -125);
    assert_eq!(k[0].bsums[1], 127);
    // A positive max flips the sign of the scale: d = -1, quants negated.
    let x: Vec<f32> = x.iter().map(|v| -v).collect();
    act::quantize_q8k(&x, &mut k);
    assert_eq!(k[0].d, -1.0);
    assert_eq!(&k[0].qs[5..8], &[-127, 0, 2]);
}

#[test]
fn real_model_tensors_match_reference() {
    use vela_formats::gguf::GgufFile;
    use vela_formats::testdata;
    let pool = ThreadPool::new(2);
    let mut rng = Rng(99);
    let mut checked = Vec::new();
    for name in [testdata::SMOLLM2, testdata::GEMMA3, testdata::QWEN25] {
        let Some(path) = testdata::model(name) else {
            continue;
        };
        let f = GgufFile::open(&path).unwrap();
        let mut seen = std::collections::HashSet::new();
        for t in &f.tensors {
            if t.dims.len() != 2 || !supported(t.ty) || t.ty.block_size() == 1 || !seen.insert(t.ty)
            {
                continue;
            }
            let (cols, rows_all) = (t.ne0(), t.n_rows());
            let rows = rows_all.min(64);
            let rb = t.ty.row_bytes(cols as u64).unwrap() as usize;
            let data = &f.tensor_data(t)[..rows * rb];
            let n = 3;
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f()).collect();
            let (yr, mag) = reference(t.ty, data, rows, cols, &x, n);
            for k in Kernel::all_available() {
                let y = run(k, &pool, t.ty, data, rows, cols, &x, n);
                for j in 0..n * rows {
                    let tol = 2e-6 * mag[j] + 1e-6;
                    assert!(
                        (y[j] as f64 - yr[j]).abs() <= tol,
                        "{name} {} ({}) {}: j={j} got {} want {}",
                        t.name,
                        t.ty.name(),
                        k.name(),
                        y[j],
                        yr[j]
                    );
                }
            }
            checked.push(format!("{}:{}", t.name, t.ty.name()));
        }
    }
    eprintln!("real tensors checked: {checked:?}");
}

#[test]
fn matmul_multi_matches_separate_matmuls_bit_exactly() {
    let mut rng = Rng(99);
    let cols = 512;
    // Mixed activation formats (Q8, Q8_K, f32, f16) and odd row counts in one dispatch.
    let shapes = [
        (G::Q4_1, 37),
        (G::Q8_0, 5),
        (G::Q4_K, 64),
        (G::Q6_K, 3),
        (G::F32, 9),
        (G::F16, 1),
    ];
    let datas: Vec<Vec<u8>> = shapes
        .iter()
        .map(|&(ty, rows)| random_weights(&mut rng, ty, rows, cols))
        .collect();
    let mats: Vec<QMatrix> = shapes
        .iter()
        .zip(&datas)
        .map(|(&(ty, rows), data)| QMatrix {
            ty,
            rows,
            cols,
            data,
        })
        .collect();
    let refs: Vec<&QMatrix> = mats.iter().collect();
    for threads in [1, 2, 3] {
        let pool = ThreadPool::new(threads);
        for n in [1usize, 3, 6] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f() * 2.0).collect();
            for k in Kernel::all_available() {
                let mut outs: Vec<Vec<f32>> =
                    mats.iter().map(|m| vec![f32::NAN; n * m.rows]).collect();
                let mut ys: Vec<&mut [f32]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
                matmul_multi_with(k, &pool, &refs, &x, n, &mut ys);
                for (m, got) in mats.iter().zip(&outs) {
                    let want = run(k, &pool, m.ty, m.data, m.rows, cols, &x, n);
                    assert!(
                        got.iter().all(|v| v.is_finite()),
                        "{} {}",
                        k.name(),
                        m.ty.name()
                    );
                    assert_eq!(
                        got,
                        &want,
                        "{} {} threads={threads} n={n}",
                        k.name(),
                        m.ty.name()
                    );
                }
            }
        }
    }
}

#[test]
fn simd_activation_quantization_is_bit_identical_to_scalar() {
    let mut rng = Rng(5);
    let cols = 32 * 40;
    // Random values, exact .5 ties after scaling (amax 127), and an all-zero block.
    let mut x: Vec<f32> = (0..cols).map(|_| rng.f() * 4.0).collect();
    x[32] = 127.0;
    for i in 33..64 {
        x[i] = (i as f32 - 48.0) + 0.5;
    }
    x[64..96].fill(0.0);
    let row = ActKind::Q8.row_bytes(cols);
    let mut a = vec![Line([0; 64]); row.div_ceil(64)];
    let mut b = a.clone();
    let (pa, pb) = (a.as_mut_ptr() as *mut u8, b.as_mut_ptr() as *mut u8);
    // SAFETY: both buffers hold `row` bytes, 64-byte aligned.
    let (sa, sb) = unsafe {
        (
            std::slice::from_raw_parts_mut(pa, row),
            std::slice::from_raw_parts_mut(pb, row),
        )
    };
    act::quantize_row(ActKind::Q8, &x, sa);
    for k in Kernel::all_available() {
        sb.fill(0xAA);
        quantize_row(k, ActKind::Q8, &x, sb);
        assert_eq!(sa, sb, "{}", k.name());
    }
}

#[test]
fn packed_gemm_is_bit_identical_to_scalar() {
    let pools: Vec<ThreadPool> = (1..=3).map(ThreadPool::new).collect();
    let mut rng = Rng(99);
    let types = [
        G::Q4_0,
        G::Q4_1,
        G::Q5_0,
        G::Q5_1,
        G::Q8_0,
        G::Q2_K,
        G::Q3_K,
        G::Q4_K,
        G::Q5_K,
        G::Q6_K,
    ];
    for kernel in [Kernel::Avx2, Kernel::Avx512] {
        if !kernel.available() {
            eprintln!("skipped: no {} kernels on this CPU", kernel.name());
            continue;
        }
        let mut cases = 0;
        for ty in types {
            // AVX2 packs the 32-element block types only.
            assert_eq!(
                packs(kernel, ty),
                kernel == Kernel::Avx512 || ty.block_size() == 32
            );
            if !packs(kernel, ty) {
                continue;
            }
            let col_set = if ty.block_size() == 256 {
                [256usize, 512, 768, 1280]
            } else {
                [32usize, 96, 320, 576]
            };
            for cols in col_set {
                for rows in [1usize, 15, 16, 17, 40] {
                    let data = random_weights(&mut rng, ty, rows, cols);
                    let w = QMatrix {
                        ty,
                        rows,
                        cols,
                        data: &data,
                    };
                    let p = PackedMatrix::new(&w).expect("packable");
                    assert!(p.bytes() >= rows * ty.row_bytes(cols as u64).unwrap() as usize);
                    for n in [1usize, 2, 4, 5, 7, 8, 9, 19] {
                        if n < p.min_tokens() {
                            // Not packed at this batch size (checked by the reference test).
                            continue;
                        }
                        let x: Vec<f32> = (0..n * cols).map(|_| rng.f() * 3.0).collect();
                        let want = run(Kernel::Scalar, &pools[0], ty, &data, rows, cols, &x, n);
                        for pool in &pools {
                            let mut y = vec![f32::NAN; n * rows];
                            matmul_multi_packed_with(
                                kernel,
                                pool,
                                &[&w],
                                &[Some(&p)],
                                &x,
                                n,
                                &mut [&mut y[..]],
                            );
                            for j in 0..n * rows {
                                assert_eq!(
                                    y[j].to_bits(),
                                    want[j].to_bits(),
                                    "{} {} rows={rows} cols={cols} n={n} j={j}: {} vs scalar {}",
                                    kernel.name(),
                                    ty.name(),
                                    y[j],
                                    want[j]
                                );
                            }
                            cases += 1;
                        }
                    }
                }
            }
        }
        // The k-quant copies (AVX-512 only) start at 2 tokens.
        let k = if kernel == Kernel::Avx512 { 5 * 7 } else { 0 };
        assert_eq!(cases, (5 * 8 + k) * 4 * 5 * 3, "{}", kernel.name());
    }
}

#[test]
fn packed_rejects_other_types_and_bad_shapes() {
    let data = vec![0u8; 4096];
    let q = |ty, rows, cols| QMatrix {
        ty,
        rows,
        cols,
        data: &data,
    };
    assert!(PackedMatrix::new(&q(G::Q4_K, 1, 320)).is_none());
    assert!(
        PackedMatrix::new(&q(G::Q4_K, 100, 256)).is_none(),
        "data too short"
    );
    assert!(PackedMatrix::new(&q(G::F32, 1, 32)).is_none());
    assert!(PackedMatrix::new(&q(G::Q8_0, 1, 48)).is_none());
    assert!(
        PackedMatrix::new(&q(G::Q8_0, 1000, 64)).is_none(),
        "data too short"
    );
    assert!(PackedMatrix::new(&q(G::Q8_0, 2, 64)).is_some());
}

#[test]
fn simd_q8k_quantization_is_bit_identical_to_scalar() {
    let mut rng = Rng(11);
    let cols = 256 * 6;
    let mut x: Vec<f32> = (0..cols).map(|_| rng.f() * 4.0).collect();
    // Block 1: +a and -a tie for the largest magnitude (the first one sets the sign).
    x[256 + 7] = -9.0;
    x[256 + 100] = 9.0;
    // Block 2: all zero; block 3: exact .5 ties after scaling; block 4: largest at the end.
    x[512..768].fill(0.0);
    x[768] = -127.0;
    for i in 1..256 {
        x[768 + i] = (i as f32 % 50.0 - 25.0) + 0.5;
    }
    x[1024 + 255] = 50.0;
    let row = ActKind::Q8K.row_bytes(cols);
    let mut a = vec![Line([0; 64]); row.div_ceil(64)];
    let mut b = a.clone();
    let (pa, pb) = (a.as_mut_ptr() as *mut u8, b.as_mut_ptr() as *mut u8);
    // SAFETY: both buffers hold `row` bytes, 64-byte aligned.
    let (sa, sb) = unsafe {
        (
            std::slice::from_raw_parts_mut(pa, row),
            std::slice::from_raw_parts_mut(pb, row),
        )
    };
    act::quantize_row(ActKind::Q8K, &x, sa);
    for k in Kernel::all_available() {
        sb.fill(0xAA);
        quantize_row(k, ActKind::Q8K, &x, sb);
        assert_eq!(sa, sb, "{}", k.name());
    }
}

/// The GGUF-layout kernels that reduce to exact integers and finish like the scalar kernel give
/// its bits, so logits do not depend on how a prompt is batched, and weights used in place give
/// the packed copies' results: the k-quants on AVX-512 (1-token calls) and AVX2, the 32-element
/// types on both (whole 8-block groups, partial groups and, on AVX-512, an odd last block).
#[test]
fn gguf_kernels_are_bit_identical_to_scalar() {
    let pool = ThreadPool::new(2);
    let mut rng = Rng(123);
    for ty in [G::Q2_K, G::Q3_K, G::Q4_K, G::Q5_K, G::Q6_K] {
        let (rows, cols) = (19, 768);
        let data = random_weights(&mut rng, ty, rows, cols);
        for n in [1usize, 3] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f() * 3.0).collect();
            let want = run(Kernel::Scalar, &pool, ty, &data, rows, cols, &x, n);
            for k in Kernel::all_available() {
                let y = run(k, &pool, ty, &data, rows, cols, &x, n);
                let same = y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{} {} n={n}: differs from scalar",
                    k.name(),
                    ty.name()
                );
            }
        }
    }
    for ty in [G::Q4_0, G::Q4_1, G::Q5_0, G::Q5_1, G::Q8_0] {
        for nb in [1usize, 2, 3, 7, 8, 11, 16, 21] {
            let (rows, cols) = (19, 32 * nb);
            let data = random_weights(&mut rng, ty, rows, cols);
            for n in [1usize, 2, 4, 7] {
                let x: Vec<f32> = (0..n * cols).map(|_| rng.f() * 3.0).collect();
                let want = run(Kernel::Scalar, &pool, ty, &data, rows, cols, &x, n);
                for k in Kernel::all_available() {
                    let y = run(k, &pool, ty, &data, rows, cols, &x, n);
                    let same = y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{} {} nb={nb} n={n}: differs", k.name(), ty.name());
                }
            }
        }
    }
}

#[test]
fn refined_product_removes_the_activation_rounding() {
    let mut rng = Rng(2024);
    let (rows, cols, n) = (48, 512, 3);
    let pool = ThreadPool::new(2);
    // Activations with outliers, as a final norm's output has: most of each block is rounded
    // coarsely next to one large value.
    let x: Vec<f32> = (0..n * cols)
        .map(|i| rng.f() * if i % 97 == 0 { 40.0 } else { 1.0 })
        .collect();
    let nmse = |y: &[f32], r: &[f64]| {
        let num: f64 = y.iter().zip(r).map(|(&a, &b)| (a as f64 - b).powi(2)).sum();
        num / r.iter().map(|b| b * b).sum::<f64>()
    };
    for ty in [G::Q4_1, G::Q8_0, G::Q4_K, G::Q6_K] {
        let data = random_weights(&mut rng, ty, rows, cols);
        let w = QMatrix {
            ty,
            rows,
            cols,
            data: &data,
        };
        let wd = dequant_rows(ty, &data, rows, cols);
        let exact: Vec<f64> = (0..n * rows)
            .map(|i| {
                let (t, r) = (i / rows, i % rows);
                (0..cols)
                    .map(|c| wd[r * cols + c] * x[t * cols + c] as f64)
                    .sum()
            })
            .collect();
        let plain = run(Kernel::selected(), &pool, ty, &data, rows, cols, &x, n);
        let mut refined = vec![f32::NAN; n * rows];
        matmul_multi_packed(&pool, &[&w], &[None], &x, n, &mut [&mut refined[..]], true);
        let (e_plain, e_ref) = (nmse(&plain, &exact), nmse(&refined, &exact));
        assert!(
            e_ref < e_plain / 100.0,
            "{}: refined NMSE {e_ref:.3e} vs one pass {e_plain:.3e}",
            ty.name()
        );
        // Batch invariance: each row alone gives the same bits as in the batch.
        for t in 0..n {
            let mut one = vec![f32::NAN; rows];
            let xt = &x[t * cols..(t + 1) * cols];
            matmul_multi_packed(&pool, &[&w], &[None], xt, 1, &mut [&mut one[..]], true);
            assert_eq!(
                one,
                refined[t * rows..(t + 1) * rows],
                "{} row {t}",
                ty.name()
            );
        }
    }
}

/// Batch invariance, what `matmul_experts` relies on: a row's result does not depend on how many
/// activation rows share the call, on every kernel family and type (each tile finishes every
/// (row, token) pair alone, the same way for any token count). The SIMD families are not
/// bit-identical to the scalar kernel for the 32-element and float types (their lane order
/// differs); the packed copies are (`packed_gemm_is_bit_identical_to_scalar`).
#[test]
fn rows_do_not_depend_on_batch_size() {
    let pool = ThreadPool::new(2);
    let mut rng = Rng(5150);
    for k in Kernel::all_available() {
        for ty in TYPES {
            let (rows, cols) = (37, col_options(ty)[2]);
            let data = random_weights(&mut rng, ty, rows, cols);
            let n = 9;
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f() * 3.0).collect();
            let all = run(k, &pool, ty, &data, rows, cols, &x, n);
            for m in 1..n {
                // Rows t0..t0+m alone.
                let t0 = (m * 5) % (n - m + 1);
                let part = run(
                    k,
                    &pool,
                    ty,
                    &data,
                    rows,
                    cols,
                    &x[t0 * cols..(t0 + m) * cols],
                    m,
                );
                let same = part
                    .iter()
                    .zip(&all[t0 * rows..(t0 + m) * rows])
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{} {} rows {t0}..{} of {n}",
                    k.name(),
                    ty.name(),
                    t0 + m
                );
            }
        }
    }
}

/// A row range of a packed matrix ([`PackedRows`]: one expert of a 3-D expert tensor), aligned
/// to its tiles or not, gives the same bits as those rows of the whole matrix's product.
#[test]
fn packed_row_ranges_match_the_whole_matrix() {
    if !Kernel::Avx512.available() {
        eprintln!("skipped: no AVX-512 VNNI");
        return;
    }
    let pool = ThreadPool::new(2);
    let mut rng = Rng(4242);
    for ty in [G::Q4_0, G::Q8_0, G::Q5_1, G::Q4_K, G::Q6_K] {
        let (rows, cols) = (40, if ty.block_size() == 256 { 512 } else { 96 });
        let data = random_weights(&mut rng, ty, rows, cols);
        let w = QMatrix {
            ty,
            rows,
            cols,
            data: &data,
        };
        let p = PackedMatrix::new(&w).expect("packable");
        let wrow = ty.row_bytes(cols as u64).unwrap() as usize;
        for n in [2usize, 7, 9] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f() * 3.0).collect();
            let mut all = vec![f32::NAN; n * rows];
            matmul_multi_packed(&pool, &[&w], &[Some(&p)], &x, n, &mut [&mut all[..]], false);
            for (row0, len) in [
                (0usize, 16usize),
                (16, 24),
                (3, 17),
                (17, 6),
                (39, 1),
                (0, 40),
            ] {
                let view = QMatrix {
                    ty,
                    rows: len,
                    cols,
                    data: &data[row0 * wrow..(row0 + len) * wrow],
                };
                let pr = PackedRows { m: &p, row0 };
                let mut y = vec![f32::NAN; n * len];
                matmul_rows_packed(
                    &pool,
                    &[&view],
                    &[Some(pr)],
                    &x,
                    n,
                    &mut [&mut y[..]],
                    false,
                );
                for t in 0..n {
                    let want = &all[t * rows + row0..t * rows + row0 + len];
                    let got = &y[t * len..(t + 1) * len];
                    let same = got
                        .iter()
                        .zip(want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{} rows {row0}+{len} n={n} token {t}", ty.name());
                }
            }
        }
    }
}
