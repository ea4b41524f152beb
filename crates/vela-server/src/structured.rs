//! Structured output: `response_format` (`json_object`, `json_schema`) and forced tool calls
//! (OpenAI `tool_choice` `"required"` or a named function, Anthropic `any` / `tool`) become a
//! grammar that constrains decoding (`vela_engine::grammar`).
//!
//! A forced call is written in the model's own tool-call syntax (the one its template teaches
//! and `parser.rs` reads back): the syntax's markers around a JSON object whose `arguments`
//! validate against the function's `parameters`; for Qwen3.5 / GLM / DSML parameter blocks one
//! block per parameter (`structured_xml.rs`); for Gemma 4 `call:NAME{k:v}` the schema converted
//! to its syntax (`structured_gemma4.rs`). What a syntax cannot express is a 400 naming it.
//! When the prompt ends inside a reasoning block (`<think>`), the reasoning stays free and the
//! grammar starts after its closer.

use crate::error::ApiError;
use crate::http::Ready;
use crate::parser::{ParserConfig, ToolSyntax};
use crate::request::Obj;
use crate::structured_gemma4::{G4Rules, QUOTE};
use crate::structured_xml::{call_rule, Xml};
use serde_json::{json, Value};
use vela_engine::grammar::{styled_schema, Constraint, Grammar, GrammarCompiler};

/// A tool call the request forces.
#[derive(Debug, Clone, PartialEq)]
pub enum Forced {
    /// Any of the tools (OpenAI `required`, Anthropic `any`).
    Any,
    /// This one.
    Named(String),
}

/// What the output must be.
#[derive(Debug, Clone, PartialEq)]
pub enum Structured {
    /// One JSON value valid under the schema.
    Json(Value),
    /// One or more calls of these functions (name, parameters schema).
    Tools(Vec<(String, Value)>),
}

/// `response_format`: `text` (nothing to enforce), `json_object` (any JSON object) or
/// `json_schema` (`{"json_schema": {"name", "schema", "strict"}}`; the schema is enforced
/// whether `strict` is set or not).
pub fn response_format(o: &Obj) -> Result<Option<Value>, ApiError> {
    const P: &str = "response_format";
    let rf = match o.get(P) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(rf)) => rf,
        Some(_) => return Err(ApiError::bad(P, "`response_format` must be an object")),
    };
    match rf.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "object"}))),
        Some("json_schema") => {
            let Some(js) = rf.get("json_schema").and_then(Value::as_object) else {
                return Err(ApiError::bad(
                    P,
                    "response_format.json_schema must be an object",
                ));
            };
            if js.get("name").is_some_and(|n| !n.is_string()) {
                return Err(ApiError::bad(
                    P,
                    "response_format.json_schema.name must be a string",
                ));
            }
            if js
                .get("strict")
                .is_some_and(|s| !s.is_boolean() && !s.is_null())
            {
                return Err(ApiError::bad(
                    P,
                    "response_format.json_schema.strict must be a boolean",
                ));
            }
            match js.get("schema") {
                Some(s @ Value::Object(_)) => Ok(Some(s.clone())),
                Some(Value::Bool(true)) | None => Ok(Some(json!({}))),
                Some(_) => Err(ApiError::bad(
                    P,
                    "response_format.json_schema.schema must be a JSON Schema object",
                )),
            }
        }
        _ => Err(ApiError::bad(
            P,
            "`response_format.type` must be one of text, json_object, json_schema",
        )),
    }
}

/// OpenAI `tool_choice` as a forced call (already validated by `request::parse_tools`).
pub fn openai_forced(o: &Obj) -> Option<Forced> {
    match o.get("tool_choice")? {
        Value::String(s) if s == "required" => Some(Forced::Any),
        Value::Object(c) => c
            .get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .map(|n| Forced::Named(n.to_string())),
        _ => None,
    }
}

/// Anthropic `tool_choice` as a forced call (already validated).
pub fn anthropic_forced(o: &Obj) -> Option<Forced> {
    let c = o.get("tool_choice")?;
    match c.get("type").and_then(Value::as_str)? {
        "any" => Some(Forced::Any),
        "tool" => c
            .get("name")
            .and_then(Value::as_str)
            .map(|n| Forced::Named(n.to_string())),
        _ => None,
    }
}

