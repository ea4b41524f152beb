//! One-token products of different weight types in one launch (`mv_mix*_x3`) and the Q/K/V
//! biases added by them (`mv_mix*_x3b`): the same bits as separate products and `add_bias`. Also the
//! norms folded into neighbouring kernels (QK norm into RoPE + store, the post norms into the
//! next pre-norm): the same bits as the separate `rms_norm` launches.

use super::*;

/// llama.cpp's _M mixtures give attn_v more bits than attn_q / attn_k: Q5_0, Q5_0, Q8_0 at
/// Qwen2.5-0.5B's shapes (896 columns; q 896 rows, k and v 128), Q4_0 (split rows) with Q8_0, and
/// the split-row k-quants Q4_K, Q4_K, Q6_K; two and three weights, with and without biases, one
/// launch against one `norm_matmul_many` per weight (separate kernels, which may take two rows
/// per warp, and `add_bias`).
#[test]
fn mixed_x3_and_bias_equal_separate_products() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(0);
    let mut rng = Rng(0x0307);
    for (types, cols) in [
        ([GgmlType::Q5_0, GgmlType::Q5_0, GgmlType::Q8_0], 896usize),
        ([GgmlType::Q4_0, GgmlType::Q4_0, GgmlType::Q8_0], 1024),
        ([GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K], 2048),
        ([GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q4_0], 2048),
    ] {
        let rows = [cols, 128usize, 128];
        let ws: Vec<_> = types
            .iter()
            .zip(rows)
            .map(|(&t, r)| upload_random(&g, &cpu, t, r, cols, &mut rng).0)
            .collect();
        let bs: Vec<_> = rows.iter().map(|&r| up(&g, &rng.vec(r))).collect();
        let norm_w = up(&g, &rng.vec(cols));
        let x0 = rng.vec(cols);
        let res = up(&g, &rng.vec(cols));
        let tag = format!(
            "{}+{}+{} cols={cols}",
            types[0].name(),
            types[1].name(),
            types[2].name()
        );
        for k in [2usize, 3] {
            // Runs from the same x: each weight alone, then all together (the mixed kernel),
            // without and with biases; `ids` picks the weights, `bias` adds their biases.
            let run = |ids: &[usize], bias: bool| {
                let mut x = up(&g, &x0);
                let mut h = g.alloc(cols);
                let mut ys: Vec<_> = ids.iter().map(|&j| g.alloc(rows[j])).collect();
                {
                    let wr: Vec<&vela_cuda::CudaWeight> = ids.iter().map(|&j| &ws[j]).collect();
                    let br: Vec<Option<&vela_cuda::CudaBuf>> =
                        ids.iter().map(|&j| bias.then_some(&bs[j])).collect();
                    let mut yr: Vec<&mut vela_cuda::CudaBuf> = ys.iter_mut().collect();
                    g.norm_matmul_many(
                        &mut x,
                        Some(&res),
                        &norm_w,
                        1,
                        cols,
                        1e-6,
                        &mut h,
                        &wr,
                        &br,
                        &mut yr,
                    );
                }
                let y: Vec<Vec<f32>> = ys
                    .iter()
                    .zip(ids)
                    .map(|(y, &j)| down(&g, y, rows[j]))
                    .collect();
                (y, down(&g, &x, cols))
            };
            for (bias, name) in [(false, "mixed"), (true, "mixed + bias")] {
                let all: Vec<usize> = (0..k).collect();
                let together = run(&all, bias);
                for j in 0..k {
                    let alone = run(&[j], bias);
                    check(
                        &format!("{tag} k={k} {name} product {j}"),
                        &together.0[j],
                        &alone.0[0],
                        0.0,
                    );
                    check(
                        &format!("{tag} k={k} {name} residual"),
                        &together.1,
                        &alone.1,
                        0.0,
                    );
                }
            }
            // Without biases, the mixed kernel through matmul_many too.
            let xq = up(&g, &x0);
            let mut ys: Vec<_> = rows[..k].iter().map(|&r| g.alloc(r)).collect();
            {
                let wr: Vec<&vela_cuda::CudaWeight> = ws[..k].iter().collect();
                let mut yr: Vec<&mut vela_cuda::CudaBuf> = ys.iter_mut().collect();
                g.matmul_many(&wr, &xq, 1, &mut yr);
            }
            for j in 0..k {
                let mut y1 = g.alloc(rows[j]);
                g.matmul(&ws[j], &xq, 1, &mut y1);
                check(
                    &format!("{tag} k={k} matmul_many mixed product {j}"),
                    &down(&g, &ys[j], rows[j]),
                    &down(&g, &y1, rows[j]),
                    0.0,
                );
            }
        }
    }
}

