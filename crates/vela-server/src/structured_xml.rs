//! Forced tool calls in the parameter-block syntaxes: Qwen3-Coder / Qwen3.5
//! `<function=NAME>\n<parameter=K>\nV\n</parameter>\n</function>`, GLM
//! `NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n` and DeepSeek DSML
//! `<｜DSML｜invoke name="NAME">\n<｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>`.
//!
//! `parser.rs` reads a Qwen or GLM value as JSON when it parses as something other than a
//! string, else as the raw text. So a string parameter is free text that is not JSON of another
//! type (nor starts like an object or array) and does not contain its closer; any other
//! parameter is JSON valid under its schema. DSML says which values are strings
//! (`string="true"`: raw text without the closer). Parameters come in the schema's order, the
//! optional ones optional.

use crate::structured::quote;
use serde_json::{Map, Value};
use vela_engine::grammar::styled_schema;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Xml {
    Qwen,
    Glm,
    Dsml,
}

impl Xml {
    /// The text that ends a value.
    fn closer(self) -> &'static str {
        match self {
            Xml::Qwen => "</parameter>",
            Xml::Glm => "</arg_value>",
            Xml::Dsml => "</｜DSML｜parameter>",
        }
    }

    /// What precedes parameter `key`'s value (`string`: the value is a raw string) and what
    /// follows it.
    fn around(self, key: &str, string: bool) -> (String, String) {
        let c = self.closer();
        match self {
            Xml::Qwen => (format!("<parameter={key}>\n"), format!("\n{c}\n")),
            Xml::Glm => (
                format!("<arg_key>{key}</arg_key>\n<arg_value>"),
                format!("{c}\n"),
            ),
            Xml::Dsml => (
                format!("<｜DSML｜parameter name=\"{key}\" string=\"{string}\">"),
                format!("{c}\n"),
            ),
        }
    }

    /// Whether a raw string value must not read back as another JSON type.
    fn typed_strings(self) -> bool {
        self != Xml::Dsml
    }
}

/// Raw text the parser would read as JSON other than a string (serde_json skips whitespace
/// around a value); anything starting like an object or array is excluded too.
const TYPED: &str = r"[ \t\n\r]*(-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?|true|false|null|[\[{](?s:.*))[ \t\n\r]*";

fn regex_escape(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '/' | '\\' | '.' | '+' | '*' | '?' | '(' | ')' | '|' | '[' | ']' | '{' | '}' | '^'
            | '$' => format!("\\{c}"),
            c => c.to_string(),
        })
        .collect()
}

/// Whether the parser reads `s` back as the string `s`.
fn reads_as_string(s: &str) -> bool {
    match serde_json::from_str::<Value>(s) {
        Ok(v) => v.is_string() && !s.trim_start().starts_with(['[', '{']),
        Err(_) => !s.trim_start().starts_with(['[', '{']),
    }
}

/// A string-only schema: its strings as free text with these length bounds, or one of these
/// literals.
enum Str {
    Free(Option<u64>, Option<u64>),
    OneOf(Vec<String>),
}

fn string_schema(p: &Map<String, Value>) -> Result<Option<Str>, String> {
    let strings = |v: &Value| -> Option<Vec<String>> {
        let a = v.as_array()?;
        a.iter().map(|x| x.as_str().map(str::to_string)).collect()
    };
    if let Some(e) = p.get("enum") {
        return Ok(strings(e).map(Str::OneOf));
    }
    if let Some(Value::String(c)) = p.get("const") {
        return Ok(Some(Str::OneOf(vec![c.clone()])));
    }
    if p.get("type").and_then(Value::as_str) != Some("string") {
        return Ok(None);
    }
    const META: [&str; 6] = [
        "type",
        "description",
        "title",
        "default",
        "examples",
        "$comment",
    ];
    let len = |k: &str| p.get(k).and_then(Value::as_u64);
    for k in p.keys() {
        if !META.contains(&k.as_str()) && k != "minLength" && k != "maxLength" {
            return Err(format!("string parameter keyword '{k}'"));
        }
    }
    Ok(Some(Str::Free(len("minLength"), len("maxLength"))))
}

/// The Lark rule `call{i}` of one function (and its helper rules) into `rules`; the error names
/// what cannot be enforced in this syntax.
pub fn call_rule(
    kind: Xml,
    i: usize,
    name: &str,
    params: &Value,
    rules: &mut Vec<String>,
) -> Result<(), String> {
    let empty = Map::new();
    let props = params
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let required: Vec<&str> = params
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if let Some(k) = required.iter().find(|k| !props.contains_key(**k)) {
        return Err(format!(
            "required parameter '{k}' without a schema in properties"
        ));
    }
    let closer = kind.closer();
    let typed = kind.typed_strings();
    let mut parts = Vec::new();
    for (j, (key, p)) in props.iter().enumerate() {
        let obj = p.as_object().unwrap_or(&empty);
        let string = string_schema(obj)?;
        let (open, suffix) = kind.around(key, string.is_some());
        let value = match string {
            Some(Str::OneOf(lits)) => {
                let bad = |l: &&String| (typed && !reads_as_string(l)) || l.contains(closer);
                if let Some(l) = lits.iter().find(bad) {
                    return Err(format!("enum value {l:?} of parameter '{key}'"));
                }
                let alts: Vec<String> = lits.iter().map(|l| quote(l)).collect();
                format!("({}) {}", alts.join(" | "), quote(&suffix))
            }
            Some(Str::Free(min, max)) => {
                let len = format!(
                    "{{{},{}}}",
                    min.unwrap_or(0),
                    max.map(|m| m.to_string()).unwrap_or_default()
                );
                let t = format!("SV{i}_{j}");
                let not_typed = if typed {
                    format!(" & ~/{TYPED}/")
                } else {
                    String::new()
                };
                rules.push(format!(
                    "{t}: /(?s:.){len}/{not_typed} & ~/(?s:.*){}(?s:.*)/",
                    regex_escape(closer)
                ));
                rules.push(format!("sv{i}_{j}[suffix={}]: {t}", quote(&suffix)));
                format!("sv{i}_{j}")
            }
            None => {
                // The subschema as its own root: its `$ref`s resolve against the parameters'.
                let mut sub = p.clone();
                if let Value::Object(o) = &mut sub {
                    for d in ["$defs", "definitions"] {
                        if let Some(v) = params.get(d) {
                            o.entry(d).or_insert_with(|| v.clone());
                        }
                    }
                }
                format!("%json {} {}", styled_schema(&sub), quote(&suffix))
            }
        };
        let rule = format!("p{i}_{j}");
        rules.push(format!("{rule}: {} {value}", quote(&open)));
        let optional = if required.contains(&key.as_str()) {
            ""
        } else {
            "?"
        };
        parts.push(format!("{rule}{optional}"));
    }
    let body = parts.join(" ");
    rules.push(match kind {
        Xml::Qwen => format!(
            "call{i}: {} {body} \"</function>\"",
            quote(&format!("<function={name}>\n"))
        ),
        Xml::Glm => format!("call{i}: {} {body}", quote(&format!("{name}\n"))),
        Xml::Dsml => format!(
            "call{i}: {} {body} \"</｜DSML｜invoke>\\n\"",
            quote(&format!("<｜DSML｜invoke name=\"{name}\">\n"))
        ),
    });
    Ok(())
}
