//! The CUDA backend: [`CudaBackend`] implements [`vela_compute::Backend`] with kernels written in
//! CUDA C (`kernels/*.cu`), compiled at run time by NVRTC for the GPU's architecture and cached
//! on disk (see [`kernels`]).
//!
//! Nothing CUDA is needed to build: the driver (`libcuda.so`) is opened by `cudarc` with
//! `dlopen` and NVRTC by [`nvrtc`], both when [`CudaBackend::new`] runs. Every op is enqueued
//! on one stream; only [`Backend::read`] waits for the GPU.
//!
//! Numerics mirror the CPU backend: matmuls quantize activations to Q8/Q8_K blocks exactly like
//! it and use exact integer block dot products, RMSNorm sums squares in f64, RoPE builds its
//! angles by repeated f32 multiplication with the same host-computed ratio.
//!
//! Modules: `nvrtc`, `cublas`, `kernels`, `tuning`, `attn_parts` and `weight` hold no GPU state;
//! `device` (context, stream, kernels, one launch) builds on `kernels`; `profile`, `graph` and
//! `l2pf` work on a `Device`; `backend` defines [`CudaBackend`] (the device, the tuning, the
//! decode-step recorder, the ops' state) and the launch path every op takes; the ops are
//! `impl CudaBackend` blocks (`matmul`, `gemm`, `attn`, `attn_gemm`, `kv`, `upload`, `argmax`,
//! `sample`, `steps`, `kit`, `recurrent`, `sparse`); this file puts the [`Backend`] trait on top. No module below `backend`
//! imports it or an op module.

mod argmax;
mod attn;
mod attn_gemm;
mod attn_parts;
mod backend;
mod batch_attn;
pub use batch_attn::BATCHED_LAYERS;
mod compressed;
mod cublas;
mod device;
mod fused;
mod gemm;
mod graph;
pub mod kernels;
mod kit;
mod kv;
mod kv_pages;
mod l2pf;
mod matmul;
pub mod nvrtc;
mod profile;
mod recurrent;
pub mod sample;
mod sparse;
mod steps;
pub mod tuning;
mod upload;
mod weight;

pub use backend::CudaBackend;
pub use graph::GraphStats;
pub use kernels::KERNEL_NAMES;
pub use kv::{CudaKv, CudaKvSnapshot};
pub use tuning::{Tuning, DEFAULT_GEMM_MIN};
pub use weight::{supported, CudaBuf, CudaWeight};

use anyhow::Result;
use cudarc::driver::CudaSlice;
use device::Arg;
use vela_compute::{
    Activation, AttnParams, Backend, HostWeight, KvLayerSpec, KvType, RopeParams, RouteParams,
};

impl Backend for CudaBackend {
    type Buf = CudaBuf;
    type Weight = CudaWeight;
    type Vector = CudaSlice<f32>;
    type Kv = CudaKv;
    type KvSnapshot = CudaKvSnapshot;
    type Ids = CudaSlice<u32>;

    fn memory_free(&self) -> Option<u64> {
        self.memory_info().ok().map(|(free, _)| free)
    }

    fn device_probe(&self) -> Option<Box<dyn vela_compute::DeviceProbe>> {
        backend::Canary::new(&self.dev)
            .ok()
            .map(|c| Box::new(c) as Box<dyn vela_compute::DeviceProbe>)
    }

    fn name(&self) -> String {
        self.dev.name.clone()
    }

    fn alloc(&self, len: usize) -> CudaBuf {
        self.dev
            .stream
            .alloc_zeros::<f32>(len.max(1))
            .unwrap_or_else(|e| panic!("CUDA alloc of {len} floats failed: {e:?}"))
    }

    fn write(&self, buf: &mut CudaBuf, data: &[f32]) {
        self.flush_recording();
        self.dev
            .stream
            .memcpy_htod(data, &mut buf.slice_mut(0..data.len()))
            .expect("CUDA upload");
    }

    fn write_step_input(&self, buf: &mut CudaBuf, data: &[f32]) {
        if !self.recording_inputs() {
            return self.write(buf, data);
        }
        // Stream-ordered ahead of the step's launches, which run when the step ends.
        self.dev
            .stream
            .memcpy_htod(data, &mut buf.slice_mut(0..data.len()))
            .expect("CUDA upload");
    }

