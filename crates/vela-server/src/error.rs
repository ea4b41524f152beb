//! API errors: one type, rendered in the OpenAI shape (`{"error":{message,type,param,code}}`) or
//! the Anthropic shape (`{"type":"error","error":{type,message}}`) with the right HTTP status.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// An error answered to a client.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The offending request field, if one.
    pub param: Option<String>,
    /// A machine-readable code (`model_not_found`, `context_length_exceeded`, ...).
    pub code: Option<&'static str>,
    /// Seconds a client should wait before retrying (`Retry-After`).
    pub retry_after: Option<u32>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            param: None,
            code: None,
            retry_after: None,
        }
    }
    /// 400 for a client mistake, naming the field.
    pub fn bad(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: Some(param.to_string()),
            code: None,
            retry_after: None,
        }
    }
    /// 400 without a field.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }
    pub fn with_retry_after(mut self, secs: u32) -> Self {
        self.retry_after = Some(secs);
        self
    }

    /// The OpenAI error `type` for the status.
    pub fn openai_type(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            400 | 405 | 413 | 422 => "invalid_request_error",
            429 => "rate_limit_error",
            503 => "server_overloaded",
            _ => "server_error",
        }
    }

    /// The Anthropic error `type` for the status.
    pub fn anthropic_type(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            400 | 405 | 422 => "invalid_request_error",
            _ => "api_error",
        }
    }

    pub fn openai_json(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.openai_type(),
            "param": self.param,
            "code": self.code,
        }})
    }

    pub fn anthropic_json(&self) -> Value {
        json!({"type": "error", "error": {"type": self.anthropic_type(), "message": self.message}})
    }

    /// The response in the OpenAI shape (with `Retry-After` when set); the message travels in
    /// the response's extensions for the access log.
    pub fn openai_response(&self) -> Response {
        self.response(self.openai_json())
    }

    /// The response in the Anthropic shape.
    pub fn anthropic_response(&self) -> Response {
        self.response(self.anthropic_json())
    }

    /// The response in the shape of the API `path` belongs to (`/v1/messages`: Anthropic).
    pub fn response_for(&self, path: &str) -> Response {
        if path.starts_with("/v1/messages") {
            self.anthropic_response()
        } else {
            self.openai_response()
        }
    }

    fn response(&self, body: Value) -> Response {
        let mut r = (self.status, axum::Json(body)).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r.extensions_mut()
            .insert(crate::access::ErrorNote(self.message.clone()));
        r
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_and_anthropic_shapes() {
        let e = ApiError::bad("max_tokens", "max_tokens must be ≥ 1").with_code("invalid_value");
        let o = e.openai_json();
        assert_eq!(o["error"]["type"], "invalid_request_error");
        assert_eq!(o["error"]["param"], "max_tokens");
        assert_eq!(o["error"]["code"], "invalid_value");
        assert_eq!(o["error"]["message"], "max_tokens must be ≥ 1");
        let a = ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too big").anthropic_json();
        assert_eq!(a["type"], "error");
        assert_eq!(a["error"]["type"], "request_too_large");
        let n = ApiError::new(StatusCode::NOT_FOUND, "no").openai_json();
        assert_eq!(n["error"]["type"], "not_found_error");
        assert!(n["error"]["param"].is_null());
    }

    #[test]
    fn retry_after_header() {
        let e = ApiError::new(StatusCode::TOO_MANY_REQUESTS, "full").with_retry_after(1);
        for r in [e.openai_response(), e.anthropic_response()] {
            assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        }
        let r = ApiError::invalid("x").openai_response();
        assert!(r.headers().get(header::RETRY_AFTER).is_none());
    }
}
