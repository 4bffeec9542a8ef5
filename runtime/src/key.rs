//! Idempotency key derivation: RFC 8785 (JCS) canonical JSON, hashed with SHA-256.
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
//! The encoder is a [`serde::Serializer`] that writes canonical bytes straight into a
//! `Vec<u8>`: no `serde_json::Value` is built on the hot path. For every `x: Serialize` it
//! produces the bytes of JCS applied to `serde_json::to_value(x)`, with three documented
//! differences, all of which make the key safer:
//!
//! - integers with magnitude above 2^53 - 1 are written as JSON strings of their decimal
//!   digits (they cannot round-trip through the IEEE doubles other languages parse into);
//!   this also gives `i128`/`u128` values outside the 64-bit range a form, where
//!   `serde_json::to_value` fails;
//! - NaN and infinities are an error ([`CanonicalError::NonFinite`]) instead of `null`, as
//!   RFC 8785 requires;
//! - `serde_json`'s private number and raw-value tokens (its `arbitrary_precision` and
//!   `raw_value` features) are decoded, so a feature switched on elsewhere in the
//!   dependency graph cannot silently change keys.
//!
//! Key fields (and [`Secret`](crate::Secret) digests) add one refusal: a float of magnitude
//! 2^53 or more, or integer text outside the 64-bit range, is
//! [`CanonicalError::InexactNumber`]. By the time such a number reaches the crate it may
//! be the rounding of another one (`serde_json` reads both `18446744073709551616` and
//! `18446744073709551617` as one double), and two intents must never share a key.

use core::cell::Cell;
use core::cmp::Ordering;
use core::fmt;

use serde::ser::{self, Impossible, Serialize};
use sha2::{Digest, Sha256};

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

/// Largest integer magnitude an IEEE 754 double holds exactly (2^53 - 1).
///
/// Integers beyond it are written as JSON strings; see the module documentation.
const MAX_SAFE_INTEGER: u64 = 9_007_199_254_740_991;

/// 2^53: the smallest float magnitude that a key field refuses (above it, neighbouring
/// integers round to the same double).
const FIRST_INEXACT_FLOAT: f64 = 9_007_199_254_740_992.0;

/// Struct name `serde_json` uses for numbers under its `arbitrary_precision` feature.
const SERDE_JSON_NUMBER_TOKEN: &str = "$serde_json::private::Number";
/// Struct name `serde_json` uses for `RawValue` under its `raw_value` feature.
const SERDE_JSON_RAW_TOKEN: &str = "$serde_json::private::RawValue";

/// Why a value cannot be encoded canonically.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CanonicalError {
    /// A float is NaN or infinite: RFC 8785 (section 3.2.2.3) gives those no JSON form.
    #[error(
        "NaN and infinite numbers have no canonical JSON form (RFC 8785 section 3.2.2.3); \
         replace the value with a finite number, a string or null before it is used in a key"
    )]
    NonFinite,
    /// A map key is not a string, char, bool, integer, float, unit variant or a newtype of
    /// one (the keys `serde_json` accepts).
    #[error(
        "a map key must serialize as a string (strings, chars, bools, integers, floats and \
         unit enum variants are accepted, as in serde_json); convert the map's keys to strings"
    )]
    MapKeyNotString,
    /// A float of magnitude 2^53 or more, or integer text outside the 64-bit range, in a
    /// key field (or a [`Secret`](crate::Secret)): by the time the crate sees it, it may
    /// already be the rounding of another number
    /// (`serde_json` reads `18446744073709551616` and `18446744073709551617` as one f64),
    /// so two different intents could share one key. Typed integers of any size are exact and
    /// accepted; see `docs/key-spec.md` section 3.3.
    #[error(
        "the number {0} may not be exact in a key (a float of magnitude 2^53 or more, or an \
         integer outside the 64-bit range, may already be the rounding of another number), so \
         two different intents could share one key; send such an identifier as a string"
    )]
    InexactNumber(String),
    /// The value's `Serialize` implementation reported an error.
    #[error("{0}")]
    Custom(String),
}

impl ser::Error for CanonicalError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        CanonicalError::Custom(msg.to_string())
    }
}

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

