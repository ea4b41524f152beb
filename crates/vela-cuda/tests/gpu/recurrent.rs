//! Recurrent-layer, hyper-connection and block-sparse ops against the CPU backend: the causal
//! convolution with state and the gated delta rule (every split of the sequence), the small
//! gates, grouped RMSNorm, the indexer's selection and attention over it.

use super::ops::check_ulps;
use super::*;
use vela_compute::DeltaDims;

/// The convolution is bit-identical to the CPU without SiLU (same order, no FMA), within a few
/// ulps with it (expf); the state after any split of the sequence equals the CPU's.
#[test]
fn conv1d_causal_matches_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(1);
    let mut rng = Rng(0xc0_1d);
    for (width, k, dil, n) in [
        (5, 4, 1, 9),
        (300, 4, 3, 37),
        (10240, 4, 1, 3),
        (7, 1, 1, 4),
    ] {
        let x = rng.vec(n * width);
        let w = rng.vec(width * k);
        let s = (k - 1) * dil;
        for silu in [false, true] {
            for split in [1, 2, n] {
                let (wg, wc) = (g.upload_vector(&w).unwrap(), cpu.upload_vector(&w).unwrap());
                let (mut sg, mut sc) = (g.alloc(s * width), cpu.alloc(s * width));
                let mut t = 0;
                while t < n {
                    let m = split.min(n - t);
                    let xs = &x[t * width..(t + m) * width];
                    let (mut og, mut oc) = (g.alloc(m * width), cpu.alloc(m * width));
                    g.conv1d_causal(
                        &up(&g, xs),
                        0,
                        m,
                        width,
                        &wg,
                        k,
                        dil,
                        silu,
                        &mut sg,
                        &mut og,
                    );
                    cpu.conv1d_causal(
                        &up(&cpu, xs),
                        0,
                        m,
                        width,
                        &wc,
                        k,
                        dil,
                        silu,
                        &mut sc,
                        &mut oc,
                    );
                    let (a, b) = (down(&g, &og, m * width), down(&cpu, &oc, m * width));
                    let what = format!("conv1d {width}x{k} dil {dil} silu {silu} split {split}");
                    if silu {
                        check_ulps(&what, &a, &b, 8.0);
                    } else {
                        assert_eq!(a, b, "{what}");
                    }
                    t += m;
                }
                assert_eq!(
                    down(&g, &sg, s * width),
                    down(&cpu, &sc, s * width),
                    "state"
                );
            }
        }
    }
}

/// Stream mean and injection: bit-identical to the CPU (same order, no FMA).
#[test]
fn hyper_connection_streams_match_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(1);
    let mut rng = Rng(0x4c);
    for (n, streams, width) in [(1, 4, 8), (5, 4, 2560), (3, 3, 7)] {
        let x = rng.vec(n * streams * width);
        let (mut mg, mut mc) = (g.alloc(n * width), cpu.alloc(n * width));
        g.mean_streams(&up(&g, &x), n, streams, width, &mut mg);
        cpu.mean_streams(&up(&cpu, &x), n, streams, width, &mut mc);
        assert_eq!(
            down(&g, &mg, n * width),
            down(&cpu, &mc, n * width),
            "mean_streams"
        );
        let (w, y) = (rng.vec(n * streams), rng.vec(n * width));
        let (mut xg, mut xc) = (up(&g, &x), up(&cpu, &x));
        g.inject_streams(&mut xg, &up(&g, &w), &up(&g, &y), n, streams, width);
        cpu.inject_streams(&mut xc, &up(&cpu, &w), &up(&cpu, &y), n, streams, width);
        let len = n * streams * width;
        assert_eq!(down(&g, &xg, len), down(&cpu, &xc, len), "inject_streams");
    }
}

