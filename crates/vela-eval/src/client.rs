//! The OpenAI-compatible client both drivers use: one streamed request per turn, every server
//! event timestamped on the run's clock.

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};
use std::io::BufRead;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Seconds since the run started (a trait so metric tests can drive time).
pub trait Clock: Send + Sync {
    fn now(&self) -> f64;
}

pub struct RealClock(pub Instant);

impl Clock for RealClock {
    fn now(&self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
}

/// A tool call assembled from streamed fragments.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// Token accounting the server reported (`usage`).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// `prompt_tokens_details.cached_tokens` (None when the server does not report it).
    pub cached_tokens: Option<usize>,
}

/// Everything observed of one request.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Trace {
    /// When the request was handed to the connection.
    pub sent: f64,
    /// Arrival of each event that carried output (text, reasoning or a tool-call fragment).
    pub token_events: Vec<f64>,
    /// When the stream ended (`[DONE]` or the connection closed after the last event).
    pub done: f64,
    pub content: String,
    pub reasoning: String,
    pub tool_calls: Vec<ToolCall>,
    pub finish_reason: Option<String>,
    pub usage: Option<Usage>,
    /// The server's `timings` object (vela, llama-server), when it sends one.
    pub timings: Option<Value>,
}

impl Trace {
    pub fn first_token(&self) -> Option<f64> {
        self.token_events.first().copied()
    }
}

/// An OpenAI-compatible endpoint.
pub struct Client {
    agent: ureq::Agent,
    base: String,
    api_key: Option<String>,
    pub model: String,
}

impl Client {
    /// `base` like `http://127.0.0.1:8080` (a trailing `/v1` is accepted); `model` None: the
    /// first model `/v1/models` lists.
    pub fn new(base: &str, api_key: Option<String>, model: Option<String>) -> Result<Client> {
        let base = base
            .trim_end_matches('/')
            .trim_end_matches("/v1")
            .to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            bail!("--url must start with http:// or https:// (got {base})");
        }
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(10)))
            // A long prefill sends nothing until its first token: no read timeout.
            .timeout_per_read(None)
            .build();
        let mut c = Client {
            agent: ureq::Agent::new_with_config(config),
            base,
            api_key,
            model: String::new(),
        };
        c.model = match model {
            Some(m) => m,
            None => c.first_model().unwrap_or_else(|_| "default".into()),
        };
        Ok(c)
    }

    fn first_model(&self) -> Result<String> {
        let mut req = self.agent.get(format!("{}/v1/models", self.base));
        if let Some(k) = &self.api_key {
            req = req.header("Authorization", format!("Bearer {k}"));
        }
        let mut resp = req.call()?;
        let v: Value = serde_json::from_reader(resp.body_mut().as_reader())?;
        v["data"][0]["id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow!("no model listed"))
    }

    /// Stream one request to `path` (`/v1/chat/completions` or `/v1/completions`); `abort` ends
    /// it early (the connection is dropped, which cancels the generation on vela's server);
    /// `first` is called when the first output arrives.
    pub fn stream(
        &self,
        path: &str,
        mut body: Value,
        clock: &dyn Clock,
        abort: &AtomicBool,
        first: &dyn Fn(),
    ) -> Result<Trace> {
        body["model"] = json!(self.model);
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let mut req = self
            .agent
            .post(format!("{}{path}", self.base))
            .header("Content-Type", "application/json");
        if let Some(k) = &self.api_key {
            req = req.header("Authorization", format!("Bearer {k}"));
        }
        let sent = clock.now();
        let mut resp = req
            .send(serde_json::to_vec(&body)?)
            .with_context(|| format!("request to {}{path}", self.base))?;
        let status = resp.status().as_u16();
        if status != 200 {
            let text = resp.body_mut().read_to_string().unwrap_or_default();
            bail!("server answered {status}: {}", text.trim());
        }
        let reader = std::io::BufReader::new(resp.into_body().into_reader());
        read_stream(reader, sent, clock, abort, first)
    }
}

