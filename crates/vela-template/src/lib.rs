//! Chat templates rendered byte-identically to HF transformers' `apply_chat_template`.
//!
//! HF renders the Jinja chat template with Python jinja2 in an
//! `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
//! extensions=[AssistantTracker, loopcontrols])` with a custom `tojson` filter
//! (`json.dumps(x, ensure_ascii=False, indent, separators, sort_keys)`) and the globals
//! `raise_exception`, `strftime_now`, `dict` and `namespace`. [`ChatTemplate`] reproduces that on
//! [`minijinja`]:
//!
//! * the same block-whitespace rules (`trim_blocks`, `lstrip_blocks`, trailing newline of the
//!   source dropped), `break`/`continue`, `loop.previtem`/`nextitem`;
//! * Python `str`/`dict`/`list` methods (`.strip()`, `.split()`, `.items()`, `.get()`, ...) via
//!   `minijinja-contrib`'s pycompat callback;
//! * values printed with Python's `str()` (`None`, `True`, `1.0`, `{'k': 'v'}`), `|string` as
//!   Python `str()` and `|tojson` as Python `json.dumps` (see [`pyfmt`]);
//! * HF's `{% generation %}...{% endgeneration %}` tag (assistant-mask tracking) renders its body
//!   unchanged; it is rewritten to a scoping `{% with %}` block before parsing;
//! * the context HF builds: messages with `None`-valued keys dropped and the reasoning field
//!   aliased (`thinking` = `reasoning_content`), `tools` (`none` when not given, as HF passes
//!   `tools=None`), `documents=none`, `add_generation_prompt`, `bos_token`, `eos_token`, then the
//!   caller's extra kwargs (which override the special tokens, as in HF).
//!
//! Known differences from jinja2 (none hit by the golden corpus except the first):
//! * `Markup + str` auto-escaping: in jinja2 `"x"|safe + y` HTML-escapes `y`; MiniJinja's `+`
//!   drops the safe marking (only `meetkai-functionary-medium-v3.1` relies on this);
//! * `~` concatenation of lists/dicts uses MiniJinja's formatting instead of Python `repr`;
//! * `strftime_now` reads UTC, not the local time zone (inject a [`Clock`] if it matters);
//! * HF's `continue_final_message` and assistant-mask tracking are not implemented.
//!
//! Rendering never interprets control tokens: a user message containing `<|im_end|>` is copied
//! verbatim into the prompt. Deciding whether such text becomes a special token is the
//! tokenizer's job (HF's `sanitize_control_tokens` option lives there, not here).

pub mod clock;
mod loader;
mod pyfilters;
pub mod pyfmt;

pub use clock::{fixed_clock, system_clock, Clock, DateTime};
pub use loader::{
    load_model_dir, read_chat_template_jinja, read_tokenizer_config, TemplateSet,
    TokenizerConfigTemplates,
};

use anyhow::{anyhow, Result};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, Value};
use serde_json::{Map, Value as Json};

const TEMPLATE_NAME: &str = "chat_template";

/// One `apply_chat_template` call.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct RenderRequest {
    /// OpenAI-style list of messages: `role` (system/user/assistant/tool), `content` (string or
    /// list of parts), assistant `tool_calls`, tool `tool_call_id`/`name`, `reasoning_content`.
    pub messages: Json,
    /// Tool (function) definitions; passed as `tools` (`none` when absent, like HF).
    #[serde(default)]
    pub tools: Option<Json>,
    /// Append the assistant turn header.
    #[serde(default)]
    pub add_generation_prompt: bool,
    /// Extra template kwargs (e.g. `enable_thinking`), merged into the context last.
    #[serde(default)]
    pub extra: Map<String, Json>,
}

/// A compiled chat template plus the special tokens it is rendered with.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

/// Error source that marks a template's own `raise_exception(msg)` call.
#[derive(Debug)]
struct RaisedException(String);

