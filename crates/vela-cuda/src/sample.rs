//! Device top-k for sampling ([`Backend::top_k_rows`]): the kernels of `kernels/sample.cu` select
//! each row's `k` best pairs and its statistics on the GPU, and only those (`8k + 24` bytes per
//! row) are copied back.
//!
//! A row of one part ([`top_k_partition`]) is selected by one block (`topk_rows`). A longer row
//! is split into parts of `part` contiguous elements: `topk_part` (one block per row and part)
//! selects each part's `k` best and its statistics, then `topk_merge` (one block per row) selects
//! the row's `k` best among the parts' candidates and combines the statistics. The candidates of
//! a row are the parts' sorted lists concatenated in part order, so equal values appear in index
//! order and the merge's position tie-break is the index tie-break: the result is the same as a
//! selection over the whole row (see sample.cu).
//!
//! The output records and the candidates live in the `argmax_rows` buffers (grow-only, used under
//! their lock, and both users wait for the stream before releasing it), so a call allocates
//! nothing once they are large enough.

use crate::backend::CudaBackend;
use crate::device::Arg;
use crate::weight::CudaBuf;
use vela_compute::{top_k_row, Backend, TopK};

/// Largest `k` selected on the device (`TOPK_MAX` in sample.cu); larger ones read the rows back
/// and select on the host.
pub const TOP_K_DEVICE_MAX: usize = 1024;
/// Threads per block of every top-k kernel (`TOPK_THREADS`).
const TOPK_THREADS: u32 = 1024;
/// u32 words of a row record before its pairs.
const HEADER: usize = 6;
/// Smallest part of a split row (shorter rows take one block).
const PART_MIN: usize = 2048;
/// Most parts per row.
const PARTS_MAX: usize = 256;
/// u32 words of a part's statistics (`n_valid`, max key, f64 sum).
const PART_STATS: usize = 4;

/// `(part, parts)`: how `topk_part` splits a row of `width` elements for `k` (clamped to
/// `1..=TOP_K_DEVICE_MAX`): `part` is the largest of 2048, `4k`, `sqrt(width * k)` (which
/// balances a part's elements against the row's `parts * k` candidates) and `width / 256`,
/// rounded up to a multiple of 256; `parts = ceil(width / part)` (at least 1, at most 256). One
/// part means a single `topk_rows` block per row.
pub fn top_k_partition(width: usize, k: usize) -> (usize, usize) {
    let k = k.clamp(1, TOP_K_DEVICE_MAX);
    let balanced = ((width as f64) * (k as f64)).sqrt() as usize;
    let part = PART_MIN
        .max(4 * k)
        .max(balanced)
        .max(width.div_ceil(PARTS_MAX))
        .next_multiple_of(256);
    (part, width.div_ceil(part).max(1))
}

impl CudaBackend {
    pub(crate) fn top_k_rows_device(
        &self,
        x: &CudaBuf,
        n_rows: usize,
        width: usize,
        k: usize,
    ) -> Vec<TopK> {
        if n_rows == 0 {
            return Vec::new();
        }
        assert!(x.len() >= n_rows * width, "top_k_rows: buffer too small");
        if width == 0
            || k > TOP_K_DEVICE_MAX
            || width > i32::MAX as usize - TOPK_THREADS as usize
            || n_rows * PARTS_MAX > i32::MAX as usize
        {
            let mut v = vec![0f32; n_rows * width];
            if !v.is_empty() {
                self.read(x, &mut v);
            }
            return (0..n_rows)
                .map(|r| top_k_row(&v[r * width..(r + 1) * width], k))
                .collect();
        }
        // k = 0 still needs the statistics: select one and drop it.
        let kd = k.max(1);
        let stride = HEADER + 2 * kd;
        let (part, parts) = top_k_partition(width, kd);
        let mut guard = self.argmax_out.lock().unwrap_or_else(|e| e.into_inner());
        let (out, scratch) = &mut *guard;
        let n_out = n_rows * stride;
        if out.len() < n_out {
            *out = self
                .dev
                .stream
                .alloc_zeros::<u32>(n_out.next_power_of_two())
                .expect("CUDA alloc of top-k output");
        }
        if parts == 1 {
            let args = [
                Arg::P(self.ptr(x)),
                Arg::I(width as i32),
                Arg::I(kd as i32),
                Arg::P(self.ptr(&*out)),
            ];
            self.launch("topk_rows", (n_rows as u32, 1, 1), TOPK_THREADS, &args);
        } else {
            // Scratch (as u32 words): the parts' statistics, then their candidate values and
            // indices, `parts * kd` of each per row.
            let n_parts = n_rows * parts;
            let need = n_parts * (PART_STATS + 2 * kd);
            if scratch.len() < need {
                *scratch = self
                    .dev
                    .stream
                    .alloc_zeros::<f32>(need.next_power_of_two())
                    .expect("CUDA alloc of top-k candidates");
            }
            let stats = self.ptr(&*scratch);
            let cval = stats + (4 * PART_STATS * n_parts) as u64;
            let cidx = cval + (4 * kd * n_parts) as u64;
            let args = [
                Arg::P(self.ptr(x)),
                Arg::I(width as i32),
                Arg::I(kd as i32),
                Arg::I(part as i32),
                Arg::I(parts as i32),
                Arg::P(cval),
                Arg::P(cidx),
                Arg::P(stats),
            ];
            self.launch("topk_part", (n_parts as u32, 1, 1), TOPK_THREADS, &args);
            let args = [
                Arg::P(cval),
                Arg::P(cidx),
                Arg::P(stats),
                Arg::I(kd as i32),
                Arg::I(parts as i32),
                Arg::P(self.ptr(&*out)),
            ];
            self.launch("topk_merge", (n_rows as u32, 1, 1), TOPK_THREADS, &args);
        }
        self.flush_recording();
        let mut h = vec![0u32; n_out];
        self.dev
            .stream
            .memcpy_dtoh(&out.slice(0..n_out), &mut h)
            .expect("CUDA download of top-k");
        self.dev.wait().expect("CUDA synchronize");
        drop(guard);
        h.chunks_exact(stride)
            .map(|r| {
                let n = (r[0] as usize).min(k);
                TopK {
                    items: (0..n)
                        .map(|i| (r[HEADER + 2 * i], f32::from_bits(r[HEADER + 2 * i + 1])))
                        .collect(),
                    n_valid: r[1] as usize,
                    max: f32::from_bits(r[2]),
                    sum_exp: f64::from_bits(r[4] as u64 | (r[5] as u64) << 32),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_bounds() {
        for width in [
            1usize, 2, 100, 2048, 2049, 4097, 49_152, 151_936, 262_147, 600_000,
        ] {
            for k in [0usize, 1, 40, 64, 1000, 1024, 5000] {
                let (part, parts) = top_k_partition(width, k);
                assert!((1..=PARTS_MAX).contains(&parts), "{width} {k}");
                assert!(part % 256 == 0 && part >= PART_MIN);
                // Every part starts inside the row and together they cover it.
                assert!((parts - 1) * part < width && parts * part >= width);
                // Every part but the last holds at least 4k elements.
                assert!(parts == 1 || part >= 4 * k.clamp(1, TOP_K_DEVICE_MAX));
                // The merge's candidate count fits its i32 argument.
                assert!(parts * TOP_K_DEVICE_MAX <= i32::MAX as usize);
            }
        }
        assert_eq!(top_k_partition(2048, 40), (2048, 1));
        assert_eq!(top_k_partition(262_144, 40), (3328, 79));
        assert_eq!(top_k_partition(262_144, 1024), (16_384, 16));
    }
}
