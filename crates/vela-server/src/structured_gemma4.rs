//! Forced tool calls in Gemma 4's syntax: `call:NAME{key:value,…}` between `<|tool_call>` and
//! `<tool_call|>`, strings between `<|"|>` delimiters, objects with bare keys, arrays, and JSON
//! scalars (numbers, booleans, null) as they are. The parameters' schema is converted
//! construct by construct (properties in the schema's order, the optional ones optional);
//! numbers, booleans and null are JSON under their own schema. What has no such form (`anyOf`,
//! `$ref`, a string `pattern`, …) is an error naming it.

use crate::structured::quote;
use serde_json::{Map, Value};
use vela_engine::grammar::styled_schema;

/// The string delimiter.
pub const QUOTE: &str = "<|\"|>";

/// Builds the Lark rules of one call; `q` is the delimiter as a Lark terminal (a token by id,
/// or its text: `q_text` then says to end strings lazily at it).
pub struct G4Rules<'a> {
    pub rules: &'a mut Vec<String>,
    pub q: String,
    pub q_text: bool,
    n: usize,
    /// The parameters' schema, which local `$ref`s point into, and the refs being expanded.
    root: Value,
    depth: usize,
}

const SCALAR: [&str; 4] = ["number", "integer", "boolean", "null"];

impl<'a> G4Rules<'a> {
    pub fn new(rules: &'a mut Vec<String>, q: String, q_text: bool) -> Self {
        G4Rules {
            rules,
            q,
            q_text,
            n: 0,
            root: Value::Null,
            depth: 0,
        }
    }

    fn fresh(&mut self, p: &str) -> String {
        self.n += 1;
        format!("{p}{}", self.n)
    }

    /// The rule `call{i}` for function `name`.
    pub fn call(&mut self, i: usize, name: &str, params: &Value) -> Result<(), String> {
        self.root = params.clone();
        let body = self.object(params)?;
        self.rules.push(format!(
            "call{i}: {} {body}",
            quote(&format!("call:{name}"))
        ));
        Ok(())
    }

    /// A Lark expression for a value valid under `s`.
    fn value(&mut self, s: &Value) -> Result<String, String> {
        let Some(o) = s.as_object() else {
            return Err("a boolean schema".into());
        };
        if let Some(r) = o.get("$ref").and_then(Value::as_str) {
            // A local reference, expanded in place (a recursive one is refused).
            let target = r
                .strip_prefix('#')
                .and_then(|p| self.root.pointer(p))
                .cloned();
            let Some(target) = target.filter(|_| self.depth < 8) else {
                return Err(format!("'$ref' {r:?}"));
            };
            self.depth += 1;
            let v = self.value(&target);
            self.depth -= 1;
            return v;
        }
        for k in ["anyOf", "oneOf", "allOf", "not", "if", "pattern", "format"] {
            if o.contains_key(k) {
                return Err(format!("'{k}'"));
            }
        }
        let lits = |v: &Value| v.as_array().cloned();
        let choices = match (o.get("enum"), o.get("const")) {
            (Some(e), _) => lits(e),
            (None, Some(c)) => Some(vec![c.clone()]),
            _ => None,
        };
        if let Some(c) = choices {
            if c.iter().all(Value::is_string) {
                return self.string_literals(&c);
            }
            if c.iter()
                .all(|v| !v.is_string() && !v.is_object() && !v.is_array())
            {
                return Ok(format!("%json {}", styled_schema(s)));
            }
            return Err("an enum mixing strings with other values".into());
        }
        match o.get("type").and_then(Value::as_str) {
            Some("string") => self.string(o),
            Some(t) if SCALAR.contains(&t) => Ok(format!("%json {}", styled_schema(s))),
            Some("object") => self.object(s),
            Some("array") => self.array(o),
            Some(t) => Err(format!("type '{t}'")),
            None => Err("a value without a single type".into()),
        }
    }

    fn string_literals(&mut self, c: &[Value]) -> Result<String, String> {
        let mut alts = Vec::new();
        for v in c {
            let s = v.as_str().unwrap_or_default();
            if s.contains(QUOTE) {
                return Err(format!("enum value {s:?}"));
            }
            alts.push(quote(s));
        }
        Ok(format!("{q} ({}) {q}", alts.join(" | "), q = self.q))
    }

