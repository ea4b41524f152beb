//! `POST /v1/messages`: the Anthropic Messages API on top of the same engine jobs.

use crate::error::ApiError;
use crate::http::{
    body_bytes, check_model, collect, json_with_usage, new_id, sse_response, submit, St,
};
use crate::openai::{prepare_chat, render_messages};
use crate::request::{
    check_schema, get_f32, get_stop, get_uint, parse_object, ChatRequest, GenParams, Obj,
    MAX_TOKENS_LIMIT,
};
use crate::worker::Out;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::Response;
use serde_json::{json, Map, Value};
use std::sync::atomic::Ordering;
use std::time::Instant;
use vela_engine::SamplerConfig;

fn err(st: &crate::http::AppState, e: ApiError) -> Response {
    st.metrics.request_errors.fetch_add(1, Ordering::Relaxed);
    e.anthropic_response()
}

fn text_of(v: &Value, p: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(a) => {
            let mut s = String::new();
            for b in a {
                match (
                    b.get("type").and_then(Value::as_str),
                    b.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => s.push_str(t),
                    _ => {
                        return Err(ApiError::bad(
                            p,
                            format!("{p}: only text blocks are supported here"),
                        ))
                    }
                }
            }
            Ok(s)
        }
        _ => Err(ApiError::bad(
            p,
            format!("{p} must be a string or a list of text blocks"),
        )),
    }
}

/// Anthropic messages → OpenAI-style messages for the chat template.
pub fn to_openai_messages(o: &Obj) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::new();
    if let Some(s) = o.get("system").filter(|v| !v.is_null()) {
        out.push(json!({"role": "system", "content": text_of(s, "system")?}));
    }
    let msgs = o
        .get("messages")
        .and_then(Value::as_array)
        .filter(|a| !a.is_empty())
        .ok_or_else(|| ApiError::bad("messages", "`messages` must be a non-empty array"))?;
    let mut late_system = Vec::new();
    for (i, m) in msgs.iter().enumerate() {
        let p = format!("messages[{i}]");
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::bad(&p, format!("{p}.role must be a string")))?;
        let content = m
            .get("content")
            .ok_or_else(|| ApiError::bad(&p, format!("{p}.content is required")))?;
        if role == "system" {
            // A system message within the conversation (Claude Code sends them): its text joins
            // the system prompt, which every chat template takes at the start.
            late_system.push(text_of(content, &p)?);
            continue;
        }
        if role != "user" && role != "assistant" {
            return Err(ApiError::bad(
                &p,
                format!("{p}.role must be 'user', 'assistant' or 'system'"),
            ));
        }
        let blocks = match content {
            Value::String(s) => vec![json!({"type": "text", "text": s})],
            Value::Array(a) => a.clone(),
            _ => {
                return Err(ApiError::bad(
                    &p,
                    format!("{p}.content must be a string or a list of blocks"),
                ))
            }
        };
        let mut text = String::new();
        let mut calls = Vec::new();
        for b in &blocks {
            match b.get("type").and_then(Value::as_str) {
                Some("text") => text.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
                Some("thinking") | Some("redacted_thinking") => {}
                Some("tool_use") if role == "assistant" => {
                    let name = b
                        .get("name")
                        .and_then(Value::as_str)
                        .ok_or_else(|| ApiError::bad(&p, "tool_use.name must be a string"))?;
                    calls.push(json!({"id": b.get("id").cloned().unwrap_or(Value::Null), "type": "function",
                        "function": {"name": name, "arguments": b.get("input").cloned().unwrap_or(json!({}))}}));
                }
                Some("tool_result") if role == "user" => {
                    let c = match b.get("content") {
                        None | Some(Value::Null) => String::new(),
                        Some(v) => text_of(v, &p)?,
                    };
                    out.push(json!({"role": "tool", "tool_call_id": b.get("tool_use_id").cloned().unwrap_or(Value::Null), "content": c}));
                }
                Some(t) => {
                    return Err(ApiError::bad(
                        &p,
                        format!("{p}: content block type '{t}' is not supported here"),
                    ))
                }
                None => {
                    return Err(ApiError::bad(
                        &p,
                        format!("{p}: every content block needs a string `type`"),
                    ))
                }
            }
        }
        if !text.is_empty() || !calls.is_empty() || blocks.is_empty() {
            let mut msg = json!({"role": role, "content": text});
            if !calls.is_empty() {
                msg["tool_calls"] = Value::Array(calls);
            }
            out.push(msg);
        }
    }
    if !late_system.is_empty() {
        let late = late_system.join("\n\n");
        match out.first_mut().filter(|m| m["role"] == "system") {
            Some(m) => {
                m["content"] = json!(format!("{}\n\n{late}", m["content"].as_str().unwrap_or("")))
            }
            None => out.insert(0, json!({"role": "system", "content": late})),
        }
    }
    Ok(out)
}

