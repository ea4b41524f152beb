//! GPU correctness: every op of [`CudaBackend`] against the CPU backend on random data, then a
//! whole model (SmolLM2-135M Q4_1) GPU vs CPU, plus a first decode-speed number.
//!
//! Without a usable GPU every test is skipped with a message, unless `VELA_REQUIRE_GPU=1`, in
//! which case it fails. The model is `$VELA_GPU_MODEL`, else `$VELA_CACHE/models/<SMOLLM2>`.
//! Lines starting with `RESULT` form the table `scripts/gpu-check.sh` collects.

use std::sync::Arc;
use std::time::Instant;
use vela_compute::cpu::CpuBackend;
use vela_compute::{Activation, AttnParams, Backend, HostWeight, KvLayerSpec, KvType, RopeParams};
use vela_cuda::CudaBackend;
use vela_formats::gguf::GgufFile;
use vela_formats::quant::GgmlType;

/// A cache layer of `n_head_kv` heads of `head_dim` (keys and values).
fn kv_spec(
    n_head_kv: usize,
    head_dim: usize,
    capacity: usize,
    window: Option<usize>,
) -> KvLayerSpec {
    KvLayerSpec {
        n_head_kv,
        head_dim_k: head_dim,
        head_dim_v: head_dim,
        capacity,
        window,
    }
}

/// Attention parameters with keys and values of `head_dim`.
fn attn_params(
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    scale: f32,
    window: Option<usize>,
    softcap: Option<f32>,
) -> AttnParams {
    AttnParams {
        n_head,
        n_head_kv,
        head_dim_k: head_dim,
        head_dim_v: head_dim,
        scale,
        window,
        softcap,
    }
}

fn gpu() -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(b) => {
            eprintln!(
                "backend: {} (kernel modules from cache: {})",
                b.name(),
                b.modules_from_cache()
            );
            Some(b)
        }
        Err(e) => {
            if std::env::var("VELA_REQUIRE_GPU").as_deref() == Ok("1") {
                panic!("VELA_REQUIRE_GPU=1 but the CUDA backend is unavailable: {e:#}");
            }
            eprintln!("SKIP (no GPU): {e:#}");
            None
        }
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [-1, 1).
    fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f()).collect()
    }
}

fn f16_bytes(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_le_bytes()
}

/// Random but valid weight bytes: random quants, small finite f16 scales.
fn random_weight(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let n = ty.row_bytes(cols as u64).unwrap() as usize * rows;
    let mut b: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
    let bb = ty.type_size();
    let scale_at: &[usize] = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        GgmlType::F16 => {
            for c in b.chunks_exact_mut(2) {
                c.copy_from_slice(&f16_bytes(rng.f()));
            }
            &[]
        }
        GgmlType::F32 => {
            for c in b.chunks_exact_mut(4) {
                c.copy_from_slice(&rng.f().to_le_bytes());
            }
            &[]
        }
        _ => unreachable!(),
    };
    if !scale_at.is_empty() {
        for blk in b.chunks_exact_mut(bb) {
            for &o in scale_at {
                blk[o..o + 2].copy_from_slice(&f16_bytes(0.01 + 0.02 * rng.f().abs()));
            }
        }
    }
    b
}

/// A GGUF v3 file in memory holding the given tensors `(name, type, rows, cols, data)`.
fn gguf(tensors: &[(&str, GgmlType, usize, usize, Vec<u8>)]) -> Arc<GgufFile> {
    let mut h = Vec::new();
    h.extend_from_slice(b"GGUF");
    h.extend_from_slice(&3u32.to_le_bytes());
    h.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    h.extend_from_slice(&0u64.to_le_bytes());
    let mut off = 0u64;
    for (name, ty, rows, cols, data) in tensors {
        h.extend_from_slice(&(name.len() as u64).to_le_bytes());
        h.extend_from_slice(name.as_bytes());
        h.extend_from_slice(&2u32.to_le_bytes());
        h.extend_from_slice(&(*cols as u64).to_le_bytes());
        h.extend_from_slice(&(*rows as u64).to_le_bytes());
        h.extend_from_slice(&ty.id().to_le_bytes());
        h.extend_from_slice(&off.to_le_bytes());
        off += (data.len() as u64).div_ceil(32) * 32;
    }
    while h.len() % 32 != 0 {
        h.push(0);
    }
    for (_, _, _, _, data) in tensors {
        h.extend_from_slice(data);
        while h.len() % 32 != 0 {
            h.push(0);
        }
    }
    Arc::new(GgufFile::from_bytes(h).unwrap())
}

