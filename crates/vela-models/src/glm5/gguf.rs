//! llama.cpp 0c1e570's GLM 5.3 GGUF files (`glm5-next`: `conversion/glm.py` `Glm5NextModel`,
//! run by `src/models/glm5-next.cpp`): the metadata read back into config.json's keys as
//! llama.cpp reads them (so one parser validates both), and the release's tensor names mapped
//! onto the converter's. What the converter rewrites is undone by the loader (load.rs):
//! `kv_b_proj` arrives as the per-head absorbed `attn_k_b` (W^k_hᵀ) and `attn_v_b` (W^v_h),
//! `A_log` as `ssm_a = −exp(A_log)`, the routed experts stacked (`ffn_{gate,up,down}_exps`).
//! An MTP block (blocks from `block_count − nextn_predict_layers` on) keeps the trunk's names for
//! its MLA and MoE tensors and adds `blk.N.nextn.*` (`eh_proj`, `enorm`, `hnorm`,
//! `shared_head_norm`, optionally `shared_head_head` and `embed_tokens`; mtp.rs).

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Map, Value};
use vela_formats::gguf::GgufFile;

const ARCH: &str = "glm5-next";

/// The config.json keys a `glm5-next` GGUF's metadata describes, as llama.cpp's runtime reads
/// them (docs/glm5.md lists where that differs from what transformers would make of the
/// checkpoint the file was converted from).
pub(super) fn config_json(g: &GgufFile) -> Result<Value> {
    let arch = g.architecture()?;
    if arch != ARCH {
        bail!("GGUF architecture '{}' is not {ARCH}", arch.escape_debug());
    }
    let key = |k: &str| format!("{ARCH}.{k}");
    let u = |k: &str| g.get_u64(&key(k));
    let f32v = |k: &str| g.get_f64(&key(k)).map(|v| json!(v as f32));
    // A per-layer key (an array, or one value for every layer), its first `n` entries.
    let per_layer = |k: &str, n: usize| -> Result<Option<Vec<f64>>> {
        let Some(v) = g.get(&key(k)) else {
            return Ok(None);
        };
        let vals = match v.as_array() {
            Some(a) => a.iter().map(|x| x.as_f64()).collect::<Option<Vec<f64>>>(),
            None => v.as_f64().map(|x| vec![x; n]),
        }
        .ok_or_else(|| anyhow!("metadata '{}' must be a number or an array of them", key(k)))?;
        if vals.len() < n {
            bail!(
                "metadata '{}' has {} entries for {n} layers",
                key(k),
                vals.len()
            );
        }
        Ok(Some(vals[..n].to_vec()))
    };
    let required = |k: &str, n: usize| -> Result<Vec<f64>> {
        per_layer(k, n)?.ok_or_else(|| anyhow!("missing metadata key '{}'", key(k)))
    };
    // One value over the layers that use the key (refused when they differ).
    let uniform = |k: &str, vals: &[f64], layers: &mut dyn Iterator<Item = usize>| {
        let mut it = layers.map(|i| vals[i]);
        let first = it.next();
        if it.any(|v| Some(v) != first) {
            bail!(
                "metadata '{}': per-layer values that differ are not supported",
                key(k)
            );
        }
        Ok(first)
    };

    let n_all = u("block_count")? as usize;
    let nextn = g.arch_u64_opt("nextn_predict_layers")?.unwrap_or(0) as usize;
    if nextn >= n_all {
        bail!(
            "metadata: {} blocks, {nextn} of them MTP ('{}'): no trunk layers",
            n_all,
            key("nextn_predict_layers")
        );
    }
    let n = n_all - nextn;
    // llama.cpp: a layer with no KV heads is recurrent (KDA), the others MLA.
    let layer_types: Vec<Value> = required("attention.head_count_kv", n)?
        .iter()
        .map(|&h| {
            json!(if h == 0.0 {
                "linear_attention"
            } else {
                "indexed_attention"
            })
        })
        .collect();
    // llama.cpp: the first `leading_dense_block_count` layers dense, the rest MoE.
    let lead = u("leading_dense_block_count")? as usize;
    let mlp_layer_types: Vec<Value> = (0..n)
        .map(|i| json!(if i < lead { "dense" } else { "sparse" }))
        .collect();
    // llama.cpp: absent means every layer has its own indexer.
    let indexer_types: Vec<Value> = per_layer("attention.indexer.types", n)?
        .unwrap_or_else(|| vec![1.0; n])
        .iter()
        .map(|&t| json!(if t != 0.0 { "full" } else { "shared" }))
        .collect();
    // The clamp of routed experts (MoE layers) and of every other SwiGLU (llama.cpp's
    // `build_ffn`: dense layers and the shared expert), one value for all.
    let exp = required("swiglu_clamp_exp", n)?;
    let shexp = per_layer("swiglu_clamp_shexp", n)?.unwrap_or_else(|| exp.clone());
    let a = uniform("swiglu_clamp_exp", &exp, &mut (lead..n))?;
    let b = uniform("swiglu_clamp_shexp", &shexp, &mut (0..n))?;
    let limit = match (a, b) {
        (Some(a), Some(b)) if a != b => bail!(
            "metadata: swiglu_clamp_exp {a} and swiglu_clamp_shexp {b} differ (one clamp for \
             every FFN is supported)"
        ),
        (a, b) => a.or(b).unwrap_or(0.0),
    };
    if limit <= 1e-6 {
        bail!(
            "metadata '{}' {limit}: no SwiGLU clamp is not supported (transformers clamps \
             every FFN)",
            key("swiglu_clamp_exp")
        );
    }
    let n_ff_exp = uniform(
        "expert_feed_forward_length",
        &required("expert_feed_forward_length", n)?,
        &mut (lead..n),
    )?;
    let n_ff = match lead {
        0 => None,
        _ => uniform(
            "feed_forward_length",
            &required("feed_forward_length", n)?,
            &mut (0..lead),
        )?,
    };
    match g.arch_u64_opt("expert_gating_func")? {
        None | Some(0) | Some(2) => {}
        Some(x) => bail!(
            "metadata '{}' {x}: only sigmoid routing (2) is supported",
            key("expert_gating_func")
        ),
    }
    // The indexer's key LayerNorm: transformers fixes its eps at 1e-6, as the converter writes.
    if let Some(e) = g.arch_f64_opt("attention.layer_norm_epsilon")? {
        if (e - 1e-6).abs() > 1e-12 {
            bail!(
                "metadata '{}' {e}: the indexer LayerNorm's eps is 1e-6",
                key("attention.layer_norm_epsilon")
            );
        }
    }
    let rope = u("rope.dimension_count")?;
    let k_mla = u("attention.key_length_mla")?;
    let n_head = u("attention.head_count")?;
    // KDA: llama.cpp runs as many heads as MLA has; no bound means the softplus decay.
    let mut kda = Map::new();
    kda.insert("num_heads".into(), json!(n_head));
    kda.insert("head_dim".into(), json!(u("kda.head_dim")?));
    kda.insert(
        "short_conv_kernel_size".into(),
        json!(u("ssm.conv_kernel")?),
    );
    kda.insert("safe_gate".into(), json!(false));
    if let Some(lb) = g.arch_f64_opt("kda.gate_lower_bound")? {
        kda.insert("gate_lower_bound".into(), json!(lb as f32));
    }
    let n_vocab = g
        .tensor("token_embd.weight")
        .map(|t| t.n_rows())
        .ok_or_else(|| anyhow!("missing tensor token_embd.weight"))?;
    let mut c = Map::new();
    for (k, v) in [
        ("model_type", json!("glm5_next")),
        ("vocab_size", json!(n_vocab)),
        ("hidden_size", json!(u("embedding_length")?)),
        ("num_hidden_layers", json!(n)),
        ("num_nextn_predict_layers", json!(nextn)),
        ("layer_types", Value::Array(layer_types)),
        ("mlp_layer_types", Value::Array(mlp_layer_types)),
        ("indexer_types", Value::Array(indexer_types)),
        ("rms_norm_eps", f32v("attention.layer_norm_rms_epsilon")?),
        ("hc_mult", json!(u("hyper_connection.count")?)),
        (
            "hc_sinkhorn_iters",
            json!(u("hyper_connection.sinkhorn_iterations")?),
        ),
        ("hc_eps", f32v("hyper_connection.epsilon")?),
        ("linear_attn_config", Value::Object(kda)),
        ("linear_lower_bound", Value::Null),
        ("num_attention_heads", json!(n_head)),
        ("num_key_value_heads", json!(n_head)),
        ("qk_rope_head_dim", json!(rope)),
        ("qk_nope_head_dim", json!(k_mla.saturating_sub(rope))),
        ("v_head_dim", json!(u("attention.value_length_mla")?)),
        ("q_lora_rank", json!(u("attention.q_lora_rank")?)),
        ("kv_lora_rank", json!(u("attention.kv_lora_rank")?)),
        ("index_n_heads", json!(u("attention.indexer.head_count")?)),
        ("index_head_dim", json!(u("attention.indexer.key_length")?)),
        ("index_topk", json!(u("attention.indexer.top_k")?)),
        ("index_kpool", json!(u("attention.indexer.kpool")?)),
        (
            "index_kpool_always_select_tail",
            match g.get(&key("attention.indexer.kpool_select_tail")) {
                None => json!(true),
                Some(_) => json!(g.get_bool(&key("attention.indexer.kpool_select_tail"))?),
            },
        ),
        ("intermediate_size", json!(n_ff.map(|v| v as u64))),
        ("moe_intermediate_size", json!(n_ff_exp.map(|v| v as u64))),
        ("n_shared_experts", json!(u("expert_shared_count")?)),
        ("n_routed_experts", json!(u("expert_count")?)),
        ("num_experts_per_tok", json!(u("expert_used_count")?)),
        (
            "n_group",
            json!(g.arch_u64_opt("expert_group_count")?.unwrap_or(1).max(1)),
        ),
        (
            "topk_group",
            json!(g
                .arch_u64_opt("expert_group_used_count")?
                .unwrap_or(1)
                .max(1)),
        ),
        (
            "norm_topk_prob",
            json!(g.get_bool(&key("expert_weights_norm"))?),
        ),
        ("routed_scaling_factor", f32v("expert_weights_scale")?),
        ("swiglu_limit", json!(limit as f32)),
        (
            "tie_word_embeddings",
            json!(g.tensor("output.weight").is_none()),
        ),
    ] {
        c.insert(k.into(), v);
    }
    Ok(Value::Object(c))
}