    fn read(&self, buf: &CudaBuf, out: &mut [f32]) {
        self.flush_recording();
        self.dev
            .stream
            .memcpy_dtoh(&buf.slice(0..out.len()), out)
            .expect("CUDA download");
        self.dev.wait().expect("CUDA synchronize");
    }

    fn upload_weight(&self, w: &HostWeight) -> Result<CudaWeight> {
        self.upload_weight_impl(w)
    }

    fn write_weight_rows(&self, dst: &mut CudaWeight, row0: usize, w: &HostWeight) -> Result<()> {
        self.write_weight_rows_impl(dst, row0, w)
    }

    fn upload_vector(&self, data: &[f32]) -> Result<CudaSlice<f32>> {
        Ok(self.dev.stream.clone_htod(data)?)
    }

    fn alloc_ids(&self, len: usize) -> CudaSlice<u32> {
        self.dev
            .stream
            .alloc_zeros::<u32>(len.max(1))
            .unwrap_or_else(|e| panic!("CUDA alloc of {len} ids failed: {e:?}"))
    }

    fn write_ids(&self, ids: &mut CudaSlice<u32>, data: &[u32]) {
        if data.is_empty() {
            return;
        }
        self.flush_recording();
        self.dev
            .stream
            .memcpy_htod(data, &mut ids.slice_mut(0..data.len()))
            .expect("CUDA upload of ids");
    }

    fn read_ids(&self, ids: &CudaSlice<u32>, out: &mut [u32]) {
        if out.is_empty() {
            return;
        }
        self.flush_recording();
        self.dev
            .stream
            .memcpy_dtoh(&ids.slice(0..out.len()), out)
            .expect("CUDA download of ids");
        self.dev.wait().expect("CUDA synchronize");
    }

    fn new_kv(&self, layers: &[KvLayerSpec], ty: KvType) -> Result<CudaKv> {
        self.kv_new_impl(layers, ty)
    }

    fn kv_checkpoint(&self, kv: &CudaKv, n_past: usize) -> CudaKvSnapshot {
        self.kv_checkpoint_impl(kv, n_past)
    }

    fn kv_restore(&self, kv: &mut CudaKv, snap: &CudaKvSnapshot) {
        self.kv_restore_impl(kv, snap)
    }

    fn kv_clone(&self, kv: &CudaKv) -> Result<CudaKv> {
        self.kv_clone_impl(kv)
    }

    fn kv_bytes(&self, kv: &CudaKv) -> usize {
        self.kv_bytes_impl(kv)
    }

    fn kv_reserve(&self, kv: &mut CudaKv, n_past: usize) -> Result<()> {
        self.kv_reserve_impl(kv, n_past)
    }

    fn kv_release(&self, kv: &mut CudaKv, n_past: usize) {
        self.kv_release_impl(kv, n_past)
    }

    fn kv_export(&self, kv: &CudaKv, n_past: usize) -> vela_compute::KvExport {
        self.kv_export_impl(kv, n_past)
    }

    fn kv_import(&self, kv: &mut CudaKv, e: &vela_compute::KvExport) -> Result<()> {
        self.kv_import_impl(kv, e)
    }

    fn get_rows(&self, w: &CudaWeight, ids: &[u32], scale: f32, out: &mut CudaBuf) -> Result<()> {
        self.get_rows_impl(w, ids, scale, out)
    }

    fn matmul(&self, w: &CudaWeight, x: &CudaBuf, n: usize, y: &mut CudaBuf) {
        self.matmul_many(&[w], x, n, &mut [y]);
    }

    /// The activations are quantized once for all weights that share their block type and
    /// width (Q/K/V, gate/up), then one product kernel runs per weight.
    fn matmul_many(&self, ws: &[&CudaWeight], x: &CudaBuf, n: usize, ys: &mut [&mut CudaBuf]) {
        self.matmul_many_impl(ws, x, n, ys, None);
    }

    fn norm_matmul_many(
        &self,
        x: &mut CudaBuf,
        residual: Option<&CudaBuf>,
        w: &CudaSlice<f32>,
        n_rows: usize,
        width: usize,
        eps: f32,
        h: &mut CudaBuf,
        ws: &[&CudaWeight],
        biases: &[Option<&CudaSlice<f32>>],
        ys: &mut [&mut CudaBuf],
    ) {
        self.norm_matmul_impl(x, residual, None, w, n_rows, width, eps, h, ws, ys, biases);
    }

