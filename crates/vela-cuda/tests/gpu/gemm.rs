//! Prefill products on tensor cores (f16 tiles + cuBLAS, src/gemm.rs) against the CPU backend's
//! exact mode, and their speed against the integer `mm_*_t8` kernels on Llama-3-8B shapes.

use super::*;
use vela_compute::cpu::matmul::exact;

const TYPES: [GgmlType; 10] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::F16,
    GgmlType::F32,
];

/// cuBLAS products (every weight type, odd row counts, several chunks when the scratch limit is
/// forced down) vs the CPU's exact f32/f64 product: only f16 rounding of the two operands.
#[test]
fn gemm_prefill_matches_cpu_exact() {
    let Some(g) = gpu() else { return };
    if !g.gemm_available() {
        assert!(
            std::env::var("VELA_REQUIRE_GPU").as_deref() != Ok("1"),
            "cuBLAS could not be loaded"
        );
        eprintln!("SKIP (no cuBLAS)");
        return;
    }
    let cpu = CpuBackend::new(0);
    let mut rng = Rng(0x6e33_1234);
    for ty in TYPES {
        // Float weights in rows of 32 too (the cuBLAS path needs rows of whole 32-element blocks).
        let bs = ty.block_size().max(32);
        for &(rows, nb, n) in &[(300usize, 2usize, 32usize), (77, 9, 75), (1030, 1, 40)] {
            let cols = bs * nb;
            // The last shape in chunks of 100 rows (11 cuBLAS calls into one output).
            g.set_gemm_chunk_elems(if rows == 1030 { 100 * cols } else { 64 << 20 });
            let (wg, wc) = upload_random(&g, &cpu, ty, rows, cols, &mut rng);
            let x = rng.vec(n * cols);
            let (xg, xc) = (up(&g, &x), up(&cpu, &x));
            let (mut yg, mut yi, mut yc) =
                (g.alloc(n * rows), g.alloc(n * rows), cpu.alloc(n * rows));
            g.matmul(&wg, &xg, n, &mut yg);
            g.set_gemm_min(0);
            g.matmul(&wg, &xg, n, &mut yi);
            g.set_gemm_min(16);
            exact::set_thread_override(Some(true));
            cpu.matmul(&wc, &xc, n, &mut yc);
            exact::set_thread_override(None);
            let (gm, im) = (down(&g, &yg, n * rows), down(&g, &yi, n * rows));
            let (mi, ni) = err(&im, &yc[..n * rows]);
            eprintln!(
                "RESULT | int8 path vs exact {} {rows}x{cols} n={n} | max_err/rms {mi:.2e} nmse {ni:.2e} | | info |",
                ty.name()
            );
            check(
                &format!("gemm {} {rows}x{cols} n={n}", ty.name()),
                &gm,
                &yc[..n * rows],
                4e-3,
            );
        }
    }
}

/// Prefill product speed on Llama-3-8B shapes: cuBLAS path vs the integer kernels, 512 tokens,
/// and the crossover batch size on a 4096x4096 Q4_0 weight.
#[test]
fn gemm_speed() {
    let Some(g) = gpu() else { return };
    if !g.gemm_available() {
        return;
    }
    let cpu = CpuBackend::new(0);
    let mut rng = Rng(7);
    let time = |w: &vela_cuda::CudaWeight,
                x: &vela_cuda::CudaBuf,
                n: usize,
                y: &mut vela_cuda::CudaBuf| {
        g.matmul(w, x, n, y);
        g.synchronize().unwrap();
        let reps = 20;
        let t = Instant::now();
        for _ in 0..reps {
            g.matmul(w, x, n, y);
        }
        g.synchronize().unwrap();
        t.elapsed().as_secs_f64() / reps as f64
    };
    for ty in [GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q8_0] {
        for &(rows, cols) in &[(4096usize, 4096usize), (14336, 4096), (4096, 14336)] {
            let (wg, _) = upload_random(&g, &cpu, ty, rows, cols, &mut rng);
            let n = 512;
            let xg = up(&g, &rng.vec(n * cols));
            let mut y = g.alloc(n * rows);
            let flop = 2.0 * (rows * cols * n) as f64;
            g.set_gemm_min(16);
            let tg = time(&wg, &xg, n, &mut y);
            g.set_gemm_min(0);
            let ti = time(&wg, &xg, n, &mut y);
            g.set_gemm_min(16);
            eprintln!(
                "RESULT | prefill product {} {rows}x{cols} n={n} | cublas {:.1} us {:.0} TFLOP/s, int8 {:.1} us {:.0} TFLOP/s | | info |",
                ty.name(),
                tg * 1e6,
                flop / tg / 1e12,
                ti * 1e6,
                flop / ti / 1e12
            );
        }
    }
    let (wg, _) = upload_random(&g, &cpu, GgmlType::Q4_0, 4096, 4096, &mut rng);
    let xg = up(&g, &rng.vec(256 * 4096));
    let mut y = g.alloc(256 * 4096);
    let mut line = String::from("crossover Q4_0 4096x4096 (us int8/cublas)");
    for n in [2usize, 4, 8, 16, 24, 32, 64, 128, 256] {
        g.set_gemm_min(0);
        let ti = time(&wg, &xg, n, &mut y);
        g.set_gemm_min(1);
        let tg = time(&wg, &xg, n, &mut y);
        line += &format!(" | n={n}: {:.1}/{:.1}", ti * 1e6, tg * 1e6);
    }
    g.set_gemm_min(16);
    eprintln!("RESULT | {line} | | info |");
}

