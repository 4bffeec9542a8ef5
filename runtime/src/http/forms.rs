//! HTML form bodies (`application/x-www-form-urlencoded`) as a tool's JSON arguments.
//!
//! A form sends flat `name=value` pairs of text; a tool takes typed, nested JSON. The
//! mapping (docs/http.md, "Forms"):
//!
//! - a name is a dotted path into the arguments: `user_id`, `cart.id`,
//!   `cart.items.0.sku` (a segment of digits indexes an array; indices run from `0` without
//!   gaps);
//! - each value is converted by the tool's input schema at that path: `integer` and
//!   `number` parsed (surrounding spaces ignored), `boolean` from `true`/`on`/`1` or
//!   `false`/`off`/`0`, `string` kept as sent; an empty value is `null` where the schema
//!   admits `null` (an `Option`), so an empty optional box means "none";
//! - a name sent several times makes an array where the schema has one (`tag=a&tag=b`);
//!   for a boolean the last value wins (the hidden `false` before a checkbox); anything
//!   else sent twice is refused;
//! - a name the schema does not know is passed on as text, and the call refuses it with
//!   the same error a JSON call gets (`members.rs`).
//!
//! A value that does not convert is [`Error::InvalidArguments`] naming its field.
//!
//! Hand-written over the schema rather than `serde_urlencoded` into the tool's type: the
//! registry calls tools with JSON only (the argument types are not known here), and
//! `serde_urlencoded` has no nesting; form conventions with nesting (`serde_qs`) use
//! brackets and guess types from the text, where the schema says what each field is.

use std::collections::BTreeMap;

use serde_json::{Map, Number, Value};

use crate::error::Error;
use crate::members::join;

/// How deep `$ref`, `allOf` and `anyOf` are followed at one path before giving up (a
/// schema whose references loop).
const MAX_DEPTH: usize = 32;

/// The JSON arguments a form body makes for `tool`, whose input schema is `schema`.
pub(super) fn form_to_args(tool: &str, schema: &Value, body: &[u8]) -> Result<Value, Error> {
    let invalid = |field: Option<&str>, message: String| Error::InvalidArguments {
        tool: tool.to_owned(),
        field: field.map(str::to_owned),
        message,
    };
    let mut root = Node::Branch(BTreeMap::new());
    for (name, value) in form_urlencoded::parse(body) {
        if name.is_empty() {
            return Err(invalid(
                None,
                "the form has a field without a name; nothing ran. Name every field after its argument (`cart.id`)".to_owned(),
            ));
        }
        let segments: Vec<&str> = name.split('.').collect();
        if segments.iter().any(|s| s.is_empty()) {
            return Err(invalid(
                Some(&name),
                format!("the form field name `{name}` has an empty segment; nothing ran. Separate the members of a nested argument with single dots (`cart.id`)"),
            ));
        }
        root.insert(&segments, value.into_owned())
            .map_err(|at| invalid(Some(&at), format!("the form gives `{at}` both a value and members (or items); nothing ran. Send either `{at}` or names under it (`{at}.…`), not both")))?;
    }
    let walk = Walk { root: schema };
    walk.convert(root, &[schema], "")
        .map_err(|(field, message)| invalid(Some(&field), format!("{message}; nothing ran")))
}

/// The pairs of a form as a tree of their dotted names.
enum Node {
    /// Values sent under one name, in order.
    Leaf(Vec<String>),
    /// Members (or items, by index) under a name.
    Branch(BTreeMap<String, Node>),
}

impl Node {
    /// Adds `value` at `segments`; `Err(path)` where a leaf and a branch meet.
    fn insert(&mut self, segments: &[&str], value: String) -> Result<(), String> {
        let mut node = self;
        for (i, segment) in segments.iter().enumerate() {
            let Node::Branch(children) = node else {
                return Err(segments[..i].join("."));
            };
            let last = i + 1 == segments.len();
            let child = children.entry((*segment).to_owned()).or_insert_with(|| {
                if last {
                    Node::Leaf(Vec::new())
                } else {
                    Node::Branch(BTreeMap::new())
                }
            });
            if last {
                return match child {
                    Node::Leaf(values) => {
                        values.push(value);
                        Ok(())
                    }
                    Node::Branch(_) => Err(segments.join(".")),
                };
            }
            node = child;
        }
        Ok(())
    }
}

/// What a field's schema (with its `$ref`s, `allOf` parts and `anyOf`/`oneOf`
/// alternatives followed) allows.
#[derive(Default)]
struct Shape<'a> {
    /// JSON types named by `type` anywhere (empty: unconstrained).
    types: Vec<&'a str>,
    /// Whether some part says nothing about the type (`true`, `{}`, `enum` only): any value.
    open: bool,
    /// Schemas of members, by name.
    properties: Vec<(&'a str, &'a Value)>,
    /// Schemas of other members (`additionalProperties`: a map).
    additional: Vec<&'a Value>,
    /// Schemas of array items.
    items: Vec<&'a Value>,
    /// Schemas of tuple positions.
    prefix: Vec<&'a [Value]>,
}

