//! Models: one file per architecture family, each reading side by side with the HF
//! `modeling_<arch>.py`, built from shared blocks ([`decoder`]).
//!
//! A family file only translates GGUF metadata into a [`DecoderConfig`] (which options of the shared
//! decoder it switches on); the forward pass lives once in [`decoder::DecoderModel`].

pub mod config;
pub mod decoder;
pub mod gemma3;
pub mod gemma4;
pub mod llama;
pub mod qwen2;
pub mod qwen3;

pub use config::{DecoderConfig, LayerConfig};
pub use decoder::{DecoderModel, ForwardState};
pub use gemma4::{load_gguf_gemma4, load_hf_gemma4, Gemma4Model};

use anyhow::{bail, Result};
use std::sync::Arc;
use vela_compute::Backend;
use vela_formats::gguf::GgufFile;

/// Architectures this build can run.
pub const SUPPORTED_ARCHS: &[&str] = &["llama", "qwen2", "qwen3", "gemma3"];

/// Build the decoder configuration for a GGUF file by its `general.architecture`.
pub fn config_from_gguf(g: &GgufFile) -> Result<DecoderConfig> {
    let arch = g.architecture()?;
    match arch {
        "llama" => llama::config(g),
        "qwen2" => qwen2::config(g),
        "qwen3" => qwen3::config(g),
        "gemma3" => gemma3::config(g),
        other => bail!(
            "unsupported model architecture '{other}' (supported: {})",
            SUPPORTED_ARCHS.join(", ")
        ),
    }
}

/// Load a GGUF model onto a backend.
pub fn load<B: Backend>(backend: Arc<B>, g: Arc<GgufFile>) -> Result<DecoderModel<B>> {
    let cfg = config_from_gguf(&g)?;
    DecoderModel::load(backend, g, cfg)
}