/// Compares two strings in JCS order: lexicographically by UTF-16 code units
/// (RFC 8785 section 3.2.3).
///
/// This differs from Rust's `str` order (Unicode scalar order) only when a character at
/// or above U+10000 meets one in U+E000..=U+FFFF: `"\u{10000}" < "\u{ffff}"` here.
/// Used to order key fields (the proc macro emits them in this order) and object members.
///
/// ```
/// use core::cmp::Ordering;
/// use tool_contracts_runtime::key::jcs_cmp;
///
/// assert_eq!(jcs_cmp("cart.id", "user_id"), Ordering::Less);
/// assert_eq!(jcs_cmp("\u{10000}", "\u{ffff}"), Ordering::Less);
/// ```
pub fn jcs_cmp(a: &str, b: &str) -> Ordering {
    let (ab, bb) = (a.as_bytes(), b.as_bytes());
    let Some(i) = ab.iter().zip(bb).position(|(x, y)| x != y) else {
        // One is a prefix of the other (or they are equal).
        return ab.len().cmp(&bb.len());
    };
    let (x, y) = (ab.get(i).copied(), bb.get(i).copied());
    match (x, y) {
        // Fast path: the first difference involves an ASCII byte. An ASCII byte always
        // starts a character, and ASCII sorts before every other character in UTF-16 as in
        // UTF-8, so byte order is UTF-16 order.
        (Some(x), Some(y)) if x < 0x80 || y < 0x80 => x.cmp(&y),
        _ => {
            // Both differ inside non-ASCII characters: compare UTF-16 code units from the
            // start of the character holding the first difference (the prefixes are equal).
            let mut start = i;
            while start > 0 && !a.is_char_boundary(start) {
                start -= 1;
            }
            match (a.get(start..), b.get(start..)) {
                (Some(a), Some(b)) => a.encode_utf16().cmp(b.encode_utf16()),
                _ => a.encode_utf16().cmp(b.encode_utf16()),
            }
        }
    }
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
    /// The canonical document written so far (up to the last field).
    doc: Vec<u8>,
    /// Reusable buffers of the object encoder.
    scratch: Scratch,
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
        let Spare { mut doc, scratch } = SPARE.try_with(Cell::take).unwrap_or_default();
        doc.clear();
        doc.reserve(160 + contract.len());
        if contract == TOOL_KEY_CONTRACT {
            doc.extend_from_slice(TOOL_KEY_HEADER.as_bytes());
        } else {
            doc.extend_from_slice(b"{\"contract\":");
            write_str(&mut doc, contract);
            doc.extend_from_slice(b",\"fields\":{");
        }
        KeyBuilder {
            doc,
            scratch,
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
        #[cfg(debug_assertions)]
        {
            if let Some(last) = &self.last_path {
                debug_assert!(
                    jcs_cmp(last, path) == Ordering::Less,
                    "key fields must be added in strictly increasing JCS order: `{last}` then `{path}`"
                );
            }
        }
        let mark = self.doc.len();
        if self.fields > 0 {
            self.doc.push(b',');
        }
        write_str(&mut self.doc, path);
        self.doc.push(b':');
        let value_start = self.doc.len();
        if let Err(source) = write_canonical_with(value, &mut self.doc, &mut self.scratch, true) {
            self.doc.truncate(mark);
            return Err(KeyFieldError::Encode {
                field: path.to_owned(),
                source,
            });
        }
        let found = match self.doc.get(value_start..) {
            Some(b"null") => Some("null"),
            Some(b"\"\"") => Some("an empty string"),
            Some(b"[]") => Some("an empty array"),
            Some(b"{}") => Some("an empty object"),
            _ => None,
        };
        if let Some(found) = found {
            self.doc.truncate(mark);
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

    /// Returns the 64-char lowercase hex key.
    #[must_use]
    pub fn finish(mut self, scope: Option<&str>, tool: &str, version: u32) -> String {
        let scratch = core::mem::take(&mut self.scratch);
        let doc = self.finish_document(scope, tool, version);
        let key = hex_lower(&Sha256::digest(&doc).into());
        Spare { doc, scratch }.keep();
        key
    }

    /// The canonical document bytes that finish() hashes (for tests/debugging).
    #[must_use]
    pub fn finish_document(mut self, scope: Option<&str>, tool: &str, version: u32) -> Vec<u8> {
        let scratch = core::mem::take(&mut self.scratch);
        Spare {
            doc: Vec::new(),
            scratch,
        }
        .keep();
        let doc = &mut self.doc;
        doc.extend_from_slice(b"},\"scope\":");
        match scope {
            Some(scope) => write_str(doc, scope),
            None => doc.extend_from_slice(b"null"),
        }
        doc.extend_from_slice(b",\"tool\":");
        write_str(doc, tool);
        doc.extend_from_slice(b",\"version\":");
        write_u64(doc, u64::from(version));
        doc.push(b'}');
        self.doc
    }
}

/// Buffers of a finished [`KeyBuilder`], kept for the next key built on the same thread so
/// that a key costs no allocation for its document or scratch space once warm.
#[derive(Debug, Default)]
struct Spare {
    doc: Vec<u8>,
    scratch: Scratch,
}

/// Buffers larger than this are dropped rather than kept, so one huge key does not pin its
/// memory to the thread.
const SPARE_MAX_BYTES: usize = 64 * 1024;

thread_local! {
    static SPARE: Cell<Spare> = const {
        Cell::new(Spare {
            doc: Vec::new(),
            scratch: Scratch {
                entries: Vec::new(),
                keys: String::new(),
                body: Vec::new(),
                exact: false,
            },
        })
    };
}

impl Spare {
    /// Keeps these buffers for the next [`KeyBuilder::new`] on this thread (emptied; any
    /// buffer over [`SPARE_MAX_BYTES`] is dropped instead).
    fn keep(mut self) {
        let Spare { doc, scratch } = &mut self;
        doc.clear();
        scratch.entries.clear();
        scratch.keys.clear();
        scratch.body.clear();
        if doc.capacity() > SPARE_MAX_BYTES {
            *doc = Vec::new();
        }
        if scratch.entries.capacity() * core::mem::size_of::<Entry>() > SPARE_MAX_BYTES {
            scratch.entries = Vec::new();
        }
        if scratch.keys.capacity() > SPARE_MAX_BYTES {
            scratch.keys = String::new();
        }
        if scratch.body.capacity() > SPARE_MAX_BYTES {
            scratch.body = Vec::new();
        }
        // During thread teardown there is nowhere to keep them: they are dropped.
        let _ = SPARE.try_with(|spare| spare.set(self));
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

/// Lowercase hex of a SHA-256 digest.
///
/// Written by hand (a 16-entry table) rather than pulling in the `hex` crate: the digits
/// are filled into a stack array and copied into the `String` once.
fn hex_lower(digest: &[u8; 32]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = [0_u8; 64];
    for (pair, &b) in text.chunks_exact_mut(2).zip(digest) {
        if let [high, low] = pair {
            *high = DIGITS[usize::from(b >> 4)];
            *low = DIGITS[usize::from(b & 0x0f)];
        }
    }
    // Only ASCII digits were written: the conversion always succeeds (the fallback, which
    // would give the same text, is never taken).
    String::from_utf8(text.to_vec())
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

// ---------------------------------------------------------------------------------------
// Scalars
// ---------------------------------------------------------------------------------------

/// Writes the decimal digits of `n` (no sign) into the end of `buf`, returning the start.
fn digits_u128(n: u128, buf: &mut [u8; 40]) -> usize {
    let mut i = buf.len();
    // Nearly every integer fits in 64 bits, whose division is much cheaper than 128-bit.
    if let Ok(mut n) = u64::try_from(n) {
        loop {
            i -= 1;
            // `n % 10 < 10`, so the cast cannot truncate.
            buf[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                return i;
            }
        }
    }
    let mut n = n;
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return i;
        }
    }
}

/// Writes the decimal digits of `n` (no sign).
fn write_u128_digits(out: &mut Vec<u8>, n: u128) {
    let mut buf = [0_u8; 40];
    let start = digits_u128(n, &mut buf);
    out.extend_from_slice(buf.get(start..).unwrap_or_default());
}

/// `"00"`, `"01"`, ..., `"99"`: two digits per division (as `itoa` does).
const DIGIT_PAIRS: &[u8; 200] = b"\
    0001020304050607080910111213141516171819\
    2021222324252627282930313233343536373839\
    4041424344454647484950515253545556575859\
    6061626364656667686970717273747576777879\
    8081828384858687888990919293949596979899";

/// Writes the decimal digits of `n` (no sign).
#[inline]
fn write_u64(out: &mut Vec<u8>, mut n: u64) {
    // u64::MAX has 20 digits, so `i` never goes below 0.
    let mut buf = [0_u8; 20];
    let mut i = buf.len();
    while n >= 100 {
        // `n % 100 < 100`, so the cast cannot truncate.
        let d = (n % 100) as usize * 2;
        n /= 100;
        i -= 2;
        buf[i] = DIGIT_PAIRS[d];
        buf[i + 1] = DIGIT_PAIRS[d + 1];
    }
    if n >= 10 {
        // `n < 100`.
        let d = n as usize * 2;
        i -= 2;
        buf[i] = DIGIT_PAIRS[d];
        buf[i + 1] = DIGIT_PAIRS[d + 1];
    } else {
        // `n < 10`.
        i -= 1;
        buf[i] = b'0' + n as u8;
    }
    out.extend_from_slice(buf.get(i..).unwrap_or_default());
}

/// [`write_integer`] for magnitudes that fit in 64 bits (nearly all of them).
#[inline]
fn write_integer_u64(out: &mut Vec<u8>, negative: bool, magnitude: u64) {
    let big = magnitude > MAX_SAFE_INTEGER;
    if big {
        out.push(b'"');
    }
    if negative && magnitude != 0 {
        out.push(b'-');
    }
    write_u64(out, magnitude);
    if big {
        out.push(b'"');
    }
}

/// Writes an integer per the key rule: a plain JSON integer when its magnitude is at most
/// 2^53 - 1, otherwise a JSON string of its decimal digits (with a leading `-` if negative).
fn write_integer(out: &mut Vec<u8>, negative: bool, magnitude: u128) {
    if let Ok(magnitude) = u64::try_from(magnitude) {
        return write_integer_u64(out, negative, magnitude);
    }
    out.push(b'"');
    if negative {
        out.push(b'-');
    }
    write_u128_digits(out, magnitude);
    out.push(b'"');
}

fn write_i128(out: &mut Vec<u8>, n: i128) {
    write_integer(out, n < 0, n.unsigned_abs());
}

/// Under the key fields' rule (`exact`), refuses a float of magnitude 2^53 or more: it may
/// be the rounding of another number (NaN and infinities are left to [`write_f64`]).
#[inline]
fn check_exact(f: f64, exact: bool) -> Result<(), CanonicalError> {
    if exact && f.abs() >= FIRST_INEXACT_FLOAT && f.is_finite() {
        return Err(CanonicalError::InexactNumber(
            ryu_js::Buffer::new().format_finite(f).to_owned(),
        ));
    }
    Ok(())
}

/// Writes `f` as ECMAScript's `Number.prototype.toString` does (RFC 8785 section 3.2.2.3).
fn write_f64(out: &mut Vec<u8>, f: f64) -> Result<(), CanonicalError> {
    if !f.is_finite() {
        return Err(CanonicalError::NonFinite);
    }
    if f == 0.0 {
        // Both +0 and -0 are written "0".
        out.push(b'0');
    } else {
        out.extend_from_slice(ryu_js::Buffer::new().format_finite(f).as_bytes());
    }
    Ok(())
}

/// Writes `s` as a JSON string with RFC 8785 escaping: `\"`, `\\`, `\b`, `\f`, `\n`, `\r`,
/// `\t`, other controls below U+0020 as `\u00xx` (lowercase hex), everything else raw.
#[inline]
fn write_str(out: &mut Vec<u8>, s: &str) {
    out.reserve(s.len() + 2);
    out.push(b'"');
    write_str_body(out, s);
    out.push(b'"');
}

/// How each byte is written inside a JSON string: `0` raw, otherwise the character after
/// the backslash (`u` for `\u00xx`). The table of `serde_json`'s `ESCAPE`, with RFC 8785's
/// choices: only `"`, `\` and the controls below U+0020 are escaped.
static ESCAPE: [u8; 256] = {
    let mut table = [0_u8; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = b'u';
        b += 1;
    }
    table[0x08] = b'b';
    table[0x09] = b't';
    table[0x0a] = b'n';
    table[0x0c] = b'f';
    table[0x0d] = b'r';
    table[b'"' as usize] = b'"';
    table[b'\\' as usize] = b'\\';
    table
};

/// Whether any of the 8 bytes of `word` is a control below U+0020, `"` or `\` (the bytes
/// [`ESCAPE`] escapes). Exact: no false negatives, no false positives.
///
/// Classic SWAR tests ("Bit Twiddling Hacks": `hasless`, `haszero`): a byte below `n`
/// (`n <= 0x80`) borrows in `x - n` and so sets its top bit while `!x` keeps it; a borrow
/// can only spill upward from a byte that already matched, so the "any" answer is exact.
#[inline]
fn word_needs_escape(word: u64) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    let control = word.wrapping_sub(ONES * 0x20) & !word;
    let quote = word ^ (ONES * u64::from(b'"'));
    let quote = quote.wrapping_sub(ONES) & !quote;
    let backslash = word ^ (ONES * u64::from(b'\\'));
    let backslash = backslash.wrapping_sub(ONES) & !backslash;
    (control | quote | backslash) & HIGHS != 0
}

/// Whether `bytes` holds a byte [`ESCAPE`] escapes, tested 8 bytes at a time with no
/// per-byte loop: whole words first, then the remaining 1 to 7 bytes gathered into one
/// word from overlapping reads (bytes read twice do not change the answer; the padding
/// `a` needs no escape).
#[inline]
fn needs_escape(bytes: &[u8]) -> bool {
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        if word
            .first_chunk::<8>()
            .is_some_and(|w| word_needs_escape(u64::from_ne_bytes(*w)))
        {
            return true;
        }
    }
    let rest = words.remainder();
    let n = rest.len();
    let last = if n == 0 {
        return false;
    } else if let Some(word) = bytes.last_chunk::<8>() {
        // At least 8 bytes in all: the last 8 cover the remainder.
        *word
    } else if let (Some(low), Some(high)) = (rest.first_chunk::<4>(), rest.last_chunk::<4>()) {
        // 4 to 7 bytes: the first 4 and the last 4 cover them.
        let [a, b, c, d] = *low;
        let [e, f, g, h] = *high;
        [a, b, c, d, e, f, g, h]
    } else {
        // 1 to 3 bytes: the first, the middle and the last cover them.
        let first = rest.first().copied().unwrap_or(b'a');
        let middle = rest.get(n / 2).copied().unwrap_or(b'a');
        let last = rest.last().copied().unwrap_or(b'a');
        [first, middle, last, b'a', b'a', b'a', b'a', b'a']
    };
    word_needs_escape(u64::from_ne_bytes(last))
}

/// Writes the escaped contents of a JSON string (without the quotes).
///
/// Most strings need no escape at all: [`needs_escape`] finds that out a word at a time and
/// the string is then copied with one `extend_from_slice`.
#[inline]
fn write_str_body(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    if needs_escape(bytes) {
        write_escaped(out, bytes);
    } else {
        out.extend_from_slice(bytes);
    }
}

/// [`write_str_body`] for a string with something to escape: unescaped runs are copied
/// with one `extend_from_slice` each; 8-byte words with nothing to escape are skipped with
/// one test ([`word_needs_escape`]), the others are looked up byte by byte in [`ESCAPE`].
#[cold]
fn write_escaped(out: &mut Vec<u8>, bytes: &[u8]) {
    // Start of the pending unescaped run.
    let mut run = 0;
    let mut i = 0;
    while let Some(word) = bytes.get(i..).and_then(<[u8]>::first_chunk::<8>) {
        if word_needs_escape(u64::from_ne_bytes(*word)) {
            for (k, &b) in word.iter().enumerate() {
                escape_byte(out, bytes, &mut run, i + k, b);
            }
        }
        i += 8;
    }
    for (k, &b) in bytes.get(i..).unwrap_or_default().iter().enumerate() {
        escape_byte(out, bytes, &mut run, i + k, b);
    }
    out.extend_from_slice(bytes.get(run..).unwrap_or_default());
}

/// If `b` (at offset `i` of `bytes`) needs escaping, flushes the run before it and writes
/// its escape.
#[inline(always)]
fn escape_byte(out: &mut Vec<u8>, bytes: &[u8], run: &mut usize, i: usize, b: u8) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let escape = ESCAPE[usize::from(b)];
    if escape == 0 {
        return;
    }
    out.extend_from_slice(bytes.get(*run..i).unwrap_or_default());
    if escape == b'u' {
        out.extend_from_slice(&[
            b'\\',
            b'u',
            b'0',
            b'0',
            HEX[usize::from(b >> 4)],
            HEX[usize::from(b & 0x0f)],
        ]);
    } else {
        out.extend_from_slice(&[b'\\', escape]);
    }
    *run = i + 1;
}

