//! Quantized matrix multiplication `y = x · Wᵀ` on the CPU.
//!
//! Numerics follow ggml's CPU backend: every activation row is first converted to the weight
//! type's `vec_dot_type` (Q4_0/Q5_0/Q8_0 → Q8_0, Q4_1/Q5_1 → Q8_1, k-quants → Q8_K, F16 → f16,
//! BF16 → bf16, F32 → f32) with ggml's x86 rounding, then every block contributes an exact
//! integer dot product scaled in f32. Results therefore agree with llama.cpp up to the order of
//! the f32 block accumulation.
//!
//! Work split: activations are quantized once (in parallel over tokens for prefill), then the
//! weight rows are cut into chunks of whole tiles that threads claim dynamically
//! ([`ThreadPool::run_chunks`]: robust to a descheduled worker on a shared machine). Inside a range the kernel walks
//! cache-sized row blocks and, per block, tiles of `R` rows × `T` tokens (see `x86.rs`), so each
//! weight block is decoded once per `T` tokens: decode (≤ 4 tokens) streams the weights exactly
//! once, prefill reuses them from L1/L2.

// The kernels index several parallel arrays (register tiles, block fields) by the same loop
// counter; iterator rewrites would obscure the lane/row/token correspondence.
mod act;
#[allow(clippy::needless_range_loop)]
mod decode;
pub mod exact;
#[allow(clippy::needless_range_loop)]
mod packed;
#[cfg(target_arch = "x86_64")]
mod packed_avx2;
#[cfg(target_arch = "x86_64")]
mod packed_k;
mod refine;
#[allow(clippy::needless_range_loop)]
mod scalar;
#[cfg(test)]
#[allow(clippy::needless_range_loop)]
mod tests;
#[allow(clippy::needless_range_loop)]
#[cfg(target_arch = "x86_64")]
mod x86;
#[allow(clippy::needless_range_loop)]
#[cfg(target_arch = "x86_64")]
mod x86_512;

use std::cell::RefCell;
use std::sync::OnceLock;

use vela_formats::quant::GgmlType;

use super::pool::ThreadPool;
use act::ActKind;
pub use packed::PackedMatrix;

/// Rows `row0 .. row0 + rows` of a [`PackedMatrix`] (`rows` = the rows of the weight view it is
/// paired with): one expert's rows of the packed copy of all experts (`Backend::matmul_experts`).
/// Tiles ([`PackedRows::ROWS`] rows) that the range only partly covers are computed whole into
/// a buffer; the results are those of the whole matrix (each row is computed alone).
#[derive(Clone, Copy)]
pub struct PackedRows<'a> {
    pub m: &'a PackedMatrix,
    pub row0: usize,
}

impl<'a> PackedRows<'a> {
    /// Rows per tile of the packed layout.
    pub const ROWS: usize = packed::ROWS;

    /// The whole matrix.
    pub fn all(m: &'a PackedMatrix) -> PackedRows<'a> {
        PackedRows { m, row0: 0 }
    }

    /// The tiles overlapping `rows` rows from `row0`, if they lie in the matrix.
    fn tiles(&self, rows: usize) -> Option<std::ops::Range<usize>> {
        let end = self.row0 + rows;
        (end <= self.m.rows()).then(|| self.row0 / Self::ROWS..end.div_ceil(Self::ROWS))
    }
}

/// A weight matrix in GGUF layout: `rows` rows of `cols` elements (`cols` = GGUF `ne0`); row `r`
/// starts at byte `r * ty.row_bytes(cols)` of `data`.
#[derive(Clone, Copy, Debug)]
pub struct QMatrix<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
}

/// A kernel implementation family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// Portable Rust; the only path on non-x86 targets.
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F/BW/VL + VNNI (on top of AVX2/FMA/F16C).
    Avx512,
}

