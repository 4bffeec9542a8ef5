//! Idempotency keys: the key spec in code (`docs/key-spec.md`, contract
//! `tool-contracts/key/v1`).
//!
//! A key is the lowercase hex SHA-256 of the canonical JSON document
//!
//! ```text
//! {"contract":"tool-contracts/key/v1","fields":{<path>:<value>,...},"scope":<string|null>,"tool":<name>,"version":<integer>}
//! ```
//!
//! `docs/key-spec.md` is the language-independent specification (what a Python or
//! JavaScript client implements); `tests/key_vectors.json` pins it with vectors computed
//! by an independent Python implementation (`tests/key_vectors.py`).
//!
//! The module, by the question each file answers:
//!
//! - `mod.rs`, what is the key: the contract strings, [`KeyBuilder`] (the document, field
//!   by field, and its digest), [`tool_key`], [`write_canonical`];
//! - `canonical.rs`, how is a value written: numbers, strings and their escapes, the JCS
//!   order of object members ([`jcs_cmp`]);
//! - `serializer.rs`, how does serde reach the writer: the `serde::Serializer` that maps
//!   any `Serialize` value onto it as `serde_json::to_value` would;
//! - `hex.rs`: lowercase hex, the one encoder of keys, `\u00xx` escapes and
//!   [`Secret`](crate::Secret) digests;
//! - `tests.rs`: the unit tests, checked against a naive JCS written independently.
//!
//! # Why the crate writes canonical JSON itself
//!
//! JCS crates exist (`serde_jcs`, `json-canon`, ...). The key does not use one, for three
//! reasons.
//!
//! **The spec departs from plain RFC 8785 on purpose.** For every `x: Serialize` the
//! writer produces the bytes of JCS applied to `serde_json::to_value(x)`, except where
//! those would let two intents share a key, or one intent have different keys in
//! different languages or builds:
//!
//! - integers with magnitude above 2^53 - 1 are written as JSON strings of their decimal
//!   digits (spec section 3.3): RFC 8785 writes every number as the IEEE 754 double that
//!   other languages parse it into, and a double cannot hold them. This also gives
//!   `i128`/`u128` values outside the 64-bit range a form, where `to_value` fails;
//! - key fields (and [`Secret`](crate::Secret) digests) refuse numbers that may not be
//!   exact, [`CanonicalError::InexactNumber`] (spec section 3.3): a float of magnitude
//!   2^53 or more, or integer text outside the 64-bit range, at any depth. By the time
//!   such a number reaches the crate it may be the rounding of another one (`serde_json`
//!   reads both `18446744073709551616` and `18446744073709551617` as one double). Other
//!   arguments are written as JCS writes them;
//! - a key field whose canonical value is `null`, `""`, `[]` or `{}` is refused,
//!   [`KeyFieldError::Empty`] (spec section 2): an absent intent must never collapse
//!   distinct calls onto one key;
//! - NaN and infinities are an error, [`CanonicalError::NonFinite`], as RFC 8785 requires,
//!   where `to_value` gives `null`;
//! - `serde_json`'s private number and raw-value tokens (its `arbitrary_precision` and
//!   `raw_value` features) are decoded, so a feature switched on elsewhere in the
//!   dependency graph cannot silently change keys;
//! - a `Secret` is keyed as `{"sha256":"<hex>"}`, the digest of its exact canonical
//!   JSON: the writer runs once inside another run (`secret.rs`).
//!
//! A JCS crate writes `u64::MAX` as a number and a key field of `1e21` without complaint;
//! bending its output to these rules would take a pass over a `serde_json::Value` first,
//! which is the allocation the next point avoids.
//!
//! **No intermediate value.** The writer is a `serde::Serializer` that streams canonical
//! bytes straight into one `Vec<u8>`: no `serde_json::Value` (a node per value, a `String`
//! per map key and string) is built on the hot path, which derives a key on every call.
//! Arrays are streamed; object members are written as they arrive and moved into order in
//! place only when they did not arrive in it; a [`KeyBuilder`] reuses its buffers across
//! fields and, per thread, across keys.
//!
//! **Keys must stay byte-stable across dependency releases.** Keys are stored and
//! compared across deploys. If a dependency changed how it formats a number or escapes a
//! character, every key would change silently: a retry that straddles the deploy would
//! miss its record and run again, breaking dedup exactly when it is needed. The bytes are
//! decided here and pinned by `tests/key_vectors.json`; the only formatting delegated is
//! `ryu-js`'s shortest round-trip digits for floats (ECMA-262's algorithm, pinned by the
//! RFC 8785 Appendix B vectors in the tests) and `serde_json`'s for float map keys (the
//! spec writes them "as `serde_json` formats them").

