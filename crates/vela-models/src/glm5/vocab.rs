//! The vocabulary `vela synth` gives the real GLM 5 geometries. GLM's own tokenizer (GLM-4.5 .. 5:
//! byte-level BPE, 154,820 regular tokens, 36 added ones) is neither among llama.cpp's vocabulary
//! files nor in a package this project can fetch, so a stand-in of the same shape is built from
//! llama.cpp's `ggml-vocab-qwen35.gguf`: its 151,643 BPE ranks and merges (the same cl100k-derived
//! kind as GLM's) as the regular tokens, its own control tokens and padding as `[PAD<i>]`, GLM's
//! added tokens at GLM-4.7-Flash / GLM 5's ids (154,820 ..), the special tokens llama.cpp's
//! converter sets for GLM (`_set_vocab_glm`: BOS `[gMASK]`, EOT `<|user|>`, EOM `<|observation|>`,
//! EOS / UNK / padding `<|endoftext|>`), pre-tokenizer `glm4`, and llama.cpp's GLM-4.7-Flash chat
//! template when it is found. `scripts/gen-glm5-toolcall.py` builds the same layout as an HF
//! tokenizer.json.

use anyhow::{bail, Result};
use std::path::PathBuf;
use vela_formats::gguf::Value;

/// GLM-4.5's added tokens in order (GLM-4.5: from 151,329; GLM-4.7-Flash and GLM 5: from 154,820).
pub const ADDED: [&str; 36] = [
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
    "<|begin_of_audio|>",
    "<|end_of_audio|>",
    "<|begin_of_transcription|>",
    "<|end_of_transcription|>",
    "<|code_prefix|>",
    "<|code_middle|>",
    "<|code_suffix|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "/nothink",
    "<|begin_of_box|>",
    "<|end_of_box|>",
    "<|image|>",
    "<|video|>",
];

/// Id of GLM's first added token (`<|endoftext|>`) in GLM-4.7-Flash and GLM 5.
pub const FIRST_ADDED: usize = 154_820;

/// The chat template the stand-in vocabulary carries.
pub const TEMPLATE: &str = "GLM-4.7-Flash.jinja";

/// Id of an added token by its text.
pub fn id(text: &str) -> Option<u32> {
    ADDED
        .iter()
        .position(|t| *t == text)
        .map(|i| (FIRST_ADDED + i) as u32)
}

/// llama.cpp's GLM-4.7-Flash template: `$VELA_CACHE/vocab/` or llama.cpp's `models/templates/`.
pub fn find_template() -> Option<String> {
    use vela_formats::testdata::{cache_dir, llama_cpp_src};
    let dirs: [PathBuf; 2] = [
        cache_dir().join("vocab"),
        llama_cpp_src().join("models").join("templates"),
    ];
    dirs.iter()
        .find_map(|d| std::fs::read_to_string(d.join(TEMPLATE)).ok())
}

