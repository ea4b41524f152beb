//! Qwen3.8 Flash Next at real size without a file: the weights of an HF checkpoint of a named
//! geometry generated in memory as the loader asks for them (deterministic from the seed, the
//! element values of `crate::synth`'s generator), matrices directly in the load type. The real
//! model (125B trunk parameters, 70 GB at Q4_0) exceeds the GPU machine's 64 GiB disk; its
//! 51B-parameter n-gram table is never materialised: a row is generated when a token reads it.
//!
//! Geometries: `qwen3.8-flash-next` (the published config, ../shared/notes/next-archs.md §1),
//! `qwen3.8-flash-next-12l` (its first 12 layers: 9 GDN + 3 QSA, the PLE layer included),
//! `qwen3.8-flash-next-12l-smallple` (the same with an n-gram table of 0.5B instead of 51B
//! parameters: `ngram_vocab_size_base` 200,000, the same compute per token; small enough for a
//! GGUF, `super::synth_gguf`), `qwen4exp-tiny` (a test-sized sibling) and
//! `qwen4exp-tiny-llamacpp` (the tiny one with `ple_embed_dim == hidden_size`, which llama.cpp
//! requires, and value heads of 32). Each includes the MTP layer.

use super::*;
use crate::synth::tensor_key;
use crate::weights::{load_type, WeightSource};
use anyhow::{anyhow, Context};
use serde_json::{json, Value};
use std::collections::HashMap;
use vela_compute::HostWeight;
use vela_formats::quant::GgmlType;

/// Names of the geometries [`config`] knows.
pub const GEOMETRIES: &[&str] = &[
    "qwen3.8-flash-next",
    "qwen3.8-flash-next-12l",
    "qwen3.8-flash-next-12l-smallple",
    "qwen4exp-tiny",
    "qwen4exp-tiny-llamacpp",
];

/// The config.json of a geometry.
pub fn config(name: &str) -> Result<Value> {
    let (g, q) = ("linear_attention", "full_attention");
    let real = |layers: usize| {
        json!({
            "model_type": "qwen4_exp_text",
            "vocab_size": 248320, "hidden_size": 2560, "num_hidden_layers": layers,
            "layer_types": (0..layers).map(|i| if i % 4 == 3 { q } else { g }).collect::<Vec<_>>(),
            "num_attention_heads": 24, "num_key_value_heads": 2, "head_dim": 256,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                                "mrope_section": [11, 11, 10], "mrope_interleaved": true},
            "linear_conv_kernel_dim": 4, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
            "linear_key_head_dim": 128, "linear_value_head_dim": 128,
            "hc_count": 4, "hc_lowrank": 320,
            "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 640,
            "shared_expert_intermediate_size": 640, "norm_topk_prob": true,
            "indexer_n_heads": 4, "indexer_kv_heads": 1, "indexer_head_dim": 128,
            "indexer_budget": 2048, "indexer_compress_ratio": 4,
            "output_gate_type": "sigmoid", "hidden_act": "silu",
            "ple_layer_ids": [2], "ple_embed_dim": 2560, "heads_per_ngram": 8, "ngram_size": 3,
            "ple_conv_kernel_size": 4, "ngram_vocab_size_base": 20_000_000,
            "make_ngram_vocab_size_divisible_by": 128, "seed": 1234,
            "rms_norm_eps": 1e-6, "eos_token_id": 248044, "tie_word_embeddings": false,
            "max_position_embeddings": 262144, "mtp_num_hidden_layers": 1
        })
    };
    Ok(match name {
        "qwen3.8-flash-next" => real(48),
        "qwen3.8-flash-next-12l" => real(12),
        "qwen3.8-flash-next-12l-smallple" => {
            let mut j = real(12);
            j["ngram_vocab_size_base"] = json!(200_000);
            j
        }
        "qwen4exp-tiny" | "qwen4exp-tiny-llamacpp" => {
            let mut j = real(8);
            let o = j.as_object_mut().expect("an object");
            for (k, v) in [
                ("vocab_size", json!(512)),
                ("hidden_size", json!(64)),
                ("num_attention_heads", json!(6)),
                ("head_dim", json!(64)),
                ("linear_num_key_heads", json!(2)),
                ("linear_num_value_heads", json!(6)),
                ("linear_key_head_dim", json!(16)),
                ("linear_value_head_dim", json!(16)),
                ("hc_lowrank", json!(32)),
                ("num_experts", json!(8)),
                ("num_experts_per_tok", json!(2)),
                ("moe_intermediate_size", json!(32)),
                ("shared_expert_intermediate_size", json!(32)),
                ("indexer_head_dim", json!(32)),
                ("indexer_budget", json!(16)),
                ("ple_embed_dim", json!(128)),
                ("ngram_vocab_size_base", json!(1000)),
                ("eos_token_id", json!(503)),
            ] {
                o.insert(k.into(), v);
            }
            if name == "qwen4exp-tiny-llamacpp" {
                // llama.cpp needs ple_embed_dim == hidden_size; value heads of 32 keep llama.cpp's
                // tiled reordering of ssm_out's columns from regrouping Q8_0/Q4_0 blocks.
                o.insert("ple_embed_dim".into(), json!(64));
                o.insert("linear_key_head_dim".into(), json!(32));
                o.insert("linear_value_head_dim".into(), json!(32));
            }
            // The fixtures' rotary sections (they sum to rot/2 = 8) and context.
            j["rope_parameters"]["mrope_section"] = json!([3, 3, 2]);
            j["max_position_embeddings"] = json!(4096);
            j
        }
        _ => bail!(
            "unknown qwen4_exp geometry '{name}' (one of {})",
            GEOMETRIES.join(", ")
        ),
    })
}

