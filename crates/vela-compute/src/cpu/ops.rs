//! The CPU implementation of [`Backend`]: activations in `Vec<f32>`, weights used in place from the
//! memory map, KV cache in F32 or F16 rings.
//!
//! Numerics follow llama.cpp's CPU path where it matters for parity: RMSNorm sums squares in f64,
//! RoPE builds its angle table by repeated f32 multiplication, matmuls quantize activations to the
//! weight type's dot-product format (see [`super::matmul`]).

use super::compressed;
use super::kvdata::{host_memory_available, KvData};
pub use super::kvdata::{CpuKv, CpuKvSnapshot};
use super::matmul::{self, QMatrix};
use super::pool::ThreadPool;
use super::rows::{rms_norm_row, rms_norm_row_inplace, rope_cache, rope_head};
use super::simd;
use super::{experts, kit, route};
use crate::{
    Activation, AttnParams, Backend, HostWeight, KvLayerSpec, KvType, RopeParams, RouteParams,
};
use anyhow::{bail, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The CPU backend.
pub struct CpuBackend {
    pool: Arc<ThreadPool>,
    /// [`Backend::precise_products`]: products add their activation-rounding residual's.
    precise: AtomicBool,
}

impl CpuBackend {
    /// A backend using `n_threads` threads (0 = all cores).
    pub fn new(n_threads: usize) -> CpuBackend {
        let n = if n_threads == 0 {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        } else {
            n_threads
        };
        CpuBackend {
            pool: Arc::new(ThreadPool::new(n)),
            precise: AtomicBool::new(false),
        }
    }

    pub fn pool(&self) -> &ThreadPool {
        &self.pool
    }

    /// A weight used only where it lies (never repacked, so a memory-mapped file's pages are all
    /// it takes): routed experts in host memory. Products are bit-identical to a repacked
    /// weight's (`matmul::PackedMatrix`).
    pub fn map_weight(&self, w: &HostWeight) -> Result<CpuWeight> {
        if !matmul::supported(w.ty) {
            bail!(
                "tensor '{}' has type {} which the CPU backend cannot multiply",
                w.name,
                w.ty
            );
        }
        Ok(CpuWeight {
            host: w.clone(),
            packed: None,
        })
    }
}

/// A weight: a window of the memory map plus its geometry, and for the 32-element block types
/// on AVX-512 a repacked copy for the register-blocked GEMM (see `matmul::PackedMatrix`).
pub struct CpuWeight {
    host: HostWeight,
    packed: Option<matmul::PackedMatrix>,
}

impl CpuWeight {
    /// The weight's bytes on the host, where they lie.
    pub fn host(&self) -> &HostWeight {
        &self.host
    }

    fn qmatrix(&self) -> QMatrix<'_> {
        QMatrix {
            ty: self.host.ty,
            rows: self.host.rows,
            cols: self.host.cols,
            data: self.host.bytes(),
        }
    }
}

/// Raw pointer that may be shared across pool threads writing disjoint ranges.
#[derive(Clone, Copy)]
struct SyncPtr(*mut f32);
unsafe impl Send for SyncPtr {}
unsafe impl Sync for SyncPtr {}

impl SyncPtr {
    /// A method (not field access) so closures capture the whole `Sync` wrapper.
    fn get(&self) -> *mut f32 {
        self.0
    }
}

/// Elements below which a row-wise op runs on the calling thread (a dispatch costs more).
const PARALLEL_MIN: usize = 1 << 14;

impl CpuBackend {
    /// `f(r)` for every row `r < n_rows`, split over the pool when the op is large enough.
    fn rows_parallel(&self, n_rows: usize, width: usize, f: impl Fn(usize) + Sync) {
        self.rows_parallel_with(n_rows, width, || (), |_, r| f(r));
    }

    /// [`Self::rows_parallel`] with per-thread state made by `init`.
    fn rows_parallel_with<S>(
        &self,
        n_rows: usize,
        width: usize,
        init: impl Fn() -> S + Sync,
        f: impl Fn(&mut S, usize) + Sync,
    ) {
        if n_rows < 2 || n_rows * width < PARALLEL_MIN || self.pool.n_threads() < 2 {
            let mut st = init();
            (0..n_rows).for_each(|r| f(&mut st, r));
            return;
        }
        self.pool.run(|ti, nt| {
            let mut st = init();
            chunk(n_rows, nt, ti).for_each(|r| f(&mut st, r));
        });
    }
}

