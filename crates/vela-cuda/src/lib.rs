//! The CUDA backend: [`CudaBackend`] implements [`vela_compute::Backend`] with kernels written in
//! CUDA C (`kernels/*.cu`), compiled at run time by NVRTC for the GPU's architecture and cached
//! on disk (see [`kernels`]).
//!
//! Nothing CUDA is needed to build: the driver (`libcuda.so`) is opened by `cudarc` with
//! `dlopen` and NVRTC by [`nvrtc`], both when [`CudaBackend::new`] runs. Every op is enqueued
//! on one stream; only [`Backend::read`] waits for the GPU.
//!
//! Numerics mirror the CPU backend: matmuls quantize activations to Q8/Q8_K blocks exactly like
//! it and use exact integer block dot products, RMSNorm sums squares in f64, RoPE builds its
//! angles by repeated f32 multiplication with the same host-computed ratio.

pub mod kernels;
pub mod nvrtc;

use anyhow::{anyhow, bail, Context, Result};
use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DriverError, LaunchConfig,
    PushKernelArg,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use vela_compute::{Activation, AttnParams, Backend, HostWeight, KvLayerSpec, KvType, RopeParams};
use vela_formats::quant::GgmlType;

/// Every kernel the backend launches, per group (also checked by `tests/ptx.rs`).
pub const KERNEL_NAMES: &[(&str, &[&str])] = &[
    (
        "quant",
        &[
            "quantize_q8",
            "quantize_q8k",
            "mm_q4_0_t1",
            "mm_q4_0_t8",
            "mm_q4_1_t1",
            "mm_q4_1_t8",
            "mm_q5_0_t1",
            "mm_q5_0_t8",
            "mm_q5_1_t1",
            "mm_q5_1_t8",
            "mm_q8_0_t1",
            "mm_q8_0_t8",
            "mm_q4_k_t1",
            "mm_q4_k_t8",
            "mm_q5_k_t1",
            "mm_q5_k_t8",
            "mm_q6_k_t1",
            "mm_q6_k_t8",
            "mm_f32_t1",
            "mm_f32_t8",
            "mm_f16_t1",
            "mm_f16_t8",
            "get_rows_f32",
            "get_rows_f16",
            "get_rows_q4_0",
            "get_rows_q4_1",
            "get_rows_q5_0",
            "get_rows_q5_1",
            "get_rows_q8_0",
            "get_rows_q4_k",
            "get_rows_q5_k",
            "get_rows_q6_k",
        ],
    ),
    (
        "elementwise",
        &[
            "rms_norm",
            "rope",
            "add",
            "add_bias",
            "scale",
            "act_mul_silu",
            "act_mul_gelu",
            "softcap",
        ],
    ),
    (
        "attention",
        &[
            "kv_store_f32",
            "kv_store_f16",
            "attention_f32",
            "attention_f16",
        ],
    ),
];

/// Bytes of the GPU activation block layouts (`struct AQ8` / `AQ8K` in `kernels/quant.cu`).
const AQ8_BYTES: usize = 48;
const AQ8K_BYTES: usize = 304;
/// Warps (weight rows) per matmul thread block (`WARPS` in quant.cu).
const MM_WARPS: u32 = 4;
/// Largest head dimension the attention kernel supports (`ATT_MAXD`).
const ATT_MAXD: usize = 256;
/// Warps per attention thread block (`ATT_WARPS` in attention.cu).
const ATT_WARPS: u32 = 32;

/// How a weight type's matmul reads activations.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum ActKind {
    Q8,
    Q8K,
    Float,
}

/// Kernel-name suffix and activation kind of the supported weight types.
fn type_info(ty: GgmlType) -> Option<(&'static str, ActKind)> {
    use GgmlType as G;
    Some(match ty {
        G::Q4_0 => ("q4_0", ActKind::Q8),
        G::Q4_1 => ("q4_1", ActKind::Q8),
        G::Q5_0 => ("q5_0", ActKind::Q8),
        G::Q5_1 => ("q5_1", ActKind::Q8),
        G::Q8_0 => ("q8_0", ActKind::Q8),
        G::Q4_K => ("q4_k", ActKind::Q8K),
        G::Q5_K => ("q5_k", ActKind::Q8K),
        G::Q6_K => ("q6_k", ActKind::Q8K),
        G::F32 => ("f32", ActKind::Float),
        G::F16 => ("f16", ActKind::Float),
        _ => return None,
    })
}

