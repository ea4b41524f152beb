//! Fuzz the server's request validation on arbitrary bodies: `/v1/chat/completions`,
//! `/v1/completions`, `/v1/responses` (OpenAI) and `/v1/messages` (Anthropic). Never a panic; every rejection is
//! a 4xx naming no more than one field; a body that parses re-serialises to JSON that parses to
//! the same object and validates the same way (same error, or the same parameters, messages and
//! tools); normalising already-normalised chat messages changes nothing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use vela_server::{anthropic, responses};
use vela_server::error::ApiError;
use vela_server::openai::{validate_chat, validate_completion};
use vela_server::request::{normalize_messages, parse_object, ChatRequest, GenParams, Obj};

/// Vocabulary size the `logit_bias` and prompt ids are checked against.
const N_VOCAB: usize = 1000;

fn check_err(e: &ApiError) {
    let s = e.status.as_u16();
    assert!((400..500).contains(&s), "status {s}: {}", e.message);
    assert!(!e.message.is_empty());
}

/// Parameters as text, with the seed blanked when the body gave none (it is random then).
fn params_key(o: &Obj, p: &GenParams) -> String {
    let mut p = p.clone();
    if o.get("seed").is_none_or(Value::is_null) {
        p.sampling.seed = 0;
    }
    format!("{p:?}")
}

fn chat_key(o: &Obj, r: &Result<ChatRequest, ApiError>) -> String {
    match r {
        Ok(c) => format!(
            "ok {} {:?} {:?}",
            params_key(o, &c.params),
            c.messages,
            c.tools
        ),
        Err(e) => format!("err {e:?}"),
    }
}

fn validate_all(o: &Obj) -> Vec<String> {
    let chat = validate_chat(o, N_VOCAB);
    let msgs = anthropic::validate(o);
    let resp = responses::validate(o, N_VOCAB);
    let compl = validate_completion(o, N_VOCAB);
    for e in [
        chat.as_ref().err(),
        msgs.as_ref().err(),
        resp.as_ref().err(),
        compl.as_ref().err(),
    ]
    .into_iter()
    .flatten()
    {
        check_err(e);
    }
    if let Ok(c) = &chat {
        // The normalised messages are a fixed point of normalisation.
        let again = normalize_messages(Some(&Value::Array(c.messages.clone())))
            .expect("normalised messages validate");
        assert_eq!(again, c.messages);
    }
    for c in [&chat, &msgs, &resp].into_iter().flatten() {
        assert!(c.messages.iter().all(Value::is_object));
        assert!(c.tools.as_ref().is_none_or(Value::is_array));
    }
    let compl = match compl {
        Ok((p, prompt)) => format!("ok {} {prompt:?}", params_key(o, &p)),
        Err(e) => format!("err {e:?}"),
    };
    vec![
        chat_key(o, &chat),
        chat_key(o, &msgs),
        chat_key(o, &resp),
        compl,
    ]
}

fuzz_target!(|data: &[u8]| {
    let o = match parse_object(data) {
        Ok(o) => o,
        Err(e) => {
            check_err(&e);
            return;
        }
    };
    let first = validate_all(&o);
    let text = serde_json::to_vec(&Value::Object(o.clone())).expect("a parsed body serialises");
    let o2 = parse_object(&text).expect("a re-serialised body parses");
    assert_eq!(
        o,
        o2,
        "re-serialised body differs: {}",
        String::from_utf8_lossy(&text)
    );
    assert_eq!(first, validate_all(&o2));
});
