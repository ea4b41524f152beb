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
        serde_json::from_str(&fs::read_to_string(a.out.join("gate-config.json")).unwrap()).unwrap();
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
        o.summary.as_mut().unwrap()["model"] = json!({"path": "m.gguf", "sha256": "sha256:beef"});
        o
    });
    assert!(
        e.contains("reports model sha256 beef, but") && e.contains("m.gguf hashes to"),
        "{e}"
    );
    let cfg: GateConfig =
        serde_json::from_str(&fs::read_to_string(a.out.join("gate-config.json")).unwrap()).unwrap();
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
    assert!(rec.wall_s > 0.0 && rec.host.load1_before.is_some() && rec.host.load1_after.is_some());

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
