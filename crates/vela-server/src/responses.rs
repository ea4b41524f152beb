//! `POST /v1/responses`: OpenAI's Responses API (what Codex CLI speaks) on top of the chat path.
//! A request becomes a `/v1/chat/completions` body (validated and rendered by the same code);
//! the engine's output becomes Responses output items: `reasoning`, `message`, `function_call`
//! and `custom_tool_call`. Nothing is stored: `previous_response_id` is refused, every request
//! carries its whole conversation.

use crate::error::ApiError;
use crate::http::{
    body_bytes, check_model, collect, data, json_with_usage, new_id, openai_err, sse_response,
    submit, unix_now, Prepared, St,
};
use crate::openai::{prepare_chat, timings_json, validate_chat};
use crate::parser::ToolCall;
use crate::request::{get_uint, parse_object, ChatRequest, Obj, MAX_TOKENS_LIMIT};
use crate::worker::{Out, Usage};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::Response;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::time::Instant;

/// How a tool the model may call goes back to the client.
#[derive(Clone, Debug, PartialEq)]
enum ToolKind {
    /// A `function` tool, `Some(ns)` when it came inside a `namespace` tool.
    Function(Option<String>),
    /// A `custom` (freeform) tool: presented to the model as a function of one string
    /// argument `input`; its call goes back as a `custom_tool_call` with that string.
    Custom,
}

/// The chat body a Responses body stands for, and the tools' kinds by name.
struct Translated {
    chat: Obj,
    kinds: HashMap<String, ToolKind>,
}

fn bad(p: &str, m: impl Into<String>) -> ApiError {
    ApiError::bad(p, m)
}

/// The text of a content value: a string, or a list of text parts (`input_text`,
/// `output_text`, `text`, `refusal`). Images, files and audio are refused.
fn text_of(v: &Value, p: &str) -> Result<String, ApiError> {
    let parts = match v {
        Value::String(s) => return Ok(s.clone()),
        Value::Null => return Ok(String::new()),
        Value::Array(a) => a,
        _ => return Err(bad(p, format!("{p} must be a string or a list of parts"))),
    };
    let mut s = String::new();
    for (j, part) in parts.iter().enumerate() {
        let t = part.get("type").and_then(Value::as_str);
        let field = if t == Some("refusal") {
            "refusal"
        } else {
            "text"
        };
        match (t, part.get(field).and_then(Value::as_str)) {
            (Some("input_text" | "output_text" | "text" | "refusal"), Some(x)) => s.push_str(x),
            (Some(t @ ("input_text" | "output_text" | "text" | "refusal")), None) => {
                return Err(bad(p, format!("{p}[{j}] ({t}) needs a string `{field}`")))
            }
            (Some(t), _) => {
                return Err(bad(
                    p,
                    format!("{p}[{j}]: content type '{t}' is not supported (text only)"),
                ))
            }
            (None, _) => return Err(bad(p, format!("{p}[{j}] needs a string `type`"))),
        }
    }
    Ok(s)
}

fn str_field<'a>(it: &'a Value, k: &str, p: &str) -> Result<&'a str, ApiError> {
    it.get(k)
        .and_then(Value::as_str)
        .ok_or_else(|| bad(p, format!("{p}.{k} must be a string")))
}

/// Push a tool call onto the assistant message being built (the last message, when it is the
/// assistant's), else onto a new one.
fn push_call(out: &mut Vec<Value>, call: Value) {
    match out.last_mut().filter(|m| m["role"] == "assistant") {
        Some(m) => match m.get_mut("tool_calls").and_then(Value::as_array_mut) {
            Some(a) => a.push(call),
            None => m["tool_calls"] = json!([call]),
        },
        None => out.push(json!({"role": "assistant", "content": "", "tool_calls": [call]})),
    }
}

