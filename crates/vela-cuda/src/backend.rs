//! The [`CudaBackend`] struct: the device, the tuning, the shared scratch buffers and the launch
//! path every op goes through (recorded into the current decode step, or launched now). The ops
//! themselves are `impl CudaBackend` blocks in their own modules (matmul.rs, attn.rs, ...).

use crate::argmax::Pipe;
use crate::device::{Arg, Device};
use crate::gemm::GemmState;
use crate::graph::{Launch, Recorder};
use crate::profile::Profiler;
use crate::tuning::{Live, Tuning};
use crate::upload::Upload;
use anyhow::{Context, Result};
use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};

/// Reusable device scratch: quantized activations and the last uploaded positions.
pub(crate) struct Scratch {
    pub(crate) act: CudaSlice<u8>,
    /// Activations in the tensor-core products' fragment order (`act_mma`, matmul.rs).
    pub(crate) mma: CudaSlice<u8>,
    pub(crate) pos: CudaSlice<u32>,
    pub(crate) pos_host: Vec<u32>,
    /// The K/V table of a batched step (`batch_attn.rs`) and its host copy.
    pub(crate) kvt: CudaSlice<u64>,
    pub(crate) kvt_host: Vec<u64>,
}

/// RoPE frequency factors: the host vector (kept alive as the cache key) and its device copy.
type RopeFactors = (Arc<Vec<f32>>, CudaSlice<f32>);

/// The CUDA backend (one device, one stream).
pub struct CudaBackend {
    pub(crate) dev: Device,
    pub(crate) tune: Live,
    pub(crate) prof: Profiler,
    scratch: Mutex<Scratch>,
    /// Partial results of the split-K decode attention.
    pub(crate) attn_part: Mutex<CudaSlice<f32>>,
    /// The indexer's block scores and the parts of the sparse attention (sparse.rs).
    pub(crate) sparse_scores: Mutex<CudaSlice<f32>>,
    pub(crate) sparse_part: Mutex<CudaSlice<f32>>,
    /// The RoPE positions of the indexer's pooled keys (sparse.rs).
    pub(crate) sparse_pool_pos: Mutex<CudaSlice<u32>>,
    /// The slots of a batch's expert products grouped by expert (`experts_group`, kit.rs).
    pub(crate) expert_groups: Mutex<CudaSlice<u32>>,
    /// The decode-step recorder and graph cache (graph.rs, steps.rs).
    pub(crate) rec: Mutex<Recorder>,
    /// `[token, position]` of the decode step being recorded, and its device address.
    pub(crate) io: Mutex<CudaSlice<u32>>,
    pub(crate) io_ptr: u64,
    /// The tokens, then the positions, of the batched step being recorded (steps.rs).
    pub(crate) bio: Mutex<CudaSlice<u32>>,
    /// RoPE frequency factors uploaded once per distinct host vector.
    rope_factors: Mutex<Vec<RopeFactors>>,
    /// Device output of `argmax_rows` and its per-chunk candidates (values, then indices); also
    /// the row records and part candidates of the device top-k (sample.rs), under the same lock.
    pub(crate) argmax_out: Mutex<(CudaSlice<u32>, CudaSlice<f32>)>,
    /// Pipelined greedy decoding's host slots (argmax.rs).
    pub(crate) pipe: Mutex<Pipe>,
    /// Bumped whenever a scratch buffer that recorded launches point at is reallocated.
    pub(crate) scratch_gen: AtomicU64,
    pub(crate) upload: Upload,
    /// cuBLAS and its scratch (gemm.rs, attn_gemm.rs).
    pub(crate) gemm: Mutex<GemmState>,
    /// Page size of K/V caches held by use; `None`: each cache is allocated whole (kv_pages.rs).
    pub(crate) kv_page: Option<usize>,
}

