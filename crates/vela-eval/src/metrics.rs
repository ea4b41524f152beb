//! The metrics of a turn and of a run, each defined once here (docs/eval.md repeats the
//! definitions). Times come from the run's clock (`client::Clock`); server-side times come from
//! the response's `timings` object when the server sends one (vela, llama-server), else the
//! client-side approximation is used and the `*_source` field says so.

use crate::checks::CheckResult;
use crate::client::Trace;
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// Where a rate was measured.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The server's `timings` (engine time only).
    Server,
    /// Derived from event arrival times at the client (includes queueing and transport).
    #[default]
    Client,
}

/// One turn of one client.
#[derive(Debug, Clone, Serialize, Default)]
pub struct TurnMetrics {
    pub client: usize,
    pub turn: usize,
    pub name: String,
    /// `usage.prompt_tokens`: the whole rendered prompt.
    pub prompt_tokens: Option<usize>,
    /// `usage.prompt_tokens_details.cached_tokens` (or `timings.cache_n`): prompt tokens the
    /// server took from its prefix cache.
    pub cached_tokens: Option<usize>,
    /// prompt − cached: the tokens this turn evaluated.
    pub new_tokens: Option<usize>,
    pub completion_tokens: Option<usize>,
    /// The previous turn's prompt + completion tokens: what an exact prefix cache can hold.
    pub previous_tokens: Option<usize>,
    /// previous − cached: tokens of the history the template rendered differently from how
    /// they were generated (or that the cache lost).
    pub rerendered_tokens: Option<i64>,
    /// Request sent → first event carrying output.
    pub ttft_ms: Option<f64>,
    /// Request sent → end of the stream.
    pub turn_ms: f64,
    /// New prompt tokens per second of prefill: server `prompt_n / prompt_ms`; client:
    /// new tokens / TTFT.
    pub prefill_tps: Option<f64>,
    pub prefill_source: Source,
    /// Generated tokens per second of the decode loop: server `predicted_n / predicted_ms`;
    /// client: (completion − 1) / (last output event − first output event).
    pub decode_loop_tps: Option<f64>,
    pub decode_source: Source,
    /// Generated tokens / (end of stream − first output event): the decode loop plus the
    /// request's trailing work.
    pub post_prefill_tps: Option<f64>,
    /// Server: wait in the queue, prefix-cache restore, the prompt checkpoint.
    pub queue_ms: Option<f64>,
    pub restore_ms: Option<f64>,
    pub restore_bytes: Option<u64>,
    pub checkpoint_ms: Option<f64>,
    pub checkpoint_bytes: Option<u64>,
    /// Speculative decoding: drafted tokens, accepted drafts, accepted / drafted.
    pub draft_tokens: Option<u64>,
    pub draft_accepted: Option<u64>,
    pub acceptance: Option<f64>,
    /// Largest host RSS sampled during the turn (the serving process), MiB.
    pub rss_peak_mib: Option<f64>,
    /// Largest device memory in use sampled during the turn, MiB.
    pub gpu_mem_peak_mib: Option<f64>,
    pub finish_reason: Option<String>,
    pub checks: Vec<CheckResult>,
    pub error: Option<String>,
    /// (tokens, seconds) behind `prefill_tps` / `decode_loop_tps` / `post_prefill_tps`, which
    /// the run's aggregates sum.
    #[serde(skip)]
    pub work: [Option<(f64, f64)>; 3],
}

fn num(t: &Value, k: &str) -> Option<f64> {
    t.get(k).and_then(Value::as_f64)
}

