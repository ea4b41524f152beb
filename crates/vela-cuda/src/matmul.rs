//! Matrix products of the CUDA backend: quantized activations + integer block dots (default),
//! the exact f32/f64 mode, the one-token `mv_*` kernels, and the fused pre-norm input
//! (`x += residual; h = rms_norm(x) * w; quantize(h)` in one kernel, then the products).

use crate::backend::{CudaBackend, Scratch};
use crate::device::Arg;
use crate::kv::CudaKv;
use crate::weight::{ActKind, CudaBuf, CudaWeight};
use cudarc::driver::CudaSlice;
use vela_compute::{Activation, AttnParams, Backend};

/// Bytes of the GPU activation block layouts (`struct AQ8` / `AQ8K` in `kernels/quant.cu`).
const AQ8_BYTES: usize = 48;
const AQ8K_BYTES: usize = 304;
/// Warps (weight rows) per matmul thread block (`WARPS` in quant.cu).
pub(crate) const MM_WARPS: u32 = 4;

/// Warps per block of the several-token tensor-core products (`MMQ_WARPS` in kernels/mmq.cu).
const MMQ_WARPS: u32 = 4;

/// Most tokens whose products take the several-token tensor-core kernels rather than cuBLAS
/// (decode steps of up to this many sequences).
pub(crate) const MMQ_MAX: usize = 64;

/// Threads per block of the tensor-core products.
pub(crate) const MMQ_BLOCK: u32 = 32 * MMQ_WARPS;

/// Whether a product of `n` tokens with weights of kernel suffix `suffix` runs `mmq_*` on a
/// device of compute capability `arch` (`mma.sync` with s8 operands: sm_80+): split-row Q4_0
/// (the Q4_0 models' layers) and Q6_K (their LM heads).
pub(crate) fn mmq_applies(arch: u32, suffix: &str, n: usize) -> bool {
    arch >= 80 && (2..=MMQ_MAX).contains(&n) && matches!(suffix, "q4_0s" | "q6_ks")
}

/// Tiles of 8 tokens per block of the tensor-core products (`NT` of kernels/mmq.cu) for `n`
/// tokens (or slots per expert): the fewest that hold them, at most `max`.
pub(crate) fn mmq_tiles(n: usize, max: usize) -> usize {
    match n.div_ceil(8) {
        0..=1 => 1,
        2 => 2,
        3..=4 => 4,
        _ => 8,
    }
    .min(max)
}

/// Row groups per warp of `mv_q8_0_r2n` (`MV32_NARROW_G` in kernels/matvec.cu).
const MV_NARROW_G: u32 = 4;

/// One-token float products with at most this many rows (and rows of at least 1024 columns)
/// run a block per row (`mm_f32_b1`): one warp per row would leave most SMs idle.
const ROW_BLOCK_ROWS: usize = 2048;

