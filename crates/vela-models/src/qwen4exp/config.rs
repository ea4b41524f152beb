//! The `qwen4_exp` text configuration from an HF `config.json` (docs/qwen4exp-spec.md §1).

use anyhow::{anyhow, bail, Result};
use serde_json::Value;

/// A decoder layer's mixer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mixer {
    /// Gated DeltaNet (`linear_attention`).
    Gdn,
    /// Indexed sparse attention (`full_attention` / `indexed_attention`).
    Qsa,
}

/// The n-gram injection (PLE) settings.
#[derive(Clone, Debug, PartialEq)]
pub struct PleConfig {
    /// 0-based layer indices (HF's `ple_layer_ids` are 1-based).
    pub layers: Vec<usize>,
    pub dim: usize,
    pub conv_k: usize,
    pub ngram: usize,
    pub heads_per_ngram: usize,
    pub eos: u32,
}

impl PleConfig {
    /// Table heads: `(ngram − 1) · heads_per_ngram`.
    pub fn n_heads(&self) -> usize {
        (self.ngram - 1) * self.heads_per_ngram
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Qwen4ExpConfig {
    pub n_vocab: usize,
    pub hidden: usize,
    pub mixers: Vec<Mixer>,
    pub eps: f32,
    /// GDN output gate: sigmoid (true; the real model) or SiLU (HF's default).
    pub gate_sigmoid: bool,
    pub tie_embeddings: bool,
    // Hyper-connections.
    pub streams: usize,
    pub lowrank: usize,
    // Gated DeltaNet.
    pub conv_k: usize,
    pub n_k: usize,
    pub n_v: usize,
    pub dk: usize,
    pub dv: usize,
    /// Value heads in llama.cpp's tiled order (value head h reads key head h % n_k; its GGUF
    /// files) rather than HF's grouped order (h / (n_v / n_k)).
    pub tiled_heads: bool,
    // QSA.
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_rot: usize,
    pub rope_theta: f32,
    /// YaRN: per-frequency divisors of the default angles, and the factor cos and sin are
    /// scaled by (1 without YaRN).
    pub rope_divisors: Option<Vec<f32>>,
    pub rope_attn_factor: f32,
    pub idx_heads: usize,
    pub idx_dim: usize,
    pub idx_block: usize,
    /// Kept blocks per query (`indexer_budget / indexer_compress_ratio`).
    pub idx_blocks: usize,
    // MoE.
    pub n_expert: usize,
    pub top_k: usize,
    pub n_ff_exp: usize,
    pub n_ff_shared: usize,
    pub norm_topk: bool,
    pub ple: Option<PleConfig>,
}

fn uint(j: &Value, k: &str) -> Result<usize> {
    j.get(k)
        .and_then(Value::as_u64)
        .map(|v| v as usize)
        .ok_or_else(|| anyhow!("config.json: missing or non-integer `{k}`"))
}

fn uint_or(j: &Value, k: &str, d: usize) -> Result<usize> {
    match j.get(k) {
        None | Some(Value::Null) => Ok(d),
        Some(_) => uint(j, k),
    }
}

/// YaRN as transformers computes it (`_compute_yarn_parameters`): the inverse frequencies mix
/// extrapolation (`θ^(−2i/d)`) and interpolation (`/factor`) along a linear ramp between the
/// correction dims of `beta_fast` and `beta_slow`; returned as divisors of the default angles
/// (what the backends' RoPE takes as frequency factors), with the attention factor.
fn yarn(rope: &Value, j: &Value, dim: usize, base: f64) -> Result<(Vec<f32>, f32)> {
    let g = |k: &str| rope.get(k).and_then(Value::as_f64);
    let omax = g("original_max_position_embeddings")
        .ok_or_else(|| anyhow!("yarn needs original_max_position_embeddings"))?;
    let factor = match g("factor") {
        Some(f) => f,
        None => uint(j, "max_position_embeddings")? as f64 / omax,
    };
    let mscale = |s: f64, m: f64| {
        if s <= 1.0 {
            1.0
        } else {
            0.1 * m * s.ln() + 1.0
        }
    };
    let attn = match (g("attention_factor"), g("mscale"), g("mscale_all_dim")) {
        (Some(a), _, _) => a,
        (None, Some(m), Some(ma)) if m != 0.0 && ma != 0.0 => {
            mscale(factor, m) / mscale(factor, ma)
        }
        _ => mscale(factor, 1.0),
    };
    let beta_fast = g("beta_fast").filter(|&b| b != 0.0).unwrap_or(32.0);
    let beta_slow = g("beta_slow").filter(|&b| b != 0.0).unwrap_or(1.0);
    let truncate = rope
        .get("truncate")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    let corr = |rot: f64| {
        (dim as f64 * (omax / (rot * 2.0 * std::f64::consts::PI)).ln()) / (2.0 * base.ln())
    };
    let (mut lo, mut hi) = (corr(beta_fast), corr(beta_slow));
    if truncate {
        (lo, hi) = (lo.floor(), hi.ceil());
    }
    let (lo, mut hi) = (lo.max(0.0), hi.min(dim as f64 - 1.0));
    if lo == hi {
        hi += 0.001;
    }
    // The ramp in f32 like HF; inv = inv_extra · (e + (1 − e)/factor) with e = 1 − ramp, so the
    // default angle is divided by 1 / (e + (1 − e)/factor).
    let divisors = (0..dim / 2)
        .map(|i| {
            let ramp = ((i as f32 - lo as f32) / (hi as f32 - lo as f32)).clamp(0.0, 1.0);
            let e = 1.0 - ramp;
            1.0 / (e + (1.0 - e) / factor as f32)
        })
        .collect();
    Ok((divisors, attn as f32))
}

impl Qwen4ExpConfig {
    pub fn from_json(j: &Value) -> Result<Self> {
        let j = j.get("text_config").unwrap_or(j);
        let n_layer = uint(j, "num_hidden_layers")?;
        let mixers: Vec<Mixer> = match j.get("layer_types").and_then(Value::as_array) {
            Some(a) => a
                .iter()
                .map(|t| match t.as_str() {
                    Some("linear_attention") => Ok(Mixer::Gdn),
                    Some("full_attention" | "indexed_attention") => Ok(Mixer::Qsa),
                    other => bail!("config.json: unknown layer type {other:?}"),
                })
                .collect::<Result<_>>()?,
            None => {
                let every = uint_or(j, "full_attention_interval", 4)?.max(1);
                (0..n_layer)
                    .map(|i| {
                        if (i + 1) % every == 0 {
                            Mixer::Qsa
                        } else {
                            Mixer::Gdn
                        }
                    })
                    .collect()
            }
        };
        if mixers.len() != n_layer {
            bail!(
                "config.json: {} layer types for {n_layer} layers",
                mixers.len()
            );
        }
        let act = j
            .get("hidden_act")
            .and_then(Value::as_str)
            .unwrap_or("silu");
        if act != "silu" {
            bail!("hidden_act {act} is not supported (silu only)");
        }
        let gate_sigmoid = match j.get("output_gate_type").and_then(Value::as_str) {
            None | Some("silu") => false,
            Some("sigmoid") => true,
            Some(o) => bail!("output_gate_type {o} is not supported"),
        };
        let rope = j.get("rope_parameters").cloned().unwrap_or(Value::Null);
        let head_dim = uint(j, "head_dim")?;
        let partial = rope
            .get("partial_rotary_factor")
            .and_then(Value::as_f64)
            .unwrap_or(1.0);
        let n_rot = (head_dim as f64 * partial) as usize;
        let theta = rope
            .get("rope_theta")
            .and_then(Value::as_f64)
            .unwrap_or(10000.0);
        let (rope_divisors, rope_attn_factor) = match rope
            .get("rope_type")
            .and_then(Value::as_str)
            .unwrap_or("default")
        {
            "default" => (None, 1.0),
            "yarn" => {
                let (d, f) = yarn(&rope, j, n_rot, theta)?;
                (Some(d), f)
            }
            t => bail!(
                "rope_type '{}' is not supported (default, yarn)",
                t.escape_debug()
            ),
        };
        let idx_dim = uint(j, "indexer_head_dim")?;
        let idx_block = uint(j, "indexer_compress_ratio")?;
        let budget = uint(j, "indexer_budget")?;
        if idx_block == 0
            || !budget.is_multiple_of(idx_block)
            || uint_or(j, "indexer_kv_heads", 1)? != 1
        {
            bail!("indexer: budget must be a multiple of the compress ratio, one key head");
        }
        if n_rot > idx_dim || !n_rot.is_multiple_of(2) {
            bail!("rotary dims {n_rot} must be even and at most the indexer head dim {idx_dim}");
        }
        let streams = uint(j, "hc_count")?;
        if streams < 2 {
            bail!("hc_count must be at least 2");
        }
        let hidden = uint(j, "hidden_size")?;
        let eos = match j.get("eos_token_id") {
            Some(Value::Array(a)) => a.first().and_then(Value::as_u64),
            Some(v) => v.as_u64(),
            None => None,
        };
        let mut ple_layers: Vec<usize> = j
            .get("ple_layer_ids")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_u64)
                    .map(|x| x as usize)
                    .collect()
            })
            .unwrap_or_default();
        ple_layers.sort_unstable();
        ple_layers.dedup();
        let ple = if ple_layers.is_empty() {
            None
        } else {
            let eos = eos.ok_or_else(|| anyhow!("PLE needs eos_token_id"))? as u32;
            let layers: Vec<usize> = ple_layers
                .iter()
                .map(|&i| {
                    if i == 0 || i > n_layer || mixers[i - 1] != Mixer::Gdn {
                        bail!("ple_layer_ids: {i} is not a (1-based) linear-attention layer");
                    }
                    Ok(i - 1)
                })
                .collect::<Result<_>>()?;
            let p = PleConfig {
                layers,
                dim: uint_or(j, "ple_embed_dim", hidden)?,
                conv_k: uint_or(j, "ple_conv_kernel_size", 4)?,
                ngram: uint_or(j, "ngram_size", 3)?,
                heads_per_ngram: uint_or(j, "heads_per_ngram", 8)?,
                eos,
            };
            if p.ngram < 2 || !p.dim.is_multiple_of(p.n_heads()) {
                bail!("PLE: ngram_size ≥ 2 and ple_embed_dim divisible by the table heads");
            }
            Some(p)
        };
        let attn_bias = j
            .get("attention_bias")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if attn_bias {
            bail!("attention_bias is not supported");
        }
        Ok(Qwen4ExpConfig {
            n_vocab: uint(j, "vocab_size")?,
            hidden,
            mixers,
            eps: j
                .get("rms_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-6) as f32,
            gate_sigmoid,
            tie_embeddings: j
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            streams,
            lowrank: uint(j, "hc_lowrank")?,
            conv_k: uint_or(j, "linear_conv_kernel_dim", 4)?,
            n_k: uint(j, "linear_num_key_heads")?,
            n_v: uint(j, "linear_num_value_heads")?,
            dk: uint(j, "linear_key_head_dim")?,
            dv: uint(j, "linear_value_head_dim")?,
            tiled_heads: false,
            n_head: uint(j, "num_attention_heads")?,
            n_head_kv: uint(j, "num_key_value_heads")?,
            head_dim,
            n_rot,
            rope_theta: theta as f32,
            rope_divisors,
            rope_attn_factor,
            idx_heads: uint(j, "indexer_n_heads")?,
            idx_dim,
            idx_block,
            idx_blocks: budget / idx_block,
            n_expert: uint(j, "num_experts")?,
            top_k: uint(j, "num_experts_per_tok")?,
            n_ff_exp: uint(j, "moe_intermediate_size")?,
            n_ff_shared: uint(j, "shared_expert_intermediate_size")?,
            norm_topk: j
                .get("norm_topk_prob")
                .and_then(Value::as_bool)
                .unwrap_or(true),
            ple,
        })
    }

    /// One line for `vela info`.
    pub fn summary(&self) -> String {
        let gdn = self.mixers.iter().filter(|m| **m == Mixer::Gdn).count();
        format!(
            "qwen4_exp: {} layers ({gdn} Gated DeltaNet, {} QSA), hidden {}, {} streams, \
             {} experts top-{} (+shared), {} vocab{}",
            self.mixers.len(),
            self.mixers.len() - gdn,
            self.hidden,
            self.streams,
            self.n_expert,
            self.top_k,
            self.n_vocab,
            match &self.ple {
                Some(p) => format!(", n-gram injection on {} layer(s)", p.layers.len()),
                None => String::new(),
            }
        )
    }

    /// Width of the GDN projection `[q | k | v]`.
    pub fn qkv_width(&self) -> usize {
        2 * self.n_k * self.dk + self.n_v * self.dv
    }
}