/// Whether the CUDA backend can multiply (and embed from) weights of type `ty`.
pub fn supported(ty: GgmlType) -> bool {
    type_info(ty).is_some()
}

/// A weight matrix uploaded once, in its GGUF block layout.
pub struct CudaWeight {
    data: CudaSlice<u8>,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
}

/// An f32 activation buffer.
pub type CudaBuf = CudaSlice<f32>;

struct KvLayer {
    spec: KvLayerSpec,
    k: CudaSlice<u8>,
    v: CudaSlice<u8>,
}

/// Per-layer K/V rings in device memory (f32 or f16 elements).
pub struct CudaKv {
    layers: Vec<KvLayer>,
    ty: KvType,
}

/// Saved sliding-window slots: (layer, first position, K rows, V rows), on the device.
pub struct CudaKvSnapshot {
    saved: Vec<(usize, usize, CudaSlice<u8>, CudaSlice<u8>)>,
}

/// Reusable device scratch: quantized activations and the last uploaded positions.
struct Scratch {
    act: CudaSlice<u8>,
    pos: CudaSlice<u32>,
    pos_host: Vec<u32>,
}

/// The CUDA backend (one device, one stream).
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    funcs: HashMap<&'static str, CudaFunction>,
    name: String,
    /// Compute capability as major*10+minor.
    pub arch: u32,
    /// How many kernel groups were loaded from the on-disk cache (vs compiled now).
    pub modules_from_cache: usize,
    scratch: Mutex<Scratch>,
}

/// A kernel argument (all are passed by value).
enum Arg {
    P(u64),
    I(i32),
    L(i64),
    F(f32),
}

fn kv_elem_bytes(ty: KvType) -> usize {
    match ty {
        KvType::F32 => 4,
        KvType::F16 => 2,
    }
}

fn driver_error(e: DriverError, ordinal: usize) -> anyhow::Error {
    match e.0 {
        CUresult::CUDA_ERROR_NO_DEVICE => {
            anyhow!("no CUDA-capable GPU found (the driver reports none)")
        }
        CUresult::CUDA_ERROR_INVALID_DEVICE => anyhow!("CUDA device {ordinal} does not exist"),
        other => anyhow!("CUDA initialisation failed: {other:?}"),
    }
}