/// `instructions` and `input` → chat messages. Every system/developer text joins one system
/// message at the start (the place every chat template takes it).
fn messages(o: &Obj) -> Result<Vec<Value>, ApiError> {
    let mut system = Vec::new();
    match o.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::String(s)) => system.push(s.clone()),
        Some(_) => return Err(bad("instructions", "`instructions` must be a string")),
    }
    let mut out: Vec<Value> = Vec::new();
    let items = match o.get("input") {
        Some(Value::String(s)) => vec![json!({"type": "message", "role": "user", "content": s})],
        Some(Value::Array(a)) if !a.is_empty() => a.clone(),
        _ => {
            return Err(bad(
                "input",
                "`input` must be a string or a non-empty list of items",
            ))
        }
    };
    for (i, it) in items.iter().enumerate() {
        let p = format!("input[{i}]");
        if !it.is_object() {
            return Err(bad(&p, format!("{p} must be an object")));
        }
        let ty = match it.get("type") {
            None | Some(Value::Null) if it.get("role").is_some() => "message",
            Some(Value::String(t)) => t.as_str(),
            _ => return Err(bad(&p, format!("{p}.type must be a string"))),
        };
        match ty {
            "message" => {
                let role = str_field(it, "role", &p)?;
                let text = text_of(it.get("content").unwrap_or(&Value::Null), &p)?;
                match role {
                    "system" | "developer" => system.push(text),
                    "user" | "assistant" => out.push(json!({"role": role, "content": text})),
                    r => {
                        return Err(bad(
                            &p,
                            format!(
                                "{p}.role '{r}' is not one of user, assistant, system, developer"
                            ),
                        ))
                    }
                }
            }
            "function_call" | "custom_tool_call" => {
                let name = str_field(it, "name", &p)?;
                let id = str_field(it, "call_id", &p)?;
                let args = if ty == "function_call" {
                    Value::String(str_field(it, "arguments", &p)?.to_string())
                } else {
                    json!({"input": str_field(it, "input", &p)?})
                };
                push_call(
                    &mut out,
                    json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}}),
                );
            }
            "function_call_output" | "custom_tool_call_output" => {
                let id = str_field(it, "call_id", &p)?;
                let content = text_of(it.get("output").unwrap_or(&Value::Null), &p)?;
                out.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            // Earlier reasoning is not shown to the model again (as in the chat API), and a
            // hosted tool's record has no call the model could see the result of.
            "reasoning" | "web_search_call" => {}
            "item_reference" => {
                return Err(bad(
                    &p,
                    format!("{p}: item references are not supported: this server stores no responses; send the items themselves"),
                ))
            }
            t => {
                return Err(bad(
                    &p,
                    format!("{p}: item type '{t}' is not supported"),
                ))
            }
        }
    }
    if !system.is_empty() {
        out.insert(0, json!({"role": "system", "content": system.join("\n\n")}));
    }
    if out.iter().all(|m| m["role"] == "system") {
        return Err(bad("input", "`input` has no user or assistant message"));
    }
    Ok(out)
}

/// One `function` tool in the chat shape.
fn function(t: &Value, p: &str) -> Result<(String, Value), ApiError> {
    let name = str_field(t, "name", p)?.to_string();
    let mut f = json!({"name": name});
    for k in ["description", "parameters", "strict"] {
        if let Some(v) = t.get(k).filter(|v| !v.is_null()) {
            f[k] = v.clone();
        }
    }
    Ok((name, json!({"type": "function", "function": f})))
}