impl CudaBackend {
    /// `ys[i] = x · ws[i]ᵀ`. The activations are quantized once for all weights that share their
    /// block type and width (Q/K/V, gate/up); `pre` names activations already quantized (by
    /// `norm_q8*`) as (kind, width, device address, blocks per row).
    pub(crate) fn matmul_many_impl(
        &self,
        ws: &[&CudaWeight],
        x: &CudaBuf,
        n: usize,
        ys: &mut [&mut CudaBuf],
        pre: Option<(ActKind, usize, u64, usize)>,
    ) {
        assert_eq!(
            ws.len(),
            ys.len(),
            "matmul_many: {} weights, {} outputs",
            ws.len(),
            ys.len()
        );
        if n == 0 {
            return;
        }
        if self.tune.exact() {
            for (w, y) in ws.iter().zip(ys.iter_mut()) {
                self.matmul_exact(w, x, n, y);
            }
            return;
        }
        if pre.is_none() && self.use_gemm(n, ws) {
            match self.matmul_gemm(ws, x, n, ys) {
                Ok(()) => return,
                // A cuBLAS failure (e.g. its workspace allocation) is not fatal: say so once,
                // turn the path off and compute every product with the integer kernels below.
                Err(e) => {
                    eprintln!("vela-cuda: cuBLAS product failed, using the integer kernels: {e:#}");
                    self.set_gemm_min(0);
                }
            }
        }
        let mut sc = self.scratch();
        // (activation kind, width) of the activations currently in the scratch buffer.
        let mut quantized = pre;
        // The quantized activations last put in fragment order (`act_mma`).
        let mut mma_src = None;
        if self.try_mv3(&mut sc, ws, x, n, ys, quantized, &[]) {
            return;
        }
        let done = if n == 1 && ws.len() >= 2 {
            self.mv3_groups(&mut sc, ws, x, ys, &mut quantized)
        } else {
            vec![false; ws.len()]
        };
        for ((w, y), _) in ws.iter().zip(ys.iter_mut()).zip(&done).filter(|(_, &d)| !d) {
            if w.rows == 0 {
                continue;
            }
            check_product(w, x, y, n);
            let (suffix, kind) = w.info();
            let (xp, nb) = match kind {
                ActKind::Float => (self.ptr(x), w.cols),
                ActKind::Q8 | ActKind::Q8K => match quantized {
                    Some((k, c, p, nb)) if k == kind && c == w.cols => (p, nb),
                    _ => {
                        let r = self.quantize_act(&mut sc, kind, x, n, w.cols);
                        quantized = Some((kind, w.cols, r.0, r.1));
                        mma_src = None;
                        r
                    }
                },
            };
            if mmq_applies(self.arch(), suffix, n) {
                // The decode rows of a batched step: tensor-core products reading the weights
                // once per 64 (Q4_0) or 32 (Q6_K) tokens, from activations in fragment order.
                let q6 = suffix == "q6_ks";
                let nt = mmq_tiles(n, if q6 { 4 } else { 8 });
                // Tiles in fragment order: whole grid rows of `nt` (the last ones zeros).
                let n_tiles = n.div_ceil(8 * nt) * nt;
                if mma_src != Some((xp, n_tiles)) {
                    self.act_mma(&mut sc, kind, xp, nb, n, n_tiles);
                    mma_src = Some((xp, n_tiles));
                }
                let base = self.ptr(&sc.mma);
                let grid = ((w.rows as u32).div_ceil(16), (n_tiles / nt) as u32, 1);
                let args = [
                    Arg::P(self.ptr(&w.data)),
                    Arg::P(base),
                    Arg::P(base + (nb * n_tiles * 256 * if q6 { 8 } else { 1 }) as u64),
                    Arg::P(self.ptr(&**y)),
                    Arg::I(w.rows as i32),
                    Arg::I(nb as i32),
                    Arg::I(n as i32),
                    Arg::I(n_tiles as i32),
                ];
                self.launch(&format!("mmq_{suffix}_{nt}"), grid, MMQ_BLOCK, &args);
                continue;
            }
            if n == 1 && kind != ActKind::Float {
                let r = self.mv_rows(w.rows);
                let mut grid = ((w.rows as u32).div_ceil(MM_WARPS * r), 1, 1);
                // Narrow Q8_0 rows (the small models' LM heads): several row pairs per warp
                // (`mv_q8_0_r2n`).
                let narrow = suffix == "q8_0" && r == 2 && nb <= 64;
                if narrow {
                    grid.0 = (w.rows as u32).div_ceil(MM_WARPS * 2 * MV_NARROW_G);
                }
                let args = [
                    Arg::P(self.ptr(&w.data)),
                    Arg::P(xp),
                    Arg::P(self.ptr(&**y)),
                    Arg::I(w.rows as i32),
                    Arg::I(nb as i32),
                    Arg::I(MV_SPLIT),
                ];
                let name = match r {
                    _ if narrow => "mv_q8_0_r2n".to_string(),
                    2 => format!("mv_{suffix}_r2"),
                    _ => format!("mv_{suffix}"),
                };
                let wr = vec![(self.ptr(&w.data), w.data.len() as u64)];
                self.launch_w(&name, grid, 32 * MM_WARPS, &args, wr);
                continue;
            }
            let args = [
                Arg::P(self.ptr(&w.data)),
                Arg::P(xp),
                Arg::P(self.ptr(&**y)),
                Arg::I(w.rows as i32),
                Arg::I(nb as i32),
                Arg::I(n as i32),
            ];
            if n == 1 && kind == ActKind::Float && w.rows <= ROW_BLOCK_ROWS && w.cols >= 1024 {
                let grid = (w.rows as u32, 1, 1);
                self.launch(&format!("mm_{suffix}_b1"), grid, 256, &args);
                continue;
            }
            let tt = if n == 1 { 1 } else { 8 };
            let grid = ((w.rows as u32).div_ceil(MM_WARPS), n.div_ceil(tt) as u32, 1);
            self.launch(&format!("mm_{suffix}_t{tt}"), grid, 32 * MM_WARPS, &args);
        }
    }

