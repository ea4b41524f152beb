//! llama.cpp's tokenizer golden tests (`models/ggml-vocab-*.gguf` + `.inp`/`.out`), with the
//! protocol of `tests/test-tokenizer-0.cpp`: add_special = false, parse_special = false, exact ids.

use vela_formats::gguf::GgufFile;
use vela_formats::testdata;
use vela_tokenizer::Vocab;

/// Vocabularies that must load and pass every case.
const REQUIRED: &[&str] = &[
    "llama-spm",
    "llama-bpe",
    "qwen2",
    "qwen35",
    "deepseek-llm",
    "deepseek-coder",
    "deepseek-v3",
    "gemma-4",
    "gpt-2",
    "phi-3",
    "starcoder",
    "falcon",
    "mpt",
    "refact",
    "command-r",
];
/// Vocabularies whose tokenizer type we do not implement (WPM).
const OPTIONAL: &[&str] = &["bert-bge"];

fn read_cases(base: &std::path::Path) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read(base.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(base.with_extension("gguf.out")).unwrap();
    let inp = String::from_utf8(inp).expect("inp is UTF-8");
    let sep = "\n__ggml_vocab_test__\n";
    let mut texts: Vec<&str> = Vec::new();
    let mut rest = inp.as_str();
    while !rest.is_empty() {
        match rest.find(sep) {
            Some(p) => {
                texts.push(&rest[..p]);
                rest = &rest[p + sep.len()..];
            }
            None => {
                texts.push(rest);
                break;
            }
        }
    }
    let outs: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(
        texts.len(),
        outs.len(),
        "{}: inp/out case counts differ",
        base.display()
    );
    texts.into_iter().map(String::from).zip(outs).collect()
}

/// The `ggml-vocab-*.gguf` files of `dir` that come with cases.
fn vocab_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy().to_string();
            n.starts_with("ggml-vocab-")
                && n.ends_with(".gguf")
                && p.with_extension("gguf.inp").exists()
        })
        .collect();
    files.sort();
    files
}

#[test]
fn ggml_vocab_golden() {
    let Some(dir) = testdata::require(testdata::llama_cpp_src().join("models")) else {
        return;
    };
    let mut files = vocab_files(&dir);
    // Vocabularies llama.cpp ships no file of, converted from real tokenizer.json files by
    // its converter, with its own tokenization as the cases (scripts/gen-deepseekv4-vocab.py).
    if let Some(d) =
        testdata::require(testdata::golden_dir().join("tokenizer/ggml-vocab-deepseek-v3.gguf"))
    {
        files.extend(vocab_files(d.parent().unwrap()));
    }
    let mut failures = Vec::new();
    let mut seen = Vec::new();
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy();
        let name = name
            .trim_start_matches("ggml-vocab-")
            .trim_end_matches(".gguf")
            .to_string();
        let gf = GgufFile::open(f).unwrap();
        let vocab = match Vocab::from_gguf(&gf) {
            Ok(v) => v,
            Err(e) => {
                assert!(
                    OPTIONAL.contains(&name.as_str()),
                    "{name}: failed to load: {e:#}"
                );
                println!("{name:>16}: SKIP ({e})");
                continue;
            }
        };
        seen.push(name.clone());
        let cases = read_cases(f);
        let mut pass = 0;
        for (text, want) in &cases {
            let got = vocab.encode(text, false, false);
            if &got == want {
                pass += 1;
            } else if failures.len() < 40 {
                failures.push(format!(
                    "{name}: {text:?}\n   want {want:?}\n   got  {got:?}"
                ));
            }
        }
        println!("{name:>16}: {pass}/{} cases pass", cases.len());
        if pass != cases.len() {
            failures.push(format!("{name}: {pass}/{} pass", cases.len()));
        }
    }
    for r in REQUIRED {
        assert!(
            seen.iter().any(|s| s == r),
            "required vocabulary {r} was not tested"
        );
    }
    assert!(failures.is_empty(), "mismatches:\n{}", failures.join("\n"));
}