impl Kernel {
    /// The name used by `VELA_KERNEL` and [`kernel_name`].
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Scalar => "scalar",
            Kernel::Avx2 => "avx2",
            Kernel::Avx512 => "avx512",
        }
    }

    /// Whether this CPU can run the kernel family.
    pub fn available(self) -> bool {
        match self {
            Kernel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => {
                Kernel::Avx2.available()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Every family this CPU can run, best last.
    pub fn all_available() -> Vec<Kernel> {
        [Kernel::Scalar, Kernel::Avx2, Kernel::Avx512]
            .into_iter()
            .filter(|k| k.available())
            .collect()
    }

    /// The kernel [`matmul`] uses: `VELA_KERNEL=scalar|avx2|avx512` if set and available
    /// (an unavailable or unknown request falls back to the best available, with a warning),
    /// else the best available. Decided once per process.
    pub fn selected() -> Kernel {
        static SELECTED: OnceLock<Kernel> = OnceLock::new();
        *SELECTED.get_or_init(|| {
            let best = *Kernel::all_available().last().expect("scalar is always available");
            match std::env::var("VELA_KERNEL") {
                Ok(v) if !v.is_empty() => {
                    let k = Kernel::all_available().into_iter().find(|k| k.name() == v);
                    k.unwrap_or_else(|| {
                        eprintln!(
                            "warning: VELA_KERNEL={v} is unknown or unsupported on this CPU; using {}",
                            best.name()
                        );
                        best
                    })
                }
                _ => best,
            }
        })
    }
}

/// Name of the kernel family [`matmul`] uses (see [`Kernel::selected`]).
pub fn kernel_name() -> &'static str {
    Kernel::selected().name()
}

/// Whether [`matmul`] handles weights of type `ty`. Callers must check this first: `matmul`
/// panics on other types.
pub fn supported(ty: GgmlType) -> bool {
    act_kind(ty).is_some()
}

fn act_kind(ty: GgmlType) -> Option<ActKind> {
    use GgmlType::*;
    Some(match ty {
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 => ActKind::Q8,
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K => ActKind::Q8K,
        F32 => ActKind::F32,
        F16 => ActKind::F16,
        BF16 => ActKind::Bf16,
        _ => return None,
    })
}

/// A tile kernel computing `y[t * ys + r] = dot(weight row r, activation row t)` for an `R × T`
/// tile; `w` points at weight row 0 (rows `ws` bytes apart), `x` at activation row 0 (rows `xs`
/// bytes apart, in the [`ActKind`] layout), `nb` = weight blocks per row (elements for float
/// types). Callers guarantee all pointed-to extents.
pub(crate) type TileFn = unsafe fn(*const u8, usize, *const u8, usize, usize, *mut f32, usize);

/// The tile kernels of one (kernel family, weight type): `fns[0][t-1]` handles 1 row × `t`
/// tokens, `fns[1][t-1]` handles `r_max` rows × `t` tokens (`t ≤ t_max`).
struct Tiles {
    r_max: usize,
    t_max: usize,
    fns: [[TileFn; 4]; 2],
}

macro_rules! table {
    ($m:ident :: $f:ident, $B:ty, $rm:literal) => {
        Tiles {
            r_max: $rm,
            t_max: 4,
            fns: [
                [
                    $m::$f::<$B, 1, 1>,
                    $m::$f::<$B, 1, 2>,
                    $m::$f::<$B, 1, 3>,
                    $m::$f::<$B, 1, 4>,
                ],
                [
                    $m::$f::<$B, $rm, 1>,
                    $m::$f::<$B, $rm, 2>,
                    $m::$f::<$B, $rm, 3>,
                    $m::$f::<$B, $rm, 4>,
                ],
            ],
        }
    };
}

macro_rules! per_type {
    ($ty:expr, $m:ident, $q32:ident, $qk:ident, $f:ident, $rm:literal) => {{
        use decode::*;
        use scalar::{WBf16, WF16, WF32};
        use GgmlType as G;
        match $ty {
            G::Q4_0 => table!($m::$q32, Q4_0, $rm),
            G::Q4_1 => table!($m::$q32, Q4_1, $rm),
            G::Q5_0 => table!($m::$q32, Q5_0, $rm),
            G::Q5_1 => table!($m::$q32, Q5_1, $rm),
            G::Q8_0 => table!($m::$q32, Q8_0, $rm),
            G::Q2_K => table!($m::$qk, Q2K, $rm),
            G::Q3_K => table!($m::$qk, Q3K, $rm),
            G::Q4_K => table!($m::$qk, Q4K, $rm),
            G::Q5_K => table!($m::$qk, Q5K, $rm),
            G::Q6_K => table!($m::$qk, Q6K, $rm),
            G::F32 => table!($m::$f, WF32, $rm),
            G::F16 => table!($m::$f, WF16, $rm),
            G::BF16 => table!($m::$f, WBf16, $rm),
            _ => unreachable!("checked by supported()"),
        }
    }};
}

fn scalar_tiles(ty: GgmlType) -> Tiles {
    use decode::*;
    use scalar::{WBf16, WF16, WF32};
    use GgmlType as G;
    let f: TileFn = match ty {
        G::Q4_0 => scalar::q32::<Q4_0>,
        G::Q4_1 => scalar::q32::<Q4_1>,
        G::Q5_0 => scalar::q32::<Q5_0>,
        G::Q5_1 => scalar::q32::<Q5_1>,
        G::Q8_0 => scalar::q32::<Q8_0>,
        G::Q2_K => scalar::qk::<Q2K>,
        G::Q3_K => scalar::qk::<Q3K>,
        G::Q4_K => scalar::qk::<Q4K>,
        G::Q5_K => scalar::qk::<Q5K>,
        G::Q6_K => scalar::qk::<Q6K>,
        G::F32 => scalar::float::<WF32>,
        G::F16 => scalar::float::<WF16>,
        G::BF16 => scalar::float::<WBf16>,
        _ => unreachable!("checked by supported()"),
    };
    Tiles {
        r_max: 1,
        t_max: 1,
        fns: [[f; 4]; 2],
    }
}

fn tiles(kernel: Kernel, ty: GgmlType) -> Tiles {
    match kernel {
        Kernel::Scalar => scalar_tiles(ty),
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => per_type!(ty, x86, avx2_q32, avx2_qk, avx2_f, 2),
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => per_type!(ty, x86, avx512_q32, avx512_qk, avx512_f, 4),
        #[cfg(not(target_arch = "x86_64"))]
        _ => scalar_tiles(ty),
    }
}

/// Scratch for quantized activations, reused across calls on the calling thread.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Line([u8; 64]);

thread_local! {
    static SCRATCH: RefCell<Vec<Line>> = const { RefCell::new(Vec::new()) };
}

/// A raw pointer that may cross to pool threads (each thread touches disjoint elements).
#[derive(Clone, Copy)]
struct SendPtr<T>(*mut T);
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}
impl<T> SendPtr<T> {
    /// A method (not field access) so closures capture the whole `Send` wrapper.
    fn get(self) -> *mut T {
        self.0
    }
}

