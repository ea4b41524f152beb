//! Streaming parsing of generated text into content, reasoning and tool calls.
//!
//! The model's text arrives piece by piece. [`OutputParser`] is a state machine over a small
//! buffer: in plain text it looks for any *opener* marker (`<think>`, `<tool_call>`, ...); a
//! suffix of the buffer that could still become an opener is held back, everything before it is
//! emitted at once. Inside reasoning it emits text up to the closer (again holding back a
//! partial closer). Inside a tool block it buffers until the closer and then parses the whole
//! block with the family's parser; a block that does not parse is emitted as plain content with
//! its markers, so malformed tool syntax never becomes an error and text is never duplicated
//! between content and tool calls. Llama 3.x JSON calls have no markers: when the answer starts
//! with `{` (or `<|python_tag|>`), the whole answer is held and parsed at the end.
//!
//! Families are chosen from the chat template text ([`ParserConfig::from_template`]).
//!
//! Gemma 4 (templates with `<|channel>` / `<|tool_call>`), as llama.cpp's `peg-gemma4` parser
//! reads it: `<|channel>thought\n…<channel|>` is reasoning (trimmed at both ends); stray
//! `<|channel>` / `<channel|>` tokens (an empty trailing thought block, a lone closer) are
//! dropped; `<|tool_call>call:NAME{k:v,…}<tool_call|>` blocks become calls whose values are
//! `<|"|>`-delimited strings, numbers, booleans, null, `[…]` and `{…}`, converted to JSON (a
//! closer inside a delimited string does not end the block). Generation stops at the
//! `<|tool_response>` end-of-generation token, so it never reaches the parser.

use crate::tool_schema::ArgKinds;
use serde_json::{Map, Value};

/// A parsed tool call; `arguments` is JSON text of an object.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: String,
}

/// One piece of parsed output.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Content(String),
    Reasoning(String),
    ToolCall(ToolCall),
}

/// How a tool block's body is parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolSyntax {
    /// Hermes/Qwen JSON `{"name":..,"arguments":..}`, or GLM `NAME<arg_key>k</arg_key><arg_value>v</arg_value>`.
    HermesOrGlm,
    /// Gemma 4 `call:NAME{key:value,...}` with `<|"|>` string delimiters.
    Gemma4,
    /// DeepSeek V3.x `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>` (repeated).
    DeepSeekV3,
    /// DeepSeek DSML `<｜DSML｜invoke name="N"><｜DSML｜parameter name="k" string="true">v</...>`.
    Dsml,
}

/// Which markers to look for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParserConfig {
    /// Reasoning (open, close) markers.
    pub reasoning: Vec<(String, String)>,
    /// Tool block (open, close, syntax).
    pub tools: Vec<(String, String, ToolSyntax)>,
    /// Llama 3.x bare JSON calls.
    pub llama_json: bool,
    /// The prompt ended inside a reasoning block (generation prompt ends with `<think>`).
    pub start_in_reasoning: bool,
    /// Markers deleted from content when they appear outside any block (Gemma 4's stray
    /// `<|channel>` / `<channel|>` tokens, which llama.cpp's parser consumes too).
    pub drop: Vec<String>,
    /// Reasoning text is trimmed at both ends (Gemma 4 writes `<|channel>thought\n…\n<channel|>`;
    /// the template adds those newlines back when it re-renders `reasoning_content`).
    pub trim_reasoning: bool,
    /// The content right after a reasoning block loses its leading whitespace (`<think>…
    /// </think>\n\n`, as llama.cpp's parser returns it; the template writes it back).
    pub lstrip_after_reasoning: bool,
    /// Which arguments of the request's tools are strings (GLM / Qwen XML values).
    pub arg_kinds: ArgKinds,
}

const DSML_OPEN: &str = "<｜DSML｜tool_calls>";
const DSML_CLOSE: &str = "</｜DSML｜tool_calls>";
const DS_OPEN: &str = "<｜tool▁calls▁begin｜>";
const DS_CLOSE: &str = "<｜tool▁calls▁end｜>";
const PYTHON_TAG: &str = "<|python_tag|>";

