//! The model kit's generic ops (MoE and hybrid architectures) against the CPU backend on odd
//! shapes: id buffers, softmax / sigmoid / mul, gather / scatter-add, routing and the
//! expert-indexed product. Skipped without a GPU like the other GPU tests.

use super::*;
use vela_compute::{RouteParams, Score};

fn up_ids<B: Backend>(be: &B, data: &[u32]) -> B::Ids {
    let mut b = be.alloc_ids(data.len());
    be.write_ids(&mut b, data);
    b
}

fn down_ids<B: Backend>(be: &B, b: &B::Ids, n: usize) -> Vec<u32> {
    let mut out = vec![0u32; n];
    be.read_ids(b, &mut out);
    out
}

/// Id buffers round-trip (a zero-length buffer too) and a fresh one reads zeros.
#[test]
fn ids_round_trip() {
    let Some(g) = gpu() else { return };
    let data: Vec<u32> = (0..1001u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let b = up_ids(&g, &data);
    assert_eq!(down_ids(&g, &b, data.len()), data);
    assert_eq!(down_ids(&g, &b, 7), data[..7]);
    let z = g.alloc_ids(5);
    assert_eq!(down_ids(&g, &z, 5), vec![0; 5]);
    let e = up_ids(&g, &[]);
    assert_eq!(down_ids(&g, &e, 0), Vec::<u32>::new());
}

/// `|a - b| <= ulps` units in the last place of `b` (and exact zeros where `b` is 0 or -inf).
pub(super) fn check_ulps(what: &str, gpu: &[f32], cpu: &[f32], ulps: f32) {
    assert_eq!(gpu.len(), cpu.len());
    let mut worst = 0f32;
    for (i, (&a, &b)) in gpu.iter().zip(cpu).enumerate() {
        let tol = ulps * f32::EPSILON * b.abs().max(f32::MIN_POSITIVE);
        let ok = (a == b) || (a - b).abs() <= tol;
        assert!(
            ok,
            "{what}[{i}]: GPU {a:e} vs CPU {b:e} (tolerance {ulps} ulps)"
        );
        if b != 0.0 {
            worst = worst.max((a - b).abs() / (f32::EPSILON * b.abs()));
        }
    }
    eprintln!("RESULT | {what} | max {worst:.1} ulps | ok |");
}

/// Softmax over rows (odd widths up to 5,000, -inf entries, all -inf rows), sigmoid and mul:
/// within 8 ulps of the CPU (expf vs the host's exp, 2 ulps each way, then one division; the
/// f64 sums differ in order only); mul is exact.
#[test]
fn softmax_sigmoid_mul_match_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(1);
    let mut rng = Rng(0x50f7_3a11);
    for (n_rows, width) in [
        (1, 1),
        (3, 7),
        (5, 33),
        (2, 129),
        (7, 1000),
        (1, 5000),
        (4, 257),
    ] {
        let mut x: Vec<f32> = rng.vec(n_rows * width).iter().map(|v| v * 30.0).collect();
        if n_rows > 2 {
            x[width..2 * width].fill(f32::NEG_INFINITY);
            for i in (0..width).step_by(3) {
                x[2 * width + i] = f32::NEG_INFINITY;
            }
        }
        let (mut xg, mut xc) = (up(&g, &x), up(&cpu, &x));
        g.softmax_rows(&mut xg, n_rows, width);
        cpu.softmax_rows(&mut xc, n_rows, width);
        let n = n_rows * width;
        let what = format!("softmax_rows {n_rows}x{width}");
        check_ulps(&what, &down(&g, &xg, n), &down(&cpu, &xc, n), 8.0);

        let (mut sg, mut sc) = (up(&g, &x), up(&cpu, &x));
        g.sigmoid(&mut sg, n);
        cpu.sigmoid(&mut sc, n);
        check_ulps(
            &format!("sigmoid {n}"),
            &down(&g, &sg, n),
            &down(&cpu, &sc, n),
            8.0,
        );

        let y = rng.vec(n);
        let x2 = rng.vec(n);
        let (mut mg, mut mc) = (up(&g, &x2), up(&cpu, &x2));
        g.mul(&mut mg, &up(&g, &y), n);
        cpu.mul(&mut mc, &up(&cpu, &y), n);
        assert_eq!(down(&g, &mg, n), down(&cpu, &mc, n), "mul {n}");

        // Fused gate/up rows of 2·width: the activation of the first half times the second.
        let gu = rng.vec(2 * n);
        for act in [Activation::Silu, Activation::GeluTanh] {
            let (mut og, mut oc) = (g.alloc(n), cpu.alloc(n));
            g.act_mul_split(&up(&g, &gu), n_rows, width, act, &mut og);
            cpu.act_mul_split(&up(&cpu, &gu), n_rows, width, act, &mut oc);
            let what = format!("act_mul_split {act:?} {n_rows}x{width}");
            check_ulps(&what, &down(&g, &og, n), &down(&cpu, &oc, n), 8.0);
        }
    }
}

