use super::*;

fn cfg_for(template: &str) -> ParserConfig {
    ParserConfig::from_template(template, true)
}

/// Merge adjacent text events so different chunkings compare equal.
fn norm(events: Vec<Event>) -> Vec<Event> {
    let mut out = Vec::new();
    for e in events {
        push_event(&mut out, e);
    }
    out
}

pub(super) fn run_chunks(cfg: &ParserConfig, chunks: &[&str]) -> Vec<Event> {
    let mut p = OutputParser::new(cfg.clone());
    let mut ev = Vec::new();
    for c in chunks {
        ev.extend(p.push(c));
    }
    ev.extend(p.finish());
    norm(ev)
}

/// Every split point (at every char boundary, i.e. every byte of ASCII text) and char-by-char
/// feeding give the same events as one push.
pub(super) fn check_all_splits(cfg: &ParserConfig, text: &str, expect: &[Event]) {
    let whole = run_chunks(cfg, &[text]);
    assert_eq!(whole, expect, "whole text {text:?}");
    for i in 0..=text.len() {
        if !text.is_char_boundary(i) {
            continue;
        }
        for j in i..=text.len() {
            if !text.is_char_boundary(j) {
                continue;
            }
            let got = run_chunks(cfg, &[&text[..i], &text[i..j], &text[j..]]);
            assert_eq!(got, expect, "split at {i},{j} of {text:?}");
        }
    }
    let chars: Vec<String> = text.chars().map(|c| c.to_string()).collect();
    let refs: Vec<&str> = chars.iter().map(|s| s.as_str()).collect();
    assert_eq!(run_chunks(cfg, &refs), expect, "char by char");
}

pub(super) fn call(name: &str, args: &str) -> Event {
    Event::ToolCall(ToolCall {
        name: name.into(),
        arguments: args.into(),
    })
}
pub(super) fn content(s: &str) -> Event {
    Event::Content(s.into())
}
pub(super) fn reasoning(s: &str) -> Event {
    Event::Reasoning(s.into())
}

