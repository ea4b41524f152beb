//! The access log: one line per request through `tracing` (method, route, status, client, token
//! counts, total time, time to first token of a stream), and the subscriber behind
//! `--log-format text|json`.

use crate::worker::Usage;
use axum::body::{Body, BodyDataStream, Bytes};
use axum::extract::{ConnectInfo, MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;
use tracing_subscriber::fmt::MakeWriter;

/// How server messages (the access log included) are written to stderr.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// `TIMESTAMP LEVEL target: message key=value ...`
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `message`, the fields, `target`).
    Json,
}

/// A subscriber writing INFO and above in `format` to `writer`.
pub fn subscriber<W>(format: LogFormat, writer: W) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let b = tracing_subscriber::fmt()
        .with_writer(writer)
        .with_max_level(tracing::Level::INFO);
    match format {
        LogFormat::Text => Box::new(b.finish()),
        LogFormat::Json => Box::new(
            b.json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false)
                .finish(),
        ),
    }
}

/// Install the stderr subscriber for the process (kept if one is already installed).
pub fn init(format: LogFormat) {
    let _ = tracing::subscriber::set_global_default(subscriber(format, std::io::stderr));
}

/// What the handlers tell the log about a request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AccessInfo {
    pub prompt_tokens: Option<usize>,
    pub completion_tokens: Option<usize>,
    pub cached_tokens: Option<usize>,
    pub ttft_ms: Option<f64>,
    pub error: Option<String>,
}

impl AccessInfo {
    /// Add a finished generation's counts (a batch adds one per prompt); `ttft`: also keep its
    /// time to first token (the earliest of a batch).
    pub fn add_usage(&mut self, u: &Usage, ttft: bool) {
        let add = |a: &mut Option<usize>, b: usize| *a = Some(a.unwrap_or(0) + b);
        add(&mut self.prompt_tokens, u.prompt_tokens);
        add(&mut self.completion_tokens, u.completion_tokens);
        add(&mut self.cached_tokens, u.cached_tokens);
        let t = u.timings.ttft_ms;
        if ttft && t > 0.0 && self.ttft_ms.is_none_or(|x| t < x) {
            self.ttft_ms = Some(t);
        }
    }
}

/// Response extension: the message of an error response.
#[derive(Clone)]
pub struct ErrorNote(pub String);

/// Response extension: what a whole (non-streamed) response knows.
#[derive(Clone)]
pub struct InfoNote(pub AccessInfo);

/// Response extension of a stream: filled while it runs, logged when its body ends.
#[derive(Clone, Default)]
pub struct StreamNote(pub Arc<Mutex<AccessInfo>>);

/// The request side of a log line.
struct Line {
    method: String,
    route: String,
    client: Option<SocketAddr>,
    start: Instant,
    status: u16,
}

/// Emit the access event at a constant level (tracing callsites need one).
macro_rules! access_event {
    ($lvl:expr, $l:expr, $i:expr, $gone:expr) => {
        tracing::event!(
            target: "vela_server::access",
            $lvl,
            method = %$l.method,
            route = %$l.route,
            status = $l.status,
            client = $l.client.map(|c| c.to_string()).as_deref(),
            prompt_tokens = $i.prompt_tokens,
            completion_tokens = $i.completion_tokens,
            cached_tokens = $i.cached_tokens,
            total_ms = round1($l.start.elapsed().as_secs_f64() * 1e3),
            ttft_ms = $i.ttft_ms.map(round1),
            error = $i.error.as_deref(),
            disconnected = $gone.then_some(true),
            "request"
        )
    };
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

impl Line {
    /// `gone`: the body was dropped before its end (client disconnected).
    fn emit(&self, i: &AccessInfo, gone: bool) {
        // Health probes (load balancers, scripts polling for readiness) only at DEBUG, as
        // llama-server leaves them out of its log.
        if self.route == "/health" || self.route == "/v1/health" {
            access_event!(tracing::Level::DEBUG, self, i, gone);
        } else {
            access_event!(tracing::Level::INFO, self, i, gone);
        }
    }
}

/// Middleware: log every request once its response (a stream: its body) is complete.
pub async fn middleware(req: Request, next: Next) -> Response {
    let route = match req.extensions().get::<MatchedPath>() {
        Some(m) => m.as_str().to_string(),
        None => req.uri().path().chars().take(200).collect(),
    };
    let mut line = Line {
        method: req.method().to_string(),
        route,
        client: req
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0),
        start: Instant::now(),
        status: 0,
    };
    let mut resp = next.run(req).await;
    line.status = resp.status().as_u16();
    let ext = resp.extensions_mut();
    let mut info = ext.remove::<InfoNote>().map(|n| n.0).unwrap_or_default();
    if let Some(ErrorNote(m)) = ext.remove::<ErrorNote>() {
        info.error = Some(m);
    }
    if let Some(StreamNote(slot)) = ext.remove::<StreamNote>() {
        let (parts, body) = resp.into_parts();
        let body = Logged {
            inner: body.into_data_stream(),
            pending: Some((line, slot)),
        };
        return Response::from_parts(parts, Body::from_stream(body));
    }
    line.emit(&info, false);
    resp
}

