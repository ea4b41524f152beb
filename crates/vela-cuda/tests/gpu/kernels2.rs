//! Decode kernels against references: the one-token matvec (`mv_*`), the fused norm, RoPE and
//! decode attention kernels and split rows against the CPU backend, the exact matmul mode against
//! the CPU's exact mode, device argmax against the CPU sampler's argmax, and a matvec bandwidth
//! and decode attention timing.

use super::*;
use vela_compute::cpu::matmul::exact;

const QUANT_TYPES: [GgmlType; 8] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Decode matvec vs CPU (all quantized types, odd shapes: rows not a multiple of the 4 rows per
/// block, block counts not a multiple of 32 lanes × 4 unrolled blocks), one and two rows per warp.
#[test]
fn matvec_matches_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(0);
    let mut rng = Rng(0xfeed_beef_1234_5678);
    for ty in QUANT_TYPES {
        let bs = ty.block_size();
        // nb 8, 136: Q4_0 in split rows (`mv_q4_0s*`).
        for &(rows, nb) in &[
            (37usize, 3usize),
            (130, 9),
            (1001, 37),
            (6, 130),
            (64, 300),
            (37, 8),
            (1001, 136),
        ] {
            let cols = bs * nb;
            let (wg, wc) = upload_random(&g, &cpu, ty, rows, cols, &mut rng);
            let x = rng.vec(cols);
            let (xg, xc) = (up(&g, &x), up(&cpu, &x));
            let (mut yn, mut yc) = (g.alloc(rows), cpu.alloc(rows));
            g.matmul(&wg, &xg, 1, &mut yn);
            // One row per warp (`mv_*`) gives the same bits as two (`mv_*_r2`).
            let (mut y1, mut y2) = (g.alloc(rows), g.alloc(rows));
            g.set_mv_rows_mode(0);
            g.matmul(&wg, &xg, 1, &mut y1);
            g.set_mv_rows_mode(2);
            g.matmul(&wg, &xg, 1, &mut y2);
            g.set_mv_rows_mode(1);
            assert_eq!(
                down(&g, &y1, rows),
                down(&g, &y2, rows),
                "matvec 1 vs 2 rows per warp {} {rows}x{cols}",
                ty.name()
            );
            cpu.matmul(&wc, &xc, 1, &mut yc);
            let what = format!("matvec {} {rows}x{cols}", ty.name());
            check(&what, &down(&g, &yn, rows), &yc[..rows], 1e-4);
        }
    }
}

/// Exact mode (f32 weights and activations, f64 sums) on both backends: equal to f32 rounding.
#[test]
fn exact_matmul_matches_cpu_exact() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(0);
    let mut rng = Rng(0x5eed_0000_aaaa_5555);
    exact::set_thread_override(Some(true));
    g.set_exact_matmul(true);
    let mut types = QUANT_TYPES.to_vec();
    types.extend([GgmlType::F16, GgmlType::F32]);
    for ty in types {
        let bs = ty.block_size();
        for &(rows, nb) in &[(37usize, 3usize), (130, 9), (21, 16)] {
            let cols = bs * nb;
            let (wg, wc) = upload_random(&g, &cpu, ty, rows, cols, &mut rng);
            for n in [1usize, 3, 17] {
                let x = rng.vec(n * cols);
                let (xg, xc) = (up(&g, &x), up(&cpu, &x));
                let (mut yg, mut yc) = (g.alloc(n * rows), cpu.alloc(n * rows));
                g.matmul(&wg, &xg, n, &mut yg);
                cpu.matmul(&wc, &xc, n, &mut yc);
                let what = format!("exact matmul {} {rows}x{cols} n={n}", ty.name());
                check(&what, &down(&g, &yg, n * rows), &yc[..n * rows], 1e-6);
            }
        }
    }
    g.set_exact_matmul(false);
    exact::set_thread_override(None);
}

/// `vela_engine::sampler::argmax` (the CPU sampler's greedy choice), replicated here because
/// vela-engine depends on this crate: lowest id on ties, NaNs skipped.
fn sampler_argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] || logits[best].is_nan() {
            best = i;
        }
    }
    best as u32
}