/// Gather and scatter-add (with and without weights, many rows onto few destinations, an
/// out-of-range index): bit-identical to the CPU (same order, no FMA).
#[test]
fn gather_scatter_match_cpu_bit_exactly() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(1);
    let mut rng = Rng(0x6a7e);
    for (n_dst, n, width) in [
        (1usize, 1usize, 1usize),
        (5, 9, 3),
        (17, 40, 33),
        (3, 300, 257),
        (64, 2048, 8),
    ] {
        let src = rng.vec(n_dst * width);
        let idx: Vec<u32> = (0..n).map(|_| (rng.next() % n_dst as u64) as u32).collect();
        let (ig, ic) = (up_ids(&g, &idx), up_ids(&cpu, &idx));
        let (mut og, mut oc) = (g.alloc(n * width), cpu.alloc(n * width));
        g.gather_rows(&up(&g, &src), &ig, n, width, &mut og);
        cpu.gather_rows(&up(&cpu, &src), &ic, n, width, &mut oc);
        assert_eq!(
            down(&g, &og, n * width),
            down(&cpu, &oc, n * width),
            "gather {n}x{width}"
        );

        let rows = rng.vec(n * width);
        let w = rng.vec(n);
        let base = rng.vec(n_dst * width);
        for weighted in [false, true] {
            let (mut dg, mut dc) = (up(&g, &base), up(&cpu, &base));
            let (wg, wc) = (up(&g, &w), up(&cpu, &w));
            let (rg, rc) = (up(&g, &rows), up(&cpu, &rows));
            g.scatter_add_rows(&mut dg, &rg, &ig, weighted.then_some(&wg), n, width);
            cpu.scatter_add_rows(&mut dc, &rc, &ic, weighted.then_some(&wc), n, width);
            let (a, b) = (down(&g, &dg, n_dst * width), down(&cpu, &dc, n_dst * width));
            let same = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(
                same,
                "scatter_add_rows {n}->{n_dst}x{width} weighted {weighted}"
            );
        }
    }
    // An index past the source rows: a zero row (the GPU never reads out of bounds).
    let src = up(&g, &[1.0, 2.0, 3.0, 4.0]);
    let mut out = up(&g, &[9.0; 4]);
    g.gather_rows(&src, &up_ids(&g, &[1, 2]), 2, 2, &mut out);
    assert_eq!(down(&g, &out, 4), vec![3.0, 4.0, 0.0, 0.0]);
    eprintln!("RESULT | gather / scatter_add_rows | bit-exact | ok |");
}

/// Router logits without near-ties (so a few ulps of score difference cannot change the
/// experts): each row is a random permutation of a grid over `[-range, range]` with a small
/// jitter of its spacing.
fn spread_logits(rng: &mut Rng, n_tokens: usize, n_expert: usize, range: f32) -> Vec<f32> {
    let gap = 2.0 * range / n_expert as f32;
    let mut out = Vec::with_capacity(n_tokens * n_expert);
    for _ in 0..n_tokens {
        let mut rank: Vec<usize> = (0..n_expert).collect();
        for i in (1..n_expert).rev() {
            rank.swap(i, (rng.next() % (i as u64 + 1)) as usize);
        }
        out.extend(
            rank.iter()
                .map(|&r| -range + (r as f32 + 0.5 + 0.3 * rng.f()) * gap),
        );
    }
    out
}

