//! `vela eval run`: drive a workload through vela's server started in this process (the same
//! path `vela serve` uses: template, prefix cache, worker) or through any OpenAI-compatible
//! `--url`, and write the report.

use crate::client::{Client, Clock, RealClock, Trace};
use crate::metrics::{aggregate, turn_metrics, TurnMetrics};
use crate::probe::{self, Budget, ClientPhase, PhaseSource, Probe, ProbeConfig};
use crate::report::{self, EventLog, Summary};
use crate::workload::{self, Api, Expanded, ExpandedTurn};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Workload: a built-in name (`vela eval list`) or a workload file (docs/eval.md).
    pub workload: String,
    /// Drive this OpenAI-compatible server (vela, llama-server, vLLM) instead of starting
    /// vela's in this process.
    #[arg(long)]
    pub url: Option<String>,
    /// The model name to send to --url (default: the first one /v1/models lists).
    #[arg(long)]
    pub served_model: Option<String>,
    /// PID of the --url server, to sample its memory.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Report directory (default: eval-<workload>-<unix time>).
    #[arg(long, short = 'o')]
    pub out: Option<PathBuf>,
    /// No stall probe (memory is still sampled for the budgets).
    #[arg(long)]
    pub no_probe: bool,
    /// Do not execute model-written code (code checks are reported as skipped).
    #[arg(long)]
    pub no_exec: bool,
    /// Stop the run when the host RSS (MiB) of the serving process exceeds this.
    #[arg(long)]
    pub max_rss: Option<f64>,
    /// Stop the run when the device memory in use (MiB) exceeds this.
    #[arg(long)]
    pub max_gpu_mem: Option<f64>,
    /// Concurrent clients (overrides the workload's `clients`).
    #[arg(long)]
    pub clients: Option<usize>,
    /// The in-process server's options (`vela serve`'s; --host/--port are ignored). Their
    /// `--no-warmup` also skips the warm-up request before the workload.
    #[command(flatten)]
    pub serve: vela_server::ServeArgs,
}

/// The engine's own phase (in-process runs).
struct ServerPhase(Arc<vela_server::metrics::Metrics>);

impl PhaseSource for ServerPhase {
    fn phase(&self) -> &'static str {
        self.0.phase().name()
    }
}

/// What a driver provides: the endpoint and, in process, the server behind it.
struct Target {
    client: Client,
    phase: Arc<dyn PhaseSource>,
    client_phase: Arc<ClientPhase>,
    server: Option<vela_server::Running>,
    load_ms: Option<f64>,
    info: Value,
    model_path: Option<PathBuf>,
}

