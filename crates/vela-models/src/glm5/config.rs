//! `glm5_next` config.json as transformers 5.23 reads it (docs/glm5-spec.md §1,
//! `configuration_glm5_next.py` 100-312): the text config nested in `text_config` or flat, HF's
//! defaults and derived fields (`layer_types`, `mlp_layer_types`, `indexer_types`,
//! `linear_attn_config` overriding the `linear_*` keys), and refusals by name of what the model
//! does not run.

use anyhow::{anyhow, bail, Result};
use serde_json::Value;

/// A layer's token mixer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mixer {
    /// Kimi Delta Attention (`linear_attention`).
    Kda,
    /// NoPE MLA with a DSA indexer (`indexed_attention`, or `full_attention`).
    Mla,
}

/// An MLA layer's token selection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Indexer {
    /// Its own indexer.
    Full,
    /// The selection of the layer right before it (which must be a full MLA layer).
    Shared,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Glm5Config {
    pub n_vocab: usize,
    pub hidden: usize,
    pub mixers: Vec<Mixer>,
    /// Per layer: a dense FFN (else MoE).
    pub dense: Vec<bool>,
    /// Per layer (KDA layers: unused).
    pub indexers: Vec<Indexer>,
    pub eps: f32,
    // mHC
    pub hc: usize,
    pub sinkhorn_iters: usize,
    pub hc_eps: f32,
    // KDA
    pub kda_heads: usize,
    pub kda_dim: usize,
    pub conv_k: usize,
    /// `Some(lb)`: g = lb·σ(a·x); `None`: g = −a·softplus(x).
    pub lower_bound: Option<f32>,
    // MLA
    pub n_head: usize,
    pub nope_dim: usize,
    pub v_dim: usize,
    pub q_rank: usize,
    pub kv_rank: usize,
    // DSA indexer
    pub idx_heads: usize,
    pub idx_dim: usize,
    /// Tokens selected per query (a multiple of the pool size).
    pub idx_topk: usize,
    /// Tokens per pool.
    pub idx_pool: usize,
    // FFN
    pub n_ff: usize,
    pub n_ff_exp: usize,
    pub n_shared: usize,
    pub n_expert: usize,
    pub top_k: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub norm_topk: bool,
    pub routed_scale: f32,
    pub swiglu_limit: f32,
    pub tie_embeddings: bool,
    /// `num_nextn_predict_layers`: MTP blocks after the trunk (`layers.{n}.*`; HF ignores them).
    pub nextn: usize,
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

fn flag(j: &Value, k: &str, d: bool) -> Result<bool> {
    match get(j, k) {
        None => Ok(d),
        Some(v) => v
            .as_bool()
            .ok_or_else(|| anyhow!("config.json: `{k}` must be true or false")),
    }
}

/// A list of strings, truncated to `n` entries; an error when shorter.
fn strings(j: &Value, k: &str, n: usize) -> Result<Option<Vec<String>>> {
    let Some(v) = get(j, k) else {
        return Ok(None);
    };
    let a = v
        .as_array()
        .ok_or_else(|| anyhow!("config.json: `{k}` must be a list"))?;
    if a.len() < n {
        bail!("config.json: `{k}` has {} entries for {n} layers", a.len());
    }
    a.iter()
        .take(n)
        .map(|s| {
            s.as_str()
                .map(str::to_string)
                .ok_or_else(|| anyhow!("config.json: `{k}` entries must be strings"))
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

impl Glm5Config {
    pub fn from_json(j: &Value) -> Result<Self> {
        let j = get(j, "text_config").unwrap_or(j);
        let n = uint(j, "num_hidden_layers", 45)?;
        if n == 0 {
            bail!("config.json: num_hidden_layers is 0");
        }
        let mixers = match strings(j, "layer_types", n)? {
            Some(t) => t
                .iter()
                .map(|s| match s.as_str() {
                    "linear_attention" => Ok(Mixer::Kda),
                    "indexed_attention" | "full_attention" => Ok(Mixer::Mla),
                    o => bail!("config.json: layer type `{o}` is not supported by glm5_next"),
                })
                .collect::<Result<Vec<_>>>()?,
            None => (0..n)
                .map(|i| if i % 4 == 3 { Mixer::Mla } else { Mixer::Kda })
                .collect(),
        };
        // `first_k_dense_replace` has no effect in HF: only `mlp_layer_types` or 3 dense layers.
        let dense = match strings(j, "mlp_layer_types", n)? {
            Some(t) => t
                .iter()
                .map(|s| match s.as_str() {
                    "dense" => Ok(true),
                    "sparse" => Ok(false),
                    o => bail!("config.json: mlp layer type `{o}` is not supported by glm5_next"),
                })
                .collect::<Result<Vec<_>>>()?,
            None => (0..n).map(|i| i < 3).collect(),
        };
        let indexers = Self::indexers(j, n)?;
        for i in 0..n {
            if mixers[i] == Mixer::Mla
                && indexers[i] == Indexer::Shared
                && (i == 0 || mixers[i - 1] != Mixer::Mla || indexers[i - 1] != Indexer::Full)
            {
                bail!(
                    "config.json: layer {i} shares the indexer of a layer that is not a full \
                     indexed-attention layer (transformers raises ValueError)"
                );
            }
        }
        // KDA: `linear_attn_config` overrides the flat keys; its layer lists are ignored.
        let mut kda_dim = uint(j, "linear_head_dim", 128)?;
        let mut kda_heads = uint(j, "linear_num_heads", 64)?;
        let mut conv_k = uint(j, "linear_conv_kernel_dim", 4)?;
        let mut lower_bound = match j.get("linear_lower_bound") {
            None => Some(-5.0),
            Some(Value::Null) => None,
            Some(_) => Some(float(j, "linear_lower_bound", -5.0)?),
        };
        if let Some(la) = get(j, "linear_attn_config") {
            kda_dim = uint(la, "head_dim", kda_dim)?;
            kda_heads = uint(la, "num_heads", kda_heads)?;
            conv_k = uint(la, "short_conv_kernel_size", conv_k)?;
            if get(la, "gate_lower_bound").is_some() {
                lower_bound = Some(float(la, "gate_lower_bound", -5.0)?);
            }
            if flag(la, "safe_gate", true)? && lower_bound.is_none() {
                lower_bound = Some(-5.0);
            }
        }
        let act = get(j, "hidden_act")
            .and_then(Value::as_str)
            .unwrap_or("silu");
        if act != "silu" {
            bail!("config.json: hidden_act `{act}` is not supported by glm5_next (silu only)");
        }
        if flag(j, "attention_bias", false)? {
            bail!("config.json: attention_bias is not supported by glm5_next yet");
        }
        if uint(j, "qk_rope_head_dim", 0)? != 0 {
            bail!("config.json: qk_rope_head_dim must be 0 (transformers refuses RoPE dims)");
        }
        if !flag(j, "index_kpool_always_select_tail", true)? {
            bail!(
                "config.json: index_kpool_always_select_tail false is not supported (early \
                 queries would attend to future tokens)"
            );
        }
        let n_head = uint(j, "num_attention_heads", 64)?;
        let n_kv = uint(j, "num_key_value_heads", n_head)?;
        if n_kv != n_head {
            bail!(
                "config.json: num_key_value_heads {n_kv} must equal num_attention_heads {n_head}"
            );
        }
        let idx_pool = uint(j, "index_kpool", 16)?;
        let idx_topk = uint(j, "index_topk", 2048)?;
        if idx_pool == 0 || idx_topk == 0 || !idx_topk.is_multiple_of(idx_pool) {
            bail!(
                "config.json: index_topk {idx_topk} must be a positive multiple of index_kpool \
                 {idx_pool}"
            );
        }
        let c = Glm5Config {
            n_vocab: uint(j, "vocab_size", 154_880)?,
            hidden: uint(j, "hidden_size", 4096)?,
            mixers,
            dense,
            indexers,
            eps: float(j, "rms_norm_eps", 1e-5)?,
            hc: uint(j, "hc_mult", 4)?,
            sinkhorn_iters: uint(j, "hc_sinkhorn_iters", 20)?,
            hc_eps: float(j, "hc_eps", 1e-6)?,
            kda_heads,
            kda_dim,
            conv_k,
            lower_bound,
            n_head,
            nope_dim: uint(j, "qk_nope_head_dim", 256)?,
            v_dim: uint(j, "v_head_dim", 256)?,
            q_rank: uint(j, "q_lora_rank", 1536)?,
            kv_rank: uint(j, "kv_lora_rank", 512)?,
            idx_heads: uint(j, "index_n_heads", 32)?,
            idx_dim: uint(j, "index_head_dim", 128)?,
            idx_topk,
            idx_pool,
            n_ff: uint(j, "intermediate_size", 12288)?,
            n_ff_exp: uint(j, "moe_intermediate_size", 2048)?,
            n_shared: uint(j, "n_shared_experts", 1)?,
            n_expert: uint(j, "n_routed_experts", 288)?,
            top_k: uint(j, "num_experts_per_tok", 8)?,
            n_group: uint(j, "n_group", 1)?,
            topk_group: uint(j, "topk_group", 1)?,
            norm_topk: flag(j, "norm_topk_prob", true)?,
            routed_scale: float(j, "routed_scaling_factor", 2.5)?,
            swiglu_limit: float(j, "swiglu_limit", 10.0)?,
            tie_embeddings: flag(j, "tie_word_embeddings", false)?,
            nextn: uint(j, "num_nextn_predict_layers", 0)?,
        };
        c.validate()?;
        Ok(c)
    }

    /// `indexer_types`, else `index_topk_pattern` (a string of F/S or a list), else full where
    /// max(i − offset + 1, 0) is a multiple of `index_topk_freq` (CFG 174-187).
    fn indexers(j: &Value, n: usize) -> Result<Vec<Indexer>> {
        let kind = |s: &str| match s {
            "full" | "F" => Ok(Indexer::Full),
            "shared" | "S" => Ok(Indexer::Shared),
            o => bail!("config.json: indexer type `{o}` is not supported by glm5_next"),
        };
        if let Some(t) = strings(j, "indexer_types", n)? {
            return t.iter().map(|s| kind(s)).collect();
        }
        if let Some(p) = get(j, "index_topk_pattern") {
            let t: Vec<String> = match p {
                Value::String(s) => s.chars().map(String::from).collect(),
                _ => strings(j, "index_topk_pattern", n)?.unwrap_or_default(),
            };
            if t.len() < n {
                bail!(
                    "config.json: index_topk_pattern has {} entries for {n} layers",
                    t.len()
                );
            }
            return t.iter().take(n).map(|s| kind(s)).collect();
        }
        let freq = uint(j, "index_topk_freq", 1)?.max(1);
        let off = uint(j, "index_skip_topk_offset", 2)?;
        Ok((0..n)
            .map(|i| {
                if (i + 1).saturating_sub(off).is_multiple_of(freq) {
                    Indexer::Full
                } else {
                    Indexer::Shared
                }
            })
            .collect())
    }

    fn validate(&self) -> Result<()> {
        let pos = [
            ("hidden_size", self.hidden),
            ("vocab_size", self.n_vocab),
            ("hc_mult", self.hc),
            ("hc_sinkhorn_iters", self.sinkhorn_iters),
            ("linear head_dim", self.kda_dim),
            ("linear num_heads", self.kda_heads),
            ("short_conv_kernel_size", self.conv_k),
            ("num_attention_heads", self.n_head),
            ("qk_nope_head_dim", self.nope_dim),
            ("v_head_dim", self.v_dim),
            ("q_lora_rank", self.q_rank),
            ("kv_lora_rank", self.kv_rank),
            ("index_n_heads", self.idx_heads),
            ("index_head_dim", self.idx_dim),
            ("n_routed_experts", self.n_expert),
            ("num_experts_per_tok", self.top_k),
            ("n_group", self.n_group),
        ];
        for (k, v) in pos {
            if v == 0 {
                bail!("config.json: {k} is 0");
            }
        }
        if self.top_k > self.n_expert || !self.n_expert.is_multiple_of(self.n_group) {
            bail!(
                "config.json: {} experts in {} groups, top-{}",
                self.n_expert,
                self.n_group,
                self.top_k
            );
        }
        Ok(())
    }

    /// Top-k pools per query.
    pub fn idx_pools(&self) -> usize {
        self.idx_topk / self.idx_pool
    }

    /// Most tokens a query attends to: the selected pools and the open pool's tail.
    pub fn max_selected(&self) -> usize {
        self.idx_topk + self.idx_pool - 1
    }

    pub fn summary(&self) -> String {
        let mla = self.mixers.iter().filter(|&&m| m == Mixer::Mla).count();
        format!(
            "glm5_next: {} layers ({} KDA {}×{}, {} MLA {} heads nope {} v {} rank {}, DSA top-{} \
             in pools of {}), hidden {}, {} mHC streams, {} dense layers, {} experts top-{} \
             (width {}), vocab {}",
            self.mixers.len(),
            self.mixers.len() - mla,
            self.kda_heads,
            self.kda_dim,
            mla,
            self.n_head,
            self.nope_dim,
            self.v_dim,
            self.kv_rank,
            self.idx_topk,
            self.idx_pool,
            self.hidden,
            self.hc,
            self.dense.iter().filter(|&&d| d).count(),
            self.n_expert,
            self.top_k,
            self.n_ff_exp,
            self.n_vocab,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_are_the_real_flash() {
        let c = Glm5Config::from_json(&json!({"text_config": {"index_kpool": 4}})).unwrap();
        assert_eq!(c.mixers.len(), 45);
        assert_eq!(c.mixers[3], Mixer::Mla);
        assert_eq!(c.mixers[4], Mixer::Kda);
        assert_eq!(c.dense[..4], [true, true, true, false]);
        assert!(c.indexers.iter().all(|&i| i == Indexer::Full));
        assert_eq!(c.lower_bound, Some(-5.0));
        assert_eq!(c.idx_pools(), 512);
    }

    #[test]
    fn derived_fields_and_refusals() {
        let c = Glm5Config::from_json(&json!({
            "num_hidden_layers": 3, "linear_lower_bound": null, "index_topk_pattern": "FFS",
            "layer_types": ["linear_attention", "full_attention", "indexed_attention"]
        }))
        .unwrap();
        assert_eq!(c.lower_bound, None);
        assert_eq!(c.indexers, [Indexer::Full, Indexer::Full, Indexer::Shared]);
        // safe_gate turns a missing bound back into −5.
        let c = Glm5Config::from_json(&json!({
            "num_hidden_layers": 1, "linear_lower_bound": null, "linear_attn_config": {"num_heads": 2}
        }))
        .unwrap();
        assert_eq!((c.lower_bound, c.kda_heads), (Some(-5.0), 2));
        for bad in [
            json!({"qk_rope_head_dim": 64}),
            json!({"num_key_value_heads": 8}),
            json!({"index_topk": 30, "index_kpool": 4}),
            json!({"hidden_act": "gelu"}),
            json!({"index_kpool_always_select_tail": false}),
            json!({"num_hidden_layers": 2, "index_topk_pattern": "SF",
                   "layer_types": ["full_attention", "full_attention"]}),
        ] {
            assert!(Glm5Config::from_json(&bad).is_err(), "{bad}");
        }
    }
}