fn route_params(n_expert: usize, k: usize, score: Score, groups: (usize, usize)) -> RouteParams {
    RouteParams {
        n_expert,
        k,
        score,
        n_group: groups.0,
        topk_group: groups.1,
        renorm: true,
        scale: 1.0,
    }
}

/// Routing on the device against the CPU: every score kind, groups (DeepSeek V3's 8 of 256),
/// selection bias, expert scales, renorm and scale, 1..37 tokens. The experts must be the same
/// ([`spread_logits`] has no near-ties) and the weights within 16 ulps (the scores' expf / log1pf
/// differ from the host's by a few ulps; renorm divides by a sum of such values).
#[test]
fn route_matches_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(1);
    let mut rng = Rng(0x0707_2026);
    let cases = [
        route_params(8, 2, Score::Softmax, (1, 1)),
        route_params(128, 8, Score::Softmax, (1, 1)),
        route_params(7, 3, Score::Softmax, (1, 1)),
        route_params(256, 8, Score::Sigmoid, (8, 4)),
        route_params(60, 4, Score::Sigmoid, (4, 2)),
        route_params(384, 6, Score::SqrtSoftplus, (1, 1)),
        route_params(1024, 32, Score::Sigmoid, (32, 5)),
        route_params(5, 5, Score::SqrtSoftplus, (5, 2)),
    ];
    for (ci, base) in cases.iter().enumerate() {
        for variant in 0..4 {
            let mut p = base.clone();
            p.renorm = variant != 1;
            p.scale = if variant == 2 { 2.5 } else { 1.0 };
            let (e_n, k) = (p.n_expert, p.k);
            let n_tokens = [1, 3, 37, 8][variant];
            let logits = spread_logits(&mut rng, n_tokens, e_n, 3.0);
            // A coarse bias (multiples of 0.01) cannot bring two keys within a few ulps.
            let bias: Vec<f32> = (0..e_n).map(|_| (rng.next() % 8) as f32 * 0.01).collect();
            let es: Vec<f32> = rng.vec(e_n).iter().map(|v| 1.0 + v * 0.5).collect();
            let (bg, bc) = (
                g.upload_vector(&bias).unwrap(),
                cpu.upload_vector(&bias).unwrap(),
            );
            let (eg, ec) = (
                g.upload_vector(&es).unwrap(),
                cpu.upload_vector(&es).unwrap(),
            );
            let (bg, bc) = if variant == 3 {
                (Some(&bg), Some(&bc))
            } else {
                (None, None)
            };
            let (eg, ec) = if variant == 2 {
                (Some(&eg), Some(&ec))
            } else {
                (None, None)
            };
            let (mut ig, mut ic) = (g.alloc_ids(n_tokens * k), cpu.alloc_ids(n_tokens * k));
            let (mut wg, mut wc) = (g.alloc(n_tokens * k), cpu.alloc(n_tokens * k));
            g.route(&up(&g, &logits), n_tokens, &p, bg, eg, &mut ig, &mut wg);
            cpu.route(&up(&cpu, &logits), n_tokens, &p, bc, ec, &mut ic, &mut wc);
            let what = format!("route case {ci} variant {variant}");
            let n = n_tokens * k;
            assert_eq!(
                down_ids(&g, &ig, n),
                down_ids(&cpu, &ic, n),
                "{what}: experts"
            );
            check_ulps(&what, &down(&g, &wg, n), &down(&cpu, &wc, n), 16.0);
        }
    }
}

