//! Real models vs llama.cpp's `llama-tokenize` (goldens from scripts/gen-tokenizer-golden.py),
//! round trips, streaming decoding and encoding speed.

use std::time::Instant;
use vela_formats::gguf::GgufFile;
use vela_formats::testdata;
use vela_tokenizer::{Tokenizer, Vocab};

const MODELS: [&str; 3] = [testdata::SMOLLM2, testdata::GEMMA3, testdata::QWEN25];

fn vocab(name: &str) -> Option<Vocab> {
    let path = testdata::model(name)?;
    Some(Vocab::from_gguf(&GgufFile::open(path).unwrap()).unwrap())
}

#[test]
fn real_models_match_llama_tokenize() {
    for name in MODELS {
        let Some(v) = vocab(name) else { continue };
        let stem = name.trim_end_matches(".gguf");
        let Some(g) =
            testdata::require(testdata::golden_dir().join(format!("tokenizer/{stem}.json")))
        else {
            continue;
        };
        let j: serde_json::Value = serde_json::from_slice(&std::fs::read(g).unwrap()).unwrap();
        let cases = j["cases"].as_array().unwrap();
        assert!(cases.len() >= 60, "{name}: too few golden cases");
        let mut bad = Vec::new();
        for c in cases {
            let text = c["text"].as_str().unwrap();
            let add = c["add_special"].as_bool().unwrap();
            let ps = c["parse_special"].as_bool().unwrap();
            let want: Vec<u32> = c["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect();
            let got = v.encode(text, add, ps);
            if got != want {
                bad.push(format!(
                    "{text:?} add={add} parse={ps}\n  want {want:?}\n  got  {got:?}"
                ));
            }
        }
        println!(
            "{name}: {}/{} llama-tokenize cases pass",
            cases.len() - bad.len(),
            cases.len()
        );
        assert!(bad.is_empty(), "{name} mismatches:\n{}", bad.join("\n"));
    }
}

#[test]
fn special_tokens_and_eog() {
    if let Some(v) = vocab(testdata::QWEN25) {
        let im_end = v.text_to_token("<|im_end|>").unwrap();
        assert!(v.is_eog(im_end) && v.is_eog(v.text_to_token("<|endoftext|>").unwrap()));
        assert!(!v.is_eog(v.text_to_token("<|im_start|>").unwrap()));
        assert_eq!(v.encode("<|im_end|>", false, true), vec![im_end]);
        assert_ne!(v.encode("<|im_end|>", false, false), vec![im_end]);
        assert!(v.token_to_piece(im_end, false).is_empty());
        assert_eq!(v.token_to_piece(im_end, true), b"<|im_end|>");
    }
    if let Some(v) = vocab(testdata::GEMMA3) {
        let eot = v.text_to_token("<end_of_turn>").unwrap();
        assert!(v.is_eog(eot) && v.is_eog(v.special.eos.unwrap()));
        assert_eq!(v.special.bos, Some(2));
        assert!(v.add_bos);
    }
    if let Some(v) = vocab(testdata::SMOLLM2) {
        assert!(v.is_eog(v.text_to_token("<|im_end|>").unwrap()));
        assert!(!v.add_bos);
    }
}

#[test]
fn round_trip_decode() {
    let text = "Hello, world! 日本語 😀 e\u{301}  spaces\n\ttabs <|im_end|> 12345";
    for name in MODELS {
        let Some(v) = vocab(name) else { continue };
        let tok = Tokenizer::Gguf(Box::new(v));
        let ids = tok.encode(text, true, false).unwrap();
        let back = tok.decode(&ids, true).unwrap();
        assert_eq!(back, text, "{name}: round trip");
        // streaming gives the same text
        let mut d = tok.detokenizer(false);
        let mut s: String = ids.iter().map(|&id| d.push(id)).collect();
        s.push_str(&d.flush());
        assert_eq!(s, text, "{name}: streaming");
    }
}

#[test]
fn streaming_byte_fallback_tokens() {
    // Gemma 3 (SPM with byte fallback): a rare CJK char is spelled as <0xXX> byte tokens.
    let Some(v) = vocab(testdata::GEMMA3) else {
        return;
    };
    let text = "\u{2A6D6}\u{20BB7}x"; // CJK Extension B characters
    let ids = v.encode(text, false, false);
    let bytes: Vec<bool> = ids
        .iter()
        .map(|&i| v.attr(i) & vela_tokenizer::attr::BYTE != 0)
        .collect();
    assert!(
        bytes.iter().filter(|&&b| b).count() >= 4,
        "expected byte-fallback tokens: {ids:?}"
    );
    let tok = Tokenizer::Gguf(Box::new(v));
    let mut d = tok.detokenizer(false);
    let mut outs = Vec::new();
    for &id in &ids {
        let s = d.push(id);
        assert!(!s.contains('\u{FFFD}'), "half a character was emitted");
        outs.push(s);
    }
    // the first byte tokens of a 4-byte character produce nothing until it is complete
    assert_eq!(outs[0], "");
    let joined: String = outs.concat() + &d.flush();
    assert_eq!(joined, text);
}

#[test]
fn encoding_10kb_is_fast() {
    let base = "fn main() { println!(\"Hello, 世界 😀\"); }  // The quick brown fox 12345\n";
    let text: String = base.repeat(10_240 / base.len() + 1);
    for name in MODELS {
        let Some(v) = vocab(name) else { continue };
        let _ = v.encode(&text, true, false); // warm up lazy tables
        let t = Instant::now();
        let ids = v.encode(&text, true, false);
        let ms = t.elapsed().as_secs_f64() * 1e3;
        println!(
            "{name}: {} bytes -> {} tokens in {ms:.2} ms",
            text.len(),
            ids.len()
        );
        assert!(ms < 100.0, "{name}: encoding 10 KB took {ms:.1} ms");
    }
}
