//! Recurrent-layer ops on the GPU (kernels/recurrent.cu): causal depthwise convolution with a
//! carried state, row L2 normalisation, the gated delta rule.

use crate::backend::CudaBackend;
use crate::device::Arg;
use crate::weight::CudaBuf;
use cudarc::driver::CudaSlice;
use vela_compute::DeltaDims;

impl CudaBackend {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn conv1d_causal_impl(
        &self,
        x: &CudaBuf,
        from: usize,
        n: usize,
        width: usize,
        w: &CudaSlice<f32>,
        k: usize,
        dilation: usize,
        silu: bool,
        state: &mut CudaBuf,
        out: &mut CudaBuf,
    ) {
        assert!(
            k >= 1 && dilation >= 1,
            "conv1d_causal: kernel and dilation at least 1"
        );
        let s = (k - 1) * dilation;
        assert!(
            x.len() >= (from + n) * width
                && out.len() >= (from + n) * width
                && state.len() >= s * width,
            "conv1d_causal: buffer too small"
        );
        assert!(w.len() >= width * k, "conv1d_causal: weight too small");
        if n == 0 || width == 0 {
            return;
        }
        let off = (from * width * 4) as u64;
        let args = [
            Arg::P(self.ptr(x) + off),
            Arg::I(n as i32),
            Arg::I(width as i32),
            Arg::P(self.ptr(w)),
            Arg::I(k as i32),
            Arg::I(dilation as i32),
            Arg::I(silu as i32),
            Arg::P(self.ptr(state)),
            Arg::P(self.ptr(out) + off),
        ];
        self.launch(
            "rec_conv1d_causal",
            (width.div_ceil(128) as u32, 1, 1),
            128,
            &args,
        );
    }

    pub(crate) fn sum_rows_impl(
        &self,
        x: &CudaBuf,
        n_rows: usize,
        width: usize,
        out: &mut CudaBuf,
    ) {
        assert!(
            x.len() >= n_rows * width && out.len() >= n_rows,
            "sum_rows: buffer too small"
        );
        if n_rows == 0 {
            return;
        }
        let args = [
            Arg::P(self.ptr(x)),
            Arg::I(n_rows as i32),
            Arg::I(width as i32),
            Arg::P(self.ptr(out)),
        ];
        self.launch_1d("rec_sum_rows", n_rows, &args);
    }

    pub(crate) fn decay_gate_impl(
        &self,
        x: &mut CudaBuf,
        bias: &CudaSlice<f32>,
        scale: &CudaSlice<f32>,
        n_rows: usize,
        width: usize,
    ) {
        let total = n_rows * width;
        assert!(
            x.len() >= total && bias.len() >= width && scale.len() >= width,
            "decay_gate: buffer too small"
        );
        let args = [
            Arg::P(self.ptr(x)),
            Arg::P(self.ptr(bias)),
            Arg::P(self.ptr(scale)),
            Arg::I(width as i32),
            Arg::L(total as i64),
        ];
        self.launch_1d("rec_decay_gate", total, &args);
    }

    pub(crate) fn signed_sqrt_gate_impl(&self, x: &mut CudaBuf, len: usize, scale: f32) {
        assert!(x.len() >= len, "signed_sqrt_gate: buffer too small");
        let args = [Arg::P(self.ptr(x)), Arg::L(len as i64), Arg::F(scale)];
        self.launch_1d("rec_signed_sqrt_gate", len, &args);
    }

