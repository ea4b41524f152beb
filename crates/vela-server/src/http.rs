//! HTTP plumbing: shared state, auth/CORS middleware, job submission (context and queue
//! checks) and SSE streaming with keepalives and disconnect detection. The router and the
//! utility endpoints are in `endpoints.rs`.

use crate::access::{AccessInfo, InfoNote, StreamNote};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::parser::ParserConfig;
use crate::request::{GenParams, Obj};
use crate::worker::{CancelToken, Job, Out, TokenLogprob, Usage};
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use vela_engine::grammar::{Constraint, GrammarCompiler};
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
    /// The vocabulary's grammar compiler, built by the first constrained request.
    pub grammar: OnceLock<Result<Arc<GrammarCompiler>, String>>,
}

impl Ready {
    /// The grammar compiler of the model's vocabulary (built once).
    pub fn grammar(&self) -> Result<&GrammarCompiler, String> {
        let g = self.grammar.get_or_init(|| {
            GrammarCompiler::new(&self.model.tokenizer)
                .map(Arc::new)
                .map_err(|e| format!("{e:#}"))
        });
        g.as_deref().map_err(Clone::clone)
    }
}

/// Server settings used by handlers.
pub struct Settings {
    pub api_key: Option<String>,
    pub cors: bool,
    pub queue: usize,
    pub cache_mb: usize,
    /// `--max-tokens`: the output limit of requests that set none.
    pub max_tokens: Option<usize>,
}

/// Shared state of all handlers.
pub struct AppState {
    pub ready: OnceLock<Ready>,
    pub load_error: Mutex<Option<String>>,
    pub metrics: Arc<Metrics>,
    pub settings: Settings,
    pub created: u64,
    /// Set at shutdown: the engine worker saves what it must and ends.
    pub stopping: Arc<std::sync::atomic::AtomicBool>,
    /// Signalled by the engine worker when it has ended (its saves written).
    pub engine_done: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

pub type St = State<Arc<AppState>>;

impl AppState {
    pub fn ready(&self) -> Result<&Ready, ApiError> {
        self.ready.get().ok_or_else(|| {
            let msg = match self.load_error.lock().ok().and_then(|e| e.clone()) {
                Some(e) => format!("model failed to load: {e}"),
                None => {
                    return ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the model is still loading",
                    )
                    .with_retry_after(1)
                }
            };
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, msg)
        })
    }
}

/// A response in the OpenAI error shape.
pub fn openai_err(m: &Metrics, e: ApiError) -> Response {
    m.request_errors.fetch_add(1, Ordering::Relaxed);
    e.openai_response()
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

impl Ready {
    /// Whether `m` names the served model (its id or an alias, case-insensitive).
    pub fn serves(&self, m: &str) -> bool {
        m.eq_ignore_ascii_case(&self.name) || self.aliases.iter().any(|a| a.eq_ignore_ascii_case(m))
    }

    /// The 404 for a model this server does not serve.
    pub fn not_found(&self, m: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("model '{m}' not found; this server serves '{}'", self.name),
        )
        .with_code("model_not_found")
    }
}

/// Check the `model` field against the loaded model.
pub fn check_model(o: &Obj, r: &Ready) -> Result<(), ApiError> {
    match o.get("model") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(m)) if m.is_empty() || r.serves(m) => Ok(()),
        Some(Value::String(m)) => Err(r.not_found(m)),
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
    /// The request field the prompt came from (`messages`, `prompt`), for errors.
    pub field: &'static str,
    /// Tokens to generate when the request gives no `max_tokens` (`None`: up to the context).
    pub default_max_tokens: Option<usize>,
    /// Structured output: the grammar decoding must follow.
    pub constraint: Option<Constraint>,
}

