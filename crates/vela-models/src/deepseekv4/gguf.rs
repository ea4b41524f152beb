//! llama.cpp 0c1e570's DeepSeek V4 GGUF files (`deepseek4`, `conversion/deepseek.py`): the
//! metadata read back into the release config's keys (so one parser validates both), the
//! tensor names mapped onto the release's, the routed experts as the converter stacks them
//! (`ffn_{gate,up,down}_exps`, GGML's MXFP4 decoded exactly by the weight source). The
//! converter's FP8 matrices arrive as Q8_0 (it dequantizes and requantizes them).

use anyhow::anyhow;
use serde_json::{json, Map, Value};
use vela_formats::gguf::GgufFile;

/// The release config (config.json keys) a `deepseek4` GGUF's metadata describes.
pub(super) fn config_json(g: &GgufFile) -> anyhow::Result<Value> {
    let arch = g.architecture()?;
    if arch != "deepseek4" {
        anyhow::bail!("GGUF architecture '{arch}' is not deepseek4");
    }
    let u = |k: &str| g.arch_u64(k).map(|v| json!(v));
    let f = |k: &str| -> anyhow::Result<Value> {
        g.arch_f64_opt(k)?
            .map(|v| json!(v as f32))
            .ok_or_else(|| anyhow!("deepseek4.{k} is missing"))
    };
    let ints = |k: &str| -> anyhow::Result<Value> {
        let a = g.get_array(&format!("deepseek4.{k}"))?;
        a.iter()
            .map(|v| v.as_i64().map(|x| json!(x)))
            .collect::<Option<Vec<Value>>>()
            .map(Value::Array)
            .ok_or_else(|| anyhow!("deepseek4.{k} is not an array of integers"))
    };
    let first_f = |k: &str| -> anyhow::Result<Value> {
        let a = g.get_array(&format!("deepseek4.{k}"))?;
        a.first()
            .and_then(|v| v.as_f64())
            .map(|v| json!(v as f32))
            .ok_or_else(|| anyhow!("deepseek4.{k} is not an array of numbers"))
    };
    let n_vocab = g
        .tensor("token_embd.weight")
        .map(|t| t.n_rows())
        .ok_or_else(|| anyhow!("missing tensor token_embd.weight"))?;
    let scoring = match g.arch_u64_opt("expert_gating_func")? {
        Some(2) => "sigmoid",
        Some(4) | None => "sqrtsoftplus",
        Some(x) => anyhow::bail!("deepseek4.expert_gating_func {x} is not supported"),
    };
    let mut c = Map::new();
    for (key, v) in [
        ("model_type", json!("deepseek_v4")),
        ("vocab_size", json!(n_vocab)),
        ("hidden_size", u("embedding_length")?),
        ("num_hidden_layers", u("block_count")?),
        ("num_attention_heads", u("attention.head_count")?),
        ("head_dim", u("attention.key_length")?),
        ("q_lora_rank", u("attention.q_lora_rank")?),
        ("qk_rope_head_dim", u("rope.dimension_count")?),
        ("o_groups", u("attention.output_group_count")?),
        ("o_lora_rank", u("attention.output_lora_rank")?),
        ("sliding_window", u("attention.sliding_window")?),
        ("compress_ratios", ints("attention.compress_ratios")?),
        (
            "compress_rope_theta",
            f("attention.compress_rope_freq_base")?,
        ),
        ("rope_theta", f("rope.freq_base")?),
        ("num_hash_layers", u("hash_layer_count")?),
        ("n_routed_experts", u("expert_count")?),
        ("num_experts_per_tok", u("expert_used_count")?),
        ("moe_intermediate_size", u("expert_feed_forward_length")?),
        ("scoring_func", json!(scoring)),
        ("routed_scaling_factor", f("expert_weights_scale")?),
        ("swiglu_limit", first_f("swiglu_clamp_exp")?),
        ("hc_mult", u("hyper_connection.count")?),
        (
            "hc_sinkhorn_iters",
            u("hyper_connection.sinkhorn_iterations")?,
        ),
        ("hc_eps", f("hyper_connection.epsilon")?),
        ("index_n_heads", u("attention.indexer.head_count")?),
        ("index_head_dim", u("attention.indexer.key_length")?),
        ("index_topk", u("attention.indexer.top_k")?),
        ("rms_norm_eps", f("attention.layer_norm_rms_epsilon")?),
        (
            "tie_word_embeddings",
            json!(g.tensor("output.weight").is_none()),
        ),
    ] {
        c.insert(key.into(), v);
    }
    if g.get("deepseek4.rope.scaling.type")
        .and_then(|v| v.as_str())
        == Some("yarn")
    {
        c.insert(
            "rope_scaling".into(),
            json!({
                "type": "yarn",
                "factor": f("rope.scaling.factor")?,
                "original_max_position_embeddings": u("rope.scaling.original_context_length")?,
                "beta_fast": f("rope.scaling.yarn_beta_fast")?,
                "beta_slow": f("rope.scaling.yarn_beta_slow")?,
            }),
        );
    }
    Ok(Value::Object(c))
}

