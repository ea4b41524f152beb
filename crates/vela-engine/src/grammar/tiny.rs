//! A small SentencePiece-style vocabulary (every byte, some JSON and chat pieces, control tokens
//! and the tool-call markers) for tests of constrained decoding here and in the server, and a
//! decoding loop over random logits: whatever the "model" prefers, the mask must keep the output
//! inside the grammar.

use super::Constraint;
use crate::sampler::{Rng, Sampler, SamplerConfig};
use anyhow::Result;
use vela_formats::gguf::{GgufFile, Value};
use vela_formats::gguf_write::GgufWriter;
use vela_tokenizer::Tokenizer;

/// Control tokens of the vocabulary (ids 1..): a grammar names these by id.
pub const CONTROL: [&str; 6] = [
    "<s>",
    "</s>",
    "<|im_end|>",
    "<|\"|>",
    "<tool_call>",
    "</tool_call>",
];
/// User-defined (plain text) markers.
pub const MARKERS: [&str; 4] = [
    "<think>",
    "</think>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>",
];
const PIECES: [&str; 26] = [
    "{\"",
    "\"}",
    "\": ",
    "\", \"",
    ", ",
    "true",
    "false",
    "null",
    "name",
    "arguments",
    "city",
    "▁the",
    "▁",
    "10",
    "42",
    "ab",
    "xyz",
    "\"",
    "{",
    "}",
    "[",
    "]",
    "parameters",
    "unit",
    "ok",
    "\n",
];

/// The vocabulary: `<unk>`, [`CONTROL`], 256 byte tokens, [`MARKERS`], JSON pieces;
/// end of generation `</s>` and `<|im_end|>`.
pub fn vocab() -> Result<Tokenizer> {
    let mut toks: Vec<(String, i32)> = vec![("<unk>".into(), 2)];
    toks.extend(CONTROL.iter().map(|t| (t.to_string(), 3)));
    toks.extend((0..=255u32).map(|b| (format!("<0x{b:02X}>"), 6)));
    toks.extend(MARKERS.iter().map(|t| (t.to_string(), 4)));
    toks.extend(PIECES.iter().map(|t| (t.to_string(), 1)));
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", Value::String("llama".into()))?;
    w.add_kv("tokenizer.ggml.model", Value::String("llama".into()))?;
    let strs = toks.iter().map(|(t, _)| Value::String(t.clone())).collect();
    w.add_kv("tokenizer.ggml.tokens", Value::Array(strs))?;
    let types = toks.iter().map(|&(_, k)| Value::I32(k)).collect();
    w.add_kv("tokenizer.ggml.token_type", Value::Array(types))?;
    let scores = toks.iter().map(|_| Value::F32(0.0)).collect();
    w.add_kv("tokenizer.ggml.scores", Value::Array(scores))?;
    w.add_kv("tokenizer.ggml.eos_token_id", Value::U32(2))?;
    w.add_kv("tokenizer.ggml.eot_token_id", Value::U32(3))?;
    Tokenizer::from_gguf(&GgufFile::from_bytes(w.to_bytes(|_, _, _| Ok(()))?)?)
}

/// The byte tokens spelling `s` (the vocabulary's encoder would add SentencePiece's space
/// prefix).
pub fn byte_tokens(s: &str) -> Vec<u32> {
    let first = 1 + CONTROL.len() as u32;
    s.bytes().map(|b| first + b as u32).collect()
}