/// Row sums, the decay gate and the n-gram gate within a few ulps of the CPU; grouped RMSNorm
/// as close as `rms_norm` is.
#[test]
fn small_ops_match_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(1);
    let mut rng = Rng(0x12);
    let (rows, width) = (7, 129);
    let x: Vec<f32> = rng.vec(rows * width).iter().map(|v| v * 30.0).collect();
    let (mut sg, mut sc) = (g.alloc(rows), cpu.alloc(rows));
    g.sum_rows(&up(&g, &x), rows, width, &mut sg);
    cpu.sum_rows(&up(&cpu, &x), rows, width, &mut sc);
    assert_eq!(down(&g, &sg, rows), down(&cpu, &sc, rows), "sum_rows");
    let (bias, scale) = (rng.vec(width), rng.vec(width));
    let (bg, sgv) = (
        g.upload_vector(&bias).unwrap(),
        g.upload_vector(&scale).unwrap(),
    );
    let (mut xg, mut xc) = (up(&g, &x), up(&cpu, &x));
    g.decay_gate(&mut xg, &bg, &sgv, rows, width);
    cpu.decay_gate(&mut xc, &bias, &scale, rows, width);
    let n = rows * width;
    check_ulps("decay_gate", &down(&g, &xg, n), &down(&cpu, &xc, n), 8.0);
    let (mut xg, mut xc) = (up(&g, &x), up(&cpu, &x));
    g.signed_sqrt_gate(&mut xg, n, 0.125);
    cpu.signed_sqrt_gate(&mut xc, n, 0.125);
    check_ulps(
        "signed_sqrt_gate",
        &down(&g, &xg, n),
        &down(&cpu, &xc, n),
        8.0,
    );
    let w = rng.vec(3 * width);
    let wg = g.upload_vector(&w).unwrap();
    let (mut og, mut oc) = (g.alloc(n), cpu.alloc(n));
    g.rms_norm_grouped(&up(&g, &x), &wg, rows, width, 3, 1e-6, &mut og);
    cpu.rms_norm_grouped(&up(&cpu, &x), &w, rows, width, 3, 1e-6, &mut oc);
    check_ulps(
        "rms_norm_grouped",
        &down(&g, &og, n),
        &down(&cpu, &oc, n),
        4.0,
    );
}

/// The indexer's selection equals the CPU's (scores in the same order; ties to the lower
/// block), and attention over it is within a few ulps.
#[test]
fn sparse_attention_matches_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(1);
    let mut rng = Rng(0x5e1);
    let p = vela_compute::IndexerParams {
        n_head: 4,
        head_dim: 32,
        block: 4,
        max_blocks: 4,
    };
    let (n, ctx, nh, nkv, hd) = (9usize, 70usize, 6usize, 2usize, 64usize);
    let positions: Vec<u32> = (ctx - n..ctx).map(|x| x as u32).collect();
    let q = rng.vec(n * p.n_head * p.head_dim);
    let mut keys = rng.vec(ctx / p.block * p.head_dim);
    keys[..3 * p.head_dim].fill(0.0); // ties at zero
    let w = p.max_selected();
    let (mut sel_g, mut cnt_g) = (g.alloc_ids(n * w), g.alloc_ids(n));
    let (mut sel_c, mut cnt_c) = (cpu.alloc_ids(n * w), cpu.alloc_ids(n));
    g.indexer_select(
        &up(&g, &q),
        &up(&g, &keys),
        &positions,
        &p,
        &mut sel_g,
        &mut cnt_g,
    );
    cpu.indexer_select(
        &up(&cpu, &q),
        &up(&cpu, &keys),
        &positions,
        &p,
        &mut sel_c,
        &mut cnt_c,
    );
    let (mut a, mut b) = (vec![0u32; n], vec![0u32; n]);
    g.read_ids(&cnt_g, &mut a);
    cpu.read_ids(&cnt_c, &mut b);
    assert_eq!(a, b, "counts");
    let (mut sa, mut sb) = (vec![0u32; n * w], vec![0u32; n * w]);
    g.read_ids(&sel_g, &mut sa);
    cpu.read_ids(&sel_c, &mut sb);
    for t in 0..n {
        let c = b[t] as usize;
        assert_eq!(
            sa[t * w..t * w + c],
            sb[t * w..t * w + c],
            "selection of query {t}"
        );
    }
    let (qa, k, v) = (
        rng.vec(n * nh * hd),
        rng.vec(ctx * nkv * hd),
        rng.vec(ctx * nkv * hd),
    );
    let (mut og, mut oc) = (g.alloc(n * nh * hd), cpu.alloc(n * nh * hd));
    let scale = 1.0 / (hd as f32).sqrt();
    let heads = (nh, nkv, hd);
    let (qg, kg, vg) = (up(&g, &qa), up(&g, &k), up(&g, &v));
    g.attention_selected(&qg, &kg, &vg, &sel_g, &cnt_g, n, w, heads, scale, &mut og);
    let (qc, kc, vc) = (up(&cpu, &qa), up(&cpu, &k), up(&cpu, &v));
    cpu.attention_selected(&qc, &kc, &vc, &sel_c, &cnt_c, n, w, heads, scale, &mut oc);
    // Each output is a weighted sum of ±1-scale values that cancels to small numbers: the
    // bound is 64 ulps of the largest |output| of its head row (expf vs the host's exp, the
    // softmax sum in another order), not of the cancelled value itself.
    let m = n * nh * hd;
    let (a, b) = (down(&g, &og, m), down(&cpu, &oc, m));
    let mut worst = 0f32;
    for (ra, rb) in a.chunks(hd).zip(b.chunks(hd)) {
        let scale = rb
            .iter()
            .fold(0f32, |x, y| x.max(y.abs()))
            .max(f32::MIN_POSITIVE);
        for (x, y) in ra.iter().zip(rb) {
            let ulps = (x - y).abs() / (f32::EPSILON * scale);
            worst = worst.max(ulps);
        }
    }
    eprintln!("RESULT | attention_selected | max {worst:.1} ulps of the row scale |");
    assert!(
        worst <= 64.0,
        "attention_selected: {worst} ulps of the row scale"
    );
}