impl super::Glm5Config {
    /// The configuration of a `glm5-next` GGUF file.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        Self::from_json(&config_json(g)?)
            .context("the glm5-next GGUF's metadata (read as config.json keys)")
    }
}

/// The GGUF name of a release-named tensor (the names load.rs asks for, without the
/// `model.language_model.` prefix). `self_attn.{k,v}_b_proj.weight` stand for the converter's
/// split of `kv_b_proj`; `None`: the routed experts (stacked by the converter) and names it has
/// no counterpart for.
pub(super) fn gguf_name(name: &str) -> Option<String> {
    let top = match name {
        "embed_tokens.weight" => Some("token_embd.weight"),
        "lm_head.weight" => Some("output.weight"),
        "norm.weight" => Some("output_norm.weight"),
        _ => None,
    };
    if let Some(t) = top {
        return Some(t.into());
    }
    let rest = name.strip_prefix("layers.")?;
    let (i, rest) = rest.split_once('.')?;
    i.parse::<usize>().ok()?;
    let mapped = if let Some(a) = rest.strip_prefix("shared_head.") {
        format!("nextn.shared_head_{a}")
    } else if ["eh_proj.", "enorm.", "hnorm.", "embed_tokens."]
        .iter()
        .any(|p| rest.starts_with(p))
    {
        format!("nextn.{rest}")
    } else if rest.starts_with("hc_") && !rest.contains('.') {
        format!("{rest}.weight")
    } else if let Some(a) = rest.strip_prefix("self_attn.indexer.") {
        match a {
            "wq_b.weight" => "indexer.attn_q_b.weight",
            "wk.weight" => "indexer.attn_k.weight",
            "k_norm.weight" => "indexer.k_norm.weight",
            "k_norm.bias" => "indexer.k_norm.bias",
            "weights_proj.weight" => "indexer.proj.weight",
            "index_kpool_compress_ape" => "indexer_compressor_ape.weight",
            "index_kpool_compress_gate" => "indexer_compressor_gate.weight",
            _ => return None,
        }
        .to_string()
    } else if let Some(a) = rest.strip_prefix("self_attn.") {
        match a {
            // KDA
            "q_proj.weight" => "attn_q.weight",
            "k_proj.weight" => "attn_k.weight",
            "v_proj.weight" => "attn_v.weight",
            "q_conv1d.weight" => "ssm_conv1d_q.weight",
            "k_conv1d.weight" => "ssm_conv1d_k.weight",
            "v_conv1d.weight" => "ssm_conv1d_v.weight",
            "f_a_proj.weight" => "ssm_f_a.weight",
            "f_b_proj.weight" => "ssm_f_b.weight",
            "dt_bias" => "ssm_dt.bias",
            "A_log" => "ssm_a",
            "b_proj.weight" => "ssm_beta.weight",
            "g_a_proj.weight" => "ssm_g_a.weight",
            "g_b_proj.weight" => "ssm_g_b.weight",
            "o_norm.weight" => "ssm_norm.weight",
            // both mixers
            "o_proj.weight" => "attn_output.weight",
            // MLA
            "q_a_proj.weight" => "attn_q_a.weight",
            "q_a_layernorm.weight" => "attn_q_a_norm.weight",
            "q_b_proj.weight" => "attn_q_b.weight",
            "kv_a_proj_with_mqa.weight" => "attn_kv_a_mqa.weight",
            "kv_a_layernorm.weight" => "attn_kv_a_norm.weight",
            "k_b_proj.weight" => "attn_k_b.weight",
            "v_b_proj.weight" => "attn_v_b.weight",
            _ => return None,
        }
        .to_string()
    } else {
        match rest {
            "input_layernorm.weight" => "attn_norm.weight",
            "post_attention_layernorm.weight" => "ffn_norm.weight",
            "mlp.gate_proj.weight" => "ffn_gate.weight",
            "mlp.up_proj.weight" => "ffn_up.weight",
            "mlp.down_proj.weight" => "ffn_down.weight",
            "mlp.gate.weight" => "ffn_gate_inp.weight",
            "mlp.gate.e_score_correction_bias" => "exp_probs_b.bias",
            "mlp.shared_experts.gate_proj.weight" => "ffn_gate_shexp.weight",
            "mlp.shared_experts.up_proj.weight" => "ffn_up_shexp.weight",
            "mlp.shared_experts.down_proj.weight" => "ffn_down_shexp.weight",
            _ => return None,
        }
        .to_string()
    };
    Some(format!("blk.{i}.{mapped}"))
}

