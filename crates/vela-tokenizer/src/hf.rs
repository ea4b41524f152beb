//! HF `tokenizer.json` (+ `tokenizer_config.json`, `generation_config.json`) loading for
//! safetensors checkpoints, through the `tokenizers` crate.

use crate::vocab::EOG_TEXTS;
use anyhow::{anyhow, Context, Result};
use serde_json::Value as Json;
use std::collections::BTreeSet;
use std::path::Path;
use tokenizers::Tokenizer as HfInner;

/// A tokenizer.json tokenizer with the metadata the engine needs.
pub struct HfTokenizer {
    /// Parses special-token text in the input (`parse_special = true`).
    parse: HfInner,
    /// Treats special-token text as plain text (`parse_special = false`).
    plain: HfInner,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eog: BTreeSet<u32>,
    pub add_bos: bool,
    /// The tokenizer.json post-processor inserts BOS itself; when it does not but the config
    /// says `add_bos_token` (DeepSeek V3's ByteLevel post-processor), `encode` prepends it, as
    /// HF's LlamaTokenizerFast does.
    post_adds_bos: bool,
    /// Ids of added tokens flagged `special`.
    special_ids: BTreeSet<u32>,
    /// Largest id + 1 (ids may have gaps, so this can exceed the number of tokens).
    n_vocab: usize,
    /// The model maps bytes to GPT-2 printable characters.
    byte_level: bool,
}

