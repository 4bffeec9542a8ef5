//! A registry call's JSON arguments kept derived, per thread, for the replays of a hot key.
//!
//! A registry replay decodes the call's JSON arguments (text: `Registry::call_json`, an
//! HTTP tool's body through `HttpTools`; a `Value`: `Registry::call`, an MCP `tools/call`)
//! into the tool's parameters and derives the key and the canonical arguments from them
//! before the store is asked. For a key replayed over and over with the same arguments (a
//! retry loop, a herd of duplicates) that decode and derivation is most of the replay's
//! cost. Each thread keeps what it derived from one set of arguments for one tool in one
//! scope, and a call with *the same arguments for the same tool in the same scope* takes
//! that key and those arguments instead of decoding again ([`recall`]); the parameters are
//! decoded only if the body must run.
//!
//! "The same arguments" is the same keyed 128-bit hash of the arguments as given
//! ([`digest_of`]): text byte for byte; a `Value` as its tree, numbers by kind and bits
//! (`7` is not `7.0`, `-0.0` is not `0.0`). A fast hash ([`quick_of`]) tells most other
//! arguments apart first, and the keyed hash confirms a match. That hash is SipHash-2-4
//! with 128-bit output, a pseudorandom function under a 128-bit key drawn from the
//! operating system once per process ([`sip_key`]) and never shown: arguments crafted to
//! meet the kept ones' hash would have to guess the key, and two different arguments
//! share it with probability 2^-128. A recall needs only that no other arguments pass for
//! the kept ones, not a digest anyone can recompute, which a SHA-256 gave at a higher cost.
//! If the operating system gives no key, nothing is kept. The entry holds the two hashes,
//! not the arguments, so no argument (a `Secret`'s clear value among them) stays in memory
//! after its call; what it holds besides is the key and the canonical arguments, which the
//! store keeps anyway.
//!
//! What it never changes: which call is made. The key and the arguments are a function of
//! the arguments given, the tool and the scope (`docs/key-spec.md`); the members check and
//! the decode refuse the same arguments the same way every time. The process-wide settings
//! a call reads are read again on every recall: the arguments' size limit
//! ([`max_argument_bytes`](crate::ambient::max_argument_bytes)), the approval rule, a tool
//! name shared by two contracts. Nothing is kept for arguments any of them refused (the
//! call is kept only once made), so there is nothing to invalidate: the store, its expiry
//! and the arguments' check answer every call as before.
//!
//! Bounds: one entry per thread, kept only on the second derivation in a row of the same
//! arguments for the same tool (a recall clears what the last derivation saw, so the kept
//! entry stays while other arguments come in turn), and only for arguments up to
//! [`KEEP_MAX_BYTES`] (of text, or of a `Value`'s strings, names and nodes). Every registry
//! call of a tool with this entry point pays the fast hash of its arguments; the keyed hash
//! is paid only to keep arguments and to confirm a recall. A tool whose
//! `Deserialize` is not a function of its input alone (a `#[serde(default = ...)]` that
//! draws a random value) gets the arguments of the kept decode on a recall, where a decode
//! would draw again (and the store would then refuse the retry as other arguments); such a
//! default has no place in a mutating tool's arguments (docs/guarantees.md, section 8).
//!
//! Written here rather than with a caching crate, as `decoded.rs` is: one entry compared
//! by its digest, which no general cache's API expresses more simply.

use core::cell::RefCell;
use core::hash::{BuildHasher, Hasher};
use std::sync::{Arc, OnceLock};

use serde_json::Value;
use siphasher::sip128::{Hasher128, SipHasher24};

use crate::decoded::tool_id;
use crate::engine::Call;
use crate::registry::CallArgs;
use crate::spec::ToolSpec;

/// Arguments over this size (bytes of JSON text, or of a `Value`'s strings, names and
/// nodes) are decoded every time, never kept.
pub(crate) const KEEP_MAX_BYTES: usize = 16 * 1024;

/// A `Value` nested deeper than this is decoded every time, never kept (`serde_json`'s own
/// parser stops at 128).
const MAX_DEPTH: usize = 128;

