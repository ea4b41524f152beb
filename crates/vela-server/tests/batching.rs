//! Continuous batching over real sockets with SmolLM2 (skipped when missing, required in CI):
//! shared steps, `n` > 1, followers, admission by state memory, the persistent prefix cache.

mod common;
use common::*;

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

/// Admission by state memory: with a budget that holds one request's reservation (prompt +
/// `max_tokens` positions), concurrent requests run one at a time, in order, each with the text
/// it gets alone; the sequences hold state for the positions they have, not the context.
#[test]
fn requests_wait_for_state_memory_and_hold_what_they_use() {
    let Some(alone) = smol() else { return };
    // SmolLM2-135M: 30 layers × 3 KV heads × (64 + 64) × 2 bytes = 23,040 bytes per position;
    // a request of ~5 prompt tokens + 30 reserves ~0.8 MB, two do not fit 1 MiB.
    let Some(a) = start_smol(&["--parallel", "4", "--kv-budget-mb", "1"]) else {
        return;
    };
    assert_eq!(metric(a, "vela_kv_budget_bytes"), (1 << 20) as f64);
    let body = |p: &str| {
        json!({"prompt": p, "max_tokens": 30, "temperature": 0,
        "logit_bias": {"0": -100, "1": -100, "2": -100}})
    };
    let prompts = ["The sky is", "def add(a, b):", "1, 2, 3,"];
    let want: Vec<Value> = prompts
        .iter()
        .map(|p| post(alone, "/v1/completions", body(p)).json()["choices"][0]["text"].clone())
        .collect();
    let done = std::sync::atomic::AtomicBool::new(false);
    let (got, most) = std::thread::scope(|s| {
        let watch = s.spawn(|| {
            let mut most = (0f64, 0f64);
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                most.0 = most.0.max(metric(a, "vela_running_requests"));
                most.1 = most.1.max(metric(a, "vela_kv_reserved_bytes"));
                std::thread::sleep(Duration::from_millis(5));
            }
            most
        });
        let hs: Vec<_> = prompts
            .iter()
            .map(|p| s.spawn(move || post(a, "/v1/completions", body(p))))
            .collect();
        let got: Vec<Value> = hs
            .into_iter()
            .map(|h| {
                let r = h.join().unwrap();
                assert_eq!(r.status, 200, "{}", r.body);
                assert_eq!(r.json()["usage"]["completion_tokens"], 30);
                r.json()["choices"][0]["text"].clone()
            })
            .collect();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        (got, watch.join().unwrap())
    });
    assert_eq!(got, want);
    assert_eq!(most.0, 1.0, "one request at a time");
    assert!(most.1 > 0.0 && most.1 <= (1 << 20) as f64, "{most:?}");
    // Cached sequences of ~35 positions hold a block of 64 positions each, not the 256-position
    // context (5.9 MB).
    let (n, bytes) = (
        metric(a, "vela_prefix_cache_sessions"),
        metric(a, "vela_prefix_cache_bytes"),
    );
    assert!(
        n >= 1.0 && bytes / n <= 64.0 * 23_040.0,
        "{bytes} bytes in {n}"
    );
}
