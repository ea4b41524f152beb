//! The CUDA backend's run-time choices that are not made by shape or device: resolved once from
//! the environment when the backend starts, then read from here only.
//!
//! Environment (the only variables the CUDA backend reads besides the library paths
//! `VELA_NVRTC_LIB` and `VELA_CUBLAS_LIB`):
//! - `VELA_MATMUL=f32`: exact matmuls (f32 weights and activations, f64 sums; shared with the
//!   CPU backend), for comparisons against a reference;
//! - `VELA_CUDA_PROFILE=1`: per-kernel GPU times printed when the backend is dropped (decode
//!   graphs are then off, each launch must be timed);
//! - `VELA_CUDA_GRAPH=0`: decode steps launched kernel by kernel, not as CUDA graphs;
//! - `VELA_CUDA_DEBUG` (any value): synchronize after every launch that is not recorded into a
//!   decode graph (a fault names its kernel), say when a graph capture fails or cuBLAS is loaded,
//!   and print the graph statistics at the end.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

/// Smallest batch whose products go to cuBLAS (on the H200, a 4096x4096 Q4_0 product: integer
/// kernels 33.7 us at 8 tokens, 59 us at 16; cuBLAS with dequantization 42 us).
pub const DEFAULT_GEMM_MIN: usize = 16;

/// Fewest keys (of the longest query row) for the tensor-core decode attention; fewer take the
/// split-K parts. Llama-3-8B Q4_0 decode with it: 380 vs 386 tok/s at 1,024 keys, 380 vs 331 at
/// 2,048, 350 vs 265 at 8,192 (docs/perf-log.md).
pub const FLASH_DECODE_MIN_KEYS: usize = 1536;

/// The same threshold where the one-warp parts follow the keys (head dim 64): they stay faster
/// up to 4,096 keys (docs/perf-log.md).
pub const FLASH_DECODE_MIN_KEYS_WARP: usize = 4096;

/// The resolved choices. Tests change some of them through the backend's `set_*` methods.
#[derive(Clone, Debug, PartialEq)]
pub struct Tuning {
    /// Exact matmuls (`VELA_MATMUL=f32`).
    pub exact_matmul: bool,
    /// Per-kernel timing (`VELA_CUDA_PROFILE=1`).
    pub profile: bool,
    /// Decode steps recorded and replayed as CUDA graphs (off with `VELA_CUDA_GRAPH=0` or when
    /// profiling).
    pub graphs: bool,
    /// Synchronize after each unrecorded launch, diagnostics on stderr (`VELA_CUDA_DEBUG`).
    pub debug: bool,
    /// Smallest batch for the cuBLAS products (0: never).
    pub gemm_min: usize,
    /// See [`FLASH_DECODE_MIN_KEYS`] and [`FLASH_DECODE_MIN_KEYS_WARP`].
    pub flash_decode_min_keys: usize,
    pub flash_decode_min_keys_warp: usize,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            exact_matmul: false,
            profile: false,
            graphs: true,
            debug: false,
            gemm_min: DEFAULT_GEMM_MIN,
            flash_decode_min_keys: FLASH_DECODE_MIN_KEYS,
            flash_decode_min_keys_warp: FLASH_DECODE_MIN_KEYS_WARP,
        }
    }
}

impl Tuning {
    /// The defaults with the environment's switches applied (see the module docs).
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).unwrap_or_default();
        let profile = var("VELA_CUDA_PROFILE") == "1";
        Tuning {
            exact_matmul: var("VELA_MATMUL") == "f32",
            profile,
            graphs: var("VELA_CUDA_GRAPH") != "0" && !profile,
            debug: std::env::var_os("VELA_CUDA_DEBUG").is_some(),
            ..Tuning::default()
        }
    }
}

/// The backend's copy of a [`Tuning`]: atomics, read on every op, changed by the few `set_*`
/// methods tests use (profiling lives in the profiler).
pub(crate) struct Live {
    exact_matmul: AtomicBool,
    graphs: AtomicBool,
    gemm_min: AtomicUsize,
    fd_min_keys: AtomicUsize,
    fd_min_keys_warp: AtomicUsize,
    /// Rows per warp of the one-token matvec: 0 one, 1 by the launch's rows (two from 2,048),
    /// 2 two (tests force the kernels the shape would not pick).
    mv_rows: AtomicU32,
    pub(crate) debug: bool,
}

impl Live {
    pub(crate) fn new(t: &Tuning) -> Self {
        Live {
            exact_matmul: AtomicBool::new(t.exact_matmul),
            graphs: AtomicBool::new(t.graphs),
            gemm_min: AtomicUsize::new(t.gemm_min),
            fd_min_keys: AtomicUsize::new(t.flash_decode_min_keys),
            fd_min_keys_warp: AtomicUsize::new(t.flash_decode_min_keys_warp),
            mv_rows: AtomicU32::new(1),
            debug: t.debug,
        }
    }

    pub(crate) fn exact(&self) -> bool {
        self.exact_matmul.load(Ordering::Relaxed)
    }

    pub(crate) fn set_exact(&self, on: bool) {
        self.exact_matmul.store(on, Ordering::Relaxed);
    }

    pub(crate) fn graphs(&self) -> bool {
        self.graphs.load(Ordering::Relaxed)
    }

    pub(crate) fn set_graphs(&self, on: bool) {
        self.graphs.store(on, Ordering::Relaxed);
    }

    pub(crate) fn gemm_min(&self) -> usize {
        self.gemm_min.load(Ordering::Relaxed)
    }

    pub(crate) fn set_gemm_min(&self, n: usize) {
        self.gemm_min.store(n, Ordering::Relaxed);
    }

    /// (`flash_decode_min_keys`, `flash_decode_min_keys_warp`).
    pub(crate) fn fd_min_keys(&self) -> (usize, usize) {
        (
            self.fd_min_keys.load(Ordering::Relaxed),
            self.fd_min_keys_warp.load(Ordering::Relaxed),
        )
    }

    pub(crate) fn set_fd_min_keys(&self, n: usize) {
        self.fd_min_keys.store(n, Ordering::Relaxed);
        self.fd_min_keys_warp.store(n, Ordering::Relaxed);
    }

    pub(crate) fn mv_rows(&self) -> u32 {
        self.mv_rows.load(Ordering::Relaxed)
    }

    pub(crate) fn set_mv_rows(&self, mode: u32) {
        self.mv_rows.store(mode.min(2), Ordering::Relaxed);
    }
}