#[cfg(test)]
mod tests {
    use super::super::Glm5Config;
    use super::*;
    use vela_formats::gguf::Value as Gv;
    use vela_formats::gguf_write::GgufWriter;
    use vela_formats::quant::GgmlType;

    #[test]
    fn release_names_map_to_the_converter_names() {
        for (a, b) in [
            ("embed_tokens.weight", "token_embd.weight"),
            ("lm_head.weight", "output.weight"),
            ("norm.weight", "output_norm.weight"),
            ("layers.3.hc_attn_fn", "blk.3.hc_attn_fn.weight"),
            ("layers.3.hc_ffn_scale", "blk.3.hc_ffn_scale.weight"),
            ("layers.0.input_layernorm.weight", "blk.0.attn_norm.weight"),
            (
                "layers.0.self_attn.k_conv1d.weight",
                "blk.0.ssm_conv1d_k.weight",
            ),
            ("layers.0.self_attn.dt_bias", "blk.0.ssm_dt.bias"),
            ("layers.0.self_attn.A_log", "blk.0.ssm_a"),
            ("layers.0.self_attn.b_proj.weight", "blk.0.ssm_beta.weight"),
            ("layers.0.self_attn.o_norm.weight", "blk.0.ssm_norm.weight"),
            (
                "layers.7.self_attn.o_proj.weight",
                "blk.7.attn_output.weight",
            ),
            (
                "layers.7.self_attn.k_b_proj.weight",
                "blk.7.attn_k_b.weight",
            ),
            (
                "layers.7.self_attn.kv_a_layernorm.weight",
                "blk.7.attn_kv_a_norm.weight",
            ),
            (
                "layers.7.self_attn.indexer.k_norm.bias",
                "blk.7.indexer.k_norm.bias",
            ),
            (
                "layers.7.self_attn.indexer.index_kpool_compress_ape",
                "blk.7.indexer_compressor_ape.weight",
            ),
            (
                "layers.7.self_attn.indexer.weights_proj.weight",
                "blk.7.indexer.proj.weight",
            ),
            (
                "layers.2.mlp.gate.e_score_correction_bias",
                "blk.2.exp_probs_b.bias",
            ),
            (
                "layers.2.mlp.shared_experts.up_proj.weight",
                "blk.2.ffn_up_shexp.weight",
            ),
            ("layers.0.mlp.down_proj.weight", "blk.0.ffn_down.weight"),
            ("layers.8.eh_proj.weight", "blk.8.nextn.eh_proj.weight"),
            ("layers.8.enorm.weight", "blk.8.nextn.enorm.weight"),
            ("layers.8.hnorm.weight", "blk.8.nextn.hnorm.weight"),
            (
                "layers.8.shared_head.norm.weight",
                "blk.8.nextn.shared_head_norm.weight",
            ),
            (
                "layers.8.shared_head.head.weight",
                "blk.8.nextn.shared_head_head.weight",
            ),
            (
                "layers.8.embed_tokens.weight",
                "blk.8.nextn.embed_tokens.weight",
            ),
        ] {
            assert_eq!(gguf_name(a).as_deref(), Some(b), "{a}");
        }
        for none in [
            "layers.2.mlp.experts.3.gate_proj.weight",
            "layers.7.self_attn.kv_b_proj.weight",
            "layers.x.input_layernorm.weight",
            "model.visual.patch_embed.weight",
        ] {
            assert_eq!(gguf_name(none), None, "{none}");
        }
    }