/// The delta rule per split of the sequence, against the CPU: every split gives the GPU the
/// same bits (batch invariance), and the GPU is within a small bound of the CPU (its expf and
/// sqrtf are the only differences, compounded over the positions).
#[test]
fn gated_delta_rule_matches_cpu_and_is_split_invariant() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(2);
    let mut rng = Rng(0xde17a);
    for d in [
        DeltaDims {
            n: 7,
            n_k: 2,
            n_v: 6,
            dk: 16,
            dv: 24,
            tiled: false,
            from: 0,
        },
        DeltaDims {
            n: 33,
            n_k: 16,
            n_v: 48,
            dk: 128,
            dv: 128,
            tiled: false,
            from: 0,
        },
    ] {
        let qkv = rng.vec(d.n * (2 * d.n_k * d.dk + d.n_v * d.dv));
        let gg: Vec<f32> = rng
            .vec(d.n * d.n_v)
            .iter()
            .map(|v| -0.5 * (v + 1.0))
            .collect();
        let beta: Vec<f32> = rng
            .vec(d.n * d.n_v)
            .iter()
            .map(|v| 0.5 * (v + 1.0))
            .collect();
        // KDA's per-channel decays: [n, n_v·dk].
        let gc: Vec<f32> = rng
            .vec(d.n * d.n_v * d.dk)
            .iter()
            .map(|v| -0.5 * (v + 1.0))
            .collect();
        for (gv, channels) in [(&gg, false), (&gc, true)] {
            let (oc, sc) = delta(&cpu, &qkv, gv, &beta, d, d.n, channels);
            let (og, sg) = delta(&g, &qkv, gv, &beta, d, d.n, channels);
            let close = |a: &[f32], b: &[f32], what: &str| {
                let err: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
                let norm: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
                let nmse = err / norm.max(1e-30);
                assert!(nmse <= 1e-10, "{what} (channels {channels}): nmse {nmse}");
                eprintln!(
                    "RESULT | gated_delta_rule{} {d:?} {what} | nmse {nmse:.2e} | ok |",
                    if channels { "_channels" } else { "" }
                );
            };
            close(&og, &oc, "out");
            close(&sg, &sc, "state");
            for split in [1, 5] {
                let again = delta(&g, &qkv, gv, &beta, d, split, channels);
                assert_eq!(
                    again,
                    (og.clone(), sg.clone()),
                    "GPU split {split} (channels {channels})"
                );
            }
        }
    }
}