pub fn run(mut args: RunArgs) -> Result<()> {
    let mut w = workload::load(&args.workload)?;
    if let Some(k) = args.clients {
        if k == 0 {
            bail!("--clients must be at least 1");
        }
        let conv = w.conversations[0].clone();
        w.conversations = (0..k)
            .map(|c| {
                w.conversations
                    .get(c)
                    .cloned()
                    .unwrap_or_else(|| conv.clone())
            })
            .collect();
        w.clients = k;
    }
    let out = args.out.clone().unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        PathBuf::from(format!("eval-{}-{t}", w.name))
    });
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let log = EventLog::create(&out.join("events.jsonl"))?;
    let clock: Arc<dyn Clock> = Arc::new(RealClock(Instant::now()));
    let abort = Arc::new(AtomicBool::new(false));
    let abort_reason = Arc::new(Mutex::new(None::<String>));
    log.emit(&json!({"event": "start", "workload": w.name, "digest": w.digest,
                     "clients": w.clients, "driver": if args.url.is_some() { "url" } else { "in-process" }}));

    // The probe starts before the model loads (the load phase is part of the record); the
    // device canary joins once the model is on its device.
    let device: probe::SharedDevice = Default::default();
    let client_phase = Arc::new(ClientPhase::default());
    let phase_slot: Arc<Mutex<Arc<dyn PhaseSource>>> = Arc::new(Mutex::new(client_phase.clone()));
    let rss_of = match (&args.url, args.server_pid) {
        (_, Some(pid)) => Some(Some(pid)),
        (None, None) => Some(None),
        (Some(_), None) => None,
    };
    let probe = Probe::start(
        ProbeConfig {
            stalls: !args.no_probe,
            rss_of,
            budget: Budget {
                max_rss_mib: args.max_rss,
                max_gpu_mib: args.max_gpu_mem,
            },
            abort: abort.clone(),
            abort_reason: abort_reason.clone(),
        },
        clock.clone(),
        Arc::new(Delegate(phase_slot.clone())),
        device.clone(),
    );
    let target = connect(&mut args, &w, clock.as_ref(), client_phase)?;
    *phase_slot.lock().unwrap_or_else(|e| e.into_inner()) = target.phase.clone();
    if let Some(s) = &target.server {
        if let Some(r) = s.state.ready.get() {
            *device.lock().unwrap_or_else(|e| e.into_inner()) = r.model.model.device_probe();
        }
    }
    if let Some(ms) = target.load_ms {
        log.emit(&json!({"event": "load", "ms": ms, "server": target.info}));
    }
    let warmup_ms = if args.serve.no_warmup {
        None
    } else {
        let ms = warmup(&target, &w, clock.as_ref(), &abort)?;
        log.emit(&json!({"event": "warmup", "ms": ms}));
        Some(ms)
    };

    let exec = (!args.no_exec).then(|| Duration::from_secs(10));
    let t0 = clock.now();
    let turns: Mutex<Vec<(TurnMetrics, Trace)>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for (c, conv) in w.conversations.iter().enumerate() {
            let (target, w, clock, abort, log, turns, probe) =
                (&target, &w, clock.as_ref(), &*abort, &log, &turns, &probe);
            s.spawn(move || {
                conversation(c, conv, target, w, clock, abort, exec, &mut |m, tr| {
                    let mut m = m;
                    (m.rss_peak_mib, m.gpu_mem_peak_mib) = probe.peaks(tr.sent, tr.done);
                    // A turn shorter than the probe's period still gets a reading.
                    if let Some(now) = rss_of.and_then(probe::rss_mib) {
                        m.rss_peak_mib = Some(m.rss_peak_mib.map_or(now, |p| p.max(now)));
                    }
                    let mut ev = serde_json::to_value(&m).unwrap_or(Value::Null);
                    ev["event"] = json!("turn");
                    ev["answer"] = json!({"content": tr.content, "reasoning": tr.reasoning,
                                         "tool_calls": tr.tool_calls});
                    log.emit(&ev);
                    turns
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((m, tr));
                });
            });
        }
    });
    let wall_ms = (clock.now() - t0) * 1e3;
    let rec = probe.finish();
    let mut turns = turns.into_inner().unwrap_or_else(|e| e.into_inner());
    turns.sort_by_key(|(m, _)| (m.client, m.turn));
    let (metrics, traces): (Vec<TurnMetrics>, Vec<Trace>) = turns.into_iter().unzip();
    let mut agg = aggregate(&metrics, wall_ms);
    if let Some(ms) = target.load_ms {
        agg.insert("load_ms".into(), ms);
    }
    if let Some(ms) = warmup_ms {
        agg.insert("warmup_ms".into(), ms);
    }
    let stalls = probe::stall_stats(&rec.samples);
    let reason = abort_reason
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let errors: Vec<String> = metrics
        .iter()
        .filter_map(|m| {
            m.error
                .as_ref()
                .map(|e| format!("client {} turn {}: {e}", m.client, m.name))
        })
        .collect();
    let status = match (&reason, errors.first()) {
        (Some(r), _) => format!("aborted: {r}"),
        (None, Some(e)) => format!("failed: {e}"),
        (None, None) => "ok".into(),
    };
    log.emit(&json!({"event": "stalls", "stats": stalls}));
    log.emit(&json!({"event": "end", "status": status, "wall_ms": wall_ms}));
    let model = target.model_path.as_deref().and_then(|p| {
        let sha = report::sha256_file(p).ok()?;
        Some(json!({"path": p.display().to_string(), "sha256": sha}))
    });
    let summary = Summary {
        format: "vela-eval-summary/1",
        status: status.clone(),
        driver: if args.url.is_some() {
            "url"
        } else {
            "in-process"
        },
        url: args.url.clone(),
        server: target.info.clone(),
        workload: json!({"name": w.name, "digest": w.digest, "clients": w.clients,
                         "turns": w.conversations[0].len(), "description": w.description}),
        model,
        metrics: agg,
        turns: metrics,
        stalls,
        probe_errors: rec.errors.iter().take(20).cloned().collect(),
        vela_version: env!("CARGO_PKG_VERSION"),
    };
    report::write(&out, &summary, &traces, &rec)?;
    print!("{}", report::markdown(&summary));
    eprintln!("vela eval: report in {}", out.display());
    drop(target);
    if status != "ok" {
        bail!("{status}");
    }
    Ok(())
}

