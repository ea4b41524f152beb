//! Validation of request bodies into engine parameters. Every mistake is a 400 naming the field;
//! nothing a client sends can panic or be silently ignored where it would change the answer.

use crate::error::ApiError;
use serde_json::{Map, Value};
use vela_engine::SamplerConfig;

/// Largest `max_tokens` accepted (anything above is "absurd": 400).
pub const MAX_TOKENS_LIMIT: u64 = 1 << 20;

/// Most choices one request may ask for (`n`); each is a sequence of its own.
pub const MAX_N: usize = 16;

/// Sampling and output settings shared by every endpoint.
#[derive(Debug, Clone)]
pub struct GenParams {
    pub sampling: SamplerConfig,
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub logprobs: Option<usize>,
    pub stream: bool,
    pub include_usage: bool,
    /// Choices to generate from the prompt (`n`): copies of its session once it is in, each
    /// sampled with its own seed (`seed + i`).
    pub n: usize,
    /// `ignore_eos` (vLLM, llama-server): an end-of-generation token does not end the output,
    /// only `max_tokens`, a stop string or the context do (benchmarks of fixed lengths).
    pub ignore_eos: bool,
}

impl GenParams {
    /// The parameters of choice `i` of `n`: its own sampling seed.
    pub fn choice(&self, i: usize) -> GenParams {
        let mut p = self.clone();
        p.sampling.seed = p.sampling.seed.wrapping_add(i as u64);
        p
    }
}

pub type Obj = Map<String, Value>;

/// A validated chat request (OpenAI chat or Anthropic messages), ready for template rendering.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    pub params: GenParams,
    /// Messages in the OpenAI shape the chat templates read.
    pub messages: Vec<Value>,
    /// Tool definitions to render (`None`: no tools, or `tool_choice` "none").
    pub tools: Option<Value>,
    /// `chat_template_kwargs`: extra variables for the chat template.
    pub template_kwargs: Map<String, Value>,
    /// Structured output to enforce (`response_format`, a forced tool call).
    pub structured: Option<crate::structured::Structured>,
}

/// Parse a body as a JSON object.
pub fn parse_object(body: &[u8]) -> Result<Obj, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("invalid JSON body: {e}")))?;
    match v {
        Value::Object(o) => Ok(o),
        _ => Err(ApiError::invalid("the request body must be a JSON object")),
    }
}

fn present<'a>(o: &'a Obj, k: &str) -> Option<&'a Value> {
    o.get(k).filter(|v| !v.is_null())
}

pub fn get_bool(o: &Obj, k: &str) -> Result<Option<bool>, ApiError> {
    present(o, k)
        .map(|v| {
            v.as_bool()
                .ok_or_else(|| ApiError::bad(k, format!("`{k}` must be a boolean")))
        })
        .transpose()
}

pub fn get_str<'a>(o: &'a Obj, k: &str) -> Result<Option<&'a str>, ApiError> {
    present(o, k)
        .map(|v| {
            v.as_str()
                .ok_or_else(|| ApiError::bad(k, format!("`{k}` must be a string")))
        })
        .transpose()
}

/// A number within `[lo, hi]`.
pub fn get_f32(o: &Obj, k: &str, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
    let Some(v) = present(o, k) else {
        return Ok(None);
    };
    let x = v
        .as_f64()
        .ok_or_else(|| ApiError::bad(k, format!("`{k}` must be a number")))?;
    if !(lo..=hi).contains(&x) {
        return Err(ApiError::bad(
            k,
            format!("`{k}` must be between {lo} and {hi}, got {x}"),
        ));
    }
    Ok(Some(x as f32))
}

/// A non-negative integer ≤ `hi`.
pub fn get_uint(o: &Obj, k: &str, hi: u64) -> Result<Option<u64>, ApiError> {
    let Some(v) = present(o, k) else {
        return Ok(None);
    };
    let x = match v.as_u64() {
        Some(x) => x,
        None if v.as_i64().is_some() || v.as_f64().is_some_and(|f| f < 0.0) => {
            return Err(ApiError::bad(k, format!("`{k}` must not be negative")))
        }
        None => return Err(ApiError::bad(k, format!("`{k}` must be an integer"))),
    };
    if x > hi {
        return Err(ApiError::bad(
            k,
            format!("`{k}` must be at most {hi}, got {x}"),
        ));
    }
    Ok(Some(x))
}

