//! Workload files (`vela-workload/1`, docs/eval.md): what a run sends, turn by turn.
//!
//! A workload is one JSON object. A conversation has frozen user turns (`turns`), each with
//! optional checks; a synthetic workload (`synthetic`) is expanded into turns here: a long
//! prefix of about N tokens, then short extensions. Documents (`documents`) are files next to
//! the workload (or built in) spliced into user text as `{{name}}`. Everything is expanded
//! before the run, and the digest covers the expanded form: two runs with the same digest sent
//! the same text.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::Path;

pub const FORMAT: &str = "vela-workload/1";

/// Sampling settings sent with every request (absent fields: the server's defaults).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Sampling {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

/// A check of a turn's answer (`checks.rs` runs them).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Check {
    /// Every string occurs (case-insensitive).
    ContainsAll(Vec<String>),
    /// At least one occurs (case-insensitive).
    ContainsAny(Vec<String>),
    /// None occurs (case-insensitive).
    NotContains(Vec<String>),
    /// The answer has at least this many words.
    MinWords(usize),
    /// The answer does not end by asking the user something (its last line has no '?').
    NoQuestionAtEnd(bool),
    /// The turn finished with a call of this tool, with JSON arguments.
    ToolCall(String),
    /// The answer's first fenced code block defines `function`; each test is a Python
    /// statement (usually an `assert`) run against it without network, in a fresh
    /// interpreter with a time limit.
    Python {
        function: String,
        tests: Vec<String>,
    },
}

/// One turn as written in the file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Turn {
    pub name: String,
    /// The user's message (`{{doc}}` placeholders filled from `documents`). Absent on a turn
    /// that answers the previous turn's tool calls with `tool_results`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Results of the previous turn's tool calls, by tool name (a `tool_results` turn sends one
    /// `tool` message per call instead of a user message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_results: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<usize>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<Check>,
}

/// A synthetic long-context workload: a prefix of about `prefix_tokens` tokens of seeded text,
/// then `extensions` turns each adding about `extension_tokens` tokens.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Synthetic {
    pub prefix_tokens: usize,
    pub extensions: usize,
    pub extension_tokens: usize,
    #[serde(default = "one")]
    pub seed: u64,
}

fn one() -> u64 {
    1
}

/// The API a workload speaks: chat messages (`/v1/chat/completions`, the model's template) or
/// raw text (`/v1/completions`: each turn's prompt is the previous prompt, its completion and
/// the new text).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    #[default]
    Chat,
    Completion,
}

/// A workload as written in its file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    pub format: String,
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub api: Api,
    #[serde(default)]
    pub sampling: Sampling,
    /// Default generation limit of a turn.
    #[serde(default = "default_max_tokens")]
    pub max_tokens: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// OpenAI `tools` offered on every request of the conversation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Value>,
    /// Name → file (relative to the workload file), spliced into user text as `{{name}}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub documents: BTreeMap<String, String>,
    /// Concurrent clients, each running the whole conversation.
    #[serde(default = "one_usize")]
    pub clients: usize,
    /// Context the server needs (the in-process driver raises `--ctx` to it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_ctx: Option<usize>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub turns: Vec<Turn>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synthetic: Option<Synthetic>,
}

fn default_max_tokens() -> usize {
    256
}

fn one_usize() -> usize {
    1
}

