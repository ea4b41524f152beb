//! RoPE (alone, q+k, q+k with the KV store) and attention (one block per head and token, or
//! split-K for decode) of the CUDA backend.

use crate::attn_parts::{
    fd_parts_for, keys_seen, split_chunk, split_parts, warp_parts_for, FD_KEYS,
};
use crate::backend::CudaBackend;
use crate::device::Arg;
use crate::kernels::dyn_smem;
use crate::kv::{kv_suffix, CudaKv};
use crate::weight::{ActKind, CudaBuf};
use cudarc::driver::CudaSlice;
use vela_compute::{AttnParams, Backend, KvType, RopeParams};

/// Largest head dimension of the attention kernels' default instances (`ATT_MAXD`).
pub(crate) const ATT_MAXD: usize = 256;
/// Largest head dimension at all (`ATT_MAXD_BIG`: the `_d512` instances, e.g. Gemma 4's full
/// attention layers).
pub(crate) const ATT_MAXD_BIG: usize = 512;
/// Warps per attention thread block (`ATT_WARPS` in attention.cu).
const ATT_WARPS: u32 = 32;
/// Warps per split-K attention block (`SPLIT_WARPS`) and the most query rows it is used for.
const SPLIT_WARPS: u32 = 4;
const SPLIT_MAX_ROWS: usize = 4;

/// Most parts of the tensor-core decode attention (`FD_MAX_PARTS` in flash.cu), which is also
/// the most `attention_combine` and the tail combine merge (`COMBINE_MAX` in attention.cu).
const FD_MAX_PARTS: usize = 128;

/// Blocks the tensor-core decode attention's parts aim for per launch, per SM.
const FD_WAVES: usize = 2;

/// Fewest 64-key tiles per part of the tensor-core decode attention.
const FD_MIN_TILES: usize = 4;

/// Fewest blocks (KV heads × tokens × non-empty parts) for which the tensor-core decode also
/// runs from 1,024 keys, below its key threshold: Llama-3-8B Q4_0 at 1,024 keys (32 blocks)
/// 448 vs 418 tok/s, Qwen2.5-0.5B (2 KV heads, 8 blocks) slower (docs/perf-log.md).
const FD_MIN_BLOCKS: usize = 32;

/// Most parts of the one-warp split-K parts once the keys fill more than one 32-key chunk per
/// part (`warp_parts_for`): Qwen2.5-0.5B at 1,024 keys 1,475 vs 1,419 tok/s (docs/perf-log.md).
const WARP_MAX_PARTS: usize = 64;

/// Largest head dim for which the one-warp parts' own key threshold applies
/// (`FLASH_DECODE_MIN_KEYS_WARP`); head dim 128 was slower past 1,536 keys (see
/// `attention_impl`).
const WARP_FD_HD: usize = 64;

/// Query rows per block of the flash attention kernels (flash.cu).
const FLASH_ROWS: usize = 64;

/// Fewest query rows for the flash attention kernels (fewer: the other kernels, which split
/// the keys of a row over more threads).
const FLASH_MIN_ROWS: usize = 16;

/// Fewest (head, token) blocks for the 4-warp prefill attention kernels.
const ATT_W4_MIN_BLOCKS: usize = 2048;

/// The norms of `norm_rope_qk_store_impl`: q weights, k weights, v weights (Gemma 4) or none, eps.
pub(crate) type RopeNorms<'a> = (
    &'a CudaSlice<f32>,
    &'a CudaSlice<f32>,
    Option<&'a CudaSlice<f32>>,
    f32,
);

impl CudaBackend {
    /// The tensor-core attention kernels (flash.cu) can run: not exact mode (they round Q and P
    /// to 16 bits), sm_80+, an f16/bf16 cache, whole query groups, K and V heads of one of
    /// `dims`.
    fn tensor_core_attention(&self, ty: KvType, p: &AttnParams, dims: &[usize]) -> bool {
        !self.tune.exact()
            && self.dev.arch >= 80
            && ty != KvType::F32
            && p.n_head_kv > 0
            && p.n_head.is_multiple_of(p.n_head_kv)
            && p.head_dim_k == p.head_dim_v
            && dims.contains(&p.head_dim_k)
    }