/// The keyed 128-bit hash of a call's arguments as given ([`digest_of`]): what a recall is
/// decided by, so no argument (a `Secret`'s clear value among them) outlives its call in
/// the memo.
type ArgsDigest = u128;

/// What this thread derived from one set of arguments: the tool, the scope and the
/// hashes of the arguments it came from.
struct Kept {
    /// The tool's spec, by address (each tool has its own `static`).
    tool: usize,
    scope: Option<Arc<str>>,
    /// [`quick_of`]: calls whose arguments differ are told apart without the keyed hash.
    quick: u64,
    digest: ArgsDigest,
    key: String,
    args: String,
}

/// This thread's entry, and what the last derivation that did not keep one saw.
#[derive(Default)]
struct Memo {
    /// The tool and the [`quick_of`] hash of the arguments of the last derivation: a second
    /// derivation of the same arguments for the same tool keeps it. A recall clears it.
    seen: Option<(usize, u64)>,
    kept: Option<Kept>,
}

thread_local! {
    static MEMO: RefCell<Memo> = RefCell::new(Memo::default());
}

/// What [`recall`] found: the call kept for these arguments, or the arguments' [`quick_of`]
/// hash for [`note`] (`None`: arguments never kept, over [`KEEP_MAX_BYTES`] or
/// [`MAX_DEPTH`]).
#[doc(hidden)]
pub enum Recall {
    /// The call derived before from the same arguments, for the same tool and scope.
    Kept(Call),
    /// Not kept: the hash to note the call the full path makes under.
    Missed(Option<u64>),
}

thread_local! {
    /// The buffer a `Value`'s encoding is written to ([`with_encoding`]), reused.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// `f` given `given`'s encoding, one prefix-free form for each kind (`kind`, hashed first):
/// text byte for byte (`T`); a `Value` as its tree (`V`), with numbers by kind and bits
/// (`7`, `7.0` and `-0.0` all differ from one another and from `0.0`), every string, name
/// and list led by its length ([`len16`]) and object members in the map's order (sorted by
/// name). `None` for arguments over [`KEEP_MAX_BYTES`] or [`MAX_DEPTH`].
fn with_encoding<R>(given: &CallArgs<'_>, f: impl FnOnce(u8, &[u8]) -> R) -> Option<R> {
    match given {
        CallArgs::Text(text) => (text.len() <= KEEP_MAX_BYTES).then(|| f(b'T', text.as_bytes())),
        CallArgs::Value(value) => SCRATCH
            .try_with(|scratch| {
                let mut buf = scratch.try_borrow_mut().ok()?;
                buf.clear();
                let mut budget = KEEP_MAX_BYTES;
                encode_value(value, &mut buf, &mut budget, 0)?;
                Some(f(b'V', &buf))
            })
            .ok()
            .flatten(),
    }
}

/// `n` bytes taken from `budget`, `None` if it has fewer.
fn take(budget: &mut usize, n: usize) -> Option<()> {
    *budget = budget.checked_sub(n)?;
    Some(())
}

/// `len` as two bytes: every length in a kept encoding is under [`KEEP_MAX_BYTES`]
/// (`None` for one that is not, and then the arguments are not kept).
fn len16(len: usize) -> Option<[u8; 2]> {
    u16::try_from(len).ok().map(u16::to_le_bytes)
}

/// `value`'s tree written to `buf`, `None` once it passes `budget` bytes or [`MAX_DEPTH`].
fn encode_value(value: &Value, buf: &mut Vec<u8>, budget: &mut usize, depth: usize) -> Option<()> {
    if depth > MAX_DEPTH {
        return None;
    }
    take(budget, 9)?;
    match value {
        Value::Null => buf.push(b'n'),
        Value::Bool(true) => buf.push(b't'),
        Value::Bool(false) => buf.push(b'f'),
        Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => {
                buf.push(b'u');
                buf.extend_from_slice(&u.to_le_bytes());
            }
            (None, Some(i), _) => {
                buf.push(b'i');
                buf.extend_from_slice(&i.to_le_bytes());
            }
            (None, None, Some(f)) => {
                buf.push(b'd');
                buf.extend_from_slice(&f.to_bits().to_le_bytes());
            }
            // No other kind without `arbitrary_precision`, which this crate does not use.
            (None, None, None) => return None,
        },
        Value::String(s) => {
            take(budget, s.len())?;
            buf.push(b's');
            buf.extend_from_slice(&len16(s.len())?);
            buf.extend_from_slice(s.as_bytes());
        }
        Value::Array(items) => {
            buf.push(b'a');
            buf.extend_from_slice(&len16(items.len())?);
            for item in items {
                encode_value(item, buf, budget, depth + 1)?;
            }
        }
        Value::Object(members) => {
            buf.push(b'o');
            buf.extend_from_slice(&len16(members.len())?);
            for (name, member) in members {
                take(budget, name.len() + 2)?;
                buf.extend_from_slice(&len16(name.len())?);
                buf.extend_from_slice(name.as_bytes());
                encode_value(member, buf, budget, depth + 1)?;
            }
        }
    }
    Some(())
}

