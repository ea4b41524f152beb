//! Constrained decoding over a small vocabulary: whatever the logits prefer, greedy and sampled
//! output under a JSON schema ends with an end token at a complete value, parses and validates;
//! schemas llguidance cannot handle are errors that name the construct; the reasoning gate and
//! rollback.

use serde_json::{json, Value};
use vela_engine::grammar::tiny::{byte_tokens, decode_random, validates, vocab};
use vela_engine::grammar::{Grammar, GrammarCompiler};

fn schemas() -> Vec<Value> {
    vec![
        json!({"type": "object"}),
        json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
               "age": {"type": "integer", "minimum": 0, "maximum": 150},
               "ok": {"type": "boolean"}},
               "required": ["name", "age", "ok"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"unit": {"enum": ["c", "f"]},
               "xs": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3}},
               "required": ["unit", "xs"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"v": {"anyOf": [{"type": "null"}, {"type": "number", "minimum": -100, "maximum": 100},
               {"type": "string", "maxLength": 3}]}}, "required": ["v"], "additionalProperties": false}),
        json!({"$defs": {"p": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 5}},
               "required": ["city"], "additionalProperties": false}},
               "type": "object", "properties": {"a": {"$ref": "#/$defs/p"}, "b": {"type": "array",
               "items": {"$ref": "#/$defs/p"}, "maxItems": 2}}, "required": ["a", "b"],
               "additionalProperties": false}),
        json!({"type": "array", "items": {"type": "string", "enum": ["ab", "xyz"]}, "maxItems": 4}),
        json!({"type": "object", "properties": {"k": {"const": "ok"}, "n": {"type": "number",
               "minimum": -1, "maximum": 1}}, "required": ["k", "n"], "additionalProperties": false}),
    ]
}

#[test]
fn random_logits_under_a_schema_always_give_valid_json() {
    let tok = vocab().unwrap();
    let c = GrammarCompiler::new(&tok).unwrap();
    for (i, schema) in schemas().iter().enumerate() {
        let g = c.compile(&Grammar::JsonSchema(schema.clone())).unwrap();
        for seed in 0..12u64 {
            for temp in [0.0, 1.0] {
                let mut g = g.clone();
                let (text, ended) =
                    decode_random(&tok, &mut g, seed * 31 + i as u64, temp, 4000).unwrap();
                assert!(
                    ended,
                    "schema {i} seed {seed} t {temp}: no end token in {text:?}"
                );
                let v: Value = match serde_json::from_str(&text) {
                    Ok(v) => v,
                    // Valid JSON (RFC 8259 sets no range) that serde_json will not hold in an
                    // f64, e.g. `9e61042`, where the schema bounds no number.
                    Err(e) if e.to_string().contains("number out of range") && i == 0 => continue,
                    Err(e) => panic!("schema {i} seed {seed} t {temp}: {e}: {text:?}"),
                };
                assert!(
                    validates(schema, schema, &v),
                    "schema {i} seed {seed}: {text}"
                );
            }
        }
    }
}

#[test]
fn the_validator_rejects_what_it_should() {
    // The check above is only as good as this validator.
    let s = &schemas()[1];
    assert!(validates(s, s, &json!({"name": "a", "age": 3, "ok": true})));
    for bad in [
        json!({"name": "a", "age": 3}),
        json!({"name": "abcdefg", "age": 3, "ok": true}),
        json!({"name": "a", "age": -1, "ok": true}),
        json!({"name": "a", "age": 3, "ok": true, "x": 1}),
        json!({"name": 1, "age": 3, "ok": true}),
    ] {
        assert!(!validates(s, s, &bad), "{bad}");
    }
    let r = &schemas()[4];
    assert!(!validates(r, r, &json!({"a": {"city": 1}, "b": []})));
}

#[test]
fn unsupported_schemas_name_the_construct() {
    let tok = vocab().unwrap();
    let c = GrammarCompiler::new(&tok).unwrap();
    for (schema, what) in [
        (
            json!({"type": "object", "if": {"type": "object"}, "then": {"required": ["a"]}}),
            "if",
        ),
        (
            json!({"type": "string", "format": "no-such-format"}),
            "no-such-format",
        ),
        (json!({"$ref": "https://example.com/s.json"}), "example.com"),
    ] {
        let e = c
            .compile(&Grammar::JsonSchema(schema.clone()))
            .err()
            .expect("an error");
        let e = format!("{e:#}");
        assert!(e.contains(what), "{schema}: {e}");
    }
    let e = c
        .compile(&Grammar::Lark("start: <nope>".into()))
        .err()
        .expect("an error");
    assert!(format!("{e:#}").contains("nope"), "{e:#}");
}

