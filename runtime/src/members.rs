//! One rule for unknown members at every level of a tool's JSON arguments: a member the
//! tool's input schema does not declare is refused, naming its path.
//!
//! The generated argument struct denies unknown top-level fields, but the user's own
//! nested types (`Cart`) usually do not, so serde would silently drop `cart.gift`: the
//! caller believes it sent something the tool never saw. The input schema (schemars, from
//! the same serde attributes) says which members each object declares; this walk checks
//! the JSON against it before decoding. An object whose schema declares no properties, or
//! allows others (`additionalProperties` other than `false`: maps, `serde_json::Value`),
//! accepts any member. Alternatives (`anyOf`/`oneOf`, e.g. `Option<T>` and enums) accept
//! a value when one of them does; `allOf` parts (e.g. `#[serde(flatten)]`) are merged.
//!
//! Hand-written rather than a JSON Schema validator crate: only this one rule is wanted
//! (types, formats and ranges are serde's job, with its own precise messages), and a full
//! validator would reject what serde accepts (e.g. integer formats) or the reverse.

use serde_json::{Map, Value};

/// An undeclared member: where it is and what the object declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UnknownMember {
    /// Dotted path of the member, e.g. `cart.gift`.
    pub(crate) path: String,
    /// The members the object declares, in schema order.
    pub(crate) expected: Vec<String>,
}

/// The first member of `args` that `schema` (a tool's input schema) does not declare.
///
/// Runs on every registry call, so the walk allocates nothing unless it finds one: paths
/// are a chain of borrowed segments rendered only for the answer, `$ref`s are followed
/// without copying their pointer, and an object's declared members are looked up in place.
pub(crate) fn unknown_member(schema: &Value, args: &Value) -> Option<UnknownMember> {
    let walk = Walk { root: schema };
    walk.check(schema, args, Path::Root, 0)
}

/// Deeper than this, a schema is not followed (a recursive type): nothing is refused there.
const MAX_DEPTH: usize = 64;

/// Where the walk is, as borrowed segments; [`Path::render`] gives the dotted path.
#[derive(Clone, Copy)]
enum Path<'p> {
    /// The arguments object itself.
    Root,
    /// A member of the object at the parent path.
    Member(&'p Path<'p>, &'p str),
    /// An item of the array at the parent path.
    Item(&'p Path<'p>, usize),
}

impl Path<'_> {
    /// The dotted path (`cart.items.1`), as [`join`] builds it segment by segment.
    fn render(&self) -> String {
        match self {
            Path::Root => String::new(),
            Path::Member(parent, name) => join(&parent.render(), name),
            Path::Item(parent, i) => join(&parent.render(), &i.to_string()),
        }
    }
}

/// [`Value::pointer`] (RFC 6901) without its copy of every reference token: a token is
/// unescaped (`~1`, `~0`) into a new string only when it holds a `~`.
fn pointer<'v>(root: &'v Value, pointer: &str) -> Option<&'v Value> {
    if pointer.is_empty() {
        return Some(root);
    }
    let rest = pointer.strip_prefix('/')?;
    rest.split('/').try_fold(root, |target, token| {
        let token: std::borrow::Cow<'_, str> = if token.contains('~') {
            token.replace("~1", "/").replace("~0", "~").into()
        } else {
            token.into()
        };
        match target {
            Value::Object(map) => map.get(token.as_ref()),
            Value::Array(list) => array_index(&token).and_then(|i| list.get(i)),
            _ => None,
        }
    })
}

/// An array index token as RFC 6901 (and `serde_json`) reads it: decimal, no sign, no
/// leading zero.
fn array_index(token: &str) -> Option<usize> {
    if token.starts_with('+') || (token.starts_with('0') && token.len() != 1) {
        return None;
    }
    token.parse().ok()
}

struct Walk<'a> {
    root: &'a Value,
}