/// `tools` → chat tools and their kinds. Hosted tools (web search, file search, code
/// interpreter, …) run on OpenAI's side; this server has none of them, so they are left out.
fn tools(o: &Obj) -> Result<(Option<Value>, HashMap<String, ToolKind>), ApiError> {
    let arr = match o.get("tools") {
        None | Some(Value::Null) => return Ok((None, HashMap::new())),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(bad("tools", "`tools` must be an array")),
    };
    let mut out = Vec::new();
    let mut kinds = HashMap::new();
    for (i, t) in arr.iter().enumerate() {
        let p = format!("tools[{i}]");
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {
                let (name, f) = function(t, &p)?;
                kinds.insert(name, ToolKind::Function(None));
                out.push(f);
            }
            Some("namespace") => {
                let ns = str_field(t, "name", &p)?;
                let inner = t
                    .get("tools")
                    .and_then(Value::as_array)
                    .ok_or_else(|| bad("tools", format!("{p}.tools must be an array")))?;
                for (j, f) in inner.iter().enumerate() {
                    let q = format!("{p}.tools[{j}]");
                    if f.get("type").and_then(Value::as_str) != Some("function") {
                        return Err(bad("tools", format!("{q}.type must be 'function'")));
                    }
                    let (name, f) = function(f, &q)?;
                    kinds.insert(name, ToolKind::Function(Some(ns.to_string())));
                    out.push(f);
                }
            }
            Some("custom") => {
                let name = str_field(t, "name", &p)?;
                let mut desc = t
                    .get("description")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                if let Some(def) = t.pointer("/format/definition").and_then(Value::as_str) {
                    desc.push_str("\n\nThe input follows this grammar:\n");
                    desc.push_str(def);
                }
                kinds.insert(name.to_string(), ToolKind::Custom);
                out.push(json!({"type": "function", "function": {"name": name, "description": desc,
                    "parameters": {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}}}));
            }
            Some(_) => {}
            None => return Err(bad("tools", format!("{p}.type must be a string"))),
        }
    }
    Ok(((!out.is_empty()).then_some(Value::Array(out)), kinds))
}

/// `tool_choice` in the chat shape.
fn tool_choice(v: &Value) -> Result<Value, ApiError> {
    const P: &str = "tool_choice";
    match v {
        Value::String(_) => Ok(v.clone()),
        Value::Object(c) => match c.get("type").and_then(Value::as_str) {
            Some("function" | "custom") => {
                let name = c
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(P, "tool_choice.name must be a string"))?;
                Ok(json!({"type": "function", "function": {"name": name}}))
            }
            Some("allowed_tools") => Ok(json!(c
                .get("mode")
                .and_then(Value::as_str)
                .unwrap_or("auto"))),
            Some(t) => Err(bad(
                P,
                format!(
                    "tool_choice type '{t}' names a hosted tool, which this server does not have"
                ),
            )),
            None => Err(bad(P, "tool_choice.type must be a string")),
        },
        _ => Err(bad(P, "`tool_choice` must be a string or an object")),
    }
}

/// `text.format` → `response_format`.
fn text_format(o: &Obj) -> Result<Option<Value>, ApiError> {
    let Some(f) = o.get("text").and_then(|t| t.get("format")) else {
        return Ok(None);
    };
    Ok(match f.get("type").and_then(Value::as_str) {
        Some("json_schema") => {
            let mut js = Map::new();
            for k in ["name", "schema", "strict", "description"] {
                if let Some(v) = f.get(k) {
                    js.insert(k.into(), v.clone());
                }
            }
            Some(json!({"type": "json_schema", "json_schema": js}))
        }
        Some(t @ ("text" | "json_object")) => Some(json!({ "type": t })),
        _ => {
            return Err(bad(
                "text",
                "text.format.type must be text, json_object or json_schema",
            ))
        }
    })
}

/// A Responses body → the chat body it stands for.
fn translate(o: &Obj) -> Result<Translated, ApiError> {
    if o.get("previous_response_id").is_some_and(|v| !v.is_null()) {
        return Err(bad(
            "previous_response_id",
            "this server stores no responses: send the whole conversation in `input`",
        ));
    }
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages(o)?));
    let (tools, kinds) = tools(o)?;
    if let Some(t) = tools {
        chat.insert("tools".into(), t);
        if let Some(c) = o.get("tool_choice").filter(|v| !v.is_null()) {
            chat.insert("tool_choice".into(), tool_choice(c)?);
        }
    }
    if let Some(n) = get_uint(o, "max_output_tokens", MAX_TOKENS_LIMIT)? {
        if n == 0 {
            return Err(bad(
                "max_output_tokens",
                "`max_output_tokens` must be at least 1",
            ));
        }
        chat.insert("max_tokens".into(), json!(n));
    }
    if let Some(rf) = text_format(o)? {
        chat.insert("response_format".into(), rf);
    }
    // Sampling and vela's extensions keep their chat names.
    for k in [
        "stream",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logit_bias",
        "chat_template_kwargs",
    ] {
        if let Some(v) = o.get(k) {
            chat.insert(k.into(), v.clone());
        }
    }
    // `reasoning.effort: "none"` asks for no thinking: the templates' `enable_thinking` switch.
    if o.get("reasoning")
        .and_then(|r| r.get("effort"))
        .and_then(Value::as_str)
        == Some("none")
    {
        let kw = chat
            .entry("chat_template_kwargs")
            .or_insert_with(|| json!({}));
        if let Some(kw) = kw.as_object_mut() {
            kw.entry("enable_thinking").or_insert(json!(false));
        }
    }
    Ok(Translated { chat, kinds })
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    })
}