/// Split `n` items into `parts` contiguous ranges; range `i`.
fn chunk(n: usize, parts: usize, i: usize) -> std::ops::Range<usize> {
    let per = n / parts;
    let rem = n % parts;
    let start = i * per + i.min(rem);
    start..start + per + usize::from(i < rem)
}

/// gate = act(gate) · up.
fn act_mul_slice(act: Activation, gate: &mut [f32], up: &[f32]) {
    match act {
        Activation::Silu => simd::silu_mul(gate, up),
        Activation::GeluTanh => simd::gelu_mul(gate, up),
        Activation::SiluLimit(l) => {
            for (g, &u) in gate.iter_mut().zip(up) {
                let x = g.min(l);
                *g = x / (1.0 + (-x).exp()) * u.clamp(-l, l);
            }
        }
    }
}

impl Backend for CpuBackend {
    type Buf = Vec<f32>;
    type Weight = CpuWeight;
    type Vector = Vec<f32>;
    type Kv = CpuKv;
    type KvSnapshot = CpuKvSnapshot;
    type Ids = Vec<u32>;

    fn name(&self) -> String {
        format!(
            "cpu ({} threads, {} kernels)",
            self.pool.n_threads(),
            matmul::kernel_name()
        )
    }

    /// The host's available memory: a session checks its KV cache against it before allocating,
    /// so an oversized `--ctx` is a clear error rather than an allocation failure or the OOM killer.
    fn memory_free(&self) -> Option<u64> {
        host_memory_available()
    }

    fn alloc(&self, len: usize) -> Vec<f32> {
        vec![0.0; len]
    }

    fn write(&self, buf: &mut Vec<f32>, data: &[f32]) {
        buf[..data.len()].copy_from_slice(data);
    }

    fn read(&self, buf: &Vec<f32>, out: &mut [f32]) {
        out.copy_from_slice(&buf[..out.len()]);
    }

    fn upload_weight(&self, w: &HostWeight) -> Result<CpuWeight> {
        let mut cw = self.map_weight(w)?;
        // The embedding / output head is only multiplied for one token per step (and gathered
        // from the GGUF layout), so a packed copy would only cost memory.
        if !w.head && matmul::packs(matmul::Kernel::selected(), w.ty) {
            cw.packed = matmul::PackedMatrix::new(&cw.qmatrix());
        }
        Ok(cw)
    }

    fn write_weight_rows(&self, dst: &mut CpuWeight, row0: usize, w: &HostWeight) -> Result<()> {
        let h = &dst.host;
        if w.ty != h.ty || w.cols != h.cols || row0 + w.rows > h.rows {
            bail!(
                "tensor '{}': {} rows of {} {} do not fit rows {row0}.. of a {}×{} {} weight",
                w.name,
                w.rows,
                w.cols,
                w.ty,
                h.rows,
                h.cols,
                h.ty
            );
        }
        // A new copy with the rows replaced, packed again: the CPU has no device to spare copies
        // for, so this is for tests of the caches that use it.
        let rb = h.bytes().len() / h.rows.max(1);
        let mut bytes = h.bytes().to_vec();
        bytes[row0 * rb..(row0 + w.rows) * rb].copy_from_slice(&w.bytes()[..w.rows * rb]);
        let new = HostWeight::owned(&h.name, h.ty, h.rows, h.cols, bytes)?.as_head(h.head);
        *dst = self.upload_weight(&new)?;
        Ok(())
    }

    fn upload_vector(&self, data: &[f32]) -> Result<Vec<f32>> {
        Ok(data.to_vec())
    }

    fn alloc_ids(&self, len: usize) -> Vec<u32> {
        vec![0; len]
    }

    fn write_ids(&self, ids: &mut Vec<u32>, data: &[u32]) {
        ids[..data.len()].copy_from_slice(data);
    }

    fn read_ids(&self, ids: &Vec<u32>, out: &mut [u32]) {
        out.copy_from_slice(&ids[..out.len()]);
    }

