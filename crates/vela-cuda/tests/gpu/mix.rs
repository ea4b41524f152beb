//! One-token products of different weight types in one launch (`mv_mix*_x3`, default;
//! `VELA_CUDA_MIXED_X3=0` off) and the Q/K/V biases added by them (`mv_mix*_x3b`, default;
//! `VELA_CUDA_BIAS_FUSE=0` off): the same bits as separate products and `add_bias`.

use super::*;

/// llama.cpp's _M mixtures give attn_v more bits than attn_q / attn_k: Q5_0, Q5_0, Q8_0 at
/// Qwen2.5-0.5B's shapes (896 columns; q 896 rows, k and v 128), Q4_0 (split rows) with Q8_0, and
/// the split-row k-quants Q4_K, Q4_K, Q6_K; two and three weights, with and without biases, one
/// row per warp against the separate kernels (which may take two).
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
            // (mixed, bias-fused) runs, each from the same x: separate, mixed, mixed + bias.
            let mut outs = Vec::new();
            for (mixed, fuse) in [(false, false), (true, false), (true, true)] {
                g.set_mixed_x3(mixed);
                g.set_bias_fuse(fuse);
                let mut x = up(&g, &x0);
                let mut h = g.alloc(cols);
                let mut ys: Vec<_> = rows[..k].iter().map(|&r| g.alloc(r)).collect();
                {
                    let wr: Vec<&vela_cuda::CudaWeight> = ws[..k].iter().collect();
                    let br: Vec<Option<&vela_cuda::CudaBuf>> = bs[..k].iter().map(Some).collect();
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
                let y: Vec<Vec<f32>> = ys.iter().zip(rows).map(|(y, r)| down(&g, y, r)).collect();
                outs.push((y, down(&g, &x, cols)));
            }
            // (Back to the defaults.)
            g.set_mixed_x3(true);
            g.set_bias_fuse(true);
            for (i, name) in [(1, "mixed"), (2, "mixed + bias")] {
                for j in 0..k {
                    check(
                        &format!("{tag} k={k} {name} product {j}"),
                        &outs[i].0[j],
                        &outs[0].0[j],
                        0.0,
                    );
                }
                check(
                    &format!("{tag} k={k} {name} residual"),
                    &outs[i].1,
                    &outs[0].1,
                    0.0,
                );
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