/// A fast 64-bit hash (foldhash) of an encoding, which tells most different arguments
/// apart; a match is confirmed by [`digest_of`].
fn quick_of(kind: u8, bytes: &[u8]) -> u64 {
    let mut hasher = foldhash::fast::FixedState::with_seed(0).build_hasher();
    hasher.write_u8(kind);
    hasher.write(bytes);
    hasher.finish()
}

/// This process's key for [`digest_of`], drawn once from the operating system (`getrandom`);
/// `None` if it gave none, and then nothing is kept.
fn sip_key() -> Option<(u64, u64)> {
    static KEY: OnceLock<Option<(u64, u64)>> = OnceLock::new();
    *KEY.get_or_init(|| Some((getrandom::u64().ok()?, getrandom::u64().ok()?)))
}

/// The keyed SipHash-2-4-128 of an encoding under [`sip_key`]: without the key, no caller can
/// make other arguments meet it, whatever they send to make the [`quick_of`] hashes meet.
/// `None` without a key.
fn digest_of(kind: u8, bytes: &[u8]) -> Option<ArgsDigest> {
    let (k0, k1) = sip_key()?;
    let mut hasher = SipHasher24::new_with_keys(k0, k1);
    hasher.write_u8(kind);
    hasher.write(bytes);
    Some(hasher.finish128().as_u128())
}

/// The quick hash of `given` (tests).
#[cfg(test)]
fn quick(given: &CallArgs<'_>) -> Option<u64> {
    with_encoding(given, quick_of)
}

/// The keyed hash of `given` (tests).
#[cfg(test)]
fn digest(given: &CallArgs<'_>) -> Option<ArgsDigest> {
    with_encoding(given, digest_of).flatten()
}

/// The call `spec` made on this thread from the same arguments (`given`) in the caller's
/// current scope, if this thread kept it and today's settings still accept it; otherwise
/// the arguments' quick hash, and the caller takes the full path (decode, derive), which
/// also reports any refusal.
pub(crate) fn recall(spec: &'static ToolSpec, given: &CallArgs<'_>) -> Recall {
    let tool = tool_id(spec);
    // One borrow: the kept entry's quick hash compared, then its keyed hash (no user code runs
    // while it is held), and on a match what the last derivation saw cleared.
    let found = with_encoding(given, |kind, bytes| {
        let hash = quick_of(kind, bytes);
        let parts = MEMO
            .try_with(|memo| {
                let mut memo = memo.try_borrow_mut().ok()?;
                let kept = memo.kept.as_ref().filter(|kept| {
                    kept.tool == tool
                        && kept.quick == hash
                        && Some(kept.digest) == digest_of(kind, bytes)
                })?;
                let parts = (kept.key.clone(), kept.scope.clone(), kept.args.clone());
                memo.seen = None;
                Some(parts)
            })
            .ok()
            .flatten();
        (hash, parts)
    });
    let Some((hash, parts)) = found else {
        return Recall::Missed(None);
    };
    let missed = Recall::Missed(Some(hash));
    let Some((key, scope, args)) = parts else {
        return missed;
    };
    // Read again on every recall: the scope this call runs in, and the settings the full
    // path would apply to these arguments.
    let Ok(current) = crate::ambient::caller_scope(spec.name) else {
        return missed;
    };
    if current.as_deref() != scope.as_deref()
        || args.len() > crate::ambient::max_argument_bytes()
        || crate::contracts::check_unique(spec.name).is_err()
    {
        return missed;
    }
    Recall::Kept(Call::recalled(spec, key, current, args))
}

