//! Per-turn checks of an answer (the workload's `checks`).
//!
//! The Python check runs the model's code: in a fresh interpreter started with `-I -S` (no
//! site packages, no user environment, an empty environment), in a scratch directory, with a
//! time limit (10 s). That is isolation from the harness, not a security sandbox: run workloads
//! with code checks only where running model-written code is acceptable (`--no-exec` skips them).

use crate::client::Trace;
use crate::workload::Check;
use serde::Serialize;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CheckResult {
    /// The check, in words.
    pub check: String,
    pub passed: bool,
    /// Not run (no python3, or `--no-exec`): counts as not passed, reported apart.
    pub skipped: bool,
    pub detail: String,
}

fn result(check: String, passed: bool, detail: String) -> CheckResult {
    CheckResult {
        check,
        passed,
        skipped: false,
        detail,
    }
}

/// Run every check of a turn against its trace.
/// `exec`: the time limit of code checks (None: code checks are skipped).
pub fn run(checks: &[Check], tr: &Trace, exec: Option<Duration>) -> Vec<CheckResult> {
    checks.iter().map(|c| run_one(c, tr, exec)).collect()
}

fn run_one(c: &Check, tr: &Trace, exec: Option<Duration>) -> CheckResult {
    let text = tr.content.to_lowercase();
    let missing = |v: &[String]| -> Vec<String> {
        v.iter()
            .filter(|s| !text.contains(&s.to_lowercase()))
            .cloned()
            .collect()
    };
    match c {
        Check::ContainsAll(v) => {
            let m = missing(v);
            result(
                format!("contains all of {v:?}"),
                m.is_empty(),
                if m.is_empty() {
                    String::new()
                } else {
                    format!("missing {m:?}")
                },
            )
        }
        Check::ContainsAny(v) => {
            let ok = missing(v).len() < v.len();
            result(
                format!("contains one of {v:?}"),
                ok,
                if ok {
                    String::new()
                } else {
                    "none found".into()
                },
            )
        }
        Check::NotContains(v) => {
            let found: Vec<_> = v
                .iter()
                .filter(|s| text.contains(&s.to_lowercase()))
                .cloned()
                .collect();
            result(
                format!("contains none of {v:?}"),
                found.is_empty(),
                if found.is_empty() {
                    String::new()
                } else {
                    format!("found {found:?}")
                },
            )
        }
        Check::MinWords(n) => {
            let w = tr.content.split_whitespace().count();
            result(format!("at least {n} words"), w >= *n, format!("{w} words"))
        }
        Check::NoQuestionAtEnd(want) => {
            let last = tr
                .content
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            let asks = last.contains('?');
            result(
                "does not end with a question".into(),
                asks != *want,
                if asks {
                    format!("last line: {:.120}", last.trim())
                } else {
                    String::new()
                },
            )
        }
        Check::ToolCall(name) => {
            let call = tr.tool_calls.iter().find(|c| c.name == *name);
            let (ok, detail) = match call {
                None => (
                    false,
                    format!(
                        "no call of {name} (finish {:?}, calls {:?})",
                        tr.finish_reason,
                        tr.tool_calls.iter().map(|c| &c.name).collect::<Vec<_>>()
                    ),
                ),
                Some(c) => match serde_json::from_str::<serde_json::Value>(&c.arguments) {
                    Ok(v) if v.is_object() => (true, format!("arguments {}", c.arguments)),
                    _ => (
                        false,
                        format!("arguments are not a JSON object: {:.200}", c.arguments),
                    ),
                },
            };
            result(format!("calls tool {name}"), ok, detail)
        }
        Check::Python { function, tests } => {
            let check = format!("python {function}: {} tests", tests.len());
            let Some(limit) = exec else {
                return CheckResult {
                    check,
                    passed: false,
                    skipped: true,
                    detail: "code execution disabled (--no-exec)".into(),
                };
            };
            match python(&code_block(&tr.content), function, tests, limit) {
                Ok((passed, detail)) => result(check, passed, detail),
                Err(e) => CheckResult {
                    check,
                    passed: false,
                    skipped: true,
                    detail: format!("{e:#}"),
                },
            }
        }
    }
}

/// The first fenced code block (preferring one tagged python), else the whole answer.
pub fn code_block(answer: &str) -> String {
    let blocks: Vec<(&str, &str)> = answer
        .split("```")
        .skip(1)
        .step_by(2)
        .map(|b| match b.split_once('\n') {
            Some((tag, body)) => (tag.trim(), body),
            None => ("", b),
        })
        .collect();
    blocks
        .iter()
        .find(|(tag, _)| tag.eq_ignore_ascii_case("python") || tag.eq_ignore_ascii_case("py"))
        .or_else(|| blocks.first())
        .map(|(_, b)| b.to_string())
        .unwrap_or_else(|| answer.to_string())
}

const RUNNER: &str = r#"
import json, sys
results = []
ns = {}
try:
    exec(compile(open("solution.py").read(), "solution.py", "exec"), ns)
    err = None if callable(ns.get(FUNCTION)) else "the code defines no function " + FUNCTION
except BaseException as e:
    err = "the code does not run: " + type(e).__name__ + ": " + str(e)
for t in TESTS:
    if err:
        results.append([False, err])
        continue
    try:
        exec(t, dict(ns))
        results.append([True, ""])
    except BaseException as e:
        results.append([False, type(e).__name__ + (": " + str(e) if str(e) else "")])
print(json.dumps(results))
"#;

