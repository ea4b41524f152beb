//! Fuzz chat-template rendering and prompt tokenization on hostile message lists: arbitrary
//! roles, content as strings, part lists or nested JSON, tool calls with object, string or junk
//! arguments, reasoning fields, tool definitions and template kwargs, rendered with the real
//! templates of llama.cpp's `models/templates` (the input picks one).
//!
//! Asserts: rendering returns `Ok` or an error, never panics (a panic inside MiniJinja is
//! caught by `ChatTemplate::render` and must come back as an error); a rendered prompt tokenizes
//! (`vela_engine::prompt::tokenize_chat`, the server's path) losslessly, and no special token of
//! the result overlaps an occurrence of a request string that holds special-token text (user
//! text never becomes control tokens).
//!
//! Templates are read once from `$VELA_FUZZ_TEMPLATES`, else
//! `$VELA_CACHE/llama-cpp-python/vendor/llama.cpp/models/templates` (`VELA_CACHE` defaults to
//! `~/.cache/vela`); without them a built-in ChatML template is used. The tokenizer is a
//! byte-level BPE (one token per byte) with the usual control tokens as special added tokens.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{json, Map, Value};
use std::path::PathBuf;
use std::sync::OnceLock;
use vela_template::{fixed_clock, ChatTemplate, DateTime, RenderRequest};
use vela_tokenizer::hf::HfTokenizer;
use vela_tokenizer::Tokenizer;

/// Control tokens of the common templates (special added tokens of the test tokenizer).
const SPECIAL: &[&str] = &[
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "<|user|>",
    "<|assistant|>",
    "<|system|>",
    "<|end|>",
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<|turn>",
    "<turn|>",
    "<|channel>",
    "<channel|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|\"|>",
    "<|start|>",
    "<|message|>",
    "<|return|>",
];

/// Text fragments the generator splices into strings: markup, quotes, JSON and Jinja syntax.
const FRAGMENTS: &[&str] = &[
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "{\"name\": \"f\", \"arguments\": {}}",
    "{",
    "}",
    "\"",
    "'",
    "\\",
    "\n",
    " ",
    "{{ x }}",
    "{% if %}",
    "é",
    "👋",
    "\u{0}",
    "<|im_",
    "end|>",
    "<",
    ">",
    "|",
    "system",
    "user",
    "assistant",
    "tool",
];

struct Tpl {
    name: String,
    tpl: ChatTemplate,
}

struct Setup {
    templates: Vec<Tpl>,
    tok: Tokenizer,
}

fn template_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("VELA_FUZZ_TEMPLATES") {
        return d.into();
    }
    let cache = std::env::var_os("VELA_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/vela")
        });
    cache.join("llama-cpp-python/vendor/llama.cpp/models/templates")
}

fn setup() -> &'static Setup {
    static S: OnceLock<Setup> = OnceLock::new();
    S.get_or_init(|| {
        // `ChatTemplate::render` catches panics inside MiniJinja (2.24 panics on `[::-1]` of an
        // empty sequence) and returns an error. libFuzzer's hook aborts on every panic, caught
        // or not, so those unwind to `render`; any other panic still aborts.
        let libfuzzer_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let in_engine = info
                .location()
                .is_some_and(|l| l.file().contains("/minijinja-"));
            if !in_engine {
                libfuzzer_hook(info);
            }
        }));
        let clock = fixed_clock(DateTime {
            year: 2025,
            month: 3,
            day: 7,
            hour: 12,
            minute: 0,
            second: 0,
        });
        let dir = template_dir();
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map(|r| r.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        files.retain(|p| p.extension().is_some_and(|e| e == "jinja"));
        files.sort();
        let mut templates = Vec::new();
        for p in &files {
            let Ok(src) = std::fs::read_to_string(p) else {
                continue;
            };
            if let Ok(t) = ChatTemplate::new(&src, "<s>", "</s>") {
                let name = p.file_stem().unwrap_or_default().to_string_lossy().into_owned();
                templates.push(Tpl {
                    name,
                    tpl: t.with_clock(clock.clone()),
                });
            }
        }
        if templates.is_empty() {
            eprintln!("chat_template: no templates in {}; using a built-in ChatML", dir.display());
            let src = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
            templates.push(Tpl {
                name: "chatml".into(),
                tpl: ChatTemplate::new(src, "<s>", "</s>").expect("built-in template"),
            });
        } else {
            eprintln!("chat_template: {} templates from {}", templates.len(), dir.display());
        }
        Setup {
            templates,
            tok: byte_tokenizer(),
        }
    })
}