/// (max |a-b| / rms(b), NMSE = Σ(a-b)² / Σb²).
/// Upload one random `rows x cols` weight of type `ty` to both backends.
fn upload_random(
    g: &CudaBackend,
    cpu: &CpuBackend,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    rng: &mut Rng,
) -> (vela_cuda::CudaWeight, <CpuBackend as Backend>::Weight) {
    let file = gguf(&[("w", ty, rows, cols, random_weight(ty, rows, cols, rng))]);
    let hw = HostWeight::from_gguf(&file, "w").unwrap();
    (
        g.upload_weight(&hw).unwrap(),
        cpu.upload_weight(&hw).unwrap(),
    )
}

/// A little-endian f32 file (a fixture's logits).
fn f32s(p: &std::path::Path) -> Vec<f32> {
    std::fs::read(p)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// The `long` prompt of a fixture's `prompts.json` (the qwen4_exp and deepseek_v4 generators).
fn long_prompt(dir: &std::path::Path) -> Vec<u32> {
    let p: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("prompts.json")).unwrap()).unwrap();
    p["prompts"]["long"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn err(a: &[f32], b: &[f32]) -> (f64, f64) {
    assert_eq!(a.len(), b.len());
    let (mut se, mut sb, mut mx) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        assert!(x.is_finite(), "non-finite GPU output");
        let d = (x - y) as f64;
        se += d * d;
        sb += (y as f64) * (y as f64);
        mx = mx.max(d.abs());
    }
    let rms = (sb / b.len() as f64).sqrt().max(1e-30);
    (mx / rms, se / sb.max(1e-30))
}

fn check(what: &str, gpu: &[f32], cpu: &[f32], tol: f64) {
    let (mx, nmse) = err(gpu, cpu);
    let ok = mx <= tol;
    eprintln!(
        "RESULT | {what} | max_err/rms {mx:.2e} | nmse {nmse:.2e} | {} |",
        if ok { "ok" } else { "FAIL" }
    );
    assert!(
        ok,
        "{what}: max error {mx:.3e} (relative to rms) above {tol:.1e}"
    );
}

/// The bound of an attention against the CPU: f32 caches tight; the tensor-core kernels round Q
/// and P to the cache's 16-bit type.
fn attn_tol(ty: KvType, tensor_cores: bool) -> f64 {
    match (ty, tensor_cores) {
        (KvType::F32, _) => 1e-5,
        (KvType::F16, true) => 5e-3,
        (KvType::Bf16, true) => 4e-2,
        _ => 1e-4,
    }
}

fn up<B: Backend>(be: &B, data: &[f32]) -> B::Buf {
    let mut b = be.alloc(data.len());
    be.write(&mut b, data);
    b
}

fn down<B: Backend>(be: &B, b: &B::Buf, n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    be.read(b, &mut out);
    out
}

