//! Tests of `/v1/responses`: the translation to chat and the stream events.
use super::*;

fn tr(v: Value) -> Result<Translated, ApiError> {
    translate(v.as_object().unwrap())
}

fn emitter(kinds: HashMap<String, ToolKind>) -> Emitter {
    Emitter::new(json!({"id": "resp_1"}), kinds)
}

/// The event types and payloads of SSE frames.
fn events(f: &[String]) -> Vec<(String, Value)> {
    f.iter()
        .map(|s| {
            let (head, rest) = s.split_once('\n').unwrap();
            let ty = head.strip_prefix("event: ").unwrap().to_string();
            let v: Value =
                serde_json::from_str(rest.trim().strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(v["type"], ty.as_str());
            (ty, v)
        })
        .collect()
}

#[test]
fn codex_conversation_becomes_chat_messages() {
    let t = tr(json!({
        "instructions": "Be brief.",
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Use tools."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List files"}]},
            {"type": "reasoning", "summary": [], "encrypted_content": null},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Listing."}]},
            {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": "{\"cmd\":\"ls\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
            {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch"},
            {"type": "custom_tool_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "done"}]},
            {"role": "user", "content": "thanks"},
        ],
        "tools": [
            {"type": "function", "name": "exec_command", "parameters": {"type": "object"}, "strict": false},
            {"type": "namespace", "name": "agents", "tools": [{"type": "function", "name": "spawn", "parameters": {"type": "object"}}]},
            {"type": "custom", "name": "apply_patch", "format": {"type": "grammar", "definition": "start: x"}},
            {"type": "web_search"},
        ],
        "tool_choice": "auto", "max_output_tokens": 64, "stream": true, "store": false,
        "reasoning": {"effort": "none"}, "include": ["reasoning.encrypted_content"],
    }))
    .unwrap();
    let m = &t.chat["messages"];
    assert_eq!(
        m[0],
        json!({"role": "system", "content": "Be brief.\n\nUse tools."})
    );
    assert_eq!(m[1], json!({"role": "user", "content": "List files"}));
    assert_eq!(m[2]["content"], "Listing.");
    let calls = m[2]["tool_calls"].as_array().unwrap();
    assert_eq!(calls[0]["function"]["name"], "exec_command");
    assert_eq!(
        m[3],
        json!({"role": "tool", "tool_call_id": "c1", "content": "a.txt"})
    );
    assert_eq!(
        m[4]["tool_calls"][0]["function"]["arguments"],
        json!({"input": "*** Begin Patch"})
    );
    assert_eq!(m[5]["content"], "done");
    assert_eq!(m[6], json!({"role": "user", "content": "thanks"}));
    let names: Vec<_> = t.chat["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].clone())
        .collect();
    assert_eq!(
        names,
        [json!("exec_command"), json!("spawn"), json!("apply_patch")]
    );
    assert_eq!(t.kinds["spawn"], ToolKind::Function(Some("agents".into())));
    assert_eq!(t.kinds["apply_patch"], ToolKind::Custom);
    assert_eq!(t.chat["max_tokens"], 64);
    assert_eq!(
        t.chat["chat_template_kwargs"],
        json!({"enable_thinking": false})
    );
    // The chat validation takes the translated body as it is.
    validate_chat(&t.chat, 1000).unwrap();
}

#[test]
fn bad_bodies_name_the_field() {
    for (body, param) in [
        (json!({"input": []}), "input"),
        (json!({"input": 3}), "input"),
        (
            json!({"input": "x", "previous_response_id": "resp_1"}),
            "previous_response_id",
        ),
        (
            json!({"input": [{"type": "message", "role": "tool", "content": "x"}]}),
            "input[0]",
        ),
        (
            json!({"input": [{"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
            "input[0]",
        ),
        (
            json!({"input": [{"type": "item_reference", "id": "msg_1"}]}),
            "input[0]",
        ),
        (
            json!({"input": [{"type": "function_call", "name": "f"}]}),
            "input[0]",
        ),
        (json!({"input": "x", "instructions": 1}), "instructions"),
        (
            json!({"input": "x", "tools": [{"type": "function"}]}),
            "tools[0]",
        ),
        (
            json!({"input": "x", "tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "web_search"}}),
            "tool_choice",
        ),
        (
            json!({"input": "x", "max_output_tokens": 0}),
            "max_output_tokens",
        ),
        (
            json!({"input": "x", "text": {"format": {"type": "yaml"}}}),
            "text",
        ),
        (
            json!({"input": [{"type": "message", "role": "system", "content": "x"}]}),
            "input",
        ),
    ] {
        let e = tr(body.clone())
            .err()
            .unwrap_or_else(|| panic!("{body} was accepted"));
        assert_eq!(
            (e.status.as_u16(), e.param.as_deref()),
            (400, Some(param)),
            "{body}: {}",
            e.message
        );
    }
}

#[test]
fn stream_events_and_final_items() {
    let mut kinds = HashMap::new();
    kinds.insert(
        "spawn".to_string(),
        ToolKind::Function(Some("agents".into())),
    );
    kinds.insert("apply_patch".to_string(), ToolKind::Custom);
    let mut em = emitter(kinds);
    let mut f = Vec::new();
    em.text(&mut f, true, "hmm".into());
    em.text(&mut f, false, "\n".into());
    em.tool_call(
        &mut f,
        ToolCall {
            name: "spawn".into(),
            arguments: "{\"a\":1}".into(),
        },
    );
    em.tool_call(
        &mut f,
        ToolCall {
            name: "apply_patch".into(),
            arguments: "{\"input\":\"P\"}".into(),
        },
    );
    let u = Usage {
        prompt_tokens: 5,
        completion_tokens: 3,
        cached_tokens: 2,
        ..Default::default()
    };
    let r = em.done(&mut f, "tool_calls", &u);
    let ev = events(&f);
    let types: Vec<_> = ev.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(
        types,
        [
            "response.output_item.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.custom_tool_call_input.delta",
            "response.custom_tool_call_input.done",
            "response.output_item.done",
        ]
    );
    let seqs: Vec<_> = ev
        .iter()
        .map(|(_, v)| v["sequence_number"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (0..12).collect::<Vec<_>>());
    // The whitespace before the calls made no message item.
    let out = r["output"].as_array().unwrap();
    assert_eq!(out.len(), 3);
    assert_eq!(
        out[0]["content"][0],
        json!({"type": "reasoning_text", "text": "hmm"})
    );
    assert_eq!(
        (&out[1]["type"], &out[1]["namespace"], &out[1]["arguments"]),
        (
            &json!("function_call"),
            &json!("agents"),
            &json!("{\"a\":1}")
        )
    );
    assert_eq!(
        (&out[2]["type"], &out[2]["input"]),
        (&json!("custom_tool_call"), &json!("P"))
    );
    assert_eq!(ev[7].1["item"], out[1]);
    assert_eq!(r["status"], "completed");
    assert_eq!(r["usage"]["input_tokens_details"]["cached_tokens"], 2);
    assert_eq!(r["usage"]["total_tokens"], 8);
}

#[test]
fn a_text_answer_streams_as_one_message() {
    let mut em = emitter(HashMap::new());
    let mut f = Vec::new();
    em.text(&mut f, false, " ".into());
    em.text(&mut f, false, "Paris".into());
    em.text(&mut f, false, ".".into());
    let r = em.done(&mut f, "length", &Usage::default());
    let ev = events(&f);
    let deltas: Vec<_> = ev
        .iter()
        .filter(|(t, _)| t == "response.output_text.delta")
        .map(|(_, v)| v["delta"].clone())
        .collect();
    assert_eq!(deltas, [json!(" Paris"), json!(".")]);
    assert_eq!(r["output"][0]["content"][0]["text"], " Paris.");
    assert_eq!(
        (&r["status"], &r["incomplete_details"]["reason"]),
        (&json!("incomplete"), &json!("max_output_tokens"))
    );
    // Nothing at all still answers with an (empty) message.
    let mut em = emitter(HashMap::new());
    let r = em.done(&mut Vec::new(), "stop", &Usage::default());
    assert_eq!(r["output"][0]["content"][0]["text"], "");
}
