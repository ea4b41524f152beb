//! The fused decode attention against the unfused ops: `flash_decode_*` (split-K on the tensor
//! cores, the combine in the last block, the output quantized for the next product) and the
//! second split-K version whose `attention_combine` quantizes the output.

use super::*;

/// `attention_matmul` (the attention quantizing its output for the projection) equals
/// `attention` then `matmul` bit for bit, for Q8 (Q4_0) and Q8_K (Q4_K) products, head dims 64
/// and 128, 1 and 3 query rows, short and long contexts (one part and many), a sliding window
/// that wraps its ring, F16 and BF16 caches, with the tensor-core kernel at every length and
/// with the second version at every length; and the attention stays within the kernel's bound of
/// the CPU.
#[test]
fn fused_attention_matmul_equals_unfused() {
    let Some(g) = gpu() else { return };
    for flash in [true, false] {
        g.set_flash_decode_min_keys(if flash { 0 } else { usize::MAX });
        fused_attention_matmul_case(&g, flash);
    }
    g.set_flash_decode_min_keys(1536);
}

fn fused_attention_matmul_case(g: &CudaBackend, flash: bool) {
    let cpu = CpuBackend::new(0);
    let mut rng = Rng(0xfd);
    for (ty, hd, nh, nkv, wty) in [
        (KvType::F16, 128usize, 32usize, 8usize, GgmlType::Q4_0),
        (KvType::F16, 128, 32, 8, GgmlType::Q4_K),
        (KvType::Bf16, 64, 14, 2, GgmlType::Q4_0),
        (KvType::F16, 64, 9, 3, GgmlType::Q8_0),
        (KvType::F16, 64, 16, 4, GgmlType::Q4_K),
        (KvType::F16, 64, 12, 4, GgmlType::Q4_K),
    ] {
        let width = nh * hd;
        let (wg, _) = upload_random(g, &cpu, wty, 96, width, &mut rng);
        for window in [None, Some(300usize)] {
            let cap = window.map_or(2048, |w| w + 512);
            decode_rows(
                g,
                &cpu,
                ty,
                (hd, nh, nkv),
                window,
                cap,
                &mut rng,
                |pos, kg, kc, p, rng| {
                    let n = pos.len();
                    let q = rng.vec(n * width);
                    let qg = up(g, &q);
                    let (mut a1, mut a2, mut ac) =
                        (g.alloc(n * width), g.alloc(n * width), cpu.alloc(n * width));
                    let (mut y1, mut y2) = (g.alloc(n * 96), g.alloc(n * 96));
                    g.attention_matmul(&qg, kg, 0, pos, p, &mut a1, &wg, &mut y1);
                    g.attention(&qg, kg, 0, pos, p, &mut a2);
                    g.matmul(&wg, &a2, n, &mut y2);
                    cpu.attention(&up(&cpu, &q), kc, 0, pos, p, &mut ac);
                    let tag = format!(
                    "fused attention+matmul {} {ty:?} hd={hd} G={} {} window={window:?} pos {}+{n}",
                    if flash { "tensor-core" } else { "second version" },
                    nh / nkv,
                    wty.name(),
                    pos[0]
                );
                    let (a1, a2) = (down(g, &a1, n * width), down(g, &a2, n * width));
                    check(&format!("{tag} attention == unfused"), &a1, &a2, 0.0);
                    check(
                        &format!("{tag} product == unfused"),
                        &down(g, &y1, n * 96),
                        &down(g, &y2, n * 96),
                        0.0,
                    );
                    // Tensor cores: Q and P rounded to the cache type (the flash prefill test's
                    // bound); else the split-K test's.
                    let tol = match (flash, ty) {
                        (false, _) => 1e-4,
                        (true, KvType::F16) => 5e-3,
                        _ => 4e-2,
                    };
                    check(&format!("{tag} attention vs CPU"), &a1, &ac, tol);
                },
            );
        }
    }
}

