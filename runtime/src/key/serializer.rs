//! The serde [`Serializer`](ser::Serializer) that reaches the canonical writer: it maps
//! serde's data model onto JSON as `serde_json::to_value` does (`docs/key-spec.md`
//! section 8), streaming each value into the output through [`canonical`](super::canonical)
//! with no `serde_json::Value` in between.
//!
//! Arrays are streamed as they come; object members are written in arrival order and put
//! into JCS order when the object closes (only if they did not arrive in it); map keys go
//! through their own serializer ([`MapKey`]), which accepts what `serde_json` accepts as
//! a key. `serde_json`'s private number and raw-value tokens are decoded here.

use core::cmp::Ordering;
use core::fmt;

use serde::ser::{self, Impossible, Serialize};

use super::canonical::{
    check_exact, digits_u128, key_order, key_prefix, key_text, reorder, write_f64, write_i128,
    write_integer, write_integer_u64, write_number_text, write_str, write_u64, CanonicalError,
    Entry, EscapeWriter, KeyRef,
};

/// Struct name `serde_json` uses for numbers under its `arbitrary_precision` feature.
pub(super) const SERDE_JSON_NUMBER_TOKEN: &str = "$serde_json::private::Number";
/// Struct name `serde_json` uses for `RawValue` under its `raw_value` feature.
pub(super) const SERDE_JSON_RAW_TOKEN: &str = "$serde_json::private::RawValue";

/// `Serializer` methods for narrow integer types, each widening its value (exactly) and
/// passing it to the method of the wide type: `serialize_i8(i8) => serialize_i64(i64);`.
macro_rules! widen_integers {
    ($($($narrow:ident($from:ty)),+ => $wide:ident($to:ty);)+) => {$($(
        fn $narrow(self, v: $from) -> Result<(), CanonicalError> {
            self.$wide(<$to>::from(v))
        }
    )+)+};
}

/// The error of a `Display` implementation that failed inside `collect_str`.
fn display_failed(_: fmt::Error) -> CanonicalError {
    CanonicalError::Custom("a `Display` implementation returned an error".to_owned())
}

// ---------------------------------------------------------------------------------------
// Entry point
// ---------------------------------------------------------------------------------------

/// Buffers the object encoder reuses across objects (and, in a
/// [`KeyBuilder`](super::KeyBuilder), across fields), so an object costs no allocation of
/// its own.
///
/// `entries` and `keys` are stacks: an open object owns everything above the lengths they
/// had when it opened and truncates back to them when it closes; a member truncates back
/// after its value, so a nested object that failed midway leaves nothing behind.
#[derive(Debug, Clone, Default)]
pub(super) struct Scratch {
    /// Members of the open objects, innermost last.
    entries: Vec<Entry>,
    /// Raw text of the map keys of the open objects.
    keys: String,
    /// Copy of the members being reordered (used by one `close` at a time).
    body: Vec<u8>,
}

impl Scratch {
    /// Empties the buffers for reuse, dropping instead any whose capacity is over
    /// `max_bytes`.
    pub(super) fn recycle(&mut self, max_bytes: usize) {
        self.entries.clear();
        self.keys.clear();
        self.body.clear();
        if self.entries.capacity() * core::mem::size_of::<Entry>() > max_bytes {
            self.entries = Vec::new();
        }
        if self.keys.capacity() > max_bytes {
            self.keys = String::new();
        }
        if self.body.capacity() > max_bytes {
            self.body = Vec::new();
        }
    }
}

/// Writes the canonical JSON of `value` to `out`, using (and leaving reusable) `scratch`.
/// On error `out` is left exactly as it was.
/// With `exact`, floats of magnitude 2^53 or more are refused (the key fields' rule).
pub(super) fn write_canonical_with<T: ?Sized + Serialize>(
    value: &T,
    out: &mut Vec<u8>,
    scratch: &mut Scratch,
    exact: bool,
) -> Result<(), CanonicalError> {
    let mark = out.len();
    scratch.entries.clear();
    scratch.keys.clear();
    let result = value.serialize(Canonical {
        out: &mut *out,
        scratch,
        exact,
    });
    if result.is_err() {
        out.truncate(mark);
    }
    result
}

