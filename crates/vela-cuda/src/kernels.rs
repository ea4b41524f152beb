//! The CUDA C kernel sources (one file per group under `kernels/`), their run-time compilation
//! with NVRTC and the on-disk cache of the compiled modules.
//!
//! A module is cached under `$VELA_CACHE/cuda-kernels/<group>-<hash>.cubin`, where the hash
//! (FNV-1a 64) covers the source, the target architecture and the NVRTC version, so a changed
//! kernel, GPU or compiler recompiles and everything else loads instantly.

use crate::nvrtc::{Nvrtc, Target};
use anyhow::{Context, Result};
use std::path::PathBuf;

/// Prelude prepended to every group (types, f16 conversion, dp4a, warp reductions).
pub const COMMON: &str = include_str!("../kernels/common.cu");

/// The kernel groups: (name, source without the prelude). The "quant" group is quant.cu
/// followed by matvec.cu, mmq.cu and experts.cu, the "attention" group attention.cu followed by flash.cu,
/// the "recurrent" group recurrent.cu followed by sparse.cu.
pub const GROUPS: &[(&str, &str)] = &[
    (
        "quant",
        concat!(
            include_str!("../kernels/quant.cu"),
            include_str!("../kernels/matvec.cu"),
            include_str!("../kernels/mmq.cu"),
            include_str!("../kernels/experts.cu")
        ),
    ),
    ("elementwise", include_str!("../kernels/elementwise.cu")),
    (
        "attention",
        concat!(
            include_str!("../kernels/attention.cu"),
            include_str!("../kernels/flash.cu")
        ),
    ),
    ("sample", include_str!("../kernels/sample.cu")),
    ("kit", include_str!("../kernels/kit.cu")),
    (
        "recurrent",
        concat!(
            include_str!("../kernels/recurrent.cu"),
            include_str!("../kernels/sparse.cu")
        ),
    ),
    ("compressed", include_str!("../kernels/compressed.cu")),
];

