//! Gemma 3 (text): sliding/global interleave, q/k norms, GeGLU, embedding scale, post norms.
//!
//! Reads side by side with HF `modeling_gemma3.py`:
//! - embeddings × sqrt(hidden_size);
//! - RMSNorm weights use the (1 + w) convention — llama.cpp's converter already stores 1 + w in GGUF;
//! - `sliding_window_pattern` 6: layers with `il % 6 < 5` are local (window `sliding_window`,
//!   RoPE base `rope_local_base_freq` = 10000), every 6th is global (RoPE base `rope_theta`, with
//!   linear scaling when configured);
//! - attention scale `query_pre_attn_scalar^-0.5` (= head_dim for all sizes but 27B, where it is
//!   hidden/heads), optional attention/final logit soft-capping.

use crate::config::{Common, DecoderConfig};
use anyhow::{bail, Result};
use vela_compute::Activation;
use vela_formats::gguf::GgufFile;

pub fn config(g: &GgufFile) -> Result<DecoderConfig> {
    let common = Common::read(g)?;
    let window = g
        .arch_u64_opt("attention.sliding_window")?
        .map(|w| w as usize)
        .filter(|&w| w > 0);
    let swa_base = g.arch_f64_opt("rope.freq_base_swa")?.unwrap_or(10000.0) as f32;
    let pattern: Vec<bool> = match g.get(&format!(
        "{}.attention.sliding_window_pattern",
        g.architecture()?
    )) {
        Some(v) if v.as_array().is_some() => {
            let a = v.as_array().unwrap();
            if a.len() != common.n_layer {
                bail!(
                    "sliding_window_pattern has {} entries for {} layers",
                    a.len(),
                    common.n_layer
                );
            }
            a.iter().map(|x| x.as_bool().unwrap_or(false)).collect()
        }
        Some(v) => {
            let n = v.as_i64().unwrap_or(6).max(0) as usize;
            (0..common.n_layer)
                .map(|il| n == 0 || il % n < n - 1)
                .collect()
        }
        None => (0..common.n_layer).map(|il| il % 6 < 5).collect(),
    };
    let n_layer = common.n_layer;
    let scale = if n_layer == 62 {
        1.0 / ((common.n_embd / common.n_head) as f32).sqrt()
    } else {
        1.0 / (common.head_dim_k as f32).sqrt()
    };
    let mut c = common.into_config("gemma3", true);
    c.attn_scale = scale;
    c.embed_scale = (c.n_embd as f32).sqrt();
    c.act = Activation::GeluTanh;
    c.qk_norm = true;
    c.post_norms = true;
    c.final_softcap = g
        .arch_f64_opt("final_logit_softcapping")?
        .map(|v| v as f32)
        .filter(|&v| v > 0.0);
    c.attn_softcap = g
        .arch_f64_opt("attn_logit_softcapping")?
        .map(|v| v as f32)
        .filter(|&v| v > 0.0);
    if let Some(w) = window {
        for (il, l) in c.layers.iter_mut().enumerate() {
            if pattern[il] {
                l.window = Some(w);
                l.rope.freq_base = swa_base;
                l.rope.freq_scale = 1.0;
            }
        }
    }
    Ok(c)
}
