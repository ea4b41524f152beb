//! Developer switches of the CUDA backend: kernel variants on or off at run time (the defaults
//! come from `VELA_CUDA_*` variables read in `CudaBackend::new`; tests and A/B runs use these).
//! (`set_flash_decode_min_keys` is in attn.rs, next to its state.)

use crate::CudaBackend;
use std::sync::atomic::Ordering;

impl CudaBackend {
    /// Exact matmul mode on or off for this backend (default: `VELA_MATMUL=f32`).
    pub fn set_exact_matmul(&self, on: bool) {
        self.drop_parked();
        self.flush_recording();
        self.exact.store(on, Ordering::Relaxed);
    }

    /// New (`mv_*`) or old (`mm_*_t1`) one-token matvec kernels (default: `VELA_CUDA_MATVEC`).
    pub fn set_matvec_new(&self, on: bool) {
        self.drop_parked();
        self.matvec_new.store(on, Ordering::Relaxed);
    }

    /// k-quant one-token products with 2 (true) or 4 sub-blocks in flight per lane.
    pub fn set_mvk_u2(&self, on: bool) {
        self.drop_parked();
        self.mvk_u2.store(on, Ordering::Relaxed);
    }

    /// Fused pre-norm input / q+k RoPE on or off (default: on unless `VELA_CUDA_FUSE=0`).
    pub fn set_fusion(&self, on: bool) {
        self.drop_parked();
        self.fuse.store(on, Ordering::Relaxed);
    }

    /// QK norm folded into RoPE + store and post norms into the next pre-norm (default: on
    /// unless `VELA_CUDA_NORM_FOLD=0`).
    pub fn set_norm_fold(&self, on: bool) {
        self.drop_parked();
        self.flush_recording();
        self.norm_fold.store(on, Ordering::Relaxed);
    }

    /// Several row pairs per warp for narrow Q8_0 rows (`mv_q8_0_r2n`; default: on unless
    /// `VELA_CUDA_MV_NARROW=0`).
    pub fn set_mv_narrow(&self, on: bool) {
        self.drop_parked();
        self.flush_recording();
        self.mv_narrow.store(on, Ordering::Relaxed);
    }

    /// Split-K decode attention on or off (default: on unless `VELA_CUDA_ATTN=old`).
    pub fn set_split_attention(&self, on: bool) {
        self.drop_parked();
        self.split_attn.store(on, Ordering::Relaxed);
    }

    /// The second-version norm and RoPE+store decode kernels (true, default) or the first.
    pub fn set_small_kernels_v2(&self, on: bool) {
        self.drop_parked();
        self.flush_recording();
        self.small_v2.store(on, Ordering::Relaxed);
    }

    /// The second-version split-K attention parts (true, default) or the first.
    pub fn set_attention_parts_v2(&self, on: bool) {
        self.drop_parked();
        self.flush_recording();
        self.attn_part_v2.store(on, Ordering::Relaxed);
    }

    /// Programmatic dependent launch on or off (only takes effect on sm_90 and newer).
    pub fn set_pdl(&self, on: bool) {
        self.drop_parked();
        self.flush_recording();
        self.pdl.store(on && self.arch >= 90, Ordering::Relaxed);
    }

    /// Split-K decode attention on the tensor cores (`flash_decode_*`, where it applies) on or
    /// off.
    pub fn set_flash_decode(&self, on: bool) {
        self.drop_parked();
        self.flush_recording();
        self.fdec.on.store(on, Ordering::Relaxed);
    }

    /// Split-K decode attention parts of the third version (one block per KV head) on or off.
    pub fn set_attention_parts_v3(&self, on: bool) {
        self.drop_parked();
        self.flush_recording();
        self.attn_part3.store(on, Ordering::Relaxed);
    }

    /// Prefill attention with head dims above 256 through cuBLAS (default: on unless
    /// `VELA_CUDA_ATTN_GEMM=0`).
    pub fn set_attention_gemm(&self, on: bool) {
        self.drop_parked();
        self.attn_gemm.store(on, Ordering::Relaxed);
    }

    /// Q6_K weights uploaded from now on go into split rows whatever their length (padded to 16
    /// bytes; default: on unless `VELA_CUDA_Q6K_PAD=0`).
    pub fn set_q6k_pad(&self, on: bool) {
        self.q6k_pad.store(on, Ordering::Relaxed);
    }

    /// Repack Q4_0/Q4_K/Q6_K weights uploaded from now on into split rows (default: on unless
    /// `VELA_CUDA_REPACK=0`).
    pub fn set_repack(&self, on: bool) {
        self.drop_parked();
        self.repack.store(on, Ordering::Relaxed);
    }

    /// One-token products of different weight types (sharing the activation kind) in one
    /// `mv_mix*_x3` launch on or off (default on; `VELA_CUDA_MIXED_X3=0` off).
    pub fn set_mixed_x3(&self, on: bool) {
        self.drop_parked();
        self.flush_recording();
        self.mixed_x3.store(on, Ordering::Relaxed);
    }

    /// Q/K/V biases added by the one-token products (`mv_mix*_x3b`) on or off (default
    /// on; `VELA_CUDA_BIAS_FUSE=0` off).
    pub fn set_bias_fuse(&self, on: bool) {
        self.drop_parked();
        self.flush_recording();
        self.bias_fuse.store(on, Ordering::Relaxed);
    }

    /// Prefill attention kernel: 0 tensor-core flash attention where it applies, else as 1
    /// (default); 1 four warps per row for big batches, else 32; 2 always the 32-warp kernel
    /// (see attn.rs).
    pub fn set_prefill_attention(&self, mode: u32) {
        self.drop_parked();
        self.attn_prefill.store(mode, Ordering::Relaxed);
    }

    /// Record the next decode step while the GPU runs this one (default on;
    /// `VELA_CUDA_PREPARE=0` off).
    pub fn set_prepare(&self, on: bool) {
        self.drop_parked();
        self.prepare_on.store(on, Ordering::Relaxed);
    }
}