/// What to enforce for a chat request: a forced tool call (over the rendered tools, OpenAI
/// shape) takes precedence over `response_format`.
pub fn structured(
    tools: Option<&Value>,
    forced: Option<Forced>,
    json_schema: Option<Value>,
) -> Option<Structured> {
    if let (Some(Value::Array(tools)), Some(f)) = (tools, forced) {
        let fns: Vec<(String, Value)> = tools
            .iter()
            .filter_map(|t| {
                let f = t.get("function")?;
                let name = f.get("name")?.as_str()?.to_string();
                let params = match f.get("parameters") {
                    Some(p @ Value::Object(_)) => p.clone(),
                    _ => json!({"type": "object"}),
                };
                Some((name, params))
            })
            .filter(|(n, _)| match &f {
                Forced::Any => true,
                Forced::Named(want) => n == want,
            })
            .collect();
        if !fns.is_empty() {
            return Some(Structured::Tools(fns));
        }
    }
    json_schema.map(Structured::Json)
}

/// The constraint for `s` on this model, or the 400 that names what cannot be enforced.
/// `parser` is the request's output parser; a forced call in the bare JSON form turns on its
/// JSON call detection.
pub fn constraint(
    r: &Ready,
    s: &Structured,
    parser: &mut ParserConfig,
) -> Result<Constraint, ApiError> {
    let compiler = r
        .grammar()
        .map_err(|e| ApiError::invalid(format!("constrained decoding is unavailable: {e}")))?;
    let template = r.template_src.as_deref().unwrap_or("");
    constraint_with(compiler, template, s, parser)
}

/// [`constraint`] with the model's grammar compiler and chat template source.
pub fn constraint_with(
    compiler: &GrammarCompiler,
    template: &str,
    s: &Structured,
    parser: &mut ParserConfig,
) -> Result<Constraint, ApiError> {
    let (grammar, field) = match s {
        Structured::Json(schema) => {
            // The answer is the JSON value: none of it is a tool call, even if it looks like one.
            parser.tools.clear();
            parser.llama_json = false;
            (Grammar::JsonSchema(schema.clone()), "response_format")
        }
        Structured::Tools(fns) => {
            let l = tool_grammar(compiler, template, parser, fns)?;
            (Grammar::Lark(l), "tool_choice")
        }
    };
    let c = compiler.compile(&grammar).map_err(|e| {
        ApiError::bad(
            field,
            format!(
                "{field} cannot be enforced: {}",
                one_line(&format!("{e:#}"))
            ),
        )
    })?;
    Ok(
        match (parser.start_in_reasoning, parser.reasoning.first()) {
            (true, Some((_, close))) => c.gated(close),
            _ => c,
        },
    )
}

/// An object schema's `properties` (none: empty) and `required` names; a required name without a
/// schema in `properties` is an error naming it as a `what` (property, parameter).
pub(crate) fn object_parts<'a>(
    s: &'a Value,
    empty: &'a serde_json::Map<String, Value>,
    what: &str,
) -> Result<(&'a serde_json::Map<String, Value>, Vec<&'a str>), String> {
    let props = s
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(empty);
    let required: Vec<&str> = s
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if let Some(k) = required.iter().find(|k| !props.contains_key(**k)) {
        return Err(format!(
            "required {what} '{k}' without a schema in properties"
        ));
    }
    Ok((props, required))
}

fn one_line(s: &str) -> String {
    let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    match s.char_indices().nth(400) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s,
    }
}

/// A marker as a Lark terminal: a control token by id (its bytes are not text), else the text.
fn lit(c: &GrammarCompiler, text: &str) -> String {
    match c.special_token(text) {
        Some(id) => format!("<[{id}]>"),
        None => quote(text),
    }
}

pub(crate) fn quote(s: &str) -> String {
    Value::String(s.into()).to_string()
}

fn not_forceable(name: &str, what: &str) -> ApiError {
    ApiError::bad(
        "tool_choice",
        format!("tool '{name}' cannot be forced in this model's tool-call syntax: {what}"),
    )
}

