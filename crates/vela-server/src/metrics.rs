//! Prometheus metrics (text exposition format), lock-free counters and fixed-bucket histograms.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A histogram with fixed upper bounds (seconds).
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_us: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_us: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, secs: f64) {
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            if secs <= *b {
                c.fetch_add(1, Relaxed);
            }
        }
        self.sum_us.fetch_add((secs * 1e6) as u64, Relaxed);
        self.count.fetch_add(1, Relaxed);
    }

    fn render(&self, name: &str, help: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {}", c.load(Relaxed));
        }
        let n = self.count.load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {n}");
        let _ = writeln!(out, "{name}_sum {}", self.sum_us.load(Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {n}");
    }
}

const TTFT_BOUNDS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
const TOKEN_BOUNDS: &[f64] = &[0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0];

/// All server metrics.
pub struct Metrics {
    pub requests: AtomicU64,
    pub request_errors: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub cached_prompt_tokens: AtomicU64,
    /// Requests that took a copy of another's session holding their prompt (`n` > 1,
    /// identical prompts) instead of evaluating it.
    pub prompt_copies: AtomicU64,
    pub queue_depth: AtomicU64,
    pub cancelled: AtomicU64,
    /// Engine forward passes (prefill chunks or decode steps) that completed after a request's
    /// cancellation flag was set.
    pub steps_after_cancel: AtomicU64,
    pub cache_sessions: AtomicU64,
    pub cache_bytes: AtomicU64,
    /// The persistent prefix cache (`--cache-dir`): files and their bytes, sessions loaded from
    /// it, files written, and failures (a write that failed, a file refused at load).
    pub disk_files: AtomicU64,
    pub disk_bytes: AtomicU64,
    pub disk_hits: AtomicU64,
    pub disk_writes: AtomicU64,
    pub disk_errors: AtomicU64,
    /// Continuous batching: requests admitted to the engine, engine steps (forward passes over
    /// the active requests) and the requests those steps evaluated (their ratio: the mean batch).
    pub running: AtomicU64,
    /// State memory: what the running requests reserved, the budget, and what their sequences
    /// hold now (allocated by use: at most the reservation).
    pub kv_reserved: AtomicU64,
    pub kv_budget: AtomicU64,
    pub kv_held: AtomicU64,
    pub steps: AtomicU64,
    pub step_sequences: AtomicU64,
    /// Speculative decoding: tokens drafted and drafts accepted by verification.
    pub draft_tokens: AtomicU64,
    pub draft_accepted: AtomicU64,
    pub ttft: Histogram,
    pub token_latency: Histogram,
    /// The engine worker's [`crate::worker::Phase`].
    pub phase: std::sync::atomic::AtomicU8,
}

impl Default for Metrics {
    fn default() -> Self {
        let z = || AtomicU64::new(0);
        Metrics {
            requests: z(),
            request_errors: z(),
            prompt_tokens: z(),
            generated_tokens: z(),
            cached_prompt_tokens: z(),
            prompt_copies: z(),
            queue_depth: z(),
            cancelled: z(),
            steps_after_cancel: z(),
            cache_sessions: z(),
            cache_bytes: z(),
            disk_files: z(),
            disk_bytes: z(),
            disk_hits: z(),
            disk_writes: z(),
            disk_errors: z(),
            running: z(),
            kv_reserved: z(),
            kv_budget: z(),
            kv_held: z(),
            steps: z(),
            step_sequences: z(),
            draft_tokens: z(),
            draft_accepted: z(),
            ttft: Histogram::new(TTFT_BOUNDS),
            token_latency: Histogram::new(TOKEN_BOUNDS),
            phase: std::sync::atomic::AtomicU8::new(0),
        }
    }
}