    fn new_kv(&self, layers: &[KvLayerSpec], ty: KvType) -> Result<CpuKv> {
        Ok(CpuKv::new(layers, ty))
    }

    fn kv_checkpoint(&self, kv: &CpuKv, n_past: usize) -> CpuKvSnapshot {
        kv.checkpoint(n_past)
    }

    fn kv_restore(&self, kv: &mut CpuKv, snap: &CpuKvSnapshot) {
        kv.restore(snap)
    }

    fn kv_clone(&self, kv: &CpuKv) -> Result<CpuKv> {
        Ok(kv.deep_clone())
    }

    fn kv_bytes(&self, kv: &CpuKv) -> usize {
        kv.bytes()
    }

    fn kv_reserve(&self, kv: &mut CpuKv, n_past: usize) -> Result<()> {
        kv.reserve(n_past)
    }

    fn kv_release(&self, kv: &mut CpuKv, n_past: usize) {
        kv.release(n_past)
    }

    fn scratch_by_use(&self) -> bool {
        true
    }

    fn kv_export(&self, kv: &CpuKv, n_past: usize) -> crate::KvExport {
        kv.export(n_past)
    }

    fn kv_import(&self, kv: &mut CpuKv, e: &crate::KvExport) -> Result<()> {
        kv.import(e)
    }

    fn get_rows(&self, w: &CpuWeight, ids: &[u32], scale: f32, out: &mut Vec<f32>) -> Result<()> {
        let cols = w.host.cols;
        let row_bytes = w.host.ty.row_bytes(cols as u64).unwrap() as usize;
        let data = w.host.bytes();
        for (t, &id) in ids.iter().enumerate() {
            if id as usize >= w.host.rows {
                bail!(
                    "token id {id} is out of range (vocabulary has {} entries)",
                    w.host.rows
                );
            }
            let row = &data[id as usize * row_bytes..(id as usize + 1) * row_bytes];
            let dst = &mut out[t * cols..(t + 1) * cols];
            vela_formats::quant::dequantize(w.host.ty, row, dst)?;
            if scale != 1.0 {
                dst.iter_mut().for_each(|x| *x *= scale);
            }
        }
        Ok(())
    }

    fn matmul(&self, w: &CpuWeight, x: &Vec<f32>, n: usize, y: &mut Vec<f32>) {
        let q = w.qmatrix();
        matmul::matmul_multi_packed(
            &self.pool,
            &[&q],
            &[w.packed.as_ref()],
            &x[..n * q.cols],
            n,
            &mut [&mut y[..n * q.rows]],
            self.precise.load(Ordering::Relaxed),
        );
    }

    fn matmul_many(&self, ws: &[&CpuWeight], x: &Vec<f32>, n: usize, ys: &mut [&mut Vec<f32>]) {
        let qs: Vec<QMatrix> = ws.iter().map(|w| w.qmatrix()).collect();
        let qrefs: Vec<&QMatrix> = qs.iter().collect();
        let cols = qs.first().map(|q| q.cols).unwrap_or(0);
        let mut outs: Vec<&mut [f32]> = ys
            .iter_mut()
            .zip(&qs)
            .map(|(y, q)| &mut y[..n * q.rows])
            .collect();
        let packed: Vec<Option<&matmul::PackedMatrix>> =
            ws.iter().map(|w| w.packed.as_ref()).collect();
        let precise = self.precise.load(Ordering::Relaxed);
        let x = &x[..n * cols];
        matmul::matmul_multi_packed(&self.pool, &qrefs, &packed, x, n, &mut outs, precise);
    }

    fn softmax_rows(&self, x: &mut Vec<f32>, n_rows: usize, width: usize) {
        kit::softmax_rows(x, n_rows, width);
    }

    fn sigmoid(&self, x: &mut Vec<f32>, len: usize) {
        kit::sigmoid(&mut x[..len]);
    }

    fn mul(&self, x: &mut Vec<f32>, y: &Vec<f32>, len: usize) {
        kit::mul(&mut x[..len], &y[..len]);
    }

    fn silu_scaled(&self, x: &mut Vec<f32>, len: usize, s: f32) {
        super::fused::silu_scaled(&mut x[..len], s);
    }

