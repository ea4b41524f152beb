//! `Gemma4TextConfig` → [`Gemma4Config`]: from an HF `config.json`, or from llama.cpp `gemma4` GGUF
//! metadata translated into the equivalent `config.json`.

use anyhow::{anyhow, bail, Result};
use serde_json::Value;
use std::sync::Arc;
use vela_compute::RopeParams;
use vela_formats::gguf::GgufFile;

pub use super::moe::MoeConfig;

/// Attention kind of one layer (`config.layer_types`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    Sliding,
    Full,
}

/// Derived per-layer configuration (what `Gemma4TextConfig.per_layer_config` and
/// `kv_sharing_modes` say about layer `i`).
#[derive(Clone, Debug)]
pub struct Gemma4Layer {
    pub kind: LayerKind,
    pub head_dim: usize,
    pub n_head_kv: usize,
    /// `Some(j)`: a KV-sharing consumer that attends over layer `j`'s cache and owns no K/V.
    pub kv_from: Option<usize>,
    /// Full layers with `attention_k_eq_v`: V is the raw K projection (no `v_proj`).
    pub k_eq_v: bool,
    pub n_ff: usize,
    pub rope: RopeParams,
}

/// The parts of `Gemma4TextConfig` the text decoder uses.
#[derive(Clone, Debug)]
pub struct Gemma4Config {
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_layer: usize,
    pub rms_eps: f32,
    pub sliding_window: usize,
    pub final_softcap: Option<f32>,
    /// `hidden_size_per_layer_input` (0 = no per-layer embeddings).
    pub ple_dim: usize,
    pub ple_vocab: usize,
    pub tie_embeddings: bool,
    pub layers: Vec<Gemma4Layer>,
    /// `enable_moe_block`: every layer adds a routed-experts branch to its MLP.
    pub moe: Option<MoeConfig>,
}

fn get_u(j: &Value, k: &str, default: Option<u64>) -> Result<usize> {
    match j.get(k) {
        Some(v) if !v.is_null() => v
            .as_u64()
            .map(|v| v as usize)
            .ok_or_else(|| anyhow!("config.json: {k} is not a non-negative integer")),
        _ => default
            .map(|d| d as usize)
            .ok_or_else(|| anyhow!("config.json: missing {k}")),
    }
}

fn get_f(j: &Value, k: &str) -> Result<Option<f64>> {
    match j.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| anyhow!("config.json: {k} is not a number")),
    }
}

fn get_b(j: &Value, k: &str) -> bool {
    j.get(k).and_then(Value::as_bool).unwrap_or(false)
}

fn rope_for(j: &Value, kind: &str, head_dim: usize) -> Result<RopeParams> {
    let rp = j
        .get("rope_parameters")
        .and_then(|r| r.get(kind))
        .ok_or_else(|| anyhow!("config.json: rope_parameters.{kind} missing"))?;
    let ty = rp
        .get("rope_type")
        .and_then(Value::as_str)
        .unwrap_or("default");
    let theta =
        get_f(rp, "rope_theta")?.ok_or_else(|| anyhow!("rope_parameters.{kind}: no rope_theta"))?;
    let base = RopeParams {
        n_rot: head_dim,
        freq_base: theta as f32,
        freq_scale: 1.0,
        neox: true,
        freq_factors: None,
    };
    match ty {
        "default" => Ok(base),
        "proportional" => {
            let p = get_f(rp, "partial_rotary_factor")?.unwrap_or(1.0);
            let factor = get_f(rp, "factor")?.unwrap_or(1.0) as f32;
            if !(0.0..=1.0).contains(&p) || factor <= 0.0 {
                bail!(
                    "rope_parameters.{kind}: invalid partial_rotary_factor {p} / factor {factor}"
                );
            }
            let n = (p * head_dim as f64 / 2.0).floor() as usize;
            let ff: Vec<f32> = (0..head_dim / 2)
                .map(|i| if i < n { factor } else { f32::INFINITY })
                .collect();
            Ok(RopeParams {
                freq_factors: Some(Arc::new(ff)),
                ..base
            })
        }
        other => bail!(
            "Gemma 4 rope_type '{}' ({kind}) is not supported yet",
            other.escape_debug()
        ),
    }
}

