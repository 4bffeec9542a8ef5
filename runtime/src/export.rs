//! The registry as tool definitions for LLM APIs that take JSON-Schema tools: OpenAI Chat
//! Completions, Anthropic Messages, Google Gemini.
//!
//! Each function returns the value of the API's `tools` request field. A model's tool call
//! comes back as a name and JSON arguments: pass them to [`Registry::call`] and the call is
//! deduplicated exactly like a direct or MCP call.
//!
//! Tool names are passed as they are. OpenAI and Anthropic accept `[A-Za-z0-9_-]{1,64}`,
//! Gemini also `.` and `:`; a tool exported to them should keep to that (the MCP rule of
//! the `name = "..."` option is wider: `[A-Za-z0-9_.-]{1,128}`).

use serde_json::{json, Map, Value};

use crate::registry::{Registry, ToolDescriptor};

impl Registry {
    /// The tools for OpenAI Chat Completions' `tools` field:
    ///
    /// ```json
    /// [{"type": "function",
    ///   "function": {"name": "...", "description": "...", "parameters": {JSON Schema},
    ///                "strict": true}}]
    /// ```
    ///
    /// `parameters` is the tool's input schema without `$schema` (`$defs`/`$ref` are kept;
    /// OpenAI resolves them). `"strict": true` is set only when the schema already meets
    /// strict mode's rules (every object closed with `"additionalProperties": false` and
    /// every property required, no `allOf`/`oneOf`/`not`/conditionals); otherwise `strict`
    /// is left out and the API's non-strict default applies. Serde gives closed objects
    /// with `#[serde(deny_unknown_fields)]`.
    pub fn to_openai_tools(&self) -> Value {
        Value::Array(self.iter().map(openai_tool).collect())
    }

    /// The tools for Anthropic Messages' `tools` field:
    ///
    /// ```json
    /// [{"name": "...", "description": "...", "input_schema": {JSON Schema}}]
    /// ```
    ///
    /// `input_schema` is the tool's input schema without `$schema`.
    pub fn to_anthropic_tools(&self) -> Value {
        Value::Array(
            self.iter()
                .map(|tool| {
                    json!({
                        "name": tool.name(),
                        "description": tool.description(),
                        "input_schema": without_dialect(tool.input_schema()),
                    })
                })
                .collect(),
        )
    }

    /// The tools for Gemini's `tools` field (`generateContent`, REST JSON):
    ///
    /// ```json
    /// [{"functionDeclarations": [{"name": "...", "description": "...",
    ///                             "parameters": {OpenAPI Schema subset}}]}]
    /// ```
    ///
    /// `parameters` uses the subset of OpenAPI 3.0 that Gemini's `Schema` object accepts,
    /// converted from the input schema: `$ref`s are inlined (a recursive type is cut to
    /// `{"type": "object"}` where it recurs); `["T", "null"]` and `anyOf [T, null]` become
    /// `T` with `"nullable": true`; `oneOf` becomes `anyOf`; a single `allOf` member is
    /// inlined; `const` becomes a one-value `enum`; enums of non-strings and formats
    /// Gemini does not know (`uint64`…) are dropped, bounds such as `minimum` are kept; and
    /// `$schema`, `$defs`, `additionalProperties` and every other keyword outside the
    /// subset are removed. Tools with no arguments get no `parameters`.
    pub fn to_gemini_tools(&self) -> Value {
        let declarations: Vec<Value> = self.iter().map(gemini_declaration).collect();
        json!([{ "functionDeclarations": declarations }])
    }
}

fn without_dialect(mut schema: Value) -> Value {
    if let Value::Object(map) = &mut schema {
        map.remove("$schema");
    }
    schema
}

fn openai_tool(tool: &ToolDescriptor) -> Value {
    let parameters = without_dialect(tool.input_schema());
    let mut function = Map::new();
    function.insert("name".into(), tool.name().into());
    function.insert("description".into(), tool.description().into());
    let strict = openai_strict_compatible(&parameters);
    function.insert("parameters".into(), parameters);
    if strict {
        function.insert("strict".into(), true.into());
    }
    json!({ "type": "function", "function": Value::Object(function) })
}

