//! A replay's stored result kept decoded, per thread, for the replays of a hot key.
//!
//! A replay decodes the stored result's JSON into the tool's type every time; for a key
//! replayed over and over (a retry loop, a herd of duplicates) that decode is the largest
//! cost left after the key's hash. When the result type is `Clone` (found at compile time,
//! [`__private::KeepProbe`](crate::__private::KeepProbe)), each thread keeps the value it
//! decoded for one stored text, and a replay of *the same stored text for the same tool*
//! hands back a clone instead of decoding again.
//!
//! What it never changes: which record is replayed, and whether. The store, the scope,
//! the expiry and the arguments' check have all answered before a result is decoded;
//! this only replaces `serde_json::from_str(text)` by a clone of an earlier
//! `serde_json::from_str(text)` of byte-identical `text`. So there is nothing to
//! invalidate: a record removed, expired or rewritten is not handed to the decode at all,
//! and another text is another entry.
//!
//! Bounds: one entry per thread, kept only on the second decode in a row of the same text
//! for the same tool (a replay of distinct keys pays a hash of the text, not a clone), and
//! only for results under [`KEEP_MAX_BYTES`] of JSON. A type whose `Clone` shares mutable
//! state (an `Arc<Mutex<_>>` in a result) would share it between replays on one thread;
//! decoding gives each replay its own (docs/guarantees.md).
//!
//! A registry call given a `Value` (`Registry::call`, MCP `tools/call`) turns that value
//! into a `serde_json::Value` on every replay (`serde_json::to_value`). For the same tools
//! (a `Clone` result), each thread also keeps the `Value` it encoded for one stored text
//! ([`kept_value`], [`note_value`]), by the same rule: the same tool and byte-identical
//! stored text, kept on its second encoding in a row. A replay it answers is neither
//! decoded nor encoded again; the `Value` is a clone of an earlier `to_value` of a decode of
//! the same text.
//!
//! Written here rather than with a caching crate: the entry is keyed by the exact text and
//! holds a value of a type known only to the tool's expansion (a `Box<dyn Any>` with the
//! expansion's own copy function), which no general cache's API expresses more simply.

use core::any::Any;
use core::cell::RefCell;
use core::hash::BuildHasher;

use crate::engine::Codec;
use crate::spec::ToolSpec;

/// Results over this size (bytes of JSON) are decoded every time, never kept.
pub(crate) const KEEP_MAX_BYTES: usize = 64 * 1024;

/// How to keep and copy a tool's result `T`: built only for `T: Clone + 'static`
/// ([`__private::KeepProbe`](crate::__private::KeepProbe)), as two function pointers, so
/// the engine needs no bound of its own on `T`.
#[doc(hidden)]
pub struct Keeper<T> {
    /// A clone of the kept value, if it is a `T`.
    copy: fn(&dyn Any) -> Option<T>,
    /// A clone of `value`, boxed for keeping.
    keep: fn(&T) -> Box<dyn Any>,
}

impl<T> Clone for Keeper<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Keeper<T> {}

impl<T: Clone + 'static> Keeper<T> {
    /// Keeps and copies `T` by `Clone`.
    pub(crate) const fn cloning() -> Self {
        Self {
            copy: |kept| kept.downcast_ref::<T>().cloned(),
            keep: |value| Box::new(value.clone()),
        }
    }
}

/// What this thread kept for one stored text: the tool it belongs to, the text, and what
/// was made from it (the decoded result, or its `Value`).
struct Kept<V> {
    /// The tool's spec, by address (each tool has its own `static`).
    tool: usize,
    text: Box<str>,
    value: V,
}

/// One of this thread's entries, and what the last call that did not keep one saw.
struct Memo<V> {
    /// The tool and the hash of the text last seen: a second time in a row for the same
    /// text and tool keeps what was made from it.
    seen: Option<(usize, u64)>,
    kept: Option<Kept<V>>,
}

impl<V> Default for Memo<V> {
    fn default() -> Self {
        Self {
            seen: None,
            kept: None,
        }
    }
}

/// A thread's entry, as `thread_local!` declares it.
type Local<V> = std::thread::LocalKey<RefCell<Memo<V>>>;

thread_local! {
    /// The decoded result ([`decode`]).
    static MEMO: RefCell<Memo<Box<dyn Any>>> = RefCell::new(Memo::default());
    /// The `Value` encoded from the result ([`kept_value`]).
    static VALUES: RefCell<Memo<serde_json::Value>> = RefCell::new(Memo::default());
}

