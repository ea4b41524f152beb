//! Locating large external test data (real models, llama.cpp golden files) fetched by the
//! project scripts (`scripts/fetch-models.sh`, `scripts/build-llama-cpp.sh`, `scripts/gen-*.py`).
//!
//! Tests call [`require`]: when the file is missing the test is skipped with a loud message, unless
//! `VELA_REQUIRE_DATA=1` (set by `.ci/run` after fetching) in which case it fails. A test can
//! therefore never pass silently in CI for lack of data.

use std::path::PathBuf;

/// `$VELA_CACHE`, default `~/.cache/vela`.
pub fn cache_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("VELA_CACHE") {
        return PathBuf::from(p);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("vela")
}

/// The real models directory (`$VELA_CACHE/models`).
pub fn models_dir() -> PathBuf {
    cache_dir().join("models")
}

/// The extracted llama.cpp source tree (vendored in the llama-cpp-python 0.3.36 sdist).
pub fn llama_cpp_src() -> PathBuf {
    cache_dir()
        .join("llama-cpp-python")
        .join("vendor")
        .join("llama.cpp")
}

/// Directory with generated golden files (`$VELA_CACHE/golden`).
pub fn golden_dir() -> PathBuf {
    cache_dir().join("golden")
}

/// Whether missing data must fail tests (`VELA_REQUIRE_DATA=1`).
pub fn data_required() -> bool {
    std::env::var("VELA_REQUIRE_DATA")
        .map(|v| v == "1")
        .unwrap_or(false)
}

/// Return `path` if it exists. Otherwise panic when data is required, or print a SKIP line and
/// return `None`.
pub fn require(path: impl Into<PathBuf>) -> Option<PathBuf> {
    let path = path.into();
    if path.exists() {
        return Some(path);
    }
    if data_required() {
        panic!(
            "required test data missing: {} (run scripts/prepare-test-data.sh)",
            path.display()
        );
    }
    eprintln!(
        "SKIP: test data missing: {} (run scripts/prepare-test-data.sh)",
        path.display()
    );
    None
}

/// A real model by file name in [`models_dir`].
pub fn model(name: &str) -> Option<PathBuf> {
    require(models_dir().join(name))
}

pub const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";
pub const QWEN25: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