// ---------------------------------------------------------------------------------------
// Values
// ---------------------------------------------------------------------------------------

/// Serializer writing canonical JSON into `out`.
struct Canonical<'a> {
    out: &'a mut Vec<u8>,
    scratch: &'a mut Scratch,
    /// The key fields' number rule is on: floats of magnitude 2^53 or more are refused.
    /// A setting of one write, so it travels with the serializer rather than with the
    /// reused buffers of [`Scratch`].
    exact: bool,
}

impl Canonical<'_> {
    /// A serializer for a nested value, writing to the same buffers.
    fn reborrow(&mut self) -> Canonical<'_> {
        Canonical {
            out: &mut *self.out,
            scratch: &mut *self.scratch,
            exact: self.exact,
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

    widen_integers! {
        serialize_i8(i8), serialize_i16(i16), serialize_i32(i32) => serialize_i64(i64);
        serialize_u8(u8), serialize_u16(u16), serialize_u32(u32) => serialize_u64(u64);
    }

    fn serialize_i64(self, v: i64) -> Result<(), CanonicalError> {
        write_integer_u64(self.out, v < 0, v.unsigned_abs());
        Ok(())
    }

    fn serialize_i128(self, v: i128) -> Result<(), CanonicalError> {
        write_i128(self.out, v);
        Ok(())
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
        check_exact(v, self.exact)?;
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
        write!(EscapeWriter { out: self.out }, "{value}").map_err(display_failed)?;
        self.out.push(b'"');
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Arrays
// ---------------------------------------------------------------------------------------

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

/// The four array-like serde traits, all forwarding to [`SeqWriter::element`] and
/// [`SeqWriter::close`].
macro_rules! seq_writer_impls {
    ($($trait:ident :: $method:ident),* $(,)?) => {$(
        impl ser::$trait for SeqWriter<'_> {
            type Ok = ();
            type Error = CanonicalError;

            fn $method<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), CanonicalError> {
                self.element(value)
            }

            fn end(self) -> Result<(), CanonicalError> {
                self.close()
            }
        }
    )*};
}

seq_writer_impls!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field,
);

// ---------------------------------------------------------------------------------------
// Objects
// ---------------------------------------------------------------------------------------

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
        let Canonical { out, scratch, .. } = &mut self.inner;
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
        let Canonical { out, scratch, .. } = &mut self.inner;
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
            inner: Canonical { out, scratch, .. },
            body_start,
            entries_base,
            keys_base,
            in_order,
            wrapped,
            ..
        } = self;
        if !in_order {
            if let Some(members) = scratch.entries.get_mut(entries_base..) {
                reorder(out, members, &scratch.keys, &mut scratch.body, body_start);
            }
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
                write_number_text(inner.out, &text, inner.exact)
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

// ---------------------------------------------------------------------------------------
// Map keys
// ---------------------------------------------------------------------------------------

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

    fn float<F: Serialize>(self, v: F, finite: bool) -> Result<(), CanonicalError> {
        if !finite {
            return Err(CanonicalError::NonFinite);
        }
        // `serde_json` writes finite float keys with its own shortest-round-trip formatter
        // (not ECMAScript's); delegate to it so the keys match `to_value` exactly.
        let text = serde_json::to_string(&v).map_err(|_| CanonicalError::NonFinite)?;
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

    widen_integers! {
        serialize_i8(i8), serialize_i16(i16), serialize_i32(i32), serialize_i64(i64)
            => serialize_i128(i128);
        serialize_u8(u8), serialize_u16(u16), serialize_u32(u32), serialize_u64(u64)
            => serialize_u128(u128);
    }

    fn serialize_i128(self, v: i128) -> Result<(), CanonicalError> {
        self.integer(v < 0, v.unsigned_abs())
    }

    fn serialize_u128(self, v: u128) -> Result<(), CanonicalError> {
        self.integer(false, v)
    }

    fn serialize_f32(self, v: f32) -> Result<(), CanonicalError> {
        self.float(v, v.is_finite())
    }

    fn serialize_f64(self, v: f64) -> Result<(), CanonicalError> {
        self.float(v, v.is_finite())
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
        write!(self.out, "{value}").map_err(display_failed)
    }
}
