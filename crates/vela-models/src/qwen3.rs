//! Qwen3 (dense): Qwen2 without biases, with per-head RMSNorm on q and k before RoPE.
//!
//! Reads side by side with HF `modeling_qwen3.py` (`q_norm`/`k_norm` over head_dim).

use crate::config::{Common, DecoderConfig};
use anyhow::Result;
use vela_formats::gguf::GgufFile;

pub fn config(g: &GgufFile) -> Result<DecoderConfig> {
    let mut c = Common::read(g)?.into_config("qwen3", true);
    c.qk_norm = true;
    Ok(c)
}
