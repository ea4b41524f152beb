//! Fuzz the tokenizers built from GGUF vocabularies (`Vocab::from_gguf`, what
//! `vela_tokenizer::load` runs on a model file) on arbitrary text and ids.
//!
//! Vocabularies: llama.cpp's `models/ggml-vocab-*.gguf` (byte-level BPE with its many
//! pre-tokenizers, SPM, Gemma 4's BPE, and the WPM and UGM ones vela does not support, which must
//! fail to load with an error), `golden/tokenizer/*.gguf` and the real models of `models/`
//! (SmolLM2, Gemma 3, Qwen2.5-Coder), in that order, each sorted by name, under `$VELA_CACHE`
//! (default `~/.cache/vela`). Each is loaded once, on first use.
//!
//! Input: the first byte picks the vocabulary (modulo their number); the rest is the text (its
//! lossy UTF-8) and, read as little-endian u32s, the ids.
//!
//! Asserts, for every vocabulary:
//! * encoding never panics and every id it yields is below `n_vocab`;
//! * with special-token parsing off (`encode(t, false, false)`, what user text gets) no id is a
//!   control token, also for the text with the vocabulary's control-token texts spliced in
//!   (`<|im_start|>`, `<s>`, ...): user text never becomes control tokens;
//! * decoding any ids (out of range included) through `decode`, `token_to_piece`, `token_text`
//!   and the streaming `Detokenizer` returns text, never panics; the streamed text equals the
//!   lossy UTF-8 of the concatenated pieces.
//!
//! Round trips, where the vocabulary type guarantees them (only for vocabularies that can spell
//! every byte: all 256 GPT-2 byte characters for byte-level BPE, all `<0xXX>` tokens for SPM and
//! Gemma 4):
//! * byte-level BPE (`gpt2`): the token pieces spell the text exactly, with special-token parsing
//!   off and on (special tokens are spelled by their text), unless the text holds a special
//!   token with `lstrip`/`rstrip` (its neighbouring spaces are dropped, as in llama.cpp);
//!   `decode(encode(t)) == t`, except where the vocabulary cleans up tokenization spaces and the
//!   text has a space before `?!.,'` (llama.cpp's clean-up drops it);
//! * Gemma 4 BPE (`gemma4`, spaces escaped as U+2581): the same, for text without U+2581 (it
//!   decodes as a space);
//! * SPM (`llama`): the pieces spell the text after the one leading space the vocabulary adds
//!   (`add_space_prefix`), and `decode` removes that space: `decode(encode(t)) == t`; for text
//!   without U+2581 and without any user-defined token's text (the text after one gets its own
//!   leading space).
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use vela_formats::gguf::GgufFile;
use vela_tokenizer::{attr, Tokenizer, Vocab, VocabType};

/// A loaded vocabulary and what the target derives from it once.
struct Loaded {
    name: String,
    tok: Tokenizer,
    kind: VocabType,
    byte_level: bool,
    /// Every byte can be spelled (GPT-2 byte characters, or `<0xXX>` tokens).
    all_bytes: bool,
    add_space_prefix: bool,
    clean_spaces: bool,
    remove_extra_whitespaces: bool,
    /// Texts of control tokens (spliced into the text to check they stay plain).
    control: Vec<String>,
    /// Texts of user-defined tokens (partitioned out of the text even with special-token
    /// parsing off).
    user_defined: Vec<String>,
    /// Texts of special tokens that strip neighbouring spaces (`lstrip`/`rstrip`).
    strips: Vec<String>,
}

fn vocab_files() -> Vec<PathBuf> {
    let cache = std::env::var_os("VELA_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/vela")
        });
    let list = |dir: &Path, keep: &dyn Fn(&str) -> bool| {
        let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(keep))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    };
    let mut files = list(
        &cache.join("llama-cpp-python/vendor/llama.cpp/models"),
        &|n| n.starts_with("ggml-vocab-") && n.ends_with(".gguf"),
    );
    files.extend(list(&cache.join("golden/tokenizer"), &|n| {
        n.ends_with(".gguf")
    }));
    files.extend(list(&cache.join("models"), &|n| {
        matches!(
            n,
            "SmolLM2-135M-Instruct.Q4_1.gguf"
                | "gemma-3-270m-q4_k_m.gguf"
                | "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
        )
    }));
    if files.is_empty() {
        eprintln!(
            "gguf_vocab_text: no GGUF vocabularies under {}",
            cache.display()
        );
    }
    files
}

