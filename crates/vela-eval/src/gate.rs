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
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const CONFIG_FORMAT: &str = "vela-eval-ab-config/1";
const SAMPLE_FORMAT: &str = "vela-eval-ab-sample/1";
const FAILURE_FORMAT: &str = "vela-eval-ab-failure/1";
const REPORT_FORMAT: &str = "vela-eval-ab/1";
const SUMMARY_FORMAT: &str = "vela-eval-summary/1";

mod process;
pub use process::*;

use crate::report::write_atomic;

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
mod tests;