/// The item being streamed: reasoning or a message, with its output index, id and text.
struct Open {
    reasoning: bool,
    index: usize,
    id: String,
    text: String,
}

/// Turns the engine's events into Responses output items and stream events; the non-streaming
/// answer is the same items without the events.
struct Emitter {
    base: Value,
    kinds: HashMap<String, ToolKind>,
    seq: u64,
    output: Vec<Value>,
    open: Option<Open>,
    /// Answer text that is only whitespace so far: held back, so a tool-call turn has no
    /// message item of just a newline.
    pending_ws: String,
}

impl Emitter {
    fn new(base: Value, kinds: HashMap<String, ToolKind>) -> Emitter {
        Emitter {
            base,
            kinds,
            seq: 0,
            output: Vec::new(),
            open: None,
            pending_ws: String::new(),
        }
    }

    fn event(&mut self, f: &mut Vec<String>, ty: &str, mut v: Value) {
        v["type"] = json!(ty);
        v["sequence_number"] = json!(self.seq);
        self.seq += 1;
        f.push(format!("event: {ty}\n{}", data(&v)));
    }

    /// The response object with this status and output.
    fn response(&self, status: &str) -> Value {
        let mut r = self.base.clone();
        r["status"] = json!(status);
        r["output"] = Value::Array(self.output.clone());
        r
    }

    fn close(&mut self, f: &mut Vec<String>) {
        let Some(o) = self.open.take() else { return };
        let item = if o.reasoning {
            self.event(f, "response.reasoning_text.done", json!({"item_id": o.id, "output_index": o.index, "content_index": 0, "text": o.text}));
            json!({"id": o.id, "type": "reasoning", "summary": [], "encrypted_content": null,
                   "content": [{"type": "reasoning_text", "text": o.text}]})
        } else {
            let part = json!({"type": "output_text", "text": o.text, "annotations": []});
            self.event(f, "response.output_text.done", json!({"item_id": o.id, "output_index": o.index, "content_index": 0, "text": o.text}));
            self.event(
                f,
                "response.content_part.done",
                json!({"item_id": o.id, "output_index": o.index, "content_index": 0, "part": part}),
            );
            json!({"id": o.id, "type": "message", "role": "assistant", "status": "completed", "content": [part]})
        };
        self.event(
            f,
            "response.output_item.done",
            json!({"output_index": o.index, "item": item}),
        );
        self.output.push(item);
    }

    /// Close the open item and open a new one (reasoning or the answer message).
    fn open_item(&mut self, f: &mut Vec<String>, reasoning: bool) {
        self.close(f);
        let index = self.output.len();
        let id = new_id(if reasoning { "rs_" } else { "msg_" });
        let item = if reasoning {
            json!({"id": id, "type": "reasoning", "summary": [], "content": []})
        } else {
            json!({"id": id, "type": "message", "role": "assistant", "status": "in_progress", "content": []})
        };
        self.event(
            f,
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        );
        if !reasoning {
            self.event(
                f,
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": []}}),
            );
        }
        self.open = Some(Open {
            reasoning,
            index,
            id,
            text: String::new(),
        });
    }