/// `stop`: a string or a list of up to 16 non-empty strings.
pub fn get_stop(o: &Obj, k: &str) -> Result<Vec<String>, ApiError> {
    let bad = || ApiError::bad(k, format!("`{k}` must be a string or a list of strings"));
    let v: Vec<String> = match present(o, k) {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map(str::to_string).ok_or_else(bad))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad()),
    };
    if v.len() > 16 {
        return Err(ApiError::bad(
            k,
            format!("at most 16 stop sequences, got {}", v.len()),
        ));
    }
    if v.iter().any(|s| s.is_empty()) {
        return Err(ApiError::bad(k, "stop sequences must not be empty"));
    }
    Ok(v)
}

fn random_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    t.as_nanos() as u64 ^ 0x9E37_79B9_7F4A_7C15
}

/// Sampling fields common to OpenAI chat/completions; `n_vocab` bounds `logit_bias` ids.
pub fn parse_common(o: &Obj, n_vocab: usize, max_keys: &[&str]) -> Result<GenParams, ApiError> {
    let mut s = SamplerConfig::default();
    if let Some(t) = get_f32(o, "temperature", 0.0, 2.0)? {
        s.temperature = t;
    }
    if let Some(p) = get_f32(o, "top_p", 0.0, 1.0)? {
        s.top_p = if p == 0.0 { 1e-6 } else { p };
    }
    if let Some(k) = get_uint(o, "top_k", 1 << 20)? {
        s.top_k = k as usize;
    }
    if let Some(m) = get_f32(o, "min_p", 0.0, 1.0)? {
        s.min_p = m;
    }
    if let Some(p) = get_f32(o, "presence_penalty", -2.0, 2.0)? {
        s.presence_penalty = p;
    }
    if let Some(p) = get_f32(o, "frequency_penalty", -2.0, 2.0)? {
        s.frequency_penalty = p;
    }
    for k in ["repetition_penalty", "repeat_penalty"] {
        if let Some(p) = get_f32(o, k, 0.01, 10.0)? {
            s.repeat_penalty = p;
        }
    }
    s.seed = match present(o, "seed") {
        None => random_seed(),
        Some(v) => v
            .as_i64()
            .map(|x| x as u64)
            .or_else(|| v.as_u64())
            .ok_or_else(|| ApiError::bad("seed", "`seed` must be an integer"))?,
    };
    if let Some(b) = present(o, "logit_bias") {
        let m = b.as_object().ok_or_else(|| {
            ApiError::bad(
                "logit_bias",
                "`logit_bias` must be an object of token id → bias",
            )
        })?;
        for (id, bias) in m {
            let id: u32 = id
                .parse()
                .ok()
                .filter(|&i| (i as usize) < n_vocab)
                .ok_or_else(|| {
                    ApiError::bad(
                        "logit_bias",
                        format!("`logit_bias` key '{id}' is not a token id below {n_vocab}"),
                    )
                })?;
            let bias = bias
                .as_f64()
                .filter(|b| (-100.0..=100.0).contains(b))
                .ok_or_else(|| {
                    ApiError::bad(
                        "logit_bias",
                        "`logit_bias` values must be numbers in [-100, 100]",
                    )
                })?;
            s.logit_bias.push((id, bias as f32));
        }
    }
    let mut max_tokens = None;
    for k in max_keys {
        if let Some(m) = get_uint(o, k, MAX_TOKENS_LIMIT)? {
            if m == 0 {
                return Err(ApiError::bad(k, format!("`{k}` must be at least 1")));
            }
            max_tokens = Some(m as usize);
        }
    }
    let n = match get_uint(o, "n", 1 << 20)? {
        None => 1,
        Some(0) => return Err(ApiError::bad("n", "`n` must be at least 1")),
        Some(n) if n > MAX_N as u64 => {
            return Err(ApiError::bad("n", format!("`n` must be at most {MAX_N}")))
        }
        Some(n) => n as usize,
    };
    let stream = get_bool(o, "stream")?.unwrap_or(false);
    let mut include_usage = false;
    if let Some(so) = present(o, "stream_options") {
        let so = so
            .as_object()
            .ok_or_else(|| ApiError::bad("stream_options", "`stream_options` must be an object"))?;
        for k in so.keys() {
            if k != "include_usage" && k != "include_obfuscation" {
                return Err(ApiError::bad(
                    "stream_options",
                    format!("unknown field `stream_options.{k}`"),
                ));
            }
        }
        include_usage = get_bool(so, "include_usage")?.unwrap_or(false);
    }
    Ok(GenParams {
        sampling: s,
        max_tokens,
        stop: get_stop(o, "stop")?,
        logprobs: None,
        stream,
        include_usage,
        n,
        ignore_eos: get_bool(o, "ignore_eos")?.unwrap_or(false),
    })
}

