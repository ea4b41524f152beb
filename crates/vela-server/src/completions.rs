//! `POST /v1/completions` (OpenAI legacy completions): a raw prompt or a batch of them, stream
//! and non-stream.

use crate::error::ApiError;
use crate::http::{
    body_bytes, check_model, collect, data, json_with_usage, new_id, openai_err, sse_response_many,
    submit_openai, unix_now, Prepared, St,
};
use crate::openai::{timings_json, usage_json};
use crate::parser::ParserConfig;
use crate::request::{get_bool, get_uint, parse_common, parse_object, GenParams, Obj};
use crate::worker::{Out, TokenLogprob, Usage};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::Response;
use serde_json::{json, Value};
use std::time::Instant;

/// Tokens generated when a completion request gives no `max_tokens` (OpenAI's default).
pub const DEFAULT_MAX_TOKENS: usize = 16;

/// The prompt of a `/v1/completions` body.
#[derive(Debug, Clone, PartialEq)]
pub enum CompletionPrompt {
    /// Text, tokenized with special-token parsing (the client owns the whole prompt).
    Text(String),
    /// Token ids, each below the vocabulary size.
    Ids(Vec<u32>),
}

/// Token ids below `n_vocab`, or None.
fn ids_of(a: &[Value], n_vocab: usize) -> Option<Vec<u32>> {
    a.iter()
        .map(|v| v.as_u64().filter(|&i| i < n_vocab as u64).map(|i| i as u32))
        .collect()
}

/// `prompt`: a string, a list of strings, a list of token ids, or a list of such lists (one
/// choice per prompt).
fn parse_prompts(v: Option<&Value>, n_vocab: usize) -> Result<Vec<CompletionPrompt>, ApiError> {
    let shape = || {
        ApiError::bad(
            "prompt",
            "`prompt` must be a string, a list of strings, a list of token ids or a list of \
             token-id lists",
        )
    };
    let ids = |a: &[Value]| {
        ids_of(a, n_vocab).ok_or_else(|| {
            ApiError::bad(
                "prompt",
                format!("token ids must be integers below {n_vocab}"),
            )
        })
    };
    match v {
        Some(Value::String(s)) => Ok(vec![CompletionPrompt::Text(s.clone())]),
        Some(Value::Array(a)) if a.is_empty() => Err(shape()),
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => Ok(a
            .iter()
            .map(|s| CompletionPrompt::Text(s.as_str().unwrap_or_default().to_string()))
            .collect()),
        Some(Value::Array(a)) if a.iter().all(Value::is_number) => {
            Ok(vec![CompletionPrompt::Ids(ids(a)?)])
        }
        Some(Value::Array(a)) if a.iter().all(Value::is_array) => a
            .iter()
            .map(|p| match p.as_array() {
                Some(p) if !p.is_empty() && p.iter().all(Value::is_number) => {
                    Ok(CompletionPrompt::Ids(ids(p)?))
                }
                _ => Err(shape()),
            })
            .collect(),
        _ => Err(shape()),
    }
}

/// Validate a `/v1/completions` body: everything but `model`; `n_vocab` bounds `logit_bias`
/// and prompt ids. `max_tokens` stays `None` when absent ([`DEFAULT_MAX_TOKENS`] then).
pub fn validate_completion(
    o: &Obj,
    n_vocab: usize,
) -> Result<(GenParams, Vec<CompletionPrompt>), ApiError> {
    let mut params = parse_common(o, n_vocab, &["max_tokens"])?;
    if let Some(n) = o.get("logprobs").filter(|v| !v.is_null()) {
        let n = n
            .as_u64()
            .filter(|&n| n <= 20)
            .ok_or_else(|| ApiError::bad("logprobs", "`logprobs` must be an integer 0..=20"))?;
        params.logprobs = Some(n as usize);
    }
    if get_bool(o, "echo")?.unwrap_or(false) {
        return Err(ApiError::bad("echo", "`echo` is not supported"));
    }
    if o.get("suffix").is_some_and(|v| !v.is_null()) {
        return Err(ApiError::bad("suffix", "`suffix` is not supported"));
    }
    if get_uint(o, "best_of", 1 << 20)?.is_some_and(|b| b != 1) {
        return Err(ApiError::bad("best_of", "only best_of=1 is supported"));
    }
    let prompts = parse_prompts(o.get("prompt"), n_vocab)?;
    Ok((params, prompts))
}