/// Every kernel the backend launches, per group (also checked by `tests/ptx.rs`).
pub const KERNEL_NAMES: &[(&str, &[&str])] = &[
    (
        "quant",
        &[
            "mv_mix32_x3",
            "mv_mix32_x3b",
            "mv_mixk_x3",
            "mv_mixk_x3b",
            "quantize_q8",
            "quantize_q8k",
            "mm_q4_0_t8",
            "mm_q4_0s_t8",
            "mm_q4_1_t8",
            "mm_q5_0_t8",
            "mm_q5_1_t8",
            "mm_q8_0_t8",
            "mm_q5_k_t8",
            "mm_q4_ks_t8",
            "mm_q6_ks_t8",
            "mm_f32_t1",
            "mm_f32_b1",
            "mm_f32_t8",
            "mm_f16_t1",
            "mm_f16_b1",
            "mm_f16_t8",
            "get_rows_f32",
            "get_rows_f16",
            "get_rows_q4_0",
            "get_rows_q4_0s",
            "get_rows_q4_1",
            "get_rows_q5_0",
            "get_rows_q5_1",
            "get_rows_q8_0",
            "get_rows_q5_k",
            "get_rows_q4_ks",
            "get_rows_q6_ks",
            "norm_q8",
            "norm_q8k",
            "norm_q8_regs",
            "norm_q8k_regs",
            "norm_q8_post_regs",
            "norm_q8k_post_regs",
            "mmx_f32",
            "mmx_f16",
            "mmx_q4_0",
            "mmx_q4_0s",
            "mmx_q4_1",
            "mmx_q5_0",
            "mmx_q5_1",
            "mmx_q8_0",
            "mmx_q5_k",
            "mmx_q4_ks",
            "mmx_q6_ks",
            "mv_q4_0",
            "mv_q4_0s",
            "act_mma",
            "mmq_q4_0s_1",
            "mmq_q4_0s_2",
            "mmq_q4_0s_4",
            "mmq_q4_0s_8",
            "act_mma_e",
            "mmqe_q4_0s_1",
            "mmqe_q4_0s_2",
            "mmqe_q4_0s_4",
            "mmqe_q4_0s_8",
            "act_mma_k",
            "mmq_q6_ks_1",
            "mmq_q6_ks_2",
            "mmq_q6_ks_4",
            "mv_q4_1",
            "mv_q5_0",
            "mv_q5_1",
            "mv_q8_0",
            "mv_q5_k",
            "mv_q4_ks",
            "mv_q6_ks",
            "mv_q4_0_x3",
            "mv_q4_0s_x3",
            "mv_q4_1_x3",
            "mv_q5_0_x3",
            "mv_q5_1_x3",
            "mv_q8_0_x3",
            "mv_q5_k_x3",
            "mv_q4_ks_x3",
            "mv_q6_ks_x3",
            "mv_q4_0_r2",
            "mv_q4_0s_r2",
            "mv_q4_1_r2",
            "mv_q5_0_r2",
            "mv_q5_1_r2",
            "mv_q8_0_r2",
            "mv_q5_k_r2",
            "mv_q4_ks_r2",
            "mv_q6_ks_r2",
            "mv_q4_0_x3_r2",
            "mv_q4_0s_x3_r2",
            "mv_q4_1_x3_r2",
            "mv_q5_0_x3_r2",
            "mv_q5_1_x3_r2",
            "mv_q8_0_x3_r2",
            "mv_q5_k_x3_r2",
            "mv_q4_ks_x3_r2",
            "mv_q6_ks_x3_r2",
            "mv_q8_0_r2n",
            "act_q8_silu",
            "act_q8_gelu",
            "act_q8k_silu",
            "act_q8k_gelu",
            "deqh_f32",
            "deqh_f16",
            "deqh_q4_0",
            "deqh_q4_0s",
            "deqh_q4_1",
            "deqh_q5_0",
            "deqh_q5_1",
            "deqh_q8_0",
            "deqh_q5_k",
            "deqh_q4_ks",
            "deqh_q6_ks",
            "deqhb_f32",
            "deqhb_f16",
            "deqhb_q4_0",
            "deqhb_q4_0s",
            "deqhb_q4_1",
            "deqhb_q5_0",
            "deqhb_q5_1",
            "deqhb_q8_0",
            "deqhb_q5_k",
            "deqhb_q4_ks",
            "deqhb_q6_ks",
            "to_f16",
            "repack_q4_0",
            "repack_q4_k",
            "repack_q6_k",
            "experts_group",
            "mmeg_q4_0",
            "mmeg_q4_0s",
            "mmeg_q4_1",
            "mmeg_q5_0",
            "mmeg_q5_1",
            "mmeg_q8_0",
            "mmeg_q5_k",
            "mmeg_q4_ks",
            "mmeg_q6_ks",
            "mme_q4_0",
            "mme_q4_0s",
            "mme_q4_1",
            "mme_q5_0",
            "mme_q5_1",
            "mme_q8_0",
            "mme_q5_k",
            "mme_q4_ks",
            "mme_q6_ks",
            "mme_f32",
            "mme_f16",
            "mmex_f32",
            "mmex_f16",
            "mmex_q4_0",
            "mmex_q4_0s",
            "mmex_q4_1",
            "mmex_q5_0",
            "mmex_q5_1",
            "mmex_q8_0",
            "mmex_q5_k",
            "mmex_q4_ks",
            "mmex_q6_ks",
        ],
    ),
    (
        "elementwise",
        &[
            "rms_norm",
            "prefetch_l2",
            "rope",
            "rope_qk",
            "rope_store_heads_f32",
            "rope_store_heads_f16",
            "rope_store_heads_bf16",
            "rope_norm_store_heads_f32",
            "rope_norm_store_heads_f16",
            "rope_norm_store_heads_bf16",
            "add",
            "add_bias",
            "scale",
            "act_mul_silu",
            "act_mul_gelu",
            "softcap",
            "copy_f32",
            "argmax_part",
            "argmax_final",
            "argmax_final_io",
        ],
    ),
    (
        "attention",
        &[
            "kv_store_f32",
            "kv_store_f16",
            "kv_store_bf16",
            "attention_f32",
            "attention_f16",
            "attention_f32_w4",
            "attention_f16_w4",
            "attention_bf16",
            "attention_bf16_w4",
            "attention_part_f32",
            "attention_part_f16",
            "attention_part2_f32",
            "attention_part2_f16",
            "attention_part2_bf16",
            "attention_partw_f16_d64",
            "attention_partw_f16_d128",
            "attention_partw_bf16_d64",
            "attention_partw_bf16_d128",
            "attention_part_bf16",
            "attention_combine",
            "attention_f32_w4_d512",
            "attention_part2_f32_d512",
            "attention_f16_w4_d512",
            "attention_part2_f16_d512",
            "attention_bf16_w4_d512",
            "attention_part2_bf16_d512",
            "attn_softmax_f16",
            "flash_f16_d64",
            "flash_f16_d128",
            "flash_bf16_d64",
            "flash_bf16_d128",
            "flash_f16_d256",
            "flash_bf16_d256",
            "flash_decode_f16_d64",
            "flash_decode_f16_d128",
            "flash_decode_bf16_d64",
            "flash_decode_bf16_d128",
            "flash_decode_f16_d256",
            "flash_decode_bf16_d256",
            "flash_decode_f16_d512",
            "flash_decode_bf16_d512",
        ],
    ),
    ("sample", &["topk_rows", "topk_part", "topk_merge"]),
    (
        "kit",
        &[
            "kit_softmax_rows",
            "kit_sigmoid",
            "kit_mul",
            "kit_act_mul_split",
            "kit_gather_rows",
            "kit_scatter_add_rows",
            "kit_route",
            "kit_route_hash",
        ],
    ),
    (
        "recurrent",
        &[
            "rec_conv1d_causal",
            "rec_sum_rows",
            "rec_decay_gate",
            "rec_signed_sqrt_gate",
            "rec_gated_delta_rule",
            "rec_mean_streams",
            "rec_inject_streams",
            "rec_rms_norm_grouped",
            "sparse_index_scores",
            "sparse_index_select",
            "sparse_attention",
            "sparse_scores_t",
            "sparse_topk",
            "sparse_attn_part",
            "sparse_attn_combine",
            "store_rows_at",
            "sparse_pool_mean",
            "sparse_pool_store",
            "fu_silu_scaled",
            "fu_sigmoid_scaled",
            "fu_sigmoid_mul",
            "fu_sigmoid_mix_streams",
            "fu_delta_gates",
        ],
    ),
    (
        "compressed",
        &[
            "dsv4_mhc_weights",
            "dsv4_mhc_collapse",
            "dsv4_mhc_expand",
            "dsv4_rope_trailing",
            "dsv4_compress_pool",
            "dsv4_compress_pool_at",
            "dsv4_lightning_scores",
            "dsv4_lightning_select",
            "dsv4_attention_sink",
            "dsv4_attn_sink_part",
            "dsv4_attn_sink_combine",
            "dsv4_act_mul_silu_limit",
        ],
    ),
];

