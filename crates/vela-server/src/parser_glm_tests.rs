//! GLM 4.5 – 5 output parsing: `<think>` opened by the generation prompt, compact
//! `<tool_call>NAME<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>` blocks with values
//! typed by the tool's schema (as llama.cpp's parser reads them), and the round trip through
//! llama.cpp's `GLM-4.7-Flash.jinja` (skipped without it).

use super::tests::{call, check_all_splits, content, reasoning, run_chunks};
use super::*;
use serde_json::json;

const GLM_TEMPLATE_SNIPPET: &str =
    "<|assistant|>{{ '<think>' }}<tool_call>{{ tc.name }}<arg_key>{{ k }}</arg_key>";

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "zip": {"type": "string"},
                       "days": {"type": "integer"}, "opts": {"type": "object"},
                       "hourly": {"type": "boolean"}, "unit": {"enum": ["c", "f"]}},
        "required": ["city"]}}}])
}

fn glm_cfg(src: &str, start_in_reasoning: bool) -> ParserConfig {
    let mut cfg = ParserConfig::from_template(src, true);
    cfg.start_in_reasoning = start_in_reasoning;
    cfg.arg_kinds = ArgKinds::from_tools(Some(&tools()));
    cfg
}

#[test]
fn glm_thinking_and_typed_calls() {
    let cfg = glm_cfg(GLM_TEMPLATE_SNIPPET, true);
    assert!(!cfg.llama_json, "GLM templates never show a bare JSON call");
    check_all_splits(
        &cfg,
        "The user asks.</think>Checking.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>zip</arg_key><arg_value>75001</arg_value><arg_key>days</arg_key><arg_value>3</arg_value><arg_key>opts</arg_key><arg_value>{\"a\": [1, null]}</arg_value><arg_key>hourly</arg_key><arg_value>false</arg_value><arg_key>unit</arg_key><arg_value>c</arg_value></tool_call>",
        &[
            reasoning("The user asks."),
            content("Checking."),
            // `zip` is a string by the schema although it reads as a number.
            call(
                "get_weather",
                r#"{"city":"Paris","zip":"75001","days":3,"opts":{"a":[1,null]},"hourly":false,"unit":"c"}"#,
            ),
        ],
    );
    // Two calls in a row; a declared non-string the model did not write as JSON stays text;
    // an undeclared key is JSON when it parses.
    check_all_splits(
        &cfg,
        "</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value></tool_call><tool_call>get_weather<arg_key>days</arg_key><arg_value>three</arg_value><arg_key>extra</arg_key><arg_value>[1]</arg_value></tool_call>",
        &[
            call("get_weather", r#"{"city":"Rome"}"#),
            call("get_weather", r#"{"days":"three","extra":[1]}"#),
        ],
    );
    // A string value keeps its whitespace and markup-like text.
    check_all_splits(
        &cfg,
        "</think><tool_call>get_weather<arg_key>city</arg_key><arg_value> New\nYork <b></arg_value></tool_call>",
        &[call("get_weather", r#"{"city":" New\nYork <b>"}"#)],
    );
    // Thinking off (`<|assistant|></think>` prompt): the answer is content; a JSON answer is
    // content too.
    let off = glm_cfg(GLM_TEMPLATE_SNIPPET, false);
    check_all_splits(&off, "{\"name\": \"x\"}", &[content("{\"name\": \"x\"}")]);
    // Malformed blocks stay text with their markers.
    for bad in [
        "<tool_call>get_weather<arg_key>city</arg_key>Paris</tool_call>",
        "<tool_call><arg_key>city</arg_key><arg_value>x</arg_value></tool_call>",
        "<tool_call>get_weather<arg_key>city<arg_value>x</arg_value></tool_call>",
    ] {
        check_all_splits(&off, bad, &[content(bad)]);
    }
}

/// The official GLM-4.7-Flash template renders an assistant turn (reasoning, text, a call with
/// string, number, object and boolean arguments); the text after the generation prompt
/// (`<|assistant|><think>`) parses back to the same reasoning, content and call.
#[test]
fn glm47_template_round_trip() {
    let rel = "llama-cpp-python/vendor/llama.cpp/models/templates/GLM-4.7-Flash.jinja";
    let path = match std::env::var_os("VELA_CACHE") {
        Some(c) => std::path::PathBuf::from(c).join(rel),
        None => std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
            .join(".cache/vela")
            .join(rel),
    };
    let Ok(src) = std::fs::read_to_string(&path) else {
        eprintln!("SKIP: {} missing", path.display());
        return;
    };
    let t = vela_template::ChatTemplate::new(&src, "", "<|endoftext|>").unwrap();
    let args = json!({"city": "Paris", "zip": "75001", "days": 3, "opts": {"a": [1, null]}, "hourly": true});
    let req = vela_template::RenderRequest {
        messages: json!([
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "Checking.", "reasoning_content": "The user asks.",
             "tool_calls": [{"id": "c1", "type": "function",
                             "function": {"name": "get_weather", "arguments": args}}]}
        ]),
        tools: Some(tools()),
        add_generation_prompt: false,
        extra: Default::default(),
    };
    let text = t.render(&req).unwrap();
    let at = text
        .rfind("<|assistant|><think>")
        .expect("the turn keeps its thinking");
    let answer = &text[at + "<|assistant|><think>".len()..];
    let cfg = glm_cfg(&src, true);
    assert!(cfg.tools[0].2 == ToolSyntax::HermesOrGlm && !cfg.llama_json);
    assert_eq!(
        run_chunks(&cfg, &[answer.trim_end()]),
        [
            reasoning("The user asks."),
            content("Checking."),
            call("get_weather", &args.to_string()),
        ],
        "{answer}"
    );
}