impl Metrics {
    pub fn set_phase(&self, p: crate::worker::Phase) {
        self.phase.store(p as u8, Relaxed);
    }
    pub fn phase(&self) -> crate::worker::Phase {
        crate::worker::Phase::from_u8(self.phase.load(Relaxed))
    }
    /// The exposition text.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let mut one = |name: &str, kind: &str, help: &str, v: &AtomicU64| {
            let _ = writeln!(
                s,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {}",
                v.load(Relaxed)
            );
        };
        one(
            "vela_requests_total",
            "counter",
            "Generation requests received.",
            &self.requests,
        );
        one(
            "vela_request_errors_total",
            "counter",
            "Requests answered with an error.",
            &self.request_errors,
        );
        one(
            "vela_prompt_tokens_total",
            "counter",
            "Prompt tokens of served requests.",
            &self.prompt_tokens,
        );
        one(
            "vela_generated_tokens_total",
            "counter",
            "Generated tokens.",
            &self.generated_tokens,
        );
        one(
            "vela_cached_prompt_tokens_total",
            "counter",
            "Prompt tokens reused from the prefix cache (not recomputed).",
            &self.cached_prompt_tokens,
        );
        one(
            "vela_prompt_copies_total",
            "counter",
            "Requests served from a copy of another request's session holding the same prompt.",
            &self.prompt_copies,
        );
        one(
            "vela_draft_tokens_total",
            "counter",
            "Tokens proposed by the speculative-decoding drafter.",
            &self.draft_tokens,
        );
        one(
            "vela_draft_accepted_total",
            "counter",
            "Drafted tokens accepted by the target's verification.",
            &self.draft_accepted,
        );
        one(
            "vela_queue_depth",
            "gauge",
            "Requests waiting for the engine.",
            &self.queue_depth,
        );
        one(
            "vela_running_requests",
            "gauge",
            "Requests the engine is evaluating (continuous batching, at most --parallel).",
            &self.running,
        );
        one(
            "vela_kv_reserved_bytes",
            "gauge",
            "Sequence-state bytes reserved by the running requests (prompt + max_tokens each).",
            &self.kv_reserved,
        );
        one(
            "vela_kv_budget_bytes",
            "gauge",
            "Sequence-state bytes the running requests may reserve together (--kv-budget-mb).",
            &self.kv_budget,
        );
        one(
            "vela_kv_held_bytes",
            "gauge",
            "Sequence-state bytes the running requests' sequences hold now (allocated by use).",
            &self.kv_held,
        );
        one(
            "vela_engine_steps_total",
            "counter",
            "Engine steps: forward passes over the running requests.",
            &self.steps,
        );
        one(
            "vela_engine_step_requests_total",
            "counter",
            "Requests evaluated by the engine steps (divided by the steps: the mean batch).",
            &self.step_sequences,
        );
        one(
            "vela_cancelled_requests_total",
            "counter",
            "Requests cancelled (client gone).",
            &self.cancelled,
        );
        one(
            "vela_steps_after_cancel_total",
            "counter",
            "Engine steps (prefill chunks / decode steps) completed after a cancellation.",
            &self.steps_after_cancel,
        );
        one(
            "vela_prefix_cache_sessions",
            "gauge",
            "Sequences held by the prefix cache.",
            &self.cache_sessions,
        );
        one(
            "vela_prefix_cache_bytes",
            "gauge",
            "KV bytes held by the prefix cache.",
            &self.cache_bytes,
        );
        for (name, kind, help, v) in [
            (
                "vela_prefix_cache_disk_files",
                "gauge",
                "Sequence states saved in --cache-dir.",
                &self.disk_files,
            ),
            (
                "vela_prefix_cache_disk_bytes",
                "gauge",
                "Bytes of the sequence states saved in --cache-dir.",
                &self.disk_bytes,
            ),
            (
                "vela_prefix_cache_disk_hits_total",
                "counter",
                "Requests that continued a sequence state loaded from --cache-dir.",
                &self.disk_hits,
            ),
            (
                "vela_prefix_cache_disk_writes_total",
                "counter",
                "Sequence states written to --cache-dir.",
                &self.disk_writes,
            ),
            (
                "vela_prefix_cache_disk_errors_total",
                "counter",
                "Writes to --cache-dir that failed and files there refused at load.",
                &self.disk_errors,
            ),
        ] {
            one(name, kind, help, v);
        }
        // Routed experts in host memory (`--experts`) and their device cache: process-wide.
        let ht = &vela_engine::expert_stats::HOST_TRAFFIC;
        let cs = &vela_engine::expert_stats::CACHE_STATS;
        let st = &vela_engine::expert_stats::STREAM_STATS;
        for (name, help, v) in [
            (
                "vela_host_expert_layer_calls_total",
                "MoE layer evaluations whose routed experts are in host memory.",
                &ht.calls,
            ),
            (
                "vela_host_expert_bytes_to_host_total",
                "Bytes of activations, expert ids and weights copied to the host for them.",
                &ht.bytes_to_host,
            ),
            (
                "vela_host_expert_bytes_to_device_total",
                "Bytes of expert outputs copied back to the device.",
                &ht.bytes_to_device,
            ),
            (
                "vela_expert_cache_hits_total",
                "Routed slots of host-memory layers run from the device cache.",
                &cs.hits,
            ),
            (
                "vela_expert_cache_misses_total",
                "Routed slots of host-memory layers run by the CPU.",
                &cs.misses,
            ),
            (
                "vela_expert_cache_refreshes_total",
                "Times a layer's device cache took a new set of experts.",
                &cs.refreshes,
            ),
            (
                "vela_expert_cache_bytes_uploaded_total",
                "Expert weight bytes copied to the device cache.",
                &cs.bytes_uploaded,
            ),
            (
                "vela_host_expert_streamed_batches_total",
                "Batches of host-memory layers run on the device with their experts copied there.",
                &st.batches,
            ),
            (
                "vela_host_expert_streamed_bytes_total",
                "Expert weight bytes copied to the device for those batches.",
                &st.bytes,
            ),
        ] {
            one(name, "counter", help, v);
        }
        self.ttft.render(
            "vela_time_to_first_token_seconds",
            "Time from request to first token.",
            &mut s,
        );
        self.token_latency.render(
            "vela_time_per_output_token_seconds",
            "Decode step latency.",
            &mut s,
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative() {
        let m = Metrics::default();
        m.ttft.observe(0.03);
        m.ttft.observe(3.0);
        let t = m.render();
        assert!(
            t.contains("vela_time_to_first_token_seconds_bucket{le=\"0.05\"} 1\n"),
            "{t}"
        );
        assert!(
            t.contains("vela_time_to_first_token_seconds_bucket{le=\"5\"} 2\n"),
            "{t}"
        );
        assert!(t.contains("vela_time_to_first_token_seconds_count 2\n"));
    }
}