#[test]
fn device_argmax_matches_cpu_sampler() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(0);
    let mut rng = Rng(4242);
    let width = 49_153;
    let n_rows = 6;
    let mut x = rng.vec(n_rows * width);
    // Row 1: a tie between two maxima (lowest index wins); row 2: NaNs before and after the
    // maximum; row 3: the maximum in the last element; row 4: all equal; row 5: -inf mostly.
    x[width + 100] = 5.0;
    x[width + 40_000] = 5.0;
    x[2 * width] = f32::NAN;
    x[2 * width + 7] = 9.0;
    x[2 * width + 9] = f32::NAN;
    x[4 * width - 1] = 3.0;
    x[4 * width..5 * width].fill(0.25);
    x[5 * width..6 * width].fill(f32::NEG_INFINITY);
    x[5 * width + 33_333] = -1e30;
    let xg = up(&g, &x);
    let xc = up(&cpu, &x);
    let dev = g.argmax_rows(&xg, n_rows, width);
    let host = cpu.argmax_rows(&xc, n_rows, width);
    let sampler: Vec<u32> = x.chunks_exact(width).map(sampler_argmax).collect();
    let ok = dev == sampler && host == sampler;
    eprintln!(
        "RESULT | device argmax {n_rows}x{width} | gpu {dev:?} cpu {host:?} sampler {sampler:?} | | {} |",
        if ok { "ok" } else { "FAIL" }
    );
    assert!(
        ok,
        "argmax differs: gpu {dev:?} cpu {host:?} sampler {sampler:?}"
    );
}

/// Decode matvec bandwidth on large matrices (Llama-3-8B shapes): bytes of the weight matrix per
/// launch / time per launch (many launches back to back, one sync).
#[test]
fn matvec_bandwidth() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(0);
    let mut rng = Rng(99);
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ] {
        for &(rows, cols) in &[(4096usize, 4096usize), (14336, 4096), (4096, 14336)] {
            let (wg, _) = upload_random(&g, &cpu, ty, rows, cols, &mut rng);
            let bytes = ty.row_bytes(cols as u64).unwrap() as f64 * rows as f64;
            let xg = up(&g, &rng.vec(cols));
            let mut y = g.alloc(rows);
            let mut line = format!("matvec bandwidth {} {rows}x{cols}", ty.name());
            let reps = 200;
            g.matmul(&wg, &xg, 1, &mut y);
            g.synchronize().unwrap();
            let t = Instant::now();
            for _ in 0..reps {
                g.matmul(&wg, &xg, 1, &mut y);
            }
            g.synchronize().unwrap();
            let dt = t.elapsed().as_secs_f64() / reps as f64;
            line += &format!(" | {:.1} us {:.0} GB/s", dt * 1e6, bytes / dt / 1e9);
            eprintln!("RESULT | {line} (incl. activation quantize) | info |");
        }
    }
}

