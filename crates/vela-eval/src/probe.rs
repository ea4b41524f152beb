//! The stall probe and memory supervisor: one thread that wakes every 100 ms.
//!
//! Each tick takes a host-timer sample (how late the thread woke: a host stall shows here) and,
//! on a GPU, a device canary (a 4 KiB copy on a stream of its own: how long the device took to
//! get to it while the engine's work ran). Every sample records the engine phase at its start
//! and its end. The same tick samples host RSS (this process, or `--server-pid`) and device
//! memory, keeps the peaks, and trips the abort flag when a budget is exceeded.

use crate::client::Clock;
use crate::metrics::percentile;
use serde::Serialize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const PERIOD: Duration = Duration::from_millis(100);

/// What the engine is doing, as the probe sees it.
pub trait PhaseSource: Send + Sync {
    fn phase(&self) -> &'static str;
}

/// A probe sample.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// `host` (timer overshoot) or `device` (canary completion time).
    pub kind: &'static str,
    /// Run-clock seconds at the sample's start.
    pub t: f64,
    pub ms: f64,
    pub phase_start: &'static str,
    pub phase_end: &'static str,
}

/// A memory sample (MiB).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct MemSample {
    pub t: f64,
    pub rss_mib: Option<f64>,
    pub gpu_mib: Option<f64>,
}

/// Latency distribution of one kind and phase (ms).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StallStats {
    pub kind: &'static str,
    pub phase: &'static str,
    pub count: usize,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

#[derive(Default)]
pub struct Recorded {
    pub samples: Vec<Sample>,
    pub mem: Vec<MemSample>,
    pub errors: Vec<String>,
}

/// Budgets (MiB) whose excess stops the run.
#[derive(Debug, Clone, Copy, Default)]
pub struct Budget {
    pub max_rss_mib: Option<f64>,
    pub max_gpu_mib: Option<f64>,
}

pub struct Probe {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    pub recorded: Arc<Mutex<Recorded>>,
}

/// Resident set size of a process (VmRSS), MiB.
pub fn rss_mib(pid: Option<u32>) -> Option<f64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/status"),
        None => "/proc/self/status".into(),
    };
    let s = std::fs::read_to_string(path).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Where the device probe appears once there is one.
pub type SharedDevice = Arc<Mutex<Option<Box<dyn vela_compute::DeviceProbe>>>>;

pub struct ProbeConfig {
    pub stalls: bool,
    /// Whose RSS to sample: this process (None inside) or another (`--server-pid`); the outer
    /// None: nobody's (a `--url` server of unknown PID).
    pub rss_of: Option<Option<u32>>,
    pub budget: Budget,
    /// Set with the reason when a budget is exceeded.
    pub abort: Arc<AtomicBool>,
    pub abort_reason: Arc<Mutex<Option<String>>>,
}