impl Gemma4Config {
    /// Parse a `config.json` (`gemma4_text`, or `gemma4` with a nested `text_config`).
    pub fn from_json(j: &Value) -> Result<Gemma4Config> {
        let j = match j.get("text_config") {
            Some(t) if t.is_object() => t,
            _ => j,
        };
        let mt = j.get("model_type").and_then(Value::as_str).unwrap_or("");
        if mt != "gemma4_text" {
            bail!(
                "config.json: model_type '{}' is not gemma4_text",
                mt.escape_debug()
            );
        }
        if get_b(j, "attention_bias") {
            bail!("Gemma 4 attention biases (attention_bias) are not supported yet");
        }
        let moe = if get_b(j, "enable_moe_block") {
            let m = MoeConfig {
                n_expert: get_u(j, "num_experts", None)?,
                top_k: get_u(j, "top_k_experts", None)?,
                n_ff_exp: get_u(j, "moe_intermediate_size", None)?,
            };
            if m.n_expert == 0 || m.n_expert > 1 << 16 || m.top_k == 0 || m.top_k > m.n_expert {
                bail!(
                    "config.json: top_k_experts {} / num_experts {} is invalid",
                    m.top_k,
                    m.n_expert
                );
            }
            if m.n_ff_exp == 0 || m.n_ff_exp > 1 << 20 {
                bail!(
                    "config.json: moe_intermediate_size {} is invalid",
                    m.n_ff_exp
                );
            }
            Some(m)
        } else {
            None
        };
        if j.get("use_bidirectional_attention")
            .is_some_and(|v| !v.is_null())
        {
            bail!("Gemma 4 use_bidirectional_attention is not supported yet");
        }
        let act = j
            .get("hidden_activation")
            .and_then(Value::as_str)
            .unwrap_or("gelu_pytorch_tanh");
        if act != "gelu_pytorch_tanh" {
            bail!("Gemma 4 hidden_activation '{act}' is not supported yet");
        }
        let n_layer = get_u(j, "num_hidden_layers", None)?;
        let n_head = get_u(j, "num_attention_heads", None)?;
        let n_kv = get_u(j, "num_key_value_heads", None)?;
        let head_dim = get_u(j, "head_dim", None)?;
        let n_ff = get_u(j, "intermediate_size", None)?;
        let n_embd = get_u(j, "hidden_size", None)?;
        if [n_layer, n_head, n_kv, head_dim, n_ff, n_embd]
            .iter()
            .any(|&v| v == 0 || v > 1 << 20)
        {
            bail!("config.json: a layer/head/width count is zero or absurd");
        }
        let kinds: Vec<LayerKind> = match j.get("layer_types").and_then(Value::as_array) {
            Some(a) => a
                .iter()
                .map(|t| match t.as_str() {
                    Some("sliding_attention") => Ok(LayerKind::Sliding),
                    Some("full_attention") => Ok(LayerKind::Full),
                    other => bail!("config.json: unknown layer type {other:?}"),
                })
                .collect::<Result<_>>()?,
            None => (0..n_layer)
                .map(|i| {
                    if (i + 1) % 6 == 0 {
                        LayerKind::Full
                    } else {
                        LayerKind::Sliding
                    }
                })
                .collect(),
        };
        if kinds.len() != n_layer {
            bail!(
                "config.json: {} layer_types for {n_layer} layers",
                kinds.len()
            );
        }
        let mut kinds = kinds;
        kinds[n_layer - 1] = LayerKind::Full; // forced by Gemma4TextConfig.__post_init__
        let k_eq_v = get_b(j, "attention_k_eq_v");
        // Per-layer head dim / kv heads: saved configs carry `per_layer_config`, upstream ones
        // `global_head_dim` (+ `num_global_key_value_heads`, only honoured with k_eq_v).
        let plc = j.get("per_layer_config").and_then(Value::as_object);
        let global_hd = get_u(j, "global_head_dim", Some(512))?;
        let global_kv = match j.get("num_global_key_value_heads") {
            Some(v) if k_eq_v && !v.is_null() => {
                Some(get_u(j, "num_global_key_value_heads", None)?)
            }
            _ => None,
        };
        let n_shared = get_u(j, "num_kv_shared_layers", Some(0))?;
        if n_shared >= n_layer && n_shared > 0 {
            bail!("config.json: num_kv_shared_layers {n_shared} leaves no producer layer");
        }
        let first_shared = n_layer - n_shared;
        let double_wide = get_b(j, "use_double_wide_mlp");
        let mut layers = Vec::with_capacity(n_layer);
        for (i, &kind) in kinds.iter().enumerate() {
            let (mut hd, mut kvh) = (head_dim, n_kv);
            if let Some(p) = plc {
                if let Some(o) = p.get(&i.to_string()) {
                    hd = get_u(o, "head_dim", Some(hd as u64))?;
                    kvh = get_u(o, "num_key_value_heads", Some(kvh as u64))?;
                }
            } else if kind == LayerKind::Full {
                hd = global_hd;
                kvh = global_kv.unwrap_or(kvh);
            }
            if hd == 0 || hd % 2 != 0 || kvh == 0 || n_head % kvh != 0 {
                bail!("layer {i}: head_dim {hd} / kv heads {kvh} invalid for {n_head} heads");
            }
            let kv_from = if i >= first_shared {
                let p = (0..first_shared)
                    .rev()
                    .find(|&p| kinds[p] == kind)
                    .ok_or_else(|| anyhow!("layer {i}: no KV-sharing producer of its type"))?;
                Some(p)
            } else {
                None
            };
            let kind_name = match kind {
                LayerKind::Sliding => "sliding_attention",
                LayerKind::Full => "full_attention",
            };
            layers.push(Gemma4Layer {
                kind,
                head_dim: hd,
                n_head_kv: kvh,
                kv_from,
                k_eq_v: k_eq_v && kind == LayerKind::Full,
                n_ff: if double_wide && kv_from.is_some() {
                    2 * n_ff
                } else {
                    n_ff
                },
                rope: rope_for(j, kind_name, hd)?,
            });
        }
        for i in 0..n_layer {
            if let Some(p) = layers[i].kv_from {
                if (layers[p].head_dim, layers[p].n_head_kv)
                    != (layers[i].head_dim, layers[i].n_head_kv)
                {
                    bail!("layer {i}: head geometry differs from its KV producer {p}");
                }
            }
        }
        let ple_dim = get_u(j, "hidden_size_per_layer_input", Some(256))?;
        Ok(Gemma4Config {
            n_vocab: get_u(j, "vocab_size", None)?,
            n_embd,
            n_head,
            n_layer,
            rms_eps: get_f(j, "rms_norm_eps")?.unwrap_or(1e-6) as f32,
            sliding_window: get_u(j, "sliding_window", Some(512))?.max(1),
            final_softcap: get_f(j, "final_logit_softcapping")?
                .map(|v| v as f32)
                .filter(|&v| v > 0.0),
            ple_dim,
            ple_vocab: if ple_dim > 0 {
                get_u(j, "vocab_size_per_layer_input", Some(262_144))?
            } else {
                0
            },
            tie_embeddings: j
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(true),
            layers,
            moe,
        })
    }
}