/// The prefill attention kernels (four warps per row, 32 warps per row)
/// against the CPU on batches big enough to select them (8 heads x 300 and 260 rows), with and
/// without a sliding window and a softcap, F16 and F32 caches.
#[test]
fn prefill_attention_kernels_match_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(0);
    let (nh, nkv) = (8usize, 2usize);
    // Flash attention for f16/bf16 with hd 64/128/256 (Q and P rounded to the cache type: a
    // looser bound), else the 4-warp kernel. hd 512: with an f16 cache and no ring wrap the
    // cuBLAS products (attn_gemm.rs), else the `_d512` 4-warp kernel (Gemma 4's full layers).
    for (ty, hd) in [
        (KvType::F16, 64usize),
        (KvType::F32, 64),
        (KvType::Bf16, 64),
        (KvType::F16, 128),
        (KvType::Bf16, 128),
        (KvType::F16, 256),
        (KvType::Bf16, 256),
        (KvType::F16, 512),
    ] {
        for (window, softcap) in [(None, None), (Some(100usize), Some(30.0f32))] {
            {
                let mut rng = Rng(4040);
                let spec = kv_spec(nkv, hd, window.map_or(1024, |w| w + 300), window);
                let mut kg = g.new_kv(std::slice::from_ref(&spec), ty).unwrap();
                let mut kc = cpu.new_kv(std::slice::from_ref(&spec), ty).unwrap();
                let p = attn_params(nh, nkv, hd, 0.125, window, softcap);
                let mut p0 = 0;
                for n in [300usize, 260] {
                    let pos: Vec<u32> = (p0..p0 + n).map(|p| p as u32).collect();
                    let (k, v, q) = (
                        rng.vec(n * nkv * hd),
                        rng.vec(n * nkv * hd),
                        rng.vec(n * nh * hd),
                    );
                    g.kv_store(&mut kg, 0, &up(&g, &k), &up(&g, &v), &pos);
                    cpu.kv_store(&mut kc, 0, &up(&cpu, &k), &up(&cpu, &v), &pos);
                    let (mut og, mut oc) = (g.alloc(n * nh * hd), cpu.alloc(n * nh * hd));
                    g.attention(&up(&g, &q), &kg, 0, &pos, &p, &mut og);
                    cpu.attention(&up(&cpu, &q), &kc, 0, &pos, &p, &mut oc);
                    // (hd 512, f16, no ring wrap: cuBLAS products, Q and P rounded like flash.)
                    let gemm = ty == KvType::F16 && hd == 512 && p0 + n <= spec.capacity;
                    let flash = ty != KvType::F32 && (hd <= 256 || gemm);
                    let tol = attn_tol(ty, flash);
                    check(
                        &format!("prefill attention {ty:?} hd={hd} window={window:?} pos {p0}+{n}"),
                        &down(&g, &og, n * nh * hd),
                        &down(&cpu, &oc, n * nh * hd),
                        tol,
                    );
                    p0 += n;
                }
            }
        }
    }
}

