//! A registry call's JSON text kept derived, per thread, for the replays of a hot key.
//!
//! A registry replay of a call given as JSON text (`Registry::call_json`, an HTTP tool's
//! body through `HttpTools`; MCP hands its arguments over as a `Value`) decodes the text
//! into the tool's parameters and derives the key and the canonical arguments from them
//! before the store is asked. For a key replayed over and over with the same body (a retry
//! loop, a herd of duplicates) that decode and derivation is most of the replay's cost. Each thread keeps what it derived
//! from one text for one tool in one scope, and a call with *byte-identical text for the
//! same tool in the same scope* takes that key and those arguments instead of decoding
//! again ([`recall`]); the parameters are decoded only if the body must run.
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
//! text for the same tool (calls with distinct texts pay a hash of the text, not a copy),
//! and only for texts up to [`KEEP_MAX_BYTES`]. A tool whose `Deserialize` is not a
//! function of the text alone (a `#[serde(default = ...)]` that draws a random value) gets
//! the arguments of the kept decode on a recall, where a decode would draw again; such a
//! default has no place in a mutating tool's arguments (docs/guarantees.md, section 8).
//!
//! Written here rather than with a caching crate, as `decoded.rs` is: one entry compared
//! byte for byte, which no general cache's API expresses more simply.

use core::cell::RefCell;
use core::hash::BuildHasher;
use std::sync::Arc;

use crate::engine::Call;
use crate::spec::ToolSpec;

/// Texts over this size (bytes of JSON) are decoded every time, never kept.
pub(crate) const KEEP_MAX_BYTES: usize = 16 * 1024;

/// What this thread derived from one text: the tool, the scope and the text it came from.
struct Kept {
    /// The tool's spec, by address (each tool has its own `static`).
    tool: usize,
    scope: Option<Arc<str>>,
    text: Box<str>,
    key: String,
    args: String,
}

/// This thread's entry, and what the last derivation that did not keep one saw.
#[derive(Default)]
struct Memo {
    /// The tool and the hash of the text of the last derivation: a second derivation of
    /// the same text for the same tool keeps it.
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

/// The call `spec` made on this thread from byte-identical `text` in the caller's current
/// scope, if this thread kept it and today's settings still accept it; `None` sends the
/// caller down the full path (decode, derive), which also reports any refusal.
pub(crate) fn recall(spec: &'static ToolSpec, text: &str) -> Option<Call> {
    if text.len() > KEEP_MAX_BYTES {
        return None;
    }
    let tool = tool_id(spec);
    let (key, scope, args) = MEMO
        .try_with(|memo| {
            let memo = memo.try_borrow().ok()?;
            let kept = memo.kept.as_ref()?;
            if kept.tool != tool || *kept.text != *text {
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

/// Notes that `call` was derived from `text` for `spec`: kept on the second time in a row
/// for the same tool and text.
pub(crate) fn note(spec: &'static ToolSpec, text: &str, call: &Call) {
    if text.len() > KEEP_MAX_BYTES {
        return;
    }
    let tool = tool_id(spec);
    let hash = foldhash::fast::FixedState::with_seed(0).hash_one(text);
    let _ = MEMO.try_with(|memo| {
        let Ok(mut memo) = memo.try_borrow_mut() else {
            return;
        };
        if memo.seen == Some((tool, hash)) {
            memo.seen = None;
            let (key, scope, args) = call.derived();
            memo.kept = Some(Kept {
                tool,
                scope: scope.cloned(),
                text: text.into(),
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
        assert!(recall(&SPEC, text).is_none(), "nothing kept yet");
        note(&SPEC, text, &derive(&SPEC, 1));
        assert!(
            recall(&SPEC, text).is_none(),
            "kept on the second time only"
        );
        note(&SPEC, text, &derive(&SPEC, 1));
        let recalled = recall(&SPEC, text).expect("kept on the second time");
        assert_eq!(parts(&recalled), parts(&derive(&SPEC, 1)));
    }

    #[test]
    fn another_text_or_tool_is_not_recalled() {
        clear();
        let text = r#"{"n":1}"#;
        note(&SPEC, text, &derive(&SPEC, 1));
        note(&SPEC, text, &derive(&SPEC, 1));
        assert!(recall(&SPEC, r#"{"n": 1}"#).is_none(), "other bytes");
        assert!(recall(&OTHER, text).is_none(), "another tool");
        // Two texts in turn never keep either.
        clear();
        for n in 0..4 {
            let text = if n % 2 == 0 {
                r#"{"n":1}"#
            } else {
                r#"{"n": 1}"#
            };
            note(&SPEC, text, &derive(&SPEC, 1));
        }
        assert!(recall(&SPEC, r#"{"n":1}"#).is_none());
    }

    #[tokio::test]
    async fn a_recall_in_another_scope_is_the_full_paths_call() {
        clear();
        let text = r#"{"n":1}"#;
        crate::with_scope("tenant-a", async {
            note(&SPEC, text, &derive(&SPEC, 1));
            note(&SPEC, text, &derive(&SPEC, 1));
            assert!(recall(&SPEC, text).is_some(), "kept in its scope");
        })
        .await;
        assert!(recall(&SPEC, text).is_none(), "no scope is another scope");
        crate::with_scope("tenant-b", async {
            assert!(
                recall(&SPEC, text).is_none(),
                "another tenant's key is not ours"
            );
        })
        .await;
    }

    #[test]
    fn a_text_over_the_bound_is_never_kept() {
        clear();
        let text = format!(r#"{{"n":1,"pad":"{}"}}"#, "x".repeat(super::KEEP_MAX_BYTES));
        note(&SPEC, &text, &derive(&SPEC, 1));
        note(&SPEC, &text, &derive(&SPEC, 1));
        assert!(recall(&SPEC, &text).is_none());
    }
}