/// Fused pre-norm input (`x += residual; h = rms_norm(x) * w; ys = h · Wᵀ`, one kernel for the
/// norm and the activation quantization) and fused q+k RoPE against the CPU backend's unfused
/// ops, for Q8 (Q4_1) and Q8_K (Q4_K) activations, with and without a residual.
#[test]
fn fused_norm_matmul_and_rope_qk_match_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(0);
    let mut rng = Rng(31337);
    // Rows of at most 8,192 take the register kernels `norm_q8*_regs`; wider ones the loop kernels.
    for (ty, width) in [
        (GgmlType::Q4_1, 512),
        (GgmlType::Q4_K, 512),
        (GgmlType::Q4_1, 576),
        (GgmlType::Q4_1, 2304),
        (GgmlType::Q4_K, 2304),
        (GgmlType::Q4_0, 4096),
        (GgmlType::Q4_K, 4096),
        (GgmlType::Q4_1, 10240),
        (GgmlType::Q4_K, 10240),
    ] {
        let (wa_g, wa_c) = upload_random(&g, &cpu, ty, 70, width, &mut rng);
        let (wb_g, wb_c) = upload_random(&g, &cpu, ty, 33, width, &mut rng);
        let nw = rng.vec(width);
        let (nwg, nwc) = (
            g.upload_vector(&nw).unwrap(),
            cpu.upload_vector(&nw).unwrap(),
        );
        for n in [1usize, 3] {
            for with_res in [false, true] {
                let x = rng.vec(n * width);
                let r = rng.vec(n * width);
                let (mut xg, mut xc) = (up(&g, &x), up(&cpu, &x));
                let (rg, rc) = (up(&g, &r), up(&cpu, &r));
                let (mut hg, mut hc) = (g.alloc(n * width), cpu.alloc(n * width));
                let (mut ag, mut ac) = (g.alloc(n * 70), cpu.alloc(n * 70));
                let (mut bg, mut bc) = (g.alloc(n * 33), cpu.alloc(n * 33));
                g.norm_matmul_many(
                    &mut xg,
                    with_res.then_some(&rg),
                    &nwg,
                    n,
                    width,
                    1e-5,
                    &mut hg,
                    &[&wa_g, &wb_g],
                    &[],
                    &mut [&mut ag, &mut bg],
                );
                cpu.norm_matmul_many(
                    &mut xc,
                    with_res.then_some(&rc),
                    &nwc,
                    n,
                    width,
                    1e-5,
                    &mut hc,
                    &[&wa_c, &wb_c],
                    &[],
                    &mut [&mut ac, &mut bc],
                );
                let tag = format!(
                    "fused norm+matmul {} {width} n={n} residual={with_res}",
                    ty.name()
                );
                check(&format!("{tag} x"), &down(&g, &xg, n * width), &xc, 0.0);
                check(&format!("{tag} h"), &down(&g, &hg, n * width), &hc, 1e-6);
                check(&format!("{tag} y0"), &down(&g, &ag, n * 70), &ac, 1e-4);
                check(&format!("{tag} y1"), &down(&g, &bg, n * 33), &bc, 1e-4);
            }
        }
    }
    let positions = [3u32, 700, 4095];
    let (nh, nkv, hd) = (9usize, 3usize, 64usize);
    let p = RopeParams {
        n_rot: 64,
        freq_base: 10000.0,
        freq_scale: 1.0,
        neox: false,
        freq_factors: None,
    };
    let q = rng.vec(3 * nh * hd);
    let k = rng.vec(3 * nkv * hd);
    let (mut qg, mut qc) = (up(&g, &q), up(&cpu, &q));
    let (mut kg, mut kc) = (up(&g, &k), up(&cpu, &k));
    g.rope_qk(&mut qg, &mut kg, nh, nkv, hd, &positions, &p);
    cpu.rope_qk(&mut qc, &mut kc, nh, nkv, hd, &positions, &p);
    check("rope_qk q", &down(&g, &qg, q.len()), &qc, 1e-5);
    check("rope_qk k", &down(&g, &kg, k.len()), &kc, 1e-5);
}

/// Split-K decode attention over long contexts (1500+ keys, a 700-key window, F32 and F16 KV)
/// against the CPU backend: the split-K parts (head dim 96: the first-version parts), then the
/// tensor-core decode where it applies.
#[test]
fn split_attention_long_context_matches_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(0);
    let mut rng = Rng(8080);
    let (nh, nkv) = (9usize, 3usize);
    for (ty, hd) in [
        (KvType::F32, 64usize),
        (KvType::F16, 64),
        (KvType::F16, 128),
        (KvType::F32, 256),
        (KvType::F16, 96),
        (KvType::Bf16, 128),
        (KvType::Bf16, 64),
        (KvType::F16, 512),
        (KvType::Bf16, 512),
    ] {
        for window in [None, Some(700usize)] {
            let cap = match window {
                Some(w) => w + 512,
                None => 4096,
            };
            let spec = kv_spec(nkv, hd, cap, window);
            let mut kg = g.new_kv(std::slice::from_ref(&spec), ty).unwrap();
            let mut kc = cpu.new_kv(std::slice::from_ref(&spec), ty).unwrap();
            let p = attn_params(nh, nkv, hd, 0.125, window, None);
            let mut p0 = 0usize;
            for n in [500usize, 500, 500, 1, 1, 3, 1] {
                let pos: Vec<u32> = (p0..p0 + n).map(|x| x as u32).collect();
                let (k, v) = (rng.vec(n * nkv * hd), rng.vec(n * nkv * hd));
                g.kv_store(&mut kg, 0, &up(&g, &k), &up(&g, &v), &pos);
                cpu.kv_store(&mut kc, 0, &up(&cpu, &k), &up(&cpu, &v), &pos);
                p0 += n;
                if n > 4 {
                    continue;
                }
                let q = rng.vec(n * nh * hd);
                let (qg, qc) = (up(&g, &q), up(&cpu, &q));
                let mut oc = cpu.alloc(n * nh * hd);
                cpu.attention(&qc, &kc, 0, &pos, &p, &mut oc);
                let oc = down(&cpu, &oc, n * nh * hd);
                let tag = format!(
                    "split attention {ty:?} hd={hd} window={window:?} pos {}+{n}",
                    pos[0]
                );
                // The split-K parts (the tensor-core decode only where it takes over from 1,024
                // keys for many blocks), then the tensor-core decode wherever it applies (F16/BF16,
                // the head dims of flash_decode_dims); Q and P rounded to the cache type there,
                // so the bound of the flash prefill test.
                for (min_keys, what) in [(usize::MAX, "split-K"), (0, "flash decoding")] {
                    g.set_flash_decode_min_keys(min_keys);
                    let mut og = g.alloc(n * nh * hd);
                    g.set_profiling(true);
                    g.profile_take();
                    g.attention(&qg, &kg, 0, &pos, &p, &mut og);
                    let fd = g
                        .profile_take()
                        .keys()
                        .any(|k| k.starts_with("flash_decode_"));
                    g.set_profiling(false);
                    let tol = attn_tol(ty, fd);
                    check(
                        &format!("{tag} {what}"),
                        &down(&g, &og, n * nh * hd),
                        &oc,
                        tol,
                    );
                }
            }
        }
    }
    g.set_flash_decode_min_keys(vela_cuda::tuning::FLASH_DECODE_MIN_KEYS);
}