    /// The metadata llama.cpp's converter writes for a 4-layer model (KDA, KDA, KDA, MLA; one
    /// dense layer), with an MTP block.
    fn metadata() -> Vec<(String, Gv)> {
        let a = |k: &str| format!("{ARCH}.{k}");
        let u = |v: u32| Gv::U32(v);
        let arr = |v: Vec<Gv>| Gv::Array(v);
        vec![
            ("general.architecture".into(), Gv::String(ARCH.into())),
            (a("block_count"), u(5)),
            (a("nextn_predict_layers"), u(1)),
            (a("embedding_length"), u(64)),
            (a("feed_forward_length"), u(96)),
            (a("attention.head_count"), u(4)),
            (
                a("attention.head_count_kv"),
                arr([0, 0, 0, 1, 1].map(u).to_vec()),
            ),
            (a("attention.layer_norm_rms_epsilon"), Gv::F32(1e-5)),
            (a("attention.layer_norm_epsilon"), Gv::F32(1e-6)),
            (a("attention.key_length_mla"), u(16)),
            (a("attention.value_length_mla"), u(16)),
            (a("attention.q_lora_rank"), u(32)),
            (a("attention.kv_lora_rank"), u(24)),
            (a("rope.dimension_count"), u(0)),
            (a("ssm.conv_kernel"), u(4)),
            (a("kda.head_dim"), u(16)),
            (a("kda.gate_lower_bound"), Gv::F32(-5.0)),
            (a("attention.indexer.head_count"), u(2)),
            (a("attention.indexer.key_length"), u(16)),
            (a("attention.indexer.top_k"), u(16)),
            (a("attention.indexer.kpool"), u(4)),
            (a("attention.indexer.kpool_select_tail"), Gv::Bool(true)),
            (a("attention.indexer.types"), arr(vec![Gv::Bool(true); 4])),
            (a("hyper_connection.count"), u(4)),
            (a("hyper_connection.sinkhorn_iterations"), u(20)),
            (a("hyper_connection.epsilon"), Gv::F32(1e-6)),
            (a("leading_dense_block_count"), u(1)),
            (a("expert_feed_forward_length"), u(32)),
            (a("expert_shared_count"), u(1)),
            (a("expert_count"), u(8)),
            (a("expert_used_count"), u(2)),
            (a("expert_weights_scale"), Gv::F32(2.5)),
            (a("expert_weights_norm"), Gv::Bool(true)),
            (a("expert_gating_func"), u(2)),
            (a("swiglu_clamp_exp"), arr(vec![Gv::F32(10.0); 5])),
            (a("swiglu_clamp_shexp"), arr(vec![Gv::F32(10.0); 5])),
        ]
    }

