//! A minimal run-time loader for cuBLAS, used for prefill products on tensor cores.
//!
//! Batched products (many tokens) are arithmetic-bound: the quantized weight is dequantized
//! to an f16 tile in a scratch buffer (`deqh_*` in quant.cu), the activations are converted to
//! f16, and `cublasGemmEx` multiplies them on the tensor cores with f32 accumulation and f32
//! output. One-token decode stays on vela's own integer matvec kernels.
//!
//! Like NVRTC, cuBLAS is opened with `dlopen` on first use, so building needs no CUDA toolkit:
//! `$VELA_CUBLAS_LIB` (a full path), then `libcublas.so`, `.so.13`, `.so.12` on the loader's
//! search path, next to the loaded NVRTC (the PyPI `nvidia-*` wheels put both in one folder),
//! and under `$CUDA_HOME/lib64` and `/usr/local/cuda/lib64`. When it cannot be loaded the
//! backend keeps using its own integer product kernels for prefill (and says so once).

use anyhow::{anyhow, bail, Context, Result};
use std::ffi::{c_int, c_void};
use std::path::PathBuf;

type Handle = *mut c_void;
type Status = c_int;

const OP_N: c_int = 0;
const OP_T: c_int = 1;
const R_32F: c_int = 0;
const R_16F: c_int = 2;
const COMPUTE_32F: c_int = 68;
const GEMM_DEFAULT: c_int = -1;

type GemmEx = unsafe extern "C" fn(
    Handle,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    *const c_void,
    *const c_void,
    c_int,
    c_int,
    *const c_void,
    c_int,
    c_int,
    *const c_void,
    *mut c_void,
    c_int,
    c_int,
    c_int,
    c_int,
) -> Status;

type GemmStridedBatchedEx = unsafe extern "C" fn(
    Handle,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    *const c_void,
    *const c_void,
    c_int,
    c_int,
    i64,
    *const c_void,
    c_int,
    c_int,
    i64,
    *const c_void,
    *mut c_void,
    c_int,
    c_int,
    i64,
    c_int,
    c_int,
    c_int,
) -> Status;

/// One operand of [`Cublas::gemm_batched_f16`] (column-major, cuBLAS's view): device address,
/// transposed or not, leading dimension and the element stride between batch entries.
#[derive(Clone, Copy, Debug)]
pub struct Operand {
    pub ptr: u64,
    pub trans: bool,
    pub ld: usize,
    pub stride: usize,
}

/// A loaded cuBLAS with one handle bound to the backend's stream.
pub struct Cublas {
    _lib: libloading::Library,
    /// Where the library was loaded from (for messages).
    pub path: String,
    handle: Handle,
    gemm_ex: GemmEx,
    gemm_batched: GemmStridedBatchedEx,
    destroy: unsafe extern "C" fn(Handle) -> Status,
}

// SAFETY: the handle is only used under the backend's scratch lock (one product at a time), and
// cuBLAS handles may be used from any thread of the context they were created in.
unsafe impl Send for Cublas {}
unsafe impl Sync for Cublas {}

/// Candidate library paths, in search order.
pub fn candidates() -> Vec<PathBuf> {
    let names = ["libcublas.so", "libcublas.so.13", "libcublas.so.12"];
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os("VELA_CUBLAS_LIB") {
        out.push(PathBuf::from(p));
    }
    out.extend(names.iter().map(PathBuf::from));
    let mut dirs = Vec::new();
    if let Ok(n) = crate::nvrtc::Nvrtc::get() {
        if let Some(d) = PathBuf::from(&n.path).parent() {
            if !d.as_os_str().is_empty() {
                dirs.push(d.to_path_buf());
            }
        }
    }
    dirs.extend(crate::nvrtc::toolkit_dirs());
    for d in dirs {
        out.extend(names.iter().map(|n| d.join(n)));
    }
    out
}

impl Cublas {
    /// Load cuBLAS and create a handle on `stream` (the calling thread must have the
    /// backend's context current).
    pub fn new(stream: *mut c_void) -> Result<Cublas> {
        let explicit = std::env::var_os("VELA_CUBLAS_LIB").is_some();
        let mut last = String::new();
        for (i, path) in candidates().into_iter().enumerate() {
            // SAFETY: loading cuBLAS runs its initialisers, which have no preconditions.
            match unsafe { libloading::Library::new(&path) } {
                Ok(lib) => return Cublas::resolve(lib, path.display().to_string(), stream),
                Err(e) if i == 0 && explicit => {
                    bail!("VELA_CUBLAS_LIB={} cannot be loaded: {e}", path.display())
                }
                Err(e) => last = e.to_string(),
            }
        }
        bail!("cuBLAS (libcublas.so) not found (last error: {last}); set VELA_CUBLAS_LIB")
    }

