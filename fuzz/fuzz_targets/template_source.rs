//! Fuzz chat templates from hostile model files: the input is a template's source (a GGUF's
//! `tokenizer.chat_template` or a checkpoint's `chat_template.jinja` reach vela as such),
//! compiled and rendered over a short conversation with a tool call, a tool result and tools.
//!
//! Asserts: compiling and rendering return `Ok` or an error, never panic or hang (a template that
//! does not end stops at `vela_template::FUEL` steps with an error), and an error is one line.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::json;
use std::sync::OnceLock;
use vela_template::{fixed_clock, ChatTemplate, DateTime, RenderRequest};

fn request() -> &'static RenderRequest {
    static R: OnceLock<RenderRequest> = OnceLock::new();
    R.get_or_init(|| RenderRequest {
        messages: json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": "", "reasoning_content": "Use the tool.",
             "tool_calls": [{"id": "c1", "type": "function",
                 "function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21}"},
            {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]}
        ]),
        tools: Some(json!([{"type": "function", "function": {"name": "weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])),
        add_generation_prompt: true,
        ..Default::default()
    })
}

fuzz_target!(|data: &[u8]| {
    let src = String::from_utf8_lossy(data);
    let clock = fixed_clock(DateTime {
        year: 2026,
        month: 1,
        day: 2,
        hour: 3,
        minute: 4,
        second: 5,
    });
    let tpl = match ChatTemplate::new(&src, "<s>", "</s>") {
        Ok(t) => t.with_clock(clock),
        Err(e) => {
            assert!(!format!("{e:#}").contains('\n'), "multi-line compile error: {e:#}");
            return;
        }
    };
    if let Err(e) = tpl.render(request()) {
        // A template's own raise_exception message is its text, which may hold newlines.
        let msg = format!("{e:#}");
        if msg.starts_with("chat template") {
            assert!(!msg.contains('\n'), "multi-line render error: {msg}");
        }
    }
});
