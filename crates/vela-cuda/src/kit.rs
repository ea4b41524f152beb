//! The model kit's generic ops on the GPU (kernels/kit.cu): softmax, sigmoid, elementwise
//! product, row gather / scatter-add, expert routing. Ids stay on the device throughout.

use crate::backend::CudaBackend;
use crate::device::Arg;
use crate::weight::CudaBuf;
use cudarc::driver::CudaSlice;

/// Threads per block of the row-wise kit kernels.
const ROW_THREADS: u32 = 256;

impl CudaBackend {
    pub(crate) fn softmax_rows_impl(&self, x: &mut CudaBuf, n_rows: usize, width: usize) {
        if n_rows == 0 || width == 0 {
            return;
        }
        assert!(x.len() >= n_rows * width, "softmax_rows: buffer too small");
        let args = [Arg::P(self.ptr(x)), Arg::I(width as i32)];
        self.launch(
            "kit_softmax_rows",
            (n_rows as u32, 1, 1),
            ROW_THREADS,
            &args,
        );
    }

    pub(crate) fn sigmoid_impl(&self, x: &mut CudaBuf, len: usize) {
        assert!(x.len() >= len, "sigmoid: buffer too small");
        let args = [Arg::P(self.ptr(x)), Arg::L(len as i64)];
        self.launch_1d("kit_sigmoid", len, &args);
    }

    pub(crate) fn mul_impl(&self, x: &mut CudaBuf, y: &CudaBuf, len: usize) {
        assert!(x.len() >= len && y.len() >= len, "mul: buffer too small");
        let args = [Arg::P(self.ptr(x)), Arg::P(self.ptr(y)), Arg::L(len as i64)];
        self.launch_1d("kit_mul", len, &args);
    }

    pub(crate) fn gather_rows_impl(
        &self,
        src: &CudaBuf,
        idx: &CudaSlice<u32>,
        n: usize,
        width: usize,
        out: &mut CudaBuf,
    ) {
        if n == 0 || width == 0 {
            return;
        }
        assert!(
            idx.len() >= n && out.len() >= n * width,
            "gather_rows: buffers too small for {n}x{width}"
        );
        let args = [
            Arg::P(self.ptr(src)),
            Arg::P(self.ptr(idx)),
            Arg::P(self.ptr(out)),
            Arg::I(width as i32),
            Arg::L((src.len() / width) as i64),
        ];
        self.launch("kit_gather_rows", (n as u32, 1, 1), ROW_THREADS, &args);
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn scatter_add_rows_impl(
        &self,
        dst: &mut CudaBuf,
        src: &CudaBuf,
        idx: &CudaSlice<u32>,
        weights: Option<&CudaBuf>,
        n: usize,
        width: usize,
    ) {
        if n == 0 || width == 0 {
            return;
        }
        assert!(
            idx.len() >= n && src.len() >= n * width && weights.is_none_or(|w| w.len() >= n),
            "scatter_add_rows: buffers too small for {n}x{width}"
        );
        let args = [
            Arg::P(self.ptr(dst)),
            Arg::P(self.ptr(src)),
            Arg::P(self.ptr(idx)),
            Arg::P(weights.map_or(0, |w| self.ptr(w))),
            Arg::I(n as i32),
            Arg::I(width as i32),
            Arg::L((dst.len() / width) as i64),
        ];
        self.launch("kit_scatter_add_rows", (n as u32, 1, 1), ROW_THREADS, &args);
    }
}
