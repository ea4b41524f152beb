//! The report of a run: `events.jsonl` (one JSON object per event, appended as it happens),
//! `summary.json`, `report.md` and three SVG plots, each written whole (temp + fsync + rename),
//! so an interrupted run never leaves a half-written report.

use crate::client::Trace;
use crate::metrics::TurnMetrics;
use crate::probe::{Recorded, Sample, StallStats};
use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::Mutex;

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub format: &'static str,
    /// `ok`, `aborted: <why>` (a budget) or `failed: <first error>`.
    pub status: String,
    pub driver: &'static str,
    pub url: Option<String>,
    pub server: Value,
    pub workload: Value,
    pub model: Option<Value>,
    pub metrics: BTreeMap<String, f64>,
    pub turns: Vec<TurnMetrics>,
    pub stalls: Vec<StallStats>,
    pub probe_errors: Vec<String>,
    pub vela_version: &'static str,
}

/// Writes via a temp file in the same directory, fsync, rename, then fsyncs the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let parent = path
        .parent()
        .ok_or_else(|| anyhow::anyhow!("{} has no directory", path.display()))?;
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

pub fn sha256_file(p: &Path) -> Result<String> {
    let mut f = std::fs::File::open(p)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(format!("{:x}", h.finalize()))
}

/// `events.jsonl`: each event one line, written with one call and flushed.
pub struct EventLog(Mutex<std::fs::File>);

impl EventLog {
    pub fn create(path: &Path) -> Result<EventLog> {
        let f =
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        Ok(EventLog(Mutex::new(f)))
    }
    pub fn emit(&self, v: &Value) {
        let mut line = v.to_string();
        line.push('\n');
        let mut f = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let _ = f.write_all(line.as_bytes());
        let _ = f.flush();
    }
}

pub fn write(dir: &Path, s: &Summary, traces: &[Trace], rec: &Recorded) -> Result<()> {
    write_atomic(&dir.join("summary.json"), &serde_json::to_vec_pretty(s)?)?;
    write_atomic(&dir.join("report.md"), markdown(s).as_bytes())?;
    write_atomic(&dir.join("turns.svg"), turns_svg(&s.turns).as_bytes())?;
    write_atomic(
        &dir.join("timeline.svg"),
        timeline_svg(&s.turns, traces).as_bytes(),
    )?;
    write_atomic(&dir.join("stalls.svg"), stalls_svg(&rec.samples).as_bytes())?;
    Ok(())
}

fn f1(v: Option<f64>) -> String {
    v.map_or("–".into(), |x| format!("{x:.1}"))
}

fn n(v: Option<usize>) -> String {
    v.map_or("–".into(), |x| x.to_string())
}

