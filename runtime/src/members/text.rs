//! The members rule applied to JSON text in the pass that decodes it: no `Value` built.
//!
//! [`Members::decode_text`] runs the tool's own `Deserialize` over `serde_json`'s text
//! deserializer wrapped in [`Checked`], which knows the schema node of every value serde
//! asks for and looks at every member name as it goes by (whatever serde then does with
//! it: a field, a map key, a `#[serde(flatten)]` buffer). A member the schema does not
//! declare stops the decoding, and so does every value this one pass cannot judge the way
//! [`Members::check`] would (an object or array matched by several alternatives, an enum's
//! object form); the caller then parses the text and takes the tree walk's verdict, so
//! this pass may refuse more than the walk but never lets through what the walk refuses.
//!
//! Hand-written: `serde_ignored` (the closest crate) reports only the members serde
//! skipped, not those it took under another name (`#[serde(alias)]`) or buffered
//! (`flatten`), which the schema may not declare; the rule here is the schema's.

use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess,
    Visitor,
};

use super::{Members, Rule, MAX_DEPTH};

/// The JSON type bits ([`super::type_bit`]) of the two kinds of value a check looks into.
const OBJECT: u8 = 64;
const ARRAY: u8 = 32;

/// Why the pass stopped (never shown: the caller's tree walk gives the message).
const UNDECIDED: &str = "not decided in one pass";

/// What [`Members::check`] does with an object or an array met at a node.
enum Step<'m> {
    /// It finds nothing in the value.
    Skip,
    /// It checks the value against this rule's own members and items, at this depth.
    Own(&'m Rule, usize),
    /// It needs the value twice (several alternatives of its type, or alternatives beside
    /// members of the schema's own), which one pass over text cannot give.
    Undecided,
}

impl Members {
    /// `args`, a JSON object as text, decoded into `A` with every member checked against
    /// the schema in the same pass; `None` if either refuses it, or this pass cannot tell
    /// (then the caller parses the text and asks [`Members::unknown_member`]).
    pub(crate) fn decode_text<A: DeserializeOwned>(&self, args: &str) -> Option<A> {
        if !args.trim_start().starts_with('{') {
            return None;
        }
        let mut de = serde_json::Deserializer::from_str(args);
        let decoded = A::deserialize(Checked {
            de: &mut de,
            members: self,
            node: self.root,
            depth: 0,
        })
        .ok()?;
        de.end().ok()?;
        Some(decoded)
    }

    /// Whether [`Members::decode_text`] passes `args` (any JSON inside the object).
    #[cfg(test)]
    pub(crate) fn text_is_clean(&self, args: &str) -> bool {
        self.decode_text::<de::IgnoredAny>(args).is_some()
    }

    /// Whether the check finds nothing in any value at `node` (or is past its depth).
    fn inert_at(&self, node: usize, depth: usize) -> bool {
        depth > MAX_DEPTH || self.inert.get(node).copied().unwrap_or(false)
    }

    /// [`Members::check`]'s course for an object or array (`bit`) at `node`.
    fn step(&self, mut node: usize, mut depth: usize, bit: u8) -> Step<'_> {
        loop {
            if depth > MAX_DEPTH {
                return Step::Skip;
            }
            let Some(rule) = self.rule(node) else {
                return Step::Skip;
            };
            let Some(alternatives) = &rule.alternatives else {
                return Step::Own(rule, depth);
            };
            let admits = |&&a: &&usize| self.rule(a).is_none_or(|r| r.types & bit != 0);
            let mut admitted = alternatives.iter().filter(admits);
            let only = match (admitted.next(), admitted.next()) {
                // None of its type: `check` finds nothing.
                (None, _) => return Step::Skip,
                (Some(&only), None) => only,
                // Several: `check` tries each in turn.
                (Some(_), Some(_)) => return Step::Undecided,
            };
            // One alternative: `check` walks it, then this schema's own members and items,
            // which must then say nothing for one pass to be enough.
            let own_silent = match bit {
                OBJECT => !rule.declares_any && rule.additional.is_none(),
                _ => rule.prefix_items.is_none() && rule.items.is_none(),
            };
            if !own_silent {
                return Step::Undecided;
            }
            node = only;
            depth += 1;
        }
    }
}