/// Whether OpenAI's strict mode accepts `schema` as it is: the root is an object, every
/// object schema lists all its properties as required and sets
/// `"additionalProperties": false`, and no keyword strict mode refuses appears.
fn openai_strict_compatible(schema: &Value) -> bool {
    fn check(node: &Value, depth: usize) -> bool {
        if depth > 64 {
            return false;
        }
        let Value::Object(map) = node else {
            return matches!(node, Value::Bool(true));
        };
        const REFUSED: [&str; 9] = [
            "allOf",
            "oneOf",
            "not",
            "if",
            "then",
            "else",
            "dependentRequired",
            "dependentSchemas",
            "patternProperties",
        ];
        if REFUSED.iter().any(|k| map.contains_key(*k)) {
            return false;
        }
        let is_object = match map.get("type") {
            Some(Value::String(t)) => t == "object",
            Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
            _ => map.contains_key("properties"),
        };
        if is_object {
            if map.get("additionalProperties") != Some(&Value::Bool(false)) {
                return false;
            }
            let properties = map.get("properties").and_then(Value::as_object);
            let required: Vec<&str> = map
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            if let Some(properties) = properties {
                if !properties.keys().all(|k| required.contains(&k.as_str())) {
                    return false;
                }
                if !properties.values().all(|p| check(p, depth + 1)) {
                    return false;
                }
            }
        }
        for key in ["items", "additionalProperties"] {
            if let Some(sub @ Value::Object(_)) = map.get(key) {
                if !check(sub, depth + 1) {
                    return false;
                }
            }
        }
        for key in ["anyOf", "prefixItems"] {
            if let Some(Value::Array(subs)) = map.get(key) {
                if !subs.iter().all(|s| check(s, depth + 1)) {
                    return false;
                }
            }
        }
        for key in ["$defs", "definitions"] {
            if let Some(Value::Object(defs)) = map.get(key) {
                if !defs.values().all(|s| check(s, depth + 1)) {
                    return false;
                }
            }
        }
        true
    }
    schema.get("type").and_then(Value::as_str) == Some("object") && check(schema, 0)
}

fn gemini_declaration(tool: &ToolDescriptor) -> Value {
    let schema = tool.input_schema();
    let mut declaration = Map::new();
    declaration.insert("name".into(), tool.name().into());
    declaration.insert("description".into(), tool.description().into());
    let has_params = schema
        .get("properties")
        .and_then(Value::as_object)
        .is_some_and(|p| !p.is_empty());
    if has_params {
        declaration.insert("parameters".into(), gemini_schema(&schema));
    }
    Value::Object(declaration)
}

/// Keywords of Gemini's `Schema` object (the OpenAPI 3.0 subset it accepts).
const GEMINI_KEYWORDS: [&str; 22] = [
    "type",
    "format",
    "title",
    "description",
    "nullable",
    "enum",
    "maxItems",
    "minItems",
    "properties",
    "required",
    "minProperties",
    "maxProperties",
    "minLength",
    "maxLength",
    "pattern",
    "example",
    "anyOf",
    "propertyOrdering",
    "default",
    "items",
    "minimum",
    "maximum",
];

/// Converts a JSON Schema (as schemars writes it) to Gemini's OpenAPI subset.
fn gemini_schema(schema: &Value) -> Value {
    let defs = schema
        .get("$defs")
        .or_else(|| schema.get("definitions"))
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut stack = Vec::new();
    gemini_node(schema, &defs, &mut stack)
}