impl Gemma4Config {
    /// Translate llama.cpp `gemma4` GGUF metadata (as `conversion/gemma.py` writes it) into the
    /// equivalent HF `config.json` and parse that, so both paths share one set of checks.
    pub fn from_gguf(g: &GgufFile) -> Result<Gemma4Config> {
        let arch = g.architecture()?;
        if arch != "gemma4" {
            bail!("GGUF architecture '{}' is not gemma4", arch.escape_debug());
        }
        let n_layer = g.arch_u64("block_count")? as usize;
        if n_layer == 0 || n_layer > 1 << 16 {
            bail!("invalid gemma4.block_count {n_layer}");
        }
        // A scalar or a per-layer array of unsigned integers.
        let per_layer = |key: &str| -> Result<Vec<u64>> {
            let full = format!("gemma4.{key}");
            let v = g
                .get(&full)
                .ok_or_else(|| anyhow!("missing GGUF key {full}"))?;
            let vals: Vec<u64> = match v.as_array() {
                Some(a) => a
                    .iter()
                    .map(|x| x.as_i64().filter(|&x| x >= 0).map(|x| x as u64))
                    .collect::<Option<_>>()
                    .ok_or_else(|| anyhow!("{full} is not an array of counts"))?,
                None => vec![g.arch_u64(key)?; n_layer],
            };
            if vals.len() != n_layer {
                bail!("{full} has {} entries for {n_layer} layers", vals.len());
            }
            Ok(vals)
        };
        let swa: Vec<bool> = g
            .get_array("gemma4.attention.sliding_window_pattern")?
            .iter()
            .map(|v| v.as_bool())
            .collect::<Option<_>>()
            .ok_or_else(|| anyhow!("gemma4.attention.sliding_window_pattern is not boolean"))?;
        if swa.len() != n_layer {
            bail!(
                "sliding_window_pattern has {} entries for {n_layer} layers",
                swa.len()
            );
        }
        let kv = per_layer("attention.head_count_kv")?;
        let ff = per_layer("feed_forward_length")?;
        let hd_full = g.arch_u64("attention.key_length")?;
        let hd_swa = g
            .arch_u64_opt("attention.key_length_swa")?
            .unwrap_or(hd_full);
        let n_shared = g.arch_u64_opt("attention.shared_kv_layers")?.unwrap_or(0) as usize;
        if n_shared >= n_layer && n_shared > 0 {
            bail!("gemma4.attention.shared_kv_layers {n_shared} leaves no producer layer");
        }
        let first_shared = n_layer - n_shared;
        let double_wide = ff[first_shared..].iter().any(|&f| f == 2 * ff[0]);
        for (i, &f) in ff.iter().enumerate() {
            if f != ff[0]
                * if double_wide && i >= first_shared {
                    2
                } else {
                    1
                }
            {
                bail!("gemma4.feed_forward_length {ff:?}: this per-layer pattern is not supported");
            }
        }
        if g.arch_u64_opt("rope.dimension_count_swa")?
            .is_some_and(|r| r != hd_swa)
        {
            bail!("gemma4 partial RoPE on sliding layers is not supported yet");
        }
        // Proportional RoPE of the full layers: rope_freqs holds 1 for rotated frequencies and
        // a huge divisor (1e30) for the identity ones.
        let partial = match g.tensor("rope_freqs.weight") {
            Some(t) => {
                let mut v = vec![0f32; t.n_elements() as usize];
                vela_formats::quant::dequantize(t.ty, g.tensor_data(t), &mut v)?;
                let n_rot = v.iter().take_while(|&&f| f == 1.0).count();
                if v.len() as u64 * 2 != hd_full || v[n_rot..].iter().any(|&f| f < 1e20) {
                    bail!("rope_freqs.weight does not describe a proportional RoPE");
                }
                n_rot as f64 * 2.0 / hd_full as f64
            }
            None => 1.0,
        };
        let full_layers: Vec<usize> = (0..n_layer).filter(|&i| !swa[i]).collect();
        let k_eq_v = full_layers
            .iter()
            .filter(|&&i| i < first_shared)
            .any(|&i| g.tensor(&format!("blk.{i}.attn_v.weight")).is_none());
        let per_layer_config: serde_json::Map<String, Value> = full_layers
            .iter()
            .map(|&i| {
                let o = serde_json::json!({"head_dim": hd_full, "num_key_value_heads": kv[i]});
                (i.to_string(), o)
            })
            .collect();
        let swa_kv = (0..n_layer).find(|&i| swa[i]).map_or(kv[0], |i| kv[i]);
        let rows = |name: &str| g.tensor(name).map(|t| t.n_rows() as u64);
        let ple = g
            .arch_u64_opt("embedding_length_per_layer_input")?
            .unwrap_or(0);
        let j = serde_json::json!({
            "model_type": "gemma4_text",
            "vocab_size": rows("token_embd.weight").ok_or_else(|| anyhow!("missing token_embd"))?,
            "hidden_size": g.arch_u64("embedding_length")?,
            "intermediate_size": ff[0],
            "num_hidden_layers": n_layer,
            "num_attention_heads": g.arch_u64("attention.head_count")?,
            "num_key_value_heads": swa_kv,
            "head_dim": hd_swa,
            "per_layer_config": per_layer_config,
            "layer_types": swa.iter().map(|&s| if s { "sliding_attention" } else { "full_attention" })
                .collect::<Vec<_>>(),
            "sliding_window": g.arch_u64_opt("attention.sliding_window")?.unwrap_or(512),
            "rms_norm_eps": g.arch_f64_opt("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-6),
            "final_logit_softcapping": g.arch_f64_opt("final_logit_softcapping")?,
            "hidden_size_per_layer_input": ple,
            "vocab_size_per_layer_input": rows("per_layer_token_embd.weight").unwrap_or(0),
            "attention_k_eq_v": k_eq_v,
            "num_kv_shared_layers": n_shared,
            "use_double_wide_mlp": double_wide,
            "tie_word_embeddings": g.tensor("output.weight").is_none(),
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default",
                    "rope_theta": g.arch_f64_opt("rope.freq_base_swa")?.unwrap_or(10_000.0)},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": partial,
                    "rope_theta": g.arch_f64_opt("rope.freq_base")?.unwrap_or(1_000_000.0)},
            },
        });
        let mut j = j;
        if let Some(e) = g.arch_u64_opt("expert_count")?.filter(|&e| e > 0) {
            j["enable_moe_block"] = Value::Bool(true);
            j["num_experts"] = e.into();
            j["top_k_experts"] = g.arch_u64("expert_used_count")?.into();
            j["moe_intermediate_size"] = g.arch_u64("expert_feed_forward_length")?.into();
        }
        Gemma4Config::from_json(&j)
    }
}

impl Gemma4Config {
    /// One line for `vela info`.
    pub fn summary(&self) -> String {
        let sliding = self
            .layers
            .iter()
            .filter(|l| l.kind == LayerKind::Sliding)
            .count();
        let shared = self.layers.iter().filter(|l| l.kv_from.is_some()).count();
        let keqv = self.layers.iter().filter(|l| l.k_eq_v).count();
        let hd: std::collections::BTreeSet<usize> =
            self.layers.iter().map(|l| l.head_dim).collect();
        format!(
            "gemma4, {} layers ({sliding} sliding, window {}), d={}, heads {}, head dims {hd:?}, \
             vocab {}, {shared} KV-sharing layers, {keqv} k_eq_v layers, per-layer input dim {}, \
             final soft-cap {:?}",
            self.n_layer,
            self.sliding_window,
            self.n_embd,
            self.n_head,
            self.n_vocab,
            self.ple_dim,
            self.final_softcap
        )
    }
}