    /// Head dims the tensor-core decode attention (`flash_decode_*`) takes: 64 and 128, and
    /// 256 / 512 where the device's opt-in shared memory per block holds their kernels (140 /
    /// 149 KiB; an H200 has 227, an sm_86/89 GPU 99).
    pub fn flash_decode_dims(&self) -> &'static [usize] {
        let fits = |k: &str| self.dev.smem_optin >= dyn_smem(k) as usize;
        match (fits("flash_decode_f16_d256"), fits("flash_decode_f16_d512")) {
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
        let mut sc = self.scratch();
        let pp = self.positions(&mut sc, positions);
        drop(sc);
        self.rope_at(x, positions.len(), pp, n_head, head_dim, p);
    }

    /// [`Self::rope_impl`] of `rows` rows at the positions in device memory at `pp`.
    pub(crate) fn rope_at(
        &self,
        x: &mut CudaBuf,
        rows: usize,
        pp: u64,
        n_head: usize,
        head_dim: usize,
        p: &RopeParams,
    ) {
        if rows == 0 || p.n_rot == 0 {
            return;
        }
        // Same expression as the CPU backend, so both use the identical f32 ratio.
        let theta_scale = p.freq_base.powf(-2.0 / p.n_rot as f32);
        let ff = p.freq_factors.as_ref().map(|f| self.rope_factors_ptr(f));
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
        self.launch("rope", (rows as u32, 1, 1), 256, &args);
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
    /// Where the per-head kernel applies, one `rope_norm_store_heads_*` launch (the norms
    /// computed as `rms_norm` computes them); otherwise the unfused ops.
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
        kvt: u64,
    ) {
        let l = &kv.layers[layer];
        let (qn, kn, vn, eps) = norms;
        let fold = p.n_rot != 0
            && l.spec.head_dim_k == head_dim
            && (vn.is_none() || l.spec.head_dim_v == head_dim);
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
            q, k, v, kv, layer, n_head, n_head_kv, head_dim, positions, p, norms, kvt,
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
        kvt: u64,
    ) {
        if kvt == 0 {
            // (With a table, the rows belong to several caches, each ensured by its caller.)
            self.kv_ensure(kv, layer, positions);
        }
        let l = &kv.layers[layer];
        if p.n_rot == 0 || l.spec.head_dim_k != head_dim {
            assert!(
                kvt == 0,
                "rope_qk_store: a K/V table needs the per-head kernel"
            );
            self.rope_qk(q, k, n_head, n_head_kv, head_dim, positions, p);
            self.kv_store(kv, layer, k, v, positions);
            return;
        }
        if positions.is_empty() {
            return;
        }
        let theta_scale = p.freq_base.powf(-2.0 / p.n_rot as f32);
        let ff = p.freq_factors.as_ref().map(|f| self.rope_factors_ptr(f));
        let mut sc = self.scratch();
        let pp = self.positions(&mut sc, positions);
        let mut args = vec![
            Arg::P(self.ptr(q)),
            Arg::P(self.ptr(k)),
            Arg::P(self.ptr(v)),
            Arg::P(pp),
            Arg::P(l.k.ptr()),
            Arg::P(l.v.ptr()),
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
        // One block per q, k and v head (`rope_store_heads`), a thread per rotated pair;
        // with QK norms `rope_norm_store_heads` (256 threads, like rms_norm).
        let heads = (n_head + 2 * n_head_kv) as u32;
        let mut threads = (p.n_rot / 2).clamp(32, 256).next_multiple_of(32) as u32;
        let mut name = format!("rope_store_heads_{}", kv_suffix(kv.ty));
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
        args.push(Arg::P(kvt));
        self.launch(&name, (positions.len() as u32, heads, 1), threads, &args);
    }

    /// The split-K parts run on one warp each (`attention_partw_*`) for this cache type and
    /// shape: 16-bit caches, equal K and V head dims of 64 or 128. Head dim 128: Llama-3-8B Q4_0
    /// 566 vs 560 tok/s; head dim 256 (Gemma 3 270M) was slower (docs/perf-log.md).
    fn warp_parts_run(ty: KvType, p: &AttnParams, d512: bool) -> bool {
        let hd = p.head_dim_k;
        !d512 && ty != KvType::F32 && hd == p.head_dim_v && matches!(hd, 64 | 128)
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
        kvt: u64,
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
        let group = p.n_head / p.n_head_kv.max(1);
        let hd = p.head_dim_k;
        // Parts of the tensor-core decode attention: as many as make FD_WAVES blocks per SM,
        // but no more than the capacity's tiles give at `FD_MIN_TILES` per part (the kernel
        // uses fewer when the position has fewer tiles; parts past those write empty records
        // that attention_combine reads). Same parts on the device either way (fd_parts).
        let target = (FD_WAVES * self.dev.sms / (p.n_head_kv.max(1) * n_tok)).max(1);
        let cap_tiles = l.spec.capacity.div_ceil(FD_KEYS);
        let most = cap_tiles.div_ceil(FD_MIN_TILES);
        let parts = most.min(target).clamp(1, FD_MAX_PARTS);
        // From `min_keys` keys; also from 1,024 keys when it runs at least FD_MIN_BLOCKS blocks
        // (models with many KV heads).
        let keys = keys_seen(positions, window);
        // Not for head dim 256: Gemma 4 12B's sliding layers (1,024 keys, 8 KV heads, two query
        // heads each) decode slower on it than on the split-K parts.
        let wide = hd != 256
            && keys >= 1024
            && p.n_head_kv * n_tok * fd_parts_for(keys, parts, FD_MIN_TILES) >= FD_MIN_BLOCKS;
        // Where the one-warp parts run (their count following the keys), the tensor-core decode
        // takes over from `min_keys_warp` keys for head dim 64, and for head dim 128 from
        // `min_keys` without the 1,024-key rule: Llama-3-8B Q4_0 with the warp parts 500 vs 471
        // tok/s at 1,024 keys, 438 vs 470 at 2,048 (docs/perf-log.md).
        let (mut min_keys, min_keys_warp) = self.tune.fd_min_keys();
        let warp_follow = Self::warp_parts_run(kv.ty, p, d512);
        if warp_follow && hd <= WARP_FD_HD {
            min_keys = min_keys_warp;
        }
        let wide = wide && !(warp_follow && hd == 128);
        // Decode where it applies: tensor-core split-K.
        // With a K/V table (rows of different sequences, `rope_store_attend_batch`) every row is
        // a decode row of its own sequence: the split-K kernels at any row count, never the
        // prefill kernels, which share K/V tiles between rows.
        let split_rows = n_tok <= SPLIT_MAX_ROWS || kvt != 0;
        if split_rows
            && group <= 16
            && self.tensor_core_attention(kv.ty, p, self.flash_decode_dims())
            && (keys >= min_keys || wide)
        {
            // The parts are merged by attention_combine in a launch of its own, which also
            // quantizes for Q8 products.
            let pt = self.attn_partials(n_tok * p.n_head * parts * (hd + 2));
            let args = [
                Arg::P(self.ptr(q)),
                Arg::P(l.k.ptr()),
                Arg::P(l.v.ptr()),
                Arg::P(pp),
                Arg::P(pt),
                Arg::I(p.n_head as i32),
                Arg::I(p.n_head_kv as i32),
                Arg::I(l.spec.capacity as i32),
                Arg::I(window as i32),
                Arg::F(p.scale),
                Arg::F(p.softcap.unwrap_or(0.0)),
                Arg::I(target as i32),
                Arg::I(FD_MIN_TILES as i32),
                Arg::P(kvt),
            ];
            let name = format!("flash_decode_{}_d{hd}", kv_suffix(kv.ty));
            let grid = (p.n_head_kv as u32, n_tok as u32, parts as u32);
            self.launch(&name, grid, 128, &args);
            let cq = combine_quant(quant, hd);
            return self.combine_parts(pt, out, n_tok, p.n_head, hd, parts, cq);
        }
        let parts = split_parts(d512, p.n_head * n_tok, l.spec.capacity, p.head_dim_k);
        let split_ok = split_rows && parts > 1 && p.head_dim_k.is_multiple_of(4);
        // The second split-K version (`attention_part2`: no per-chunk round trips) takes value
        // dims whose 8-element pieces divide 128 threads; others the first (`attention_part`).
        let v2 = p.head_dim_v.is_multiple_of(8) && 128 % (p.head_dim_v / 8) == 0;
        if split_ok && (!d512 || v2) {
            let name = format!(
                "attention_part{}_{}{}",
                if v2 { "2" } else { "" },
                kv_suffix(kv.ty),
                if d512 { "_d512" } else { "" }
            );
            // The one-warp parts' count follows the keys seen (one part per chunk, see
            // `warp_parts_for`); the four-warp parts' count is the shape's.
            let warp = v2 && Self::warp_parts_run(kv.ty, p, d512);
            let parts = if warp {
                let chunk = split_chunk(p.head_dim_k);
                warp_parts_for(parts, keys, l.spec.capacity, WARP_MAX_PARTS, chunk)
            } else {
                parts
            };
            let pt = self.attn_partials(n_tok * p.n_head * parts * (p.head_dim_v + 2));
            let args = [
                Arg::P(self.ptr(q)),
                Arg::P(l.k.ptr()),
                Arg::P(l.v.ptr()),
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
                Arg::P(kvt),
            ];
            // Both part kernels take the same arguments.
            let (name, block) = if warp {
                (format!("attention_partw_{}_d{hd}", kv_suffix(kv.ty)), 32)
            } else {
                (name, 32 * SPLIT_WARPS)
            };
            let grid = (p.n_head as u32, n_tok as u32, parts as u32);
            self.launch(&name, grid, block, &args);
            let cq = combine_quant(quant, p.head_dim_v);
            return self.combine_parts(pt, out, n_tok, p.n_head, p.head_dim_v, parts, cq);
        }
        if kvt == 0 && self.flash_applies(kv.ty, p, positions) {
            // Tensor-core flash attention (flash.cu): 64 query rows per block.
            let name = format!("flash_{}_d{}", kv_suffix(kv.ty), p.head_dim_k);
            let args = [
                Arg::P(self.ptr(q)),
                Arg::P(l.k.ptr()),
                Arg::P(l.v.ptr()),
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
        if kvt == 0 && d512 && self.attention_gemm_applies(kv.ty, p, positions, l.spec.capacity) {
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
            Arg::P(l.k.ptr()),
            Arg::P(l.v.ptr()),
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
            Arg::P(kvt),
        ];
        // Without flash attention: prefill batches (n_head * n_tok >= ATT_W4_MIN_BLOCKS)
        // already fill the GPU with (head, row) work and run 4 warps per row (`attention_*_w4`;
        // a pp512 layer of Llama-3-8B: 870 us on the H200 against 1.27 ms with 32 warps, mostly
        // idle); smaller batches the 32-warp kernel.
        let big = p.n_head * positions.len() >= ATT_W4_MIN_BLOCKS;
        let (name, warps) = if d512 {
            (format!("{name}_w4_d512"), 4)
        } else if big {
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
}

/// Where the combine may also quantize its output for the next product: Q8 activations with
/// whole 32-element blocks per head. (Q8_K products get a `quantize_q8k` launch: merging and
/// quantizing them in the combine was slower on Llama-3-8B Q4_K_M, docs/perf-log.md.)
fn combine_quant(quant: Option<(ActKind, u64)>, hdv: usize) -> Option<(ActKind, u64)> {
    quant.filter(|&(k, _)| matches!(k, ActKind::Q8) && hdv.is_multiple_of(32))
}

impl CudaBackend {
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