/// Fused decode ops against the CPU backend's unfused defaults: two- and three-matrix one-token
/// products in one launch (`mv_*_x3`), gated activation + quantization + down projection
/// (`act_q8*`), and RoPE q+k with the KV store (`rope_store_*`, checked through attention).
#[test]
fn fused_decode_ops_match_cpu() {
    let Some(g) = gpu() else { return };
    // The accurate decode attention (the tensor-core one is checked with its own bound).
    g.set_flash_decode_min_keys(usize::MAX);
    let cpu = CpuBackend::new(0);
    let mut rng = Rng(2718);
    for ty in [
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ] {
        let cols = 512;
        let shapes = [97usize, 33, 130];
        let ws: Vec<_> = shapes
            .iter()
            .map(|&r| upload_random(&g, &cpu, ty, r, cols, &mut rng))
            .collect();
        for k in [2usize, 3] {
            let x = rng.vec(cols);
            let (xg, xc) = (up(&g, &x), up(&cpu, &x));
            let mut yg: Vec<_> = shapes[..k].iter().map(|&r| g.alloc(r)).collect();
            let mut yc: Vec<_> = shapes[..k].iter().map(|&r| cpu.alloc(r)).collect();
            let wg: Vec<_> = ws[..k].iter().map(|w| &w.0).collect();
            let wc: Vec<_> = ws[..k].iter().map(|w| &w.1).collect();
            g.matmul_many(&wg, &xg, 1, &mut yg.iter_mut().collect::<Vec<_>>());
            cpu.matmul_many(&wc, &xc, 1, &mut yc.iter_mut().collect::<Vec<_>>());
            for i in 0..k {
                check(
                    &format!("matvec x{k} {} weight {i}", ty.name()),
                    &down(&g, &yg[i], shapes[i]),
                    &yc[i][..shapes[i]],
                    1e-4,
                );
            }
        }
        for act in [Activation::Silu, Activation::GeluTanh] {
            for n in [1usize, 3] {
                let (gv, uv) = (rng.vec(n * cols), rng.vec(n * cols));
                let (mut gg, mut gc) = (up(&g, &gv), up(&cpu, &gv));
                let (ug, uc) = (up(&g, &uv), up(&cpu, &uv));
                let (mut yg, mut yc) = (g.alloc(n * 97), cpu.alloc(n * 97));
                g.act_mul_matmul(&mut gg, &ug, n, cols, act, &ws[0].0, &mut yg);
                cpu.act_mul_matmul(&mut gc, &uc, n, cols, act, &ws[0].1, &mut yc);
                let tag = format!("fused act {act:?} + matmul {} n={n}", ty.name());
                check(&format!("{tag} gate"), &down(&g, &gg, n * cols), &gc, 1e-5);
                check(&format!("{tag} y"), &down(&g, &yg, n * 97), &yc, 1e-4);
            }
        }
    }
    // RoPE + KV store, then attention over what was stored.
    let (nh, nkv, hd) = (9usize, 3usize, 64usize);
    let rp = RopeParams {
        n_rot: 64,
        freq_base: 10000.0,
        freq_scale: 1.0,
        neox: true,
        freq_factors: None,
    };
    let ap = attn_params(nh, nkv, hd, 0.125, None, None);
    for ty in [KvType::F32, KvType::F16, KvType::Bf16] {
        let spec = kv_spec(nkv, hd, 64, None);
        let mut kvg = g.new_kv(std::slice::from_ref(&spec), ty).unwrap();
        let mut kvc = cpu.new_kv(std::slice::from_ref(&spec), ty).unwrap();
        let mut p0 = 0;
        for n in [5usize, 1, 1, 3] {
            let pos: Vec<u32> = (p0..p0 + n).map(|x| x as u32).collect();
            p0 += n;
            let (q, k, v) = (
                rng.vec(n * nh * hd),
                rng.vec(n * nkv * hd),
                rng.vec(n * nkv * hd),
            );
            let (mut qg, mut qc) = (up(&g, &q), up(&cpu, &q));
            let (mut kg, mut kc) = (up(&g, &k), up(&cpu, &k));
            let (vg, vc) = (up(&g, &v), up(&cpu, &v));
            g.rope_qk_store(&mut qg, &mut kg, &vg, &mut kvg, 0, nh, nkv, hd, &pos, &rp);
            cpu.rope_qk_store(&mut qc, &mut kc, &vc, &mut kvc, 0, nh, nkv, hd, &pos, &rp);
            let tag = format!("fused rope+kv_store {ty:?} pos {}+{n}", pos[0]);
            check(&format!("{tag} q"), &down(&g, &qg, q.len()), &qc, 1e-5);
            check(&format!("{tag} k"), &down(&g, &kg, k.len()), &kc, 1e-5);
            let (mut og, mut oc) = (g.alloc(n * nh * hd), cpu.alloc(n * nh * hd));
            g.attention(&qg, &kvg, 0, &pos, &ap, &mut og);
            cpu.attention(&qc, &kvc, 0, &pos, &ap, &mut oc);
            let tol = if ty == KvType::F32 { 1e-5 } else { 1e-4 };
            check(
                &format!("{tag} attention"),
                &down(&g, &og, n * nh * hd),
                &oc,
                tol,
            );
        }
    }
}

