//! The canonical JSON writer: numbers, strings and their escapes, and the JCS order of
//! object members (`jcs_cmp`, and the reordering of members written out of order).
//!
//! Everything here writes bytes into a `Vec<u8>` and knows nothing of serde: the
//! [`serializer`](super::serializer) decides *what* to write and calls these functions for
//! *how*. The rules are `docs/key-spec.md` section 3 (RFC 8785 with the spec's integer
//! rule and the key fields' refusal of inexact numbers).

use core::cmp::Ordering;
use core::fmt;

use serde::ser;

use super::hex::hex_pair;

// ---------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------
// Numbers
// ---------------------------------------------------------------------------------------

/// Largest integer magnitude an IEEE 754 double holds exactly (2^53 - 1).
///
/// Integers beyond it are written as JSON strings (`docs/key-spec.md` section 3.3).
const MAX_SAFE_INTEGER: u64 = 9_007_199_254_740_991;

/// 2^53: the smallest float magnitude that a key field refuses (above it, neighbouring
/// integers round to the same double).
const FIRST_INEXACT_FLOAT: f64 = 9_007_199_254_740_992.0;

/// `"00"`, `"01"`, ..., `"99"`: two digits per division (as `itoa` does).
const DIGIT_PAIRS: &[u8; 200] = b"\
    0001020304050607080910111213141516171819\
    2021222324252627282930313233343536373839\
    4041424344454647484950515253545556575859\
    6061626364656667686970717273747576777879\
    8081828384858687888990919293949596979899";

/// Writes the decimal digits of `n` (no sign) into the end of `buf`, two per division,
/// returning the start. `N` is at least 20 (u64::MAX has 20 digits), so `i` never goes
/// below 0.
#[inline]
fn digits_u64<const N: usize>(mut n: u64, buf: &mut [u8; N]) -> usize {
    let mut i = N;
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
    i
}