#[test]
fn matmul_and_get_rows_match_cpu() {
    let Some(g) = gpu() else { return };
    // The integer kernels (batches of 16+ tokens otherwise go to cuBLAS: tests/gpu/gemm.rs).
    g.set_gemm_min(0);
    let cpu = CpuBackend::new(0);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    use GgmlType as G;
    let types = [
        G::Q4_0,
        G::Q4_1,
        G::Q5_0,
        G::Q5_1,
        G::Q8_0,
        G::Q4_K,
        G::Q5_K,
        G::Q6_K,
        G::F16,
        G::F32,
    ];
    for ty in types {
        let bs = ty.block_size();
        // Float weights also few rows of many columns (one block per row for one token);
        // block types also rows of 16 blocks (Q4_0 in split rows: the several-token kernels,
        // `mmq_q4_0s_*`, with a partial row tile).
        let wide: &[(usize, usize)] = if bs == 1 { &[(24, 4100)] } else { &[(70, 16)] };
        for &(rows, cols_blocks) in [(37usize, 3usize), (130, 9)].iter().chain(wide) {
            let cols = bs * cols_blocks;
            let file = gguf(&[("w", ty, rows, cols, random_weight(ty, rows, cols, &mut rng))]);
            let hw = HostWeight::from_gguf(&file, "w").unwrap();
            let (wg, wc) = (
                g.upload_weight(&hw).unwrap(),
                cpu.upload_weight(&hw).unwrap(),
            );
            for n in [1usize, 3, 12, 16, 17, 40, 64] {
                let x = rng.vec(n * cols);
                let (xg, xc) = (up(&g, &x), up(&cpu, &x));
                let (mut yg, mut yc) = (g.alloc(n * rows), cpu.alloc(n * rows));
                g.matmul(&wg, &xg, n, &mut yg);
                cpu.matmul(&wc, &xc, n, &mut yc);
                let what = format!("matmul {} {rows}x{cols} n={n}", ty.name());
                check(&what, &down(&g, &yg, n * rows), &yc[..n * rows], 1e-4);
            }
            let ids: Vec<u32> = [0, rows - 1, 5, 5, rows / 2]
                .iter()
                .map(|&i| i as u32)
                .collect();
            let (mut og, mut oc) = (g.alloc(ids.len() * cols), cpu.alloc(ids.len() * cols));
            g.get_rows(&wg, &ids, 0.5, &mut og).unwrap();
            cpu.get_rows(&wc, &ids, 0.5, &mut oc).unwrap();
            let what = format!("get_rows {} {rows}x{cols}", ty.name());
            check(&what, &down(&g, &og, ids.len() * cols), &oc, 1e-6);
            assert!(g.get_rows(&wg, &[rows as u32], 1.0, &mut og).is_err());
        }
    }
}

/// `write_weight_rows` (a device cache replacing one expert in place) leaves the weight as an
/// upload of the changed rows would: the same products, bit for bit, for a plain type, split
/// rows (Q4_0) and padded split rows (Q6_K).
#[test]
fn write_weight_rows_equals_upload() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(29);
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q8_0,
        GgmlType::Q6_K,
        GgmlType::F16,
    ] {
        let (rows, cols, at, n_new) = (64usize, ty.block_size() * 4, 16usize, 8usize);
        let rb = ty.row_bytes(cols as u64).unwrap() as usize;
        let (a, b) = (
            random_weight(ty, rows, cols, &mut rng),
            random_weight(ty, n_new, cols, &mut rng),
        );
        let mut merged = a.clone();
        merged[at * rb..(at + n_new) * rb].copy_from_slice(&b);
        let file = gguf(&[
            ("a", ty, rows, cols, a),
            ("b", ty, n_new, cols, b),
            ("m", ty, rows, cols, merged),
        ]);
        let hw = |n: &str| HostWeight::from_gguf(&file, n).unwrap();
        let mut w = g.upload_weight(&hw("a")).unwrap();
        g.write_weight_rows(&mut w, at, &hw("b")).unwrap();
        let fresh = g.upload_weight(&hw("m")).unwrap();
        let x = rng.vec(3 * cols);
        let xg = up(&g, &x);
        let (mut y1, mut y2) = (g.alloc(3 * rows), g.alloc(3 * rows));
        g.matmul(&w, &xg, 3, &mut y1);
        g.matmul(&fresh, &xg, 3, &mut y2);
        assert_eq!(
            down(&g, &y1, 3 * rows),
            down(&g, &y2, 3 * rows),
            "{} rows written in place",
            ty.name()
        );
        // Rows past the end: an error.
        assert!(g.write_weight_rows(&mut w, rows - 4, &hw("b")).is_err());
    }
}