impl<'a> Walk<'a> {
    /// `schema` with a local `$ref` (`#/$defs/Cart`) followed.
    fn resolve(&self, schema: &'a Value) -> &'a Value {
        let mut schema = schema;
        for _ in 0..MAX_DEPTH {
            let Some(reference) = schema.get("$ref").and_then(Value::as_str) else {
                return schema;
            };
            let Some(target) = reference.strip_prefix('#') else {
                return &Value::Bool(true);
            };
            match pointer(self.root, target) {
                Some(target) => schema = target,
                None => return &Value::Bool(true),
            }
        }
        &Value::Bool(true)
    }

    fn check(
        &self,
        schema: &'a Value,
        value: &Value,
        path: Path<'_>,
        depth: usize,
    ) -> Option<UnknownMember> {
        if depth > MAX_DEPTH {
            return None;
        }
        let schema = self.resolve(schema);
        let Value::Object(schema) = schema else {
            return None; // `true`/`false` schemas: nothing to say about members
        };
        for keyword in ["anyOf", "oneOf"] {
            if let Some(Value::Array(alternatives)) = schema.get(keyword) {
                let mut first = None;
                // Only alternatives of the value's JSON type count (`null` accepts no object).
                for alternative in alternatives
                    .iter()
                    .filter(|a| admits_type(self.resolve(a), value))
                {
                    match self.check(alternative, value, path, depth + 1) {
                        None => return self.check_own(schema, value, path, depth),
                        Some(found) => {
                            first.get_or_insert(found);
                        }
                    }
                }
                return first;
            }
        }
        self.check_own(schema, value, path, depth)
    }

    /// The members and items `schema` itself (with its `allOf` parts) declares.
    fn check_own(
        &self,
        schema: &'a Map<String, Value>,
        value: &Value,
        path: Path<'_>,
        depth: usize,
    ) -> Option<UnknownMember> {
        match value {
            Value::Object(members) => {
                if !self.declares_any(schema, depth) {
                    return None; // nothing declared: a map or any JSON value
                }
                let open = self.is_open(schema, depth);
                for (name, member) in members {
                    let inner = Path::Member(&path, name);
                    match self.declared(schema, name, depth) {
                        Some(member_schema) => {
                            if let Some(found) = self.check(member_schema, member, inner, depth + 1)
                            {
                                return Some(found);
                            }
                        }
                        None if open => {}
                        None => {
                            let mut declared = Vec::new();
                            self.collect(schema, &mut declared, depth);
                            return Some(UnknownMember {
                                path: inner.render(),
                                expected: declared.into_iter().map(str::to_owned).collect(),
                            });
                        }
                    }
                }
                None
            }
            Value::Array(items) => {
                let prefix = schema.get("prefixItems").and_then(Value::as_array);
                for (i, item) in items.iter().enumerate() {
                    let item_schema = prefix
                        .and_then(|p| p.get(i))
                        .or_else(|| schema.get("items").filter(|s| s.is_object()));
                    if let Some(item_schema) = item_schema {
                        let inner = Path::Item(&path, i);
                        if let Some(found) = self.check(item_schema, item, inner, depth + 1) {
                            return Some(found);
                        }
                    }
                }
                None
            }
            _ => None,
        }
    }

    /// The `allOf` parts of `schema` (e.g. `#[serde(flatten)]`), unresolved.
    fn parts(schema: &'a Map<String, Value>) -> &'a [Value] {
        match schema.get("allOf") {
            Some(Value::Array(parts)) => parts,
            _ => &[],
        }
    }

    /// Whether `schema` or one of its `allOf` parts declares a property.
    fn declares_any(&self, schema: &'a Map<String, Value>, depth: usize) -> bool {
        if depth > MAX_DEPTH {
            return false;
        }
        if matches!(schema.get("properties"), Some(Value::Object(p)) if !p.is_empty()) {
            return true;
        }
        Self::parts(schema)
            .iter()
            .any(|part| match self.resolve(part) {
                Value::Object(part) => self.declares_any(part, depth + 1),
                _ => false,
            })
    }

    /// The schema of the declared member `name`: from `schema`'s own properties first,
    /// then from its `allOf` parts in order (the first declaration wins).
    fn declared(
        &self,
        schema: &'a Map<String, Value>,
        name: &str,
        depth: usize,
    ) -> Option<&'a Value> {
        if depth > MAX_DEPTH {
            return None;
        }
        if let Some(Value::Object(properties)) = schema.get("properties") {
            if let Some(member) = properties.get(name) {
                return Some(member);
            }
        }
        Self::parts(schema)
            .iter()
            .find_map(|part| match self.resolve(part) {
                Value::Object(part) => self.declared(part, name, depth + 1),
                _ => None,
            })
    }

    /// Whether `schema` or one of its `allOf` parts allows members it does not list (or
    /// is too deep to follow).
    fn is_open(&self, schema: &'a Map<String, Value>, depth: usize) -> bool {
        if depth > MAX_DEPTH {
            return true;
        }
        match schema.get("additionalProperties") {
            None | Some(Value::Bool(false)) => {}
            Some(_) => return true,
        }
        if schema.contains_key("patternProperties") {
            return true;
        }
        // A part that is not an object schema allows any member.
        Self::parts(schema)
            .iter()
            .any(|part| match self.resolve(part) {
                Value::Object(part) => self.is_open(part, depth + 1),
                _ => true,
            })
    }

    /// Declared property names of `schema` and of its `allOf` parts, in schema order
    /// (what an error lists as expected).
    fn collect(&self, schema: &'a Map<String, Value>, declared: &mut Vec<&'a str>, depth: usize) {
        if depth > MAX_DEPTH {
            return;
        }
        if let Some(Value::Object(properties)) = schema.get("properties") {
            declared.extend(properties.keys().map(String::as_str));
        }
        for part in Self::parts(schema) {
            if let Value::Object(part) = self.resolve(part) {
                self.collect(part, declared, depth + 1);
            }
        }
    }
}

/// Whether `schema`'s `type` (if it has one) admits `value`'s JSON type.
fn admits_type(schema: &Value, value: &Value) -> bool {
    let name = match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    let admits = |t: &Value| {
        t.as_str()
            .is_some_and(|t| t == name || (t == "number" && name == "integer"))
    };
    match schema.get("type") {
        None => true,
        Some(Value::Array(types)) => types.iter().any(admits),
        Some(t) => admits(t),
    }
}

/// `path.name`, or `name` at the top: the dotted argument path every message names (JSON
/// members here, form fields in `http::forms`).
pub(crate) fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_owned()
    } else {
        format!("{path}.{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "cart": {"$ref": "#/$defs/Cart"},
                "maybe": {"anyOf": [{"$ref": "#/$defs/Cart"}, {"type": "null"}]},
                "tags": {"type": "object", "additionalProperties": {"type": "string"}},
                "any": true,
                "carts": {"type": "array", "items": {"$ref": "#/$defs/Cart"}},
                "flat": {"allOf": [{"$ref": "#/$defs/Cart"}, {"properties": {"extra": {}}}]}
            },
            "additionalProperties": false,
            "$defs": {
                "Cart": {"type": "object", "properties": {"id": {"type": "string"}, "items": {"type": "array", "items": {"type": "string"}}}}
            }
        })
    }

    #[test]
    fn an_undeclared_member_is_named_at_any_depth() {
        let s = schema();
        assert_eq!(
            unknown_member(&s, &json!({"cart": {"id": "c", "items": []}})),
            None
        );
        let found = unknown_member(&s, &json!({"cart": {"id": "c", "gift": true}})).unwrap();
        assert_eq!(found.path, "cart.gift");
        assert_eq!(found.expected, ["id", "items"]);
        assert_eq!(
            unknown_member(&s, &json!({"carts": [{"id": "a"}, {"id": "b", "x": 1}]}))
                .unwrap()
                .path,
            "carts.1.x"
        );
        assert_eq!(unknown_member(&s, &json!({"maybe": null})), None);
        assert_eq!(
            unknown_member(&s, &json!({"maybe": {"id": "c", "y": 1}}))
                .unwrap()
                .path,
            "maybe.y"
        );
        assert_eq!(
            unknown_member(&s, &json!({"nope": 1})).unwrap().path,
            "nope"
        );
    }

    /// The walk's own `$ref` pointer reads what `serde_json`'s `Value::pointer` reads, escapes
    /// and array indices included.
    #[test]
    fn refs_are_followed_as_json_pointers() {
        let doc = json!({
            "$defs": {"a/b": {"x": 1}, "m~n": [10, 20], "": {"e": true}},
            "list": [{"k": "v"}]
        });
        for p in [
            "",
            "/",
            "/$defs",
            "/$defs/a~1b",
            "/$defs/a~1b/x",
            "/$defs/m~0n/1",
            "/$defs/m~0n/01",
            "/$defs/m~0n/+1",
            "/$defs/m~0n/2",
            "/$defs//e",
            "/list/0/k",
            "/list/-",
            "nope",
            "/$defs/a/b",
            "/$defs/~01",
        ] {
            assert_eq!(pointer(&doc, p), doc.pointer(p), "{p:?}");
        }
        // Through a schema: a definition whose name needs escaping.
        let schema = json!({
            "type": "object",
            "properties": {"c": {"$ref": "#/$defs/C~1v2"}},
            "$defs": {"C/v2": {"type": "object", "properties": {"id": {}}}}
        });
        assert_eq!(unknown_member(&schema, &json!({"c": {"id": 1}})), None);
        let found = unknown_member(&schema, &json!({"c": {"id": 1, "x": 2}})).unwrap();
        assert_eq!(found.path, "c.x");
        assert_eq!(found.expected, ["id"]);
    }

    /// An error lists the object's own members, then its `allOf` parts' in order; the
    /// first declaration of a name is the one followed.
    #[test]
    fn expected_members_come_in_schema_order() {
        let schema = json!({
            "type": "object",
            "properties": {"z": {}, "a": {}},
            "allOf": [
                {"properties": {"m": {"type": "object", "properties": {"q": {}}}}},
                {"properties": {"m": {}, "b": {}}}
            ]
        });
        let found = unknown_member(&schema, &json!({"a": 1, "nope": 2})).unwrap();
        assert_eq!(found.expected, ["a", "z", "m", "b", "m"]);
        let nested = unknown_member(&schema, &json!({"m": {"r": 1}})).unwrap();
        assert_eq!(nested.path, "m.r");
        assert_eq!(nested.expected, ["q"]);
    }

    #[test]
    fn maps_any_values_and_flattened_parts_accept_what_they_declare() {
        let s = schema();
        assert_eq!(
            unknown_member(&s, &json!({"tags": {"a": "b"}, "any": {"z": 1}})),
            None
        );
        assert_eq!(
            unknown_member(&s, &json!({"flat": {"id": "c", "extra": 1}})),
            None
        );
        assert_eq!(
            unknown_member(&s, &json!({"flat": {"id": "c", "other": 1}}))
                .unwrap()
                .path,
            "flat.other"
        );
    }
}