    fn text(&mut self, f: &mut Vec<String>, reasoning: bool, mut text: String) {
        let new_item = self.open.as_ref().is_none_or(|o| o.reasoning != reasoning);
        if !reasoning && new_item {
            if text.trim().is_empty() {
                self.pending_ws.push_str(&text);
                return;
            }
            text = std::mem::take(&mut self.pending_ws) + &text;
        }
        if text.is_empty() {
            return;
        }
        if new_item {
            self.open_item(f, reasoning);
        }
        let Some(o) = self.open.as_mut() else { return };
        o.text.push_str(&text);
        let (id, index) = (o.id.clone(), o.index);
        let ty = if reasoning {
            "response.reasoning_text.delta"
        } else {
            "response.output_text.delta"
        };
        self.event(
            f,
            ty,
            json!({"item_id": id, "output_index": index, "content_index": 0, "delta": text}),
        );
    }

    fn tool_call(&mut self, f: &mut Vec<String>, t: ToolCall) {
        self.close(f);
        self.pending_ws.clear();
        let index = self.output.len();
        let call_id = new_id("call_");
        let kind = self
            .kinds
            .get(&t.name)
            .cloned()
            .unwrap_or(ToolKind::Function(None));
        let (mut item, delta_ty, done_ty, field, value) = match kind {
            ToolKind::Custom => {
                let input = serde_json::from_str::<Value>(&t.arguments)
                    .ok()
                    .and_then(|v| v.get("input").and_then(Value::as_str).map(str::to_string))
                    .unwrap_or(t.arguments);
                (
                    json!({"id": new_id("ctc_"), "type": "custom_tool_call", "call_id": call_id, "name": t.name}),
                    "response.custom_tool_call_input.delta",
                    "response.custom_tool_call_input.done",
                    "input",
                    input,
                )
            }
            ToolKind::Function(ns) => {
                let mut item = json!({"id": new_id("fc_"), "type": "function_call", "call_id": call_id, "name": t.name});
                if let Some(ns) = ns {
                    item["namespace"] = json!(ns);
                }
                (
                    item,
                    "response.function_call_arguments.delta",
                    "response.function_call_arguments.done",
                    "arguments",
                    t.arguments,
                )
            }
        };
        let id = item["id"].clone();
        item["status"] = json!("in_progress");
        item[field] = json!("");
        self.event(
            f,
            "response.output_item.added",
            json!({"output_index": index, "item": item.clone()}),
        );
        self.event(
            f,
            delta_ty,
            json!({"item_id": id, "output_index": index, "delta": value}),
        );
        self.event(
            f,
            done_ty,
            json!({"item_id": id, "output_index": index, field: value}),
        );
        item["status"] = json!("completed");
        item[field] = json!(value);
        self.event(
            f,
            "response.output_item.done",
            json!({"output_index": index, "item": item.clone()}),
        );
        self.output.push(item);
    }

    /// The end: the last item closed, the response `completed` (or `incomplete` when the
    /// output hit its limit or the context), with usage and vela's `timings`.
    fn done(&mut self, f: &mut Vec<String>, finish: &str, usage: &Usage) -> Value {
        let answered = self.output.iter().any(|i| i["type"] != "reasoning")
            || self.open.as_ref().is_some_and(|o| !o.reasoning);
        if !answered {
            // Always an answer message, if only an empty one (or the held-back whitespace).
            let ws = std::mem::take(&mut self.pending_ws);
            self.open_item(f, false);
            if !ws.is_empty() {
                self.text(f, false, ws);
            }
        }
        self.close(f);
        let incomplete = finish == "length";
        let status = if incomplete {
            "incomplete"
        } else {
            "completed"
        };
        let mut r = self.response(status);
        if incomplete {
            r["incomplete_details"] = json!({"reason": "max_output_tokens"});
        }
        r["usage"] = usage_json(usage);
        r["timings"] = timings_json(usage);
        r
    }
}

/// Validate a Responses body as the handler does, without a model: its chat translation, then
/// the chat validation (the fuzzer's entry point).
pub fn validate(o: &Obj, n_vocab: usize) -> Result<ChatRequest, ApiError> {
    validate_chat(&translate(o)?.chat, n_vocab)
}

