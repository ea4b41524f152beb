//! RoPE (alone, q+k, q+k with the KV store) and attention (one block per head and token, or
//! split-K for decode) of the CUDA backend.

use crate::attn_parts::{fd_parts_for, keys_seen, split_chunk, split_parts, warp_parts_for};
use crate::{ActKind, Arg, CudaBackend, CudaBuf, CudaKv};
use crate::{ATT_MAXD, ATT_MAXD_BIG, ATT_WARPS, SPLIT_MAX_ROWS, SPLIT_WARPS};
use anyhow::Result;
use cudarc::driver::{sys, CudaContext, CudaSlice};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize};
use std::sync::{Arc, Mutex};

/// Most split-K parts of the first two versions (one `attention_part*` block per query head).
pub(crate) const SPLIT_MAX_PARTS: usize = 32;

/// Most split-K parts of the third version (one block per KV head; `attention_combine` merges
/// at most 128).
pub(crate) const SPLIT_MAX_PARTS_V3: usize = 128;

/// Most parts of the tensor-core decode attention (`FD_MAX_PARTS` in flash.cu), which is also
/// the most `attention_combine` and the tail combine merge (`COMBINE_MAX` in attention.cu).
const FD_MAX_PARTS: usize = 128;

/// Keys per tile of the tensor-core decode attention (`FD_KEYS` in flash.cu).
pub(crate) const FD_KEYS: usize = 64;