/// `y[t*rows + r] = Σ_c W[r][c] · x[t*cols + c]` for `t < n_tokens`, using [`Kernel::selected`].
///
/// Panics (with a one-line message) if `w.ty` is not [`supported`], `cols` is not a multiple of
/// the block size, or a slice is too short. Must not be called from inside `pool.run`.
pub fn matmul(pool: &ThreadPool, w: &QMatrix, x: &[f32], n_tokens: usize, y: &mut [f32]) {
    if exact::enabled() {
        return exact::matmul_multi(pool, &[w], x, n_tokens, &mut [y]);
    }
    matmul_with(Kernel::selected(), pool, w, x, n_tokens, y)
}

/// [`matmul`] with an explicit kernel family (tests and benchmarks); `kernel` must be
/// [`Kernel::available`].
pub fn matmul_with(
    kernel: Kernel,
    pool: &ThreadPool,
    w: &QMatrix,
    x: &[f32],
    n_tokens: usize,
    y: &mut [f32],
) {
    matmul_multi_with(kernel, pool, &[w], x, n_tokens, &mut [y])
}

/// Several matmuls sharing the activations `x` (`n_tokens` rows of `ws[i].cols` elements, the
/// same `cols` for every matrix): `ys[i] = x · ws[i]ᵀ` in the layout of [`matmul`].
///
/// Equivalent to calling [`matmul`] once per matrix (bit-identical results), but the activations
/// are quantized once per distinct activation format and all matrices are computed in a single
/// pool dispatch whose row split spans all of them — for Q/K/V and gate/up projections, where
/// per-call overhead dominates small decode matvecs. Panics like [`matmul`], and if the slices
/// differ in length or the matrices in `cols`.
pub fn matmul_multi(
    pool: &ThreadPool,
    ws: &[&QMatrix],
    x: &[f32],
    n_tokens: usize,
    ys: &mut [&mut [f32]],
) {
    if exact::enabled() {
        return exact::matmul_multi(pool, ws, x, n_tokens, ys);
    }
    matmul_multi_with(Kernel::selected(), pool, ws, x, n_tokens, ys)
}