/// Notes that `call` was derived for `spec` from `given`, whose quick hash [`recall`]
/// returned (`hash`): kept (with the keyed hash of `given`) on the second time in a row for
/// the same tool and arguments.
pub(crate) fn note(spec: &'static ToolSpec, given: &CallArgs<'_>, hash: Option<u64>, call: &Call) {
    let Some(hash) = hash else {
        return;
    };
    let tool = tool_id(spec);
    let _ = MEMO.try_with(|memo| {
        let Ok(mut memo) = memo.try_borrow_mut() else {
            return;
        };
        if memo.seen != Some((tool, hash)) {
            memo.seen = Some((tool, hash));
            return;
        }
        memo.seen = None;
        let Some(digest) = with_encoding(given, digest_of).flatten() else {
            return;
        };
        let (key, scope, args) = call.derived();
        memo.kept = Some(Kept {
            tool,
            scope: scope.cloned(),
            quick: hash,
            digest,
            key: key.to_owned(),
            args: args.to_owned(),
        });
    });
}

#[cfg(test)]
mod tests {
    use super::{digest, note, quick, recall, Recall, MEMO};
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

    /// The full path's turn for `given`: [`recall`], and on a miss the derivation noted.
    fn call(spec: &'static ToolSpec, given: &CallArgs<'_>) -> Option<Call> {
        match recall(spec, given) {
            Recall::Kept(call) => Some(call),
            Recall::Missed(hash) => {
                note(spec, given, hash, &derive(spec, 1));
                None
            }
        }
    }

    /// `given` derived twice in a row, as the full path does: kept from then on.
    fn keep(spec: &'static ToolSpec, given: &CallArgs<'_>) {
        call(spec, given);
        call(spec, given);
    }

