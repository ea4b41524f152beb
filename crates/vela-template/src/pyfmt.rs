//! Python-compatible value formatting for template output.
//!
//! Jinja2 prints values with Python's `str()`, and HF's `tojson` filter is plain
//! `json.dumps(x, ensure_ascii=False, indent=.., separators=.., sort_keys=..)`. MiniJinja's own
//! formatting differs (JSON-ish maps, HTML-escaping `tojson`, Rust float formatting), so the
//! functions here re-implement the Python behaviour over [`minijinja::Value`]s.

use minijinja::value::ValueKind;
use minijinja::{Error, ErrorKind, Value};
use std::fmt::Write;

/// Python `repr(float)` / `str(float)`: shortest round-trip digits, positional notation for
/// decimal exponents in `-4..16`, scientific (`1e+16`, `1.5e-05`) otherwise, and always a `.0`
/// on integral positional values.
pub fn py_float(v: f64) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if v == 0.0 {
        return if v.is_sign_negative() {
            "-0.0".into()
        } else {
            "0.0".into()
        };
    }
    // `{:e}` yields the shortest round-trip digits as `d.ddde[-]x`.
    let sci = format!("{v:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (neg, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let mut out = String::new();
    if neg {
        out.push('-');
    }
    if (-4..16).contains(&exp) {
        if exp < 0 {
            out.push_str("0.");
            out.push_str(&"0".repeat((-exp - 1) as usize));
            out.push_str(&digits);
        } else {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                out.push_str(&digits);
                out.push_str(&"0".repeat(int_len - digits.len()));
                out.push_str(".0");
            } else {
                out.push_str(&digits[..int_len]);
                out.push('.');
                out.push_str(&digits[int_len..]);
            }
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    out
}

/// Python `str(value)` as Jinja2 prints `{{ value }}`: strings verbatim, undefined as empty,
/// everything else as [`py_repr`].
pub fn py_str(value: &Value) -> String {
    match value.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::String => value.as_str().unwrap_or_default().to_string(),
        _ => {
            let mut s = String::new();
            py_repr_into(value, &mut s);
            s
        }
    }
}

/// Python `repr(value)` for JSON-like data (`None`, `True`, `'str'`, `[1, 2]`, `{'k': 'v'}`).
pub fn py_repr(value: &Value) -> String {
    let mut s = String::new();
    py_repr_into(value, &mut s);
    s
}

fn py_repr_into(value: &Value, out: &mut String) {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => out.push_str(&py_number(value)),
        ValueKind::String => py_repr_str(value.as_str().unwrap_or_default(), out),
        ValueKind::Map => {
            out.push('{');
            if let Ok(keys) = value.try_iter() {
                for (i, k) in keys.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr_into(&k, out);
                    out.push_str(": ");
                    let v = value.get_item(&k).unwrap_or_default();
                    py_repr_into(&v, out);
                }
            }
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            if let Ok(items) = value.try_iter() {
                for (i, v) in items.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr_into(&v, out);
                }
            }
            out.push(']');
        }
        _ => {
            let _ = write!(out, "{value}");
        }
    }
}

/// A number in Python notation (ints verbatim, floats via [`py_float`]).
fn py_number(value: &Value) -> String {
    if let NumRepr::F64(f) = value_repr(value) {
        py_float(f)
    } else {
        value.to_string()
    }
}

/// Minimal view on a number's representation (integers vs. floats).
enum NumRepr {
    F64(f64),
    Int,
}
fn value_repr(value: &Value) -> NumRepr {
    if value.is_integer() {
        NumRepr::Int
    } else {
        match f64::try_from(value.clone()) {
            Ok(f) => NumRepr::F64(f),
            Err(_) => NumRepr::Int,
        }
    }
}

/// Python's `repr(str)`: single quotes unless the text contains `'` but no `"`.
fn py_repr_str(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..0xa0).contains(&(c as u32)) => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Options of Python's `json.dumps` that HF's `tojson` filter exposes.
pub struct JsonOpts {
    pub ensure_ascii: bool,
    /// Indentation string per level; `None` = single line.
    pub indent: Option<String>,
    pub item_sep: String,
    pub key_sep: String,
    pub sort_keys: bool,
}