fn load(path: &Path) -> Option<Loaded> {
    let gf = GgufFile::open(path).expect("the vocabulary files are valid GGUF");
    let v = match Vocab::from_gguf(&gf) {
        Ok(v) => v,
        Err(e) => {
            let e = format!("{e:#}");
            assert!(
                !e.contains('\n'),
                "{}: multi-line error {e:?}",
                path.display()
            );
            eprintln!("gguf_vocab_text: {} not supported: {e}", path.display());
            return None;
        }
    };
    let byte_level = v.pre.as_ref().is_some_and(|p| p.byte_encode);
    let all_bytes = if byte_level {
        let map = vela_tokenizer::unicode::byte_map();
        map.to_char
            .iter()
            .all(|c| v.text_to_token(&c.to_string()).is_some())
    } else {
        (0..=255u8).all(|b| v.text_to_token(&format!("<0x{b:02X}>")).is_some())
    };
    let texts = |mask: u32| -> Vec<String> {
        v.tokens
            .iter()
            .filter(|t| t.attr & mask != 0)
            .map(|t| t.text.clone())
            .collect()
    };
    let control = texts(attr::CONTROL);
    let user_defined = texts(attr::USER_DEFINED);
    let strips = v
        .tokens
        .iter()
        .filter(|t| {
            t.attr & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
                && t.attr & (attr::LSTRIP | attr::RSTRIP) != 0
        })
        .map(|t| t.text.clone())
        .collect();
    eprintln!(
        "gguf_vocab_text: {} {:?}{} round trip {}",
        path.display(),
        v.kind,
        if byte_level { " byte-level" } else { "" },
        if all_bytes && !v.remove_extra_whitespaces {
            "checked"
        } else {
            "not checked"
        }
    );
    Some(Loaded {
        name: path.file_name().unwrap().to_string_lossy().into_owned(),
        kind: v.kind,
        byte_level,
        all_bytes,
        add_space_prefix: v.add_space_prefix,
        clean_spaces: v.clean_spaces,
        remove_extra_whitespaces: v.remove_extra_whitespaces,
        control,
        user_defined,
        strips,
        tok: Tokenizer::Gguf(Box::new(v)),
    })
}

struct Vocabs {
    files: Vec<PathBuf>,
    loaded: Vec<OnceLock<Option<Loaded>>>,
}

fn vocabs() -> &'static Vocabs {
    static V: OnceLock<Vocabs> = OnceLock::new();
    V.get_or_init(|| {
        let files = vocab_files();
        let loaded = files.iter().map(|_| OnceLock::new()).collect();
        Vocabs { files, loaded }
    })
}

/// The concatenated token pieces, special tokens spelled by their text.
fn pieces(tok: &Tokenizer, ids: &[u32]) -> Vec<u8> {
    ids.iter()
        .flat_map(|&i| tok.token_to_piece(i, true))
        .collect()
}

/// Whether llama.cpp's clean-up of tokenization spaces can change `t`.
fn cleanup_applies(t: &str) -> bool {
    t.as_bytes()
        .windows(2)
        .any(|w| w[0] == b' ' && matches!(w[1], b'?' | b'!' | b'.' | b',' | b'\''))
}