    /// One-token products of several weights that `try_mv3` did not take at once (more than
    /// three, or of different activation kinds): those sharing an activation kind and width in
    /// `mv_*_x3` launches of two or three, their activations quantized once (left in
    /// `quantized`). Returns which products are done.
    fn mv3_groups(
        &self,
        sc: &mut Scratch,
        ws: &[&CudaWeight],
        x: &CudaBuf,
        ys: &mut [&mut CudaBuf],
        quantized: &mut Option<(ActKind, usize, u64, usize)>,
    ) -> Vec<bool> {
        let mut done = vec![false; ws.len()];
        for i in 0..ws.len() {
            let (kind, cols) = (ws[i].info().1, ws[i].cols);
            if done[i] || kind == ActKind::Float {
                continue;
            }
            let group: Vec<usize> = (i..ws.len())
                .filter(|&j| !done[j] && ws[j].info().1 == kind && ws[j].cols == cols)
                .collect();
            if group.len() < 2 {
                continue;
            }
            if !matches!(*quantized, Some((k, c, ..)) if k == kind && c == cols) {
                let r = self.quantize_act(sc, kind, x, 1, cols);
                *quantized = Some((kind, cols, r.0, r.1));
            }
            for chunk in group.chunks(3).filter(|c| c.len() >= 2) {
                let cw: Vec<&CudaWeight> = chunk.iter().map(|&j| ws[j]).collect();
                let ok = match *chunk {
                    [a, b] => {
                        let [ya, yb] = ys.get_disjoint_mut([a, b]).expect("distinct");
                        let mut cy = [&mut **ya, &mut **yb];
                        self.try_mv3(sc, &cw, x, 1, &mut cy, *quantized, &[])
                    }
                    [a, b, c] => {
                        let [ya, yb, yc] = ys.get_disjoint_mut([a, b, c]).expect("distinct");
                        let mut cy = [&mut **ya, &mut **yb, &mut **yc];
                        self.try_mv3(sc, &cw, x, 1, &mut cy, *quantized, &[])
                    }
                    _ => false,
                };
                if ok {
                    chunk.iter().for_each(|&j| done[j] = true);
                }
            }
        }
        done
    }

    /// Put `n` rows of `nb` quantized activation blocks (`kind`: AQ8 or AQ8K) at device address
    /// `x` in the tensor-core products' fragment order (`act_mma` / `act_mma_k` in
    /// kernels/mmq.cu) in the `mma` scratch buffer: per block the quants of `n_tiles` tiles of 8
    /// tokens (256 bytes each per 32 elements), then the scales (and AQ8's sums).
    fn act_mma(
        &self,
        sc: &mut Scratch,
        kind: ActKind,
        x: u64,
        nb: usize,
        n: usize,
        n_tiles: usize,
    ) {
        let (quants, rest, name, warps) = if kind == ActKind::Q8K {
            (
                nb * n_tiles * 2048,
                nb * n_tiles * 32,
                "act_mma_k",
                nb * 16 * n_tiles,
            )
        } else {
            (
                nb * n_tiles * 256,
                nb * n_tiles * 64,
                "act_mma",
                nb * n_tiles,
            )
        };
        let base = self.mma_scratch(sc, quants + rest);
        let args = [
            Arg::P(x),
            Arg::P(base),
            Arg::P(base + quants as u64),
            Arg::I(nb as i32),
            Arg::I(n as i32),
            Arg::I(n_tiles as i32),
        ];
        self.launch(name, ((warps as u32).div_ceil(8), 1, 1), 256, &args);
    }

