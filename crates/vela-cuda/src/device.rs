//! One opened GPU: the driver checks, the CUDA context and stream, the kernels (compiled or loaded
//! from the cache, see [`crate::kernels`]) and the immediate launch of one kernel.

use crate::kernels::{self, KERNEL_NAMES};
use crate::nvrtc;
use anyhow::{anyhow, bail, Context, Result};
use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DriverError, LaunchConfig,
    PushKernelArg,
};
use std::collections::HashMap;
use std::sync::Arc;

/// A kernel argument (all are passed by value).
#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) enum Arg {
    P(u64),
    I(i32),
    L(i64),
    F(f32),
}

/// The context, its one stream and the loaded kernels. Every op is enqueued on `stream`.
pub(crate) struct Device {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    funcs: HashMap<&'static str, CudaFunction>,
    /// "cuda (GPU, sm_XY, driver CUDA a.b, NVRTC c.d)".
    pub(crate) name: String,
    /// Compute capability as major*10+minor.
    pub(crate) arch: u32,
    /// How many kernel groups were loaded from the on-disk cache (vs compiled now).
    pub(crate) modules_from_cache: usize,
    /// Streaming multiprocessors.
    pub(crate) sms: usize,
    /// Opt-in shared memory per block in bytes (0 if the query failed).
    pub(crate) smem_optin: usize,
    /// Programmatic dependent launch: sm_90 and newer.
    pdl: bool,
    /// Times the host waited for the device to read a result back ([`Device::wait`]).
    pub(crate) host_waits: std::sync::atomic::AtomicU64,
}

impl Device {
    /// Wait for the stream (a host synchronization: counted, see [`Device::host_waits`]).
    pub(crate) fn wait(&self) -> Result<()> {
        self.host_waits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.stream
            .synchronize()
            .map_err(|e| anyhow!("CUDA synchronize: {e:?}"))
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

impl Device {
    /// Open GPU `ordinal` and compile (or load cached) kernels for its architecture.
    ///
    /// Fails with a one-line message when no driver or GPU is present, the driver predates
    /// CUDA 12.0, the GPU predates compute capability 6.1, or NVRTC cannot be found.
    pub(crate) fn open(ordinal: usize) -> Result<Device> {
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
        let ctx = CudaContext::new(ordinal).map_err(|e| driver_error(e, ordinal))?;
        let (ma, mi) = ctx
            .compute_capability()
            .map_err(|e| driver_error(e, ordinal))?;
        let arch = (ma * 10 + mi) as u32;
        if arch < 61 {
            bail!("GPU compute capability {ma}.{mi} is below 6.1 (no dp4a): not supported");
        }
        let dev_name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| anyhow!("querying the SM count: {e:?}"))?
            .max(1) as usize;
        let a = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN;
        let smem_optin = ctx.attribute(a).map_or(0, |v| v.max(0) as usize);
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
                // Kernels above the default 48 KiB of dynamic shared memory (the tensor-core
                // decode attention, sm_80+) opt in where the device's limit holds them (an
                // opt-in limit of 0: the query failed, tried anyway); the host never launches
                // those it does not hold (`flash_decode_dims`).
                let smem = kernels::dyn_smem(n);
                let optin_ok = smem_optin == 0 || smem as usize <= smem_optin;
                if smem > 48 << 10 && arch >= 80 && optin_ok {
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
        let (nm, nn) = nvrtc.version()?;
        Ok(Device {
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
            sms,
            smem_optin,
            pdl: arch >= 90,
            host_waits: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Device address of a buffer.
    pub(crate) fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        let (p, _sync) = s.device_ptr(&self.stream);
        p
    }

    /// A loaded kernel.
    pub(crate) fn func(&self, name: &str) -> Result<&CudaFunction> {
        self.funcs
            .get(name)
            .ok_or_else(|| anyhow!("CUDA kernel {name} is not loaded"))
    }

    /// Launch a kernel now on the stream (with programmatic dependent launch on sm_90+).
    pub(crate) fn launch_now(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: u32,
        args: &[Arg],
    ) -> Result<()> {
        let f = self.func(name)?;
        if self.pdl {
            return self
                .launch_pdl(f, grid, block, kernels::dyn_smem(name), args)
                .map_err(|e| anyhow!("CUDA launch of {name} failed: {e:?}"));
        }
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
            shared_mem_bytes: kernels::dyn_smem(name),
        };
        // SAFETY: every kernel's parameter list matches `args` (see kernels/*.cu), and the
        // callers size the grids to the buffers they pass.
        unsafe { b.launch(cfg) }
            .map(|_| ())
            .map_err(|e| anyhow!("CUDA launch of {name} failed: {e:?}"))
    }

    /// Launch `f` with programmatic stream serialization (PDL): its blocks may start while the
    /// previous kernel of the stream runs; each kernel waits for it with `griddepcontrol.wait`
    /// before touching its data (`PDL_ENTRY` in kernels/common.cu). Stream capture turns the
    /// attribute into programmatic graph edges, so replayed decode steps overlap the same way.
    fn launch_pdl(
        &self,
        f: &CudaFunction,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &[Arg],
    ) -> std::result::Result<(), DriverError> {
        self.stream.context().bind_to_thread()?;
        // Every argument in its own 8-byte slot (little-endian: 4-byte values at the start).
        let mut slots: Vec<u64> = args
            .iter()
            .map(|a| match *a {
                Arg::P(x) => x,
                Arg::I(x) => x as u32 as u64,
                Arg::L(x) => x as u64,
                Arg::F(x) => x.to_bits() as u64,
            })
            .collect();
        let mut params: Vec<*mut std::ffi::c_void> = slots
            .iter_mut()
            .map(|s| s as *mut u64 as *mut std::ffi::c_void)
            .collect();
        // SAFETY: plain-old-data C structs; all-zero is a valid value of each.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let cfg = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: smem,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: `params` points at one live slot per kernel parameter, in order, each holding
        // the parameter's value (see `Arg`); the callers size the grids to the buffers passed.
        unsafe {
            sys::cuLaunchKernelEx(
                &cfg,
                f.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
    }
}