use core::cell::Cell;

use serde::Serialize;
use sha2::{Digest, Sha256};

mod canonical;
mod hex;
mod serializer;
#[cfg(test)]
mod tests;

/// The canonical JSON string writer, for documents built by hand elsewhere in the crate
/// (`downstream.rs`' derived keys), which cannot fail as `write_canonical` can.
#[cfg_attr(not(feature = "http-client"), allow(unused_imports))]
pub(crate) use canonical::write_str as write_canonical_str;
pub use canonical::{jcs_cmp, CanonicalError};
pub(crate) use hex::push_hex;

use canonical::{write_str, write_u64};
use serializer::{write_canonical_with, Scratch};

/// The literal of [`TOOL_KEY_CONTRACT`], for `concat!` in [`TOOL_KEY_HEADER`].
macro_rules! tool_key_contract {
    () => {
        "tool-contracts/key/v1"
    };
}

/// Contract string of tool keys.
pub const TOOL_KEY_CONTRACT: &str = tool_key_contract!();

/// The start of every tool key document (the contract needs no escaping), written in one
/// copy by [`KeyBuilder::new`].
const TOOL_KEY_HEADER: &str = concat!("{\"contract\":\"", tool_key_contract!(), "\",\"fields\":{");

/// Appends the JCS canonical JSON of `value` to `out`.
///
/// The bytes are those of RFC 8785 applied to `serde_json::to_value(value)`, except that
/// integers with magnitude above 2^53 - 1 become strings of their digits and NaN or
/// infinity is an error (see the module documentation). On error `out` is left exactly as
/// it was.
///
/// ```
/// use tool_contracts_runtime::key::write_canonical;
///
/// let mut out = Vec::new();
/// write_canonical(&serde_json::json!({"b": [1.0, 1e21], "a": "é\n"}), &mut out)?;
/// assert_eq!(out, "{\"a\":\"é\\n\",\"b\":[1,1e+21]}".as_bytes());
/// # Ok::<(), tool_contracts_runtime::key::CanonicalError>(())
/// ```
pub fn write_canonical<T: ?Sized + Serialize>(
    value: &T,
    out: &mut Vec<u8>,
) -> Result<(), CanonicalError> {
    write_canonical_with(value, out, &mut Scratch::default(), false)
}

/// As [`write_canonical`], with the key fields' number rule: a float whose magnitude is
/// 2^53 or more is refused ([`CanonicalError::InexactNumber`]), at any depth. Used for key
/// fields and [`Secret`](crate::Secret) digests, where two values must never share bytes.
pub(crate) fn write_canonical_exact<T: ?Sized + Serialize>(
    value: &T,
    out: &mut Vec<u8>,
) -> Result<(), CanonicalError> {
    write_canonical_with(value, out, &mut Scratch::default(), true)
}

/// Error from [`KeyBuilder::field`] and [`tool_key`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyFieldError {
    /// The field's canonical value is `null`, `""`, `[]` or `{}`.
    ///
    /// A missing intent must never collapse many distinct calls onto one key, so an empty
    /// key field is refused rather than hashed.
    #[error(
        "key field `{field}` is {found}: an empty key field would make unrelated calls share \
         one idempotency key, so the call is refused; pass a non-empty `{field}` (or key the \
         tool on a field that always identifies the request)"
    )]
    Empty {
        /// The field path, as written in the tool's `key` attribute.
        field: String,
        /// What was found: `"null"`, `"an empty string"`, `"an empty array"` or
        /// `"an empty object"`.
        found: &'static str,
    },
    /// The field's value cannot be encoded canonically.
    #[error("key field `{field}` cannot be encoded as canonical JSON: {source}")]
    Encode {
        /// The field path, as written in the tool's `key` attribute.
        field: String,
        /// Why encoding failed.
        source: CanonicalError,
    },
    /// The same field path was given twice to [`tool_key`].
    #[error("key field `{field}` is given more than once; give each field path once")]
    DuplicateField {
        /// The repeated field path.
        field: String,
    },
}