    /// The `mma` scratch buffer, grown to at least `bytes`: its device address.
    pub(crate) fn mma_scratch(&self, sc: &mut Scratch, bytes: usize) -> u64 {
        if sc.mma.len() < bytes {
            self.flush_recording();
            sc.mma = self
                .dev
                .stream
                .alloc_zeros::<u8>(bytes.next_power_of_two())
                .expect("CUDA alloc of activation scratch");
            self.scratch_moved();
        }
        self.ptr(&sc.mma)
    }

    /// Quantize `n` rows of `cols` activations into the scratch buffer as Q8 (32) or Q8_K (256)
    /// blocks; returns the device pointer and the number of blocks per row.
    pub(crate) fn quantize_act(
        &self,
        sc: &mut Scratch,
        kind: ActKind,
        x: &CudaBuf,
        n: usize,
        cols: usize,
    ) -> (u64, usize) {
        let (bs, bb, qname) = if kind == ActKind::Q8 {
            (32, AQ8_BYTES, "quantize_q8")
        } else {
            (256, AQ8K_BYTES, "quantize_q8k")
        };
        let n_blocks = n * cols / bs;
        if sc.act.len() < n_blocks * bb {
            self.flush_recording();
            sc.act = self
                .dev
                .stream
                .alloc_zeros::<u8>((n_blocks * bb).next_power_of_two())
                .expect("CUDA alloc of activation scratch");
            self.scratch_moved();
        }
        let ap = self.ptr(&sc.act);
        let args = [Arg::P(self.ptr(x)), Arg::P(ap), Arg::I(n_blocks as i32)];
        self.launch(qname, (n_blocks.div_ceil(8) as u32, 1, 1), 256, &args);
        (ap, cols / bs)
    }

    /// Exact-mode product (see `mmx` in quant.cu): f32 weights and activations, f64 sums.
    fn matmul_exact(&self, w: &CudaWeight, x: &CudaBuf, n: usize, y: &mut CudaBuf) {
        if w.rows == 0 {
            return;
        }
        check_product(w, x, y, n);
        let (suffix, _) = w.info();
        let args = [
            Arg::P(self.ptr(&w.data)),
            Arg::P(self.ptr(x)),
            Arg::P(self.ptr(y)),
            Arg::I(w.rows as i32),
            Arg::I(w.cols as i32),
            Arg::L(w.row_bytes as i64),
            Arg::I(n as i32),
        ];
        let grid = ((w.rows as u32).div_ceil(MM_WARPS), n.div_ceil(8) as u32, 1);
        self.launch(&format!("mmx_{suffix}"), grid, 32 * MM_WARPS, &args);
    }