/// An F16 cache of one layer (`dims`: heads, KV heads, head dim) holding `n_keys` random keys
/// and values at positions 0.., the attention parameters (scale 1/sqrt(hd)) and a random query
/// row, for the timing tests.
fn filled_f16_cache(
    g: &CudaBackend,
    rng: &mut Rng,
    (nh, nkv, hd): (usize, usize, usize),
    n_keys: usize,
    capacity: usize,
) -> (vela_cuda::CudaKv, AttnParams, vela_cuda::CudaBuf) {
    let spec = kv_spec(nkv, hd, capacity, None);
    let mut kv = g.new_kv(std::slice::from_ref(&spec), KvType::F16).unwrap();
    let pos: Vec<u32> = (0..n_keys as u32).collect();
    let k = up(g, &rng.vec(n_keys * nkv * hd));
    let v = up(g, &rng.vec(n_keys * nkv * hd));
    g.kv_store(&mut kv, 0, &k, &v, &pos);
    let p = attn_params(nh, nkv, hd, 1.0 / (hd as f32).sqrt(), None, None);
    (kv, p, up(g, &rng.vec(nh * hd)))
}

/// Decode attention timing (info): 1000 back-to-back single-query calls over 530 cached keys
/// (SmolLM2 geometry, F16 KV: the split-K parts); then one Llama-3-8B layer at 8K keys (32 heads,
/// 8 KV heads, hd 128, F16; capacity 8,320): the split-K parts and the tensor-core decode, their
/// GPU time and KV bytes per second, and the difference of their outputs.
#[test]
fn attention_decode_timing() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(5);
    let (nh, nkv, hd, n_keys) = (9usize, 3usize, 64usize, 530usize);
    let (kv, p, q) = filled_f16_cache(&g, &mut rng, (nh, nkv, hd), n_keys, 4096);
    let mut out = g.alloc(nh * hd);
    let last = [n_keys as u32 - 1];
    g.attention(&q, &kv, 0, &last, &p, &mut out);
    g.synchronize().unwrap();
    let t = Instant::now();
    for _ in 0..1000 {
        g.attention(&q, &kv, 0, &last, &p, &mut out);
    }
    g.synchronize().unwrap();
    let us = t.elapsed().as_secs_f64() * 1e3;
    eprintln!("RESULT | attention decode timing {n_keys} keys F16 | {us:.1} us/call | info |");
    let (nh, nkv, hd, n_keys) = (32usize, 8usize, 128usize, 8192usize);
    let (kv, p, q) = filled_f16_cache(&g, &mut rng, (nh, nkv, hd), n_keys, 8320);
    let mut outs: Vec<_> = (0..2).map(|_| g.alloc(nh * hd)).collect();
    let last = [n_keys as u32 - 1];
    let bytes = (2 * n_keys * nkv * hd * 2) as f64;
    // GPU time per call from the per-kernel timing events (the part kernel + the combine).
    let mut line = format!("attention decode 8B layer {n_keys} keys F16, GPU time");
    for (min_keys, out) in [usize::MAX, 0].into_iter().zip(outs.iter_mut()) {
        g.set_flash_decode_min_keys(min_keys);
        g.attention(&q, &kv, 0, &last, &p, out);
        g.synchronize().unwrap();
        g.set_profiling(true);
        g.profile_take();
        for _ in 0..100 {
            g.attention(&q, &kv, 0, &last, &p, out);
        }
        g.synchronize().unwrap();
        let times = g.profile_take();
        g.set_profiling(false);
        let (ms, calls) = times
            .iter()
            .filter(|(k, _)| k.starts_with("attention_") || k.starts_with("flash_decode"))
            .fold((0.0, 0u64), |a, (_, &(ms, n))| (a.0 + ms, a.1 + n));
        let s = ms / 1e3 / 100.0;
        line += &format!(
            " | {}: {:.1} us ({calls} launches), {:.2} TB/s of KV",
            if min_keys == 0 {
                "tensor cores"
            } else {
                "split-K parts"
            },
            s * 1e6,
            bytes / s / 1e12
        );
    }
    let (m, _) = err(&down(&g, &outs[1], nh * hd), &down(&g, &outs[0], nh * hd));
    eprintln!("RESULT | {line} | max_err/rms {m:.1e} | info |");
    assert!(
        m < 5e-3,
        "tensor-core decode vs split-K parts differ by {m:.2e}"
    );
}