/// Fewest tokens for which a [`PackedMatrix`] copy of a 32-element block type is used instead
/// of the GGUF layout (k-quants: [`PackedMatrix::min_tokens`]).
pub const PACKED_MIN_TOKENS: usize = 1;

/// Whether weights of type `ty` should be repacked with [`PackedMatrix::new`] for `kernel`:
/// the AVX-512 family has a packed GEMM for the 32-element block types and the k-quants, the
/// AVX2 family for the 32-element block types (`packed_avx2.rs`).
pub fn packs(kernel: Kernel, ty: GgmlType) -> bool {
    use GgmlType as G;
    let q32 = matches!(ty, G::Q4_0 | G::Q4_1 | G::Q5_0 | G::Q5_1 | G::Q8_0);
    cfg!(target_arch = "x86_64")
        && (kernel == Kernel::Avx2 && q32 || kernel == Kernel::Avx512)
        && matches!(
            ty,
            G::Q4_0
                | G::Q4_1
                | G::Q5_0
                | G::Q5_1
                | G::Q8_0
                | G::Q2_K
                | G::Q3_K
                | G::Q4_K
                | G::Q5_K
                | G::Q6_K
        )
}

/// [`matmul_multi`] where `packed[i]`, if present, is the [`PackedMatrix`] copy of `ws[i]`, used
/// for batches of at least [`PackedMatrix::min_tokens`] tokens (results are bit-identical to the
/// scalar kernel's). Follows the exact mode ([`exact::enabled`]) like [`matmul_multi`].
/// `packed` may be shorter than `ws` (missing entries: none). With `refine`, each row's
/// activation rounding residual is multiplied too (`refine.rs`; where it applies).
pub fn matmul_multi_packed(
    pool: &ThreadPool,
    ws: &[&QMatrix],
    packed: &[Option<&PackedMatrix>],
    x: &[f32],
    n_tokens: usize,
    ys: &mut [&mut [f32]],
    refine: bool,
) {
    let packed: Vec<Option<PackedRows>> = packed.iter().map(|p| p.map(PackedRows::all)).collect();
    matmul_rows_packed(pool, ws, &packed, x, n_tokens, ys, refine)
}

/// [`matmul_multi_packed`] where each packed copy may cover more rows than its weight, which is
/// then a row range of the packed matrix ([`PackedRows`]; an expert of a 3-D expert tensor).
pub fn matmul_rows_packed(
    pool: &ThreadPool,
    ws: &[&QMatrix],
    packed: &[Option<PackedRows>],
    x: &[f32],
    n_tokens: usize,
    ys: &mut [&mut [f32]],
    refine: bool,
) {
    if exact::enabled() {
        return exact::matmul_multi(pool, ws, x, n_tokens, ys);
    }
    let kernel = Kernel::selected();
    match refine.then(|| refine::kind(ws)).flatten() {
        Some(kind) => refine::matmul(kind, kernel, pool, ws, packed, x, n_tokens, ys),
        None => matmul_dispatch(kernel, pool, ws, packed, x, n_tokens, ys),
    }
}

