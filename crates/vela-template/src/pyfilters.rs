//! Filters and tests whose MiniJinja built-ins differ from Jinja2 under Python semantics.
//!
//! Jinja2 converts non-string operands of string filters with Python `str()` (so a list of
//! content parts prints as `[{'type': 'text', ...}]`), and its type tests follow Python's
//! abstract base classes (`None` is not iterable, a `dict` is a sequence, `True` is a number).

use crate::pyfmt;
use minijinja::value::{Kwargs, Rest, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value};

/// Install the Python-compatible filters and tests into `env`.
pub fn register(env: &mut Environment<'static>) {
    env.add_filter("tojson", tojson_filter);
    env.add_filter("string", |v: Value| Value::from(pyfmt::py_str(&v)));
    env.add_filter("trim", trim);
    env.add_filter("upper", |v: Value| pyfmt::py_str(&v).to_uppercase());
    env.add_filter("lower", |v: Value| pyfmt::py_str(&v).to_lowercase());
    env.add_filter("join", join);
    // Jinja2's `Undefined` has `__len__` = 0; MiniJinja's `length` rejects undefined.
    let length = |v: Value| -> Result<usize, Error> {
        if v.is_undefined() {
            Ok(0)
        } else {
            minijinja::filters::length(&v)
        }
    };
    env.add_filter("length", length);
    env.add_filter("count", length);
    // Python's collections.abc semantics.
    env.add_test("iterable", |v: Value| {
        matches!(
            v.kind(),
            ValueKind::String | ValueKind::Seq | ValueKind::Map | ValueKind::Iterable
        )
    });
    env.add_test("sequence", |v: Value| {
        matches!(
            v.kind(),
            ValueKind::String | ValueKind::Seq | ValueKind::Map
        )
    });
    env.add_test("number", |v: Value| {
        matches!(v.kind(), ValueKind::Number | ValueKind::Bool)
    });
}

/// `str(value).strip(chars)`.
fn trim(value: Value, chars: Option<Value>) -> String {
    let s = pyfmt::py_str(&value);
    match chars.filter(|c| !c.is_none() && !c.is_undefined()) {
        Some(c) => {
            let set: Vec<char> = pyfmt::py_str(&c).chars().collect();
            s.trim_matches(|ch| set.contains(&ch)).to_string()
        }
        None => s.trim().to_string(),
    }
}

/// `d.join(str(x) for x in value)`, optionally over `attribute` of each item.
fn join(value: Value, d: Option<Value>, kwargs: Kwargs) -> Result<String, Error> {
    let sep = d.map(|d| pyfmt::py_str(&d)).unwrap_or_default();
    let attribute: Option<Value> = kwargs.get("attribute")?;
    kwargs.assert_all_used()?;
    if value.is_undefined() || value.is_none() {
        return Ok(String::new());
    }
    let mut parts = Vec::new();
    for item in value.try_iter()? {
        let item = match &attribute {
            Some(a) => item.get_item(a)?,
            None => item,
        };
        parts.push(pyfmt::py_str(&item));
    }
    Ok(parts.join(&sep))
}

/// HF's `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson_filter(value: Value, args: Rest<Value>, kwargs: Kwargs) -> Result<String, Error> {
    let mut slots: [Option<Value>; 4] = Default::default();
    if args.len() > slots.len() {
        return Err(Error::new(
            ErrorKind::TooManyArguments,
            "tojson takes at most 4 arguments",
        ));
    }
    for (slot, a) in slots.iter_mut().zip(args.iter()) {
        *slot = Some(a.clone());
    }
    for (i, name) in ["ensure_ascii", "indent", "separators", "sort_keys"]
        .iter()
        .enumerate()
    {
        if let Some(v) = kwargs.get::<Option<Value>>(name)? {
            slots[i] = Some(v);
        }
    }
    kwargs.assert_all_used()?;
    let [ensure_ascii, indent, separators, sort_keys] = slots;
    let truthy = |v: &Option<Value>| v.as_ref().is_some_and(|v| v.is_true());
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) if v.kind() == ValueKind::String => {
            Some(v.as_str().unwrap_or_default().to_string())
        }
        Some(v) => {
            let n = v.as_i64().ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be int or str",
                )
            })?;
            Some(" ".repeat(n.max(0) as usize))
        }
    };
    let separators = match separators {
        Some(v) if !v.is_none() && !v.is_undefined() => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] => Some((pyfmt::py_str(a), pyfmt::py_str(b))),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be a pair",
                    ))
                }
            }
        }
        _ => None,
    };
    let opts = pyfmt::JsonOpts::new(
        truthy(&ensure_ascii),
        indent,
        separators,
        truthy(&sort_keys),
    );
    pyfmt::json_dumps(&value, &opts)
}
