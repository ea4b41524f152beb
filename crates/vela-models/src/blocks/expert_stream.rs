//! Batches of a host-memory expert layer ([`super::experts`]) either run on the CPU or have
//! the experts they route to copied to the device for that batch only ("streamed") and
//! multiplied there, whichever the measured costs say is cheaper.
//!
//! A decode step routes a few slots: the CPU reads a few experts from memory, and copying them
//! across PCIe would cost more. A long prompt's batch routes thousands of slots to nearly
//! every expert: the CPU's products grow with the slots, the copy does not. The costs are
//! measured as the layers run, shared by a model's host layers (one CPU, one link, layers of
//! one shape): CPU seconds per slot for each batch size (by powers of two), and the link's
//! bytes per second. A batch size the CPU has not run yet runs there first; once the CPU's
//! estimate for a batch passes [`EXPLORE_S`], one batch is streamed to measure the link; from
//! then on the cheaper estimate wins. Streaming needs the batch's experts to fit the device's
//! free memory with [`MARGIN`] to spare; a failed copy turns it off for the model.
//!
//! A streamed batch runs the device's own kernels on the device's copy of the same rows, so
//! its result is what the all-on-device layer gives, bit for bit.

use super::experts::GateUp;
use crate::weights::stack;
use anyhow::Result;
use std::sync::atomic::AtomicU64;
use vela_compute::{Backend, HostWeight};

/// How host layers run a batch ([`crate::placement::HostExperts::prefill`]): by the measured
/// costs; the forced sides let tests pin each path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Prefill {
    /// By the measured costs.
    #[default]
    Measured,
    /// Always on the CPU.
    Cpu,
    /// Always streamed (where the device memory allows).
    Stream,
}

/// CPU estimate (seconds) past which a batch is worth streaming once to measure the link.
pub const EXPLORE_S: f64 = 0.02;

/// Every this many choices between two measured sides (of batches worth measuring), the losing
/// side runs once: each side's cost is measured only when it runs, and a stale or unlucky
/// measurement (a first copy that paid for allocations, a CPU busy at the time) must not decide
/// for good.
pub const REEXPLORE: u64 = 16;

/// Device memory a streamed batch leaves free.
pub const MARGIN: u64 = 1 << 30;

/// Streamed batches and their bytes (all layers of a process), for `vela bench` and
/// `/metrics`.
pub struct StreamStats {
    pub batches: AtomicU64,
    pub bytes: AtomicU64,
}

pub static STREAM_STATS: StreamStats = StreamStats {
    batches: AtomicU64::new(0),
    bytes: AtomicU64::new(0),
};

/// The measured costs of a model's host layers.
#[derive(Debug, Default)]
pub struct StreamCosts {
    /// CPU seconds per routed slot, by batch size (index: log2 of the slots).
    cpu: [Option<f64>; 32],
    /// Host-to-device bytes per second of streamed batches.
    bw: Option<f64>,
    /// A copy failed: the CPU from then on.
    pub off: bool,
    /// Choices made between two measured sides.
    choices: u64,
}

fn bucket(slots: usize) -> usize {
    (usize::BITS - 1 - slots.max(1).leading_zeros()) as usize
}

/// An average that follows changes (a busier CPU, a cold page cache) within a few batches.
fn ema(old: Option<f64>, new: f64) -> Option<f64> {
    Some(old.map_or(new, |o| 0.5 * o + 0.5 * new))
}

impl StreamCosts {
    /// The CPU's part of a batch of `slots` routed slots took `secs` (with a device cache, the
    /// CPU runs only the misses: the estimate of such a batch then includes the cache's help).
    pub fn record_cpu(&mut self, slots: usize, secs: f64) {
        if slots > 0 {
            let b = bucket(slots);
            self.cpu[b] = ema(self.cpu[b], secs / slots as f64);
        }
    }

    /// `bytes` of experts crossed to the device in `secs`.
    pub fn record_stream(&mut self, bytes: u64, secs: f64) {
        if bytes > 0 && secs > 0.0 {
            self.bw = ema(self.bw, bytes as f64 / secs);
        }
    }

    /// Whether a batch of `slots` routed slots whose experts take `bytes` goes to the device,
    /// which has `free` bytes of memory (None: a backend without memory of its own).
    pub fn stream(&mut self, mode: Prefill, slots: usize, bytes: u64, free: Option<u64>) -> bool {
        let fits = free.is_some_and(|f| bytes.saturating_add(MARGIN) <= f);
        if self.off || !fits {
            return false;
        }
        match mode {
            Prefill::Cpu => false,
            Prefill::Stream => true,
            Prefill::Measured => {
                let Some(per_slot) = self.cpu[bucket(slots)] else {
                    return false;
                };
                let cpu = per_slot * slots as f64;
                let Some(bw) = self.bw else {
                    return cpu > EXPLORE_S;
                };
                let link = bytes as f64 / bw;
                let pick = link < cpu;
                if cpu.min(link) > EXPLORE_S {
                    self.choices += 1;
                    if self.choices.is_multiple_of(REEXPLORE) {
                        return !pick;
                    }
                }
                pick
            }
        }
    }
}