/// Builds one key: fields must be added in JCS order of their paths (callers pre-sort;
/// checked with `debug_assert!`), then finish.
///
/// The builder streams the canonical document into one buffer and reuses its scratch
/// space across fields and nested objects, so deriving a key costs a handful of
/// allocations whatever the shape of the field values.
///
/// ```
/// use tool_contracts_runtime::key::{KeyBuilder, TOOL_KEY_CONTRACT};
///
/// let mut key = KeyBuilder::new(TOOL_KEY_CONTRACT);
/// key.field("cart.id", "c-42")?; // paths in `jcs_cmp` order
/// key.field("user_id", &7_u64)?;
/// assert_eq!(
///     key.finish_document(None, "checkout", 1),
///     br#"{"contract":"tool-contracts/key/v1","fields":{"cart.id":"c-42","user_id":7},"scope":null,"tool":"checkout","version":1}"#,
/// );
/// # Ok::<(), tool_contracts_runtime::key::KeyFieldError>(())
/// ```
#[derive(Debug, Clone)]
pub struct KeyBuilder {
    /// The document written so far (up to the last field) and the object encoder's
    /// buffers, taken from this thread's spare and given back by `finish`.
    bufs: Box<Spare>,
    /// Number of fields written.
    fields: usize,
    /// Last field path, to check the caller's ordering.
    #[cfg(debug_assertions)]
    last_path: Option<String>,
}

impl KeyBuilder {
    /// Starts a key document for `contract` (e.g. [`TOOL_KEY_CONTRACT`]).
    #[must_use]
    pub fn new(contract: &str) -> Self {
        let mut bufs = SPARE
            .try_with(Cell::take)
            .ok()
            .flatten()
            .unwrap_or_default();
        let doc = &mut bufs.doc;
        doc.clear();
        doc.reserve(160 + contract.len());
        if contract == TOOL_KEY_CONTRACT {
            doc.extend_from_slice(TOOL_KEY_HEADER.as_bytes());
        } else {
            doc.extend_from_slice(b"{\"contract\":");
            write_str(doc, contract);
            doc.extend_from_slice(b",\"fields\":{");
        }
        KeyBuilder {
            bufs,
            fields: 0,
            #[cfg(debug_assertions)]
            last_path: None,
        }
    }

    /// Adds the key field `path` (as written in the tool's attribute, e.g. `cart.id`) with
    /// the JSON value of `value`.
    ///
    /// Paths must come in strictly increasing [`jcs_cmp`] order (checked in debug builds).
    /// On error nothing is added and the builder stays usable.
    ///
    /// # Errors
    ///
    /// [`KeyFieldError::Empty`] if the canonical value is `null`, `""`, `[]` or `{}`;
    /// [`KeyFieldError::Encode`] if it has no canonical form.
    pub fn field<T: ?Sized + Serialize>(
        &mut self,
        path: &str,
        value: &T,
    ) -> Result<(), KeyFieldError> {
        self.field_with(path, value, |doc| {
            write_str(doc, path);
            doc.push(b':');
        })
    }

    /// [`field`](Self::field) with the member's name already encoded: `member` is
    /// `"<path>":`, the canonical string of `path` and a colon, which `#[mutating_tool]`
    /// writes out at compile time (a path is a Rust identifier path: nothing in it is
    /// escaped). Checked against `path` in debug builds.
    ///
    /// For generated code, which writes `member` from the same path: a `member` that is not
    /// `path`'s encoding gives a wrong key in release builds, silently.
    ///
    /// # Errors
    ///
    /// As [`field`](Self::field).
    #[doc(hidden)]
    #[inline]
    pub fn field_member<T: ?Sized + Serialize>(
        &mut self,
        member: &'static str,
        path: &str,
        value: &T,
    ) -> Result<(), KeyFieldError> {
        #[cfg(debug_assertions)]
        {
            let mut expected = Vec::new();
            write_str(&mut expected, path);
            expected.push(b':');
            debug_assert_eq!(
                member.as_bytes(),
                expected,
                "the encoded member does not match its path"
            );
        }
        self.field_with(path, value, |doc| doc.extend_from_slice(member.as_bytes()))
    }

