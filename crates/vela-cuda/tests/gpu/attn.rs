//! The fused decode attention against the unfused ops: `flash_decode_*` (split-K on the tensor
//! cores) and the second split-K version, each merged by `attention_combine`, which quantizes the
//! output for a Q8 product (a Q8_K one gets a `quantize_q8k` launch).

use super::*;

/// `attention_matmul` (the attention quantizing its output for the projection) equals
/// `attention` then `matmul` bit for bit, for Q8 (Q4_0) and Q8_K (Q4_K) products, head dims 64,
/// 128, 256 and 512 (and 32, second version only), 1 and 3 query rows, short and long contexts
/// (one part and many), a sliding window that wraps its ring, F16 and BF16 caches, with the
/// tensor-core kernel at every length and with the second version at every length; and the
/// attention stays within the kernel's bound of the CPU.
#[test]
fn fused_attention_matmul_equals_unfused() {
    let Some(g) = gpu() else { return };
    for flash in [true, false] {
        g.set_flash_decode_min_keys(if flash { 0 } else { usize::MAX });
        // (An sm_86/89 GPU's shared memory does not hold the 256 / 512 kernels.)
        let dims = g.flash_decode_dims();
        eprintln!("tensor-core decode attention head dims: {dims:?}");
        fused_attention_matmul_case(&g, flash);
    }
    // (The default.)
    g.set_flash_decode_min_keys(vela_cuda::tuning::FLASH_DECODE_MIN_KEYS);
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
        // Head dim 256 (tensor cores where the shared memory holds the kernel): Gemma 3 270M's
        // 4 heads over 1 KV head, Gemma 4 12B's sliding layers' 16 over 8; then (second version
        // only) eight heads per Q8_K block.
        (KvType::F16, 256, 4, 1, GgmlType::Q4_K),
        (KvType::Bf16, 256, 16, 8, GgmlType::Q4_0),
        // Head dim 512 (likewise): Gemma 4's full layers, 16 heads over 1 KV
        // head; and 4 over 2 in BF16.
        (KvType::F16, 512, 16, 1, GgmlType::Q4_0),
        (KvType::Bf16, 512, 4, 2, GgmlType::Q4_K),
        (KvType::F16, 32, 16, 4, GgmlType::Q4_K),
    ] {
        let width = nh * hd;
        let (wg, _) = upload_random(g, &cpu, wty, 96, width, &mut rng);
        let steps = [40usize, 1, 3, 500, 400, 1, 3];
        let shape = (ty, hd, nh, nkv);
        walk_cache(
            g,
            Some(&cpu),
            shape,
            &steps,
            &mut rng,
            |rng, pos, p, kg, kc| {
                let (n, window) = (pos.len(), p.window);
                let kc = kc.expect("CPU cache");
                let q = rng.vec(n * width);
                let qg = up(g, &q);
                let (mut a1, mut a2, mut ac) =
                    (g.alloc(n * width), g.alloc(n * width), cpu.alloc(n * width));
                let (mut y1, mut y2) = (g.alloc(n * 96), g.alloc(n * 96));
                // (The tensor-core kernels have head dims 64, 128, 256 and 512; others take
                // the second version at every length.)
                let tc = flash && g.flash_decode_dims().contains(&hd);
                g.set_profiling(true);
                g.profile_take();
                g.attention_matmul(&qg, kg, 0, pos, p, &mut a1, &wg, &mut y1);
                let ran = g
                    .profile_take()
                    .iter()
                    .any(|(k, _)| k.starts_with("flash_decode_"));
                g.set_profiling(false);
                assert_eq!(
                    ran, tc,
                    "hd={hd} flash={flash}: tensor-core kernel ran: {ran}"
                );
                g.attention(&qg, kg, 0, pos, p, &mut a2);
                g.matmul(&wg, &a2, n, &mut y2);
                cpu.attention(&up(&cpu, &q), kc, 0, pos, p, &mut ac);
                let tag = format!(
                    "fused attention+matmul {} {ty:?} hd={hd} G={} {} window={window:?} pos {}+{n}",
                    if tc { "tensor-core" } else { "second version" },
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
                let tol = match (tc, ty) {
                    (false, _) => 1e-4,
                    (true, KvType::F16) => 5e-3,
                    _ => 4e-2,
                };
                check(&format!("{tag} attention vs CPU"), &a1, &ac, tol);
            },
        );
    }
}