impl CudaBackend {
    /// Open GPU `device_ordinal` with the tuning of the environment ([`Tuning::from_env`]),
    /// compile (or load cached) kernels for its architecture.
    ///
    /// Fails with a one-line message when no driver or GPU is present, the driver predates
    /// CUDA 12.0, the GPU predates compute capability 6.1, or NVRTC cannot be found.
    pub fn new(device_ordinal: usize) -> Result<CudaBackend> {
        Self::with_tuning(device_ordinal, &Tuning::from_env())
    }

    /// [`Self::new`] with the given tuning.
    pub fn with_tuning(device_ordinal: usize, tuning: &Tuning) -> Result<CudaBackend> {
        let dev = Device::open(device_ordinal)?;
        let stream = &dev.stream;
        let scratch = Scratch {
            act: stream.alloc_zeros::<u8>(1)?,
            mma: stream.alloc_zeros::<u8>(1)?,
            pos: stream.alloc_zeros::<u32>(1)?,
            pos_host: Vec::new(),
            kvt: stream.alloc_zeros::<u64>(1)?,
            kvt_host: Vec::new(),
        };
        let io = stream.alloc_zeros::<u32>(2)?;
        let io_ptr = dev.ptr(&io);
        let argmax_out = stream.alloc_zeros::<u32>(1)?;
        let argmax_cand = stream.alloc_zeros::<f32>(2)?;
        let attn_part = stream.alloc_zeros::<f32>(1)?;
        Ok(CudaBackend {
            tune: Live::new(tuning),
            prof: Profiler::new(tuning.profile),
            scratch: Mutex::new(scratch),
            attn_part: Mutex::new(attn_part),
            sparse_scores: Mutex::new(stream.alloc_zeros::<f32>(1)?),
            sparse_part: Mutex::new(stream.alloc_zeros::<f32>(1)?),
            sparse_pool_pos: Mutex::new(stream.alloc_zeros::<u32>(1)?),
            expert_groups: Mutex::new(stream.alloc_zeros::<u32>(1)?),
            rec: Mutex::new(Recorder::default()),
            io: Mutex::new(io),
            io_ptr,
            bio: Mutex::new(stream.alloc_zeros::<u32>(2)?),
            rope_factors: Mutex::new(Vec::new()),
            argmax_out: Mutex::new((argmax_out, argmax_cand)),
            pipe: Mutex::new(Pipe::default()),
            scratch_gen: AtomicU64::new(0),
            upload: Upload::default(),
            gemm: Mutex::new(GemmState::default()),
            kv_page: crate::kv_pages::page_bytes(dev.ctx.cu_device()),
            dev,
        })
    }

    /// Compute capability as major*10+minor.
    pub fn arch(&self) -> u32 {
        self.dev.arch
    }

    /// How many kernel groups were loaded from the on-disk cache (vs compiled now).
    pub fn modules_from_cache(&self) -> usize {
        self.dev.modules_from_cache
    }

    /// Free and total device memory in bytes.
    pub fn memory_info(&self) -> Result<(u64, u64)> {
        let (free, total) = self.dev.ctx.mem_get_info().context("querying GPU memory")?;
        Ok((free as u64, total as u64))
    }

    /// Show upload progress for a model of `total` weight bytes until [`Self::end_upload`].
    pub fn begin_upload(&self, total: u64) {
        self.upload.begin(total, &self.dev.name);
    }

    /// End the upload progress; returns (bytes uploaded, seconds).
    pub fn end_upload(&self) -> Option<(u64, f64)> {
        self.upload.end()
    }