/// The tokens a job may generate: `max_tokens` when the prompt and it fit the context of `n_ctx`
/// tokens; without `max_tokens`, `default` or the rest of the context. Otherwise the 400 vLLM
/// and OpenAI answer (`context_length_exceeded`, the numbers in the message).
pub fn fit_context(
    n_prompt: usize,
    max_tokens: Option<usize>,
    default: Option<usize>,
    n_ctx: usize,
    field: &str,
) -> Result<usize, ApiError> {
    let err = |m: String| Err(ApiError::bad(field, m).with_code("context_length_exceeded"));
    match max_tokens {
        Some(m) if n_prompt + m > n_ctx => err(format!(
            "This model's maximum context length is {n_ctx} tokens. However, you requested {} \
             tokens ({n_prompt} in the {field}, {m} in the completion). Please reduce the \
             length of the {field} or completion.",
            n_prompt + m
        )),
        _ if n_prompt >= n_ctx => err(format!(
            "This model's maximum context length is {n_ctx} tokens. However, your {field} \
             resulted in {n_prompt} tokens, which leaves no room for the completion. Please \
             reduce the length of the {field}."
        )),
        Some(m) => Ok(m),
        None => {
            let room = n_ctx - n_prompt;
            Ok(default.map_or(room, |d| d.min(room)))
        }
    }
}

/// A queued job: its output and cancel token.
pub type Queued = (mpsc::UnboundedReceiver<Out>, Arc<CancelToken>);

/// Queue one job. Errors: prompt (plus `max_tokens`) over the context (400), queue full (429).
pub fn submit(
    st: &AppState,
    r: &Ready,
    p: Prepared,
    received: Instant,
) -> Result<Queued, ApiError> {
    let mut q = submit_many(st, r, vec![p], received)?;
    q.pop()
        .ok_or_else(|| ApiError::internal("no job was queued"))
}

/// Queue the prepared jobs of an OpenAI request (`prepared`: its validation's result, the jobs
/// and what the answer needs besides), or the error response.
pub fn submit_openai<T>(
    st: &AppState,
    prepared: Result<(Vec<Prepared>, T), ApiError>,
    received: Instant,
) -> Result<(Vec<Queued>, T), Box<Response>> {
    let queued = prepared.and_then(|(ps, extra)| {
        let r = st.ready().map_err(|_| ApiError::internal("not ready"))?;
        Ok((submit_many(st, r, ps, received)?, extra))
    });
    queued.map_err(|e| Box::new(openai_err(&st.metrics, e)))
}

/// Queue the jobs of one request, all or none (a batch of prompts runs in order).
pub fn submit_many(
    st: &AppState,
    r: &Ready,
    ps: Vec<Prepared>,
    received: Instant,
) -> Result<Vec<Queued>, ApiError> {
    st.metrics.requests.fetch_add(1, Ordering::Relaxed);
    if ps.len() > st.settings.queue {
        return Err(ApiError::bad(
            "prompt",
            format!(
                "{} prompts in one request, but at most {} can queue (--queue)",
                ps.len(),
                st.settings.queue
            ),
        ));
    }
    let batch = ps.len() > 1;
    let mut jobs = Vec::with_capacity(ps.len());
    let mut out = Vec::with_capacity(ps.len());
    for (i, p) in ps.into_iter().enumerate() {
        let at = |e: ApiError| match batch {
            true => ApiError {
                message: format!("{}[{i}]: {}", p.field, e.message),
                ..e
            },
            false => e,
        };
        if p.prompt.is_empty() {
            return Err(at(ApiError::bad(p.field, "the prompt is empty")));
        }
        let max_tokens = fit_context(
            p.prompt.len(),
            p.params.max_tokens,
            st.settings.max_tokens.or(p.default_max_tokens),
            r.n_ctx,
            p.field,
        )
        .map_err(at)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let cancel = CancelToken::new();
        let free = p.constraint.is_none();
        jobs.push(Job {
            prompt: p.prompt,
            sampling: p.params.sampling,
            max_tokens,
            stop: p.params.stop,
            logprobs: p.params.logprobs,
            parser: p.parser,
            constraint: p.constraint,
            cancel: cancel.clone(),
            out: tx,
            received,
            requeued: false,
            // (A grammar decides where its output ends.)
            ignore_eos: p.params.ignore_eos && free,
        });
        out.push((rx, cancel));
    }
    let Ok(permits) = r.jobs.try_reserve_many(jobs.len()) else {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "the request queue is full ({} waiting); retry shortly",
                st.settings.queue
            ),
        )
        .with_code("queue_full")
        .with_retry_after(1));
    };
    st.metrics
        .queue_depth
        .fetch_add(jobs.len() as u64, Ordering::Relaxed);
    for (permit, job) in permits.zip(jobs) {
        permit.send(job);
    }
    Ok(out)
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
                return Err(e);
            }
        }
    }
    guard.1 = false;
    Err(ApiError::internal("the engine dropped the request"))
}