/// Prefill attention time for one Llama-3-8B layer (32 heads, 8 KV heads, hd 128, f16 cache:
/// flash attention) and one Gemma 4 12B full layer (16 heads, 1 KV head, hd 512: cuBLAS) at 512
/// and 2,048 tokens; reported.
#[test]
fn prefill_attention_timing() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(77);
    for (what, nh, nkv, hd) in [
        ("8B layer", 32usize, 8usize, 128usize),
        ("Gemma 4 12B full layer", 16, 1, 512),
    ] {
        for n in [512usize, 2048] {
            let spec = kv_spec(nkv, hd, n, None);
            let mut kg = g.new_kv(std::slice::from_ref(&spec), KvType::F16).unwrap();
            let pos: Vec<u32> = (0..n as u32).collect();
            let (k, v, q) = (
                rng.vec(n * nkv * hd),
                rng.vec(n * nkv * hd),
                rng.vec(n * nh * hd),
            );
            g.kv_store(&mut kg, 0, &up(&g, &k), &up(&g, &v), &pos);
            let p = attn_params(nh, nkv, hd, 1.0 / (hd as f32).sqrt(), None, None);
            let qg = up(&g, &q);
            let mut og = g.alloc(n * nh * hd);
            g.attention(&qg, &kg, 0, &pos, &p, &mut og);
            g.synchronize().unwrap();
            let reps = 10;
            let t = Instant::now();
            for _ in 0..reps {
                g.attention(&qg, &kg, 0, &pos, &p, &mut og);
            }
            g.synchronize().unwrap();
            let us = t.elapsed().as_secs_f64() / reps as f64 * 1e6;
            let flop = 4.0 * (nh * hd) as f64 * (n * (n + 1) / 2) as f64;
            eprintln!(
                "RESULT | prefill attention {what} n={n} | {us:.1} us ({:.1} TFLOP/s) | | info |",
                flop / us / 1e6
            );
        }
    }
}

/// Head dim 512 (Gemma 4's full layers) through cuBLAS (`attention_gemm`: QKᵀ, row softmax, PV)
/// against the CPU: 16 query heads on 2 KV heads, chunks of 300 and 260 rows after each other,
/// with and without a sliding window and a softcap (no ring wrap); the cuBLAS path must have run
/// (its softmax kernel launched).
#[test]
fn prefill_attention_d512_gemm_matches_cpu() {
    let Some(g) = gpu() else { return };
    if !g.gemm_available() {
        eprintln!("SKIP prefill_attention_d512_gemm_matches_cpu: no cuBLAS");
        return;
    }
    let cpu = CpuBackend::new(0);
    let (nh, nkv, hd) = (16usize, 2usize, 512usize);
    for (window, softcap) in [(None, None), (Some(100usize), Some(30.0f32))] {
        let spec = kv_spec(nkv, hd, 1024, window);
        let mut kv = g.new_kv(std::slice::from_ref(&spec), KvType::F16).unwrap();
        let mut kc = cpu
            .new_kv(std::slice::from_ref(&spec), KvType::F16)
            .unwrap();
        let p = attn_params(nh, nkv, hd, 1.0, window, softcap);
        let mut rng = Rng(512);
        let mut p0 = 0;
        for n in [300usize, 260] {
            let pos: Vec<u32> = (p0..p0 + n).map(|p| p as u32).collect();
            let (k, v, q) = (
                rng.vec(n * nkv * hd),
                rng.vec(n * nkv * hd),
                rng.vec(n * nh * hd)
                    .iter()
                    .map(|x| 0.05 * x)
                    .collect::<Vec<_>>(),
            );
            g.kv_store(&mut kv, 0, &up(&g, &k), &up(&g, &v), &pos);
            cpu.kv_store(&mut kc, 0, &up(&cpu, &k), &up(&cpu, &v), &pos);
            g.set_profiling(true);
            g.profile_take();
            let mut o = g.alloc(n * nh * hd);
            g.attention(&up(&g, &q), &kv, 0, &pos, &p, &mut o);
            let softmax = g
                .profile_take()
                .get("attn_softmax_f16")
                .map_or(0, |v| v.1 as usize);
            g.set_profiling(false);
            assert_eq!(softmax, nkv, "cuBLAS path taken");
            let mut oc = cpu.alloc(n * nh * hd);
            cpu.attention(&up(&cpu, &q), &kc, 0, &pos, &p, &mut oc);
            check(
                &format!("prefill attention hd=512 cuBLAS vs CPU window={window:?} pos {p0}+{n}"),
                &down(&g, &o, n * nh * hd),
                &down(&cpu, &oc, n * nh * hd),
                5e-3,
            );
            p0 += n;
        }
    }
}