    fn post_norm_matmul_many(
        &self,
        x: &mut CudaBuf,
        residual: &mut CudaBuf,
        post: &CudaSlice<f32>,
        x_scale: f32,
        w: &CudaSlice<f32>,
        n_rows: usize,
        width: usize,
        eps: f32,
        h: &mut CudaBuf,
        ws: &[&CudaWeight],
        biases: &[Option<&CudaSlice<f32>>],
        ys: &mut [&mut CudaBuf],
    ) {
        let post = (post, x_scale);
        self.post_norm_matmul_impl(x, residual, post, w, n_rows, width, eps, h, ws, ys, biases);
    }

    fn add_bias(&self, x: &mut CudaBuf, b: &CudaSlice<f32>, n: usize) {
        let w = b.len();
        let args = [
            Arg::P(self.ptr(x)),
            Arg::P(self.ptr(b)),
            Arg::I(w as i32),
            Arg::L((n * w) as i64),
        ];
        self.launch_1d("add_bias", n * w, &args);
    }

    fn rms_norm(
        &self,
        x: &CudaBuf,
        w: &CudaSlice<f32>,
        n_rows: usize,
        width: usize,
        eps: f32,
        out: &mut CudaBuf,
    ) {
        if n_rows == 0 {
            return;
        }
        let args = [
            Arg::P(self.ptr(x)),
            Arg::P(self.ptr(w)),
            Arg::P(self.ptr(out)),
            Arg::I(width as i32),
            Arg::F(eps),
        ];
        self.launch("rms_norm", (n_rows as u32, 1, 1), 256, &args);
    }

    fn rms_norm_inplace(
        &self,
        x: &mut CudaBuf,
        w: &CudaSlice<f32>,
        n_rows: usize,
        width: usize,
        eps: f32,
    ) {
        if n_rows == 0 {
            return;
        }
        let xp = self.ptr(x);
        let args = [
            Arg::P(xp),
            Arg::P(self.ptr(w)),
            Arg::P(xp),
            Arg::I(width as i32),
            Arg::F(eps),
        ];
        self.launch("rms_norm", (n_rows as u32, 1, 1), 256, &args);
    }

    fn rope(
        &self,
        x: &mut CudaBuf,
        n_head: usize,
        head_dim: usize,
        positions: &[u32],
        p: &RopeParams,
    ) {
        self.rope_impl(x, n_head, head_dim, positions, p);
    }

    #[allow(clippy::too_many_arguments)]
    fn rope_qk(
        &self,
        q: &mut CudaBuf,
        k: &mut CudaBuf,
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        positions: &[u32],
        p: &RopeParams,
    ) {
        self.rope_qk_impl(q, k, n_head, n_head_kv, head_dim, positions, p);
    }

    #[allow(clippy::too_many_arguments)]
    fn rope_qk_store(
        &self,
        q: &mut CudaBuf,
        k: &mut CudaBuf,
        v: &CudaBuf,
        kv: &mut CudaKv,
        layer: usize,
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        positions: &[u32],
        p: &RopeParams,
    ) {
        let (n_kv, hd) = (n_head_kv, head_dim);
        self.rope_qk_store_impl(q, k, v, kv, layer, n_head, n_kv, hd, positions, p, None, 0);
    }