    fn sigmoid_scaled(&self, x: &mut Vec<f32>, len: usize, pre: f32, post: f32) {
        super::fused::sigmoid_scaled(&mut x[..len], pre, post);
    }

    fn sigmoid_mul(&self, x: &mut Vec<f32>, g: &Vec<f32>, len: usize) {
        super::fused::sigmoid_mul(&mut x[..len], &g[..len]);
    }

    fn sigmoid_mix_streams(
        &self,
        a: &Vec<f32>,
        xn: &Vec<f32>,
        n: usize,
        streams: usize,
        width: usize,
        out: &mut Vec<f32>,
    ) {
        super::fused::sigmoid_mix_streams(a, xn, n, streams, width, out);
    }

    fn delta_gates(
        &self,
        b: &mut Vec<f32>,
        a: &mut Vec<f32>,
        bias: &Vec<f32>,
        scale: &Vec<f32>,
        n_rows: usize,
        width: usize,
    ) {
        super::fused::delta_gates(b, a, bias, scale, n_rows, width);
    }

    fn act_mul_split(
        &self,
        gu: &Vec<f32>,
        n_rows: usize,
        width: usize,
        act: Activation,
        out: &mut Vec<f32>,
    ) {
        for (src, dst) in gu[..n_rows * 2 * width]
            .chunks_exact(2 * width)
            .zip(out[..n_rows * width].chunks_exact_mut(width))
        {
            let (g, u) = src.split_at(width);
            dst.copy_from_slice(g);
            act_mul_slice(act, dst, u);
        }
    }

    fn rms_norm_grouped(
        &self,
        x: &Vec<f32>,
        w: &Vec<f32>,
        n_rows: usize,
        width: usize,
        groups: usize,
        eps: f32,
        out: &mut Vec<f32>,
    ) {
        assert!(
            w.len() >= groups * width,
            "rms_norm_grouped: weight too small"
        );
        let x = &x[..n_rows * width];
        let ptr = SyncPtr(out[..n_rows * width].as_mut_ptr());
        self.rows_parallel(n_rows, width, |r| {
            // SAFETY: each row index is visited once; rows are disjoint ranges of `out`.
            let dst = unsafe { std::slice::from_raw_parts_mut(ptr.get().add(r * width), width) };
            let g = r % groups;
            rms_norm_row(
                &x[r * width..(r + 1) * width],
                &w[g * width..(g + 1) * width],
                eps,
                dst,
            );
        });
    }

    fn indexer_select(
        &self,
        q: &Vec<f32>,
        keys: &Vec<f32>,
        positions: &[u32],
        p: &crate::IndexerParams,
        sel: &mut Vec<u32>,
        counts: &mut Vec<u32>,
    ) {
        super::sparse::indexer_select(q, keys, positions, p, sel, counts);
    }

    fn attention_selected(
        &self,
        q: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        sel: &Vec<u32>,
        counts: &Vec<u32>,
        n: usize,
        width: usize,
        heads: (usize, usize, usize),
        scale: f32,
        out: &mut Vec<f32>,
    ) {
        let (nh, nkv, hd) = heads;
        super::sparse::attention_selected(q, k, v, sel, counts, n, width, nh, nkv, hd, scale, out);
    }

    fn mhc_weights(
        &self,
        mix: &mut Vec<f32>,
        base: &Vec<f32>,
        scale: [f32; 3],
        n: usize,
        streams: usize,
        iters: usize,
        eps: f32,
        head: bool,
    ) {
        compressed::mhc_weights(mix, base, scale, n, streams, iters, eps, head);
    }

    fn mhc_collapse(
        &self,
        x: &Vec<f32>,
        w: &Vec<f32>,
        stride: usize,
        n: usize,
        streams: usize,
        width: usize,
        out: &mut Vec<f32>,
    ) {
        compressed::mhc_collapse(x, w, stride, n, streams, width, out);
    }

    fn mhc_expand(
        &self,
        x: &mut Vec<f32>,
        w: &Vec<f32>,
        y: &Vec<f32>,
        n: usize,
        streams: usize,
        width: usize,
    ) {
        compressed::mhc_expand(x, w, y, n, streams, width);
    }