/// State of the tensor-core split-K decode attention (`flash_decode_*`).
pub(crate) struct FlashDecode {
    /// On where it applies (default; `VELA_CUDA_ATTN_PART=1|2|3` selects the older kernels).
    pub(crate) on: AtomicBool,
    /// Blocks the parts aim for per launch: `VELA_CUDA_FD_WAVES` (default 2) per SM.
    blocks: usize,
    /// Fewest 64-key tiles per part (`VELA_CUDA_FD_MIN_TILES`, default 4).
    min_tiles: usize,
    /// Fewest keys (the longest row's) for this kernel; fewer: the second version
    /// (`VELA_CUDA_FD_MIN_KEYS`, default 1536; `set_flash_decode_min_keys`). Llama-3-8B Q4_0
    /// tg128 on the H200: the second version 386 vs 380 t/s at depth 1,024, this kernel 380 vs
    /// 331 at 2,048 and 350 vs 265 at 8,192.
    min_keys: AtomicUsize,
    /// `attention_combine` also quantizes for the next product (Q8; default,
    /// `VELA_CUDA_COMBINE_Q8=0` off).
    combine_q8: bool,
    /// Fewest blocks (KV heads × tokens × non-empty parts) for which the tensor-core kernel also
    /// runs from 1,024 keys, below `min_keys` (`VELA_CUDA_FD_MIN_BLOCKS`, default 32; 0: off).
    /// Llama-3-8B Q4_0 at depth 1,024 (32 blocks) on the H200: 452.7 vs 422.8 t/s with the
    /// kernel from 1,024 keys; Qwen2.5-0.5B (2 KV heads, 8 blocks) 1,191 vs 1,286, hence the
    /// block count. With 32 (session 11, two calls, 3 rounds each): Llama-3-8B Q4_0 at depth
    /// 1,024 448.0 / 447.3 / 452.8 vs 418.7 / 417.8 / 418.5 t/s, at 1,400 450.5 / 447.8 / 447.7
    /// vs 399.5 / 400.3 / 399.4; Qwen2.5-0.5B unchanged (1,220 vs 1,217 at 1,400).
    min_blocks: usize,
    /// The grid's parts: one per 64-key tile of capacity (`VELA_CUDA_FD_GRID=tiles`; before
    /// session 10) instead of one per `min_tiles` tiles.
    grid_per_tile: bool,
    /// Head dim 256 too (`flash_decode_*_d256`; default on, `VELA_CUDA_FD_D256=0` /
    /// `set_flash_decode_d256` turn it off), from `min_keys` keys only. The real Gemma 3 270M
    /// (one KV head) tg128 at 8K: 1,428.0 / 1,423.7 / 1,427.6 vs 1,274.5 / 1,274.9 / 1,274.0 t/s
    /// (session 14), 1,430.2 / 1,427.6 / 1,429.4 vs 1,277.1 / 1,277.0 / 1,277.3 (session 15);
    /// Gemma 4 12B's sliding layers (1,024 keys, taken through `min_blocks` then) were slower
    /// (199.1 / 200.6 vs 203.6 / 204.0 at 8K), hence the key floor: with it 230.7 vs 230.1.
    pub(crate) d256: AtomicBool,
    /// Head dim 512 too (`flash_decode_*_d512`, Gemma 4's full layers; default on,
    /// `VELA_CUDA_FD_D512=0` / `set_flash_decode_d512` turn it off). Gemma 4 12B Q4_0 tg128 at
    /// 8K: 230.0 / 230.2 / 229.4 / 227.6 vs 203.6 / 204.0 / 204.3 / 202.8 t/s; 31B 110.3 /
    /// 108.0 vs 93.4 / 94.0 (session 14, two calls).
    pub(crate) d512: AtomicBool,
    /// The device's opt-in shared memory per block holds the head-dim-256 / 512 kernels' (140 /
    /// 149 KiB; an H200 has 227, an sm_86/89 GPU 99): else they never run.
    fits: [bool; 2],
    /// The second split-K version's parts on one warp each (`attention_partw_*`: 16-bit caches,
    /// head dims 64 / 128 / 256): 0 never, 1 for every head dim it takes, 2 for head dim 64, 3
    /// (default) for head dims 64 and 128 (`VELA_CUDA_ATTN_WARP`, `set_attention_warp_parts`).
    /// Head dim 128 once the warp parts' count followed the keys (session 19, call 3):
    /// Llama-3-8B Q4_0 tg128 565.9 / 565.4 vs 559.6 / 559.9 t/s, at depth 512 541.6 / 540.3 vs
    /// 504.5 / 506.1 (call 2: 570.3 vs 556.7, 545.9 vs 506.3). Before that, H200 tg128 against
    /// the four-warp parts (session 18, call 1, two rounds): Qwen2.5-0.5B geometry 1,555.3 /
    /// 1,565.7 vs 1,519.0 / 1,515.7 t/s (depth 512: 1,493.4 / 1,494.9 vs 1,473.8 / 1,475.1),
    /// SmolLM2 1,900.7 / 1,897.7 vs 1,817.0 / 1,817.8 (1,894.4 / 1,891.9 vs 1,808.4 / 1,807.9);
    /// Gemma 3 270M (head dim 256) 1,942.1 / 1,940.2 vs 1,955.5 / 1,953.8; Llama-3-8B (head dim
    /// 128, call 2) 570.0 / 566.8 vs 557.9 / 557.6 but at depth 512 494.3 / 497.7 vs 506.1 /
    /// 506.8 (a lane's whole 128- or 256-wide dot product per key), hence head dim 64 only then.
    pub(crate) warp_parts: AtomicU32,
    /// Most parts of the warp parts when the keys seen fill more than one 32-key chunk per part
    /// of the shape's count (`warp_parts_for`; `VELA_CUDA_WARP_MAX_PARTS`, default 64; 0: the
    /// shape's count). H200 tg128, one part per chunk up to 64 (session 18, call 9; calls 8-9
    /// for the 4,096-key threshold): Qwen2.5-0.5B / SmolLM2 geometries at depth 1024 1,474.8 /
    /// 1,754.9 vs 1,418.8 / 1,637.7 t/s; at 2048 with the tensor-core decode from 4,096 keys
    /// 1,312.7 / 1,563.0 vs 1,273.9 / 1,448.1 (from 1,536); equal at 512, 4K and 8K (the warp
    /// parts everywhere: 1,267.8 / 1,450.8 vs 1,269.3 / 1,455.8 at 4K).
    pub(crate) warp_max_parts: AtomicUsize,
    /// The four-warp parts' count follows the keys as the warp parts' does
    /// (`VELA_CUDA_PARTS_FOLLOW=1`, `set_parts_follow`; off). H200 tg128 (session 19, calls
    /// 1-2): Llama-3-8B Q4_0 528.3 / 527.8 vs 507.5 / 506.8 t/s at depth 512, equal at 0 and
    /// 1024 (the warp parts for head dim 128 are faster: 541-546 at 512); Gemma 3 270M (head dim
    /// 256) 1,883.8 / 1,879.7 vs 1,917.2 / 1,918.8 at 512, 1,815.7 / 1,827.3 vs 1,881.7 /
    /// 1,879.8 at 1024.
    pub(crate) parts_follow: AtomicBool,
    /// Fewest keys for the tensor-core decode where the warp parts follow the keys (head dim
    /// 64): `VELA_CUDA_WARP_FD_MIN_KEYS`, else `VELA_CUDA_FD_MIN_KEYS` when that is set, else
    /// 4,096; `set_flash_decode_min_keys` sets both thresholds.
    pub(crate) warp_fd_min_keys: AtomicUsize,
    /// Largest head dim for which `warp_fd_min_keys` applies (`VELA_CUDA_WARP_FD_HD`, default
    /// 64; 128 measured slower past 1,536 keys, see `attention_impl`).
    warp_fd_hd: usize,
}

/// The device's opt-in shared memory per block in bytes (0 if the query fails).
pub(crate) fn smem_optin(ctx: &Arc<CudaContext>) -> usize {
    let a = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN;
    ctx.attribute(a).map_or(0, |v| v.max(0) as usize)
}