    fn resolve(lib: libloading::Library, path: String, stream: *mut c_void) -> Result<Cublas> {
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the signature matches the cuBLAS C API declaration of this symbol.
                unsafe {
                    *lib.get($name.as_bytes())
                        .with_context(|| format!("{path} lacks the symbol {}", $name))?
                }
            };
        }
        let create: unsafe extern "C" fn(*mut Handle) -> Status = sym!("cublasCreate_v2");
        let set_stream: unsafe extern "C" fn(Handle, *mut c_void) -> Status =
            sym!("cublasSetStream_v2");
        let destroy: unsafe extern "C" fn(Handle) -> Status = sym!("cublasDestroy_v2");
        let gemm_ex: GemmEx = sym!("cublasGemmEx");
        let gemm_batched: GemmStridedBatchedEx = sym!("cublasGemmStridedBatchedEx");
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        let r = unsafe { create(&mut handle) };
        if r != 0 || handle.is_null() {
            bail!("cublasCreate failed (status {r}) with {path}");
        }
        // SAFETY: live handle; `stream` is the backend's CUstream (= cudaStream_t).
        let r = unsafe { set_stream(handle, stream) };
        if r != 0 {
            // SAFETY: created above, destroyed once.
            unsafe { destroy(handle) };
            bail!("cublasSetStream failed (status {r})");
        }
        Ok(Cublas {
            _lib: lib,
            path,
            handle,
            gemm_ex,
            gemm_batched,
            destroy,
        })
    }

    /// `y[t][r] = Σ_c w[r][c] · x[t][c]` for `rows` weight rows, `n` tokens and `cols` columns:
    /// `w` is row-major f16 `[rows, cols]`, `x` row-major f16 `[n, cols]`, `y` row-major f32
    /// with row stride `ldy` (≥ rows). Device addresses; enqueued on the handle's stream.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_f16(
        &self,
        w: u64,
        x: u64,
        y: u64,
        rows: usize,
        n: usize,
        cols: usize,
        ldy: usize,
    ) -> Result<()> {
        let dim = |v: usize| c_int::try_from(v).map_err(|_| anyhow!("GEMM dimension {v} too big"));
        let (alpha, beta) = (1.0f32, 0.0f32);
        // Column-major view: Y (rows x n, ld ldy) = Wᵀ (W is cols x rows, ld cols) · X (cols x n).
        // SAFETY: the addresses are live device buffers of the sizes the caller checked.
        let r = unsafe {
            (self.gemm_ex)(
                self.handle,
                OP_T,
                OP_N,
                dim(rows)?,
                dim(n)?,
                dim(cols)?,
                &alpha as *const f32 as *const c_void,
                w as *const c_void,
                R_16F,
                dim(cols)?,
                x as *const c_void,
                R_16F,
                dim(cols)?,
                &beta as *const f32 as *const c_void,
                y as *mut c_void,
                R_32F,
                dim(ldy)?,
                COMPUTE_32F,
                GEMM_DEFAULT,
            )
        };
        if r != 0 {
            bail!("cublasGemmEx({rows}x{n}x{cols}) failed with status {r}");
        }
        Ok(())
    }
}

impl Cublas {
    /// `C_i = op(A_i) · op(B_i)` for `batch` entries, column-major (cuBLAS's convention): op(A)
    /// is m × k, op(B) k × n, C m × n with leading dimension `c.1` and batch stride `c.2`; A and
    /// B f16, C f32, f32 accumulation. Device addresses; enqueued on the handle's stream.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_batched_f16(
        &self,
        m: usize,
        n: usize,
        k: usize,
        a: Operand,
        b: Operand,
        c: (u64, usize, usize),
        batch: usize,
    ) -> Result<()> {
        let dim = |v: usize| c_int::try_from(v).map_err(|_| anyhow!("GEMM dimension {v} too big"));
        let op = |t: bool| if t { OP_T } else { OP_N };
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the addresses are live device buffers of the sizes the caller checked.
        let r = unsafe {
            (self.gemm_batched)(
                self.handle,
                op(a.trans),
                op(b.trans),
                dim(m)?,
                dim(n)?,
                dim(k)?,
                &alpha as *const f32 as *const c_void,
                a.ptr as *const c_void,
                R_16F,
                dim(a.ld)?,
                a.stride as i64,
                b.ptr as *const c_void,
                R_16F,
                dim(b.ld)?,
                b.stride as i64,
                &beta as *const f32 as *const c_void,
                c.0 as *mut c_void,
                R_32F,
                dim(c.1)?,
                c.2 as i64,
                dim(batch)?,
                COMPUTE_32F,
                GEMM_DEFAULT,
            )
        };
        if r != 0 {
            bail!("cublasGemmStridedBatchedEx({m}x{n}x{k}, {batch}) failed with status {r}");
        }
        Ok(())
    }
}

impl Drop for Cublas {
    fn drop(&mut self) {
        // SAFETY: created in `resolve`, destroyed once.
        unsafe { (self.destroy)(self.handle) };
    }
}
