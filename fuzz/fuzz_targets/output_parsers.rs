//! Fuzz the server's streaming output parser (reasoning blocks, tool calls of every family) on
//! arbitrary model output: it never panics, and feeding the text in fuzzer-chosen pieces gives
//! the same content, reasoning and tool calls as feeding it in one piece. Every tool call's
//! `arguments` is a JSON object, and no text is lost or duplicated when no markers are
//! configured.
//!
//! Input: byte 0 picks the parser configuration (template family, tools on/off, whether the
//! prompt ended inside `<think>`), byte 1 how many split points follow (each a little-endian
//! u16), then the model output (lossy UTF-8).
#![no_main]

use libfuzzer_sys::fuzz_target;
use vela_server::parser::{Event, OutputParser, ParserConfig};
use vela_server::tool_schema::ArgKinds;

/// Template excerpts that select each parser family in `ParserConfig::from_template`.
const TEMPLATES: &[&str] = &[
    "",
    "<think>",
    "<|im_start|><think><tool_call>",
    "<tool_call>",
    "<|channel>thought<|tool_call>",
    "<|channel>",
    "<｜DSML｜tool_calls><think>",
    "<｜tool▁calls▁begin｜><think>",
    "<|python_tag|>",
    "\"parameters\"",
];

/// Merge adjacent text events (chunking may split one piece of text across pushes).
fn norm(events: Vec<Event>) -> Vec<Event> {
    let mut out: Vec<Event> = Vec::new();
    for e in events {
        match (&e, out.last_mut()) {
            (Event::Content(s), _) | (Event::Reasoning(s), _) if s.is_empty() => {}
            (Event::Content(s), Some(Event::Content(p))) => p.push_str(s),
            (Event::Reasoning(s), Some(Event::Reasoning(p))) => p.push_str(s),
            _ => out.push(e),
        }
    }
    out
}

fn run(cfg: &ParserConfig, chunks: &[&str]) -> Vec<Event> {
    let mut p = OutputParser::new(cfg.clone());
    let mut ev = Vec::new();
    for c in chunks {
        ev.extend(p.push(c));
    }
    ev.extend(p.finish());
    norm(ev)
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let sel = data[0] as usize;
    let n_splits = (data[1] % 16) as usize;
    let rest = &data[2..];
    let (split_bytes, text) = rest.split_at((n_splits * 2).min(rest.len()));
    let text = String::from_utf8_lossy(text);

    let tpl = TEMPLATES[sel % TEMPLATES.len()];
    let tools = (sel / TEMPLATES.len()) % 2 == 1;
    let mut cfg = ParserConfig::from_template(tpl, tools);
    cfg.start_in_reasoning = (sel / (2 * TEMPLATES.len())) % 2 == 1;
    if tools {
        // Schema-typed XML arguments (GLM, Qwen3.5): strings, a number, an object.
        let t = serde_json::json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"},
            "days": {"type": "integer"}, "opts": {"type": "object"}, "x": {"enum": ["a", 1]}}}}}]);
        cfg.arg_kinds = ArgKinds::from_tools(Some(&t));
    }

    // Split points at char boundaries (the worker only ever pushes whole characters).
    let mut cuts: Vec<usize> = split_bytes
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]) as usize % (text.len() + 1))
        .map(|mut i| {
            while !text.is_char_boundary(i) {
                i -= 1;
            }
            i
        })
        .collect();
    cuts.sort_unstable();
    let mut chunks = Vec::with_capacity(cuts.len() + 1);
    let mut from = 0;
    for c in cuts {
        chunks.push(&text[from..c]);
        from = c;
    }
    chunks.push(&text[from..]);

    let whole = run(&cfg, &[&text]);
    let split = run(&cfg, &chunks);
    assert_eq!(whole, split, "chunks {chunks:?} with {cfg:?}");

    for e in &whole {
        if let Event::ToolCall(c) = e {
            let v: serde_json::Value =
                serde_json::from_str(&c.arguments).expect("arguments are JSON");
            assert!(
                v.is_object(),
                "arguments {:?} are not an object",
                c.arguments
            );
        }
    }
    if cfg == ParserConfig::default() {
        // No markers: the text comes back unchanged as content.
        let want = if text.is_empty() {
            vec![]
        } else {
            vec![Event::Content(text.to_string())]
        };
        assert_eq!(whole, want);
    }
});
