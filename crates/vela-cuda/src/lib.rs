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

mod argmax;
mod attn;
mod attn_gemm;
mod attn_parts;
mod cublas;
mod gemm;
mod graph;
pub mod kernels;
mod kv;
mod l2pf;
mod matmul;
pub mod nvrtc;
mod profile;
pub mod sample;
pub use sync_cost::{OverlapProbe, SyncCost};
mod switches;
mod sync_cost;
mod upload;

pub use gemm::DEFAULT_GEMM_MIN;
pub use graph::GraphStats;
pub use kv::{CudaKv, CudaKvSnapshot};

use anyhow::{anyhow, bail, Context, Result};
use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DriverError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex};
use vela_compute::{Activation, AttnParams, Backend, HostWeight, KvLayerSpec, KvType, RopeParams};
use vela_formats::quant::GgmlType;

pub use kernels::KERNEL_NAMES;

/// Bytes of the GPU activation block layouts (`struct AQ8` / `AQ8K` in `kernels/quant.cu`).
const AQ8_BYTES: usize = 48;
const AQ8K_BYTES: usize = 304;
/// Warps (weight rows) per matmul thread block (`WARPS` in quant.cu).
const MM_WARPS: u32 = 4;
/// Zero bytes allocated after every weight (see `mv32` in matvec.cu).
const WEIGHT_PAD: usize = 64;
/// Largest head dimension of the attention kernels' default instances (`ATT_MAXD`).
const ATT_MAXD: usize = 256;
/// Largest head dimension at all (`ATT_MAXD_BIG`: the `_d512` instances, e.g. Gemma 4's full
/// attention layers).
const ATT_MAXD_BIG: usize = 512;
/// Warps per attention thread block (`ATT_WARPS` in attention.cu).
const ATT_WARPS: u32 = 32;
/// Warps per split-K attention block (`SPLIT_WARPS`) and the most query rows it is used for.
const SPLIT_WARPS: u32 = 4;
const SPLIT_MAX_ROWS: usize = 4;

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

/// Kernel-name suffix of a type's split-row layout (see `CudaWeight`).
fn split_suffix(ty: GgmlType) -> Option<&'static str> {
    match ty {
        GgmlType::Q4_0 => Some("q4_0s"),
        GgmlType::Q4_K => Some("q4_ks"),
        GgmlType::Q6_K => Some("q6_ks"),
        _ => None,
    }
}

/// Whether the CUDA backend can multiply (and embed from) weights of type `ty`.
pub fn supported(ty: GgmlType) -> bool {
    type_info(ty).is_some()
}

/// A weight matrix uploaded once, in its GGUF block layout, or for Q4_0 (rows of a multiple of
/// 256 elements), Q4_K and Q6_K (rows padded to 16 bytes) in split rows (`split`: the 4-bit
/// quants of each 32-element (sub-)block in one aligned 16-byte word, the scales after them; the
/// same row size but for Q6_K's padding; see `repack_q4_0` and `BK<112>` in kernels/quant.cu).
/// `row_bytes` is the stride between rows as uploaded.
pub struct CudaWeight {
    data: CudaSlice<u8>,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    split: bool,
}

impl CudaWeight {
    /// Whether the weight was repacked into split rows at upload.
    pub fn is_split_rows(&self) -> bool {
        self.split
    }

    /// Kernel-name suffix and activation kind (`q4_0s` for split rows).
    fn info(&self) -> (&'static str, ActKind) {
        let (suffix, kind) = type_info(self.ty).expect("checked at upload");
        if self.split {
            return (split_suffix(self.ty).unwrap_or(suffix), kind);
        }
        (suffix, kind)
    }
}

/// An f32 activation buffer.
pub type CudaBuf = CudaSlice<f32>;

