//! Loading a model file with its tokenizer and chat template (shared by the CLI and the server).

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use vela_compute::cpu::CpuBackend;
use vela_formats::gguf::GgufFile;
use vela_models::DecoderModel;
use vela_tokenizer::Tokenizer;

/// A model ready to serve: weights on a backend, tokenizer, chat template.
pub struct LoadedModel {
    pub path: PathBuf,
    pub gguf: Arc<GgufFile>,
    pub model: Arc<DecoderModel<CpuBackend>>,
    pub tokenizer: Tokenizer,
    /// The model's own Jinja chat template, if it has one.
    pub chat_template: Option<String>,
}

impl LoadedModel {
    /// A short name for APIs (`/v1/models`): the file stem.
    pub fn name(&self) -> String {
        self.path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into())
    }
    /// Text of the BOS/EOS tokens for chat templates ("" when absent).
    pub fn bos_eos_text(&self) -> (String, String) {
        let t = |id: Option<u32>| {
            id.and_then(|i| self.tokenizer.token_text(i))
                .unwrap_or_default()
        };
        (t(self.tokenizer.bos()), t(self.tokenizer.eos()))
    }
}

/// Load a GGUF model on the CPU backend with `threads` threads (0 = all cores).
pub fn load_gguf(path: &Path, threads: usize) -> Result<LoadedModel> {
    let gguf = Arc::new(GgufFile::open(path)?);
    let tokenizer = Tokenizer::from_gguf(&gguf).context("cannot load the tokenizer")?;
    let backend = Arc::new(CpuBackend::new(threads));
    let model = Arc::new(vela_models::load(backend, gguf.clone())?);
    let chat_template = gguf
        .get_str("tokenizer.chat_template")
        .ok()
        .map(str::to_string);
    Ok(LoadedModel {
        path: path.to_path_buf(),
        gguf,
        model,
        tokenizer,
        chat_template,
    })
}