pub fn markdown(s: &Summary) -> String {
    let mut o = String::new();
    let w = &s.workload;
    let _ = writeln!(o, "# vela eval: {}\n", w["name"].as_str().unwrap_or("?"));
    let _ = writeln!(o, "- status: **{}**", s.status);
    let _ = writeln!(
        o,
        "- driver: {}{}; server: {}",
        s.driver,
        s.url
            .as_deref()
            .map(|u| format!(" ({u})"))
            .unwrap_or_default(),
        s.server
    );
    let _ = writeln!(
        o,
        "- workload digest: {}; clients: {}",
        w["digest"].as_str().unwrap_or("?"),
        w["clients"]
    );
    if let Some(m) = &s.model {
        let _ = writeln!(
            o,
            "- model: {} (sha256 {})",
            m["path"].as_str().unwrap_or("?"),
            m["sha256"].as_str().unwrap_or("?")
        );
    }
    let g = |k: &str| s.metrics.get(k).copied();
    let _ = writeln!(
        o,
        "- load {} ms, warm-up {} ms (not part of any turn)",
        f1(g("load_ms")),
        f1(g("warmup_ms"))
    );
    let _ = writeln!(
        o,
        "- totals: prefill {} tok/s, decode loop {} tok/s, mean TTFT {} ms, wall {} ms, throughput {} tok/s\n",
        f1(g("prefill_tps")),
        f1(g("decode_tps")),
        f1(g("ttft_ms")),
        f1(g("wall_ms")),
        f1(g("throughput_tps"))
    );
    let _ = writeln!(o, "| client | turn | prompt | cached | new | prev ctx | re-rendered | out | TTFT ms | prefill tok/s | decode-loop tok/s | post-prefill tok/s | turn ms | drafts (acc) | ckpt save B/ms | restore B/ms | RSS MiB | GPU MiB | finish | checks |");
    let _ = writeln!(o, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---:|---:|---|---|");
    for t in &s.turns {
        let passed = t.checks.iter().filter(|c| c.passed).count();
        let src = |v: Option<f64>, x: crate::metrics::Source| {
            if v.is_some() && x == crate::metrics::Source::Client {
                "ᶜ"
            } else {
                ""
            }
        };
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {}{} | {}{} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} |",
            t.client,
            t.name,
            n(t.prompt_tokens),
            n(t.cached_tokens),
            n(t.new_tokens),
            n(t.previous_tokens),
            t.rerendered_tokens.map_or("–".into(), |x| x.to_string()),
            n(t.completion_tokens),
            f1(t.ttft_ms),
            f1(t.prefill_tps),
            src(t.prefill_tps, t.prefill_source),
            f1(t.decode_loop_tps),
            src(t.decode_loop_tps, t.decode_source),
            f1(t.post_prefill_tps),
            t.turn_ms,
            match (t.draft_tokens, t.acceptance) {
                (Some(d), Some(a)) if d > 0 => format!("{d} ({:.0} %)", a * 100.0),
                _ => "–".into(),
            },
            match (t.checkpoint_bytes, t.checkpoint_ms) {
                (Some(b), Some(m)) => format!("{b}/{m:.2}"),
                _ => "–".into(),
            },
            match (t.restore_bytes, t.restore_ms) {
                (Some(b), Some(m)) => format!("{b}/{m:.2}"),
                _ => "–".into(),
            },
            f1(t.rss_peak_mib),
            f1(t.gpu_mem_peak_mib),
            t.error.as_deref().map(|e| format!("error: {e}")).or(t.finish_reason.clone()).unwrap_or_default(),
            if t.checks.is_empty() { "–".into() } else { format!("{passed}/{}", t.checks.len()) },
        );
    }
    if s.turns.iter().any(|t| {
        use crate::metrics::Source::Client;
        (t.prefill_tps.is_some() && t.prefill_source == Client)
            || (t.decode_loop_tps.is_some() && t.decode_source == Client)
    }) {
        let _ = writeln!(
            o,
            "\nᶜ measured at the client (the server sent no `timings`)."
        );
    }
    let checks: Vec<_> = s
        .turns
        .iter()
        .flat_map(|t| t.checks.iter().map(move |c| (t, c)))
        .collect();
    if !checks.is_empty() {
        let _ = writeln!(o, "\n## Checks\n");
        for (t, c) in checks {
            let mark = if c.skipped {
                "skipped"
            } else if c.passed {
                "pass"
            } else {
                "FAIL"
            };
            let _ = writeln!(
                o,
                "- client {} {}: {} — **{mark}** {}",
                t.client, t.name, c.check, c.detail
            );
        }
    }
    if !s.stalls.is_empty() {
        let _ = writeln!(
            o,
            "\n## Stall probe (ms; host: timer lateness, device: canary completion)\n"
        );
        let _ = writeln!(o, "| kind | phase | samples | p50 | p95 | p99 | max |\n|---|---|---:|---:|---:|---:|---:|");
        for x in &s.stalls {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} |",
                x.kind, x.phase, x.count, x.p50, x.p95, x.p99, x.max
            );
        }
    }
    if !s.probe_errors.is_empty() {
        let _ = writeln!(o, "\nprobe errors: {}", s.probe_errors.join("; "));
    }
    o
}

// --- SVG ---

const COLORS: [&str; 6] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#b07aa1",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn svg_open(w: f64, h: f64, title: &str) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"18\" font-size=\"14\" text-anchor=\"middle\">{}</text>\n",
        w / 2.0,
        esc(title)
    )
}

/// Bars of one series per panel: (label, value).
fn bar_panel(
    o: &mut String,
    y0: f64,
    h: f64,
    w: f64,
    title: &str,
    bars: &[(String, Option<f64>)],
    color: &str,
) {
    let max = bars
        .iter()
        .filter_map(|b| b.1)
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let (left, right) = (50.0, 10.0);
    let bw = (w - left - right) / bars.len().max(1) as f64;
    let _ = writeln!(
        o,
        "<text x=\"{left}\" y=\"{}\" font-weight=\"bold\">{}</text>",
        y0 + 12.0,
        esc(title)
    );
    let base = y0 + h - 28.0;
    let top = y0 + 20.0;
    let _ = writeln!(
        o,
        "<line x1=\"{left}\" y1=\"{base}\" x2=\"{}\" y2=\"{base}\" stroke=\"#888\"/>",
        w - right
    );
    for (i, (label, v)) in bars.iter().enumerate() {
        let x = left + i as f64 * bw;
        if let Some(v) = v {
            let bh = (base - top) * v / max;
            let _ = writeln!(
                o,
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{bh:.1}\" fill=\"{color}\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{v:.1}</text>",
                x + bw * 0.15,
                base - bh,
                bw * 0.7,
                x + bw / 2.0,
                base - bh - 3.0
            );
        }
        let _ = writeln!(
            o,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            x + bw / 2.0,
            base + 14.0,
            esc(label)
        );
    }
}