/// A streamed body that logs its request when it ends or is dropped.
struct Logged {
    inner: BodyDataStream,
    pending: Option<(Line, Arc<Mutex<AccessInfo>>)>,
}

impl Logged {
    fn emit(&mut self, gone: bool) {
        if let Some((line, slot)) = self.pending.take() {
            let info = slot.lock().map(|i| i.clone()).unwrap_or_default();
            line.emit(&info, gone);
        }
    }
}

impl tokio_stream::Stream for Logged {
    type Item = Result<Bytes, axum::Error>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let r = Pin::new(&mut self.inner).poll_next(cx);
        if let Poll::Ready(None) = r {
            self.emit(false);
        }
        r
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        self.emit(true);
    }
}

/// A log destination in memory (a `MakeWriter` into a shared buffer), for tests of the log.
#[derive(Clone, Default)]
pub struct LogCapture(pub Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogCapture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for LogCapture {
    type Writer = LogCapture;
    fn make_writer(&'a self) -> LogCapture {
        self.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Buf = LogCapture;

    fn line(route: &str) -> Line {
        Line {
            method: "POST".into(),
            route: route.into(),
            client: Some("127.0.0.1:5555".parse().unwrap()),
            start: Instant::now(),
            status: 200,
        }
    }

    fn logged(format: LogFormat, f: impl FnOnce()) -> String {
        let buf = Buf::default();
        tracing::subscriber::with_default(subscriber(format, buf.clone()), f);
        let v = buf.0.lock().unwrap().clone();
        String::from_utf8(v).unwrap()
    }

    fn info() -> AccessInfo {
        let mut i = AccessInfo::default();
        let mut u = Usage {
            prompt_tokens: 12,
            completion_tokens: 5,
            cached_tokens: 3,
            ..Usage::default()
        };
        u.timings.ttft_ms = 42.26;
        i.add_usage(&u, true);
        i
    }

    #[test]
    fn json_line_has_the_fields() {
        let out = logged(LogFormat::Json, || {
            line("/v1/chat/completions").emit(&info(), false)
        });
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 1, "{out}");
        let v: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["target"], "vela_server::access");
        assert_eq!(v["method"], "POST");
        assert_eq!(v["route"], "/v1/chat/completions");
        assert_eq!(v["status"], 200);
        assert_eq!(v["client"], "127.0.0.1:5555");
        assert_eq!(
            (v["prompt_tokens"].as_u64(), v["completion_tokens"].as_u64()),
            (Some(12), Some(5))
        );
        assert_eq!(v["cached_tokens"], 3);
        assert_eq!(v["ttft_ms"], 42.3);
        assert!(v["total_ms"].as_f64().is_some());
        assert!(v["timestamp"].as_str().is_some_and(|t| t.len() >= 20));
        assert!(v.get("error").is_none() && v.get("disconnected").is_none());
    }

    #[test]
    fn text_line_and_health_at_debug() {
        let out = logged(LogFormat::Text, || {
            let i = AccessInfo {
                error: Some("bad thing".into()),
                ..AccessInfo::default()
            };
            line("/v1/completions").emit(&i, true);
            line("/health").emit(&AccessInfo::default(), false);
        });
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 1, "{out}");
        let l = lines[0];
        for want in [
            " INFO vela_server::access: request",
            "method=POST",
            "route=/v1/completions",
            "status=200",
            "error=\"bad thing\"",
            "disconnected=true",
            "total_ms=",
        ] {
            assert!(l.contains(want), "{want} missing in {l}");
        }
        assert!(!l.contains("prompt_tokens"), "{l}");
    }

    #[test]
    fn batch_usage_adds_up() {
        let mut i = info();
        let mut u = Usage {
            prompt_tokens: 1,
            completion_tokens: 2,
            ..Usage::default()
        };
        u.timings.ttft_ms = 10.0;
        i.add_usage(&u, true);
        assert_eq!(
            (i.prompt_tokens, i.completion_tokens, i.cached_tokens),
            (Some(13), Some(7), Some(3))
        );
        assert_eq!(i.ttft_ms, Some(10.0));
    }
}
