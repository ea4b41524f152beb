//! The HTTP API in-process over real sockets. Without a model (its load fails, the routes still
//! answer): 405/404 bodies, CORS preflights, the JSON access log, the shutdown message. With
//! SmolLM2 (skipped when missing, required in CI: `vela_formats::testdata`): the context check,
//! batch completions, model ids and `--alias`, template kwargs, 429 with `Retry-After`, and the
//! access log's token counts and time to first token.

use clap::Parser;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use vela_formats::testdata;
use vela_server::access::{subscriber, LogFormat};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: vela_server::ServeArgs,
}

fn args(extra: &[&str]) -> vela_server::ServeArgs {
    let mut argv = vec!["serve", "--port", "0", "--threads", "2"];
    argv.extend_from_slice(extra);
    Cli::parse_from(argv).args
}

// ---- the access log: a JSON subscriber into a buffer, for the whole test binary ----

type Buf = vela_server::access::LogCapture;

fn log() -> &'static Buf {
    static LOG: OnceLock<Buf> = OnceLock::new();
    LOG.get_or_init(|| {
        let b = Buf::default();
        tracing::subscriber::set_global_default(subscriber(LogFormat::Json, b.clone()))
            .expect("no other subscriber");
        b
    })
}

/// The logged JSON objects matching `f`, waiting up to 10 s for at least one.
fn log_lines(f: impl Fn(&Value) -> bool) -> Vec<Value> {
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
fn access_line(client: SocketAddr) -> Value {
    let c = client.to_string();
    let l = log_lines(|v| v["target"] == "vela_server::access" && v["client"] == c.as_str());
    assert_eq!(l.len(), 1, "one access line for {c}: {l:?}");
    l[0].clone()
}

// ---- servers ----

/// A server whose model cannot load (routing, CORS, errors): `--api-key k --cors`.
fn no_model() -> SocketAddr {
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

fn start_smol(extra: &[&str]) -> Option<SocketAddr> {
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
fn smol() -> Option<SocketAddr> {
    static S: OnceLock<Option<SocketAddr>> = OnceLock::new();
    *S.get_or_init(|| start_smol(&["--alias", "my-model"]))
}

// ---- a small HTTP/1.1 client ----

struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
    /// The client's address (the access log's `client`).
    local: SocketAddr,
}

impl Resp {
    fn header(&self, k: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(k))
            .map(|(_, v)| v.as_str())
    }
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
    /// The `data:` payloads of an SSE body, `[DONE]` included.
    fn events(&self) -> Vec<String> {
        self.body
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }
}

fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> TcpStream {
    send_body(addr, method, path, headers, None)
}

fn send_body(
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

fn dechunk(mut b: &[u8]) -> Vec<u8> {
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
fn read(mut s: TcpStream) -> Resp {
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

fn get(addr: SocketAddr, path: &str) -> Resp {
    read(send(addr, "GET", path, &[]))
}

fn post(addr: SocketAddr, path: &str, body: Value) -> Resp {
    read(send_body(addr, "POST", path, &[], Some(&body)))
}

const KEY: (&str, &str) = ("Authorization", "Bearer k");

// ---- without a model ----

#[test]
fn wrong_method_and_unknown_route_answer_json() {
    let a = no_model();
    let r = read(send(a, "GET", "/v1/chat/completions", &[KEY]));
    assert_eq!(r.status, 405, "{}", r.body);
    assert!(
        r.header("allow").is_some_and(|v| v.contains("POST")),
        "{:?}",
        r.headers
    );
    let e = &r.json()["error"];
    assert_eq!(e["type"], "invalid_request_error");
    assert_eq!(e["code"], "method_not_allowed");
    assert!(e["message"].as_str().unwrap().contains("GET"), "{e}");
    // The Anthropic route answers in its shape.
    let r = read(send(a, "GET", "/v1/messages", &[KEY]));
    assert_eq!(r.status, 405);
    let v = r.json();
    assert_eq!(
        (&v["type"], &v["error"]["type"]),
        (&json!("error"), &json!("invalid_request_error"))
    );
    let r = read(send_body(a, "POST", "/v1/models", &[KEY], Some(&json!({}))));
    assert_eq!(r.status, 405);
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    let r = read(send(a, "GET", "/v1/engines", &[KEY]));
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["type"], "not_found_error");
    // A failed load is a 503 in the error shape, never a Debug dump.
    let r = read(send(a, "GET", "/v1/models/x", &[KEY]));
    assert_eq!(r.status, 503);
    let m = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        m.contains("failed to load") && !m.contains("Some(") && !m.contains("Err("),
        "{m}"
    );
}

#[test]
fn cors_preflight_allows_the_sdk_headers() {
    let a = no_model();
    let asked = "authorization, content-type, x-api-key, anthropic-version, \
                 anthropic-dangerous-direct-browser-access, x-stainless-os, x-stainless-lang, \
                 x-stainless-package-version, x-stainless-retry-count";
    for path in ["/v1/chat/completions", "/v1/messages", "/v1/models"] {
        // No API key: browsers send none on a preflight.
        let r = read(send(
            a,
            "OPTIONS",
            path,
            &[
                ("Origin", "http://localhost:3000"),
                ("Access-Control-Request-Method", "POST"),
                ("Access-Control-Request-Headers", asked),
            ],
        ));
        assert!(r.status == 204 || r.status == 200, "{path}: {}", r.status);
        assert_eq!(r.header("access-control-allow-origin"), Some("*"));
        let h = r
            .header("access-control-allow-headers")
            .unwrap_or_default()
            .to_lowercase();
        for want in asked.split(',').map(str::trim) {
            assert!(h.contains(want), "{path}: {want} not allowed in {h}");
        }
        let m = r.header("access-control-allow-methods").unwrap_or_default();
        assert!(m.contains("POST") && m.contains("GET"), "{m}");
    }
    // Without Access-Control-Request-Headers the SDKs' fixed headers are listed.
    let r = read(send(
        a,
        "OPTIONS",
        "/v1/messages",
        &[("Origin", "http://x")],
    ));
    let h = r.header("access-control-allow-headers").unwrap_or_default();
    assert!(
        h.contains("anthropic-dangerous-direct-browser-access") && h.contains("x-api-key"),
        "{h}"
    );
    // Real responses (a 401 too) carry the origin header and expose Retry-After.
    let r = get(a, "/v1/models");
    assert_eq!(r.status, 401);
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    assert!(r
        .header("access-control-expose-headers")
        .is_some_and(|v| v.contains("retry-after")));
}

#[test]
fn access_log_is_one_json_line_per_request() {
    let a = no_model();
    let r = read(send(a, "GET", "/no/such/route", &[KEY]));
    assert_eq!(r.status, 404);
    let l = access_line(r.local);
    assert_eq!(l["level"], "INFO");
    assert_eq!(l["message"], "request");
    assert_eq!(
        (&l["method"], &l["route"], &l["status"]),
        (&json!("GET"), &json!("/no/such/route"), &json!(404))
    );
    assert!(l["total_ms"].as_f64().is_some_and(|t| t >= 0.0), "{l}");
    assert!(
        l["timestamp"].as_str().is_some_and(|t| t.contains('T')),
        "{l}"
    );
    assert!(
        l["error"].as_str().is_some_and(|e| e.contains("no route")),
        "{l}"
    );
    assert!(
        l.get("prompt_tokens").is_none() && l.get("ttft_ms").is_none(),
        "{l}"
    );
    // Unauthorized requests are logged too, under their route pattern.
    let r = get(a, "/v1/models/some-model");
    assert_eq!(r.status, 401);
    let l = access_line(r.local);
    assert_eq!(
        (&l["route"], &l["status"]),
        (&json!("/v1/models/{*id}"), &json!(401))
    );
}

#[test]
fn shutdown_is_logged_and_returns() {
    log();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let t = std::thread::spawn(move || {
        vela_server::serve_until(args(&["--model", "/nonexistent/none.gguf"]), async move {
            let _ = rx.await;
            "SIGTERM"
        })
    });
    // The listening line names the address; find this server's (only this test calls serve_until).
    let l = log_lines(|v| {
        v["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("listening on"))
    });
    assert_eq!(l.len(), 1, "{l:?}");
    let addr: SocketAddr = l[0]["addr"].as_str().unwrap().parse().unwrap();
    assert_eq!(get(addr, "/health").status, 503);
    tx.send(()).unwrap();
    t.join().unwrap().unwrap();
    let a = addr.to_string();
    let msgs: Vec<String> =
        log_lines(|v| v["addr"] == a.as_str() && v["message"] != l[0]["message"])
            .iter()
            .map(|v| v["message"].as_str().unwrap().to_string())
            .collect();
    assert!(
        msgs.iter()
            .any(|m| m.starts_with("SIGTERM received: shutting down")),
        "{msgs:?}"
    );
    assert!(msgs.iter().any(|m| m == "server stopped"), "{msgs:?}");
    assert!(TcpStream::connect(addr).is_err(), "no longer listening");
}

// ---- with SmolLM2 ----

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

#[test]
fn over_context_requests_are_rejected_up_front() {
    let Some(a) = smol() else { return };
    // The prompt's size, from a request that fits.
    let r = post(
        a,
        "/v1/chat/completions",
        json!({"messages": user("Hi"), "max_tokens": 1}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let p = r.json()["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    let fits = 256 - p;
    for key in ["max_tokens", "max_completion_tokens"] {
        let mut b = json!({"messages": user("Hi"), "temperature": 0});
        b[key] = json!(fits + 1);
        let r = post(a, "/v1/chat/completions", b);
        assert_eq!(r.status, 400, "{key}: {}", r.body);
        let e = &r.json()["error"];
        assert_eq!(
            (&e["type"], &e["code"]),
            (
                &json!("invalid_request_error"),
                &json!("context_length_exceeded")
            )
        );
        let want = format!(
            "This model's maximum context length is 256 tokens. However, you requested {} tokens ({p} in the messages, {} in the completion).",
            257,
            fits + 1
        );
        assert!(e["message"].as_str().unwrap().starts_with(&want), "{e}");
    }
    // Exactly filling the context is allowed.
    let r = post(
        a,
        "/v1/chat/completions",
        json!({"messages": user("Hi"), "max_tokens": fits, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    // Anthropic: the same check, in its error shape.
    let r = post(
        a,
        "/v1/messages",
        json!({"messages": user("Hi"), "max_tokens": 4096}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    let v = r.json();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("4096 in the completion"),
        "{v}"
    );
    // Completions: "in the prompt"; without max_tokens the prompt alone must fit.
    let r = post(
        a,
        "/v1/completions",
        json!({"prompt": "Hello", "max_tokens": 1000}),
    );
    assert_eq!(r.status, 400);
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("in the prompt, 1000 in the completion"));
    let long = "word ".repeat(400);
    let r = post(a, "/v1/chat/completions", json!({"messages": user(&long)}));
    assert_eq!(r.status, 400);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("leaves no room"),
        "{}",
        r.body
    );
    let r = post(
        a,
        "/v1/chat/completions",
        json!({"messages": user("Hi"), "temperature": 0}),
    );
    assert_eq!(
        r.status, 200,
        "no max_tokens: runs to the end or the context"
    );
}

#[test]
fn batch_completions_give_one_choice_per_prompt() {
    let Some(a) = smol() else { return };
    let prompts = ["The sky is", "One, two,", "Paris is the capital of"];
    let one = |p: Value| {
        let r = post(
            a,
            "/v1/completions",
            json!({"prompt": p, "max_tokens": 4, "temperature": 0}),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    };
    let singles: Vec<Value> = prompts.iter().map(|p| one(json!(p))).collect();
    let batch = one(json!(prompts));
    let ch = batch["choices"].as_array().unwrap();
    assert_eq!(ch.len(), 3);
    for (i, c) in ch.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["text"], singles[i]["choices"][0]["text"], "choice {i}");
    }
    let sum = |k: &str| {
        singles
            .iter()
            .map(|s| s["usage"][k].as_u64().unwrap())
            .sum::<u64>()
    };
    assert_eq!(
        batch["usage"]["prompt_tokens"].as_u64().unwrap(),
        sum("prompt_tokens")
    );
    assert_eq!(
        batch["usage"]["completion_tokens"].as_u64().unwrap(),
        sum("completion_tokens")
    );
    // Token-id prompts.
    let ids: Vec<Value> = prompts[..2]
        .iter()
        .map(|p| post(a, "/tokenize", json!({"content": p})).json()["tokens"].clone())
        .collect();
    let b = one(json!(ids));
    assert_eq!(b["choices"].as_array().unwrap().len(), 2);
    assert_eq!(b["choices"][1]["index"], 1);
    // Streamed: every index finishes, texts as above, one usage chunk and one [DONE] at the end.
    let r = post(
        a,
        "/v1/completions",
        json!({"prompt": prompts, "max_tokens": 4, "temperature": 0,
        "stream": true, "stream_options": {"include_usage": true}}),
    );
    assert_eq!(r.status, 200);
    let ev = r.events();
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(ev.iter().filter(|e| *e == "[DONE]").count(), 1);
    let mut text = vec![String::new(); 3];
    let mut finished = [false; 3];
    let mut usage = None;
    for e in &ev[..ev.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap();
        if !v["usage"].is_null() {
            usage = Some(v["usage"].clone());
        }
        for c in v["choices"].as_array().unwrap() {
            let i = c["index"].as_u64().unwrap() as usize;
            text[i].push_str(c["text"].as_str().unwrap());
            finished[i] |= !c["finish_reason"].is_null();
        }
    }
    assert_eq!(finished, [true; 3]);
    for i in 0..3 {
        assert_eq!(
            text[i],
            singles[i]["choices"][0]["text"].as_str().unwrap(),
            "streamed choice {i}"
        );
    }
    assert_eq!(
        usage.unwrap()["completion_tokens"].as_u64().unwrap(),
        sum("completion_tokens")
    );
    // A batch member over the context names its index.
    let r = post(
        a,
        "/v1/completions",
        json!({"prompt": ["Hi", "word ".repeat(400)], "max_tokens": 4}),
    );
    assert_eq!(r.status, 400);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("prompt[1]: "),
        "{}",
        r.body
    );
}

#[test]
fn model_ids_and_alias() {
    let Some(a) = smol() else { return };
    let list = get(a, "/v1/models").json();
    assert_eq!(list["data"][0]["id"], "my-model");
    let stem = "SmolLM2-135M-Instruct.Q4_1";
    for id in ["my-model", "MY-MODEL", stem, "default"] {
        let r = get(a, &format!("/v1/models/{id}"));
        assert_eq!(r.status, 200, "{id}: {}", r.body);
        let v = r.json();
        assert_eq!(
            (&v["id"], &v["object"]),
            (&json!("my-model"), &json!("model"))
        );
    }
    let r = get(a, "/v1/models/gpt-9");
    assert_eq!(r.status, 404);
    let e = &r.json()["error"];
    assert_eq!(
        (&e["type"], &e["code"]),
        (&json!("not_found_error"), &json!("model_not_found"))
    );
    for (model, status) in [("my-model", 200), (stem, 200), ("gpt-9", 404)] {
        let r = post(
            a,
            "/v1/chat/completions",
            json!({"model": model, "messages": user("Hi"), "max_tokens": 2}),
        );
        assert_eq!(r.status, status, "{model}: {}", r.body);
        if status == 200 {
            assert_eq!(r.json()["model"], "my-model");
        }
    }
}

#[test]
fn template_kwargs_and_tools_are_validated() {
    let Some(a) = smol() else { return };
    let tool = |params: Value| json!([{"type": "function", "function": {"name": "f", "parameters": params}}]);
    for (body, param) in [
        (json!({"chat_template_kwargs": "x"}), "chat_template_kwargs"),
        (
            json!({"chat_template_kwargs": {"enable_thinking": "false"}}),
            "chat_template_kwargs",
        ),
        (json!({"tools": tool(json!("object"))}), "tools"),
        (
            json!({"tools": tool(json!({})), "tool_choice": {"type": "function", "function": {"name": "g"}}}),
            "tool_choice",
        ),
    ] {
        let mut b = body.clone();
        b["messages"] = user("Hi");
        let r = post(a, "/v1/chat/completions", b);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert_eq!(r.json()["error"]["param"], param, "{body}");
    }
    let r = post(
        a,
        "/v1/chat/completions",
        json!({"messages": user("Hi"), "max_tokens": 2,
        "chat_template_kwargs": {"enable_thinking": false, "anything": "<|im_end|>"}}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn access_log_has_tokens_and_ttft() {
    let Some(a) = smol() else { return };
    let r = post(
        a,
        "/v1/chat/completions",
        json!({"messages": user("Hi"), "max_tokens": 3, "temperature": 0,
        "stream": true, "stream_options": {"include_usage": true}}),
    );
    assert_eq!(r.status, 200);
    let usage: Value = r
        .events()
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .find(|v| !v["usage"].is_null())
        .unwrap()["usage"]
        .clone();
    let l = access_line(r.local);
    assert_eq!(
        (&l["method"], &l["route"], &l["status"]),
        (&json!("POST"), &json!("/v1/chat/completions"), &json!(200))
    );
    assert_eq!(l["prompt_tokens"], usage["prompt_tokens"]);
    assert_eq!(l["completion_tokens"], usage["completion_tokens"]);
    let (ttft, total) = (
        l["ttft_ms"].as_f64().unwrap(),
        l["total_ms"].as_f64().unwrap(),
    );
    assert!(ttft > 0.0 && ttft <= total, "{l}");
    // A whole response: the counts, no time to first token.
    let r = post(
        a,
        "/v1/messages",
        json!({"messages": user("Hi"), "max_tokens": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let l = access_line(r.local);
    assert_eq!(l["prompt_tokens"], r.json()["usage"]["input_tokens"]);
    assert_eq!(l["completion_tokens"], r.json()["usage"]["output_tokens"]);
    assert!(l.get("ttft_ms").is_none(), "{l}");
    // A rejected request logs its error.
    let r = post(
        a,
        "/v1/completions",
        json!({"prompt": "x", "max_tokens": 5000}),
    );
    let l = access_line(r.local);
    assert_eq!(l["status"], 400);
    assert!(
        l["error"]
            .as_str()
            .unwrap()
            .contains("maximum context length"),
        "{l}"
    );
}

/// Read a response head only (a stream keeps running).
fn head(s: &mut TcpStream) -> (u16, String) {
    let mut h = Vec::new();
    let mut b = [0u8; 1];
    while !h.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b).unwrap();
        h.push(b[0]);
    }
    let h = String::from_utf8(h).unwrap();
    (h.split(' ').nth(1).unwrap().parse().unwrap(), h)
}

#[test]
fn queue_full_is_429_with_retry_after() {
    let Some(a) = start_smol(&["--queue", "1"]) else {
        return;
    };
    // Long generations (end-of-text tokens banned) keep the engine busy and the queue full.
    let body = json!({"prompt": "Once upon a time", "max_tokens": 200, "temperature": 0, "stream": true,
        "logit_bias": {"0": -100, "1": -100, "2": -100}});
    let mut open = Vec::new();
    let mut refused = None;
    for _ in 0..4 {
        let mut s = send_body(a, "POST", "/v1/completions", &[], Some(&body));
        let (status, h) = head(&mut s);
        if status == 429 {
            refused = Some((h, s));
            break;
        }
        assert_eq!(status, 200);
        open.push(s);
    }
    let (h, mut s) = refused.expect("a full queue answers 429");
    assert!(h.to_lowercase().contains("\r\nretry-after: 1\r\n"), "{h}");
    let mut rest = String::new();
    s.read_to_string(&mut rest).unwrap();
    let v: Value = serde_json::from_str(rest.trim()).unwrap();
    assert_eq!(
        (&v["error"]["type"], &v["error"]["code"]),
        (&json!("rate_limit_error"), &json!("queue_full"))
    );
    drop(open);
}

/// A counter or gauge of `/metrics`.
fn metric(a: SocketAddr, name: &str) -> f64 {
    let body = get(a, "/metrics").body;
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no metric {name}"))
}

/// Continuous batching: concurrent requests of different lengths (a prompt of several chunks
/// among them) run in shared steps, and each gets the text it gets alone.
#[test]
fn concurrent_requests_share_steps_and_match_alone() {
    let Some(alone) = smol() else { return };
    let Some(a) = start_smol(&["--parallel", "4", "--ubatch", "16"]) else {
        return;
    };
    let long = "The history of the city goes back many centuries, and its people ".repeat(6);
    let prompts = [
        "The sky is",
        "def add(a, b):",
        long.as_str(),
        "Here is a list of fruits: apple,",
        "1, 2, 3,",
    ];
    let body = |p: &str| json!({"prompt": p, "max_tokens": 12, "temperature": 0});
    let want: Vec<Value> = prompts
        .iter()
        .map(|p| post(alone, "/v1/completions", body(p)).json()["choices"][0]["text"].clone())
        .collect();
    let (steps0, seqs0) = (
        metric(a, "vela_engine_steps_total"),
        metric(a, "vela_engine_step_requests_total"),
    );
    let got: Vec<Value> = std::thread::scope(|s| {
        let hs: Vec<_> = prompts
            .iter()
            .map(|p| s.spawn(move || post(a, "/v1/completions", body(p))))
            .collect();
        hs.into_iter()
            .map(|h| {
                let r = h.join().unwrap();
                assert_eq!(r.status, 200, "{}", r.body);
                r.json()["choices"][0]["text"].clone()
            })
            .collect()
    });
    assert_eq!(got, want);
    let steps = metric(a, "vela_engine_steps_total") - steps0;
    let seqs = metric(a, "vela_engine_step_requests_total") - seqs0;
    // Alone the five would take at least 5 × 12 decode steps plus their prompt chunks; shared,
    // the mean batch is above one.
    assert!(seqs / steps > 1.5, "{seqs} requests over {steps} steps");
    // The gauge is updated after the step that sent the last answer.
    let t0 = std::time::Instant::now();
    while metric(a, "vela_running_requests") != 0.0 {
        assert!(t0.elapsed().as_secs() < 10, "requests still running");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// `n` > 1: every choice is what a request of its own with seed `seed + i` gives; the prompt is
/// evaluated once (the other choices copy its session: their timings show no prompt tokens, the
/// usage counts the prompt once); streamed, every index finishes before one `[DONE]`;
/// completions give prompt i's choice j at index i·n + j.
#[test]
fn n_choices_copy_the_prompt_and_match_separate_requests() {
    let Some(alone) = smol() else { return };
    let Some(a) = start_smol(&["--parallel", "4", "--ubatch", "16"]) else {
        return;
    };
    let msg = "Write one sentence about the sea, the wind and the old lighthouse on the hill.";
    let body = |n: usize, seed: u64| json!({"messages": user(msg), "max_tokens": 12, "temperature": 1.0, "seed": seed, "n": n});
    let want: Vec<Value> = (0..3)
        .map(|i| {
            let r = post(alone, "/v1/chat/completions", body(1, 7 + i));
            assert_eq!(r.status, 200, "{}", r.body);
            r.json()
        })
        .collect();
    let (p0, c0, k0) = (
        metric(a, "vela_prompt_tokens_total"),
        metric(a, "vela_cached_prompt_tokens_total"),
        metric(a, "vela_prompt_copies_total"),
    );
    let r = post(a, "/v1/chat/completions", body(3, 7));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let ch = v["choices"].as_array().unwrap();
    assert_eq!(ch.len(), 3);
    for (i, c) in ch.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(
            c["message"]["content"], want[i]["choices"][0]["message"]["content"],
            "choice {i}"
        );
    }
    let n_prompt = want[0]["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(v["usage"]["prompt_tokens"].as_u64().unwrap(), n_prompt);
    let completion: u64 = want
        .iter()
        .map(|w| w["usage"]["completion_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(
        v["usage"]["completion_tokens"].as_u64().unwrap(),
        completion
    );
    // Three prompts' worth counted, two of them from the copied session.
    let evaluated = (metric(a, "vela_prompt_tokens_total") - p0)
        - (metric(a, "vela_cached_prompt_tokens_total") - c0);
    assert!(
        evaluated <= n_prompt as f64,
        "{evaluated} prompt tokens evaluated"
    );
    assert_eq!(metric(a, "vela_prompt_copies_total") - k0, 2.0);
    // Streamed.
    let mut b = body(2, 7);
    b["stream"] = json!(true);
    let r = post(a, "/v1/chat/completions", b);
    assert_eq!(r.status, 200);
    let ev = r.events();
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(ev.iter().filter(|e| *e == "[DONE]").count(), 1);
    let mut text = vec![String::new(); 2];
    let mut prompt_n = [None; 2];
    for e in &ev[..ev.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap();
        for c in v["choices"].as_array().unwrap() {
            let i = c["index"].as_u64().unwrap() as usize;
            text[i].push_str(c["delta"]["content"].as_str().unwrap_or(""));
            if !c["finish_reason"].is_null() {
                prompt_n[i] = v["timings"]["prompt_n"].as_u64();
            }
        }
    }
    for i in 0..2 {
        assert_eq!(
            text[i],
            want[i]["choices"][0]["message"]["content"]
                .as_str()
                .unwrap(),
            "streamed choice {i}"
        );
    }
    assert_eq!(
        prompt_n[1],
        Some(0),
        "the second choice evaluated its prompt"
    );
    // Completions: two prompts, two choices each.
    let r = post(
        a,
        "/v1/completions",
        json!({"prompt": ["The sky is", "One, two,"], "max_tokens": 4, "temperature": 0, "n": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let ch = v["choices"].as_array().unwrap();
    assert_eq!(ch.len(), 4);
    // Greedy: a prompt's two choices are the same text.
    assert_eq!(ch[0]["text"], ch[1]["text"]);
    assert_eq!(ch[2]["text"], ch[3]["text"]);
    assert_eq!(ch[3]["index"], 3);
    for n in [0, 17] {
        let r = post(a, "/v1/chat/completions", body(n, 7));
        assert_eq!(r.status, 400, "n={n}: {}", r.body);
        assert_eq!(r.json()["error"]["param"], "n");
    }
}

/// A request waiting for an identical prompt that another client is evaluating still gets its
/// answer (the same as alone) when that client goes away first.
#[test]
fn follower_outlives_its_leader() {
    let Some(alone) = smol() else { return };
    let Some(a) = start_smol(&["--parallel", "4", "--ubatch", "16"]) else {
        return;
    };
    let text = "The old lighthouse keeper wrote in his log every evening. ".repeat(20);
    let body = json!({"prompt": text, "max_tokens": 8, "temperature": 0});
    let want = post(alone, "/v1/completions", body.clone()).json()["choices"][0]["text"].clone();
    let c0 = metric(a, "vela_cancelled_requests_total");
    // The leader streams (its prompt takes dozens of 16-token steps), the follower arrives, then
    // the leader's client disconnects.
    let mut lead = body.clone();
    lead["stream"] = json!(true);
    let mut s = send_body(a, "POST", "/v1/completions", &[], Some(&lead));
    let mut first = [0u8; 64];
    let _ = std::io::Read::read(&mut s, &mut first);
    let follower = std::thread::spawn(move || post(a, "/v1/completions", body));
    std::thread::sleep(Duration::from_millis(50));
    drop(s);
    let r = follower.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["choices"][0]["text"], want);
    assert!(
        metric(a, "vela_cancelled_requests_total") > c0,
        "the leader was not cancelled"
    );
}

/// `--cache-dir`: a conversation's second turn after a restart reuses the first turn's saved
/// sequence as if the server had not stopped (the same cached tokens and text as a server that
/// kept running), and a corrupt file is refused with a log line, not loaded.
#[test]
fn prefix_cache_survives_a_restart() {
    let Some(alone) = smol() else { return };
    let dir = std::env::temp_dir().join(format!("vela-cache-dir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let m = testdata::model(testdata::SMOLLM2).unwrap();
    let serve = || {
        let r = vela_server::spawn(args(&[
            "--model",
            m.to_str().unwrap(),
            "--ctx",
            "256",
            "--cache-dir",
            dir.to_str().unwrap(),
        ]))
        .unwrap();
        r.wait_ready().unwrap();
        r
    };
    let turn1 = user("Name three colours of the sea at dawn.");
    let body = |messages: &Value| json!({"messages": messages, "max_tokens": 12, "temperature": 0});
    let first = |a: SocketAddr| {
        let r = post(a, "/v1/chat/completions", body(&turn1));
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let answer = first(alone);
    let turn2 = json!([
        turn1[0],
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "And at dusk?"}
    ]);
    // The reference: the same server keeps the first turn in memory.
    let a = start_smol(&[]).unwrap();
    assert_eq!(first(a), answer);
    let want = post(a, "/v1/chat/completions", body(&turn2)).json();
    let cached = |v: &Value| v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
    assert!(cached(&want).unwrap() > 0);
    // Turn one, then stop: the session is saved.
    let r = serve();
    assert_eq!(first(r.addr), answer);
    vela_server::stop_engine(&r.state, std::time::Duration::from_secs(60));
    assert_eq!(metric(r.addr, "vela_prefix_cache_disk_writes_total"), 1.0);
    drop(r);
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert_eq!(files.len(), 1, "one saved sequence");
    // A new server finds it: turn two as if nothing had stopped.
    let r = serve();
    assert_eq!(metric(r.addr, "vela_prefix_cache_disk_files"), 1.0);
    let got = post(r.addr, "/v1/chat/completions", body(&turn2)).json();
    assert_eq!(cached(&got), cached(&want), "{got}");
    assert_eq!(
        got["choices"][0]["message"]["content"],
        want["choices"][0]["message"]["content"]
    );
    assert_eq!(metric(r.addr, "vela_prefix_cache_disk_hits_total"), 1.0);
    assert!(got["timings"]["cache_load_ms"].as_f64().unwrap() > 0.0);
    vela_server::stop_engine(&r.state, std::time::Duration::from_secs(60));
    drop(r);
    // Corrupt every saved file: refused (counted, logged), the turn still right, nothing reused.
    for f in std::fs::read_dir(&dir).unwrap().flatten() {
        let mut b = std::fs::read(f.path()).unwrap();
        let i = b.len() / 2;
        b[i] ^= 0xff;
        std::fs::write(f.path(), b).unwrap();
    }
    let r = serve();
    let got = post(r.addr, "/v1/chat/completions", body(&turn2)).json();
    assert_eq!(cached(&got), Some(0), "{got}");
    assert_eq!(
        got["choices"][0]["message"]["content"],
        want["choices"][0]["message"]["content"]
    );
    assert!(metric(r.addr, "vela_prefix_cache_disk_errors_total") >= 1.0);
    drop(r);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `POST /v1/messages/count_tokens` (what Claude Code asks before it sends): the prompt tokens a
/// `/v1/messages` request with the same system prompt, messages and tools has; malformed bodies
/// and another model's name are errors in the Anthropic shape.
#[test]
fn count_tokens_matches_the_messages_prompt() {
    let Some(a) = smol() else { return };
    let tools = json!([{"name": "get_weather", "description": "Weather of a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]);
    for body in [
        json!({"messages": user("Hi")}),
        json!({"system": "Answer in one word.", "messages": user("What is the capital of France?"), "tools": tools}),
    ] {
        let r = post(a, "/v1/messages/count_tokens", body.clone());
        assert_eq!(r.status, 200, "{}", r.body);
        let n = r.json()["input_tokens"].as_u64().unwrap();
        let mut m = body;
        m["max_tokens"] = json!(1);
        let r = post(a, "/v1/messages", m);
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.json()["usage"]["input_tokens"].as_u64(), Some(n));
    }
    let r = post(a, "/v1/messages/count_tokens", json!({"messages": "hi"}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["type"], json!("error"), "{}", r.body);
    let r = post(
        a,
        "/v1/messages/count_tokens",
        json!({"model": "other-model", "messages": user("Hi")}),
    );
    assert_eq!(r.status, 404, "{}", r.body);
}
