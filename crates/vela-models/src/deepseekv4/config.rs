//! `deepseek_v4` config.json as transformers 5.23 reads it (docs/deepseekv4-spec.md §1,
//! `configuration_deepseek_v4.py` 128-320): both the release's keys (`compress_ratios`,
//! `num_hash_layers`, `qk_rope_head_dim`, top-level `rope_scaling`) and what `save_pretrained`
//! writes (`layer_types`, `mlp_layer_types`, `partial_rotary_factor`, nested `rope_parameters`),
//! with HF's defaults, precedence and refusals.

use anyhow::{anyhow, bail, Result};
use serde_json::Value;

/// A layer's attention kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attn {
    /// Sliding window only.
    Sliding,
    /// Compressed sparse attention: overlapping windows of `csa_rate` tokens, the indexer.
    Csa,
    /// Heavily compressed attention: windows of `hca_rate` tokens, no indexer.
    Hca,
}

/// A layer's expert routing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routing {
    /// Experts from a fixed token → experts table (`tid2eid`), weights from the gate.
    Hash,
    /// Top-k of the scores plus a selection bias.
    TopK,
}

/// The router's score function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scoring {
    SqrtSoftplus,
    Sigmoid,
}

/// YaRN parameters of a rope (its attention factor is HF's, 1 unless given).
#[derive(Clone, Debug, PartialEq)]
pub struct Yarn {
    pub factor: f32,
    pub original_max: usize,
    pub beta_fast: f32,
    pub beta_slow: f32,
    pub attention_factor: f32,
}

/// One of the two ropes (`main`: sliding layers; `compress`: CSA/HCA layers, compressors,
/// indexer).
#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    pub theta: f32,
    pub yarn: Option<Yarn>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct DeepseekV4Config {
    pub n_vocab: usize,
    pub hidden: usize,
    pub n_head: usize,
    pub head_dim: usize,
    /// Rotated trailing dims of a head (`int(head_dim · partial_rotary_factor)`).
    pub n_rot: usize,
    pub q_rank: usize,
    pub o_groups: usize,
    pub o_rank: usize,
    pub window: usize,
    pub attn: Vec<Attn>,
    /// The MTP block's attention: the layer list's entry past the last layer (upstream builds
    /// the block as layer `num_hidden_layers`), sliding when the list ends there.
    pub mtp_attn: Attn,
    pub csa_rate: usize,
    pub hca_rate: usize,
    pub routing: Vec<Routing>,
    pub rope_main: Rope,
    pub rope_compress: Rope,
    pub idx_heads: usize,
    pub idx_dim: usize,
    pub idx_topk: usize,
    /// mHC streams, Sinkhorn iterations, epsilon.
    pub hc: usize,
    pub sinkhorn_iters: usize,
    pub hc_eps: f32,
    pub n_expert: usize,
    pub top_k: usize,
    /// Routed and shared expert width.
    pub n_ff: usize,
    pub scoring: Scoring,
    pub routed_scale: f32,
    pub swiglu_limit: f32,
    pub eps: f32,
    pub tie_embeddings: bool,
    /// Bias on the shared expert's projections.
    pub mlp_bias: bool,
    /// `quantization_config.quant_method == "fp8"` (the release's FP8/MXFP4 storage).
    pub fp8: bool,
}

fn get<'a>(j: &'a Value, k: &str) -> Option<&'a Value> {
    j.get(k).filter(|v| !v.is_null())
}

fn uint(j: &Value, k: &str, d: usize) -> Result<usize> {
    match get(j, k) {
        None => Ok(d),
        Some(v) => v
            .as_u64()
            .map(|v| v as usize)
            .ok_or_else(|| anyhow!("config.json: `{k}` must be a non-negative integer")),
    }
}

fn float(j: &Value, k: &str, d: f32) -> Result<f32> {
    match get(j, k) {
        None => Ok(d),
        Some(v) => v
            .as_f64()
            .map(|v| v as f32)
            .ok_or_else(|| anyhow!("config.json: `{k}` must be a number")),
    }
}

const CSA: &str = "compressed_sparse_attention";
const HCA: &str = "heavily_compressed_attention";

fn attn_kind(s: Option<&str>) -> Result<Attn> {
    Ok(match s {
        Some("sliding_attention") => Attn::Sliding,
        Some(CSA) => Attn::Csa,
        Some(HCA) => Attn::Hca,
        other => bail!("config.json: unknown layer type {other:?}"),
    })
}