impl ParserConfig {
    /// Pick parsers from a chat template's source. `tools_enabled` turns on tool parsing (only
    /// when the request defined tools).
    pub fn from_template(template: &str, tools_enabled: bool) -> ParserConfig {
        let mut c = ParserConfig::default();
        if template.contains("<think>") {
            c.reasoning.push(("<think>".into(), "</think>".into()));
            c.trim_reasoning = true;
            c.lstrip_after_reasoning = true;
        }
        if template.contains("<|channel>") {
            c.reasoning
                .push(("<|channel>thought".into(), "<channel|>".into()));
            c.drop = vec!["<|channel>".into(), "<channel|>".into()];
            c.trim_reasoning = true;
        }
        if !tools_enabled {
            return c;
        }
        if template.contains("<|tool_call>") {
            c.tools.push((
                "<|tool_call>".into(),
                "<tool_call|>".into(),
                ToolSyntax::Gemma4,
            ));
        } else if template.contains("DSML") {
            c.tools
                .push((DSML_OPEN.into(), DSML_CLOSE.into(), ToolSyntax::Dsml));
        } else if template.contains("tool▁calls▁begin") {
            c.tools
                .push((DS_OPEN.into(), DS_CLOSE.into(), ToolSyntax::DeepSeekV3));
        } else if template.contains("<tool_call>") {
            c.tools.push((
                "<tool_call>".into(),
                "</tool_call>".into(),
                ToolSyntax::HermesOrGlm,
            ));
            // Small Qwen2.5 models often answer with the bare JSON call, without the tags; GLM
            // templates never show a JSON call, so a JSON answer there is content.
            c.llama_json = !template.contains("<arg_key>");
        } else if template.contains("<|python_tag|>") || template.contains("\"parameters\"") {
            c.llama_json = true;
        }
        c
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Mode {
    Text,
    Reasoning(usize),
    Tool(usize),
    LlamaJson,
}

/// The streaming parser (see the module docs).
pub struct OutputParser {
    cfg: ParserConfig,
    buf: String,
    mode: Mode,
    /// Nothing but whitespace has been seen yet (Llama JSON detection).
    at_start: bool,
    /// Non-whitespace reasoning text has been emitted in the current block (trimming).
    reasoning_started: bool,
    /// A reasoning block just closed: drop the whitespace that starts the content.
    lstrip: bool,
}

/// What a marker found in plain text starts.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Marker {
    Reasoning(usize),
    Tool(usize),
    Drop,
}

/// Where a tool block's closer is: the first occurrence, except that Gemma 4 closers inside a
/// `<|"|>`-delimited string are skipped (an argument may quote the marker text).
fn find_closer(syn: ToolSyntax, buf: &str, close: &str) -> Option<usize> {
    if syn != ToolSyntax::Gemma4 {
        return buf.find(close);
    }
    let mut i = 0;
    loop {
        let rest = &buf[i..];
        let c = rest.find(close)?;
        match rest.find(G4_QUOTE) {
            Some(q) if q < c => {
                // Skip the whole string; an unterminated one means "not closed yet".
                let after = i + q + G4_QUOTE.len();
                let e = buf[after..].find(G4_QUOTE)?;
                i = after + e + G4_QUOTE.len();
            }
            _ => return Some(i + c),
        }
    }
}

/// Length of the longest suffix of `buf` that is a proper prefix of `marker`.
fn partial_suffix(buf: &str, marker: &str) -> usize {
    let max = marker.len().saturating_sub(1).min(buf.len());
    (1..=max)
        .rev()
        .find(|&k| buf.is_char_boundary(buf.len() - k) && marker.starts_with(&buf[buf.len() - k..]))
        .unwrap_or(0)
}

fn push_event(out: &mut Vec<Event>, e: Event) {
    match (&e, out.last_mut()) {
        (Event::Content(s), _) | (Event::Reasoning(s), _) if s.is_empty() => {}
        (Event::Content(s), Some(Event::Content(p))) => p.push_str(s),
        (Event::Reasoning(s), Some(Event::Reasoning(p))) => p.push_str(s),
        _ => out.push(e),
    }
}

impl OutputParser {
    pub fn new(cfg: ParserConfig) -> Self {
        let mode = if cfg.start_in_reasoning && !cfg.reasoning.is_empty() {
            Mode::Reasoning(0)
        } else {
            Mode::Text
        };
        OutputParser {
            cfg,
            buf: String::new(),
            mode,
            at_start: true,
            reasoning_started: false,
            lstrip: false,
        }
    }