/// `copy` of what `memo` kept for `tool` and byte-identical `text`, if it kept it.
fn lookup<V: 'static, R>(
    memo: &'static Local<V>,
    tool: usize,
    text: &str,
    copy: impl FnOnce(&V) -> Option<R>,
) -> Option<R> {
    memo.try_with(|memo| {
        let memo = memo.try_borrow().ok()?;
        let kept = memo.kept.as_ref()?;
        if kept.tool != tool || *kept.text != *text {
            return None;
        }
        copy(&kept.value)
    })
    .ok()
    .flatten()
}

/// Notes that `tool` made a value from `text`: on the second time in a row for the same
/// tool and text, `memo` keeps `make()` for it.
fn note<V: 'static>(memo: &'static Local<V>, tool: usize, text: &str, make: impl FnOnce() -> V) {
    let hash = foldhash::fast::FixedState::with_seed(0).hash_one(text);
    // The entry replaced, dropped after the borrow ends (its `Drop` may be the user's).
    let replaced = memo
        .try_with(|memo| {
            let mut memo = memo.try_borrow_mut().ok()?;
            if memo.seen == Some((tool, hash)) {
                memo.seen = None;
                memo.kept.replace(Kept {
                    tool,
                    text: text.into(),
                    value: make(),
                })
            } else {
                memo.seen = Some((tool, hash));
                None
            }
        })
        .ok()
        .flatten();
    drop(replaced);
}

/// A clone of the `Value` this thread encoded for `spec` from byte-identical stored `text`,
/// if it kept one.
pub(crate) fn kept_value(spec: &'static ToolSpec, text: &str) -> Option<serde_json::Value> {
    lookup(&VALUES, tool_id(spec), text, |value| Some(value.clone()))
}

/// Notes that a replay of `spec` encoded stored `text` as `value`: kept on the second time
/// in a row for the same tool and text (texts up to [`KEEP_MAX_BYTES`]).
pub(crate) fn note_value(spec: &'static ToolSpec, text: &str, value: &serde_json::Value) {
    if text.len() <= KEEP_MAX_BYTES {
        note(&VALUES, tool_id(spec), text, || value.clone());
    }
}

/// The address that stands for `spec` in an entry (here and in `derived.rs`): each tool
/// has its own `static` spec.
pub(crate) fn tool_id(spec: &'static ToolSpec) -> usize {
    core::ptr::from_ref(spec) as usize
}

