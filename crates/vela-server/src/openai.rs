//! `POST /v1/chat/completions` and `POST /v1/completions` (OpenAI shapes, stream and non-stream).

use crate::error::ApiError;
use crate::http::{
    body_bytes, check_model, collect, data, new_id, openai_err, sse_response, submit, unix_now,
    Collected, Prepared, Ready, St,
};
use crate::parser::{ParserConfig, ToolCall};
use crate::request::{
    check_response_format, get_bool, get_uint, normalize_messages, parse_common, parse_object,
    parse_tools, ChatRequest, GenParams, Obj,
};
use crate::worker::{CancelToken, Out, TokenLogprob};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;
use vela_template::RenderRequest;

/// Render chat messages with the model's template and tokenize them safely; also returns the
/// parser configuration for the answer. Shared with `/apply-template` and `/v1/messages`.
pub fn render_messages(
    r: &Ready,
    messages: Vec<Value>,
    tools: Option<Value>,
    extra: &Obj,
) -> Result<(String, Vec<u32>, ParserConfig), ApiError> {
    let tpl = r.template.as_ref().ok_or_else(|| {
        ApiError::invalid("this model has no chat template; use /v1/completions with a raw prompt")
    })?;
    let msgs = Value::Array(messages);
    let mut kwargs = serde_json::Map::new();
    if let Some(Value::Object(k)) = extra.get("chat_template_kwargs") {
        kwargs = k.clone();
    }
    let req = RenderRequest {
        messages: msgs.clone(),
        tools: tools.clone(),
        add_generation_prompt: true,
        extra: kwargs,
    };
    let rendered = tpl
        .render(&req)
        .map_err(|e| ApiError::bad("messages", format!("chat template error: {e:#}")))?;
    let values = [msgs, tools.clone().unwrap_or(Value::Null)];
    let tokens = vela_engine::prompt::tokenize_chat(&r.model.tokenizer, &rendered, &values)
        .map_err(|e| ApiError::invalid(format!("tokenization failed: {e:#}")))?;
    let mut parser =
        ParserConfig::from_template(r.template_src.as_deref().unwrap_or(""), tools.is_some());
    parser.start_in_reasoning = rendered.trim_end().ends_with("<think>");
    Ok((rendered, tokens, parser))
}

/// Render an OpenAI chat body (`messages`, `tools`).
pub fn render_chat(r: &Ready, o: &Obj) -> Result<(String, Vec<u32>), ApiError> {
    let messages = normalize_messages(o.get("messages"))?;
    let tools = parse_tools(o)?;
    let (s, t, _) = render_messages(r, messages, tools, o)?;
    Ok((s, t))
}

/// Validate a `/v1/chat/completions` body: everything but `model` (checked against the loaded
/// model by the handler); `n_vocab` bounds `logit_bias` ids.
pub fn validate_chat(o: &Obj, n_vocab: usize) -> Result<ChatRequest, ApiError> {
    check_response_format(o)?;
    let mut params = parse_common(o, n_vocab, &["max_tokens", "max_completion_tokens"])?;
    params.logprobs = parse_logprobs(o)?;
    let messages = normalize_messages(o.get("messages"))?;
    let tools = parse_tools(o)?;
    Ok(ChatRequest {
        params,
        messages,
        tools,
    })
}

/// The prompt of a `/v1/completions` body.
#[derive(Debug, Clone, PartialEq)]
pub enum CompletionPrompt {
    /// Text, tokenized with special-token parsing (the client owns the whole prompt).
    Text(String),
    /// Token ids, each below the vocabulary size.
    Ids(Vec<u32>),
}

