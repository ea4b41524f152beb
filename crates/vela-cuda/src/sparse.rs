//! Block-sparse attention on the GPU: the indexer's selection and attention over it. The fast
//! kernels (kernels/sparse.cu) run by default; the reference ones (kernels/recurrent.cu, the
//! CPU's bits) in exact mode for the attention and, for both, outside the fast kernels' shape
//! limits. The selection is the same in both (scores summed in the reference's order, the
//! reference's ranking).
//!
//! Positions come through [`CudaBackend::positions`] (the decode step's `io` slot while a step
//! is recorded), and the scratch (scores, attention parts) is the backend's, sized in steps:
//! a recorded step's launches stay the same from one position to the next.

use crate::backend::CudaBackend;
use crate::device::Arg;
use crate::weight::CudaBuf;
use cudarc::driver::CudaSlice;
use vela_compute::{Backend, IndexerParams};

/// `SPARSE_TILE` in sparse.cu; `ATTN_PART`, `ATTN_MAX_G`, `ATTN_MAX_HD` (`attn_part_rows`, the
/// attention parts of this file and of DeepSeek V4's sink attention) in common.cu.
const TILE: usize = 32;
pub(crate) const PART: usize = 64;
const MAX_G: usize = 16;
const MAX_HD: usize = 512;

/// Query rows per launch of the attention parts (bounds their scratch; a query's result does
/// not depend on it).
const PART_ROWS: usize = 32;

/// Score columns per query for the keys' blocks up to `max_pos`: a power of two, at least 1024,
/// so the scratch and the scores grid change only at a few positions of a long decode.
fn score_stride(max_pos: usize, block: usize) -> usize {
    ((max_pos + 1) / block).max(1).next_power_of_two().max(1024)
}

/// Whether the fast selection kernels take this shape (sparse_scores_t's shared memory).
fn fast_select(p: &IndexerParams) -> bool {
    p.n_head >= 1 && p.n_head <= 32 && p.head_dim <= 256 && p.n_head * p.head_dim <= 1024
}

/// Query heads per block of the attention parts (`attn_part_rows`): all `g` heads that share
/// their rows when they fit its limits (at most `MAX_G`, heads × head dim at most 4096), else
/// groups of the most that fit.
pub(crate) fn head_group(g: usize, hd: usize) -> usize {
    g.min(MAX_G).min(4096 / hd.max(1)).max(1)
}

/// Whether the attention parts (`attn_part_rows`) take this head dim.
pub(crate) fn fast_attention(hd: usize) -> bool {
    hd.is_multiple_of(32) && hd > 0 && hd <= MAX_HD
}

impl CudaBackend {
    /// The attention parts' scratch for `rows` queries of `nh` heads in `parts` parts:
    /// (`part_acc` `[rows, nh, parts, hd]`, `part_ml` `[rows, nh, parts, 2]`) device addresses.
    pub(crate) fn attn_parts_scratch(
        &self,
        rows: usize,
        nh: usize,
        parts: usize,
        hd: usize,
    ) -> (u64, u64) {
        let acc = self.grown_zeroed(
            &self.sparse_part,
            rows * nh * parts * (hd + 2),
            "attention parts",
        );
        (acc, acc + (rows * nh * parts * hd * 4) as u64)
    }