    /// Writes one field: a comma after the first, the member's name by `name`, its value.
    #[inline]
    fn field_with<T: ?Sized + Serialize>(
        &mut self,
        path: &str,
        value: &T,
        name: impl FnOnce(&mut Vec<u8>),
    ) -> Result<(), KeyFieldError> {
        #[cfg(debug_assertions)]
        {
            if let Some(last) = &self.last_path {
                debug_assert!(
                    jcs_cmp(last, path) == core::cmp::Ordering::Less,
                    "key fields must be added in strictly increasing JCS order: `{last}` then `{path}`"
                );
            }
        }
        let Spare { doc, scratch } = &mut *self.bufs;
        let mark = doc.len();
        if self.fields > 0 {
            doc.push(b',');
        }
        name(doc);
        let value_start = doc.len();
        if let Err(source) = write_canonical_with(value, doc, scratch, true) {
            doc.truncate(mark);
            return Err(KeyFieldError::Encode {
                field: path.to_owned(),
                source,
            });
        }
        let found = match doc.get(value_start..) {
            Some(b"null") => Some("null"),
            Some(b"\"\"") => Some("an empty string"),
            Some(b"[]") => Some("an empty array"),
            Some(b"{}") => Some("an empty object"),
            _ => None,
        };
        if let Some(found) = found {
            doc.truncate(mark);
            return Err(KeyFieldError::Empty {
                field: path.to_owned(),
                found,
            });
        }
        self.fields += 1;
        #[cfg(debug_assertions)]
        {
            self.last_path = Some(path.to_owned());
        }
        Ok(())
    }

    /// Appends the canonical JSON of `value` to `out`, as [`write_canonical`] does, with this
    /// builder's scratch space: a call's arguments document, written beside its key, then
    /// costs no allocation of its own for the objects in it.
    pub(crate) fn write_value<T: ?Sized + Serialize>(
        &mut self,
        value: &T,
        out: &mut Vec<u8>,
    ) -> Result<(), CanonicalError> {
        write_canonical_with(value, out, &mut self.bufs.scratch, false)
    }

    /// Returns the 64-char lowercase hex key.
    #[must_use]
    pub fn finish(mut self, scope: Option<&str>, tool: &str, version: u32) -> String {
        self.close_document(scope, tool, version);
        self.digest()
    }

    /// [`finish`](Self::finish) with the document's end already encoded: `tail` is
    /// `,"tool":<tool>,"version":<version>}` as [`key_tail`] writes it, which
    /// `#[mutating_tool]` writes out at compile time. Checked against `tool` and `version`
    /// in debug builds.
    ///
    /// For generated code, which writes `tail` from the tool's own name and version: a
    /// `tail` that is not theirs gives a wrong key in release builds, silently.
    #[doc(hidden)]
    #[must_use]
    pub fn finish_tail(
        mut self,
        scope: Option<&str>,
        tail: &'static str,
        tool: &str,
        version: u32,
    ) -> String {
        debug_assert_eq!(
            tail,
            key_tail(tool, version),
            "the encoded tail does not match its tool"
        );
        let doc = &mut self.bufs.doc;
        doc.extend_from_slice(b"},\"scope\":");
        match scope {
            Some(scope) => write_str(doc, scope),
            None => doc.extend_from_slice(b"null"),
        }
        doc.extend_from_slice(tail.as_bytes());
        self.digest()
    }

    /// The lowercase hex SHA-256 of the closed document; the buffers go back to the thread.
    fn digest(self) -> String {
        let key = const_hex::encode(Sha256::digest(&self.bufs.doc));
        Spare::keep(self.bufs);
        key
    }

    /// The canonical document bytes that finish() hashes (for tests/debugging).
    #[must_use]
    pub fn finish_document(mut self, scope: Option<&str>, tool: &str, version: u32) -> Vec<u8> {
        self.close_document(scope, tool, version);
        let doc = core::mem::take(&mut self.bufs.doc);
        Spare::keep(self.bufs);
        doc
    }

    /// Appends the members after `fields` and closes the document.
    fn close_document(&mut self, scope: Option<&str>, tool: &str, version: u32) {
        let doc = &mut self.bufs.doc;
        doc.extend_from_slice(b"},\"scope\":");
        match scope {
            Some(scope) => write_str(doc, scope),
            None => doc.extend_from_slice(b"null"),
        }
        write_tail(doc, tool, version);
    }
}

/// Appends the end of a key document after its scope: `,"tool":<tool>,"version":<n>}`.
fn write_tail(doc: &mut Vec<u8>, tool: &str, version: u32) {
    doc.extend_from_slice(b",\"tool\":");
    write_str(doc, tool);
    doc.extend_from_slice(b",\"version\":");
    write_u64(doc, u64::from(version));
    doc.push(b'}');
}