/// `fmt::Write` adapter escaping into a JSON string body (for `collect_str`).
struct EscapeWriter<'a> {
    out: &'a mut Vec<u8>,
}

impl fmt::Write for EscapeWriter<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        write_str_body(self.out, s);
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// The serializer
// ---------------------------------------------------------------------------------------

/// Buffers the object encoder reuses across objects (and, in a [`KeyBuilder`], across
/// fields), so an object costs no allocation of its own.
///
/// `entries` and `keys` are stacks: an open object owns everything above the lengths they
/// had when it opened and truncates back to them when it closes; a member truncates back
/// after its value, so a nested object that failed midway leaves nothing behind.
#[derive(Debug, Clone, Default)]
struct Scratch {
    /// Members of the open objects, innermost last.
    entries: Vec<Entry>,
    /// Raw text of the map keys of the open objects.
    keys: String,
    /// Copy of the members being reordered (used by one `close` at a time).
    body: Vec<u8>,
    /// The key fields' number rule is on: floats of magnitude 2^53 or more are refused.
    exact: bool,
}

/// Writes the canonical JSON of `value` to `out`, using (and leaving reusable) `scratch`.
/// On error `out` is left exactly as it was.
/// With `exact`, floats of magnitude 2^53 or more are refused (the key fields' rule).
fn write_canonical_with<T: ?Sized + Serialize>(
    value: &T,
    out: &mut Vec<u8>,
    scratch: &mut Scratch,
    exact: bool,
) -> Result<(), CanonicalError> {
    let mark = out.len();
    scratch.exact = exact;
    scratch.entries.clear();
    scratch.keys.clear();
    let result = value.serialize(Canonical {
        out: &mut *out,
        scratch,
    });
    if result.is_err() {
        out.truncate(mark);
    }
    result
}

/// Serializer writing canonical JSON into `out`.
struct Canonical<'a> {
    out: &'a mut Vec<u8>,
    scratch: &'a mut Scratch,
}

impl Canonical<'_> {
    /// A serializer for a nested value, writing to the same buffers.
    fn reborrow(&mut self) -> Canonical<'_> {
        Canonical {
            out: &mut *self.out,
            scratch: &mut *self.scratch,
        }
    }
}

impl<'a> ser::Serializer for Canonical<'a> {
    type Ok = ();
    type Error = CanonicalError;
    type SerializeSeq = SeqWriter<'a>;
    type SerializeTuple = SeqWriter<'a>;
    type SerializeTupleStruct = SeqWriter<'a>;
    type SerializeTupleVariant = SeqWriter<'a>;
    type SerializeMap = ObjectWriter<'a>;
    type SerializeStruct = StructWriter<'a>;
    type SerializeStructVariant = ObjectWriter<'a>;

    fn serialize_bool(self, v: bool) -> Result<(), CanonicalError> {
        self.out
            .extend_from_slice(if v { b"true" } else { b"false" });
        Ok(())
    }

    fn serialize_i8(self, v: i8) -> Result<(), CanonicalError> {
        self.serialize_i64(i64::from(v))
    }

    fn serialize_i16(self, v: i16) -> Result<(), CanonicalError> {
        self.serialize_i64(i64::from(v))
    }

    fn serialize_i32(self, v: i32) -> Result<(), CanonicalError> {
        self.serialize_i64(i64::from(v))
    }

    fn serialize_i64(self, v: i64) -> Result<(), CanonicalError> {
        write_integer_u64(self.out, v < 0, v.unsigned_abs());
        Ok(())
    }

    fn serialize_i128(self, v: i128) -> Result<(), CanonicalError> {
        write_i128(self.out, v);
        Ok(())
    }

    fn serialize_u8(self, v: u8) -> Result<(), CanonicalError> {
        self.serialize_u64(u64::from(v))
    }

    fn serialize_u16(self, v: u16) -> Result<(), CanonicalError> {
        self.serialize_u64(u64::from(v))
    }

    fn serialize_u32(self, v: u32) -> Result<(), CanonicalError> {
        self.serialize_u64(u64::from(v))
    }

    fn serialize_u64(self, v: u64) -> Result<(), CanonicalError> {
        write_integer_u64(self.out, false, v);
        Ok(())
    }

    fn serialize_u128(self, v: u128) -> Result<(), CanonicalError> {
        write_integer(self.out, false, v);
        Ok(())
    }

    fn serialize_f32(self, v: f32) -> Result<(), CanonicalError> {
        // As `serde_json::to_value`: the f32 is widened exactly to f64.
        self.serialize_f64(f64::from(v))
    }

    fn serialize_f64(self, v: f64) -> Result<(), CanonicalError> {
        check_exact(v, self.scratch.exact)?;
        write_f64(self.out, v)
    }

    fn serialize_char(self, v: char) -> Result<(), CanonicalError> {
        write_str(self.out, v.encode_utf8(&mut [0_u8; 4]));
        Ok(())
    }

    fn serialize_str(self, v: &str) -> Result<(), CanonicalError> {
        write_str(self.out, v);
        Ok(())
    }

    fn serialize_bytes(self, v: &[u8]) -> Result<(), CanonicalError> {
        self.out.push(b'[');
        for (i, &b) in v.iter().enumerate() {
            if i > 0 {
                self.out.push(b',');
            }
            write_u64(self.out, u64::from(b));
        }
        self.out.push(b']');
        Ok(())
    }

    fn serialize_none(self) -> Result<(), CanonicalError> {
        self.serialize_unit()
    }

    fn serialize_some<T: ?Sized + Serialize>(self, value: &T) -> Result<(), CanonicalError> {
        value.serialize(self)
    }

    fn serialize_unit(self) -> Result<(), CanonicalError> {
        self.out.extend_from_slice(b"null");
        Ok(())
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), CanonicalError> {
        self.serialize_unit()
    }

    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), CanonicalError> {
        write_str(self.out, variant);
        Ok(())
    }

    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), CanonicalError> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        mut self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), CanonicalError> {
        self.out.push(b'{');
        write_str(self.out, variant);
        self.out.push(b':');
        value.serialize(self.reborrow())?;
        self.out.push(b'}');
        Ok(())
    }

    fn serialize_seq(self, _len: Option<usize>) -> Result<SeqWriter<'a>, CanonicalError> {
        self.out.push(b'[');
        Ok(SeqWriter {
            inner: self,
            first: true,
            close: b"]",
        })
    }

    fn serialize_tuple(self, len: usize) -> Result<SeqWriter<'a>, CanonicalError> {
        self.serialize_seq(Some(len))
    }

    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        len: usize,
    ) -> Result<SeqWriter<'a>, CanonicalError> {
        self.serialize_seq(Some(len))
    }

    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<SeqWriter<'a>, CanonicalError> {
        self.out.push(b'{');
        write_str(self.out, variant);
        self.out.extend_from_slice(b":[");
        Ok(SeqWriter {
            inner: self,
            first: true,
            close: b"]}",
        })
    }

    fn serialize_map(self, _len: Option<usize>) -> Result<ObjectWriter<'a>, CanonicalError> {
        Ok(ObjectWriter::open(self, false))
    }

    fn serialize_struct(
        self,
        name: &'static str,
        _len: usize,
    ) -> Result<StructWriter<'a>, CanonicalError> {
        Ok(match name {
            SERDE_JSON_NUMBER_TOKEN => StructWriter::Number(self),
            SERDE_JSON_RAW_TOKEN => StructWriter::RawValue(self),
            _ => StructWriter::Object(ObjectWriter::open(self, false)),
        })
    }

    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<ObjectWriter<'a>, CanonicalError> {
        self.out.push(b'{');
        write_str(self.out, variant);
        self.out.push(b':');
        Ok(ObjectWriter::open(self, true))
    }

    fn collect_str<T: ?Sized + fmt::Display>(self, value: &T) -> Result<(), CanonicalError> {
        use fmt::Write as _;
        self.out.push(b'"');
        write!(EscapeWriter { out: self.out }, "{value}").map_err(|_| {
            CanonicalError::Custom("a `Display` implementation returned an error".to_owned())
        })?;
        self.out.push(b'"');
        Ok(())
    }
}

/// Arrays: elements are streamed straight into the output.
struct SeqWriter<'a> {
    inner: Canonical<'a>,
    first: bool,
    /// `]`, or `]}` for a tuple variant (`{"Variant":[...]}`).
    close: &'static [u8],
}

impl SeqWriter<'_> {
    fn element<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), CanonicalError> {
        if !self.first {
            self.inner.out.push(b',');
        }
        self.first = false;
        value.serialize(self.inner.reborrow())
    }

    fn close(self) -> Result<(), CanonicalError> {
        self.inner.out.extend_from_slice(self.close);
        Ok(())
    }
}

impl ser::SerializeSeq for SeqWriter<'_> {
    type Ok = ();
    type Error = CanonicalError;

    fn serialize_element<T: ?Sized + Serialize>(
        &mut self,
        value: &T,
    ) -> Result<(), CanonicalError> {
        self.element(value)
    }

    fn end(self) -> Result<(), CanonicalError> {
        self.close()
    }
}

impl ser::SerializeTuple for SeqWriter<'_> {
    type Ok = ();
    type Error = CanonicalError;

    fn serialize_element<T: ?Sized + Serialize>(
        &mut self,
        value: &T,
    ) -> Result<(), CanonicalError> {
        self.element(value)
    }

    fn end(self) -> Result<(), CanonicalError> {
        self.close()
    }
}

impl ser::SerializeTupleStruct for SeqWriter<'_> {
    type Ok = ();
    type Error = CanonicalError;

    fn serialize_field<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), CanonicalError> {
        self.element(value)
    }

    fn end(self) -> Result<(), CanonicalError> {
        self.close()
    }
}

impl ser::SerializeTupleVariant for SeqWriter<'_> {
    type Ok = ();
    type Error = CanonicalError;

    fn serialize_field<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), CanonicalError> {
        self.element(value)
    }

    fn end(self) -> Result<(), CanonicalError> {
        self.close()
    }
}