    fn string(&mut self, o: &Map<String, Value>) -> Result<String, String> {
        let len = |k: &str| o.get(k).and_then(Value::as_u64);
        let (min, max) = (len("minLength").unwrap_or(0), len("maxLength"));
        let t = self.fresh("S");
        let max = max.map(|m| m.to_string()).unwrap_or_default();
        self.rules.push(format!(
            "{t}: /(?s:.){{{min},{max}}}/ & ~/(?s:.*)<\\|\"\\|>(?s:.*)/"
        ));
        if self.q_text {
            let r = self.fresh("s");
            self.rules
                .push(format!("{r}[suffix={}]: {t}", quote(QUOTE)));
            Ok(format!("{} {r}", self.q))
        } else {
            Ok(format!("{q} {t} {q}", q = self.q))
        }
    }

    /// `{k:v,…}`: the properties in order; a comma before each but the first one present.
    fn object(&mut self, s: &Value) -> Result<String, String> {
        let empty = Map::new();
        let (props, required) = crate::structured::object_parts(s, &empty, "property")?;
        let mut items = Vec::new();
        for (k, v) in props {
            if k.is_empty() || k.contains([':', ',', '{', '}', '[', ']']) || k.trim() != k {
                return Err(format!("property name {k:?}"));
            }
            let val = self
                .value(v)
                .map_err(|e| format!("{e} in property '{k}'"))?;
            items.push((
                format!("{} {val}", quote(&format!("{k}:"))),
                required.contains(&k.as_str()),
            ));
        }
        // The first item present is one of those up to the first required one.
        let tails: Vec<String> = (0..items.len())
            .map(|j| self.tail_rule(&items, j))
            .collect();
        let mut heads = Vec::new();
        for (j, (item, req)) in items.iter().enumerate() {
            let rest = tails.get(j + 1).cloned().unwrap_or_default();
            heads.push(format!("{item} {rest}"));
            if *req {
                break;
            }
        }
        let all_optional = items.iter().all(|(_, r)| !r);
        let body = match (heads.is_empty(), all_optional) {
            (true, _) => String::new(),
            (false, true) => format!("({})?", heads.join(" | ")),
            (false, false) => format!("({})", heads.join(" | ")),
        };
        Ok(format!("\"{{\" {body} \"}}\""))
    }

    /// A rule for the items from `j` on, each after a comma.
    fn tail_rule(&mut self, items: &[(String, bool)], j: usize) -> String {
        let parts: Vec<String> = items[j..]
            .iter()
            .map(|(item, req)| match req {
                true => format!("\",\" {item}"),
                false => format!("(\",\" {item})?"),
            })
            .collect();
        let r = self.fresh("t");
        self.rules.push(format!("{r}: {}", parts.join(" ")));
        r
    }

    /// `[v,…]` with `minItems` / `maxItems`.
    fn array(&mut self, o: &Map<String, Value>) -> Result<String, String> {
        let items = o.get("items").ok_or("an array without 'items'")?;
        let it = self
            .value(items)
            .map_err(|e| format!("{e} in array items"))?;
        let r = self.fresh("i");
        self.rules.push(format!("{r}: {it}"));
        let len = |k: &str| o.get(k).and_then(Value::as_u64);
        let (min, max) = (len("minItems").unwrap_or(0), len("maxItems"));
        if max.is_some_and(|m| m < min || m > 64) || min > 64 {
            return Err("array bounds beyond 64 items".into());
        }
        // min mandatory items, then up to max - min optional ones (or any number).
        let mut more = match max {
            None => format!("(\",\" {r})*"),
            Some(m) => {
                let mut s = String::new();
                for _ in min.max(1)..m {
                    s = format!("(\",\" {r} {s})?");
                }
                s
            }
        };
        if min == 0 {
            more = format!("({r} {more})?");
        } else {
            let req = vec![r.clone(); min as usize].join(" \",\" ");
            more = format!("{req} {more}");
        }
        if max == Some(0) {
            more = String::new();
        }
        Ok(format!("\"[\" {more} \"]\""))
    }
}
