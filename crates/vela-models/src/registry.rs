//! The architectures this build runs: one [`Arch`] entry each, with its names in both formats
//! (GGUF `general.architecture`, Hugging Face `model_type`), how to read its configuration and
//! load its weights, and whether it has its own drafter. Loading, `vela info` and the drafter
//! options go through here: adding an architecture adds its entry and its file, and touches
//! neither the engine, nor the CLI, nor the server.

use crate::config::DecoderConfig;
use crate::decoder::DecoderModel;
use crate::deepseekv4::{DeepseekV4Config, DeepseekV4Model};
use crate::gemma4::{Gemma4Config, Gemma4Model};
use crate::glm5::{Glm5Config, Glm5Model};
use crate::lm::LanguageModel;
use crate::placement::LoadSpec;
use crate::qwen4exp::{Qwen4ExpConfig, Qwen4ExpModel};
use crate::weights::WeightSource;
use crate::{gemma3, llama, qwen2, qwen3};
use anyhow::{anyhow, bail, Result};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;
use vela_compute::Backend;
use vela_formats::gguf::GgufFile;

/// One architecture.
pub struct Arch {
    /// `general.architecture` of its GGUF files.
    pub gguf: &'static str,
    /// `model_type`s of its Hugging Face checkpoint directories (empty: GGUF only).
    pub hf_model_types: &'static [&'static str],
    /// The family's name for people.
    pub display: &'static str,
    /// Whether the architecture has its own drafter (an MTP head or assistant model):
    /// [`LanguageModel::load_mtp`].
    pub mtp: bool,
    family: Family,
}

/// How an entry is built.
enum Family {
    /// The shared decoder with the options a GGUF file's metadata selects.
    Decoder(fn(&GgufFile) -> Result<DecoderConfig>),
    Gemma4,
    Qwen4Exp,
    DeepseekV4,
    Glm5,
}

/// Every architecture this build runs.
pub static ARCHS: &[Arch] = &[
    Arch {
        gguf: "llama",
        hf_model_types: &[],
        display: "Llama",
        mtp: false,
        family: Family::Decoder(llama::config),
    },
    Arch {
        gguf: "qwen2",
        hf_model_types: &[],
        display: "Qwen 2",
        mtp: false,
        family: Family::Decoder(qwen2::config),
    },
    Arch {
        gguf: "qwen3",
        hf_model_types: &[],
        display: "Qwen 3",
        mtp: false,
        family: Family::Decoder(qwen3::config),
    },
    Arch {
        gguf: "gemma3",
        hf_model_types: &[],
        display: "Gemma 3",
        mtp: false,
        family: Family::Decoder(gemma3::config),
    },
    Arch {
        gguf: "gemma4",
        hf_model_types: &["gemma4", "gemma4_text"],
        display: "Gemma 4",
        mtp: true,
        family: Family::Gemma4,
    },
    Arch {
        gguf: "qwen4exp",
        hf_model_types: &["qwen4_exp", "qwen4_exp_text"],
        display: "Qwen3.8 Flash Next",
        mtp: true,
        family: Family::Qwen4Exp,
    },
    Arch {
        gguf: "deepseek4",
        hf_model_types: &["deepseek_v4"],
        display: "DeepSeek V4",
        mtp: true,
        family: Family::DeepseekV4,
    },
    Arch {
        gguf: "glm5-next",
        hf_model_types: &["glm5_next", "glm5_next_text"],
        display: "GLM 5.3",
        mtp: true,
        family: Family::Glm5,
    },
];

/// GGUF architecture names this build runs.
pub fn gguf_names() -> Vec<&'static str> {
    ARCHS.iter().map(|a| a.gguf).collect()
}

/// Names of the architectures with their own drafter (for messages).
pub fn mtp_arch_names() -> Vec<&'static str> {
    ARCHS.iter().filter(|a| a.mtp).map(|a| a.display).collect()
}

/// The entry of a GGUF file (by `general.architecture`).
pub fn for_gguf(g: &GgufFile) -> Result<&'static Arch> {
    let name = g.architecture()?;
    ARCHS.iter().find(|a| a.gguf == name).ok_or_else(|| {
        anyhow!(
            "unsupported model architecture '{}' (supported: {})",
            name.escape_debug(),
            gguf_names().join(", ")
        )
    })
}