/// Forwards every `deserialize_*` method but `deserialize_ignored_any` through `$via!`,
/// which is given the wrapper, the visitor, and the call to make with the names it binds.
macro_rules! forward_deserialize {
    ($via:ident) => {
        forward_deserialize!(@each $via
            deserialize_any(); deserialize_bool(); deserialize_i8(); deserialize_i16();
            deserialize_i32(); deserialize_i64(); deserialize_i128(); deserialize_u8();
            deserialize_u16(); deserialize_u32(); deserialize_u64(); deserialize_u128();
            deserialize_f32(); deserialize_f64(); deserialize_char(); deserialize_str();
            deserialize_string(); deserialize_bytes(); deserialize_byte_buf();
            deserialize_option(); deserialize_unit(); deserialize_unit_struct(name: &'static str);
            deserialize_newtype_struct(name: &'static str); deserialize_seq();
            deserialize_tuple(len: usize); deserialize_tuple_struct(name: &'static str, len: usize);
            deserialize_map();
            deserialize_struct(name: &'static str, fields: &'static [&'static str]);
            deserialize_enum(name: &'static str, variants: &'static [&'static str]);
            deserialize_identifier();
        );
    };
    (@each $via:ident $($method:ident($($arg:ident: $ty:ty),*);)*) => {$(
        fn $method<V: Visitor<'de>>(self, $($arg: $ty,)* visitor: V) -> Result<V::Value, Self::Error> {
            $via!(self, visitor, de, v, de.$method($($arg,)* v))
        }
    )*};
}

/// Forwards the `visit_*` methods named to `self.inner`.
macro_rules! forward_visit {
    ($($method:ident($($arg:ident: $ty:ty),*);)*) => {$(
        fn $method<E: de::Error>(self, $($arg: $ty),*) -> Result<Self::Value, E> {
            self.inner.$method($($arg),*)
        }
    )*};
}

/// The scalar visits, which a check never looks into.
macro_rules! forward_scalar_visits {
    () => {
        forward_visit! {
            visit_bool(v: bool); visit_i8(v: i8); visit_i16(v: i16); visit_i32(v: i32);
            visit_i64(v: i64); visit_i128(v: i128); visit_u8(v: u8); visit_u16(v: u16);
            visit_u32(v: u32); visit_u64(v: u64); visit_u128(v: u128); visit_f32(v: f32);
            visit_f64(v: f64); visit_char(v: char); visit_bytes(v: &[u8]);
            visit_borrowed_bytes(v: &'de [u8]); visit_byte_buf(v: Vec<u8>); visit_none();
            visit_unit();
        }
    };
}

/// The text deserializer at one value, with the schema node it is checked against.
struct Checked<'m, D> {
    de: D,
    members: &'m Members,
    node: usize,
    depth: usize,
}

/// A value with nothing to check goes to the parser as asked; any other is watched.
macro_rules! checked_via {
    ($this:ident, $visitor:ident, $de:ident, $v:ident, $call:expr) => {{
        let Checked {
            de: $de,
            members,
            node,
            depth,
        } = $this;
        if members.inert_at(node, depth) {
            let $v = $visitor;
            $call
        } else {
            let $v = CheckedVisitor {
                inner: $visitor,
                members,
                node,
                depth,
            };
            $call
        }
    }};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Checked<'_, D> {
    type Error = D::Error;

    forward_deserialize!(checked_via);

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        if self.members.inert_at(self.node, self.depth) {
            return self.de.deserialize_ignored_any(visitor);
        }
        // Skipped by serde but not by the check (the tree walk looks into every member):
        // read through, so its members are checked too.
        let v = CheckedVisitor {
            inner: visitor,
            members: self.members,
            node: self.node,
            depth: self.depth,
        };
        self.de.deserialize_any(v)
    }

    fn is_human_readable(&self) -> bool {
        self.de.is_human_readable()
    }
}

/// A seed whose value is checked at `node`.
struct CheckedSeed<'m, S> {
    inner: S,
    members: &'m Members,
    node: usize,
    depth: usize,
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for CheckedSeed<'_, S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<S::Value, D::Error> {
        self.inner.deserialize(Checked {
            de,
            members: self.members,
            node: self.node,
            depth: self.depth,
        })
    }
}

/// The visitor of a value to check: objects and arrays are walked as [`Members::check`]
/// walks them; the rest passes through.
struct CheckedVisitor<'m, V> {
    inner: V,
    members: &'m Members,
    node: usize,
    depth: usize,
}

impl<'de, V: Visitor<'de>> Visitor<'de> for CheckedVisitor<'_, V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        self.inner.expecting(f)
    }

    forward_scalar_visits!();
    forward_visit! {
        visit_str(v: &str); visit_borrowed_str(v: &'de str); visit_string(v: String);
    }

    fn visit_some<D: Deserializer<'de>>(self, de: D) -> Result<V::Value, D::Error> {
        // `Option<T>` is its value's JSON: the same node (its `null` alternative aside).
        self.inner.visit_some(Checked {
            de,
            members: self.members,
            node: self.node,
            depth: self.depth,
        })
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, de: D) -> Result<V::Value, D::Error> {
        self.inner.visit_newtype_struct(Checked {
            de,
            members: self.members,
            node: self.node,
            depth: self.depth,
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        match self.members.step(self.node, self.depth, OBJECT) {
            Step::Own(rule, depth) if rule.declares_any || rule.additional.is_some() => {
                self.inner.visit_map(CheckedMap {
                    map,
                    members: self.members,
                    rule,
                    depth,
                    next: None,
                })
            }
            Step::Own(..) | Step::Skip => self.inner.visit_map(map),
            Step::Undecided => Err(de::Error::custom(UNDECIDED)),
        }
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        match self.members.step(self.node, self.depth, ARRAY) {
            Step::Own(rule, depth) if rule.prefix_items.is_some() || rule.items.is_some() => {
                self.inner.visit_seq(CheckedSeq {
                    seq,
                    members: self.members,
                    rule,
                    depth,
                    index: 0,
                })
            }
            Step::Own(..) | Step::Skip => self.inner.visit_seq(seq),
            Step::Undecided => Err(de::Error::custom(UNDECIDED)),
        }
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<V::Value, A::Error> {
        // An enum may come as a string or as an object (`{"variant": ...}`), which this
        // visit cannot tell apart: only where the check finds nothing in an object is the
        // answer the same either way.
        match self.members.step(self.node, self.depth, OBJECT) {
            Step::Skip => self.inner.visit_enum(data),
            Step::Own(..) | Step::Undecided => Err(de::Error::custom(UNDECIDED)),
        }
    }
}

/// An object's members, each name checked against `rule` as it is read.
struct CheckedMap<'m, A> {
    map: A,
    members: &'m Members,
    rule: &'m Rule,
    depth: usize,
    /// The schema of the value after the last name, when it is a declared member.
    next: Option<usize>,
}

/// What a member name is to its object's rule.
#[derive(Clone, Copy)]
enum Found {
    /// Not declared and not allowed (or not read as a name): stop.
    Refused,
    /// Declared, its value checked at this node.
    Declared(usize),
    /// Not declared, allowed by an open object: its value is not checked.
    Open,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for CheckedMap<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        let mut found = Found::Refused;
        let key = self.map.next_key_seed(NameSeed {
            inner: seed,
            rule: self.rule,
            found: &mut found,
        })?;
        if key.is_some() {
            self.next = match found {
                Found::Declared(node) => Some(node),
                Found::Open => None,
                Found::Refused => return Err(de::Error::custom(UNDECIDED)),
            };
        }
        Ok(key)
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, A::Error> {
        match self.next.take() {
            Some(node) => self.map.next_value_seed(CheckedSeed {
                inner: seed,
                members: self.members,
                node,
                depth: self.depth + 1,
            }),
            None => self.map.next_value_seed(seed),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        self.map.size_hint()
    }
}

/// An array's items, each checked at its `prefixItems` or `items` schema.
struct CheckedSeq<'m, A> {
    seq: A,
    members: &'m Members,
    rule: &'m Rule,
    depth: usize,
    index: usize,
}

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for CheckedSeq<'_, A> {
    type Error = A::Error;

    fn next_element_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<Option<S::Value>, A::Error> {
        let schema = self
            .rule
            .prefix_items
            .as_ref()
            .and_then(|p| p.get(self.index))
            .or(self.rule.items.as_ref());
        self.index += 1;
        match schema {
            Some(&node) => self.seq.next_element_seed(CheckedSeed {
                inner: seed,
                members: self.members,
                node,
                depth: self.depth + 1,
            }),
            None => self.seq.next_element_seed(seed),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        self.seq.size_hint()
    }
}

/// A member name's seed: records what the name is to the object's rule, however serde
/// reads it (a field identifier, a map key, a buffered `flatten` member).
struct NameSeed<'a, K> {
    inner: K,
    rule: &'a Rule,
    found: &'a mut Found,
}

impl<'de, K: DeserializeSeed<'de>> DeserializeSeed<'de> for NameSeed<'_, K> {
    type Value = K::Value;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<K::Value, D::Error> {
        self.inner.deserialize(NameDe {
            de,
            rule: self.rule,
            found: self.found,
        })
    }
}

/// The deserializer of one member name.
struct NameDe<'a, D> {
    de: D,
    rule: &'a Rule,
    found: &'a mut Found,
}

