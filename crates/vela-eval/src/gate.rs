//! `vela eval ab`: the A/B gate. Two configurations (two binaries, or one binary with two argument
//! strings) each run `BIN eval run ARGS... --out SAMPLEDIR` in a fresh process: one discarded
//! warm-up per arm, then `repeats` pairs in ABBA order; `stats` turns the paired samples into a
//! verdict.
//!
//! The gate directory (`--out DIR`):
//! - `gate-config.json`: provenance and the identity of the gate (written first); a rerun with the
//!   same DIR must match it and resumes, running only the samples without a valid record;
//! - `samples/NN-{warm|rep}-{a|b}.json`: one record per completed sample (NN = run position);
//! - `runs/NN-…/`: each child's `--out` directory with its `summary.json`, `stdout.txt`, `stderr.txt`;
//! - `failures/NN-…-<ms>.json`: failed attempts (non-zero exit, bad summary, killed for the RSS
//!   budget or the timeout), never counted as samples;
//! - `hash-cache.json`: sha256 digests keyed by path, size and mtime, so a resume does not rehash;
//! - `ab.json`, `ab.md`: the report (the Markdown is printed on stdout too).
//!
//! Every file is written to a temp name, fsynced and renamed: a crash leaves whole files or ignored
//! temps.

use crate::stats::{self, Direction};
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const CONFIG_FORMAT: &str = "vela-eval-ab-config/1";
const SAMPLE_FORMAT: &str = "vela-eval-ab-sample/1";
const FAILURE_FORMAT: &str = "vela-eval-ab-failure/1";
const REPORT_FORMAT: &str = "vela-eval-ab/1";
const SUMMARY_FORMAT: &str = "vela-eval-summary/1";

/// `vela eval ab`: compare two configurations in fresh processes and give a verdict.
#[derive(clap::Args, Debug, Clone)]
pub struct AbArgs {
    /// Arm A's arguments to `eval run`, one shell-like string (quotes and backslashes work).
    #[arg(long, value_name = "ARGS", allow_hyphen_values = true)]
    pub a: String,
    /// Arm B's arguments to `eval run`.
    #[arg(long, value_name = "ARGS", allow_hyphen_values = true)]
    pub b: String,
    /// Arm A's vela binary (default: this executable).
    #[arg(long, value_name = "PATH")]
    pub a_bin: Option<PathBuf>,
    /// Arm B's vela binary (default: this executable).
    #[arg(long, value_name = "PATH")]
    pub b_bin: Option<PathBuf>,
    /// The summary metric compared (a key of the summary's `metrics`).
    #[arg(long, default_value = "decode_tps")]
    pub metric: String,
    /// Measured pairs after the warm-up (at least 3).
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Smallest gain (percent) that promotes B.
    #[arg(long, value_name = "PCT", default_value_t = 3.0)]
    pub floor: f64,
    /// A mean regression (percent) worse than this rejects B.
    #[arg(long, value_name = "PCT", default_value_t = 2.0)]
    pub guard: f64,
    /// The gate directory (created; an existing one is resumed).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Kill a sample whose resident memory exceeds this many MiB (polled every 100 ms).
    #[arg(long, value_name = "MIB")]
    pub max_rss: Option<u64>,
    /// Kill a sample that runs longer than this many seconds.
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<f64>,
    /// The metric improves upward (for names without a known suffix).
    #[arg(long, conflicts_with = "lower_is_better")]
    pub higher_is_better: bool,
    /// The metric improves downward (for names without a known suffix).
    #[arg(long)]
    pub lower_is_better: bool,
}

/// Runs the gate with fresh `vela eval run` processes and prints the Markdown report.
pub fn ab(args: AbArgs) -> Result<()> {
    let mut runner = ProcessRunner {
        max_rss_kib: args.max_rss.map(|m| m * 1024),
        timeout: args.timeout.map(Duration::from_secs_f64),
        poll: Duration::from_millis(100),
    };
    let (_, md) = ab_with(&args, &mut runner, Duration::from_secs(1))?;
    print!("{md}");
    Ok(())
}

// ---- arms, samples and their order ----

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Arm {
    A,
    B,
}

/// One sample's place in the gate: `index` pairs A_i with B_i whatever the order they ran in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub position: usize,
    pub warm: bool,
    pub arm: Arm,
    pub index: usize,
}

impl Slot {
    pub fn name(&self) -> String {
        let kind = if self.warm { "warm" } else { "rep" };
        let arm = if self.arm == Arm::A { "a" } else { "b" };
        format!("{:02}-{kind}-{arm}", self.position)
    }
}

/// Warm-up A, warm-up B, then pairs (A,B), (B,A), (A,B), … (ABBA).
pub fn schedule(repeats: usize) -> Vec<Slot> {
    let mut v = vec![(true, Arm::A, 0), (true, Arm::B, 0)];
    for i in 0..repeats {
        let (x, y) = if i % 2 == 0 {
            (Arm::A, Arm::B)
        } else {
            (Arm::B, Arm::A)
        };
        v.extend([(false, x, i), (false, y, i)]);
    }
    v.into_iter()
        .enumerate()
        .map(|(position, (warm, arm, index))| Slot {
            position,
            warm,
            arm,
            index,
        })
        .collect()
}