/// The entry of a Hugging Face `config.json` (by `model_type`).
pub fn for_hf(config: &Value) -> Result<&'static Arch> {
    let mt = config
        .get("model_type")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    ARCHS
        .iter()
        .find(|a| a.hf_model_types.contains(&mt))
        .ok_or_else(|| {
            let known: Vec<&str> = ARCHS
                .iter()
                .flat_map(|a| a.hf_model_types.iter().copied())
                .collect();
            anyhow!(
                "unsupported model_type '{}' for a Hugging Face directory (supported: {})",
                mt.escape_debug(),
                known.join(", ")
            )
        })
}

impl Arch {
    /// Load a GGUF file of this architecture onto a backend as `spec` says (the load-time type
    /// of its float matrices, [`crate::weights`]; the placement of routed experts,
    /// [`crate::placement`]).
    pub fn load_gguf<B: Backend + 'static>(
        &self,
        backend: Arc<B>,
        g: Arc<GgufFile>,
        spec: &LoadSpec,
    ) -> Result<Arc<dyn LanguageModel>> {
        Ok(match self.family {
            Family::Decoder(config) => {
                let cfg = config(&g)?;
                let src = WeightSource::gguf(g).with_spec(spec);
                Arc::new(DecoderModel::load_from(backend, &src, cfg)?)
            }
            Family::Gemma4 => Arc::new(Gemma4Model::load_gguf_with(backend, g, spec)?),
            Family::Qwen4Exp => Arc::new(Qwen4ExpModel::load_gguf(backend, g, spec)?),
            Family::DeepseekV4 => Arc::new(DeepseekV4Model::load_gguf(backend, g, spec)?),
            Family::Glm5 => Arc::new(Glm5Model::load_gguf(backend, g, spec)?),
        })
    }

    /// Load a Hugging Face checkpoint directory of this architecture onto a backend.
    pub fn load_hf<B: Backend + 'static>(
        &self,
        backend: Arc<B>,
        dir: &Path,
        spec: &LoadSpec,
    ) -> Result<Arc<dyn LanguageModel>> {
        Ok(match self.family {
            Family::Gemma4 => Arc::new(Gemma4Model::load_hf_with(backend, dir, spec)?),
            Family::Qwen4Exp => Arc::new(Qwen4ExpModel::load_hf(backend, dir, spec)?),
            Family::DeepseekV4 => Arc::new(DeepseekV4Model::load_hf(backend, dir, spec)?),
            Family::Glm5 => Arc::new(Glm5Model::load_hf(backend, dir, spec)?),
            Family::Decoder(_) => bail!(
                "{}: {} models load from GGUF files only",
                dir.display(),
                self.display
            ),
        })
    }

    /// The shared decoder's configuration for a GGUF file of this architecture (an error for
    /// architectures with their own model).
    pub fn decoder_config(&self, g: &GgufFile) -> Result<DecoderConfig> {
        match self.family {
            Family::Decoder(config) => config(g),
            _ => bail!(
                "{} has its own model (load it with load_gguf_any)",
                self.gguf
            ),
        }
    }

    /// One line describing the model a GGUF file holds (`vela info`).
    pub fn describe_gguf(&self, g: &GgufFile) -> Result<String> {
        Ok(match self.family {
            Family::Decoder(config) => config(g)?.summary(),
            Family::Gemma4 => Gemma4Config::from_gguf(g)?.summary(),
            Family::Qwen4Exp => Qwen4ExpConfig::from_gguf(g)?.summary(),
            Family::DeepseekV4 => DeepseekV4Config::from_gguf(g)?.summary(),
            Family::Glm5 => Glm5Config::from_gguf(g)?.summary(),
        })
    }

    /// One line describing the model of a Hugging Face `config.json` (`vela info`).
    pub fn describe_hf(&self, config: &Value) -> Result<String> {
        Ok(match self.family {
            Family::Gemma4 => Gemma4Config::from_json(config)?.summary(),
            Family::Qwen4Exp => Qwen4ExpConfig::from_json(config)?.summary(),
            Family::DeepseekV4 => DeepseekV4Config::from_json(config)?.summary(),
            Family::Glm5 => Glm5Config::from_json(config)?.summary(),
            Family::Decoder(_) => bail!("{} models load from GGUF files only", self.display),
        })
    }
}