/// Hash routing on the device: the table's experts exactly, weights within 16 ulps; an
/// out-of-range token gives expert 0 with weight 0 (as on the CPU in release builds).
#[test]
fn route_hash_matches_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(1);
    let mut rng = Rng(0x4a54);
    for score in [Score::SqrtSoftplus, Score::Sigmoid, Score::Softmax] {
        let (e_n, k, n_vocab, n_tokens) = (256, 6, 1000, 19);
        let mut p = route_params(e_n, k, score, (1, 1));
        p.scale = 1.5;
        let table: Vec<u32> = (0..n_vocab * k)
            .map(|_| (rng.next() % e_n as u64) as u32)
            .collect();
        let tokens: Vec<u32> = (0..n_tokens)
            .map(|_| (rng.next() % n_vocab as u64) as u32)
            .collect();
        let logits = spread_logits(&mut rng, n_tokens, e_n, 6.0);
        let (mut ig, mut ic) = (g.alloc_ids(n_tokens * k), cpu.alloc_ids(n_tokens * k));
        let (mut wg, mut wc) = (g.alloc(n_tokens * k), cpu.alloc(n_tokens * k));
        let (tg, tc) = (up_ids(&g, &tokens), up_ids(&cpu, &tokens));
        let (hg, hc) = (up_ids(&g, &table), up_ids(&cpu, &table));
        g.route_hash(&up(&g, &logits), &tg, &hg, n_tokens, &p, &mut ig, &mut wg);
        cpu.route_hash(&up(&cpu, &logits), &tc, &hc, n_tokens, &p, &mut ic, &mut wc);
        let n = n_tokens * k;
        assert_eq!(
            down_ids(&g, &ig, n),
            down_ids(&cpu, &ic, n),
            "route_hash {score:?}"
        );
        check_ulps(
            &format!("route_hash {score:?}"),
            &down(&g, &wg, n),
            &down(&cpu, &wc, n),
            16.0,
        );
    }
    let p = route_params(4, 2, Score::Sigmoid, (1, 1));
    let (mut ids, mut w) = (up_ids(&g, &[9, 9]), up(&g, &[9.0, 9.0]));
    let (tok, table) = (up_ids(&g, &[5]), up_ids(&g, &[1, 2]));
    g.route_hash(&up(&g, &[0.0; 4]), &tok, &table, 1, &p, &mut ids, &mut w);
    assert_eq!(
        (down_ids(&g, &ids, 2), down(&g, &w, 2)),
        (vec![0, 0], vec![0.0, 0.0])
    );
}

/// The expert-indexed product against the CPU's on every weight type the backend takes (Q4_0 in
/// both layouts: 96 columns as stored, 256 in split rows), experts of odd row counts, k = 1..3
/// with repeated experts, shared and per-slot activations: within 1e-4 of the rms like the
/// ordinary products (same quantized activations and integer block dots, another f32
/// accumulation order). An expert id past the tensor gives a zero row.
#[test]
fn matmul_experts_match_cpu() {
    let Some(g) = gpu() else { return };
    experts_vs_cpu(&g, false);
}

/// The same in exact mode on both backends (f32 activations, f64 sums, as the ordinary exact
/// product): within 1e-6 of the rms, as `exact_matmul_matches_cpu_exact`. Q8 activations on
/// the GPU side alone fail this bound, and a MoE model amplifies them past its exact-mode
/// criterion (`gemma4_moe_exact_gpu_matches_cpu`).
#[test]
fn matmul_experts_exact_match_cpu_exact() {
    use vela_compute::cpu::matmul::exact;
    let Some(g) = gpu() else { return };
    exact::set_thread_override(Some(true));
    g.set_exact_matmul(true);
    experts_vs_cpu(&g, true);
    g.set_exact_matmul(false);
    exact::set_thread_override(None);
}