// ---- provenance: the gate's configuration ----

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct FileDigest {
    pub path: PathBuf,
    pub sha256: String,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ArmConfig {
    pub bin: PathBuf,
    pub bin_sha256: String,
    /// The argument string as given, and as split.
    pub args: String,
    pub argv: Vec<String>,
    /// The file named by `--model`/`-m` in the arguments, when it exists.
    pub model: Option<FileDigest>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct GateConfig {
    pub format: String,
    pub a: ArmConfig,
    pub b: ArmConfig,
    pub metric: String,
    pub direction: Direction,
    pub repeats: usize,
    pub floor_pct: f64,
    pub guard_pct: f64,
    /// Execution limits: recorded, but a resume may change them.
    pub max_rss_mib: Option<u64>,
    pub timeout_s: Option<f64>,
    pub created: String,
}

impl GateConfig {
    fn arm(&self, arm: Arm) -> &ArmConfig {
        if arm == Arm::A {
            &self.a
        } else {
            &self.b
        }
    }
}

fn build_config(args: &AbArgs, dir: &Path) -> Result<GateConfig> {
    if args.repeats < 3 {
        bail!("--repeats must be at least 3 (got {})", args.repeats);
    }
    for (name, v) in [("--floor", args.floor), ("--guard", args.guard)] {
        if !v.is_finite() || v < 0.0 {
            bail!("{name} must be a percentage ≥ 0 (got {v})");
        }
    }
    if args.max_rss == Some(0) {
        bail!("--max-rss must be positive");
    }
    if args.timeout.is_some_and(|t| !t.is_finite() || t <= 0.0) {
        bail!("--timeout must be a positive number of seconds");
    }
    let direction = match (args.higher_is_better, args.lower_is_better) {
        (true, true) => bail!("--higher-is-better and --lower-is-better exclude each other"),
        (true, false) => Direction::HigherIsBetter,
        (false, true) => Direction::LowerIsBetter,
        _ => Direction::from_metric(&args.metric).ok_or_else(|| {
            anyhow!(
                "metric {:?}: direction unknown from its name (…_tps/_per_s go up, …_ms/_s/_bytes/_mib go down); \
                 pass --higher-is-better or --lower-is-better",
                args.metric
            )
        })?,
    };
    let arm = |name: &str, bin: &Option<PathBuf>, s: &str| -> Result<ArmConfig> {
        let bin = match bin {
            Some(b) => b.clone(),
            None => std::env::current_exe().context("locating this executable")?,
        };
        let bin = fs::canonicalize(&bin)
            .with_context(|| format!("arm {name}: binary {}", bin.display()))?;
        if !bin.is_file() {
            bail!("arm {name}: binary {} is not a file", bin.display());
        }
        let argv = split_args(s).with_context(|| format!("arm {name}: arguments"))?;
        if argv.iter().any(|a| a == "--out" || a.starts_with("--out=")) {
            bail!("arm {name}: the arguments must not contain --out (the gate gives each sample its own)");
        }
        let model = match model_arg(&argv) {
            Some(p) if Path::new(&p).is_file() => {
                let path = fs::canonicalize(&p)?;
                Some(FileDigest {
                    sha256: sha256_cached(dir, &path)?,
                    path,
                })
            }
            _ => None,
        };
        Ok(ArmConfig {
            bin_sha256: sha256_cached(dir, &bin)?,
            bin,
            args: s.to_string(),
            argv,
            model,
        })
    };
    let (a, b) = (
        arm("A", &args.a_bin, &args.a)?,
        arm("B", &args.b_bin, &args.b)?,
    );
    if let (Some(ma), Some(mb)) = (&a.model, &b.model) {
        if ma.sha256 != mb.sha256 {
            bail!(
                "the arms use different model files ({} vs {}): the model is not an A/B axis",
                ma.path.display(),
                mb.path.display()
            );
        }
    }
    if a.bin_sha256 == b.bin_sha256 && a.argv == b.argv {
        eprintln!("note: the arms are identical (an A/A run measures the noise)");
    } else if a.bin_sha256 != b.bin_sha256 && a.argv != b.argv {
        eprintln!("note: the arms differ in both binary and arguments: more than one axis");
    }
    Ok(GateConfig {
        format: CONFIG_FORMAT.into(),
        a,
        b,
        metric: args.metric.clone(),
        direction,
        repeats: args.repeats,
        floor_pct: args.floor,
        guard_pct: args.guard,
        max_rss_mib: args.max_rss,
        timeout_s: args.timeout,
        created: utc(SystemTime::now()),
    })
}

/// The value of `--model PATH`, `--model=PATH` or `-m PATH`.
fn model_arg(argv: &[String]) -> Option<String> {
    argv.iter().enumerate().find_map(|(i, a)| match a.as_str() {
        "--model" | "-m" => argv.get(i + 1).cloned(),
        _ => a.strip_prefix("--model=").map(str::to_string),
    })
}

/// The fields that make a gate what it is: a resume must match them all.
fn identity(c: &GateConfig) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = [
        ("format", c.format.clone()),
        ("metric", c.metric.clone()),
        ("direction", format!("{:?}", c.direction)),
        ("repeats", c.repeats.to_string()),
        ("floor", c.floor_pct.to_string()),
        ("guard", c.guard_pct.to_string()),
    ]
    .map(|(k, v)| (k.to_string(), v))
    .into();
    for (n, a) in [("A", &c.a), ("B", &c.b)] {
        let model = a.model.as_ref().map_or("none".into(), |m| m.sha256.clone());
        v.push((format!("arm {n} binary sha256"), a.bin_sha256.clone()));
        v.push((format!("arm {n} args"), format!("{:?}", a.args)));
        v.push((format!("arm {n} model sha256"), model));
    }
    v
}

/// What differs between the stored gate and this invocation (empty: the same gate).
fn config_diffs(old: &GateConfig, new: &GateConfig) -> Vec<String> {
    let pairs = identity(old).into_iter().zip(identity(new));
    pairs
        .filter(|(x, y)| x.1 != y.1)
        .map(|((k, x), (_, y))| format!("{k}: {x} → {y}"))
        .collect()
}

// ---- running one sample ----

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
pub struct ExitInfo {
    pub code: Option<i32>,
    /// The terminating signal (unix), when there was no exit code.
    pub signal: Option<i32>,
}

impl ExitInfo {
    pub const OK: ExitInfo = ExitInfo {
        code: Some(0),
        signal: None,
    };
    fn success(&self) -> bool {
        self.code == Some(0)
    }
    fn from_status(s: ExitStatus) -> ExitInfo {
        #[cfg(unix)]
        let signal = std::os::unix::process::ExitStatusExt::signal(&s);
        #[cfg(not(unix))]
        let signal = None;
        ExitInfo {
            code: s.code(),
            signal,
        }
    }
}

impl std::fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match (self.code, self.signal) {
            (Some(c), _) => write!(f, "exit status {c}"),
            (None, Some(s)) => write!(f, "signal {s}"),
            _ => write!(f, "unknown exit"),
        }
    }
}

/// What running one sample gave: the gate judges it (exit, kill, summary) in one place.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub exit: ExitInfo,
    /// Why the supervisor killed the child (RSS budget, timeout); `None` if it ended by itself.
    pub killed: Option<String>,
    pub peak_rss_mib: Option<f64>,
    /// The child's `summary.json` (`None` when it wrote none).
    pub summary: Option<Value>,
}

/// Runs one sample of `arm` into the empty directory `dir`: the real one spawns a process, tests
/// use fakes with known numbers.
pub trait SampleRunner {
    fn run(&mut self, arm: &ArmConfig, slot: &Slot, dir: &Path) -> Result<Outcome>;
}

/// `BIN eval run ARGV... --out DIR`, stdout/stderr to `DIR/{stdout,stderr}.txt`, supervised:
/// VmRSS polled every `poll`, killed over `max_rss_kib` or past `timeout`. Only the direct child
/// is measured and killed (`vela eval run` is one process); its peak RSS is the highest VmHWM a
/// poll saw, so a child shorter than one poll has no meaningful peak.
pub struct ProcessRunner {
    pub max_rss_kib: Option<u64>,
    pub timeout: Option<Duration>,
    pub poll: Duration,
}

