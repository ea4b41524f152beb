//! The HTTP API in-process over real sockets. Without a model (its load fails, the routes still
//! answer): 405/404 bodies, CORS preflights, the JSON access log, the shutdown message. With
//! SmolLM2 (skipped when missing, required in CI: `vela_formats::testdata`): the context check,
//! batch completions, model ids and `--alias`, template kwargs, 429 with `Retry-After`, and the
//! access log's token counts and time to first token, `ignore_eos`.

mod common;
use common::*;

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

/// `ignore_eos`: a prompt SmolLM2 answers with an immediate end-of-generation token gets
/// `max_tokens` tokens with it; a non-boolean value is a 400 naming the field.
#[test]
fn ignore_eos_generates_to_max_tokens() {
    let Some(a) = smol() else { return };
    let prompt = "Client 0, request 0. Write a short story about a cat.";
    let body = |ignore: Value| {
        let mut b = json!({"prompt": prompt, "max_tokens": 8, "temperature": 0});
        if !ignore.is_null() {
            b["ignore_eos"] = ignore;
        }
        b
    };
    let plain = post(a, "/v1/completions", body(Value::Null)).json();
    assert_eq!(plain["choices"][0]["finish_reason"], "stop", "{plain}");
    assert!(plain["usage"]["completion_tokens"].as_u64().unwrap() < 8);
    let r = post(a, "/v1/completions", body(json!(true))).json();
    assert_eq!(r["choices"][0]["finish_reason"], "length", "{r}");
    assert_eq!(r["usage"]["completion_tokens"], 8);
    let bad = post(a, "/v1/completions", body(json!("yes")));
    assert_eq!(bad.status, 400);
    assert_eq!(bad.json()["error"]["param"], "ignore_eos");
}