/// The cluster-merged split-K attention (`attention_part2c_*`, opt-in `VELA_CUDA_ATTN_CLUSTER`)
/// equals the second version's parts + `attention_combine` bit for bit where both use the same
/// parts (here 8 or 4: 32 or 64 query heads), its Q8 output for the o projection included, and
/// stays within the split-K bound of the CPU; F32/F16/BF16 caches, head dims 64/128, 1 and 3 rows,
/// short and long rows, a window that wraps its ring.
#[test]
fn cluster_attention_equals_part2_combine() {
    let Some(g) = gpu() else { return };
    if g.arch < 90 {
        eprintln!(
            "SKIP cluster_attention_equals_part2_combine: sm_{} has no clusters",
            g.arch
        );
        return;
    }
    g.set_flash_decode(false);
    let cpu = CpuBackend::new(0);
    let mut rng = Rng(0xc1);
    for (ty, hd, nh, nkv, window) in [
        (KvType::F16, 128usize, 32usize, 8usize, None),
        (KvType::Bf16, 64, 64, 8, None),
        (KvType::F32, 64, 32, 4, None),
        (KvType::F16, 128, 32, 8, Some(300usize)),
    ] {
        let width = nh * hd;
        let (wg, _) = upload_random(&g, &cpu, GgmlType::Q4_0, 96, width, &mut rng);
        let cap = window.map_or(if nh == 64 { 1024 } else { 2048 }, |w| w + 512);
        decode_rows(
            &g,
            &cpu,
            ty,
            (hd, nh, nkv),
            window,
            cap,
            &mut rng,
            |pos, kg, kc, p, rng| {
                let n = pos.len();
                let q = rng.vec(n * width);
                let qg = up(&g, &q);
                let run = |cluster: bool| {
                    g.set_attention_cluster(cluster);
                    let (mut a, mut a2) = (g.alloc(n * width), g.alloc(n * width));
                    let mut y = g.alloc(n * 96);
                    g.attention(&qg, kg, 0, pos, p, &mut a);
                    g.attention_matmul(&qg, kg, 0, pos, p, &mut a2, &wg, &mut y);
                    g.set_attention_cluster(false);
                    (
                        down(&g, &a, n * width),
                        down(&g, &a2, n * width),
                        down(&g, &y, n * 96),
                    )
                };
                let (a0, _, y0) = run(false);
                let (a1, a1m, y1) = run(true);
                let mut ac = cpu.alloc(n * width);
                cpu.attention(&up(&cpu, &q), kc, 0, pos, p, &mut ac);
                let tag = format!(
                    "cluster attention {ty:?} hd={hd} heads={nh} window={window:?} pos {}+{n}",
                    pos[0]
                );
                check(&format!("{tag} == parts + combine"), &a1, &a0, 0.0);
                check(&format!("{tag} fused == unfused"), &a1m, &a1, 0.0);
                check(
                    &format!("{tag} o projection == parts + combine"),
                    &y1,
                    &y0,
                    0.0,
                );
                let tol = if ty == KvType::F32 { 1e-5 } else { 1e-4 };
                check(
                    &format!("{tag} vs CPU"),
                    &a1,
                    &down(&cpu, &ac, n * width),
                    tol,
                );
            },
        );
    }
    g.set_flash_decode(true);
}

/// One cache layer of `ty` on both backends ((head dim, query heads, KV heads), `window`,
/// `capacity`), filled with random K/V in batches of 40, 1, 3, 500, 400, 1 and 3 positions; after
/// each batch of at most 4 rows, `f(positions, GPU cache, CPU cache, params, rng)`. (A batch never
/// exceeds the ring: slots written twice in one batch race.)
#[allow(clippy::too_many_arguments)]
fn decode_rows(
    g: &CudaBackend,
    cpu: &CpuBackend,
    ty: KvType,
    (hd, nh, nkv): (usize, usize, usize),
    window: Option<usize>,
    capacity: usize,
    rng: &mut Rng,
    mut f: impl FnMut(&[u32], &vela_cuda::CudaKv, &<CpuBackend as Backend>::Kv, &AttnParams, &mut Rng),
) {
    let spec = KvLayerSpec {
        n_head_kv: nkv,
        head_dim_k: hd,
        head_dim_v: hd,
        capacity,
        window,
    };
    let mut kg = g.new_kv(std::slice::from_ref(&spec), ty).unwrap();
    let mut kc = cpu.new_kv(std::slice::from_ref(&spec), ty).unwrap();
    let p = AttnParams {
        n_head: nh,
        n_head_kv: nkv,
        head_dim_k: hd,
        head_dim_v: hd,
        scale: 1.0 / (hd as f32).sqrt(),
        window,
        softcap: None,
    };
    let mut p0 = 0usize;
    for n in [40usize, 1, 3, 500, 400, 1, 3] {
        let pos: Vec<u32> = (p0..p0 + n).map(|x| x as u32).collect();
        p0 += n;
        let (k, v) = (rng.vec(n * nkv * hd), rng.vec(n * nkv * hd));
        g.kv_store(&mut kg, 0, &up(g, &k), &up(g, &v), &pos);
        cpu.kv_store(&mut kc, 0, &up(cpu, &k), &up(cpu, &v), &pos);
        if n <= 4 {
            f(&pos, &kg, &kc, &p, rng);
        }
    }
}