    /// Both delta rules (`channels`: KDA's log-decay per key channel, `[n, n_v·dk]`; else one
    /// per value head, `[n, n_v]`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gated_delta_rule_impl(
        &self,
        qkv: &CudaBuf,
        g: &CudaBuf,
        beta: &CudaBuf,
        channels: bool,
        d: DeltaDims,
        state: &mut CudaBuf,
        out: &mut CudaBuf,
    ) {
        let DeltaDims {
            n,
            n_k,
            n_v,
            dk,
            dv,
            from,
            ..
        } = d;
        let row = 2 * n_k * dk + n_v * dv;
        let gw = if channels { n_v * dk } else { n_v };
        assert!(
            n_k > 0 && n_v % n_k == 0,
            "gated_delta_rule: value heads must be a multiple of key heads"
        );
        assert!(
            dk <= 256 && dv <= 1024,
            "gated_delta_rule: head dims up to 256 (keys) and 1024 (values)"
        );
        assert!(
            qkv.len() >= (from + n) * row
                && out.len() >= (from + n) * n_v * dv
                && g.len() >= (from + n) * gw
                && beta.len() >= (from + n) * n_v
                && state.len() >= n_v * dk * dv,
            "gated_delta_rule: buffer too small"
        );
        if n == 0 {
            return;
        }
        let args = [
            Arg::P(self.ptr(qkv) + (from * row * 4) as u64),
            Arg::P(self.ptr(g) + (from * gw * 4) as u64),
            Arg::P(self.ptr(beta) + (from * n_v * 4) as u64),
            Arg::I(n as i32),
            Arg::I(n_k as i32),
            Arg::I(n_v as i32),
            Arg::I(dk as i32),
            Arg::I(dv as i32),
            Arg::I(d.tiled as i32),
            Arg::I(channels as i32),
            Arg::P(self.ptr(state)),
            Arg::P(self.ptr(out) + (from * n_v * dv * 4) as u64),
        ];
        let threads = dv.div_ceil(32).max(1) * 32;
        self.launch(
            "rec_gated_delta_rule",
            (n_v as u32, 1, 1),
            threads as u32,
            &args,
        );
    }

    pub(crate) fn mean_streams_impl(
        &self,
        x: &CudaBuf,
        n: usize,
        streams: usize,
        width: usize,
        out: &mut CudaBuf,
    ) {
        let total = n * width;
        assert!(
            x.len() >= total * streams && out.len() >= total && streams >= 1,
            "mean_streams: buffer too small"
        );
        let args = [
            Arg::P(self.ptr(x)),
            Arg::I(streams as i32),
            Arg::I(width as i32),
            Arg::L(total as i64),
            Arg::P(self.ptr(out)),
        ];
        self.launch_1d("rec_mean_streams", total, &args);
    }

    pub(crate) fn inject_streams_impl(
        &self,
        x: &mut CudaBuf,
        w: &CudaBuf,
        y: &CudaBuf,
        n: usize,
        streams: usize,
        width: usize,
    ) {
        let total = n * streams * width;
        assert!(
            x.len() >= total && w.len() >= n * streams && y.len() >= n * width,
            "inject_streams: buffer too small"
        );
        let args = [
            Arg::P(self.ptr(x)),
            Arg::P(self.ptr(w)),
            Arg::P(self.ptr(y)),
            Arg::I(streams as i32),
            Arg::I(width as i32),
            Arg::L(total as i64),
        ];
        self.launch_1d("rec_inject_streams", total, &args);
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rms_norm_grouped_impl(
        &self,
        x: &CudaBuf,
        w: &CudaSlice<f32>,
        n_rows: usize,
        width: usize,
        groups: usize,
        eps: f32,
        out: &mut CudaBuf,
    ) {
        assert!(
            x.len() >= n_rows * width && out.len() >= n_rows * width && w.len() >= groups * width,
            "rms_norm_grouped: buffer too small"
        );
        if n_rows == 0 {
            return;
        }
        let args = [
            Arg::P(self.ptr(x)),
            Arg::P(self.ptr(w)),
            Arg::P(self.ptr(out)),
            Arg::I(width as i32),
            Arg::I(groups.max(1) as i32),
            Arg::F(eps),
        ];
        self.launch("rec_rms_norm_grouped", (n_rows as u32, 1, 1), 256, &args);
    }
}
