//! Fused elementwise chains (kernels/recurrent.cu, `fu_*`): one launch each for the op sequences
//! of the hyper-connections and the Gated DeltaNet gates, with those ops' values.

use crate::backend::CudaBackend;
use crate::device::Arg;
use crate::weight::CudaBuf;
use cudarc::driver::CudaSlice;

impl CudaBackend {
    pub(crate) fn silu_scaled_impl(&self, x: &mut CudaBuf, len: usize, s: f32) {
        assert!(x.len() >= len, "silu_scaled: buffer too small");
        let args = [Arg::P(self.ptr(x)), Arg::F(s), Arg::L(len as i64)];
        self.launch_1d("fu_silu_scaled", len, &args);
    }

    pub(crate) fn sigmoid_scaled_impl(&self, x: &mut CudaBuf, len: usize, pre: f32, post: f32) {
        assert!(x.len() >= len, "sigmoid_scaled: buffer too small");
        let args = [
            Arg::P(self.ptr(x)),
            Arg::F(pre),
            Arg::F(post),
            Arg::L(len as i64),
        ];
        self.launch_1d("fu_sigmoid_scaled", len, &args);
    }

    pub(crate) fn sigmoid_mul_impl(&self, x: &mut CudaBuf, g: &CudaBuf, len: usize) {
        assert!(
            x.len() >= len && g.len() >= len,
            "sigmoid_mul: buffer too small"
        );
        let args = [Arg::P(self.ptr(x)), Arg::P(self.ptr(g)), Arg::L(len as i64)];
        self.launch_1d("fu_sigmoid_mul", len, &args);
    }

    pub(crate) fn sigmoid_mix_streams_impl(
        &self,
        a: &CudaBuf,
        xn: &CudaBuf,
        n: usize,
        streams: usize,
        width: usize,
        out: &mut CudaBuf,
    ) {
        let total = n * width;
        assert!(
            streams >= 1
                && a.len() >= total * streams
                && xn.len() >= total * streams
                && out.len() >= total,
            "sigmoid_mix_streams: buffer too small"
        );
        let args = [
            Arg::P(self.ptr(a)),
            Arg::P(self.ptr(xn)),
            Arg::I(streams as i32),
            Arg::I(width as i32),
            Arg::L(total as i64),
            Arg::P(self.ptr(out)),
        ];
        self.launch_1d("fu_sigmoid_mix_streams", total, &args);
    }

    pub(crate) fn delta_gates_impl(
        &self,
        b: &mut CudaBuf,
        a: &mut CudaBuf,
        bias: &CudaSlice<f32>,
        scale: &CudaSlice<f32>,
        n_rows: usize,
        width: usize,
    ) {
        let total = n_rows * width;
        assert!(
            b.len() >= total && a.len() >= total && bias.len() >= width && scale.len() >= width,
            "delta_gates: buffer too small"
        );
        let args = [
            Arg::P(self.ptr(b)),
            Arg::P(self.ptr(a)),
            Arg::P(self.ptr(bias)),
            Arg::P(self.ptr(scale)),
            Arg::I(width as i32),
            Arg::L(total as i64),
        ];
        self.launch_1d("fu_delta_gates", total, &args);
    }
}
