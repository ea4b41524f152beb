//! `POST /v1/chat/completions` (OpenAI shape, stream and non-stream) and the chat rendering
//! shared with `/apply-template` and `/v1/messages`.

use crate::completions::total;
use crate::error::ApiError;
use crate::http::{
    body_bytes, check_model, collect, data, json_with_usage, new_id, openai_err, sse_response_many,
    submit_openai, unix_now, Collected, Prepared, Ready, St,
};
use crate::parser::{ParserConfig, ToolCall};
use crate::request::{
    get_bool, get_uint, normalize_messages, parse_common, parse_object, parse_template_kwargs,
    parse_tools, ChatRequest, GenParams, Obj,
};
use crate::structured;
use crate::worker::{Out, TokenLogprob};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::Response;
use serde_json::{json, Map, Value};
use std::time::Instant;
use vela_template::RenderRequest;

pub use crate::completions::{completions, validate_completion, CompletionPrompt};

/// Render chat messages with the model's template and tokenize them safely; also returns the
/// parser configuration for the answer. Shared with `/apply-template` and `/v1/messages`.
pub fn render_messages(
    r: &Ready,
    messages: Vec<Value>,
    tools: Option<Value>,
    kwargs: Map<String, Value>,
) -> Result<(String, Vec<u32>, ParserConfig), ApiError> {
    let tpl = r.template.as_ref().ok_or_else(|| {
        ApiError::invalid("this model has no chat template; use /v1/completions with a raw prompt")
    })?;
    let msgs = Value::Array(messages);
    let req = RenderRequest {
        messages: msgs.clone(),
        tools: tools.clone(),
        add_generation_prompt: true,
        extra: kwargs.clone(),
    };
    let rendered = tpl
        .render(&req)
        .map_err(|e| ApiError::bad("messages", format!("chat template error: {e:#}")))?;
    // Every client string, template kwargs included, stays plain text in the prompt.
    let values = [
        msgs,
        tools.clone().unwrap_or(Value::Null),
        Value::Object(kwargs),
    ];
    let tokens = vela_engine::prompt::tokenize_chat(&r.model.tokenizer, &rendered, &values)
        .map_err(|e| ApiError::invalid(format!("tokenization failed: {e:#}")))?;
    let mut parser =
        ParserConfig::from_template(r.template_src.as_deref().unwrap_or(""), tools.is_some());
    parser.start_in_reasoning = rendered.trim_end().ends_with("<think>");
    parser.arg_kinds = crate::tool_schema::ArgKinds::from_tools(tools.as_ref());
    Ok((rendered, tokens, parser))
}

/// A validated chat request rendered for the engine: its prompt tokens, output parser and the
/// grammar of its structured output, with its parameters; `field` names the prompt's request
/// field in errors. Shared by the chat, Messages and Responses endpoints.
pub fn prepare_chat(
    r: &Ready,
    req: ChatRequest,
    field: &'static str,
) -> Result<Prepared, ApiError> {
    let ChatRequest {
        params,
        messages,
        tools,
        template_kwargs,
        structured,
    } = req;
    let (_, prompt, mut parser) = render_messages(r, messages, tools, template_kwargs)?;
    let constraint = structured
        .map(|s| structured::constraint(r, &s, &mut parser))
        .transpose()?;
    Ok(Prepared {
        prompt,
        params,
        parser,
        field,
        default_max_tokens: None,
        constraint,
    })
}

/// Render an OpenAI chat body (`messages`, `tools`, `chat_template_kwargs`).
pub fn render_chat(r: &Ready, o: &Obj) -> Result<(String, Vec<u32>), ApiError> {
    let messages = normalize_messages(o.get("messages"))?;
    let tools = parse_tools(o)?;
    let kwargs = parse_template_kwargs(o)?;
    let (s, t, _) = render_messages(r, messages, tools, kwargs)?;
    Ok((s, t))
}

