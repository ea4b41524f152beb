//! Recurrent-layer ops against the CPU backend: the causal convolution with state (every
//! split of the sequence), row L2 norm, the gated delta rule (every split; grouped heads).

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
                    g.conv1d_causal(&up(&g, xs), m, width, &wg, k, dil, silu, &mut sg, &mut og);
                    cpu.conv1d_causal(&up(&cpu, xs), m, width, &wc, k, dil, silu, &mut sc, &mut oc);
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

#[test]
fn l2_norm_rows_matches_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(1);
    let mut rng = Rng(0x12);
    for (rows, width) in [(1, 1), (3, 128), (5, 257)] {
        let x = rng.vec(rows * width);
        let (mut xg, mut xc) = (up(&g, &x), up(&cpu, &x));
        g.l2_norm_rows(&mut xg, rows, width, 1e-6);
        cpu.l2_norm_rows(&mut xc, rows, width, 1e-6);
        let n = rows * width;
        check_ulps(
            &format!("l2_norm {rows}x{width}"),
            &down(&g, &xg, n),
            &down(&cpu, &xc, n),
            4.0,
        );
    }
}

/// The delta rule per split of the sequence, against the CPU: every split gives the GPU the
/// same bits (batch invariance), and the GPU is within a small bound of the CPU (the decay's
/// expf is the only difference, compounded over the positions).
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
        },
        DeltaDims {
            n: 33,
            n_k: 16,
            n_v: 48,
            dk: 128,
            dv: 128,
        },
    ] {
        let q: Vec<f32> = rng
            .vec(d.n * d.n_k * d.dk)
            .iter()
            .map(|v| v * 0.1)
            .collect();
        let k: Vec<f32> = rng
            .vec(d.n * d.n_k * d.dk)
            .iter()
            .map(|v| v * 0.1)
            .collect();
        let v = rng.vec(d.n * d.n_v * d.dv);
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
        let (oc, sc) = delta(&cpu, &q, &k, &v, &gg, &beta, d, d.n);
        let (og, sg) = delta(&g, &q, &k, &v, &gg, &beta, d, d.n);
        let close = |a: &[f32], b: &[f32], what: &str| {
            let err: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
            let norm: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
            assert!(
                err <= 1e-10 * norm.max(1e-30),
                "{what}: relative squared error {}",
                err / norm
            );
            eprintln!(
                "RESULT | gated_delta_rule {d:?} {what} | nmse {:.2e} | ok |",
                err / norm
            );
        };
        close(&og, &oc, "out");
        close(&sg, &sc, "state");
        for split in [1, 5] {
            let again = delta(&g, &q, &k, &v, &gg, &beta, d, split);
            assert_eq!(again, (og.clone(), sg.clone()), "GPU split {split}");
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn delta<B: Backend>(
    be: &B,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    d: DeltaDims,
    split: usize,
) -> (Vec<f32>, Vec<f32>) {
    let mut state = be.alloc(d.n_v * d.dk * d.dv);
    let mut out = vec![0f32; d.n * d.n_v * d.dv];
    let mut t = 0;
    while t < d.n {
        let m = split.min(d.n - t);
        let dd = DeltaDims { n: m, ..d };
        let (qk, vv, gi) = (t * d.n_k * d.dk, t * d.n_v * d.dv, t * d.n_v);
        let sl = |x: &[f32], a: usize, len: usize| up(be, &x[a..a + len]);
        let mut o = be.alloc(m * d.n_v * d.dv);
        be.gated_delta_rule(
            &sl(q, qk, m * d.n_k * d.dk),
            &sl(k, qk, m * d.n_k * d.dk),
            &sl(v, vv, m * d.n_v * d.dv),
            &sl(g, gi, m * d.n_v),
            &sl(beta, gi, m * d.n_v),
            dd,
            &mut state,
            &mut o,
        );
        out[vv..vv + m * d.n_v * d.dv].copy_from_slice(&down(be, &o, m * d.n_v * d.dv));
        t += m;
    }
    (out, down(be, &state, d.n_v * d.dk * d.dv))
}
