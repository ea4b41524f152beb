//! Helpers of the HTTP tests: servers in-process (without a model, or SmolLM2 when present),
//! a small HTTP/1.1 client, the JSON access log captured for the whole test binary.

#![allow(dead_code)]

use clap::Parser;
pub use serde_json::{json, Value};
pub use std::io::{Read, Write};
pub use std::net::{SocketAddr, TcpStream};
pub use std::sync::OnceLock;
pub use std::time::{Duration, Instant};
pub use vela_formats::testdata;
use vela_server::access::{subscriber, LogFormat};

#[derive(Parser)]
pub struct Cli {
    #[command(flatten)]
    args: vela_server::ServeArgs,
}

pub fn args(extra: &[&str]) -> vela_server::ServeArgs {
    let mut argv = vec!["serve", "--port", "0", "--threads", "2"];
    argv.extend_from_slice(extra);
    Cli::parse_from(argv).args
}

// ---- the access log: a JSON subscriber into a buffer, for the whole test binary ----

pub type Buf = vela_server::access::LogCapture;

pub fn log() -> &'static Buf {
    static LOG: OnceLock<Buf> = OnceLock::new();
    LOG.get_or_init(|| {
        let b = Buf::default();
        tracing::subscriber::set_global_default(subscriber(LogFormat::Json, b.clone()))
            .expect("no other subscriber");
        b
    })
}

/// The logged JSON objects matching `f`, waiting up to 10 s for at least one.
pub fn log_lines(f: impl Fn(&Value) -> bool) -> Vec<Value> {
    let t0 = Instant::now();
    loop {
        let text = String::from_utf8(log().0.lock().unwrap().clone()).unwrap();
        let found: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).expect("every log line is JSON"))
            .filter(|v| f(v))
            .collect();
        if !found.is_empty() || t0.elapsed() > Duration::from_secs(10) {
            return found;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The access line of the request made from `client`.
pub fn access_line(client: SocketAddr) -> Value {
    let c = client.to_string();
    let l = log_lines(|v| v["target"] == "vela_server::access" && v["client"] == c.as_str());
    assert_eq!(l.len(), 1, "one access line for {c}: {l:?}");
    l[0].clone()
}

// ---- servers ----

/// A server whose model cannot load (routing, CORS, errors): `--api-key k --cors`.
pub fn no_model() -> SocketAddr {
    static S: OnceLock<SocketAddr> = OnceLock::new();
    *S.get_or_init(|| {
        log();
        let r = vela_server::spawn(args(&[
            "--model",
            "/nonexistent/none.gguf",
            "--api-key",
            "k",
            "--cors",
        ]))
        .unwrap();
        assert!(r.wait_ready().is_err());
        let a = r.addr;
        std::mem::forget(r);
        a
    })
}

pub fn start_smol(extra: &[&str]) -> Option<SocketAddr> {
    log();
    let m = testdata::model(testdata::SMOLLM2)?;
    let mut a = vec!["--model", m.to_str().unwrap(), "--ctx", "256"];
    a.extend_from_slice(extra);
    let r = vela_server::spawn(args(&a)).unwrap();
    r.wait_ready().unwrap();
    let addr = r.addr;
    std::mem::forget(r);
    Some(addr)
}

/// SmolLM2 with a 256-token context, served as `my-model`.
pub fn smol() -> Option<SocketAddr> {
    static S: OnceLock<Option<SocketAddr>> = OnceLock::new();
    *S.get_or_init(|| start_smol(&["--alias", "my-model"]))
}

// ---- a small HTTP/1.1 client ----

pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
    /// The client's address (the access log's `client`).
    pub local: SocketAddr,
}

impl Resp {
    pub fn header(&self, k: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(k))
            .map(|(_, v)| v.as_str())
    }
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
    /// The `data:` payloads of an SSE body, `[DONE]` included.
    pub fn events(&self) -> Vec<String> {
        self.body
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }
}

pub fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> TcpStream {
    send_body(addr, method, path, headers, None)
}

pub fn send_body(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    if !body.is_empty() {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(&body);
    s.write_all(req.as_bytes()).unwrap();
    s
}

pub fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(i) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let n = usize::from_str_radix(std::str::from_utf8(&b[..i]).unwrap().trim(), 16).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&b[i + 2..i + 2 + n]);
        b = &b[i + 2 + n + 2..];
    }
}

/// Read a whole response (the server closes the connection after it).
pub fn read(mut s: TcpStream) -> Resp {
    let local = s.local_addr().unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a complete head");
    let head = String::from_utf8(raw[..end].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = raw[end + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    if chunked {
        body = dechunk(&body);
    }
    Resp {
        status,
        headers,
        body: String::from_utf8(body).unwrap(),
        local,
    }
}

pub fn get(addr: SocketAddr, path: &str) -> Resp {
    read(send(addr, "GET", path, &[]))
}

pub fn post(addr: SocketAddr, path: &str, body: Value) -> Resp {
    read(send_body(addr, "POST", path, &[], Some(&body)))
}

pub const KEY: (&str, &str) = ("Authorization", "Bearer k");

pub fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

/// Read a response head only (a stream keeps running).
pub fn head(s: &mut TcpStream) -> (u16, String) {
    let mut h = Vec::new();
    let mut b = [0u8; 1];
    while !h.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b).unwrap();
        h.push(b[0]);
    }
    let h = String::from_utf8(h).unwrap();
    (h.split(' ').nth(1).unwrap().parse().unwrap(), h)
}

/// A counter or gauge of `/metrics`.
pub fn metric(a: SocketAddr, name: &str) -> f64 {
    let body = get(a, "/metrics").body;
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no metric {name}"))
}
