//! Locating a model's chat template source in HF files: `chat_template.jinja` and the
//! `chat_template` entry of `tokenizer_config.json` (a string, or a list of
//! `{"name": .., "template": ..}` named templates).

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value as Json;
use std::path::Path;

/// The chat template(s) of a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateSet {
    /// One template.
    Single(String),
    /// Named templates (e.g. `default`, `tool_use`, `rag`), in file order.
    Named(Vec<(String, String)>),
}

impl TemplateSet {
    /// Pick the template source the way HF's `get_chat_template` does: an explicit `name` wins;
    /// otherwise `tool_use` when tools are given and present, else `default`.
    pub fn select(&self, name: Option<&str>, has_tools: bool) -> Result<&str> {
        match self {
            TemplateSet::Single(s) => Ok(s),
            TemplateSet::Named(list) => {
                let find = |n: &str| list.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
                if let Some(n) = name {
                    return find(n).ok_or_else(|| anyhow!("no chat template named {n:?}"));
                }
                if has_tools {
                    if let Some(t) = find("tool_use") {
                        return Ok(t);
                    }
                }
                find("default").ok_or_else(|| {
                    let names: Vec<&str> = list.iter().map(|(k, _)| k.as_str()).collect();
                    anyhow!("multiple chat templates and no \"default\" (available: {names:?})")
                })
            }
        }
    }
}

/// Templates and special tokens found in a `tokenizer_config.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizerConfigTemplates {
    /// `None` when the file has no `chat_template`.
    pub templates: Option<TemplateSet>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
}

/// A special token entry: a string or an AddedToken dict with `content`.
fn token_str(v: Option<&Json>) -> Option<String> {
    match v? {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o
            .get("content")
            .and_then(|c| c.as_str())
            .map(str::to_string),
        _ => None,
    }
}

fn parse_template_value(v: &Json) -> Result<TemplateSet> {
    match v {
        Json::String(s) => Ok(TemplateSet::Single(s.clone())),
        Json::Array(items) => {
            let mut list = Vec::with_capacity(items.len());
            for item in items {
                let name = item.get("name").and_then(|n| n.as_str());
                let tmpl = item.get("template").and_then(|t| t.as_str());
                match (name, tmpl) {
                    (Some(n), Some(t)) => list.push((n.to_string(), t.to_string())),
                    _ => bail!("chat_template list entries need string `name` and `template`"),
                }
            }
            Ok(TemplateSet::Named(list))
        }
        _ => bail!("chat_template must be a string or a list of named templates"),
    }
}

/// Read `chat_template`, `bos_token` and `eos_token` from a `tokenizer_config.json`.
pub fn read_tokenizer_config(path: &Path) -> Result<TokenizerConfigTemplates> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let json: Json =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let templates = match json.get("chat_template") {
        None | Some(Json::Null) => None,
        Some(v) => Some(parse_template_value(v).with_context(|| path.display().to_string())?),
    };
    Ok(TokenizerConfigTemplates {
        templates,
        bos_token: token_str(json.get("bos_token")),
        eos_token: token_str(json.get("eos_token")),
    })
}

/// Read a standalone `chat_template.jinja` file.
pub fn read_chat_template_jinja(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// A HF model directory's template(s): `chat_template.jinja` takes precedence over
/// `tokenizer_config.json` (as in transformers 5); special tokens come from the config if present.
pub fn load_model_dir(dir: &Path) -> Result<TokenizerConfigTemplates> {
    let cfg_path = dir.join("tokenizer_config.json");
    let mut cfg = if cfg_path.exists() {
        read_tokenizer_config(&cfg_path)?
    } else {
        TokenizerConfigTemplates {
            templates: None,
            bos_token: None,
            eos_token: None,
        }
    };
    let jinja = dir.join("chat_template.jinja");
    if jinja.exists() {
        cfg.templates = Some(TemplateSet::Single(read_chat_template_jinja(&jinja)?));
    }
    if cfg.templates.is_none() {
        bail!(
            "no chat template in {} (chat_template.jinja / tokenizer_config.json)",
            dir.display()
        );
    }
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_templates_select_like_hf() {
        let v = serde_json::json!([
            {"name": "default", "template": "D"},
            {"name": "tool_use", "template": "T"}
        ]);
        let set = parse_template_value(&v).unwrap();
        assert_eq!(set.select(None, false).unwrap(), "D");
        assert_eq!(set.select(None, true).unwrap(), "T");
        assert_eq!(set.select(Some("default"), true).unwrap(), "D");
        assert!(set.select(Some("rag"), false).is_err());
        let only = TemplateSet::Named(vec![("rag".into(), "R".into())]);
        assert!(only.select(None, false).is_err());
        assert!(parse_template_value(&serde_json::json!(3)).is_err());
    }

    #[test]
    fn reads_config_and_jinja_file() {
        let dir = std::env::temp_dir().join(format!("vela-template-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("tokenizer_config.json"),
            r#"{"chat_template": "C", "bos_token": {"content": "<s>"}, "eos_token": "</s>"}"#,
        )
        .unwrap();
        let cfg = load_model_dir(&dir).unwrap();
        assert_eq!(cfg.templates, Some(TemplateSet::Single("C".into())));
        assert_eq!(cfg.bos_token.as_deref(), Some("<s>"));
        assert_eq!(cfg.eos_token.as_deref(), Some("</s>"));
        std::fs::write(dir.join("chat_template.jinja"), "J").unwrap();
        let cfg = load_model_dir(&dir).unwrap();
        assert_eq!(cfg.templates, Some(TemplateSet::Single("J".into())));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