/// Dynamic shared memory of a kernel in bytes (0: static only). The tensor-core decode attention
/// (`flash_decode_*`, flash.cu) holds the 16 Q rows and `FD_STAGES` = 2 K and V tiles of
/// `FD_KEYS` = 64 rows, each row padded by 8 elements: (16 + 2 * 2 * 64) * (D + 8) * 2 bytes
/// (head dim 512: its own layout, one stage).
pub fn dyn_smem(name: &str) -> u32 {
    if !name.starts_with("flash_decode_") {
        return 0;
    }
    let d: u32 = match name.rsplit_once("_d") {
        Some((_, "64")) => 64,
        Some((_, "256")) => 256,
        // `flash_decode_d512`: Q, one K and V stage, and the P tile of 16 x 72.
        Some((_, "512")) => return (16 + 2 * 64) * (512 + 8) * 2 + 16 * 72 * 2,
        _ => 128,
    };
    (16 + 2 * 2 * 64) * (d + 8) * 2
}

/// The full source NVRTC compiles for a group: the common prelude, then the group.
pub fn source(group_src: &str) -> String {
    format!("{COMMON}\n{group_src}")
}

/// 64-bit FNV-1a (stable across Rust versions, unlike `DefaultHasher`).
pub fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // Separator so ("ab","c") and ("a","bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// `$VELA_CACHE/cuda-kernels`.
pub fn cache_dir() -> PathBuf {
    vela_formats::testdata::cache_dir().join("cuda-kernels")
}