/// Body stream that cancels the jobs when hyper drops it (client gone or write error).
struct GuardedStream {
    rx: mpsc::Receiver<Bytes>,
    cancel: Vec<Arc<CancelToken>>,
}

impl tokio_stream::Stream for GuardedStream {
    type Item = Result<Bytes, std::convert::Infallible>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx).map(|o| o.map(Ok))
    }
}

impl Drop for GuardedStream {
    fn drop(&mut self) {
        self.cancel.iter().for_each(|c| c.cancel());
    }
}

/// The OpenAI streams' keepalive: an SSE comment.
pub const KEEPALIVE_COMMENT: &str = ": keepalive\n\n";

/// Stream a job as SSE: `first` at once (before the prompt is in), then `fmt` turns each engine
/// event into frames; `keepalive` is sent after every prefill chunk and every 5 s of silence. A
/// failed write cancels the job.
pub fn sse_response(
    rx: mpsc::UnboundedReceiver<Out>,
    cancel: Arc<CancelToken>,
    first: Vec<String>,
    keepalive: &'static str,
    mut fmt: impl FnMut(Out) -> Vec<String> + Send + 'static,
) -> Response {
    sse_response_many(vec![(rx, cancel)], first, keepalive, move |_, ev| fmt(ev))
}

/// Stream the jobs of one request as SSE, one after the other (the worker runs them in that
/// order); `fmt` gets each job's index with its events. Its token counts and time to first token
/// go to the access log ([`StreamNote`]).
pub fn sse_response_many(
    jobs: Vec<Queued>,
    first: Vec<String>,
    keepalive: &'static str,
    mut fmt: impl FnMut(usize, Out) -> Vec<String> + Send + 'static,
) -> Response {
    let (btx, brx) = mpsc::channel::<Bytes>(64);
    let cancel: Vec<_> = jobs.iter().map(|j| j.1.clone()).collect();
    let c2 = cancel.clone();
    let note = StreamNote::default();
    let slot = note.0.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        for f in first {
            if btx.send(Bytes::from(f)).await.is_err() {
                c2.iter().for_each(|c| c.cancel());
                return;
            }
        }
        for (i, (mut rx, _)) in jobs.into_iter().enumerate() {
            loop {
                let frames: Vec<String> = tokio::select! {
                    ev = rx.recv() => match ev {
                        None => break,
                        Some(Out::Progress { .. }) => vec![keepalive.to_string()],
                        Some(ev) => {
                            if let Ok(mut s) = slot.lock() {
                                match &ev {
                                    Out::Done { usage, .. } => s.add_usage(usage, true),
                                    Out::Error(e) => s.error = Some(e.message.clone()),
                                    _ => {}
                                }
                            }
                            fmt(i, ev)
                        }
                    },
                    _ = tick.tick() => vec![keepalive.to_string()],
                };
                for f in frames {
                    if btx.send(Bytes::from(f)).await.is_err() {
                        c2.iter().for_each(|c| c.cancel());
                        return;
                    }
                }
                tick.reset();
            }
        }
    });
    let body = Body::from_stream(GuardedStream { rx: brx, cancel });
    let mut r = Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(body)
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response());
    r.extensions_mut().insert(note);
    r
}

