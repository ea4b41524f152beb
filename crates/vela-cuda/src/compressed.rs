//! DeepSeek V4's ops on the GPU (kernels/compressed.cu): mHC mixing, trailing interleaved
//! rotation, the compressors' pooling, the Lightning indexer and attention with sinks. The
//! semantics are `vela_compute::Backend`'s; the CPU backend is the reference.

use crate::backend::CudaBackend;
use crate::device::Arg;
use crate::sparse;
use crate::weight::CudaBuf;
use cudarc::driver::CudaSlice;
use vela_compute::{Backend, LightningParams};

/// Most streams `dsv4_mhc_expand` holds per thread.
const MAX_STREAMS: usize = 16;

/// Queries per launch of the sink attention's parts (bounds their scratch).
const SINK_ROWS: usize = 8;

impl CudaBackend {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn mhc_weights_impl(
        &self,
        mix: &mut CudaBuf,
        base: &CudaSlice<f32>,
        scale: [f32; 3],
        n: usize,
        s: usize,
        iters: usize,
        eps: f32,
        head: bool,
    ) {
        let stride = if head { s } else { (2 + s) * s };
        assert!(
            mix.len() >= n * stride && base.len() >= stride,
            "mhc_weights: buffer too small"
        );
        let args = [
            Arg::P(self.ptr(mix)),
            Arg::P(self.ptr(base)),
            Arg::F(scale[0]),
            Arg::F(scale[1]),
            Arg::F(scale[2]),
            Arg::I(n as i32),
            Arg::I(s as i32),
            Arg::I(iters as i32),
            Arg::F(eps),
            Arg::I(head as i32),
        ];
        self.launch_1d("dsv4_mhc_weights", n, &args);
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn mhc_collapse_impl(
        &self,
        x: &CudaBuf,
        w: &CudaBuf,
        stride: usize,
        n: usize,
        s: usize,
        width: usize,
        out: &mut CudaBuf,
    ) {
        let total = n * width;
        assert!(
            x.len() >= total * s && w.len() >= n * stride && out.len() >= total,
            "mhc_collapse: buffer too small"
        );
        let args = [
            Arg::P(self.ptr(x)),
            Arg::P(self.ptr(w)),
            Arg::I(stride as i32),
            Arg::I(s as i32),
            Arg::I(width as i32),
            Arg::L(total as i64),
            Arg::P(self.ptr(out)),
        ];
        self.launch_1d("dsv4_mhc_collapse", total, &args);
    }

    pub(crate) fn mhc_expand_impl(
        &self,
        x: &mut CudaBuf,
        w: &CudaBuf,
        y: &CudaBuf,
        n: usize,
        s: usize,
        width: usize,
    ) {
        assert!(
            s <= MAX_STREAMS,
            "mhc_expand: at most {MAX_STREAMS} streams"
        );
        let total = n * width;
        assert!(
            x.len() >= total * s && w.len() >= n * (2 + s) * s && y.len() >= total,
            "mhc_expand: buffer too small"
        );
        let args = [
            Arg::P(self.ptr(x)),
            Arg::P(self.ptr(w)),
            Arg::P(self.ptr(y)),
            Arg::I(s as i32),
            Arg::I(width as i32),
            Arg::L(total as i64),
        ];
        self.launch_1d("dsv4_mhc_expand", total, &args);
    }

    pub(crate) fn rope_trailing_impl(
        &self,
        x: &mut CudaBuf,
        n_head: usize,
        hd: usize,
        positions: &[u32],
        inv_freq: &[f32],
        inverse: bool,
    ) {
        let np = inv_freq.len();
        if positions.is_empty() || np == 0 {
            return;
        }
        assert!(
            2 * np <= hd && x.len() >= positions.len() * n_head * hd,
            "rope_trailing: buffer too small"
        );
        let mut pos = self.alloc_ids(positions.len());
        self.write_ids(&mut pos, positions);
        let mut inv = self.alloc(np);
        self.write(&mut inv, inv_freq);
        let total = positions.len() * n_head * np;
        let args = [
            Arg::P(self.ptr(x)),
            Arg::P(self.ptr(&pos)),
            Arg::P(self.ptr(&inv)),
            Arg::I(n_head as i32),
            Arg::I(hd as i32),
            Arg::I(np as i32),
            Arg::F(if inverse { -1.0 } else { 1.0 }),
            Arg::L(total as i64),
        ];
        self.launch_1d("dsv4_rope_trailing", total, &args);
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn compress_pool_impl(
        &self,
        raw: &CudaBuf,
        raw_slots: usize,
        raw_width: usize,
        d: usize,
        ape: &CudaSlice<f32>,
        m: usize,
        overlap: bool,
        first: usize,
        n_windows: usize,
        out: &mut CudaBuf,
    ) {
        let half = if overlap { 2 * d } else { d };
        assert!(
            raw_width >= 2 * half
                && raw.len() >= raw_slots * raw_width
                && ape.len() >= m * half
                && out.len() >= n_windows * d,
            "compress_pool: buffer too small"
        );
        let args = [
            Arg::P(self.ptr(raw)),
            Arg::I(raw_slots as i32),
            Arg::I(raw_width as i32),
            Arg::I(d as i32),
            Arg::P(self.ptr(ape)),
            Arg::I(m as i32),
            Arg::I(overlap as i32),
            Arg::I(first as i32),
            Arg::I(n_windows as i32),
            Arg::P(self.ptr(out)),
        ];
        self.launch_1d("dsv4_compress_pool", n_windows * d, &args);
    }

    /// [`vela_compute::Backend::compress_pool_at`]: one launch whose rows find their windows
    /// from the positions on the device (the step's `io` slot while one is recorded).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn compress_pool_at_impl(
        &self,
        raw: &CudaBuf,
        (raw_slots, raw_width): (usize, usize),
        d: usize,
        ape: &CudaSlice<f32>,
        (m, overlap): (usize, bool),
        positions: &[u32],
        rows: &mut CudaBuf,
    ) {
        let n = positions.len();
        if n == 0 || d == 0 {
            return;
        }
        let half = if overlap { 2 * d } else { d };
        let last = *positions.iter().max().unwrap_or(&0) as usize;
        assert!(
            m >= 1
                && raw_width >= 2 * half
                && raw.len() >= raw_slots * raw_width
                && ape.len() >= m * half
                && rows.len() >= (last + 1) / m * d,
            "compress_pool_at: buffer too small"
        );
        let mut sc = self.scratch();
        let pp = self.positions(&mut sc, positions);
        drop(sc);
        let args = [
            Arg::P(self.ptr(raw)),
            Arg::I(raw_slots as i32),
            Arg::I(raw_width as i32),
            Arg::I(d as i32),
            Arg::P(self.ptr(ape)),
            Arg::I(m as i32),
            Arg::I(overlap as i32),
            Arg::P(pp),
            Arg::I(n as i32),
            Arg::P(self.ptr(rows)),
        ];
        self.launch_1d("dsv4_compress_pool_at", n * d, &args);
    }

    /// The scores of every visible entry into the backend's scratch (rows of a power-of-two
    /// stride of at least 1024 entries), then the selection; positions through
    /// [`CudaBackend::positions`]. A decode step's launches change only where the stride
    /// doubles.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn lightning_select_impl(
        &self,
        q: &CudaBuf,
        w: &CudaBuf,
        keys: &CudaBuf,
        positions: &[u32],
        p: &LightningParams,
        sel: &mut CudaSlice<u32>,
        counts: &mut CudaSlice<u32>,
    ) {
        let n = positions.len();
        if n == 0 {
            return;
        }
        assert!(
            q.len() >= n * p.n_head * p.head_dim
                && w.len() >= n * p.n_head
                && sel.len() >= n * p.width()
                && counts.len() >= n,
            "lightning_select: buffer too small"
        );
        let max_pos = *positions.iter().max().unwrap_or(&0) as usize;
        let stride = ((max_pos + 1) / p.ratio)
            .max(1)
            .next_power_of_two()
            .max(1024);
        let scores = self.grown_zeroed(&self.sparse_scores, n * stride, "lightning scores");
        let mut sc = self.scratch();
        let pos = self.positions(&mut sc, positions);
        drop(sc);
        let args = [
            Arg::P(self.ptr(q)),
            Arg::P(self.ptr(w)),
            Arg::P(self.ptr(keys)),
            Arg::P(pos),
            Arg::I(p.n_head as i32),
            Arg::I(p.head_dim as i32),
            Arg::I(p.ratio as i32),
            Arg::F(p.scale),
            Arg::I(stride as i32),
            Arg::P(scores),
        ];
        // LSC_PER_BLOCK entries a block (kernels/compressed.cu).
        let tiles = stride.div_ceil(64) as u32;
        self.launch("dsv4_lightning_scores", (n as u32, tiles, 1), 256, &args);
        let args = [
            Arg::P(scores),
            Arg::P(pos),
            Arg::I(p.ratio as i32),
            Arg::I(p.top_k as i32),
            Arg::I(stride as i32),
            Arg::I(p.expand as i32),
            Arg::P(self.ptr(sel)),
            Arg::P(self.ptr(counts)),
        ];
        self.launch("dsv4_lightning_select", (n as u32, 1, 1), 512, &args);
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attention_sink_impl(
        &self,
        q: &CudaBuf,
        a: (&CudaBuf, &CudaSlice<u32>, &CudaSlice<u32>, usize),
        b: (&CudaBuf, &CudaSlice<u32>, &CudaSlice<u32>, usize),
        sinks: &CudaSlice<f32>,
        n: usize,
        nh: usize,
        hd: usize,
        scale: f32,
        out: &mut CudaBuf,
    ) {
        const THREADS: usize = 256;
        assert!(
            hd <= 4 * THREADS,
            "attention_sink: head width at most {}",
            4 * THREADS
        );
        assert!(
            q.len() >= n * nh * hd
                && out.len() >= n * nh * hd
                && sinks.len() >= nh
                && a.1.len() >= n * a.3
                && b.1.len() >= n * b.3,
            "attention_sink: buffer too small"
        );
        if n == 0 {
            return;
        }
        if self.tune.exact() || !sparse::fast_attention(hd) {
            let args = [
                Arg::P(self.ptr(q)),
                Arg::P(self.ptr(a.0)),
                Arg::P(self.ptr(a.1)),
                Arg::P(self.ptr(a.2)),
                Arg::I(a.3 as i32),
                Arg::P(self.ptr(b.0)),
                Arg::P(self.ptr(b.1)),
                Arg::P(self.ptr(b.2)),
                Arg::I(b.3 as i32),
                Arg::P(self.ptr(sinks)),
                Arg::I(nh as i32),
                Arg::I(hd as i32),
                Arg::F(scale),
                Arg::P(self.ptr(out)),
            ];
            self.launch(
                "dsv4_attention_sink",
                (n as u32, nh as u32, 1),
                THREADS as u32,
                &args,
            );
            return;
        }
        // In parts of `sparse::PART` rows and groups of heads that share each row read
        // (`dsv4_attn_sink_part`, whose body is GLM's sparse attention's), merged with the sink
        // by `dsv4_attn_sink_combine`: one block per (query, head) left a decode step with 64
        // blocks, each reading every row again. The grid depends on the selections' widths,
        // not on their counts. Exact mode keeps the one-block kernel.
        let parts = (a.3 + b.3).div_ceil(sparse::PART).max(1);
        let gs = sparse::head_group(nh, hd);
        let groups = nh.div_ceil(gs);
        let (acc, ml) = self.attn_parts_scratch(n.min(SINK_ROWS), nh, parts, hd);
        for t0 in (0..n).step_by(SINK_ROWS) {
            let m = SINK_ROWS.min(n - t0);
            let (qo, co) = ((t0 * nh * hd * 4) as u64, (t0 * 4) as u64);
            let args = [
                Arg::P(self.ptr(q) + qo),
                Arg::P(self.ptr(a.0)),
                Arg::P(self.ptr(a.1) + (t0 * a.3 * 4) as u64),
                Arg::P(self.ptr(a.2) + co),
                Arg::I(a.3 as i32),
                Arg::P(self.ptr(b.0)),
                Arg::P(self.ptr(b.1) + (t0 * b.3 * 4) as u64),
                Arg::P(self.ptr(b.2) + co),
                Arg::I(b.3 as i32),
                Arg::I(nh as i32),
                Arg::I(hd as i32),
                Arg::F(scale),
                Arg::I(parts as i32),
                Arg::I(gs as i32),
                Arg::P(acc),
                Arg::P(ml),
            ];
            let grid = (parts as u32, groups as u32, m as u32);
            self.launch("dsv4_attn_sink_part", grid, 256, &args);
            let args = [
                Arg::P(acc),
                Arg::P(ml),
                Arg::P(self.ptr(a.2) + co),
                Arg::P(self.ptr(b.2) + co),
                Arg::P(self.ptr(sinks)),
                Arg::I(nh as i32),
                Arg::I(hd as i32),
                Arg::I(parts as i32),
                Arg::P(self.ptr(&*out) + qo),
            ];
            self.launch(
                "dsv4_attn_sink_combine",
                (nh as u32, m as u32, 1),
                128,
                &args,
            );
        }
    }

    /// `act_mul` with DeepSeek V4's limit.
    pub(crate) fn act_mul_limit_impl(&self, gate: &mut CudaBuf, up: &CudaBuf, len: usize, l: f32) {
        let args = [
            Arg::P(self.ptr(gate)),
            Arg::P(self.ptr(up)),
            Arg::L(len as i64),
            Arg::F(l),
        ];
        self.launch_1d("dsv4_act_mul_silu_limit", len, &args);
    }
}