    /// Every marker recognised in plain text, with what it starts.
    fn markers(&self) -> Vec<(String, Marker)> {
        let c = &self.cfg;
        let r = c.reasoning.iter().enumerate();
        let t = c.tools.iter().enumerate();
        r.map(|(i, (o, _))| (o.clone(), Marker::Reasoning(i)))
            .chain(t.map(|(i, (o, _, _))| (o.clone(), Marker::Tool(i))))
            .chain(c.drop.iter().map(|d| (d.clone(), Marker::Drop)))
            .collect()
    }

    /// Feed more generated text; returns what can be emitted now.
    pub fn push(&mut self, text: &str) -> Vec<Event> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        self.step(&mut out, false);
        out
    }

    /// End of generation: everything still held is resolved.
    pub fn finish(&mut self) -> Vec<Event> {
        let mut out = Vec::new();
        self.step(&mut out, true);
        let rest = std::mem::take(&mut self.buf);
        match self.mode.clone() {
            Mode::Text => push_event(&mut out, Event::Content(rest)),
            Mode::Reasoning(_) => push_event(&mut out, Event::Reasoning(rest)),
            Mode::Tool(i) => {
                // Ended (EOS) before the closer: accept the block if it parses.
                let (open, _, syn) = &self.cfg.tools[i];
                match parse_block(*syn, &rest, &self.cfg.arg_kinds) {
                    Some(calls) => calls.into_iter().for_each(|c| out.push(Event::ToolCall(c))),
                    None => push_event(&mut out, Event::Content(format!("{open}{rest}"))),
                }
            }
            Mode::LlamaJson => match parse_llama_json(&rest) {
                Some(calls) => calls.into_iter().for_each(|c| out.push(Event::ToolCall(c))),
                None => push_event(&mut out, Event::Content(rest)),
            },
        }
        self.mode = Mode::Text;
        out
    }