/// Anthropic `tools` in the OpenAI shape the templates read, checked against `tool_choice`
/// (`auto`, `any`, `tool` naming one of them, `none`: no tools rendered).
fn tools_of(o: &Obj) -> Result<Option<Value>, ApiError> {
    let arr = match o.get("tools") {
        None | Some(Value::Null) => &Vec::new(),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(ApiError::bad("tools", "`tools` must be an array")),
    };
    let mut out = Vec::new();
    let mut names = Vec::new();
    for (i, t) in arr.iter().enumerate() {
        let name = t
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::bad("tools", format!("tools[{i}].name must be a string")))?;
        if t.get("description")
            .is_some_and(|d| !d.is_string() && !d.is_null())
        {
            return Err(ApiError::bad(
                "tools",
                format!("tools[{i}].description must be a string"),
            ));
        }
        check_schema(
            t.get("input_schema"),
            "tools",
            &format!("tools[{i}].input_schema"),
        )?;
        names.push(name);
        out.push(json!({"type": "function", "function": {"name": name,
            "description": t.get("description").cloned().unwrap_or(json!("")),
            "parameters": t.get("input_schema").cloned().unwrap_or(json!({"type": "object"}))}}));
    }
    let none = match o.get("tool_choice") {
        None | Some(Value::Null) => false,
        Some(c) => match c.get("type").and_then(Value::as_str) {
            Some("none") => true,
            Some("auto") => false,
            Some("any") if names.is_empty() => {
                return Err(ApiError::bad(
                    "tool_choice",
                    "tool_choice 'any' needs `tools`",
                ))
            }
            Some("any") => false,
            Some("tool") => {
                let Some(name) = c.get("name").and_then(Value::as_str) else {
                    return Err(ApiError::bad(
                        "tool_choice",
                        "tool_choice.name must be a string",
                    ));
                };
                if !names.contains(&name) {
                    return Err(ApiError::bad(
                        "tool_choice",
                        format!("tool_choice names tool '{name}', which is not in `tools`"),
                    ));
                }
                false
            }
            _ => {
                return Err(ApiError::bad(
                    "tool_choice",
                    "tool_choice.type must be one of auto, any, tool, none",
                ))
            }
        },
    };
    Ok((!out.is_empty() && !none).then_some(Value::Array(out)))
}

fn params(o: &Obj) -> Result<GenParams, ApiError> {
    let mut s = SamplerConfig::default();
    if let Some(t) = get_f32(o, "temperature", 0.0, 1.0)? {
        s.temperature = t;
    }
    if let Some(p) = get_f32(o, "top_p", 0.0, 1.0)? {
        s.top_p = p.max(1e-6);
    }
    if let Some(k) = get_uint(o, "top_k", 1 << 20)? {
        s.top_k = k as usize;
    }
    s.seed = get_uint(o, "seed", u64::MAX)?
        .unwrap_or_else(|| Instant::now().elapsed().as_nanos() as u64 ^ 0x5EED);
    let max = get_uint(o, "max_tokens", MAX_TOKENS_LIMIT)?
        .ok_or_else(|| ApiError::bad("max_tokens", "`max_tokens` is required"))?;
    if max == 0 {
        return Err(ApiError::bad(
            "max_tokens",
            "`max_tokens` must be at least 1",
        ));
    }
    let stream = crate::request::get_bool(o, "stream")?.unwrap_or(false);
    Ok(GenParams {
        sampling: s,
        max_tokens: Some(max as usize),
        stop: get_stop(o, "stop_sequences")?,
        logprobs: None,
        stream,
        include_usage: true,
        n: 1,
        ignore_eos: false,
    })
}

/// Validate a Messages body: everything but `model` (checked against the loaded model by the
/// handler); the messages and tools come out in the OpenAI shape the templates read.
pub fn validate(o: &Obj) -> Result<ChatRequest, ApiError> {
    let params = params(o)?;
    let messages = to_openai_messages(o)?;
    let tools = tools_of(o)?;
    let forced = crate::structured::anthropic_forced(o);
    let structured = crate::structured::structured(tools.as_ref(), forced, None);
    Ok(ChatRequest {
        params,
        messages,
        tools,
        template_kwargs: Map::new(),
        structured,
    })
}