    fn rope_trailing(
        &self,
        x: &mut Vec<f32>,
        n_head: usize,
        head_dim: usize,
        positions: &[u32],
        inv_freq: &[f32],
        inverse: bool,
    ) {
        compressed::rope_trailing(x, n_head, head_dim, positions, inv_freq, inverse);
    }

    fn compress_pool(
        &self,
        raw: &Vec<f32>,
        raw_slots: usize,
        raw_width: usize,
        width: usize,
        ape: &Vec<f32>,
        m: usize,
        overlap: bool,
        first: usize,
        n_windows: usize,
        out: &mut Vec<f32>,
    ) {
        compressed::compress_pool(
            raw, raw_slots, raw_width, width, ape, m, overlap, first, n_windows, out,
        );
    }

    fn lightning_select(
        &self,
        q: &Vec<f32>,
        w: &Vec<f32>,
        keys: &Vec<f32>,
        positions: &[u32],
        p: &crate::LightningParams,
        sel: &mut Vec<u32>,
        counts: &mut Vec<u32>,
    ) {
        compressed::lightning_select(q, w, keys, positions, p, sel, counts);
    }

    fn attention_sink(
        &self,
        q: &Vec<f32>,
        a: (&Vec<f32>, &Vec<u32>, &Vec<u32>, usize),
        b: (&Vec<f32>, &Vec<u32>, &Vec<u32>, usize),
        sinks: &Vec<f32>,
        n: usize,
        n_head: usize,
        head_dim: usize,
        scale: f32,
        out: &mut Vec<f32>,
    ) {
        let (a, b) = (compressed::RowSet::from(a), compressed::RowSet::from(b));
        compressed::attention_sink(q, [&a, &b], sinks, n, n_head, head_dim, scale, out);
    }

    fn mean_streams(
        &self,
        x: &Vec<f32>,
        n: usize,
        streams: usize,
        width: usize,
        out: &mut Vec<f32>,
    ) {
        super::recurrent::mean_streams(x, n, streams, width, out);
    }

    fn inject_streams(
        &self,
        x: &mut Vec<f32>,
        w: &Vec<f32>,
        y: &Vec<f32>,
        n: usize,
        streams: usize,
        width: usize,
    ) {
        super::recurrent::inject_streams(x, w, y, n, streams, width);
    }

    fn conv1d_causal(
        &self,
        x: &Vec<f32>,
        from: usize,
        n: usize,
        width: usize,
        w: &Vec<f32>,
        k: usize,
        dilation: usize,
        silu: bool,
        state: &mut Vec<f32>,
        out: &mut Vec<f32>,
    ) {
        super::recurrent::conv1d_causal(x, from, n, width, w, k, dilation, silu, state, out);
    }

    fn sum_rows(&self, x: &Vec<f32>, n_rows: usize, width: usize, out: &mut Vec<f32>) {
        super::recurrent::sum_rows(x, n_rows, width, out);
    }

    fn decay_gate(
        &self,
        x: &mut Vec<f32>,
        bias: &Vec<f32>,
        scale: &Vec<f32>,
        n_rows: usize,
        width: usize,
    ) {
        super::recurrent::decay_gate(x, bias, scale, n_rows, width);
    }

    fn signed_sqrt_gate(&self, x: &mut Vec<f32>, len: usize, scale: f32) {
        super::recurrent::signed_sqrt_gate(&mut x[..len], scale);
    }

    fn gated_delta_rule(
        &self,
        qkv: &Vec<f32>,
        g: &Vec<f32>,
        beta: &Vec<f32>,
        dims: crate::DeltaDims,
        state: &mut Vec<f32>,
        out: &mut Vec<f32>,
    ) {
        super::recurrent::gated_delta_rule(&self.pool, qkv, g, beta, dims, state, out);
    }

    fn gated_delta_rule_channels(
        &self,
        qkv: &Vec<f32>,
        g: &Vec<f32>,
        beta: &Vec<f32>,
        dims: crate::DeltaDims,
        state: &mut Vec<f32>,
        out: &mut Vec<f32>,
    ) {
        super::recurrent::gated_delta_rule_channels(&self.pool, qkv, g, beta, dims, state, out);
    }