/// A decode cache of `shape` (cache type, head dim, heads, KV heads) walked twice, without and
/// with a 300-key window (capacity 2,048 / window + 512; a batch never exceeds the ring: slots
/// written twice in one batch race): each step of `steps` stores that many random K/V rows (into
/// the CPU cache too when `cpu` is given) and, for steps of at most 4 rows, calls
/// `f(rng, positions, params, GPU cache, CPU cache)`.
fn walk_cache(
    g: &CudaBackend,
    cpu: Option<&CpuBackend>,
    (ty, hd, nh, nkv): (KvType, usize, usize, usize),
    steps: &[usize],
    rng: &mut Rng,
    mut f: impl FnMut(
        &mut Rng,
        &[u32],
        &AttnParams,
        &vela_cuda::CudaKv,
        Option<&<CpuBackend as Backend>::Kv>,
    ),
) {
    for window in [None, Some(300usize)] {
        let spec = kv_spec(nkv, hd, window.map_or(2048, |w| w + 512), window);
        let mut kg = g.new_kv(std::slice::from_ref(&spec), ty).unwrap();
        let mut kc = cpu.map(|c| c.new_kv(std::slice::from_ref(&spec), ty).unwrap());
        let p = attn_params(nh, nkv, hd, 1.0 / (hd as f32).sqrt(), window, None);
        let mut p0 = 0usize;
        for &n in steps {
            let pos: Vec<u32> = (p0..p0 + n).map(|x| x as u32).collect();
            p0 += n;
            let (k, v) = (rng.vec(n * nkv * hd), rng.vec(n * nkv * hd));
            g.kv_store(&mut kg, 0, &up(g, &k), &up(g, &v), &pos);
            if let (Some(c), Some(kc)) = (cpu, kc.as_mut()) {
                c.kv_store(kc, 0, &up(c, &k), &up(c, &v), &pos);
            }
            if n <= 4 {
                f(rng, &pos, &p, &kg, kc.as_ref());
            }
        }
    }
}

/// The split-K parts (one warp each, `attention_partw_*`, for head dims 64 and 128 of 16-bit
/// caches, their count following the keys: 30 parts at 945 keys; four warps each for head dim
/// 256) within the split-K bound of the CPU, quantizing for a product, F16 and BF16 caches, 1 and
/// 3 query rows, short and long contexts (pieces of 32 keys, partial last pieces), with and
/// without a window; the warp kernel ran exactly for head dims 64 and 128.
#[test]
fn split_parts_match_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(0);
    let mut rng = Rng(0x3a7f);
    g.set_flash_decode_min_keys(usize::MAX);
    for (ty, hd, nh, nkv) in [
        (KvType::F16, 64usize, 14usize, 2usize),
        (KvType::Bf16, 128, 32, 8),
        (KvType::F16, 256, 4, 1),
        (KvType::F16, 64, 9, 3),
    ] {
        let width = nh * hd;
        let (wg, _) = upload_random(&g, &cpu, GgmlType::Q4_0, 64, width, &mut rng);
        let steps = [40usize, 1, 3, 500, 400, 1, 3];
        let shape = (ty, hd, nh, nkv);
        walk_cache(
            &g,
            Some(&cpu),
            shape,
            &steps,
            &mut rng,
            |rng, pos, p, kg, kc| {
                let n = pos.len();
                let q = rng.vec(n * width);
                let qg = up(&g, &q);
                let mut ac = cpu.alloc(n * width);
                cpu.attention(&up(&cpu, &q), kc.expect("CPU cache"), 0, pos, p, &mut ac);
                let ac = down(&cpu, &ac, n * width);
                let tag = format!(
                    "{ty:?} hd={hd} {nh}/{nkv} window={:?} pos {}+{n}",
                    p.window, pos[0]
                );
                let (mut a, mut y) = (g.alloc(n * width), g.alloc(n * 64));
                g.set_profiling(true);
                g.profile_take();
                g.attention_matmul(&qg, kg, 0, pos, p, &mut a, &wg, &mut y);
                let launches = g.profile_take();
                g.set_profiling(false);
                let ran = launches.keys().any(|k| k.starts_with("attention_partw_"));
                assert_eq!(ran, hd != 256, "{tag}: {launches:?}");
                check(
                    &format!("{tag} split parts vs CPU"),
                    &down(&g, &a, n * width),
                    &ac,
                    1e-4,
                );
            },
        );
    }
    g.set_flash_decode_min_keys(vela_cuda::tuning::FLASH_DECODE_MIN_KEYS);
}
