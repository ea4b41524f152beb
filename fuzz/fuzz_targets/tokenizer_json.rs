//! Fuzz the HF `tokenizer.json` loader (`HfTokenizer::from_json_bytes`, what `vela_tokenizer::load`
//! runs on a model directory) and the loaded tokenizer on arbitrary text and ids.
//!
//! Input: the tokenizer.json bytes, then a NUL byte, then a payload (JSON text has no raw NUL).
//! The payload's lossy UTF-8 is encoded (with and without special-token parsing) and its
//! little-endian u32s are decoded as ids. Asserts: loading returns `Ok` or an error, never
//! panics; encoding valid UTF-8 and decoding any ids (out of range included) return `Ok` or an
//! error, and so do `token_to_piece` and the streaming detokenizer; every id that encoding
//! yields is below `n_vocab`. For a plain byte-level BPE (no normalizer, a `ByteLevel`
//! pre-tokenizer without prefix space, optionally after non-removing `Split`s, a `ByteLevel`
//! decoder, no subword prefix or suffix, every byte in the vocabulary, one string per id, no
//! added tokens), ASCII text round-trips: `decode(encode(t)) == t`, and so do the token pieces
//! the server streams.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use std::collections::HashSet;
use vela_tokenizer::hf::HfTokenizer;
use vela_tokenizer::Tokenizer;

/// Whether `tj` is a byte-level BPE for which `decode(encode(ascii)) == ascii` must hold.
fn plain_byte_level(tj: &Value) -> bool {
    let bl = |v: &Value| v["type"] == "ByteLevel" && v["add_prefix_space"] != true;
    let pre = &tj["pre_tokenizer"];
    let pre_ok = bl(pre)
        || (pre["type"] == "Sequence"
            && pre["pretokenizers"].as_array().is_some_and(|a| {
                a.iter().any(bl)
                    && a.iter().all(|p| {
                        bl(p)
                            || (p["type"] == "Split"
                                && p["invert"] != true
                                && p["behavior"] != "Removed")
                    })
            }));
    let m = &tj["model"];
    let Some(vocab) = m["vocab"].as_object() else {
        return false;
    };
    let map = vela_tokenizer::unicode::byte_map();
    let all_bytes = map
        .to_char
        .iter()
        .all(|c| vocab.contains_key(&c.to_string()));
    let ids: HashSet<u64> = vocab.values().filter_map(Value::as_u64).collect();
    tj["normalizer"].is_null()
        && pre_ok
        && tj["decoder"]["type"] == "ByteLevel"
        && m["type"] == "BPE"
        && m["continuing_subword_prefix"]
            .as_str()
            .is_none_or(str::is_empty)
        && m["end_of_word_suffix"].as_str().is_none_or(str::is_empty)
        && all_bytes
        && ids.len() == vocab.len()
        && tj["added_tokens"].as_array().is_none_or(Vec::is_empty)
}

fuzz_target!(|data: &[u8]| {
    let (json, payload) = match data.iter().position(|&b| b == 0) {
        Some(p) => (&data[..p], &data[p + 1..]),
        None => (data, &b"Hello world! 123 <|im_end|> caf\xc3\xa9"[..]),
    };
    let Ok(h) = HfTokenizer::from_json_bytes(json, &Value::Null, &Value::Null) else {
        return;
    };
    let round_trip = serde_json::from_slice::<Value>(json).is_ok_and(|v| plain_byte_level(&v));
    let tok = Tokenizer::Hf(Box::new(h));
    let n_vocab = tok.n_vocab();

    let text = String::from_utf8_lossy(payload);
    for (add, parse) in [(false, false), (true, true)] {
        if let Ok(ids) = tok.encode(&text, add, parse) {
            assert!(
                ids.iter().all(|&i| (i as usize) < n_vocab),
                "id out of the vocabulary"
            );
            let _ = tok.decode(&ids, false);
            let _ = tok.decode(&ids, true);
        }
    }

    let ids: Vec<u32> = payload
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .chain([n_vocab as u32, u32::MAX])
        .collect();
    let _ = tok.decode(&ids, false);
    let _ = tok.decode(&ids, true);
    let mut d = tok.detokenizer(true);
    for &id in &ids {
        let _ = tok.token_to_piece(id, false);
        let _ = tok.token_text(id);
        let _ = tok.is_eog(id);
        let _ = d.push(id);
    }
    let _ = d.flush();

    if round_trip {
        let ascii: String = text.chars().filter(char::is_ascii).collect();
        let ids = tok.encode(&ascii, false, false).expect("ASCII encodes");
        let back = tok.decode(&ids, false).expect("its ids decode");
        assert_eq!(back, ascii, "decode(encode(t)) != t");
        let pieces: Vec<u8> = ids
            .iter()
            .flat_map(|&i| tok.token_to_piece(i, true))
            .collect();
        assert!(
            pieces == ascii.as_bytes(),
            "token pieces do not spell {ascii:?}"
        );
    }
});
