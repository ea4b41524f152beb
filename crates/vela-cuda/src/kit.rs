//! The model kit's generic ops on the GPU (kernels/kit.cu): softmax, sigmoid, elementwise
//! product, row gather / scatter-add, expert routing. Ids stay on the device throughout.

use crate::backend::CudaBackend;
use crate::device::Arg;
use crate::matmul::{MMQ_BLOCK, MM_WARPS};
use crate::weight::{ActKind, CudaBuf, CudaWeight};
use cudarc::driver::CudaSlice;
use vela_compute::{RouteParams, Score};

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

    pub(crate) fn act_mul_split_impl(
        &self,
        gu: &CudaBuf,
        n_rows: usize,
        width: usize,
        act: vela_compute::Activation,
        out: &mut CudaBuf,
    ) {
        let len = n_rows * width;
        assert!(
            gu.len() >= 2 * len && out.len() >= len,
            "act_mul_split: buffer too small"
        );
        let (kind, limit) = match act {
            vela_compute::Activation::Silu => (0, 0.0),
            vela_compute::Activation::GeluTanh => (1, 0.0),
            vela_compute::Activation::SiluLimit(l) => (2, l),
        };
        let args = [
            Arg::P(self.ptr(gu)),
            Arg::P(self.ptr(out)),
            Arg::L(width as i64),
            Arg::L(len as i64),
            Arg::I(kind),
            Arg::F(limit),
        ];
        self.launch_1d("kit_act_mul_split", len, &args);
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

    /// See `Backend::route`: `kit_route`, one warp per token.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn route_impl(
        &self,
        logits: &CudaBuf,
        n_tokens: usize,
        p: &RouteParams,
        bias: Option<&CudaSlice<f32>>,
        expert_scale: Option<&CudaSlice<f32>>,
        ids: &mut CudaSlice<u32>,
        weights: &mut CudaBuf,
    ) {
        check_route(p);
        let grouped = p.topk_group < p.n_group;
        assert!(
            !grouped || p.n_group <= 32,
            "route: at most 32 expert groups"
        );
        if n_tokens == 0 {
            return;
        }
        let (e_n, k) = (p.n_expert, p.k);
        assert!(
            logits.len() >= n_tokens * e_n
                && ids.len() >= n_tokens * k
                && weights.len() >= n_tokens * k,
            "route: buffers too small for {n_tokens} tokens"
        );
        assert!(bias.is_none_or(|b| b.len() >= e_n) && expert_scale.is_none_or(|b| b.len() >= e_n));
        let args = [
            Arg::P(self.ptr(logits)),
            Arg::I(e_n as i32),
            Arg::I(k as i32),
            Arg::I(score_code(p.score)),
            Arg::I(p.n_group as i32),
            Arg::I(p.topk_group.min(p.n_group) as i32),
            Arg::I(p.renorm as i32),
            Arg::F(p.renorm_eps()),
            Arg::F(p.scale),
            Arg::P(bias.map_or(0, |b| self.ptr(b))),
            Arg::P(expert_scale.map_or(0, |b| self.ptr(b))),
            Arg::P(self.ptr(ids)),
            Arg::P(self.ptr(weights)),
        ];
        self.launch("kit_route", (n_tokens as u32, 1, 1), 32, &args);
    }

    /// See `Backend::route_hash`: `kit_route_hash`, one warp per token.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn route_hash_impl(
        &self,
        logits: &CudaBuf,
        tokens: &CudaSlice<u32>,
        table: &CudaSlice<u32>,
        n_tokens: usize,
        p: &RouteParams,
        ids: &mut CudaSlice<u32>,
        weights: &mut CudaBuf,
    ) {
        check_route(p);
        if n_tokens == 0 {
            return;
        }
        let (e_n, k) = (p.n_expert, p.k);
        assert!(
            logits.len() >= n_tokens * e_n
                && tokens.len() >= n_tokens
                && ids.len() >= n_tokens * k
                && weights.len() >= n_tokens * k,
            "route_hash: buffers too small for {n_tokens} tokens"
        );
        let args = [
            Arg::P(self.ptr(logits)),
            Arg::P(self.ptr(tokens)),
            Arg::P(self.ptr(table)),
            Arg::L((table.len() / k) as i64),
            Arg::I(e_n as i32),
            Arg::I(k as i32),
            Arg::I(score_code(p.score)),
            Arg::I(p.renorm as i32),
            Arg::F(p.renorm_eps()),
            Arg::F(p.scale),
            Arg::P(self.ptr(ids)),
            Arg::P(self.ptr(weights)),
        ];
        self.launch("kit_route_hash", (n_tokens as u32, 1, 1), 32, &args);
    }
}