/// Where an object member's raw (unescaped) key lives.
#[derive(Debug, Clone, Copy)]
enum KeyRef {
    /// A struct field name.
    Static(&'static str),
    /// A range of [`Scratch::keys`] (map keys).
    Owned(usize, usize),
}

/// The raw text of `key`, whose map keys live in `keys`.
#[inline]
fn key_text(keys: &str, key: KeyRef) -> &str {
    match key {
        KeyRef::Static(s) => s,
        KeyRef::Owned(start, end) => keys.get(start..end).unwrap_or_default(),
    }
}

/// The first 8 bytes of `key` as a big-endian integer, zero-padded: unequal prefixes
/// compare as the keys' first 8 bytes do in byte order (a key that ends first is padded
/// with 0, below every other byte, as a proper prefix sorts first).
#[inline]
fn key_prefix(key: &str) -> u64 {
    let bytes = key.as_bytes();
    let n = bytes.len();
    if let Some(word) = bytes.first_chunk::<8>() {
        return u64::from_be_bytes(*word);
    }
    if let (Some(low), Some(high)) = (bytes.first_chunk::<4>(), bytes.last_chunk::<4>()) {
        // 4 to 7 bytes: the first 4 and the last 4 (overlapping bytes are equal), the last
        // byte landing at position `n - 1`.
        let low = u64::from(u32::from_be_bytes(*low)) << 32;
        let high = u64::from(u32::from_be_bytes(*high)) << (64 - 8 * n);
        return low | high;
    }
    bytes
        .iter()
        .enumerate()
        .fold(0, |prefix, (i, &b)| prefix | u64::from(b) << (56 - 8 * i))
}

/// [`jcs_cmp`] of two member keys, from their [`key_prefix`]es alone when those differ and
/// are ASCII (in ASCII, byte order is UTF-16 order).
#[inline]
fn key_order(keys: &str, a: KeyRef, a_prefix: u64, b: KeyRef, b_prefix: u64) -> Ordering {
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    if a_prefix != b_prefix && (a_prefix | b_prefix) & HIGHS == 0 {
        return a_prefix.cmp(&b_prefix);
    }
    jcs_cmp(key_text(keys, a), key_text(keys, b))
}

/// One member already written to the output.
#[derive(Debug, Clone, Copy)]
struct Entry {
    key: KeyRef,
    /// [`key_prefix`] of the key.
    prefix: u64,
    /// Byte range of `"key":value` in the output.
    start: usize,
    end: usize,
}

/// Objects: members are written to the output in the order they arrive, with their raw
/// keys recorded in the shared [`Scratch`]. If they did not arrive in JCS order (or a key
/// repeats), `close` moves them into order; structs whose fields are declared in sorted
/// order never pay for that.
struct ObjectWriter<'a> {
    inner: Canonical<'a>,
    /// Offset just past the `{`.
    body_start: usize,
    /// This object's members are `inner.scratch.entries[entries_base..]`.
    entries_base: usize,
    /// This object's map keys are `inner.scratch.keys[keys_base..]`.
    keys_base: usize,
    /// Whether every key so far is strictly greater than the one before.
    in_order: bool,
    /// Key given to `serialize_key`, waiting for its value.
    pending_key: Option<KeyRef>,
    /// Whether to write an extra `}` (struct variant: `{"Variant":{...}}`).
    wrapped: bool,
}

impl<'a> ObjectWriter<'a> {
    fn open(inner: Canonical<'a>, wrapped: bool) -> Self {
        inner.out.push(b'{');
        ObjectWriter {
            body_start: inner.out.len(),
            entries_base: inner.scratch.entries.len(),
            keys_base: inner.scratch.keys.len(),
            inner,
            in_order: true,
            pending_key: None,
            wrapped,
        }
    }

    fn member<T: ?Sized + Serialize>(
        &mut self,
        key: KeyRef,
        value: &T,
    ) -> Result<(), CanonicalError> {
        let Canonical { out, scratch } = &mut self.inner;
        let depth = scratch.entries.len();
        let prefix = key_prefix(key_text(&scratch.keys, key));
        if depth > self.entries_base {
            if self.in_order {
                if let Some(last) = scratch.entries.last() {
                    if key_order(&scratch.keys, last.key, last.prefix, key, prefix)
                        != Ordering::Less
                    {
                        self.in_order = false;
                    }
                }
            }
            out.push(b',');
        }
        let start = out.len();
        write_str(out, key_text(&scratch.keys, key));
        out.push(b':');
        let keys_len = scratch.keys.len();
        let result = value.serialize(self.inner.reborrow());
        let Canonical { out, scratch } = &mut self.inner;
        // Whatever a nested object left (it only does on error) is not this object's.
        scratch.entries.truncate(depth);
        scratch.keys.truncate(keys_len);
        result?;
        scratch.entries.push(Entry {
            key,
            prefix,
            start,
            end: out.len(),
        });
        Ok(())
    }

    fn close(self) -> Result<(), CanonicalError> {
        let ObjectWriter {
            inner: Canonical { out, scratch },
            body_start,
            entries_base,
            keys_base,
            in_order,
            wrapped,
            ..
        } = self;
        if !in_order {
            reorder(out, scratch, body_start, entries_base);
        }
        scratch.entries.truncate(entries_base);
        scratch.keys.truncate(keys_base);
        out.push(b'}');
        if wrapped {
            out.push(b'}');
        }
        Ok(())
    }
}

/// Puts the members `scratch.entries[base..]`, written from `body_start` to the end of
/// `out` in arrival order, into JCS order. Of members with equal keys only the last to
/// arrive is kept, as when `serde_json::to_value` inserts them into its map.
fn reorder(out: &mut Vec<u8>, scratch: &mut Scratch, body_start: usize, base: usize) {
    let Scratch {
        entries,
        keys,
        body,
        ..
    } = scratch;
    let Some(members) = entries.get_mut(base..) else {
        return;
    };
    let mut order = [0_u8; 16];
    let ranked = rank_by_prefix(members, &mut order);
    if ranked {
        let sorted = |k: usize| {
            let i = order.get(k)?;
            members.get(usize::from(*i)).copied()
        };
        if permute_in_place(out, body, body_start, members.len(), sorted) {
            return;
        }
    }
    // Ties broken by arrival (offsets are distinct): the order of a stable sort, without
    // the buffer a stable sort allocates.
    members.sort_unstable_by(|a, b| {
        key_order(keys, a.key, a.prefix, b.key, b.prefix).then(a.start.cmp(&b.start))
    });
    if !ranked {
        let distinct = members.windows(2).all(|w| match w {
            [a, b] => a.prefix != b.prefix || key_text(keys, a.key) != key_text(keys, b.key),
            _ => true,
        });
        let sorted = |k: usize| members.get(k).copied();
        if distinct && permute_in_place(out, body, body_start, members.len(), sorted) {
            return;
        }
    }
    // General case (repeated keys): rebuild the body from a copy, skipping superseded
    // members.
    body.clear();
    body.extend_from_slice(out.get(body_start..).unwrap_or_default());
    out.truncate(body_start);
    let mut first = true;
    for (i, entry) in members.iter().enumerate() {
        let superseded = members
            .get(i + 1)
            .is_some_and(|next| key_text(keys, next.key) == key_text(keys, entry.key));
        if superseded {
            continue;
        }
        if !first {
            out.push(b',');
        }
        first = false;
        let range = (entry.start - body_start)..(entry.end - body_start);
        out.extend_from_slice(body.get(range).unwrap_or_default());
    }
}

/// The JCS order of `members` without sorting them, when their keys are told apart by
/// their ASCII [`key_prefix`]es alone (the common case: struct field names, short map
/// keys): `order[k]` is the index of the member at sorted position `k`, a member's
/// position being the number of members with a smaller prefix.
///
/// `false` for more than 16 members, a non-ASCII prefix or two equal prefixes. (`order`
/// is filled in place: returning the array would load it whole right after its bytes
/// were stored one by one, a store-forwarding stall.)
fn rank_by_prefix(members: &[Entry], order: &mut [u8; 16]) -> bool {
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    if members.len() > 16 {
        return false;
    }
    // Branch-free counting: which prefix is smaller is data, not a predictable branch.
    let mut high = 0;
    let mut equal = 0;
    for (i, m) in members.iter().enumerate() {
        high |= m.prefix;
        let mut rank = 0;
        for other in members {
            rank += usize::from(other.prefix < m.prefix);
            equal += usize::from(other.prefix == m.prefix);
        }
        if let (Some(slot), Ok(i)) = (order.get_mut(rank), u8::try_from(i)) {
            *slot = i;
        }
    }
    // Each member's prefix equals its own once; a higher count means two are equal (and
    // `order` may then have gaps).
    high & HIGHS == 0 && equal == members.len()
}

/// Reorders `n` members with distinct keys inside `out`, `sorted(k)` being the member at
/// sorted position `k`, without moving the members already in their final place at
/// either end: only the span from the first misplaced member to the last one is copied
/// out and written back. A struct whose big last field sorts last (say `{"id",
/// "currency", "lines"}`) thus never copies that field.
///
/// Returns `false`, having changed nothing, if the body is not exactly the members joined
/// by commas (possible only after a `Serialize` impl swallowed an error); the caller then
/// rebuilds the body from the members alone.
fn permute_in_place(
    out: &mut [u8],
    body: &mut Vec<u8>,
    body_start: usize,
    n: usize,
    sorted: impl Fn(usize) -> Option<Entry>,
) -> bool {
    // Members already in place at the front: the member at sorted position `lo` starts
    // where the `lo`-th member to arrive starts (offsets identify members).
    let mut lo = 0;
    let mut span_start = body_start;
    while let Some(m) = sorted(lo) {
        if m.start != span_start {
            break;
        }
        span_start = m.end + 1;
        lo += 1;
    }
    // And at the back.
    let mut hi = n;
    let mut span_end = out.len();
    while hi > lo {
        let Some(m) = sorted(hi - 1) else {
            return false;
        };
        if m.end != span_end {
            break;
        }
        span_end = m.start.saturating_sub(1);
        hi -= 1;
    }
    if lo >= hi {
        return true;
    }
    let mut joined = hi - lo - 1;
    for k in lo..hi {
        let Some(m) = sorted(k) else {
            return false;
        };
        joined += m.end - m.start;
    }
    if span_end.checked_sub(span_start) != Some(joined) {
        return false;
    }
    body.clear();
    body.extend_from_slice(out.get(span_start..span_end).unwrap_or_default());
    let mut at = span_start;
    for k in lo..hi {
        let Some(m) = sorted(k) else {
            return false;
        };
        if k > lo {
            if let Some(comma) = out.get_mut(at) {
                *comma = b',';
            }
            at += 1;
        }
        let len = m.end - m.start;
        let src = body.get(m.start - span_start..m.end - span_start);
        let dst = out.get_mut(at..at + len);
        if let (Some(dst), Some(src)) = (dst, src) {
            dst.copy_from_slice(src);
        }
        at += len;
    }
    true
}

impl ser::SerializeMap for ObjectWriter<'_> {
    type Ok = ();
    type Error = CanonicalError;

    fn serialize_key<T: ?Sized + Serialize>(&mut self, key: &T) -> Result<(), CanonicalError> {
        let keys = &mut self.inner.scratch.keys;
        let start = keys.len();
        key.serialize(MapKey { out: &mut *keys })?;
        self.pending_key = Some(KeyRef::Owned(start, keys.len()));
        Ok(())
    }

    fn serialize_value<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), CanonicalError> {
        let key = self.pending_key.take().ok_or_else(|| {
            CanonicalError::Custom("serialize_value called before serialize_key".to_owned())
        })?;
        self.member(key, value)
    }

    fn end(self) -> Result<(), CanonicalError> {
        self.close()
    }
}