/// `text` decoded as the tool's result: a clone of the value this thread kept for the
/// same tool and byte-identical text, else `codec`'s decode (kept on its second time in a
/// row when `keeper` is given).
pub(crate) fn decode<T>(
    spec: &'static ToolSpec,
    keeper: Option<Keeper<T>>,
    codec: &Codec<T>,
    text: &str,
) -> Result<T, serde_json::Error> {
    let Some(keeper) = keeper.filter(|_| text.len() <= KEEP_MAX_BYTES) else {
        return codec.decode(text);
    };
    let tool = tool_id(spec);
    if let Some(copy) = lookup(&MEMO, tool, text, |kept| (keeper.copy)(&**kept)) {
        return Ok(copy);
    }
    let value = codec.decode(text)?;
    note(&MEMO, tool, text, || (keeper.keep)(&value));
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::{decode, kept_value, note_value, Keeper, MEMO, VALUES};
    use crate::engine::Codec;
    use crate::spec::{SourceLocation, ToolKind, ToolSpec};
    use core::cell::Cell;

    const HERE: SourceLocation = SourceLocation {
        module_path: module_path!(),
        file: file!(),
        line: line!(),
        column: column!(),
    };
    static SPEC: ToolSpec = ToolSpec::fixture("decoded_a", ToolKind::Mutating, &[], &[], HERE);
    static OTHER: ToolSpec = ToolSpec::fixture("decoded_b", ToolKind::Mutating, &[], &[], HERE);

    thread_local! {
        /// How many times [`Counted`] was decoded on this thread.
        static DECODES: Cell<u32> = const { Cell::new(0) };
    }

    /// A result that counts its decodes.
    #[derive(Clone, Debug, PartialEq, serde::Serialize)]
    struct Counted(String);

    impl<'de> serde::Deserialize<'de> for Counted {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            DECODES.with(|n| n.set(n.get() + 1));
            String::deserialize(d).map(Counted)
        }
    }

    fn decodes() -> u32 {
        DECODES.with(Cell::get)
    }

    /// A fresh memo and count on this thread, with the codec and keeper of [`Counted`].
    fn setup() -> (Codec<Counted>, Option<Keeper<Counted>>) {
        MEMO.with(|m| *m.borrow_mut() = super::Memo::default());
        DECODES.with(|n| n.set(0));
        (Codec::json(), Some(Keeper::cloning()))
    }

    #[test]
    fn the_same_text_is_decoded_twice_then_cloned() {
        let (codec, keeper) = setup();
        for _ in 0..5 {
            let value = decode(&SPEC, keeper, &codec, "\"a\"").unwrap();
            assert_eq!(value, Counted("a".into()));
        }
        assert_eq!(decodes(), 2, "decoded on its first and second replay only");
    }

    #[test]
    fn another_text_or_tool_or_no_keeper_is_decoded() {
        let (codec, keeper) = setup();
        decode(&SPEC, keeper, &codec, "\"a\"").unwrap();
        decode(&SPEC, keeper, &codec, "\"a\"").unwrap();
        assert_eq!(decodes(), 2);
        // Same tool, other text: decoded, and its own value.
        assert_eq!(
            decode(&SPEC, keeper, &codec, "\"b\"").unwrap(),
            Counted("b".into())
        );
        assert_eq!(decodes(), 3);
        // Other tool, the kept text: decoded.
        assert_eq!(
            decode(&OTHER, keeper, &codec, "\"a\"").unwrap(),
            Counted("a".into())
        );
        assert_eq!(decodes(), 4);
        // No keeper (a result type that is not `Clone`): decoded every time.
        decode(&SPEC, None, &codec, "\"a\"").unwrap();
        assert_eq!(decodes(), 5);
        // The kept entry is still the first one.
        decode(&SPEC, keeper, &codec, "\"a\"").unwrap();
        assert_eq!(decodes(), 5);
    }

    #[test]
    fn a_text_that_does_not_decode_is_an_error_every_time() {
        let (codec, keeper) = setup();
        for _ in 0..3 {
            assert!(decode(&SPEC, keeper, &codec, "42").is_err());
        }
    }

    #[test]
    fn large_results_are_never_kept() {
        let (codec, keeper) = setup();
        let big = format!("\"{}\"", "x".repeat(super::KEEP_MAX_BYTES));
        for _ in 0..3 {
            decode(&SPEC, keeper, &codec, &big).unwrap();
        }
        assert_eq!(decodes(), 3);
    }

    #[test]
    fn a_value_is_kept_on_its_second_encoding_of_the_same_text_for_the_same_tool() {
        VALUES.with(|m| *m.borrow_mut() = super::Memo::default());
        let (a, b) = (serde_json::json!({"n": 1}), serde_json::json!({"n": 2}));
        assert_eq!(kept_value(&SPEC, "{\"n\":1}"), None);
        note_value(&SPEC, "{\"n\":1}", &a);
        assert_eq!(
            kept_value(&SPEC, "{\"n\":1}"),
            None,
            "kept on the second time only"
        );
        note_value(&SPEC, "{\"n\":1}", &a);
        assert_eq!(kept_value(&SPEC, "{\"n\":1}"), Some(a.clone()));
        // Another text, another tool: not the kept one's.
        assert_eq!(kept_value(&SPEC, "{\"n\": 1}"), None);
        assert_eq!(kept_value(&OTHER, "{\"n\":1}"), None);
        // Two texts in turn keep nothing new; the kept entry stays.
        note_value(&SPEC, "{\"n\":2}", &b);
        note_value(&OTHER, "{\"n\":2}", &b);
        note_value(&SPEC, "{\"n\":2}", &b);
        assert_eq!(kept_value(&SPEC, "{\"n\":2}"), None);
        assert_eq!(kept_value(&SPEC, "{\"n\":1}"), Some(a));
        // Over the bound: never kept.
        let big = format!("\"{}\"", "x".repeat(super::KEEP_MAX_BYTES));
        note_value(&SPEC, &big, &b);
        note_value(&SPEC, &big, &b);
        assert_eq!(kept_value(&SPEC, &big), None);
    }
}