/// The end of a key document after its scope, `,"tool":<tool>,"version":<version>}`: what
/// `#[mutating_tool]` writes out at compile time for [`KeyBuilder::finish_tail`] (and what
/// the tests check it against).
#[doc(hidden)]
#[must_use]
pub fn key_tail(tool: &str, version: u32) -> String {
    let mut doc = Vec::new();
    write_tail(&mut doc, tool, version);
    // The writer emits valid UTF-8: `str`s and ASCII only.
    String::from_utf8(doc).unwrap_or_default()
}

/// Buffers of a finished [`KeyBuilder`], kept for the next key built on the same thread so
/// that a key costs no allocation for its document or scratch space once warm.
///
/// Kept boxed: a builder takes and gives back one pointer. Moving the buffers themselves
/// (four `Vec`s) in and out of the thread-local took about 9% of a short key's time, most
/// of it stalled on wide copies of words just written (BENCHMARKS.md).
#[derive(Debug, Clone, Default)]
struct Spare {
    doc: Vec<u8>,
    scratch: Scratch,
}

/// Buffers larger than this are dropped rather than kept, so one huge key does not pin its
/// memory to the thread.
const SPARE_MAX_BYTES: usize = 64 * 1024;

thread_local! {
    static SPARE: Cell<Option<Box<Spare>>> = const { Cell::new(None) };
}

impl Spare {
    /// Keeps these buffers for the next [`KeyBuilder::new`] on this thread (emptied; any
    /// buffer over [`SPARE_MAX_BYTES`] is dropped instead).
    fn keep(mut bufs: Box<Spare>) {
        let Spare { doc, scratch } = &mut *bufs;
        doc.clear();
        if doc.capacity() > SPARE_MAX_BYTES {
            *doc = Vec::new();
        }
        scratch.recycle(SPARE_MAX_BYTES);
        // During thread teardown there is nowhere to keep them: they are dropped.
        let _ = SPARE.try_with(|spare| spare.set(Some(bufs)));
    }
}

/// Convenience for clients and tests: key of a tool call from already-extracted JSON field
/// values (any order; sorted inside).
///
/// ```
/// use tool_contracts_runtime::key::tool_key;
///
/// let id = serde_json::json!("c-42");
/// let key = tool_key("checkout", 1, None, &[("cart.id", &id)])?;
/// assert_eq!(key.len(), 64);
/// # Ok::<(), tool_contracts_runtime::key::KeyFieldError>(())
/// ```
///
/// # Errors
///
/// As [`KeyBuilder::field`], plus [`KeyFieldError::DuplicateField`] if a path repeats.
pub fn tool_key(
    tool: &str,
    version: u32,
    scope: Option<&str>,
    fields: &[(&str, &serde_json::Value)],
) -> Result<String, KeyFieldError> {
    let mut sorted: Vec<&(&str, &serde_json::Value)> = fields.iter().collect();
    sorted.sort_by(|a, b| jcs_cmp(a.0, b.0));
    if let Some(pair) = sorted.windows(2).find(|w| match w {
        [a, b] => a.0 == b.0,
        _ => false,
    }) {
        let field = pair.first().map_or("", |f| f.0).to_owned();
        return Err(KeyFieldError::DuplicateField { field });
    }
    let mut builder = KeyBuilder::new(TOOL_KEY_CONTRACT);
    for (path, value) in sorted {
        builder.field(path, *value)?;
    }
    Ok(builder.finish(scope, tool, version))
}

/// Marks the fingerprint format: one truncated SHA-256 of the canonical arguments document
/// (a later format gets another prefix, so the two can never be confused).
const FINGERPRINT_PREFIX: &str = "a1:";

/// What identifies a call's arguments (stored with its claim, compared by later calls of
/// the key): one digest of the whole canonical document, so one SHA-256 per call whatever
/// the number of parameters; which parameters differ is worked out from the stored
/// arguments only when the digests differ.
pub(crate) fn fingerprint(args: &str) -> String {
    let digest = Sha256::digest(args.as_bytes());
    let mut out = String::with_capacity(FINGERPRINT_PREFIX.len() + 32);
    out.push_str(FINGERPRINT_PREFIX);
    push_hex(&mut out, &digest[..16]);
    out
}
