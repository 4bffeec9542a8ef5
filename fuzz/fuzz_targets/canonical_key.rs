//! `write_canonical` never panics on any JSON value, and writes exactly what an independent,
//! deliberately naive JCS writer (below, written from docs/key-spec.md) writes; a key built
//! from the value is the SHA-256 of the reference document.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tool_contracts::key::{tool_key, write_canonical, CanonicalError, KeyFieldError};

const MAX_SAFE_INTEGER: u64 = 9_007_199_254_740_991;

fuzz_target!(|data: &[u8]| {
    // serde_json's parser stops at 128 levels of nesting, so the recursion below is bounded.
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let mut expected = String::new();
    reference(&value, &mut expected);

    let mut out = Vec::new();
    if let Err(e) = write_canonical(&value, &mut out) {
        panic!("write_canonical refused a parsed JSON value: {e}\nvalue: {value}");
    }
    let Ok(written) = std::str::from_utf8(&out) else {
        panic!("write_canonical wrote invalid UTF-8 for {value}");
    };
    assert_eq!(written, expected, "canonical form differs for {value}");
    // The key of a call with this value as its only field. A float of magnitude 2^53 or
    // more anywhere in it may be the rounding of another number: refused (key spec 3.3).
    let empty = matches!(expected.as_str(), "null" | "\"\"" | "[]" | "{}");
    let inexact = has_inexact_float(&value);
    match tool_key("fuzz_tool", 3, Some("tenant"), &[("f.g", &value)]) {
        Ok(key) => {
            assert!(!empty, "an empty key field was accepted: {value}");
            assert!(
                !inexact,
                "a float of magnitude 2^53 or more was keyed: {value}"
            );
            let document = format!(
                r#"{{"contract":"tool-contracts/key/v1","fields":{{"f.g":{expected}}},"scope":"tenant","tool":"fuzz_tool","version":3}}"#
            );
            assert_eq!(
                key,
                hex(&Sha256::digest(document.as_bytes())),
                "key of {value}"
            );
        }
        Err(KeyFieldError::Empty { .. }) => assert!(empty, "refused as empty: {value}"),
        Err(KeyFieldError::Encode {
            source: CanonicalError::InexactNumber(_),
            ..
        }) => assert!(inexact, "refused as inexact: {value}"),
        Err(e) => panic!("tool_key failed on {value}: {e}"),
    }
});

/// Whether `value` holds, at any depth, a float (serde_json keeps every number outside the
/// 64-bit integer range as one) whose magnitude is 2^53 or more.
fn has_inexact_float(value: &Value) -> bool {
    match value {
        Value::Number(n) => {
            n.as_u64().is_none()
                && n.as_i64().is_none()
                && n.as_f64()
                    .is_some_and(|f| f.abs() >= 9_007_199_254_740_992.0)
        }
        Value::Array(items) => items.iter().any(has_inexact_float),
        Value::Object(members) => members.values().any(has_inexact_float),
        _ => false,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// RFC 8785 plus the key spec's big-integer rule, the obvious way.
fn reference(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                if u > MAX_SAFE_INTEGER {
                    out.push_str(&format!("\"{u}\""));
                } else {
                    out.push_str(&u.to_string());
                }
            } else if let Some(i) = n.as_i64() {
                if i.unsigned_abs() > MAX_SAFE_INTEGER {
                    out.push_str(&format!("\"{i}\""));
                } else {
                    out.push_str(&i.to_string());
                }
            } else if let Some(f) = n.as_f64() {
                assert!(f.is_finite(), "serde_json produced a non-finite number");
                if f == 0.0 {
                    out.push('0');
                } else {
                    out.push_str(ryu_js::Buffer::new().format_finite(f));
                }
            } else {
                panic!("a serde_json number that is neither integer nor float: {n}");
            }
        }
        Value::String(s) => string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                reference(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut members: Vec<(&String, &Value)> = map.iter().collect();
            members.sort_by(|a, b| {
                let a: Vec<u16> = a.0.encode_utf16().collect();
                let b: Vec<u16> = b.0.encode_utf16().collect();
                a.cmp(&b)
            });
            out.push('{');
            for (i, (name, member)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                string(name, out);
                out.push(':');
                reference(member, out);
            }
            out.push('}');
        }
    }
}

fn string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}
