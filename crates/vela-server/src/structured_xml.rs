//! Forced tool calls in the parameter-block syntaxes: Qwen3-Coder / Qwen3.5
//! `<function=NAME>\n<parameter=K>\nV\n</parameter>\n</function>`, GLM
//! `NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n` and DeepSeek DSML
//! `<｜DSML｜invoke name="NAME">\n<｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>`.
//!
//! `parser.rs` reads a Qwen or GLM value by the tool's schema (`tool_schema.rs`): the raw text
//! for a parameter that may be a string, JSON for any other. So a string parameter is free text
//! without its closer, any other parameter JSON valid under its schema, and one that may be a
//! string or another type (`anyOf`, a type list) is refused: its JSON would read back as text.
//! DSML says which values are strings (`string="true"`: raw text; `"false"`: JSON). Parameters
//! come in the schema's order, the optional ones optional; local `$ref`s are followed.

use crate::structured::quote;
use crate::tool_schema::may_be_string;
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
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '/' | '\\' | '.' | '+' | '*' | '?' | '(' | ')' | '|' | '[' | ']' | '{' | '}' | '^'
            | '$' => format!("\\{c}"),
            c => c.to_string(),
        })
        .collect()
}

/// `s` with its local `$ref`s followed (`None`: a dangling or too deep reference).
fn resolved<'a>(mut s: &'a Value, root: &'a Value) -> Option<&'a Value> {
    for _ in 0..16 {
        let Some(r) = s.get("$ref").and_then(Value::as_str) else {
            return Some(s);
        };
        s = r.strip_prefix('#').and_then(|p| root.pointer(p))?;
    }
    None
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
    let (props, required) = crate::structured::object_parts(params, &empty, "parameter")?;
    let closer = kind.closer();
    let mut parts = Vec::new();
    for (j, (key, p)) in props.iter().enumerate() {
        let p = resolved(p, params).ok_or_else(|| format!("the '$ref' of parameter '{key}'"))?;
        let obj = p.as_object().unwrap_or(&empty);
        let string = string_schema(obj)?;
        // Qwen and GLM read a value the schema lets be a string as text: only string-only
        // schemas can be forced there.
        if kind != Xml::Dsml && string.is_none() && may_be_string(p, params, 0) {
            return Err(format!("parameter '{key}' may be a string or another type"));
        }
        let (open, suffix) = kind.around(key, string.is_some());
        let value = match string {
            Some(Str::OneOf(lits)) => {
                if let Some(l) = lits.iter().find(|l| l.contains(closer)) {
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
                rules.push(format!(
                    "{t}: /(?s:.){len}/ & ~/(?s:.*){}(?s:.*)/",
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