fn check_text(l: &Loaded, text: &str, valid_utf8: bool) {
    let tok = &l.tok;
    let n_vocab = tok.n_vocab();
    let name = &l.name;
    let ids = tok
        .encode(text, false, false)
        .expect("GGUF encoding is infallible");
    for &id in &ids {
        assert!(
            (id as usize) < n_vocab,
            "{name}: id {id} out of the vocabulary"
        );
        let a = match tok {
            Tokenizer::Gguf(v) => v.attr(id),
            _ => unreachable!(),
        };
        assert!(
            a & attr::CONTROL == 0,
            "{name}: {text:?} with special-token parsing off gave control token {id} ({:?})",
            tok.token_text(id)
        );
    }
    let special_ids = tok
        .encode(text, true, true)
        .expect("GGUF encoding is infallible");
    assert!(
        special_ids.iter().all(|&i| (i as usize) < n_vocab),
        "{name}: id out of the vocabulary"
    );
    if !valid_utf8 || !l.all_bytes || l.remove_extra_whitespaces {
        return;
    }

    let holds = |list: &[String]| list.iter().any(|t| text.contains(t.as_str()));
    let decoded = tok
        .decode(&ids, false)
        .expect("GGUF decoding is infallible");
    match (l.kind, l.byte_level) {
        (VocabType::Bpe, byte_level) => {
            if (!byte_level && text.contains('\u{2581}')) || holds(&l.strips) {
                return;
            }
            assert!(
                pieces(tok, &ids) == text.as_bytes(),
                "{name}: pieces do not spell {text:?}"
            );
            // with special-token parsing on, special tokens are spelled by their text (the
            // BOS/EOS added by add_special are left out)
            let inner = tok.encode(text, false, true).unwrap();
            assert!(
                pieces(tok, &inner) == text.as_bytes(),
                "{name}: pieces (special-token parsing on) do not spell {text:?}"
            );
            if !(l.clean_spaces && cleanup_applies(text)) {
                let want = match text.strip_prefix(' ') {
                    Some(rest) if l.add_space_prefix => rest,
                    _ => text,
                };
                assert_eq!(decoded, want, "{name}: decode(encode(t)) != t");
            }
        }
        (VocabType::Spm, _) => {
            if text.contains('\u{2581}') || holds(&l.user_defined) {
                return;
            }
            let mut want = Vec::new();
            if l.add_space_prefix && !text.is_empty() {
                want.push(b' ');
            }
            want.extend_from_slice(text.as_bytes());
            assert!(
                pieces(tok, &ids) == want,
                "{name}: pieces do not spell {text:?}"
            );
            if !(l.clean_spaces && cleanup_applies(text)) {
                assert_eq!(decoded, text, "{name}: decode(encode(t)) != t");
            }
        }
    }
}

fn check_ids(l: &Loaded, ids: &[u32]) {
    let tok = &l.tok;
    let _ = tok.decode(ids, false).expect("GGUF decoding is infallible");
    let _ = tok.decode(ids, true).expect("GGUF decoding is infallible");
    for special in [false, true] {
        let mut d = tok.detokenizer(special);
        let mut streamed = String::new();
        let mut raw = Vec::new();
        for &id in ids {
            raw.extend(tok.token_to_piece(id, special));
            let _ = tok.token_text(id);
            let _ = tok.is_eog(id);
            streamed.push_str(&d.push(id));
        }
        streamed.push_str(&d.flush());
        assert_eq!(
            streamed,
            String::from_utf8_lossy(&raw),
            "{}: streamed text differs from the pieces",
            l.name
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let v = vocabs();
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    if v.files.is_empty() {
        return;
    }
    let i = pick as usize % v.files.len();
    let Some(l) = v.loaded[i].get_or_init(|| load(&v.files[i])) else {
        return;
    };

    let valid = std::str::from_utf8(rest).is_ok();
    let text = String::from_utf8_lossy(rest);
    check_text(l, &text, valid);
    // the vocabulary's control-token texts spliced into the text, which stays plain
    if !l.control.is_empty() && !rest.is_empty() {
        let c = &l.control[rest[0] as usize % l.control.len()];
        let mid = text
            .char_indices()
            .nth(text.chars().count() / 2)
            .map_or(0, |(p, _)| p);
        let spliced = format!("{}{c}{}{c}", &text[..mid], &text[mid..]);
        check_text(l, &spliced, valid);
    }

    let n = l.tok.n_vocab() as u32;
    let raw: Vec<u32> = rest
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let mut ids: Vec<u32> = raw.iter().map(|&x| x % (n + 2)).collect();
    ids.extend([n, u32::MAX]);
    check_ids(l, &raw);
    check_ids(l, &ids);
});