    /// How many times the host has waited for the device to read something back (results,
    /// logits, ids, a pipelined argmax): the host synchronizations a decode step costs.
    pub fn host_waits(&self) -> u64 {
        self.dev
            .host_waits
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Wait until every enqueued op has finished.
    pub fn synchronize(&self) -> Result<()> {
        self.dev
            .stream
            .synchronize()
            .context("CUDA stream synchronize")
    }

    /// Exact matmul mode on or off (default: `VELA_MATMUL=f32`); tests compare it with the CPU
    /// backend's exact mode.
    pub fn set_exact_matmul(&self, on: bool) {
        self.retune(|t| t.set_exact(on));
    }

    /// Decode-step graphs on or off (default: on unless `VELA_CUDA_GRAPH=0` or profiling).
    pub fn set_graphs(&self, on: bool) {
        self.retune(|t| t.set_graphs(on));
    }

    /// Per-kernel timing on or off (`VELA_CUDA_PROFILE=1` turns it on at creation, and only then
    /// are decode graphs off); tests use it to see which kernels ran.
    pub fn set_profiling(&self, on: bool) {
        self.drop_parked();
        self.prof.set(on);
    }

    /// GPU milliseconds and launches per kernel name so far, and reset the totals.
    pub fn profile_take(&self) -> HashMap<String, (f64, u64)> {
        self.prof.take()
    }

    /// The per-kernel table so far (None when profiling is off).
    pub fn profile_report(&self) -> Option<String> {
        self.prof.report()
    }

    /// Smallest batch whose products go to cuBLAS (0: never; default
    /// [`crate::DEFAULT_GEMM_MIN`]); tests move the threshold to reach both paths.
    pub fn set_gemm_min(&self, n: usize) {
        self.drop_parked();
        self.tune.set_gemm_min(n);
    }

    /// Fewest keys for the tensor-core decode attention (default
    /// [`crate::tuning::FLASH_DECODE_MIN_KEYS`], and
    /// [`crate::tuning::FLASH_DECODE_MIN_KEYS_WARP`] where the one-warp parts follow the keys:
    /// this sets both); tests move the threshold to reach both kernels at short contexts.
    pub fn set_flash_decode_min_keys(&self, n: usize) {
        self.retune(|t| t.set_fd_min_keys(n));
    }

    /// Rows per warp of the one-token matvec: 0 one, 1 two from 2,048 rows (default), 2 two;
    /// tests reach both kernels on small matrices.
    pub fn set_mv_rows_mode(&self, mode: u32) {
        self.retune(|t| t.set_mv_rows(mode));
    }

    /// Change a choice that recorded launches depend on: the parked step is dropped and the
    /// recording in progress run first.
    fn retune(&self, f: impl FnOnce(&Live)) {
        self.drop_parked();
        self.flush_recording();
        f(&self.tune);
    }

    pub(crate) fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        self.dev.ptr(s)
    }

    /// Queue a launch: recorded while a step is being recorded, else launched now.
    pub(crate) fn launch(&self, name: &str, grid: (u32, u32, u32), block: u32, args: &[Arg]) {
        self.launch_w(name, grid, block, args, Vec::new());
    }

    /// [`Self::launch`] of a product that reads `weights` (address, bytes; for the L2 prefetch).
    pub(crate) fn launch_w(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: u32,
        args: &[Arg],
        weights: Vec<(u64, u64)>,
    ) {
        {
            let mut r = self.recorder();
            if r.active {
                r.ops.push(Launch {
                    name: name.to_string(),
                    grid,
                    block,
                    args: args.to_vec(),
                    weights,
                });
                return;
            }
            if r.prepare_aborted {
                return;
            }
        }
        let t = self.prof.begin(&self.dev);
        if let Err(e) = self.dev.launch_now(name, grid, block, args) {
            panic!("{e:#}");
        }
        self.prof.end(&self.dev, name, t);
        if self.tune.debug {
            // An asynchronous fault is reported here, against the kernel that caused it.
            if let Err(e) = self.dev.stream.synchronize() {
                panic!("CUDA kernel {name} failed: {e:?}");
            }
        }
    }

    /// 1-D launch over `n` elements.
    pub(crate) fn launch_1d(&self, name: &str, n: usize, args: &[Arg]) {
        if n == 0 {
            return;
        }
        self.launch(name, (n.div_ceil(256) as u32, 1, 1), 256, args);
    }

