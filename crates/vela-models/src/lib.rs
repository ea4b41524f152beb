//! Models: one file per architecture family, each reading side by side with the HF
//! `modeling_<arch>.py`, built from shared blocks ([`decoder`]).
//!
//! [`registry`] lists the architectures. The mainstream families only translate GGUF metadata
//! into a [`DecoderConfig`] (which options of the shared decoder they switch on; the forward
//! pass lives once in [`decoder::DecoderModel`]); others have their own model ([`gemma4`]). Each
//! implements [`CausalLm`] and declares its per-sequence state ([`state`]); [`lm`] makes that a
//! [`LanguageModel`] the engine uses without knowing the architecture.

pub mod blocks;
pub mod config;
pub mod decoder;
pub mod deepseekv4;
pub mod gemma3;
pub mod gemma4;
pub mod gemma4_assistant;
pub mod glm5;
pub mod llama;
pub mod lm;
pub mod mtp;
pub mod placement;
pub mod qwen2;
pub mod qwen3;
pub mod qwen4exp;
pub mod registry;
pub mod state;
pub mod stepper;
pub mod synth;
pub mod weights;

pub use config::{DecoderConfig, LayerConfig};
pub use decoder::{DecoderModel, ForwardState};
pub use gemma4::{load_gguf_gemma4, load_hf_gemma4, Gemma4Model};
pub use lm::{BatchItem, CausalLm, LanguageModel, ModelState, Select, Selected, StateExport};
pub use mtp::MtpHead;
pub use placement::LoadSpec;
pub use registry::{load_gguf_any, load_gguf_spec, load_hf_any, load_hf_spec};
pub use state::{LayerState, StateLayout};

use anyhow::Result;
use std::sync::Arc;
use vela_compute::Backend;
use vela_formats::gguf::GgufFile;

/// The shared decoder's configuration for a GGUF file of one of its architectures.
pub fn config_from_gguf(g: &GgufFile) -> Result<DecoderConfig> {
    registry::for_gguf(g)?.decoder_config(g)
}

/// Load a GGUF model of one of the shared decoder's architectures onto a backend.
pub fn load<B: Backend>(backend: Arc<B>, g: Arc<GgufFile>) -> Result<DecoderModel<B>> {
    let cfg = config_from_gguf(&g)?;
    DecoderModel::load(backend, g, cfg)
}