impl ser::SerializeStructVariant for ObjectWriter<'_> {
    type Ok = ();
    type Error = CanonicalError;

    fn serialize_field<T: ?Sized + Serialize>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), CanonicalError> {
        self.member(KeyRef::Static(key), value)
    }

    fn end(self) -> Result<(), CanonicalError> {
        self.close()
    }
}

/// Structs: ordinary objects, plus `serde_json`'s private tokens (see the module docs).
enum StructWriter<'a> {
    Object(ObjectWriter<'a>),
    /// `serde_json::Number` under `arbitrary_precision`: one field holding the number text.
    Number(Canonical<'a>),
    /// `serde_json::value::RawValue` under `raw_value`: one field holding JSON text.
    RawValue(Canonical<'a>),
}

impl ser::SerializeStruct for StructWriter<'_> {
    type Ok = ();
    type Error = CanonicalError;

    fn serialize_field<T: ?Sized + Serialize>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), CanonicalError> {
        match self {
            StructWriter::Object(object) => object.member(KeyRef::Static(key), value),
            StructWriter::Number(inner) => {
                let text = capture_string(value)?;
                write_number_text(inner.out, &text, inner.scratch.exact)
            }
            StructWriter::RawValue(inner) => {
                let text = capture_string(value)?;
                let parsed: serde_json::Value = serde_json::from_str(&text)
                    .map_err(|e| CanonicalError::Custom(format!("invalid raw JSON value: {e}")))?;
                parsed.serialize(inner.reborrow())
            }
        }
    }

    fn end(self) -> Result<(), CanonicalError> {
        match self {
            StructWriter::Object(object) => object.close(),
            StructWriter::Number(_) | StructWriter::RawValue(_) => Ok(()),
        }
    }
}

/// The string a `Serialize` value serializes as (for `serde_json`'s private tokens).
fn capture_string<T: ?Sized + Serialize>(value: &T) -> Result<String, CanonicalError> {
    let mut text = String::new();
    value.serialize(MapKey { out: &mut text })?;
    Ok(text)
}

/// Writes JSON number text (from `serde_json`'s `arbitrary_precision` feature) canonically:
/// integers per the integer rule, anything else as the f64 it denotes. Under the key
/// fields' rule (`exact`) an integer outside the 64-bit range is refused as it is without
/// the feature (where `serde_json` has already made it a double), so keys do not depend
/// on a feature switched on elsewhere in the build.
fn write_number_text(out: &mut Vec<u8>, text: &str, exact: bool) -> Result<(), CanonicalError> {
    let is_integer = !text.contains(['.', 'e', 'E']);
    if is_integer {
        let in_64_bits = text.parse::<i64>().is_ok() || text.parse::<u64>().is_ok();
        if exact && !in_64_bits {
            return Err(CanonicalError::InexactNumber(text.to_owned()));
        }
        if let Ok(n) = text.parse::<i128>() {
            write_i128(out, n);
            return Ok(());
        }
        let digits = text.strip_prefix('-').unwrap_or(text);
        if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
            // Beyond i128: still an integer, written as the string of its digits.
            write_str(out, text);
            return Ok(());
        }
    }
    match text.parse::<f64>() {
        Ok(f) => {
            check_exact(f, exact)?;
            write_f64(out, f)
        }
        Err(_) => Err(CanonicalError::Custom(format!(
            "invalid JSON number `{text}`"
        ))),
    }
}

/// Serializer for map keys, appending the key's raw text to `out`. Accepts what
/// `serde_json::to_value` accepts as a map key, written the same way.
struct MapKey<'a> {
    out: &'a mut String,
}

impl MapKey<'_> {
    fn integer(self, negative: bool, magnitude: u128) -> Result<(), CanonicalError> {
        let mut buf = [0_u8; 40];
        let start = digits_u128(magnitude, &mut buf);
        if negative && magnitude != 0 {
            self.out.push('-');
        }
        for &d in buf.get(start..).unwrap_or_default() {
            self.out.push(char::from(d));
        }
        Ok(())
    }

    fn float(self, json: Result<String, serde_json::Error>) -> Result<(), CanonicalError> {
        // `serde_json` writes finite float keys with its own shortest-round-trip formatter
        // (not ECMAScript's); delegate to it so the keys match `to_value` exactly.
        let text = json.map_err(|_| CanonicalError::NonFinite)?;
        self.out.push_str(&text);
        Ok(())
    }
}