/// Per-turn bars: prefill rate, decode-loop rate, TTFT.
pub fn turns_svg(turns: &[TurnMetrics]) -> String {
    let (w, ph) = (120.0 + 90.0 * turns.len() as f64, 170.0);
    let mut o = svg_open(w.max(400.0), 30.0 + 3.0 * ph, "per-turn metrics");
    let label = |t: &TurnMetrics| {
        if turns.iter().any(|x| x.client > 0) {
            format!("{}:{}", t.client, t.name)
        } else {
            t.name.clone()
        }
    };
    type Series = Box<dyn Fn(&TurnMetrics) -> Option<f64>>;
    let series: [(&str, Series); 3] = [
        ("prefill tok/s", Box::new(|t| t.prefill_tps)),
        ("decode-loop tok/s", Box::new(|t| t.decode_loop_tps)),
        ("TTFT ms", Box::new(|t| t.ttft_ms)),
    ];
    for (i, (title, f)) in series.iter().enumerate() {
        let bars: Vec<_> = turns.iter().map(|t| (label(t), f(t))).collect();
        bar_panel(
            &mut o,
            30.0 + i as f64 * ph,
            ph,
            w.max(400.0),
            title,
            &bars,
            COLORS[i],
        );
    }
    o + "</svg>\n"
}

/// Cumulative output events over run time, one line per turn (a dot where it was sent).
pub fn timeline_svg(turns: &[TurnMetrics], traces: &[Trace]) -> String {
    let (w, h, left, bottom) = (800.0, 400.0, 50.0, 40.0);
    let mut o = svg_open(
        w,
        h,
        "token timeline (output events per turn over run time)",
    );
    let t_end = traces
        .iter()
        .map(|t| t.done)
        .fold(0.0f64, f64::max)
        .max(1e-3);
    let t_start = traces
        .iter()
        .filter(|t| t.done > 0.0)
        .map(|t| t.sent)
        .fold(t_end, f64::min);
    let n_max = traces
        .iter()
        .map(|t| t.token_events.len())
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let x = |t: f64| left + (t - t_start) / (t_end - t_start).max(1e-3) * (w - left - 20.0);
    let y = |k: f64| h - bottom - k / n_max * (h - bottom - 40.0);
    let _ = writeln!(
        o,
        "<line x1=\"{left}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#888\"/>",
        h - bottom,
        w - 20.0,
        h - bottom
    );
    let _ = writeln!(o, "<text x=\"{left}\" y=\"{}\">{:.1} s</text><text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.1} s</text>", h - bottom + 16.0, 0.0, w - 20.0, h - bottom + 16.0, t_end - t_start);
    let _ = writeln!(
        o,
        "<text x=\"10\" y=\"{}\">{n_max:.0}</text>",
        y(n_max) + 4.0
    );
    for (i, (m, tr)) in turns.iter().zip(traces).enumerate() {
        if tr.token_events.is_empty() {
            continue;
        }
        let c = COLORS[i % COLORS.len()];
        let pts: Vec<String> = tr
            .token_events
            .iter()
            .enumerate()
            .map(|(k, &t)| format!("{:.1},{:.1}", x(t), y(k as f64 + 1.0)))
            .collect();
        let _ = writeln!(
            o,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{c}\"/>",
            x(tr.sent),
            y(0.0)
        );
        let _ = writeln!(
            o,
            "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"1.5\" points=\"{}\"/>",
            pts.join(" ")
        );
        let (lx, ly) = (
            x(*tr.token_events.last().unwrap_or(&tr.done)),
            y(tr.token_events.len() as f64),
        );
        let _ = writeln!(
            o,
            "<text x=\"{lx:.1}\" y=\"{:.1}\" fill=\"{c}\">{}</text>",
            ly - 4.0,
            esc(&format!("{}:{}", m.client, m.name))
        );
    }
    o + "</svg>\n"
}