/// Validate a `/v1/completions` body: everything but `model`; `n_vocab` bounds `logit_bias`
/// and prompt ids.
pub fn validate_completion(
    o: &Obj,
    n_vocab: usize,
) -> Result<(GenParams, CompletionPrompt), ApiError> {
    let mut params = parse_common(o, n_vocab, &["max_tokens"])?;
    if params.max_tokens.is_none() {
        params.max_tokens = Some(16);
    }
    if let Some(n) = o.get("logprobs").filter(|v| !v.is_null()) {
        let n = n
            .as_u64()
            .filter(|&n| n <= 20)
            .ok_or_else(|| ApiError::bad("logprobs", "`logprobs` must be an integer 0..=20"))?;
        params.logprobs = Some(n as usize);
    }
    if get_bool(o, "echo")?.unwrap_or(false) {
        return Err(ApiError::bad("echo", "`echo` is not supported"));
    }
    if o.get("suffix").is_some_and(|v| !v.is_null()) {
        return Err(ApiError::bad("suffix", "`suffix` is not supported"));
    }
    if get_uint(o, "best_of", 1 << 20)?.is_some_and(|b| b != 1) {
        return Err(ApiError::bad("best_of", "only best_of=1 is supported"));
    }
    let prompt = match o.get("prompt") {
        Some(Value::String(s)) => CompletionPrompt::Text(s.clone()),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            CompletionPrompt::Text(a[0].as_str().unwrap_or("").to_string())
        }
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_u64) => {
            let n = n_vocab as u64;
            let ids = a
                .iter()
                .map(|v| v.as_u64().filter(|&i| i < n).map(|i| i as u32))
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(|| ApiError::bad("prompt", format!("token ids must be below {n}")))?;
            CompletionPrompt::Ids(ids)
        }
        _ => {
            return Err(ApiError::bad(
                "prompt",
                "`prompt` must be a string, a list of one string or a list of token ids",
            ))
        }
    };
    Ok((params, prompt))
}

fn parse_logprobs(o: &Obj) -> Result<Option<usize>, ApiError> {
    let on = get_bool(o, "logprobs")?.unwrap_or(false);
    let top = get_uint(o, "top_logprobs", 20)?;
    if top.is_some() && !on {
        return Err(ApiError::bad(
            "top_logprobs",
            "`top_logprobs` requires `logprobs: true`",
        ));
    }
    Ok(on.then(|| top.unwrap_or(0) as usize))
}