impl std::fmt::Display for RaisedException {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedException {}

/// Instructions a render may take ([`minijinja::Environment::set_fuel`]).
pub const FUEL: u64 = 20_000_000;

impl ChatTemplate {
    /// Compile `source` with the HF-compatible environment; `strftime_now` uses the system clock
    /// (see [`ChatTemplate::with_clock`]).
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        // A template comes from a model file: one that loops without end (nested `range`s) must
        // end in an error, not hold the server. Real templates over long conversations with tools
        // take well under a million instructions (`real_templates_stay_within_fuel`).
        env.set_fuel(Some(FUEL));
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(|out, _state, value| {
            out.write_str(&pyfmt::py_str(value))
                .map_err(|_| Error::new(ErrorKind::WriteFailure, "failed to write output"))
        });
        pyfilters::register(&mut env);
        env.add_function("raise_exception", |msg: Value| -> Result<Value, Error> {
            let msg = pyfmt::py_str(&msg);
            Err(Error::new(ErrorKind::InvalidOperation, msg.clone())
                .with_source(RaisedException(msg)))
        });
        let mut tpl = ChatTemplate {
            env,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
        };
        tpl.set_clock(system_clock());
        tpl.env
            .add_template_owned(TEMPLATE_NAME, rewrite_generation_tags(source))
            .map_err(|e| anyhow!("chat template does not compile: {}", one_line(&e)))?;
        Ok(tpl)
    }

    /// Replace the clock behind `strftime_now` (tests use a fixed time).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.set_clock(clock);
        self
    }

    fn set_clock(&mut self, clock: Clock) {
        self.env
            .add_function("strftime_now", move |fmt: &str| clock().strftime(fmt));
    }

    /// The BOS token string passed to the template as `bos_token`.
    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    /// The EOS token string passed to the template as `eos_token`.
    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// Render the prompt text. A template's `raise_exception(msg)` becomes `Err` whose message is
    /// exactly `msg`; other failures are one-line errors naming the template location.
    pub fn render(&self, req: &RenderRequest) -> Result<String> {
        let ctx = self.context(req)?;
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| anyhow!("{}", one_line(&e)))?;
        // MiniJinja 2.24 panics on a reverse slice of an empty sequence or string
        // (`messages[::-1]` with no messages, as the Qwen3 templates write): a panic inside the
        // engine becomes an error, never a crash of the caller.
        let rendered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tmpl.render(ctx)))
            .map_err(|_| anyhow!("chat template render error: the template engine panicked"))?;
        rendered.map_err(|e| {
            let mut src: Option<&(dyn std::error::Error + 'static)> = Some(&e);
            while let Some(s) = src {
                if let Some(raised) = s.downcast_ref::<RaisedException>() {
                    return anyhow!("{}", raised.0);
                }
                src = s.source();
            }
            if e.kind() == ErrorKind::OutOfFuel {
                return anyhow!(
                    "chat template render error: the template did not finish within {FUEL} steps"
                );
            }
            anyhow!("chat template render error: {}", one_line(&e))
        })
    }

    /// The template context, built the way HF's `apply_chat_template` builds it.
    fn context(&self, req: &RenderRequest) -> Result<Value> {
        let msgs = req
            .messages
            .as_array()
            .ok_or_else(|| anyhow!("chat template: `messages` must be a JSON array"))?;
        let mut messages = Vec::with_capacity(msgs.len());
        for (i, m) in msgs.iter().enumerate() {
            let obj = m
                .as_object()
                .ok_or_else(|| anyhow!("chat template: message {i} is not a JSON object"))?;
            messages.push(Json::Object(prepare_message(obj)));
        }
        let mut ctx = Map::new();
        ctx.insert("messages".into(), Json::Array(messages));
        ctx.insert("tools".into(), req.tools.clone().unwrap_or(Json::Null));
        ctx.insert("documents".into(), Json::Null);
        ctx.insert(
            "add_generation_prompt".into(),
            Json::Bool(req.add_generation_prompt),
        );
        ctx.insert("bos_token".into(), Json::String(self.bos_token.clone()));
        ctx.insert("eos_token".into(), Json::String(self.eos_token.clone()));
        for (k, v) in &req.extra {
            ctx.insert(k.clone(), v.clone());
        }
        Ok(Value::from_serialize(&ctx))
    }
}