#[test]
fn hermes_qwen_calls_and_reasoning() {
    let cfg = cfg_for("<think> {{ '<tool_call>' }}");
    check_all_splits(
        &cfg,
        "<think>hmm</think>Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        &[reasoning("hmm"), content("Let me check."), call("get_weather", r#"{"city":"Paris"}"#)],
    );
    // Whitespace around the reasoning and at the start of the answer goes (llama.cpp's
    // rendering; the template writes it back).
    check_all_splits(
        &cfg,
        "<think>\nhmm\n</think>\n\nIt is sunny.",
        &[reasoning("hmm"), content("It is sunny.")],
    );
    // Two calls, text after.
    check_all_splits(
        &cfg,
        "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call><tool_call>{\"name\":\"b\",\"arguments\":\"{\\\"x\\\":1}\"}</tool_call> ok",
        &[call("a", "{}"), call("b", r#"{"x":1}"#), content(" ok")],
    );
}

#[test]
fn malformed_tool_syntax_is_plain_content() {
    let cfg = cfg_for("<tool_call>");
    let bad = "x <tool_call>{\"name\": oops}</tool_call> y";
    check_all_splits(&cfg, bad, &[content(bad)]);
    // Unterminated block at the end that does not parse: content, markers included.
    check_all_splits(&cfg, "a <tool_call>{\"na", &[content("a <tool_call>{\"na")]);
    // Unterminated but complete JSON (model stopped at EOS): accepted.
    check_all_splits(
        &cfg,
        "<tool_call>{\"name\":\"f\",\"arguments\":{}}",
        &[call("f", "{}")],
    );
    // A partial opener at the end is released as content.
    check_all_splits(&cfg, "less <tool_ca", &[content("less <tool_ca")]);
    check_all_splits(&cfg, "a < b", &[content("a < b")]);
}

#[test]
fn qwen_bare_json_call() {
    let cfg = cfg_for("<tool_call>");
    check_all_splits(
        &cfg,
        "{\"name\": \"f\", \"arguments\": {\"a\": 1}}",
        &[call("f", r#"{"a":1}"#)],
    );
    check_all_splits(&cfg, "{oops} and more", &[content("{oops} and more")]);
    // The same call fenced as a JSON code block (what Qwen2.5-Coder-0.5B writes).
    check_all_splits(
        &cfg,
        "```json\n{\n  \"name\": \"f\",\n  \"arguments\": {\"a\": 1}\n}\n```",
        &[call("f", r#"{"a":1}"#)],
    );
    check_all_splits(
        &cfg,
        "```\n{\"name\": \"f\", \"arguments\": {}}\n```",
        &[call("f", "{}")],
    );
    // Other fenced blocks, a fenced non-call and a broken fence stay text, whole.
    for text in [
        "```python\nprint(1)\n```",
        "```json\n{\"a\": 1}\n```",
        "```json\n{\"name\": \"f\", \"arguments\": {}}",
        "`x` is a variable",
        "``",
    ] {
        check_all_splits(&cfg, text, &[content(text)]);
    }
}

#[test]
fn glm_xml_calls() {
    let cfg = cfg_for("<tool_call>{{ tc.name }}<arg_key>");
    check_all_splits(
        &cfg,
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
        &[call("get_weather", r#"{"city":"Paris","days":3}"#)],
    );
}

#[test]
fn gemma4_calls() {
    let cfg = cfg_for("{{ '<|tool_call>call:' }} <|channel>");
    check_all_splits(
        &cfg,
        "<|tool_call>call:bash{command:pwd}<tool_call|>",
        &[call("bash", r#"{"command":"pwd"}"#)],
    );
    check_all_splits(
        &cfg,
        "<|channel>thought\nplan<channel|>Sure.<|tool_call>call:f{a:<|\"|>x, y}<|\"|>,b:2.5,c:true,d:[1,<|\"|>s<|\"|>],e:{k:v}}<tool_call|>",
        &[
            reasoning("plan"),
            content("Sure."),
            call("f", r#"{"a":"x, y}","b":2.5,"c":true,"d":[1,"s"],"e":{"k":"v"}}"#),
        ],
    );
    let bad = "<|tool_call>call:f{a:}<tool_call|>";
    check_all_splits(&cfg, bad, &[content(bad)]);
}

#[test]
fn deepseek_v3_and_dsml() {
    let cfg = cfg_for("tool▁calls▁begin");
    check_all_splits(
        &cfg,
        "ok<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Rome\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        &[content("ok"), call("get_weather", r#"{"city":"Rome"}"#)],
    );
    let cfg = cfg_for("DSML");
    check_all_splits(
        &cfg,
        "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"search\">\n<｜DSML｜parameter name=\"q\" string=\"true\">rust</｜DSML｜parameter>\n<｜DSML｜parameter name=\"n\" string=\"false\">5</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
        &[call("search", r#"{"q":"rust","n":5}"#)],
    );
}

/// Fuzz finding (output_parsers): an end marker before the name's or key's closing quote made
/// `parse_dsml` slice backwards and panic; such blocks are malformed, hence content.
#[test]
fn dsml_markers_out_of_order_are_content() {
    let cfg = cfg_for("DSML");
    for body in [
        "<｜DSML｜invoke name=\"a</｜DSML｜invoke>\">",
        "<｜DSML｜invoke name=\"f\"><｜DSML｜parameter name=\"k>v</｜DSML｜parameter>\"</｜DSML｜invoke>",
        "<｜DSML｜invoke name=\"f\"><｜DSML｜parameter name=\"k\" string</｜DSML｜parameter>>v</｜DSML｜invoke>",
    ] {
        assert_eq!(
            parse_block(ToolSyntax::Dsml, body, &ArgKinds::default()),
            None,
            "{body}"
        );
        let text = format!("<｜DSML｜tool_calls>{body}</｜DSML｜tool_calls>");
        check_all_splits(&cfg, &text, &[content(&text)]);
    }
}

#[test]
fn llama3_json_calls() {
    let cfg = cfg_for("<|python_tag|> \"parameters\"");
    check_all_splits(
        &cfg,
        "  {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}",
        &[call("get_weather", r#"{"city":"Oslo"}"#)],
    );
    check_all_splits(&cfg, "{not json", &[content("{not json")]);
    // Fuzz finding (output_parsers): `<|python_tag|>` split across pushes was not recognised
    // at the start, so the streamed answer parsed differently from the whole one.
    let cfg = cfg_for("<tool_call>");
    let t = "<|python_tag|>x<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>";
    check_all_splits(&cfg, t, &[content(t)]);
    check_all_splits(&cfg, "<|pyt", &[content("<|pyt")]);
    check_all_splits(&cfg, "Hello {x}", &[content("Hello {x}")]);
}

#[test]
fn no_tools_means_markers_are_content() {
    let cfg = ParserConfig::from_template("<tool_call>", false);
    let t = "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>";
    check_all_splits(&cfg, t, &[content(t)]);
}

#[test]
fn starts_in_reasoning() {
    let mut cfg = cfg_for("<think>");
    cfg.start_in_reasoning = true;
    check_all_splits(&cfg, "a</think>b", &[reasoning("a"), content("b")]);
}

#[test]
fn multibyte_text_survives() {
    let cfg = cfg_for("<think> <tool_call>");
    check_all_splits(
        &cfg,
        "héllo <thi 世界 <think>思考</think>",
        &[content("héllo <thi 世界 "), reasoning("思考")],
    );
}

/// Qwen3.5 / Qwen3-Coder XML calls inside `<tool_call>`, at every split point; typed values;
/// malformed blocks stay text.
#[test]
fn qwen_xml_calls() {
    let cfg = cfg_for("<tool_call>\n<function=example_function_name>");
    check_all_splits(
        &cfg,
        "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nLisbon\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{\"unit\": \"c\"}\n</parameter>\n</function>\n</tool_call>",
        &[
            content("Let me check.\n"),
            call("get_weather", r#"{"city":"Lisbon","days":3,"opts":{"unit":"c"}}"#),
        ],
    );
    // Multi-line string values keep their inner newlines.
    check_all_splits(
        &cfg,
        "<tool_call>\n<function=write>\n<parameter=text>\nline 1\nline 2\n</parameter>\n</function>\n</tool_call>",
        &[call("write", r#"{"text":"line 1\nline 2"}"#)],
    );
    let broken = "<tool_call>\n<function=f>\n<parameter=x>\n1\n</function>\n</tool_call>";
    check_all_splits(&cfg, broken, &[content(broken)]);
}

/// The official Qwen3.5 template renders an assistant tool call as XML, which parses back to
/// the same call (skipped without llama.cpp's template file).
#[test]
fn qwen35_template_round_trip() {
    let path = std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
        .join(".cache/vela/llama-cpp-python/vendor/llama.cpp/models/templates/Qwen3.5-4B.jinja");
    let path = match std::env::var_os("VELA_CACHE") {
        Some(c) => std::path::PathBuf::from(c)
            .join("llama-cpp-python/vendor/llama.cpp/models/templates/Qwen3.5-4B.jinja"),
        None => path,
    };
    let Ok(src) = std::fs::read_to_string(&path) else {
        eprintln!("SKIP: {} missing", path.display());
        return;
    };
    let t = vela_template::ChatTemplate::new(&src, "", "<|im_end|>").unwrap();
    let args = serde_json::json!({"city": "Lisbon", "days": 3});
    let req = vela_template::RenderRequest {
        messages: serde_json::json!([
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]}
        ]),
        tools: Some(
            serde_json::json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]),
        ),
        add_generation_prompt: false,
        extra: Default::default(),
    };
    let text = t.render(&req).unwrap();
    let start = text
        .rfind("<tool_call>")
        .expect("the template renders the call");
    let end = text.rfind("</tool_call>").unwrap() + "</tool_call>".len();
    let block = &text[start..end];
    let cfg = ParserConfig::from_template(&src, true);
    let ev = run_chunks(&cfg, &[block]);
    assert_eq!(
        ev,
        [call("get_weather", r#"{"city":"Lisbon","days":3}"#)],
        "{block}"
    );
}