    fn file(kv: &[(String, Gv)]) -> GgufFile {
        let mut w = GgufWriter::new();
        for (k, v) in kv {
            w.add_kv(k.clone(), v.clone()).unwrap();
        }
        w.add_tensor("token_embd.weight", &[64, 100], GgmlType::F32)
            .unwrap();
        let bytes = w
            .to_bytes(|_, _, out| {
                let n = out.remaining() as usize;
                std::io::Write::write_all(out, &vec![0u8; n])?;
                Ok(())
            })
            .unwrap();
        GgufFile::from_bytes(bytes).unwrap()
    }

    #[test]
    fn metadata_reads_back_into_the_config() {
        let c = Glm5Config::from_gguf(&file(&metadata())).unwrap();
        assert_eq!(c.mixers.len(), 4, "the MTP block is not a trunk layer");
        assert_eq!(c.nextn, 1);
        assert_eq!(c.mixers[3], super::super::Mixer::Mla);
        assert_eq!(c.dense, [true, false, false, false]);
        assert_eq!((c.kda_heads, c.kda_dim, c.conv_k), (4, 16, 4));
        assert_eq!(c.lower_bound, Some(-5.0));
        assert_eq!((c.nope_dim, c.v_dim, c.kv_rank), (16, 16, 24));
        assert_eq!((c.n_vocab, c.n_ff, c.n_ff_exp), (100, 96, 32));
        assert_eq!((c.swiglu_limit, c.eps), (10.0, 1e-5));
        assert!(c.tie_embeddings && c.norm_topk);
        // No lower bound: llama.cpp's softplus decay.
        let kv: Vec<_> = metadata()
            .into_iter()
            .filter(|(k, _)| !k.ends_with("gate_lower_bound"))
            .collect();
        assert_eq!(Glm5Config::from_gguf(&file(&kv)).unwrap().lower_bound, None);
    }