/// Compile (or load from the cache) one group as CUBIN for `sm_<arch>`; returns the image and
/// whether it came from the cache.
pub fn cubin(nvrtc: &Nvrtc, group: &str, group_src: &str, arch: u32) -> Result<(Vec<u8>, bool)> {
    let src = source(group_src);
    let (ma, mi) = nvrtc.version()?;
    let ver = format!("{ma}.{mi}");
    let key = fnv1a(&[src.as_bytes(), arch.to_string().as_bytes(), ver.as_bytes()]);
    let path = cache_dir().join(format!("{group}-sm{arch}-{key:016x}.cubin"));
    if let Ok(bytes) = std::fs::read(&path) {
        if !bytes.is_empty() {
            return Ok((bytes, true));
        }
    }
    let bin = nvrtc
        .compile(&src, &format!("{group}.cu"), Target::Cubin(arch))
        .with_context(|| format!("NVRTC {ver} at {}", nvrtc.path))?;
    // The cache is best effort: a read-only or missing home only costs a recompile next time.
    // Write to a temporary name and rename so a concurrent reader never sees a partial file.
    if std::fs::create_dir_all(cache_dir()).is_ok() {
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, &bin).is_ok() {
            let _ = std::fs::rename(&tmp, &path);
        }
    }
    Ok((bin, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_depends_on_every_part_and_boundaries() {
        let a = fnv1a(&[b"src", b"90", b"12.9"]);
        assert_ne!(a, fnv1a(&[b"src", b"89", b"12.9"]));
        assert_ne!(a, fnv1a(&[b"src", b"90", b"13.0"]));
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
        assert_eq!(a, fnv1a(&[b"src", b"90", b"12.9"]));
    }

    /// The decode attention's dynamic shared memory per head dim (two stages; 512: one stage
    /// and the P tile), within the H200's 227 KiB per block.
    #[test]
    fn flash_decode_shared_memory() {
        assert_eq!(dyn_smem("flash_decode_f16_d64"), (16 + 256) * 72 * 2);
        assert_eq!(dyn_smem("flash_decode_bf16_d128"), (16 + 256) * 136 * 2);
        assert_eq!(dyn_smem("flash_decode_f16_d256"), 143_616);
        assert_eq!(dyn_smem("flash_decode_bf16_d512"), 152_064);
        assert_eq!(dyn_smem("attention_combine"), 0);
        assert!(dyn_smem("flash_decode_f16_d512") <= 227 << 10);
    }

    #[test]
    fn every_group_has_kernels() {
        for (name, src) in GROUPS {
            assert!(src.contains("__global__"), "{name} has no kernels");
        }
    }

    /// With programmatic dependent launch a kernel may start before the previous one ends, so
    /// every block of every kernel must pass `griddepcontrol.wait` before it touches shared
    /// data: each `__global__` body starts with `PDL_ENTRY();` (after a batched step's
    /// `KVT_ROW(...);` and a `KV_PF(...);` L2 hint),
    /// or with `X_ENTRY();` where the kernel's function calls `X_RESUME();` once after reading
    /// only constants (weights, positions).
    #[test]
    fn every_kernel_waits() {
        let mut n = 0;
        for (name, src) in GROUPS {
            let mut rest = *src;
            while let Some(i) = rest.find("__global__ void") {
                rest = &rest[i + 15..];
                // The body starts after the parameter list.
                let close = rest.find(')').expect("parameter list");
                let open = close + rest[close..].find('{').expect("kernel body");
                let head: String = rest[..close].chars().take(60).collect();
                let body = rest[open + 1..].trim_start();
                // The matvecs wait inside their products, after the first weight loads
                // (MV_ENTRY / MV_RESUME in kernels/matvec.cu, checked below).
                // The decode attention's parts first ask L2 for their older keys (KV_PF in
                // kernels/attention.cu: prefetch hints only, no load whose value is used).
                // A batched step's kernels first take their row's K/V cache bases from the
                // step's table (KVT_ROW in kernels/common.cu: uploaded before the step, like the
                // positions, never written by a kernel).
                let body = match body.strip_prefix("KVT_ROW(") {
                    Some(b) => b[b.find("); ").expect("KVT_ROW(...);") + 3..].trim_start(),
                    None => body,
                };
                let body = match body.strip_prefix("KV_PF(") {
                    Some(b) => b[b.find("); ").expect("KV_PF(...);") + 3..].trim_start(),
                    None => body,
                };
                // X_ENTRY(); of a group that defines it: MV_ENTRY (the matvecs), NORM_ENTRY (the
                // pre-norms), ROPE_ENTRY (RoPE + store), each paired with a X_RESUME() that waits.
                let entry = body.split_once("();").map_or("", |(e, _)| e);
                assert!(
                    body.starts_with("PDL_ENTRY();")
                        || (entry.ends_with("_ENTRY")
                            && !entry.contains(' ')
                            && src.contains(&format!("#define {entry}() do {{}} while (0)"))
                            && src.contains(&format!(
                                "#define {}() pdl_resume()",
                                entry.replace("_ENTRY", "_RESUME")
                            ))),
                    "{name}: kernel {head}... does not start with PDL_ENTRY()"
                );
                n += 1;
            }
        }
        assert!(n > 40, "only {n} kernels found");
        // Every function behind an X_ENTRY kernel reaches X_RESUME once: the products the
        // matvec kernels call, the pre-norms, RoPE + store.
        for (entry, fns) in [
            (
                "MV",
                &[
                    "mv32(",
                    "mv32_narrow(",
                    "mvs(",
                    "mvk(",
                    "mvks(",
                    "mmq_q4_0s(",
                ][..],
            ),
            ("NORM", &["norm_quant(", "norm_quant_regs("]),
            ("ROPE", &["rope_store_heads("]),
        ] {
            let src = GROUPS
                .iter()
                .map(|(_, s)| *s)
                .find(|s| s.contains(&format!("#define {entry}_ENTRY()")))
                .expect(entry);
            for f in fns {
                let at = src.find(&format!("void {f}")).expect(f);
                let end = at + src[at..].find("\n}\n").expect("end of function");
                let n = src[at..end].matches(&format!("{entry}_RESUME();")).count();
                assert_eq!(n, 1, "{f}");
            }
        }
    }
}