impl SampleRunner for ProcessRunner {
    fn run(&mut self, arm: &ArmConfig, _slot: &Slot, dir: &Path) -> Result<Outcome> {
        let mut cmd = Command::new(&arm.bin);
        cmd.args(["eval", "run"])
            .args(&arm.argv)
            .arg("--out")
            .arg(dir)
            .stdin(Stdio::null());
        cmd.stdout(File::create(dir.join("stdout.txt"))?)
            .stderr(File::create(dir.join("stderr.txt"))?);
        let mut child =
            spawn(&mut cmd).with_context(|| format!("starting {}", arm.bin.display()))?;
        let t0 = Instant::now();
        let (mut peak_kib, mut killed) = (None::<u64>, None);
        let status = loop {
            if let Some(s) = child.try_wait()? {
                break s;
            }
            if let Some((rss, hwm)) = proc_rss_kib(child.id()) {
                peak_kib = Some(peak_kib.unwrap_or(0).max(rss).max(hwm));
                if let Some(max) = self.max_rss_kib.filter(|&m| rss > m) {
                    killed = Some(format!(
                        "rss budget exceeded: {} MiB > {} MiB",
                        rss / 1024,
                        max / 1024
                    ));
                }
            }
            if let Some(t) = self
                .timeout
                .filter(|&t| killed.is_none() && t0.elapsed() > t)
            {
                killed = Some(format!("timeout after {:.1} s", t.as_secs_f64()));
            }
            if killed.is_some() {
                let _ = child.kill();
                break child.wait()?;
            }
            std::thread::sleep(self.poll);
        };
        let exit = ExitInfo::from_status(status);
        let path = dir.join("summary.json");
        let summary = if killed.is_none() && exit.success() && path.exists() {
            let text = fs::read_to_string(&path)?;
            Some(
                serde_json::from_str(&text)
                    .with_context(|| format!("unparsable summary {}", path.display()))?,
            )
        } else {
            None
        };
        Ok(Outcome {
            exit,
            killed,
            peak_rss_mib: peak_kib.map(|k| k as f64 / 1024.0),
            summary,
        })
    }
}

/// Spawns, retrying briefly on ETXTBSY (a just-written executable whose write handle another
/// thread's fork still holds).
fn spawn(cmd: &mut Command) -> std::io::Result<std::process::Child> {
    for _ in 0..50 {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(26) => std::thread::sleep(Duration::from_millis(20)),
            r => return r,
        }
    }
    cmd.spawn()
}

/// (VmRSS, VmHWM) in KiB from /proc/PID/status; `None` off Linux or once the process is gone.
fn proc_rss_kib(pid: u32) -> Option<(u64, u64)> {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |k: &str| {
        s.lines().find_map(|l| {
            l.strip_prefix(k)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
    };
    let rss = field("VmRSS:")?;
    Some((rss, field("VmHWM:").unwrap_or(rss)))
}

/// Host load around a sample: 1-minute loadavg before and after, CPU busy % over a window before.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Default)]
pub struct HostLoad {
    pub load1_before: Option<f64>,
    pub cpu_busy_pct_before: Option<f64>,
    pub load1_after: Option<f64>,
}

fn load1() -> Option<f64> {
    fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// (busy, total) jiffies from /proc/stat's first line (idle and iowait are not busy).
fn cpu_jiffies() -> Option<(u64, u64)> {
    let s = fs::read_to_string("/proc/stat").ok()?;
    let v: Vec<u64> = s
        .lines()
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace()
        .take(8)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    let total: u64 = v.iter().sum();
    Some((total - v[3] - v.get(4).copied().unwrap_or(0), total))
}

fn cpu_busy_pct(window: Duration) -> Option<f64> {
    let a = cpu_jiffies();
    std::thread::sleep(window);
    let (b, a) = (cpu_jiffies()?, a?);
    let dt = b.1.checked_sub(a.1).filter(|&d| d > 0)?;
    Some(b.0.saturating_sub(a.0) as f64 * 100.0 / dt as f64)
}

// ---- records ----

/// `samples/NN-{warm|rep}-{a|b}.json`: one completed, valid sample.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct SampleRecord {
    pub format: String,
    pub name: String,
    pub arm: Arm,
    /// "warm" or "rep".
    pub kind: String,
    /// The repeat index: pair i is (A_i, B_i). 0 for the warm-ups.
    pub index: usize,
    /// The place in the run order.
    pub position: usize,
    pub metric: String,
    pub value: f64,
    /// The child's whole summary.json.
    pub summary: Value,
    pub wall_s: f64,
    pub exit: ExitInfo,
    pub host: HostLoad,
    /// The child's peak resident memory as the supervisor saw it (`None` off Linux).
    pub peak_rss_mib: Option<f64>,
    pub sample_dir: PathBuf,
    pub started: String,
}

/// The metric's value in a child's summary, or why the summary is not a usable sample.
fn metric_value(s: &Value, metric: &str) -> Result<f64> {
    let format = s.get("format").and_then(Value::as_str).unwrap_or("(none)");
    if format != SUMMARY_FORMAT {
        bail!("summary format {format:?}, expected {SUMMARY_FORMAT:?}");
    }
    let status = s
        .get("status")
        .and_then(Value::as_str)
        .unwrap_or("(missing)");
    if status != "ok" {
        bail!("status: {status}");
    }
    let metrics = s
        .get("metrics")
        .and_then(Value::as_object)
        .ok_or_else(|| anyhow!("summary has no metrics object"))?;
    match metrics.get(metric).and_then(Value::as_f64) {
        Some(v) if v.is_finite() => Ok(v),
        Some(v) => bail!("metric {metric:?} is {v}"),
        None => {
            let have: Vec<&str> = metrics
                .iter()
                .filter(|(_, v)| v.is_number())
                .map(|(k, _)| k.as_str())
                .collect();
            bail!(
                "metric {metric:?} not in the summary (it has: {})",
                have.join(", ")
            )
        }
    }
}

/// The inputs a child reports: (workload digest, model sha256 without a `sha256:` prefix).
fn child_inputs(s: &Value) -> Result<(String, Option<String>)> {
    let wd = s
        .pointer("/workload/digest")
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("summary lacks workload.digest"))?;
    let ms = s
        .pointer("/model/sha256")
        .and_then(Value::as_str)
        .map(|m| m.trim_start_matches("sha256:").to_string());
    Ok((wd.to_string(), ms))
}

/// All samples of both arms must have run the same workload on the same model, and the model the
/// gate hashed from the arguments.
fn check_consistency<'a>(
    cfg: &GateConfig,
    recs: impl Iterator<Item = &'a SampleRecord>,
) -> Result<()> {
    let mut first: Option<(String, String, Option<String>)> = None;
    for r in recs {
        let (wd, ms) = child_inputs(&r.summary).with_context(|| format!("sample {}", r.name))?;
        if let Some((n0, wd0, ms0)) = &first {
            let why = "the arms differ in more than the intended axis, or the inputs changed";
            if &wd != wd0 {
                bail!(
                    "workload digest differs: sample {n0} has {wd0}, sample {} has {wd}: {why}",
                    r.name
                );
            }
            if &ms != ms0 {
                bail!(
                    "model sha256 differs: sample {n0} has {ms0:?}, sample {} has {ms:?}: {why}",
                    r.name
                );
            }
        } else {
            first = Some((r.name.clone(), wd, ms.clone()));
        }
        if let (Some(m), Some(f)) = (&ms, &cfg.arm(r.arm).model) {
            if m != &f.sha256 {
                bail!(
                    "sample {} reports model sha256 {m}, but {} hashes to {}",
                    r.name,
                    f.path.display(),
                    f.sha256
                );
            }
        }
    }
    Ok(())
}

