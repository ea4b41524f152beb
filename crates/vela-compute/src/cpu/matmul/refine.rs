//! A product with the activation rounding corrected: `y = W·x̂ + W·r̂`, where `x̂` is the row as
//! the quantized kernels see it (Q8/Q8_K blocks, ggml's rounding) and `r̂` the same quantization
//! of the residual `r = x − x̂`.
//!
//! Used for the rows whose logits a model returns, in the last layer past its K/V
//! (`Backend::precise_products`): rounding there reaches the logits without the damping the
//! earlier layers' rounding gets from the layers after it. (The output head keeps one pass: its
//! two-row product cost ~40 % of decode speed on the real models, docs/perf-log.md.)
//!
//! One Q8 pass leaves each element off by up to half a step of `amax/127`; the residual is at most
//! that half step, so its own pass has a step about 254× finer, and the sum is off by about 1/254
//! of what one pass leaves. Both rows go through the ordinary kernels as a batch of two rows per
//! token, so the weights are streamed once and each row is computed by the same operations
//! whatever the batch (batch invariance holds). See docs/testing.md, "Accuracy of the quantized
//! path".

use std::cell::RefCell;

use super::act::{self, ActKind, ActQ8, ActQ8K};
use super::{act_kind, matmul_dispatch, Kernel, PackedRows, QMatrix};
use crate::cpu::pool::ThreadPool;

thread_local! {
    /// `[x rows; residual rows]`, their products, and one quantized row.
    static SCRATCH: RefCell<(Vec<f32>, Vec<f32>, Vec<u8>)> =
        const { RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// `x − x̂` for one row, `x̂` = the row after quantization to `kind` and back (the values the
/// integer kernels multiply: `d·q`, `d` as stored in the block).
fn residual(kind: ActKind, x: &[f32], qbuf: &mut Vec<u8>, r: &mut [f32]) {
    let bytes = kind.row_bytes(x.len());
    // ActQ8K needs 32-byte alignment: over-allocate and align by hand.
    qbuf.resize(bytes + 64, 0);
    let off = qbuf.as_ptr().align_offset(64);
    let q = &mut qbuf[off..off + bytes];
    act::quantize_row(kind, x, q);
    match kind {
        // SAFETY (both arms): aligned (64) and exactly `x.len() / BS` blocks, written just above.
        ActKind::Q8 => unsafe { subtract::<ActQ8, 32>(q, x, r) },
        ActKind::Q8K => unsafe { subtract::<ActQ8K, 256>(q, x, r) },
        // Float activations are not rounded beyond their own type: nothing to correct.
        ActKind::F32 | ActKind::F16 | ActKind::Bf16 => r.fill(0.0),
    }
}

/// An activation block's scale and quants.
trait Block {
    fn parts(&self) -> (f32, &[i8]);
}
impl Block for ActQ8 {
    fn parts(&self) -> (f32, &[i8]) {
        (self.d, &self.qs)
    }
}
impl Block for ActQ8K {
    fn parts(&self) -> (f32, &[i8]) {
        (self.d, &self.qs)
    }
}

/// `r = x − d·q` block by block, the blocks (`BS` elements each) read from `q`.
///
/// # Safety
/// `q` is aligned for `B` and holds `x.len() / BS` valid blocks.
unsafe fn subtract<B: Block, const BS: usize>(q: &[u8], x: &[f32], r: &mut [f32]) {
    let blocks = std::slice::from_raw_parts(q.as_ptr() as *const B, x.len() / BS);
    for ((b, xb), rb) in blocks
        .iter()
        .zip(x.chunks_exact(BS))
        .zip(r.chunks_exact_mut(BS))
    {
        let (d, qs) = b.parts();
        for ((o, &v), &qi) in rb.iter_mut().zip(xb).zip(qs) {
            *o = v - d * qi as f32;
        }
    }
}

/// The activation format to refine for `ws`: `Some` when every matrix has the same quantized one
/// (float weights have nothing to correct; mixed formats would need a residual each).
pub(super) fn kind(ws: &[&QMatrix]) -> Option<ActKind> {
    let kind = ws.first().and_then(|w| act_kind(w.ty));
    let same = ws.iter().all(|w| act_kind(w.ty) == kind);
    kind.filter(|k| same && matches!(k, ActKind::Q8 | ActKind::Q8K))
}

/// `ys[i][t*rows_i + r] = Σ_c W_i[r][c] · x[t*cols + c]`: the quantized product of each row plus
/// that of its quantization residual (module doc), for matrices sharing `x` and the activation
/// format `kind` (one residual, one dispatch).
#[allow(clippy::too_many_arguments)]
pub(super) fn matmul(
    kind: ActKind,
    kernel: Kernel,
    pool: &ThreadPool,
    ws: &[&QMatrix],
    packed: &[Option<PackedRows>],
    x: &[f32],
    n_tokens: usize,
    ys: &mut [&mut [f32]],
) {
    let cols = ws[0].cols;
    assert!(x.len() >= n_tokens * cols);
    SCRATCH.with(|cell| {
        let mut guard = cell.borrow_mut();
        let (xx, yy, qbuf) = &mut *guard;
        xx.resize(2 * n_tokens * cols, 0.0);
        let total: usize = ws.iter().map(|w| 2 * n_tokens * w.rows).sum();
        yy.resize(total, 0.0);
        let (xs, rs) = xx.split_at_mut(n_tokens * cols);
        xs.copy_from_slice(&x[..n_tokens * cols]);
        for (xr, rr) in xs.chunks_exact(cols).zip(rs.chunks_exact_mut(cols)) {
            residual(kind, xr, qbuf, rr);
        }
        let mut outs: Vec<&mut [f32]> = Vec::with_capacity(ws.len());
        let mut rest = &mut yy[..];
        for w in ws {
            let (a, b) = rest.split_at_mut(2 * n_tokens * w.rows);
            outs.push(a);
            rest = b;
        }
        matmul_dispatch(kernel, pool, ws, packed, xx, 2 * n_tokens, &mut outs);
        for ((w, o), y) in ws.iter().zip(&outs).zip(ys.iter_mut()) {
            let m = n_tokens * w.rows;
            assert!(y.len() >= m);
            let (y0, y1) = o.split_at(m);
            for ((d, a), b) in y[..m].iter_mut().zip(y0).zip(y1) {
                *d = a + b;
            }
        }
    });
}