/// A byte-level BPE without merges (one token per byte) plus `SPECIAL` as special tokens.
fn byte_tokenizer() -> Tokenizer {
    let map = vela_tokenizer::unicode::byte_map();
    let vocab: Map<String, Value> = (0..256)
        .map(|b| (map.to_char[b].to_string(), json!(b)))
        .collect();
    let added: Vec<Value> = SPECIAL
        .iter()
        .enumerate()
        .map(|(i, s)| {
            json!({"id": 256 + i, "content": s, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let bl = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false,
                    "use_regex": false});
    let tj = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": bl, "post_processor": null, "decoder": bl,
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": []},
    });
    let bytes = serde_json::to_vec(&tj).expect("serialises");
    let h = HfTokenizer::from_json_bytes(&bytes, &Value::Null, &Value::Null)
        .expect("the test tokenizer loads");
    Tokenizer::Hf(Box::new(h))
}

/// Reads the fuzz input as a stream of choices (zeros once it runs out).
struct Gen<'a> {
    d: &'a [u8],
    i: usize,
}

impl Gen<'_> {
    fn byte(&mut self) -> u8 {
        let b = self.d.get(self.i).copied().unwrap_or(0);
        self.i += 1;
        b
    }
    fn below(&mut self, n: usize) -> usize {
        self.byte() as usize % n
    }
    fn text(&mut self) -> String {
        let mut s = String::new();
        for _ in 0..self.below(6) {
            match self.below(4) {
                0 => s.push_str(SPECIAL[self.below(SPECIAL.len())]),
                1 => s.push_str(FRAGMENTS[self.below(FRAGMENTS.len())]),
                _ => {
                    let n = self.below(16);
                    let end = (self.i + n).min(self.d.len());
                    let start = self.i.min(end);
                    s.push_str(&String::from_utf8_lossy(&self.d[start..end]));
                    self.i += n;
                }
            }
        }
        s
    }
    fn value(&mut self, depth: u32) -> Value {
        let k = if depth == 0 {
            self.below(5)
        } else {
            self.below(7)
        };
        match k {
            0 => Value::Null,
            1 => Value::Bool(self.byte() & 1 == 1),
            2 => match self.below(4) {
                0 => json!(self.byte() as i64 - 128),
                1 => json!(f64::from(self.byte()) / 7.0),
                2 => json!(u64::MAX),
                _ => json!(-1e300),
            },
            3 | 4 => Value::String(self.text()),
            5 => Value::Array((0..self.below(4)).map(|_| self.value(depth - 1)).collect()),
            _ => {
                let mut m = Map::new();
                for _ in 0..self.below(4) {
                    let key = if self.byte() & 1 == 0 {
                        [
                            "type",
                            "text",
                            "name",
                            "content",
                            "arguments",
                            "properties",
                            "description",
                        ][self.below(7)]
                        .to_string()
                    } else {
                        self.text()
                    };
                    let v = self.value(depth - 1);
                    m.insert(key, v);
                }
                Value::Object(m)
            }
        }
    }
    fn content(&mut self) -> Option<Value> {
        Some(match self.below(6) {
            0 => return None,
            1 | 2 => Value::String(self.text()),
            3 => Value::Array(
                (0..self.below(4))
                    .map(|_| match self.below(3) {
                        0 => json!({"type": "text", "text": self.text()}),
                        1 => json!({"type": "image_url", "image_url": {"url": self.text()}}),
                        _ => self.value(2),
                    })
                    .collect(),
            ),
            _ => self.value(3),
        })
    }
    fn tool_call(&mut self) -> Value {
        let args = match self.below(3) {
            0 => self.value(3),
            1 => Value::String(self.value(2).to_string()),
            _ => json!({"location": self.text(), "n": self.byte()}),
        };
        let mut c = json!({"id": self.text(), "type": "function",
                           "function": {"name": self.text(), "arguments": args}});
        if self.below(8) == 0 {
            c = self.value(2);
        }
        c
    }
    fn message(&mut self) -> Value {
        let roles = ["system", "user", "assistant", "tool", "developer"];
        let role = match self.below(7) {
            r @ 0..=4 => Value::String(roles[r].into()),
            5 => Value::String(self.text()),
            _ => self.value(1),
        };
        let mut m = Map::new();
        m.insert("role".into(), role);
        if let Some(c) = self.content() {
            m.insert("content".into(), c);
        }
        let flags = self.byte();
        if flags & 1 != 0 {
            let calls = (0..1 + self.below(3)).map(|_| self.tool_call()).collect();
            m.insert("tool_calls".into(), Value::Array(calls));
        }
        if flags & 2 != 0 {
            let k = ["reasoning_content", "thinking", "reasoning"][self.below(3)];
            let v = self.text();
            m.insert(k.into(), v.into());
        }
        if flags & 4 != 0 {
            m.insert("tool_call_id".into(), self.text().into());
        }
        if flags & 8 != 0 {
            m.insert("name".into(), self.text().into());
        }
        if flags & 16 != 0 {
            let k = self.text();
            let v = self.value(2);
            m.insert(k, v);
        }
        Value::Object(m)
    }
    fn tools(&mut self) -> Option<Value> {
        match self.below(4) {
            0 | 1 => None,
            2 => Some(Value::Array(
                (0..1 + self.below(3))
                    .map(|_| {
                        json!({"type": "function", "function": {"name": self.text(),
                            "description": self.text(),
                            "parameters": {"type": "object",
                                "properties": {"location": {"type": "string", "description": self.text()},
                                               "x": self.value(2)},
                                "required": ["location"]}}})
                    })
                    .collect(),
            )),
            _ => Some(self.value(3)),
        }
    }
}