impl FlashDecode {
    pub(crate) fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| anyhow::anyhow!("querying the SM count: {e:?}"))?;
        let num = |k: &str, d: usize| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(d)
        };
        let waves = num("VELA_CUDA_FD_WAVES", 2);
        let part = std::env::var("VELA_CUDA_ATTN_PART").unwrap_or_default();
        Ok(FlashDecode {
            on: AtomicBool::new(!matches!(part.as_str(), "1" | "2" | "3")),
            blocks: waves.max(1) * sms.max(1) as usize,
            min_tiles: num("VELA_CUDA_FD_MIN_TILES", 4).max(1),
            min_keys: AtomicUsize::new(num("VELA_CUDA_FD_MIN_KEYS", 1536)),
            combine_q8: num("VELA_CUDA_COMBINE_Q8", 1) != 0,
            min_blocks: num("VELA_CUDA_FD_MIN_BLOCKS", 32),
            grid_per_tile: std::env::var("VELA_CUDA_FD_GRID").is_ok_and(|v| v == "tiles"),
            d256: AtomicBool::new(num("VELA_CUDA_FD_D256", 1) == 1),
            d512: AtomicBool::new(num("VELA_CUDA_FD_D512", 1) == 1),
            fits: {
                let optin = smem_optin(ctx);
                ["flash_decode_f16_d256", "flash_decode_f16_d512"]
                    .map(|k| optin >= crate::kernels::dyn_smem(k) as usize)
            },
            warp_parts: AtomicU32::new(num("VELA_CUDA_ATTN_WARP", 3).min(3) as u32),
            warp_max_parts: AtomicUsize::new(
                num("VELA_CUDA_WARP_MAX_PARTS", 64).min(SPLIT_MAX_PARTS_V3),
            ),
            parts_follow: AtomicBool::new(num("VELA_CUDA_PARTS_FOLLOW", 0) == 1),
            warp_fd_min_keys: AtomicUsize::new(num(
                "VELA_CUDA_WARP_FD_MIN_KEYS",
                num("VELA_CUDA_FD_MIN_KEYS", 4096),
            )),
            warp_fd_hd: num("VELA_CUDA_WARP_FD_HD", 64),
        })
    }
}

/// Query rows per block of the flash attention kernels (flash.cu).
const FLASH_ROWS: usize = 64;

/// Fewest query rows for the flash attention kernels (fewer: the other kernels, which split
/// the keys of a row over more threads).
const FLASH_MIN_ROWS: usize = 16;

/// Fewest (head, token) blocks for the 4-warp prefill attention kernels.
const ATT_W4_MIN_BLOCKS: usize = 2048;
use crate::kv::kv_suffix;

/// The norms of `norm_rope_qk_store_impl`: q weights, k weights, v weights (Gemma 4) or none, eps.
pub(crate) type RopeNorms<'a> = (
    &'a CudaSlice<f32>,
    &'a CudaSlice<f32>,
    Option<&'a CudaSlice<f32>>,
    f32,
);
use std::sync::atomic::Ordering;
use vela_compute::{AttnParams, Backend, KvType, RopeParams};

impl CudaBackend {
    /// The tensor-core attention kernels (flash.cu) can run: not exact mode (they round Q and P
    /// to 16 bits), sm_80+, an f16/bf16 cache, whole query groups, K and V heads of one of
    /// `dims`.
    fn tensor_core_attention(&self, ty: KvType, p: &AttnParams, dims: &[usize]) -> bool {
        !self.exact.load(Ordering::Relaxed)
            && self.arch >= 80
            && ty != KvType::F32
            && p.n_head_kv > 0
            && p.n_head.is_multiple_of(p.n_head_kv)
            && p.head_dim_k == p.head_dim_v
            && dims.contains(&p.head_dim_k)
    }