fn completion_logprobs(l: &[TokenLogprob]) -> Value {
    let mut off = 0usize;
    let mut offsets = Vec::new();
    for t in l {
        offsets.push(off);
        off += t.token.len();
    }
    json!({
        "tokens": l.iter().map(|t| &t.token).collect::<Vec<_>>(),
        "token_logprobs": l.iter().map(|t| t.logprob).collect::<Vec<_>>(),
        "top_logprobs": l.iter().map(|t| t.top.iter().map(|(s, _, p)| (s.clone(), json!(p))).collect::<serde_json::Map<_, _>>()).collect::<Vec<_>>(),
        "text_offset": offsets,
    })
}

fn lp_json(l: &[TokenLogprob]) -> Value {
    if l.is_empty() {
        Value::Null
    } else {
        completion_logprobs(l)
    }
}

/// The counts of a batch together (timings added up too), `n` choices per prompt: a prompt's
/// tokens count once, as OpenAI counts them.
pub(crate) fn total(us: &[Usage], n: usize) -> Usage {
    let mut t = Usage::default();
    for (i, u) in us.iter().enumerate() {
        if i % n.max(1) == 0 {
            t.prompt_tokens += u.prompt_tokens;
            t.cached_tokens += u.cached_tokens;
        }
        t.completion_tokens += u.completion_tokens;
        let (a, b) = (&mut t.timings, &u.timings);
        a.queue_ms += b.queue_ms;
        a.session_ms += b.session_ms;
        a.grammar_ms += b.grammar_ms;
        // The batch's first token.
        if b.ttft_ms > 0.0 && (a.ttft_ms == 0.0 || b.ttft_ms < a.ttft_ms) {
            a.ttft_ms = b.ttft_ms;
        }
        a.restore_ms += b.restore_ms;
        a.restore_bytes += b.restore_bytes;
        a.cache_load_ms += b.cache_load_ms;
        a.prompt_n += b.prompt_n;
        a.prompt_ms += b.prompt_ms;
        a.checkpoint_ms += b.checkpoint_ms;
        a.checkpoint_bytes += b.checkpoint_bytes;
        a.predicted_n += b.predicted_n;
        a.predicted_ms += b.predicted_ms;
        a.draft_n += b.draft_n;
        a.draft_n_accepted += b.draft_n_accepted;
    }
    t
}