#[test]
fn elementwise_ops_match_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(0);
    let mut rng = Rng(12345);
    let (n, w) = (5usize, 576usize);
    let x = rng.vec(n * w);
    let y = rng.vec(n * w);
    let nw = rng.vec(w);
    // rms_norm / rms_norm_inplace
    let (wg, wc) = (
        g.upload_vector(&nw).unwrap(),
        cpu.upload_vector(&nw).unwrap(),
    );
    let (xg, xc) = (up(&g, &x), up(&cpu, &x));
    let (mut og, mut oc) = (g.alloc(n * w), cpu.alloc(n * w));
    g.rms_norm(&xg, &wg, n, w, 1e-5, &mut og);
    cpu.rms_norm(&xc, &wc, n, w, 1e-5, &mut oc);
    check("rms_norm", &down(&g, &og, n * w), &oc, 1e-6);
    let hn = rng.vec(64);
    let (hg, hc) = (
        g.upload_vector(&hn).unwrap(),
        cpu.upload_vector(&hn).unwrap(),
    );
    let (mut ig, mut ic) = (up(&g, &x), up(&cpu, &x));
    g.rms_norm_inplace(&mut ig, &hg, n * w / 64, 64, 1e-6);
    cpu.rms_norm_inplace(&mut ic, &hc, n * w / 64, 64, 1e-6);
    check("rms_norm_inplace", &down(&g, &ig, n * w), &ic, 1e-6);
    // Wide rows (mHC's 4 streams of 4096, plus a tail the unrolled loop does not take), in place.
    {
        let ww = 16384 + 37;
        let (xw, nw) = (rng.vec(2 * ww), rng.vec(ww));
        let (wg, wc) = (
            g.upload_vector(&nw).unwrap(),
            cpu.upload_vector(&nw).unwrap(),
        );
        let (mut ig, mut ic) = (up(&g, &xw), up(&cpu, &xw));
        g.rms_norm_inplace(&mut ig, &wg, 2, ww, 1e-6);
        cpu.rms_norm_inplace(&mut ic, &wc, 2, ww, 1e-6);
        check("rms_norm_inplace wide", &down(&g, &ig, 2 * ww), &ic, 1e-6);
    }
    // rope, both styles, partial rotation, large positions, with and without freq factors
    let positions = [0u32, 1, 17, 700, 4095];
    for (neox, ff) in [(true, false), (false, false), (true, true)] {
        let p = RopeParams {
            n_rot: 48,
            freq_base: 10000.0,
            freq_scale: if ff { 0.5 } else { 1.0 },
            neox,
            freq_factors: ff.then(|| Arc::new((0..24).map(|i| 1.0 + i as f32 * 0.3).collect())),
        };
        let (mut rg, mut rc) = (up(&g, &x), up(&cpu, &x));
        g.rope(&mut rg, 9, 64, &positions, &p);
        cpu.rope(&mut rc, 9, 64, &positions, &p);
        check(
            &format!("rope neox={neox} factors={ff}"),
            &down(&g, &rg, n * w),
            &rc,
            1e-5,
        );
    }
    // add, add_bias, scale, act_mul, softcap, copy_rows
    let len = n * w - 3;
    let (mut ag, mut ac) = (up(&g, &x), up(&cpu, &x));
    let (yg, yc) = (up(&g, &y), up(&cpu, &y));
    g.add(&mut ag, &yg, len);
    cpu.add(&mut ac, &yc, len);
    g.add_bias(&mut ag, &wg, n - 1);
    cpu.add_bias(&mut ac, &wc, n - 1);
    g.scale(&mut ag, len, 1.7);
    cpu.scale(&mut ac, len, 1.7);
    check("add+add_bias+scale", &down(&g, &ag, n * w), &ac, 1e-6);
    for act in [Activation::Silu, Activation::GeluTanh] {
        let (mut ag, mut ac) = (up(&g, &x), up(&cpu, &x));
        g.act_mul(&mut ag, &yg, len, act);
        cpu.act_mul(&mut ac, &yc, len, act);
        check(
            &format!("act_mul {act:?}"),
            &down(&g, &ag, n * w),
            &ac,
            1e-5,
        );
    }
    let (mut sg, mut scc) = (up(&g, &x), up(&cpu, &x));
    g.softcap(&mut sg, len, 0.3);
    cpu.softcap(&mut scc, len, 0.3);
    check("softcap", &down(&g, &sg, n * w), &scc, 1e-5);
    // Rows 3..5 into rows 1..3 (row 0 is not written).
    let (mut cg, mut cc) = (g.alloc(3 * w), cpu.alloc(3 * w));
    g.copy_rows(&xg, 3, 2, w, &mut cg, 1);
    cpu.copy_rows(&xc, 3, 2, w, &mut cc, 1);
    let (dg, dc) = (down(&g, &cg, 3 * w), down(&cpu, &cc, 3 * w));
    check("copy_rows", &dg[w..], &dc[w..], 0.0);
}

