//! Lowercase hex: the one encoder behind a key's 64 digits, the `\u00xx` escapes of
//! control characters and [`Secret`](crate::Secret) digests.
//!
//! Written by hand (a 16-entry table) rather than pulling in the `hex` crate.

/// The hex digits, lowercase.
const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// The two lowercase hex digits of `b`, high nibble first.
#[inline]
pub(super) fn hex_pair(b: u8) -> [u8; 2] {
    [DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 0x0f)]]
}

/// Appends the lowercase hex of `bytes` to `out`, two digits a byte, high nibble first.
pub(crate) fn push_hex(out: &mut String, bytes: &[u8]) {
    out.reserve(2 * bytes.len());
    for &b in bytes {
        let [high, low] = hex_pair(b);
        out.push(char::from(high));
        out.push(char::from(low));
    }
}