/// A workload ready to run: documents spliced in, synthetic turns generated.
#[derive(Debug, Clone, Serialize)]
pub struct Expanded {
    pub name: String,
    pub description: String,
    pub api: Api,
    pub sampling: Sampling,
    pub system: Option<String>,
    pub tools: Option<Value>,
    pub clients: usize,
    pub min_ctx: Option<usize>,
    /// Per client (the same unless the text is seeded per client).
    pub conversations: Vec<Vec<ExpandedTurn>>,
    /// `sha256:` of the canonical JSON of everything above.
    #[serde(skip)]
    pub digest: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ExpandedTurn {
    pub name: String,
    pub user: Option<String>,
    pub tool_results: Option<BTreeMap<String, String>>,
    pub max_tokens: usize,
    pub checks: Vec<Check>,
}

/// The workloads shipped with vela: (name, file text, documents).
const BUILTIN: &[(&str, &str)] = &[
    ("seeds-chat", include_str!("../workloads/seeds-chat.json")),
    ("tool-call", include_str!("../workloads/tool-call.json")),
    ("long-8k", include_str!("../workloads/long-8k.json")),
    ("long-32k", include_str!("../workloads/long-32k.json")),
    ("long-128k", include_str!("../workloads/long-128k.json")),
    (
        "concurrent-4",
        include_str!("../workloads/concurrent-4.json"),
    ),
];
const BUILTIN_DOCS: &[(&str, &str)] = &[(
    "tidepool-readme.md",
    include_str!("../workloads/tidepool-readme.md"),
)];

/// Names and descriptions of the built-in workloads.
pub fn builtin_list() -> Vec<(String, String)> {
    BUILTIN
        .iter()
        .filter_map(|(n, src)| {
            let w: Workload = serde_json::from_str(src).ok()?;
            Some((n.to_string(), w.description))
        })
        .collect()
}

/// The text of a built-in workload.
pub fn builtin_source(name: &str) -> Option<&'static str> {
    BUILTIN.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

/// Load a workload: a built-in name or a file path.
pub fn load(spec: &str) -> Result<Expanded> {
    if let Some(src) = builtin_source(spec) {
        return expand(src, &|f| {
            BUILTIN_DOCS
                .iter()
                .find(|(n, _)| *n == f)
                .map(|(_, t)| t.to_string())
                .ok_or_else(|| anyhow::anyhow!("built-in document {f} missing"))
        });
    }
    let path = Path::new(spec);
    if !path.exists() {
        let names: Vec<_> = BUILTIN.iter().map(|(n, _)| *n).collect();
        bail!(
            "no workload file {spec} (built-in workloads: {})",
            names.join(", ")
        );
    }
    let src = std::fs::read_to_string(path).with_context(|| format!("reading {spec}"))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    expand(&src, &|f| {
        let p = dir.join(f);
        std::fs::read_to_string(&p).with_context(|| format!("document {}", p.display()))
    })
    .with_context(|| format!("workload {spec}"))
}

/// Parse, validate and expand a workload's text; `doc` reads a document by file name.
pub fn expand(src: &str, doc: &dyn Fn(&str) -> Result<String>) -> Result<Expanded> {
    let w: Workload = serde_json::from_str(src).context("not a valid workload")?;
    if w.format != FORMAT {
        bail!("format is {:?}, expected {FORMAT:?}", w.format);
    }
    if w.clients == 0 || w.clients > 256 {
        bail!("clients must be 1..=256");
    }
    let mut docs = BTreeMap::new();
    for (k, f) in &w.documents {
        docs.insert(k.clone(), doc(f)?);
    }
    let fill = |t: &str| -> Result<String> { splice(t, &docs) };
    let conversations = match (&w.synthetic, w.turns.is_empty()) {
        (Some(s), true) => (0..w.clients)
            .map(|c| synthetic_turns(s, w.max_tokens, s.seed.wrapping_add(c as u64)))
            .collect(),
        (None, false) => {
            let mut turns = Vec::new();
            for (i, t) in w.turns.iter().enumerate() {
                match (&t.user, &t.tool_results) {
                    (Some(_), None) => {}
                    (None, Some(_)) if i > 0 => {}
                    (None, Some(_)) => bail!("turn {}: tool_results on the first turn", t.name),
                    _ => bail!("turn {}: needs exactly one of user, tool_results", t.name),
                }
                if t.max_tokens == Some(0) {
                    bail!("turn {}: max_tokens must be at least 1", t.name);
                }
                if matches!(w.api, Api::Completion) && t.tool_results.is_some() {
                    bail!("turn {}: tool_results needs the chat api", t.name);
                }
                turns.push(ExpandedTurn {
                    name: t.name.clone(),
                    user: t.user.as_deref().map(fill).transpose()?,
                    tool_results: t.tool_results.clone(),
                    max_tokens: t.max_tokens.unwrap_or(w.max_tokens),
                    checks: t.checks.clone(),
                });
            }
            vec![turns; w.clients]
        }
        _ => bail!("a workload has either turns or synthetic, not both or neither"),
    };
    if w.max_tokens == 0 {
        bail!("max_tokens must be at least 1");
    }
    let mut e = Expanded {
        name: w.name,
        description: w.description,
        api: w.api,
        sampling: w.sampling,
        system: w.system.as_deref().map(fill).transpose()?,
        tools: w.tools,
        clients: w.clients,
        min_ctx: w.min_ctx,
        conversations,
        digest: String::new(),
    };
    let canon = serde_json::to_vec(&e)?;
    e.digest = format!("sha256:{:x}", Sha256::digest(&canon));
    Ok(e)
}

/// Replace `{{name}}` with the document; an unknown name is an error.
fn splice(text: &str, docs: &BTreeMap<String, String>) -> Result<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(a) = rest.find("{{") {
        out.push_str(&rest[..a]);
        let Some(b) = rest[a..].find("}}") else {
            bail!("unclosed {{{{ in turn text");
        };
        let key = rest[a + 2..a + b].trim();
        match docs.get(key) {
            Some(d) => out.push_str(d),
            None => bail!("{{{{{key}}}}} names no document"),
        }
        rest = &rest[a + b + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Common English words: with a leading space, one token each in the usual BPE vocabularies,
/// so N words are close to N tokens.
const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
    "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "out", "up", "into", "than",
    "them", "only", "time", "some", "could", "new", "these", "two", "may", "first", "then", "do",
    "any", "like", "my", "now", "over", "such", "our", "man", "me", "even", "most", "made",
    "after", "also", "did", "many", "before", "must", "through", "back", "years", "where", "much",
    "your", "way", "well", "down", "should", "because", "each", "just", "those", "people", "how",
    "too", "little", "state", "good", "very", "make", "world", "still", "own", "see", "men",
    "work", "long", "get", "here", "between", "both", "life", "being", "under", "never", "day",
    "same", "another", "know", "while", "last", "might", "us", "great", "old", "year", "off",
    "come", "since", "against", "go", "came", "right", "used", "take", "three", "water", "river",
    "stone", "light", "house", "road", "field", "city", "ship", "market", "winter", "garden",
    "letter", "music", "paper", "school", "table", "window", "village",
];

/// About `n` tokens of seeded text (sentences of common words).
pub fn synthetic_text(n: usize, seed: u64) -> String {
    let mut rng = seed ^ 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        // splitmix64
        rng = rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut out = String::new();
    let mut tokens = 0;
    while tokens < n {
        let len = 8 + (next() % 9) as usize;
        // Each sentence ends with '.', which counts as a token too.
        for i in 0..len.min(n - tokens - 1) {
            let w = WORDS[(next() % WORDS.len() as u64) as usize];
            if i == 0 {
                if !out.is_empty() {
                    out.push(' ');
                }
                let mut c = w.chars();
                out.extend(c.next().map(|f| f.to_ascii_uppercase()));
                out.push_str(c.as_str());
            } else {
                out.push(' ');
                out.push_str(w);
            }
            tokens += 1;
        }
        out.push('.');
        tokens += 1;
    }
    out
}

fn synthetic_turns(s: &Synthetic, max_tokens: usize, seed: u64) -> Vec<ExpandedTurn> {
    let mut turns = vec![ExpandedTurn {
        name: format!("prefix-{}", s.prefix_tokens),
        user: Some(synthetic_text(s.prefix_tokens, seed)),
        tool_results: None,
        max_tokens,
        checks: Vec::new(),
    }];
    for i in 0..s.extensions {
        turns.push(ExpandedTurn {
            name: format!("ext-{}", i + 1),
            user: Some(format!(
                "\n\n{}",
                synthetic_text(
                    s.extension_tokens,
                    seed.wrapping_mul(31).wrapping_add(i as u64 + 1)
                )
            )),
            tool_results: None,
            max_tokens,
            checks: Vec::new(),
        });
    }
    turns
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_docs(f: &str) -> Result<String> {
        bail!("no document {f}")
    }

    #[test]
    fn builtins_parse_and_expand() {
        for (name, _) in BUILTIN {
            let e = load(name).unwrap_or_else(|e| panic!("{name}: {e:#}"));
            assert!(!e.conversations[0].is_empty(), "{name}");
            assert!(e.digest.starts_with("sha256:"));
        }
        let chat = load("seeds-chat").unwrap();
        let names: Vec<_> = chat.conversations[0]
            .iter()
            .map(|t| t.name.as_str())
            .collect();
        assert_eq!(names, ["summary", "story", "python"]);
        // The document is spliced in.
        assert!(chat.conversations[0][0]
            .user
            .as_ref()
            .unwrap()
            .contains("tidepool"));
    }

    #[test]
    fn digest_follows_the_expanded_text() {
        let src = |t: &str| {
            format!(
                r#"{{"format":"vela-workload/1","name":"x","turns":[{{"name":"a","user":"{t}"}}]}}"#
            )
        };
        let a = expand(&src("hello"), &no_docs).unwrap();
        let b = expand(&src("hello"), &no_docs).unwrap();
        let c = expand(&src("hellp"), &no_docs).unwrap();
        assert_eq!(a.digest, b.digest);
        assert_ne!(a.digest, c.digest);
    }

    #[test]
    fn bad_workloads_are_clear_errors() {
        let cases = [
            (
                r#"{"format":"vela-workload/2","name":"x","turns":[{"name":"a","user":"u"}]}"#,
                "format",
            ),
            (
                r#"{"format":"vela-workload/1","name":"x"}"#,
                "either turns or synthetic",
            ),
            (
                r#"{"format":"vela-workload/1","name":"x","turns":[{"name":"a"}]}"#,
                "exactly one of",
            ),
            (
                r#"{"format":"vela-workload/1","name":"x","turns":[{"name":"a","tool_results":{}}]}"#,
                "first turn",
            ),
            (
                r#"{"format":"vela-workload/1","name":"x","turns":[{"name":"a","user":"{{d}}"}]}"#,
                "names no document",
            ),
            (
                r#"{"format":"vela-workload/1","name":"x","turns":[{"name":"a","user":"u","bogus":1}]}"#,
                "unknown field",
            ),
            (
                r#"{"format":"vela-workload/1","name":"x","clients":0,"turns":[{"name":"a","user":"u"}]}"#,
                "clients",
            ),
        ];
        for (src, want) in cases {
            let e = format!("{:#}", expand(src, &no_docs).unwrap_err());
            assert!(e.contains(want), "{src}: {e}");
        }
    }

    #[test]
    fn synthetic_text_is_seeded_and_about_n_tokens() {
        let a = synthetic_text(1000, 7);
        assert_eq!(a, synthetic_text(1000, 7));
        assert_ne!(a, synthetic_text(1000, 8));
        let words = a.split_whitespace().count();
        let dots = a.matches('.').count();
        assert_eq!(words + dots, 1000, "words plus sentence ends");
        let w = expand(
            r#"{"format":"vela-workload/1","name":"s","clients":2,
                "synthetic":{"prefix_tokens":100,"extensions":3,"extension_tokens":10}}"#,
            &no_docs,
        )
        .unwrap();
        assert_eq!(w.conversations.len(), 2);
        assert_eq!(w.conversations[0].len(), 4);
        assert_ne!(w.conversations[0][0].user, w.conversations[1][0].user);
    }
}
