//! `vela agent`: a coding-agent client pointed at a local model. Starts `vela serve` on a free
//! port of 127.0.0.1 (or uses `--url`), waits until it answers `/health`, runs the client with
//! the variables that point it there (printed), and stops the server when the client exits:
//! the port is free again when `vela agent` returns.
//!
//! The server runs in its own process group, so the terminal's Ctrl-C reaches the client (which
//! decides what it means) and not the server; `vela agent` itself ignores it while the client
//! runs. The server is also told to stop if `vela agent` dies (`PR_SET_PDEATHSIG`).

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// The model id the started server reports (`--alias`), which the client is told to ask for.
const MODEL_ID: &str = "vela";

/// The clients `vela agent` can start.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Client {
    /// Claude Code (`claude`, Anthropic Messages API): `npm install -g @anthropic-ai/claude-code`.
    Claude,
    /// aider (`aider`, OpenAI Chat Completions API): `python3 -m pip install aider-chat`.
    Aider,
    /// OpenAI Codex CLI (`codex`, OpenAI Responses API): `npm install -g @openai/codex`.
    Codex,
}

impl Client {
    fn program(self) -> &'static str {
        match self {
            Client::Claude => "claude",
            Client::Aider => "aider",
            Client::Codex => "codex",
        }
    }
    fn install_hint(self) -> &'static str {
        match self {
            Client::Claude => "npm install -g @anthropic-ai/claude-code",
            Client::Aider => "python3 -m pip install aider-chat",
            Client::Codex => "npm install -g @openai/codex",
        }
    }
    /// The variables that point the client at `base` with `model`, and that keep it from
    /// asking for more output than the context leaves (`max_output`).
    fn env(self, base: &str, key: &str, model: &str, max_output: usize) -> Vec<(String, String)> {
        let v = |k: &str, v: &str| (k.to_string(), v.to_string());
        match self {
            Client::Claude => vec![
                v("ANTHROPIC_BASE_URL", base),
                v("ANTHROPIC_AUTH_TOKEN", key),
                v("ANTHROPIC_MODEL", model),
                v("ANTHROPIC_DEFAULT_OPUS_MODEL", model),
                v("ANTHROPIC_DEFAULT_SONNET_MODEL", model),
                v("ANTHROPIC_DEFAULT_HAIKU_MODEL", model),
                v("ANTHROPIC_SMALL_FAST_MODEL", model),
                v("CLAUDE_CODE_MAX_OUTPUT_TOKENS", &max_output.to_string()),
                // A long prompt on a CPU takes minutes before the first token.
                v("API_TIMEOUT_MS", "3600000"),
                v("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
                v("DISABLE_TELEMETRY", "1"),
                v("DISABLE_AUTOUPDATER", "1"),
            ],
            Client::Aider => vec![
                v("OPENAI_API_BASE", &format!("{base}/v1")),
                v("OPENAI_API_KEY", key),
                // litellm's prefix for an OpenAI-compatible server.
                v("AIDER_MODEL", &format!("openai/{model}")),
                v("AIDER_SHOW_MODEL_WARNINGS", "false"),
                v("AIDER_CHECK_UPDATE", "false"),
                v("AIDER_ANALYTICS_DISABLE", "true"),
                // The model price list ships with litellm; it is not fetched.
                v("LITELLM_LOCAL_MODEL_COST_MAP", "True"),
            ],
            // The provider itself is configured by `args` (Codex reads the key from this).
            Client::Codex => vec![v("VELA_API_KEY", key)],
        }
    }
    /// Arguments that go before the user's: Codex takes its provider from `-c` overrides.
    fn args(self, base: &str, model: &str, ctx: usize) -> Vec<String> {
        match self {
            Client::Claude | Client::Aider => Vec::new(),
            Client::Codex => {
                // The prompt of a CPU-served model can take minutes before the first event.
                let provider = format!(
                    "model_providers.vela={{name=\"vela\", base_url=\"{base}/v1\", \
                     env_key=\"VELA_API_KEY\", wire_api=\"responses\", \
                     stream_idle_timeout_ms=3600000}}"
                );
                [
                    "-m".to_string(),
                    model.to_string(),
                    "-c".into(),
                    "model_provider=vela".into(),
                    "-c".into(),
                    provider,
                    "-c".into(),
                    format!("model_context_window={ctx}"),
                ]
                .into()
            }
        }
    }
}

#[derive(Args)]
pub struct AgentArgs {
    /// The client to start.
    #[arg(long, value_enum, default_value = "claude")]
    pub client: Client,
    /// Use this running server (e.g. http://127.0.0.1:8080) instead of starting one.
    #[arg(long, conflicts_with_all = ["model", "serve_args"])]
    pub url: Option<String>,
    /// The model the started server serves (as `vela serve --model`; default: vela's default).
    #[arg(long, short = 'm')]
    pub model: Option<String>,
    /// Context of the started server (agents send long system prompts and tool lists); Codex is
    /// told it as its model's context window.
    #[arg(long, default_value_t = 32768)]
    pub ctx: usize,
    /// Most tokens the client may ask for in one answer (told to Claude Code; the started server's
    /// `--max-tokens` for clients that set no limit, Codex and aider); the rest of the context is
    /// the prompt's.
    #[arg(long, default_value_t = 4096)]
    pub max_output: usize,
    /// The server's API key (`--url`), or the one the started server requires.
    #[arg(long)]
    pub api_key: Option<String>,
    /// One more `vela serve` argument (repeatable), e.g. `--serve-arg=--device=cuda`.
    #[arg(long = "serve-arg", allow_hyphen_values = true)]
    pub serve_args: Vec<String>,
    /// Seconds to wait for the started server to load its model.
    #[arg(long, default_value_t = 600)]
    pub wait: u64,
    /// The client's own arguments, after `--` (e.g. `-- -p "explain main.rs"`).
    #[arg(last = true)]
    pub client_args: Vec<String>,
}