/// Histogram of probe latencies in power-of-two buckets, one panel per kind, a bar per phase.
pub fn stalls_svg(samples: &[Sample]) -> String {
    let bounds: Vec<f64> = (-3..=11).map(|e| 2f64.powi(e)).collect(); // 0.125 ms .. 2048 ms
    let kinds: Vec<&str> = ["host", "device"]
        .into_iter()
        .filter(|k| samples.iter().any(|s| s.kind == *k))
        .collect();
    let phases: Vec<&str> = {
        let mut p: Vec<&str> = samples.iter().map(|s| s.phase_start).collect();
        p.sort();
        p.dedup();
        p
    };
    let (w, ph) = (820.0, 220.0);
    let mut o = svg_open(
        w,
        40.0 + ph * kinds.len().max(1) as f64,
        "stall probe: samples per latency bucket (ms), by phase",
    );
    for (pi, kind) in kinds.iter().enumerate() {
        let y0 = 30.0 + pi as f64 * ph;
        let counts: Vec<Vec<usize>> = phases
            .iter()
            .map(|p| {
                let mut c = vec![0usize; bounds.len() + 1];
                for s in samples
                    .iter()
                    .filter(|s| s.kind == *kind && s.phase_start == *p)
                {
                    c[bounds
                        .iter()
                        .position(|&b| s.ms <= b)
                        .unwrap_or(bounds.len())] += 1;
                }
                c
            })
            .collect();
        let max = counts.iter().flatten().copied().max().unwrap_or(1).max(1) as f64;
        let (left, base, top) = (50.0, y0 + ph - 40.0, y0 + 24.0);
        let gw = (w - left - 20.0) / (bounds.len() + 1) as f64;
        let bw = gw * 0.8 / phases.len().max(1) as f64;
        let _ = writeln!(
            o,
            "<text x=\"{left}\" y=\"{}\" font-weight=\"bold\">{kind} (log count scale)</text>",
            y0 + 14.0
        );
        for (bi, b) in bounds
            .iter()
            .chain(std::iter::once(&f64::INFINITY))
            .enumerate()
        {
            let label = if b.is_finite() {
                format!("≤{b}")
            } else {
                ">2048".into()
            };
            let _ = writeln!(o, "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"9\">{label}</text>", left + (bi as f64 + 0.5) * gw, base + 14.0);
            for (k, c) in counts.iter().enumerate() {
                if c[bi] == 0 {
                    continue;
                }
                let bh = (base - top) * (1.0 + c[bi] as f64).ln() / (1.0 + max).ln();
                let _ = writeln!(
                    o,
                    "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{bw:.1}\" height=\"{bh:.1}\" fill=\"{}\"><title>{} {}: {}</title></rect>",
                    left + bi as f64 * gw + gw * 0.1 + k as f64 * bw,
                    base - bh,
                    COLORS[k % COLORS.len()],
                    phases[k],
                    label,
                    c[bi]
                );
            }
        }
        let _ = writeln!(
            o,
            "<line x1=\"{left}\" y1=\"{base}\" x2=\"{}\" y2=\"{base}\" stroke=\"#888\"/>",
            w - 20.0
        );
        for (k, p) in phases.iter().enumerate() {
            let _ = writeln!(o, "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{:.1}\" y=\"{:.1}\">{p}</text>", w - 150.0, y0 + 20.0 + k as f64 * 14.0, COLORS[k % COLORS.len()], w - 136.0, y0 + 29.0 + k as f64 * 14.0);
        }
    }
    o + "</svg>\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_whole() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.json");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert!(!d.path().join(".x.json.tmp").exists());
    }

    #[test]
    fn plots_are_well_formed() {
        let t = TurnMetrics {
            name: "a<b".into(),
            prefill_tps: Some(10.0),
            ..TurnMetrics::default()
        };
        let tr = Trace {
            sent: 1.0,
            token_events: vec![1.5, 1.6],
            done: 1.7,
            ..Trace::default()
        };
        let samples = vec![Sample {
            kind: "host",
            t: 0.0,
            ms: 0.3,
            phase_start: "idle",
            phase_end: "idle",
        }];
        for s in [
            turns_svg(std::slice::from_ref(&t)),
            timeline_svg(std::slice::from_ref(&t), &[tr]),
            stalls_svg(&samples),
        ] {
            assert!(s.starts_with("<svg") && s.ends_with("</svg>\n"));
            assert!(!s.contains("a<b") && !s.contains("NaN"), "{s}");
        }
    }
}