impl Shape<'_> {
    fn admits(&self, ty: &str) -> bool {
        self.types
            .iter()
            .any(|t| *t == ty || (ty == "integer" && *t == "number"))
    }

    fn is_array(&self) -> bool {
        self.admits("array")
    }
}

struct Walk<'a> {
    root: &'a Value,
}

impl<'a> Walk<'a> {
    /// The shape of the union of `schemas`.
    fn shape(&self, schemas: &[&'a Value]) -> Shape<'a> {
        let mut shape = Shape::default();
        for schema in schemas {
            self.collect(schema, &mut shape, 0);
        }
        shape
    }

    fn collect(&self, schema: &'a Value, shape: &mut Shape<'a>, depth: usize) {
        if depth > MAX_DEPTH {
            shape.open = true;
            return;
        }
        let Value::Object(obj) = schema else {
            // `true` admits anything; `false` nothing (the call will say so).
            shape.open |= schema.as_bool() == Some(true);
            return;
        };
        match obj.get("type") {
            Some(Value::String(t)) => shape.types.push(t),
            Some(Value::Array(ts)) => shape.types.extend(ts.iter().filter_map(Value::as_str)),
            _ => {
                let composite = ["$ref", "allOf", "anyOf", "oneOf"]
                    .iter()
                    .any(|k| obj.contains_key(*k));
                if !composite {
                    shape.open = true;
                }
            }
        }
        if let Some(Value::Object(properties)) = obj.get("properties") {
            shape
                .properties
                .extend(properties.iter().map(|(n, s)| (n.as_str(), s)));
        }
        if let Some(additional @ Value::Object(_)) = obj.get("additionalProperties") {
            shape.additional.push(additional);
        }
        if let Some(items) = obj.get("items").filter(|i| i.is_object()) {
            shape.items.push(items);
        }
        if let Some(Value::Array(prefix)) = obj.get("prefixItems") {
            shape.prefix.push(prefix);
        }
        if let Some(reference) = obj.get("$ref").and_then(Value::as_str) {
            match reference
                .strip_prefix('#')
                .and_then(|pointer| self.root.pointer(pointer))
            {
                Some(target) => self.collect(target, shape, depth + 1),
                None => shape.open = true,
            }
        }
        for keyword in ["allOf", "anyOf", "oneOf"] {
            if let Some(Value::Array(parts)) = obj.get(keyword) {
                for part in parts {
                    self.collect(part, shape, depth + 1);
                }
            }
        }
    }

    /// The JSON of `node`, a field whose schema is the union of `schemas` (none: a field
    /// the schema does not know, passed on as text for the call to refuse).
    fn convert(
        &self,
        node: Node,
        schemas: &[&'a Value],
        path: &str,
    ) -> Result<Value, (String, String)> {
        let shape = self.shape(schemas);
        match node {
            Node::Leaf(values) => self.leaf(values, &shape, path),
            Node::Branch(children) if shape.is_array() && !shape.admits("object") => {
                let mut items = Vec::with_capacity(children.len());
                // BTreeMap order is text order ("10" < "2"): index them first.
                let mut indexed = BTreeMap::new();
                for (segment, child) in children {
                    let at = join(path, &segment);
                    let index = segment
                        .parse::<usize>()
                        .ok()
                        .filter(|i| i.to_string() == segment)
                        .ok_or_else(|| {
                            (
                                at.clone(),
                                format!("`{path}` is a list: name its items `{path}.0`, `{path}.1`, …, not `{at}`"),
                            )
                        })?;
                    indexed.insert(index, child);
                }
                for (expected, (index, child)) in indexed.into_iter().enumerate() {
                    if index != expected {
                        return Err((
                            join(path, &expected.to_string()),
                            format!("the items of `{path}` must be numbered from 0 without gaps, and `{}` is missing", join(path, &expected.to_string())),
                        ));
                    }
                    let item = self.item_schemas(&shape, index);
                    items.push(self.convert(child, &item, &join(path, &index.to_string()))?);
                }
                Ok(Value::Array(items))
            }
            Node::Branch(children) => {
                let mut members = Map::new();
                for (segment, child) in children {
                    let member: Vec<&Value> = shape
                        .properties
                        .iter()
                        .filter(|(n, _)| *n == segment)
                        .map(|(_, s)| *s)
                        .collect();
                    let member = if member.is_empty() {
                        shape.additional.clone()
                    } else {
                        member
                    };
                    let value = self.convert(child, &member, &join(path, &segment))?;
                    members.insert(segment, value);
                }
                Ok(Value::Object(members))
            }
        }
    }

    fn item_schemas(&self, shape: &Shape<'a>, index: usize) -> Vec<&'a Value> {
        let mut item: Vec<&Value> = shape.prefix.iter().filter_map(|p| p.get(index)).collect();
        item.extend(shape.items.iter().copied());
        item
    }

    /// The values sent under one name.
    fn leaf(
        &self,
        values: Vec<String>,
        shape: &Shape<'a>,
        path: &str,
    ) -> Result<Value, (String, String)> {
        if shape.is_array() && !shape.admits("string") {
            // `tag=a&tag=b` (or a single `tag=a`): the items, in order.
            let mut items = Vec::with_capacity(values.len());
            for (index, value) in values.into_iter().enumerate() {
                let item = self.shape(&self.item_schemas(shape, index));
                items.push(scalar(value, &item, path)?);
            }
            return Ok(Value::Array(items));
        }
        let count = values.len();
        let Some(last) = values.into_iter().last() else {
            return Ok(Value::Null);
        };
        let boolean =
            shape.admits("boolean") && shape.types.iter().all(|t| matches!(*t, "boolean" | "null"));
        if count > 1 && !boolean {
            return Err((
                path.to_owned(),
                format!("`{path}` is sent {count} times but takes one value"),
            ));
        }
        scalar(last, shape, path)
    }
}

/// One form value as the JSON its schema asks for.
fn scalar(text: String, shape: &Shape<'_>, path: &str) -> Result<Value, (String, String)> {
    if shape.types.is_empty() {
        // No type to convert to (a field the schema does not know, `serde_json::Value`, an
        // enum of names): the text as sent.
        return Ok(Value::String(text));
    }
    if text.is_empty() && shape.admits("null") {
        return Ok(Value::Null);
    }
    let trimmed = text.trim();
    if shape.admits("boolean") {
        match trimmed.to_ascii_lowercase().as_str() {
            "true" | "on" | "1" => return Ok(Value::Bool(true)),
            "false" | "off" | "0" => return Ok(Value::Bool(false)),
            _ => {}
        }
    }
    if shape.admits("integer") {
        if let Ok(n) = trimmed.parse::<u64>() {
            return Ok(Value::Number(n.into()));
        }
        if let Ok(n) = trimmed.parse::<i64>() {
            return Ok(Value::Number(n.into()));
        }
    }
    if shape.types.contains(&"number") {
        // `Number::from_f64` refuses what JSON cannot hold (`NaN`, `inf`).
        if let Some(n) = trimmed.parse::<f64>().ok().and_then(Number::from_f64) {
            return Ok(Value::Number(n));
        }
    }
    if shape.admits("string") || shape.open {
        return Ok(Value::String(text));
    }
    let expected = expected(shape);
    let shown = if text.is_empty() {
        "an empty value".to_owned()
    } else {
        format!("{text:?}")
    };
    Err((
        path.to_owned(),
        format!("`{path}` must be {expected}, not {shown}"),
    ))
}

/// What a field takes, in words: "an integer or null".
fn expected(shape: &Shape<'_>) -> String {
    let mut words: Vec<&str> = Vec::new();
    for ty in &shape.types {
        let word = match *ty {
            "integer" => "an integer",
            "number" => "a number",
            "boolean" => "a boolean (true/false, on/off, 1/0)",
            "null" => "empty",
            "object" => "an object (send its members as `name.member`)",
            "array" => "a list (send its items as `name.0`, `name.1`, …)",
            _ => "text",
        };
        if !words.contains(&word) {
            words.push(word);
        }
    }
    words.join(" or ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What schemars 1 writes for `(user_id: u64, cart: Cart, note: String, gift:
    /// Option<u32>, express: bool, tags: Vec<String>, weights: Vec<f64>, meta:
    /// HashMap<String, u8>)`.
    fn schema() -> Value {
        json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {
                "user_id": {"type": "integer", "format": "uint64", "minimum": 0},
                "cart": {"$ref": "#/$defs/Cart"},
                "note": {"type": "string"},
                "gift": {"type": ["integer", "null"], "format": "uint32"},
                "express": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "weights": {"type": "array", "items": {"type": "number"}},
                "meta": {"type": "object", "additionalProperties": {"type": "integer"}},
                "parent": {"anyOf": [{"$ref": "#/$defs/Cart"}, {"type": "null"}]},
                "any": true
            },
            "required": ["user_id", "cart", "note"],
            "$defs": {
                "Cart": {"type": "object", "properties": {
                    "id": {"type": "string"},
                    "items": {"type": "array", "items": {"$ref": "#/$defs/Item"}}
                }},
                "Item": {"type": "object", "properties": {
                    "sku": {"type": "string"},
                    "qty": {"type": "integer", "format": "uint32"}
                }}
            }
        })
    }

    fn args(body: &str) -> Result<Value, Error> {
        form_to_args("t", &schema(), body.as_bytes())
    }

    fn field(body: &str) -> (Option<String>, String) {
        match args(body).unwrap_err() {
            Error::InvalidArguments { field, message, .. } => (field, message),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn dotted_names_nest_and_values_take_their_schema_types() {
        let got = args(
            "user_id=7&cart.id=c%201&cart.items.0.sku=tea&cart.items.0.qty=+2+&cart.items.1.sku=cup&cart.items.1.qty=1&note=ring+twice&gift=&express=on&tags=a&tags=b&weights.0=1.5&weights.1=-2&meta.x=3&parent.id=p&any=12",
        )
        .unwrap();
        assert_eq!(
            got,
            json!({
                "user_id": 7,
                "cart": {"id": "c 1", "items": [{"sku": "tea", "qty": 2}, {"sku": "cup", "qty": 1}]},
                "note": "ring twice",
                "gift": null,
                "express": true,
                "tags": ["a", "b"],
                "weights": [1.5, -2],
                "meta": {"x": 3},
                "parent": {"id": "p"},
                "any": "12"
            })
        );
    }

    #[test]
    fn strings_keep_what_was_sent_and_numbers_stay_exact() {
        let got = args("note=+007+&user_id=18446744073709551615&cart.id=0").unwrap();
        assert_eq!(got["note"], " 007 ");
        assert_eq!(got["user_id"], json!(u64::MAX));
        assert_eq!(got["cart"]["id"], "0");
        assert_eq!(args("gift=5").unwrap()["gift"], 5);
    }

    #[test]
    fn a_value_that_does_not_convert_names_its_field() {
        let (at, message) = field("user_id=seven");
        assert_eq!(at.as_deref(), Some("user_id"));
        assert!(
            message.contains("`user_id` must be an integer, not \"seven\""),
            "{message}"
        );
        let (at, message) = field("cart.items.0.qty=2.5");
        assert_eq!(at.as_deref(), Some("cart.items.0.qty"));
        assert!(message.contains("must be an integer"), "{message}");
        let (at, _) = field("user_id=");
        assert_eq!(at.as_deref(), Some("user_id"));
        let (at, message) = field("express=maybe");
        assert_eq!(at.as_deref(), Some("express"));
        assert!(message.contains("true/false"), "{message}");
        let (at, _) = field("weights.0=NaN");
        assert_eq!(at.as_deref(), Some("weights.0"));
        let (at, _) = field("meta.x=big");
        assert_eq!(at.as_deref(), Some("meta.x"));
    }

    #[test]
    fn list_items_are_numbered_from_zero_without_gaps() {
        let (at, message) = field("cart.items.1.sku=a");
        assert_eq!(at.as_deref(), Some("cart.items.0"));
        assert!(message.contains("without gaps"), "{message}");
        let (at, _) = field("cart.items.01.sku=a");
        assert_eq!(at.as_deref(), Some("cart.items.01"));
        let (at, _) = field("cart.items.first.sku=a");
        assert_eq!(at.as_deref(), Some("cart.items.first"));
        // Ten items and more sort by number, not text.
        let body: String = (0..12)
            .map(|i| format!("cart.items.{i}.qty={i}&"))
            .collect();
        let got = args(&body).unwrap();
        let qty: Vec<u64> = got["cart"]["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["qty"].as_u64().unwrap())
            .collect();
        assert_eq!(qty, (0..12).collect::<Vec<u64>>());
    }

    #[test]
    fn repeated_names_are_lists_last_boolean_wins_or_refused() {
        assert_eq!(args("express=false&express=on").unwrap()["express"], true);
        assert_eq!(args("express=false").unwrap()["express"], false);
        let (at, message) = field("note=a&note=b");
        assert_eq!(at.as_deref(), Some("note"));
        assert!(message.contains("sent 2 times"), "{message}");
        assert_eq!(args("tags=only").unwrap()["tags"], json!(["only"]));
    }

    #[test]
    fn malformed_names_and_shapes_are_refused() {
        let (at, _) = field("cart..id=x");
        assert_eq!(at.as_deref(), Some("cart..id"));
        let (at, message) = field("cart=x&cart.id=y");
        assert_eq!(at.as_deref(), Some("cart"));
        assert!(message.contains("both a value and members"), "{message}");
        let (at, _) = field("cart.id=y&cart=x");
        assert_eq!(at.as_deref(), Some("cart"));
        let (at, _) = field("=x");
        assert_eq!(at, None);
    }

    #[test]
    fn unknown_names_pass_as_text_for_the_call_to_refuse() {
        assert_eq!(
            args("cart.gift=yes&extra=1").unwrap(),
            json!({"cart": {"gift": "yes"}, "extra": "1"})
        );
        assert_eq!(args("").unwrap(), json!({}));
    }
}
