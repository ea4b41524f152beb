//! Per-kernel GPU time (`VELA_CUDA_PROFILE=1`): every launch (and cuBLAS product) is bracketed
//! by two timing events; the times are summed per kernel name and printed to stderr when the
//! backend is dropped. Decode-step graphs are off while profiling (each launch must be seen), so
//! the wall-clock rate is lower than without it; the per-kernel GPU times are what it is for.

use crate::device::Device;
use cudarc::driver::{sys, CudaEvent};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Pending event pairs are resolved (one stream synchronize) when this many accumulate.
const FLUSH_AT: usize = 4096;

#[derive(Default)]
struct Totals {
    pending: Vec<(String, CudaEvent, CudaEvent)>,
    /// name → (milliseconds, launches)
    totals: HashMap<String, (f64, u64)>,
}

/// The profiler: on or off, and the times so far.
#[derive(Default)]
pub(crate) struct Profiler {
    on: AtomicBool,
    t: Mutex<Totals>,
}

fn event(dev: &Device) -> Option<CudaEvent> {
    let e = dev
        .ctx
        .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
        .ok()?;
    e.record(&dev.stream).ok()?;
    Some(e)
}

impl Profiler {
    pub(crate) fn new(on: bool) -> Self {
        Profiler {
            on: AtomicBool::new(on),
            t: Mutex::default(),
        }
    }

    pub(crate) fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    pub(crate) fn set(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }

    /// Start timing a launch on `dev`'s stream (None when profiling is off or an event cannot
    /// be made).
    pub(crate) fn begin(&self, dev: &Device) -> Option<CudaEvent> {
        self.is_on().then_some(())?;
        event(dev)
    }

    /// End timing `name` started by [`Self::begin`].
    pub(crate) fn end(&self, dev: &Device, name: &str, start: Option<CudaEvent>) {
        let Some(start) = start else { return };
        let Some(end) = event(dev) else { return };
        let mut p = self.t.lock().unwrap_or_else(|e| e.into_inner());
        p.pending.push((name.to_string(), start, end));
        if p.pending.len() >= FLUSH_AT {
            resolve(&mut p);
        }
    }

    /// GPU milliseconds and launches per kernel name so far, and reset the totals.
    pub(crate) fn take(&self) -> HashMap<String, (f64, u64)> {
        let mut p = self.t.lock().unwrap_or_else(|e| e.into_inner());
        resolve(&mut p);
        std::mem::take(&mut p.totals)
    }

    /// The per-kernel table so far (None when profiling is off).
    pub(crate) fn report(&self) -> Option<String> {
        if !self.is_on() {
            return None;
        }
        let mut p = self.t.lock().unwrap_or_else(|e| e.into_inner());
        resolve(&mut p);
        let total: f64 = p.totals.values().map(|v| v.0).sum();
        let mut rows: Vec<_> = p.totals.iter().collect();
        rows.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
        let mut s = format!(
            "vela-cuda profile: {:.3} ms of GPU time in {} launches\n{:<28} {:>10} {:>8} {:>10} {:>6}\n",
            total,
            p.totals.values().map(|v| v.1).sum::<u64>(),
            "kernel",
            "ms",
            "calls",
            "us/call",
            "%"
        );
        for (name, (ms, n)) in rows {
            s += &format!(
                "{:<28} {:>10.3} {:>8} {:>10.2} {:>6.1}\n",
                name,
                ms,
                n,
                1000.0 * ms / *n as f64,
                100.0 * ms / total.max(1e-12)
            );
        }
        Some(s)
    }
}

fn resolve(p: &mut Totals) {
    for (name, a, b) in p.pending.drain(..) {
        if let Ok(ms) = a.elapsed_ms(&b) {
            let t = p.totals.entry(name).or_default();
            t.0 += ms as f64;
            t.1 += 1;
        }
    }
}