fn gemini_node(node: &Value, defs: &Map<String, Value>, stack: &mut Vec<String>) -> Value {
    let Value::Object(map) = node else {
        // `true` (anything) has no equivalent but an untyped schema.
        return json!({});
    };
    if stack.len() > 32 {
        return json!({ "type": "object" });
    }
    let mut map = map.clone();

    // `$ref`: inline the definition (siblings such as `description` win).
    if let Some(Value::String(reference)) = map.remove("$ref") {
        let name = reference
            .strip_prefix("#/$defs/")
            .or_else(|| reference.strip_prefix("#/definitions/"))
            .unwrap_or(&reference)
            .to_owned();
        let resolved = match defs.get(&name) {
            Some(_) if stack.contains(&name) => json!({ "type": "object" }),
            Some(def) => {
                stack.push(name);
                let out = gemini_node(def, defs, stack);
                stack.pop();
                out
            }
            None => json!({}),
        };
        let siblings = gemini_node(&Value::Object(map), defs, stack);
        return merge(resolved, siblings);
    }

    // A single `allOf` member is the schema itself.
    if let Some(Value::Array(all)) = map.remove("allOf") {
        let siblings = gemini_node(&Value::Object(map), defs, stack);
        let merged = all.iter().fold(json!({}), |acc, member| {
            merge(acc, gemini_node(member, defs, stack))
        });
        return merge(merged, siblings);
    }

    // `anyOf`/`oneOf` with `null`: nullable; otherwise `anyOf`.
    let alternatives = match (map.remove("anyOf"), map.remove("oneOf")) {
        (Some(Value::Array(a)), _) | (None, Some(Value::Array(a))) => Some(a),
        _ => None,
    };
    if let Some(alternatives) = alternatives {
        let (nulls, others): (Vec<&Value>, Vec<&Value>) = alternatives
            .iter()
            .partition(|a| a.get("type").and_then(Value::as_str) == Some("null"));
        let siblings = gemini_node(&Value::Object(map), defs, stack);
        let mut out = match others.as_slice() {
            [only] => merge(gemini_node(only, defs, stack), siblings),
            _ => {
                let converted: Vec<Value> =
                    others.iter().map(|o| gemini_node(o, defs, stack)).collect();
                merge(json!({ "anyOf": converted }), siblings)
            }
        };
        if !nulls.is_empty() {
            if let Value::Object(out) = &mut out {
                out.insert("nullable".into(), true.into());
            }
        }
        return out;
    }

    let mut out = Map::new();
    // `type`: one name; `null` in a list becomes `nullable`.
    let mut nullable = false;
    match map.remove("type") {
        Some(Value::String(t)) if t == "null" => nullable = true,
        Some(Value::String(t)) => {
            out.insert("type".into(), t.into());
        }
        Some(Value::Array(types)) => {
            let names: Vec<&str> = types.iter().filter_map(Value::as_str).collect();
            nullable = names.contains(&"null");
            let rest: Vec<&str> = names.into_iter().filter(|t| *t != "null").collect();
            match rest.as_slice() {
                [] => {}
                [one] => {
                    out.insert("type".into(), (*one).into());
                }
                many => {
                    let alternatives: Vec<Value> =
                        many.iter().map(|t| json!({ "type": t })).collect();
                    out.insert("anyOf".into(), alternatives.into());
                }
            }
        }
        _ => {}
    }
    if let Some(value) = map.remove("const") {
        if let Value::String(_) = value {
            out.entry("type").or_insert_with(|| "string".into());
            out.insert("enum".into(), json!([value]));
        }
    }
    if let Some(Value::Array(values)) = map.remove("enum") {
        if values.iter().all(Value::is_string) {
            out.entry("type").or_insert_with(|| "string".into());
            out.insert("enum".into(), values.into());
        } else if values.iter().any(Value::is_null) && values.len() > 1 {
            let strings: Vec<Value> = values.iter().filter(|v| v.is_string()).cloned().collect();
            if strings.len() + 1 == values.len() {
                nullable = true;
                out.entry("type").or_insert_with(|| "string".into());
                out.insert("enum".into(), strings.into());
            }
        }
    }
    if let Some(Value::Object(properties)) = map.remove("properties") {
        let converted: Map<String, Value> = properties
            .iter()
            .map(|(k, v)| (k.clone(), gemini_node(v, defs, stack)))
            .collect();
        out.insert("properties".into(), converted.into());
    }
    if let Some(items) = map.remove("items") {
        out.insert("items".into(), gemini_node(&items, defs, stack));
    }
    if let Some(Value::String(format)) = map.remove("format") {
        let known = match out.get("type").and_then(Value::as_str) {
            Some("string") => matches!(format.as_str(), "enum" | "date-time"),
            Some("integer") => matches!(format.as_str(), "int32" | "int64"),
            Some("number") => matches!(format.as_str(), "float" | "double"),
            _ => false,
        };
        if known {
            out.insert("format".into(), format.into());
        }
    }
    for (key, value) in map {
        if GEMINI_KEYWORDS.contains(&key.as_str()) && !out.contains_key(&key) {
            out.insert(key, value);
        }
    }
    if nullable {
        out.insert("nullable".into(), true.into());
    }
    Value::Object(out)
}

