//! A registry call's JSON arguments kept derived, per thread, for the replays of a hot key.
//!
//! A registry replay decodes the call's JSON arguments (text: `Registry::call_json`, an
//! HTTP tool's body through `HttpTools`; a `Value`: `Registry::call`, an MCP `tools/call`)
//! into the tool's parameters and derives the key and the canonical arguments from them
//! before the store is asked. For a key replayed over and over with the same arguments (a
//! retry loop, a herd of duplicates) that decode and derivation is most of the replay's
//! cost. Each thread keeps what it derived from one set of arguments for one tool in one
//! scope, and a call with *byte-identical text, or an equal `Value`, for the same tool in
//! the same scope* takes that key and those arguments instead of decoding again
//! ([`recall`]); the parameters are decoded only if the body must run. Text is compared
//! byte for byte; a `Value` by `serde_json`'s equality (the same members with equal values,
//! in any order, and numbers of the same kind: `7` is not `7.0`).
//!
//! What it never changes: which call is made. The key and the arguments are a function of
//! the text, the tool and the scope (`docs/key-spec.md`); the members check and the
//! decode refuse a text the same way every time. The process-wide settings a call reads
//! are read again on every recall: the arguments' size limit
//! ([`max_argument_bytes`](crate::ambient::max_argument_bytes)), the approval rule, a tool
//! name shared by two contracts. Nothing is kept for a text that any of them refused (the
//! call is kept only once made), so there is nothing to invalidate: the store, its expiry
//! and the arguments' check answer every call as before.
//!
//! Bounds: one entry per thread, kept only on the second derivation in a row of the same
//! arguments for the same tool (calls with distinct arguments pay a hash of them, not a
//! copy), and only for arguments up to [`KEEP_MAX_BYTES`] (of text, or of their canonical
//! form for a `Value`). A tool whose `Deserialize` is not a
//! function of the text alone (a `#[serde(default = ...)]` that draws a random value) gets
//! the arguments of the kept decode on a recall, where a decode would draw again; such a
//! default has no place in a mutating tool's arguments (docs/guarantees.md, section 8).
//!
//! Written here rather than with a caching crate, as `decoded.rs` is: one entry compared
//! in full, which no general cache's API expresses more simply.

use core::cell::RefCell;
use core::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;

use serde_json::Value;

use crate::engine::Call;
use crate::registry::CallArgs;
use crate::spec::ToolSpec;

/// Arguments over this size (bytes of JSON text, or of a `Value`'s canonical form) are
/// decoded every time, never kept.
pub(crate) const KEEP_MAX_BYTES: usize = 16 * 1024;

/// How deep [`hash_value`] looks into a `Value`: below, members are not hashed (two values
/// that differ only there hash alike, and the second is kept on its first time: harmless).
const HASH_DEPTH: usize = 16;

/// The arguments a call was derived from, as the caller gave them.
enum Source {
    Text(Box<str>),
    Value(Value),
}

/// What this thread derived from one set of arguments: the tool, the scope and the
/// arguments it came from.
struct Kept {
    /// The tool's spec, by address (each tool has its own `static`).
    tool: usize,
    scope: Option<Arc<str>>,
    source: Source,
    key: String,
    args: String,
}

/// This thread's entry, and what the last derivation that did not keep one saw.
#[derive(Default)]
struct Memo {
    /// The tool and the hash of the arguments of the last derivation: a second derivation
    /// of the same arguments for the same tool keeps it.
    seen: Option<(usize, u64)>,
    kept: Option<Kept>,
}

thread_local! {
    static MEMO: RefCell<Memo> = RefCell::new(Memo::default());
}

/// The address that stands for `spec` in an entry.
fn tool_id(spec: &'static ToolSpec) -> usize {
    core::ptr::from_ref(spec) as usize
}

/// Whether `given` is the arguments `source` was: the same text byte for byte, or an
/// equal `Value`.
fn same(source: &Source, given: &CallArgs<'_>) -> bool {
    match (source, given) {
        (Source::Text(kept), CallArgs::Text(text)) => **kept == **text,
        (Source::Value(kept), CallArgs::Value(value)) => kept == value,
        _ => false,
    }
}