    /// Head dims the tensor-core decode attention (`flash_decode_*`) takes now: 64 and 128, and
    /// 256 / 512 when switched on and the device's shared memory holds their kernels.
    pub fn flash_decode_dims(&self) -> &'static [usize] {
        match (
            self.fdec.d256.load(Ordering::Relaxed) && self.fdec.fits[0],
            self.fdec.d512.load(Ordering::Relaxed) && self.fdec.fits[1],
        ) {
            (false, false) => &[64, 128],
            (true, false) => &[64, 128, 256],
            (false, true) => &[64, 128, 512],
            (true, true) => &[64, 128, 256, 512],
        }
    }

    /// The flash prefill kernels apply: head dims 64, 128 or 256, at least `FLASH_MIN_ROWS`
    /// query rows, positions increasing along the batch (the kernel takes a tile's keys from its
    /// first row's window to its last row's position).
    fn flash_applies(&self, ty: KvType, p: &AttnParams, positions: &[u32]) -> bool {
        self.tensor_core_attention(ty, p, &[64, 128, 256])
            && positions.len() >= FLASH_MIN_ROWS
            && positions.windows(2).all(|w| w[1] > w[0])
    }

    pub(crate) fn rope_impl(
        &self,
        x: &mut CudaBuf,
        n_head: usize,
        head_dim: usize,
        positions: &[u32],
        p: &RopeParams,
    ) {
        if positions.is_empty() || p.n_rot == 0 {
            return;
        }
        // Same expression as the CPU backend, so both use the identical f32 ratio.
        let theta_scale = p.freq_base.powf(-2.0 / p.n_rot as f32);
        let ff = p.freq_factors.as_ref().map(|f| self.rope_factors_ptr(f));
        let mut sc = self.scratch();
        let pp = self.positions(&mut sc, positions);
        let args = [
            Arg::P(self.ptr(x)),
            Arg::P(pp),
            Arg::I(n_head as i32),
            Arg::I(head_dim as i32),
            Arg::I(p.n_rot as i32),
            Arg::F(theta_scale),
            Arg::F(p.freq_scale),
            Arg::P(ff.unwrap_or(0)),
            Arg::I(i32::from(p.neox)),
        ];
        self.launch("rope", (positions.len() as u32, 1, 1), 256, &args);
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rope_qk_impl(
        &self,
        q: &mut CudaBuf,
        k: &mut CudaBuf,
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        positions: &[u32],
        p: &RopeParams,
    ) {
        if !self.fuse.load(Ordering::Relaxed) {
            self.rope(q, n_head, head_dim, positions, p);
            self.rope(k, n_head_kv, head_dim, positions, p);
            return;
        }
        if positions.is_empty() || p.n_rot == 0 {
            return;
        }
        let theta_scale = p.freq_base.powf(-2.0 / p.n_rot as f32);
        let ff = p.freq_factors.as_ref().map(|f| self.rope_factors_ptr(f));
        let mut sc = self.scratch();
        let pp = self.positions(&mut sc, positions);
        let args = [
            Arg::P(self.ptr(q)),
            Arg::P(self.ptr(k)),
            Arg::P(pp),
            Arg::I(n_head as i32),
            Arg::I(n_head_kv as i32),
            Arg::I(head_dim as i32),
            Arg::I(p.n_rot as i32),
            Arg::F(theta_scale),
            Arg::F(p.freq_scale),
            Arg::P(ff.unwrap_or(0)),
            Arg::I(i32::from(p.neox)),
        ];
        self.launch("rope_qk", (positions.len() as u32, 2, 1), 256, &args);
    }

    /// `Backend::norm_rope_qk_store`; `norms` = (q weights, k weights, v weights or none, eps).
    /// With the fold on and the per-head kernel applicable, one `rope_norm_store_heads_*`
    /// launch (the norms computed as `rms_norm` computes them); otherwise the unfused ops.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn norm_rope_qk_store_impl(
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
        norms: RopeNorms<'_>,
    ) {
        let l = &kv.layers[layer];
        let (qn, kn, vn, eps) = norms;
        let fold = self.fuse.load(Ordering::Relaxed)
            && p.n_rot != 0
            && l.spec.head_dim_k == head_dim
            && (vn.is_none() || l.spec.head_dim_v == head_dim)
            && self.small_v2.load(Ordering::Relaxed)
            && self.norm_fold.load(Ordering::Relaxed);
        if !fold {
            let n = positions.len();
            if let Some(vn) = vn {
                self.rms_norm_inplace(v, vn, n * n_head_kv, head_dim, eps);
            }
            self.rms_norm_inplace(q, qn, n * n_head, head_dim, eps);
            self.rms_norm_inplace(k, kn, n * n_head_kv, head_dim, eps);
        }
        let norms = fold.then_some(norms);
        self.rope_qk_store_impl(
            q, k, v, kv, layer, n_head, n_head_kv, head_dim, positions, p, norms,
        );
    }

    /// `Backend::rope_qk_store`: RoPE on q and k and the store of k and v (with `norms`: the
    /// fused norms too, see `norm_rope_qk_store_impl`, which checked that the per-head kernel
    /// applies).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rope_qk_store_impl(
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
        norms: Option<RopeNorms<'_>>,
    ) {
        let l = &kv.layers[layer];
        if !self.fuse.load(Ordering::Relaxed) || p.n_rot == 0 || l.spec.head_dim_k != head_dim {
            self.rope_qk(q, k, n_head, n_head_kv, head_dim, positions, p);
            self.kv_store(kv, layer, k, v, positions);
            return;
        }
        if positions.is_empty() {
            return;
        }
        let name = format!("rope_store_{}", kv_suffix(kv.ty));
        let theta_scale = p.freq_base.powf(-2.0 / p.n_rot as f32);
        let ff = p.freq_factors.as_ref().map(|f| self.rope_factors_ptr(f));
        let mut sc = self.scratch();
        let pp = self.positions(&mut sc, positions);
        let mut args = vec![
            Arg::P(self.ptr(q)),
            Arg::P(self.ptr(k)),
            Arg::P(self.ptr(v)),
            Arg::P(pp),
            Arg::P(self.ptr(&l.k)),
            Arg::P(self.ptr(&l.v)),
            Arg::I(n_head as i32),
            Arg::I(n_head_kv as i32),
            Arg::I(head_dim as i32),
            Arg::I(p.n_rot as i32),
            Arg::F(theta_scale),
            Arg::F(p.freq_scale),
            Arg::P(ff.unwrap_or(0)),
            Arg::I(i32::from(p.neox)),
            Arg::I((l.spec.n_head_kv * l.spec.head_dim_k) as i32),
            Arg::I((l.spec.n_head_kv * l.spec.head_dim_v) as i32),
            Arg::I(l.spec.capacity as i32),
        ];
        if self.small_v2.load(Ordering::Relaxed) {
            // One block per q, k and v head (`rope_store_heads`), a thread per rotated pair;
            // with QK norms `rope_norm_store_heads` (256 threads, like rms_norm).
            let heads = (n_head + 2 * n_head_kv) as u32;
            let mut threads = (p.n_rot / 2).clamp(32, 256).next_multiple_of(32) as u32;
            let mut name = name.replace("rope_store", "rope_store_heads");
            if let Some((qn, kn, vn, eps)) = norms {
                let vp = vn.map_or(0, |vn| self.ptr(vn));
                args.extend([
                    Arg::P(self.ptr(qn)),
                    Arg::P(self.ptr(kn)),
                    Arg::P(vp),
                    Arg::F(eps),
                ]);
                threads = 256;
                name = name.replace("rope_store", "rope_norm_store");
            }
            self.launch(&name, (positions.len() as u32, heads, 1), threads, &args);
        } else {
            self.launch(&name, (positions.len() as u32, 3, 1), 256, &args);
        }
    }

    /// Fewest keys (of the longest query row) for the tensor-core decode attention; shorter
    /// rows take the second split-K version (default `VELA_CUDA_FD_MIN_KEYS`, else 1536; 4,096
    /// where the warp parts follow the keys, see `warp_fd_min_keys`: this sets both), except
    /// from 1,024 keys when the kernel runs at least `VELA_CUDA_FD_MIN_BLOCKS` blocks (default 32).
    pub fn set_flash_decode_min_keys(&self, n: usize) {
        self.drop_parked();
        self.flush_recording();
        self.fdec.min_keys.store(n, Ordering::Relaxed);
        self.fdec.warp_fd_min_keys.store(n, Ordering::Relaxed);
    }

    /// The tensor-core decode attention also for head dim 256 (default: on unless
    /// `VELA_CUDA_FD_D256=0`).
    pub fn set_flash_decode_d256(&self, on: bool) {
        self.drop_parked();
        self.flush_recording();
        self.fdec.d256.store(on, Ordering::Relaxed);
    }

    /// The second split-K version's parts on one warp each (`attention_partw_*`): `true` for
    /// every head dim it takes (64, 128, 256), `false` never. The default (`VELA_CUDA_ATTN_WARP`
    /// unset or 3) takes them for head dims 64 and 128.
    pub fn set_attention_warp_parts(&self, on: bool) {
        self.drop_parked();
        self.flush_recording();
        self.fdec.warp_parts.store(on as u32, Ordering::Relaxed);
    }

    /// The warp parts (`attention_partw_*`) run for this cache type and shape where the second
    /// split-K version does (the switch's head dims; 16-bit caches, equal K and V head dims).
    fn warp_parts_run(&self, ty: KvType, p: &AttnParams, d512: bool) -> bool {
        let hd = p.head_dim_k;
        !d512
            && ty != KvType::F32
            && hd == p.head_dim_v
            && match self.fdec.warp_parts.load(Ordering::Relaxed) {
                1 => matches!(hd, 64 | 128 | 256),
                2 => hd == 64,
                3 => matches!(hd, 64 | 128),
                _ => false,
            }
    }

    /// Most parts of the warp parts past one 32-key chunk per part (0: the shape's count;
    /// default `VELA_CUDA_WARP_MAX_PARTS`, else 64).
    pub fn set_warp_max_parts(&self, n: usize) {
        self.drop_parked();
        self.flush_recording();
        self.fdec
            .warp_max_parts
            .store(n.min(SPLIT_MAX_PARTS_V3), Ordering::Relaxed);
    }

    /// The four-warp split-K parts' count follows the keys seen like the warp parts'
    /// (`warp_parts_for`; default: off unless `VELA_CUDA_PARTS_FOLLOW=1`).
    pub fn set_parts_follow(&self, on: bool) {
        self.drop_parked();
        self.flush_recording();
        self.fdec.parts_follow.store(on, Ordering::Relaxed);
    }

    /// The tensor-core decode attention also for head dim 512 (default: on unless
    /// `VELA_CUDA_FD_D512=0`).
    pub fn set_flash_decode_d512(&self, on: bool) {
        self.drop_parked();
        self.flush_recording();
        self.fdec.d512.store(on, Ordering::Relaxed);
    }

    /// Attention of the query rows over the cache layer into `out`. `quant` = (activation kind,
    /// device address): also quantize `out` there for the next product where the decode kernels
    /// can (`attention_combine`: Q8); returns whether they did.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attention_impl(
        &self,
        q: &CudaBuf,
        kv: &CudaKv,
        layer: usize,
        positions: &[u32],
        p: &AttnParams,
        out: &mut CudaBuf,
        quant: Option<(ActKind, u64)>,
    ) -> bool {
        if positions.is_empty() {
            return false;
        }
        assert!(
            p.head_dim_k <= ATT_MAXD_BIG && p.head_dim_v <= ATT_MAXD_BIG,
            "attention: head dimension above {ATT_MAXD_BIG}"
        );
        // Head dims above 256 (Gemma 4's full layers: 512) take the `_d512` instances: split-K
        // parts of the second version for decode, else the 4-warp kernel.
        let d512 = p.head_dim_k > ATT_MAXD || p.head_dim_v > ATT_MAXD;
        let l = &kv.layers[layer];
        let name = format!("attention_{}", kv_suffix(kv.ty));
        let window = p.window.or(l.spec.window).unwrap_or(0);
        let mut sc = self.scratch();
        let pp = self.positions(&mut sc, positions);
        let n_tok = positions.len();
        // Split-K: enough (head, token, part) blocks for two waves over ~132 SMs, and at least
        // one part per `split_keys()` keys of cache capacity (long contexts: more blocks in
        // flight), parts of at least one 32-key chunk; fixed by the shapes (not the position),
        // so recorded steps replay at any position.
        // Third version (opt-in): one block per KV head and part, at least one part per 64 keys
        // of capacity, up to 128 parts.
        let group = p.n_head / p.n_head_kv.max(1);
        let hd = p.head_dim_k;
        // Parts of the tensor-core decode attention: as many as make `fdec.blocks` blocks, but no
        // more than the capacity's tiles give at `min_tiles` per part (the kernel uses fewer when
        // the position has fewer tiles; parts past those write empty records that
        // attention_combine reads: with one part per tile of capacity, Qwen2.5-0.5B at 8K
        // launched 128 parts for 32 non-empty ones). Same parts on the device either way
        // (fd_parts); `VELA_CUDA_FD_GRID=tiles`: one per tile of capacity (before session 10).
        let target = (self.fdec.blocks / (p.n_head_kv.max(1) * n_tok)).max(1);
        let cap_tiles = l.spec.capacity.div_ceil(FD_KEYS);
        let most = if self.fdec.grid_per_tile {
            cap_tiles
        } else {
            cap_tiles.div_ceil(self.fdec.min_tiles)
        };
        let parts = most.min(target).clamp(1, FD_MAX_PARTS);
        // From `min_keys` keys; also from 1,024 keys when it runs at least
        // `VELA_CUDA_FD_MIN_BLOCKS` blocks (default 32: models with many KV heads; 0: never).
        let keys = keys_seen(positions, window);
        let min_blocks = self.fdec.min_blocks;
        // Not for head dim 256: Gemma 4 12B's sliding layers (1,024 keys, 8 KV heads, two query
        // heads each) decode slower on it than on the second version (session 14).
        let wide = min_blocks > 0
            && hd != 256
            && keys >= 1024
            && p.n_head_kv * n_tok * fd_parts_for(keys, parts, self.fdec.min_tiles) >= min_blocks;
        // With the warp parts following the keys (not with the opt-in third version, which
        // would take their place), the tensor-core decode takes over from `warp_fd_min_keys`
        // keys for head dim 64, and for head dim 128 from `min_keys` without the 1,024-key
        // rule. Llama-3-8B Q4_0 tg128 (session 19, call 3): the warp parts at depth 1024 500.6 /
        // 499.4 vs 471.0 / 471.8 t/s, but at 2048 440.5 / 437.8 vs 473.2 / 466.8 and at 3072
        // 409.1 / 409.7 vs 460.4 / 459.0.
        let mut min_keys = self.fdec.min_keys.load(Ordering::Relaxed);
        let warp_follow = self.attn_part_v2.load(Ordering::Relaxed)
            && !self.attn_part3.load(Ordering::Relaxed)
            && self.warp_parts_run(kv.ty, p, d512)
            && self.fdec.warp_max_parts.load(Ordering::Relaxed) > 0;
        if warp_follow && hd <= self.fdec.warp_fd_hd {
            min_keys = self.fdec.warp_fd_min_keys.load(Ordering::Relaxed);
        }
        let wide = wide && !(warp_follow && hd == 128);
        // Default for decode where it applies: tensor-core split-K.
        if self.fdec.on.load(Ordering::Relaxed)
            && self.split_attn.load(Ordering::Relaxed)
            && n_tok <= SPLIT_MAX_ROWS
            && group <= 16
            && self.tensor_core_attention(kv.ty, p, self.flash_decode_dims())
            && (keys >= min_keys || wide)
        {
            // The parts are merged by attention_combine in a launch of its own, which also
            // quantizes for Q8 products.
            let pt = self.attn_partials(n_tok * p.n_head * parts * (hd + 2));
            let args = [
                Arg::P(self.ptr(q)),
                Arg::P(self.ptr(&l.k)),
                Arg::P(self.ptr(&l.v)),
                Arg::P(pp),
                Arg::P(pt),
                Arg::I(p.n_head as i32),
                Arg::I(p.n_head_kv as i32),
                Arg::I(l.spec.capacity as i32),
                Arg::I(window as i32),
                Arg::F(p.scale),
                Arg::F(p.softcap.unwrap_or(0.0)),
                Arg::I(target as i32),
                Arg::I(self.fdec.min_tiles as i32),
            ];
            let name = format!("flash_decode_{}_d{hd}", kv_suffix(kv.ty));
            let grid = (p.n_head_kv as u32, n_tok as u32, parts as u32);
            self.launch(&name, grid, 128, &args);
            let cq = self.combine_quant(quant, hd);
            return self.combine_parts(pt, out, n_tok, p.n_head, hd, parts, cq);
        }
        let v3 = self.attn_part3.load(Ordering::Relaxed)
            && p.n_head_kv > 0
            && p.n_head.is_multiple_of(p.n_head_kv)
            && hd == p.head_dim_v
            && group <= 8
            && hd <= ATT_MAXD
            && hd.is_multiple_of(16)
            && 128 % (hd / 8) == 0;
        let per_kv_head = v3;
        let parts = split_parts(
            per_kv_head,
            d512,
            if per_kv_head { p.n_head_kv } else { p.n_head } * n_tok,
            l.spec.capacity,
            p.head_dim_k,
        );
        let split_ok = n_tok <= SPLIT_MAX_ROWS && parts > 1 && p.head_dim_k.is_multiple_of(4);
        let d512_split = p.head_dim_v.is_multiple_of(8) && 128 % (p.head_dim_v / 8) == 0;
        if self.split_attn.load(Ordering::Relaxed) && split_ok && (!d512 || d512_split) {
            // Second version (default): no per-chunk round trips (see `attention_part2`).
            let v2_fits = p.head_dim_v.is_multiple_of(8) && 128 % (p.head_dim_v / 8) == 0;
            let v2 = v2_fits && (d512 || self.attn_part_v2.load(Ordering::Relaxed));
            let name = format!(
                "attention_part{}_{}{}",
                if v2 { "2" } else { "" },
                kv_suffix(kv.ty),
                if d512 { "_d512" } else { "" }
            );
            let warp = v2 && self.warp_parts_run(kv.ty, p, d512);
            let most = self.fdec.warp_max_parts.load(Ordering::Relaxed);
            // (The four-warp parts follow the keys too with `VELA_CUDA_PARTS_FOLLOW=1`; off by
            // default, see `parts_follow`.)
            let follow = warp || (v2 && !d512 && self.fdec.parts_follow.load(Ordering::Relaxed));
            let parts = if follow && !v3 {
                let chunk = split_chunk(p.head_dim_k);
                warp_parts_for(parts, keys, l.spec.capacity, most, chunk)
            } else {
                parts
            };
            let pt = self.attn_partials(n_tok * p.n_head * parts * (p.head_dim_v + 2));
            let args = [
                Arg::P(self.ptr(q)),
                Arg::P(self.ptr(&l.k)),
                Arg::P(self.ptr(&l.v)),
                Arg::P(pp),
                Arg::P(pt),
                Arg::I(p.n_head as i32),
                Arg::I(p.n_head_kv as i32),
                Arg::I(p.head_dim_k as i32),
                Arg::I(p.head_dim_v as i32),
                Arg::I(l.spec.capacity as i32),
                Arg::I(window as i32),
                Arg::F(p.scale),
                Arg::F(p.softcap.unwrap_or(0.0)),
            ];
            // All part kernels take the same arguments; the third version runs one block per KV
            // head.
            let (name, grid, block) = if v3 {
                let g = if group <= 4 { 4 } else { 8 };
                let name = format!("attention_part3_{}_g{g}", kv_suffix(kv.ty));
                (name, (p.n_head_kv, n_tok, parts), 128)
            } else if warp {
                let name = format!("attention_partw_{}_d{hd}", kv_suffix(kv.ty));
                (name, (p.n_head, n_tok, parts), 32)
            } else {
                (name, (p.n_head, n_tok, parts), 32 * SPLIT_WARPS)
            };
            let grid = (grid.0 as u32, grid.1 as u32, grid.2 as u32);
            self.launch(&name, grid, block, &args);
            let cq = self.combine_quant(quant, p.head_dim_v);
            return self.combine_parts(pt, out, n_tok, p.n_head, p.head_dim_v, parts, cq);
        }
        let mode = self.attn_prefill.load(Ordering::Relaxed);
        if mode == 0 && self.flash_applies(kv.ty, p, positions) {
            // Tensor-core flash attention (flash.cu): 64 query rows per block.
            let name = format!("flash_{}_d{}", kv_suffix(kv.ty), p.head_dim_k);
            let args = [
                Arg::P(self.ptr(q)),
                Arg::P(self.ptr(&l.k)),
                Arg::P(self.ptr(&l.v)),
                Arg::P(pp),
                Arg::P(self.ptr(out)),
                Arg::I(n_tok as i32),
                Arg::I(p.n_head as i32),
                Arg::I(p.n_head_kv as i32),
                Arg::I(l.spec.capacity as i32),
                Arg::I(window as i32),
                Arg::F(p.scale),
                Arg::F(p.softcap.unwrap_or(0.0)),
            ];
            let grid = (p.n_head as u32, n_tok.div_ceil(FLASH_ROWS) as u32, 1);
            self.launch(&name, grid, 128, &args);
            return false;
        }
        if mode == 0 && d512 && self.attention_gemm_applies(kv.ty, p, positions, l.spec.capacity) {
            // Head dims above 256 (Gemma 4's full layers): two tensor-core products through
            // cuBLAS and a row softmax (attn_gemm.rs). On failure the plain kernel below
            // recomputes the whole output.
            match self.attention_gemm(q, l, pp, positions, p, window, out) {
                Ok(()) => return false,
                Err(e) => {
                    eprintln!("vela-cuda: cuBLAS attention failed, using the plain kernel: {e:#}")
                }
            }
        }
        let args = [
            Arg::P(self.ptr(q)),
            Arg::P(self.ptr(&l.k)),
            Arg::P(self.ptr(&l.v)),
            Arg::P(pp),
            Arg::P(self.ptr(out)),
            Arg::I(p.n_head as i32),
            Arg::I(p.n_head_kv as i32),
            Arg::I(p.head_dim_k as i32),
            Arg::I(p.head_dim_v as i32),
            Arg::I(l.spec.capacity as i32),
            Arg::I(window as i32),
            Arg::F(p.scale),
            Arg::F(p.softcap.unwrap_or(0.0)),
        ];
        // Without flash attention: prefill batches (n_head * n_tok >= ATT_W4_MIN_BLOCKS)
        // already fill the GPU with (head, row) work: modes 0 and 1 run 4 warps per row
        // (`attention_*_w4`; a pp512 layer of Llama-3-8B: 870 us on the H200), mode 2 always the
        // 32-warp kernel (1.27 ms, mostly idle warps). (One warp per row with 4 rows per block
        // sharing K/V reads was measured slower in the model: 8B pp512 9,377 vs 9,456 t/s;
        // removed.)
        let big = p.n_head * positions.len() >= ATT_W4_MIN_BLOCKS;
        let (name, warps) = if d512 {
            (format!("{name}_w4_d512"), 4)
        } else if mode != 2 && big {
            (format!("{name}_w4"), 4)
        } else {
            (name.to_string(), ATT_WARPS)
        };
        self.launch(
            &name,
            (p.n_head as u32, positions.len() as u32, 1),
            32 * warps,
            &args,
        );
        false
    }

    /// Device address of the split-K partials buffer, grown to at least `len` floats.
    fn attn_partials(&self, len: usize) -> u64 {
        self.grown_zeroed(&self.attn_part, len, "attention partials")
    }

    /// Device address of the buffer in `m`, replaced by a zeroed one of at least `len` elements
    /// (a power of two) when shorter; recorded steps that used the old one are dropped.
    fn grown_zeroed<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self,
        m: &Mutex<CudaSlice<T>>,
        len: usize,
        what: &str,
    ) -> u64 {
        let mut buf = m.lock().unwrap_or_else(|e| e.into_inner());
        if buf.len() < len {
            *buf = self
                .stream
                .alloc_zeros::<T>(len.next_power_of_two())
                .unwrap_or_else(|e| panic!("CUDA alloc of {what}: {e:?}"));
            self.scratch_moved();
        }
        self.ptr(&*buf)
    }
}