/// The probe's phase, switched from the client's view to the engine's once it is running.
struct Delegate(Arc<Mutex<Arc<dyn PhaseSource>>>);

impl PhaseSource for Delegate {
    fn phase(&self) -> &'static str {
        self.0.lock().map(|p| p.phase()).unwrap_or("unknown")
    }
}

fn connect(
    args: &mut RunArgs,
    w: &Expanded,
    clock: &dyn Clock,
    client_phase: Arc<ClientPhase>,
) -> Result<Target> {
    if let Some(url) = &args.url {
        let client = Client::new(url, args.serve.api_key.clone(), args.served_model.clone())?;
        let info = json!({"url": url, "model": client.model});
        return Ok(Target {
            client,
            phase: client_phase.clone(),
            client_phase,
            server: None,
            load_ms: None,
            info,
            model_path: None,
        });
    }
    let s = &mut args.serve;
    s.host = "127.0.0.1".into();
    s.port = 0;
    if let Some(need) = w.min_ctx {
        if s.ctx != 0 && s.ctx < need {
            eprintln!(
                "vela eval: --ctx raised from {} to {need}, the workload's min_ctx",
                s.ctx
            );
            s.ctx = need;
        }
    }
    let queue = s.queue.max(w.clients);
    s.queue = queue;
    let t = clock.now();
    let server = vela_server::spawn(s.clone())?;
    server.wait_ready().context("loading the model")?;
    let load_ms = (clock.now() - t) * 1e3;
    let ready = server.state.ready.get().context("server not ready")?;
    let info = json!({"model": ready.name, "path": ready.model.path.display().to_string(),
                      "backend": ready.model.model.backend_name(), "n_ctx": ready.n_ctx,
                      "ubatch": ready.ubatch, "arch": ready.model.model.arch()});
    let model_path = Some(ready.model.path.clone()).filter(|p| p.is_file());
    let client = Client::new(
        &format!("http://{}", server.addr),
        s.api_key.clone(),
        Some(ready.name.clone()),
    )?;
    Ok(Target {
        client,
        phase: Arc::new(ServerPhase(server.state.metrics.clone())),
        client_phase,
        server: Some(server),
        load_ms: Some(load_ms),
        info,
        model_path,
    })
}

fn sampling_body(w: &Expanded, max_tokens: usize) -> Value {
    let mut b = serde_json::to_value(&w.sampling).unwrap_or_else(|_| json!({}));
    b["max_tokens"] = json!(max_tokens);
    b
}

/// A short request before the workload (compiles kernels, warms caches); timed apart.
fn warmup(t: &Target, w: &Expanded, clock: &dyn Clock, abort: &AtomicBool) -> Result<f64> {
    let mut body = sampling_body(w, 8);
    let path = match w.api {
        Api::Chat => {
            body["messages"] = json!([{"role": "user", "content": "Reply with the word OK."}]);
            "/v1/chat/completions"
        }
        Api::Completion => {
            body["prompt"] = json!("The weather today is");
            "/v1/completions"
        }
    };
    let tr = t
        .client
        .stream(path, body, clock, abort, &|| ())
        .context("warm-up request")?;
    Ok((tr.done - tr.sent) * 1e3)
}

