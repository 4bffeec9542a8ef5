//! Key field paths checked against the arguments' JSON Schema, when a registry is built.
//!
//! A tool's key fields are published in `tools/list` (`keyFields`) and are the member names
//! of its key document (docs/key-spec.md, section 2), so a client that computes keys
//! itself follows each path in the JSON arguments it sends. The attribute macros see Rust
//! paths only: `cart.id` is `args.cart.id`. serde can make the two differ: a renamed field
//! (`#[serde(rename = "cartId")]`, `rename_all`) or a flattened one has another JSON path
//! than its Rust path, and no client could follow the Rust one.
//!
//! The arguments' JSON Schema is written by schemars from the same serde attributes, so it
//! knows the JSON names. A key path that resolves through it segment by segment (object
//! members by `properties`, tuple indices by `prefixItems`, through `$ref`, `allOf` and the
//! `anyOf`/`oneOf` of an `Option`) names the same value in Rust and in JSON; any other is
//! refused with [`Error::KeyFieldUnresolved`].
//!
//! Why refuse rather than map a Rust name to its JSON name: serde's derive erases the
//! relation. A struct's `Serialize` and `Deserialize` and its schema name fields by their
//! JSON names only, and the macro, which sees the tool's signature but not the definitions
//! of its argument types, cannot read their `#[serde]` attributes. A path that resolves is
//! therefore the only evidence available that the two agree.

use serde_json::Value;

use crate::error::Error;
use crate::registry::ToolDescriptor;

/// `$ref`, `allOf` and `anyOf` nesting followed per segment before giving up, so a schema
/// whose references loop cannot hang the registry build.
const MAX_DEPTH: usize = 32;

/// Refuses a mutating tool whose key field paths do not all resolve through its input
/// schema. Read-only tools have no key.
pub(crate) fn check(tool: &ToolDescriptor) -> Result<(), Error> {
    if !tool.is_mutating() {
        return Ok(());
    }
    let schema = tool.input_schema();
    for path in tool.idempotency_key_fields() {
        if let Err(stop) = resolve(&schema, path) {
            return Err(Error::KeyFieldUnresolved {
                tool: tool.name().to_owned(),
                path: (*path).to_owned(),
                resolved: stop.resolved,
                reason: stop.reason,
            });
        }
    }
    Ok(())
}

/// Where a path stopped resolving.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Stop {
    /// The leading segments that did resolve, joined by `.` (empty: not even the first).
    pub(crate) resolved: String,
    /// Why the next segment did not.
    pub(crate) reason: String,
}

/// Follows `path` (segments separated by `.`) from the root of `schema`, returning where it
/// stopped if some segment names nothing in the JSON the schema describes.
pub(crate) fn resolve(schema: &Value, path: &str) -> Result<(), Stop> {
    let mut node = schema;
    let mut resolved: Vec<&str> = Vec::new();
    for segment in path.split('.') {
        let mut search = Search::default();
        search.visit(schema, node, segment, 0);
        match search.found {
            Some(child) => {
                node = child;
                resolved.push(segment);
            }
            None => {
                let at = if resolved.is_empty() {
                    "the arguments' object".to_owned()
                } else {
                    format!("`{}`", resolved.join("."))
                };
                return Err(Stop {
                    resolved: resolved.join("."),
                    reason: search.reason(&at, segment),
                });
            }
        }
    }
    Ok(())
}

/// The search for one segment among the members a schema node (and what it refers to)
/// allows.
#[derive(Default)]
struct Search<'a> {
    found: Option<&'a Value>,
    /// Object members seen, for the error.
    members: Vec<String>,
    /// The length of a tuple seen, for the error.
    tuple_len: Option<usize>,
    /// A union of several shapes was met: a Rust path cannot go inside an enum.
    union: bool,
    /// A `$ref` that does not resolve in the schema.
    bad_ref: Option<String>,
    /// The schema nests deeper than [`MAX_DEPTH`].
    too_deep: bool,
}

impl<'a> Search<'a> {
    fn visit(&mut self, root: &'a Value, node: &'a Value, segment: &str, depth: usize) {
        if self.found.is_some() {
            return;
        }
        if depth > MAX_DEPTH {
            self.too_deep = true;
            return;
        }
        let Some(obj) = node.as_object() else {
            return;
        };
        if let Some(properties) = obj.get("properties").and_then(Value::as_object) {
            if let Some(child) = properties.get(segment) {
                self.found = Some(child);
                return;
            }
            self.members.extend(properties.keys().cloned());
        }
        if let Some(items) = obj.get("prefixItems").and_then(Value::as_array) {
            // Exactly the digits Rust writes for a tuple index: `0`, `1`, never `01`.
            let index = segment
                .parse::<usize>()
                .ok()
                .filter(|i| i.to_string() == segment);
            if let Some(child) = index.and_then(|i| items.get(i)) {
                self.found = Some(child);
                return;
            }
            self.tuple_len = Some(items.len());
        }
        if let Some(reference) = obj.get("$ref").and_then(Value::as_str) {
            match reference
                .strip_prefix('#')
                .and_then(|pointer| root.pointer(pointer))
            {
                Some(target) => self.visit(root, target, segment, depth + 1),
                None => self.bad_ref = Some(reference.to_owned()),
            }
        }
        if let Some(all) = obj.get("allOf").and_then(Value::as_array) {
            for sub in all {
                self.visit(root, sub, segment, depth + 1);
            }
        }
        for keyword in ["anyOf", "oneOf"] {
            if let Some(alternatives) = obj.get(keyword).and_then(Value::as_array) {
                // `Option<T>` is `anyOf: [T, null]`: the path goes on inside `T`. Several
                // shapes (an enum, an untagged union) have no member a Rust path can name.
                let mut shapes = alternatives.iter().filter(|a| !is_null_schema(a));
                match (shapes.next(), shapes.next()) {
                    (Some(only), None) => self.visit(root, only, segment, depth + 1),
                    (Some(_), Some(_)) => self.union = true,
                    _ => {}
                }
            }
        }
    }

