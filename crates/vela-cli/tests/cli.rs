//! The `vela` binary's contract: outputs on stdout, one-line errors with exit status 1, no panics.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use vela_formats::testdata;

fn vela(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vela"))
        .args(args)
        .env("VELA_OFFLINE", "1")
        .output()
        .unwrap()
}

/// Assert a clean failure: status 1, a single `error:` line containing `needle`, no panic.
fn fails_with(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "expected one error line: {err}");
    assert!(lines[0].contains(needle), "expected {needle:?} in {err}");
    assert!(out.stdout.is_empty(), "stdout must stay empty on error");
}

fn smol() -> Option<PathBuf> {
    testdata::model(testdata::SMOLLM2)
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vela-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

#[test]
fn truncated_and_corrupted_models_are_rejected() {
    let Some(m) = smol() else { return };
    let bytes = std::fs::read(&m).unwrap();
    let t = tmp("truncated.gguf");
    std::fs::write(&t, &bytes[..bytes.len() / 3]).unwrap();
    fails_with(
        &vela(&["run", "--model", t.to_str().unwrap(), "--prompt", "hi"]),
        "truncated",
    );
    let mut bad = bytes[..4096].to_vec();
    bad[0] = b'X';
    std::fs::write(&t, &bad).unwrap();
    fails_with(
        &vela(&["info", "--model", t.to_str().unwrap()]),
        "bad magic",
    );
    fails_with(
        &vela(&[
            "run",
            "--model",
            "/nonexistent/model.gguf",
            "--prompt",
            "hi",
        ]),
        "model.gguf",
    );
}

#[test]
fn unknown_architecture_is_a_clear_error() {
    let Some(v) = testdata::require(testdata::llama_cpp_src().join("models/ggml-vocab-gpt-2.gguf"))
    else {
        return;
    };
    // A vocab-only GGUF: tokenizes fine, but is not a runnable model.
    let out = vela(&[
        "tokenize",
        "--model",
        v.to_str().unwrap(),
        "--text",
        "Hello world",
    ]);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[15496,995]");
    fails_with(
        &vela(&["run", "--model", v.to_str().unwrap(), "--prompt", "hi"]),
        "unsupported model architecture 'gpt2'",
    );
}

#[test]
fn limits_are_one_line_errors() {
    let Some(m) = smol() else { return };
    let m = m.to_str().unwrap();
    fails_with(
        &vela(&["run", "--model", m, "--prompt", "hi", "--max-tokens", "0"]),
        "max-tokens",
    );
    let long = "word ".repeat(100);
    fails_with(
        &vela(&["run", "--model", m, "--prompt", &long, "--ctx", "32"]),
        "prompt too long",
    );
    fails_with(
        &vela(&["run", "--model", m, "--prompt", "hi", "--temperature=-1"]),
        "temperature",
    );
    fails_with(
        &vela(&["logits", "--model", m, "--tokens", "1,x"]),
        "invalid token id",
    );
    fails_with(
        &vela(&["logits", "--model", m, "--tokens", "99999999"]),
        "out of range",
    );
    fails_with(
        &vela(&["run", "--model", m, "--prompt", "hi", "--kv-type", "q9"]),
        "kv-type",
    );
}

#[test]
fn run_streams_only_generated_text() {
    let Some(m) = smol() else { return };
    let out = vela(&[
        "run",
        "--model",
        m.to_str().unwrap(),
        "--prompt",
        "The capital of France is",
        "--temperature",
        "0",
        "--max-tokens",
        "8",
        "--threads",
        "2",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with(" Paris."), "{text:?}");
    // The prompt as the positional argument, and on standard input (less its final line
    // break): the same text.
    let args = ["--temperature", "0", "--max-tokens", "8", "--threads", "2"];
    let mut pos = vec![
        "run",
        "--model",
        m.to_str().unwrap(),
        "The capital of France is",
    ];
    pos.extend(args);
    let out = vela(&pos);
    assert_eq!(String::from_utf8(out.stdout).unwrap(), text);
    let mut child = Command::new(env!("CARGO_BIN_EXE_vela"))
        .args(["run", "--model", m.to_str().unwrap()])
        .args(args)
        .env("VELA_OFFLINE", "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"The capital of France is\n").unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), text);
}

/// `vela run --json-schema FILE`: the output is one JSON value valid under the schema, ended by
/// the model at the value's end; a schema that cannot be enforced is a one-line error.
#[test]
fn run_with_a_json_schema() {
    let Some(m) = smol() else { return };
    let schema = tmp("schema.json");
    std::fs::write(
        &schema,
        r#"{"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
            "population": {"type": "integer", "minimum": 0}}, "required": ["city", "population"],
            "additionalProperties": false}"#,
    )
    .unwrap();
    let m = m.to_str().unwrap();
    let args = |s: &Path| {
        let a = [
            "run",
            "--model",
            m,
            "--prompt",
            "The largest city of France, as JSON:",
        ];
        let b = [
            "--temperature",
            "0",
            "--max-tokens",
            "80",
            "--threads",
            "2",
            "--json-schema",
        ];
        vela(&[&a[..], &b[..], &[s.to_str().unwrap()]].concat())
    };
    let out = args(&schema);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let v: serde_json::Value = serde_json::from_str(text.trim()).expect(&text);
    let o = v.as_object().expect(&text);
    assert_eq!(o.len(), 2, "{text}");
    assert!(
        o["city"].as_str().is_some_and(|c| c.chars().count() <= 20),
        "{text}"
    );
    assert!(o["population"].as_u64().is_some(), "{text}");
    std::fs::write(&schema, r#"{"type": "object", "if": {}, "then": {}}"#).unwrap();
    fails_with(&args(&schema), "cannot be enforced");
}

#[test]
fn logits_and_tokenize_json() {
    let Some(m) = smol() else { return };
    let m = m.to_str().unwrap();
    let out = vela(&[
        "tokenize",
        "--model",
        m,
        "--text",
        "The capital of France is",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "[504,3575,282,4649,314]"
    );
    // Control-token text in user input is plain text unless --parse-special.
    let plain = vela(&["tokenize", "--model", m, "--text", "<|im_end|>", "--no-bos"]);
    let special = vela(&[
        "tokenize",
        "--model",
        m,
        "--text",
        "<|im_end|>",
        "--no-bos",
        "--parse-special",
    ]);
    assert_eq!(String::from_utf8_lossy(&special.stdout).trim(), "[2]");
    assert_ne!(plain.stdout, special.stdout);
    let out = vela(&["logits", "--model", m, "--tokens", "504,3575,282,4649,314"]);
    assert!(out.status.success());
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["n_vocab"], 49152);
    assert_eq!(j["tokens"].as_array().unwrap().len(), 5);
    let logits: Vec<f64> = j["logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(logits.len(), 49152);
    let argmax = logits
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .unwrap()
        .0;
    assert_eq!(argmax, 7042, "' Paris' is the greedy next token");
    // Every position's logits, fed in ubatches of 2: one row per token, the last one the same
    // prediction.
    let out = vela(&[
        "logits",
        "--model",
        m,
        "--tokens",
        "504,3575,282,4649,314",
        "--all-positions",
        "--ubatch",
        "2",
    ]);
    assert!(out.status.success());
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let all: Vec<f64> = j["logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(all.len(), 5 * 49152);
    let last = &all[4 * 49152..];
    let am = (0..last.len()).max_by(|&a, &b| last[a].total_cmp(&last[b]));
    assert_eq!(am, Some(7042), "the last row predicts ' Paris'");
}

/// `tokenize` accepts an HF checkpoint directory (tokenizer.json + tokenizer_config.json) and agrees
/// with the GGUF tokenizer of the same vocabulary.
#[test]
fn tokenize_hf_directory() {
    let Some(dir) = testdata::require(testdata::cache_dir().join("hf-tokenizers/qwen3")) else {
        return;
    };
    let Some(q) = testdata::model(testdata::QWEN25) else {
        return;
    };
    let text = "def f(x):\n    return x * 2  # 你好 <|im_end|>";
    let hf = vela(&[
        "tokenize",
        "--model",
        dir.to_str().unwrap(),
        "--text",
        text,
        "--no-bos",
    ]);
    let gg = vela(&[
        "tokenize",
        "--model",
        q.to_str().unwrap(),
        "--text",
        text,
        "--no-bos",
    ]);
    assert!(
        hf.status.success(),
        "{}",
        String::from_utf8_lossy(&hf.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&hf.stdout),
        String::from_utf8_lossy(&gg.stdout)
    );
}

#[test]
fn info_describes_the_model() {
    let Some(m) = testdata::model(testdata::GEMMA3) else {
        return;
    };
    let out = vela(&["info", "--model", m.to_str().unwrap()]);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    for needle in [
        "architecture: gemma3",
        "18 layers",
        "15 sliding-window layers",
        "q4_K",
        "262144 tokens",
    ] {
        assert!(s.contains(needle), "missing {needle:?} in:\n{s}");
    }
    let _ = Path::new("");
}

/// `--device` errors: an unknown name, and CUDA where no GPU/driver can be used (CI machines),
/// are one-line errors; `--device cpu` always works.
#[test]
fn device_flag_errors_are_one_line() {
    let Some(m) = smol() else { return };
    let m = m.to_str().unwrap();
    fails_with(
        &vela(&["run", "--model", m, "--prompt", "hi", "--device", "tpu"]),
        "unknown device",
    );
    fails_with(
        &vela(&["run", "--model", m, "--prompt", "hi", "--device", "cuda:x"]),
        "cuda:N",
    );
    let out = vela(&[
        "run", "--model", m, "--prompt", "hi", "--device", "cuda:7", "-n", "2",
    ]);
    // On a machine with 8+ usable GPUs this would run; everywhere else it must fail cleanly.
    if !out.status.success() {
        fails_with(&out, "cuda:7");
    }
    let out = vela(&[
        "run", "--model", m, "--prompt", "hi", "--device", "cpu", "-n", "2",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A Gemma 4 GGUF (random weights, real tokenizer and template: scripts/gen-gemma4-e2e.py) runs
/// through `run`, `chat` and `info`, and `info` also reads its Hugging Face directory.
#[test]
fn gemma4_run_chat_info() {
    let Some(g) = testdata::require(
        testdata::golden_dir()
            .join("gemma4_e2e")
            .join("model-f32.gguf"),
    ) else {
        return;
    };
    let gs = g.to_str().unwrap();
    let out = vela(&[
        "run",
        "--model",
        gs,
        "--prompt",
        "Hello",
        "-n",
        "8",
        "--temperature",
        "0",
        "--device",
        "cpu",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.stdout.is_empty());
    let mut child = Command::new(env!("CARGO_BIN_EXE_vela"))
        .args(["chat", "--model", gs, "-n", "4", "--device", "cpu"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"hi there\n/exit\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("gemma4"), "{err}");
    let info = vela(&["info", "--model", gs]);
    let s = String::from_utf8_lossy(&info.stdout);
    assert!(s.contains("model: gemma4, 4 layers (3 sliding"), "{s}");
    assert!(s.contains("tokenizer: 262144 tokens"), "{s}");
    let hf = g.parent().unwrap().join("hf");
    let info = vela(&["info", "--model", hf.to_str().unwrap()]);
    let s = String::from_utf8_lossy(&info.stdout);
    assert!(
        info.status.success(),
        "{}",
        String::from_utf8_lossy(&info.stderr)
    );
    assert!(s.contains("model_type: gemma4_text"), "{s}");
    assert!(s.contains("model: gemma4, 4 layers"), "{s}");
}

/// Greedy MTP speculative decoding (the assistant `mtp-model-f32.gguf` is discovered next to the
/// target) prints exactly what plain decoding (`--no-mtp`) prints, and reports its statistics.
#[test]
fn gemma4_mtp_greedy_equals_plain() {
    let Some(g) = testdata::require(
        testdata::golden_dir()
            .join("gemma4_e2e")
            .join("mtp-model-f32.gguf"),
    ) else {
        return;
    };
    let target = g.parent().unwrap().join("model-f32.gguf");
    let t = target.to_str().unwrap();
    let base = [
        "run",
        "--model",
        t,
        "--prompt",
        "Once upon a time",
        "-n",
        "40",
        "--temperature",
        "0",
        "--device",
        "cpu",
        "--ubatch",
        "8",
    ];
    let mtp = vela(&[&base[..], &["--draft-max", "3"]].concat());
    let plain = vela(&[&base[..], &["--no-mtp"]].concat());
    assert!(
        mtp.status.success(),
        "{}",
        String::from_utf8_lossy(&mtp.stderr)
    );
    assert!(
        plain.status.success(),
        "{}",
        String::from_utf8_lossy(&plain.stderr)
    );
    let err = String::from_utf8_lossy(&mtp.stderr);
    assert!(err.contains("MTP drafting with the assistant"), "{err}");
    assert!(err.contains("[speculative:"), "{err}");
    assert!(!String::from_utf8_lossy(&plain.stderr).contains("speculative"));
    assert_eq!(mtp.stdout, plain.stdout);
    // An assistant for a non-Gemma-4 target is refused with one line.
    if let Some(s) = smol() {
        fails_with(
            &vela(&[
                "run",
                "--model",
                s.to_str().unwrap(),
                "--prompt",
                "hi",
                "--mtp",
                g.to_str().unwrap(),
                "--device",
                "cpu",
            ]),
            "drafts for Gemma 4, Qwen3.8 Flash Next, DeepSeek V4, GLM 5.3 targets only",
        );
    }
}

/// `vela synth` is deterministic from the seed and its file runs.
#[test]
fn synth_is_deterministic_and_runs() {
    let (a, b, c) = (tmp("s1.gguf"), tmp("s2.gguf"), tmp("s3.gguf"));
    for (p, seed) in [(&a, "7"), (&b, "7"), (&c, "8")] {
        let out = vela(&[
            "synth",
            "--arch",
            "llama-tiny",
            "--type",
            "q4_0",
            "--seed",
            seed,
            "-o",
            p.to_str().unwrap(),
        ]);
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            // The tokenizer comes from llama.cpp's vocab files (test data).
            assert!(err.contains("tokenizer"), "{err}");
            return;
        }
    }
    let (ba, bb, bc) = (
        std::fs::read(&a).unwrap(),
        std::fs::read(&b).unwrap(),
        std::fs::read(&c).unwrap(),
    );
    assert_eq!(ba, bb);
    assert_ne!(ba, bc);
    let out = vela(&[
        "run",
        "--model",
        a.to_str().unwrap(),
        "--prompt",
        "hi",
        "-n",
        "4",
        "--device",
        "cpu",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A prefill-only bench (no decode tests) still has room for its warm-up decode steps.
    let out = vela(&[
        "bench",
        "-m",
        a.to_str().unwrap(),
        "-p",
        "300",
        "-n",
        "0",
        "-r",
        "2",
        "--device",
        "cpu",
    ]);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("pp300"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    fails_with(
        &vela(&["synth", "--arch", "nope", "-o", a.to_str().unwrap()]),
        "nope",
    );
    let list = vela(&["synth", "--list"]);
    assert!(String::from_utf8_lossy(&list.stdout).contains("llama3-8b"));
}

/// `--model synth:` for DeepSeek V4: the tiny geometry benchmarks on the CPU; `vela info` gives
/// the real geometry's memory plan without generating anything.
#[test]
fn synth_deepseek_bench_and_memory_plan() {
    let out = vela(&["info", "-m", "synth:deepseek-v4-flash"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("284.3B parameters"),
        "{text}"
    );
    assert!(
        text.contains("| 128K |") && text.contains("| Q4_0"),
        "{text}"
    );
    let out = vela(&[
        "bench",
        "-m",
        "synth:deepseek-v4-tiny:q8_0",
        "-p",
        "64",
        "-n",
        "8",
        "-r",
        "1",
        "--device",
        "cpu",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && err.contains("tokenizer source") {
        // The vocabulary comes from llama.cpp's vocab files (test data).
        return;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("pp64") && text.contains("tg8"),
        "{text}\n{err}"
    );
    let list = vela(&["synth", "--list"]);
    assert!(String::from_utf8_lossy(&list.stdout).contains("deepseek-v4-flash-12l"));
    fails_with(&vela(&["info", "-m", "synth:nope"]), "nope");
    // With its DSpark drafter: speculation at forced acceptance drafts whole blocks.
    let out = vela(&[
        "bench",
        "-m",
        "synth:deepseek-v4-tiny-dspark:q8_0",
        "--spec-accept",
        "0.9",
        "-d",
        "16",
        "-n",
        "12",
        "--draft-max",
        "3",
        "-r",
        "1",
        "--device",
        "cpu",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("p=0.9 K=3") && text.contains("MTP head"),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `--model synth:` for GLM 5: `vela info` gives the real geometry's memory plan and `vela plan`
/// its experts placement without generating anything; the tiny geometry benchmarks in memory,
/// speculative decoding with its MTP block included, and `vela synth` writes it as a
/// `glm5-next` GGUF that runs.
#[test]
fn synth_glm5_memory_plan_bench_and_file() {
    let out = vela(&["info", "-m", "synth:glm5-flash"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("313.3B parameters") && text.contains("320.8B"),
        "{text}"
    );
    assert!(text.contains("| 1M |") && text.contains("| Q4_0"), "{text}");
    let out = vela(&["plan", "-m", "synth:glm5-flash:q4_0", "--device", "cpu"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("in 43 MoE layers"),
        "{text}"
    );
    let bench = |m: &str| {
        let out = vela(&[
            "bench", "-m", m, "-p", "64", "-n", "8", "-r", "1", "--device", "cpu",
        ]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("pp64") && text.contains("tg8"),
            "{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    bench("synth:glm5-tiny:q8_0");
    // The MTP block drafts (proposals forced to 70 % acceptance): `vela bench` fails unless
    // every speculative run prints plain greedy decoding's tokens.
    let out = vela(&[
        "bench",
        "-m",
        "synth:glm5-tiny",
        "--spec-accept",
        "0.7",
        "-n",
        "24",
        "-d",
        "40",
        "-r",
        "1",
        "--draft-max",
        "3",
        "--device",
        "cpu",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("the model's MTP head") && text.contains("p=0.7 K=3"),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p = tmp("glm5-tiny.gguf");
    let out = vela(&[
        "synth",
        "--arch",
        "glm5-tiny",
        "--type",
        "q4_0",
        "-o",
        p.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let info = vela(&["info", "-m", p.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&info.stdout);
    assert!(
        text.contains("architecture: glm5-next") && text.contains("model: glm5_next"),
        "{text}"
    );
    bench(p.to_str().unwrap());
    let list = vela(&["synth", "--list"]);
    assert!(String::from_utf8_lossy(&list.stdout).contains("glm5-flash-12l"));
}

/// `--lookup` (prompt-lookup speculative decoding) prints exactly what plain greedy decoding
/// prints, and accepts drafts on a prompt whose answer repeats it.
#[test]
fn lookup_greedy_equals_plain() {
    let Some(m) = smol() else { return };
    let m = m.to_str().unwrap();
    let prompt = "a b c d e f g h\na b c d e f g h\na b c d";
    let base = [
        "run",
        "--model",
        m,
        "--prompt",
        prompt,
        "-n",
        "24",
        "--temperature",
        "0",
        "--device",
        "cpu",
    ];
    let plain = vela(&base);
    let look = vela(&[&base[..], &["--lookup"]].concat());
    assert!(
        look.status.success(),
        "{}",
        String::from_utf8_lossy(&look.stderr)
    );
    assert_eq!(look.stdout, plain.stdout);
    let err = String::from_utf8_lossy(&look.stderr);
    assert!(
        err.contains("[speculative:") && !err.contains(" 0/"),
        "{err}"
    );
}

/// `vela run ... | head -c 0`: the reader is gone; vela must end without a panic (it used to
/// panic in the newline printed after the text: "failed printing to stdout").
#[cfg(unix)]
#[test]
fn closed_stdout_ends_quietly() {
    let Some(m) = smol() else { return };
    let mut child = Command::new(env!("CARGO_BIN_EXE_vela"))
        .args([
            "run",
            "--model",
            m.to_str().unwrap(),
            "--prompt",
            "Once upon a time",
        ])
        .args([
            "--max-tokens",
            "24",
            "--temperature",
            "0",
            "--device",
            "cpu",
        ])
        .env("VELA_OFFLINE", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Close the pipe before vela writes anything (while it loads the model), so its first
    // write fails whatever the pipe's buffer size.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "panic: {err}");
    // Killed by SIGPIPE (no status code) or a clean exit, never the panic's 101.
    assert_ne!(out.status.code(), Some(101), "stderr: {err}");
}

/// Write an executable stand-in client `name` into `dir`; returns a `PATH` that finds it first.
fn stand_in(dir: &Path, name: &str, script: &str) -> String {
    let client = dir.join(name);
    std::fs::write(&client, script).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&client, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    format!("{}:{}", dir.display(), std::env::var("PATH").unwrap())
}

/// `vela agent` with a stand-in `claude` on PATH (a Python script speaking the Messages API as
/// Claude Code does: Bearer key, the model from ANTHROPIC_MODEL, a system message inside the
/// conversation, tools, count_tokens first): the server it starts answers, the client's
/// arguments and exit status pass through, and the port is free afterwards. A missing client is
/// a one-line error naming how to install it.
#[test]
fn agent_starts_a_server_for_the_client_and_stops_it() {
    let Some(m) = smol() else { return };
    let dir = tmp("agent-bin");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let report = dir.join("report.json");
    let script = format!(
        r#"#!/usr/bin/env python3
import json, os, sys, urllib.request
base, key, model = (os.environ[k] for k in ("ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_MODEL"))
def post(path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(),
        {{"Authorization": "Bearer " + key, "content-type": "application/json", "anthropic-version": "2023-06-01"}})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
msgs = [{{"role": "user", "content": [{{"type": "text", "text": "Say OK", "cache_control": {{"type": "ephemeral"}}}}]}},
        {{"role": "system", "content": "Answer briefly."}}]
tools = [{{"name": "Read", "description": "Read a file", "input_schema": {{"type": "object", "properties": {{"path": {{"type": "string"}}}}}}}}]
body = {{"model": model, "system": [{{"type": "text", "text": "You are a helpful assistant."}}], "messages": msgs, "tools": tools,
        "metadata": {{"user_id": "x"}}, "max_tokens": 4}}
out = {{"args": sys.argv[1:], "count": post("/v1/messages/count_tokens", body), "messages": post("/v1/messages", body),
       "health": urllib.request.urlopen(base + "/health").status}}
json.dump(out, open({report:?}, "w"))
sys.exit(3)
"#,
        report = report.to_str().unwrap()
    );
    let path = stand_in(&dir, "claude", &script);
    let out = Command::new(env!("CARGO_BIN_EXE_vela"))
        .args(["agent", "-m", m.to_str().unwrap(), "--ctx", "1024"])
        .args(["--", "-p", "hello world"])
        .env("VELA_OFFLINE", "1")
        .env("PATH", &path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "the client's status: {err}");
    assert!(
        err.contains("ANTHROPIC_BASE_URL=http://127.0.0.1:"),
        "{err}"
    );
    assert!(err.contains(" free"), "the port is released: {err}");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(r["args"], serde_json::json!(["-p", "hello world"]));
    assert_eq!(r["count"][0], 200, "{r}");
    let n = r["count"][1]["input_tokens"].as_u64().unwrap();
    assert_eq!(r["messages"][0], 200, "{r}");
    assert_eq!(r["messages"][1]["usage"]["input_tokens"].as_u64(), Some(n));
    assert_eq!(r["messages"][1]["model"], "vela");
    // The port the stand-in used is free again.
    let port: u16 = err
        .split("ANTHROPIC_BASE_URL=http://127.0.0.1:")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap();
    assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_ok());
    // No client on PATH: one line saying how to install it.
    let out = Command::new(env!("CARGO_BIN_EXE_vela"))
        .args(["agent", "-m", m.to_str().unwrap()])
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    fails_with(&out, "npm install -g @anthropic-ai/claude-code");
}

/// `vela agent --client codex`: the stand-in `codex` finds the provider in its `-c` arguments
/// (base URL, key variable, `wire_api="responses"`) and sends a Codex-shaped request there,
/// streamed and not, without an output limit (the server's `--max-tokens` applies).
#[test]
fn agent_points_codex_at_the_responses_api() {
    let Some(m) = smol() else { return };
    let dir = tmp("agent-codex-bin");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let report = dir.join("report.json");
    let script = format!(
        r#"#!/usr/bin/env python3
import json, os, re, sys, urllib.request
args = sys.argv[1:]
provider = next(a for a in args if a.startswith("model_providers.vela="))
base = re.search(r'base_url="([^"]+)"', provider).group(1)
key = os.environ[re.search(r'env_key="([^"]+)"', provider).group(1)]
def post(body):
    req = urllib.request.Request(base + "/responses", json.dumps(body).encode(),
        {{"Authorization": "Bearer " + key, "content-type": "application/json"}})
    with urllib.request.urlopen(req) as r:
        raw = r.read().decode()
        return r.status, (json.loads(raw) if not body["stream"] else
            [json.loads(l[6:]) for l in raw.splitlines() if l.startswith("data: ")])
fn = {{"type": "function", "name": "exec_command", "parameters": {{"type": "object", "properties": {{"cmd": {{"type": "string"}}}}}}}}
body = {{"model": args[args.index("-m") + 1], "instructions": "", "store": False, "reasoning": {{"summary": "auto"}},
        "input": [{{"type": "message", "role": "developer", "content": [{{"type": "input_text", "text": "You are a coding agent."}}]}},
                  {{"type": "message", "role": "user", "content": [{{"type": "input_text", "text": "Count from 1 to 100."}}]}}],
        "tools": [fn, {{"type": "namespace", "name": "agents", "tools": [dict(fn, name="spawn_agent")]}}, {{"type": "web_search"}}],
        "tool_choice": "auto", "parallel_tool_calls": True, "temperature": 0, "stream": False}}
out = {{"args": args, "plain": post(body), "streamed": post(dict(body, stream=True))}}
json.dump(out, open({report:?}, "w"))
"#,
        report = report.to_str().unwrap()
    );
    let path = stand_in(&dir, "codex", &script);
    let out = Command::new(env!("CARGO_BIN_EXE_vela"))
        .args(["agent", "--client", "codex", "-m", m.to_str().unwrap()])
        .args(["--ctx", "1024", "--max-output", "3", "--", "exec", "hello"])
        .env("VELA_OFFLINE", "1")
        .env("PATH", &path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("VELA_API_KEY=") && err.contains(" free"),
        "{err}"
    );
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let args: Vec<&str> = r["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(&args[..4], ["-m", "vela", "-c", "model_provider=vela"]);
    assert!(args.contains(&"model_context_window=1024"), "{args:?}");
    assert!(args[5].contains(r#"wire_api="responses""#), "{args:?}");
    assert_eq!(&args[args.len() - 2..], ["exec", "hello"]);
    let plain = &r["plain"];
    assert_eq!(plain[0], 200, "{r}");
    assert_eq!(plain[1]["object"], "response");
    // Codex sets no output limit: the server's `--max-tokens` (`--max-output`) applies.
    assert_eq!(plain[1]["status"], "incomplete", "{r}");
    assert_eq!(plain[1]["usage"]["output_tokens"], 3, "{r}");
    assert!(plain[1]["usage"]["input_tokens"].as_u64().unwrap() > 20);
    let events = r["streamed"][1].as_array().unwrap();
    assert_eq!(events[0]["type"], "response.created");
    assert_eq!(events.last().unwrap()["type"], "response.incomplete");
}