/// Writes the decimal digits of `n` (no sign) into the end of `buf`, returning the start.
pub(super) fn digits_u128(n: u128, buf: &mut [u8; 40]) -> usize {
    // Nearly every integer fits in 64 bits, whose division is much cheaper than 128-bit.
    if let Ok(n) = u64::try_from(n) {
        return digits_u64(n, buf);
    }
    let mut i = buf.len();
    let mut n = n;
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

/// Writes the decimal digits of `n` (no sign).
fn write_u128_digits(out: &mut Vec<u8>, n: u128) {
    let mut buf = [0_u8; 40];
    let start = digits_u128(n, &mut buf);
    out.extend_from_slice(buf.get(start..).unwrap_or_default());
}

/// Writes the decimal digits of `n` (no sign).
#[inline]
pub(super) fn write_u64(out: &mut Vec<u8>, n: u64) {
    let mut buf = [0_u8; 20];
    let start = digits_u64(n, &mut buf);
    out.extend_from_slice(buf.get(start..).unwrap_or_default());
}

/// [`write_integer`] for magnitudes that fit in 64 bits (nearly all of them).
#[inline]
pub(super) fn write_integer_u64(out: &mut Vec<u8>, negative: bool, magnitude: u64) {
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
pub(super) fn write_integer(out: &mut Vec<u8>, negative: bool, magnitude: u128) {
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

pub(super) fn write_i128(out: &mut Vec<u8>, n: i128) {
    write_integer(out, n < 0, n.unsigned_abs());
}

/// Under the key fields' rule (`exact`), refuses a float of magnitude 2^53 or more: it may
/// be the rounding of another number (NaN and infinities are left to [`write_f64`]).
#[inline]
pub(super) fn check_exact(f: f64, exact: bool) -> Result<(), CanonicalError> {
    if exact && f.abs() >= FIRST_INEXACT_FLOAT && f.is_finite() {
        return Err(CanonicalError::InexactNumber(
            ryu_js::Buffer::new().format_finite(f).to_owned(),
        ));
    }
    Ok(())
}

/// Writes `f` as ECMAScript's `Number.prototype.toString` does (RFC 8785 section 3.2.2.3).
pub(super) fn write_f64(out: &mut Vec<u8>, f: f64) -> Result<(), CanonicalError> {
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

/// Writes JSON number text (from `serde_json`'s `arbitrary_precision` feature) canonically:
/// integers per the integer rule, anything else as the f64 it denotes. Under the key
/// fields' rule (`exact`) an integer outside the 64-bit range is refused as it is without
/// the feature (where `serde_json` has already made it a double), so keys do not depend
/// on a feature switched on elsewhere in the build.
pub(super) fn write_number_text(
    out: &mut Vec<u8>,
    text: &str,
    exact: bool,
) -> Result<(), CanonicalError> {
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

// ---------------------------------------------------------------------------------------
// Strings
// ---------------------------------------------------------------------------------------

/// Writes `s` as a JSON string with RFC 8785 escaping: `\"`, `\\`, `\b`, `\f`, `\n`, `\r`,
/// `\t`, other controls below U+0020 as `\u00xx` (lowercase hex), everything else raw.
#[inline]
pub(crate) fn write_str(out: &mut Vec<u8>, s: &str) {
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
    // The padding byte `a` needs no escape; bytes read twice do not change the answer.
    const PAD: u64 = u64::from_ne_bytes([b'a'; 8]);
    let last = if rest.is_empty() {
        return false;
    } else if let Some(word) = bytes.last_chunk::<8>() {
        // At least 8 bytes in all: the last 8 cover the remainder.
        u64::from_ne_bytes(*word)
    } else if let (Some(low), Some(high)) = (rest.first_chunk::<4>(), rest.last_chunk::<4>()) {
        // 4 to 7 bytes: the first 4 and the last 4 cover them.
        u64::from(u32::from_ne_bytes(*low)) | (u64::from(u32::from_ne_bytes(*high)) << 32)
    } else if let (Some(low), Some(high)) = (rest.first_chunk::<2>(), rest.last_chunk::<2>()) {
        // 2 or 3 bytes: the first 2 and the last 2 cover them.
        u64::from(u16::from_ne_bytes(*low))
            | (u64::from(u16::from_ne_bytes(*high)) << 16)
            | (PAD << 32)
    } else {
        // One byte.
        u64::from(rest.first().copied().unwrap_or(b'a')) | (PAD << 8)
    };
    word_needs_escape(last)
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
    let escape = ESCAPE[usize::from(b)];
    if escape == 0 {
        return;
    }
    out.extend_from_slice(bytes.get(*run..i).unwrap_or_default());
    if escape == b'u' {
        let [high, low] = hex_pair(b);
        out.extend_from_slice(&[b'\\', b'u', b'0', b'0', high, low]);
    } else {
        out.extend_from_slice(&[b'\\', escape]);
    }
    *run = i + 1;
}

/// `fmt::Write` adapter escaping into a JSON string body (for `collect_str`).
pub(super) struct EscapeWriter<'a> {
    /// The output, inside the string's quotes.
    pub(super) out: &'a mut Vec<u8>,
}

impl fmt::Write for EscapeWriter<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        write_str_body(self.out, s);
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Member order
// ---------------------------------------------------------------------------------------

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

/// Where an object member's raw (unescaped) key lives.
#[derive(Debug, Clone, Copy)]
pub(super) enum KeyRef {
    /// A struct field name.
    Static(&'static str),
    /// A range of [`Scratch::keys`](super::serializer::Scratch::keys) (map keys).
    Owned(usize, usize),
}

/// The raw text of `key`, whose map keys live in `keys`.
#[inline]
pub(super) fn key_text(keys: &str, key: KeyRef) -> &str {
    match key {
        KeyRef::Static(s) => s,
        KeyRef::Owned(start, end) => keys.get(start..end).unwrap_or_default(),
    }
}

/// The first 8 bytes of `key` as a big-endian integer, zero-padded: unequal prefixes
/// compare as the keys' first 8 bytes do in byte order (a key that ends first is padded
/// with 0, below every other byte, as a proper prefix sorts first).
#[inline]
pub(super) fn key_prefix(key: &str) -> u64 {
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
pub(super) fn key_order(
    keys: &str,
    a: KeyRef,
    a_prefix: u64,
    b: KeyRef,
    b_prefix: u64,
) -> Ordering {
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    if a_prefix != b_prefix && (a_prefix | b_prefix) & HIGHS == 0 {
        return a_prefix.cmp(&b_prefix);
    }
    jcs_cmp(key_text(keys, a), key_text(keys, b))
}

/// One member already written to the output.
#[derive(Debug, Clone, Copy)]
pub(super) struct Entry {
    /// Where the member's key lives.
    pub(super) key: KeyRef,
    /// [`key_prefix`] of the key.
    pub(super) prefix: u64,
    /// Byte range of `"key":value` in the output.
    pub(super) start: usize,
    /// End of that range.
    pub(super) end: usize,
}

/// Puts `members`, written from `body_start` to the end of `out` in arrival order, into
/// JCS order (their map keys live in `keys`; `body` is scratch space). Of members with
/// equal keys only the last to arrive is kept, as when `serde_json::to_value` inserts them
/// into its map.
pub(super) fn reorder(
    out: &mut Vec<u8>,
    members: &mut [Entry],
    keys: &str,
    body: &mut Vec<u8>,
    body_start: usize,
) {
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

#[cfg(test)]
mod tests {
    use super::{needs_escape, ESCAPE};

    /// The word-at-a-time test agrees with the byte table for every length up to 24 and
    /// every position of one byte of each kind (controls, `"`, `\`, and their neighbours
    /// that need no escape), so the tail gather of 1, 2-3 and 4-7 bytes misses nothing.
    #[test]
    fn needs_escape_agrees_with_the_table_at_every_length_and_position() {
        let kinds = [
            0x00_u8, 0x01, 0x1f, b'"', b'\\', 0x20, 0x21, 0x23, 0x5b, 0x5d, 0x7f, 0x80, 0xa2, 0xdc,
            0xff,
        ];
        for len in 1..=24_usize {
            for at in 0..len {
                for &kind in &kinds {
                    let mut bytes = vec![b'x'; len];
                    bytes[at] = kind;
                    let expected = bytes.iter().any(|&b| ESCAPE[usize::from(b)] != 0);
                    assert_eq!(
                        needs_escape(&bytes),
                        expected,
                        "{len} bytes, {kind:#04x} at {at}"
                    );
                }
            }
        }
        assert!(!needs_escape(b""));
    }
}