/// The call `spec` made on this thread from the same arguments (`given`) in the caller's
/// current scope, if this thread kept it and today's settings still accept it; `None`
/// sends the caller down the full path (decode, derive), which also reports any refusal.
pub(crate) fn recall(spec: &'static ToolSpec, given: &CallArgs<'_>) -> Option<Call> {
    if matches!(given, CallArgs::Text(text) if text.len() > KEEP_MAX_BYTES) {
        return None;
    }
    let tool = tool_id(spec);
    let (key, scope, args) = MEMO
        .try_with(|memo| {
            let memo = memo.try_borrow().ok()?;
            let kept = memo.kept.as_ref()?;
            if kept.tool != tool || !same(&kept.source, given) {
                return None;
            }
            Some((kept.key.clone(), kept.scope.clone(), kept.args.clone()))
        })
        .ok()
        .flatten()?;
    // Read again on every recall: the scope this call runs in, and the settings the full
    // path would apply to these arguments.
    let current = crate::ambient::caller_scope(spec.name).ok()?;
    if current.as_deref() != scope.as_deref()
        || args.len() > crate::ambient::max_argument_bytes()
        || crate::contracts::check_unique(spec.name).is_err()
    {
        return None;
    }
    Some(Call::recalled(spec, key, current, args))
}

/// `value` fed to `state`, to [`HASH_DEPTH`]: `serde_json::Value` has no `Hash`. Object
/// members in the map's order, which is the same for equal maps (sorted by name).
fn hash_value(value: &Value, state: &mut impl Hasher, depth: usize) {
    core::mem::discriminant(value).hash(state);
    match value {
        Value::Null => {}
        Value::Bool(b) => b.hash(state),
        Value::Number(n) => {
            n.as_u64().hash(state);
            n.as_i64().hash(state);
            n.as_f64().map(f64::to_bits).hash(state);
        }
        Value::String(s) => s.hash(state),
        Value::Array(items) => {
            items.len().hash(state);
            if depth < HASH_DEPTH {
                items.iter().for_each(|v| hash_value(v, state, depth + 1));
            }
        }
        Value::Object(members) => {
            members.len().hash(state);
            if depth < HASH_DEPTH {
                for (name, v) in members {
                    name.hash(state);
                    hash_value(v, state, depth + 1);
                }
            }
        }
    }
}