/// A rope's parameters from a dict with `rope_type`/`type`, `rope_theta`, YaRN keys.
fn rope(j: &Value, theta: f32) -> Result<Rope> {
    let kind = get(j, "rope_type")
        .or_else(|| get(j, "type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let theta = float(j, "rope_theta", theta)?;
    let yarn = match kind {
        "default" => None,
        "yarn" => Some(Yarn {
            factor: float(j, "factor", 1.0)?,
            original_max: uint(j, "original_max_position_embeddings", 0)?,
            beta_fast: float(j, "beta_fast", 32.0)?,
            beta_slow: float(j, "beta_slow", 1.0)?,
            attention_factor: float(j, "attention_factor", 1.0)?,
        }),
        other => bail!(
            "config.json: rope type '{}' is not supported (default, yarn)",
            other.escape_debug()
        ),
    };
    if let Some(y) = &yarn {
        if y.factor <= 0.0 || y.original_max == 0 {
            bail!("config.json: YaRN needs a positive factor and original_max_position_embeddings");
        }
    }
    Ok(Rope { theta, yarn })
}

impl DeepseekV4Config {
    pub fn from_json(j: &Value) -> Result<Self> {
        let j = j.get("text_config").unwrap_or(j);
        let n = uint(j, "num_hidden_layers", 43)?;
        if n == 0 {
            bail!("config.json: num_hidden_layers is 0");
        }
        let head_dim = uint(j, "head_dim", 512)?;
        // Compression rates: the dict, legacy scalars folded in.
        let rates = get(j, "compress_rates");
        let rate = |key: &str, legacy: &str, d: usize| -> Result<usize> {
            let v = match rates.and_then(|r| get(r, key)) {
                Some(v) => v.as_u64().map(|v| v as usize).ok_or_else(|| {
                    anyhow!("config.json: compress_rates.{key} must be an integer")
                })?,
                None => d,
            };
            let v = uint(j, legacy, v)?;
            if v == 0 {
                bail!("config.json: a compression rate of 0");
            }
            Ok(v)
        };
        let csa_rate = rate(CSA, "compress_rate_csa", 4)?;
        let hca_rate = rate(HCA, "compress_rate_hca", 128)?;
        // Layer kinds: explicit > legacy compress_ratios (0/4/128 only) > the V4-Pro default;
        // truncated to the layer count (the release lists its MTP stages too).
        let mut attn: Vec<Attn> = if let Some(a) = get(j, "layer_types") {
            let a = a
                .as_array()
                .ok_or_else(|| anyhow!("config.json: layer_types must be a list"))?;
            a.iter()
                .map(|t| attn_kind(t.as_str()))
                .collect::<Result<_>>()?
        } else if let Some(r) = get(j, "compress_ratios") {
            let r = r
                .as_array()
                .ok_or_else(|| anyhow!("config.json: compress_ratios must be a list"))?;
            r.iter()
                .map(|v| match v.as_u64() {
                    Some(0) => Ok(Attn::Sliding),
                    Some(4) => Ok(Attn::Csa),
                    Some(128) => Ok(Attn::Hca),
                    _ => bail!(
                        "config.json: compress_ratios entry {v} (transformers maps only 0, 4, 128)"
                    ),
                })
                .collect::<Result<_>>()?
        } else {
            (0..n)
                .map(|i| match i {
                    0 | 1 => Attn::Hca,
                    i if (i - 2) % 2 == 1 => Attn::Csa,
                    _ => Attn::Hca,
                })
                .collect()
        };
        if attn.len() < n {
            bail!("config.json: {} layer types for {n} layers", attn.len());
        }
        let mtp_attn = attn.get(n).copied().unwrap_or(Attn::Sliding);
        attn.truncate(n);
        let routing: Vec<Routing> = match get(j, "mlp_layer_types") {
            Some(a) => {
                let a = a
                    .as_array()
                    .ok_or_else(|| anyhow!("config.json: mlp_layer_types must be a list"))?;
                let v: Vec<Routing> = a
                    .iter()
                    .map(|t| match t.as_str() {
                        Some("hash_moe") => Ok(Routing::Hash),
                        Some("moe") => Ok(Routing::TopK),
                        other => bail!("config.json: unknown mlp layer type {other:?}"),
                    })
                    .collect::<Result<_>>()?;
                if v.len() < n {
                    bail!("config.json: {} mlp layer types for {n} layers", v.len());
                }
                v[..n].to_vec()
            }
            None => {
                let h = uint(j, "num_hash_layers", 3)?;
                (0..n)
                    .map(|i| if i < h { Routing::Hash } else { Routing::TopK })
                    .collect()
            }
        };
        let factor = match get(j, "partial_rotary_factor") {
            Some(_) => float(j, "partial_rotary_factor", 0.125)?,
            None => match get(j, "qk_rope_head_dim") {
                Some(_) => uint(j, "qk_rope_head_dim", 64)? as f32 / head_dim as f32,
                None => 64.0 / 512.0,
            },
        };
        let n_rot = (head_dim as f32 * factor) as usize;
        if n_rot == 0 || !n_rot.is_multiple_of(2) || n_rot > head_dim {
            bail!("config.json: {n_rot} rotated dims of a {head_dim}-dim head");
        }
        // Ropes: nested {main, compress} as is; otherwise main is plain and every top-level
        // rope key (rope_parameters or the legacy rope_scaling) goes to compress.
        let (theta, ctheta) = (
            float(j, "rope_theta", 10000.0)?,
            float(j, "compress_rope_theta", 160000.0)?,
        );
        let rp = get(j, "rope_parameters").or_else(|| get(j, "rope_scaling"));
        let (rope_main, rope_compress) = match rp {
            Some(p) if get(p, "main").is_some() && get(p, "compress").is_some() => {
                (rope(&p["main"], theta)?, rope(&p["compress"], ctheta)?)
            }
            Some(p) => {
                let mut c = p.clone();
                if let Some(o) = c.as_object_mut() {
                    o.remove("rope_theta");
                }
                (Rope { theta, yarn: None }, rope(&c, ctheta)?)
            }
            None => (
                Rope { theta, yarn: None },
                Rope {
                    theta: ctheta,
                    yarn: None,
                },
            ),
        };
        let scoring = match get(j, "scoring_func").and_then(Value::as_str) {
            None | Some("sqrtsoftplus") => Scoring::SqrtSoftplus,
            Some("sigmoid") => Scoring::Sigmoid,
            Some(other) => bail!(
                "config.json: scoring_func '{}' is not supported (sqrtsoftplus, sigmoid; \
                 transformers 5.23 refuses softmax too)",
                other.escape_debug()
            ),
        };
        if let Some(act) = get(j, "hidden_act").and_then(Value::as_str) {
            if act != "silu" {
                bail!("hidden_act {act} is not supported (silu only)");
            }
        }
        let c = DeepseekV4Config {
            n_vocab: uint(j, "vocab_size", 129280)?,
            hidden: uint(j, "hidden_size", 4096)?,
            n_head: uint(j, "num_attention_heads", 64)?,
            head_dim,
            n_rot,
            q_rank: uint(j, "q_lora_rank", 1024)?,
            o_groups: uint(j, "o_groups", 8)?,
            o_rank: uint(j, "o_lora_rank", 1024)?,
            window: uint(j, "sliding_window", 128)?,
            attn,
            mtp_attn,
            csa_rate,
            hca_rate,
            routing,
            rope_main,
            rope_compress,
            idx_heads: uint(j, "index_n_heads", 64)?,
            idx_dim: uint(j, "index_head_dim", 128)?,
            idx_topk: uint(j, "index_topk", 512)?,
            hc: uint(j, "hc_mult", 4)?,
            sinkhorn_iters: uint(j, "hc_sinkhorn_iters", 20)?,
            hc_eps: float(j, "hc_eps", 1e-6)?,
            n_expert: uint(j, "n_routed_experts", 256)?,
            top_k: uint(j, "num_experts_per_tok", 6)?,
            n_ff: uint(j, "moe_intermediate_size", 2048)?,
            scoring,
            routed_scale: float(j, "routed_scaling_factor", 1.5)?,
            swiglu_limit: float(j, "swiglu_limit", 10.0)?,
            eps: float(j, "rms_norm_eps", 1e-6)?,
            tie_embeddings: get(j, "tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            mlp_bias: get(j, "mlp_bias").and_then(Value::as_bool).unwrap_or(false),
            fp8: get(j, "quantization_config")
                .and_then(|q| get(q, "quant_method"))
                .and_then(Value::as_str)
                == Some("fp8"),
        };
        c.check()?;
        Ok(c)
    }

    fn check(&self) -> Result<()> {
        let nonzero = [
            ("vocab_size", self.n_vocab),
            ("hidden_size", self.hidden),
            ("num_attention_heads", self.n_head),
            ("q_lora_rank", self.q_rank),
            ("o_groups", self.o_groups),
            ("o_lora_rank", self.o_rank),
            ("sliding_window", self.window),
            ("hc_mult", self.hc),
            ("hc_sinkhorn_iters", self.sinkhorn_iters),
            ("n_routed_experts", self.n_expert),
            ("num_experts_per_tok", self.top_k),
            ("moe_intermediate_size", self.n_ff),
        ];
        if let Some((k, _)) = nonzero.iter().find(|(_, v)| *v == 0) {
            bail!("config.json: {k} is 0");
        }
        if !(self.n_head * self.head_dim).is_multiple_of(self.o_groups) {
            bail!(
                "config.json: {} heads do not split into {} output groups",
                self.n_head,
                self.o_groups
            );
        }
        if self.top_k > self.n_expert {
            bail!(
                "config.json: {} experts per token of {}",
                self.top_k,
                self.n_expert
            );
        }
        if self.attn.contains(&Attn::Csa)
            && (self.idx_heads == 0 || self.idx_dim == 0 || self.idx_topk == 0)
        {
            bail!("config.json: CSA layers need index_n_heads, index_head_dim and index_topk");
        }
        Ok(())
    }

    /// A one-line description (`vela info`).
    pub fn summary(&self) -> String {
        let count = |a: Attn| self.attn.iter().filter(|&&x| x == a).count();
        format!(
            "deepseek_v4: {} layers ({} sliding, {} CSA m={}, {} HCA m={}), hidden {}, {} heads × {}, \
             {} mHC streams, {} experts top-{} (width {}), {} hash-routed layers, vocab {}",
            self.attn.len(),
            count(Attn::Sliding),
            count(Attn::Csa),
            self.csa_rate,
            count(Attn::Hca),
            self.hca_rate,
            self.hidden,
            self.n_head,
            self.head_dim,
            self.hc,
            self.n_expert,
            self.top_k,
            self.n_ff,
            self.routing.iter().filter(|&&r| r == Routing::Hash).count(),
            self.n_vocab
        )
    }
}