/// `POST /v1/completions` (raw prompt; the client owns the whole prompt, so special-token text
/// in it is parsed as special tokens). A batch of prompts gives `n` choices per prompt, in
/// prompt order (choice `i·n + j` is prompt i's j-th), streamed one choice after the other.
pub async fn completions(State(st): St, body: Result<Bytes, BytesRejection>) -> Response {
    let received = Instant::now();
    let prep = || -> Result<(Vec<Prepared>, GenParams, String), ApiError> {
        let r = st.ready()?;
        let o = parse_object(&body_bytes(body)?)?;
        check_model(&o, r)?;
        let tok = &r.model.tokenizer;
        let (params, prompts) = validate_completion(&o, tok.n_vocab())?;
        let mut ps = Vec::with_capacity(prompts.len());
        for p in prompts {
            let prompt = match p {
                CompletionPrompt::Text(s) => tok
                    .encode(&s, true, true)
                    .map_err(|e| ApiError::bad("prompt", format!("{e:#}")))?,
                CompletionPrompt::Ids(ids) => ids,
            };
            for j in 0..params.n {
                ps.push(Prepared {
                    prompt: prompt.clone(),
                    params: params.choice(j),
                    parser: ParserConfig::default(),
                    field: "prompt",
                    default_max_tokens: Some(DEFAULT_MAX_TOKENS),
                    constraint: None,
                });
            }
        }
        Ok((ps, params, r.name.clone()))
    };
    let (jobs, (params, model)) =
        match submit_openai(&st, prep().map(|(ps, p, m)| (ps, (p, m))), received) {
            Ok(x) => x,
            Err(resp) => return *resp,
        };
    let id = new_id("cmpl-");
    let created = unix_now();
    let obj = move |choices: Value| {
        json!({"id": id, "object": "text_completion", "created": created, "model": model,
               "choices": choices})
    };
    let choice = |i: usize, text: &str, lp: Value, finish: Value| json!({"index": i, "text": text, "logprobs": lp, "finish_reason": finish});
    if !params.stream {
        let mut choices = Vec::new();
        let mut usage = Vec::new();
        for (i, (rx, cancel)) in jobs.into_iter().enumerate() {
            match collect(rx, cancel).await {
                Ok(c) => {
                    choices.push(choice(i, &c.content, lp_json(&c.logprobs), json!(c.finish)));
                    usage.push(c.usage);
                }
                // The later jobs' receivers drop here, so the worker skips them.
                Err(e) => return openai_err(&st.metrics, e),
            }
        }
        let sum = total(&usage, params.n);
        let mut v = obj(Value::Array(choices));
        v["usage"] = usage_json(&sum);
        v["timings"] = timings_json(&sum);
        return json_with_usage(v, &usage);
    }
    let n = jobs.len();
    let cancels: Vec<_> = jobs.iter().map(|j| j.1.clone()).collect();
    let mut usage = Vec::new();
    let mut failed = false;
    let fmt = move |i: usize, ev: Out| -> Vec<String> {
        if failed {
            return vec![];
        }
        match ev {
            Out::Progress { .. } => vec![],
            Out::Delta {
                content, logprobs, ..
            } => vec![data(&obj(json!([choice(
                i,
                &content,
                lp_json(&logprobs),
                Value::Null
            )])))],
            Out::Done {
                finish, usage: u, ..
            } => {
                usage.push(u);
                let mut last = obj(json!([choice(i, "", Value::Null, json!(finish))]));
                last["timings"] = timings_json(&u);
                let mut f = vec![data(&last)];
                if usage.len() == n {
                    if params.include_usage {
                        let mut u = obj(json!([]));
                        u["usage"] = usage_json(&total(&usage, params.n));
                        f.push(data(&u));
                    }
                    f.push("data: [DONE]\n\n".into());
                }
                f
            }
            Out::Error(e) => {
                // The rest of a batch is not run once one prompt failed.
                failed = true;
                cancels.iter().for_each(|c| c.cancel());
                vec![data(&e.openai_json()), "data: [DONE]\n\n".into()]
            }
        }
    };
    sse_response_many(jobs, Vec::new(), crate::http::KEEPALIVE_COMMENT, fmt)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompts(v: Value) -> Result<Vec<CompletionPrompt>, ApiError> {
        let o = json!({"prompt": v});
        validate_completion(o.as_object().unwrap(), 100).map(|x| x.1)
    }

    #[test]
    fn prompt_shapes() {
        use CompletionPrompt::*;
        assert_eq!(prompts(json!("a")).unwrap(), vec![Text("a".into())]);
        assert_eq!(
            prompts(json!(["a", "b"])).unwrap(),
            vec![Text("a".into()), Text("b".into())]
        );
        assert_eq!(prompts(json!([1, 2])).unwrap(), vec![Ids(vec![1, 2])]);
        assert_eq!(
            prompts(json!([[1], [2, 3]])).unwrap(),
            vec![Ids(vec![1]), Ids(vec![2, 3])]
        );
        for bad in [
            json!([]),
            json!([[]]),
            json!(["a", 1]),
            json!([[1], "a"]),
            json!([[1, "x"]]),
            json!([100]),
            json!([[5], [100]]),
            json!([-1]),
            json!({"a": 1}),
            json!(null),
        ] {
            let e = prompts(bad.clone()).unwrap_err();
            assert_eq!(
                (e.status.as_u16(), e.param.as_deref()),
                (400, Some("prompt")),
                "{bad}"
            );
            assert!(!e.message.contains("Some("), "{}", e.message);
        }
    }

    #[test]
    fn max_tokens_absent_stays_none() {
        let o = json!({"prompt": "x"});
        let (p, _) = validate_completion(o.as_object().unwrap(), 100).unwrap();
        assert_eq!(p.max_tokens, None);
    }
}