fn usage_json(u: &crate::worker::Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

/// The engine's time for the request (`worker::Timings`), on the finishing chunk of a stream and
/// on a whole response, as llama-server reports `timings` (its field names where they match).
fn timings_json(u: &crate::worker::Usage) -> Value {
    let t = &u.timings;
    let rate = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
    json!({
        "cache_n": u.cached_tokens,
        "prompt_n": t.prompt_n, "prompt_ms": t.prompt_ms,
        "prompt_per_second": rate(t.prompt_n, t.prompt_ms),
        "predicted_n": t.predicted_n, "predicted_ms": t.predicted_ms,
        "predicted_per_second": rate(t.predicted_n, t.predicted_ms),
        "draft_n": t.draft_n, "draft_n_accepted": t.draft_n_accepted,
        "queue_ms": t.queue_ms,
        "restore_ms": t.restore_ms, "restore_bytes": t.restore_bytes,
        "checkpoint_ms": t.checkpoint_ms, "checkpoint_bytes": t.checkpoint_bytes,
    })
}

fn chat_logprobs(l: &[TokenLogprob]) -> Value {
    let content: Vec<Value> = l
        .iter()
        .map(|t| {
            json!({
                "token": t.token, "logprob": t.logprob, "bytes": t.bytes,
                "top_logprobs": t.top.iter().map(|(s, b, p)| json!({"token": s, "logprob": p, "bytes": b})).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({"content": content})
}

fn tool_calls_json(calls: &[ToolCall], start: usize, with_index: bool) -> Value {
    Value::Array(
        calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut v = json!({"id": new_id("call_"), "type": "function", "function": {"name": c.name, "arguments": c.arguments}});
                if with_index {
                    v["index"] = json!(start + i);
                }
                v
            })
            .collect(),
    )
}

/// A queued request: its output channel, cancel token, `stream`, `include_usage` and model name.
type Started = (
    mpsc::UnboundedReceiver<Out>,
    Arc<CancelToken>,
    bool,
    bool,
    String,
);

/// Queue a prepared OpenAI request (checking readiness), or the error response to send.
fn start(
    st: &crate::http::AppState,
    prep: Result<(Prepared, String), ApiError>,
    received: Instant,
) -> Result<Started, Box<Response>> {
    let err = |e| Box::new(openai_err(&st.metrics, e));
    let (p, model) = prep.map_err(err)?;
    let r = st
        .ready()
        .map_err(|_| err(ApiError::internal("not ready")))?;
    let (stream, include_usage) = (p.params.stream, p.params.include_usage);
    let (rx, cancel) = submit(st, r, p, received).map_err(err)?;
    Ok((rx, cancel, stream, include_usage, model))
}

/// `POST /v1/chat/completions`.
pub async fn chat(State(st): St, body: Result<Bytes, BytesRejection>) -> Response {
    let received = Instant::now();
    let prep = || -> Result<(Prepared, String), ApiError> {
        let r = st.ready()?;
        let o = parse_object(&body_bytes(body)?)?;
        check_model(&o, r)?;
        let ChatRequest {
            params,
            messages,
            tools,
        } = validate_chat(&o, r.model.tokenizer.n_vocab())?;
        let (_, prompt, parser) = render_messages(r, messages, tools, &o)?;
        Ok((
            Prepared {
                prompt,
                params,
                parser,
            },
            r.name.clone(),
        ))
    };
    let (rx, cancel, stream, include_usage, model) = match start(&st, prep(), received) {
        Ok(x) => x,
        Err(resp) => return *resp,
    };
    let id = new_id("chatcmpl-");
    let created = unix_now();
    if !stream {
        return match collect(rx, cancel).await {
            Ok(c) => axum::Json(chat_body(&id, created, &model, c)).into_response(),
            Err(e) => openai_err(&st.metrics, e),
        };
    }
    let chunk = move |delta: Value, logprobs: Value, finish: Value| {
        json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
               "system_fingerprint": "vela",
               "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]})
    };
    let mut n_calls = 0usize;
    let mut first = vec![data(&chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
        Value::Null,
    ))];
    let fmt = move |ev: Out| -> Vec<String> {
        let mut f = std::mem::take(&mut first);
        match ev {
            Out::Progress { .. } => {}
            Out::Delta {
                content,
                reasoning,
                tool_calls,
                logprobs,
            } => {
                let lp = if logprobs.is_empty() {
                    Value::Null
                } else {
                    chat_logprobs(&logprobs)
                };
                let mut d = serde_json::Map::new();
                if !reasoning.is_empty() {
                    d.insert("reasoning_content".into(), json!(reasoning));
                }
                if !content.is_empty() || (reasoning.is_empty() && tool_calls.is_empty()) {
                    d.insert("content".into(), json!(content));
                }
                if !tool_calls.is_empty() {
                    d.insert(
                        "tool_calls".into(),
                        tool_calls_json(&tool_calls, n_calls, true),
                    );
                    n_calls += tool_calls.len();
                }
                f.push(data(&chunk(Value::Object(d), lp, Value::Null)));
            }
            Out::Done { finish, usage, .. } => {
                let mut last = chunk(json!({}), Value::Null, json!(finish));
                last["timings"] = timings_json(&usage);
                f.push(data(&last));
                if include_usage {
                    let mut u = chunk(json!({}), Value::Null, Value::Null);
                    u["choices"] = json!([]);
                    u["usage"] = usage_json(&usage);
                    f.push(data(&u));
                }
                f.push("data: [DONE]\n\n".into());
            }
            Out::Error(e) => {
                f.push(data(&ApiError::invalid(e).openai_json()));
                f.push("data: [DONE]\n\n".into());
            }
        }
        f
    };
    sse_response(rx, cancel, fmt)
}

fn chat_body(id: &str, created: u64, model: &str, c: Collected) -> Value {
    // A tool-call turn whose only text is whitespace (e.g. the newline between Gemma 4's
    // `<channel|>` and `<|tool_call>`) has no content.
    let no_text = c.content.trim().is_empty() && !c.tool_calls.is_empty();
    let mut msg = json!({"role": "assistant", "content": if no_text { Value::Null } else { json!(c.content) }});
    if !c.reasoning.is_empty() {
        msg["reasoning_content"] = json!(c.reasoning);
    }
    if !c.tool_calls.is_empty() {
        msg["tool_calls"] = tool_calls_json(&c.tool_calls, 0, false);
    }
    let lp = if c.logprobs.is_empty() {
        Value::Null
    } else {
        chat_logprobs(&c.logprobs)
    };
    json!({
        "id": id, "object": "chat.completion", "created": created, "model": model, "system_fingerprint": "vela",
        "choices": [{"index": 0, "message": msg, "logprobs": lp, "finish_reason": c.finish}],
        "usage": usage_json(&c.usage),
        "timings": timings_json(&c.usage),
    })
}

fn completion_logprobs(l: &[TokenLogprob]) -> Value {
    let mut off = 0usize;
    let mut offsets = Vec::new();
    for t in l {
        offsets.push(off);
        off += t.token.len();
    }
    json!({
        "tokens": l.iter().map(|t| &t.token).collect::<Vec<_>>(),
        "token_logprobs": l.iter().map(|t| t.logprob).collect::<Vec<_>>(),
        "top_logprobs": l.iter().map(|t| t.top.iter().map(|(s, _, p)| (s.clone(), json!(p))).collect::<serde_json::Map<_, _>>()).collect::<Vec<_>>(),
        "text_offset": offsets,
    })
}

/// `POST /v1/completions` (raw prompt; the client owns the whole prompt, so special-token text
/// in it is parsed as special tokens).
pub async fn completions(State(st): St, body: Result<Bytes, BytesRejection>) -> Response {
    let received = Instant::now();
    let prep = || -> Result<(Prepared, String), ApiError> {
        let r = st.ready()?;
        let o = parse_object(&body_bytes(body)?)?;
        check_model(&o, r)?;
        let tok = &r.model.tokenizer;
        let (params, prompt) = validate_completion(&o, tok.n_vocab())?;
        let prompt = match prompt {
            CompletionPrompt::Text(s) => tok
                .encode(&s, true, true)
                .map_err(|e| ApiError::invalid(format!("{e:#}")))?,
            CompletionPrompt::Ids(ids) => ids,
        };
        Ok((
            Prepared {
                prompt,
                params,
                parser: ParserConfig::default(),
            },
            r.name.clone(),
        ))
    };
    let (rx, cancel, stream, include_usage, model) = match start(&st, prep(), received) {
        Ok(x) => x,
        Err(resp) => return *resp,
    };
    let id = new_id("cmpl-");
    let created = unix_now();
    let obj = move |text: &str, lp: Value, finish: Value| {
        json!({"id": id, "object": "text_completion", "created": created, "model": model,
               "choices": [{"index": 0, "text": text, "logprobs": lp, "finish_reason": finish}]})
    };
    if !stream {
        return match collect(rx, cancel).await {
            Ok(c) => {
                let lp = if c.logprobs.is_empty() {
                    Value::Null
                } else {
                    completion_logprobs(&c.logprobs)
                };
                let mut v = obj(&c.content, lp, json!(c.finish));
                v["usage"] = usage_json(&c.usage);
                v["timings"] = timings_json(&c.usage);
                axum::Json(v).into_response()
            }
            Err(e) => openai_err(&st.metrics, e),
        };
    }
    let fmt = move |ev: Out| -> Vec<String> {
        match ev {
            Out::Progress { .. } => vec![],
            Out::Delta {
                content, logprobs, ..
            } => {
                let lp = if logprobs.is_empty() {
                    Value::Null
                } else {
                    completion_logprobs(&logprobs)
                };
                vec![data(&obj(&content, lp, Value::Null))]
            }
            Out::Done { finish, usage, .. } => {
                let mut last = obj("", Value::Null, json!(finish));
                last["timings"] = timings_json(&usage);
                let mut f = vec![data(&last)];
                if include_usage {
                    let mut u = obj("", Value::Null, Value::Null);
                    u["choices"] = json!([]);
                    u["usage"] = usage_json(&usage);
                    f.push(data(&u));
                }
                f.push("data: [DONE]\n\n".into());
                f
            }
            Out::Error(e) => vec![
                data(&ApiError::invalid(e).openai_json()),
                "data: [DONE]\n\n".into(),
            ],
        }
    };
    sse_response(rx, cancel, fmt)
}