    fn gather_rows(&self, src: &Vec<f32>, idx: &Vec<u32>, n: usize, w: usize, out: &mut Vec<f32>) {
        kit::gather_rows(src, &idx[..n], w, &mut out[..n * w]);
    }

    fn scatter_add_rows(
        &self,
        dst: &mut Vec<f32>,
        src: &Vec<f32>,
        idx: &Vec<u32>,
        weights: Option<&Vec<f32>>,
        n: usize,
        w: usize,
    ) {
        let weights = weights.map(|v| &v[..n]);
        kit::scatter_add_rows(dst, &src[..n * w], &idx[..n], weights, w);
    }

    fn route(
        &self,
        logits: &Vec<f32>,
        n: usize,
        p: &RouteParams,
        bias: Option<&Vec<f32>>,
        scale: Option<&Vec<f32>>,
        ids: &mut Vec<u32>,
        w: &mut Vec<f32>,
    ) {
        let (b, s) = (bias.map(|v| &v[..]), scale.map(|v| &v[..]));
        route::route(logits, n, p, b, s, ids, w);
    }

    fn route_hash(
        &self,
        logits: &Vec<f32>,
        tokens: &Vec<u32>,
        table: &Vec<u32>,
        n: usize,
        p: &RouteParams,
        ids: &mut Vec<u32>,
        w: &mut Vec<f32>,
    ) {
        route::route_hash(logits, tokens, table, n, p, ids, w);
    }

    fn matmul_experts(
        &self,
        w: &CpuWeight,
        rpe: usize,
        x: &Vec<f32>,
        x_per_slot: bool,
        ids: &Vec<u32>,
        n_tokens: usize,
        k: usize,
        y: &mut Vec<f32>,
    ) {
        let (q, p, precise) = (
            w.qmatrix(),
            w.packed.as_ref(),
            self.precise.load(Ordering::Relaxed),
        );
        experts::matmul_experts(
            &self.pool, &q, p, rpe, x, x_per_slot, ids, n_tokens, k, y, precise,
        );
    }

    fn precise_products(&self, on: bool) {
        self.precise.store(on, Ordering::Relaxed);
    }

    fn add_bias(&self, x: &mut Vec<f32>, b: &Vec<f32>, n: usize) {
        let w = b.len();
        for row in x[..n * w].chunks_exact_mut(w) {
            row.iter_mut().zip(b).for_each(|(a, b)| *a += b);
        }
    }

    fn rms_norm(
        &self,
        x: &Vec<f32>,
        w: &Vec<f32>,
        n_rows: usize,
        width: usize,
        eps: f32,
        out: &mut Vec<f32>,
    ) {
        let x = &x[..n_rows * width];
        let ptr = SyncPtr(out[..n_rows * width].as_mut_ptr());
        self.rows_parallel(n_rows, width, |r| {
            // SAFETY: each row index is visited once; rows are disjoint ranges of `out`.
            let dst = unsafe { std::slice::from_raw_parts_mut(ptr.get().add(r * width), width) };
            rms_norm_row(&x[r * width..(r + 1) * width], w, eps, dst);
        });
    }

    fn rms_norm_inplace(
        &self,
        x: &mut Vec<f32>,
        w: &Vec<f32>,
        n_rows: usize,
        width: usize,
        eps: f32,
    ) {
        let ptr = SyncPtr(x[..n_rows * width].as_mut_ptr());
        self.rows_parallel(n_rows, width, |r| {
            // SAFETY: each row index is visited once; rows are disjoint ranges of `x`.
            let row = unsafe { std::slice::from_raw_parts_mut(ptr.get().add(r * width), width) };
            rms_norm_row_inplace(row, w, eps);
        });
    }