impl CudaBackend {
    /// Where the combine may also quantize its output for the next product: Q8 activations with
    /// whole 32-element blocks per head and the switch on (`VELA_CUDA_COMBINE_Q8`, default).
    /// (Q8_K products get a `quantize_q8k` launch: `attention_combine_q8k`, which merged and
    /// quantized them, measured slower on the 8B Q4_K_M in session 11 and was removed.)
    fn combine_quant(&self, quant: Option<(ActKind, u64)>, hdv: usize) -> Option<(ActKind, u64)> {
        quant.filter(|&(k, _)| {
            matches!(k, ActKind::Q8) && hdv.is_multiple_of(32) && self.fdec.combine_q8
        })
    }

    /// Merge `parts` split-K partial results per (token, head) (`attention_part2`'s layout at
    /// `pt`) into `out` with `attention_combine`; with `quant` (from [`Self::combine_quant`]),
    /// also quantized there (returns whether it was).
    #[allow(clippy::too_many_arguments)]
    fn combine_parts(
        &self,
        pt: u64,
        out: &mut CudaBuf,
        n_tok: usize,
        n_head: usize,
        hdv: usize,
        parts: usize,
        quant: Option<(ActKind, u64)>,
    ) -> bool {
        let args = [
            Arg::P(pt),
            Arg::P(self.ptr(out)),
            Arg::I(n_head as i32),
            Arg::I(hdv as i32),
            Arg::I(parts as i32),
            Arg::P(quant.map_or(0, |q| q.1)),
        ];
        // Four groups of parts (two above 256) × the value dimension rounded up to a warp
        // (at most 1,024 threads).
        let hdv32 = (hdv.div_ceil(32) * 32).max(32);
        let block = ((1024 / hdv32).min(4) * hdv32) as u32;
        self.launch(
            "attention_combine",
            (n_head as u32, n_tok as u32, 1),
            block,
            &args,
        );
        quant.is_some()
    }
}