    fn norm_rope_qk_store(
        &self,
        q: &mut CudaBuf,
        k: &mut CudaBuf,
        v: &mut CudaBuf,
        kv: &mut CudaKv,
        layer: usize,
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        positions: &[u32],
        p: &RopeParams,
        norms: (&CudaSlice<f32>, &CudaSlice<f32>, f32),
        v_norm: Option<&CudaSlice<f32>>,
    ) {
        let (qn, kn, eps) = norms;
        self.norm_rope_qk_store_impl(
            q,
            k,
            v,
            kv,
            layer,
            n_head,
            n_head_kv,
            head_dim,
            positions,
            p,
            (qn, kn, v_norm, eps),
            0,
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn act_mul_matmul(
        &self,
        gate: &mut CudaBuf,
        up: &CudaBuf,
        n_rows: usize,
        width: usize,
        act: Activation,
        w: &CudaWeight,
        y: &mut CudaBuf,
    ) {
        self.act_matmul_impl(gate, up, n_rows, width, act, w, y);
    }

    fn scale(&self, x: &mut CudaBuf, len: usize, s: f32) {
        let args = [Arg::P(self.ptr(x)), Arg::F(s), Arg::L(len as i64)];
        self.launch_1d("scale", len, &args);
    }

    fn add(&self, x: &mut CudaBuf, y: &CudaBuf, len: usize) {
        let args = [Arg::P(self.ptr(x)), Arg::P(self.ptr(y)), Arg::L(len as i64)];
        self.launch_1d("add", len, &args);
    }

    fn act_mul(&self, gate: &mut CudaBuf, up: &CudaBuf, len: usize, act: Activation) {
        let name = match act {
            Activation::Silu => "act_mul_silu",
            Activation::GeluTanh => "act_mul_gelu",
            Activation::SiluLimit(l) => return self.act_mul_limit_impl(gate, up, len, l),
        };
        let args = [
            Arg::P(self.ptr(gate)),
            Arg::P(self.ptr(up)),
            Arg::L(len as i64),
        ];
        self.launch_1d(name, len, &args);
    }

    fn softcap(&self, x: &mut CudaBuf, len: usize, cap: f32) {
        let args = [Arg::P(self.ptr(x)), Arg::F(cap), Arg::L(len as i64)];
        self.launch_1d("softcap", len, &args);
    }

    fn softmax_rows(&self, x: &mut CudaBuf, n_rows: usize, width: usize) {
        self.softmax_rows_impl(x, n_rows, width);
    }

    fn rms_norm_grouped(
        &self,
        x: &CudaBuf,
        w: &CudaSlice<f32>,
        n_rows: usize,
        width: usize,
        groups: usize,
        eps: f32,
        out: &mut CudaBuf,
    ) {
        self.rms_norm_grouped_impl(x, w, n_rows, width, groups, eps, out);
    }

    fn store_rows_at(
        &self,
        src: &CudaBuf,
        width: usize,
        positions: &[u32],
        ring: usize,
        dst: &mut CudaBuf,
    ) {
        self.store_rows_at_impl(src, width, positions, ring, dst);
    }

    fn pool_blocks(
        &self,
        raw: &CudaBuf,
        raw_slots: usize,
        width: usize,
        block: usize,
        positions: &[u32],
        norm: (&CudaSlice<f32>, f32),
        rope: &vela_compute::RopeParams,
        scratch: [&mut CudaBuf; 2],
        rows: &mut CudaBuf,
    ) {
        let [_, pooled] = scratch;
        self.pool_blocks_impl(
            raw, raw_slots, width, block, positions, norm, rope, pooled, rows,
        );
    }

    fn indexer_select(
        &self,
        q: &CudaBuf,
        keys: &CudaBuf,
        positions: &[u32],
        p: &vela_compute::IndexerParams,
        sel: &mut CudaSlice<u32>,
        counts: &mut CudaSlice<u32>,
    ) {
        self.indexer_select_impl(q, keys, positions, p, sel, counts);
    }

    fn attention_selected(
        &self,
        q: &CudaBuf,
        k: &CudaBuf,
        v: &CudaBuf,
        sel: &CudaSlice<u32>,
        counts: &CudaSlice<u32>,
        n: usize,
        width: usize,
        heads: (usize, usize, usize),
        scale: f32,
        out: &mut CudaBuf,
    ) {
        self.attention_selected_impl(q, k, v, sel, counts, n, width, heads, scale, out);
    }

    fn mhc_weights(
        &self,
        mix: &mut CudaBuf,
        base: &CudaSlice<f32>,
        scale: [f32; 3],
        n: usize,
        streams: usize,
        iters: usize,
        eps: f32,
        head: bool,
    ) {
        self.mhc_weights_impl(mix, base, scale, n, streams, iters, eps, head);
    }

    fn mhc_collapse(
        &self,
        x: &CudaBuf,
        w: &CudaBuf,
        stride: usize,
        n: usize,
        streams: usize,
        width: usize,
        out: &mut CudaBuf,
    ) {
        self.mhc_collapse_impl(x, w, stride, n, streams, width, out);
    }

    fn mhc_expand(
        &self,
        x: &mut CudaBuf,
        w: &CudaBuf,
        y: &CudaBuf,
        n: usize,
        streams: usize,
        width: usize,
    ) {
        self.mhc_expand_impl(x, w, y, n, streams, width);
    }

    fn rope_trailing(
        &self,
        x: &mut CudaBuf,
        n_head: usize,
        head_dim: usize,
        positions: &[u32],
        inv_freq: &[f32],
        inverse: bool,
    ) {
        self.rope_trailing_impl(x, n_head, head_dim, positions, inv_freq, inverse);
    }

    fn compress_pool(
        &self,
        raw: &CudaBuf,
        raw_slots: usize,
        raw_width: usize,
        width: usize,
        ape: &CudaSlice<f32>,
        m: usize,
        overlap: bool,
        first: usize,
        n_windows: usize,
        out: &mut CudaBuf,
    ) {
        self.compress_pool_impl(
            raw, raw_slots, raw_width, width, ape, m, overlap, first, n_windows, out,
        );
    }

    fn compress_pool_at(
        &self,
        raw: &CudaBuf,
        ring: (usize, usize),
        width: usize,
        ape: &CudaSlice<f32>,
        window: (usize, bool),
        positions: &[u32],
        _scratch: &mut CudaBuf,
        rows: &mut CudaBuf,
    ) {
        self.compress_pool_at_impl(raw, ring, width, ape, window, positions, rows);
    }

    fn lightning_select(
        &self,
        q: &CudaBuf,
        w: &CudaBuf,
        keys: &CudaBuf,
        positions: &[u32],
        p: &vela_compute::LightningParams,
        sel: &mut CudaSlice<u32>,
        counts: &mut CudaSlice<u32>,
    ) {
        self.lightning_select_impl(q, w, keys, positions, p, sel, counts);
    }

    fn attention_sink(
        &self,
        q: &CudaBuf,
        a: (&CudaBuf, &CudaSlice<u32>, &CudaSlice<u32>, usize),
        b: (&CudaBuf, &CudaSlice<u32>, &CudaSlice<u32>, usize),
        sinks: &CudaSlice<f32>,
        n: usize,
        n_head: usize,
        head_dim: usize,
        scale: f32,
        out: &mut CudaBuf,
    ) {
        self.attention_sink_impl(q, a, b, sinks, n, n_head, head_dim, scale, out);
    }

    fn mean_streams(&self, x: &CudaBuf, n: usize, streams: usize, width: usize, out: &mut CudaBuf) {
        self.mean_streams_impl(x, n, streams, width, out);
    }

    fn inject_streams(
        &self,
        x: &mut CudaBuf,
        w: &CudaBuf,
        y: &CudaBuf,
        n: usize,
        streams: usize,
        width: usize,
    ) {
        self.inject_streams_impl(x, w, y, n, streams, width);
    }

    fn conv1d_causal(
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
        self.conv1d_causal_impl(x, from, n, width, w, k, dilation, silu, state, out);
    }

    fn sum_rows(&self, x: &CudaBuf, n_rows: usize, width: usize, out: &mut CudaBuf) {
        self.sum_rows_impl(x, n_rows, width, out);
    }

    fn decay_gate(
        &self,
        x: &mut CudaBuf,
        bias: &CudaSlice<f32>,
        scale: &CudaSlice<f32>,
        n_rows: usize,
        width: usize,
    ) {
        self.decay_gate_impl(x, bias, scale, n_rows, width);
    }

    fn signed_sqrt_gate(&self, x: &mut CudaBuf, len: usize, scale: f32) {
        self.signed_sqrt_gate_impl(x, len, scale);
    }

    fn gated_delta_rule(
        &self,
        qkv: &CudaBuf,
        g: &CudaBuf,
        beta: &CudaBuf,
        dims: vela_compute::DeltaDims,
        state: &mut CudaBuf,
        out: &mut CudaBuf,
    ) {
        self.gated_delta_rule_impl(qkv, g, beta, false, dims, state, out);
    }

    fn gated_delta_rule_channels(
        &self,
        qkv: &CudaBuf,
        g: &CudaBuf,
        beta: &CudaBuf,
        dims: vela_compute::DeltaDims,
        state: &mut CudaBuf,
        out: &mut CudaBuf,
    ) {
        self.gated_delta_rule_impl(qkv, g, beta, true, dims, state, out);
    }

    fn sigmoid(&self, x: &mut CudaBuf, len: usize) {
        self.sigmoid_impl(x, len);
    }

    fn mul(&self, x: &mut CudaBuf, y: &CudaBuf, len: usize) {
        self.mul_impl(x, y, len);
    }

    fn silu_scaled(&self, x: &mut CudaBuf, len: usize, s: f32) {
        self.silu_scaled_impl(x, len, s);
    }

    fn sigmoid_scaled(&self, x: &mut CudaBuf, len: usize, pre: f32, post: f32) {
        self.sigmoid_scaled_impl(x, len, pre, post);
    }

    fn sigmoid_mul(&self, x: &mut CudaBuf, g: &CudaBuf, len: usize) {
        self.sigmoid_mul_impl(x, g, len);
    }

    fn sigmoid_mix_streams(
        &self,
        a: &CudaBuf,
        xn: &CudaBuf,
        n: usize,
        streams: usize,
        width: usize,
        out: &mut CudaBuf,
    ) {
        self.sigmoid_mix_streams_impl(a, xn, n, streams, width, out);
    }

    fn delta_gates(
        &self,
        b: &mut CudaBuf,
        a: &mut CudaBuf,
        bias: &CudaSlice<f32>,
        scale: &CudaSlice<f32>,
        n_rows: usize,
        width: usize,
    ) {
        self.delta_gates_impl(b, a, bias, scale, n_rows, width);
    }

    fn act_mul_split(
        &self,
        gu: &CudaBuf,
        n_rows: usize,
        width: usize,
        act: Activation,
        out: &mut CudaBuf,
    ) {
        self.act_mul_split_impl(gu, n_rows, width, act, out);
    }

    fn gather_rows(
        &self,
        src: &CudaBuf,
        idx: &CudaSlice<u32>,
        n: usize,
        width: usize,
        out: &mut CudaBuf,
    ) {
        self.gather_rows_impl(src, idx, n, width, out);
    }

    fn scatter_add_rows(
        &self,
        dst: &mut CudaBuf,
        src: &CudaBuf,
        idx: &CudaSlice<u32>,
        weights: Option<&CudaBuf>,
        n: usize,
        width: usize,
    ) {
        self.scatter_add_rows_impl(dst, src, idx, weights, n, width);
    }

    fn route(
        &self,
        logits: &CudaBuf,
        n_tokens: usize,
        p: &RouteParams,
        bias: Option<&CudaSlice<f32>>,
        expert_scale: Option<&CudaSlice<f32>>,
        ids: &mut CudaSlice<u32>,
        weights: &mut CudaBuf,
    ) {
        self.route_impl(logits, n_tokens, p, bias, expert_scale, ids, weights);
    }

    fn route_hash(
        &self,
        logits: &CudaBuf,
        tokens: &CudaSlice<u32>,
        table: &CudaSlice<u32>,
        n_tokens: usize,
        p: &RouteParams,
        ids: &mut CudaSlice<u32>,
        weights: &mut CudaBuf,
    ) {
        self.route_hash_impl(logits, tokens, table, n_tokens, p, ids, weights);
    }

    fn matmul_experts(
        &self,
        w: &CudaWeight,
        rows_per_expert: usize,
        x: &CudaBuf,
        x_per_slot: bool,
        ids: &CudaSlice<u32>,
        n_tokens: usize,
        k: usize,
        y: &mut CudaBuf,
    ) {
        self.matmul_experts_impl(w, rows_per_expert, x, x_per_slot, ids, n_tokens, k, y);
    }

    fn kv_store(&self, kv: &mut CudaKv, layer: usize, k: &CudaBuf, v: &CudaBuf, positions: &[u32]) {
        if positions.is_empty() {
            return;
        }
        self.kv_ensure(kv, layer, positions);
        let name = format!("kv_store_{}", kv::kv_suffix(kv.ty));
        let l = &kv.layers[layer];
        let mut sc = self.scratch();
        let pp = self.positions(&mut sc, positions);
        let args = [
            Arg::P(self.ptr(k)),
            Arg::P(self.ptr(v)),
            Arg::P(pp),
            Arg::P(l.k.ptr()),
            Arg::P(l.v.ptr()),
            Arg::I((l.spec.n_head_kv * l.spec.head_dim_k) as i32),
            Arg::I((l.spec.n_head_kv * l.spec.head_dim_v) as i32),
            Arg::I(l.spec.capacity as i32),
        ];
        self.launch(&name, (positions.len() as u32, 1, 1), 256, &args);
    }

    fn attention(
        &self,
        q: &CudaBuf,
        kv: &CudaKv,
        layer: usize,
        positions: &[u32],
        p: &AttnParams,
        out: &mut CudaBuf,
    ) {
        self.attention_impl(q, kv, layer, positions, p, out, None, 0);
    }

    fn rope_store_attend_batch(
        &self,
        q: &mut CudaBuf,
        k: &mut CudaBuf,
        v: &mut CudaBuf,
        kvs: &mut [&mut CudaKv],
        layer: usize,
        positions: &[&[u32]],
        rope: &RopeParams,
        norms: Option<(&CudaSlice<f32>, &CudaSlice<f32>, f32)>,
        p: &AttnParams,
        out: &mut CudaBuf,
    ) -> bool {
        self.rope_store_attend_batch_impl(q, k, v, kvs, layer, positions, rope, norms, p, out)
    }

    fn attention_matmul(
        &self,
        q: &CudaBuf,
        kv: &CudaKv,
        layer: usize,
        positions: &[u32],
        p: &AttnParams,
        a: &mut CudaBuf,
        w: &CudaWeight,
        y: &mut CudaBuf,
    ) {
        self.attention_matmul_impl(q, kv, layer, positions, p, a, w, y);
    }

    fn copy_rows(
        &self,
        src: &CudaBuf,
        src_row: usize,
        n_rows: usize,
        width: usize,
        dst: &mut CudaBuf,
        dst_row: usize,
    ) {
        let n = n_rows * width;
        if n == 0 {
            return;
        }
        let (s0, d0) = (src_row * width, dst_row * width);
        assert!(
            src.len() >= s0 + n && dst.len() >= d0 + n,
            "copy_rows: buffers too small"
        );
        // A kernel rather than a memcpy, so that decode steps can be recorded as launches.
        let args = [
            Arg::P(self.ptr(src) + (s0 * 4) as u64),
            Arg::P(self.ptr(dst) + (d0 * 4) as u64),
            Arg::L(n as i64),
        ];
        self.launch_1d("copy_f32", n, &args);
    }

    fn decode_step_begin(&self, token: u32, pos: u32, key: u64) -> bool {
        self.step_begin(token, pos, key)
    }

    fn decode_step_end(&self) {
        self.flush_recording();
    }

    fn decode_batch_begin(&self, tokens: &[u32], positions: &[u32]) -> bool {
        self.step_begin_batch(tokens, positions)
    }

    fn argmax_rows(&self, x: &CudaBuf, n_rows: usize, width: usize) -> Vec<u32> {
        self.argmax_rows_device(x, n_rows, width)
    }

    fn decode_step_prepare(&self, pos: u32, key: u64) -> bool {
        self.step_prepare(pos, key)
    }

    fn decode_step_park(&self) {
        self.step_park()
    }

    fn decode_step_discard(&self) {
        self.step_discard()
    }

    fn decode_step_launch(&self, token: u32, pos: u32, key: u64) -> bool {
        self.step_launch(token, pos, key)
    }

    fn decode_step_begin_chained(&self, pos: u32, key: u64) -> bool {
        self.pipe.lock().unwrap_or_else(|e| e.into_inner()).on && self.step_begin_chained(pos, key)
    }

    fn argmax_start(&self, x: &CudaBuf, width: usize) -> Option<u64> {
        self.argmax_start_device(x, width)
    }

    fn argmax_finish(&self, ticket: u64) -> Result<u32> {
        self.argmax_finish_device(ticket)
    }

    fn top_k_rows(
        &self,
        x: &CudaBuf,
        n_rows: usize,
        width: usize,
        k: usize,
    ) -> Vec<vela_compute::TopK> {
        self.top_k_rows_device(x, n_rows, width, k)
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        let _ = self.dev.stream.synchronize();
        if let Some(r) = self.profile_report() {
            eprint!("{r}");
        }
        if self.tune.debug {
            let g = self.graph_stats();
            let per = |x: u64| x as f64 / g.replays.max(1) as f64;
            eprintln!(
                "vela-cuda: decode graphs: {} replays, {} captures, {} plain steps, {} recorded \
                 ahead; host {:.1} us per replayed step ({:.0} launches)",
                g.replays,
                g.captures,
                g.plain,
                g.prepared,
                per(g.replay_host_ns) / 1e3,
                per(g.replay_launches)
            );
        }
    }
}
