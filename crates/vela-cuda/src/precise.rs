//! Products with the activation rounding corrected (`Backend::precise_products`), as the CPU's
//! `cpu/matmul/refine.rs`: `y = W·x̂ + W·r̂`, where `x̂` is the row as the integer kernels see it
//! (Q8 / Q8_K blocks) and `r̂` the same quantization of the residual `r = x − x̂`. One pass leaves
//! each element off by up to half a step of `amax/127`; the residual's own pass has a step about
//! 254× finer, so the sum is off by about 1/254 of what one pass leaves (docs/testing.md,
//! "Accuracy of the quantized path").
//!
//! Models turn it on for the rows whose logits they return, in the last layer past its K/V. The
//! `W·x̂` pass is the ordinary product, bit for bit; the residual pass runs the same kernels
//! again on `r` into a scratch that is then added. While it is on, the fused quantizing kernels
//! (pre-norm, gated activation, attention output) give way to their unfused ops, so that every
//! product sees its float input. Products that go through cuBLAS (f16 activations, 16 rows and
//! more) have no int8 rounding to correct and are left as they are.

use std::sync::atomic::Ordering;

use crate::backend::CudaBackend;
use crate::device::Arg;
use crate::weight::{ActKind, CudaBuf, CudaWeight};
use cudarc::driver::CudaSlice;
use vela_compute::Backend;

impl CudaBackend {
    /// Precise products are on (and the mode is not exact, whose products are exact already).
    pub(crate) fn precise_on(&self) -> bool {
        self.precise.load(Ordering::Relaxed) && !self.tune.exact()
    }

    /// `ys[i] = x · ws[i]ᵀ` with the activation rounding corrected (module doc), when precise
    /// products are on, the integer kernels run these products and every weight takes the same
    /// quantized activations (as the CPU: one residual); returns false (nothing done) otherwise.
    pub(crate) fn matmul_precise(
        &self,
        ws: &[&CudaWeight],
        x: &CudaBuf,
        n: usize,
        ys: &mut [&mut CudaBuf],
    ) -> bool {
        let Some(w0) = ws.first() else { return false };
        let (kind, cols) = (w0.info().1, w0.cols);
        let same = ws.iter().all(|w| w.info().1 == kind && w.cols == cols);
        if !self.precise_on() || n == 0 || kind == ActKind::Float || !same || self.use_gemm(n, ws) {
            return false;
        }
        let mut bufs = self.precise_bufs.lock().unwrap_or_else(|e| e.into_inner());
        let mut lens = vec![n * cols];
        lens.extend(ws.iter().map(|w| n * w.rows));
        self.precise_grow(&mut bufs, &lens);
        let (r, tmp) = bufs.split_first_mut().expect("the residual's buffer");
        let pre = self.residual(kind, x, n, cols, r);
        self.matmul_plain(ws, x, n, ys, Some(pre));
        let mut ts: Vec<&mut CudaBuf> = tmp.iter_mut().take(ws.len()).collect();
        self.matmul_plain(ws, r, n, &mut ts, None);
        for ((w, y), t) in ws.iter().zip(ys.iter_mut()).zip(ts) {
            self.add(y, t, n * w.rows);
        }
        true
    }

    /// See `Backend::matmul_experts`, with the activation rounding corrected when precise
    /// products are on (the residual's expert products added); returns false (nothing done)
    /// otherwise.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn matmul_experts_precise(
        &self,
        w: &CudaWeight,
        rows_per_expert: usize,
        x: &CudaBuf,
        x_per_slot: bool,
        ids: &CudaSlice<u32>,
        n_tokens: usize,
        k: usize,
        y: &mut CudaBuf,
    ) -> bool {
        let kind = w.info().1;
        let n_slots = n_tokens * k;
        if !self.precise_on() || kind == ActKind::Float || n_slots == 0 {
            return false;
        }
        let x_rows = if x_per_slot { n_slots } else { n_tokens };
        let mut bufs = self.precise_bufs.lock().unwrap_or_else(|e| e.into_inner());
        self.precise_grow(&mut bufs, &[x_rows * w.cols, n_slots * rows_per_expert]);
        let [r, t] = bufs.get_disjoint_mut([0, 1]).expect("two buffers");
        self.residual(kind, x, x_rows, w.cols, r);
        let rpe = rows_per_expert;
        self.matmul_experts_impl(w, rpe, x, x_per_slot, ids, n_tokens, k, y);
        self.matmul_experts_impl(w, rpe, r, x_per_slot, ids, n_tokens, k, t);
        self.add(y, t, n_slots * rpe);
        true
    }

    /// `r = x − x̂` for `n` rows of `cols` (`x̂`: `x` quantized to `kind`, which is left in the
    /// activation scratch); returns that quantization as `matmul_plain`'s `pre`.
    fn residual(
        &self,
        kind: ActKind,
        x: &CudaBuf,
        n: usize,
        cols: usize,
        r: &mut CudaBuf,
    ) -> (ActKind, usize, u64, usize) {
        let mut sc = self.scratch();
        let (ap, nb) = self.quantize_act(&mut sc, kind, x, n, cols);
        drop(sc);
        let name = match kind {
            ActKind::Q8 => "residual_q8",
            _ => "residual_q8k",
        };
        let len = n * cols;
        let args = [
            Arg::P(self.ptr(x)),
            Arg::P(ap),
            Arg::P(self.ptr(&*r)),
            Arg::L(len as i64),
        ];
        self.launch_1d(name, len, &args);
        (kind, cols, ap, nb)
    }

    /// The first `lens.len()` scratch buffers, each at least its length (recorded steps that
    /// used a replaced one are dropped).
    fn precise_grow(&self, bufs: &mut Vec<CudaSlice<f32>>, lens: &[usize]) {
        for (i, &len) in lens.iter().enumerate() {
            if bufs.len() <= i || bufs[i].len() < len {
                let b = self
                    .dev
                    .stream
                    .alloc_zeros::<f32>(len.max(1).next_power_of_two())
                    .expect("CUDA alloc of the precise products' scratch");
                if bufs.len() <= i {
                    bufs.push(b);
                } else {
                    bufs[i] = b;
                }
                self.scratch_moved();
            }
        }
    }
}