fn read_json(path: &Path) -> Result<Option<Json>> {
    if !path.exists() {
        return Ok(None);
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(Some(serde_json::from_str(&text).with_context(|| {
        format!("invalid JSON in {}", path.display())
    })?))
}

/// A token given as `"text"` or `{"content": "text", ...}` in tokenizer_config.json.
fn token_str(v: Option<&Json>) -> Option<&str> {
    match v? {
        Json::String(s) => Some(s),
        Json::Object(o) => o.get("content").and_then(Json::as_str),
        _ => None,
    }
}

impl HfTokenizer {
    /// Load `dir/tokenizer.json` and the optional config files next to it.
    pub fn from_dir(dir: &Path) -> Result<HfTokenizer> {
        let tj = dir.join("tokenizer.json");
        let bytes = std::fs::read(&tj).with_context(|| format!("cannot read {}", tj.display()))?;
        let cfg = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or(Json::Null);
        let gen = read_json(&dir.join("generation_config.json"))?.unwrap_or(Json::Null);
        Self::from_json_bytes(&bytes, &cfg, &gen)
            .map_err(|e| anyhow!("cannot load {}: {e:#}", tj.display()))
    }

    /// Build from the bytes of a `tokenizer.json` plus the parsed `tokenizer_config.json` and
    /// `generation_config.json` (`Json::Null` when absent). Any bytes give `Ok` or an error.
    pub fn from_json_bytes(tokenizer_json: &[u8], cfg: &Json, gen: &Json) -> Result<HfTokenizer> {
        // JSON syntax first: the `tokenizers` crate panics on a syntax error inside `decoder`
        // (it unwraps the decoder's deserialization), so it only ever sees well-formed JSON.
        let raw: Json =
            serde_json::from_slice(tokenizer_json).map_err(|e| anyhow!("invalid JSON: {e}"))?;
        let plain = HfInner::from_bytes(tokenizer_json).map_err(|e| anyhow!("{e}"))?;
        let mut parse = plain.clone();
        parse.set_encode_special_tokens(false);
        let mut plain = plain;
        plain.set_encode_special_tokens(true);

        let byte_level = raw["decoder"]["type"] == "ByteLevel"
            || raw["pre_tokenizer"]["type"] == "ByteLevel"
            || raw["pre_tokenizer"]["pretokenizers"]
                .as_array()
                .is_some_and(|a| a.iter().any(|p| p["type"] == "ByteLevel"));

        let id_of = |s: Option<&str>| s.and_then(|s| parse.token_to_id(s));
        let mut bos = id_of(token_str(cfg.get("bos_token")));
        let mut eos = id_of(token_str(cfg.get("eos_token")));
        if bos.is_none() {
            bos = gen["bos_token_id"].as_u64().map(|v| v as u32);
        }
        let mut eog: BTreeSet<u32> = BTreeSet::new();
        match &gen["eos_token_id"] {
            Json::Number(n) => eog.extend(n.as_u64().map(|v| v as u32)),
            Json::Array(a) => eog.extend(a.iter().filter_map(|v| v.as_u64()).map(|v| v as u32)),
            _ => {}
        }
        if eos.is_none() {
            eos = eog.iter().next().copied();
        }
        eog.extend(eos);
        eog.extend(EOG_TEXTS.iter().filter_map(|t| parse.token_to_id(t)));
        let special_ids: BTreeSet<u32> = parse
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| id)
            .collect();
        // Every id encoding may yield is below `n_vocab`: the model's embedding must cover it.
        let n_vocab = parse
            .get_vocab(true)
            .into_values()
            .max()
            .map_or(0, |m| m as usize + 1)
            .max(parse.get_vocab_size(true));
        // BOS is added when the post-processor inserts it (or the config says so).
        let post_adds_bos = bos.is_some_and(|b| {
            parse
                .encode("a", true)
                .is_ok_and(|e| e.get_ids().first() == Some(&b))
        });
        let add_bos = cfg["add_bos_token"].as_bool().unwrap_or(post_adds_bos);
        Ok(HfTokenizer {
            parse,
            plain,
            bos,
            eos,
            eog,
            add_bos,
            post_adds_bos,
            special_ids,
            n_vocab,
            byte_level,
        })
    }

    /// Encode; `add_special` runs the post-processor (BOS etc.), `parse_special` recognises
    /// special-token text.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let t = if parse_special {
            &self.parse
        } else {
            &self.plain
        };
        let enc = t
            .encode(text, add_special)
            .map_err(|e| anyhow!("tokenization failed: {e}"))?;
        let mut ids = enc.get_ids().to_vec();
        if add_special && self.add_bos && !self.post_adds_bos {
            if let Some(b) = self.bos {
                ids.insert(0, b);
            }
        }
        Ok(ids)
    }

    /// Decode to a string with the tokenizer's own decoder.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.parse
            .decode(ids, skip_special)
            .map_err(|e| anyhow!("decoding failed: {e}"))
    }

    /// Vocabulary size including added tokens: the largest id + 1.
    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// The token's vocabulary text.
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.parse.id_to_token(id)
    }

    /// Raw bytes of one token (special tokens empty unless `special`).
    pub fn token_to_piece(&self, id: u32, special: bool) -> Vec<u8> {
        let Some(text) = self.parse.id_to_token(id) else {
            return Vec::new();
        };
        if self.special_ids.contains(&id) {
            return if special {
                text.into_bytes()
            } else {
                Vec::new()
            };
        }
        let b = text.as_bytes();
        if b.len() == 6 && text.starts_with("<0x") && text.ends_with('>') {
            if let Ok(v) = u8::from_str_radix(&text[3..5], 16) {
                return vec![v];
            }
        }
        if self.byte_level {
            let map = crate::unicode::byte_map();
            if let Some(bytes) = text
                .chars()
                .map(|c| map.from_char.get(&c).copied())
                .collect()
            {
                return bytes;
            }
            return text.into_bytes();
        }
        text.replace('\u{2581}', " ").into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A byte-level BPE over "a", "b" with BOS `<s>` (id 0) and the given post-processor.
    fn write_dir(name: &str, post: Json, add_bos_token: Option<bool>) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("vela-hf-bos-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let tj = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [{"id": 0, "content": "<s>", "single_word": false, "lstrip": false,
                              "rstrip": false, "normalized": false, "special": true}],
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "post_processor": post,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                      "ignore_merges": false, "vocab": {"<s>": 0, "a": 1, "b": 2}, "merges": []}
        });
        std::fs::write(dir.join("tokenizer.json"), tj.to_string()).unwrap();
        let mut cfg = serde_json::json!({"bos_token": "<s>"});
        if let Some(v) = add_bos_token {
            cfg["add_bos_token"] = Json::Bool(v);
        }
        std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).unwrap();
        dir
    }

    #[test]
    fn bos_from_config_when_the_post_processor_adds_none() {
        let byte_level = serde_json::json!({"type": "ByteLevel", "add_prefix_space": true,
                                            "trim_offsets": false, "use_regex": true});
        let template = serde_json::json!({"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}});
        // (post-processor, add_bos_token) -> encode("ab", add_special) and add_bos
        let cases = [
            (
                "bytelevel-cfg",
                byte_level.clone(),
                Some(true),
                vec![0, 1, 2],
                true,
            ),
            (
                "bytelevel-nocfg",
                byte_level.clone(),
                None,
                vec![1, 2],
                false,
            ),
            ("bytelevel-off", byte_level, Some(false), vec![1, 2], false),
            (
                "template-cfg",
                template.clone(),
                Some(true),
                vec![0, 1, 2],
                true,
            ),
            ("template-nocfg", template, None, vec![0, 1, 2], true),
        ];
        for (name, post, cfg, want, add_bos) in cases {
            let dir = write_dir(name, post, cfg);
            let t = HfTokenizer::from_dir(&dir).unwrap();
            assert_eq!(t.add_bos, add_bos, "{name}: add_bos");
            assert_eq!(
                t.encode("ab", true, true).unwrap(),
                want,
                "{name}: add_special"
            );
            assert_eq!(
                t.encode("ab", false, true).unwrap(),
                vec![1, 2],
                "{name}: no specials"
            );
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }

    /// Fuzz finding (tokenizer_json): a syntax error inside `decoder` panicked in the
    /// `tokenizers` crate; it is an error.
    #[test]
    fn syntax_error_in_decoder_is_an_error() {
        let tj = br#"{"version": "1.0", "added_tokens": [], "normalizer": null,
            "pre_tokenizer": null, "post_processor": null, "decoder": {"type": tru},
            "model": {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"}}"#;
        let e = HfTokenizer::from_json_bytes(tj, &Json::Null, &Json::Null)
            .err()
            .unwrap();
        assert!(e.to_string().contains("invalid JSON"), "{e}");
    }

    /// Fuzz finding (tokenizer_json): with gaps in the ids, `n_vocab` counted tokens, so
    /// encoding could yield ids at or above it (and the loader's check that the model covers
    /// the tokenizer passed for a model too small).
    #[test]
    fn n_vocab_covers_ids_with_gaps() {
        let tj = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "normalizer": null,
            "post_processor": null, "decoder": null,
            "added_tokens": [{"id": 20, "content": "<end>", "single_word": false, "lstrip": false,
                              "rstrip": false, "normalized": false, "special": true}],
            "pre_tokenizer": {"type": "Whitespace"},
            "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "a": 5, "b": 9},
                      "unk_token": "[UNK]"},
        });
        let bytes = serde_json::to_vec(&tj).unwrap();
        let t = HfTokenizer::from_json_bytes(&bytes, &Json::Null, &Json::Null).unwrap();
        // The `tokenizers` crate numbers added tokens from the model's token count (3 here),
        // whatever ids the file gives them.
        assert_eq!(t.n_vocab(), 10);
        let ids = t.encode("a b <end> c", false, true).unwrap();
        assert_eq!(ids, [5, 9, 3, 0]);
        assert!(ids.iter().all(|&i| (i as usize) < t.n_vocab()));
    }
}