const MASK_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

fn splitmix64(v: u64) -> u64 {
    let v = v.wrapping_add(MASK_GAMMA);
    let v = (v ^ (v >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let v = (v ^ (v >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    v ^ (v >> 31)
}

fn is_prime(v: u64) -> bool {
    if v < 2 {
        return false;
    }
    if v.is_multiple_of(2) {
        return v == 2;
    }
    let mut d = 3;
    while d * d <= v {
        if v.is_multiple_of(d) {
            return false;
        }
        d += 2;
    }
    true
}

/// A PLE layer's hash constants as transformers computes them (`_build_layer_multipliers`,
/// `_find_nth_prime_after`; modeling_qwen4_exp.py 1030-1106): multipliers, head sizes, offsets.
pub fn ple_constants(
    vocab: u64,
    ngram: usize,
    heads_per_ngram: usize,
    base: u64,
    ple_index: usize,
    seed: u64,
) -> (Vec<u64>, Vec<u64>, Vec<u64>) {
    let half = ((i64::MAX as u64 / vocab.max(1)) / 2).max(1);
    let base_seed = seed.wrapping_add(10007 * ple_index as u64);
    let mult = (0..ngram)
        .map(|i| {
            2 * (splitmix64(base_seed.wrapping_add(MASK_GAMMA.wrapping_mul(i as u64 + 1))) % half)
                + 1
        })
        .collect();
    let heads = (ngram - 1) * heads_per_ngram;
    let (mut sizes, mut offsets, mut total) = (Vec::new(), Vec::new(), 0);
    let mut prime = base - 1;
    // The n-th prime after base − 1 for global head n: consecutive primes from the layer's first.
    for _ in 0..ple_index * heads {
        prime += 1;
        while !is_prime(prime) {
            prime += 1;
        }
    }
    for _ in 0..heads {
        prime += 1;
        while !is_prime(prime) {
            prime += 1;
        }
        sizes.push(prime);
        offsets.push(total);
        total += prime;
    }
    (mult, sizes, offsets)
}

/// How a tensor's values are made.
#[derive(Clone, Copy, Debug)]
pub(super) enum Make {
    /// A matrix, N(0, 1/cols) (N(0, 1) for the embedding), in the load type.
    Matrix { std: f32 },
    /// f32 values `mean + std·N`.
    Floats { mean: f32, std: f32 },
    /// Integer constants (PLE hash), as int64.
    Ints,
}

/// The tensors of a geometry's HF checkpoint (no prefix; `lm_head` and `mtp.*` at the root).
pub(super) struct Plan {
    pub(super) shapes: HashMap<String, (usize, usize, Make)>,
    pub(super) ints: HashMap<String, Vec<u64>>,
}

pub(super) fn plan(c: &Qwen4ExpConfig, j: &Value) -> Result<Plan> {
    let mut shapes = HashMap::new();
    let mut ints = HashMap::new();
    let (h, sh, s, r) = (c.hidden, c.streams * c.hidden, c.streams, c.lowrank);
    let mut m = |name: String, rows: usize, cols: usize| {
        let std = 1.0 / (cols as f32).sqrt();
        shapes.insert(name, (rows, cols, Make::Matrix { std }));
    };
    m("lm_head.weight".into(), c.n_vocab, h);
    let layer =
        |p: &str, qsa: bool, ple: Option<usize>, m: &mut dyn FnMut(String, usize, usize)| {
            for hc in ["attn_hyper_connection", "mlp_hyper_connection"] {
                m(format!("{p}.{hc}.input_mix_weight_down.weight"), r, sh);
                m(format!("{p}.{hc}.input_mix_weight_up.weight"), sh, r);
                m(format!("{p}.{hc}.block_inject_weight.weight"), s, sh);
            }
            if qsa {
                let a = format!("{p}.self_attn");
                m(format!("{a}.q_proj.weight"), 2 * c.n_head * c.head_dim, h);
                m(format!("{a}.k_proj.weight"), c.n_head_kv * c.head_dim, h);
                m(format!("{a}.v_proj.weight"), c.n_head_kv * c.head_dim, h);
                m(format!("{a}.o_proj.weight"), h, c.n_head * c.head_dim);
                m(
                    format!("{a}.indexer.index_qk_proj.weight"),
                    (c.idx_heads + 1) * c.idx_dim,
                    h,
                );
            } else {
                let a = format!("{p}.linear_attn");
                m(format!("{a}.in_proj_qkv.weight"), c.qkv_width(), h);
                m(format!("{a}.in_proj_z.weight"), c.n_v * c.dv, h);
                m(format!("{a}.in_proj_b.weight"), c.n_v, h);
                m(format!("{a}.in_proj_a.weight"), c.n_v, h);
                m(format!("{a}.out_proj.weight"), h, c.n_v * c.dv);
            }
            let e = format!("{p}.mlp");
            m(format!("{e}.gate.weight"), c.n_expert, h);
            for x in 0..c.n_expert {
                m(format!("{e}.experts.{x}.gate_proj.weight"), c.n_ff_exp, h);
                m(format!("{e}.experts.{x}.up_proj.weight"), c.n_ff_exp, h);
                m(format!("{e}.experts.{x}.down_proj.weight"), h, c.n_ff_exp);
            }
            m(
                format!("{e}.shared_expert.gate_proj.weight"),
                c.n_ff_shared,
                h,
            );
            m(
                format!("{e}.shared_expert.up_proj.weight"),
                c.n_ff_shared,
                h,
            );
            m(
                format!("{e}.shared_expert.down_proj.weight"),
                h,
                c.n_ff_shared,
            );
            m(format!("{e}.shared_expert_gate.weight"), 1, h);
            if let Some(pd) = ple {
                m(format!("{p}.ple.key_proj.weight"), sh, pd);
                m(format!("{p}.ple.value_proj.weight"), h, pd);
            }
        };
    let mut ple_index = 0;
    for (i, mx) in c.mixers.iter().enumerate() {
        let ple = c.ple.as_ref().filter(|p| p.layers.contains(&i));
        layer(
            &format!("layers.{i}"),
            *mx == Mixer::Qsa,
            ple.map(|p| p.dim),
            &mut m,
        );
        if let Some(p) = ple {
            let u = |k: &str| {
                j.get(k)
                    .and_then(Value::as_u64)
                    .ok_or_else(|| anyhow!("config: {k}"))
            };
            let (mult, sizes, offsets) = ple_constants(
                c.n_vocab as u64,
                p.ngram,
                p.heads_per_ngram,
                u("ngram_vocab_size_base")?,
                ple_index,
                u("seed")?,
            );
            let e = format!("layers.{i}.ple.ple_embedding");
            ints.insert(format!("{e}.layer_multipliers"), mult);
            ints.insert(format!("{e}.ngram_heads_vocab_sizes"), sizes);
            ints.insert(format!("{e}.ngram_heads_offsets"), offsets);
            ple_index += 1;
        }
    }
    layer("mtp.layers.0", true, None, &mut m);
    m("mtp.fc_embedding.weight".into(), h, h);
    m("mtp.fc_hidden.weight".into(), h, h);
    m(
        "mtp.hyper_connection_mixer.input_mix_weight_down.weight".into(),
        r,
        sh,
    );
    m(
        "mtp.hyper_connection_mixer.input_mix_weight_up.weight".into(),
        sh,
        r,
    );
    m(
        "hyper_connection_mixer.input_mix_weight_down.weight".into(),
        r,
        sh,
    );
    m(
        "hyper_connection_mixer.input_mix_weight_up.weight".into(),
        sh,
        r,
    );
    shapes.insert(
        "embed_tokens.weight".into(),
        (c.n_vocab, h, Make::Matrix { std: 1.0 }),
    );
    for (k, _) in ints.iter() {
        shapes.insert(k.clone(), (1, 0, Make::Ints));
    }
    Ok(Plan { shapes, ints })
}

/// The f32 vector a name stands for (norms, gates, conv kernels), or `None`.
pub(super) fn vector_make(name: &str) -> Option<Make> {
    let f = |mean, std| Some(Make::Floats { mean, std });
    if name.ends_with("linear_attn.norm.weight") {
        f(1.0, 0.02) // a plain weight
    } else if name.ends_with("norm.weight")
        || name.ends_with("layernorm.weight")
        || name.ends_with("pre_fc_norm_hidden.weight")
        || name.ends_with("pre_fc_norm_embedding.weight")
        || name.ends_with("norm_key.weight")
        || name.ends_with("norm_query.weight")
        || name.ends_with("norm_conv.weight")
    {
        f(0.0, 0.02) // (1+w) norms
    } else if name.ends_with("A_log") {
        f(-0.7, 0.1)
    } else if name.ends_with("dt_bias") {
        f(0.0, 0.1)
    } else if name.ends_with("conv1d.weight") {
        f(0.0, 0.5)
    } else {
        None
    }
}

/// The length of a vector tensor of the config.
pub(super) fn vector_len(c: &Qwen4ExpConfig, name: &str) -> Option<usize> {
    let sh = c.streams * c.hidden;
    let pk = c.ple.as_ref().map_or(0, |p| p.conv_k);
    Some(if name.ends_with("linear_attn.norm.weight") {
        c.dv
    } else if name.ends_with("hc_norm.weight")
        || name.ends_with("pre_fc_norm_hidden.weight")
        || name.ends_with("norm_key.weight")
        || name.ends_with("norm_query.weight")
        || name.ends_with("norm_conv.weight")
    {
        sh
    } else if name.ends_with("pre_fc_norm_embedding.weight") {
        c.hidden
    } else if name.ends_with("q_norm.weight") || name.ends_with("k_norm.weight") {
        c.head_dim
    } else if name.ends_with("q_layernorm.weight") || name.ends_with("k_layernorm.weight") {
        c.idx_dim
    } else if name.ends_with("A_log") || name.ends_with("dt_bias") {
        c.n_v
    } else if name.ends_with("ple.conv1d.weight") {
        sh * pk
    } else if name.ends_with("linear_attn.conv1d.weight") {
        c.qkv_width() * c.conv_k
    } else {
        return None;
    })
}

impl<B: Backend> Qwen4ExpModel<B> {
    /// The geometry `name` with random weights (matrices in `qtype`), deterministic from `seed`.
    pub fn synth(backend: Arc<B>, name: &str, qtype: GgmlType, seed: u64) -> Result<Self> {
        Self::synth_typed(backend, name, qtype, seed, &HashMap::new())
    }

    /// [`Self::synth`] with the types of `types` for the tensors it names (matrices, vectors, and
    /// the n-gram table's rows under `layers.{i}.ple.ple_embedding.ngram_embedding`): with
    /// `synth_gguf::hf_types` the types `vela synth` writes for the geometry.
    pub fn synth_typed(
        backend: Arc<B>,
        name: &str,
        qtype: GgmlType,
        seed: u64,
        types: &HashMap<String, GgmlType>,
    ) -> Result<Self> {
        let types = types.clone();
        let j = config(name)?;
        let cfg = Qwen4ExpConfig::from_json(&j)?;
        let plan = Arc::new(plan(&cfg, &j)?);
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let c2 = cfg.clone();
        let get = move |n: &str| -> Option<HostWeight> {
            let key = tensor_key(seed, n);
            let r = if let Some(v) = plan.ints.get(n) {
                let bytes = v.iter().flat_map(|x| (*x as i64).to_le_bytes()).collect();
                HostWeight::owned(n, GgmlType::I64, 1, v.len(), bytes)
            } else if let Some(&(rows, cols, Make::Matrix { std })) = plan.shapes.get(n) {
                crate::synth::normal_weight(
                    n,
                    types
                        .get(n)
                        .copied()
                        .unwrap_or_else(|| load_type(qtype, cols)),
                    rows,
                    cols,
                    (0.0, std),
                    key,
                    threads,
                )
            } else if let (Some(Make::Floats { mean, std }), Some(len)) =
                (vector_make(n), vector_len(&c2, n))
            {
                let ty = types.get(n).copied().unwrap_or(GgmlType::F32);
                crate::synth::normal_weight(n, ty, 1, len, (mean, std), key, threads)
            } else if let Some(&ty) = types.get(n).filter(|_| n.ends_with(".ngram_embedding")) {
                // The table's row type: a one-row stand-in (rows are generated when read).
                let bs = ty.block_size();
                HostWeight::owned(n, ty, 1, bs, vec![0; ty.type_size()])
            } else {
                return None;
            };
            match r.with_context(|| format!("synthesizing {n}")) {
                Ok(w) => Some(w),
                Err(e) => {
                    eprintln!("{e:#}");
                    None
                }
            }
        };
        let src = WeightSource::synthetic(Arc::new(get), seed);
        Self::load(backend, &src, cfg)
    }
}
