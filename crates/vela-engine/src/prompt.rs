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
    let mut plain = vec![false; rendered.len()];
    for h in &hostile {
        let mut from = 0;
        while let Some(i) = rendered[from..].find(h) {
            let start = from + i;
            plain[start..start + h.len()]
                .iter_mut()
                .for_each(|p| *p = true);
            from = start + h.len();
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