/// `program` on `PATH`, if it is there.
fn find_program(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// A port of 127.0.0.1 nobody listens on now.
fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

/// `GET path` on `host:port`: the status code, or None when nothing answers.
fn http_status(addr: &str, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect_timeout(&addr.parse().ok()?, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut head = [0u8; 16];
    s.read_exact(&mut head[..12]).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// `host:port` of an `http://host:port[/...]` URL.
fn authority(url: &str) -> Result<String> {
    let rest = url
        .strip_prefix("http://")
        .with_context(|| format!("--url {url}: only http:// URLs are supported"))?;
    let a = rest.split('/').next().unwrap_or_default();
    Ok(if a.contains(':') {
        a.to_string()
    } else {
        format!("{a}:80")
    })
}

/// A `vela serve` child: stopped (SIGTERM, then SIGKILL after `grace`) when dropped.
struct Server {
    child: Child,
    log: PathBuf,
}

impl Server {
    fn start(a: &AgentArgs, port: u16, key: &str) -> Result<Server> {
        let exe = std::env::current_exe().context("locating the vela binary")?;
        let log = std::env::temp_dir().join(format!("vela-agent-{port}.log"));
        let out = std::fs::File::create(&log)
            .with_context(|| format!("creating the server's log {}", log.display()))?;
        let mut cmd = Command::new(exe);
        cmd.args(["serve", "--host", "127.0.0.1", "--alias", MODEL_ID])
            .args(["--port", &port.to_string(), "--ctx", &a.ctx.to_string()])
            .args(["--api-key", key])
            .args(["--max-tokens", &a.max_output.to_string()]);
        if let Some(m) = &a.model {
            cmd.args(["--model", m]);
        }
        cmd.args(&a.serve_args)
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt;
            cmd.process_group(0);
            // SAFETY: prctl is async-signal-safe; the closure runs in the child before exec.
            unsafe {
                cmd.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                    Ok(())
                });
            }
        }
        let child = cmd.spawn().context("starting vela serve")?;
        Ok(Server { child, log })
    }

    /// Wait until `/health` answers 200; an error with the log's end if the server exits or
    /// `wait` passes first.
    fn wait_ready(&mut self, addr: &str, wait: Duration) -> Result<()> {
        let t0 = Instant::now();
        loop {
            if http_status(addr, "/health") == Some(200) {
                return Ok(());
            }
            if let Some(st) = self.child.try_wait()? {
                bail!(
                    "vela serve exited ({st}) before it was ready: {}",
                    self.log_tail()
                );
            }
            if t0.elapsed() > wait {
                bail!(
                    "vela serve was not ready after {} s (see {})",
                    wait.as_secs(),
                    self.log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn log_tail(&self) -> String {
        let t = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = t.lines().rev().take(3).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }

    /// SIGTERM, then up to 150 s for the graceful shutdown (the engine gets 120 s), then SIGKILL.
    fn stop(&mut self) -> Result<ExitStatus> {
        #[cfg(unix)]
        // SAFETY: signalling our own child by its pid.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(150) {
            if let Some(st) = self.child.try_wait()? {
                return Ok(st);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.child.kill()?;
        Ok(self.child.wait()?)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.stop();
        }
    }
}

pub fn agent(a: AgentArgs) -> Result<()> {
    let client = a.client;
    let Some(program) = find_program(client.program()) else {
        bail!(
            "`{}` is not installed (or not on PATH): {}",
            client.program(),
            client.install_hint()
        );
    };
    let key = a.api_key.clone().unwrap_or_else(|| "vela-local".into());
    let mut server = None;
    let (base, addr, model) = match &a.url {
        Some(url) => {
            let addr = authority(url)?;
            if http_status(&addr, "/health") != Some(200) {
                bail!("{url} does not answer GET /health with 200");
            }
            (url.trim_end_matches('/').to_string(), addr, "default")
        }
        None => {
            let port = free_port()?;
            let addr = format!("127.0.0.1:{port}");
            let mut s = Server::start(&a, port, &key)?;
            eprintln!(
                "vela agent: starting vela serve on {addr} (log {})",
                s.log.display()
            );
            s.wait_ready(&addr, Duration::from_secs(a.wait))?;
            server = Some(s);
            (format!("http://{addr}"), addr, MODEL_ID)
        }
    };
    let env = client.env(&base, &key, model, a.max_output);
    let mut args = client.args(&base, model, a.ctx);
    eprintln!("vela agent: {} with", program.display());
    for (k, v) in &env {
        eprintln!("  {k}={v}");
    }
    if !args.is_empty() {
        eprintln!("  arguments: {}", args.join(" "));
    }
    args.extend(a.client_args.iter().cloned());
    #[cfg(unix)]
    // SAFETY: SIG_IGN is a valid disposition; Ctrl-C is the client's while it runs.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
    }
    let status = Command::new(&program)
        .args(&args)
        .envs(env)
        .status()
        .with_context(|| format!("running {}", program.display()));
    if let Some(mut s) = server {
        let st = s.stop()?;
        let free = TcpListener::bind(&addr).is_ok();
        eprintln!(
            "vela agent: server stopped ({st}); port {} {}",
            addr,
            if free { "free" } else { "still in use" }
        );
    }
    let status = status?;
    if !status.success() {
        std::process::exit(status.code().unwrap_or(1));
    }
    Ok(())
}