fn delta<B: Backend>(
    be: &B,
    qkv: &[f32],
    g: &[f32],
    beta: &[f32],
    d: DeltaDims,
    split: usize,
    channels: bool,
) -> (Vec<f32>, Vec<f32>) {
    let gw = if channels { d.n_v * d.dk } else { d.n_v };
    let row = 2 * d.n_k * d.dk + d.n_v * d.dv;
    let mut state = be.alloc(d.n_v * d.dk * d.dv);
    let mut out = vec![0f32; d.n * d.n_v * d.dv];
    let mut t = 0;
    while t < d.n {
        let m = split.min(d.n - t);
        let dd = DeltaDims { n: m, ..d };
        let gi = t * d.n_v;
        let mut o = be.alloc(m * d.n_v * d.dv);
        let (q, gv, b) = (
            up(be, &qkv[t * row..(t + m) * row]),
            up(be, &g[t * gw..(t + m) * gw]),
            up(be, &beta[gi..gi + m * d.n_v]),
        );
        if channels {
            be.gated_delta_rule_channels(&q, &gv, &b, dd, &mut state, &mut o);
        } else {
            be.gated_delta_rule(&q, &gv, &b, dd, &mut state, &mut o);
        }
        let ov = down(be, &o, m * d.n_v * d.dv);
        out[t * d.n_v * d.dv..(t + m) * d.n_v * d.dv].copy_from_slice(&ov);
        t += m;
    }
    (out, down(be, &state, d.n_v * d.dk * d.dv))
}

/// The fused elementwise chains give the GPU's unfused ops' bits (the same kernels' operations
/// in the same order) and are within a few ulps of the CPU (expf).
#[test]
fn fused_chains_match_unfused_ops_and_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(1);
    let mut rng = Rng(0xf5ed);
    let (n, s, h) = (3, 4, 2560);
    let len = n * s * h;
    let x: Vec<f32> = rng.vec(len).iter().map(|v| v * 12.0).collect();
    let gv: Vec<f32> = rng.vec(len).iter().map(|v| v * 12.0).collect();
    let both = |what: &str, fused: &[f32], unfused: &[f32], cpu: &[f32]| {
        assert_eq!(fused, unfused, "{what}: fused vs unfused");
        check_ulps(what, fused, cpu, 8.0);
    };
    // silu_scaled
    let (mut f, mut u, mut c) = (up(&g, &x), up(&g, &x), up(&cpu, &x));
    g.silu_scaled(&mut f, len, 0.25);
    cpu.silu_scaled(&mut c, len, 0.25);
    g.scale(&mut u, len, 0.25);
    let mut t = g.alloc(len);
    g.copy_rows(&u, 0, 1, len, &mut t, 0);
    g.sigmoid(&mut t, len);
    g.mul(&mut u, &t, len);
    let (f, u, c) = (down(&g, &f, len), down(&g, &u, len), down(&cpu, &c, len));
    both("silu_scaled", &f, &u, &c);
    // sigmoid_scaled
    let (mut f, mut u, mut c) = (up(&g, &x), up(&g, &x), up(&cpu, &x));
    g.sigmoid_scaled(&mut f, len, 0.25, 2.0);
    cpu.sigmoid_scaled(&mut c, len, 0.25, 2.0);
    g.scale(&mut u, len, 0.25);
    g.sigmoid(&mut u, len);
    g.scale(&mut u, len, 2.0);
    let (f, u, c) = (down(&g, &f, len), down(&g, &u, len), down(&cpu, &c, len));
    both("sigmoid_scaled", &f, &u, &c);
    // sigmoid_mul
    let (mut f, mut u, mut c) = (up(&g, &x), up(&g, &x), up(&cpu, &x));
    let (gg, gc) = (up(&g, &gv), up(&cpu, &gv));
    g.sigmoid_mul(&mut f, &gg, len);
    cpu.sigmoid_mul(&mut c, &gc, len);
    let mut sg = up(&g, &gv);
    g.sigmoid(&mut sg, len);
    g.mul(&mut u, &sg, len);
    let (f, u, c) = (down(&g, &f, len), down(&g, &u, len), down(&cpu, &c, len));
    both("sigmoid_mul", &f, &u, &c);
    // sigmoid_mix_streams
    let (xg, xc) = (up(&g, &x), up(&cpu, &x));
    let (mut f, mut u, mut c) = (g.alloc(n * h), g.alloc(n * h), cpu.alloc(n * h));
    g.sigmoid_mix_streams(&gg, &xg, n, s, h, &mut f);
    cpu.sigmoid_mix_streams(&gc, &xc, n, s, h, &mut c);
    let mut a = up(&g, &gv);
    g.sigmoid(&mut a, len);
    g.mul(&mut a, &xg, len);
    g.mean_streams(&a, n, s, h, &mut u);
    let m = n * h;
    let (f, u, c) = (down(&g, &f, m), down(&g, &u, m), down(&cpu, &c, m));
    // A mean of signed terms cancels: the bound is 8 ulps of the terms' magnitude (Σ_s |x| / S,
    // σ ≤ 1), not of the cancelled value.
    assert_eq!(f, u, "sigmoid_mix_streams: fused vs unfused");
    let mut worst = 0f32;
    for (e, (a, b)) in f.iter().zip(&c).enumerate() {
        let (t, i) = (e / h, e % h);
        let mag = (0..s).map(|j| x[(t * s + j) * h + i].abs()).sum::<f32>() / s as f32;
        let ulps = (a - b).abs() / (f32::EPSILON * mag.max(f32::MIN_POSITIVE));
        worst = worst.max(ulps);
        assert!(
            ulps <= 8.0,
            "sigmoid_mix_streams[{e}]: GPU {a:e} vs CPU {b:e}: {ulps} ulps"
        );
    }
    eprintln!("RESULT | sigmoid_mix_streams | max {worst:.1} ulps of the terms |");
    // delta_gates
    let (rows, width) = (5, 48);
    let m = rows * width;
    let (bias, scale) = (rng.vec(width), rng.vec(width));
    let (bg, sgv) = (
        g.upload_vector(&bias).unwrap(),
        g.upload_vector(&scale).unwrap(),
    );
    let (mut fb, mut fa) = (up(&g, &x[..m]), up(&g, &gv[..m]));
    let (mut cb, mut ca) = (up(&cpu, &x[..m]), up(&cpu, &gv[..m]));
    g.delta_gates(&mut fb, &mut fa, &bg, &sgv, rows, width);
    cpu.delta_gates(&mut cb, &mut ca, &bias, &scale, rows, width);
    let (mut ub, mut ua) = (up(&g, &x[..m]), up(&g, &gv[..m]));
    g.sigmoid(&mut ub, m);
    g.decay_gate(&mut ua, &bg, &sgv, rows, width);
    let d = |be: &_, b| down(be, b, m);
    both(
        "delta_gates b",
        &d(&g, &fb),
        &d(&g, &ub),
        &down(&cpu, &cb, m),
    );
    both(
        "delta_gates a",
        &d(&g, &fa),
        &d(&g, &ua),
        &down(&cpu, &ca, m),
    );
}