/// Byte spans `[a, b)` of every occurrence (overlapping ones too) of `needle` in `hay`.
fn occurrences(hay: &str, needle: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = hay[from..].find(needle) {
        let a = from + i;
        out.push((a, a + needle.len()));
        from = a + hay[a..].chars().next().map_or(1, char::len_utf8);
    }
    out
}

fn strings<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
    match v {
        Value::String(s) => out.push(s),
        Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
        Value::Object(o) => o.values().for_each(|x| strings(x, out)),
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let s = setup();
    let mut g = Gen { d: data, i: 0 };
    let t = &s.templates[(g.byte() as usize * 256 + g.byte() as usize) % s.templates.len()];
    let messages = Value::Array((0..g.below(6)).map(|_| g.message()).collect());
    let tools = g.tools();
    let flags = g.byte();
    let mut extra = Map::new();
    if flags & 2 != 0 {
        extra.insert("enable_thinking".into(), Value::Bool(flags & 4 != 0));
    }
    if flags & 8 != 0 {
        let k = g.text();
        let v = g.value(2);
        extra.insert(k, v);
    }
    let req = RenderRequest {
        messages: messages.clone(),
        tools: tools.clone(),
        add_generation_prompt: flags & 1 != 0,
        extra,
    };
    let Ok(rendered) = t.tpl.render(&req) else {
        return;
    };
    let values = [messages, tools.unwrap_or(Value::Null)];
    let ids = vela_engine::prompt::tokenize_chat(&s.tok, &rendered, &values)
        .unwrap_or_else(|e| panic!("{}: rendered prompt does not tokenize: {e:#}", t.name));

    // Lossless, and where each token lies in the prompt.
    let mut spans = Vec::with_capacity(ids.len());
    let mut bytes = Vec::with_capacity(rendered.len());
    for &id in &ids {
        let a = bytes.len();
        bytes.extend(s.tok.token_to_piece(id, true));
        spans.push((id, a, bytes.len()));
    }
    assert!(
        bytes == rendered.as_bytes(),
        "{}: tokens do not spell the prompt",
        t.name
    );

    let mut hostile = Vec::new();
    values.iter().for_each(|v| strings(v, &mut hostile));
    hostile.retain(|h| SPECIAL.iter().any(|sp| h.contains(sp)));
    for h in hostile {
        for (a, b) in occurrences(&rendered, h) {
            for &(id, ta, tb) in &spans {
                let special = id >= 256;
                assert!(
                    !(special && ta < b && a < tb),
                    "{}: special token {:?} at {ta}..{tb} inside request text {h:?} at {a}..{b}",
                    t.name,
                    &rendered[ta..tb]
                );
            }
        }
    }
});