/// Validate a `/v1/chat/completions` body: everything but `model` (checked against the loaded
/// model by the handler); `n_vocab` bounds `logit_bias` ids.
pub fn validate_chat(o: &Obj, n_vocab: usize) -> Result<ChatRequest, ApiError> {
    let json_schema = structured::response_format(o)?;
    let mut params = parse_common(o, n_vocab, &["max_tokens", "max_completion_tokens"])?;
    params.logprobs = parse_logprobs(o)?;
    let messages = normalize_messages(o.get("messages"))?;
    let tools = parse_tools(o)?;
    let template_kwargs = parse_template_kwargs(o)?;
    let structured =
        structured::structured(tools.as_ref(), structured::openai_forced(o), json_schema);
    Ok(ChatRequest {
        params,
        messages,
        tools,
        template_kwargs,
        structured,
    })
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

pub(crate) fn usage_json(u: &crate::worker::Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

/// The engine's time for the request (`worker::Timings`), on the finishing chunk of a stream and
/// on a whole response, as llama-server reports `timings` (its field names where they match).
pub(crate) fn timings_json(u: &crate::worker::Usage) -> Value {
    let t = &u.timings;
    let rate = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
    json!({
        "cache_n": u.cached_tokens,
        "prompt_n": t.prompt_n, "prompt_ms": t.prompt_ms,
        "prompt_per_second": rate(t.prompt_n, t.prompt_ms),
        "predicted_n": t.predicted_n, "predicted_ms": t.predicted_ms,
        "predicted_per_second": rate(t.predicted_n, t.predicted_ms),
        "draft_n": t.draft_n, "draft_n_accepted": t.draft_n_accepted,
        "grammar_ms": t.grammar_ms,
        "queue_ms": t.queue_ms, "session_ms": t.session_ms,
        "restore_ms": t.restore_ms, "restore_bytes": t.restore_bytes,
        "cache_load_ms": t.cache_load_ms,
        "checkpoint_ms": t.checkpoint_ms, "checkpoint_bytes": t.checkpoint_bytes,
        "ttft_ms": t.ttft_ms,
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

/// `POST /v1/chat/completions`. With `n` > 1 the choices are sequences of their own, copies of
/// the prompt's session once it is in; a stream sends them one after the other.
pub async fn chat(State(st): St, body: Result<Bytes, BytesRejection>) -> Response {
    let received = Instant::now();
    let prep = || -> Result<(Vec<Prepared>, GenParams, String), ApiError> {
        let r = st.ready()?;
        let o = parse_object(&body_bytes(body)?)?;
        check_model(&o, r)?;
        let p = prepare_chat(
            r,
            validate_chat(&o, r.model.tokenizer.n_vocab())?,
            "messages",
        )?;
        let params = p.params.clone();
        let ps = (0..params.n)
            .map(|j| Prepared {
                prompt: p.prompt.clone(),
                params: params.choice(j),
                parser: p.parser.clone(),
                constraint: p.constraint.clone(),
                ..p
            })
            .collect();
        Ok((ps, params, r.name.clone()))
    };
    let (jobs, (params, model)) =
        match submit_openai(&st, prep().map(|(ps, p, m)| (ps, (p, m))), received) {
            Ok(x) => x,
            Err(resp) => return *resp,
        };
    let id = new_id("chatcmpl-");
    let created = unix_now();
    let n = jobs.len();
    if !params.stream {
        let mut cs = Vec::with_capacity(n);
        for (rx, cancel) in jobs {
            match collect(rx, cancel).await {
                Ok(c) => cs.push(c),
                // The other choices' receivers drop here, so the worker stops them.
                Err(e) => return openai_err(&st.metrics, e),
            }
        }
        let usage: Vec<_> = cs.iter().map(|c| c.usage).collect();
        return json_with_usage(chat_body(&id, created, &model, cs), &usage);
    }
    let include_usage = params.include_usage;
    let chunk = move |i: usize, delta: Value, logprobs: Value, finish: Value| {
        json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
               "system_fingerprint": "vela",
               "choices": [{"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]})
    };
    let cancels: Vec<_> = jobs.iter().map(|j| j.1.clone()).collect();
    let mut n_calls = vec![0usize; n];
    let mut started = vec![false; n];
    let mut usage = Vec::new();
    let mut failed = false;
    let fmt = move |i: usize, ev: Out| -> Vec<String> {
        if failed {
            return vec![];
        }
        let mut f = Vec::new();
        if !started[i] {
            started[i] = true;
            let role = json!({"role": "assistant", "content": ""});
            f.push(data(&chunk(i, role, Value::Null, Value::Null)));
        }
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
                        tool_calls_json(&tool_calls, n_calls[i], true),
                    );
                    n_calls[i] += tool_calls.len();
                }
                f.push(data(&chunk(i, Value::Object(d), lp, Value::Null)));
            }
            Out::Done {
                finish, usage: u, ..
            } => {
                usage.push(u);
                let mut last = chunk(i, json!({}), Value::Null, json!(finish));
                last["timings"] = timings_json(&u);
                f.push(data(&last));
                if usage.len() == n {
                    if include_usage {
                        let mut u = chunk(0, json!({}), Value::Null, Value::Null);
                        u["choices"] = json!([]);
                        u["usage"] = usage_json(&total(&usage, n));
                        f.push(data(&u));
                    }
                    f.push("data: [DONE]\n\n".into());
                }
            }
            Out::Error(e) => {
                // The other choices stop too.
                failed = true;
                cancels.iter().for_each(|c| c.cancel());
                f.push(data(&e.openai_json()));
                f.push("data: [DONE]\n\n".into());
            }
        }
        f
    };
    sse_response_many(jobs, Vec::new(), crate::http::KEEPALIVE_COMMENT, fmt)
}

/// The non-streaming answer: one choice per collected sequence.
fn chat_body(id: &str, created: u64, model: &str, cs: Vec<Collected>) -> Value {
    let n = cs.len();
    let usage: Vec<_> = cs.iter().map(|c| c.usage).collect();
    let sum = total(&usage, n);
    let choices: Vec<Value> = cs
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            // A tool-call turn whose only text is whitespace (e.g. the newline between Gemma
            // 4's `<channel|>` and `<|tool_call>`) has no content.
            let no_text = c.content.trim().is_empty() && !c.tool_calls.is_empty();
            let content = if no_text {
                Value::Null
            } else {
                json!(c.content)
            };
            let mut msg = json!({"role": "assistant", "content": content});
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
            json!({"index": i, "message": msg, "logprobs": lp, "finish_reason": c.finish})
        })
        .collect();
    json!({
        "id": id, "object": "chat.completion", "created": created, "model": model, "system_fingerprint": "vela",
        "choices": choices,
        "usage": usage_json(&sum),
        "timings": timings_json(&sum),
    })
}
