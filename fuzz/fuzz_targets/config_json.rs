//! Fuzz every architecture's configuration reader on arbitrary JSON: the Hugging Face
//! `config.json` readers (Gemma 4, Gemma 4 assistant, Qwen3.8 Flash Next, DeepSeek V4, and the
//! registry's `model_type` dispatch and `describe_hf`), and, with the JSON object turned into GGUF
//! metadata (strings, integers, floats, booleans and arrays of them), the GGUF readers of every
//! registered architecture (`describe_gguf`, the shared decoder's config, Gemma 4 and its
//! assistant, Qwen3.8 Flash Next). Asserts: `Ok` or an error, never a panic; every error message
//! is one line; a config that parses gives a summary.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value as Json;
use vela_formats::gguf::{GgufFile, Value as Gv};
use vela_formats::gguf_write::GgufWriter;
use vela_models::deepseekv4::DeepseekV4Config;
use vela_models::gemma4::Gemma4Config;
use vela_models::gemma4_assistant::AssistantConfig;
use vela_models::qwen4exp::Qwen4ExpConfig;
use vela_models::registry::{self, ARCHS};

fn one_line<T>(r: anyhow::Result<T>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            let m = format!("{e:#}");
            assert!(!m.contains('\n'), "multi-line error: {m:?}");
            None
        }
    }
}

/// A JSON value as GGUF metadata; `None` for what GGUF cannot hold (null, objects, mixed arrays).
fn to_gguf(v: &Json) -> Option<Gv> {
    Some(match v {
        Json::Bool(b) => Gv::Bool(*b),
        Json::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) if u <= u32::MAX as u64 => Gv::U32(u as u32),
            (Some(u), _) => Gv::U64(u),
            (_, Some(i)) if i >= i32::MIN as i64 => Gv::I32(i as i32),
            (_, Some(i)) => Gv::I64(i),
            _ => Gv::F32(n.as_f64()? as f32),
        },
        Json::String(s) => Gv::String(s.clone()),
        Json::Array(a) => {
            let items: Vec<Gv> = a.iter().map(to_gguf).collect::<Option<_>>()?;
            let same = items
                .windows(2)
                .all(|w| std::mem::discriminant(&w[0]) == std::mem::discriminant(&w[1]));
            if !same {
                return None;
            }
            Gv::Array(items)
        }
        Json::Null | Json::Object(_) => return None,
    })
}

/// The JSON object's convertible entries as an in-memory GGUF file (no tensors).
fn as_gguf(o: &serde_json::Map<String, Json>) -> Option<GgufFile> {
    let mut w = GgufWriter::new();
    for (k, v) in o {
        if let Some(g) = to_gguf(v) {
            let _ = w.add_kv(k.as_str(), g);
        }
    }
    let bytes = w.to_bytes(|_, _, _| Ok(())).ok()?;
    Some(GgufFile::from_bytes(bytes).expect("the writer's output parses"))
}

fuzz_target!(|data: &[u8]| {
    let Ok(j) = serde_json::from_slice::<Json>(data) else {
        return;
    };
    if let Some(c) = one_line(Gemma4Config::from_json(&j)) {
        assert!(!c.summary().is_empty());
    }
    if let Some(c) = one_line(Qwen4ExpConfig::from_json(&j)) {
        assert!(!c.summary().is_empty());
        let _ = c.qkv_width();
    }
    if let Some(c) = one_line(DeepseekV4Config::from_json(&j)) {
        assert!(!c.summary().is_empty());
    }
    let _ = one_line(AssistantConfig::from_json(&j));
    if let Some(arch) = one_line(registry::for_hf(&j)) {
        let _ = one_line(arch.describe_hf(&j));
    }

    let Some(o) = j.as_object() else {
        return;
    };
    let Some(g) = as_gguf(o) else {
        return;
    };
    if let Some(arch) = one_line(registry::for_gguf(&g)) {
        let _ = one_line(arch.describe_gguf(&g));
    }
    for arch in ARCHS {
        let _ = one_line(arch.describe_gguf(&g));
    }
    let _ = one_line(vela_models::config_from_gguf(&g));
    let _ = one_line(Gemma4Config::from_gguf(&g));
    let _ = one_line(Qwen4ExpConfig::from_gguf(&g));
    let _ = one_line(AssistantConfig::from_gguf(&g));
});