impl JsonOpts {
    /// Python defaults given `indent`: `", "` between items on one line, `","` when indenting.
    pub fn new(
        ensure_ascii: bool,
        indent: Option<String>,
        separators: Option<(String, String)>,
        sort_keys: bool,
    ) -> Self {
        let (item_sep, key_sep) = separators.unwrap_or_else(|| {
            let item = if indent.is_some() { "," } else { ", " };
            (item.to_string(), ": ".to_string())
        });
        JsonOpts {
            ensure_ascii,
            indent,
            item_sep,
            key_sep,
            sort_keys,
        }
    }
}

fn not_serializable(value: &Value) -> Error {
    let ty = match value.kind() {
        ValueKind::Undefined => "Undefined".to_string(),
        other => other.to_string(),
    };
    Error::new(
        ErrorKind::InvalidOperation,
        format!("Object of type {ty} is not JSON serializable"),
    )
}

/// Python `json.dumps(value, ...)` over a MiniJinja value.
pub fn json_dumps(value: &Value, opts: &JsonOpts) -> Result<String, Error> {
    let mut out = String::new();
    json_into(value, opts, 0, &mut out)?;
    Ok(out)
}

fn newline_indent(opts: &JsonOpts, level: usize, out: &mut String) {
    if let Some(ind) = &opts.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(ind);
        }
    }
}

fn json_into(value: &Value, opts: &JsonOpts, level: usize, out: &mut String) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => match value_repr(value) {
            NumRepr::F64(f) if f.is_nan() => out.push_str("NaN"),
            NumRepr::F64(f) if f.is_infinite() => {
                out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" })
            }
            NumRepr::F64(f) => out.push_str(&py_float(f)),
            NumRepr::Int => out.push_str(&value.to_string()),
        },
        ValueKind::String => json_str(value.as_str().unwrap_or_default(), opts.ensure_ascii, out),
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if opts.sort_keys {
                keys.sort();
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                newline_indent(opts, level + 1, out);
                let key = match k.kind() {
                    ValueKind::String => k.as_str().unwrap_or_default().to_string(),
                    ValueKind::None => "null".into(),
                    ValueKind::Bool => (if k.is_true() { "true" } else { "false" }).into(),
                    ValueKind::Number => {
                        let mut s = String::new();
                        json_into(k, opts, 0, &mut s)?;
                        s
                    }
                    other => {
                        return Err(Error::new(
                            ErrorKind::InvalidOperation,
                            format!("keys must be str, int, float, bool or None, not {other}"),
                        ))
                    }
                };
                json_str(&key, opts.ensure_ascii, out);
                out.push_str(&opts.key_sep);
                json_into(&value.get_item(k)?, opts, level + 1, out)?;
            }
            newline_indent(opts, level, out);
            out.push('}');
        }
        ValueKind::Seq => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                newline_indent(opts, level + 1, out);
                json_into(v, opts, level + 1, out)?;
            }
            newline_indent(opts, level, out);
            out.push(']');
        }
        _ => return Err(not_serializable(value)),
    }
    Ok(())
}

/// A JSON string literal the way Python's `json` module writes it.
fn json_str(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        let cases = [
            (1.0, "1.0"),
            (21.5, "21.5"),
            (0.1, "0.1"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789012345.6, "123456789012345.6"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (-2.5e-7, "-2.5e-07"),
            (100.0, "100.0"),
            (-0.0, "-0.0"),
        ];
        for (v, want) in cases {
            assert_eq!(py_float(v), want, "{v}");
        }
    }

    #[test]
    fn repr_and_json_match_python() {
        let v = Value::from_serialize(serde_json::json!({
            "b": [1, 2.0, "it's", null, true],
            "a": {"x": "é\n"}
        }));
        assert_eq!(
            py_repr(&v),
            r#"{'b': [1, 2.0, "it's", None, True], 'a': {'x': 'é\n'}}"#
        );
        let compact = JsonOpts::new(false, None, None, false);
        assert_eq!(
            json_dumps(&v, &compact).unwrap(),
            r#"{"b": [1, 2.0, "it's", null, true], "a": {"x": "é\n"}}"#
        );
        let ascii = JsonOpts::new(true, Some("  ".into()), None, true);
        assert_eq!(
            json_dumps(&v, &ascii).unwrap(),
            "{\n  \"a\": {\n    \"x\": \"\\u00e9\\n\"\n  },\n  \"b\": [\n    1,\n    2.0,\n    \
             \"it's\",\n    null,\n    true\n  ]\n}"
        );
    }
}