/// The metrics of one traced turn; `previous` is the previous turn's (prompt, completion).
pub fn turn_metrics(
    client: usize,
    turn: usize,
    name: &str,
    tr: &Trace,
    previous: Option<(usize, usize)>,
) -> TurnMetrics {
    let ms = |a: f64, b: f64| (b - a) * 1e3;
    let timings = tr.timings.as_ref();
    let mut m = TurnMetrics {
        client,
        turn,
        name: name.to_string(),
        turn_ms: ms(tr.sent, tr.done),
        ttft_ms: tr.first_token().map(|f| ms(tr.sent, f)),
        finish_reason: tr.finish_reason.clone(),
        ..TurnMetrics::default()
    };
    if let Some(u) = tr.usage {
        m.prompt_tokens = Some(u.prompt_tokens);
        m.completion_tokens = Some(u.completion_tokens);
        m.cached_tokens = u
            .cached_tokens
            .or_else(|| timings.and_then(|t| num(t, "cache_n")).map(|x| x as usize));
        m.new_tokens = m.cached_tokens.map(|c| u.prompt_tokens.saturating_sub(c));
    }
    if let (Some((p, c)), Some(cached)) = (previous, m.cached_tokens) {
        m.previous_tokens = Some(p + c);
        m.rerendered_tokens = Some((p + c) as i64 - cached as i64);
    }
    // Prefill.
    let server_prefill = timings.and_then(|t| Some((num(t, "prompt_n")?, num(t, "prompt_ms")?)));
    match server_prefill {
        Some((n, t)) if t > 0.0 => {
            m.work[0] = Some((n, t / 1e3));
            m.prefill_source = Source::Server;
        }
        _ => {
            let new = m.new_tokens.or(m.prompt_tokens);
            if let (Some(n), Some(ttft)) = (new, m.ttft_ms) {
                if ttft > 0.0 {
                    m.work[0] = Some((n as f64, ttft / 1e3));
                }
            }
        }
    }
    // Decode loop.
    let server_decode =
        timings.and_then(|t| Some((num(t, "predicted_n")?, num(t, "predicted_ms")?)));
    match server_decode {
        Some((n, t)) if t > 0.0 => {
            m.work[1] = Some((n, t / 1e3));
            m.decode_source = Source::Server;
        }
        _ => {
            if let (Some(n), Some(&a), Some(&b)) = (
                m.completion_tokens,
                tr.token_events.first(),
                tr.token_events.last(),
            ) {
                if n > 1 && b > a {
                    m.work[1] = Some(((n - 1) as f64, b - a));
                }
            }
        }
    }
    if let (Some(n), Some(f)) = (m.completion_tokens, tr.first_token()) {
        if tr.done > f && n > 0 {
            m.work[2] = Some((n as f64, tr.done - f));
        }
    }
    let r = |w: Option<(f64, f64)>| w.map(|(n, s)| n / s);
    (m.prefill_tps, m.decode_loop_tps, m.post_prefill_tps) =
        (r(m.work[0]), r(m.work[1]), r(m.work[2]));
    if let Some(t) = timings {
        m.queue_ms = num(t, "queue_ms");
        m.restore_ms = num(t, "restore_ms");
        m.restore_bytes = num(t, "restore_bytes").map(|x| x as u64);
        m.checkpoint_ms = num(t, "checkpoint_ms");
        m.checkpoint_bytes = num(t, "checkpoint_bytes").map(|x| x as u64);
        m.draft_tokens = num(t, "draft_n").map(|x| x as u64);
        m.draft_accepted = num(t, "draft_n_accepted").map(|x| x as u64);
        if let (Some(d), Some(a)) = (m.draft_tokens, m.draft_accepted) {
            m.acceptance = (d > 0).then(|| a as f64 / d as f64);
        }
    }
    m
}

/// A run's aggregate metrics (`summary.json`'s `metrics`; names ending in `_tps` are
/// higher-is-better rates, `_ms` / `_mib` lower-is-better costs, which `vela eval ab` relies
/// on).
pub fn aggregate(turns: &[TurnMetrics], wall_ms: f64) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let ok: Vec<&TurnMetrics> = turns.iter().filter(|t| t.error.is_none()).collect();
    // Token-weighted rates: total tokens over total time, so long turns weigh more.
    let rate = |i: usize| {
        let (n, s) = ok
            .iter()
            .filter_map(|t| t.work[i])
            .fold((0.0, 0.0), |(n, s), (a, b)| (n + a, s + b));
        (s > 0.0).then(|| n / s)
    };
    let (pre, dec, post) = (rate(0), rate(1), rate(2));
    let mut put = |k: &str, v: Option<f64>| {
        if let Some(v) = v.filter(|v| v.is_finite()) {
            out.insert(k.to_string(), v);
        }
    };
    put("prefill_tps", pre);
    put("decode_tps", dec);
    put("post_prefill_tps", post);
    let ttfts: Vec<f64> = ok.iter().filter_map(|t| t.ttft_ms).collect();
    put(
        "ttft_ms",
        (!ttfts.is_empty()).then(|| ttfts.iter().sum::<f64>() / ttfts.len() as f64),
    );
    put("turn_ms", Some(ok.iter().map(|t| t.turn_ms).sum()));
    put("wall_ms", Some(wall_ms));
    let gen: usize = ok.iter().filter_map(|t| t.completion_tokens).sum();
    put(
        "throughput_tps",
        (wall_ms > 0.0).then(|| gen as f64 * 1e3 / wall_ms),
    );
    let max = |f: &dyn Fn(&TurnMetrics) -> Option<f64>| {
        ok.iter()
            .filter_map(|t| f(t))
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
    };
    put("rss_peak_mib", max(&|t| t.rss_peak_mib));
    put("gpu_mem_peak_mib", max(&|t| t.gpu_mem_peak_mib));
    let sum_u = |f: &dyn Fn(&TurnMetrics) -> Option<u64>| -> Option<f64> {
        let v: Vec<u64> = ok.iter().filter_map(|t| f(t)).collect();
        (!v.is_empty()).then(|| v.iter().sum::<u64>() as f64)
    };
    let (d, a) = (sum_u(&|t| t.draft_tokens), sum_u(&|t| t.draft_accepted));
    if let (Some(d), Some(a)) = (d, a) {
        if d > 0.0 {
            put("acceptance", Some(a / d));
        }
    }
    let checks: Vec<&CheckResult> = turns.iter().flat_map(|t| &t.checks).collect();
    if !checks.is_empty() {
        put(
            "checks_passed",
            Some(checks.iter().filter(|c| c.passed).count() as f64),
        );
        put("checks_total", Some(checks.len() as f64));
    }
    // Per turn of a single-client run, for gates on one turn (`turn.story.decode_loop_tps`).
    if turns.iter().all(|t| t.client == 0) {
        for t in &ok {
            for (k, v) in [
                ("prefill_tps", t.prefill_tps),
                ("decode_loop_tps", t.decode_loop_tps),
                ("ttft_ms", t.ttft_ms),
                ("turn_ms", Some(t.turn_ms)),
            ] {
                put(&format!("turn.{}.{k}", t.name), v);
            }
        }
    }
    out
}

