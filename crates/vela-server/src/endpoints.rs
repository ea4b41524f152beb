//! The router (the web UI's routes are in `ui.rs`) and the utility endpoints: health, props,
//! metrics, models, tokenize, detokenize, apply-template, and the JSON answers for unknown routes
//! and wrong methods.

use crate::error::ApiError;
use crate::http::{body_bytes, guard_mw, openai_err, AppState, St};
use crate::parser::ParserConfig;
use crate::request::parse_object;
use crate::{access, anthropic, openai, responses};
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use std::sync::Arc;

/// The router.
pub fn router(st: Arc<AppState>, max_body: usize) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .route("/props", get(props))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/apply-template", post(apply_template))
        .route("/v1/chat/completions", post(openai::chat))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/responses", post(responses::responses))
        .merge(crate::ui::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(st.clone(), guard_mw))
        .layer(DefaultBodyLimit::max(max_body))
        .layer(middleware::from_fn(access::middleware))
        .with_state(st)
}

async fn not_found(req: Request) -> Response {
    let path = req.uri().path();
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no route for {} {path}", req.method()),
    )
    .response_for(path)
}

/// A known route asked with a method it does not answer (axum adds `Allow`).
async fn method_not_allowed(req: Request) -> Response {
    let path = req.uri().path();
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} is not allowed on {path}", req.method()),
    )
    .with_code("method_not_allowed")
    .response_for(path)
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

/// The model object of `/v1/models` and `/v1/models/{id}`.
fn model_json(st: &AppState, r: &crate::http::Ready) -> Value {
    json!({
        "id": r.name, "object": "model", "created": st.created, "owned_by": "vela",
        "meta": {"n_ctx": r.n_ctx, "path": r.model.path.display().to_string(), "aliases": r.aliases}
    })
}

async fn models(State(st): St) -> Response {
    match st.ready() {
        Ok(r) => {
            axum::Json(json!({"object": "list", "data": [model_json(&st, r)]})).into_response()
        }
        Err(e) => openai_err(&st.metrics, e),
    }
}

/// `GET /v1/models/{id}`: the model object for its id or an alias, else 404.
async fn model(State(st): St, id: Result<Path<String>, PathRejection>) -> Response {
    let run = || -> Result<Value, ApiError> {
        let r = st.ready()?;
        let Path(id) = id.map_err(|e| ApiError::invalid(e.body_text()))?;
        if !r.serves(&id) {
            return Err(r.not_found(&id));
        }
        Ok(model_json(&st, r))
    };
    match run() {
        Ok(v) => axum::Json(v).into_response(),
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