impl CudaBackend {
    /// See `Backend::matmul_experts`: the activations quantized once (Q8 / Q8_K, or f32 as
    /// is), then one `mme_*` launch (kernels/experts.cu): a warp per (expert row, slot), the
    /// expert id read on the device. From [`GROUP_MIN`] slots on (prompts, batches), quantized
    /// weights go through `experts_group` and `mmeg_*` instead: a warp per (expert row, group of
    /// up to 8 slots of that expert), each weight block decoded once for the group, the same
    /// bits; split-row Q4_0 on sm_80+ through `mmqe_q4_0s_*` (kernels/mmq.cu): the tensor-core
    /// product of the dense decode batches on groups of up to 64 slots, whose f32 sums run in
    /// another order (a slot's result is the same in any batch, not the per-slot kernel's bits).
    /// In exact mode `mmex_*`: f32 activations, f64 sums, as the ordinary product's
    /// `mmx_*` and the CPU's exact mode.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn matmul_experts_impl(
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
        let rpe = rows_per_expert;
        assert!(
            rpe > 0 && w.rows.is_multiple_of(rpe),
            "matmul_experts: {} rows are not experts of {rpe} rows",
            w.rows
        );
        // Row blocks of MM_WARPS rows go in grid.y (at most 65,535).
        assert!(
            rpe.div_ceil(MM_WARPS as usize) <= 65_535,
            "matmul_experts: {rpe} rows per expert"
        );
        let n_slots = n_tokens * k;
        if n_slots == 0 {
            return;
        }
        let x_rows = if x_per_slot { n_slots } else { n_tokens };
        assert!(
            ids.len() >= n_slots && x.len() >= x_rows * w.cols && y.len() >= n_slots * rpe,
            "matmul_experts: buffers too small for {n_tokens} tokens x {k} slots"
        );
        let (suffix, kind) = w.info();
        let grid = (n_slots as u32, (rpe as u32).div_ceil(MM_WARPS), 1);
        if self.tune.exact() {
            let args = [
                Arg::P(self.ptr(&w.data)),
                Arg::P(self.ptr(ids)),
                Arg::P(self.ptr(x)),
                Arg::P(self.ptr(&*y)),
                Arg::I(rpe as i32),
                Arg::I(w.cols as i32),
                Arg::L(w.row_bytes as i64),
                Arg::I((w.rows / rpe) as i32),
                Arg::I(k as i32),
                Arg::I(x_per_slot as i32),
            ];
            self.launch(&format!("mmex_{suffix}"), grid, 32 * MM_WARPS, &args);
            return;
        }
        let mut sc = self.scratch();
        let (xp, nb) = match kind {
            ActKind::Float => (self.ptr(x), w.cols),
            _ => self.quantize_act(&mut sc, kind, x, x_rows, w.cols),
        };
        let n_exp = w.rows / rpe;
        if n_slots >= GROUP_MIN && kind != ActKind::Float && n_exp <= MAX_EXPERTS {
            // Split-row Q4_0 on sm_80+: the tensor-core products (mmqe_q4_0s_NT), groups of
            // 8 NT slots sized to the slots an expert gets on average; otherwise mmeg_*.
            let mma_nt = (self.arch() >= 80 && suffix == "q4_0s")
                .then(|| crate::matmul::mmq_tiles(n_slots.div_ceil(n_exp), 8));
            let gs = mma_nt.map_or(MEG, |nt| 8 * nt);
            // Groups: at most one partial group per expert (and the invalid ids' own).
            let max_groups = n_slots.div_ceil(gs) + n_slots.min(n_exp + 1);
            let mut grp = self.expert_groups.lock().unwrap_or_else(|e| e.into_inner());
            let need = 4 + n_slots + 3 * max_groups;
            if grp.len() < need {
                self.flush_recording();
                *grp = self
                    .dev
                    .stream
                    .alloc_zeros::<u32>(need.next_power_of_two())
                    .expect("CUDA alloc of the expert groups");
                self.scratch_moved();
            }
            let gp = self.ptr(&*grp);
            let args = [
                Arg::P(self.ptr(ids)),
                Arg::I(n_slots as i32),
                Arg::I(n_exp as i32),
                Arg::I(gs as i32),
                Arg::P(gp),
            ];
            self.launch("experts_group", (1, 1, 1), 1024, &args);
            if let Some(nt) = mma_nt {
                // The slots' activations in fragment order, tiles by group (act_mma_e).
                let n_tiles = max_groups * nt;
                let quants = nb * n_tiles * 256;
                let base = self.mma_scratch(&mut sc, quants + nb * n_tiles * 64);
                let args = [
                    Arg::P(xp),
                    Arg::P(base),
                    Arg::P(base + quants as u64),
                    Arg::I(nb as i32),
                    Arg::I(n_tiles as i32),
                    Arg::I(nt as i32),
                    Arg::P(gp),
                    Arg::I(n_slots as i32),
                    Arg::I(k as i32),
                    Arg::I(x_per_slot as i32),
                ];
                let grid = (((nb * n_tiles) as u32).div_ceil(8), 1, 1);
                self.launch("act_mma_e", grid, 256, &args);
                let args = [
                    Arg::P(self.ptr(&w.data)),
                    Arg::P(gp),
                    Arg::P(base),
                    Arg::P(base + quants as u64),
                    Arg::P(self.ptr(&*y)),
                    Arg::I(rpe as i32),
                    Arg::I(nb as i32),
                    Arg::I(n_exp as i32),
                    Arg::I(n_tiles as i32),
                    Arg::I(n_slots as i32),
                ];
                let grid = ((rpe as u32).div_ceil(16), max_groups as u32, 1);
                self.launch(&format!("mmqe_q4_0s_{nt}"), grid, MMQ_BLOCK, &args);
                return;
            }
            let args = [
                Arg::P(self.ptr(&w.data)),
                Arg::P(gp),
                Arg::P(xp),
                Arg::P(self.ptr(&*y)),
                Arg::I(rpe as i32),
                Arg::I(nb as i32),
                Arg::I(n_exp as i32),
                Arg::I(k as i32),
                Arg::I(x_per_slot as i32),
                Arg::I(n_slots as i32),
            ];
            let grid = (max_groups as u32, (rpe as u32).div_ceil(MM_WARPS), 1);
            self.launch(&format!("mmeg_{suffix}"), grid, 32 * MM_WARPS, &args);
            return;
        }
        let args = [
            Arg::P(self.ptr(&w.data)),
            Arg::P(self.ptr(ids)),
            Arg::P(xp),
            Arg::P(self.ptr(&*y)),
            Arg::I(rpe as i32),
            Arg::I(nb as i32),
            Arg::I(n_exp as i32),
            Arg::I(k as i32),
            Arg::I(x_per_slot as i32),
        ];
        self.launch(&format!("mme_{suffix}"), grid, 32 * MM_WARPS, &args);
    }
}

/// Slots from which expert products go through the grouped kernels, and their group size
/// (`MEG` in kernels/experts.cu).
const GROUP_MIN: usize = 32;
const MEG: usize = 8;

/// Experts and slots the routing kernels hold (`KIT_MAX_EXPERTS`, `KIT_MAX_K` in kit.cu).
const MAX_EXPERTS: usize = 1024;
const MAX_K: usize = 32;

/// The routing settings the kernels take (the CPU's checks plus their limits).
fn check_route(p: &RouteParams) {
    assert!(
        p.k >= 1 && p.k <= p.n_expert && p.k <= MAX_K && p.n_expert <= MAX_EXPERTS,
        "route: k = {} of {} experts (the CUDA kernels take up to {MAX_K} of {MAX_EXPERTS})",
        p.k,
        p.n_expert
    );
    assert!(
        p.n_group >= 1 && p.n_expert.is_multiple_of(p.n_group),
        "route: {} groups do not divide {} experts",
        p.n_group,
        p.n_expert
    );
}

/// The kernels' score code.
fn score_code(s: Score) -> i32 {
    match s {
        Score::Softmax => 0,
        Score::Sigmoid => 1,
        Score::SqrtSoftplus => 2,
    }
}