/// Decode up to `max` tokens from random logits (a "model" of uniform random preferences,
/// seeded) under `c`: greedy when `temperature` is 0, else sampled. Returns the text (control
/// tokens as their text) and whether an end-of-generation token ended it.
pub fn decode_random(
    tok: &Tokenizer,
    c: &mut Constraint,
    seed: u64,
    temperature: f32,
    max: usize,
) -> Result<(String, bool)> {
    let mut rng = Rng::new(seed);
    let mut sampler = Sampler::new(SamplerConfig {
        temperature,
        seed,
        ..SamplerConfig::default()
    });
    // A few extra rows, as models pad their output layer beyond the vocabulary.
    let n = tok.n_vocab() + 7;
    let mut out = Vec::new();
    for _ in 0..max {
        let mut logits: Vec<f32> = (0..n).map(|_| (rng.uniform() * 8.0) as f32).collect();
        c.apply(&mut logits)?;
        let t = sampler.sample(&mut logits);
        c.accept(t)?;
        if tok.is_eog(t) {
            return Ok((tok.decode(&out, false)?, true));
        }
        out.push(t);
    }
    Ok((tok.decode(&out, false)?, false))
}

/// Whether `v` is valid under `schema`, for the keywords the tests use (`type`, `properties`,
/// `required`, `additionalProperties: false`, `enum`, `const`, `items`, `minItems`/`maxItems`,
/// `minimum`/`maximum`, `minLength`/`maxLength`, `anyOf`, local `$ref`). `root` resolves refs.
pub fn validates(
    root: &serde_json::Value,
    schema: &serde_json::Value,
    v: &serde_json::Value,
) -> bool {
    use serde_json::Value as J;
    let Some(s) = schema.as_object() else {
        return schema.as_bool().unwrap_or(true);
    };
    if let Some(r) = s.get("$ref").and_then(J::as_str) {
        let Some(target) = r.strip_prefix('#').and_then(|p| root.pointer(p)) else {
            return false;
        };
        return validates(root, target, v);
    }
    if let Some(any) = s.get("anyOf").and_then(J::as_array) {
        if !any.iter().any(|a| validates(root, a, v)) {
            return false;
        }
    }
    if s.get("const").is_some_and(|c| c != v) {
        return false;
    }
    if s.get("enum")
        .and_then(J::as_array)
        .is_some_and(|e| !e.contains(v))
    {
        return false;
    }
    let type_ok = |t: &str| match t {
        "string" => v.is_string(),
        // A mathematical integer (beyond 64 bits serde_json holds it as an f64).
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|x| x.fract() == 0.0),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "object" => v.is_object(),
        "array" => v.is_array(),
        "null" => v.is_null(),
        _ => false,
    };
    match s.get("type") {
        Some(J::String(t)) if !type_ok(t) => return false,
        Some(J::Array(ts)) if !ts.iter().filter_map(J::as_str).any(type_ok) => return false,
        _ => {}
    }
    let num = |k: &str| s.get(k).and_then(J::as_f64);
    if let Some(x) = v.as_f64() {
        if num("minimum").is_some_and(|m| x < m) || num("maximum").is_some_and(|m| x > m) {
            return false;
        }
    }
    if let Some(st) = v.as_str() {
        let n = st.chars().count() as f64;
        if num("minLength").is_some_and(|m| n < m) || num("maxLength").is_some_and(|m| n > m) {
            return false;
        }
    }
    if let Some(a) = v.as_array() {
        let n = a.len() as f64;
        if num("minItems").is_some_and(|m| n < m) || num("maxItems").is_some_and(|m| n > m) {
            return false;
        }
        if let Some(items) = s.get("items") {
            if !a.iter().all(|x| validates(root, items, x)) {
                return false;
            }
        }
    }
    if let Some(o) = v.as_object() {
        let props = s.get("properties").and_then(J::as_object);
        let req = s.get("required").and_then(J::as_array);
        if req.is_some_and(|r| r.iter().filter_map(J::as_str).any(|k| !o.contains_key(k))) {
            return false;
        }
        for (k, x) in o {
            match props.and_then(|p| p.get(k)) {
                Some(ps) if !validates(root, ps, x) => return false,
                Some(_) => {}
                None if s.get("additionalProperties") == Some(&J::Bool(false)) => return false,
                None => {}
            }
        }
    }
    true
}
