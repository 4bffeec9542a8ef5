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
pub(crate) fn unknown_member(schema: &Value, args: &Value) -> Option<UnknownMember> {
    let walk = Walk { root: schema };
    walk.check(schema, args, "", 0)
}

/// Deeper than this, a schema is not followed (a recursive type): nothing is refused there.
const MAX_DEPTH: usize = 64;

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
            let Some(pointer) = reference.strip_prefix('#') else {
                return &Value::Bool(true);
            };
            match self.root.pointer(pointer) {
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
        path: &str,
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
        path: &str,
        depth: usize,
    ) -> Option<UnknownMember> {
        match value {
            Value::Object(members) => {
                let mut declared: Vec<(&'a str, &'a Value)> = Vec::new();
                let mut open = false;
                self.collect(schema, &mut declared, &mut open, depth);
                if declared.is_empty() {
                    return None; // nothing declared: a map or any JSON value
                }
                for (name, member) in members {
                    let inner = join(path, name);
                    match declared.iter().find(|(n, _)| *n == name) {
                        Some((_, member_schema)) => {
                            if let Some(found) =
                                self.check(member_schema, member, &inner, depth + 1)
                            {
                                return Some(found);
                            }
                        }
                        None if open => {}
                        None => {
                            return Some(UnknownMember {
                                path: inner,
                                expected: declared.iter().map(|(n, _)| (*n).to_owned()).collect(),
                            })
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
                        let inner = join(path, &i.to_string());
                        if let Some(found) = self.check(item_schema, item, &inner, depth + 1) {
                            return Some(found);
                        }
                    }
                }
                None
            }
            _ => None,
        }
    }

    /// Declared properties of `schema` and of its `allOf` parts; `open` when any of them
    /// allows members it does not list.
    fn collect(
        &self,
        schema: &'a Map<String, Value>,
        declared: &mut Vec<(&'a str, &'a Value)>,
        open: &mut bool,
        depth: usize,
    ) {
        if depth > MAX_DEPTH {
            *open = true;
            return;
        }
        if let Some(Value::Object(properties)) = schema.get("properties") {
            declared.extend(properties.iter().map(|(n, s)| (n.as_str(), s)));
        }
        match schema.get("additionalProperties") {
            None | Some(Value::Bool(false)) => {}
            Some(_) => *open = true,
        }
        if schema.contains_key("patternProperties") {
            *open = true;
        }
        if let Some(Value::Array(parts)) = schema.get("allOf") {
            for part in parts {
                match self.resolve(part) {
                    Value::Object(part) => self.collect(part, declared, open, depth + 1),
                    _ => *open = true,
                }
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
