//! [`Secret`]: a tool parameter whose clear value never reaches the store, the logs or the
//! registry's output.

use core::fmt;

use serde::de::{Deserialize, Deserializer, Error as _};
use serde::ser::{Error as _, Serialize, SerializeStruct, Serializer};
use sha2::{Digest, Sha256};

/// A value that must not be written in clear: a card number, a token, a password.
///
/// Clients send the plain value (`"card": "4242 4242 4242 4242"`): `Secret<T>` deserializes
/// exactly as `T` does, and its JSON Schema is `T`'s. The tool body reads it with
/// [`expose`](Secret::expose).
///
/// Everything that *writes* it sees only a digest:
///
/// - `Debug` and `Display` print `Secret(***)`, so `tracing` fields, panics and error
///   messages built with `{:?}` or `{}` never show the value;
/// - `Serialize` writes `{"sha256": "<hex>"}`, the lowercase hex SHA-256 of the value's
///   canonical JSON (`docs/key-spec.md`, section 3). That is what the store keeps in a
///   record's arguments and fingerprint, and what a key field made of a `Secret` hashes:
///   the same secret always gives the same key, different secrets give different keys,
///   and the clear value never reaches the store.
///
/// An *empty* value (one whose canonical JSON is `null`, `""`, `[]` or `{}`) is written as
/// itself: it reveals nothing, and a `Secret` key field then still gets the empty-intent
/// check (`Error::InvalidArguments`) instead of hashing nothing into a shared key.
///
/// The digest is unsalted (keys must stay computable by any client, see
/// `docs/key-spec.md`), so whoever reads the store can confirm a guess, and can enumerate
/// a small value space (a PIN, a 16-digit card number with a known prefix). See
/// `docs/security.md`.
///
/// A `Secret` as a tool's *result* is stored as its digest and cannot be replayed; return
/// secrets from read-only tools, or not at all.
///
/// ```
/// use tool_contracts_runtime::Secret;
///
/// let card: Secret<String> = serde_json::from_str(r#""4242424242424242""#)?;
/// assert_eq!(card.expose(), "4242424242424242");
/// assert_eq!(format!("{card:?} {card}"), "Secret(***) Secret(***)");
/// let stored = serde_json::to_string(&card)?;
/// assert!(stored.starts_with(r#"{"sha256":""#) && !stored.contains("4242"));
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Secret<T>(T);

impl<T> Secret<T> {
    /// Wraps a value.
    pub const fn new(value: T) -> Self {
        Secret(value)
    }

    /// The clear value, for the tool body. Do not log it.
    pub fn expose(&self) -> &T {
        &self.0
    }

    /// The clear value, by value.
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T> From<T> for Secret<T> {
    fn from(value: T) -> Self {
        Secret(value)
    }
}

impl<T> fmt::Debug for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl<T> fmt::Display for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// Canonical JSON of an empty value: written as itself (see the type's documentation).
const EMPTY_FORMS: [&[u8]; 4] = [b"null", b"\"\"", b"[]", b"{}"];

impl<T: Serialize> Serialize for Secret<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut canonical = Vec::new();
        crate::key::write_canonical_exact(&self.0, &mut canonical)
            .map_err(|e| S::Error::custom(format_args!("secret value: {e}")))?;
        if EMPTY_FORMS.contains(&canonical.as_slice()) {
            return self.0.serialize(serializer);
        }
        let digest = Sha256::digest(&canonical);
        let mut hex = String::with_capacity(64);
        crate::key::push_hex(&mut hex, &digest);
        let mut object = serializer.serialize_struct("Secret", 1)?;
        object.serialize_field("sha256", &hex)?;
        object.end()
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Secret<T> {
    /// Deserializes as `T`. On failure the message is replaced: serde's messages quote the
    /// offending value (`invalid type: integer `737`, expected a string`), and a secret
    /// sent with the wrong type must not be echoed into errors and logs either.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        T::deserialize(deserializer).map(Secret).map_err(|_| {
            D::Error::custom(format_args!(
                "the value of this secret parameter is not a valid `{}` (the value is not shown)",
                core::any::type_name::<T>()
            ))
        })
    }
}

impl<T: schemars::JsonSchema> schemars::JsonSchema for Secret<T> {
    fn inline_schema() -> bool {
        T::inline_schema()
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        T::schema_name()
    }

    fn schema_id() -> std::borrow::Cow<'static, str> {
        T::schema_id()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        T::json_schema(generator)
    }
}

#[cfg(test)]
mod tests {
    use super::Secret;

    #[test]
    fn a_secret_serializes_as_the_digest_of_its_canonical_json() {
        let json = serde_json::to_value(Secret::new("abc")).unwrap();
        // sha256(b"\"abc\"")
        let mut canonical = Vec::new();
        crate::key::write_canonical(&"abc", &mut canonical).unwrap();
        assert_eq!(canonical, b"\"abc\"");
        let hex = json["sha256"].as_str().unwrap().to_owned();
        assert_eq!(hex.len(), 64);
        assert!(!json.to_string().contains("abc"));
        assert_eq!(
            serde_json::to_value(Secret::new("")).unwrap(),
            serde_json::json!("")
        );
        assert_eq!(
            serde_json::to_value(Secret::new(None::<u8>)).unwrap(),
            serde_json::Value::Null
        );
    }
}