/// Nearest-rank percentile of sorted samples (`q` in 0..=1).
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil().max(1.0) as usize;
    Some(sorted[rank.min(sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Usage;
    use serde_json::json;

    fn trace(timings: Option<Value>) -> Trace {
        // Sent at 1.0 s; output events at 1.5, 1.6, ..., 2.4 s (10 tokens); stream ends 2.5 s.
        Trace {
            sent: 1.0,
            token_events: (0..10).map(|i| 1.5 + 0.1 * i as f64).collect(),
            done: 2.5,
            usage: Some(Usage {
                prompt_tokens: 1000,
                completion_tokens: 10,
                cached_tokens: Some(900),
            }),
            finish_reason: Some("stop".into()),
            timings,
            ..Trace::default()
        }
    }

    fn close(a: Option<f64>, b: f64) {
        let a = a.expect("value");
        assert!((a - b).abs() < 1e-9 * b.abs().max(1.0), "{a} != {b}");
    }

    #[test]
    fn client_side_definitions() {
        let m = turn_metrics(0, 1, "t", &trace(None), Some((880, 30)));
        close(m.ttft_ms, 500.0);
        assert!((m.turn_ms - 1500.0).abs() < 1e-9);
        assert_eq!((m.new_tokens, m.previous_tokens), (Some(100), Some(910)));
        assert_eq!(m.rerendered_tokens, Some(10));
        // 100 new tokens over a 0.5 s TTFT.
        close(m.prefill_tps, 200.0);
        assert_eq!(m.prefill_source, Source::Client);
        // 9 intervals over 0.9 s between the first and the last token.
        close(m.decode_loop_tps, 10.0);
        // 10 tokens over 1.0 s from the first token to the end of the stream.
        close(m.post_prefill_tps, 10.0);
        assert_eq!(m.acceptance, None);
    }

    #[test]
    fn server_timings_take_precedence() {
        let t = json!({"prompt_n": 100, "prompt_ms": 250.0, "predicted_n": 10, "predicted_ms": 800.0,
                       "draft_n": 8, "draft_n_accepted": 6, "checkpoint_ms": 1.5, "checkpoint_bytes": 4096,
                       "restore_ms": 0.5, "restore_bytes": 0, "queue_ms": 3.0, "cache_n": 900});
        let m = turn_metrics(0, 0, "t", &trace(Some(t)), None);
        close(m.prefill_tps, 400.0);
        assert_eq!(m.prefill_source, Source::Server);
        close(m.decode_loop_tps, 12.5);
        assert_eq!(m.decode_source, Source::Server);
        close(m.acceptance, 0.75);
        assert_eq!(m.checkpoint_bytes, Some(4096));
        assert_eq!(m.previous_tokens, None);
    }

    #[test]
    fn aggregates_are_token_weighted() {
        let mut a = turn_metrics(0, 0, "a", &trace(None), None);
        let mut b = a.clone();
        b.name = "b".into();
        // a: 100 new tokens at 200/s (0.5 s); b: 300 new tokens at 100/s (3 s) → 400 / 3.5 s.
        b.work[0] = Some((300.0, 3.0));
        a.rss_peak_mib = Some(10.0);
        b.rss_peak_mib = Some(30.0);
        let agg = aggregate(&[a, b], 4000.0);
        assert!((agg["prefill_tps"] - 400.0 / 3.5).abs() < 1e-9);
        assert!((agg["decode_tps"] - 10.0).abs() < 1e-9);
        assert!((agg["turn_ms"] - 3000.0).abs() < 1e-9);
        assert!((agg["throughput_tps"] - 5.0).abs() < 1e-9);
        assert_eq!(agg["rss_peak_mib"], 30.0);
        assert!(agg.contains_key("turn.b.prefill_tps"));
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), Some(50.0));
        assert_eq!(percentile(&v, 0.99), Some(99.0));
        assert_eq!(percentile(&v, 1.0), Some(100.0));
        assert_eq!(percentile(&[7.0], 0.95), Some(7.0));
        assert_eq!(percentile(&[], 0.5), None);
    }
}
