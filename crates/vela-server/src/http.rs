//! HTTP plumbing: shared state, router, auth/CORS middleware, utility endpoints, job submission
//! and SSE streaming with keepalives and disconnect detection.

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::parser::ParserConfig;
use crate::request::{parse_object, GenParams, Obj};
use crate::worker::{CancelToken, Job, Out, TokenLogprob, Usage};
use crate::{anthropic, openai};
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use vela_engine::loader::LoadedModel;
use vela_template::ChatTemplate;

/// Everything available once the model is loaded.
pub struct Ready {
    pub model: Arc<LoadedModel>,
    /// The id listed by `/v1/models`.
    pub name: String,
    /// Other accepted names (the `--model` argument, "default").
    pub aliases: Vec<String>,
    pub template: Option<ChatTemplate>,
    pub template_src: Option<String>,
    pub jobs: mpsc::Sender<Job>,
    pub n_ctx: usize,
    pub ubatch: usize,
}

/// Server settings used by handlers.
pub struct Settings {
    pub api_key: Option<String>,
    pub cors: bool,
    pub queue: usize,
    pub cache_mb: usize,
}

/// Shared state of all handlers.
pub struct AppState {
    pub ready: OnceLock<Ready>,
    pub load_error: Mutex<Option<String>>,
    pub metrics: Arc<Metrics>,
    pub settings: Settings,
    pub created: u64,
}

pub type St = State<Arc<AppState>>;

impl AppState {
    pub fn ready(&self) -> Result<&Ready, ApiError> {
        self.ready.get().ok_or_else(|| {
            let msg = match self.load_error.lock().ok().and_then(|e| e.clone()) {
                Some(e) => format!("model failed to load: {e}"),
                None => "the model is still loading".to_string(),
            };
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, msg)
        })
    }
}

/// A response in the OpenAI error shape.
pub fn openai_err(m: &Metrics, e: ApiError) -> Response {
    m.request_errors.fetch_add(1, Ordering::Relaxed);
    (e.status, axum::Json(e.openai_json())).into_response()
}

/// A request body or the error for a rejected one (413 for oversize).
pub fn body_bytes(b: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    b.map_err(|r| {
        let status = r.status();
        let msg = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "request body too large".to_string()
        } else {
            format!("cannot read the request body: {}", r.body_text())
        };
        ApiError::new(status, msg)
    })
}

/// Check the `model` field against the loaded model.
pub fn check_model(o: &Obj, r: &Ready) -> Result<(), ApiError> {
    match o.get("model") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(m)) => {
            if m.is_empty()
                || m.eq_ignore_ascii_case(&r.name)
                || r.aliases.iter().any(|a| a.eq_ignore_ascii_case(m))
            {
                Ok(())
            } else {
                Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!("model '{m}' not found; this server serves '{}'", r.name),
                )
                .with_code("model_not_found"))
            }
        }
        Some(_) => Err(ApiError::bad("model", "`model` must be a string")),
    }
}

static ID: AtomicU64 = AtomicU64::new(1);

/// A unique response id with a prefix.
pub fn new_id(prefix: &str) -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64;
    format!("{prefix}{:x}{:04x}", t, ID.fetch_add(1, Ordering::Relaxed))
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

/// A prompt ready for the engine.
pub struct Prepared {
    pub prompt: Vec<u32>,
    pub params: GenParams,
    pub parser: ParserConfig,
}

/// Queue a job. Errors: prompt over the context (400), queue full (429).
pub fn submit(
    st: &AppState,
    r: &Ready,
    p: Prepared,
    received: Instant,
) -> Result<(mpsc::UnboundedReceiver<Out>, Arc<CancelToken>), ApiError> {
    st.metrics.requests.fetch_add(1, Ordering::Relaxed);
    if p.prompt.is_empty() {
        return Err(ApiError::bad("prompt", "the prompt is empty"));
    }
    if p.prompt.len() >= r.n_ctx {
        return Err(ApiError::invalid(format!(
            "the prompt has {} tokens but the context size is {} (at least one token must be left to generate)",
            p.prompt.len(),
            r.n_ctx
        ))
        .with_code("context_length_exceeded"));
    }
    let room = r.n_ctx - p.prompt.len();
    let max_tokens = p.params.max_tokens.unwrap_or(room).min(room);
    let (tx, rx) = mpsc::unbounded_channel();
    let cancel = CancelToken::new();
    let job = Job {
        prompt: p.prompt,
        sampling: p.params.sampling,
        max_tokens,
        stop: p.params.stop,
        logprobs: p.params.logprobs,
        parser: p.parser,
        cancel: cancel.clone(),
        out: tx,
        received,
    };
    st.metrics.queue_depth.fetch_add(1, Ordering::Relaxed);
    if r.jobs.try_send(job).is_err() {
        st.metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!("the request queue is full ({} waiting)", st.settings.queue),
        )
        .with_code("queue_full"));
    }
    Ok((rx, cancel))
}