/// [`matmul_multi_packed`] with an explicit kernel family (tests and benchmarks); the packed
/// copies are used where [`packs`] says so for that family.
pub fn matmul_multi_packed_with(
    kernel: Kernel,
    pool: &ThreadPool,
    ws: &[&QMatrix],
    packed: &[Option<&PackedMatrix>],
    x: &[f32],
    n_tokens: usize,
    ys: &mut [&mut [f32]],
) {
    let packed: Vec<Option<PackedRows>> = packed.iter().map(|p| p.map(PackedRows::all)).collect();
    matmul_dispatch(kernel, pool, ws, &packed, x, n_tokens, ys)
}

/// One validated matrix of a dispatch.
struct Job<'a> {
    /// The packed copy and its kernels, when used.
    #[cfg(target_arch = "x86_64")]
    packed: Option<(PackedRows<'a>, packed::Kernels)>,
    #[cfg(not(target_arch = "x86_64"))]
    packed: Option<PackedRows<'a>>,
    tiles: Tiles,
    w: SendPtr<u8>,
    wrow: usize,
    rows: usize,
    nb: usize,
    /// Index into the quantized-activation formats of the dispatch.
    act: usize,
    y: SendPtr<f32>,
}

/// [`matmul_multi`] with an explicit kernel family; `kernel` must be [`Kernel::available`].
pub fn matmul_multi_with(
    kernel: Kernel,
    pool: &ThreadPool,
    ws: &[&QMatrix],
    x: &[f32],
    n_tokens: usize,
    ys: &mut [&mut [f32]],
) {
    matmul_dispatch(kernel, pool, ws, &[], x, n_tokens, ys)
}