/// Normalize OpenAI chat messages for the template: text parts joined, tool-call arguments
/// parsed to objects; returns the messages and whether the last one is an assistant prefill.
pub fn normalize_messages(v: Option<&Value>) -> Result<Vec<Value>, ApiError> {
    let arr = v
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::bad("messages", "`messages` must be a non-empty array"))?;
    if arr.is_empty() {
        return Err(ApiError::bad(
            "messages",
            "`messages` must be a non-empty array",
        ));
    }
    let mut out = Vec::with_capacity(arr.len());
    for (i, m) in arr.iter().enumerate() {
        let p = format!("messages[{i}]");
        let o = m
            .as_object()
            .ok_or_else(|| ApiError::bad(&p, format!("{p} must be an object")))?;
        let role = o
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::bad(&p, format!("{p}.role must be a string")))?;
        let role = match role {
            "developer" => "system",
            r @ ("system" | "user" | "assistant" | "tool") => r,
            r => {
                return Err(ApiError::bad(
                    &p,
                    format!("{p}.role '{r}' is not one of system, user, assistant, tool"),
                ))
            }
        };
        let mut n = Map::new();
        n.insert("role".into(), Value::String(role.into()));
        let content = match o.get("content") {
            None | Some(Value::Null) => {
                if role != "assistant" {
                    return Err(ApiError::bad(&p, format!("{p}.content is required")));
                }
                Value::String(String::new())
            }
            Some(Value::String(s)) => Value::String(s.clone()),
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for part in parts {
                    match (
                        part.get("type").and_then(Value::as_str),
                        part.get("text").and_then(Value::as_str),
                    ) {
                        (Some("text"), Some(t)) => text.push_str(t),
                        (Some(t), _) if t != "text" => {
                            return Err(ApiError::bad(
                                &p,
                                format!(
                                    "{p}: content part type '{t}' is not supported (text only)"
                                ),
                            ))
                        }
                        _ => {
                            return Err(ApiError::bad(
                                &p,
                                format!(
                                    "{p}: content parts must be {{\"type\":\"text\",\"text\":...}}"
                                ),
                            ))
                        }
                    }
                }
                Value::String(text)
            }
            Some(_) => {
                return Err(ApiError::bad(
                    &p,
                    format!("{p}.content must be a string or a list of text parts"),
                ))
            }
        };
        n.insert("content".into(), content);
        for k in ["name", "tool_call_id", "reasoning_content"] {
            match o.get(k) {
                None | Some(Value::Null) => {}
                Some(Value::String(s)) => {
                    n.insert(k.into(), Value::String(s.clone()));
                }
                Some(_) => return Err(ApiError::bad(&p, format!("{p}.{k} must be a string"))),
            }
        }
        if let Some(tc) = o.get("tool_calls").filter(|v| !v.is_null()) {
            let tc = tc
                .as_array()
                .ok_or_else(|| ApiError::bad(&p, format!("{p}.tool_calls must be an array")))?;
            let mut calls = Vec::new();
            for c in tc {
                let f = c
                    .get("function")
                    .and_then(Value::as_object)
                    .ok_or_else(|| {
                        ApiError::bad(&p, format!("{p}.tool_calls[].function must be an object"))
                    })?;
                let name = f.get("name").and_then(Value::as_str).ok_or_else(|| {
                    ApiError::bad(
                        &p,
                        format!("{p}.tool_calls[].function.name must be a string"),
                    )
                })?;
                let args = match f.get("arguments") {
                    Some(Value::String(s)) => serde_json::from_str::<Value>(s)
                        .ok()
                        .filter(Value::is_object)
                        .unwrap_or(Value::String(s.clone())),
                    Some(v @ Value::Object(_)) => v.clone(),
                    None | Some(Value::Null) => Value::Object(Map::new()),
                    Some(_) => {
                        return Err(ApiError::bad(
                            &p,
                            format!("{p}.tool_calls[].function.arguments must be a JSON string"),
                        ))
                    }
                };
                let mut call = Map::new();
                call.insert(
                    "id".into(),
                    c.get("id")
                        .cloned()
                        .unwrap_or(Value::String(format!("call_{i}"))),
                );
                call.insert("type".into(), Value::String("function".into()));
                call.insert(
                    "function".into(),
                    serde_json::json!({"name": name, "arguments": args}),
                );
                calls.push(Value::Object(call));
            }
            n.insert("tool_calls".into(), Value::Array(calls));
        }
        out.push(Value::Object(n));
    }
    Ok(out)
}

