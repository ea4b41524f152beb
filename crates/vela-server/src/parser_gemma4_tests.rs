//! Gemma 4 output parsing: thinking channel, `<|tool_call>` blocks with `<|"|>` strings,
//! streaming equivalence, malformed output, and the full chat round trip against jinja2 renders
//! of the official template (`$VELA_CACHE/golden/templates/roundtrip.json`, written by
//! `scripts/gen-template-golden.py`).

use super::tests::{call, check_all_splits, content, reasoning, run_chunks};
use super::*;
use serde_json::json;
use std::path::PathBuf;

/// `$VELA_CACHE` (default `~/.cache/vela`), as `vela_formats::testdata` locates it (vela-server
/// does not depend on vela-formats directly).
fn cache_dir() -> PathBuf {
    std::env::var_os("VELA_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/vela")
        })
}

/// The golden file, or `None` (skip) when it is missing — a failure under `VELA_REQUIRE_DATA=1`.
fn require_golden() -> Option<PathBuf> {
    let p = cache_dir().join("golden/templates/roundtrip.json");
    if p.exists() {
        return Some(p);
    }
    if std::env::var("VELA_REQUIRE_DATA").as_deref() == Ok("1") {
        panic!(
            "required test data missing: {} (run scripts/gen-template-golden.py)",
            p.display()
        );
    }
    eprintln!("SKIP: test data missing: {}", p.display());
    None
}

/// The parser configuration vela-server picks for the official Gemma 4 template.
fn g4_cfg(tools: bool) -> ParserConfig {
    let src = std::fs::read_to_string(
        cache_dir()
            .join("llama-cpp-python/vendor/llama.cpp/models/templates/google-gemma-4-31B-it.jinja"),
    )
    .unwrap_or_else(|_| "{{ '<|tool_call>call:' }} <|channel> <channel|>".into());
    ParserConfig::from_template(&src, tools)
}

const REASONING: &str = "The user wants the weather in Paris.\nI should call get_weather.";

/// A model answer as Gemma 4 writes it: thinking channel, then a call (generation stops at the
/// `<|tool_response>` EOG token, which is not part of the text).
fn model_answer() -> String {
    format!(
        "<|channel>thought\n{REASONING}\n<channel|><|tool_call>call:get_weather{{location:<|\"|>Paris<|\"|>,unit:<|\"|>celsius<|\"|>}}<tool_call|>"
    )
}

#[test]
fn selected_for_gemma4_templates() {
    let c = g4_cfg(true);
    assert_eq!(c.tools.len(), 1);
    assert_eq!(c.tools[0].2, ToolSyntax::Gemma4);
    assert_eq!(
        c.reasoning,
        vec![("<|channel>thought".into(), "<channel|>".into())]
    );
    assert!(c.trim_reasoning && !c.llama_json);
    // Without tools in the request, calls are not parsed but thinking still is.
    let c = g4_cfg(false);
    assert!(c.tools.is_empty() && !c.reasoning.is_empty());
}

