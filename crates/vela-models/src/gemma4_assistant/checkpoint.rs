//! An assistant checkpoint's tensor names: llama.cpp's name for each HF name (the loader looks
//! tensors up by llama.cpp's names in both formats).

/// llama.cpp's GGUF name for an HF assistant tensor (`None`: not a weight we read).
pub(super) fn gguf_name(hf: &str) -> Option<String> {
    const TOP: &[(&str, &str)] = &[
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
        ("pre_projection.weight", "nextn.pre_projection.weight"),
        ("post_projection.weight", "nextn.post_projection.weight"),
        (
            "masked_embedding.centroids.weight",
            "masked_embd_centroids.weight",
        ),
    ];
    const LAYER: &[(&str, &str)] = &[
        ("input_layernorm.weight", "attn_norm.weight"),
        ("self_attn.q_proj.weight", "attn_q.weight"),
        ("self_attn.o_proj.weight", "attn_output.weight"),
        ("self_attn.q_norm.weight", "attn_q_norm.weight"),
        (
            "post_attention_layernorm.weight",
            "post_attention_norm.weight",
        ),
        ("pre_feedforward_layernorm.weight", "ffn_norm.weight"),
        ("post_feedforward_layernorm.weight", "post_ffw_norm.weight"),
        ("mlp.gate_proj.weight", "ffn_gate.weight"),
        ("mlp.up_proj.weight", "ffn_up.weight"),
        ("mlp.down_proj.weight", "ffn_down.weight"),
        ("layer_scalar", "layer_output_scale.weight"),
    ];
    if let Some((_, g)) = TOP.iter().find(|(h, _)| *h == hf) {
        return Some(g.to_string());
    }
    let (il, rest) = hf.strip_prefix("model.layers.")?.split_once('.')?;
    let (_, g) = LAYER.iter().find(|(h, _)| *h == rest)?;
    Some(format!("blk.{il}.{g}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hf_names_map_to_llama_cpp_names() {
        assert_eq!(
            gguf_name("model.layers.3.self_attn.q_proj.weight").as_deref(),
            Some("blk.3.attn_q.weight")
        );
        assert_eq!(
            gguf_name("pre_projection.weight").as_deref(),
            Some("nextn.pre_projection.weight")
        );
        assert_eq!(
            gguf_name("model.layers.0.layer_scalar").as_deref(),
            Some("blk.0.layer_output_scale.weight")
        );
        assert_eq!(gguf_name("masked_embedding.token_ordering"), None);
    }
}