/// The record at `path` if it is a whole, valid record of `slot` under `cfg`.
fn load_record(path: &Path, slot: &Slot, cfg: &GateConfig) -> Result<SampleRecord> {
    let r: SampleRecord = serde_json::from_str(&fs::read_to_string(path)?)?;
    let kind = if slot.warm { "warm" } else { "rep" };
    let ok = r.format == SAMPLE_FORMAT
        && r.name == slot.name()
        && (r.arm, r.kind.as_str(), r.index, r.position)
            == (slot.arm, kind, slot.index, slot.position)
        && r.exit.success();
    if !ok {
        bail!("not a record of this sample");
    }
    if metric_value(&r.summary, &cfg.metric)? != r.value {
        bail!("its value does not match its summary");
    }
    Ok(r)
}

fn record_failure(dir: &Path, r: &SampleRecord, why: &str, stderr_tail: &str) -> Result<()> {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    let mut v = serde_json::to_value(r)?;
    v["format"] = json!(FAILURE_FORMAT);
    v["reason"] = json!(why);
    v["stderr_tail"] = json!(stderr_tail);
    let path = dir.join("failures").join(format!("{}-{ms}.json", r.name));
    write_atomic(&path, serde_json::to_string_pretty(&v)?.as_bytes())
}

/// The last few lines of a child's stderr, on one line.
fn stderr_tail(run_dir: &Path) -> String {
    let s = fs::read_to_string(run_dir.join("stderr.txt")).unwrap_or_default();
    let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(5)..].join(" | ");
    let skip = tail.chars().count().saturating_sub(600);
    if tail.is_empty() {
        "(empty)".into()
    } else {
        tail.chars().skip(skip).collect()
    }
}

fn run_slot(
    dir: &Path,
    cfg: &GateConfig,
    slot: &Slot,
    runner: &mut dyn SampleRunner,
    window: Duration,
    done: &[&SampleRecord],
) -> Result<SampleRecord> {
    let name = slot.name();
    let run_dir = dir.join("runs").join(&name);
    if run_dir.exists() {
        fs::remove_dir_all(&run_dir).with_context(|| format!("clearing {}", run_dir.display()))?;
    }
    fs::create_dir_all(&run_dir)?;
    let (load1_before, cpu_busy_pct_before) = (load1(), cpu_busy_pct(window));
    let started = utc(SystemTime::now());
    let t0 = Instant::now();
    let out = runner
        .run(cfg.arm(slot.arm), slot, &run_dir)
        .with_context(|| format!("sample {name}"))?;
    let host = HostLoad {
        load1_before,
        cpu_busy_pct_before,
        load1_after: load1(),
    };
    let mut rec = SampleRecord {
        format: SAMPLE_FORMAT.into(),
        name: name.clone(),
        arm: slot.arm,
        kind: (if slot.warm { "warm" } else { "rep" }).into(),
        index: slot.index,
        position: slot.position,
        metric: cfg.metric.clone(),
        value: f64::NAN,
        summary: out.summary.clone().unwrap_or(Value::Null),
        wall_s: t0.elapsed().as_secs_f64(),
        exit: out.exit,
        host,
        peak_rss_mib: out.peak_rss_mib,
        sample_dir: run_dir.clone(),
        started,
    };
    let failure = match (&out.killed, &out.summary) {
        (Some(k), _) => Some(format!("killed: {k}")),
        _ if !out.exit.success() => Some(format!("{}", out.exit)),
        (_, None) => Some("exited 0 but wrote no summary.json".into()),
        (_, Some(s)) => match metric_value(s, &cfg.metric) {
            Ok(v) => {
                rec.value = v;
                let all = done.iter().copied().chain([&rec]);
                check_consistency(cfg, all).err().map(|e| format!("{e:#}"))
            }
            Err(e) => Some(format!("{e:#}")),
        },
    };
    if let Some(why) = failure {
        let tail = stderr_tail(&run_dir);
        record_failure(dir, &rec, &why, &tail)?;
        let arm = if slot.arm == Arm::A { "A" } else { "B" };
        bail!(
            "sample {name} (arm {arm}) failed: {why}; sample dir {}; stderr tail: {tail}",
            run_dir.display()
        );
    }
    write_atomic(
        &dir.join("samples").join(format!("{name}.json")),
        serde_json::to_string_pretty(&rec)?.as_bytes(),
    )?;
    Ok(rec)
}

// ---- the gate ----

/// The whole gate with a given runner; returns (ab.json's value, ab.md's text).
pub fn ab_with(
    args: &AbArgs,
    runner: &mut dyn SampleRunner,
    load_window: Duration,
) -> Result<(Value, String)> {
    let dir = &args.out;
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let new = build_config(args, dir)?;
    let cfg_path = dir.join("gate-config.json");
    let (cfg, resuming) = if cfg_path.exists() {
        let old: GateConfig = serde_json::from_str(&fs::read_to_string(&cfg_path)?)
            .with_context(|| format!("reading {}", cfg_path.display()))?;
        let d = config_diffs(&old, &new);
        if !d.is_empty() {
            bail!(
                "{} holds a different gate ({}); use another --out",
                dir.display(),
                d.join("; ")
            );
        }
        (
            GateConfig {
                max_rss_mib: new.max_rss_mib,
                timeout_s: new.timeout_s,
                ..old
            },
            true,
        )
    } else {
        write_atomic(&cfg_path, serde_json::to_string_pretty(&new)?.as_bytes())?;
        (new, false)
    };
    let slots = schedule(cfg.repeats);
    let mut recs: BTreeMap<usize, SampleRecord> = BTreeMap::new();
    for s in &slots {
        let path = dir.join("samples").join(format!("{}.json", s.name()));
        if path.exists() {
            match load_record(&path, s, &cfg) {
                Ok(r) => {
                    recs.insert(s.position, r);
                }
                Err(e) => eprintln!("ignoring sample record {}: {e:#}", path.display()),
            }
        }
    }
    check_consistency(&cfg, recs.values())?;
    if resuming {
        eprintln!("resuming: {} of {} samples done", recs.len(), slots.len());
    }
    for s in &slots {
        if !recs.contains_key(&s.position) {
            eprintln!("sample {} of {}: {}", s.position + 1, slots.len(), s.name());
            let done: Vec<&SampleRecord> = recs.values().collect();
            let r = run_slot(dir, &cfg, s, runner, load_window, &done)?;
            recs.insert(s.position, r);
        }
    }
    let recs: Vec<SampleRecord> = recs.into_values().collect();
    let (report, md) = report(&cfg, &recs)?;
    write_atomic(
        &dir.join("ab.json"),
        serde_json::to_string_pretty(&report)?.as_bytes(),
    )?;
    write_atomic(&dir.join("ab.md"), md.as_bytes())?;
    Ok((report, md))
}