impl super::DeepseekV4Config {
    /// The configuration of a `deepseek4` GGUF file.
    pub fn from_gguf(g: &GgufFile) -> anyhow::Result<Self> {
        Self::from_json(&config_json(g)?)
    }
}

/// The GGUF name of a release-named tensor (`None`: the routed experts, which the converter
/// stacks, and names it has no counterpart for).
pub(super) fn gguf_name(name: &str) -> Option<String> {
    let top = match name {
        "embed.weight" => Some("token_embd.weight"),
        "head.weight" => Some("output.weight"),
        "norm.weight" => Some("output_norm.weight"),
        "hc_head_fn" => Some("output_hc_fn.weight"),
        "hc_head_base" => Some("output_hc_base.weight"),
        "hc_head_scale" => Some("output_hc_scale.weight"),
        _ => None,
    };
    if let Some(t) = top {
        return Some(t.into());
    }
    let rest = name.strip_prefix("layers.")?;
    let (i, rest) = rest.split_once('.')?;
    let mapped = match rest {
        r if r.starts_with("hc_") => format!("{r}.weight"),
        "attn_norm.weight" | "ffn_norm.weight" => rest.to_string(),
        "attn.attn_sink" => "attn_sinks.weight".into(),
        "attn.wq_a.weight" => "attn_q_a.weight".into(),
        "attn.q_norm.weight" => "attn_q_a_norm.weight".into(),
        "attn.wq_b.weight" => "attn_q_b.weight".into(),
        "attn.wkv.weight" => "attn_kv.weight".into(),
        "attn.kv_norm.weight" => "attn_kv_a_norm.weight".into(),
        "attn.wo_a.weight" => "attn_output_a.weight".into(),
        "attn.wo_b.weight" => "attn_output_b.weight".into(),
        "attn.indexer.wq_b.weight" => "indexer.attn_q_b.weight".into(),
        "attn.indexer.weights_proj.weight" => "indexer.proj.weight".into(),
        "ffn.gate.weight" => "ffn_gate_inp.weight".into(),
        "ffn.gate.bias" => "exp_probs_b.bias".into(),
        "ffn.gate.tid2eid" => "ffn_gate_tid2eid.weight".into(),
        "ffn.shared_experts.w1.weight" => "ffn_gate_shexp.weight".into(),
        "ffn.shared_experts.w3.weight" => "ffn_up_shexp.weight".into(),
        "ffn.shared_experts.w2.weight" => "ffn_down_shexp.weight".into(),
        // The MTP block of a `--mtp` export (its e_proj | h_proj as one matrix).
        "enorm.weight" => "nextn.enorm.weight".into(),
        "hnorm.weight" => "nextn.hnorm.weight".into(),
        "norm.weight" => "nextn.shared_head_norm.weight".into(),
        "eh_proj.weight" => "nextn.eh_proj.weight".into(),
        r => {
            let (which, part) = if let Some(p) = r.strip_prefix("attn.indexer.compressor.") {
                ("indexer_compressor", p)
            } else {
                ("attn_compressor", r.strip_prefix("attn.compressor.")?)
            };
            let suffix = match part {
                "wkv.weight" => "kv",
                "wgate.weight" => "gate",
                "ape" => "ape",
                "norm.weight" => "norm",
                _ => return None,
            };
            format!("{which}_{suffix}.weight")
        }
    };
    Some(format!("blk.{i}.{mapped}"))
}

#[cfg(test)]
mod tests {
    use super::gguf_name;

    #[test]
    fn release_names_map_to_the_converter_names() {
        for (a, b) in [
            ("embed.weight", "token_embd.weight"),
            ("hc_head_scale", "output_hc_scale.weight"),
            ("layers.3.hc_ffn_fn", "blk.3.hc_ffn_fn.weight"),
            (
                "layers.0.attn.kv_norm.weight",
                "blk.0.attn_kv_a_norm.weight",
            ),
            (
                "layers.2.attn.compressor.ape",
                "blk.2.attn_compressor_ape.weight",
            ),
            (
                "layers.2.attn.indexer.compressor.wgate.weight",
                "blk.2.indexer_compressor_gate.weight",
            ),
            (
                "layers.2.attn.indexer.weights_proj.weight",
                "blk.2.indexer.proj.weight",
            ),
            ("layers.3.ffn.gate.bias", "blk.3.exp_probs_b.bias"),
            ("layers.43.hnorm.weight", "blk.43.nextn.hnorm.weight"),
            (
                "layers.43.norm.weight",
                "blk.43.nextn.shared_head_norm.weight",
            ),
            ("layers.43.eh_proj.weight", "blk.43.nextn.eh_proj.weight"),
            (
                "layers.1.ffn.shared_experts.w3.weight",
                "blk.1.ffn_up_shexp.weight",
            ),
        ] {
            assert_eq!(gguf_name(a).as_deref(), Some(b), "{a}");
        }
        assert_eq!(gguf_name("layers.0.ffn.experts.3.w1.weight"), None);
    }
}