    pub(crate) fn indexer_select_impl(
        &self,
        q: &CudaBuf,
        keys: &CudaBuf,
        positions: &[u32],
        p: &IndexerParams,
        sel: &mut CudaSlice<u32>,
        counts: &mut CudaSlice<u32>,
    ) {
        let n = positions.len();
        if n == 0 {
            return;
        }
        let width = p.max_selected();
        assert!(
            q.len() >= n * p.n_head * p.head_dim && sel.len() >= n * width && counts.len() >= n,
            "indexer_select: buffer too small"
        );
        if !fast_select(p) {
            return self.indexer_select_ref(q, keys, positions, p, sel, counts);
        }
        let max_pos = *positions.iter().max().unwrap_or(&0) as usize;
        let stride = score_stride(max_pos, p.block);
        let scores = self.grown_zeroed(&self.sparse_scores, n * stride, "sparse scores");
        let mut sc = self.scratch();
        let pos = self.positions(&mut sc, positions);
        drop(sc);
        let args = [
            Arg::P(self.ptr(q)),
            Arg::P(self.ptr(keys)),
            Arg::P(pos),
            Arg::I(p.n_head as i32),
            Arg::I(p.head_dim as i32),
            Arg::I(p.block as i32),
            Arg::I(p.max_blocks as i32),
            Arg::I(stride as i32),
            Arg::P(scores),
        ];
        let tiles = stride.div_ceil(TILE) as u32;
        self.launch("sparse_scores_t", (tiles, n as u32, 1), 128, &args);
        let args = [
            Arg::P(scores),
            Arg::P(pos),
            Arg::I(p.block as i32),
            Arg::I(p.max_blocks as i32),
            Arg::I(stride as i32),
            Arg::I(width as i32),
            Arg::P(self.ptr(sel)),
            Arg::P(self.ptr(counts)),
        ];
        self.launch("sparse_topk", (n as u32, 1, 1), 1024, &args);
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attention_selected_impl(
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
        let (nh, nkv, hd) = heads;
        assert!(
            width <= 4096,
            "attention_selected: at most 4096 selected positions"
        );
        assert!(
            nkv > 0 && nh % nkv == 0,
            "attention_selected: heads must group"
        );
        assert!(
            q.len() >= n * nh * hd && out.len() >= n * nh * hd && sel.len() >= n * width,
            "attention_selected: buffer too small"
        );
        if n == 0 {
            return;
        }
        if self.tune.exact() || !fast_attention(hd) {
            return self.attention_selected_ref(q, k, v, sel, counts, n, width, heads, scale, out);
        }
        let parts = width.div_ceil(PART);
        let gs = head_group(nh / nkv, hd);
        let groups = (nh / nkv).div_ceil(gs);
        let (acc, ml) = self.attn_parts_scratch(n.min(PART_ROWS), nh, parts, hd);
        let mut t0 = 0;
        while t0 < n {
            let m = PART_ROWS.min(n - t0);
            let (qo, so, co) = (
                (t0 * nh * hd * 4) as u64,
                (t0 * width * 4) as u64,
                (t0 * 4) as u64,
            );
            let args = [
                Arg::P(self.ptr(q) + qo),
                Arg::P(self.ptr(k)),
                Arg::P(self.ptr(v)),
                Arg::P(self.ptr(sel) + so),
                Arg::P(self.ptr(counts) + co),
                Arg::I(width as i32),
                Arg::I(nh as i32),
                Arg::I(nkv as i32),
                Arg::I(hd as i32),
                Arg::F(scale),
                Arg::I(parts as i32),
                Arg::I(gs as i32),
                Arg::P(acc),
                Arg::P(ml),
            ];
            self.launch(
                "sparse_attn_part",
                (parts as u32, (nkv * groups) as u32, m as u32),
                256,
                &args,
            );
            let args = [
                Arg::P(acc),
                Arg::P(ml),
                Arg::P(self.ptr(counts) + co),
                Arg::I(nh as i32),
                Arg::I(hd as i32),
                Arg::I(parts as i32),
                Arg::P(self.ptr(out) + qo),
            ];
            self.launch("sparse_attn_combine", (nh as u32, m as u32, 1), 128, &args);
            t0 += m;
        }
    }

    pub(crate) fn store_rows_at_impl(
        &self,
        src: &CudaBuf,
        width: usize,
        positions: &[u32],
        ring: usize,
        dst: &mut CudaBuf,
    ) {
        let n = positions.len();
        if n == 0 || width == 0 {
            return;
        }
        let last = if ring > 0 {
            ring
        } else {
            *positions.iter().max().unwrap_or(&0) as usize + 1
        };
        assert!(
            src.len() >= n * width && dst.len() >= last * width,
            "store_rows_at: buffer too small"
        );
        let mut sc = self.scratch();
        let pp = self.positions(&mut sc, positions);
        drop(sc);
        let args = [
            Arg::P(self.ptr(src)),
            Arg::P(self.ptr(dst)),
            Arg::I(width as i32),
            Arg::P(pp),
            Arg::I(ring as i32),
        ];
        self.launch("store_rows_at", (n as u32, 1, 1), 256, &args);
    }

    /// [`vela_compute::Backend::pool_blocks`] with every launch the same for any position: each
    /// row's last complete block is pooled (into the second scratch) and stored only where the
    /// row completes it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn pool_blocks_impl(
        &self,
        raw: &CudaBuf,
        raw_slots: usize,
        width: usize,
        block: usize,
        positions: &[u32],
        norm: (&CudaSlice<f32>, f32),
        rope: &vela_compute::RopeParams,
        pooled: &mut CudaBuf,
        rows: &mut CudaBuf,
    ) {
        let n = positions.len();
        if n == 0 || width == 0 {
            return;
        }
        assert!(
            block >= 1 && raw_slots >= 1,
            "pool_blocks: no block or ring"
        );
        assert!(
            raw.len() >= raw_slots * width && pooled.len() >= n * width,
            "pool_blocks: buffer too small"
        );
        let last = *positions.iter().max().unwrap_or(&0) as usize;
        assert!(
            rows.len() >= (last + 1) / block * width,
            "pool_blocks: rows too small"
        );
        let mut sc = self.scratch();
        let pp = self.positions(&mut sc, positions);
        drop(sc);
        let pool_pos = self.grown_zeroed(&self.sparse_pool_pos, n, "pooled key positions");
        let args = [
            Arg::P(self.ptr(raw)),
            Arg::I(raw_slots as i32),
            Arg::I(width as i32),
            Arg::I(block as i32),
            Arg::P(pp),
            Arg::P(self.ptr(pooled)),
            Arg::P(pool_pos),
        ];
        self.launch("sparse_pool_mean", (n as u32, 1, 1), 128, &args);
        self.rms_norm_inplace(pooled, norm.0, n, width, norm.1);
        self.rope_at(pooled, n, pool_pos, 1, width, rope);
        let args = [
            Arg::P(self.ptr(pooled)),
            Arg::P(pp),
            Arg::I(width as i32),
            Arg::I(block as i32),
            Arg::P(self.ptr(rows)),
        ];
        self.launch("sparse_pool_store", (n as u32, 1, 1), 128, &args);
    }