    fn step(&mut self, out: &mut Vec<Event>, finishing: bool) {
        loop {
            match self.mode.clone() {
                Mode::Text => {
                    if self.lstrip {
                        let lead = self.buf.len() - self.buf.trim_start().len();
                        self.buf.drain(..lead);
                        if self.buf.is_empty() {
                            return;
                        }
                        self.lstrip = false;
                    }
                    if self.at_start && self.cfg.llama_json {
                        let t = self.buf.trim_start();
                        if t.is_empty() {
                            return;
                        }
                        // A call fenced as a JSON code block (small Qwen2.5 models): wait
                        // for the fence's line and what follows it to decide.
                        if t.starts_with('`') {
                            match fenced_json_start(t) {
                                None if !finishing => return,
                                Some(true) => {
                                    self.at_start = false;
                                    self.mode = Mode::LlamaJson;
                                    continue;
                                }
                                _ => {}
                            }
                        }
                        // A partial `<|python_tag|>` decides nothing yet either.
                        if !finishing && t.len() < PYTHON_TAG.len() && PYTHON_TAG.starts_with(t) {
                            return;
                        }
                        self.at_start = false;
                        if t.starts_with('{') || t.starts_with(PYTHON_TAG) {
                            self.mode = Mode::LlamaJson;
                            continue;
                        }
                    }
                    // Earliest marker; at equal positions the longest, and a longer opener
                    // that could still complete (`<|channel>` + `thought`) is waited for.
                    let markers = self.markers();
                    let Some(p) = markers
                        .iter()
                        .filter_map(|(m, _)| self.buf.find(m.as_str()))
                        .min()
                    else {
                        if finishing {
                            return;
                        }
                        let hold = markers
                            .iter()
                            .map(|(m, _)| partial_suffix(&self.buf, m))
                            .max()
                            .unwrap_or(0);
                        let emit = self.buf.len() - hold;
                        push_event(out, Event::Content(self.buf[..emit].to_string()));
                        self.buf.drain(..emit);
                        return;
                    };
                    let at = &self.buf[p..];
                    let pending = markers
                        .iter()
                        .any(|(m, _)| m.len() > at.len() && m.starts_with(at));
                    push_event(out, Event::Content(self.buf[..p].to_string()));
                    self.buf.drain(..p);
                    if pending && !finishing {
                        return;
                    }
                    let (m, kind) = markers
                        .into_iter()
                        .filter(|(m, _)| self.buf.starts_with(m.as_str()))
                        .max_by_key(|(m, _)| m.len())
                        .expect("a marker matched here");
                    self.buf.drain(..m.len());
                    self.mode = match kind {
                        Marker::Reasoning(i) => Mode::Reasoning(i),
                        Marker::Tool(i) => Mode::Tool(i),
                        Marker::Drop => Mode::Text,
                    };
                    self.reasoning_started = false;
                    continue;
                }
                Mode::Reasoning(i) => {
                    let close = self.cfg.reasoning[i].1.clone();
                    let trim = self.cfg.trim_reasoning;
                    if trim && !self.reasoning_started {
                        let lead = self.buf.len() - self.buf.trim_start().len();
                        self.buf.drain(..lead);
                        if self.buf.is_empty() {
                            return;
                        }
                        self.reasoning_started = true;
                    }
                    if let Some(p) = self.buf.find(&close) {
                        let text = &self.buf[..p];
                        let text = if trim { text.trim_end() } else { text };
                        push_event(out, Event::Reasoning(text.to_string()));
                        self.buf.drain(..p + close.len());
                        self.mode = Mode::Text;
                        self.lstrip = self.cfg.lstrip_after_reasoning;
                        continue;
                    }
                    if finishing {
                        if trim {
                            let keep = self.buf.trim_end().len();
                            self.buf.truncate(keep);
                        }
                        return;
                    }
                    let mut emit = self.buf.len() - partial_suffix(&self.buf, &close);
                    if trim {
                        // Trailing whitespace may turn out to precede the closer.
                        emit = self.buf[..emit].trim_end().len();
                    }
                    push_event(out, Event::Reasoning(self.buf[..emit].to_string()));
                    self.buf.drain(..emit);
                    return;
                }
                Mode::Tool(i) => {
                    let (open, close, syn) = self.cfg.tools[i].clone();
                    let Some(p) = find_closer(syn, &self.buf, &close) else {
                        return;
                    };
                    let body = self.buf[..p].to_string();
                    self.buf.drain(..p + close.len());
                    match parse_block(syn, &body, &self.cfg.arg_kinds) {
                        Some(calls) => calls.into_iter().for_each(|c| out.push(Event::ToolCall(c))),
                        None => push_event(out, Event::Content(format!("{open}{body}{close}"))),
                    }
                    self.mode = Mode::Text;
                }
                Mode::LlamaJson => return,
            }
        }
    }
}

/// Parse one tool block body (argument types from `kinds`); `None` when malformed.
pub fn parse_block(syn: ToolSyntax, body: &str, kinds: &ArgKinds) -> Option<Vec<ToolCall>> {
    match syn {
        ToolSyntax::HermesOrGlm => {
            let t = body.trim();
            if t.starts_with('{') {
                parse_json_call(t, &["arguments", "parameters"]).map(|c| vec![c])
            } else if t.starts_with("<function=") {
                parse_qwen_xml(t, kinds).map(|c| vec![c])
            } else {
                parse_glm(t, kinds).map(|c| vec![c])
            }
        }
        ToolSyntax::Gemma4 => parse_gemma4(body.trim()).map(|c| vec![c]),
        ToolSyntax::DeepSeekV3 => parse_deepseek_v3(body),
        ToolSyntax::Dsml => parse_dsml(body),
    }
}