fn matmul_dispatch(
    kernel: Kernel,
    pool: &ThreadPool,
    ws: &[&QMatrix],
    packed: &[Option<PackedRows>],
    x: &[f32],
    n_tokens: usize,
    ys: &mut [&mut [f32]],
) {
    assert!(
        kernel.available(),
        "matmul: kernel {} is not available on this CPU",
        kernel.name()
    );
    assert_eq!(
        ws.len(),
        ys.len(),
        "matmul_multi: {} matrices but {} outputs",
        ws.len(),
        ys.len()
    );
    let Some(first) = ws.first() else { return };
    let cols = first.cols;
    assert!(
        x.len() >= n_tokens * cols,
        "matmul: x shorter than {n_tokens}x{cols}"
    );
    // Distinct activation formats of this dispatch (at most a few).
    let mut kinds: Vec<ActKind> = Vec::with_capacity(2);
    let mut jobs: Vec<Job> = Vec::with_capacity(ws.len());
    for (i, (w, y)) in ws.iter().zip(ys.iter_mut()).enumerate() {
        let (rows, ty) = (w.rows, w.ty);
        assert_eq!(w.cols, cols, "matmul_multi: matrices differ in cols");
        let kind = act_kind(ty)
            .unwrap_or_else(|| panic!("matmul: weight type {} is not supported", ty.name()));
        let bs = ty.block_size();
        assert!(
            cols % bs == 0,
            "matmul: cols {cols} is not a multiple of {}'s block {bs}",
            ty.name()
        );
        let wrow = ty
            .row_bytes(cols as u64)
            .expect("cols is a multiple of the block size") as usize;
        assert!(
            w.data.len() >= rows * wrow,
            "matmul: weight data shorter than {rows}x{cols}"
        );
        assert!(
            y.len() >= n_tokens * rows,
            "matmul: y shorter than {n_tokens}x{rows}"
        );
        let act = kinds.iter().position(|&k| k == kind).unwrap_or_else(|| {
            kinds.push(kind);
            kinds.len() - 1
        });
        let p = packed.get(i).copied().flatten().filter(|p| {
            packs(kernel, ty) && n_tokens >= p.m.min_tokens() && p.tiles(rows).is_some()
        });
        if let Some(p) = p {
            assert!(
                p.m.ty() == ty && p.m.cols() == cols,
                "matmul: packed copy does not match its weight"
            );
        }
        jobs.push(Job {
            #[cfg(target_arch = "x86_64")]
            packed: p.map(|p| (p, packed::kernels(kernel, ty))),
            #[cfg(not(target_arch = "x86_64"))]
            packed: p,
            tiles: tiles(kernel, ty),
            w: SendPtr(w.data.as_ptr() as *mut u8),
            wrow,
            rows,
            nb: cols / bs,
            act,
            y: SendPtr(y.as_mut_ptr()),
        });
    }
    if n_tokens == 0 || jobs.iter().all(|j| j.rows == 0) {
        return;
    }
    SCRATCH.with(|cell| {
        let mut scratch = cell.borrow_mut();
        // Byte offset of each format's rows in `scratch` (64-byte aligned).
        let mut offs = Vec::with_capacity(kinds.len());
        let mut lines = 0;
        for k in &kinds {
            offs.push(lines * 64);
            if *k != ActKind::F32 {
                lines += (n_tokens * k.row_bytes(cols)).div_ceil(64);
            }
        }
        if scratch.len() < lines {
            scratch.resize(lines, Line([0; 64]));
        }
        let base = SendPtr(scratch.as_mut_ptr() as *mut u8);
        let quantize = |t0: usize, t1: usize| {
            for (k, &off) in kinds.iter().zip(&offs) {
                if *k == ActKind::F32 {
                    continue;
                }
                let xrow = k.row_bytes(cols);
                for t in t0..t1 {
                    // SAFETY: token rows are disjoint `xrow`-byte ranges inside this format's
                    // region of `scratch` (sized above); the region starts 64-byte aligned and
                    // `xrow` is a multiple of the block layout's alignment, so every row start
                    // is aligned for its block type.
                    let out = unsafe {
                        std::slice::from_raw_parts_mut(base.get().add(off + t * xrow), xrow)
                    };
                    quantize_row(kernel, *k, &x[t * cols..(t + 1) * cols], out);
                }
            }
        };
        if kinds.iter().any(|&k| k != ActKind::F32) {
            if n_tokens >= 4 && pool.n_threads() > 1 {
                let nc = n_tokens.min(4 * pool.n_threads());
                pool.run_chunks(nc, |c| quantize(n_tokens * c / nc, n_tokens * (c + 1) / nc));
            } else {
                quantize(0, n_tokens);
            }
        }
        let xq: Vec<SendPtr<u8>> = kinds
            .iter()
            .zip(&offs)
            .map(|(k, &off)| {
                if *k == ActKind::F32 {
                    SendPtr(x.as_ptr() as *mut u8)
                } else {
                    // SAFETY: `off` lies inside `scratch` (or at its end for an empty region).
                    SendPtr(unsafe { base.get().add(off) })
                }
            })
            .collect();
        let n_tiles: Vec<usize> = jobs
            .iter()
            .map(|j| match &j.packed {
                Some(p) => p.0.tiles(j.rows).map_or(0, |r| r.len()),
                None => j.rows.div_ceil(j.tiles.r_max),
            })
            .collect();
        let total: usize = n_tiles.iter().sum();
        let jobs = &jobs;
        let xq = &xq;
        let n_tiles = &n_tiles;
        // Chunks of the concatenated tile sequence of all matrices, claimed dynamically (see
        // `ThreadPool::run_chunks`); every tile is computed the same way whoever claims it.
        // Prefill through packed weights: fewer, larger chunks, since every chunk re-reads all
        // activations once per tile block (see `packed::run_tiles`).
        let per_thread = if n_tokens > 8 && jobs.iter().any(|j| j.packed.is_some()) {
            3
        } else {
            8
        };
        let n_chunks = total.min(per_thread * pool.n_threads());
        pool.run_chunks(n_chunks, |c| {
            let (t0, t1) = (total * c / n_chunks, total * (c + 1) / n_chunks);
            let mut start = 0;
            for (j, &nt) in jobs.iter().zip(n_tiles.iter()) {
                let (a, b) = (t0.max(start), t1.min(start + nt));
                #[cfg(target_arch = "x86_64")]
                if let (true, Some((p, fns))) = (a < b, &j.packed) {
                    let kind = kinds[j.act];
                    // The range's first tile in the packed matrix.
                    let tile0 = p.row0 / PackedRows::ROWS;
                    // SAFETY: `packed` is only chosen where `packs(kernel, ty)` (the family's
                    // features checked by `kernel.available()`); shapes validated above (the tiles lie in the
                    // matrix); disjoint output rows.
                    unsafe {
                        packed::run_tiles(
                            p.m,
                            fns,
                            a - start + tile0,
                            b - start + tile0,
                            xq[j.act].get(),
                            kind.row_bytes(cols),
                            n_tokens,
                            j.y.get(),
                            p.row0,
                            j.rows,
                        )
                    };
                    start += nt;
                    continue;
                }
                if a < b {
                    let rm = j.tiles.r_max;
                    let r0 = ((a - start) * rm).min(j.rows);
                    let r1 = ((b - start) * rm).min(j.rows);
                    let kind = kinds[j.act];
                    // SAFETY: shapes validated above; threads write disjoint rows of each y.
                    unsafe {
                        run_rows(
                            &j.tiles,
                            j.w.get(),
                            j.wrow,
                            r0,
                            r1,
                            xq[j.act].get(),
                            kind.row_bytes(cols),
                            n_tokens,
                            j.nb,
                            j.y.get(),
                            j.rows,
                        )
                    };
                }
                start += nt;
            }
        });
    });
}