    /// The reference selection (recurrent.cu; O(blocks²) per query): shapes the fast kernels
    /// do not take.
    pub(crate) fn indexer_select_ref(
        &self,
        q: &CudaBuf,
        keys: &CudaBuf,
        positions: &[u32],
        p: &IndexerParams,
        sel: &mut CudaSlice<u32>,
        counts: &mut CudaSlice<u32>,
    ) {
        let n = positions.len();
        if n == 0 {
            return;
        }
        let width = p.max_selected();
        assert!(
            q.len() >= n * p.n_head * p.head_dim && sel.len() >= n * width && counts.len() >= n,
            "indexer_select: buffer too small"
        );
        let max_pos = *positions.iter().max().unwrap_or(&0) as usize;
        let stride = ((max_pos + 1) / p.block).max(1);
        let mut pos = self.alloc_ids(n);
        self.write_ids(&mut pos, positions);
        let scores = self.alloc(n * stride);
        let kept = self
            .dev
            .stream
            .alloc_zeros::<u8>(n * stride)
            .unwrap_or_else(|e| panic!("CUDA alloc of {} bytes failed: {e:?}", n * stride));
        let args = [
            Arg::P(self.ptr(q)),
            Arg::P(self.ptr(keys)),
            Arg::P(self.ptr(&pos)),
            Arg::I(p.n_head as i32),
            Arg::I(p.head_dim as i32),
            Arg::I(p.block as i32),
            Arg::I(stride as i32),
            Arg::P(self.ptr(&scores)),
        ];
        self.launch("sparse_index_scores", (n as u32, 1, 1), 256, &args);
        let args = [
            Arg::P(self.ptr(&scores)),
            Arg::P(self.ptr(&pos)),
            Arg::I(p.block as i32),
            Arg::I(p.max_blocks as i32),
            Arg::I(stride as i32),
            Arg::I(width as i32),
            Arg::P(self.ptr(&kept)),
            Arg::P(self.ptr(sel)),
            Arg::P(self.ptr(counts)),
        ];
        self.launch("sparse_index_select", (n as u32, 1, 1), 256, &args);
    }

    /// The reference attention (recurrent.cu; the CPU's order and bits up to expf): exact mode
    /// and shapes the fast kernels do not take.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attention_selected_ref(
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
        let (nh, nkv, hd) = heads;
        assert!(
            width <= 4096,
            "attention_selected: at most 4096 selected positions"
        );
        assert!(
            nkv > 0 && nh % nkv == 0,
            "attention_selected: heads must group"
        );
        assert!(
            q.len() >= n * nh * hd && out.len() >= n * nh * hd && sel.len() >= n * width,
            "attention_selected: buffer too small"
        );
        if n == 0 {
            return;
        }
        let args = [
            Arg::P(self.ptr(q)),
            Arg::P(self.ptr(k)),
            Arg::P(self.ptr(v)),
            Arg::P(self.ptr(sel)),
            Arg::P(self.ptr(counts)),
            Arg::I(width as i32),
            Arg::I(nh as i32),
            Arg::I(nkv as i32),
            Arg::I(hd as i32),
            Arg::F(scale),
            Arg::P(self.ptr(out)),
        ];
        self.launch("sparse_attention", (n as u32, nh as u32, 1), 128, &args);
    }
}
