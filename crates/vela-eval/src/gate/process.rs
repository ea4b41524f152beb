//! Running one sample: the child process, its supervision (RSS budget, timeout) and the host's
//! load around it.

use super::*;

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
    pub(super) fn success(&self) -> bool {
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
pub(super) fn spawn(cmd: &mut Command) -> std::io::Result<std::process::Child> {
    for _ in 0..50 {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(26) => std::thread::sleep(Duration::from_millis(20)),
            r => return r,
        }
    }
    cmd.spawn()
}

/// (VmRSS, VmHWM) in KiB from /proc/PID/status; `None` off Linux or once the process is gone.
pub(super) fn proc_rss_kib(pid: u32) -> Option<(u64, u64)> {
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

pub(super) fn load1() -> Option<f64> {
    fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// (busy, total) jiffies from /proc/stat's first line (idle and iowait are not busy).
pub(super) fn cpu_jiffies() -> Option<(u64, u64)> {
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

pub(super) fn cpu_busy_pct(window: Duration) -> Option<f64> {
    let a = cpu_jiffies();
    std::thread::sleep(window);
    let (b, a) = (cpu_jiffies()?, a?);
    let dt = b.1.checked_sub(a.1).filter(|&d| d > 0)?;
    Some(b.0.saturating_sub(a.0) as f64 * 100.0 / dt as f64)
}