fn stop_reason(finish: &str, stop_word: &Option<String>) -> &'static str {
    match (finish, stop_word) {
        ("length", _) => "max_tokens",
        ("tool_calls", _) => "tool_use",
        (_, Some(_)) => "stop_sequence",
        _ => "end_turn",
    }
}

fn event(name: &str, v: Value) -> String {
    format!("event: {name}\ndata: {v}\n\n")
}

/// `POST /v1/messages/count_tokens`: the prompt tokens a `/v1/messages` request with this body
/// would have (its messages, system prompt and tools through the chat template), as
/// `{"input_tokens": N}`. The body is a messages request without `max_tokens` (one given is
/// checked as usual).
pub async fn count_tokens(State(st): St, body: Result<Bytes, BytesRejection>) -> Response {
    let count = || -> Result<usize, ApiError> {
        let r = st.ready()?;
        let mut o = parse_object(&body_bytes(body)?)?;
        check_model(&o, r)?;
        o.entry("max_tokens").or_insert(json!(1));
        let req = validate(&o)?;
        let (_, prompt, _) = render_messages(r, req.messages, req.tools, req.template_kwargs)?;
        Ok(prompt.len())
    };
    match count() {
        Ok(n) => {
            axum::response::IntoResponse::into_response(axum::Json(json!({ "input_tokens": n })))
        }
        Err(e) => err(&st, e),
    }
}

/// `POST /v1/messages`.
pub async fn messages(State(st): St, body: Result<Bytes, BytesRejection>) -> Response {
    let received = Instant::now();
    let prep = || -> Result<(crate::http::Prepared, String), ApiError> {
        let r = st.ready()?;
        let o = parse_object(&body_bytes(body)?)?;
        check_model(&o, r)?;
        Ok((prepare_chat(r, validate(&o)?, "messages")?, r.name.clone()))
    };
    let (p, model) = match prep() {
        Ok(x) => x,
        Err(e) => return err(&st, e),
    };
    let Ok(r) = st.ready() else {
        return err(&st, ApiError::internal("not ready"));
    };
    let stream = p.params.stream;
    let n_prompt = p.prompt.len();
    let (rx, cancel) = match submit(&st, r, p, received) {
        Ok(x) => x,
        Err(e) => return err(&st, e),
    };
    let id = new_id("msg_");
    if !stream {
        return match collect(rx, cancel).await {
            Ok(c) => {
                let mut content = Vec::new();
                if !c.reasoning.is_empty() {
                    content.push(
                        json!({"type": "thinking", "thinking": c.reasoning, "signature": ""}),
                    );
                }
                if !c.content.is_empty() || c.tool_calls.is_empty() {
                    content.push(json!({"type": "text", "text": c.content}));
                }
                for t in &c.tool_calls {
                    let input: Value = serde_json::from_str(&t.arguments).unwrap_or(json!({}));
                    content.push(json!({"type": "tool_use", "id": new_id("toolu_"), "name": t.name, "input": input}));
                }
                json_with_usage(
                    json!({
                    "id": id, "type": "message", "role": "assistant", "model": model, "content": content,
                    "stop_reason": stop_reason(c.finish, &c.stop_word), "stop_sequence": c.stop_word,
                    "usage": {"input_tokens": c.usage.prompt_tokens, "output_tokens": c.usage.completion_tokens,
                              "cache_read_input_tokens": c.usage.cached_tokens, "cache_creation_input_tokens": 0},
                    }),
                    [&c.usage],
                )
            }
            Err(e) => err(&st, e),
        };
    }
    // Streaming: `message_start` at once, `ping` events while the prompt is evaluated (as
    // Anthropic's API: clients take them as activity), then one open block at a time (thinking /
    // text), tool_use blocks complete at once.
    let start = event(
        "message_start",
        json!({"type": "message_start", "message": {
        "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": n_prompt, "output_tokens": 0}}}),
    );
    let mut open: Option<&'static str> = None;
    let mut index = 0usize;
    let fmt = move |ev: Out| -> Vec<String> {
        let mut f = Vec::new();
        let close = |f: &mut Vec<String>, open: &mut Option<&'static str>, index: &mut usize| {
            if open.take().is_some() {
                f.push(event(
                    "content_block_stop",
                    json!({"type": "content_block_stop", "index": *index}),
                ));
                *index += 1;
            }
        };
        let text_block = |f: &mut Vec<String>,
                          open: &mut Option<&'static str>,
                          index: &mut usize,
                          kind: &'static str,
                          text: &str| {
            if text.is_empty() {
                return;
            }
            if *open != Some(kind) {
                close(f, open, index);
                let block = if kind == "text" {
                    json!({"type": "text", "text": ""})
                } else {
                    json!({"type": "thinking", "thinking": ""})
                };
                f.push(event(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": *index, "content_block": block}),
                ));
                *open = Some(kind);
            }
            let delta = if kind == "text" {
                json!({"type": "text_delta", "text": text})
            } else {
                json!({"type": "thinking_delta", "thinking": text})
            };
            f.push(event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": *index, "delta": delta}),
            ));
        };
        match ev {
            Out::Progress { .. } => {}
            Out::Delta {
                content,
                reasoning,
                tool_calls,
                ..
            } => {
                text_block(&mut f, &mut open, &mut index, "thinking", &reasoning);
                text_block(&mut f, &mut open, &mut index, "text", &content);
                for t in tool_calls {
                    close(&mut f, &mut open, &mut index);
                    f.push(event("content_block_start", json!({"type": "content_block_start", "index": index,
                        "content_block": {"type": "tool_use", "id": new_id("toolu_"), "name": t.name, "input": {}}})));
                    f.push(event(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": t.arguments}}),
                    ));
                    f.push(event(
                        "content_block_stop",
                        json!({"type": "content_block_stop", "index": index}),
                    ));
                    index += 1;
                }
            }
            Out::Done {
                finish,
                stop_word,
                usage,
            } => {
                if index == 0 && open.is_none() {
                    text_block(&mut f, &mut open, &mut index, "text", "");
                    f.push(event("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})));
                    open = Some("text");
                }
                close(&mut f, &mut open, &mut index);
                f.push(event("message_delta", json!({"type": "message_delta",
                    "delta": {"stop_reason": stop_reason(finish, &stop_word), "stop_sequence": stop_word},
                    "usage": {"output_tokens": usage.completion_tokens, "input_tokens": usage.prompt_tokens,
                              "cache_read_input_tokens": usage.cached_tokens}})));
                f.push(event("message_stop", json!({"type": "message_stop"})));
            }
            Out::Error(e) => f.push(event("error", e.anthropic_json())),
        }
        f
    };
    sse_response(rx, cancel, vec![start], PING, fmt)
}

