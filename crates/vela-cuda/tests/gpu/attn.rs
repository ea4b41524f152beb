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

/// A cache holds device memory for the positions it has (pages mapped as it grows, unmapped
/// when it shrinks), and attention over rows that span several pages, a copy of it, an export
/// and import, and rows written again after the cache shrank all equal the CPU's.
#[test]
fn kv_cache_is_held_by_use() {
    let Some(g) = gpu() else { return };
    g.set_flash_decode_min_keys(usize::MAX);
    let cpu = CpuBackend::new(0);
    // f32 rows of 2 heads × 64: 512 bytes, so a 2 MB page holds 4,096 positions.
    let (nh, nkv, hd, cap, ty) = (8usize, 2usize, 64usize, 100_000usize, KvType::F32);
    let row = nkv * hd;
    let spec = kv_spec(nkv, hd, cap, None);
    let specs = [spec.clone(), spec];
    let whole = specs.len() * 2 * cap * row * 4;
    let mut kg = g.new_kv(&specs, ty).unwrap();
    let mut kc = cpu.new_kv(&specs, ty).unwrap();
    assert_eq!(g.kv_bytes(&kg), 0, "a new cache holds no memory");
    let p = attn_params(nh, nkv, hd, 0.125, None, None);
    // (Thousands of keys: summation order moves the f32 results by a little more than the
    // short-context bound; a wrong or unmapped page would be off by the values' scale.)
    let tol = 1e-4;
    // Store `n` rows at p0.., then attend from the last two positions (all earlier keys).
    let grow = |kg: &mut <CudaBackend as Backend>::Kv,
                kc: &mut <CpuBackend as Backend>::Kv,
                p0: usize,
                n: usize,
                rng: &mut Rng|
     -> (Vec<f32>, Vec<f32>) {
        g.kv_reserve(kg, p0 + n).unwrap();
        cpu.kv_reserve(kc, p0 + n).unwrap();
        let pos: Vec<u32> = (p0..p0 + n).map(|p| p as u32).collect();
        let (k, v) = (rng.vec(n * row), rng.vec(n * row));
        for layer in 0..2 {
            g.kv_store(kg, layer, &up(&g, &k), &up(&g, &v), &pos);
            cpu.kv_store(kc, layer, &up(&cpu, &k), &up(&cpu, &v), &pos);
        }
        let last = &pos[n - 2..];
        let q = rng.vec(2 * nh * hd);
        let (mut og, mut oc) = (g.alloc(2 * nh * hd), cpu.alloc(2 * nh * hd));
        g.attention(&up(&g, &q), kg, 1, last, &p, &mut og);
        cpu.attention(&up(&cpu, &q), kc, 1, last, &p, &mut oc);
        (down(&g, &og, 2 * nh * hd), down(&cpu, &oc, 2 * nh * hd))
    };
    let mut rng = Rng(41);
    let mut p0 = 0;
    for n in [3_000, 5_000, 2, 9_000] {
        let (a, b) = grow(&mut kg, &mut kc, p0, n, &mut rng);
        check(&format!("paged attention at {}", p0 + n), &a, &b, tol);
        p0 += n;
    }
    let held = g.kv_bytes(&kg);
    eprintln!("{p0} positions: {held} bytes held of {whole}");
    assert!(
        held >= specs.len() * 2 * p0 * row * 4,
        "{held} bytes hold {p0} rows"
    );
    assert!(held < whole / 2, "{held} bytes held of {whole}");
    // A copy and an export hold the same rows.
    let mut fork = g.kv_clone(&kg).unwrap();
    let mut fork_c = cpu.kv_clone(&kc).unwrap();
    assert_eq!(g.kv_bytes(&fork), held);
    let mut imported = g.new_kv(&specs, ty).unwrap();
    g.kv_import(&mut imported, &g.kv_export(&kg, p0)).unwrap();
    let (a, b) = grow(&mut fork, &mut fork_c, p0, 2, &mut Rng(7));
    check("paged attention of a copy", &a, &b, tol);
    let (a2, _) = grow(
        &mut imported,
        &mut cpu.kv_clone(&kc).unwrap(),
        p0,
        2,
        &mut Rng(7),
    );
    check("paged attention of an import", &a2, &a, 0.0);
    // Shrink: the pages above the kept positions go; rows written again past them are the
    // new rows, not the old ones.
    g.kv_release(&mut kg, 100);
    cpu.kv_release(&mut kc, 100);
    let small = g.kv_bytes(&kg);
    eprintln!("after release to 100 positions: {small} bytes");
    assert!(
        small * 4 <= held,
        "{small} bytes held after release (was {held})"
    );
    let (a, b) = grow(&mut kg, &mut kc, 100, 6_000, &mut Rng(8));
    check("paged attention after release", &a, &b, tol);
    g.set_flash_decode_min_keys(vela_cuda::tuning::FLASH_DECODE_MIN_KEYS);
}