impl ser::Serializer for MapKey<'_> {
    type Ok = ();
    type Error = CanonicalError;
    type SerializeSeq = Impossible<(), CanonicalError>;
    type SerializeTuple = Impossible<(), CanonicalError>;
    type SerializeTupleStruct = Impossible<(), CanonicalError>;
    type SerializeTupleVariant = Impossible<(), CanonicalError>;
    type SerializeMap = Impossible<(), CanonicalError>;
    type SerializeStruct = Impossible<(), CanonicalError>;
    type SerializeStructVariant = Impossible<(), CanonicalError>;

    fn serialize_bool(self, v: bool) -> Result<(), CanonicalError> {
        self.out.push_str(if v { "true" } else { "false" });
        Ok(())
    }

    fn serialize_i8(self, v: i8) -> Result<(), CanonicalError> {
        self.serialize_i128(i128::from(v))
    }

    fn serialize_i16(self, v: i16) -> Result<(), CanonicalError> {
        self.serialize_i128(i128::from(v))
    }

    fn serialize_i32(self, v: i32) -> Result<(), CanonicalError> {
        self.serialize_i128(i128::from(v))
    }

    fn serialize_i64(self, v: i64) -> Result<(), CanonicalError> {
        self.integer(v < 0, u128::from(v.unsigned_abs()))
    }

    fn serialize_i128(self, v: i128) -> Result<(), CanonicalError> {
        self.integer(v < 0, v.unsigned_abs())
    }

    fn serialize_u8(self, v: u8) -> Result<(), CanonicalError> {
        self.integer(false, u128::from(v))
    }

    fn serialize_u16(self, v: u16) -> Result<(), CanonicalError> {
        self.integer(false, u128::from(v))
    }

    fn serialize_u32(self, v: u32) -> Result<(), CanonicalError> {
        self.integer(false, u128::from(v))
    }

    fn serialize_u64(self, v: u64) -> Result<(), CanonicalError> {
        self.integer(false, u128::from(v))
    }

    fn serialize_u128(self, v: u128) -> Result<(), CanonicalError> {
        self.integer(false, v)
    }

    fn serialize_f32(self, v: f32) -> Result<(), CanonicalError> {
        if !v.is_finite() {
            return Err(CanonicalError::NonFinite);
        }
        self.float(serde_json::to_string(&v))
    }

    fn serialize_f64(self, v: f64) -> Result<(), CanonicalError> {
        if !v.is_finite() {
            return Err(CanonicalError::NonFinite);
        }
        self.float(serde_json::to_string(&v))
    }

    fn serialize_char(self, v: char) -> Result<(), CanonicalError> {
        self.out.push(v);
        Ok(())
    }

    fn serialize_str(self, v: &str) -> Result<(), CanonicalError> {
        self.out.push_str(v);
        Ok(())
    }

    fn serialize_bytes(self, _v: &[u8]) -> Result<(), CanonicalError> {
        Err(CanonicalError::MapKeyNotString)
    }

    fn serialize_none(self) -> Result<(), CanonicalError> {
        Err(CanonicalError::MapKeyNotString)
    }

    fn serialize_some<T: ?Sized + Serialize>(self, _value: &T) -> Result<(), CanonicalError> {
        Err(CanonicalError::MapKeyNotString)
    }

    fn serialize_unit(self) -> Result<(), CanonicalError> {
        Err(CanonicalError::MapKeyNotString)
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), CanonicalError> {
        Err(CanonicalError::MapKeyNotString)
    }

    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), CanonicalError> {
        self.out.push_str(variant);
        Ok(())
    }

    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), CanonicalError> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<(), CanonicalError> {
        Err(CanonicalError::MapKeyNotString)
    }

    fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq, CanonicalError> {
        Err(CanonicalError::MapKeyNotString)
    }

    fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple, CanonicalError> {
        Err(CanonicalError::MapKeyNotString)
    }

    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleStruct, CanonicalError> {
        Err(CanonicalError::MapKeyNotString)
    }

    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, CanonicalError> {
        Err(CanonicalError::MapKeyNotString)
    }

    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, CanonicalError> {
        Err(CanonicalError::MapKeyNotString)
    }

    fn serialize_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStruct, CanonicalError> {
        Err(CanonicalError::MapKeyNotString)
    }

    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, CanonicalError> {
        Err(CanonicalError::MapKeyNotString)
    }

    fn collect_str<T: ?Sized + fmt::Display>(self, value: &T) -> Result<(), CanonicalError> {
        use fmt::Write as _;
        write!(self.out, "{value}").map_err(|_| {
            CanonicalError::Custom("a `Display` implementation returned an error".to_owned())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Serialize;
    use serde_json::{json, Value};
    use std::collections::{BTreeMap, HashMap};

    fn canon<T: ?Sized + Serialize>(value: &T) -> String {
        let mut out = Vec::new();
        write_canonical(value, &mut out).expect("value encodes");
        String::from_utf8(out).expect("canonical JSON is UTF-8")
    }

    // -----------------------------------------------------------------------------------
    // An independent reference: JCS over `serde_json::Value`, written naively (UTF-16 key
    // vectors, per-char escaping, and ECMAScript number formatting derived from Rust's
    // shortest `{:e}` output rather than from ryu-js).
    // -----------------------------------------------------------------------------------

    fn ref_number(f: f64) -> String {
        assert!(f.is_finite());
        if f == 0.0 {
            return "0".to_owned();
        }
        let sign = if f < 0.0 { "-" } else { "" };
        // `{:e}` gives the shortest round-trip digit count k; `{:.(k-1)e}` then gives the
        // k-digit decimal nearest to f, ties to even (as ECMA-262 Number::toString wants;
        // the shortest-digits mode alone does not break ties to even).
        let shortest = format!("{:e}", f.abs());
        let (mantissa, _) = shortest.split_once('e').expect("exponent");
        let k = mantissa.chars().filter(char::is_ascii_digit).count();
        let sci = format!("{:.*e}", k - 1, f.abs());
        let (mantissa, exp) = sci.split_once('e').expect("exponent");
        let exp: i32 = exp.parse().expect("integer exponent");
        let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
        let digits = digits.trim_end_matches('0');
        let k = digits.len() as i32;
        let n = exp + 1;
        let body = if k <= n && n <= 21 {
            format!("{digits}{}", "0".repeat((n - k) as usize))
        } else if 0 < n && n <= 21 {
            format!("{}.{}", &digits[..n as usize], &digits[n as usize..])
        } else if -6 < n && n <= 0 {
            format!("0.{}{digits}", "0".repeat((-n) as usize))
        } else {
            let e = n - 1;
            let e = if e >= 0 {
                format!("+{e}")
            } else {
                e.to_string()
            };
            if k == 1 {
                format!("{digits}e{e}")
            } else {
                format!("{}.{}e{e}", &digits[..1], &digits[1..])
            }
        };
        format!("{sign}{body}")
    }

    fn ref_string(s: &str) -> String {
        let mut out = String::from("\"");
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push(c),
            }
        }
        out.push('"');
        out
    }

    fn ref_integer(negative: bool, magnitude: u64) -> String {
        let text = if negative {
            format!("-{magnitude}")
        } else {
            magnitude.to_string()
        };
        if magnitude > 9_007_199_254_740_991 {
            format!("\"{text}\"")
        } else {
            text
        }
    }

    fn reference(v: &Value) -> String {
        match v {
            Value::Null => "null".to_owned(),
            Value::Bool(b) => b.to_string(),
            Value::Number(n) => {
                if let Some(u) = n.as_u64() {
                    ref_integer(false, u)
                } else if let Some(i) = n.as_i64() {
                    ref_integer(i < 0, i.unsigned_abs())
                } else {
                    ref_number(n.as_f64().expect("float"))
                }
            }
            Value::String(s) => ref_string(s),
            Value::Array(items) => {
                let items: Vec<String> = items.iter().map(reference).collect();
                format!("[{}]", items.join(","))
            }
            Value::Object(map) => {
                let mut members: Vec<(Vec<u16>, String)> = map
                    .iter()
                    .map(|(k, v)| {
                        (
                            k.encode_utf16().collect(),
                            format!("{}:{}", ref_string(k), reference(v)),
                        )
                    })
                    .collect();
                members.sort_by(|a, b| a.0.cmp(&b.0));
                let members: Vec<String> = members.into_iter().map(|m| m.1).collect();
                format!("{{{}}}", members.join(","))
            }
        }
    }

    /// `write_canonical(x)` must equal JCS(serde_json::to_value(x)).
    fn assert_matches_reference<T: Serialize + core::fmt::Debug>(x: &T) {
        let value = serde_json::to_value(x).expect("to_value");
        assert_eq!(canon(x), reference(&value), "for {x:?}");
        assert_eq!(canon(&value), reference(&value), "for Value of {x:?}");
    }

    #[test]
    fn reference_formats_numbers_like_ecmascript() {
        for (f, s) in [
            (1e21, "1e+21"),
            (1e-7, "1e-7"),
            (123.0, "123"),
            (0.1, "0.1"),
        ] {
            assert_eq!(ref_number(f), s);
        }
    }

    // -----------------------------------------------------------------------------------
    // RFC 8785
    // -----------------------------------------------------------------------------------

    #[test]
    // The RFC's decimal inputs are kept verbatim, though longer than an f64 holds.
    #[allow(clippy::excessive_precision)]
    fn rfc8785_appendix_b_numbers() {
        let vectors: &[(u64, &str)] = &[
            (0x0000_0000_0000_0000, "0"),
            (0x8000_0000_0000_0000, "0"),
            (0x0000_0000_0000_0001, "5e-324"),
            (0x8000_0000_0000_0001, "-5e-324"),
            (0x7fef_ffff_ffff_ffff, "1.7976931348623157e+308"),
            (0xffef_ffff_ffff_ffff, "-1.7976931348623157e+308"),
            (0x4340_0000_0000_0000, "9007199254740992"),
            (0xc340_0000_0000_0000, "-9007199254740992"),
            (0x4430_0000_0000_0000, "295147905179352830000"),
            (0x44b5_2d02_c7e1_4af5, "9.999999999999997e+22"),
            (0x44b5_2d02_c7e1_4af6, "1e+23"),
            (0x44b5_2d02_c7e1_4af7, "1.0000000000000001e+23"),
            (0x444b_1ae4_d6e2_ef4e, "999999999999999700000"),
            (0x444b_1ae4_d6e2_ef4f, "999999999999999900000"),
            (0x444b_1ae4_d6e2_ef50, "1e+21"),
            (0x3eb0_c6f7_a0b5_ed8c, "9.999999999999997e-7"),
            (0x3eb0_c6f7_a0b5_ed8d, "0.000001"),
            (0x41b3_de43_5555_5553, "333333333.3333332"),
            (0x41b3_de43_5555_5554, "333333333.33333325"),
            (0x41b3_de43_5555_5555, "333333333.3333333"),
            (0x41b3_de43_5555_5556, "333333333.3333334"),
            (0x41b3_de43_5555_5557, "333333333.33333343"),
            (0xbecb_f647_612f_3696, "-0.0000033333333333333333"),
            (0x4314_3ff3_c1cb_0959, "1424953923781206.2"),
        ];
        for &(bits, want) in vectors {
            let f = f64::from_bits(bits);
            assert_eq!(canon(&f), want, "{bits:016x}");
            assert_eq!(ref_number(f), want, "reference, {bits:016x}");
        }
        for (f, want) in [
            (1.0, "1"),
            (1e21, "1e+21"),
            (1e20, "100000000000000000000"),
            (1e-7, "1e-7"),
            (333_333_333.333_333_29, "333333333.3333333"),
            (19.99, "19.99"),
        ] {
            assert_eq!(canon(&f), want);
        }
        assert_eq!(
            canon(&0.1_f32),
            "0.10000000149011612",
            "f32 widens exactly, as to_value"
        );
    }

    #[test]
    fn nan_and_infinity_are_errors() {
        for f in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let mut out = b"prefix".to_vec();
            assert_eq!(
                write_canonical(&vec![1.0, f], &mut out),
                Err(CanonicalError::NonFinite)
            );
            assert_eq!(out, b"prefix", "output restored on error");
        }
        assert_eq!(
            write_canonical(&f32::NAN, &mut Vec::new()),
            Err(CanonicalError::NonFinite)
        );
    }

    #[test]
    // The RFC's decimal inputs are kept verbatim, though longer than an f64 holds.
    #[allow(clippy::excessive_precision)]
    fn rfc8785_section_3_2_4_example() {
        // The numbers are Rust literals: serde_json's default parser is off by one ULP on
        // 333333333.33333329 unless its `float_roundtrip` feature is on.
        let string: Value =
            serde_json::from_str(r#""\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/""#)
                .expect("valid JSON");
        let input = json!({
            "numbers": [333_333_333.333_333_29, 1E30, 4.50, 2e-3, 0.000_000_000_000_000_000_000_000_001],
            "string": string,
            "literals": [null, true, false]
        });
        assert_eq!(
            canon(&input),
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
        );
    }

    #[test]
    fn rfc8785_section_3_2_3_sorting_example() {
        let input: Value = serde_json::from_str(
            r#"{
                "\u20ac": "Euro Sign",
                "\r": "Carriage Return",
                "\ufb33": "Hebrew Letter Dalet With Dagesh",
                "1": "One",
                "\ud83d\ude00": "Emoji: Grinning Face",
                "\u0080": "Control",
                "\u00f6": "Latin Small Letter O With Diaeresis"
            }"#,
        )
        .expect("valid JSON");
        assert_eq!(
            canon(&input),
            "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\
             \"ö\":\"Latin Small Letter O With Diaeresis\",\"€\":\"Euro Sign\",\
             \"😀\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}"
        );
    }

    #[test]
    fn string_escapes_are_minimal() {
        let all_controls: String = (0_u8..0x20).map(char::from).collect();
        assert_eq!(
            canon(&all_controls),
            "\"\\u0000\\u0001\\u0002\\u0003\\u0004\\u0005\\u0006\\u0007\\b\\t\\n\\u000b\\f\\r\
             \\u000e\\u000f\\u0010\\u0011\\u0012\\u0013\\u0014\\u0015\\u0016\\u0017\\u0018\
             \\u0019\\u001a\\u001b\\u001c\\u001d\\u001e\\u001f\""
        );
        // DEL, '/', U+2028, non-ASCII and astral characters are written raw.
        assert_eq!(
            canon("q\"b\\s/\u{7f}\u{2028}é€😀"),
            "\"q\\\"b\\\\s/\u{7f}\u{2028}é€😀\""
        );
        assert_eq!(canon(&'\n'), "\"\\n\"");
        assert_eq!(canon(&'😀'), "\"😀\"");
    }

    #[test]
    fn collect_str_is_escaped() {
        struct Shout;
        impl core::fmt::Display for Shout {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                writeln!(f, "say \"hi\"")
            }
        }
        impl Serialize for Shout {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        assert_eq!(canon(&Shout), r#""say \"hi\"\n""#);
        assert_matches_reference(&std::net::Ipv4Addr::new(10, 0, 0, 1));
    }

    // -----------------------------------------------------------------------------------
    // Ordering
    // -----------------------------------------------------------------------------------

    #[test]
    fn utf16_order_differs_from_utf8_order() {
        // U+10000 is the surrogate pair D800 DC00, which sorts before U+FFFF in UTF-16,
        // although its UTF-8 (and scalar value) sorts after.
        assert_eq!(jcs_cmp("\u{10000}", "\u{ffff}"), Ordering::Less);
        assert_eq!("\u{10000}".cmp("\u{ffff}"), Ordering::Greater);
        assert_eq!(jcs_cmp("a\u{1f600}", "a\u{e000}"), Ordering::Less);
        assert_eq!(jcs_cmp("\u{e000}", "\u{d7ff}"), Ordering::Greater);
        assert_eq!(
            canon(&json!({"\u{ffff}": 1, "\u{10000}": 2})),
            "{\"\u{10000}\":2,\"\u{ffff}\":1}"
        );
    }

    #[test]
    fn jcs_cmp_agrees_with_utf16_comparison() {
        let pool = [
            "",
            "a",
            "b",
            "ab",
            "é",
            "ö",
            "€",
            "\u{e000}",
            "\u{ffff}",
            "\u{10000}",
            "😀",
            "中",
            "\u{7f}",
            "\u{80}",
        ];
        for a in pool {
            for b in pool {
                for c in pool {
                    let x = format!("{a}{b}");
                    let y = format!("{a}{c}");
                    assert_eq!(
                        jcs_cmp(&x, &y),
                        x.encode_utf16().cmp(y.encode_utf16()),
                        "{x:?} vs {y:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn struct_fields_are_sorted_and_duplicate_map_keys_keep_the_last() {
        #[derive(Serialize)]
        struct Unordered {
            zeta: u8,
            alpha: &'static str,
            #[serde(rename = "\u{ffff}")]
            bmp: bool,
            #[serde(rename = "\u{10000}")]
            astral: bool,
        }
        let x = Unordered {
            zeta: 1,
            alpha: "a",
            bmp: true,
            astral: false,
        };
        assert_eq!(
            canon(&x),
            "{\"alpha\":\"a\",\"zeta\":1,\"\u{10000}\":false,\"\u{ffff}\":true}"
        );

        struct Dupes;
        impl Serialize for Dupes {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeMap;
                let mut m = s.serialize_map(None)?;
                m.serialize_entry("b", &1)?;
                m.serialize_entry("a", &2)?;
                m.serialize_entry("b", &3)?;
                m.serialize_entry("a", &4)?;
                m.serialize_entry("c", &5)?;
                m.end()
            }
        }
        let value = serde_json::to_value(Dupes).expect("to_value");
        assert_eq!(canon(&Dupes), reference(&value));
        assert_eq!(canon(&Dupes), r#"{"a":4,"b":3,"c":5}"#);
    }

    // -----------------------------------------------------------------------------------
    // The integer rule
    // -----------------------------------------------------------------------------------

    #[test]
    fn integers_beyond_2_pow_53_are_strings() {
        assert_eq!(canon(&9_007_199_254_740_991_u64), "9007199254740991");
        assert_eq!(canon(&9_007_199_254_740_992_u64), "\"9007199254740992\"");
        assert_eq!(canon(&-9_007_199_254_740_991_i64), "-9007199254740991");
        assert_eq!(canon(&-9_007_199_254_740_992_i64), "\"-9007199254740992\"");
        assert_eq!(canon(&u64::MAX), "\"18446744073709551615\"");
        assert_eq!(canon(&i64::MIN), "\"-9223372036854775808\"");
        assert_eq!(
            canon(&u128::MAX),
            "\"340282366920938463463374607431768211455\""
        );
        assert_eq!(
            canon(&i128::MIN),
            "\"-170141183460469231731687303715884105728\""
        );
        assert_eq!(canon(&5_i128), "5");
        assert_eq!(canon(&0_i64), "0");
        assert_eq!(canon(&json!(u64::MAX)), "\"18446744073709551615\"");
        // Floats are always numbers, written per ECMAScript.
        assert_eq!(canon(&9_007_199_254_740_992.0_f64), "9007199254740992");
        assert_eq!(canon(&1.8446744073709552e19_f64), "18446744073709552000");
    }

    // -----------------------------------------------------------------------------------
    // The serde data model, against the reference
    // -----------------------------------------------------------------------------------

    #[derive(Serialize, Debug, Clone)]
    struct Inner {
        b: f64,
        a: i64,
    }

    #[derive(Serialize, Debug, Clone)]
    enum Kind {
        Unit,
        Newtype(u64),
        Tuple(i8, String),
        Struct { y: char, x: () },
    }

    #[derive(Serialize, Debug)]
    struct TupleStruct(u32, &'static str);

    #[derive(Serialize, Debug)]
    struct UnitStruct;

    #[derive(Serialize, Debug)]
    struct Wrapper(Inner);

    #[derive(Serialize, Debug)]
    struct Flat {
        k: u8,
        #[serde(flatten)]
        rest: BTreeMap<String, i32>,
    }

    #[derive(Serialize, Debug)]
    #[serde(tag = "type", rename_all = "snake_case")]
    enum Tagged {
        Charge { zz: u8, amount: f64 },
        Refund(Inner),
    }

    #[derive(Serialize, Debug)]
    #[serde(untagged)]
    enum Untagged {
        Num(u8),
        Text(String),
    }

    #[derive(Serialize, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    enum KeyKind {
        Alpha,
        Beta,
    }

    #[derive(Serialize, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    struct KeyId(u32);

    #[derive(Debug)]
    struct Bytes(&'static [u8]);

    impl Serialize for Bytes {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(self.0)
        }
    }

    #[derive(Serialize, Debug)]
    struct Everything {
        unit: (),
        none: Option<u8>,
        some: Option<&'static str>,
        unit_struct: UnitStruct,
        tuple: (u8, bool, char),
        tuple_struct: TupleStruct,
        wrapper: Wrapper,
        kinds: Vec<Kind>,
        flat: Flat,
        tagged: Vec<Tagged>,
        untagged: Vec<Untagged>,
        bytes: Bytes,
        int_keys: BTreeMap<i64, &'static str>,
        u128_keys: BTreeMap<u128, u8>,
        bool_keys: BTreeMap<bool, u8>,
        char_keys: BTreeMap<char, u8>,
        enum_keys: BTreeMap<KeyKind, u8>,
        newtype_keys: BTreeMap<KeyId, u8>,
        float_keys: Vec<(f64, u8)>,
        big: u64,
        neg_zero: f64,
    }

    struct FloatKeys<'a>(&'a [(f64, u8)]);

    impl Serialize for FloatKeys<'_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
        }
    }

    #[test]
    fn serde_data_model_matches_to_value() {
        let x = Everything {
            unit: (),
            none: None,
            some: Some("s"),
            unit_struct: UnitStruct,
            tuple: (1, true, 'x'),
            tuple_struct: TupleStruct(7, "seven"),
            wrapper: Wrapper(Inner { b: 0.5, a: -3 }),
            kinds: vec![
                Kind::Unit,
                Kind::Newtype(u64::MAX),
                Kind::Tuple(-1, "t".into()),
                Kind::Struct { y: 'y', x: () },
            ],
            flat: Flat {
                k: 1,
                rest: [("b".to_owned(), 2), ("a".to_owned(), 1)].into(),
            },
            tagged: vec![
                Tagged::Charge {
                    zz: 1,
                    amount: 19.99,
                },
                Tagged::Refund(Inner { b: 1e21, a: 0 }),
            ],
            untagged: vec![Untagged::Num(3), Untagged::Text("three".into())],
            bytes: Bytes(&[0, 1, 255]),
            int_keys: [(-10, "neg"), (2, "two"), (10, "ten")].into(),
            u128_keys: [(u128::from(u64::MAX), 1)].into(),
            bool_keys: [(true, 1), (false, 0)].into(),
            char_keys: [('b', 1), ('\u{10000}', 2), ('\u{ffff}', 3)].into(),
            enum_keys: [(KeyKind::Beta, 2), (KeyKind::Alpha, 1)].into(),
            newtype_keys: [(KeyId(20), 2), (KeyId(3), 1)].into(),
            float_keys: vec![(1.0, 1), (0.5, 2), (1e21, 3)],
            big: 1 << 60,
            neg_zero: -0.0,
        };
        assert_matches_reference(&x);
        assert_matches_reference(&FloatKeys(&x.float_keys).to_json());
        let fk = FloatKeys(&x.float_keys);
        let value = serde_json::to_value(&fk).expect("to_value");
        assert_eq!(canon(&fk), reference(&value));
        assert_matches_reference(&Kind::Unit);
        assert_matches_reference(&Kind::Newtype(3));
        assert_matches_reference(&Kind::Tuple(1, "a".into()));
        assert_matches_reference(&Kind::Struct { y: '"', x: () });
        assert_matches_reference(&UnitStruct);
        assert_matches_reference(&Option::<u8>::None);
        assert_matches_reference(&Some(Some(1_u8)));
        assert_matches_reference(&HashMap::from([
            ("x", vec![1_u8]),
            ("é", vec![]),
            ("\u{10000}", vec![2]),
        ]));
    }

    impl FloatKeys<'_> {
        fn to_json(&self) -> Value {
            serde_json::to_value(self).expect("to_value")
        }
    }

    #[test]
    fn non_string_map_keys_are_errors() {
        let tuple_keys: BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into();
        assert_eq!(
            write_canonical(&tuple_keys, &mut Vec::new()),
            Err(CanonicalError::MapKeyNotString)
        );
        assert!(serde_json::to_value(&tuple_keys).is_err());
        let option_keys: BTreeMap<Option<u8>, u8> = [(Some(1), 3)].into();
        assert_eq!(
            write_canonical(&option_keys, &mut Vec::new()),
            Err(CanonicalError::MapKeyNotString)
        );
        let nan_keys = FloatKeys(&[(f64::NAN, 1)]);
        assert_eq!(
            write_canonical(&nan_keys, &mut Vec::new()),
            Err(CanonicalError::NonFinite)
        );
    }

    #[test]
    fn custom_errors_are_reported() {
        struct Fails;
        impl Serialize for Fails {
            fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
                Err(serde::ser::Error::custom("no can do"))
            }
        }
        let mut out = Vec::new();
        assert_eq!(
            write_canonical(&vec![Some(Fails)], &mut out),
            Err(CanonicalError::Custom("no can do".into()))
        );
        assert!(out.is_empty());
    }

    #[test]
    fn key_fields_refuse_numbers_that_may_not_be_exact() {
        fn exact<T: ?Sized + Serialize>(v: &T) -> Result<String, CanonicalError> {
            let mut out = Vec::new();
            write_canonical_exact(v, &mut out).map(|()| String::from_utf8(out).unwrap())
        }
        // Floats below 2^53 and typed integers of any size are exact.
        assert_eq!(
            exact(&9_007_199_254_740_991.0_f64).unwrap(),
            "9007199254740991"
        );
        assert_eq!(exact(&-19.99_f64).unwrap(), "-19.99");
        assert_eq!(exact(&u64::MAX).unwrap(), "\"18446744073709551615\"");
        assert_eq!(exact(&(u128::MAX)).unwrap(), format!("\"{}\"", u128::MAX));
        // 2^53 and above as floats, at any depth, are refused; NaN stays NonFinite.
        for f in [
            9_007_199_254_740_992.0_f64,
            -1e21,
            1.8446744073709552e19,
            f64::MAX,
        ] {
            assert!(
                matches!(exact(&f), Err(CanonicalError::InexactNumber(_))),
                "{f}"
            );
            assert!(matches!(
                exact(&serde_json::json!({"a": [1, {"b": f}]})),
                Err(CanonicalError::InexactNumber(_))
            ));
        }
        assert_eq!(exact(&f64::NAN), Err(CanonicalError::NonFinite));
        // The plain writer keeps writing them (arguments outside the key fields).
        assert_eq!(canon(&1e21_f64), "1e+21");
    }

    #[test]
    fn serde_json_private_tokens_are_decoded() {
        // What `serde_json::Number` and `RawValue` serialize as when the
        // `arbitrary_precision` / `raw_value` features are on somewhere in the build.
        struct Token(&'static str, &'static str);
        impl Serialize for Token {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeStruct;
                let mut st = s.serialize_struct(self.0, 1)?;
                st.serialize_field(self.0, self.1)?;
                st.end()
            }
        }
        let number = |t| canon(&Token(SERDE_JSON_NUMBER_TOKEN, t));
        // In a key field, integer text outside the 64-bit range is refused as without the
        // feature (where serde_json has already made it a double).
        let exact = |t| write_canonical_exact(&Token(SERDE_JSON_NUMBER_TOKEN, t), &mut Vec::new());
        assert_eq!(exact("18446744073709551615"), Ok(()));
        assert_eq!(exact("-9223372036854775808"), Ok(()));
        assert!(matches!(
            exact("18446744073709551616"),
            Err(CanonicalError::InexactNumber(_))
        ));
        assert!(matches!(
            exact("1e21"),
            Err(CanonicalError::InexactNumber(_))
        ));
        assert_eq!(number("12"), "12");
        assert_eq!(number("-0"), "0");
        assert_eq!(number("1.50"), "1.5");
        assert_eq!(number("1E30"), "1e+30");
        assert_eq!(number("18446744073709551615"), "\"18446744073709551615\"");
        assert_eq!(
            number("-123456789012345678901234567890123456789012"),
            "\"-123456789012345678901234567890123456789012\""
        );
        assert_eq!(
            write_canonical(&Token(SERDE_JSON_NUMBER_TOKEN, "1e400"), &mut Vec::new()),
            Err(CanonicalError::NonFinite)
        );
        assert_eq!(
            canon(&Token(SERDE_JSON_RAW_TOKEN, r#"{"b": 1, "a": [1.0, "x"]}"#)),
            r#"{"a":[1,"x"],"b":1}"#
        );
    }

    /// xorshift64*: a tiny deterministic generator for property-style checks.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }

        fn string(&mut self) -> String {
            const POOL: &[char] = &[
                'a',
                'b',
                'z',
                'A',
                '0',
                '_',
                '.',
                '"',
                '\\',
                '/',
                '\n',
                '\t',
                '\u{1}',
                '\u{1f}',
                '\u{7f}',
                '\u{80}',
                'é',
                'ö',
                '€',
                '中',
                '\u{e000}',
                '\u{fb33}',
                '\u{ffff}',
                '\u{10000}',
                '😀',
                '\u{10ffff}',
            ];
            let len = self.below(6);
            (0..len)
                .map(|_| POOL[self.below(POOL.len() as u64) as usize])
                .collect()
        }

        fn float(&mut self) -> f64 {
            match self.below(4) {
                0 => (self.below(2000) as f64 - 1000.0) / 8.0,
                1 => (self.below(100_000) as f64) / 100.0,
                _ => loop {
                    let f = f64::from_bits(self.next());
                    if f.is_finite() {
                        break f;
                    }
                },
            }
        }

        fn value(&mut self, depth: u32) -> Value {
            let kinds = if depth == 0 { 6 } else { 8 };
            match self.below(kinds) {
                0 => Value::Null,
                1 => Value::Bool(self.below(2) == 1),
                2 => match self.below(3) {
                    0 => json!(self.next()),
                    1 => json!(self.next() as i64),
                    _ => json!(self.below(1 << 54) as i64 - (1 << 53)),
                },
                3 => json!(self.float()),
                4 | 5 => Value::String(self.string()),
                6 => Value::Array((0..self.below(4)).map(|_| self.value(depth - 1)).collect()),
                _ => Value::Object(
                    (0..self.below(5))
                        .map(|_| (self.string(), self.value(depth - 1)))
                        .collect(),
                ),
            }
        }
    }

    #[test]
    fn random_values_match_the_reference() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..3000 {
            let value = rng.value(4);
            assert_eq!(canon(&value), reference(&value), "for {value}");
        }
    }

    #[test]
    fn random_typed_values_match_to_value() {
        let mut rng = Rng(0xdead_beef_cafe_f00d);
        for _ in 0..500 {
            let inners: Vec<Inner> = (0..rng.below(3))
                .map(|_| Inner {
                    b: rng.float(),
                    a: rng.next() as i64,
                })
                .collect();
            let map: HashMap<String, Option<Kind>> = (0..rng.below(5))
                .map(|_| {
                    let kind = match rng.below(5) {
                        0 => None,
                        1 => Some(Kind::Unit),
                        2 => Some(Kind::Newtype(rng.next())),
                        3 => Some(Kind::Tuple(rng.next() as i8, rng.string())),
                        _ => Some(Kind::Struct {
                            y: rng.string().chars().next().unwrap_or('y'),
                            x: (),
                        }),
                    };
                    (rng.string(), kind)
                })
                .collect();
            let int_keys: HashMap<i64, String> = (0..rng.below(4))
                .map(|_| (rng.next() as i64, rng.string()))
                .collect();
            assert_matches_reference(&(inners, map, int_keys));
        }
    }

    // -----------------------------------------------------------------------------------
    // Keys
    // -----------------------------------------------------------------------------------

    #[test]
    fn empty_key_fields_are_refused() {
        let cases: Vec<(Box<dyn erased::Ser>, &str)> = vec![
            (Box::new(Value::Null), "null"),
            (Box::new(Option::<String>::None), "null"),
            (Box::new(()), "null"),
            (Box::new(""), "an empty string"),
            (Box::new(String::new()), "an empty string"),
            (Box::new(Vec::<u8>::new()), "an empty array"),
            (Box::new(json!([])), "an empty array"),
            (Box::new(BTreeMap::<String, u8>::new()), "an empty object"),
            (Box::new(json!({})), "an empty object"),
        ];
        for (value, found) in cases {
            let mut builder = KeyBuilder::new(TOOL_KEY_CONTRACT);
            let err = value.add(&mut builder, "cart.id").expect_err("refused");
            assert_eq!(
                err,
                KeyFieldError::Empty {
                    field: "cart.id".into(),
                    found
                }
            );
            assert!(err.to_string().contains("`cart.id`"), "{err}");
            // The builder is unchanged and still usable.
            builder.field("user_id", "u-1").expect("accepted");
            assert_eq!(
                builder.finish_document(None, "t", 1),
                br#"{"contract":"tool-contracts/key/v1","fields":{"user_id":"u-1"},"scope":null,"tool":"t","version":1}"#
            );
        }
    }

    /// Object-safe wrapper to put differently typed values in one list.
    mod erased {
        pub trait Ser {
            fn add(
                &self,
                builder: &mut super::KeyBuilder,
                path: &str,
            ) -> Result<(), super::KeyFieldError>;
        }
        impl<T: serde::Serialize> Ser for T {
            fn add(
                &self,
                builder: &mut super::KeyBuilder,
                path: &str,
            ) -> Result<(), super::KeyFieldError> {
                builder.field(path, self)
            }
        }
    }

    #[test]
    fn falsy_values_are_not_empty() {
        let mut builder = KeyBuilder::new(TOOL_KEY_CONTRACT);
        builder.field("a", &0).expect("zero is a value");
        builder.field("b", &false).expect("false is a value");
        builder
            .field("c", &json!([null]))
            .expect("[null] is a value");
        builder
            .field("d", &json!({"x": null}))
            .expect("{\"x\":null} is a value");
        builder.field("e", &0.0).expect("0.0 is a value");
        builder.field("f", " ").expect("a space is a value");
        assert_eq!(
            builder.finish_document(Some("s"), "t", 2),
            br#"{"contract":"tool-contracts/key/v1","fields":{"a":0,"b":false,"c":[null],"d":{"x":null},"e":0,"f":" "},"scope":"s","tool":"t","version":2}"#
        );
    }

    #[test]
    fn unencodable_key_fields_name_the_field() {
        let mut builder = KeyBuilder::new(TOOL_KEY_CONTRACT);
        let err = builder
            .field("amount", &f64::NAN)
            .expect_err("NaN is refused");
        assert_eq!(
            err,
            KeyFieldError::Encode {
                field: "amount".into(),
                source: CanonicalError::NonFinite
            }
        );
        assert!(err.to_string().contains("`amount`"), "{err}");
    }

    #[test]
    fn finish_hashes_the_document() {
        let build = || {
            let mut b = KeyBuilder::new(TOOL_KEY_CONTRACT);
            b.field("x", &1).expect("ok");
            b
        };
        let doc = build().finish_document(None, "tool", 3);
        let key = build().finish(None, "tool", 3);
        assert_eq!(key, hex_lower(&Sha256::digest(&doc).into()));
        assert_eq!(key.len(), 64);
        assert!(key
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        // sha256("abc"), FIPS 180-2 test vector: pins the hex encoding.
        assert_eq!(
            hex_lower(&Sha256::digest(b"abc").into()),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn the_contract_is_a_parameter() {
        let mut b = KeyBuilder::new("tool-contracts/run/v1");
        b.field("x", &1).expect("ok");
        assert_eq!(
            b.finish_document(None, "t", 1),
            br#"{"contract":"tool-contracts/run/v1","fields":{"x":1},"scope":null,"tool":"t","version":1}"#
        );
    }

    #[test]
    fn scope_tool_and_version_change_the_key() {
        let v = json!("v");
        let base = tool_key("t", 1, None, &[("x", &v)]).expect("ok");
        assert_ne!(base, tool_key("t", 2, None, &[("x", &v)]).expect("ok"));
        assert_ne!(base, tool_key("u", 1, None, &[("x", &v)]).expect("ok"));
        assert_ne!(base, tool_key("t", 1, Some(""), &[("x", &v)]).expect("ok"));
        assert_ne!(
            base,
            tool_key("t", 1, Some("null"), &[("x", &v)]).expect("ok")
        );
    }

    #[test]
    fn tool_key_sorts_fields_and_refuses_duplicates() {
        let (a, b) = (json!(1), json!("two"));
        assert_eq!(
            tool_key("t", 1, None, &[("b.x", &b), ("a", &a)]),
            tool_key("t", 1, None, &[("a", &a), ("b.x", &b)])
        );
        assert_eq!(
            tool_key("t", 1, None, &[("a", &a), ("b", &b), ("a", &b)]),
            Err(KeyFieldError::DuplicateField { field: "a".into() })
        );
        assert_eq!(
            tool_key("t", 1, None, &[("a", &Value::Null)]),
            Err(KeyFieldError::Empty {
                field: "a".into(),
                found: "null"
            })
        );
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "strictly increasing JCS order")]
    fn unsorted_fields_are_caught_in_debug_builds() {
        let mut b = KeyBuilder::new(TOOL_KEY_CONTRACT);
        let _ = b.field("b", &1);
        let _ = b.field("a", &1);
    }
}