/// One-token products of several weights sharing their input, as qwen4_exp's layers ask for
/// them (more than three, float and quantized mixed: `mv_*_x3` groups with one quantization):
/// the CPU's values, as separate products are.
#[test]
fn grouped_products_match_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(0);
    let mut rng = Rng(0x9_7e);
    let cols = 512;
    for types in [
        vec![GgmlType::Q4_0; 4],
        vec![GgmlType::F32, GgmlType::Q4_0, GgmlType::Q4_0, GgmlType::F32],
        vec![GgmlType::Q4_0, GgmlType::Q4_0, GgmlType::F32],
        vec![
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q4_K,
            GgmlType::Q4_0,
            GgmlType::Q4_0,
        ],
    ] {
        let shapes: Vec<usize> = [2304usize, 97, 33, 1, 130][..types.len()].to_vec();
        let ws: Vec<_> = types
            .iter()
            .zip(&shapes)
            .map(|(&ty, &r)| upload_random(&g, &cpu, ty, r, cols, &mut rng))
            .collect();
        let names: Vec<_> = types.iter().map(|t| t.name()).collect();
        let x = rng.vec(cols);
        let (xg, xc) = (up(&g, &x), up(&cpu, &x));
        let mut yg: Vec<_> = shapes.iter().map(|&r| g.alloc(r)).collect();
        let mut yc: Vec<_> = shapes.iter().map(|&r| cpu.alloc(r)).collect();
        let wg: Vec<_> = ws.iter().map(|w| &w.0).collect();
        let wc: Vec<_> = ws.iter().map(|w| &w.1).collect();
        g.matmul_many(&wg, &xg, 1, &mut yg.iter_mut().collect::<Vec<_>>());
        cpu.matmul_many(&wc, &xc, 1, &mut yc.iter_mut().collect::<Vec<_>>());
        for (i, &r) in shapes.iter().enumerate() {
            check(
                &format!("grouped product {i} of {names:?}"),
                &down(&g, &yg[i], r),
                &yc[i][..r],
                1e-4,
            );
        }
    }
}