/// ab.json's value and ab.md's text from the complete set of records.
fn report(cfg: &GateConfig, recs: &[SampleRecord]) -> Result<(Value, String)> {
    let reps = |arm: Arm| -> Vec<f64> {
        let mut v: Vec<&SampleRecord> = recs
            .iter()
            .filter(|r| r.arm == arm && r.kind == "rep")
            .collect();
        v.sort_by_key(|r| r.index);
        v.iter().map(|r| r.value).collect()
    };
    let warm = |arm: Arm| {
        recs.iter()
            .find(|r| r.arm == arm && r.kind == "warm")
            .map(|r| r.value)
    };
    let (va, vb) = (reps(Arm::A), reps(Arm::B));
    let (da, db) = (stats::describe(&va)?, stats::describe(&vb)?);
    let p = stats::paired(&va, &vb, cfg.direction)?;
    let (verdict, reason) = stats::verdict(&p, cfg.floor_pct, cfg.guard_pct);
    let (drift_a, drift_b) = (stats::drift_pct(&va), stats::drift_pct(&vb));
    // Host readings over all samples as [min, max].
    let range = |f: fn(&HostLoad) -> Option<f64>| {
        let v = recs.iter().filter_map(|r| f(&r.host));
        v.clone().reduce(f64::min).zip(v.reduce(f64::max))
    };
    let load_before = range(|h| h.load1_before);
    let busy_before = range(|h| h.cpu_busy_pct_before);
    let load_after = range(|h| h.load1_after);
    let first = &recs.first().ok_or_else(|| anyhow!("no samples"))?.summary;
    let (workload, model_sha) = (&first["workload"], child_inputs(first)?.1);
    let arm = |c: &ArmConfig, d: &stats::Describe, v: &[f64], drift: Option<f64>, a: Arm| {
        json!({"bin": c.bin, "bin_sha256": c.bin_sha256, "args": c.args, "model": c.model, "values": v,
               "warmup": warm(a), "n": d.n, "mean": d.mean, "sd": d.sd, "cv_pct": d.cv_pct, "drift_pct": drift})
    };
    let pct = |x: f64| x * 100.0;
    let samples: Vec<Value> = recs
        .iter()
        .map(|r| {
            json!({"name": r.name, "arm": r.arm, "kind": r.kind, "index": r.index, "position": r.position,
                   "value": r.value, "wall_s": r.wall_s, "peak_rss_mib": r.peak_rss_mib, "host": r.host})
        })
        .collect();
    let finished = utc(SystemTime::now());
    let report = json!({
        "format": REPORT_FORMAT, "metric": cfg.metric, "direction": cfg.direction, "repeats": cfg.repeats,
        "floor_pct": cfg.floor_pct, "guard_pct": cfg.guard_pct,
        "arms": {"a": arm(&cfg.a, &da, &va, drift_a, Arm::A), "b": arm(&cfg.b, &db, &vb, drift_b, Arm::B)},
        "paired": {"n": p.n, "diffs_pct": p.diffs.iter().map(|&d| pct(d)).collect::<Vec<_>>(),
                   "mean_pct": pct(p.mean), "sd_pct": pct(p.sd), "t": p.t,
                   "lower95_pct": pct(p.lower), "upper95_pct": pct(p.upper)},
        "verdict": verdict.as_str(), "reason": reason,
        "provenance": {"config": "gate-config.json", "created": cfg.created, "finished": finished,
                       "workload": workload, "model_sha256": model_sha,
                       "host": {"load1_before": load_before, "cpu_busy_pct_before": busy_before,
                                "load1_after": load_after}},
        "samples": samples,
    });
    // The Markdown view of the same numbers.
    let row = |n: &str, d: &stats::Describe, a: Arm| {
        let w = warm(a).map_or("–".into(), |w| format!("{w:.3}"));
        format!(
            "| {n} | {} | {:.3} | {:.3} | {:.2} | {w} |",
            d.n, d.mean, d.sd, d.cv_pct
        )
    };
    let (row_a, row_b) = (row("A", &da, Arm::A), row("B", &db, Arm::B));
    let (mean, lower, upper) = (pct(p.mean), pct(p.lower), pct(p.upper));
    let drift = |d: Option<f64>| d.map_or("–".into(), |d| format!("{d:+.2} %"));
    let (drift_a, drift_b) = (drift(drift_a), drift(drift_b));
    let arm_line = |n: &str, c: &ArmConfig| {
        format!(
            "- arm {n}: `{}` (sha256 `{}`), args `{}`",
            c.bin.display(),
            c.bin_sha256,
            c.args
        )
    };
    let (arm_a, arm_b) = (arm_line("A", &cfg.a), arm_line("B", &cfg.b));
    let wl_name = workload["name"].as_str().unwrap_or("?");
    let wl_digest = workload["digest"].as_str().unwrap_or("?");
    let model = model_sha.as_deref().unwrap_or("(not reported)");
    let rng = |r: Option<(f64, f64)>| r.map_or("n/a".into(), |(a, b)| format!("{a:.2}–{b:.2}"));
    let (load_before, busy_before, load_after) =
        (rng(load_before), rng(busy_before), rng(load_after));
    let (metric, dir, verdict, n) = (&cfg.metric, cfg.direction.describe(), verdict.as_str(), p.n);
    let (repeats, created, count) = (cfg.repeats, &cfg.created, recs.len());
    let md = format!(
        "# A/B gate: `{metric}` ({dir})

| arm | n | mean | sd | CV % | warm-up (excluded) |
|---|---:|---:|---:|---:|---:|
{row_a}
{row_b}

| paired difference (B vs A, + = B better) | mean | 95 % lower | 95 % upper |
|---|---:|---:|---:|
| % over {n} pairs | {mean:+.2} | {lower:+.2} | {upper:+.2} |

**Verdict: {verdict}** — {reason}.

Drift, second half vs first half of the samples: A {drift_a}, B {drift_b}.

## Provenance

{arm_a}
{arm_b}
- workload: {wl_name} `{wl_digest}`
- model sha256: `{model}`
- host before the samples: loadavg (1 min) {load_before}, CPU busy {busy_before} %; after: loadavg {load_after}
- {count} samples (2 warm-up + {repeats} pairs, ABBA), created {created}, finished {finished}
"
    );
    Ok((report, md))
}

// ---- small utilities ----

/// Splits an argument string like a POSIX shell (no expansions): whitespace separates words;
/// '…' is literal; "…" keeps its content, with \" \\ \$ \` escaped; a backslash outside quotes
/// escapes the next character (backslash-newline joins lines).
pub fn split_args(s: &str) -> Result<Vec<String>> {
    let (mut out, mut cur, mut word) = (Vec::new(), String::new(), false);
    let mut it = s.chars();
    while let Some(c) = it.next() {
        match c {
            c if c.is_whitespace() => {
                if word {
                    out.push(std::mem::take(&mut cur));
                    word = false;
                }
            }
            '\'' => {
                word = true;
                loop {
                    match it.next() {
                        Some('\'') => break,
                        Some(c) => cur.push(c),
                        None => bail!("unterminated single quote in {s:?}"),
                    }
                }
            }
            '"' => {
                word = true;
                loop {
                    match it.next() {
                        Some('"') => break,
                        Some('\\') => match it.next() {
                            Some(c @ ('"' | '\\' | '$' | '`')) => cur.push(c),
                            Some('\n') => {}
                            Some(c) => cur.extend(['\\', c]),
                            None => bail!("unterminated double quote in {s:?}"),
                        },
                        Some(c) => cur.push(c),
                        None => bail!("unterminated double quote in {s:?}"),
                    }
                }
            }
            '\\' => match it.next() {
                Some('\n') => {}
                Some(c) => {
                    word = true;
                    cur.push(c);
                }
                None => bail!("trailing backslash in {s:?}"),
            },
            c => {
                word = true;
                cur.push(c);
            }
        }
    }
    if word {
        out.push(cur);
    }
    Ok(out)
}