/// `{"name": N, "arguments"|"parameters": {...}}`; arguments may also be a JSON string.
fn parse_json_call(t: &str, arg_keys: &[&str]) -> Option<ToolCall> {
    let v: Value = serde_json::from_str(t).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let args = arg_keys
        .iter()
        .find_map(|k| v.get(*k))
        .cloned()
        .unwrap_or(Value::Object(Map::new()));
    let args = match args {
        Value::String(s) => serde_json::from_str::<Value>(&s)
            .ok()
            .filter(Value::is_object)?,
        Value::Object(_) => args,
        _ => return None,
    };
    Some(ToolCall {
        name,
        arguments: args.to_string(),
    })
}

/// Whether text starting with a backtick opens a fenced JSON block: Some(true) for ```` ``` ```` or
/// ```` ```json ```` followed by `{`, Some(false) when it cannot be one, None while undecided.
fn fenced_json_start(t: &str) -> Option<bool> {
    let Some(rest) = t.strip_prefix("```") else {
        return if "```".starts_with(t) {
            None
        } else {
            Some(false)
        };
    };
    let (tag, body) = rest.split_once('\n')?;
    if !matches!(tag.trim(), "" | "json") {
        return Some(false);
    }
    body.trim_start().chars().next().map(|c| c == '{')
}

/// Llama 3.x: the whole answer is one call or several separated by `;` (optionally fenced as a
/// JSON code block).
pub fn parse_llama_json(text: &str) -> Option<Vec<ToolCall>> {
    let t = text.trim();
    let t = t.strip_prefix(PYTHON_TAG).unwrap_or(t).trim();
    let t = match t.strip_prefix("```") {
        Some(r) => {
            let (tag, body) = r.split_once('\n')?;
            if !matches!(tag.trim(), "" | "json") {
                return None;
            }
            body.trim_end().strip_suffix("```")?.trim()
        }
        None => t,
    };
    if let Some(c) = parse_json_call(t, &["parameters", "arguments"]) {
        return Some(vec![c]);
    }
    let calls: Option<Vec<ToolCall>> = t
        .split(';')
        .filter(|s| !s.trim().is_empty())
        .map(|s| parse_json_call(s.trim(), &["parameters", "arguments"]))
        .collect();
    calls.filter(|c| !c.is_empty())
}

/// A value written by a template as-is: JSON if it parses, else a string.
fn loose_value(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.to_string()))
}

/// GLM: `NAME<arg_key>k</arg_key><arg_value>v</arg_value>...` (GLM 4.5/4.6 put newlines between
/// the parts). A value is the raw text for a string parameter, JSON for another declared one
/// (the template writes non-strings with `tojson`), JSON-if-it-parses for an undeclared one.
fn parse_glm(t: &str, kinds: &ArgKinds) -> Option<ToolCall> {
    let (name, mut rest) = match t.find("<arg_key>") {
        Some(p) => (t[..p].trim(), &t[p..]),
        None => (t, ""),
    };
    if name.is_empty() || name.contains(['<', '>', '{', '\n']) {
        return None;
    }
    let mut args = Map::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        let r = rest.strip_prefix("<arg_key>")?;
        let ke = r.find("</arg_key>")?;
        let key = r[..ke].trim().to_string();
        let r = r[ke + "</arg_key>".len()..]
            .trim_start()
            .strip_prefix("<arg_value>")?;
        let ve = r.find("</arg_value>")?;
        let value = kinds.value(name, &key, &r[..ve], loose_value);
        args.insert(key, value);
        rest = &r[ve + "</arg_value>".len()..];
    }
    Some(ToolCall {
        name: name.to_string(),
        arguments: Value::Object(args).to_string(),
    })
}