/// Run `tests` against `code` in a fresh interpreter: (all passed, "k/n passed; …").
fn python(
    code: &str,
    function: &str,
    tests: &[String],
    limit: Duration,
) -> anyhow::Result<(bool, String)> {
    use anyhow::{bail, Context};
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "vela-eval-py-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir)?;
    let _cleanup = Cleanup(dir.clone());
    std::fs::write(dir.join("solution.py"), code)?;
    let runner = RUNNER
        .replace("FUNCTION", &serde_json::to_string(function)?)
        .replace("TESTS", &serde_json::to_string(tests)?);
    let mut child = match Command::new("python3")
        .args(["-I", "-S", "-"])
        .current_dir(&dir)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => bail!("python3 not available: {e}"),
    };
    child
        .stdin
        .take()
        .context("python3 stdin")?
        .write_all(runner.as_bytes())?;
    let t0 = Instant::now();
    loop {
        if child.try_wait()?.is_some() {
            break;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Ok((
                false,
                format!("timed out after {:.0} s", limit.as_secs_f64()),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let Some(line) = stdout.lines().last() else {
        let err = String::from_utf8_lossy(&out.stderr);
        return Ok((false, format!("no result: {:.300}", err.trim())));
    };
    let res: Vec<(bool, String)> =
        serde_json::from_str(line).with_context(|| format!("runner output {line:.200}"))?;
    let passed = res.iter().filter(|r| r.0).count();
    let fails: Vec<String> = res
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.0)
        .map(|(i, r)| format!("#{} {:.100}", i + 1, r.1))
        .take(3)
        .collect();
    let mut detail = format!("{passed}/{} passed", res.len());
    if !fails.is_empty() {
        detail += &format!("; failed {}", fails.join("; "));
    }
    Ok((passed == res.len(), detail))
}

struct Cleanup(std::path::PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::ToolCall;

    const EXEC: Option<Duration> = Some(Duration::from_secs(10));

    fn answer(s: &str) -> Trace {
        Trace {
            content: s.into(),
            ..Trace::default()
        }
    }

    fn has_python() -> bool {
        Command::new("python3").arg("-c").arg("0").output().is_ok()
    }

    #[test]
    fn text_checks() {
        let t = answer("Tidepool keeps snapshots.\nIt uses hard links.");
        let r = run(
            &[
                Check::ContainsAll(vec!["tidepool".into(), "HARD LINK".into()]),
                Check::ContainsAll(vec!["backup".into()]),
                Check::ContainsAny(vec!["nope".into(), "snapshots".into()]),
                Check::NotContains(vec!["snapshots".into()]),
                Check::MinWords(7),
                Check::MinWords(8),
                Check::NoQuestionAtEnd(true),
            ],
            &t,
            EXEC,
        );
        let passed: Vec<bool> = r.iter().map(|c| c.passed).collect();
        assert_eq!(passed, [true, false, true, false, true, false, true]);
        let q = run(
            &[Check::NoQuestionAtEnd(true)],
            &answer("Done.\nAnything else?\n\n"),
            EXEC,
        );
        assert!(!q[0].passed);
    }

    #[test]
    fn tool_call_check() {
        let mut t = answer("");
        let c = [Check::ToolCall("get_weather".into())];
        assert!(!run(&c, &t, EXEC)[0].passed);
        t.tool_calls.push(ToolCall {
            id: "1".into(),
            name: "get_weather".into(),
            arguments: "{\"city\": \"Lisbon\"}".into(),
        });
        assert!(run(&c, &t, EXEC)[0].passed);
        t.tool_calls[0].arguments = "city=Lisbon".into();
        assert!(!run(&c, &t, EXEC)[0].passed);
    }

    #[test]
    fn code_blocks() {
        assert_eq!(
            code_block("x\n```python\ndef f(): pass\n```\nmore"),
            "def f(): pass\n"
        );
        assert_eq!(code_block("```\nA\n```\n```py\nB\n```"), "B\n");
        assert_eq!(code_block("def f(): pass"), "def f(): pass");
    }

    #[test]
    fn python_tests_pass_and_fail() {
        if !has_python() {
            eprintln!("python3 not found: skipping");
            return;
        }
        let tests = vec![
            "assert f([1, 5], 2) == [5]".to_string(),
            "assert f([3, 3], 3) == []".to_string(),
            "xs = [9, 1]; r = f(xs, 5); assert xs == [9, 1]".to_string(),
        ];
        let good = Check::Python {
            function: "f".into(),
            tests: tests.clone(),
        };
        let ok = run(
            std::slice::from_ref(&good),
            &answer("Here:\n```python\ndef f(v, t):\n    return [x for x in v if x > t]\n```"),
            EXEC,
        );
        assert!(ok[0].passed, "{:?}", ok[0]);
        assert_eq!(ok[0].detail, "3/3 passed");
        // >= instead of >, and mutating the input: 2 of 3 fail.
        let bad = run(
            std::slice::from_ref(&good),
            &answer(
                "```python\ndef f(v, t):\n    v[:] = [x for x in v if x >= t]\n    return v\n```",
            ),
            EXEC,
        );
        assert!(!bad[0].passed);
        assert!(bad[0].detail.starts_with("1/3 passed"), "{}", bad[0].detail);
        let broken = run(
            std::slice::from_ref(&good),
            &answer("```python\ndef f(:\n```"),
            EXEC,
        );
        assert!(
            broken[0].detail.contains("does not run"),
            "{}",
            broken[0].detail
        );
        let slow = run(
            &[Check::Python {
                function: "f".into(),
                tests: vec!["f()".into()],
            }],
            &answer("```python\ndef f():\n    while True: pass\n```"),
            Some(Duration::from_secs(1)),
        );
        assert_eq!(slow[0].detail, "timed out after 1 s");
        let skipped = run(std::slice::from_ref(&good), &answer(""), None);
        assert!(skipped[0].skipped && !skipped[0].passed);
    }
}