impl Probe {
    /// Start the probe thread; `device` holds the GPU's probe once the model runs on one
    /// (empty on the CPU, and while the model loads).
    pub fn start(
        cfg: ProbeConfig,
        clock: Arc<dyn Clock>,
        phase: Arc<dyn PhaseSource>,
        device: SharedDevice,
    ) -> Probe {
        let stop = Arc::new(AtomicBool::new(false));
        let recorded = Arc::new(Mutex::new(Recorded::default()));
        let (s, r) = (stop.clone(), recorded.clone());
        let thread = std::thread::Builder::new()
            .name("vela-eval-probe".into())
            .spawn(move || {
                let mut next = Instant::now() + PERIOD;
                while !s.load(Ordering::Relaxed) {
                    let t = clock.now();
                    let p0 = phase.phase();
                    let now = Instant::now();
                    if next > now {
                        std::thread::sleep(next - now);
                    }
                    let late = Instant::now().saturating_duration_since(next);
                    next = Instant::now() + PERIOD;
                    let mut new = Vec::new();
                    if cfg.stalls {
                        new.push(Sample {
                            kind: "host",
                            t,
                            ms: late.as_secs_f64() * 1e3,
                            phase_start: p0,
                            phase_end: phase.phase(),
                        });
                    }
                    let mut err = None;
                    let mut gpu = None;
                    let mut slot = device.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(d) = slot.as_mut() {
                        if cfg.stalls {
                            let (t, p0) = (clock.now(), phase.phase());
                            match d.canary() {
                                Ok(dt) => new.push(Sample {
                                    kind: "device",
                                    t,
                                    ms: dt.as_secs_f64() * 1e3,
                                    phase_start: p0,
                                    phase_end: phase.phase(),
                                }),
                                Err(e) => err = Some(format!("device canary: {e:#}")),
                            }
                        }
                        gpu = d.memory_used().ok().map(|b| b as f64 / (1 << 20) as f64);
                    }
                    drop(slot);
                    let m = MemSample {
                        t: clock.now(),
                        rss_mib: cfg.rss_of.and_then(rss_mib),
                        gpu_mib: gpu,
                    };
                    let over = match (
                        m.rss_mib,
                        cfg.budget.max_rss_mib,
                        m.gpu_mib,
                        cfg.budget.max_gpu_mib,
                    ) {
                        (Some(r), Some(b), _, _) if r > b => Some(format!(
                            "host RSS {r:.0} MiB exceeds the budget of {b:.0} MiB"
                        )),
                        (_, _, Some(g), Some(b)) if g > b => Some(format!(
                            "device memory {g:.0} MiB exceeds the budget of {b:.0} MiB"
                        )),
                        _ => None,
                    };
                    if let Some(why) = over {
                        let mut r = cfg.abort_reason.lock().unwrap_or_else(|e| e.into_inner());
                        r.get_or_insert(why);
                        cfg.abort.store(true, Ordering::SeqCst);
                    }
                    let mut rec = r.lock().unwrap_or_else(|e| e.into_inner());
                    rec.samples.extend(new);
                    rec.mem.push(m);
                    rec.errors.extend(err);
                }
            })
            .expect("spawning the probe thread");
        Probe {
            stop,
            thread: Some(thread),
            recorded,
        }
    }

    /// Peak host RSS and device memory sampled within [a, b] run-clock seconds.
    pub fn peaks(&self, a: f64, b: f64) -> (Option<f64>, Option<f64>) {
        let rec = self.recorded.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = (None, None);
        for m in rec
            .mem
            .iter()
            .filter(|m| m.t >= a && m.t <= b + PERIOD.as_secs_f64())
        {
            let up = |o: &mut Option<f64>, v: Option<f64>| {
                if let Some(v) = v {
                    *o = Some(o.map_or(v, |x: f64| x.max(v)));
                }
            };
            up(&mut out.0, m.rss_mib);
            up(&mut out.1, m.gpu_mib);
        }
        out
    }

