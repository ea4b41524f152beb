//! Which tool-call arguments are strings by the tool's JSON Schema.
//!
//! XML-style calls (GLM `<arg_value>`, Qwen3.5 `<parameter=K>`) write a string argument as its
//! raw text and any other value as JSON, so the text `3` means the string "3" for a string
//! parameter and the number 3 for an integer one. llama.cpp's parsers decide by the schema
//! (`common_chat_schema::may_be_string`): a parameter whose schema admits a string keeps the raw
//! text, any other is read as JSON. [`ArgKinds`] holds that answer per function and parameter;
//! a function or parameter the request did not declare falls back to "JSON if it parses".

use serde_json::Value;
use std::collections::BTreeMap;

/// Per function name, per parameter name: whether the parameter's schema admits a string.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ArgKinds(BTreeMap<String, BTreeMap<String, bool>>);

impl ArgKinds {
    /// From an OpenAI `tools` array (`[{type: function, function: {name, parameters}}]`);
    /// anything malformed is skipped (the request was validated before).
    pub fn from_tools(tools: Option<&Value>) -> ArgKinds {
        let mut out = BTreeMap::new();
        for t in tools.and_then(Value::as_array).into_iter().flatten() {
            let f = t.get("function").unwrap_or(t);
            let (Some(name), Some(params)) =
                (f.get("name").and_then(Value::as_str), f.get("parameters"))
            else {
                continue;
            };
            let props = params.get("properties").and_then(Value::as_object);
            let kinds = props
                .into_iter()
                .flatten()
                .map(|(k, s)| (k.clone(), may_be_string(s, params, 0)))
                .collect();
            out.insert(name.to_string(), kinds);
        }
        ArgKinds(out)
    }

    /// The value of argument `key` of function `name` written as `raw`; `undeclared` reads
    /// the text of a parameter the schema does not describe (each format's own rule).
    pub fn value(&self, name: &str, key: &str, raw: &str, undeclared: fn(&str) -> Value) -> Value {
        match self.0.get(name).and_then(|p| p.get(key)) {
            Some(true) => Value::String(raw.to_string()),
            // Declared non-string: JSON, or the text when the model wrote something else.
            Some(false) => {
                serde_json::from_str(raw.trim()).unwrap_or_else(|_| Value::String(raw.into()))
            }
            None => undeclared(raw),
        }
    }
}

/// Follow a local `$ref` (`#/$defs/X`, `#/definitions/X`, any `#/a/b` path) from `root`.
fn resolve<'a>(r: &str, root: &'a Value) -> Option<&'a Value> {
    let path = r.strip_prefix('#')?;
    if path.is_empty() {
        return Some(root);
    }
    root.pointer(path)
}

/// Whether `s` admits a string, in the order llama.cpp's schema reader looks at the keywords:
/// `$ref`, `oneOf`/`anyOf`, a type list, `const`, `enum`, `type`, then without a type `allOf`
/// and the string keywords. `depth` bounds reference cycles (a cycle is "not a string").
pub(crate) fn may_be_string(s: &Value, root: &Value, depth: usize) -> bool {
    if depth > 32 {
        return false;
    }
    let Some(o) = s.as_object() else {
        return false;
    };
    let any = |list: &Value| {
        list.as_array()
            .is_some_and(|a| a.iter().any(|c| may_be_string(c, root, depth + 1)))
    };
    if let Some(r) = o.get("$ref").and_then(Value::as_str) {
        return resolve(r, root).is_some_and(|t| may_be_string(t, root, depth + 1));
    }
    if let Some(alts) = o.get("oneOf").or_else(|| o.get("anyOf")) {
        return any(alts);
    }
    match o.get("type") {
        Some(Value::Array(types)) => return types.iter().any(|t| t == "string"),
        _ if o.contains_key("const") => return o["const"].is_string(),
        _ if o.contains_key("enum") => {
            return o["enum"]
                .as_array()
                .is_some_and(|v| v.iter().any(Value::is_string))
        }
        Some(Value::String(t)) => return t == "string",
        _ => {}
    }
    if let Some(all) = o.get("allOf").and_then(Value::as_array) {
        // Every constraining child must admit a string, and at least one must constrain.
        let typed: Vec<&Value> = all
            .iter()
            .filter(|c| c.as_object().is_some_and(|m| !m.is_empty()))
            .collect();
        return !typed.is_empty() && typed.iter().all(|c| may_be_string(c, root, depth + 1));
    }
    ["pattern", "minLength", "maxLength", "format"]
        .iter()
        .any(|k| o.contains_key(*k))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn string_parameters_by_schema() {
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object",
        "$defs": {"unit": {"enum": ["c", "f"]}, "n": {"type": "integer"}, "loop": {"$ref": "#/$defs/loop"}},
        "properties": {
            "s": {"type": "string"}, "i": {"type": "integer"}, "b": {"type": "boolean"},
            "o": {"type": "object"}, "a": {"type": "array", "items": {"type": "string"}},
            "u": {"type": ["integer", "string"]}, "nu": {"type": ["integer", "null"]},
            "any": {}, "anyof": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
            "oneof": {"oneOf": [{"type": "integer"}, {"type": "number"}]},
            "c": {"const": "x"}, "c1": {"const": 1}, "e": {"enum": [1, 2]},
            "ref": {"$ref": "#/$defs/unit"}, "refn": {"$ref": "#/$defs/n"},
            "cycle": {"$ref": "#/$defs/loop"}, "dangling": {"$ref": "#/$defs/none"},
            "pat": {"pattern": "^a"}, "all": {"allOf": [{"type": "string"}, {"minLength": 1}]},
            "alln": {"allOf": [{"type": "string"}, {"type": "integer"}]}
        }}}}]);
        let k = ArgKinds::from_tools(Some(&tools));
        let strings: Vec<&str> = k.0["f"]
            .iter()
            .filter(|(_, &v)| v)
            .map(|(n, _)| n.as_str())
            .collect();
        assert_eq!(strings, ["all", "anyof", "c", "pat", "ref", "s", "u"]);
    }

    #[test]
    fn values_typed_by_schema() {
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"s": {"type": "string"}, "i": {"type": "integer"}}}}}]);
        let k = ArgKinds::from_tools(Some(&tools));
        let loose = |s: &str| serde_json::from_str(s).unwrap_or_else(|_| json!(s));
        let k = |f: &str, p: &str, raw: &str| k.value(f, p, raw, loose);
        // A string parameter keeps the text, even when it reads as JSON.
        assert_eq!(k("f", "s", "3"), json!("3"));
        assert_eq!(k("f", "s", "\"q\""), json!("\"q\""));
        assert_eq!(k("f", "i", "3"), json!(3));
        assert_eq!(k("f", "i", " 3\n"), json!(3));
        // Not JSON where JSON was declared: the text, never an error.
        assert_eq!(k("f", "i", "three"), json!("three"));
        // Undeclared parameter or function: the format's own rule.
        assert_eq!(k("f", "x", "[1]"), json!([1]));
        assert_eq!(k("g", "s", "3"), json!(3));
        assert_eq!(k("g", "s", "Paris"), json!("Paris"));
        assert_eq!(ArgKinds::from_tools(None), ArgKinds::default());
        assert_eq!(
            ArgKinds::from_tools(Some(&json!("junk"))),
            ArgKinds::default()
        );
    }
}
