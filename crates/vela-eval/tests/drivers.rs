//! `vela eval run` end to end on a real model (SmolLM2): the in-process driver, the `--url`
//! driver against `vela serve`'s code giving the same token counts, and a memory budget abort.

use clap::Parser;
use serde_json::Value;
use std::path::Path;
use vela_formats::testdata;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    run: vela_eval::run::RunArgs,
}

#[derive(Parser)]
struct Serve {
    #[command(flatten)]
    args: vela_server::ServeArgs,
}

const WORKLOAD: &str = r#"{
  "format": "vela-workload/1", "name": "two-turns", "api": "chat",
  "sampling": {"temperature": 0.0}, "max_tokens": 12,
  "system": "You are a helpful assistant.",
  "turns": [
    {"name": "one", "user": "Name three colours.", "checks": [{"min_words": 1}]},
    {"name": "two", "user": "Now name three animals."}
  ]
}"#;

fn run(dir: &Path, extra: &[&str]) -> (anyhow::Result<()>, Value) {
    let wl = dir.join("w.json");
    std::fs::write(&wl, WORKLOAD).unwrap();
    let out = dir.join(format!("out-{}", extra.len()));
    let mut argv = vec![
        "x",
        wl.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "-t",
        "2",
    ];
    argv.extend_from_slice(extra);
    let r = vela_eval::run::run(Cli::parse_from(argv).run);
    let s = std::fs::read(out.join("summary.json")).expect("summary.json is written");
    for f in [
        "report.md",
        "events.jsonl",
        "turns.svg",
        "timeline.svg",
        "stalls.svg",
    ] {
        assert!(out.join(f).exists(), "{f}");
    }
    (r, serde_json::from_slice(&s).unwrap())
}

fn counts(s: &Value) -> Vec<(u64, u64, u64)> {
    s["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let n = |k: &str| t[k].as_u64().unwrap_or(u64::MAX);
            (
                n("prompt_tokens"),
                n("cached_tokens"),
                n("completion_tokens"),
            )
        })
        .collect()
}

#[test]
fn in_process_and_url_drivers_agree() {
    let Some(model) = testdata::model(testdata::SMOLLM2) else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let m = model.to_str().unwrap();
    let (r, s) = run(d.path(), &["-m", m, "--device", "cpu"]);
    r.unwrap();
    assert_eq!(s["status"], "ok");
    assert_eq!(s["driver"], "in-process");
    let t = s["turns"].as_array().unwrap();
    assert_eq!(t.len(), 2);
    // The second turn reuses the first turn's whole context but for what the template renders
    // differently; vela's server reports engine-side timings.
    let (prev, cached) = (
        t[1]["previous_tokens"].as_u64().unwrap(),
        t[1]["cached_tokens"].as_u64().unwrap(),
    );
    assert!(
        cached <= prev && prev - cached <= 2,
        "cached {cached} of {prev}"
    );
    assert_eq!(
        t[1]["rerendered_tokens"].as_i64().unwrap(),
        (prev - cached) as i64
    );
    for turn in t {
        assert_eq!(turn["prefill_source"], "server");
        assert_eq!(turn["decode_source"], "server");
        assert!(turn["decode_loop_tps"].as_f64().unwrap() > 0.0);
        assert!(turn["rss_peak_mib"].as_f64().unwrap() > 10.0);
    }
    assert_eq!(t[0]["checks"][0]["passed"], true);
    assert!(s["metrics"]["load_ms"].as_f64().unwrap() > 0.0);
    assert!(s["stalls"]
        .as_array()
        .unwrap()
        .iter()
        .any(|x| x["kind"] == "host"));

    // The same workload through an HTTP server of the same code: the same tokens.
    let serve = Serve::parse_from(["x", "-m", m, "--device", "cpu", "-t", "2", "--port", "0"]);
    let server = vela_server::spawn(serve.args).unwrap();
    server.wait_ready().unwrap();
    let url = format!("http://{}", server.addr);
    let (r, u) = run(d.path(), &["--url", &url, "--no-probe"]);
    r.unwrap();
    assert_eq!(u["driver"], "url");
    assert_eq!(counts(&u), counts(&s));
    assert!(
        u["metrics"].get("load_ms").is_none(),
        "no load time over a URL"
    );
}

#[test]
fn memory_budget_stops_the_run_with_a_whole_report() {
    let Some(model) = testdata::model(testdata::SMOLLM2) else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let (r, s) = run(
        d.path(),
        &[
            "-m",
            model.to_str().unwrap(),
            "--device",
            "cpu",
            "--max-rss",
            "1",
            "--no-warmup",
        ],
    );
    let e = format!("{:#}", r.unwrap_err());
    assert!(e.contains("exceeds the budget of 1 MiB"), "{e}");
    assert!(
        s["status"]
            .as_str()
            .unwrap()
            .starts_with("aborted: host RSS"),
        "{}",
        s["status"]
    );
}