/// Check a function's `parameters` (OpenAI) / `input_schema` (Anthropic): a JSON Schema object
/// describing an object (its `type`, when given, is "object").
pub fn check_schema(v: Option<&Value>, param: &str, what: &str) -> Result<(), ApiError> {
    match v {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Object(o)) => match o.get("type") {
            None => Ok(()),
            Some(Value::String(t)) if t == "object" => Ok(()),
            Some(t) => Err(ApiError::bad(
                param,
                format!("{what} must be a JSON Schema of type \"object\", got type {t}"),
            )),
        },
        Some(_) => Err(ApiError::bad(
            param,
            format!("{what} must be a JSON Schema object"),
        )),
    }
}

/// Validate OpenAI `tools` and `tool_choice`; returns the tools to render (None when there are
/// none or `tool_choice` is "none").
pub fn parse_tools(o: &Obj) -> Result<Option<Value>, ApiError> {
    let arr = match present(o, "tools") {
        None => &Vec::new(),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(ApiError::bad("tools", "`tools` must be an array")),
    };
    let mut names = Vec::with_capacity(arr.len());
    for (i, t) in arr.iter().enumerate() {
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(ApiError::bad(
                "tools",
                format!("tools[{i}].type must be 'function'"),
            ));
        }
        let Some(f) = t.get("function").and_then(Value::as_object) else {
            return Err(ApiError::bad(
                "tools",
                format!("tools[{i}].function must be an object"),
            ));
        };
        let Some(name) = f.get("name").and_then(Value::as_str) else {
            return Err(ApiError::bad(
                "tools",
                format!("tools[{i}].function.name must be a string"),
            ));
        };
        if f.get("description")
            .is_some_and(|d| !d.is_string() && !d.is_null())
        {
            return Err(ApiError::bad(
                "tools",
                format!("tools[{i}].function.description must be a string"),
            ));
        }
        check_schema(
            f.get("parameters"),
            "tools",
            &format!("tools[{i}].function.parameters"),
        )?;
        names.push(name);
    }
    let none = match present(o, "tool_choice") {
        None => false,
        Some(Value::String(s)) => match s.as_str() {
            "none" => true,
            "auto" => false,
            "required" if names.is_empty() => {
                return Err(ApiError::bad(
                    "tool_choice",
                    "tool_choice 'required' needs `tools`",
                ))
            }
            "required" => false,
            other => {
                return Err(ApiError::bad(
                    "tool_choice",
                    format!("tool_choice '{other}' is not none, auto or required"),
                ))
            }
        },
        Some(Value::Object(c)) if c.get("type").and_then(Value::as_str) == Some("function") => {
            let Some(name) = c
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
            else {
                return Err(ApiError::bad(
                    "tool_choice",
                    "tool_choice.function.name must be a string",
                ));
            };
            if !names.contains(&name) {
                return Err(ApiError::bad(
                    "tool_choice",
                    format!("tool_choice names function '{name}', which is not in `tools`"),
                ));
            }
            false
        }
        Some(_) => {
            return Err(ApiError::bad(
                "tool_choice",
                "`tool_choice` must be a string or {\"type\":\"function\",...}",
            ))
        }
    };
    Ok((!arr.is_empty() && !none).then(|| Value::Array(arr.clone())))
}