// KV cache types and ops live in kv.rs.

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
    /// Exact matmuls (`VELA_MATMUL=f32`): f32 weights and activations, f64 sums.
    exact: AtomicBool,
    /// One-token quantized products use the `mv_*` kernels (`VELA_CUDA_MATVEC=old`: `mm_*_t1`).
    matvec_new: AtomicBool,
    /// k-quant one-token products with 2 instead of 4 sub-blocks in flight per lane
    /// (`VELA_CUDA_MVK_U2=1`; fewer registers, higher occupancy).
    mvk_u2: AtomicBool,
    /// Fused pre-norm input and q/k RoPE (`VELA_CUDA_FUSE`, default on).
    fuse: AtomicBool,
    /// QK norm and post norms folded into neighbouring kernels (`VELA_CUDA_NORM_FOLD=0` off).
    norm_fold: AtomicBool,
    /// Split-K attention for up to `SPLIT_MAX_ROWS` query rows (`VELA_CUDA_ATTN=old`: off).
    split_attn: AtomicBool,
    /// Partial results of the split-K attention.
    attn_part: Mutex<CudaSlice<f32>>,
    /// Decode-step graphs (`VELA_CUDA_GRAPH`, default on).
    graphs_on: AtomicBool,
    rec: Mutex<graph::Recorder>,
    /// `[token, position]` of the decode step being recorded, and its device address.
    io: Mutex<CudaSlice<u32>>,
    io_ptr: u64,
    /// RoPE frequency factors uploaded once per distinct host vector.
    rope_factors: Mutex<Vec<RopeFactors>>,
    /// Device output of `argmax_rows` and its per-chunk candidates (values, then indices); also
    /// the row records and part candidates of the device top-k (sample.rs), under the same lock.
    argmax_out: Mutex<(CudaSlice<u32>, CudaSlice<f32>)>,
    /// Pipelined greedy decoding's host slots (argmax.rs).
    pipe: Mutex<argmax::Pipe>,
    /// Record the next decode step while the GPU runs this one (`Backend::decode_step_prepare`;
    /// default on, `VELA_CUDA_PREPARE=0` off; graph.rs).
    prepare_on: AtomicBool,
    /// Bumped whenever a scratch buffer that recorded launches point at is reallocated.
    scratch_gen: std::sync::atomic::AtomicU64,
    upload: upload::Upload,
    /// cuBLAS prefill (gemm.rs): smallest batch (`VELA_CUDA_GEMM_MIN`, 0 = off) and state.
    gemm_min: AtomicUsize,
    /// Dequantize for cuBLAS one 32-element block per thread (default; `VELA_CUDA_DEQH=elem`:
    /// 8 elements per thread).
    deqh_block: AtomicBool,
    gemm: Mutex<gemm::GemmState>,
    /// Warps per row of the one-token matvec (`VELA_CUDA_MV_SPLIT`, see `mv_split`).
    mv_split_mode: std::sync::atomic::AtomicU32,
    /// Split-K decode attention on the tensor cores (`flash_decode_*`,
    /// default where it applies; `VELA_CUDA_ATTN_PART=1|2|3` off; attn.rs).
    fdec: attn::FlashDecode,
    /// Split-K decode attention parts, third version: one block per KV head
    /// (`VELA_CUDA_ATTN_PART=3`; off by default).
    attn_part3: AtomicBool,
    /// Prefill attention with head dims above 256 through cuBLAS (attn_gemm.rs; default on,
    /// `VELA_CUDA_ATTN_GEMM=0` off).
    attn_gemm: AtomicBool,
    /// Q6_K rows of any length in split rows, padded to 16 bytes (default on,
    /// `VELA_CUDA_Q6K_PAD=0` off).
    q6k_pad: AtomicBool,
    /// Repack Q4_0/Q4_K/Q6_K weights into split rows at upload (default; `VELA_CUDA_REPACK=0`
    /// off).
    repack: AtomicBool,
    /// Prefill attention kernel (`VELA_CUDA_ATTN_PREFILL` = flash | w4 | w32 → 0 | 1 | 2,
    /// attn.rs).
    attn_prefill: std::sync::atomic::AtomicU32,
    /// Latency-bound decode kernels, second version (default; `VELA_CUDA_SMALL=old` off):
    /// `norm_q8*_regs` and `rope_store_heads_*`.
    small_v2: AtomicBool,
    /// Rows per warp of the one-token matvec (`mv_rows` in matmul.rs): 0 one, 1 auto (default),
    /// 2 two (`VELA_CUDA_MV_ROWS=1|auto|2`).
    mv_rows_mode: std::sync::atomic::AtomicU32,
    /// Split-K decode attention parts, second version (default; `VELA_CUDA_ATTN_PART=1` off).
    attn_part_v2: AtomicBool,
    /// Programmatic dependent launch (sm_90+, default on; `VELA_CUDA_PDL=0` off; graph.rs).
    pdl: AtomicBool,
    /// Per-kernel timing (`VELA_CUDA_PROFILE=1`, profile.rs).
    profiling: AtomicBool,
    prof: Mutex<profile::Profiler>,
    /// Measurement only (`VELA_CUDA_SKIP=prefix,...`): kernels whose names start with one of
    /// these are not launched, so a timed run shows what they cost inside a decode step (the
    /// results are wrong).
    skip: Vec<String>,
    /// One-token products of different weight types in one `mv_mix*_x3` launch (default;
    /// `VELA_CUDA_MIXED_X3=0` off; matmul.rs).
    mixed_x3: AtomicBool,
    /// Q/K/V biases added by the products (`mv_*_x3b`; default; `VELA_CUDA_BIAS_FUSE=0` off).
    bias_fuse: AtomicBool,
    /// Several row pairs per warp for narrow Q8_0 rows (`mv_q8_0_r2n`: the small models' LM
    /// heads; default; `VELA_CUDA_MV_NARROW=0` off; matmul.rs).
    mv_narrow: AtomicBool,
}