/// QK norm folded into RoPE + KV store (`rope_norm_store_heads_*`, `Backend::norm_rope_qk_store`):
/// the same q, k and cache (read back through `attention`) as `rms_norm_inplace` twice then
/// `rope_qk_store`, at Gemma 3's head dim 256 (n_rot 256, NEOX) and Qwen3's 128 (normal style),
/// for one and several tokens; with a v norm too (Gemma 4) in the later steps.
#[test]
fn qk_norm_rope_store_equals_unfused() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(0x9e70);
    for (hd, nh, nkv, neox) in [(256usize, 4usize, 1usize, true), (128, 16, 8, false)] {
        let spec = kv_spec(nkv, hd, 64, None);
        let rope = RopeParams {
            n_rot: hd,
            freq_base: 10000.0,
            freq_scale: 1.0,
            neox,
            freq_factors: None,
        };
        let (qn, kn) = (up(&g, &rng.vec(hd)), up(&g, &rng.vec(hd)));
        let ones = up(&g, &vec![1.0; hd]);
        let p = attn_params(nh, nkv, hd, 1.0 / (hd as f32).sqrt(), None, None);
        let mut kvs = [
            g.new_kv(std::slice::from_ref(&spec), KvType::F16).unwrap(),
            g.new_kv(std::slice::from_ref(&spec), KvType::F16).unwrap(),
        ];
        let mut p0 = 0u32;
        for n in [7usize, 1, 1, 3] {
            let pos: Vec<u32> = (p0..p0 + n as u32).collect();
            p0 += n as u32;
            // Scaled inputs (the norm must matter).
            let q0: Vec<f32> = rng.vec(n * nh * hd).iter().map(|x| 3.0 * x).collect();
            let k0: Vec<f32> = rng.vec(n * nkv * hd).iter().map(|x| 0.2 * x).collect();
            let v0: Vec<f32> = rng.vec(n * nkv * hd).iter().map(|x| 4.0 * x).collect();
            // Gemma 4 also normalizes v (weights all ones) in the same call: in the second half
            // of the steps.
            let v_norm = (p0 > 8).then_some(&ones);
            let mut outs = Vec::new();
            for (i, kv) in kvs.iter_mut().enumerate() {
                let (mut q, mut k, mut v) = (up(&g, &q0), up(&g, &k0), up(&g, &v0));
                g.set_profiling(true);
                g.profile_take();
                if i == 0 {
                    if let Some(vn) = v_norm {
                        g.rms_norm_inplace(&mut v, vn, n * nkv, hd, 1e-6);
                    }
                    g.rms_norm_inplace(&mut q, &qn, n * nh, hd, 1e-6);
                    g.rms_norm_inplace(&mut k, &kn, n * nkv, hd, 1e-6);
                    g.rope_qk_store(&mut q, &mut k, &v, kv, 0, nh, nkv, hd, &pos, &rope);
                } else {
                    let norms = (&qn, &kn, 1e-6);
                    g.norm_rope_qk_store(
                        &mut q, &mut k, &mut v, kv, 0, nh, nkv, hd, &pos, &rope, norms, v_norm,
                    );
                }
                // The fused call launches no rms_norm (a silent fallback would pass unnoticed).
                let launches = rms_norm_launches(&g);
                let want = if i == 0 {
                    2 + usize::from(v_norm.is_some())
                } else {
                    0
                };
                assert_eq!(
                    launches, want,
                    "QK norm hd={hd}: {launches} rms_norm launches"
                );
                let mut a = g.alloc(n * nh * hd);
                g.attention(&q, kv, 0, &pos, &p, &mut a);
                outs.push([
                    down(&g, &q, n * nh * hd),
                    down(&g, &k, n * nkv * hd),
                    down(&g, &v, n * nkv * hd),
                    down(&g, &a, n * nh * hd),
                ]);
            }
            let vn = if v_norm.is_some() { " +v norm" } else { "" };
            for (j, what) in ["q", "k", "v", "attention over the cache"]
                .iter()
                .enumerate()
            {
                check(
                    &format!("QK norm{vn} + RoPE + store hd={hd} n={n} {what} == unfused"),
                    &outs[1][j],
                    &outs[0][j],
                    0.0,
                );
            }
        }
    }
}