/// Quantize one activation row with the fastest code for `kernel` (identical results).
fn quantize_row(kernel: Kernel, kind: ActKind, x: &[f32], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if kernel == Kernel::Avx512 && kind == ActKind::Q8K {
        assert_eq!(out.len(), kind.row_bytes(x.len()));
        assert_eq!(
            out.as_ptr() as usize % std::mem::align_of::<act::ActQ8K>(),
            0
        );
        // SAFETY: `kernel` is available, so AVX-512 F/BW are; `out` is aligned and exactly
        // `x.len() / 256` blocks long; every bit pattern is a valid `ActQ8K`.
        unsafe {
            let o =
                std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut act::ActQ8K, x.len() / 256);
            x86_512::quantize_q8k(x, o);
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if kernel != Kernel::Scalar {
        // SAFETY: `kernel` is available, so AVX2/FMA/F16C are.
        unsafe { x86::quantize_row(kind, x, out) };
        return;
    }
    let _ = kernel;
    act::quantize_row(kind, x, out)
}

/// Compute rows `r0..r1` of all tokens, in cache-sized row blocks × token groups × row tiles.
///
/// # Safety
/// `w` covers `r1` rows of `wrow` bytes, `xq` `n_tokens` rows of `xrow` bytes, `y`
/// `n_tokens * rows` floats.
#[allow(clippy::too_many_arguments)]
unsafe fn run_rows(
    tiles: &Tiles,
    w: *const u8,
    wrow: usize,
    r0: usize,
    r1: usize,
    xq: *const u8,
    xrow: usize,
    n_tokens: usize,
    nb: usize,
    y: *mut f32,
    rows: usize,
) {
    let rm = tiles.r_max;
    // Keep a row block of weights (~96 KiB) hot in L2 while all token groups pass over it.
    let rb = ((96 * 1024 / wrow.max(1)) / rm * rm).max(rm);
    let mut b0 = r0;
    while b0 < r1 {
        let b1 = (b0 + rb).min(r1);
        let mut t0 = 0;
        while t0 < n_tokens {
            let tn = tiles.t_max.min(n_tokens - t0);
            let x = xq.add(t0 * xrow);
            let mut r = b0;
            while r + rm <= b1 {
                let out = y.add(t0 * rows + r);
                (tiles.fns[1][tn - 1])(w.add(r * wrow), wrow, x, xrow, nb, out, rows);
                r += rm;
            }
            while r < b1 {
                let out = y.add(t0 * rows + r);
                (tiles.fns[0][tn - 1])(w.add(r * wrow), wrow, x, xrow, nb, out, rows);
                r += 1;
            }
            t0 += tn;
        }
        b0 = b1;
    }
}