/// Rows `experts` (sorted) of a 3-D expert tensor of `n_expert` experts, in that order.
pub fn expert_rows(w: &HostWeight, n_expert: usize, experts: &[usize]) -> Result<HostWeight> {
    let rpe = w.rows / n_expert;
    let parts: Vec<HostWeight> = experts
        .iter()
        .map(|&e| w.row_range(e * rpe, rpe, &w.name))
        .collect::<Result<_>>()?;
    stack(&format!("{} (experts of a batch)", w.name), &parts)
}

/// A batch's experts on the device: every expert's rows (`subset` None) or those of `subset`
/// (sorted expert ids), in that order, uploaded with `upload`; and the bytes copied.
pub fn upload_experts<B: Backend>(
    gate_up: &[&HostWeight],
    down: &HostWeight,
    n_expert: usize,
    subset: Option<&[usize]>,
    upload: impl Fn(&HostWeight) -> Result<B::Weight>,
) -> Result<(GateUp<B>, B::Weight, u64)> {
    let mut bytes = 0u64;
    let mut up = |w: &HostWeight| -> Result<B::Weight> {
        match subset {
            None => {
                bytes += w.bytes().len() as u64;
                upload(w)
            }
            Some(s) => {
                let r = expert_rows(w, n_expert, s)?;
                bytes += r.bytes().len() as u64;
                upload(&r)
            }
        }
    };
    let gu = match gate_up {
        [gu] => GateUp::Fused(up(gu)?),
        [g, u] => GateUp::Split(up(g)?, up(u)?),
        _ => anyhow::bail!("experts: one or two gate/up tensors"),
    };
    let down = up(down)?;
    Ok((gu, down, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cheaper_measured_path_wins() {
        let free = Some(100 << 30);
        let mut c = StreamCosts::default();
        let m = Prefill::Measured;
        // Nothing measured: the CPU, which measures itself.
        assert!(!c.stream(m, 4096, 1 << 30, free));
        // 1 ms a slot: 4096 slots take 4 s on the CPU, worth one streamed batch to measure.
        c.record_cpu(4096, 4.096);
        assert!(c.stream(m, 4096, 1 << 30, free));
        // A size the CPU has not run yet: the CPU first.
        assert!(!c.stream(m, 64, 1 << 30, free));
        // The link at 1 GiB/s: 1 s for the batch's 1 GiB beats 4 s; not 16 GiB (16 s).
        c.record_stream(1 << 30, 1.0);
        assert!(c.stream(m, 4096, 1 << 30, free));
        assert!(!c.stream(m, 4096, 16 << 30, free));
        // A decode step: 8 slots are 8 ms on the CPU.
        c.record_cpu(8, 0.008);
        assert!(!c.stream(m, 8, 1 << 26, free));
        // Never past the free memory, never without device memory, never once off.
        assert!(!c.stream(m, 4096, 1 << 30, Some(3 << 29)));
        assert!(!c.stream(Prefill::Stream, 4096, 1 << 30, None));
        assert!(c.stream(Prefill::Stream, 8, 1 << 26, free));
        assert!(!c.stream(Prefill::Cpu, 4096, 1 << 30, free));
        c.off = true;
        assert!(!c.stream(Prefill::Stream, 4096, 1 << 30, free));
    }

    #[test]
    fn the_losing_side_is_measured_again() {
        let free = Some(100 << 30);
        let mut c = StreamCosts::default();
        let m = Prefill::Measured;
        // An unlucky first copy: 0.1 GiB/s makes the batch's 1 GiB 10 s against the CPU's 4 s.
        c.record_cpu(4096, 4.096);
        c.record_stream(1 << 30, 10.0);
        let picks: Vec<bool> = (0..2 * REEXPLORE)
            .map(|_| c.stream(m, 4096, 1 << 30, free))
            .collect();
        // The CPU, except every REEXPLORE-th batch, streamed to measure the link again.
        assert_eq!(picks.iter().filter(|&&p| p).count(), 2);
        assert!(picks[REEXPLORE as usize - 1]);
        // Measured again at 4 GiB/s: streaming wins from then on (the CPU again every 16th).
        c.record_stream(1 << 30, 0.25);
        c.record_stream(1 << 30, 0.25);
        let picks: Vec<bool> = (0..REEXPLORE)
            .map(|_| c.stream(m, 4096, 1 << 30, free))
            .collect();
        assert_eq!(picks.iter().filter(|&&p| !p).count(), 1);
        // Decode-sized batches (cheap either way) never explore.
        c.record_cpu(8, 0.008);
        assert!((0..4 * REEXPLORE).all(|_| !c.stream(m, 8, 1 << 30, free)));
    }

    #[test]
    fn buckets_are_powers_of_two() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(1), 0);
        assert_eq!(bucket(7), 2);
        assert_eq!(bucket(8), 3);
        assert_eq!(bucket(4096), 12);
    }
}
