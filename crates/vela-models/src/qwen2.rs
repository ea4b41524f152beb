//! Qwen2 / Qwen2.5: the Llama decoder with q/k/v biases and NEOX (rotate_half) RoPE.
//!
//! Reads side by side with HF `modeling_qwen2.py`. The biases are picked up by the shared decoder
//! from the presence of `attn_{q,k,v}.bias` tensors.

use crate::config::{Common, DecoderConfig};
use anyhow::Result;
use vela_formats::gguf::GgufFile;

pub fn config(g: &GgufFile) -> Result<DecoderConfig> {
    Ok(Common::read(g)?.into_config("qwen2", true))
}