/// Two and three one-token products in one `mv_*_x3` launch (row lengths of 64, 160 and 300
/// blocks) equal the single products, with one and two rows per warp.
#[test]
fn matvec_x3_matches_single() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(0);
    let mut rng = Rng(0x3355_7799);
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ] {
        for nb32 in [64usize, 160, 300] {
            let cols = 32 * nb32.div_ceil(8) * 8;
            let cols = cols.div_ceil(ty.block_size()) * ty.block_size();
            let shapes = [(37usize, cols), (130, cols), (6, cols)];
            let ws: Vec<_> = shapes
                .iter()
                .map(|&(r, c)| upload_random(&g, &cpu, ty, r, c, &mut rng).0)
                .collect();
            let x = up(&g, &rng.vec(cols));
            for k in [2usize, 3] {
                let mut ys: Vec<_> = shapes[..k].iter().map(|&(r, _)| g.alloc(r)).collect();
                {
                    let wr: Vec<&vela_cuda::CudaWeight> = ws[..k].iter().collect();
                    let mut yr: Vec<&mut vela_cuda::CudaBuf> = ys.iter_mut().collect();
                    g.matmul_many(&wr, &x, 1, &mut yr);
                }
                for i in 0..k {
                    let rows = shapes[i].0;
                    let mut y1 = g.alloc(rows);
                    g.matmul(&ws[i], &x, 1, &mut y1);
                    let (a, b) = (down(&g, &ys[i], rows), down(&g, &y1, rows));
                    assert_eq!(a, b, "x3 {} k={k} weight {i} cols={cols}", ty.name());
                    // x3 with one row per warp: the same bits.
                    {
                        g.set_mv_rows_mode(2);
                        let mut y2: Vec<_> = shapes[..k].iter().map(|&(r, _)| g.alloc(r)).collect();
                        let wr: Vec<&vela_cuda::CudaWeight> = ws[..k].iter().collect();
                        let mut yr: Vec<&mut vela_cuda::CudaBuf> = y2.iter_mut().collect();
                        g.matmul_many(&wr, &x, 1, &mut yr);
                        g.set_mv_rows_mode(0);
                        let mut y3: Vec<_> = shapes[..k].iter().map(|&(r, _)| g.alloc(r)).collect();
                        let mut yr: Vec<&mut vela_cuda::CudaBuf> = y3.iter_mut().collect();
                        g.matmul_many(&wr, &x, 1, &mut yr);
                        g.set_mv_rows_mode(1);
                        assert_eq!(
                            down(&g, &y2[i], rows),
                            down(&g, &y3[i], rows),
                            "x3 1 vs 2 rows per warp {} k={k} weight {i} cols={cols}",
                            ty.name()
                        );
                    }
                }
            }
        }
    }
    eprintln!("RESULT | matvec x3 == single products | | | ok |");
}

