//! Precise products (`Backend::precise_products`: the activation rounding residual's product
//! added) on the GPU against the CPU's, and what they are for: a product much closer to the
//! exact one than a single pass.

use super::*;

/// One product of every quantized type, 1, 3 and 17 tokens (integer kernels throughout): with
/// precise products within 1e-4 of the rms of the CPU's precise product, and at least 30× closer
/// (NMSE) to the exact product than one pass. (Ideally ~254² closer; the Q4_1 / Q5_1 products'
/// block sums are rounded through f16 in both passes, as ggml's, which bounds their gain.)
#[test]
fn precise_products_match_cpu_and_cut_the_rounding_error() {
    let Some(g) = gpu() else { return };
    g.set_gemm_min(0);
    let cpu = CpuBackend::new(0);
    cpu.precise_products(true);
    let mut rng = Rng(0x5eed_0f9e);
    use GgmlType as G;
    for ty in [
        G::Q4_0,
        G::Q4_1,
        G::Q5_0,
        G::Q5_1,
        G::Q8_0,
        G::Q4_K,
        G::Q5_K,
        G::Q6_K,
    ] {
        let (rows, cols) = (130usize, ty.block_size() * 9);
        let (wg, wc) = upload_random(&g, &cpu, ty, rows, cols, &mut rng);
        for n in [1usize, 3, 17] {
            // Activations with outliers, as a norm's output has.
            let x: Vec<f32> = (0..n * cols)
                .map(|i| rng.f() * if i % 97 == 0 { 40.0 } else { 1.0 })
                .collect();
            let xg = up(&g, &x);
            let run = |precise: bool, exact: bool| {
                g.precise_products(precise);
                g.set_exact_matmul(exact);
                let mut y = g.alloc(n * rows);
                g.matmul(&wg, &xg, n, &mut y);
                down(&g, &y, n * rows)
            };
            let (plain, precise, exact) = (run(false, false), run(true, false), run(false, true));
            g.set_exact_matmul(false);
            let mut yc = cpu.alloc(n * rows);
            cpu.matmul(&wc, &up(&cpu, &x), n, &mut yc);
            let what = format!("precise matmul {} {rows}x{cols} n={n}", ty.name());
            check(&what, &precise, &yc, 1e-4);
            let (e_plain, e_precise) = (err(&plain, &exact).1, err(&precise, &exact).1);
            eprintln!(
                "RESULT | {what} | NMSE to exact: one pass {e_plain:.2e}, precise {e_precise:.2e} \
                 ({:.0}x) |",
                e_plain / e_precise.max(1e-300)
            );
            assert!(
                e_precise * 30.0 < e_plain,
                "{what}: precise NMSE {e_precise:.3e} vs one pass {e_plain:.3e}"
            );
        }
    }
    g.precise_products(false);
}

/// The ops whose fused kernels quantize their output for the next product (the pre-norm with and
/// without a post-norm, the gated activation, two products sharing their input) give way to the
/// unfused ops under precise products, so they match the CPU's precise results.
#[test]
fn precise_fused_ops_match_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(0);
    g.precise_products(true);
    cpu.precise_products(true);
    let mut rng = Rng(0x0dd_ba11);
    for (ty, width) in [(GgmlType::Q4_1, 576), (GgmlType::Q4_K, 512)] {
        let (wa_g, wa_c) = upload_random(&g, &cpu, ty, 70, width, &mut rng);
        let (wb_g, wb_c) = upload_random(&g, &cpu, ty, 33, width, &mut rng);
        let (wd_g, wd_c) = upload_random(&g, &cpu, ty, 41, width, &mut rng);
        let nw = rng.vec(width);
        let pw = rng.vec(width);
        let (nwg, nwc) = (
            g.upload_vector(&nw).unwrap(),
            cpu.upload_vector(&nw).unwrap(),
        );
        let (pwg, pwc) = (
            g.upload_vector(&pw).unwrap(),
            cpu.upload_vector(&pw).unwrap(),
        );
        for n in [1usize, 3] {
            for post in [false, true] {
                let x = rng.vec(n * width);
                let r = rng.vec(n * width);
                let (mut xg, mut xc) = (up(&g, &x), up(&cpu, &x));
                let (mut rg, mut rc) = (up(&g, &r), up(&cpu, &r));
                let (mut hg, mut hc) = (g.alloc(n * width), cpu.alloc(n * width));
                let (mut ag, mut ac) = (g.alloc(n * 70), cpu.alloc(n * 70));
                let (mut bg, mut bc) = (g.alloc(n * 33), cpu.alloc(n * 33));
                if post {
                    let (ws_g, ws_c) = ([&wa_g, &wb_g], [&wa_c, &wb_c]);
                    g.post_norm_matmul_many(
                        &mut xg,
                        &mut rg,
                        &pwg,
                        1.0,
                        &nwg,
                        n,
                        width,
                        1e-6,
                        &mut hg,
                        &ws_g,
                        &[],
                        &mut [&mut ag, &mut bg],
                    );
                    cpu.post_norm_matmul_many(
                        &mut xc,
                        &mut rc,
                        &pwc,
                        1.0,
                        &nwc,
                        n,
                        width,
                        1e-6,
                        &mut hc,
                        &ws_c,
                        &[],
                        &mut [&mut ac, &mut bc],
                    );
                } else {
                    g.norm_matmul_many(
                        &mut xg,
                        Some(&rg),
                        &nwg,
                        n,
                        width,
                        1e-6,
                        &mut hg,
                        &[&wa_g, &wb_g],
                        &[],
                        &mut [&mut ag, &mut bg],
                    );
                    cpu.norm_matmul_many(
                        &mut xc,
                        Some(&rc),
                        &nwc,
                        n,
                        width,
                        1e-6,
                        &mut hc,
                        &[&wa_c, &wb_c],
                        &[],
                        &mut [&mut ac, &mut bc],
                    );
                }
                let tag = format!(
                    "precise norm+matmul {} {width} n={n} post={post}",
                    ty.name()
                );
                check(&format!("{tag} y0"), &down(&g, &ag, n * 70), &ac, 1e-4);
                check(&format!("{tag} y1"), &down(&g, &bg, n * 33), &bc, 1e-4);
                // The gated activation and its product (the FFN's down projection).
                let (mut yg, mut yc) = (g.alloc(n * 41), cpu.alloc(n * 41));
                let mut gate_g = up(&g, &down(&g, &hg, n * width));
                let mut gate_c = hc.clone();
                let (ug, uc) = (up(&g, &x), up(&cpu, &x));
                let act = Activation::Silu;
                g.act_mul_matmul(&mut gate_g, &ug, n, width, act, &wd_g, &mut yg);
                cpu.act_mul_matmul(&mut gate_c, &uc, n, width, act, &wd_c, &mut yc);
                let what = format!("precise act+matmul {} {width} n={n}", ty.name());
                check(&what, &down(&g, &yg, n * 41), &yc, 1e-4);
            }
        }
    }
    g.precise_products(false);
}

/// The expert-indexed product with precise products on both backends, over the cases of
/// `matmul_experts_match_cpu`.
#[test]
fn precise_matmul_experts_match_cpu() {
    let Some(g) = gpu() else { return };
    crate::ops::experts_vs_cpu(&g, false, true);
    g.precise_products(false);
}