    fn rope(
        &self,
        x: &mut Vec<f32>,
        n_head: usize,
        head_dim: usize,
        positions: &[u32],
        p: &RopeParams,
    ) {
        let width = n_head * head_dim;
        let ptr = SyncPtr(x[..positions.len() * width].as_mut_ptr());
        // Per-thread cos/sin table, rebuilt per token (cheap next to the rotations' memory).
        self.rows_parallel_with(
            positions.len(),
            width,
            || vec![0f32; p.n_rot],
            |cache, t| {
                rope_cache(positions[t], p, cache);
                // SAFETY: each token row is visited once; rows are disjoint ranges of `x`.
                let row =
                    unsafe { std::slice::from_raw_parts_mut(ptr.get().add(t * width), width) };
                for h in 0..n_head {
                    let off = h * head_dim;
                    rope_head(&mut row[off..off + head_dim], cache, p.n_rot, p.neox);
                }
            },
        );
    }

    fn scale(&self, x: &mut Vec<f32>, len: usize, s: f32) {
        x[..len].iter_mut().for_each(|v| *v *= s);
    }

    fn add(&self, x: &mut Vec<f32>, y: &Vec<f32>, len: usize) {
        x[..len]
            .iter_mut()
            .zip(&y[..len])
            .for_each(|(a, b)| *a += b);
    }

    fn act_mul(&self, gate: &mut Vec<f32>, up: &Vec<f32>, len: usize, act: Activation) {
        let up = &up[..len];
        if len < 1 << 14 {
            // Decode-sized: a dispatch would cost more than the work.
            act_mul_slice(act, &mut gate[..len], up);
            return;
        }
        let ptr = SyncPtr(gate.as_mut_ptr());
        self.pool.run(|ti, nt| {
            let r = chunk(len, nt, ti);
            // SAFETY: each thread takes a disjoint range of `gate`.
            let ptr = &ptr; // capture the Sync wrapper, not its raw-pointer field
            let g = unsafe { std::slice::from_raw_parts_mut(ptr.0.add(r.start), r.len()) };
            act_mul_slice(act, g, &up[r]);
        });
    }

    fn softcap(&self, x: &mut Vec<f32>, len: usize, cap: f32) {
        x[..len]
            .iter_mut()
            .for_each(|v| *v = (*v / cap).tanh() * cap);
    }

    fn kv_store(
        &self,
        kv: &mut CpuKv,
        layer: usize,
        k: &Vec<f32>,
        v: &Vec<f32>,
        positions: &[u32],
    ) {
        let l = &mut kv.layers[layer];
        let (wk, wv) = (
            l.spec.n_head_kv * l.spec.head_dim_k,
            l.spec.n_head_kv * l.spec.head_dim_v,
        );
        for (t, &pos) in positions.iter().enumerate() {
            let s = pos as usize % l.spec.capacity;
            l.k.write(s * wk, &k[t * wk..(t + 1) * wk]);
            l.v.write(s * wv, &v[t * wv..(t + 1) * wv]);
        }
    }

