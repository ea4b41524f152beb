//! vela-server: the OpenAI/Anthropic-compatible HTTP server behind `vela serve`.
//!
//! One engine worker thread owns every sequence (a prefix cache of sessions) and serves a bounded
//! FIFO of jobs; the tokio runtime only parses, renders templates, tokenizes and streams, so
//! `/health` and friends answer while a generation runs. See `docs/server.md`.

pub mod access;
pub mod anthropic;
pub mod cache;
pub mod completions;
pub mod disk_cache;
pub mod endpoints;
pub mod error;
pub mod http;
pub mod metrics;
pub mod openai;
pub mod parser;
pub mod request;
pub mod responses;
pub mod stop;
pub mod structured;
mod structured_gemma4;
mod structured_xml;
pub mod tool_schema;
mod ui;
pub mod worker;

use anyhow::{bail, Context, Result};
use std::sync::{Arc, Mutex, OnceLock};
use vela_compute::KvType;
use vela_engine::SessionOptions;

/// Options of `vela serve`.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Model: a GGUF path, a known model name or hf://owner/repo/file.gguf (default:
    /// Qwen2.5-Coder-0.5B-Instruct).
    #[arg(long, short = 'm')]
    pub model: Option<String>,
    /// The model id `/v1/models` reports and requests may name (the file's name stays accepted).
    #[arg(long)]
    pub alias: Option<String>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Compute threads (0 = all cores).
    #[arg(long, short = 't', default_value_t = 0)]
    pub threads: usize,
    /// Where to run: cpu, cuda, cuda:N, or auto (a usable CUDA GPU, else the CPU).
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Convert the model's F32/F16/BF16 matrices to this type at load (q8_0, q4_k, q4_0, ...;
    /// quantized tensors are used as they are).
    #[arg(long)]
    pub quant: Option<String>,
    /// Where routed experts of MoE models go: gpu, cpu (host memory, run by the CPU), auto
    /// (on the GPU while they fit, the rest in host memory; on the CPU backend: used in place
    /// from the file when a repacked copy would not fit), or N (the first N MoE layers' in host
    /// memory).
    #[arg(long, default_value = "auto")]
    pub experts: String,
    /// GPU memory the model may use, in GiB (default: all that is free).
    #[arg(long)]
    pub gpu_mem: Option<f64>,
    /// GPU memory for the cache of the most used host-memory experts, in GiB, all layers
    /// together (default: what the budget leaves; 0: no cache).
    #[arg(long)]
    pub expert_cache: Option<f64>,
    /// Context size per sequence (0 = the model's, capped at 8192).
    #[arg(long, default_value_t = 4096)]
    pub ctx: usize,
    /// Most tokens a request that sets no `max_tokens` (`max_completion_tokens`,
    /// `max_output_tokens`) may generate (default: until the context is full; `/v1/completions`
    /// without it: 16, as OpenAI's).
    #[arg(long)]
    pub max_tokens: Option<usize>,
    /// Prefill chunk size (tokens per forward pass; cancellation granularity).
    #[arg(long, default_value_t = 256)]
    pub ubatch: usize,
    /// Require `Authorization: Bearer KEY` (or `x-api-key: KEY`) on every endpoint but /health
    /// and the web UI's static files.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Largest request body in bytes (larger: 413).
    #[arg(long, default_value_t = 8 << 20)]
    pub max_body: usize,
    /// Answer CORS preflights and add `Access-Control-Allow-Origin: *`.
    #[arg(long)]
    pub cors: bool,
    /// Requests that may wait for the engine (more: 429).
    #[arg(long, default_value_t = 64)]
    pub queue: usize,
    /// Requests evaluated together at most (continuous batching: one forward pass per step
    /// decodes a token for each and ingests prompt chunks within `--ubatch`); each holds its
    /// own sequence state. More requests wait in the queue.
    #[arg(long, short = 'p', default_value_t = 4)]
    pub parallel: usize,
    /// Sequence-state memory in MiB the running requests may reserve together: each reserves
    /// the state of its prompt + `max_tokens` positions when admitted, and waits in the queue
    /// while that does not fit (one request alone always runs). 0: `--parallel` full contexts.
    /// K/V is allocated as a sequence grows, so set `max_tokens` to admit more.
    #[arg(long, default_value_t = 0)]
    pub kv_budget_mb: u64,
    /// Prefix-cache budget in MiB of KV cache (at least one sequence is always kept).
    #[arg(long, default_value_t = 1024)]
    pub cache_mb: usize,
    /// Persistent prefix cache: sequences evicted from memory, and all of them at shutdown, are
    /// saved here and found again by token prefix, also after a restart (docs/server.md).
    #[arg(long)]
    pub cache_dir: Option<std::path::PathBuf>,
    /// Disk budget of `--cache-dir` in MiB (least recently used files go first).
    #[arg(long, default_value_t = 10240)]
    pub cache_disk_mb: u64,
    /// Gemma 4 assistant for MTP speculative decoding (HF directory or GGUF). Without it, an
    /// assistant next to a Gemma 4 target is used when found (docs/speculative.md).
    #[arg(long, conflicts_with = "no_mtp")]
    pub mtp: Option<std::path::PathBuf>,
    /// Plain decoding even if an assistant is found.
    #[arg(long)]
    pub no_mtp: bool,
    /// Start serving without the warm-up run (a short prompt and two decode steps on a
    /// throwaway sequence before the model is reported ready, so that the first request does
    /// not pay for reading the weights in and the backend's lazily initialised paths).
    #[arg(long)]
    pub no_warmup: bool,
    /// Prompt-lookup speculative decoding (drafts copied from the context; no draft model).
    #[arg(long, conflicts_with = "mtp")]
    pub lookup: bool,
    /// Drafted tokens per verification round at most; each round's depth comes from a cost
    /// model measured while serving (0 when drafting does not pay), unless `--draft-fixed`.
    #[arg(long, default_value_t = 4)]
    pub draft_max: usize,
    /// Always draft `--draft-max` tokens per round.
    #[arg(long)]
    pub draft_fixed: bool,
    /// Server messages and the access log (one line per request) on stderr: text, or json
    /// (one JSON object per line).
    #[arg(long, value_enum, default_value_t = access::LogFormat::Text)]
    pub log_format: access::LogFormat,
}