/// Sets the cancel flag when dropped while armed (the handler future was dropped: client gone).
pub struct CancelOnDrop(pub Arc<CancelToken>, pub bool);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.1 {
            self.0.cancel();
        }
    }
}

/// The whole output of a non-streaming request.
#[derive(Default)]
pub struct Collected {
    pub content: String,
    pub reasoning: String,
    pub tool_calls: Vec<crate::parser::ToolCall>,
    pub logprobs: Vec<TokenLogprob>,
    pub finish: &'static str,
    pub stop_word: Option<String>,
    pub usage: Usage,
}

/// Wait for a job to finish (non-streaming), cancelling it if this future is dropped.
pub async fn collect(
    mut rx: mpsc::UnboundedReceiver<Out>,
    cancel: Arc<CancelToken>,
) -> Result<Collected, ApiError> {
    let mut guard = CancelOnDrop(cancel, true);
    let mut c = Collected::default();
    while let Some(ev) = rx.recv().await {
        match ev {
            Out::Progress { .. } => {}
            Out::Delta {
                content,
                reasoning,
                tool_calls,
                logprobs,
            } => {
                c.content.push_str(&content);
                c.reasoning.push_str(&reasoning);
                c.tool_calls.extend(tool_calls);
                c.logprobs.extend(logprobs);
            }
            Out::Done {
                finish,
                stop_word,
                usage,
            } => {
                c.finish = finish;
                c.stop_word = stop_word;
                c.usage = usage;
                guard.1 = false;
                return Ok(c);
            }
            Out::Error(e) => {
                guard.1 = false;
                return Err(ApiError::invalid(e));
            }
        }
    }
    guard.1 = false;
    Err(ApiError::internal("the engine dropped the request"))
}

/// Body stream that cancels the job when hyper drops it (client gone or write error).
struct GuardedStream {
    rx: mpsc::Receiver<Bytes>,
    cancel: Arc<CancelToken>,
}

impl tokio_stream::Stream for GuardedStream {
    type Item = Result<Bytes, std::convert::Infallible>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx).map(|o| o.map(Ok))
    }
}

impl Drop for GuardedStream {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Stream a job as SSE: `fmt` turns each engine event into frames; a `: keepalive` comment is
/// sent after every prefill chunk and every 5 s of silence. A failed write cancels the job.
pub fn sse_response(
    mut rx: mpsc::UnboundedReceiver<Out>,
    cancel: Arc<CancelToken>,
    mut fmt: impl FnMut(Out) -> Vec<String> + Send + 'static,
) -> Response {
    let (btx, brx) = mpsc::channel::<Bytes>(64);
    let c2 = cancel.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            let frames: Vec<String> = tokio::select! {
                ev = rx.recv() => match ev {
                    None => break,
                    Some(Out::Progress { .. }) => vec![": keepalive\n\n".to_string()],
                    Some(ev) => fmt(ev),
                },
                _ = tick.tick() => vec![": keepalive\n\n".to_string()],
            };
            for f in frames {
                if btx.send(Bytes::from(f)).await.is_err() {
                    c2.cancel();
                    return;
                }
            }
            tick.reset();
        }
    });
    let body = Body::from_stream(GuardedStream { rx: brx, cancel });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(body)
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// One SSE `data:` frame.
pub fn data(v: &Value) -> String {
    format!("data: {v}\n\n")
}

fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Bearer / `x-api-key` check in constant time (per byte).
pub fn authorized(key: &str, req: &Request) -> bool {
    let h = req.headers();
    let bearer = h
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let x = h.get("x-api-key").and_then(|v| v.to_str().ok());
    [bearer, x]
        .into_iter()
        .flatten()
        .any(|k| ct_eq(k.trim().as_bytes(), key.as_bytes()))
}

async fn guard_mw(State(st): St, req: Request, next: Next) -> Response {
    let cors = st.settings.cors;
    if cors && req.method() == Method::OPTIONS {
        let mut r = StatusCode::NO_CONTENT.into_response();
        add_cors(&mut r);
        return r;
    }
    let path = req.uri().path().to_string();
    if let Some(key) = &st.settings.api_key {
        if path != "/health" && !authorized(key, &req) {
            let e = ApiError::new(StatusCode::UNAUTHORIZED, "invalid or missing API key")
                .with_code("invalid_api_key");
            let body = if path.starts_with("/v1/messages") {
                e.anthropic_json()
            } else {
                e.openai_json()
            };
            let mut r = (e.status, axum::Json(body)).into_response();
            if cors {
                add_cors(&mut r);
            }
            return r;
        }
    }
    let mut r = next.run(req).await;
    if cors {
        add_cors(&mut r);
    }
    r
}

fn add_cors(r: &mut Response) {
    let h = r.headers_mut();
    h.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, OPTIONS"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("authorization, content-type, x-api-key, anthropic-version"),
    );
}