/// Reasoning field names, the first being the one templates read (HF `_REASONING_FIELDS`).
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// HF: drop `None`-valued keys, then when any reasoning field is set, the message becomes
/// `{"thinking": r, **message, "reasoning_content": r}` (Python dict-merge key order).
fn prepare_message(msg: &Map<String, Json>) -> Map<String, Json> {
    let msg: Map<String, Json> = msg
        .iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let Some(reasoning) = REASONING_FIELDS.iter().find_map(|k| msg.get(*k)).cloned() else {
        return msg;
    };
    let mut out = Map::new();
    out.insert("thinking".into(), reasoning.clone());
    for (k, v) in msg {
        out.insert(k, v);
    }
    out.insert("reasoning_content".into(), reasoning);
    out
}

/// Rewrite HF's `{% generation %}` / `{% endgeneration %}` extension tags (which only track
/// assistant spans and render their body unchanged) into `{% with %}` / `{% endwith %}`: also a
/// scoped block, so whitespace control and variable scoping are identical.
fn rewrite_generation_tags(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(pos) = rest.find("{%") {
        out.push_str(&rest[..pos]);
        let tag = &rest[pos..];
        let mut i = 2;
        if tag[i..].starts_with(['-', '+']) {
            i += 1;
        }
        let ws = tag[i..].len() - tag[i..].trim_start().len();
        let name_start = i + ws;
        let name_len = tag[name_start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tag.len() - name_start);
        let name = &tag[name_start..name_start + name_len];
        let after = tag[name_start + name_len..].trim_start();
        let closes =
            after.starts_with("%}") || after.starts_with("-%}") || after.starts_with("+%}");
        let replacement = match name {
            "generation" if closes => Some("with"),
            "endgeneration" if closes => Some("endwith"),
            _ => None,
        };
        match replacement {
            Some(r) => {
                out.push_str(&tag[..name_start]);
                out.push_str(r);
                rest = &tag[name_start + name_len..];
            }
            None => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// A MiniJinja error on one line (kind, detail and template location).
fn one_line(e: &Error) -> String {
    e.to_string().replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn generation_tags_become_with_blocks() {
        let src = "a{%- generation -%}b{% endgeneration %}{%generation%}{% generations %}";
        assert_eq!(
            rewrite_generation_tags(src),
            "a{%- with -%}b{% endwith %}{%with%}{% generations %}"
        );
    }

    /// Fuzz finding (chat_template): `messages[::-1]` over no messages panicked inside
    /// MiniJinja (reachable from `/v1/messages` with only thinking blocks); it is an error.
    #[test]
    fn engine_panic_is_an_error() {
        let t = ChatTemplate::new(
            "{% for m in messages[::-1] %}{{ m.role }}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        let req = |messages| RenderRequest {
            messages,
            ..Default::default()
        };
        let e = t.render(&req(json!([]))).unwrap_err().to_string();
        assert!(e.contains("engine panicked"), "{e}");
        let ok = t.render(&req(json!([{"role": "a"}, {"role": "b"}])));
        assert_eq!(ok.unwrap(), "ba");
    }

    /// A template from a hostile model file that would loop for ~10^15 steps ends in an error
    /// within the fuel, quickly.
    #[test]
    fn endless_template_is_an_error() {
        let src = "{% for a in range(99999) %}{% for b in range(99999) %}\
                   {% for c in range(99999) %}x{% endfor %}{% endfor %}{% endfor %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let t0 = std::time::Instant::now();
        let req = RenderRequest {
            messages: json!([]),
            ..Default::default()
        };
        let e = t.render(&req).unwrap_err().to_string();
        assert!(e.contains("did not finish"), "{e}");
        assert!(t0.elapsed().as_secs() < 30, "{:?}", t0.elapsed());
    }

    #[test]
    fn reasoning_alias_and_null_drop() {
        let m = json!({"role": "assistant", "content": "x", "tool_calls": null, "reasoning": "r"});
        let p = prepare_message(m.as_object().unwrap());
        let keys: Vec<&str> = p.keys().map(|k| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "thinking",
                "role",
                "content",
                "reasoning",
                "reasoning_content"
            ]
        );
        assert_eq!(p["reasoning_content"], "r");
    }
}