/// `extra`'s members over `base`'s (objects only).
fn merge(base: Value, extra: Value) -> Value {
    match (base, extra) {
        (Value::Object(mut base), Value::Object(extra)) => {
            for (k, v) in extra {
                match (base.get_mut(&k), v) {
                    (Some(Value::Object(b)), Value::Object(e)) if k == "properties" => {
                        b.extend(e);
                    }
                    (Some(Value::Array(b)), Value::Array(e)) if k == "required" => {
                        for item in e {
                            if !b.contains(&item) {
                                b.push(item);
                            }
                        }
                    }
                    (_, v) => {
                        base.insert(k, v);
                    }
                }
            }
            Value::Object(base)
        }
        (base, _) => base,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::registry::{BoxFuture, CallArgs, CallResult, Context};
    use crate::spec::{SourceLocation, ToolKind, ToolSpec};

    const fn spec(name: &'static str, kind: ToolKind) -> ToolSpec {
        ToolSpec {
            description: "Place an order.",
            ..ToolSpec::fixture(
                name,
                kind,
                &["user_id", "cart.id"],
                &["user_id", "cart", "note"],
                SourceLocation {
                    module_path: "export::tests",
                    file: file!(),
                    line: line!(),
                    column: 1,
                },
            )
        }
    }

    fn never<'a>(_: &'a Context, _: CallArgs<'a>) -> BoxFuture<'a, Result<CallResult, Error>> {
        Box::pin(async { Ok(Value::Null.into()) })
    }

    /// What schemars writes for `fn create_order(user_id: u64, cart: Cart, note: Option<String>)`.
    fn order_schema() -> Value {
        json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {
                "user_id": {"type": "integer", "format": "uint64", "minimum": 0},
                "cart": {"$ref": "#/$defs/Cart", "description": "The cart."},
                "note": {"type": ["string", "null"]},
                "kind": {"oneOf": [{"type": "string", "const": "gift"}, {"type": "string", "const": "plain"}]}
            },
            "required": ["user_id", "cart"],
            "$defs": {
                "Cart": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string"},
                        "items": {"type": "array", "items": {"$ref": "#/$defs/Item"}},
                        "parent": {"anyOf": [{"$ref": "#/$defs/Cart"}, {"type": "null"}]}
                    },
                    "required": ["id", "items"],
                    "additionalProperties": false
                },
                "Item": {"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]}
            }
        })
    }

    fn strict_schema() -> Value {
        json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {"order_id": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
            "required": ["order_id", "tags"],
            "additionalProperties": false
        })
    }

    fn empty_schema() -> Value {
        json!({"type": "object", "properties": {}})
    }

    fn no_output() -> Option<Value> {
        None
    }

    static ORDER_SPEC: ToolSpec = spec("create_order", ToolKind::Mutating);
    static STRICT_SPEC: ToolSpec = spec("get_order", ToolKind::ReadOnly);
    static EMPTY_SPEC: ToolSpec = spec("ping", ToolKind::ReadOnly);
    static ORDER: ToolDescriptor =
        ToolDescriptor::new(&ORDER_SPEC, None, never, order_schema, no_output);
    static STRICT: ToolDescriptor =
        ToolDescriptor::new(&STRICT_SPEC, None, never, strict_schema, no_output);
    static EMPTY: ToolDescriptor =
        ToolDescriptor::new(&EMPTY_SPEC, None, never, empty_schema, no_output);

    fn registry() -> Registry {
        Registry::from_tools([&ORDER, &STRICT, &EMPTY]).unwrap()
    }

    #[test]
    fn openai_tools_are_functions_with_strict_only_where_the_schema_allows_it() {
        let tools = registry().to_openai_tools();
        let tools = tools.as_array().unwrap();
        assert_eq!(tools.len(), 3);
        let order = &tools[0];
        assert_eq!(order["type"], "function");
        assert_eq!(order["function"]["name"], "create_order");
        assert_eq!(order["function"]["description"], "Place an order.");
        let params = &order["function"]["parameters"];
        assert_eq!(params["type"], "object");
        assert!(params.get("$schema").is_none());
        assert_eq!(params["properties"]["cart"]["$ref"], "#/$defs/Cart");
        assert!(
            order["function"].get("strict").is_none(),
            "optional fields: not strict"
        );
        let strict = &tools[1];
        assert_eq!(strict["function"]["name"], "get_order");
        assert_eq!(strict["function"]["strict"], true);
        assert_eq!(
            strict["function"]["parameters"],
            json!({
                "type": "object",
                "properties": {"order_id": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
                "required": ["order_id", "tags"],
                "additionalProperties": false
            })
        );
        assert_eq!(tools[2]["function"]["name"], "ping");
        assert!(tools[2]["function"].get("strict").is_none());
    }

    #[test]
    fn strict_mode_needs_every_object_closed_and_fully_required() {
        assert!(openai_strict_compatible(&strict_schema()));
        let mut open = strict_schema();
        open["additionalProperties"] = true.into();
        assert!(!openai_strict_compatible(&open));
        let mut partial = strict_schema();
        partial["required"] = json!(["order_id"]);
        assert!(!openai_strict_compatible(&partial));
        let mut nested_open = strict_schema();
        nested_open["properties"]["tags"]["items"] =
            json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]});
        assert!(!openai_strict_compatible(&nested_open));
        let mut one_of = strict_schema();
        one_of["properties"]["order_id"] =
            json!({"oneOf": [{"type": "integer"}, {"type": "string"}]});
        assert!(!openai_strict_compatible(&one_of));
        assert!(!openai_strict_compatible(&json!({"type": "string"})));
    }

    #[test]
    fn anthropic_tools_have_name_description_and_input_schema() {
        let tools = registry().to_anthropic_tools();
        let order = &tools[0];
        let mut keys: Vec<&String> = order.as_object().unwrap().keys().collect();
        keys.sort();
        assert_eq!(keys, ["description", "input_schema", "name"]);
        assert_eq!(order["name"], "create_order");
        assert_eq!(order["input_schema"]["type"], "object");
        assert!(order["input_schema"].get("$schema").is_none());
        assert_eq!(order["input_schema"]["$defs"]["Cart"]["type"], "object");
        assert_eq!(
            tools[1]["input_schema"]["required"],
            json!(["order_id", "tags"])
        );
    }

    fn keywords(node: &Value, out: &mut Vec<String>) {
        if let Value::Object(map) = node {
            for (k, v) in map {
                out.push(k.clone());
                if k == "properties" {
                    for p in v.as_object().unwrap().values() {
                        keywords(p, out);
                    }
                } else {
                    keywords(v, out);
                }
            }
        } else if let Value::Array(items) = node {
            for i in items {
                keywords(i, out);
            }
        }
    }

    #[test]
    fn gemini_tools_are_function_declarations_in_the_openapi_subset() {
        let tools = registry().to_gemini_tools();
        let declarations = tools[0]["functionDeclarations"].as_array().unwrap();
        assert_eq!(tools.as_array().unwrap().len(), 1);
        assert_eq!(declarations.len(), 3);
        let order = &declarations[0];
        assert_eq!(order["name"], "create_order");
        assert_eq!(order["description"], "Place an order.");
        let params = &order["parameters"];
        let mut used = Vec::new();
        keywords(params, &mut used);
        for k in &used {
            assert!(
                GEMINI_KEYWORDS.contains(&k.as_str()),
                "`{k}` is outside Gemini's subset: {params:#}"
            );
        }
        assert_eq!(params["type"], "object");
        assert_eq!(params["required"], json!(["user_id", "cart"]));
        // uint64 is not a Gemini format; the bound stays.
        assert_eq!(
            params["properties"]["user_id"],
            json!({"type": "integer", "minimum": 0})
        );
        // `$ref` inlined, the sibling description kept, `additionalProperties` dropped.
        let cart = &params["properties"]["cart"];
        assert_eq!(cart["type"], "object");
        assert_eq!(cart["description"], "The cart.");
        assert_eq!(cart["required"], json!(["id", "items"]));
        assert_eq!(
            cart["properties"]["items"]["items"]["properties"]["sku"]["type"],
            "string"
        );
        // The recursive parent is cut, and nullable.
        assert_eq!(
            cart["properties"]["parent"],
            json!({"type": "object", "nullable": true})
        );
        assert_eq!(
            params["properties"]["note"],
            json!({"type": "string", "nullable": true})
        );
        assert_eq!(
            params["properties"]["kind"],
            json!({"anyOf": [{"type": "string", "enum": ["gift"]}, {"type": "string", "enum": ["plain"]}]})
        );
        assert_eq!(
            declarations[1]["parameters"],
            json!({
                "type": "object",
                "properties": {"order_id": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
                "required": ["order_id", "tags"]
            })
        );
        assert!(
            declarations[2].get("parameters").is_none(),
            "no arguments, no parameters"
        );
    }

    #[test]
    fn gemini_conversion_handles_type_lists_enums_and_all_of() {
        let converted = gemini_schema(&json!({
            "type": "object",
            "properties": {
                "n": {"type": ["integer", "string"]},
                "mode": {"enum": ["a", "b", null]},
                "level": {"enum": [1, 2]},
                "wrapped": {"allOf": [{"$ref": "#/$defs/Inner"}], "description": "d"},
                "when": {"type": "string", "format": "date-time"}
            },
            "$defs": {"Inner": {"type": "object", "properties": {"x": {"type": "number", "format": "double"}}}}
        }));
        let p = &converted["properties"];
        assert_eq!(
            p["n"],
            json!({"anyOf": [{"type": "integer"}, {"type": "string"}]})
        );
        assert_eq!(
            p["mode"],
            json!({"type": "string", "enum": ["a", "b"], "nullable": true})
        );
        assert_eq!(p["level"], json!({}));
        assert_eq!(
            p["wrapped"],
            json!({"type": "object", "properties": {"x": {"type": "number", "format": "double"}}, "description": "d"})
        );
        assert_eq!(p["when"], json!({"type": "string", "format": "date-time"}));
        assert!(converted.get("$defs").is_none());
    }
}
