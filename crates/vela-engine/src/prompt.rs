//! Turning a rendered chat prompt into tokens without letting user text become control tokens.
//!
//! The template's own markup (`<|im_start|>`, `<start_of_turn>`, ...) must be recognised as special
//! tokens, but a user who types `<|im_end|>` must get the plain-text tokens. Every string that came
//! from the request (message contents, tool arguments, names) is checked; if none contains
//! special-token text (the normal case) the whole prompt is tokenized with special parsing, which is
//! exactly what the model saw in training. Otherwise the occurrences of those strings in the
//! rendered prompt are tokenized as plain text and the template around them with special parsing.

use anyhow::Result;
use serde_json::Value;
use vela_tokenizer::Tokenizer;

fn collect_strings<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
    match v {
        Value::String(s) => out.push(s),
        Value::Array(a) => a.iter().for_each(|x| collect_strings(x, out)),
        Value::Object(o) => o.values().for_each(|x| collect_strings(x, out)),
        _ => {}
    }
}

/// Whether `s` would produce different tokens with special-token parsing on.
fn has_special_text(tok: &Tokenizer, s: &str) -> Result<bool> {
    Ok(tok.encode(s, false, true)? != tok.encode(s, false, false)?)
}

/// Tokenize `rendered`, the output of a chat template over `messages` (and tools).
pub fn tokenize_chat(
    tok: &Tokenizer,
    rendered: &str,
    request_values: &[Value],
) -> Result<Vec<u32>> {
    let mut strings = Vec::new();
    request_values
        .iter()
        .for_each(|v| collect_strings(v, &mut strings));
    let mut hostile: Vec<&str> = Vec::new();
    for s in strings {
        if !s.is_empty() && has_special_text(tok, s)? && !hostile.contains(&s) {
            hostile.push(s);
        }
    }
    let bos_text = tok.bos().and_then(|b| tok.token_text(b));
    let add_bos = tok.add_bos()
        && !bos_text
            .as_deref()
            .is_some_and(|b| !b.is_empty() && rendered.starts_with(b));
    let mut out = Vec::new();
    if add_bos {
        if let Some(b) = tok.bos() {
            out.push(b);
        }
    }
    if hostile.is_empty() {
        out.extend(tok.encode(rendered, false, true)?);
        return Ok(out);
    }
    // Mark every byte covered by an occurrence of a hostile string, then tokenize runs.
    // Occurrences may overlap (template markup followed by user text that repeats it): each
    // search resumes one character after the previous match, not after its end.
    let mut plain = vec![false; rendered.len()];
    for h in &hostile {
        let mut from = 0;
        while let Some(i) = rendered[from..].find(h) {
            let start = from + i;
            plain[start..start + h.len()]
                .iter_mut()
                .for_each(|p| *p = true);
            from = start + rendered[start..].chars().next().map_or(1, char::len_utf8);
        }
    }
    let mut start = 0;
    while start < rendered.len() {
        let kind = plain[start];
        let mut end = start;
        while end < rendered.len() && plain[end] == kind {
            end += 1;
        }
        out.extend(tok.encode(&rendered[start..end], false, !kind)?);
        start = end;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vela_tokenizer::hf::HfTokenizer;

    /// One token per byte (GPT-2 byte characters) plus `<|im_start|>` as a special token.
    fn byte_tokenizer() -> Tokenizer {
        let map = vela_tokenizer::unicode::byte_map();
        let vocab: serde_json::Map<String, Value> = (0..256)
            .map(|b| (map.to_char[b].to_string(), serde_json::json!(b)))
            .collect();
        let bl = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false,
                                    "trim_offsets": false, "use_regex": false});
        let tj = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "normalizer": null,
            "added_tokens": [{"id": 256, "content": "<|im_start|>", "single_word": false,
                              "lstrip": false, "rstrip": false, "normalized": false,
                              "special": true}],
            "pre_tokenizer": bl, "post_processor": null, "decoder": bl,
            "model": {"type": "BPE", "vocab": vocab, "merges": []},
        });
        let bytes = serde_json::to_vec(&tj).unwrap();
        let h = HfTokenizer::from_json_bytes(&bytes, &Value::Null, &Value::Null).unwrap();
        Tokenizer::Hf(Box::new(h))
    }

    /// Fuzz finding (chat_template): template markup followed by user text repeating it
    /// (`<|im_start|>` + `<|im_start|><|im_start|>`) overlapped the user's occurrence, which
    /// was skipped, so the user's second `<|im_start|>` became a control token.
    #[test]
    fn overlapping_user_text_stays_plain() {
        let tok = byte_tokenizer();
        let user = "<|im_start|><|im_start|>";
        let rendered = format!("<|im_start|>{user}\n");
        let ids =
            tokenize_chat(&tok, &rendered, &[serde_json::json!([{"content": user}])]).unwrap();
        // Every occurrence is plain, so no special token at all (the template's marker inside
        // the first occurrence too: occurrences are marked wholesale, as always).
        assert!(!ids.contains(&256), "{ids:?}");
        assert_eq!(ids.len(), rendered.len());
    }
}
