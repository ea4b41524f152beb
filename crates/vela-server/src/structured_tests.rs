use super::*;
use crate::parser::{Event, OutputParser};
use crate::tool_schema::ArgKinds;
use vela_engine::grammar::tiny::{decode_random, validates, vocab};

fn obj(v: Value) -> Obj {
    v.as_object().unwrap().clone()
}

#[test]
fn response_formats() {
    let rf = |v: Value| response_format(&obj(json!({ "response_format": v })));
    assert_eq!(response_format(&obj(json!({}))).unwrap(), None);
    assert_eq!(rf(json!({"type": "text"})).unwrap(), None);
    assert_eq!(
        rf(json!({"type": "json_object"})).unwrap(),
        Some(json!({"type": "object"}))
    );
    let s = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let got = rf(
        json!({"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": s}}),
    );
    assert_eq!(got.unwrap(), Some(s));
    for bad in [
        json!("json_object"),
        json!({"type": "xml"}),
        json!({"type": "json_schema"}),
        json!({"type": "json_schema", "json_schema": {"name": 3, "schema": {}}}),
        json!({"type": "json_schema", "json_schema": {"schema": "string"}}),
        json!({"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}}),
    ] {
        let e = rf(bad.clone()).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("response_format"), "{bad}");
    }
}

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
            "properties": {"city": {"type": "string", "maxLength": 6}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "ok", "parameters": {"type": "object",
            "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
            "required": ["n"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "note", "parameters": {"type": "object",
            "$defs": {"tag": {"enum": ["a", "b"]}},
            "properties": {"text": {"type": "string", "minLength": 1, "maxLength": 5},
                "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "maxItems": 2},
                "meta": {"type": "object", "properties": {"k": {"type": "boolean"}},
                         "required": ["k"], "additionalProperties": false}},
            "required": ["text"], "additionalProperties": false}}},
    ])
}

#[test]
fn forced_choices_pick_the_functions() {
    let tools = weather_tools();
    let names = |s: Option<Structured>| match s {
        Some(Structured::Tools(f)) => f.into_iter().map(|(n, _)| n).collect::<Vec<_>>(),
        other => panic!("{other:?}"),
    };
    let o = obj(json!({"tool_choice": "required"}));
    assert_eq!(
        names(structured(Some(&tools), openai_forced(&o), None)),
        ["get_weather", "ok", "note"]
    );
    let o = obj(json!({"tool_choice": {"type": "function", "function": {"name": "ok"}}}));
    assert_eq!(
        names(structured(Some(&tools), openai_forced(&o), None)),
        ["ok"]
    );
    let o = obj(json!({"tool_choice": {"type": "tool", "name": "get_weather"}}));
    assert_eq!(
        names(structured(Some(&tools), anthropic_forced(&o), None)),
        ["get_weather"]
    );
    let o = obj(json!({"tool_choice": {"type": "any"}}));
    assert_eq!(
        names(structured(Some(&tools), anthropic_forced(&o), None)).len(),
        3
    );
    // auto: only the response format, if any.
    let o = obj(json!({"tool_choice": "auto"}));
    let s = structured(Some(&tools), openai_forced(&o), Some(json!({})));
    assert_eq!(s, Some(Structured::Json(json!({}))));
}

/// Templates of each supported syntax (the markers `ParserConfig::from_template` looks for).
const HERMES: &str = "{{ '<tool_call>' }} {{ tools }}";
const DEEPSEEK_V31: &str = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{{ name }}<｜tool▁sep｜>";
const DEEPSEEK_V3: &str = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>";
const LLAMA3: &str = "{\"name\": function name, \"parameters\": {{ x }}} <|python_tag|>";
const NONE: &str = "{{ messages }}";
const QWEN_XML: &str = "<tool_call>\n<function={{ name }}>\n<parameter={{ k }}>";
const DSML: &str = "<｜DSML｜tool_calls>";
const GEMMA4: &str = "{{ '<|tool_call>call:' }}";
const GLM: &str = "<tool_call>{{ name }}<arg_key>{{ k }}</arg_key><arg_value>";

/// Random-logit decoding under each syntax's forced-call grammar always yields calls that the
/// server's own parser reads back, of the allowed functions, with valid arguments.
#[test]
fn forced_calls_parse_in_every_supported_syntax() {
    let tok = vocab().unwrap();
    let c = GrammarCompiler::new(&tok).unwrap();
    let tools = weather_tools();
    let all = match structured(Some(&tools), Some(Forced::Any), None) {
        Some(Structured::Tools(f)) => f,
        other => panic!("{other:?}"),
    };
    let only_ok = vec![all[1].clone()];
    for template in [
        HERMES,
        DEEPSEEK_V31,
        DEEPSEEK_V3,
        LLAMA3,
        NONE,
        QWEN_XML,
        GLM,
        DSML,
        GEMMA4,
    ] {
        for fns in [&all, &only_ok] {
            // As `render_messages` sets it up: the parser types XML values by the tools' schemas.
            let mut cfg = ParserConfig::from_template(template, true);
            cfg.arg_kinds = ArgKinds::from_tools(Some(&tools));
            let lark = tool_grammar(&c, template, &mut cfg, fns).unwrap();
            let g = c
                .compile(&Grammar::Lark(lark.clone()))
                .unwrap_or_else(|e| panic!("{template}: {e:#}\n{lark}"));
            let mut seen = std::collections::BTreeSet::new();
            for seed in 0..16u64 {
                for temp in [0.0, 1.0] {
                    let mut g = g.clone();
                    let (text, ended) = decode_random(&tok, &mut g, seed, temp, 3000).unwrap();
                    assert!(ended, "{template}: no end in {text:?}");
                    let mut p = OutputParser::new(cfg.clone());
                    let mut ev = p.push(&text);
                    ev.extend(p.finish());
                    let calls: Vec<_> = ev
                        .iter()
                        .filter_map(|e| match e {
                            Event::ToolCall(c) => Some(c.clone()),
                            Event::Content(s) if s.trim().is_empty() => None,
                            other => panic!("{template}: {other:?} in {text:?}"),
                        })
                        .collect();
                    assert!(!calls.is_empty(), "{template}: no call in {text:?}");
                    for call in calls {
                        let (_, schema) = fns
                            .iter()
                            .find(|(n, _)| *n == call.name)
                            .unwrap_or_else(|| panic!("{template}: unexpected {call:?}"));
                        let args: Value = serde_json::from_str(&call.arguments).unwrap();
                        assert!(validates(schema, schema, &args), "{template}: {call:?}");
                        seen.insert(call.name);
                    }
                }
            }
            if fns.len() > 1 {
                assert_eq!(
                    seen.len(),
                    fns.len(),
                    "{template}: every function is reachable"
                );
            }
        }
    }
}