/// The response object's fields that echo the request.
fn base(o: &Obj, id: &str, model: &str) -> Value {
    let get = |k: &str, d: Value| o.get(k).filter(|v| !v.is_null()).cloned().unwrap_or(d);
    json!({
        "id": id, "object": "response", "created_at": unix_now(), "model": model,
        "status": "in_progress", "error": null, "incomplete_details": null,
        "instructions": get("instructions", Value::Null), "output": [],
        "parallel_tool_calls": get("parallel_tool_calls", json!(true)),
        "tool_choice": get("tool_choice", json!("auto")), "tools": get("tools", json!([])),
        "temperature": get("temperature", json!(1.0)), "top_p": get("top_p", json!(1.0)),
        "max_output_tokens": get("max_output_tokens", Value::Null),
        "previous_response_id": null, "reasoning": get("reasoning", json!({})),
        "store": false, "text": get("text", json!({"format": {"type": "text"}})),
        "truncation": "disabled", "usage": null, "metadata": get("metadata", json!({})),
    })
}

/// `POST /v1/responses`.
pub async fn responses(State(st): St, body: Result<Bytes, BytesRejection>) -> Response {
    let received = Instant::now();
    let prep = || -> Result<(Prepared, Emitter), ApiError> {
        let r = st.ready()?;
        let o = parse_object(&body_bytes(body)?)?;
        check_model(&o, r)?;
        let Translated { chat, kinds } = translate(&o)?;
        let req = validate_chat(&chat, r.model.tokenizer.n_vocab())?;
        let em = Emitter::new(base(&o, &new_id("resp_"), &r.name), kinds);
        Ok((prepare_chat(r, req, "input")?, em))
    };
    let (p, mut em) = match prep() {
        Ok(x) => x,
        Err(e) => return openai_err(&st.metrics, e),
    };
    let Ok(r) = st.ready() else {
        return openai_err(&st.metrics, ApiError::internal("not ready"));
    };
    let stream = p.params.stream;
    let (rx, cancel) = match submit(&st, r, p, received) {
        Ok(x) => x,
        Err(e) => return openai_err(&st.metrics, e),
    };
    if !stream {
        return match collect(rx, cancel).await {
            Ok(c) => {
                let mut f = Vec::new();
                em.text(&mut f, true, c.reasoning);
                em.text(&mut f, false, c.content);
                for t in c.tool_calls {
                    em.tool_call(&mut f, t);
                }
                json_with_usage(em.done(&mut f, c.finish, &c.usage), [&c.usage])
            }
            Err(e) => openai_err(&st.metrics, e),
        };
    }
    // `response.created` and `response.in_progress` at once, then the items as they come.
    let mut first = Vec::new();
    let created = em.response("in_progress");
    em.event(
        &mut first,
        "response.created",
        json!({ "response": created }),
    );
    em.event(
        &mut first,
        "response.in_progress",
        json!({ "response": created }),
    );
    let fmt = move |ev: Out| -> Vec<String> {
        let mut f = Vec::new();
        match ev {
            Out::Progress { .. } => {}
            Out::Delta {
                content,
                reasoning,
                tool_calls,
                ..
            } => {
                em.text(&mut f, true, reasoning);
                em.text(&mut f, false, content);
                for t in tool_calls {
                    em.tool_call(&mut f, t);
                }
            }
            Out::Done { finish, usage, .. } => {
                let r = em.done(&mut f, finish, &usage);
                let ty = if r["status"] == "incomplete" {
                    "response.incomplete"
                } else {
                    "response.completed"
                };
                em.event(&mut f, ty, json!({ "response": r }));
            }
            Out::Error(e) => {
                let mut r = em.response("failed");
                r["error"] = json!({"code": e.openai_type(), "message": e.message});
                em.event(&mut f, "response.failed", json!({ "response": r }));
            }
        }
        f
    };
    sse_response(rx, cancel, first, crate::http::KEEPALIVE_COMMENT, fmt)
}

#[cfg(test)]
#[path = "responses_tests.rs"]
mod tests;