    pub(crate) fn recorder(&self) -> MutexGuard<'_, Recorder> {
        self.rec.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Device pointer to `positions` (uploaded only when they differ from the last upload).
    pub(crate) fn positions(&self, sc: &mut Scratch, positions: &[u32]) -> u64 {
        if let Some(p) = self.recorded_pos(positions) {
            return p;
        }
        if sc.pos_host != positions {
            if sc.pos.len() < positions.len() {
                self.flush_recording();
                sc.pos = self
                    .dev
                    .stream
                    .alloc_zeros::<u32>(positions.len().next_power_of_two())
                    .expect("CUDA alloc of positions");
            }
            self.dev
                .stream
                .memcpy_htod(positions, &mut sc.pos.slice_mut(0..positions.len()))
                .expect("CUDA upload of positions");
            sc.pos_host = positions.to_vec();
        }
        self.ptr(&sc.pos)
    }

    pub(crate) fn scratch(&self) -> MutexGuard<'_, Scratch> {
        self.scratch.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Device address of the activation scratch, grown to at least `bytes`.
    pub(crate) fn act_scratch(&self, sc: &mut Scratch, bytes: usize) -> u64 {
        if sc.act.len() < bytes {
            self.flush_recording();
            sc.act = self
                .dev
                .stream
                .alloc_zeros::<u8>(bytes.next_power_of_two())
                .expect("CUDA alloc of activation scratch");
            self.scratch_moved();
        }
        self.ptr(&sc.act)
    }

    /// Device address of the buffer in `m`, replaced by a zeroed one of at least `len` elements
    /// (a power of two) when shorter; recorded steps that used the old one are dropped.
    pub(crate) fn grown_zeroed<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        m: &Mutex<CudaSlice<T>>,
        len: usize,
        what: &str,
    ) -> u64 {
        let mut buf = m.lock().unwrap_or_else(|e| e.into_inner());
        if buf.len() < len {
            self.flush_recording();
            *buf = self
                .dev
                .stream
                .alloc_zeros::<T>(len.next_power_of_two())
                .unwrap_or_else(|e| panic!("CUDA alloc of {what}: {e:?}"));
            self.scratch_moved();
        }
        self.ptr(&*buf)
    }

    /// Device address of the uploaded copy of RoPE frequency factors `f` (uploaded on first use;
    /// keyed by the `Arc`, which is kept alive so its address cannot be reused).
    pub(crate) fn rope_factors_ptr(&self, f: &Arc<Vec<f32>>) -> u64 {
        let mut c = self.rope_factors.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, d)) = c.iter().find(|(h, _)| Arc::ptr_eq(h, f)) {
            return self.ptr(d);
        }
        let d = self
            .dev
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
        self.dev
            .stream
            .memcpy_dtod(&src.slice(so..so + n), &mut dst.slice_mut(dof..dof + n))
            .expect("CUDA device-to-device copy");
    }
}

/// [`vela_compute::DeviceProbe`]: a 4 KiB device-to-device copy on a stream of its own.
pub(crate) struct Canary {
    ctx: std::sync::Arc<cudarc::driver::CudaContext>,
    stream: std::sync::Arc<cudarc::driver::CudaStream>,
    src: cudarc::driver::CudaSlice<u8>,
    dst: cudarc::driver::CudaSlice<u8>,
}

impl Canary {
    pub(crate) fn new(dev: &crate::device::Device) -> Result<Canary> {
        let stream = dev.ctx.new_stream().context("canary stream")?;
        let src = stream.alloc_zeros::<u8>(4096).context("canary buffer")?;
        let dst = stream.alloc_zeros::<u8>(4096).context("canary buffer")?;
        stream.synchronize().context("canary stream")?;
        Ok(Canary {
            ctx: dev.ctx.clone(),
            stream,
            src,
            dst,
        })
    }
}

impl vela_compute::DeviceProbe for Canary {
    fn canary(&mut self) -> Result<std::time::Duration> {
        let t = std::time::Instant::now();
        self.stream
            .memcpy_dtod(&self.src, &mut self.dst)
            .context("canary copy")?;
        self.stream.synchronize().context("canary wait")?;
        Ok(t.elapsed())
    }
    fn memory_used(&self) -> Result<u64> {
        let (free, total) = self.ctx.mem_get_info().context("querying GPU memory")?;
        Ok((total - free) as u64)
    }
}