    /// Whether [`recall`] finds `given` kept, noting nothing.
    fn kept(spec: &'static ToolSpec, given: &CallArgs<'_>) -> bool {
        matches!(recall(spec, given), Recall::Kept(_))
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
    fn arguments_derived_twice_in_a_row_are_recalled_as_derived() {
        clear();
        let text = CallArgs::Text(r#"{"n":1}"#);
        assert!(call(&SPEC, &text).is_none(), "nothing kept yet");
        assert!(
            call(&SPEC, &text).is_none(),
            "kept on the second time, not recalled"
        );
        let recalled = call(&SPEC, &text).expect("kept on the second time");
        assert_eq!(parts(&recalled), parts(&derive(&SPEC, 1)));
    }

    #[test]
    fn other_bytes_another_tool_or_two_texts_in_turn_are_not_recalled() {
        clear();
        let text = CallArgs::Text(r#"{"n":1}"#);
        keep(&SPEC, &text);
        assert!(kept(&SPEC, &text));
        assert!(!kept(&SPEC, &CallArgs::Text(r#"{"n": 1}"#)), "other bytes");
        assert!(!kept(&OTHER, &text), "another tool");
        clear();
        for n in 0..6 {
            let text = if n % 2 == 0 {
                r#"{"n":1}"#
            } else {
                r#"{"n": 1}"#
            };
            assert!(call(&SPEC, &CallArgs::Text(text)).is_none(), "call {n}");
        }
    }

    #[test]
    fn the_kept_arguments_stay_kept_between_other_calls() {
        clear();
        let (hot, other) = (CallArgs::Text(r#"{"n":1}"#), CallArgs::Text(r#"{"n": 1}"#));
        keep(&SPEC, &hot);
        // A recall counts as no derivation: `other` in turn with `hot` is never kept, and
        // `hot` is recalled every time.
        for _ in 0..4 {
            assert!(call(&SPEC, &other).is_none());
            assert!(call(&SPEC, &hot).is_some());
        }
    }

    #[test]
    fn a_quick_hash_that_meets_the_kept_ones_is_not_a_recall() {
        clear();
        let (kept_text, other) = (CallArgs::Text(r#"{"n":1}"#), CallArgs::Text(r#"{"n":2}"#));
        keep(&SPEC, &kept_text);
        // As if `other`'s quick hash collided with the kept arguments': the keyed hash decides.
        MEMO.with(|m| {
            if let Some(kept) = m.borrow_mut().kept.as_mut() {
                kept.quick = quick(&other).unwrap();
            }
        });
        assert!(!kept(&SPEC, &other));
    }

    #[tokio::test]
    async fn a_recall_in_another_scope_is_the_full_paths_call() {
        clear();
        let text = CallArgs::Text(r#"{"n":1}"#);
        crate::with_scope("tenant-a", async {
            keep(&SPEC, &text);
            assert!(kept(&SPEC, &text), "kept in its scope");
        })
        .await;
        assert!(!kept(&SPEC, &text), "no scope is another scope");
        crate::with_scope("tenant-b", async {
            assert!(!kept(&SPEC, &text), "another tenant's key is not ours");
        })
        .await;
    }

    #[test]
    fn an_equal_value_is_recalled_and_another_number_is_not() {
        clear();
        let value = serde_json::json!({"n": 1, "tags": ["a", "b"], "x": 0.0});
        keep(&SPEC, &CallArgs::Value(value.clone()));
        let reordered: serde_json::Value =
            serde_json::from_str(r#"{"x": 0.0, "tags": ["a", "b"], "n": 1}"#).unwrap();
        let Recall::Kept(recalled) = recall(&SPEC, &CallArgs::Value(reordered)) else {
            panic!("an equal value is recalled");
        };
        assert_eq!(parts(&recalled), parts(&derive(&SPEC, 1)));
        for other in [
            serde_json::json!({"n": 1.0, "tags": ["a", "b"], "x": 0.0}),
            serde_json::json!({"n": 1, "tags": ["a", "b"], "x": -0.0}),
            serde_json::json!({"n": 1, "tags": ["a", "b"], "x": 0}),
            serde_json::json!({"n": 1, "tags": ["b", "a"], "x": 0.0}),
            serde_json::json!({"n": 1, "tags": ["ab"], "x": 0.0}),
            serde_json::json!({"n": 1, "tags": "ab", "x": 0.0}),
            serde_json::json!({"n": 1, "tags": [["a", "b"]], "x": 0.0}),
            serde_json::json!({"n": 1, "tagsx": ["a", "b"], "": 0.0}),
            serde_json::json!({"n": 1, "tags": ["a", "b"], "x": 0.0, "y": null}),
        ] {
            assert!(!kept(&SPEC, &CallArgs::Value(other.clone())), "{other}");
        }
        let text = CallArgs::Text(r#"{"n":1,"tags":["a","b"],"x":0.0}"#);
        assert!(!kept(&SPEC, &text), "text is compared with text only");
    }

    #[test]
    fn arguments_over_the_bound_or_depth_are_never_kept() {
        clear();
        let big = "x".repeat(super::KEEP_MAX_BYTES);
        let text = format!(r#"{{"n":1,"pad":"{big}"}}"#);
        let value = serde_json::json!({"n": 1, "pad": big});
        let mut deep = serde_json::json!(1);
        for _ in 0..=super::MAX_DEPTH {
            deep = serde_json::json!([deep]);
        }
        for given in [
            CallArgs::Text(&text),
            CallArgs::Value(value),
            CallArgs::Value(deep),
        ] {
            assert!(digest(&given).is_none());
            keep(&SPEC, &given);
            assert!(MEMO.with(|m| m.borrow().kept.is_none()), "nothing kept");
        }
        // Just under the bound is kept.
        let small = CallArgs::Text(r#"{"n":1}"#);
        keep(&SPEC, &small);
        assert!(MEMO.with(|m| m.borrow().kept.is_some()));
    }
}