    #[test]
    fn other_architectures_and_missing_or_unsupported_keys_are_refused() {
        let mut kv = metadata();
        kv[0].1 = Gv::String("deepseek4".into());
        let e = format!("{:#}", Glm5Config::from_gguf(&file(&kv)).unwrap_err());
        assert!(e.contains("'deepseek4' is not glm5-next"), "{e}");
        for k in [
            "block_count",
            "attention.head_count_kv",
            "leading_dense_block_count",
            "swiglu_clamp_exp",
            "kda.head_dim",
            "attention.indexer.kpool",
            "hyper_connection.count",
            "expert_weights_norm",
        ] {
            let full = format!("{ARCH}.{k}");
            let kv: Vec<_> = metadata().into_iter().filter(|(n, _)| *n != full).collect();
            let e = format!("{:#}", Glm5Config::from_gguf(&file(&kv)).unwrap_err());
            assert!(e.contains(&format!("'{full}'")), "{k}: {e}");
        }
        for (k, v, says) in [
            ("expert_gating_func", Gv::U32(1), "sigmoid"),
            ("rope.dimension_count", Gv::U32(8), "qk_rope_head_dim"),
            ("attention.layer_norm_epsilon", Gv::F32(1e-5), "1e-6"),
            ("nextn_predict_layers", Gv::U32(5), "no trunk layers"),
            (
                "swiglu_clamp_exp",
                Gv::Array(vec![Gv::F32(0.0); 5]),
                "clamp",
            ),
            (
                "attention.head_count_kv",
                Gv::Array(vec![Gv::U32(0); 2]),
                "2 entries",
            ),
            (
                "attention.indexer.types",
                Gv::String("full".into()),
                "number",
            ),
        ] {
            let mut kv = metadata();
            kv.iter_mut()
                .find(|(n, _)| *n == format!("{ARCH}.{k}"))
                .unwrap()
                .1 = v;
            let e = format!("{:#}", Glm5Config::from_gguf(&file(&kv)).unwrap_err());
            assert!(e.contains(says), "{k}: {e}");
        }
    }
}