/// Qwen3-Coder / Qwen3.5: `<function=NAME>` then `<parameter=KEY>\nVALUE\n</parameter>` blocks
/// and `</function>`. A value is typed by the tool's schema (see `parse_glm`); an undeclared one
/// is JSON when it parses as a number, boolean, null, object or array (the template writes those
/// with `tojson`), otherwise the string between the newlines.
fn parse_qwen_xml(t: &str, kinds: &ArgKinds) -> Option<ToolCall> {
    let r = t.strip_prefix("<function=")?;
    let ne = r.find('>')?;
    let name = r[..ne].trim();
    if name.is_empty() || name.contains(['<', '\n']) {
        return None;
    }
    let body = r[ne + 1..].trim_end();
    let mut rest = body.strip_suffix("</function>")?;
    let mut args = Map::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        let r = rest.strip_prefix("<parameter=")?;
        let ke = r.find('>')?;
        let key = r[..ke].trim().to_string();
        let r = &r[ke + 1..];
        let ve = r.find("</parameter>")?;
        let raw = r[..ve].strip_prefix('\n').unwrap_or(&r[..ve]);
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        let value = kinds.value(name, &key, raw, |raw| match serde_json::from_str(raw) {
            Ok(v) if !Value::is_string(&v) => v,
            _ => Value::String(raw.to_string()),
        });
        args.insert(key, value);
        rest = &r[ve + "</parameter>".len()..];
    }
    Some(ToolCall {
        name: name.to_string(),
        arguments: Value::Object(args).to_string(),
    })
}

/// DeepSeek V3.x: calls between `<｜tool▁call▁begin｜>` and `<｜tool▁call▁end｜>`.
fn parse_deepseek_v3(body: &str) -> Option<Vec<ToolCall>> {
    const B: &str = "<｜tool▁call▁begin｜>";
    const S: &str = "<｜tool▁sep｜>";
    const E: &str = "<｜tool▁call▁end｜>";
    let mut calls = Vec::new();
    let mut rest = body.trim();
    while !rest.is_empty() {
        let r = rest.strip_prefix(B)?;
        let e = r.find(E)?;
        let (name, args) = r[..e].split_once(S)?;
        // V3 (not V3.1) writes `function<｜tool▁sep｜>NAME\n```json\nARGS\n```.
        let (name, args) = if name.trim() == "function" {
            let (n, a) = args.split_once('\n')?;
            (
                n,
                a.trim()
                    .trim_start_matches("```json")
                    .trim_end_matches("```"),
            )
        } else {
            (name, args)
        };
        let v: Value = serde_json::from_str(args.trim())
            .ok()
            .filter(Value::is_object)?;
        calls.push(ToolCall {
            name: name.trim().to_string(),
            arguments: v.to_string(),
        });
        rest = r[e + E.len()..].trim();
    }
    (!calls.is_empty()).then_some(calls)
}

/// DeepSeek DSML invoke/parameter blocks.
fn parse_dsml(body: &str) -> Option<Vec<ToolCall>> {
    const INV: &str = "<｜DSML｜invoke name=\"";
    const INV_END: &str = "</｜DSML｜invoke>";
    const PAR: &str = "<｜DSML｜parameter name=\"";
    const PAR_END: &str = "</｜DSML｜parameter>";
    let mut calls = Vec::new();
    let mut rest = body.trim();
    // Each marker is searched after the previous one: an end marker inside a name or a key
    // makes the block malformed instead of a reversed slice.
    while !rest.is_empty() {
        let r = rest.strip_prefix(INV)?;
        let q = r.find("\">")?;
        let name = r[..q].to_string();
        let body = &r[q + 2..];
        let e = body.find(INV_END)?;
        let mut inner = body[..e].trim();
        let mut args = Map::new();
        while !inner.is_empty() {
            let p = inner.strip_prefix(PAR)?;
            let q = p.find('"')?;
            let key = p[..q].to_string();
            let attrs_end = q + p[q..].find('>')?;
            let is_string = p[q..attrs_end].contains("string=\"true\"");
            let value = &p[attrs_end + 1..];
            let ve = value.find(PAR_END)?;
            let raw = &value[..ve];
            let val = if is_string {
                Value::String(raw.to_string())
            } else {
                loose_value(raw)
            };
            args.insert(key, val);
            inner = value[ve + PAR_END.len()..].trim();
        }
        calls.push(ToolCall {
            name,
            arguments: Value::Object(args).to_string(),
        });
        rest = body[e + INV_END.len()..].trim();
    }
    (!calls.is_empty()).then_some(calls)
}