/// Template variables the server sets itself (a kwarg may not replace them).
const RESERVED_KWARGS: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// `chat_template_kwargs`: an object of extra template variables. The server's own variables
/// cannot be replaced, and the switches templates test (`enable_thinking`, `thinking`) must be
/// booleans: the string "false" would be true in the template.
pub fn parse_template_kwargs(o: &Obj) -> Result<Map<String, Value>, ApiError> {
    const P: &str = "chat_template_kwargs";
    let k = match present(o, P) {
        None => return Ok(Map::new()),
        Some(Value::Object(k)) => k,
        Some(_) => return Err(ApiError::bad(P, "`chat_template_kwargs` must be an object")),
    };
    for (key, v) in k {
        if RESERVED_KWARGS.contains(&key.as_str()) {
            return Err(ApiError::bad(
                P,
                format!("chat_template_kwargs.{key} is set by the server and cannot be given"),
            ));
        }
        let want = match key.as_str() {
            "enable_thinking" | "thinking" | "add_vision_id" => {
                (!v.is_boolean() && !v.is_null()).then_some("a boolean")
            }
            "reasoning_effort" => (!v.is_string() && !v.is_null()).then_some("a string"),
            _ => None,
        };
        if let Some(want) = want {
            return Err(ApiError::bad(
                P,
                format!("chat_template_kwargs.{key} must be {want}, got {v}"),
            ));
        }
    }
    Ok(k.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Obj {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn rejects_bad_fields_with_param() {
        let cases = [
            (json!({"temperature": "hot"}), "temperature"),
            (json!({"temperature": 9}), "temperature"),
            (json!({"max_tokens": -5}), "max_tokens"),
            (json!({"max_tokens": 0}), "max_tokens"),
            (json!({"max_tokens": 1e30}), "max_tokens"),
            (json!({"max_tokens": 99999999999u64}), "max_tokens"),
            (json!({"n": 0}), "n"),
            (json!({"n": 17}), "n"),
            (json!({"stop": [1]}), "stop"),
            (json!({"logit_bias": {"abc": 1}}), "logit_bias"),
            (json!({"logit_bias": {"5": 1000}}), "logit_bias"),
            (json!({"stream_options": {"bogus": true}}), "stream_options"),
            (json!({"seed": "x"}), "seed"),
        ];
        for (body, param) in cases {
            let e = parse_common(&obj(body.clone()), 100, &["max_tokens"]).unwrap_err();
            assert_eq!(e.status.as_u16(), 400, "{body}");
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
        }
        let ok = parse_common(
            &obj(json!({"temperature": 0, "seed": 5, "stop": "x", "max_tokens": 3})),
            100,
            &["max_tokens"],
        )
        .unwrap();
        assert_eq!(
            (ok.sampling.temperature, ok.sampling.seed, ok.max_tokens),
            (0.0, 5, Some(3))
        );
    }

    /// Fuzz finding (request_bodies): without serde_json's `float_roundtrip` a number could
    /// parse a few ULPs off, so an accepted body did not re-serialise to what was sent.
    #[test]
    fn numbers_parse_correctly_rounded() {
        let body = br#"{"max_tokens":2.2222222222222223e+107,"temperature":0.7000000000000001}"#;
        let o = parse_object(body).unwrap();
        assert_eq!(o["max_tokens"].as_f64(), Some(2.2222222222222223e+107));
        assert_eq!(o["temperature"].as_f64(), Some(0.7000000000000001));
        let again = serde_json::to_vec(&Value::Object(o.clone())).unwrap();
        assert_eq!(parse_object(&again).unwrap(), o);
    }

    #[test]
    fn messages_are_normalized() {
        let m = json!([
            {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\":1}"}}]},
        ]);
        let n = normalize_messages(Some(&m)).unwrap();
        assert_eq!(n[0]["role"], "system");
        assert_eq!(n[0]["content"], "ab");
        assert_eq!(n[1]["tool_calls"][0]["function"]["arguments"]["x"], 1);
        assert!(normalize_messages(Some(&json!([{"role": "wizard", "content": "x"}]))).is_err());
        assert!(normalize_messages(Some(
            &json!([{"role": "user", "content": [{"type": "image_url"}]}])
        ))
        .is_err());
        assert!(normalize_messages(Some(&json!([]))).is_err());
    }

    fn tool(name: &str, params: Value) -> Value {
        json!({"type": "function", "function": {"name": name, "parameters": params}})
    }

    #[test]
    fn tools_and_tool_choice_are_checked() {
        let ok = json!({"type": "object", "properties": {"x": {"type": "string"}}});
        let bad = [
            (json!({"tools": [tool("f", json!("a string"))]}), "tools"),
            (json!({"tools": [tool("f", json!([1]))]}), "tools"),
            (
                json!({"tools": [tool("f", json!({"type": "string"}))]}),
                "tools",
            ),
            (
                json!({"tools": [{"type": "function", "function": "f"}]}),
                "tools",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f", "description": 5}}]}),
                "tools",
            ),
            (
                json!({"tools": [tool("f", ok.clone())], "tool_choice": {"type": "function", "function": {"name": "g"}}}),
                "tool_choice",
            ),
            (
                json!({"tool_choice": {"type": "function", "function": {"name": "g"}}}),
                "tool_choice",
            ),
            (
                json!({"tools": [tool("f", ok.clone())], "tool_choice": {"type": "function"}}),
                "tool_choice",
            ),
            (json!({"tool_choice": "required"}), "tool_choice"),
            (json!({"tool_choice": "sometimes"}), "tool_choice"),
        ];
        for (body, param) in bad {
            let e = parse_tools(&obj(body.clone())).unwrap_err();
            assert_eq!(
                (e.status.as_u16(), e.param.as_deref()),
                (400, Some(param)),
                "{body}"
            );
            assert!(
                !e.message.contains("Some(") && !e.message.contains("\\\""),
                "{}",
                e.message
            );
        }
        let named = json!({"tools": [tool("f", ok.clone()), tool("g", json!({}))],
                           "tool_choice": {"type": "function", "function": {"name": "g"}}});
        assert_eq!(
            parse_tools(&obj(named))
                .unwrap()
                .unwrap()
                .as_array()
                .unwrap()
                .len(),
            2
        );
        let none = json!({"tools": [tool("f", ok)], "tool_choice": "none"});
        assert_eq!(parse_tools(&obj(none)).unwrap(), None);
        assert_eq!(
            parse_tools(&obj(json!({"tool_choice": "auto"}))).unwrap(),
            None
        );
    }

    #[test]
    fn template_kwargs_are_checked() {
        for (body, needle) in [
            (
                json!({"chat_template_kwargs": "enable_thinking=false"}),
                "must be an object",
            ),
            (json!({"chat_template_kwargs": [1]}), "must be an object"),
            (
                json!({"chat_template_kwargs": {"enable_thinking": "false"}}),
                "boolean",
            ),
            (json!({"chat_template_kwargs": {"thinking": 0}}), "boolean"),
            (
                json!({"chat_template_kwargs": {"reasoning_effort": 3}}),
                "string",
            ),
            (
                json!({"chat_template_kwargs": {"messages": []}}),
                "set by the server",
            ),
            (
                json!({"chat_template_kwargs": {"add_generation_prompt": false}}),
                "set by the server",
            ),
        ] {
            let e = parse_template_kwargs(&obj(body.clone())).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("chat_template_kwargs"), "{body}");
            assert!(e.message.contains(needle), "{body}: {}", e.message);
        }
        let k = parse_template_kwargs(&obj(
            json!({"chat_template_kwargs": {"enable_thinking": false, "custom": [1]}}),
        ))
        .unwrap();
        assert_eq!(k["enable_thinking"], false);
        assert!(
            parse_template_kwargs(&obj(json!({"chat_template_kwargs": null})))
                .unwrap()
                .is_empty()
        );
    }
}