/// Every read of a name goes through [`NameVisitor`].
macro_rules! name_via {
    ($this:ident, $visitor:ident, $de:ident, $v:ident, $call:expr) => {{
        let NameDe {
            de: $de,
            rule,
            found,
        } = $this;
        let $v = NameVisitor {
            inner: $visitor,
            rule,
            found,
        };
        $call
    }};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for NameDe<'_, D> {
    type Error = D::Error;

    forward_deserialize!(name_via);

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        name_via!(self, visitor, de, v, de.deserialize_ignored_any(v))
    }

    fn is_human_readable(&self) -> bool {
        self.de.is_human_readable()
    }
}

/// Records a name read as a string; a name read any other way stays refused.
struct NameVisitor<'a, V> {
    inner: V,
    rule: &'a Rule,
    found: &'a mut Found,
}

/// What `name` is to `rule` (as in [`Members::check`]).
fn found(rule: &Rule, name: &str) -> Found {
    match rule.find(name).or(rule.additional) {
        Some(node) => Found::Declared(node),
        None if rule.open => Found::Open,
        None => Found::Refused,
    }
}

impl<'de, V: Visitor<'de>> Visitor<'de> for NameVisitor<'_, V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        self.inner.expecting(f)
    }

    forward_scalar_visits!();

    fn visit_str<E: de::Error>(self, name: &str) -> Result<V::Value, E> {
        *self.found = found(self.rule, name);
        self.inner.visit_str(name)
    }

    fn visit_borrowed_str<E: de::Error>(self, name: &'de str) -> Result<V::Value, E> {
        *self.found = found(self.rule, name);
        self.inner.visit_borrowed_str(name)
    }

    fn visit_string<E: de::Error>(self, name: String) -> Result<V::Value, E> {
        *self.found = found(self.rule, &name);
        self.inner.visit_string(name)
    }

    fn visit_some<D: Deserializer<'de>>(self, de: D) -> Result<V::Value, D::Error> {
        self.inner.visit_some(de)
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, de: D) -> Result<V::Value, D::Error> {
        self.inner.visit_newtype_struct(de)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.inner.visit_seq(seq)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.inner.visit_map(map)
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<V::Value, A::Error> {
        self.inner.visit_enum(data)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use schemars::JsonSchema;
    use serde::Deserialize;
    use serde_json::Value;

    use super::super::Members;

    #[derive(Debug, PartialEq, Deserialize, JsonSchema)]
    struct Cart {
        id: String,
        #[serde(default)]
        items: Vec<String>,
    }

    #[derive(Debug, PartialEq, Deserialize, JsonSchema)]
    #[serde(rename_all = "snake_case")]
    enum Shipping {
        Standard,
        Express { days: u8 },
    }

    #[derive(Debug, PartialEq, Deserialize, JsonSchema)]
    struct Extra {
        #[serde(flatten)]
        base: Cart,
        note: Option<String>,
    }

    #[derive(Debug, PartialEq, Deserialize, JsonSchema)]
    #[serde(untagged)]
    enum Either {
        A { a: u8 },
        B { b: u8 },
    }

    #[derive(Debug, PartialEq, Deserialize, JsonSchema)]
    struct Aliased {
        #[serde(alias = "identifier")]
        id: String,
    }

    /// What a tool's generated argument struct looks like, with the shapes serde reads
    /// in its own ways (aliases, `flatten`, untagged and externally tagged enums).
    #[derive(Debug, PartialEq, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct Args {
        cart: Cart,
        #[serde(default)]
        maybe: Option<Cart>,
        #[serde(default)]
        shipping: Option<Shipping>,
        #[serde(default)]
        extra: Option<Extra>,
        #[serde(default)]
        either: Option<Either>,
        #[serde(default)]
        aliased: Option<Aliased>,
        #[serde(default)]
        carts: BTreeMap<String, Cart>,
        #[serde(default)]
        any: Value,
    }

    /// The one-pass decode never lets through what the tree walk and a decode of the
    /// parsed `Value` refuse, and where it passes it decodes the same arguments; it takes
    /// the usual shapes in one pass and leaves the rest to the tree walk.
    #[test]
    fn the_one_pass_decode_agrees_with_the_tree_walk() {
        let members = Members::compile(&crate::__private::input_schema::<Args>());
        let cases: &[(&str, bool)] = &[
            // (text, decided in one pass)
            (r#"{"cart": {"id": "c", "items": ["a"]}}"#, true),
            (
                r#"{"cart": {"id": "c"}, "maybe": {"id": "m"}, "carts": {"x": {"id": "y"}}}"#,
                true,
            ),
            (
                r#"{"cart": {"id": "c"}, "maybe": null, "any": {"z": [1, {"q": 2}]}}"#,
                true,
            ),
            (
                r#"{"cart": {"id": "c"}, "extra": {"id": "e", "note": "n"}}"#,
                true,
            ),
            (r#"{"cart": {"id": "c"}, "aliased": {"id": "i"}}"#, true),
            (r#" {"c\u0061rt": {"\u0069d": "escaped names"}} "#, true),
            // A map's values are checked against its value schema (`additionalProperties`),
            // in the one pass as in the tree walk: an undeclared member in one is refused.
            (
                r#"{"cart": {"id": "c"}, "carts": {"x": {"id": "y", "z": 1}}}"#,
                false,
            ),
            // Undeclared members, at any depth and through every shape: refused.
            (r#"{"cart": {"id": "c", "gift": true}}"#, false),
            (
                r#"{"cart": {"id": "c"}, "maybe": {"id": "m", "x": 1}}"#,
                false,
            ),
            (
                r#"{"cart": {"id": "c"}, "extra": {"id": "e", "other": 1}}"#,
                false,
            ),
            (
                r#"{"cart": {"id": "c"}, "aliased": {"identifier": "i"}}"#,
                false,
            ),
            (r#"{"cart": {"id": "c"}, "nope": 1}"#, false),
            (
                r#"{"cart": {"id": "c", "gift": 1}, "cart": {"id": "c"}}"#,
                false,
            ),
            // Enums and untagged alternatives: left to the tree walk.
            (r#"{"cart": {"id": "c"}, "shipping": "standard"}"#, false),
            (
                r#"{"cart": {"id": "c"}, "shipping": {"express": {"days": 2}}}"#,
                false,
            ),
            (
                r#"{"cart": {"id": "c"}, "shipping": {"standard": null}}"#,
                false,
            ),
            (r#"{"cart": {"id": "c"}, "either": {"b": 1}}"#, false),
            (
                r#"{"cart": {"id": "c"}, "either": {"b": 1, "c": 2}}"#,
                false,
            ),
            // Not an object, not JSON, wrong types, more after the object.
            ("[]", false),
            ("null", false),
            ("", false),
            ("{", false),
            (r#"{"cart": {"id": 7}}"#, false),
            (r#"{"cart": {"id": "c"}} {}"#, false),
        ];
        for &(text, decided) in cases {
            let fast = members.decode_text::<Args>(text);
            assert_eq!(fast.is_some(), decided, "{text}");
            let Some(fast) = fast else { continue };
            let value: Value = serde_json::from_str(text).unwrap();
            assert_eq!(members.unknown_member(&value), None, "{text}");
            let slow: Args = serde_json::from_value(value).unwrap();
            assert_eq!(fast, slow, "{text}");
        }
        // The tree walk's own verdicts on what this pass left to it.
        let walk = |text: &str| members.unknown_member(&serde_json::from_str(text).unwrap());
        assert_eq!(
            walk(r#"{"cart": {"id": "c"}, "shipping": "standard"}"#),
            None
        );
        assert_eq!(walk(r#"{"cart": {"id": "c"}, "either": {"b": 1}}"#), None);
        let found = walk(r#"{"cart": {"id": "c"}, "carts": {"x": {"id": "y", "z": 1}}}"#).unwrap();
        assert_eq!(found.path, "carts.x.z");
        let found = walk(r#"{"cart": {"id": "c"}, "aliased": {"identifier": "i"}}"#).unwrap();
        assert_eq!(found.path, "aliased.identifier");
        let found = walk(r#"{"cart": {"id": "c"}, "shipping": {"standard": null}}"#).unwrap();
        assert_eq!(found.path, "shipping.standard");
    }
}