/// Gemma 4: `call:NAME{key:value,...}`.
fn parse_gemma4(t: &str) -> Option<ToolCall> {
    let r = t.strip_prefix("call:")?;
    let b = r.find('{')?;
    let name = r[..b].trim();
    if name.is_empty() {
        return None;
    }
    let mut p = G4 { s: &r[b..], i: 0 };
    let v = p.value(true)?;
    p.ws();
    if p.i != p.s.len() || !v.is_object() {
        return None;
    }
    Some(ToolCall {
        name: name.to_string(),
        arguments: v.to_string(),
    })
}

const G4_QUOTE: &str = "<|\"|>";

/// Recursive-descent reader of Gemma 4's argument syntax.
struct G4<'a> {
    s: &'a str,
    i: usize,
}

impl G4<'_> {
    fn rest(&self) -> &str {
        &self.s[self.i..]
    }
    fn ws(&mut self) {
        let r = self.rest();
        self.i += r.len() - r.trim_start().len();
    }
    fn eat(&mut self, c: char) -> bool {
        self.ws();
        if self.rest().starts_with(c) {
            self.i += c.len_utf8();
            true
        } else {
            false
        }
    }
    fn quoted(&mut self) -> Option<String> {
        let r = self.rest().strip_prefix(G4_QUOTE)?;
        let e = r.find(G4_QUOTE)?;
        let out = r[..e].to_string();
        self.i += G4_QUOTE.len() * 2 + e;
        Some(out)
    }
    /// A key: quoted or bare up to `:`.
    fn key(&mut self) -> Option<String> {
        self.ws();
        if self.rest().starts_with(G4_QUOTE) {
            return self.quoted();
        }
        let e = self.rest().find(':')?;
        let k = self.rest()[..e].trim().to_string();
        self.i += e;
        (!k.is_empty() && !k.contains([',', '{', '}'])).then_some(k)
    }
    fn value(&mut self, top: bool) -> Option<Value> {
        self.ws();
        let s = self.s;
        let r = &s[self.i..];
        if r.starts_with(G4_QUOTE) {
            return self.quoted().map(Value::String);
        }
        if r.starts_with('{') {
            self.i += 1;
            let mut m = Map::new();
            if self.eat('}') {
                return Some(Value::Object(m));
            }
            loop {
                let k = self.key()?;
                if !self.eat(':') {
                    return None;
                }
                let v = self.value(false)?;
                m.insert(k, v);
                if self.eat(',') {
                    continue;
                }
                if self.eat('}') {
                    return Some(Value::Object(m));
                }
                return None;
            }
        }
        if top {
            return None;
        }
        if r.starts_with('[') {
            self.i += 1;
            let mut a = Vec::new();
            if self.eat(']') {
                return Some(Value::Array(a));
            }
            loop {
                a.push(self.value(false)?);
                if self.eat(',') {
                    continue;
                }
                if self.eat(']') {
                    return Some(Value::Array(a));
                }
                return None;
            }
        }
        // Un-delimited scalar: up to the next `,` `}` `]` at this level.
        let e = r.find([',', '}', ']']).unwrap_or(r.len());
        let raw = r[..e].trim();
        if raw.is_empty() {
            return None;
        }
        self.i += e;
        Some(match raw {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            "null" => Value::Null,
            _ => raw
                .parse::<i64>()
                .map(Value::from)
                .or_else(|_| raw.parse::<f64>().map(Value::from))
                .unwrap_or_else(|_| Value::String(raw.to_string())),
        })
    }
}

#[cfg(test)]
#[path = "parser_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "parser_gemma4_tests.rs"]
mod gemma4_tests;

#[cfg(test)]
#[path = "parser_glm_tests.rs"]
mod glm_tests;