    pub fn finish(mut self) -> Recorded {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        std::mem::take(&mut *self.recorded.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// p50/p95/p99/max per kind and phase (the phase at the sample's start; a sample whose phase
/// changed while it ran is also counted under `start→end`).
pub fn stall_stats(samples: &[Sample]) -> Vec<StallStats> {
    let mut groups: std::collections::BTreeMap<(&'static str, String), Vec<f64>> =
        Default::default();
    for s in samples {
        groups
            .entry((s.kind, s.phase_start.to_string()))
            .or_default()
            .push(s.ms);
        if s.phase_start != s.phase_end {
            groups
                .entry((s.kind, format!("{}→{}", s.phase_start, s.phase_end)))
                .or_default()
                .push(s.ms);
        }
    }
    groups
        .into_iter()
        .map(|((kind, phase), mut v)| {
            v.sort_by(f64::total_cmp);
            let p = |q| percentile(&v, q).unwrap_or(0.0);
            StallStats {
                kind,
                phase: Box::leak(phase.into_boxed_str()),
                count: v.len(),
                p50: p(0.5),
                p95: p(0.95),
                p99: p(0.99),
                max: *v.last().unwrap_or(&0.0),
            }
        })
        .collect()
}

/// The client-side phase (for `--url` runs, where the engine's own phase is not visible): the
/// most advanced state of any request in flight.
#[derive(Default)]
pub struct ClientPhase {
    waiting: std::sync::atomic::AtomicUsize,
    streaming: std::sync::atomic::AtomicUsize,
}

impl ClientPhase {
    pub fn begin(&self) {
        self.waiting.fetch_add(1, Ordering::SeqCst);
    }
    pub fn first_token(&self) {
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        self.streaming.fetch_add(1, Ordering::SeqCst);
    }
    pub fn end(&self, had_token: bool) {
        let c = if had_token {
            &self.streaming
        } else {
            &self.waiting
        };
        c.fetch_sub(1, Ordering::SeqCst);
    }
}

impl PhaseSource for ClientPhase {
    fn phase(&self) -> &'static str {
        if self.waiting.load(Ordering::SeqCst) > 0 {
            "prefill"
        } else if self.streaming.load(Ordering::SeqCst) > 0 {
            "decode"
        } else {
            "idle"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(kind: &'static str, ms: f64, a: &'static str, b: &'static str) -> Sample {
        Sample {
            kind,
            t: 0.0,
            ms,
            phase_start: a,
            phase_end: b,
        }
    }

    #[test]
    fn stats_per_kind_and_phase() {
        let mut v: Vec<Sample> = (1..=100)
            .map(|i| s("host", i as f64, "decode", "decode"))
            .collect();
        v.push(s("host", 500.0, "prefill", "decode"));
        v.push(s("device", 2.0, "idle", "idle"));
        let st = stall_stats(&v);
        let get = |k: &str, p: &str| {
            st.iter()
                .find(|x| x.kind == k && x.phase == p)
                .unwrap()
                .clone()
        };
        let d = get("host", "decode");
        assert_eq!(
            (d.count, d.p50, d.p95, d.p99, d.max),
            (100, 50.0, 95.0, 99.0, 100.0)
        );
        assert_eq!(get("host", "prefill").max, 500.0);
        assert_eq!(get("host", "prefill→decode").count, 1);
        assert_eq!(get("device", "idle").count, 1);
    }

    /// A host stall shows in the host-timer samples of the phase it happened in.
    #[test]
    fn probe_sees_a_host_stall() {
        struct Fixed;
        impl PhaseSource for Fixed {
            fn phase(&self) -> &'static str {
                "decode"
            }
        }
        let cfg = ProbeConfig {
            stalls: true,
            rss_of: Some(None),
            budget: Budget {
                max_rss_mib: Some(1e9),
                max_gpu_mib: None,
            },
            abort: Arc::new(AtomicBool::new(false)),
            abort_reason: Arc::new(Mutex::new(None)),
        };
        let clock: Arc<dyn Clock> = Arc::new(crate::client::RealClock(Instant::now()));
        let p = Probe::start(cfg, clock, Arc::new(Fixed), Default::default());
        std::thread::sleep(Duration::from_millis(350));
        // Stall the probe's own lock for 300 ms: its next sample wakes late.
        {
            let _g = p.recorded.lock().unwrap();
            std::thread::sleep(Duration::from_millis(300));
        }
        std::thread::sleep(Duration::from_millis(250));
        let (rss, _) = p.peaks(0.0, 10.0);
        let rec = p.finish();
        assert!(rss.unwrap() > 1.0, "{rss:?}");
        let st = stall_stats(&rec.samples);
        let d = st.iter().find(|x| x.phase == "decode").unwrap();
        assert!(d.count >= 5, "{d:?}");
        assert!(d.max >= 100.0, "the stall is visible: {d:?}");
        assert!(d.p50 < 50.0, "ticks are on time otherwise: {d:?}");
    }

    #[test]
    fn rss_budget_trips_the_abort_flag() {
        struct Idle;
        impl PhaseSource for Idle {
            fn phase(&self) -> &'static str {
                "idle"
            }
        }
        let abort = Arc::new(AtomicBool::new(false));
        let reason = Arc::new(Mutex::new(None));
        let cfg = ProbeConfig {
            stalls: false,
            rss_of: Some(None),
            budget: Budget {
                max_rss_mib: Some(1.0),
                max_gpu_mib: None,
            },
            abort: abort.clone(),
            abort_reason: reason.clone(),
        };
        let clock: Arc<dyn Clock> = Arc::new(crate::client::RealClock(Instant::now()));
        let p = Probe::start(cfg, clock, Arc::new(Idle), Default::default());
        std::thread::sleep(Duration::from_millis(300));
        let rec = p.finish();
        assert!(abort.load(Ordering::SeqCst));
        assert!(reason
            .lock()
            .unwrap()
            .as_ref()
            .unwrap()
            .contains("exceeds the budget of 1 MiB"));
        assert!(rec.samples.is_empty());
    }
}