/// Stores `n_pos` positions in batches, checks attention after each batch, then a
/// checkpoint / overwrite / restore cycle and a clone.
fn attention_case<G: Backend, C: Backend>(
    g: &G,
    cpu: &C,
    ty: KvType,
    window: Option<usize>,
    softcap: Option<f32>,
) {
    let mut rng = Rng(777);
    let (nh, nkv, hd) = (8usize, 2usize, 64usize);
    let batch = 7;
    let cap = match window {
        Some(w) => w + batch,
        None => 64,
    };
    let spec = kv_spec(nkv, hd, cap, window);
    let specs = [spec.clone(), spec];
    let mut kg = g.new_kv(&specs, ty).unwrap();
    let mut kc = cpu.new_kv(&specs, ty).unwrap();
    let p = attn_params(nh, nkv, hd, 0.125, window, softcap);
    let tag = format!("attention {ty:?} window={window:?} softcap={softcap:?}");
    let step =
        |g_kv: &mut G::Kv, c_kv: &mut C::Kv, p0: usize, n: usize, rng: &mut Rng, what: &str| {
            let pos: Vec<u32> = (p0..p0 + n).map(|p| p as u32).collect();
            // (Storage for every layer first, as a forward does: a paged cache maps it here.)
            g.kv_reserve(g_kv, p0 + n).unwrap();
            cpu.kv_reserve(c_kv, p0 + n).unwrap();
            let (k, v, q) = (
                rng.vec(n * nkv * hd),
                rng.vec(n * nkv * hd),
                rng.vec(n * nh * hd),
            );
            g.kv_store(g_kv, 1, &up(g, &k), &up(g, &v), &pos);
            cpu.kv_store(c_kv, 1, &up(cpu, &k), &up(cpu, &v), &pos);
            let (mut og, mut oc) = (g.alloc(n * nh * hd), cpu.alloc(n * nh * hd));
            g.attention(&up(g, &q), g_kv, 1, &pos, &p, &mut og);
            cpu.attention(&up(cpu, &q), c_kv, 1, &pos, &p, &mut oc);
            (
                down(g, &og, n * nh * hd),
                down(cpu, &oc, n * nh * hd),
                what.to_string(),
            )
        };
    let tol = if ty == KvType::F32 { 1e-5 } else { 1e-4 };
    let mut p0 = 0;
    for n in [1, 7, 3, 1, 5, 1, 7, 2] {
        let (a, b, _) = step(&mut kg, &mut kc, p0, n, &mut rng, "");
        check(&format!("{tag} pos {p0}+{n}"), &a, &b, tol);
        p0 += n;
    }
    let snap = g.kv_checkpoint(&kg, p0);
    let snap_c = cpu.kv_checkpoint(&kc, p0);
    let mut fork = g.kv_clone(&kg).unwrap();
    let mut fork_c = cpu.kv_clone(&kc).unwrap();
    assert_eq!(g.kv_bytes(&fork), g.kv_bytes(&kg));
    // Overwrite, restore, and continue from the restored state on both backends.
    let mut junk = Rng(1);
    step(&mut kg, &mut kc, p0, 7, &mut junk, "");
    g.kv_restore(&mut kg, &snap);
    cpu.kv_restore(&mut kc, &snap_c);
    let mut r1 = Rng(99);
    let (a, b, _) = step(&mut kg, &mut kc, p0, 3, &mut r1, "");
    check(&format!("{tag} after restore"), &a, &b, tol);
    let mut r2 = Rng(99);
    let (a2, _, _) = step(&mut fork, &mut fork_c, p0, 3, &mut r2, "");
    check(&format!("{tag} clone"), &a2, &a, 0.0);
}

#[test]
fn attention_and_kv_match_cpu() {
    let Some(g) = gpu() else { return };
    // The accurate kernels (the tensor-core decode attention has its own tests, attn.rs).
    g.set_flash_decode_min_keys(usize::MAX);
    let cpu = CpuBackend::new(0);
    for ty in [KvType::F32, KvType::F16, KvType::Bf16] {
        attention_case(&g, &cpu, ty, None, None);
        attention_case(&g, &cpu, ty, Some(5), None);
        attention_case(&g, &cpu, ty, Some(9), Some(20.0));
    }
    g.set_flash_decode_min_keys(vela_cuda::tuning::FLASH_DECODE_MIN_KEYS);
}

mod attn;
mod dsv4;
mod gemm;
mod gemma4;
mod glm5;
mod kernels2;
mod mix;
mod model;
mod mtp;
mod ops;
mod qwen4exp;
mod recurrent;
mod sample;
mod sparse;