/// Run the server until Ctrl-C or SIGTERM (blocking; builds its own tokio runtime), logging to
/// stderr in `--log-format`.
pub fn serve(args: ServeArgs) -> Result<()> {
    access::init(args.log_format);
    serve_until(args, stop_signal())
}

/// How long in-flight requests may finish after a stop signal.
const DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// Run the server until `stop` resolves (to the name of what stopped it), then let in-flight
/// requests finish for up to 5 s (a second signal stops at once).
pub fn serve_until(
    args: ServeArgs,
    stop: impl std::future::Future<Output = &'static str>,
) -> Result<()> {
    let r = spawn(args)?;
    let addr = r.addr;
    tracing::info!(%addr, "listening on http://{addr}");
    let Running {
        rt,
        mut server,
        shutdown,
        state,
        ..
    } = r;
    let res = rt.block_on(async move {
        tokio::select! {
            res = &mut server => return res?.map_err(anyhow::Error::from),
            why = stop => tracing::info!(
                %addr,
                "{why} received: shutting down (in-flight requests get {} s; send it again to stop now)",
                DRAIN.as_secs()
            ),
        }
        let _ = shutdown.send(());
        tokio::select! {
            _ = &mut server => {}
            _ = tokio::time::sleep(DRAIN) => {
                tracing::warn!(%addr, "requests still running after {} s are cut off", DRAIN.as_secs())
            }
            why = stop_signal() => tracing::warn!(%addr, "{why} received again: stopping now"),
        }
        Ok(())
    });
    stop_engine(&state, ENGINE_SAVE);
    tracing::info!(%addr, "server stopped");
    res
}

/// How long the engine may take at shutdown to save the prefix cache (`--cache-dir`).
const ENGINE_SAVE: std::time::Duration = std::time::Duration::from_secs(120);

/// Ask the engine worker to end (saving its cached sequences when `--cache-dir` is set) and
/// wait for it, at most `wait`.
pub fn stop_engine(state: &http::AppState, wait: std::time::Duration) {
    state
        .stopping
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let Some(done) = state.engine_done.lock().ok().and_then(|mut d| d.take()) else {
        return;
    };
    if let Some(r) = state.ready.get() {
        let _ = r.jobs.blocking_send(worker::Job::wake());
    }
    if done.recv_timeout(wait).is_err() {
        tracing::warn!("the engine did not finish within {} s", wait.as_secs());
    }
}

