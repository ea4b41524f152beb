//! Device top-k for sampling ([`Backend::top_k_rows`]): the `topk_rows` kernel of
//! `kernels/sample.cu` selects each row's `k` best pairs and its statistics on the GPU, and only
//! those (`8k + 24` bytes per row) are copied back.

use crate::{Arg, CudaBackend, CudaBuf};
use vela_compute::{top_k_row, Backend, TopK};

/// Largest `k` selected on the device (`TOPK_MAX` in sample.cu); larger ones read the rows back
/// and select on the host.
pub const TOP_K_DEVICE_MAX: usize = 1024;
/// Threads per row (`TOPK_THREADS`).
const TOPK_THREADS: u32 = 1024;
/// u32 words of a row record before its pairs.
const HEADER: usize = 6;

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
        if width == 0 || k > TOP_K_DEVICE_MAX || width > i32::MAX as usize - TOPK_THREADS as usize {
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
        // SAFETY: the kernel writes the header and the first n pairs of every row record before
        // they are read; nothing else is read.
        let out = unsafe { self.stream.alloc::<u32>(n_rows * stride) }
            .expect("CUDA alloc of top-k output");
        let args = [
            Arg::P(self.ptr(x)),
            Arg::I(width as i32),
            Arg::I(kd as i32),
            Arg::P(self.ptr(&out)),
        ];
        self.launch("topk_rows", (n_rows as u32, 1, 1), TOPK_THREADS, &args);
        self.flush_recording();
        let mut h = vec![0u32; n_rows * stride];
        self.stream
            .memcpy_dtoh(&out, &mut h)
            .expect("CUDA download of top-k");
        self.stream.synchronize().expect("CUDA synchronize");
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
