//! The Gemma 4 tool-call round-trip prompts (`$VELA_CACHE/golden/templates/roundtrip.json`,
//! written by `scripts/gen-template-golden.py`) render byte-identically to jinja2 for every
//! template that defines Gemma 4 tool calls: thinking in the system turn, tool declarations,
//! `reasoning_content` re-rendered as a thought channel, `<|tool_call>` with `<|"|>` strings,
//! and tool results as `<|tool_response>` blocks (or `tool` turns in the interleaved variant).

use serde_json::Value as Json;
use vela_formats::testdata;
use vela_template::{ChatTemplate, RenderRequest};

#[test]
fn gemma4_round_trip_prompts_match_jinja2() {
    let Some(path) = testdata::require(testdata::golden_dir().join("templates/roundtrip.json"))
    else {
        return;
    };
    let golden: Json = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let convs = golden["conversations"].as_array().unwrap();
    let templates = golden["templates"].as_array().unwrap();
    assert!(
        templates
            .iter()
            .any(|t| t["name"] == "google-gemma-4-31B-it"),
        "the official Gemma 4 template is missing from the golden file"
    );
    let mut n = 0;
    for t in templates {
        let name = t["name"].as_str().unwrap();
        let tpl = ChatTemplate::new(
            t["source"].as_str().unwrap(),
            t["bos_token"].as_str().unwrap(),
            t["eos_token"].as_str().unwrap(),
        )
        .unwrap();
        for c in convs {
            let cname = c["name"].as_str().unwrap();
            let want = t["results"][cname]["output"].as_str().unwrap();
            let req: RenderRequest = serde_json::from_value(c.clone()).unwrap();
            let got = tpl.render(&req).unwrap();
            assert_eq!(got, want, "{name} / {cname}");
            n += 1;
        }
        if name == "google-gemma-4-31B-it" {
            let after = t["results"]["g4_after_tool"]["output"].as_str().unwrap();
            assert!(after.contains("<|tool_response>response:get_weather{"));
            assert!(after.contains("<|channel>thought\n"));
        }
    }
    assert!(n >= 8, "only {n} renders checked");
}