/// Fused RoPE + KV store (`rope_qk_store`: one block per head) against the CPU's rope_qk +
/// kv_store: the rotated q and k,
/// and the stored cache through an attention over it; NeoX and interleaved pairs, a partial
/// rotation (n_rot < head_dim), frequency factors, F16 and F32 caches, a 64-slot ring (window
/// 32) that wraps.
#[test]
fn fused_rope_store_matches_cpu() {
    let Some(g) = gpu() else { return };
    // The accurate decode attention (the tensor-core one is checked with its own bound).
    g.set_flash_decode_min_keys(usize::MAX);
    let cpu = CpuBackend::new(0);
    let mut rng = Rng(2718);
    let (nh, nkv) = (8usize, 2usize);
    {
        for (hd, n_rot, neox, factors) in [
            (64usize, 64usize, false, false),
            (128, 128, true, false),
            (128, 64, true, true),
            (256, 256, true, false),
        ] {
            for ty in [KvType::F16, KvType::F32, KvType::Bf16] {
                let spec = kv_spec(nkv, hd, 64, Some(32));
                let mut kg = g.new_kv(std::slice::from_ref(&spec), ty).unwrap();
                let mut kc = cpu.new_kv(std::slice::from_ref(&spec), ty).unwrap();
                let p = RopeParams {
                    n_rot,
                    freq_base: 500000.0,
                    freq_scale: 0.5,
                    neox,
                    freq_factors: factors.then(|| {
                        std::sync::Arc::new((0..n_rot / 2).map(|i| 1.0 + i as f32 * 0.25).collect())
                    }),
                };
                let ap = attn_params(nh, nkv, hd, 0.1, Some(32), None);
                // 40 tokens, then single decode steps past the 64-slot ring.
                let mut p0 = 0u32;
                for n in [40usize, 1, 1, 30, 1] {
                    let pos: Vec<u32> = (p0..p0 + n as u32).collect();
                    let (q, k, v) = (
                        rng.vec(n * nh * hd),
                        rng.vec(n * nkv * hd),
                        rng.vec(n * nkv * hd),
                    );
                    let (mut qg, mut qc) = (up(&g, &q), up(&cpu, &q));
                    let (mut kgb, mut kcb) = (up(&g, &k), up(&cpu, &k));
                    let (vg, vc) = (up(&g, &v), up(&cpu, &v));
                    g.rope_qk_store(&mut qg, &mut kgb, &vg, &mut kg, 0, nh, nkv, hd, &pos, &p);
                    cpu.rope_qk(&mut qc, &mut kcb, nh, nkv, hd, &pos, &p);
                    cpu.kv_store(&mut kc, 0, &kcb, &vc, &pos);
                    let tag = format!("rope+store hd={hd} n_rot={n_rot} neox={neox} ff={factors} {ty:?} pos {p0}+{n}");
                    check(
                        &format!("{tag} q"),
                        &down(&g, &qg, q.len()),
                        &down(&cpu, &qc, q.len()),
                        1e-5,
                    );
                    check(
                        &format!("{tag} k"),
                        &down(&g, &kgb, k.len()),
                        &down(&cpu, &kcb, k.len()),
                        1e-5,
                    );
                    // The cache through an attention over its last 32 keys.
                    let last = vec![p0 + n as u32 - 1];
                    let qq = rng.vec(nh * hd);
                    let (mut og, mut oc) = (g.alloc(nh * hd), cpu.alloc(nh * hd));
                    g.attention(&up(&g, &qq), &kg, 0, &last, &ap, &mut og);
                    cpu.attention(&up(&cpu, &qq), &kc, 0, &last, &ap, &mut oc);
                    let tol = if ty == KvType::F32 { 1e-5 } else { 1e-4 };
                    check(
                        &format!("{tag} cache"),
                        &down(&g, &og, nh * hd),
                        &down(&cpu, &oc, nh * hd),
                        tol,
                    );
                    p0 += n as u32;
                }
            }
        }
    }
}