/// The router.
pub fn router(st: Arc<AppState>, max_body: usize) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .route("/props", get(props))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/apply-template", post(apply_template))
        .route("/v1/chat/completions", post(openai::chat))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/messages", post(anthropic::messages))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(st.clone(), guard_mw))
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(st)
}

async fn not_found(req: Request) -> Response {
    let e = ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no route for {} {}", req.method(), req.uri().path()),
    );
    (e.status, axum::Json(e.openai_json())).into_response()
}

async fn health(State(st): St) -> Response {
    match st.ready() {
        Ok(_) => axum::Json(json!({"status": "ok"})).into_response(),
        Err(e) => (
            e.status,
            axum::Json(json!({"status": "loading", "error": e.openai_json()["error"]})),
        )
            .into_response(),
    }
}

async fn metrics(State(st): St) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.metrics.render(),
    )
        .into_response()
}

async fn models(State(st): St) -> Response {
    match st.ready() {
        Ok(r) => axum::Json(json!({"object": "list", "data": [{
            "id": r.name, "object": "model", "created": st.created, "owned_by": "vela",
            "meta": {"n_ctx": r.n_ctx, "path": r.model.path.display().to_string()}
        }]}))
        .into_response(),
        Err(e) => openai_err(&st.metrics, e),
    }
}

async fn props(State(st): St) -> Response {
    let r = match st.ready() {
        Ok(r) => r,
        Err(e) => return openai_err(&st.metrics, e),
    };
    let parser = ParserConfig::from_template(r.template_src.as_deref().unwrap_or(""), true);
    axum::Json(json!({
        "model": r.name,
        "aliases": r.aliases,
        "model_path": r.model.path.display().to_string(),
        "n_ctx": r.n_ctx,
        "ubatch": r.ubatch,
        "n_vocab": r.model.tokenizer.n_vocab(),
        "chat_template": r.template_src,
        "reasoning_markers": parser.reasoning,
        "tool_markers": parser.tools.iter().map(|(o, c, s)| json!([o, c, format!("{s:?}")])).collect::<Vec<_>>(),
        "llama_json_tools": parser.llama_json,
        "queue_size": st.settings.queue,
        "cache_mb": st.settings.cache_mb,
    }))
    .into_response()
}

async fn tokenize(State(st): St, body: Result<Bytes, BytesRejection>) -> Response {
    let run = || -> Result<Value, ApiError> {
        let r = st.ready()?;
        let o = parse_object(&body_bytes(body)?)?;
        let text = crate::request::get_str(&o, "content")?
            .ok_or_else(|| ApiError::bad("content", "`content` (string) is required"))?;
        let add_special = crate::request::get_bool(&o, "add_special")?.unwrap_or(false);
        let parse_special = crate::request::get_bool(&o, "parse_special")?.unwrap_or(false);
        let pieces = crate::request::get_bool(&o, "with_pieces")?.unwrap_or(false);
        let tok = &r.model.tokenizer;
        let ids = tok
            .encode(text, add_special, parse_special)
            .map_err(|e| ApiError::invalid(format!("{e:#}")))?;
        Ok(if pieces {
            let t: Vec<Value> = ids
                .iter()
                .map(|&i| json!({"id": i, "piece": String::from_utf8_lossy(&tok.token_to_piece(i, true))}))
                .collect();
            json!({"tokens": t})
        } else {
            json!({"tokens": ids})
        })
    };
    match run() {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => openai_err(&st.metrics, e),
    }
}

async fn detokenize(State(st): St, body: Result<Bytes, BytesRejection>) -> Response {
    let run = || -> Result<Value, ApiError> {
        let r = st.ready()?;
        let o = parse_object(&body_bytes(body)?)?;
        let n = r.model.tokenizer.n_vocab();
        let ids = o
            .get("tokens")
            .and_then(Value::as_array)
            .ok_or_else(|| ApiError::bad("tokens", "`tokens` must be an array of token ids"))?
            .iter()
            .map(|v| v.as_u64().filter(|&i| (i as usize) < n).map(|i| i as u32))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| {
                ApiError::bad("tokens", format!("token ids must be integers below {n}"))
            })?;
        let text = r
            .model
            .tokenizer
            .decode(&ids, false)
            .map_err(|e| ApiError::invalid(format!("{e:#}")))?;
        Ok(json!({"content": text}))
    };
    match run() {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => openai_err(&st.metrics, e),
    }
}

async fn apply_template(State(st): St, body: Result<Bytes, BytesRejection>) -> Response {
    let run = || -> Result<Value, ApiError> {
        let r = st.ready()?;
        let o = parse_object(&body_bytes(body)?)?;
        let (rendered, tokens) = openai::render_chat(r, &o)?;
        Ok(json!({"prompt": rendered, "tokens": tokens}))
    };
    match run() {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => openai_err(&st.metrics, e),
    }
}