#[test]
fn thinking_and_call_stream_like_one_push() {
    check_all_splits(
        &g4_cfg(true),
        &model_answer(),
        &[
            reasoning(REASONING),
            call("get_weather", r#"{"location":"Paris","unit":"celsius"}"#),
        ],
    );
}

#[test]
fn content_around_calls_and_several_calls() {
    let text = "Let me look.<|tool_call>call:get_weather{days:3,location:<|\"|>Oslo<|\"|>}<tool_call|><|tool_call>call:search{exact:true,filters:{lang:<|\"|>en<|\"|>,n:[1,2]},limit:2.5,query:<|\"|>Oslo \"news\", today\n{x}<|\"|>,tags:[<|\"|>a<|\"|>,<|\"|>b<|\"|>]}<tool_call|>";
    check_all_splits(
        &g4_cfg(true),
        text,
        &[
            content("Let me look."),
            call("get_weather", r#"{"days":3,"location":"Oslo"}"#),
            call(
                "search",
                r#"{"exact":true,"filters":{"lang":"en","n":[1,2]},"limit":2.5,"query":"Oslo \"news\", today\n{x}","tags":["a","b"]}"#,
            ),
        ],
    );
}

#[test]
fn stray_channel_markers_are_dropped() {
    let cfg = g4_cfg(true);
    // An empty thought block at the end, a lone closer, a channel that is not `thought`.
    check_all_splits(
        &cfg,
        "The answer is 4.<|channel>thought\n<channel|>",
        &[content("The answer is 4.")],
    );
    check_all_splits(&cfg, "a<channel|>b", &[content("ab")]);
    check_all_splits(&cfg, "a<|channel>final b", &[content("afinal b")]);
    // A partial marker at the very end is released as text.
    check_all_splits(&cfg, "x <|chan", &[content("x <|chan")]);
    // Thinking that never closes (max_tokens hit) is still reasoning, trimmed.
    check_all_splits(
        &cfg,
        "<|channel>thought\n  step 1\n\n",
        &[reasoning("step 1")],
    );
    // Whitespace inside the reasoning is kept.
    check_all_splits(
        &cfg,
        "<|channel>thought\na \n b\n<channel|>\nDone",
        &[reasoning("a \n b"), content("\nDone")],
    );
}

#[test]
fn closer_inside_a_string_does_not_end_the_call() {
    check_all_splits(
        &g4_cfg(true),
        "<|tool_call>call:echo{text:<|\"|>use <tool_call|> here<|\"|>}<tool_call|>ok",
        &[
            call("echo", r#"{"text":"use <tool_call|> here"}"#),
            content("ok"),
        ],
    );
}

#[test]
fn malformed_calls_are_plain_content() {
    let cfg = g4_cfg(true);
    for bad in [
        "<|tool_call>call:{a:1}<tool_call|>",
        "<|tool_call>get_weather{a:1}<tool_call|>",
        "<|tool_call>call:f{a:1<tool_call|>",
        "<|tool_call>call:f[1,2]<tool_call|>",
        "<|tool_call>call:f{a:[1,}<tool_call|>",
        "<|tool_call>call:f{a:1}}<tool_call|>",
        "<|tool_call>call:f{:1}<tool_call|>",
    ] {
        check_all_splits(&cfg, bad, &[content(bad)]);
    }
    // An unterminated string swallows the closer; at the end the whole block is content.
    let bad = "<|tool_call>call:f{a:<|\"|>x}<tool_call|> more";
    check_all_splits(&cfg, bad, &[content(bad)]);
    // Cut off before the closer but complete: accepted (EOS right after the block).
    check_all_splits(&cfg, "<|tool_call>call:f{a:1}", &[call("f", r#"{"a":1}"#)]);
}

#[test]
fn every_truncation_and_corruption_is_handled() {
    // No panic on any prefix or single-byte corruption, and every emitted call has JSON
    // object arguments.
    let cfg = g4_cfg(true);
    let full = model_answer()
        + "<|tool_call>call:search{query:<|\"|>ünïcode ✓<|\"|>,limit:-1.5e3,x:null}<tool_call|>";
    let mut cases: Vec<String> = (0..=full.len())
        .filter(|&i| full.is_char_boundary(i))
        .map(|i| full[..i].to_string())
        .collect();
    for (i, _) in full.char_indices() {
        for repl in ["{", "}", ":", ",", "<", "|", "\"", ""] {
            let mut s = full.clone();
            let len = s[i..].chars().next().unwrap().len_utf8();
            s.replace_range(i..i + len, repl);
            cases.push(s);
        }
    }
    for text in &cases {
        for ev in run_chunks(&cfg, &[text]) {
            if let Event::ToolCall(c) = ev {
                let v: serde_json::Value = serde_json::from_str(&c.arguments)
                    .unwrap_or_else(|e| panic!("{text:?}: invalid arguments {e}"));
                assert!(v.is_object(), "{text:?}");
                assert!(!c.name.is_empty());
            }
        }
    }
}

/// The OpenAI assistant message vela-server sends for parsed events (what a client stores and
/// sends back in the next request).
fn openai_message(events: &[Event]) -> serde_json::Value {
    let mut text = String::new();
    let mut thinking = String::new();
    let mut calls = Vec::new();
    for e in events {
        match e {
            Event::Content(s) => text.push_str(s),
            Event::Reasoning(s) => thinking.push_str(s),
            Event::ToolCall(c) => calls.push(json!({
                "id": format!("call_{}", calls.len() + 1),
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            })),
        }
    }
    json!({
        "role": "assistant",
        "content": if text.is_empty() { serde_json::Value::Null } else { json!(text) },
        "reasoning_content": thinking,
        "tool_calls": calls,
    })
}

#[test]
fn full_round_trip_matches_jinja2() {
    let Some(path) = require_golden() else {
        return;
    };
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let conv = |name: &str| {
        golden["conversations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap()
            .clone()
    };
    let t = golden["templates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "google-gemma-4-31B-it")
        .expect("the official Gemma 4 template is in the golden file");
    let tpl = vela_template::ChatTemplate::new(
        t["source"].as_str().unwrap(),
        t["bos_token"].as_str().unwrap(),
        t["eos_token"].as_str().unwrap(),
    )
    .unwrap();
    let want = |name: &str| t["results"][name]["output"].as_str().unwrap().to_string();
    let render = |messages: serde_json::Value, gen: bool| {
        let c = conv("g4_prompt");
        tpl.render(&vela_template::RenderRequest {
            messages,
            tools: Some(c["tools"].clone()),
            add_generation_prompt: gen,
            extra: c["extra"].as_object().unwrap().clone(),
        })
        .unwrap()
    };

    // 1. system + tools + user: the prompt is what jinja2 renders.
    let system = json!({"role": "system", "content": "You are a helpful assistant."});
    let user = json!({"role": "user", "content": "What's the weather in Paris?"});
    let prompt = render(json!([system, user]), true);
    assert_eq!(prompt, want("g4_prompt"));
    let cfg = ParserConfig::from_template(t["source"].as_str().unwrap(), true);

    // 2. The model answers with thinking + a call; streamed token-sized pieces parse the same.
    let answer = model_answer();
    let events = run_chunks(&cfg, &[&answer]);
    let pieces: Vec<&str> = answer.split_inclusive(['>', ' ', '{', ',']).collect();
    assert_eq!(run_chunks(&cfg, &pieces), events);
    let assistant = openai_message(&events);
    let args = assistant["tool_calls"][0]["function"]["arguments"]
        .as_str()
        .unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(args).unwrap(),
        json!({"location": "Paris", "unit": "celsius"})
    );
    assert_eq!(assistant["reasoning_content"], REASONING);
    assert!(assistant["content"].is_null());

    // 3. The client sends the assistant message back with the tool result; after the server's
    //    normalization the re-rendered prompt is jinja2's, with the call exactly as the model
    //    wrote it and the result in a `<|tool_response>` block.
    let tool = json!({"role": "tool", "tool_call_id": "call_1",
                      "content": "{\"temperature\": 21.5, \"condition\": \"sunny\"}"});
    let msgs = crate::request::normalize_messages(Some(&json!([system, user, assistant, tool])))
        .map_err(|e| format!("{e:?}"))
        .unwrap();
    let prompt2 = render(serde_json::Value::Array(msgs.clone()), true);
    assert_eq!(prompt2, want("g4_after_tool"));
    let call_text = &answer[answer.find("<|tool_call>").unwrap()..];
    assert!(
        prompt2.contains(call_text),
        "the call is not re-rendered verbatim"
    );
    assert!(prompt2.contains(&format!("<|channel>thought\n{REASONING}\n<channel|>")));
    assert!(prompt2.ends_with(
        "<tool_call|><|tool_response>response:get_weather{value:<|\"|>{\"temperature\": 21.5, \
         \"condition\": \"sunny\"}<|\"|>}<tool_response|>"
    ));
    assert!(prompt2.starts_with(&prompt[..prompt.len() - 1]));

    // 4. The final answer after the tool result (same model turn) is plain content.
    let events = run_chunks(&cfg, &["It is 21.5 °C and sunny in Paris."]);
    let fin = openai_message(&events);
    assert_eq!(fin["content"], "It is 21.5 °C and sunny in Paris.");
    let mut all = msgs;
    all.push(json!({"role": "assistant", "content": fin["content"]}));
    assert_eq!(
        render(serde_json::Value::Array(all), false),
        want("g4_final_answer")
    );
}

#[test]
fn two_call_round_trip_matches_jinja2() {
    let Some(path) = require_golden() else {
        return;
    };
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let c = golden["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "g4_after_two_calls")
        .unwrap()
        .clone();
    let t = &golden["templates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "google-gemma-4-31B-it")
        .unwrap();
    let want = t["results"]["g4_after_two_calls"]["output"]
        .as_str()
        .unwrap();
    // The model's turn, as the golden prompt shows it, parses back to the golden message.
    let start = want.find("<|channel>thought").unwrap();
    let end = want.find("<|tool_response>").unwrap();
    let answer = &want[start..end];
    let cfg = ParserConfig::from_template(t["source"].as_str().unwrap(), true);
    let events = run_chunks(&cfg, &[answer]);
    check_all_splits(&cfg, answer, &events);
    let golden_turn = &c["messages"][2];
    let mut got = openai_message(&events);
    for (i, call) in got["tool_calls"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .enumerate()
    {
        let args = call["function"]["arguments"].as_str().unwrap().to_string();
        call["function"]["arguments"] = serde_json::from_str(&args).unwrap();
        call["id"] = golden_turn["tool_calls"][i]["id"].clone();
    }
    assert_eq!(got["tool_calls"], golden_turn["tool_calls"]);
    assert_eq!(got["reasoning_content"], golden_turn["reasoning_content"]);
}