/// Writes via a temp file in the same directory, fsync, rename, then fsyncs the directory.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let parent = path
        .parent()
        .ok_or_else(|| anyhow!("{} has no directory", path.display()))?;
    fs::create_dir_all(parent)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = parent.join(format!(".{name}.tmp"));
    let write = || -> std::io::Result<()> {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        File::open(parent)?.sync_all()
    };
    write().with_context(|| format!("writing {}", path.display()))
}

#[derive(Serialize, Deserialize)]
struct CacheEntry {
    size: u64,
    mtime_ns: u128,
    sha256: String,
}

/// A file's sha256 (streamed), cached in `dir/hash-cache.json` by path, size and mtime.
fn sha256_cached(dir: &Path, path: &Path) -> Result<String> {
    let meta = fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    let mtime_ns = meta
        .modified()?
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let cache_path = dir.join("hash-cache.json");
    let mut cache: BTreeMap<String, CacheEntry> = fs::read_to_string(&cache_path)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_default();
    let key = path.display().to_string();
    if let Some(e) = cache
        .get(&key)
        .filter(|e| e.size == meta.len() && e.mtime_ns == mtime_ns)
    {
        return Ok(e.sha256.clone());
    }
    let mut f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let (mut h, mut buf) = (Sha256::new(), vec![0u8; 1 << 20]);
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    let sha256: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    cache.insert(
        key,
        CacheEntry {
            size: meta.len(),
            mtime_ns,
            sha256: sha256.clone(),
        },
    );
    write_atomic(
        &cache_path,
        serde_json::to_string_pretty(&cache)?.as_bytes(),
    )?;
    Ok(sha256)
}