/// `matmul_experts` on `g` and on the CPU over the cases above (exact mode set by the caller on
/// both backends, or not).
fn experts_vs_cpu(g: &CudaBackend, exact: bool) {
    let cpu = CpuBackend::new(0);
    let mut rng = Rng(0xe4be_7715);
    let (mode, tol) = if exact { ("exact ", 1e-6) } else { ("", 1e-4) };
    use GgmlType as G;
    let types = [
        (G::Q4_0, 96),
        (G::Q4_0, 256),
        (G::Q4_1, 64),
        (G::Q5_0, 96),
        (G::Q5_1, 32),
        (G::Q8_0, 160),
        (G::Q4_K, 512),
        (G::Q5_K, 256),
        (G::Q6_K, 768),
        (G::F16, 40),
        (G::F32, 33),
    ];
    for (ty, cols) in types {
        for (n_exp, rpe) in [(4usize, 17usize), (3, 32), (8, 5)] {
            let (wg, wc) = upload_random(g, &cpu, ty, n_exp * rpe, cols, &mut rng);
            for k in 1..=3usize {
                // 40 tokens: from 32 slots on, the grouped kernels.
                for (n_tokens, per_slot) in [(1usize, false), (3, true), (7, false), (40, false)] {
                    let n_slots = n_tokens * k;
                    let x_rows = if per_slot { n_slots } else { n_tokens };
                    let x = rng.vec(x_rows * cols);
                    let ids: Vec<u32> = (0..n_slots)
                        .map(|_| (rng.next() % n_exp as u64) as u32)
                        .collect();
                    let (ig, ic) = (up_ids(g, &ids), up_ids(&cpu, &ids));
                    let (mut yg, mut yc) = (g.alloc(n_slots * rpe), cpu.alloc(n_slots * rpe));
                    let (xg, xc) = (up(g, &x), up(&cpu, &x));
                    g.matmul_experts(&wg, rpe, &xg, per_slot, &ig, n_tokens, k, &mut yg);
                    cpu.matmul_experts(&wc, rpe, &xc, per_slot, &ic, n_tokens, k, &mut yc);
                    let what = format!(
                        "{mode}matmul_experts {} E={n_exp} rows={rpe} cols={cols} k={k} n={n_tokens}",
                        ty.name()
                    );
                    check(
                        &what,
                        &down(g, &yg, n_slots * rpe),
                        &yc[..n_slots * rpe],
                        tol,
                    );
                }
            }
        }
    }
    let (wg, _) = upload_random(g, &cpu, G::Q8_0, 4, 32, &mut rng);
    let mut y = up(g, &[f32::NAN; 4]);
    let x = up(g, &rng.vec(32));
    g.matmul_experts(&wg, 2, &x, false, &up_ids(g, &[1, 2]), 1, 2, &mut y);
    let y = down(g, &y, 4);
    assert!(
        y[..2].iter().all(|v| v.is_finite()) && y[2..] == [0.0, 0.0],
        "{y:?}"
    );
}