/// Notes that `call` was derived from `given` for `spec`: kept on the second time in a
/// row for the same tool and arguments.
pub(crate) fn note(spec: &'static ToolSpec, given: &CallArgs<'_>, call: &Call) {
    let (key, scope, args) = call.derived();
    let size = match given {
        CallArgs::Text(text) => text.len(),
        CallArgs::Value(_) => args.len(),
    };
    if size > KEEP_MAX_BYTES {
        return;
    }
    let tool = tool_id(spec);
    let mut state = foldhash::fast::FixedState::with_seed(0).build_hasher();
    match given {
        CallArgs::Text(text) => text.hash(&mut state),
        CallArgs::Value(value) => hash_value(value, &mut state, 0),
    }
    let hash = state.finish();
    let _ = MEMO.try_with(|memo| {
        let Ok(mut memo) = memo.try_borrow_mut() else {
            return;
        };
        if memo.seen == Some((tool, hash)) {
            memo.seen = None;
            let source = match given {
                CallArgs::Text(text) => Source::Text((*text).into()),
                CallArgs::Value(value) => Source::Value(value.clone()),
            };
            memo.kept = Some(Kept {
                tool,
                scope: scope.cloned(),
                source,
                key: key.to_owned(),
                args: args.to_owned(),
            });
        } else {
            memo.seen = Some((tool, hash));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::{note, recall, MEMO};
    use crate::engine::{Call, CallBuilder};
    use crate::registry::CallArgs;
    use crate::spec::{SourceLocation, ToolKind, ToolSpec};

    const HERE: SourceLocation = SourceLocation {
        module_path: module_path!(),
        file: file!(),
        line: line!(),
        column: column!(),
    };
    static SPEC: ToolSpec = ToolSpec::fixture("derived_a", ToolKind::Mutating, &[], &[], HERE);
    static OTHER: ToolSpec = ToolSpec::fixture("derived_b", ToolKind::Mutating, &[], &[], HERE);

    /// The call `spec` makes for `{"n": n}` in the current scope, as the full path makes it.
    fn derive(spec: &'static ToolSpec, n: u64) -> Call {
        let mut builder = CallBuilder::new(spec);
        builder.key_field("n", &n);
        builder.arg("n", &n);
        builder.finish().unwrap()
    }

    fn clear() {
        MEMO.with(|m| *m.borrow_mut() = super::Memo::default());
    }

    /// The key and arguments of a call, to compare a recall with a derivation.
    fn parts(call: &Call) -> (String, Option<String>, String) {
        let (key, scope, args) = call.derived();
        (
            key.to_owned(),
            scope.map(|s| s.to_string()),
            args.to_owned(),
        )
    }

    #[test]
    fn a_text_derived_twice_in_a_row_is_recalled_as_derived() {
        clear();
        let text = r#"{"n":1}"#;
        assert!(
            recall(&SPEC, &CallArgs::Text(text)).is_none(),
            "nothing kept yet"
        );
        note(&SPEC, &CallArgs::Text(text), &derive(&SPEC, 1));
        assert!(
            recall(&SPEC, &CallArgs::Text(text)).is_none(),
            "kept on the second time only"
        );
        note(&SPEC, &CallArgs::Text(text), &derive(&SPEC, 1));
        let recalled = recall(&SPEC, &CallArgs::Text(text)).expect("kept on the second time");
        assert_eq!(parts(&recalled), parts(&derive(&SPEC, 1)));
    }

    #[test]
    fn another_text_or_tool_is_not_recalled() {
        clear();
        let text = r#"{"n":1}"#;
        note(&SPEC, &CallArgs::Text(text), &derive(&SPEC, 1));
        note(&SPEC, &CallArgs::Text(text), &derive(&SPEC, 1));
        assert!(
            recall(&SPEC, &CallArgs::Text(r#"{"n": 1}"#)).is_none(),
            "other bytes"
        );
        assert!(
            recall(&OTHER, &CallArgs::Text(text)).is_none(),
            "another tool"
        );
        // Two texts in turn never keep either.
        clear();
        for n in 0..4 {
            let text = if n % 2 == 0 {
                r#"{"n":1}"#
            } else {
                r#"{"n": 1}"#
            };
            note(&SPEC, &CallArgs::Text(text), &derive(&SPEC, 1));
        }
        assert!(recall(&SPEC, &CallArgs::Text(r#"{"n":1}"#)).is_none());
    }

    #[tokio::test]
    async fn a_recall_in_another_scope_is_the_full_paths_call() {
        clear();
        let text = r#"{"n":1}"#;
        crate::with_scope("tenant-a", async {
            note(&SPEC, &CallArgs::Text(text), &derive(&SPEC, 1));
            note(&SPEC, &CallArgs::Text(text), &derive(&SPEC, 1));
            assert!(
                recall(&SPEC, &CallArgs::Text(text)).is_some(),
                "kept in its scope"
            );
        })
        .await;
        assert!(
            recall(&SPEC, &CallArgs::Text(text)).is_none(),
            "no scope is another scope"
        );
        crate::with_scope("tenant-b", async {
            assert!(
                recall(&SPEC, &CallArgs::Text(text)).is_none(),
                "another tenant's key is not ours"
            );
        })
        .await;
    }

    #[test]
    fn an_equal_value_is_recalled_and_another_kind_of_number_is_not() {
        clear();
        let value = serde_json::json!({"n": 1, "tags": ["a", "b"]});
        note(&SPEC, &CallArgs::Value(value.clone()), &derive(&SPEC, 1));
        note(&SPEC, &CallArgs::Value(value.clone()), &derive(&SPEC, 1));
        let reordered: serde_json::Value =
            serde_json::from_str(r#"{"tags": ["a", "b"], "n": 1}"#).unwrap();
        let recalled = recall(&SPEC, &CallArgs::Value(reordered)).expect("an equal value");
        assert_eq!(parts(&recalled), parts(&derive(&SPEC, 1)));
        let float = serde_json::json!({"n": 1.0, "tags": ["a", "b"]});
        assert!(
            recall(&SPEC, &CallArgs::Value(float)).is_none(),
            "1.0 is not 1"
        );
        let other_order = serde_json::json!({"n": 1, "tags": ["b", "a"]});
        assert!(recall(&SPEC, &CallArgs::Value(other_order)).is_none());
        let text = CallArgs::Text(r#"{"n":1,"tags":["a","b"]}"#);
        assert!(
            recall(&SPEC, &text).is_none(),
            "text is compared with text only"
        );
    }

    #[test]
    fn a_text_over_the_bound_is_never_kept() {
        clear();
        let text = format!(r#"{{"n":1,"pad":"{}"}}"#, "x".repeat(super::KEEP_MAX_BYTES));
        note(&SPEC, &CallArgs::Text(&text), &derive(&SPEC, 1));
        note(&SPEC, &CallArgs::Text(&text), &derive(&SPEC, 1));
        assert!(recall(&SPEC, &CallArgs::Text(&text)).is_none());
    }
}