/// One client's conversation, turn by turn; `done` receives each turn's metrics and trace.
#[allow(clippy::too_many_arguments)]
fn conversation(
    client: usize,
    turns: &[ExpandedTurn],
    t: &Target,
    w: &Expanded,
    clock: &dyn Clock,
    abort: &AtomicBool,
    exec: Option<Duration>,
    done: &mut dyn FnMut(TurnMetrics, Trace),
) {
    let mut messages: Vec<Value> = Vec::new();
    if let Some(s) = &w.system {
        messages.push(json!({"role": "system", "content": s}));
    }
    let mut prompt = String::new();
    let mut previous: Option<(usize, usize)> = None;
    let mut last_calls: Vec<crate::client::ToolCall> = Vec::new();
    for (i, turn) in turns.iter().enumerate() {
        if abort.load(Ordering::SeqCst) {
            return;
        }
        let mut body = sampling_body(w, turn.max_tokens);
        let path = match w.api {
            Api::Chat => {
                match (&turn.user, &turn.tool_results) {
                    (Some(u), _) => messages.push(json!({"role": "user", "content": u})),
                    (None, Some(results)) => {
                        if last_calls.is_empty() {
                            // The model did not call a tool: its failure (the previous turn's
                            // check says so), not the harness's. This turn's checks fail.
                            let why = "skipped: the previous turn made no tool call to answer";
                            let m = TurnMetrics {
                                client,
                                turn: i,
                                name: turn.name.clone(),
                                finish_reason: Some(why.into()),
                                checks: turn
                                    .checks
                                    .iter()
                                    .map(|c| crate::checks::CheckResult {
                                        check: format!("{c:?}"),
                                        passed: false,
                                        skipped: true,
                                        detail: why.into(),
                                    })
                                    .collect(),
                                ..TurnMetrics::default()
                            };
                            done(m, Trace::default());
                            return;
                        }
                        for c in &last_calls {
                            let r = results.get(&c.name).cloned().unwrap_or_else(|| {
                                format!("{{\"error\": \"no result for tool {}\"}}", c.name)
                            });
                            messages
                                .push(json!({"role": "tool", "tool_call_id": c.id, "content": r}));
                        }
                    }
                    (None, None) => unreachable!("validated by workload::expand"),
                }
                body["messages"] = json!(messages);
                if let Some(tools) = &w.tools {
                    body["tools"] = tools.clone();
                }
                "/v1/chat/completions"
            }
            Api::Completion => {
                prompt.push_str(turn.user.as_deref().unwrap_or(""));
                body["prompt"] = json!(prompt);
                "/v1/completions"
            }
        };
        t.client_phase.begin();
        let r = t
            .client
            .stream(path, body, clock, abort, &|| t.client_phase.first_token());
        t.client_phase
            .end(r.as_ref().is_ok_and(|tr| tr.first_token().is_some()));
        let tr = match r {
            Ok(tr) => tr,
            Err(e) => {
                let m = TurnMetrics {
                    client,
                    turn: i,
                    name: turn.name.clone(),
                    error: Some(format!("{e:#}")),
                    ..TurnMetrics::default()
                };
                done(m, Trace::default());
                return;
            }
        };
        let mut m = turn_metrics(client, i, &turn.name, &tr, previous);
        m.checks = crate::checks::run(&turn.checks, &tr, exec);
        previous = tr.usage.map(|u| (u.prompt_tokens, u.completion_tokens));
        match w.api {
            Api::Chat => {
                let mut msg = json!({"role": "assistant", "content": tr.content});
                if !tr.tool_calls.is_empty() {
                    msg["tool_calls"] = tr
                        .tool_calls
                        .iter()
                        .map(|c| {
                            json!({"id": c.id, "type": "function",
                                        "function": {"name": c.name, "arguments": c.arguments}})
                        })
                        .collect();
                }
                messages.push(msg);
            }
            Api::Completion => prompt.push_str(&tr.content),
        }
        last_calls = tr.tool_calls.clone();
        done(m, tr);
    }
}
