//! Llama (1/2/3, SmolLM2, Mistral-style dense): pre-norm decoder, SwiGLU, GQA, RoPE.
//!
//! Reads side by side with HF `modeling_llama.py`. GGUF conversion permutes the Q/K rows so that
//! the rotation pairs adjacent dimensions ("normal" RoPE), unlike HF's rotate_half; Llama 3 rope
//! scaling arrives as `rope_freqs.weight` frequency factors.

use crate::config::{Common, DecoderConfig};
use anyhow::Result;
use vela_formats::gguf::GgufFile;

pub fn config(g: &GgufFile) -> Result<DecoderConfig> {
    Ok(Common::read(g)?.into_config("llama", false))
}