/// Parse a server-sent-event stream of OpenAI chunks into a [`Trace`].
pub fn read_stream(
    reader: impl BufRead,
    sent: f64,
    clock: &dyn Clock,
    abort: &AtomicBool,
    first: &dyn Fn(),
) -> Result<Trace> {
    let mut t = Trace {
        sent,
        ..Trace::default()
    };
    for line in reader.lines() {
        if abort.load(Ordering::Relaxed) {
            bail!("aborted");
        }
        let line = line.context("reading the response stream")?;
        let Some(data) = line.strip_prefix("data:") else {
            continue;
        };
        let data = data.trim();
        if data == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(data)
            .with_context(|| format!("unparsable stream event: {data:.200}"))?;
        let now = clock.now();
        if let Some(e) = v.get("error") {
            bail!(
                "server error: {}",
                e["message"].as_str().unwrap_or(&e.to_string())
            );
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            let n = |k: &str| u[k].as_u64().unwrap_or(0) as usize;
            t.usage = Some(Usage {
                prompt_tokens: n("prompt_tokens"),
                completion_tokens: n("completion_tokens"),
                cached_tokens: u["prompt_tokens_details"]["cached_tokens"]
                    .as_u64()
                    .map(|x| x as usize),
            });
        }
        if let Some(tm) = v.get("timings").filter(|x| x.is_object()) {
            t.timings = Some(tm.clone());
        }
        let Some(c) = v["choices"].get(0) else {
            continue;
        };
        let mut output = false;
        let delta = &c["delta"];
        for (field, reasoning) in [
            (&delta["content"], false),
            (&delta["reasoning_content"], true),
            (&c["text"], false),
        ] {
            if let Some(s) = field.as_str().filter(|s| !s.is_empty()) {
                let out = if reasoning {
                    &mut t.reasoning
                } else {
                    &mut t.content
                };
                out.push_str(s);
                output = true;
            }
        }
        if let Some(calls) = delta["tool_calls"].as_array() {
            for call in calls {
                let i = call["index"].as_u64().unwrap_or(t.tool_calls.len() as u64) as usize;
                if i > 1024 {
                    bail!("tool call index {i} out of range");
                }
                if t.tool_calls.len() <= i {
                    t.tool_calls.resize(i + 1, ToolCall::default());
                }
                let tc = &mut t.tool_calls[i];
                if let Some(id) = call["id"].as_str() {
                    tc.id = id.to_string();
                }
                if let Some(n) = call["function"]["name"].as_str() {
                    tc.name.push_str(n);
                }
                if let Some(a) = call["function"]["arguments"].as_str() {
                    tc.arguments.push_str(a);
                }
                output = true;
            }
        }
        if output {
            if t.token_events.is_empty() {
                first();
            }
            t.token_events.push(now);
        }
        if let Some(f) = c["finish_reason"].as_str() {
            t.finish_reason = Some(f.to_string());
        }
    }
    t.done = clock.now();
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Each reading advances by 10 ms.
    struct Tick(Mutex<f64>);
    impl Clock for Tick {
        fn now(&self) -> f64 {
            let mut t = self.0.lock().unwrap();
            *t += 0.01;
            *t
        }
    }

    #[test]
    fn stream_events_are_assembled_and_timed() {
        let sse = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n",
            ": keep-alive comment\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"function\":{\"name\":\"get_\",\"arguments\":\"{\\\"a\\\"\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"name\":\"weather\",\"arguments\":\": 1}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}],\"timings\":{\"prompt_n\":5}}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":4,\"prompt_tokens_details\":{\"cached_tokens\":2}}}\n\n",
            "data: [DONE]\n\n",
        );
        let clock = Tick(Mutex::new(0.0));
        let t = read_stream(sse.as_bytes(), 0.0, &clock, &AtomicBool::new(false), &|| ()).unwrap();
        assert_eq!(t.content, "Hello");
        assert_eq!(
            t.tool_calls,
            [ToolCall {
                id: "c1".into(),
                name: "get_weather".into(),
                arguments: "{\"a\": 1}".into()
            }]
        );
        assert_eq!(t.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(
            t.usage,
            Some(Usage {
                prompt_tokens: 7,
                completion_tokens: 4,
                cached_tokens: Some(2)
            })
        );
        assert_eq!(t.timings.unwrap()["prompt_n"], 5);
        // Events 2..5 carried output (the role-only chunk did not).
        let ev: Vec<_> = t.token_events.iter().map(|x| (x * 100.0).round()).collect();
        assert_eq!(ev, [2.0, 3.0, 4.0, 5.0]);
        assert_eq!((t.done * 100.0).round(), 8.0);
    }

    #[test]
    fn errors_in_the_stream_are_reported() {
        let clock = RealClock(Instant::now());
        let no = AtomicBool::new(false);
        let e = read_stream(
            "data: {\"error\":{\"message\":\"prompt too long\"}}\n".as_bytes(),
            0.0,
            &clock,
            &no,
            &|| (),
        )
        .unwrap_err();
        assert!(format!("{e}").contains("prompt too long"));
        let e = read_stream("data: {nope\n".as_bytes(), 0.0, &clock, &no, &|| ()).unwrap_err();
        assert!(format!("{e}").contains("unparsable"));
        let e = read_stream(
            "data: {\"choices\":[]}\n".as_bytes(),
            0.0,
            &clock,
            &AtomicBool::new(true),
            &|| (),
        )
        .unwrap_err();
        assert!(format!("{e}").contains("aborted"));
    }
}