/// Load any supported GGUF model onto a backend.
pub fn load_gguf_any<B: Backend + 'static>(
    backend: Arc<B>,
    g: Arc<GgufFile>,
) -> Result<Arc<dyn LanguageModel>> {
    load_gguf_spec(backend, g, &LoadSpec::default())
}

/// [`load_gguf_any`] as `spec` says (load-time type, experts placement).
pub fn load_gguf_spec<B: Backend + 'static>(
    backend: Arc<B>,
    g: Arc<GgufFile>,
    spec: &LoadSpec,
) -> Result<Arc<dyn LanguageModel>> {
    for_gguf(&g)?.load_gguf(backend, g, spec)
}

/// Load a Hugging Face checkpoint directory (`config.json` + safetensors) onto a backend.
pub fn load_hf_any<B: Backend + 'static>(
    backend: Arc<B>,
    dir: &Path,
) -> Result<Arc<dyn LanguageModel>> {
    load_hf_spec(backend, dir, &LoadSpec::default())
}

/// [`load_hf_any`] as `spec` says (load-time type, experts placement).
pub fn load_hf_spec<B: Backend + 'static>(
    backend: Arc<B>,
    dir: &Path,
    spec: &LoadSpec,
) -> Result<Arc<dyn LanguageModel>> {
    let cfg_path = dir.join("config.json");
    let text = std::fs::read_to_string(&cfg_path)
        .map_err(|e| anyhow!("cannot read {}: {e}", cfg_path.display()))?;
    let j: Value = serde_json::from_str(&text)
        .map_err(|e| anyhow!("{}: invalid JSON: {e}", cfg_path.display()))?;
    let arch = for_hf(&j).map_err(|e| anyhow!("{}: {e}", cfg_path.display()))?;
    arch.load_hf(backend, dir, spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_found() {
        let mut g: Vec<&str> = gguf_names();
        g.sort();
        g.dedup();
        assert_eq!(g.len(), ARCHS.len());
        let hf = serde_json::json!({"model_type": "gemma4_text"});
        assert_eq!(for_hf(&hf).unwrap().gguf, "gemma4");
        let e = for_hf(&serde_json::json!({"model_type": "mamba"}))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("'mamba'") && e.contains("gemma4_text"), "{e}");
        assert_eq!(
            mtp_arch_names(),
            vec!["Gemma 4", "Qwen3.8 Flash Next", "DeepSeek V4", "GLM 5.3"]
        );
    }

    /// Fuzz finding (config_json): names from the file were echoed verbatim, so a name with a
    /// newline gave a multi-line error.
    #[test]
    fn errors_on_names_with_newlines_stay_one_line() {
        use crate::gemma4::Gemma4Config;
        use crate::gemma4_assistant::AssistantConfig;
        use crate::qwen4exp::Qwen4ExpConfig;
        use vela_formats::gguf::Value as Gv;
        use vela_formats::gguf_write::GgufWriter;

        let mut w = GgufWriter::new();
        w.add_kv("general.architecture", Gv::String("qw\n2".into()))
            .unwrap();
        let g = GgufFile::from_bytes(w.to_bytes(|_, _, _| Ok(())).unwrap()).unwrap();
        let j = serde_json::json!({"model_type": "a\nb", "rope_scaling": {"rope_type": "x\ny"}});
        let errs = [
            for_gguf(&g).err().unwrap(),
            for_hf(&j).err().unwrap(),
            crate::config_from_gguf(&g).err().unwrap(),
            Gemma4Config::from_gguf(&g).err().unwrap(),
            Qwen4ExpConfig::from_gguf(&g).err().unwrap(),
            AssistantConfig::from_gguf(&g).err().unwrap(),
            Gemma4Config::from_json(&j).err().unwrap(),
            AssistantConfig::from_json(&j).err().unwrap(),
        ];
        for e in errs {
            let m = format!("{e:#}");
            assert!(!m.contains('\n'), "multi-line error: {m}");
        }
    }
}
