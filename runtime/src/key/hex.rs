//! Lowercase hex: the one encoder behind a key's 64 digits, the `\u00xx` escapes of
//! control characters and [`Secret`](crate::Secret) digests.
//!
//! Runs of bytes (a key's digest) go through `const-hex`; a single byte's pair (an escape)
//! is a 16-entry table lookup, which no crate call would make cheaper.

/// The hex digits, lowercase.
const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// The two lowercase hex digits of `b`, high nibble first.
#[inline]
pub(super) fn hex_pair(b: u8) -> [u8; 2] {
    [DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 0x0f)]]
}

/// Appends the lowercase hex of `bytes` to `out`, two digits a byte, high nibble first.
///
/// The digits of up to 32 bytes (a SHA-256 digest) are written by `const_hex` (SIMD where
/// the CPU has it) into a stack buffer and appended in one copy.
pub(crate) fn push_hex(out: &mut String, bytes: &[u8]) {
    let mut digits = [0_u8; 64];
    out.reserve(2 * bytes.len());
    for chunk in bytes.chunks(digits.len() / 2) {
        let written = digits.get_mut(..2 * chunk.len()).unwrap_or_default();
        if const_hex::encode_to_slice(chunk, written).is_ok() {
            // Hex digits are ASCII, so this never fails (and checks 64 bytes at most).
            out.push_str(core::str::from_utf8(written).unwrap_or_default());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::push_hex;

    #[test]
    fn hex_is_two_lowercase_digits_a_byte_at_any_length() {
        for len in [
            0_usize, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 65, 100, 256,
        ] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            let mut out = String::from("x");
            push_hex(&mut out, &bytes);
            let expected: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(out, format!("x{expected}"), "{len} bytes");
        }
        // Every byte value.
        let bytes: Vec<u8> = (0..=255_u8).collect();
        let mut out = String::new();
        push_hex(&mut out, &bytes);
        let expected: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(out, expected);
    }
}