/// The post-attention / post-FFN norm folded into the next pre-norm (`norm_q8*_post_regs`,
/// `Backend::post_norm_matmul_many`): the same residual stream and products as
/// `rms_norm_inplace` on the residual then `norm_matmul_many`, at Gemma 3 270M's width 640 (Q8
/// activations) and 1,024 with Q8_K activations, one and two rows.
#[test]
fn post_norm_matmul_equals_unfused() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(0);
    let mut rng = Rng(0x9057);
    for (ty, width, rows) in [
        (GgmlType::Q8_0, 640usize, 1024usize),
        (GgmlType::Q5_0, 640, 256),
        (GgmlType::Q4_K, 1024, 512),
    ] {
        let ws: Vec<_> = (0..2)
            .map(|_| upload_random(&g, &cpu, ty, rows, width, &mut rng).0)
            .collect();
        let (post, norm) = (up(&g, &rng.vec(width)), up(&g, &rng.vec(width)));
        for (n, xs) in [(1usize, 1.0f32), (2, 1.0), (1, 0.75)] {
            let x0 = rng.vec(n * width);
            let r0: Vec<f32> = rng.vec(n * width).iter().map(|x| 5.0 * x).collect();
            let mut outs = Vec::new();
            for fused in [false, true] {
                let (mut x, mut r, mut h) = (up(&g, &x0), up(&g, &r0), g.alloc(n * width));
                let mut ys = [g.alloc(n * rows), g.alloc(n * rows)];
                let wr = [&ws[0], &ws[1]];
                let [y0, y1] = &mut ys;
                g.set_profiling(true);
                g.profile_take();
                if fused {
                    g.post_norm_matmul_many(
                        &mut x,
                        &mut r,
                        &post,
                        xs,
                        &norm,
                        n,
                        width,
                        1e-6,
                        &mut h,
                        &wr,
                        &[],
                        &mut [y0, y1],
                    );
                } else {
                    g.rms_norm_inplace(&mut r, &post, n, width, 1e-6);
                    // Gemma 4's layer scalar: x = (x + r) * xs, as the model did unfused.
                    if xs != 1.0 {
                        g.add(&mut x, &r, n * width);
                        g.scale(&mut x, n * width, xs);
                    }
                    g.norm_matmul_many(
                        &mut x,
                        (xs == 1.0).then_some(&r),
                        &norm,
                        n,
                        width,
                        1e-6,
                        &mut h,
                        &wr,
                        &[],
                        &mut [y0, y1],
                    );
                }
                let launches = rms_norm_launches(&g);
                let want = usize::from(!fused);
                assert_eq!(launches, want, "post norm: {launches} rms_norm launches");
                outs.push([
                    down(&g, &x, n * width),
                    down(&g, &ys[0], n * rows),
                    down(&g, &ys[1], n * rows),
                ]);
            }
            for (j, what) in ["residual stream", "product 0", "product 1"]
                .iter()
                .enumerate()
            {
                check(
                    &format!(
                        "post norm {} {width}x{rows} n={n} scale {xs} {what} == unfused",
                        ty.name()
                    ),
                    &outs[1][j],
                    &outs[0][j],
                    0.0,
                );
            }
        }
    }
}

/// `rms_norm` launches since profiling was switched on (then switched off).
fn rms_norm_launches(g: &CudaBackend) -> usize {
    let n = g
        .profile_take()
        .iter()
        .filter(|(k, _)| k.as_str() == "rms_norm")
        .map(|(_, v)| v.1 as usize)
        .sum();
    g.set_profiling(false);
    n
}

/// Narrow Q8_0 rows (`mv_q8_0_r2n`, several row pairs per warp; the small models' LM heads)
/// against the CPU backend, at the three real models' head widths (576, 640, 896), the widest
/// row it takes (64 blocks) and row counts that leave partial groups; a 65-block row takes the
/// two-row kernel.
#[test]
fn narrow_q8_0_rows_match_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(0);
    let mut rng = Rng(0x4a11);
    g.set_mv_rows_mode(2);
    for (rows, cols) in [
        (20_003usize, 640usize),
        (4_099, 576),
        (3_001, 896),
        (1_000, 2048),
        (77, 896),
        (513, 2080),
    ] {
        let (w, wc) = upload_random(&g, &cpu, GgmlType::Q8_0, rows, cols, &mut rng);
        let xv = rng.vec(cols);
        let x = up(&g, &xv);
        g.set_profiling(true);
        g.profile_take();
        let mut y = g.alloc(rows);
        g.matmul(&w, &x, 1, &mut y);
        let launches = g.profile_take();
        g.set_profiling(false);
        let ran = launches.contains_key("mv_q8_0_r2n");
        assert_eq!(ran, cols <= 2048, "{rows}x{cols}: {launches:?}");
        let xc = up(&cpu, &xv);
        let mut yc = cpu.alloc(rows);
        cpu.matmul(&wc, &xc, 1, &mut yc);
        check(
            &format!("narrow Q8_0 {rows}x{cols} vs CPU"),
            &down(&g, &y, rows),
            &down(&cpu, &yc, rows),
            1e-4,
        );
    }
    g.set_mv_rows_mode(1);
}