/// The Anthropic streams' keepalive.
const PING: &str = "event: ping\ndata: {\"type\": \"ping\"}\n\n";

#[cfg(test)]
mod tests {
    use super::*;

    fn check(body: Value) -> Result<Option<Value>, ApiError> {
        tools_of(body.as_object().unwrap())
    }

    #[test]
    fn tools_and_tool_choice_are_checked() {
        let t = |schema: Value| json!({"name": "f", "input_schema": schema});
        for (body, param) in [
            (json!({"tools": [t(json!("x"))]}), "tools"),
            (json!({"tools": [t(json!({"type": "array"}))]}), "tools"),
            (json!({"tools": {"name": "f"}}), "tools"),
            (
                json!({"tools": [t(json!({}))], "tool_choice": {"type": "tool", "name": "g"}}),
                "tool_choice",
            ),
            (
                json!({"tools": [t(json!({}))], "tool_choice": {"type": "tool"}}),
                "tool_choice",
            ),
            (json!({"tool_choice": {"type": "any"}}), "tool_choice"),
            (
                json!({"tools": [t(json!({}))], "tool_choice": {"type": "maybe"}}),
                "tool_choice",
            ),
        ] {
            let e = check(body.clone()).unwrap_err();
            assert_eq!(
                (e.status.as_u16(), e.param.as_deref()),
                (400, Some(param)),
                "{body}"
            );
        }
        let ok = json!({"tools": [t(json!({"type": "object"}))], "tool_choice": {"type": "tool", "name": "f"}});
        assert_eq!(check(ok).unwrap().unwrap()[0]["function"]["name"], "f");
        let none = json!({"tools": [t(json!({}))], "tool_choice": {"type": "none"}});
        assert_eq!(check(none).unwrap(), None);
    }

    #[test]
    fn unknown_block_type_message_is_plain() {
        let o =
            json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]});
        let e = to_openai_messages(o.as_object().unwrap()).unwrap_err();
        assert!(
            e.message.contains("'image'") && !e.message.contains("Some("),
            "{}",
            e.message
        );
        let o = json!({"messages": [{"role": "user", "content": [{"text": "x"}]}]});
        let e = to_openai_messages(o.as_object().unwrap()).unwrap_err();
        assert!(!e.message.contains("None"), "{}", e.message);
    }
}