/// Ctrl-C (SIGINT) or SIGTERM.
async fn stop_signal() -> &'static str {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            return tokio::select! {
                _ = tokio::signal::ctrl_c() => "SIGINT (Ctrl-C)",
                _ = term.recv() => "SIGTERM",
            };
        }
    }
    let _ = tokio::signal::ctrl_c().await;
    "SIGINT (Ctrl-C)"
}

/// A server running in this process: `vela serve`, and `vela eval`'s in-process driver, which
/// measures through exactly this path.
pub struct Running {
    /// The bound address (port 0 in [`ServeArgs::port`] picks a free one).
    pub addr: std::net::SocketAddr,
    pub state: Arc<http::AppState>,
    /// Dropping the runtime stops the HTTP side; the engine thread ends with its job channel.
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    /// Starts a graceful shutdown (stop accepting, finish in-flight requests).
    shutdown: tokio::sync::oneshot::Sender<()>,
    rt: tokio::runtime::Runtime,
}

impl Running {
    /// Wait until the model is loaded (or its load failed: the error).
    pub fn wait_ready(&self) -> Result<()> {
        loop {
            if self.state.ready.get().is_some() {
                return Ok(());
            }
            if let Some(e) = self.state.load_error.lock().ok().and_then(|e| e.clone()) {
                bail!("{e}");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

/// Bind, start loading the model on the engine thread and serve HTTP on a runtime of its own;
/// returns at once (the model may still be loading: [`Running::wait_ready`]).
pub fn spawn(args: ServeArgs) -> Result<Running> {
    if args.ubatch == 0 || args.queue == 0 {
        bail!("--ubatch and --queue must be at least 1");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let state = Arc::new(http::AppState {
        ready: OnceLock::new(),
        load_error: Mutex::new(None),
        metrics: Arc::new(metrics::Metrics::default()),
        settings: http::Settings {
            api_key: args.api_key.clone(),
            cors: args.cors,
            queue: args.queue,
            cache_mb: args.cache_mb,
            max_tokens: args.max_tokens,
        },
        created: http::unix_now(),
        stopping: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        engine_done: Mutex::new(None),
    });
    let addr = format!("{}:{}", args.host, args.port);
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(&addr))
        .with_context(|| format!("cannot listen on {addr}"))?;
    let addr = listener.local_addr()?;
    let st = state.clone();
    let a = args.clone();
    std::thread::Builder::new()
        .name("vela-engine".into())
        .spawn(move || {
            if let Err(e) = load_and_work(a, st.clone()) {
                tracing::error!("{e:#}");
                if let Ok(mut le) = st.load_error.lock() {
                    *le = Some(format!("{e:#}"));
                }
            }
        })?;
    let app = endpoints::router(state.clone(), args.max_body)
        .into_make_service_with_connect_info::<std::net::SocketAddr>();
    let (shutdown, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = rt.spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stopped.await;
            })
            .await
    });
    Ok(Running {
        addr,
        state,
        server,
        shutdown,
        rt,
    })
}

fn load_and_work(args: ServeArgs, st: Arc<http::AppState>) -> Result<()> {
    let path = match args.model.as_deref() {
        Some(p) if std::path::Path::new(p).is_dir() => std::path::PathBuf::from(p),
        m => vela_hub::resolve_model(m)?,
    };
    let t0 = std::time::Instant::now();
    let lo = vela_engine::loader::LoadOptions::from_flags(
        args.threads,
        &args.device,
        args.quant.as_deref(),
        &args.experts,
        args.gpu_mem,
        args.expert_cache,
    )?;
    let m = Arc::new(vela_engine::loader::load(&path, &lo)?);
    let opts = SessionOptions {
        n_ctx: args.ctx,
        ubatch: args.ubatch,
        kv_type: KvType::F16,
    };
    let n_ctx = if args.ctx == 0 {
        vela_engine::Session::default_n_ctx(&*m.model)
    } else {
        args.ctx
    };
    // An impossible --ctx fails the start, not every request.
    vela_engine::Session::check_memory(&*m.model, n_ctx, args.ubatch, opts.kv_type)?;
    let drafter = load_drafter(&args, &m, &opts)?;
    let disk = match &args.cache_dir {
        Some(dir) => {
            let id = vela_engine::persist::identity(&*m.model, &path, opts.kv_type)?;
            Some(disk_cache::DiskCache::open(
                dir,
                &id,
                args.cache_disk_mb << 20,
                st.metrics.clone(),
            )?)
        }
        None => None,
    };
    let template = match &m.chat_template {
        Some(src) => {
            let (bos, eos) = m.bos_eos_text();
            match vela_template::ChatTemplate::new(src, &bos, &eos) {
                Ok(t) => Some(t),
                Err(e) => {
                    tracing::warn!("chat template unusable ({e:#}); chat endpoints disabled");
                    None
                }
            }
        }
        None => None,
    };
    let (tx, rx) = tokio::sync::mpsc::channel(args.queue);
    let mut aliases = vec!["default".to_string()];
    if let Some(a) = &args.model {
        aliases.push(a.clone());
    }
    // `--alias` becomes the reported id; the file's name stays accepted.
    let name = match &args.alias {
        Some(a) => {
            aliases.push(m.name());
            a.clone()
        }
        None => m.name(),
    };
    let ready = http::Ready {
        model: m.clone(),
        name: name.clone(),
        aliases,
        template,
        template_src: m.chat_template.clone(),
        jobs: tx,
        n_ctx,
        ubatch: args.ubatch.min(n_ctx),
        grammar: OnceLock::new(),
    };
    if !args.no_warmup {
        let t = std::time::Instant::now();
        match vela_engine::Session::warm_up(m.model.clone(), &opts) {
            Ok(()) => tracing::info!("warmed up in {:.0} ms", t.elapsed().as_secs_f64() * 1e3),
            Err(e) => tracing::warn!("warm-up run failed: {e:#}"),
        }
    }
    if st.ready.set(ready).is_err() {
        bail!("server state initialised twice");
    }
    tracing::info!(
        "model {name} ready on {} in {:.1}s (ctx {n_ctx}, ubatch {})",
        m.model.backend_name(),
        t0.elapsed().as_secs_f64(),
        args.ubatch
    );
    let (done, engine_done) = std::sync::mpsc::channel();
    if let Ok(mut d) = st.engine_done.lock() {
        *d = Some(engine_done);
    }
    let kv_budget = match args.kv_budget_mb {
        0 => {
            let one = m.model.state_layout();
            args.parallel.max(1) as u64 * one.bytes(n_ctx, args.ubatch.max(1), opts.kv_type)
        }
        mb => mb << 20,
    };
    let cfg = worker::WorkerConfig {
        session: opts,
        cache_bytes: args.cache_mb << 20,
        disk,
        stop: st.stopping.clone(),
        done: Some(done),
        parallel: args.parallel,
        n_ctx,
        kv_budget,
        drafter,
        draft_max: args.draft_max,
        depth: (!args.draft_fixed)
            .then(|| vela_engine::speculative::DepthModel::new(args.draft_max)),
    };
    worker::run(m, cfg, rx, st.metrics.clone());
    Ok(())
}

/// The MTP drafter `vela serve` was asked for (or found next to a Gemma 4 target).
fn load_drafter(
    args: &ServeArgs,
    m: &vela_engine::loader::LoadedModel,
    opts: &SessionOptions,
) -> Result<Option<Box<dyn vela_engine::speculative::Drafter>>> {
    if args.no_mtp {
        return Ok(None);
    }
    if args.draft_max == 0 {
        bail!("--draft-max must be at least 1");
    }
    if args.lookup {
        tracing::info!("prompt-lookup speculative decoding");
        return Ok(Some(Box::new(vela_engine::speculative::NgramDrafter::new(
            2, 4,
        )?)));
    }
    let path = match &args.mtp {
        Some(p) => Some(p.clone()),
        None => m.model.discover_mtp(&m.path),
    };
    let Some(path) = path else { return Ok(None) };
    // The drafter binds to the model, not to one sequence: a small session validates it.
    let probe = vela_engine::Session::new(
        m.model.clone(),
        &SessionOptions {
            n_ctx: 16,
            ubatch: opts.ubatch.clamp(1, 16),
            kv_type: opts.kv_type,
        },
    )?;
    let d = vela_engine::speculative::load_mtp(&probe, &path)?;
    tracing::info!("MTP speculative decoding with {}", path.display());
    Ok(Some(d))
}