/// The Lark grammar of one or more calls in the template's syntax (see the module docs).
pub fn tool_grammar(
    c: &GrammarCompiler,
    template: &str,
    parser: &mut ParserConfig,
    fns: &[(String, Value)],
) -> Result<String, ApiError> {
    let args = |i: usize| format!("%json {}", styled_schema(&fns[i].1));
    let mut rules = Vec::new();
    let mut calls = Vec::new();
    let start = match parser
        .tools
        .first()
        .map(|(o, cl, s)| (o.clone(), cl.clone(), *s))
    {
        Some((open, close, ToolSyntax::HermesOrGlm)) => {
            let (o, cl) = (lit(c, &open), lit(c, &close));
            let xml = if template.contains("<function=") {
                Some(Xml::Qwen)
            } else if template.contains("<arg_key>") {
                Some(Xml::Glm)
            } else {
                None
            };
            if let Some(kind) = xml {
                for (i, (name, params)) in fns.iter().enumerate() {
                    call_rule(kind, i, name, params, &mut rules)
                        .map_err(|what| not_forceable(name, &what))?;
                    calls.push(format!("call{i}"));
                }
                rules.push(match kind {
                    Xml::Qwen => format!("block: {o} \"\\n\" call \"\\n\" {cl}"),
                    _ => format!("block: {o} call {cl}"),
                });
                rules.push(format!("call: {}", calls.join(" | ")));
                let start = "start: block (\"\\n\" block)*";
                return Ok(format!("{start}\n{}\n", rules.join("\n")));
            }
            for (i, (name, _)) in fns.iter().enumerate() {
                let head = format!("{{\"name\": {}, \"arguments\": ", quote(name));
                rules.push(format!("call{i}: {} {} \"}}\"", quote(&head), args(i)));
                calls.push(format!("call{i}"));
            }
            rules.push(format!("block: {o} \"\\n\" call \"\\n\" {cl}"));
            "start: block (\"\\n\" block)*".to_string()
        }
        Some((open, close, ToolSyntax::DeepSeekV3)) => {
            let (b, sep, e) = (
                "<｜tool▁call▁begin｜>",
                "<｜tool▁sep｜>",
                "<｜tool▁call▁end｜>",
            );
            let (b, sep, e) = (lit(c, b), lit(c, sep), lit(c, e));
            // V3 writes `function<sep>NAME\n```json\nARGS\n````; V3.1 `NAME<sep>ARGS`.
            let v3 = template.contains("function<｜tool▁sep｜>");
            for (i, (name, _)) in fns.iter().enumerate() {
                let body = if v3 {
                    let head = format!(
                        "\"function\" {sep} {}",
                        quote(&format!("{name}\n```json\n"))
                    );
                    format!("{head} {} \"\\n```\"", args(i))
                } else {
                    format!("{} {sep} {}", quote(name), args(i))
                };
                rules.push(format!("call{i}: {b} {body} {e}"));
                calls.push(format!("call{i}"));
            }
            format!("start: {} call+ {}", lit(c, &open), lit(c, &close))
        }
        Some((open, close, ToolSyntax::Gemma4)) => {
            let q = lit(c, QUOTE);
            let q_text = c.special_token(QUOTE).is_none();
            let mut g = G4Rules::new(&mut rules, q, q_text);
            for (i, (name, params)) in fns.iter().enumerate() {
                g.call(i, name, params)
                    .map_err(|what| not_forceable(name, &what))?;
                calls.push(format!("call{i}"));
            }
            let (o, cl) = (lit(c, &open), lit(c, &close));
            rules.push(format!("block: {o} call {cl}"));
            "start: block+".to_string()
        }
        Some((open, close, ToolSyntax::Dsml)) => {
            for (i, (name, params)) in fns.iter().enumerate() {
                call_rule(Xml::Dsml, i, name, params, &mut rules)
                    .map_err(|what| not_forceable(name, &what))?;
                calls.push(format!("call{i}"));
            }
            let (o, cl) = (lit(c, &open), lit(c, &close));
            format!("start: {o} \"\\n\" call+ {cl}")
        }
        None => {
            // Llama 3.x writes `{"name", "parameters"}`; a template without any tool syntax
            // gets the same bare JSON call, which the parser then reads.
            let key = if parser.llama_json {
                "parameters"
            } else {
                "arguments"
            };
            parser.llama_json = true;
            for (i, (name, _)) in fns.iter().enumerate() {
                let head = format!("{{\"name\": {}, \"{key}\": ", quote(name));
                rules.push(format!("call{i}: {} {} \"}}\"", quote(&head), args(i)));
                calls.push(format!("call{i}"));
            }
            "start: call".to_string()
        }
    };
    rules.push(format!("call: {}", calls.join(" | ")));
    Ok(format!("{start}\n{}\n", rules.join("\n")))
}

#[cfg(test)]
#[path = "structured_tests.rs"]
mod tests;