    fn attention(
        &self,
        q: &Vec<f32>,
        kv: &CpuKv,
        layer: usize,
        positions: &[u32],
        p: &AttnParams,
        out: &mut Vec<f32>,
    ) {
        let l = &kv.layers[layer];
        let n = positions.len();
        // The blocked attention in the width of the selected kernel family (`VELA_KERNEL`).
        #[cfg(target_arch = "x86_64")]
        let isa = match matmul::Kernel::selected() {
            matmul::Kernel::Avx512 => Some(super::attn::Isa::Avx512),
            matmul::Kernel::Avx2 => Some(super::attn::Isa::Avx2),
            _ => None,
        };
        #[cfg(target_arch = "x86_64")]
        if let Some(isa) = isa.filter(|&isa| super::attn::supported(p, n, isa)) {
            let (k, v) = (&l.k, &l.v);
            let cap = l.spec.capacity;
            let w = l.spec.window;
            super::attn::attention(&self.pool, q, k, v, cap, w, positions, p, isa, out);
            return;
        }
        let group = p.n_head / p.n_head_kv;
        // Heads per task: all query heads of a KV head (each K/V row is converted once for them),
        // unless that leaves too few tasks to keep the threads busy (decode).
        let hpt = if n * p.n_head_kv >= 2 * self.pool.n_threads() {
            group
        } else {
            1
        };
        let tasks_per_token = p.n_head / hpt;
        let n_tasks = n * tasks_per_token;
        let out_ptr = SyncPtr(out.as_mut_ptr());
        let (dk, dv) = (p.head_dim_k, p.head_dim_v);
        self.pool.run(|ti, nt| {
            let out_ptr = &out_ptr;
            let max_keys = positions.iter().max().map(|&m| m as usize + 1).unwrap_or(0);
            let cap_keys = max_keys.min(l.spec.capacity).max(1);
            let mut scores = vec![0f32; hpt * cap_keys];
            let mut acc = vec![0f32; hpt * dv];
            let mut kf = vec![0f32; dk];
            let mut vf = vec![0f32; dv];
            let mut maxs = vec![0f32; hpt];
            // Interleaved, not contiguous: with causal masking later tokens have more keys.
            for task in (ti..n_tasks).step_by(nt) {
                let (t, h0) = (task / tasks_per_token, (task % tasks_per_token) * hpt);
                let g = h0 / group;
                let pos = positions[t] as usize;
                let first = crate::window_start(pos, p.window.or(l.spec.window));
                let nk = pos + 1 - first;
                debug_assert!(nk <= l.spec.capacity);
                maxs.iter_mut().for_each(|m| *m = f32::NEG_INFINITY);
                let cap = l.spec.capacity;
                let first_slot = first % cap;
                let mut slot = first_slot;
                for i in 0..nk {
                    let (s, at) = (slot, g * dk);
                    slot = if slot + 1 == cap { 0 } else { slot + 1 };
                    let krow: &[f32] = match &l.k {
                        KvData::F32(k) => k.get(s, at, dk),
                        KvData::F16(k) => {
                            simd::f16_to_f32(k.get(s, at, dk), &mut kf);
                            &kf
                        }
                        KvData::Bf16(k) => {
                            simd::bf16_to_f32(k.get(s, at, dk), &mut kf);
                            &kf
                        }
                    };
                    for hh in 0..hpt {
                        let qrow = &q[(t * p.n_head + h0 + hh) * dk..][..dk];
                        let mut d = simd::dot_f32(qrow, krow) * p.scale;
                        if let Some(c) = p.softcap {
                            d = (d / c).tanh() * c;
                        }
                        scores[hh * cap_keys + i] = d;
                        maxs[hh] = maxs[hh].max(d);
                    }
                }
                for hh in 0..hpt {
                    let sc = &mut scores[hh * cap_keys..hh * cap_keys + nk];
                    let sum = simd::exp_sub_sum(sc, maxs[hh]);
                    let inv = (1.0 / sum) as f32;
                    sc.iter_mut().for_each(|x| *x *= inv);
                }
                acc.iter_mut().for_each(|a| *a = 0.0);
                let mut slot = first_slot;
                for i in 0..nk {
                    let (s, at) = (slot, g * dv);
                    slot = if slot + 1 == cap { 0 } else { slot + 1 };
                    let vrow: &[f32] = match &l.v {
                        KvData::F32(v) => v.get(s, at, dv),
                        KvData::F16(v) => {
                            simd::f16_to_f32(v.get(s, at, dv), &mut vf);
                            &vf
                        }
                        KvData::Bf16(v) => {
                            simd::bf16_to_f32(v.get(s, at, dv), &mut vf);
                            &vf
                        }
                    };
                    for hh in 0..hpt {
                        simd::axpy_f32(
                            scores[hh * cap_keys + i],
                            vrow,
                            &mut acc[hh * dv..(hh + 1) * dv],
                        );
                    }
                }
                for hh in 0..hpt {
                    // SAFETY: each task writes its own disjoint head slices of `out`.
                    unsafe {
                        let dst = out_ptr.0.add((t * p.n_head + h0 + hh) * dv);
                        std::ptr::copy_nonoverlapping(acc.as_ptr().add(hh * dv), dst, dv);
                    }
                }
            }
        });
    }

    fn copy_rows(
        &self,
        src: &Vec<f32>,
        src_row: usize,
        n_rows: usize,
        width: usize,
        dst: &mut Vec<f32>,
        dst_row: usize,
    ) {
        dst[dst_row * width..(dst_row + n_rows) * width]
            .copy_from_slice(&src[src_row * width..(src_row + n_rows) * width]);
    }
}

#[cfg(test)]
#[path = "ops_tests.rs"]
mod tests;