/// Turn the `tokenizer.*` metadata of llama.cpp's qwen35 vocabulary, padded to `n_vocab`
/// (`crate::synth::tokenizer_metadata`), into the GLM stand-in described in the module docs.
pub fn glm_metadata(
    md: Vec<(String, Value)>,
    n_vocab: usize,
    template: Option<String>,
) -> Result<Vec<(String, Value)>> {
    if n_vocab < FIRST_ADDED + ADDED.len() {
        bail!(
            "GLM's added tokens need {} rows, not {n_vocab}",
            FIRST_ADDED + ADDED.len()
        );
    }
    let types = md.iter().find(|(k, _)| k == "tokenizer.ggml.token_type");
    let Some((_, Value::Array(types))) = types else {
        bail!("the base vocabulary has no token types");
    };
    // The BPE ranks are the leading normal tokens; everything after them is replaced.
    let n_base = types
        .iter()
        .position(|t| !matches!(t, Value::I32(1)))
        .unwrap_or(types.len());
    if n_base > FIRST_ADDED {
        bail!("the base vocabulary's {n_base} regular tokens overlap GLM's added tokens");
    }
    let added = |i: usize| i.checked_sub(FIRST_ADDED).and_then(|j| ADDED.get(j));
    let mut out = Vec::new();
    for (k, v) in md {
        match k.as_str() {
            "tokenizer.ggml.pre" => out.push((k, Value::String("glm4".into()))),
            "tokenizer.ggml.tokens" => {
                let Value::Array(mut a) = v else {
                    bail!("tokenizer.ggml.tokens is not an array");
                };
                for (i, t) in a.iter_mut().enumerate().skip(n_base) {
                    let text = added(i).map_or_else(|| format!("[PAD{i}]"), |s| s.to_string());
                    *t = Value::String(text);
                }
                out.push((k, Value::Array(a)));
            }
            "tokenizer.ggml.token_type" => {
                let Value::Array(mut a) = v else {
                    bail!("tokenizer.ggml.token_type is not an array");
                };
                for (i, t) in a.iter_mut().enumerate().skip(n_base) {
                    // CONTROL for GLM's added tokens, UNUSED for the padding.
                    *t = Value::I32(if added(i).is_some() { 3 } else { 5 });
                }
                out.push((k, Value::Array(a)));
            }
            "tokenizer.ggml.scores" => out.push((k, v)),
            // The base's own special ids, flags and template are replaced below.
            _ if k.ends_with("_token_id") || k.starts_with("tokenizer.ggml.add_") => {}
            "tokenizer.chat_template" => {}
            _ => out.push((k, v)),
        }
    }
    let tok = |t: &str| Value::U32(id(t).expect("one of ADDED"));
    for (k, t) in [
        ("bos", "[gMASK]"),
        ("eos", "<|endoftext|>"),
        ("unknown", "<|endoftext|>"),
        ("eot", "<|user|>"),
        ("eom", "<|observation|>"),
        ("padding", "<|endoftext|>"),
    ] {
        out.push((format!("tokenizer.ggml.{k}_token_id"), tok(t)));
    }
    if let Some(t) = template {
        out.push(("tokenizer.chat_template".into(), Value::String(t)));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small base in the qwen35 file's layout: 4 BPE ranks, 2 control tokens, padding.
    fn base(n_vocab: usize) -> Vec<(String, Value)> {
        let s = |x: &str| Value::String(x.into());
        let texts = ["a", "b", "ab", "Ġ", "<|endoftext|>", "<|im_start|>"];
        let mut tokens: Vec<Value> = texts.iter().map(|t| s(t)).collect();
        let mut types: Vec<Value> = [1, 1, 1, 1, 3, 3].map(Value::I32).to_vec();
        tokens.extend((6..n_vocab).map(|i| s(&format!("[PAD{i}]"))));
        types.extend((6..n_vocab).map(|_| Value::I32(5)));
        vec![
            ("tokenizer.ggml.model".into(), s("gpt2")),
            ("tokenizer.ggml.pre".into(), s("qwen35")),
            ("tokenizer.ggml.tokens".into(), Value::Array(tokens)),
            ("tokenizer.ggml.token_type".into(), Value::Array(types)),
            ("tokenizer.ggml.merges".into(), Value::Array(vec![s("a b")])),
            ("tokenizer.ggml.eos_token_id".into(), Value::U32(4)),
            ("tokenizer.ggml.bos_token_id".into(), Value::U32(4)),
            ("tokenizer.chat_template".into(), s("qwen")),
        ]
    }

    #[test]
    fn glm_added_tokens_at_glm5_ids() {
        let n = 154_880;
        let md = glm_metadata(base(n), n, Some("T".into())).unwrap();
        let get = |k: &str| md.iter().find(|(x, _)| x == k).map(|(_, v)| v.clone());
        let Some(Value::Array(tok)) = get("tokenizer.ggml.tokens") else {
            panic!()
        };
        let Some(Value::Array(ty)) = get("tokenizer.ggml.token_type") else {
            panic!()
        };
        let text = |i: usize| match &tok[i] {
            Value::String(s) => s.clone(),
            _ => panic!(),
        };
        assert_eq!((tok.len(), ty.len()), (n, n));
        assert_eq!(text(2), "ab");
        // The base's control tokens become padding: `<|endoftext|>` exists once, at GLM's id.
        assert_eq!((text(4), text(5)), ("[PAD4]".into(), "[PAD5]".into()));
        assert_eq!(text(154_820), "<|endoftext|>");
        assert_eq!(text(154_841), "<think>");
        assert_eq!(text(154_847), "<arg_key>");
        assert_eq!(text(154_855), "<|video|>");
        assert_eq!(text(154_856), "[PAD154856]");
        assert!(matches!(ty[154_843], Value::I32(3)) && matches!(ty[154_857], Value::I32(5)));
        assert!(matches!(ty[4], Value::I32(5)) && matches!(ty[3], Value::I32(1)));
        let ids: Vec<_> = ["bos", "eos", "eot", "eom", "padding"]
            .iter()
            .map(|k| get(&format!("tokenizer.ggml.{k}_token_id")))
            .collect();
        let want = [154_822, 154_820, 154_827, 154_829, 154_820].map(|i| Some(Value::U32(i)));
        assert_eq!(ids, want);
        assert_eq!(
            get("tokenizer.ggml.pre"),
            Some(Value::String("glm4".into()))
        );
        assert_eq!(
            get("tokenizer.chat_template"),
            Some(Value::String("T".into()))
        );
        // Without a template file, none (never the base's Qwen template).
        let md = glm_metadata(base(n), n, None).unwrap();
        assert!(!md.iter().any(|(k, _)| k == "tokenizer.chat_template"));
        assert!(glm_metadata(base(1000), 1000, None).is_err());
    }
}