/// The grouped expert products (32 slots or more) give the per-slot kernels' bits: a batch
/// against each of its tokens alone (fewer slots), ids past the tensor included (zero rows),
/// experts with more slots than one group, shared and per-slot activations. Split-row Q4_0 on
/// sm_80+ takes the tensor-core product instead (`mmqe_q4_0s_*`), whose f32 sums run in another
/// order: within the products' 1e-4 of the per-slot results, and each slot's result the same
/// bits in another batch (the tokens in reverse order: other groups, other tiles).
#[test]
fn matmul_experts_grouped_equal_per_slot() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(0);
    let mut rng = Rng(0x5eed_0e4b);
    use GgmlType as G;
    for (ty, cols) in [
        (G::Q4_0, 96),
        (G::Q4_0, 256),
        (G::Q4_1, 64),
        (G::Q5_0, 96),
        (G::Q8_0, 160),
        (G::Q4_K, 512),
        (G::Q5_K, 256),
        (G::Q6_K, 768),
    ] {
        let (n_exp, rpe) = (16usize, 24usize);
        let (wg, _) = upload_random(&g, &cpu, ty, n_exp * rpe, cols, &mut rng);
        for (n_tokens, k, per_slot) in [(40usize, 4usize, false), (19, 2, true)] {
            let n_slots = n_tokens * k;
            let x_rows = if per_slot { n_slots } else { n_tokens };
            let x = rng.vec(x_rows * cols);
            let ids: Vec<u32> = (0..n_slots)
                .map(|_| (rng.next() % (n_exp as u64 + 1)) as u32)
                .collect();
            let mut yg = g.alloc(n_slots * rpe);
            g.matmul_experts(
                &wg,
                rpe,
                &up(&g, &x),
                per_slot,
                &up_ids(&g, &ids),
                n_tokens,
                k,
                &mut yg,
            );
            let batch = down(&g, &yg, n_slots * rpe);
            let tensor_cores = g.arch() >= 80 && ty == G::Q4_0 && cols % 256 == 0;
            let mut single = Vec::with_capacity(n_slots * rpe);
            if tensor_cores {
                // The same slots with the tokens reversed.
                let rev = |v: &[f32], w: usize| -> Vec<f32> {
                    v.chunks(w).rev().flatten().copied().collect()
                };
                let xw = if per_slot { k * cols } else { cols };
                let ids_rev: Vec<u32> = ids.chunks(k).rev().flatten().copied().collect();
                let mut yr = g.alloc(n_slots * rpe);
                g.matmul_experts(
                    &wg,
                    rpe,
                    &up(&g, &rev(&x, xw)),
                    per_slot,
                    &up_ids(&g, &ids_rev),
                    n_tokens,
                    k,
                    &mut yr,
                );
                assert_eq!(
                    rev(&down(&g, &yr, n_slots * rpe), k * rpe),
                    batch,
                    "{} cols={cols} k={k}: a slot's result depends on its batch",
                    ty.name()
                );
            }
            for t in 0..n_tokens {
                let xr = if per_slot {
                    t * k..(t + 1) * k
                } else {
                    t..t + 1
                };
                let xt = up(&g, &x[xr.start * cols..xr.end * cols]);
                let mut y1 = g.alloc(k * rpe);
                let it = up_ids(&g, &ids[t * k..(t + 1) * k]);
                g.matmul_experts(&wg, rpe, &xt, per_slot, &it, 1, k, &mut y1);
                if tensor_cores {
                    single.extend(down(&g, &y1, k * rpe));
                    continue;
                }
                assert_eq!(
                    down(&g, &y1, k * rpe),
                    batch[t * k * rpe..(t + 1) * k * rpe],
                    "{} cols={cols} k={k} token {t}: grouped vs per slot",
                    ty.name()
                );
            }
            if tensor_cores {
                let what = format!("tensor-core experts {} cols={cols} k={k}", ty.name());
                check(&what, &batch, &single, 1e-4);
            }
        }
    }
}

/// Routing edge cases on the device, as on the CPU: an all -inf softmax row (weights 0, also
/// renormalised), ties (lowest expert id), NaN logits never chosen over numbers, equal groups
/// (the lower kept).
#[test]
fn route_edge_cases_match_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(1);
    let ninf = f32::NEG_INFINITY;
    let cases: Vec<(RouteParams, Vec<f32>)> = vec![
        (route_params(4, 2, Score::Softmax, (1, 1)), vec![ninf; 4]),
        (
            route_params(6, 3, Score::Sigmoid, (1, 1)),
            vec![1.0, 2.0, 2.0, f32::NAN, 2.0, 0.0],
        ),
        (
            route_params(4, 2, Score::Sigmoid, (2, 1)),
            vec![0.5, 0.25, 0.25, 0.5],
        ),
        (
            route_params(5, 4, Score::SqrtSoftplus, (1, 1)),
            vec![f32::NAN, ninf, 3.0, 3.0, 25.0],
        ),
        (route_params(40, 8, Score::Softmax, (1, 1)), vec![0.0; 40]),
    ];
    for (i, (p, logits)) in cases.iter().enumerate() {
        let k = p.k;
        let (mut ig, mut ic) = (g.alloc_ids(k), cpu.alloc_ids(k));
        let (mut wg, mut wc) = (g.alloc(k), cpu.alloc(k));
        g.route(&up(&g, logits), 1, p, None, None, &mut ig, &mut wg);
        cpu.route(&up(&cpu, logits), 1, p, None, None, &mut ic, &mut wc);
        assert_eq!(
            down_ids(&g, &ig, k),
            down_ids(&cpu, &ic, k),
            "case {i}: experts"
        );
        check_ulps(
            &format!("route edge case {i}"),
            &down(&g, &wg, k),
            &down(&cpu, &wc, k),
            16.0,
        );
    }
}