impl CudaBackend {
    /// Open GPU `device_ordinal`, compile (or load cached) kernels for its architecture.
    ///
    /// Fails with a one-line message when no driver or GPU is present, the driver predates
    /// CUDA 12.0, the GPU predates compute capability 6.1, or NVRTC cannot be found.
    pub fn new(device_ordinal: usize) -> Result<CudaBackend> {
        // SAFETY: probing with dlopen has no preconditions.
        if !unsafe { sys::is_culib_present() } {
            bail!(
                "no NVIDIA driver found (libcuda.so could not be loaded): CUDA backend unavailable"
            );
        }
        let mut ver = 0i32;
        // SAFETY: one valid out-pointer; cuDriverGetVersion needs no cuInit.
        let r = unsafe { sys::cuDriverGetVersion(&mut ver) };
        if r != CUresult::CUDA_SUCCESS {
            bail!("cannot query the NVIDIA driver version: {r:?}");
        }
        if ver < 12000 {
            bail!(
                "NVIDIA driver too old: it supports CUDA {}.{}, vela-cuda needs CUDA >= 12.0 (driver >= 525)",
                ver / 1000,
                ver % 1000 / 10
            );
        }
        let ctx = CudaContext::new(device_ordinal).map_err(|e| driver_error(e, device_ordinal))?;
        let (ma, mi) = ctx
            .compute_capability()
            .map_err(|e| driver_error(e, device_ordinal))?;
        let arch = (ma * 10 + mi) as u32;
        if arch < 61 {
            bail!("GPU compute capability {ma}.{mi} is below 6.1 (no dp4a): not supported");
        }
        let dev_name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let nvrtc = nvrtc::Nvrtc::get()?;
        let mut funcs = HashMap::new();
        let mut from_cache = 0;
        for (group, src) in kernels::GROUPS {
            let (bin, cached) = kernels::cubin(nvrtc, group, src, arch)?;
            from_cache += usize::from(cached);
            let module = ctx
                .load_module(cudarc::nvrtc::Ptx::from_binary(bin))
                .with_context(|| format!("loading the {group} kernels on {dev_name}"))?;
            let names = KERNEL_NAMES
                .iter()
                .find(|(g, _)| g == group)
                .map(|(_, n)| *n)
                .unwrap_or(&[]);
            for &n in names {
                let f = module
                    .load_function(n)
                    .with_context(|| format!("kernel {n} missing from the {group} module"))?;
                funcs.insert(n, f);
            }
        }
        // One stream and no cross-stream sharing: cudarc's per-buffer event tracking is not needed.
        // SAFETY: every buffer is used on `stream` only.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        let scratch = Scratch {
            act: stream.alloc_zeros::<u8>(1)?,
            pos: stream.alloc_zeros::<u32>(1)?,
            pos_host: Vec::new(),
        };
        let (nm, nn) = nvrtc.version()?;
        Ok(CudaBackend {
            name: format!(
                "cuda ({dev_name}, sm_{arch}, driver CUDA {}.{}, NVRTC {nm}.{nn})",
                ver / 1000,
                ver % 1000 / 10
            ),
            ctx,
            stream,
            funcs,
            arch,
            modules_from_cache: from_cache,
            scratch: Mutex::new(scratch),
        })
    }

    /// Wait until every enqueued op has finished.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().context("CUDA stream synchronize")
    }

    fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        let (p, _sync) = s.device_ptr(&self.stream);
        p
    }

    fn launch(&self, name: &str, grid: (u32, u32, u32), block: u32, args: &[Arg]) {
        let f = self
            .funcs
            .get(name)
            .unwrap_or_else(|| panic!("CUDA kernel {name} is not loaded"));
        let mut b = self.stream.launch_builder(f);
        for a in args {
            match a {
                Arg::P(x) => b.arg(x),
                Arg::I(x) => b.arg(x),
                Arg::L(x) => b.arg(x),
                Arg::F(x) => b.arg(x),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: every kernel's parameter list matches `args` (see kernels/*.cu), and the
        // callers size the grids to the buffers they pass.
        if let Err(e) = unsafe { b.launch(cfg) } {
            panic!("CUDA launch of {name} failed: {e:?}");
        }
    }

    /// 1-D launch over `n` elements.
    fn launch_1d(&self, name: &str, n: usize, args: &[Arg]) {
        if n == 0 {
            return;
        }
        self.launch(name, (n.div_ceil(256) as u32, 1, 1), 256, args);
    }

    /// Device pointer to `positions` (uploaded only when they differ from the last upload).
    fn positions(&self, sc: &mut Scratch, positions: &[u32]) -> u64 {
        if sc.pos_host != positions {
            if sc.pos.len() < positions.len() {
                sc.pos = self
                    .stream
                    .alloc_zeros::<u32>(positions.len().next_power_of_two())
                    .expect("CUDA alloc of positions");
            }
            self.stream
                .memcpy_htod(positions, &mut sc.pos.slice_mut(0..positions.len()))
                .expect("CUDA upload of positions");
            sc.pos_host = positions.to_vec();
        }
        self.ptr(&sc.pos)
    }

    fn scratch(&self) -> std::sync::MutexGuard<'_, Scratch> {
        self.scratch.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Quantize `n` rows of `cols` activations into the scratch buffer as Q8 (32) or Q8_K (256)
    /// blocks; returns the device pointer and the number of blocks per row.
    fn quantize_act(
        &self,
        sc: &mut Scratch,
        kind: ActKind,
        x: &CudaBuf,
        n: usize,
        cols: usize,
    ) -> (u64, usize) {
        let (bs, bb, qname) = if kind == ActKind::Q8 {
            (32, AQ8_BYTES, "quantize_q8")
        } else {
            (256, AQ8K_BYTES, "quantize_q8k")
        };
        let n_blocks = n * cols / bs;
        if sc.act.len() < n_blocks * bb {
            sc.act = self
                .stream
                .alloc_zeros::<u8>((n_blocks * bb).next_power_of_two())
                .expect("CUDA alloc of activation scratch");
        }
        let ap = self.ptr(&sc.act);
        let args = [Arg::P(self.ptr(x)), Arg::P(ap), Arg::I(n_blocks as i32)];
        self.launch(qname, (n_blocks.div_ceil(8) as u32, 1, 1), 256, &args);
        (ap, cols / bs)
    }

    /// Copy `n` bytes between device buffers at byte offsets.
    fn copy_bytes(
        &self,
        src: &CudaSlice<u8>,
        so: usize,
        dst: &mut CudaSlice<u8>,
        dof: usize,
        n: usize,
    ) {
        if n == 0 {
            return;
        }
        self.stream
            .memcpy_dtod(&src.slice(so..so + n), &mut dst.slice_mut(dof..dof + n))
            .expect("CUDA device-to-device copy");
    }
}

impl Backend for CudaBackend {
    type Buf = CudaBuf;
    type Weight = CudaWeight;
    type Vector = CudaSlice<f32>;
    type Kv = CudaKv;
    type KvSnapshot = CudaKvSnapshot;

    fn name(&self) -> String {
        self.name.clone()
    }

    fn alloc(&self, len: usize) -> CudaBuf {
        self.stream
            .alloc_zeros::<f32>(len.max(1))
            .unwrap_or_else(|e| panic!("CUDA alloc of {len} floats failed: {e:?}"))
    }

    fn write(&self, buf: &mut CudaBuf, data: &[f32]) {
        self.stream
            .memcpy_htod(data, &mut buf.slice_mut(0..data.len()))
            .expect("CUDA upload");
    }

    fn read(&self, buf: &CudaBuf, out: &mut [f32]) {
        self.stream
            .memcpy_dtoh(&buf.slice(0..out.len()), out)
            .expect("CUDA download");
        self.stream.synchronize().expect("CUDA synchronize");
    }

    fn upload_weight(&self, w: &HostWeight) -> Result<CudaWeight> {
        if !supported(w.ty) {
            bail!(
                "tensor '{}' has type {} which the CUDA backend cannot multiply",
                w.name,
                w.ty
            );
        }
        let bs = w.ty.block_size();
        if !w.cols.is_multiple_of(bs) {
            bail!(
                "tensor '{}': {} columns are not a multiple of {bs}",
                w.name,
                w.cols
            );
        }
        let row_bytes =
            w.ty.row_bytes(w.cols as u64)
                .ok_or_else(|| anyhow!("tensor '{}': bad row size", w.name))? as usize;
        let bytes = w.bytes();
        if bytes.len() < row_bytes * w.rows {
            bail!("tensor '{}' data is shorter than its shape", w.name);
        }
        let data = self
            .stream
            .clone_htod(&bytes[..row_bytes * w.rows])
            .with_context(|| format!("uploading tensor '{}'", w.name))?;
        Ok(CudaWeight {
            data,
            ty: w.ty,
            rows: w.rows,
            cols: w.cols,
            row_bytes,
        })
    }

    fn upload_vector(&self, data: &[f32]) -> Result<CudaSlice<f32>> {
        Ok(self.stream.clone_htod(data)?)
    }

    fn new_kv(&self, layers: &[KvLayerSpec], ty: KvType) -> Result<CudaKv> {
        let eb = kv_elem_bytes(ty);
        let mut out = Vec::with_capacity(layers.len());
        for spec in layers {
            if spec.head_dim_k > ATT_MAXD || spec.head_dim_v > ATT_MAXD {
                bail!(
                    "head dimension above {ATT_MAXD} is not supported by the CUDA attention kernel"
                );
            }
            let nk = spec.capacity * spec.n_head_kv * spec.head_dim_k * eb;
            let nv = spec.capacity * spec.n_head_kv * spec.head_dim_v * eb;
            out.push(KvLayer {
                spec: spec.clone(),
                k: self.stream.alloc_zeros::<u8>(nk.max(1))?,
                v: self.stream.alloc_zeros::<u8>(nv.max(1))?,
            });
        }
        Ok(CudaKv { layers: out, ty })
    }

    fn kv_checkpoint(&self, kv: &CudaKv, n_past: usize) -> CudaKvSnapshot {
        let eb = kv_elem_bytes(kv.ty);
        let mut saved = Vec::new();
        for (li, l) in kv.layers.iter().enumerate() {
            if l.spec.window.is_none() || n_past == 0 {
                continue;
            }
            let first = vela_compute::window_start(n_past - 1, l.spec.window);
            let wk = l.spec.n_head_kv * l.spec.head_dim_k * eb;
            let wv = l.spec.n_head_kv * l.spec.head_dim_v * eb;
            let n = n_past - first;
            let mut ks = self
                .stream
                .alloc_zeros::<u8>((n * wk).max(1))
                .expect("CUDA alloc");
            let mut vs = self
                .stream
                .alloc_zeros::<u8>((n * wv).max(1))
                .expect("CUDA alloc");
            // Slot by slot: the window may wrap around the ring.
            for (i, p) in (first..n_past).enumerate() {
                let s = p % l.spec.capacity;
                self.copy_bytes(&l.k, s * wk, &mut ks, i * wk, wk);
                self.copy_bytes(&l.v, s * wv, &mut vs, i * wv, wv);
            }
            saved.push((li, first, ks, vs));
        }
        CudaKvSnapshot { saved }
    }

    fn kv_restore(&self, kv: &mut CudaKv, snap: &CudaKvSnapshot) {
        let eb = kv_elem_bytes(kv.ty);
        for (li, first, ks, vs) in &snap.saved {
            let l = &mut kv.layers[*li];
            let wk = l.spec.n_head_kv * l.spec.head_dim_k * eb;
            let wv = l.spec.n_head_kv * l.spec.head_dim_v * eb;
            let n = ks.len().checked_div(wk).unwrap_or(0);
            for i in 0..n {
                let s = (first + i) % l.spec.capacity;
                let (k, v) = (&mut l.k, &mut l.v);
                if wk > 0 {
                    self.stream
                        .memcpy_dtod(
                            &ks.slice(i * wk..(i + 1) * wk),
                            &mut k.slice_mut(s * wk..(s + 1) * wk),
                        )
                        .expect("CUDA copy");
                }
                if wv > 0 {
                    self.stream
                        .memcpy_dtod(
                            &vs.slice(i * wv..(i + 1) * wv),
                            &mut v.slice_mut(s * wv..(s + 1) * wv),
                        )
                        .expect("CUDA copy");
                }
            }
        }
    }

    fn kv_clone(&self, kv: &CudaKv) -> CudaKv {
        let layers = kv
            .layers
            .iter()
            .map(|l| {
                let mut k = self
                    .stream
                    .alloc_zeros::<u8>(l.k.len())
                    .expect("CUDA alloc");
                let mut v = self
                    .stream
                    .alloc_zeros::<u8>(l.v.len())
                    .expect("CUDA alloc");
                self.stream.memcpy_dtod(&l.k, &mut k).expect("CUDA copy");
                self.stream.memcpy_dtod(&l.v, &mut v).expect("CUDA copy");
                KvLayer {
                    spec: l.spec.clone(),
                    k,
                    v,
                }
            })
            .collect();
        CudaKv { layers, ty: kv.ty }
    }

    fn kv_bytes(&self, kv: &CudaKv) -> usize {
        kv.layers.iter().map(|l| l.k.len() + l.v.len()).sum()
    }

    fn get_rows(&self, w: &CudaWeight, ids: &[u32], scale: f32, out: &mut CudaBuf) -> Result<()> {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= w.rows) {
            bail!(
                "token id {id} is out of range (vocabulary has {} entries)",
                w.rows
            );
        }
        if ids.is_empty() {
            return Ok(());
        }
        if out.len() < ids.len() * w.cols {
            bail!("get_rows: output buffer too small");
        }
        let (suffix, _) = type_info(w.ty).expect("checked at upload");
        let d_ids = self.stream.clone_htod(ids)?;
        let args = [
            Arg::P(self.ptr(&w.data)),
            Arg::P(self.ptr(&d_ids)),
            Arg::I(w.cols as i32),
            Arg::L(w.row_bytes as i64),
            Arg::F(scale),
            Arg::P(self.ptr(out)),
        ];
        self.launch(
            &format!("get_rows_{suffix}"),
            (ids.len() as u32, 1, 1),
            256,
            &args,
        );
        Ok(())
    }

    fn matmul(&self, w: &CudaWeight, x: &CudaBuf, n: usize, y: &mut CudaBuf) {
        self.matmul_many(&[w], x, n, &mut [y]);
    }

    /// The activations are quantized once for all weights that share their block type and
    /// width (Q/K/V, gate/up), then one product kernel runs per weight.
    fn matmul_many(&self, ws: &[&CudaWeight], x: &CudaBuf, n: usize, ys: &mut [&mut CudaBuf]) {
        assert_eq!(
            ws.len(),
            ys.len(),
            "matmul_many: {} weights, {} outputs",
            ws.len(),
            ys.len()
        );
        if n == 0 {
            return;
        }
        let mut sc = self.scratch();
        // (activation kind, width) of the activations currently in the scratch buffer.
        let mut quantized: Option<(ActKind, usize, u64, usize)> = None;
        for (w, y) in ws.iter().zip(ys.iter_mut()) {
            if w.rows == 0 {
                continue;
            }
            assert!(
                x.len() >= n * w.cols,
                "matmul: x shorter than {n}x{}",
                w.cols
            );
            assert!(
                y.len() >= n * w.rows,
                "matmul: y shorter than {n}x{}",
                w.rows
            );
            let (suffix, kind) = type_info(w.ty).expect("checked at upload");
            let (xp, nb) = match kind {
                ActKind::Float => (self.ptr(x), w.cols),
                ActKind::Q8 | ActKind::Q8K => match quantized {
                    Some((k, c, p, nb)) if k == kind && c == w.cols => (p, nb),
                    _ => {
                        let r = self.quantize_act(&mut sc, kind, x, n, w.cols);
                        quantized = Some((kind, w.cols, r.0, r.1));
                        r
                    }
                },
            };
            let tt = if n == 1 { 1 } else { 8 };
            let args = [
                Arg::P(self.ptr(&w.data)),
                Arg::P(xp),
                Arg::P(self.ptr(&**y)),
                Arg::I(w.rows as i32),
                Arg::I(nb as i32),
                Arg::I(n as i32),
            ];
            let grid = ((w.rows as u32).div_ceil(MM_WARPS), n.div_ceil(tt) as u32, 1);
            self.launch(&format!("mm_{suffix}_t{tt}"), grid, 32 * MM_WARPS, &args);
        }
    }

    fn add_bias(&self, x: &mut CudaBuf, b: &CudaSlice<f32>, n: usize) {
        let w = b.len();
        let args = [
            Arg::P(self.ptr(x)),
            Arg::P(self.ptr(b)),
            Arg::I(w as i32),
            Arg::L((n * w) as i64),
        ];
        self.launch_1d("add_bias", n * w, &args);
    }

    fn rms_norm(
        &self,
        x: &CudaBuf,
        w: &CudaSlice<f32>,
        n_rows: usize,
        width: usize,
        eps: f32,
        out: &mut CudaBuf,
    ) {
        if n_rows == 0 {
            return;
        }
        let args = [
            Arg::P(self.ptr(x)),
            Arg::P(self.ptr(w)),
            Arg::P(self.ptr(out)),
            Arg::I(width as i32),
            Arg::F(eps),
        ];
        self.launch("rms_norm", (n_rows as u32, 1, 1), 256, &args);
    }

    fn rms_norm_inplace(
        &self,
        x: &mut CudaBuf,
        w: &CudaSlice<f32>,
        n_rows: usize,
        width: usize,
        eps: f32,
    ) {
        if n_rows == 0 {
            return;
        }
        let xp = self.ptr(x);
        let args = [
            Arg::P(xp),
            Arg::P(self.ptr(w)),
            Arg::P(xp),
            Arg::I(width as i32),
            Arg::F(eps),
        ];
        self.launch("rms_norm", (n_rows as u32, 1, 1), 256, &args);
    }

    fn rope(
        &self,
        x: &mut CudaBuf,
        n_head: usize,
        head_dim: usize,
        positions: &[u32],
        p: &RopeParams,
    ) {
        if positions.is_empty() || p.n_rot == 0 {
            return;
        }
        // Same expression as the CPU backend, so both use the identical f32 ratio.
        let theta_scale = p.freq_base.powf(-2.0 / p.n_rot as f32);
        let ff = p.freq_factors.as_ref().map(|f| {
            self.stream
                .clone_htod(&f[..])
                .expect("CUDA upload of rope factors")
        });
        let mut sc = self.scratch();
        let pp = self.positions(&mut sc, positions);
        let args = [
            Arg::P(self.ptr(x)),
            Arg::P(pp),
            Arg::I(n_head as i32),
            Arg::I(head_dim as i32),
            Arg::I(p.n_rot as i32),
            Arg::F(theta_scale),
            Arg::F(p.freq_scale),
            Arg::P(ff.as_ref().map(|f| self.ptr(f)).unwrap_or(0)),
            Arg::I(i32::from(p.neox)),
        ];
        self.launch("rope", (positions.len() as u32, 1, 1), 256, &args);
    }

    fn scale(&self, x: &mut CudaBuf, len: usize, s: f32) {
        let args = [Arg::P(self.ptr(x)), Arg::F(s), Arg::L(len as i64)];
        self.launch_1d("scale", len, &args);
    }

    fn add(&self, x: &mut CudaBuf, y: &CudaBuf, len: usize) {
        let args = [Arg::P(self.ptr(x)), Arg::P(self.ptr(y)), Arg::L(len as i64)];
        self.launch_1d("add", len, &args);
    }

    fn act_mul(&self, gate: &mut CudaBuf, up: &CudaBuf, len: usize, act: Activation) {
        let name = match act {
            Activation::Silu => "act_mul_silu",
            Activation::GeluTanh => "act_mul_gelu",
        };
        let args = [
            Arg::P(self.ptr(gate)),
            Arg::P(self.ptr(up)),
            Arg::L(len as i64),
        ];
        self.launch_1d(name, len, &args);
    }

    fn softcap(&self, x: &mut CudaBuf, len: usize, cap: f32) {
        let args = [Arg::P(self.ptr(x)), Arg::F(cap), Arg::L(len as i64)];
        self.launch_1d("softcap", len, &args);
    }

    fn kv_store(&self, kv: &mut CudaKv, layer: usize, k: &CudaBuf, v: &CudaBuf, positions: &[u32]) {
        if positions.is_empty() {
            return;
        }
        let name = match kv.ty {
            KvType::F32 => "kv_store_f32",
            KvType::F16 => "kv_store_f16",
        };
        let l = &kv.layers[layer];
        let mut sc = self.scratch();
        let pp = self.positions(&mut sc, positions);
        let args = [
            Arg::P(self.ptr(k)),
            Arg::P(self.ptr(v)),
            Arg::P(pp),
            Arg::P(self.ptr(&l.k)),
            Arg::P(self.ptr(&l.v)),
            Arg::I((l.spec.n_head_kv * l.spec.head_dim_k) as i32),
            Arg::I((l.spec.n_head_kv * l.spec.head_dim_v) as i32),
            Arg::I(l.spec.capacity as i32),
        ];
        self.launch(name, (positions.len() as u32, 1, 1), 256, &args);
    }

    fn attention(
        &self,
        q: &CudaBuf,
        kv: &CudaKv,
        layer: usize,
        positions: &[u32],
        p: &AttnParams,
        out: &mut CudaBuf,
    ) {
        if positions.is_empty() {
            return;
        }
        assert!(
            p.head_dim_k <= ATT_MAXD && p.head_dim_v <= ATT_MAXD,
            "attention: head dimension above {ATT_MAXD}"
        );
        let l = &kv.layers[layer];
        let name = match kv.ty {
            KvType::F32 => "attention_f32",
            KvType::F16 => "attention_f16",
        };
        let window = p.window.or(l.spec.window).unwrap_or(0);
        let mut sc = self.scratch();
        let pp = self.positions(&mut sc, positions);
        let args = [
            Arg::P(self.ptr(q)),
            Arg::P(self.ptr(&l.k)),
            Arg::P(self.ptr(&l.v)),
            Arg::P(pp),
            Arg::P(self.ptr(out)),
            Arg::I(p.n_head as i32),
            Arg::I(p.n_head_kv as i32),
            Arg::I(p.head_dim_k as i32),
            Arg::I(p.head_dim_v as i32),
            Arg::I(l.spec.capacity as i32),
            Arg::I(window as i32),
            Arg::F(p.scale),
            Arg::F(p.softcap.unwrap_or(0.0)),
        ];
        self.launch(
            name,
            (p.n_head as u32, positions.len() as u32, 1),
            32 * ATT_WARPS,
            &args,
        );
    }

    fn copy_rows(
        &self,
        src: &CudaBuf,
        src_row: usize,
        n_rows: usize,
        width: usize,
        dst: &mut CudaBuf,
    ) {
        let n = n_rows * width;
        if n == 0 {
            return;
        }
        let s0 = src_row * width;
        self.stream
            .memcpy_dtod(&src.slice(s0..s0 + n), &mut dst.slice_mut(0..n))
            .expect("CUDA device-to-device copy");
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        let _ = self.stream.synchronize();
        let _ = &self.ctx;
    }
}