    /// See `Backend::norm_matmul_many`: one `norm_q8`/`norm_q8k` launch replaces add, rms_norm
    /// and the activation quantization when every weight takes the same quantized activations
    /// of width `width` (and the mode is not exact); otherwise the unfused ops. `biases` (empty,
    /// or one per weight): added to the products' rows.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn norm_matmul_impl(
        &self,
        x: &mut CudaBuf,
        residual: Option<&CudaBuf>,
        post: Option<(&CudaSlice<f32>, f32)>,
        w: &CudaSlice<f32>,
        n_rows: usize,
        width: usize,
        eps: f32,
        h: &mut CudaBuf,
        ws: &[&CudaWeight],
        ys: &mut [&mut CudaBuf],
        biases: &[Option<&CudaSlice<f32>>],
    ) {
        let kind = self.norm_fusable(ws, n_rows, width);
        let Some(kind) = kind else {
            assert!(
                post.is_none(),
                "norm_matmul_impl: post norm without the fused kernel"
            );
            if let Some(r) = residual {
                self.add(x, r, n_rows * width);
            }
            self.rms_norm(x, w, n_rows, width, eps, h);
            self.matmul_many(ws, h, n_rows, ys);
            self.add_biases(biases, n_rows, ys);
            return;
        };
        assert!(
            x.len() >= n_rows * width && h.len() >= n_rows * width,
            "norm_matmul_many: buffers shorter than {n_rows}x{width}"
        );
        let (bs, bb, name) = if kind == ActKind::Q8 {
            (32, AQ8_BYTES, "norm_q8")
        } else {
            (256, AQ8K_BYTES, "norm_q8k")
        };
        let mut sc = self.scratch();
        let ap = self.act_scratch(&mut sc, n_rows * width / bs * bb);
        let rp = residual.map_or(0, |r| self.ptr(r));
        let mut args = vec![
            Arg::P(self.ptr(&*x)),
            Arg::P(rp),
            Arg::P(self.ptr(w)),
            Arg::P(self.ptr(&*h)),
            Arg::P(ap),
            Arg::I(width as i32),
            Arg::F(eps),
        ];
        // The row in registers, 8 elements per thread (`norm_q8*_regs`; needs 16-byte aligned
        // rows of at most 8192); else one thread per element up to 1024 with loops beyond.
        if let Some((pw, xs)) = post {
            // `norm_q8*_post_regs` (the caller checked `norm_regs_ok`): res, pw, w, ..., xs
            args.insert(2, Arg::P(self.ptr(pw)));
            args.push(Arg::F(xs));
            let threads = (width / 8).next_multiple_of(32) as u32;
            self.launch(
                &format!("{name}_post_regs"),
                (n_rows as u32, 1, 1),
                threads,
                &args,
            );
        } else if Self::norm_regs_ok(width, &[self.ptr(&*x), rp, self.ptr(w), self.ptr(&*h), ap]) {
            let threads = (width / 8).next_multiple_of(32) as u32;
            self.launch(
                &format!("{name}_regs"),
                (n_rows as u32, 1, 1),
                threads,
                &args,
            );
        } else {
            let threads = width.clamp(32, 1024) as u32;
            self.launch(name, (n_rows as u32, 1, 1), threads, &args);
        }
        drop(sc);
        let pre = Some((kind, width, ap, width / bs));
        if biases.iter().any(Option::is_some) {
            let mut sc = self.scratch();
            if self.try_mv3(&mut sc, ws, h, n_rows, ys, pre, biases) {
                return;
            }
            drop(sc);
            self.matmul_many_impl(ws, h, n_rows, ys, pre);
            self.add_biases(biases, n_rows, ys);
            return;
        }
        self.matmul_many_impl(ws, h, n_rows, ys, pre);
    }

    /// The activation kind of the fused `norm_q8*` path of `norm_matmul_impl` for these
    /// products, if it applies: not exact, every weight quantized with the same activation kind
    /// and `width` columns, no cuBLAS.
    fn norm_fusable(&self, ws: &[&CudaWeight], n_rows: usize, width: usize) -> Option<ActKind> {
        let kind = ws.first().map(|w| w.info().1)?;
        let ok = !self.tune.exact()
            && n_rows > 0
            && matches!(kind, ActKind::Q8 | ActKind::Q8K)
            && ws.iter().all(|w| w.cols == width && w.info().1 == kind)
            && !self.use_gemm(n_rows, ws);
        ok.then_some(kind)
    }

    /// The row-in-registers norm kernels (`norm_q8*_regs`) apply: rows of at most 8,192
    /// elements and 16-byte aligned device addresses.
    fn norm_regs_ok(width: usize, ptrs: &[u64]) -> bool {
        width <= 8192 && ptrs.iter().all(|p| p % 16 == 0)
    }

    /// See `Backend::post_norm_matmul_many`: with the fused row-in-registers norm one
    /// `norm_q8*_post_regs` launch normalizes the residual, adds it (then scales x by
    /// `post.1`) and runs the pre-norm (`residual` is left as it was); otherwise `rms_norm_inplace` on the residual, then
    /// `norm_matmul_impl`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn post_norm_matmul_impl(
        &self,
        x: &mut CudaBuf,
        residual: &mut CudaBuf,
        post: (&CudaSlice<f32>, f32),
        w: &CudaSlice<f32>,
        n_rows: usize,
        width: usize,
        eps: f32,
        h: &mut CudaBuf,
        ws: &[&CudaWeight],
        ys: &mut [&mut CudaBuf],
        biases: &[Option<&CudaSlice<f32>>],
    ) {
        let ptrs = [
            self.ptr(&*x),
            self.ptr(&*residual),
            self.ptr(post.0),
            self.ptr(w),
            self.ptr(&*h),
        ];
        if self.norm_fusable(ws, n_rows, width).is_some() && Self::norm_regs_ok(width, &ptrs) {
            let r = Some(&*residual);
            self.norm_matmul_impl(x, r, Some(post), w, n_rows, width, eps, h, ws, ys, biases);
        } else {
            let (pw, xs) = post;
            self.rms_norm_inplace(residual, pw, n_rows, width, eps);
            if xs == 1.0 {
                let r = Some(&*residual);
                self.norm_matmul_impl(x, r, None, w, n_rows, width, eps, h, ws, ys, biases);
            } else {
                self.add(x, residual, n_rows * width);
                self.scale(x, n_rows * width, xs);
                self.norm_matmul_impl(x, None, None, w, n_rows, width, eps, h, ws, ys, biases);
            }
        }
    }

    /// `ys[i] += biases[i]` on each of the `n` rows where a bias is given.
    fn add_biases(&self, biases: &[Option<&CudaSlice<f32>>], n: usize, ys: &mut [&mut CudaBuf]) {
        for (b, y) in biases.iter().zip(ys.iter_mut()) {
            if let Some(b) = b {
                self.add_bias(y, b, n);
            }
        }
    }

    /// Two or three one-token products of the same quantized type and width in one `mv_*_x3`
    /// launch; returns false (nothing done) otherwise. Also of different types sharing the
    /// activation kind, and with `biases` (one per weight) the biases added too: the `mv_mix*`
    /// kernels (one row per warp; see kernels/matvec.cu). With biases it does nothing unless it
    /// can add them.
    #[allow(clippy::too_many_arguments)]
    fn try_mv3(
        &self,
        sc: &mut Scratch,
        ws: &[&CudaWeight],
        x: &CudaBuf,
        n: usize,
        ys: &mut [&mut CudaBuf],
        pre: Option<(ActKind, usize, u64, usize)>,
        biases: &[Option<&CudaSlice<f32>>],
    ) -> bool {
        if n != 1 || !(2..=3).contains(&ws.len()) || ws.iter().any(|w| w.cols != ws[0].cols) {
            return false;
        }
        let (suffix, kind) = ws[0].info();
        if kind == ActKind::Float || ws.iter().any(|w| w.info().1 != kind) {
            return false;
        }
        let same = ws.iter().all(|w| w.info().0 == suffix);
        let bias = biases.iter().any(Option::is_some);
        let mixed = bias || !same;
        // The mixed kernels' type codes (a missing third weight: 0, no blocks), when this call
        // needs them and they take every type.
        let codes = mixed
            .then(|| {
                let mut c = [0i32; 3];
                for (ci, w) in c.iter_mut().zip(ws) {
                    *ci = mix_code(w)?;
                }
                Some(c)
            })
            .flatten();
        if (!same || bias) && codes.is_none() {
            return false;
        }
        let cols = ws[0].cols;
        for (w, y) in ws.iter().zip(ys.iter()) {
            check_product(w, x, y, 1);
        }
        let (xp, nb) = match pre {
            Some((k, c, p, nb)) if k == kind && c == cols => (p, nb),
            _ => self.quantize_act(sc, kind, x, 1, cols),
        };
        let wp = |i: usize| ws.get(i).map(|w| self.ptr(&w.data)).unwrap_or(0);
        let yp: Vec<u64> = ys.iter().map(|y| self.ptr(&**y)).collect();
        let rows = |i: usize| ws.get(i).map(|w| w.rows).unwrap_or(0);
        let r = if mixed {
            1
        } else {
            self.mv_rows((0..3).map(rows).sum())
        };
        let blocks: u32 = (0..3)
            .map(|i| (rows(i) as u32).div_ceil(MM_WARPS * r))
            .sum();
        if blocks == 0 {
            return true;
        }
        let mut args = vec![
            Arg::P(wp(0)),
            Arg::P(wp(1)),
            Arg::P(wp(2)),
            Arg::P(xp),
            Arg::P(yp[0]),
            Arg::P(yp[1]),
            Arg::P(yp.get(2).copied().unwrap_or(0)),
            Arg::I(rows(0) as i32),
            Arg::I(rows(1) as i32),
            Arg::I(rows(2) as i32),
            Arg::I(nb as i32),
            Arg::I(MV_SPLIT),
        ];
        let name = match codes {
            Some(c) => {
                // Type codes, then the bias addresses (0: none).
                args.extend(c.map(Arg::I));
                for i in 0..3 {
                    let b = biases.get(i).copied().flatten();
                    args.push(Arg::P(b.map_or(0, |b| self.ptr(b))));
                }
                let group = if kind == ActKind::Q8 { "32" } else { "k" };
                format!("mv_mix{group}_x3{}", if bias { "b" } else { "" })
            }
            None => format!("mv_{suffix}_x3{}", if r == 2 { "_r2" } else { "" }),
        };
        let wr = ws.iter().map(|w| (self.ptr(&w.data), w.data.len() as u64));
        self.launch_w(&name, (blocks, 1, 1), 32 * MM_WARPS, &args, wr.collect());
        true
    }

    /// See `Backend::act_mul_matmul`: one `act_q8*` launch computes the gated activation and
    /// quantizes it for `w` (quantized `w` of `width` columns, not exact); otherwise the unfused
    /// ops.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn act_matmul_impl(
        &self,
        gate: &mut CudaBuf,
        up: &CudaBuf,
        n_rows: usize,
        width: usize,
        act: Activation,
        w: &CudaWeight,
        y: &mut CudaBuf,
    ) {
        let kind = Some(w.info().1);
        let fusable = !self.tune.exact()
            && n_rows > 0
            && w.cols == width
            && matches!(kind, Some(ActKind::Q8 | ActKind::Q8K))
            && !self.use_gemm(n_rows, &[w]);
        let fusable = fusable && !matches!(act, Activation::SiluLimit(_));
        let Some(kind) = kind.filter(|_| fusable) else {
            self.act_mul(gate, up, n_rows * width, act);
            self.matmul(w, gate, n_rows, y);
            return;
        };
        assert!(
            gate.len() >= n_rows * width && up.len() >= n_rows * width,
            "act_mul_matmul: buffers shorter than {n_rows}x{width}"
        );
        let (bs, bb) = if kind == ActKind::Q8 {
            (32, AQ8_BYTES)
        } else {
            (256, AQ8K_BYTES)
        };
        let name = match (kind, act) {
            (ActKind::Q8, Activation::Silu) => "act_q8_silu",
            (ActKind::Q8, Activation::GeluTanh) => "act_q8_gelu",
            (_, Activation::Silu) => "act_q8k_silu",
            (_, Activation::GeluTanh) => "act_q8k_gelu",
            (_, Activation::SiluLimit(_)) => unreachable!("not fused (above)"),
        };
        let n_blocks = n_rows * width / bs;
        let mut sc = self.scratch();
        let ap = self.act_scratch(&mut sc, n_blocks * bb);
        let args = [
            Arg::P(self.ptr(&*gate)),
            Arg::P(self.ptr(up)),
            Arg::P(ap),
            Arg::I(n_blocks as i32),
        ];
        self.launch(name, (n_blocks.div_ceil(8) as u32, 1, 1), 256, &args);
        drop(sc);
        self.matmul_many_impl(
            &[w],
            gate,
            n_rows,
            &mut [y],
            Some((kind, width, ap, width / bs)),
        );
    }

    /// See `Backend::attention_matmul`: the decode attention (`attention_combine` for Q8, and
    /// Q8_K where `attention_impl` says) also writes the activations `w` takes, when they have the
    /// attention's width (not exact, no cuBLAS); otherwise `matmul` quantizes them.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attention_matmul_impl(
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
        let n = positions.len();
        let width = p.n_head * p.head_dim_v;
        let kind = w.info().1;
        let (bs, bb) = match kind {
            ActKind::Q8 => (32, AQ8_BYTES),
            _ => (256, AQ8K_BYTES),
        };
        let fusable = !self.tune.exact()
            && n > 0
            && w.cols == width
            && width.is_multiple_of(bs)
            && kind != ActKind::Float
            && !self.use_gemm(n, &[w]);
        if !fusable {
            self.attention_impl(q, kv, layer, positions, p, a, None, 0);
            self.matmul_many_impl(&[w], a, n, &mut [y], None);
            return;
        }
        let mut sc = self.scratch();
        let ap = self.act_scratch(&mut sc, n * width / bs * bb);
        drop(sc);
        let done = self.attention_impl(q, kv, layer, positions, p, a, Some((kind, ap)), 0);
        let pre = done.then_some((kind, width, ap, width / bs));
        self.matmul_many_impl(&[w], a, n, &mut [y], pre);
    }
}

