//! The web chat UI: static files embedded in the binary, served at `GET /` (also `/index.html`)
//! and `GET /ui/<file>`. They hold no secrets, so they answer without the API key
//! ([`is_public`]); the page itself asks for the key when the API answers 401.

use crate::error::ApiError;
use crate::http::AppState;
use axum::extract::Path;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use std::sync::Arc;

/// The page's files: name under `/ui/`, content type, text.
const FILES: &[(&str, &str, &str)] = &[
    (
        "index.html",
        "text/html; charset=utf-8",
        include_str!("ui/index.html"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("ui/style.css"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("ui/app.js"),
    ),
    (
        "markdown.js",
        "text/javascript; charset=utf-8",
        include_str!("ui/markdown.js"),
    ),
];

/// Scripts and styles only from this server, no inline code, requests only to this server.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
     connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The UI's routes (merged into the API router).
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/", get(index))
        .route("/index.html", get(index))
        .route("/ui/{file}", get(file))
}

/// Whether a request may skip the API key: a GET (or HEAD) of `/`, `/index.html` or one file
/// name under `/ui/` (unknown names then answer 404).
pub fn is_public(method: &Method, path: &str) -> bool {
    if method != Method::GET && method != Method::HEAD {
        return false;
    }
    path == "/"
        || path == "/index.html"
        || path
            .strip_prefix("/ui/")
            .is_some_and(|f| !f.is_empty() && !f.contains('/'))
}

async fn index() -> Response {
    serve("index.html")
}

async fn file(name: Result<Path<String>, axum::extract::rejection::PathRejection>) -> Response {
    match name {
        Ok(Path(n)) => serve(&n),
        Err(_) => serve(""),
    }
}

/// The named file with its type, `Cache-Control: no-cache` (a new binary's UI is picked up at
/// once) and the CSP; 404 in the API's error shape for any other name.
fn serve(name: &str) -> Response {
    let Some((_, ctype, body)) = FILES.iter().find(|(n, _, _)| *n == name) else {
        return ApiError::new(StatusCode::NOT_FOUND, format!("no UI file named '{name}'"))
            .openai_response();
    };
    let mut r = (*body).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream};

    #[test]
    fn public_paths() {
        let get = Method::GET;
        for p in ["/", "/index.html", "/ui/app.js", "/ui/x"] {
            assert!(is_public(&get, p), "{p}");
        }
        for p in [
            "/v1/models",
            "/props",
            "/metrics",
            "/ui/",
            "/ui",
            "/ui/a/b",
            "/ui/../v1/models",
            "/index.htm",
            "//",
        ] {
            assert!(!is_public(&get, p), "{p}");
        }
        assert!(!is_public(&Method::POST, "/"));
        assert!(is_public(&Method::HEAD, "/ui/style.css"));
    }

    /// `(status, headers, body)` of a GET over a real socket.
    fn get(addr: SocketAddr, path: &str, key: Option<&str>) -> (u16, String, String) {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .expect("timeout");
        let auth = key
            .map(|k| format!("Authorization: Bearer {k}\r\n"))
            .unwrap_or_default();
        let req = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n{auth}\r\n");
        s.write_all(req.as_bytes()).expect("write");
        let mut raw = String::new();
        s.read_to_string(&mut raw).expect("read");
        let (head, body) = raw.split_once("\r\n\r\n").expect("a head");
        let status = head.split(' ').nth(1).and_then(|c| c.parse().ok());
        (status.expect("a status"), head.to_lowercase(), body.into())
    }

    /// A server with `--api-key` and no model (the load fails; routing and auth still answer).
    #[test]
    fn ui_routes_skip_the_key_and_nothing_else_does() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: crate::ServeArgs,
        }
        let args = Cli::parse_from([
            "serve",
            "--port",
            "0",
            "--model",
            "/nonexistent/none.gguf",
            "--api-key",
            "k",
        ])
        .args;
        let r = crate::spawn(args).expect("spawn");
        assert!(r.wait_ready().is_err());
        let a = r.addr;

        let (st, head, body) = get(a, "/", None);
        assert_eq!(st, 200, "{head}");
        assert!(head.contains("content-type: text/html"), "{head}");
        assert!(head.contains("content-security-policy: default-src 'none'; script-src 'self'"));
        assert!(head.contains("cache-control: no-cache"), "{head}");
        assert!(body.contains("ui/app.js"), "the page loads its script");
        assert_eq!(get(a, "/index.html", None).0, 200);

        let (st, head, body) = get(a, "/ui/app.js", None);
        assert_eq!(st, 200, "{head}");
        assert!(head.contains("content-type: text/javascript"), "{head}");
        assert_eq!(body.len(), include_str!("ui/app.js").len());
        let (st, head, _) = get(a, "/ui/style.css", None);
        assert!(
            st == 200 && head.contains("content-type: text/css"),
            "{head}"
        );
        let (st, head, _) = get(a, "/ui/markdown.js", None);
        assert!(st == 200 && head.contains("text/javascript"), "{head}");

        let (st, _, body) = get(a, "/ui/x", None);
        assert_eq!(st, 404, "{body}");
        assert!(body.contains("\"error\""), "{body}");
        assert_eq!(get(a, "/ui/x", Some("k")).0, 404);

        // The API still needs the key.
        assert_eq!(get(a, "/v1/models", None).0, 401);
        assert_eq!(get(a, "/props", None).0, 401);
        assert_eq!(get(a, "/metrics", None).0, 401);
        assert_eq!(get(a, "/ui/../v1/models", None).0, 401);
        assert_eq!(get(a, "/v1/models", Some("wrong")).0, 401);
        assert_eq!(
            get(a, "/v1/models", Some("k")).0,
            503,
            "past auth: no model"
        );
    }
}