    fn reason(&self, at: &str, segment: &str) -> String {
        if let Some(reference) = &self.bad_ref {
            return format!(
                "the schema of {at} refers to `{reference}`, which is not in the arguments' schema"
            );
        }
        if self.too_deep {
            return format!("the schema of {at} nests `$ref`s more than {MAX_DEPTH} deep");
        }
        let mut members = self.members.clone();
        members.sort();
        members.dedup();
        let mut found = Vec::new();
        if !members.is_empty() {
            let names: Vec<String> = members.iter().map(|m| format!("`{m}`")).collect();
            found.push(format!("its JSON members are {}", names.join(", ")));
        }
        if let Some(len) = self.tuple_len {
            found.push(format!("it is a tuple of {len}"));
        }
        if self.union {
            found.push(
                "it is a union of several shapes (an enum), which a path cannot enter".to_owned(),
            );
        }
        if found.is_empty() {
            format!("{at} has no member `{segment}`: it is not an object or a tuple in JSON")
        } else {
            format!("{at} has no member `{segment}` ({})", found.join("; "))
        }
    }
}

fn is_null_schema(schema: &Value) -> bool {
    schema.get("type").and_then(Value::as_str) == Some("null")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What schemars 1 writes for arguments `cart: Cart, gift: Option<Gift>, pair: (String,
    /// (u8, u8)), kind: Kind` with a renamed `Cart::cart_id` and a flattened `Extra`.
    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "cart": {"$ref": "#/$defs/Cart", "description": "The cart."},
                "gift": {"anyOf": [{"$ref": "#/$defs/Gift"}, {"type": "null"}]},
                "pair": {"type": "array", "prefixItems": [{"type": "string"}, {
                    "type": "array", "prefixItems": [{"type": "integer"}, {"type": "integer"}],
                    "minItems": 2, "maxItems": 2
                }], "minItems": 2, "maxItems": 2},
                "kind": {"oneOf": [{"$ref": "#/$defs/Cart"}, {"$ref": "#/$defs/Gift"}]},
                "broken": {"$ref": "#/$defs/Nowhere"},
                "looping": {"$ref": "#/$defs/Loop"}
            },
            "$defs": {
                "Cart": {"type": "object", "properties": {"cartId": {"type": "string"}},
                         "allOf": [{"properties": {"note": {"type": "string"}}}]},
                "Gift": {"type": "object", "properties": {"to": {"type": "string"}}},
                "Loop": {"$ref": "#/$defs/Loop"}
            }
        })
    }

    #[test]
    fn paths_resolve_through_refs_options_tuples_and_flattened_members() {
        for path in [
            "cart",
            "cart.cartId",
            "cart.note",
            "gift",
            "gift.to",
            "pair.0",
            "pair.1.1",
            "kind",
        ] {
            assert_eq!(resolve(&schema(), path), Ok(()), "{path}");
        }
    }

    #[test]
    fn a_renamed_rust_name_stops_at_its_parent_naming_the_json_members() {
        let stop = resolve(&schema(), "cart.cart_id").unwrap_err();
        assert_eq!(stop.resolved, "cart");
        assert_eq!(
            stop.reason,
            "`cart` has no member `cart_id` (its JSON members are `cartId`, `note`)"
        );
    }

    #[test]
    fn paths_that_name_nothing_in_json_are_refused() {
        let cases = [
            ("nope", "", "the arguments' object has no member `nope`"),
            ("pair.2", "pair", "it is a tuple of 2"),
            ("pair.01", "pair", "it is a tuple of 2"),
            (
                "pair.0.x",
                "pair.0",
                "it is not an object or a tuple in JSON",
            ),
            ("kind.to", "kind", "a union of several shapes"),
            ("broken.x", "broken", "refers to `#/$defs/Nowhere`"),
            ("looping.x", "looping", "more than 32 deep"),
        ];
        for (path, resolved, reason) in cases {
            let stop = resolve(&schema(), path).unwrap_err();
            assert_eq!(stop.resolved, resolved, "{path}");
            assert!(stop.reason.contains(reason), "{path}: {}", stop.reason);
        }
    }
}