/// RoPE frequency factors: the host vector (kept alive as the cache key) and its device copy.
type RopeFactors = (Arc<Vec<f32>>, CudaSlice<f32>);

/// A kernel argument (all are passed by value).
#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) enum Arg {
    P(u64),
    I(i32),
    L(i64),
    F(f32),
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
                // (The tensor-core kernels needing it run on sm_80+ only, and only where the
                // opt-in limit holds them (`FlashDecode::fits` for head dims 256 and 512).)
                let smem = kernels::dyn_smem(n);
                // (An opt-in limit of 0: the query failed; tried as before.)
                let optin = |o: usize| o == 0 || smem as usize <= o;
                if smem > 48 << 10 && arch >= 80 && optin(attn::smem_optin(&ctx)) {
                    f.set_attribute(
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        smem as i32,
                    )
                    .map_err(|e| anyhow!("kernel {n}: {smem} bytes of shared memory: {e:?}"))?;
                }
                funcs.insert(n, f);
            }
        }
        // One stream and no cross-stream sharing: cudarc's per-buffer event tracking is not needed.
        // SAFETY: every buffer is used on `stream` only.
        unsafe { ctx.disable_event_tracking() };
        // A created stream, not the legacy default stream, which cannot be captured into graphs.
        let stream = ctx
            .new_stream()
            .map_err(|e| anyhow!("creating a CUDA stream: {e:?}"))?;
        let scratch = Scratch {
            act: stream.alloc_zeros::<u8>(1)?,
            pos: stream.alloc_zeros::<u32>(1)?,
            pos_host: Vec::new(),
        };
        let io = stream.alloc_zeros::<u32>(2)?;
        let io_ptr = io.device_ptr(&stream).0;
        let argmax_out = stream.alloc_zeros::<u32>(1)?;
        let argmax_cand = stream.alloc_zeros::<f32>(2)?;
        let attn_part = stream.alloc_zeros::<f32>(1)?;
        let fdec = attn::FlashDecode::new(&ctx)?;
        let env = |k: &str| std::env::var(k).unwrap_or_default();
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
            exact: AtomicBool::new(env("VELA_MATMUL") == "f32"),
            matvec_new: AtomicBool::new(env("VELA_CUDA_MATVEC") != "old"),
            mvk_u2: AtomicBool::new(env("VELA_CUDA_MVK_U2") == "1"),
            fuse: AtomicBool::new(env("VELA_CUDA_FUSE") != "0"),
            norm_fold: AtomicBool::new(env("VELA_CUDA_NORM_FOLD") != "0"),
            split_attn: AtomicBool::new(env("VELA_CUDA_ATTN") != "old"),
            attn_part: Mutex::new(attn_part),
            graphs_on: AtomicBool::new(
                env("VELA_CUDA_GRAPH") != "0" && env("VELA_CUDA_PROFILE") != "1",
            ),
            rec: Mutex::new(graph::Recorder::new()),
            io: Mutex::new(io),
            io_ptr,
            rope_factors: Mutex::new(Vec::new()),
            argmax_out: Mutex::new((argmax_out, argmax_cand)),
            pipe: Mutex::new(argmax::Pipe::new()),
            prepare_on: AtomicBool::new(env("VELA_CUDA_PREPARE") != "0"),
            scratch_gen: std::sync::atomic::AtomicU64::new(0),
            upload: upload::Upload::default(),
            gemm_min: AtomicUsize::new(
                env("VELA_CUDA_GEMM_MIN")
                    .parse()
                    .unwrap_or(gemm::DEFAULT_GEMM_MIN),
            ),
            gemm: Mutex::new(gemm::GemmState::default()),
            deqh_block: AtomicBool::new(env("VELA_CUDA_DEQH") != "elem"),
            profiling: AtomicBool::new(env("VELA_CUDA_PROFILE") == "1"),
            small_v2: AtomicBool::new(env("VELA_CUDA_SMALL") != "old"),
            mv_rows_mode: std::sync::atomic::AtomicU32::new(
                match env("VELA_CUDA_MV_ROWS").as_str() {
                    "1" => 0,
                    "2" => 2,
                    _ => 1,
                },
            ),
            attn_part_v2: AtomicBool::new(env("VELA_CUDA_ATTN_PART") != "1"),
            pdl: AtomicBool::new(arch >= 90 && env("VELA_CUDA_PDL") != "0"),
            repack: AtomicBool::new(env("VELA_CUDA_REPACK") != "0"),
            attn_gemm: AtomicBool::new(env("VELA_CUDA_ATTN_GEMM") != "0"),
            q6k_pad: AtomicBool::new(env("VELA_CUDA_Q6K_PAD") != "0"),
            attn_part3: AtomicBool::new(env("VELA_CUDA_ATTN_PART") == "3"),
            fdec,
            attn_prefill: std::sync::atomic::AtomicU32::new(
                match env("VELA_CUDA_ATTN_PREFILL").as_str() {
                    "w4" => 1,
                    "w32" => 2,
                    _ => 0,
                },
            ),
            mv_split_mode: std::sync::atomic::AtomicU32::new(
                match env("VELA_CUDA_MV_SPLIT").as_str() {
                    "auto" => 0,
                    "2" => 2,
                    "4" => 4,
                    _ => 1,
                },
            ),
            prof: Mutex::new(profile::Profiler::default()),
            skip: env("VELA_CUDA_SKIP")
                .split(',')
                .filter(|p| !p.is_empty())
                .map(str::to_string)
                .collect(),
            mixed_x3: AtomicBool::new(env("VELA_CUDA_MIXED_X3") != "0"),
            bias_fuse: AtomicBool::new(env("VELA_CUDA_BIAS_FUSE") != "0"),
            mv_narrow: AtomicBool::new(env("VELA_CUDA_MV_NARROW") != "0"),
        })
    }

    /// Free and total device memory in bytes.
    pub fn memory_info(&self) -> Result<(u64, u64)> {
        let (free, total) = self.ctx.mem_get_info().context("querying GPU memory")?;
        Ok((free as u64, total as u64))
    }

    /// Show upload progress for a model of `total` weight bytes until [`Self::end_upload`].
    pub fn begin_upload(&self, total: u64) {
        self.upload.begin(total, &self.name);
    }

    /// End the upload progress; returns (bytes uploaded, seconds).
    pub fn end_upload(&self) -> Option<(u64, f64)> {
        self.upload.end()
    }

    /// Wait until every enqueued op has finished.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().context("CUDA stream synchronize")
    }

    fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        let (p, _sync) = s.device_ptr(&self.stream);
        p
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
        if let Some(p) = self.recorded_pos(positions) {
            return p;
        }
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

    /// Device address of the uploaded copy of RoPE frequency factors `f` (uploaded on first use;
    /// keyed by the `Arc`, which is kept alive so its address cannot be reused).
    fn rope_factors_ptr(&self, f: &Arc<Vec<f32>>) -> u64 {
        let mut c = self.rope_factors.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, d)) = c.iter().find(|(h, _)| Arc::ptr_eq(h, f)) {
            return self.ptr(d);
        }
        let d = self
            .stream
            .clone_htod(&f[..])
            .expect("CUDA upload of rope factors");
        let p = self.ptr(&d);
        c.push((f.clone(), d));
        p
    }

    /// Copy `n` bytes between device buffers at byte offsets.
    pub(crate) fn copy_bytes(
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

    fn memory_free(&self) -> Option<u64> {
        self.memory_info().ok().map(|(free, _)| free)
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    fn alloc(&self, len: usize) -> CudaBuf {
        self.stream
            .alloc_zeros::<f32>(len.max(1))
            .unwrap_or_else(|e| panic!("CUDA alloc of {len} floats failed: {e:?}"))
    }

    fn write(&self, buf: &mut CudaBuf, data: &[f32]) {
        self.flush_recording();
        self.stream
            .memcpy_htod(data, &mut buf.slice_mut(0..data.len()))
            .expect("CUDA upload");
    }

    fn read(&self, buf: &CudaBuf, out: &mut [f32]) {
        self.flush_recording();
        self.stream
            .memcpy_dtoh(&buf.slice(0..out.len()), out)
            .expect("CUDA download");
        self.stream.synchronize().expect("CUDA synchronize");
    }

    fn upload_weight(&self, w: &HostWeight) -> Result<CudaWeight> {
        self.upload_weight_impl(w)
    }

    fn upload_vector(&self, data: &[f32]) -> Result<CudaSlice<f32>> {
        Ok(self.stream.clone_htod(data)?)
    }

    fn new_kv(&self, layers: &[KvLayerSpec], ty: KvType) -> Result<CudaKv> {
        self.kv_new_impl(layers, ty)
    }

    fn kv_checkpoint(&self, kv: &CudaKv, n_past: usize) -> CudaKvSnapshot {
        self.kv_checkpoint_impl(kv, n_past)
    }

    fn kv_restore(&self, kv: &mut CudaKv, snap: &CudaKvSnapshot) {
        self.kv_restore_impl(kv, snap)
    }

    fn kv_clone(&self, kv: &CudaKv) -> CudaKv {
        self.kv_clone_impl(kv)
    }

    fn kv_bytes(&self, kv: &CudaKv) -> usize {
        kv.layers.iter().map(|l| l.k.len() + l.v.len()).sum()
    }

    fn get_rows(&self, w: &CudaWeight, ids: &[u32], scale: f32, out: &mut CudaBuf) -> Result<()> {
        self.get_rows_impl(w, ids, scale, out)
    }

    fn matmul(&self, w: &CudaWeight, x: &CudaBuf, n: usize, y: &mut CudaBuf) {
        self.matmul_many(&[w], x, n, &mut [y]);
    }

    /// The activations are quantized once for all weights that share their block type and
    /// width (Q/K/V, gate/up), then one product kernel runs per weight.
    fn matmul_many(&self, ws: &[&CudaWeight], x: &CudaBuf, n: usize, ys: &mut [&mut CudaBuf]) {
        self.matmul_many_impl(ws, x, n, ys, None);
    }

    fn norm_matmul_many(
        &self,
        x: &mut CudaBuf,
        residual: Option<&CudaBuf>,
        w: &CudaSlice<f32>,
        n_rows: usize,
        width: usize,
        eps: f32,
        h: &mut CudaBuf,
        ws: &[&CudaWeight],
        biases: &[Option<&CudaSlice<f32>>],
        ys: &mut [&mut CudaBuf],
    ) {
        self.norm_matmul_impl(x, residual, None, w, n_rows, width, eps, h, ws, ys, biases);
    }

    fn post_norm_matmul_many(
        &self,
        x: &mut CudaBuf,
        residual: &mut CudaBuf,
        post: &CudaSlice<f32>,
        x_scale: f32,
        w: &CudaSlice<f32>,
        n_rows: usize,
        width: usize,
        eps: f32,
        h: &mut CudaBuf,
        ws: &[&CudaWeight],
        biases: &[Option<&CudaSlice<f32>>],
        ys: &mut [&mut CudaBuf],
    ) {
        let post = (post, x_scale);
        self.post_norm_matmul_impl(x, residual, post, w, n_rows, width, eps, h, ws, ys, biases);
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
        self.rope_impl(x, n_head, head_dim, positions, p);
    }

    #[allow(clippy::too_many_arguments)]
    fn rope_qk(
        &self,
        q: &mut CudaBuf,
        k: &mut CudaBuf,
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        positions: &[u32],
        p: &RopeParams,
    ) {
        self.rope_qk_impl(q, k, n_head, n_head_kv, head_dim, positions, p);
    }

    #[allow(clippy::too_many_arguments)]
    fn rope_qk_store(
        &self,
        q: &mut CudaBuf,
        k: &mut CudaBuf,
        v: &CudaBuf,
        kv: &mut CudaKv,
        layer: usize,
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        positions: &[u32],
        p: &RopeParams,
    ) {
        let (n_kv, hd) = (n_head_kv, head_dim);
        self.rope_qk_store_impl(q, k, v, kv, layer, n_head, n_kv, hd, positions, p, None);
    }

    fn norm_rope_qk_store(
        &self,
        q: &mut CudaBuf,
        k: &mut CudaBuf,
        v: &mut CudaBuf,
        kv: &mut CudaKv,
        layer: usize,
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        positions: &[u32],
        p: &RopeParams,
        norms: (&CudaSlice<f32>, &CudaSlice<f32>, f32),
        v_norm: Option<&CudaSlice<f32>>,
    ) {
        let (qn, kn, eps) = norms;
        self.norm_rope_qk_store_impl(
            q,
            k,
            v,
            kv,
            layer,
            n_head,
            n_head_kv,
            head_dim,
            positions,
            p,
            (qn, kn, v_norm, eps),
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn act_mul_matmul(
        &self,
        gate: &mut CudaBuf,
        up: &CudaBuf,
        n_rows: usize,
        width: usize,
        act: Activation,
        w: &CudaWeight,
        y: &mut CudaBuf,
    ) {
        self.act_matmul_impl(gate, up, n_rows, width, act, w, y);
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
        let name = format!("kv_store_{}", kv::kv_suffix(kv.ty));
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
        self.launch(&name, (positions.len() as u32, 1, 1), 256, &args);
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
        self.attention_impl(q, kv, layer, positions, p, out, None);
    }

    fn attention_matmul(
        &self,
        q: &CudaBuf,
        kv: &CudaKv,
        layer: usize,
        positions: &[u32],
        p: &AttnParams,
        a: &mut CudaBuf,
        w: &CudaWeight,
        y: &mut CudaBuf,
    ) {
        self.attention_matmul_impl(q, kv, layer, positions, p, a, w, y);
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
        assert!(
            src.len() >= s0 + n && dst.len() >= n,
            "copy_rows: buffers too small"
        );
        // A kernel rather than a memcpy, so that decode steps can be recorded as launches.
        let args = [
            Arg::P(self.ptr(src) + (s0 * 4) as u64),
            Arg::P(self.ptr(dst)),
            Arg::L(n as i64),
        ];
        self.launch_1d("copy_f32", n, &args);
    }

    fn decode_step_begin(&self, token: u32, pos: u32, key: u64) -> bool {
        self.step_begin(token, pos, key)
    }

    fn decode_step_end(&self) {
        self.flush_recording();
    }

    fn argmax_rows(&self, x: &CudaBuf, n_rows: usize, width: usize) -> Vec<u32> {
        self.argmax_rows_device(x, n_rows, width)
    }

    fn decode_step_prepare(&self, pos: u32, key: u64) -> bool {
        self.step_prepare(pos, key)
    }

    fn decode_step_park(&self) {
        self.step_park()
    }

    fn decode_step_discard(&self) {
        self.step_discard()
    }

    fn decode_step_launch(&self, token: u32, pos: u32, key: u64) -> bool {
        self.step_launch(token, pos, key)
    }

    fn decode_step_begin_chained(&self, pos: u32, key: u64) -> bool {
        self.pipe.lock().unwrap_or_else(|e| e.into_inner()).on && self.step_begin_chained(pos, key)
    }

    fn argmax_start(&self, x: &CudaBuf, width: usize) -> Option<u64> {
        self.argmax_start_device(x, width)
    }

    fn argmax_finish(&self, ticket: u64) -> Result<u32> {
        self.argmax_finish_device(ticket)
    }

    fn top_k_rows(
        &self,
        x: &CudaBuf,
        n_rows: usize,
        width: usize,
        k: usize,
    ) -> Vec<vela_compute::TopK> {
        self.top_k_rows_device(x, n_rows, width, k)
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        let _ = self.stream.synchronize();
        if let Some(r) = self.profile_report() {
            eprint!("{r}");
        }
        if std::env::var_os("VELA_CUDA_DEBUG").is_some() {
            let g = self.graph_stats();
            let per = |x: u64| x as f64 / g.replays.max(1) as f64;
            eprintln!(
                "vela-cuda: decode graphs: {} replays, {} captures, {} plain steps, {} recorded \
                 ahead; host {:.1} us per replayed step ({:.0} launches)",
                g.replays,
                g.captures,
                g.plain,
                g.prepared,
                per(g.replay_host_ns) / 1e3,
                per(g.replay_launches)
            );
        }
        let _ = &self.ctx;
    }
}