/// The buffers of `y = x · wᵀ` over `n` rows are long enough (a caller bug otherwise).
pub(crate) fn check_product(w: &CudaWeight, x: &CudaBuf, y: &CudaBuf, n: usize) {
    assert!(
        x.len() >= n * w.cols,
        "matmul: x shorter than {n}x{}",
        w.cols
    );
    assert!(
        y.len() >= n * w.rows,
        "matmul: y shorter than {n}x{}",
        w.rows
    );
}

/// Fewest rows of a one-token product (all weights of an `_x3` launch together) that take two
/// rows per warp: 2,048 rows make 256 blocks, about two per SM of an H200.
const MV_ROWS2_MIN: usize = 2048;

/// Warps per row of the one-token `mv_*` kernels (their `split` argument): one. Splitting long
/// rows over 2 or 4 warps lowered Llama-3-8B decode on the H200 (see `mv32` in matvec.cu).
const MV_SPLIT: i32 = 1;

impl CudaBackend {
    /// Rows per warp of the one-token `mv_*` kernels for a launch of `rows` rows in all: 2
    /// (`mv_*_r2`: each activation block is loaded once for two rows) from `MV_ROWS2_MIN` rows,
    /// else 1 (tests may force either, `set_mv_rows_mode`). Two rows everywhere took Llama-3-8B
    /// Q4_0 from 368 to 392 tok/s but the Qwen2.5-0.5B geometry from 999 to 937 (its 896-1,152-row
    /// products then fill only 112-144 blocks; docs/perf-log.md), hence the threshold.
    pub(crate) fn mv_rows(&self, rows: usize) -> u32 {
        let mode = self.tune.mv_rows();
        if mode == 2 || (mode == 1 && rows >= MV_ROWS2_MIN) {
            2
        } else {
            1
        }
    }
}

/// The `mv_mix*` kernels' type code of a weight (kernels/matvec.cu), if they take its type.
fn mix_code(w: &CudaWeight) -> Option<i32> {
    use vela_formats::quant::GgmlType;
    match (w.ty, w.split) {
        (GgmlType::Q4_0, true) => Some(102),
        (GgmlType::Q4_0, false) => Some(2),
        (GgmlType::Q5_0, false) => Some(6),
        (GgmlType::Q8_0, false) => Some(8),
        (GgmlType::Q4_K, true) => Some(112),
        (GgmlType::Q6_K, true) => Some(114),
        _ => None,
    }
}