/// A whole JSON response with the counts of its generations for the access log.
pub fn json_with_usage<'a>(v: Value, usage: impl IntoIterator<Item = &'a Usage>) -> Response {
    let mut info = AccessInfo::default();
    usage.into_iter().for_each(|u| info.add_usage(u, false));
    let mut r = axum::Json(v).into_response();
    r.extensions_mut().insert(InfoNote(info));
    r
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

/// Auth and CORS in front of every route.
pub async fn guard_mw(State(st): St, req: Request, next: Next) -> Response {
    let cors = st.settings.cors;
    if cors && req.method() == Method::OPTIONS {
        return preflight(&req);
    }
    let path = req.uri().path().to_string();
    // `/health` and the web UI's static files (no secrets in them) answer without the key.
    let public = path == "/health" || crate::ui::is_public(req.method(), &path);
    if let Some(key) = &st.settings.api_key {
        if !public && !authorized(key, &req) {
            let e = ApiError::new(StatusCode::UNAUTHORIZED, "invalid or missing API key")
                .with_code("invalid_api_key");
            let mut r = e.response_for(&path);
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

/// Headers allowed when a preflight names none (what the official SDKs send, less the
/// `x-stainless-*` family, which a preflight always names).
const CORS_HEADERS: &str = "authorization, content-type, x-api-key, anthropic-version, \
     anthropic-beta, anthropic-dangerous-direct-browser-access";

/// Answer a CORS preflight: the methods, and whatever headers the browser asked for (the SDKs
/// send `x-stainless-*` headers; a fixed list cannot name them all, and `*` does not cover
/// `Authorization`).
fn preflight(req: &Request) -> Response {
    let mut r = StatusCode::NO_CONTENT.into_response();
    add_cors(&mut r);
    let h = r.headers_mut();
    let asked = req
        .headers()
        .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
        .filter(|v| !v.is_empty());
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        asked
            .cloned()
            .unwrap_or(HeaderValue::from_static(CORS_HEADERS)),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, OPTIONS"),
    );
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("86400"),
    );
    h.insert(
        header::VARY,
        HeaderValue::from_static("Access-Control-Request-Headers"),
    );
    r
}

fn add_cors(r: &mut Response) {
    let h = r.headers_mut();
    h.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    // Readable by browser code: the SDKs read `retry-after` to back off.
    h.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static("retry-after"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_fit() {
        // max_tokens given: prompt + max_tokens must fit.
        assert_eq!(fit_context(100, Some(28), None, 128, "messages"), Ok(28));
        let e = fit_context(100, Some(29), None, 128, "messages").unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.openai_type(), "invalid_request_error");
        assert_eq!(e.code, Some("context_length_exceeded"));
        assert_eq!(
            e.message,
            "This model's maximum context length is 128 tokens. However, you requested 129 \
             tokens (100 in the messages, 29 in the completion). Please reduce the length of the \
             messages or completion."
        );
        // Without max_tokens the prompt alone must leave room; the rest of the context, or the
        // default, is generated.
        assert_eq!(fit_context(100, None, None, 128, "messages"), Ok(28));
        assert_eq!(fit_context(100, None, Some(16), 128, "prompt"), Ok(16));
        assert_eq!(fit_context(120, None, Some(16), 128, "prompt"), Ok(8));
        let e = fit_context(128, None, Some(16), 128, "prompt").unwrap_err();
        assert!(
            e.message.contains("maximum context length is 128 tokens")
                && e.message.contains("128 tokens"),
            "{}",
            e.message
        );
        assert_eq!(e.param.as_deref(), Some("prompt"));
    }
}