/// RFC 3339 UTC time, second precision.
fn utc(t: SystemTime) -> String {
    let s = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    // Civil date from days since the epoch (H. Hinnant's algorithm).
    let z = (s / 86400) as i64 + 719_468;
    let (era, doe) = (z.div_euclid(146_097), z.rem_euclid(146_097));
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let (d, m) = (
        doy - (153 * mp + 2) / 5 + 1,
        if mp < 10 { mp + 3 } else { mp - 9 },
    );
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        s % 86400 / 3600,
        s % 3600 / 60,
        s % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// A fake runner: `f` gives each slot's outcome; `calls` lists the slots run, in order.
    struct Fake<F: FnMut(&Slot, &Path) -> Outcome> {
        f: F,
        calls: Vec<String>,
    }

    impl<F: FnMut(&Slot, &Path) -> Outcome> SampleRunner for Fake<F> {
        fn run(&mut self, _arm: &ArmConfig, slot: &Slot, dir: &Path) -> Result<Outcome> {
            self.calls.push(slot.name());
            Ok((self.f)(slot, dir))
        }
    }

    fn fake<F: FnMut(&Slot, &Path) -> Outcome>(f: F) -> Fake<F> {
        Fake {
            f,
            calls: Vec::new(),
        }
    }

    fn summary(v: f64) -> Value {
        json!({"format": SUMMARY_FORMAT, "status": "ok", "workload": {"name": "w", "digest": "sha256:w1"},
               "model": null, "metrics": {"decode_tps": v, "ttft_ms": 800.0}})
    }

    fn ok(s: Value) -> Outcome {
        Outcome {
            exit: ExitInfo::OK,
            killed: None,
            peak_rss_mib: None,
            summary: Some(s),
        }
    }

    /// A: 100 + i; B: 110 + i (+10 % to +9.1 %); warm-ups 1000 (must not count).
    fn good(s: &Slot, _: &Path) -> Outcome {
        let base = if s.arm == Arm::A { 100.0 } else { 110.0 };
        ok(summary(if s.warm {
            1000.0
        } else {
            base + s.index as f64
        }))
    }

    fn args(tmp: &Path) -> AbArgs {
        let bin = tmp.join("vela-fake");
        fs::write(&bin, "not a real binary").unwrap();
        AbArgs {
            a: "--workload w.json --ctx 4096".into(),
            b: "--workload w.json --ctx '8192'".into(),
            a_bin: Some(bin.clone()),
            b_bin: Some(bin),
            metric: "decode_tps".into(),
            repeats: 3,
            floor: 3.0,
            guard: 2.0,
            out: tmp.join("gate"),
            max_rss: None,
            timeout: None,
            higher_is_better: false,
            lower_is_better: false,
        }
    }

    fn sample_files(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir.join("samples"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn split_args_like_a_shell() {
        let s = |x: &str| split_args(x).unwrap();
        assert_eq!(
            s("  --model a.gguf\t-n 8 "),
            ["--model", "a.gguf", "-n", "8"]
        );
        assert_eq!(s(""), Vec::<String>::new());
        assert_eq!(
            s(r#"--prompt 'it''s "raw" \n' x"#),
            ["--prompt", r#"its "raw" \n"#, "x"]
        );
        assert_eq!(
            s(r#"--p "a \"b\" \\ \$x \n" ''"#),
            ["--p", r#"a "b" \ $x \n"#, ""]
        );
        assert_eq!(s(r"a\ b c\\d \'"), ["a b", r"c\d", "'"]);
        assert_eq!(s("a\\\nb"), ["ab"]);
        assert_eq!(s("x=\"1 2\"y"), ["x=1 2y"]);
        for bad in ["'open", "\"open", "trailing\\", "\"esc\\"] {
            assert!(split_args(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cli_parses_hyphenated_arm_args() {
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            ab: AbArgs,
        }
        let c = Cli::try_parse_from([
            "vela",
            "--a",
            "--model x.gguf --ctx 4096",
            "--b=--model x.gguf",
            "--out",
            "/tmp/g",
            "--max-rss",
            "512",
        ])
        .unwrap();
        assert_eq!(
            (c.ab.a.as_str(), c.ab.b.as_str()),
            ("--model x.gguf --ctx 4096", "--model x.gguf")
        );
        assert_eq!(
            (
                c.ab.metric.as_str(),
                c.ab.repeats,
                c.ab.floor,
                c.ab.guard,
                c.ab.max_rss
            ),
            ("decode_tps", 3, 3.0, 2.0, Some(512))
        );
        assert!(Cli::try_parse_from([
            "vela",
            "--a",
            "",
            "--b",
            "",
            "--out",
            "d",
            "--higher-is-better",
            "--lower-is-better"
        ])
        .is_err());
    }

    #[test]
    fn abba_order_and_warmup_exclusion() {
        let tmp = tempfile::tempdir().unwrap();
        let mut a = args(tmp.path());
        a.repeats = 4;
        let mut r = fake(good);
        let (rep, md) = ab_with(&a, &mut r, Duration::ZERO).unwrap();
        let order = [
            "00-warm-a",
            "01-warm-b",
            "02-rep-a",
            "03-rep-b",
            "04-rep-b",
            "05-rep-a",
            "06-rep-a",
            "07-rep-b",
            "08-rep-b",
            "09-rep-a",
        ];
        assert_eq!(r.calls, order);
        let files: Vec<String> = order.iter().map(|n| format!("{n}.json")).collect();
        assert_eq!(sample_files(&a.out), files);
        // Pair 1 ran B first but is still (A_1, B_1).
        let rec: SampleRecord =
            serde_json::from_str(&fs::read_to_string(a.out.join("samples/04-rep-b.json")).unwrap())
                .unwrap();
        assert_eq!(
            (
                rec.arm,
                rec.kind.as_str(),
                rec.index,
                rec.position,
                rec.value
            ),
            (Arm::B, "rep", 1, 4, 111.0)
        );
        assert_eq!(rec.summary, summary(111.0));
        assert_eq!(rec.sample_dir, a.out.join("runs/04-rep-b"));
        assert_eq!(
            rep["arms"]["a"]["values"],
            json!([100.0, 101.0, 102.0, 103.0])
        );
        assert_eq!(
            rep["arms"]["b"]["values"],
            json!([110.0, 111.0, 112.0, 113.0])
        );
        assert_eq!(
            (
                rep["arms"]["a"]["mean"].as_f64(),
                rep["arms"]["a"]["warmup"].as_f64()
            ),
            (Some(101.5), Some(1000.0))
        );
        let d1 = rep["paired"]["diffs_pct"][1].as_f64().unwrap();
        assert!((d1 - (111.0 / 101.0 - 1.0) * 100.0).abs() < 1e-9);
        assert_eq!(rep["verdict"], "promote");
        assert_eq!(rep["provenance"]["workload"]["digest"], "sha256:w1");
        assert!(
            md.contains("**Verdict: promote**") && md.contains("| A | 4 | 101.500 |"),
            "{md}"
        );
        let on_disk: Value =
            serde_json::from_str(&fs::read_to_string(a.out.join("ab.json")).unwrap()).unwrap();
        assert_eq!(
            (&on_disk["verdict"], &on_disk["arms"]),
            (&rep["verdict"], &rep["arms"])
        );
        assert_eq!(fs::read_to_string(a.out.join("ab.md")).unwrap(), md);
        let cfg: GateConfig =
            serde_json::from_str(&fs::read_to_string(a.out.join("gate-config.json")).unwrap())
                .unwrap();
        assert_eq!(cfg.b.argv, ["--workload", "w.json", "--ctx", "8192"]);
        assert_eq!(cfg.a.bin_sha256.len(), 64);
    }

    #[test]
    fn resume_runs_only_missing_samples() {
        let tmp = tempfile::tempdir().unwrap();
        let a = args(tmp.path());
        // The 4th sample (03-rep-b) fails.
        let mut n = 0;
        let mut r = fake(|s: &Slot, dir: &Path| {
            n += 1;
            if n < 4 {
                return good(s, dir);
            }
            fs::write(dir.join("stderr.txt"), "loading\nboom: out of luck\n").unwrap();
            Outcome {
                exit: ExitInfo {
                    code: Some(3),
                    signal: None,
                },
                killed: None,
                peak_rss_mib: None,
                summary: None,
            }
        });
        let e = format!("{:#}", ab_with(&a, &mut r, Duration::ZERO).unwrap_err());
        assert!(
            e.contains("sample 03-rep-b (arm B) failed: exit status 3")
                && e.contains("boom: out of luck")
                && e.contains("runs/03-rep-b"),
            "{e}"
        );
        assert_eq!(
            sample_files(&a.out),
            ["00-warm-a.json", "01-warm-b.json", "02-rep-a.json"]
        );
        assert_eq!(fs::read_dir(a.out.join("failures")).unwrap().count(), 1);
        // A half-written record and a stale run directory are ignored.
        fs::write(a.out.join("samples/.03-rep-b.json.tmp"), "{\"format\":").unwrap();
        let mut r = fake(good);
        let (rep, _) = ab_with(&a, &mut r, Duration::ZERO).unwrap();
        assert_eq!(
            r.calls,
            ["03-rep-b", "04-rep-b", "05-rep-a", "06-rep-a", "07-rep-b"]
        );
        assert_eq!(rep["verdict"], "promote");
        // Complete: a rerun runs nothing; a corrupt record is rerun alone.
        let mut r = fake(good);
        ab_with(&a, &mut r, Duration::ZERO).unwrap();
        assert!(r.calls.is_empty());
        fs::write(a.out.join("samples/05-rep-a.json"), "{}").unwrap();
        let mut r = fake(good);
        ab_with(&a, &mut r, Duration::ZERO).unwrap();
        assert_eq!(r.calls, ["05-rep-a"]);
        // A different gate in the same directory is refused, naming what differs.
        let mut changed = a.clone();
        changed.b = "--workload w.json --ctx 16384".into();
        changed.repeats = 5;
        let e = format!(
            "{:#}",
            ab_with(&changed, &mut fake(good), Duration::ZERO).unwrap_err()
        );
        assert!(
            e.contains("arm B args") && e.contains("16384") && e.contains("repeats: 3 → 5"),
            "{e}"
        );
    }

    #[test]
    fn bad_samples_and_args_are_clear_errors() {
        let tmp = tempfile::tempdir().unwrap();
        let run = |a: &AbArgs, f: fn(&Slot, &Path) -> Outcome| {
            format!(
                "{:#}",
                ab_with(a, &mut fake(f), Duration::ZERO).unwrap_err()
            )
        };
        let mut a = args(tmp.path());
        a.out = tmp.path().join("aborted");
        let e = run(&a, |s, _| {
            ok(
                json!({"format": SUMMARY_FORMAT, "status": if s.position == 1 { "aborted: rss budget exceeded" } else { "ok" },
                                          "workload": {"digest": "d"}, "metrics": {"decode_tps": 1.0}}),
            )
        });
        assert!(
            e.contains("01-warm-b")
                && e.contains("status: aborted: rss budget exceeded")
                && e.contains("runs/01-warm-b"),
            "{e}"
        );
        a.out = tmp.path().join("nometric");
        a.metric = "prefill_tps".into();
        let e = run(&a, good);
        assert!(
            e.contains("metric \"prefill_tps\" not in the summary (it has: decode_tps, ttft_ms)"),
            "{e}"
        );
        a.out = tmp.path().join("workload");
        a.metric = "decode_tps".into();
        let e = run(&a, |s, d| {
            let mut o = good(s, d);
            if s.arm == Arm::B {
                o.summary.as_mut().unwrap()["workload"]["digest"] = json!("sha256:other");
            }
            o
        });
        assert!(
            e.contains("01-warm-b") && e.contains("workload digest differs"),
            "{e}"
        );
        // The model the gate hashed must be the one the children report.
        a.out = tmp.path().join("model");
        let model = tmp.path().join("m.gguf");
        fs::write(&model, "weights").unwrap();
        a.a = format!("--model {}", model.display());
        a.b = format!("-m {} --ctx 2", model.display());
        let e = run(&a, |s, d| {
            let mut o = good(s, d);
            o.summary.as_mut().unwrap()["model"] =
                json!({"path": "m.gguf", "sha256": "sha256:beef"});
            o
        });
        assert!(
            e.contains("reports model sha256 beef, but") && e.contains("m.gguf hashes to"),
            "{e}"
        );
        let cfg: GateConfig =
            serde_json::from_str(&fs::read_to_string(a.out.join("gate-config.json")).unwrap())
                .unwrap();
        let sha = "9a129038d9a00aed0cf6a7ea059ca50a813449061ab87848cf1a13eafdf33b2c"; // sha256("weights")
        assert_eq!(
            (cfg.a.model.unwrap().sha256, cfg.b.model.unwrap().sha256),
            (sha.into(), sha.into())
        );
        for (f, want) in [
            (
                (|a: &mut AbArgs| a.repeats = 2) as fn(&mut AbArgs),
                "--repeats must be at least 3",
            ),
            (
                |a| a.metric = "quality".into(),
                "pass --higher-is-better or --lower-is-better",
            ),
            (
                |a| a.b_bin = Some("/no/such/vela".into()),
                "arm B: binary /no/such/vela",
            ),
            (
                |a| a.a = "--ctx 'x".into(),
                "arm A: arguments: unterminated single quote",
            ),
            (|a| a.a = "--out x".into(), "must not contain --out"),
            (|a| a.guard = -1.0, "--guard must be a percentage"),
        ] {
            let mut b = args(tmp.path());
            b.out = tmp.path().join("badargs");
            f(&mut b);
            let e = run(&b, good);
            assert!(e.contains(want), "{e}");
        }
    }

    #[test]
    fn hashes_are_cached_by_path_size_mtime() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("x");
        fs::write(&f, "abc").unwrap();
        let sha = sha256_cached(tmp.path(), &f).unwrap();
        assert_eq!(
            sha,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        // A cached digest is trusted while the size and mtime match: plant one and read it back.
        let cache = tmp.path().join("hash-cache.json");
        fs::write(
            &cache,
            fs::read_to_string(&cache).unwrap().replace(&sha, "planted"),
        )
        .unwrap();
        assert_eq!(sha256_cached(tmp.path(), &f).unwrap(), "planted");
        // Same size, new mtime: rehashed.
        fs::write(&f, "abd").unwrap();
        let t = fs::metadata(&f).unwrap().modified().unwrap() + Duration::from_secs(5);
        File::options()
            .write(true)
            .open(&f)
            .unwrap()
            .set_modified(t)
            .unwrap();
        let abd = "a52d159f262b2c6ddb724a61840befc36eb30c88877a4030b65cbe86298449c9";
        assert_eq!(sha256_cached(tmp.path(), &f).unwrap(), abd);
        // New size: rehashed.
        fs::write(&f, "abcd").unwrap();
        let abcd = "88d4266fd4e6338d13b845fcf289579d209c897823b9217da3e161936f031589";
        assert_eq!(sha256_cached(tmp.path(), &f).unwrap(), abcd);
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(
            utc(UNIX_EPOCH + Duration::from_secs(1_709_210_096)),
            "2024-02-29T12:34:56Z"
        );
    }

    #[cfg(unix)]
    #[test]
    fn real_processes_are_supervised() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        // The "vela binary": prints its arguments, writes the summary atomically; --tps sets the value.
        let script = tmp.path().join("fake-vela");
        let body = r#"#!/bin/sh
out=""; tps=""
while [ $# -gt 0 ]; do
  case "$1" in --out) out="$2"; shift 2;; --tps) tps="$2"; shift 2;; --hog) exec python3 -c "$2";;
    --sleep) exec sleep "$2";; *) echo "arg: $1"; shift;; esac
done
echo "to stderr" >&2
printf '{"format":"vela-eval-summary/1","status":"ok","workload":{"name":"t","digest":"sha256:t"},"model":null,"metrics":{"decode_tps":%s}}' "$tps" > "$out/s.tmp"
mv "$out/s.tmp" "$out/summary.json"
"#;
        fs::write(&script, body).unwrap();
        fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
        let mut runner = ProcessRunner {
            max_rss_kib: None,
            timeout: Some(Duration::from_secs(20)),
            poll: Duration::from_millis(20),
        };
        let mut a = args(tmp.path());
        (a.a_bin, a.b_bin) = (Some(script.clone()), Some(script.clone()));
        (a.a, a.b) = ("--tps 10 --name 'x y'".into(), "--tps 11".into());
        let (rep, md) = ab_with(&a, &mut runner, Duration::from_millis(50)).unwrap();
        assert_eq!(rep["verdict"], "promote", "{md}");
        let run = a.out.join("runs/02-rep-a");
        assert_eq!(
            fs::read_to_string(run.join("stdout.txt")).unwrap(),
            "arg: eval\narg: run\narg: --name\narg: x y\n"
        );
        assert_eq!(
            fs::read_to_string(run.join("stderr.txt")).unwrap(),
            "to stderr\n"
        );
        let rec: SampleRecord =
            serde_json::from_str(&fs::read_to_string(a.out.join("samples/02-rep-a.json")).unwrap())
                .unwrap();
        assert_eq!((rec.exit, rec.value), (ExitInfo::OK, 10.0));
        assert!(
            rec.wall_s > 0.0 && rec.host.load1_before.is_some() && rec.host.load1_after.is_some()
        );

        // A child over the RSS budget is killed, recorded as a failure, never as a sample.
        let hog = "x = bytearray(200 << 20)\nfor i in range(0, len(x), 4096): x[i] = 1\nimport time; time.sleep(30)";
        if Command::new("python3")
            .arg("-c")
            .arg("pass")
            .status()
            .is_ok_and(|s| s.success())
        {
            runner.max_rss_kib = Some(100 << 10);
            a.out = tmp.path().join("hog");
            a.a = format!("--hog '{hog}'");
            let t0 = Instant::now();
            let e = format!(
                "{:#}",
                ab_with(&a, &mut runner, Duration::ZERO).unwrap_err()
            );
            assert!(
                e.contains("sample 00-warm-a (arm A) failed: killed: rss budget exceeded")
                    && e.contains("> 100 MiB"),
                "{e}"
            );
            assert!(
                t0.elapsed() < Duration::from_secs(15),
                "not killed promptly"
            );
            assert_eq!(
                fs::read_dir(a.out.join("samples")).map_or(0, |d| d.count()),
                0
            );
            let f = fs::read_dir(a.out.join("failures"))
                .unwrap()
                .next()
                .unwrap()
                .unwrap()
                .path();
            let v: Value = serde_json::from_str(&fs::read_to_string(f).unwrap()).unwrap();
            assert!(
                v["reason"].as_str().unwrap().contains("rss budget")
                    && v["peak_rss_mib"].as_f64().unwrap() > 100.0,
                "{v}"
            );
            assert_eq!(v["exit"]["signal"], 9);
        } else {
            eprintln!("note: python3 not found; the --max-rss kill is not tested");
        }
        // A child past the timeout is killed too.
        runner.timeout = Some(Duration::from_millis(300));
        a.out = tmp.path().join("slow");
        a.a = "--sleep 20 --tps 1".into();
        let e = format!(
            "{:#}",
            ab_with(&a, &mut runner, Duration::ZERO).unwrap_err()
        );
        assert!(e.contains("killed: timeout after 0.3 s"), "{e}");
    }
}
