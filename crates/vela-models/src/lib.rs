//! Models: one file per architecture family, each reading side by side with the HF
//! `modeling_<arch>.py`, built from shared blocks ([`decoder`]).
//!
//! A family file only translates GGUF metadata into a [`DecoderConfig`] (which options of the shared
//! decoder it switches on); the forward pass lives once in [`decoder::DecoderModel`].

pub mod config;
pub mod decoder;
pub mod gemma3;
pub mod gemma4;
pub mod gemma4_assistant;
pub mod llama;
pub mod lm;
pub mod qwen2;
pub mod qwen3;
pub mod synth;

pub use config::{DecoderConfig, LayerConfig};
pub use decoder::{DecoderModel, ForwardState};
pub use gemma4::{load_gguf_gemma4, load_hf_gemma4, Gemma4Model};
pub use lm::{LanguageModel, ModelState};

use anyhow::{bail, Result};
use std::sync::Arc;
use vela_compute::Backend;
use vela_formats::gguf::GgufFile;

/// Architectures this build can run.
pub const SUPPORTED_ARCHS: &[&str] = &["llama", "qwen2", "qwen3", "gemma3", "gemma4"];

/// Build the decoder configuration for a GGUF file by its `general.architecture`.
pub fn config_from_gguf(g: &GgufFile) -> Result<DecoderConfig> {
    let arch = g.architecture()?;
    match arch {
        "llama" => llama::config(g),
        "qwen2" => qwen2::config(g),
        "qwen3" => qwen3::config(g),
        "gemma3" => gemma3::config(g),
        "gemma4" => {
            bail!("gemma4 has its own model (load it with load_gguf_any / load_gguf_gemma4)")
        }
        other => bail!(
            "unsupported model architecture '{other}' (supported: {})",
            SUPPORTED_ARCHS.join(", ")
        ),
    }
}

/// Load any supported GGUF model (the shared decoder's architectures and `gemma4`) onto a
/// backend, behind the object-safe [`LanguageModel`] interface.
pub fn load_gguf_any<B: Backend + 'static>(
    backend: Arc<B>,
    g: Arc<GgufFile>,
) -> Result<Arc<dyn LanguageModel>> {
    if g.architecture()? == "gemma4" {
        return Ok(Arc::new(load_gguf_gemma4(backend, g)?));
    }
    Ok(Arc::new(load(backend, g)?))
}

/// Load a Hugging Face checkpoint directory (`config.json` + safetensors) onto a backend.
/// Supported: Gemma 4 text models (`model_type` `gemma4` / `gemma4_text`).
pub fn load_hf_any<B: Backend + 'static>(
    backend: Arc<B>,
    dir: &std::path::Path,
) -> Result<Arc<dyn LanguageModel>> {
    let cfg_path = dir.join("config.json");
    let text = std::fs::read_to_string(&cfg_path)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", cfg_path.display()))?;
    let j: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{}: invalid JSON: {e}", cfg_path.display()))?;
    let mt = j.get("model_type").and_then(|v| v.as_str()).unwrap_or("");
    match mt {
        "gemma4" | "gemma4_text" => Ok(Arc::new(load_hf_gemma4(backend, dir)?)),
        other => bail!(
            "{}: unsupported model_type '{other}' for a Hugging Face directory (supported: gemma4)",
            cfg_path.display()
        ),
    }
}

/// Load a GGUF model onto a backend.
pub fn load<B: Backend>(backend: Arc<B>, g: Arc<GgufFile>) -> Result<DecoderModel<B>> {
    let cfg = config_from_gguf(&g)?;
    DecoderModel::load(backend, g, cfg)
}