/// Gemma 4's syntax has no form for some schema constructs: a 400 naming them.
#[test]
fn gemma4_refuses_what_its_syntax_cannot_express() {
    let tok = vocab().unwrap();
    let c = GrammarCompiler::new(&tok).unwrap();
    let obj = |p: Value| json!({"type": "object", "properties": {"x": p}});
    for (params, what) in [
        (
            obj(json!({"anyOf": [{"type": "string"}, {"type": "integer"}]})),
            "anyOf",
        ),
        (obj(json!({"type": "string", "pattern": "^a$"})), "pattern"),
        (obj(json!({"enum": ["a", 1]})), "enum"),
        (
            json!({"type": "object", "properties": {"a:b": {"type": "integer"}}}),
            "a:b",
        ),
        (
            json!({"$defs": {"n": {"type": "object", "properties": {"k": {"$ref": "#/$defs/n"}}}},
                "type": "object", "properties": {"k": {"$ref": "#/$defs/n"}}}),
            "$ref",
        ),
    ] {
        let mut cfg = ParserConfig::from_template(GEMMA4, true);
        let fns = vec![("f".to_string(), params.clone())];
        let e = tool_grammar(&c, GEMMA4, &mut cfg, &fns).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
        assert!(e.message.contains(what), "{params}: {}", e.message);
    }
}

/// A prompt that ends inside `<think>`: the reasoning is free (it cannot end the turn), the
/// answer after `</think>` is constrained; the parser splits them and the answer validates.
#[test]
fn reasoning_stays_free_when_the_prompt_opens_it() {
    let tok = vocab().unwrap();
    let c = GrammarCompiler::new(&tok).unwrap();
    let template = "{{ '<think>' }} <tool_call>";
    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}},
                        "required": ["ok"], "additionalProperties": false});
    let tools = weather_tools();
    for s in [
        Structured::Json(schema.clone()),
        structured(Some(&tools), Some(Forced::Named("ok".into())), None).unwrap(),
    ] {
        let mut answers = 0;
        for seed in 0..12u64 {
            let mut cfg = ParserConfig::from_template(template, true);
            cfg.start_in_reasoning = true;
            cfg.arg_kinds = ArgKinds::from_tools(Some(&tools));
            let mut g = constraint_with(&c, template, &s, &mut cfg).unwrap();
            assert!(!g.active());
            let (text, ended) = decode_random(&tok, &mut g, seed, 1.0, 5000).unwrap();
            assert!(ended, "{text:?}");
            let mut p = OutputParser::new(cfg.clone());
            let mut ev = p.push(&text);
            ev.extend(p.finish());
            let (mut content, mut reasoning, mut calls) = (String::new(), false, Vec::new());
            for e in ev {
                match e {
                    Event::Content(t) => content.push_str(&t),
                    Event::Reasoning(_) => reasoning = true,
                    Event::ToolCall(c) => calls.push(c),
                }
            }
            assert!(reasoning && text.contains("</think>"), "{text:?}");
            match &s {
                Structured::Json(schema) => {
                    let v: Value = serde_json::from_str(&content).expect(&text);
                    assert!(validates(schema, schema, &v), "{text:?}");
                }
                _ => {
                    assert!(content.trim().is_empty() && !calls.is_empty(), "{text:?}");
                    assert!(calls.iter().all(|c| c.name == "ok"), "{calls:?}");
                }
            }
            answers += 1;
        }
        assert_eq!(answers, 12);
    }
}

/// In the Qwen and GLM parameter blocks a value that may be a string is read as raw text: a
/// parameter that may also be another type cannot be enforced.
#[test]
fn parameter_blocks_refuse_what_the_parser_cannot_read_back() {
    let tok = vocab().unwrap();
    let c = GrammarCompiler::new(&tok).unwrap();
    for (params, what) in [
        (
            json!({"type": "object", "properties": {"s": {"type": "string", "pattern": "^a+$"}}}),
            "pattern",
        ),
        (
            json!({"type": "object", "properties": {"s": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}}),
            "may be a string",
        ),
        (
            json!({"type": "object", "properties": {"s": {"type": ["integer", "string"]}}}),
            "may be a string",
        ),
        (
            json!({"type": "object", "properties": {}, "required": ["s"]}),
            "'s'",
        ),
    ] {
        for template in [QWEN_XML, GLM] {
            let mut cfg = ParserConfig::from_template(template, true);
            let fns = vec![("f".to_string(), params.clone())];
            let e = tool_grammar(&c, template, &mut cfg, &fns).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("tool_choice"));
            assert!(e.message.contains(what), "{}", e.message);
        }
    }
}