#[test]
fn a_gated_constraint_starts_after_the_marker() {
    let tok = vocab().unwrap();
    let c = GrammarCompiler::new(&tok).unwrap();
    let mut g = c
        .compile(&Grammar::JsonSchema(json!({"type": "object"})))
        .unwrap()
        .gated("</think>");
    let ids = byte_tokens;
    let letter = ids("q")[0];
    let brace = *ids("{").last().unwrap();
    for t in ids("free text, not JSON") {
        assert!(g.allows(t) && !g.active());
        g.accept(t).unwrap();
    }
    // The reasoning may not end the turn: the constrained answer must follow.
    let eos = tok.eos().unwrap();
    assert!(!g.allows(eos));
    let mut row = vec![0.0f32; tok.n_vocab()];
    g.apply(&mut row).unwrap();
    assert!(row[eos as usize].is_infinite() && row[letter as usize] == 0.0);
    let close = tok.encode("</think>", false, true).unwrap();
    assert_eq!(close.len(), 1, "</think> is one token");
    g.accept(close[0]).unwrap();
    assert!(g.active());
    assert!(!g.allows(letter) && g.allows(brace));
    let mut row = vec![0.0f32; tok.n_vocab()];
    g.apply(&mut row).unwrap();
    assert!(row[letter as usize].is_infinite() && row[brace as usize] == 0.0);
    // End tokens only where the value is complete.
    assert!(!g.allows(eos));
    for t in ids("{}") {
        g.accept(t).unwrap();
    }
    assert!(g.is_accepting() && g.allows(eos));
    g.accept(eos).unwrap();
}

#[test]
fn rollback_restores_the_mask() {
    let tok = vocab().unwrap();
    let c = GrammarCompiler::new(&tok).unwrap();
    let schema =
        json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]});
    let mut g = c.compile(&Grammar::JsonSchema(schema)).unwrap();
    let m0 = g.mask().unwrap().unwrap().to_list();
    let text = byte_tokens("{\"ok\": tr");
    for &t in &text {
        assert!(g.allows(t));
        g.accept(t).unwrap();
    }
    let m1 = g.mask().unwrap().unwrap().to_list();
    assert_ne!(m0, m1);
    g.rollback(text.len()).unwrap();
    assert_eq!(g.mask().unwrap().unwrap().to_list(), m0);
    assert!(g.rollback(1).is_err());
}

/// A "model" that always prefers `0` cannot loop inside a number: a run of digits ends after
/// `MAX_DIGITS`, and the value completes.
#[test]
fn numbers_cannot_loop_on_digits() {
    use vela_engine::grammar::MAX_DIGITS;
    let tok = vocab().unwrap();
    let c = GrammarCompiler::new(&tok).unwrap();
    let zero = byte_tokens("0")[0];
    let one = byte_tokens("1")[0];
    for ty in ["number", "integer"] {
        let schema = json!({"type": "object", "properties": {"n": {"type": ty}}, "required": ["n"],
                            "additionalProperties": false});
        let mut g = c.compile(&Grammar::JsonSchema(schema)).unwrap();
        let mut out = Vec::new();
        let mut ended = false;
        for _ in 0..200 {
            // `1` first (a number may not start `00`), then `0` whenever allowed.
            let started = out.contains(&one);
            let mut row = vec![0.0f32; tok.n_vocab()];
            row[zero as usize] = 10.0;
            row[one as usize] = if started { 5.0 } else { 20.0 };
            g.apply(&mut row).unwrap();
            let t = vela_engine::sampler::argmax(&row);
            g.accept(t).unwrap();
            if tok.is_eog(t) {
                ended = true;
                break;
            }
            out.push(t);
        }
        let text = tok.decode(&out, false).unwrap();
        assert!(ended, "{ty}: {text}");
        let longest = text
            .split(|c: char| !c.is_ascii_digit())
            .map(str::len)
            .max()
            .unwrap();
        assert_eq!(longest, MAX_DIGITS, "{ty}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert!(v["n"].is_number(), "{text}");
    }
}