/// Q4_0, Q4_K and Q6_K weights repacked into split rows at upload (Q4_0 where the row length
/// allows; Q6_K rows padded to 16 bytes) against the CPU in the kernels that read them: the
/// one-token matvec (one and two rows per warp, alone and three at once: the same bits) and the
/// small-batch kernel; and the embedding lookup. (The cuBLAS prefill and exact mode over split
/// rows: `gemm_prefill_matches_cpu_exact`, `exact_matmul_matches_cpu_exact`.)
#[test]
fn split_rows_match_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(0);
    let mut rng = Rng(0x0400_5711);
    for (ty, rows, cols) in [
        (GgmlType::Q4_0, 300usize, 1024usize),
        (GgmlType::Q4_0, 70, 14336),
        (GgmlType::Q4_K, 300, 768),
        (GgmlType::Q4_K, 70, 4096),
        (GgmlType::Q6_K, 300, 2048),
        // Rows padded to 16 bytes: 19 blocks (Qwen2.5-0.5B's ffn_down), 15 (Gemma 4 12B's head).
        (GgmlType::Q6_K, 37, 4864),
        (GgmlType::Q6_K, 45, 3840),
    ] {
        let tag = format!("{} split rows {rows}x{cols}", ty.name());
        let (split, wc) = upload_random(&g, &cpu, ty, rows, cols, &mut rng);
        assert!(split.is_split_rows(), "{tag}");
        for n in [1usize, 3] {
            let x = rng.vec(n * cols);
            let (mut yg, mut yc) = (g.alloc(n * rows), cpu.alloc(n * rows));
            g.matmul(&split, &up(&g, &x), n, &mut yg);
            cpu.matmul(&wc, &up(&cpu, &x), n, &mut yc);
            check(
                &format!("{tag}: matmul n={n}"),
                &down(&g, &yg, n * rows),
                &down(&cpu, &yc, n * rows),
                1e-4,
            );
        }
        // Three products sharing the activations (Q/K/V-style) and single products, one and two
        // rows per warp (the o and down launches of an 8B: two rounds of loads in flight per
        // lane in the split-row Q4_0 kernel).
        let x = up(&g, &rng.vec(cols));
        let mut outs = Vec::new();
        for mode in [0u32, 2] {
            g.set_mv_rows_mode(mode);
            let mut ys: Vec<_> = (0..4).map(|_| g.alloc(rows)).collect();
            {
                let mut o: Vec<&mut _> = ys[..3].iter_mut().collect();
                g.matmul_many(&[&split, &split, &split], &x, 1, &mut o);
            }
            g.matmul(&split, &x, 1, &mut ys[3]);
            outs.push(ys.iter().map(|y| down(&g, y, rows)).collect::<Vec<_>>());
        }
        g.set_mv_rows_mode(1);
        for (i, y) in outs.iter().flatten().enumerate() {
            assert_eq!(
                y, &outs[0][3],
                "{tag}: product {i} of one/two rows per warp, x3/single"
            );
        }
        let ids = [0u32, 7, rows as u32 - 1];
        let (mut eg, mut ec) = (g.alloc(3 * cols), cpu.alloc(3 * cols));
        g.get_rows(&split, &ids, 1.0, &mut eg).unwrap();
        cpu.get_rows(&wc, &ids, 1.0, &mut ec).unwrap();
        check(
            &format!("{tag}: get_rows"),
            &down(&g, &eg, 3 * cols),
            &down(&cpu, &ec, 3 * cols),
            0.0,
        );
    }
}
