//! One rule for unknown members at every level of a tool's JSON arguments: a member the
//! tool's input schema does not declare is refused, naming its path.
//!
//! The generated argument struct denies unknown top-level fields, but the user's own
//! nested types (`Cart`) usually do not, so serde would silently drop `cart.gift`: the
//! caller believes it sent something the tool never saw. The input schema (schemars, from
//! the same serde attributes) says which members each object declares; this walk checks
//! the JSON against it before decoding. An object whose schema declares no properties, or
//! allows others (`additionalProperties` other than `false`: maps, `serde_json::Value`),
//! accepts any member name; where `additionalProperties` is a schema (a map's values,
//! `HashMap<String, Item>`; for a map keyed by integers, the one schema its
//! `patternProperties` give), each member it does not list is checked against that
//! schema, so `items.a.gift` is refused as `cart.gift` is. Values given only by
//! `unevaluatedProperties` are not followed. Alternatives (`anyOf`/`oneOf`, e.g. `Option<T>` and enums) accept
//! a value when one of them does; `allOf` parts (e.g. `#[serde(flatten)]`) are merged.
//!
//! Hand-written rather than a JSON Schema validator crate: only this one rule is wanted
//! (types, formats and ranges are serde's job, with its own precise messages), and a full
//! validator would reject what serde accepts (e.g. integer formats) or the reverse.

use serde_json::{Map, Value};

mod text;

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
/// Compiles the schema first: a tool's registry calls use [`Members::compile`] once and
/// [`Members::unknown_member`] per call.
///
/// In tests it also holds the one-pass text check to its promise on every case: text it
/// passes is text this walk finds nothing in.
#[cfg(test)]
pub(crate) fn unknown_member(schema: &Value, args: &Value) -> Option<UnknownMember> {
    let members = Members::compile(schema);
    let found = members.unknown_member(args);
    if members.text_is_clean(&args.to_string()) {
        assert_eq!(found, None, "the text check passed {args}");
    }
    found
}

/// Deeper than this, the arguments are not followed (a recursive type): nothing is refused
/// there. A schema's `allOf` parts are merged to this depth when it is compiled, whatever
/// the depth of the arguments they later check (the walk before `Members` counted the two
/// together, so an `allOf` met below 64 levels of arguments was treated as open).
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

/// A tool's input schema compiled for the members rule: every object schema (after its
/// `$ref`s) becomes one [`Rule`] with its declared names merged from its `allOf` parts, so
/// a call's check is a walk of the arguments with one lookup per member, no schema
/// keyword read, no `$ref` followed, no allocation (the schema walk it replaces cost more
/// than decoding the arguments). Built once per tool (`__private::SchemaCell`).
#[derive(Debug)]
pub(crate) struct Members {
    nodes: Vec<Node>,
    root: usize,
    /// By node: whether its check can find nothing in any value (a scalar's schema, a map
    /// of such values, `true`), so the text walk skips the value unread.
    inert: Vec<bool>,
}

/// One schema, its `$ref`s followed.
#[derive(Debug)]
enum Node {
    /// Not an object schema (`true`, `false`, an unresolvable `$ref`): says nothing about
    /// members and admits every JSON type.
    Any,
    /// An object schema.
    Rule(Rule),
}

/// What an object schema says about members, with its `allOf` parts merged.
#[derive(Debug, Default)]
struct Rule {
    /// The JSON types its `type` admits ([`type_bit`]), `u8::MAX` when it has no `type`.
    types: u8,
    /// `anyOf` (else `oneOf`) alternatives: a value passes when one of those admitting its
    /// type does, and then this schema's own members are checked too.
    alternatives: Option<Vec<usize>>,
    /// Whether it or one of its `allOf` parts declares a property.
    declares_any: bool,
    /// Whether it or one of its `allOf` parts allows members it does not list.
    open: bool,
    /// Declared members, sorted by [`by_length`] (first declaration wins: own, then the
    /// parts').
    declared: Vec<(Box<str>, usize)>,
    /// [`prefix`] of each name of `declared`, in its order.
    prefixes: Vec<u64>,
    /// The declared names in schema order, as an error lists them.
    expected: Vec<Box<str>>,
    /// `prefixItems`: the schema of each leading array item.
    prefix_items: Option<Vec<usize>>,
    /// `items` (when an object schema): the schema of the other array items.
    items: Option<usize>,
    /// `additionalProperties` (when an object schema; its own, else its `allOf` parts'
    /// first): the schema of the members it does not list, a map's values.
    additional: Option<usize>,
}

/// The order of [`Rule::declared`]: by length, then by bytes. A lookup then compares bytes
/// only with names of its own length (short names are the rule: a call for a member
/// `memcmp`s them otherwise at every step of the search).
fn by_length(a: &str, b: &str) -> core::cmp::Ordering {
    a.len()
        .cmp(&b.len())
        .then_with(|| a.as_bytes().cmp(b.as_bytes()))
}

/// Up to this many declared members, [`Rule::find`] scans rather than searches.
const SCAN_MAX: usize = 8;

/// The first 8 bytes of `name`, zero-padded, as one word: [`Rule::find`] compares a name's
/// word and length first, and its other bytes only when it is longer than 8 (most member
/// names are not, so most lookups call no `memcmp`).
fn prefix(name: &str) -> u64 {
    let mut word = [0_u8; 8];
    for (to, from) in word.iter_mut().zip(name.as_bytes()) {
        *to = *from;
    }
    u64::from_le_bytes(word)
}

impl Rule {
    /// The schema node of the declared member `name`.
    fn find(&self, name: &str) -> Option<usize> {
        // A few members (the usual object): one pass over words and lengths is cheaper
        // than a search's three-way comparisons of bytes.
        if self.declared.len() <= SCAN_MAX {
            let word = prefix(name);
            let long = name.len() > 8;
            return self
                .declared
                .iter()
                .zip(&self.prefixes)
                .find(|((n, _), &p)| {
                    p == word
                        && n.len() == name.len()
                        && (!long || n.as_bytes().get(8..) == name.as_bytes().get(8..))
                })
                .map(|(&(_, node), _)| node);
        }
        let i = self
            .declared
            .binary_search_by(|(n, _)| by_length(n, name))
            .ok()?;
        self.declared.get(i).map(|&(_, node)| node)
    }
}

/// The bit of a JSON value's type in [`Rule::types`].
fn type_bit(value: &Value) -> u8 {
    match value {
        Value::Null => 1,
        Value::Bool(_) => 2,
        Value::Number(n) if n.is_f64() => 4,
        Value::Number(_) => 8,
        Value::String(_) => 16,
        Value::Array(_) => 32,
        Value::Object(_) => 64,
    }
}

/// The types a schema's `type` admits: a name or a list of names; `number` admits integers.
fn types_of(schema: &Map<String, Value>) -> u8 {
    let bits = |t: &Value| match t.as_str() {
        Some("null") => 1,
        Some("boolean") => 2,
        Some("number") => 4 | 8,
        Some("integer") => 8,
        Some("string") => 16,
        Some("array") => 32,
        Some("object") => 64,
        _ => 0,
    };
    match schema.get("type") {
        None => u8::MAX,
        Some(Value::Array(types)) => types.iter().fold(0, |acc, t| acc | bits(t)),
        Some(t) => bits(t),
    }
}

/// Compiles a schema into [`Members`] nodes (each resolved schema once, by address, so a
/// recursive type is a cycle of nodes).
struct Compiler<'a> {
    root: &'a Value,
    nodes: Vec<Node>,
    seen: std::collections::HashMap<*const Value, usize>,
}

impl<'a> Compiler<'a> {
    /// `schema` with its local `$ref`s (`#/$defs/Cart`) followed; `None` for a reference
    /// that leads nowhere (it then says nothing, like `true`).
    fn resolve(&self, schema: &'a Value) -> Option<&'a Value> {
        let mut schema = schema;
        for _ in 0..MAX_DEPTH {
            let Some(reference) = schema.get("$ref").and_then(Value::as_str) else {
                return Some(schema);
            };
            schema = pointer(self.root, reference.strip_prefix('#')?)?;
        }
        None
    }

    /// The node of `schema`, compiled on first sight.
    fn node(&mut self, schema: &'a Value) -> usize {
        let Some(resolved) = self.resolve(schema) else {
            return self.any();
        };
        let Value::Object(map) = resolved else {
            return self.any();
        };
        let address: *const Value = resolved;
        if let Some(&id) = self.seen.get(&address) {
            return id;
        }
        let id = self.nodes.len();
        self.nodes.push(Node::Any);
        self.seen.insert(address, id);
        let alternatives = ["anyOf", "oneOf"]
            .iter()
            .find_map(|k| map.get(*k).and_then(Value::as_array))
            .map(|alternatives| alternatives.iter().map(|a| self.node(a)).collect());
        let mut merged: Vec<(&'a str, &'a Value)> = Vec::new();
        self.collect(map, &mut merged, 0);
        let expected = merged.iter().map(|(name, _)| Box::from(*name)).collect();
        let mut declared: Vec<(Box<str>, usize)> = Vec::with_capacity(merged.len());
        for (name, member) in merged {
            if !declared.iter().any(|(n, _)| &**n == name) {
                let member = self.node(member);
                declared.push((name.into(), member));
            }
        }
        declared.sort_by(|a, b| by_length(&a.0, &b.0));
        let prefixes = declared.iter().map(|(n, _)| prefix(n)).collect();
        let prefix_items = map
            .get("prefixItems")
            .and_then(Value::as_array)
            .map(|items| items.iter().map(|i| self.node(i)).collect());
        let items = map
            .get("items")
            .filter(|s| s.is_object())
            .map(|i| self.node(i));
        let additional = self.additional(map, 0).map(|a| self.node(a));
        let rule = Rule {
            types: types_of(map),
            alternatives,
            declares_any: self.declares_any(map, 0),
            open: self.is_open(map, 0),
            declared,
            prefixes,
            expected,
            prefix_items,
            items,
            additional,
        };
        if let Some(slot) = self.nodes.get_mut(id) {
            *slot = Node::Rule(rule);
        }
        id
    }

    fn any(&mut self) -> usize {
        self.nodes.push(Node::Any);
        self.nodes.len() - 1
    }

    /// The `allOf` parts of `schema` (e.g. `#[serde(flatten)]`), resolved; a part that is
    /// not an object schema is `None`.
    fn parts(&self, schema: &'a Map<String, Value>) -> Vec<Option<&'a Map<String, Value>>> {
        match schema.get("allOf") {
            Some(Value::Array(parts)) => parts
                .iter()
                .map(|part| self.resolve(part).and_then(Value::as_object))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Whether `schema` or one of its `allOf` parts declares a property.
    fn declares_any(&self, schema: &'a Map<String, Value>, depth: usize) -> bool {
        if depth > MAX_DEPTH {
            return false;
        }
        matches!(schema.get("properties"), Some(Value::Object(p)) if !p.is_empty())
            || self
                .parts(schema)
                .into_iter()
                .flatten()
                .any(|part| self.declares_any(part, depth + 1))
    }

    /// Whether `schema` or one of its `allOf` parts allows members it does not list (or
    /// is too deep to follow); a part that is not an object schema allows any member.
    fn is_open(&self, schema: &'a Map<String, Value>, depth: usize) -> bool {
        if depth > MAX_DEPTH {
            return true;
        }
        if !matches!(
            schema.get("additionalProperties"),
            None | Some(Value::Bool(false))
        ) || schema.contains_key("patternProperties")
        {
            return true;
        }
        self.parts(schema)
            .into_iter()
            .any(|part| part.is_none_or(|part| self.is_open(part, depth + 1)))
    }

    /// The schema of the members `schema` does not list: its `additionalProperties` when
    /// that is a schema (not `true` or `false`: a map keyed by strings), else the one schema
    /// all its `patternProperties` give (a map keyed by integers: schemars writes
    /// `{"^\\d+$": V}`; a name no pattern matches is serde's to refuse), else the first of
    /// its `allOf` parts'.
    fn additional(&self, schema: &'a Map<String, Value>, depth: usize) -> Option<&'a Value> {
        if depth > MAX_DEPTH {
            return None;
        }
        if let Some(additional) = schema.get("additionalProperties").filter(|a| a.is_object()) {
            return Some(additional);
        }
        if let Some(Value::Object(patterns)) = schema.get("patternProperties") {
            let mut values = patterns.values();
            if let Some(first) = values.next().filter(|v| v.is_object()) {
                if values.all(|v| v == first) {
                    return Some(first);
                }
            }
        }
        self.parts(schema)
            .into_iter()
            .flatten()
            .find_map(|part| self.additional(part, depth + 1))
    }

    /// Declared members of `schema` and of its `allOf` parts, in schema order, repeats
    /// included (what an error lists; the first of a name is the one followed).
    fn collect(
        &self,
        schema: &'a Map<String, Value>,
        declared: &mut Vec<(&'a str, &'a Value)>,
        depth: usize,
    ) {
        if depth > MAX_DEPTH {
            return;
        }
        if let Some(Value::Object(properties)) = schema.get("properties") {
            declared.extend(properties.iter().map(|(n, s)| (n.as_str(), s)));
        }
        for part in self.parts(schema).into_iter().flatten() {
            self.collect(part, declared, depth + 1);
        }
    }
}

impl Members {
    /// Compiles `schema` (a tool's input schema, `$ref`s local to it).
    pub(crate) fn compile(schema: &Value) -> Members {
        let mut compiler = Compiler {
            root: schema,
            nodes: Vec::new(),
            seen: std::collections::HashMap::new(),
        };
        let root = compiler.node(schema);
        let inert = inert(&compiler.nodes);
        Members {
            nodes: compiler.nodes,
            root,
            inert,
        }
    }

    /// The first member of `args` that the schema does not declare.
    pub(crate) fn unknown_member(&self, args: &Value) -> Option<UnknownMember> {
        self.check(self.root, args, Path::Root, 0)
    }

    fn rule(&self, node: usize) -> Option<&Rule> {
        match self.nodes.get(node) {
            Some(Node::Rule(rule)) => Some(rule),
            _ => None,
        }
    }

    /// Whether the schema of `node` admits `value`'s JSON type.
    fn admits(&self, node: usize, value: &Value) -> bool {
        self.rule(node)
            .is_none_or(|rule| rule.types & type_bit(value) != 0)
    }

    fn check(
        &self,
        node: usize,
        value: &Value,
        path: Path<'_>,
        depth: usize,
    ) -> Option<UnknownMember> {
        if depth > MAX_DEPTH {
            return None;
        }
        let rule = self.rule(node)?;
        let Some(alternatives) = &rule.alternatives else {
            return self.check_own(rule, value, path, depth);
        };
        let mut first = None;
        // Only alternatives of the value's JSON type count (`null` accepts no object).
        for &alternative in alternatives.iter().filter(|&&a| self.admits(a, value)) {
            match self.check(alternative, value, path, depth + 1) {
                None => return self.check_own(rule, value, path, depth),
                Some(found) => {
                    first.get_or_insert(found);
                }
            }
        }
        first
    }

    /// The members and items `rule` declares.
    fn check_own(
        &self,
        rule: &Rule,
        value: &Value,
        path: Path<'_>,
        depth: usize,
    ) -> Option<UnknownMember> {
        match value {
            Value::Object(members) if rule.declares_any || rule.additional.is_some() => {
                for (name, member) in members {
                    let inner = Path::Member(&path, name);
                    match rule.find(name).or(rule.additional) {
                        Some(schema) => {
                            if let Some(found) = self.check(schema, member, inner, depth + 1) {
                                return Some(found);
                            }
                        }
                        None if rule.open => {}
                        None => {
                            return Some(UnknownMember {
                                path: inner.render(),
                                expected: rule.expected.iter().map(|n| n.to_string()).collect(),
                            })
                        }
                    }
                }
                None
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    let schema = rule
                        .prefix_items
                        .as_ref()
                        .and_then(|p| p.get(i))
                        .or(rule.items.as_ref());
                    if let Some(&schema) = schema {
                        let inner = Path::Item(&path, i);
                        if let Some(found) = self.check(schema, item, inner, depth + 1) {
                            return Some(found);
                        }
                    }
                }
                None
            }
            _ => None,
        }
    }
}

/// By node, whether [`Members::check`] can find nothing there whatever the value: no
/// member refused (none declared, or the object open and every declared member's schema
/// inert), the schema of unlisted members (a map's values) inert if there is one, and
/// every alternative and item schema inert. The least fixed point: a node on a
/// cycle counts as not inert unless something else proves it, which only costs a walk.
fn inert(nodes: &[Node]) -> Vec<bool> {
    let mut inert: Vec<bool> = nodes.iter().map(|n| matches!(n, Node::Any)).collect();
    loop {
        let mut changed = false;
        for (i, node) in nodes.iter().enumerate() {
            let Node::Rule(rule) = node else { continue };
            if inert.get(i).copied().unwrap_or(true) {
                continue;
            }
            let is = |id: &usize| inert.get(*id).copied().unwrap_or(false);
            let members = (!rule.declares_any
                || (rule.open && rule.declared.iter().all(|(_, id)| is(id))))
                && rule.additional.iter().all(is);
            let now = members
                && rule.alternatives.iter().flatten().all(is)
                && rule.prefix_items.iter().flatten().all(is)
                && rule.items.iter().all(is);
            if now {
                if let Some(slot) = inert.get_mut(i) {
                    *slot = true;
                }
                changed = true;
            }
        }
        if !changed {
            return inert;
        }
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

    /// `find` names exactly the declared member, by the scan (few members) and by the
    /// search (many): names sharing their first 8 bytes, a prefix of another, one a
    /// byte longer, and padding-like NUL bytes are told apart.
    #[test]
    fn find_names_exactly_the_declared_member() {
        let few = [
            "id",
            "abcdefgh",
            "abcdefghi",
            "abcdefghj",
            "user\\u0000",
            "ab",
        ];
        let many: Vec<String> = (0..20)
            .map(|i| format!("customer_{i:02}"))
            .chain(few.iter().map(|s| (*s).to_owned()))
            .collect();
        for names in [few.iter().map(|s| (*s).to_owned()).collect(), many] {
            let properties: Map<String, Value> = names
                .iter()
                .map(|n| {
                    let n: String = serde_json::from_str(&format!("\"{n}\"")).unwrap();
                    (n, json!({}))
                })
                .collect();
            let members = Members::compile(&json!({"type": "object", "properties": properties}));
            let rule = members.rule(members.root).unwrap();
            let mut nodes: Vec<usize> = Vec::new();
            for (name, _) in &properties {
                let node = rule
                    .find(name)
                    .unwrap_or_else(|| panic!("{name:?} not found"));
                assert!(
                    !nodes.contains(&node),
                    "{name:?} found another member's node"
                );
                nodes.push(node);
            }
            for absent in [
                "",
                "i",
                "abcdefg",
                "abcdefgh\0",
                "abcdefghk",
                "user",
                "user\0\0",
                "customer_20",
                "Id",
            ] {
                assert_eq!(rule.find(absent), None, "{absent:?} is not declared");
            }
        }
    }

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "cart": {"$ref": "#/$defs/Cart"},
                "maybe": {"anyOf": [{"$ref": "#/$defs/Cart"}, {"type": "null"}]},
                "tags": {"type": "object", "additionalProperties": {"type": "string"}},
                "any": true,
                "carts": {"type": "array", "items": {"$ref": "#/$defs/Cart"}},
                "flat": {"allOf": [{"$ref": "#/$defs/Cart"}, {"properties": {"extra": {}}}]},
                "byId": {"type": "object", "additionalProperties": {"$ref": "#/$defs/Cart"}},
                "deep": {"type": "object", "additionalProperties": {"type": "object", "additionalProperties": {"$ref": "#/$defs/Cart"}}},
                "flatMap": {"type": "object", "properties": {"id": {"type": "string"}}, "additionalProperties": {"$ref": "#/$defs/Cart"}},
                "anyMap": {"type": "object", "additionalProperties": true},
                "byNumber": {"type": "object", "patternProperties": {"^\\d+$": {"$ref": "#/$defs/Cart"}}, "additionalProperties": false},
                "maybeMap": {"anyOf": [{"type": "object", "additionalProperties": {"$ref": "#/$defs/Cart"}}, {"type": "null"}]},
                "tree": {"$ref": "#/$defs/Node"},
                "emptyMap": {"type": "object", "additionalProperties": {}}
            },
            "additionalProperties": false,
            "$defs": {
                "Cart": {"type": "object", "properties": {"id": {"type": "string"}, "items": {"type": "array", "items": {"type": "string"}}}},
                "Node": {"type": "object", "properties": {"name": {"type": "string"}, "children": {"type": "object", "additionalProperties": {"$ref": "#/$defs/Node"}}}}
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

    /// A recursive type (`Node { children: Vec<Node> }`) compiles to a cycle and is
    /// checked at every depth the arguments reach; alternatives of the wrong JSON type
    /// are skipped.
    #[test]
    fn recursive_types_and_alternatives_are_checked_at_any_depth() {
        let schema = json!({
            "type": "object",
            "properties": {"root": {"$ref": "#/$defs/Node"}},
            "$defs": {"Node": {
                "type": "object",
                "properties": {"name": {}, "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}
            }}
        });
        let ok = json!({"root": {"name": "a", "children": [{"name": "b", "children": [{"name": "c"}]}]}});
        assert_eq!(unknown_member(&schema, &ok), None);
        let bad = json!({"root": {"children": [{"children": [{"name": "c", "x": 1}]}]}});
        let found = unknown_member(&schema, &bad).unwrap();
        assert_eq!(found.path, "root.children.0.children.0.x");
        assert_eq!(found.expected, ["children", "name"]);

        let alternatives = json!({
            "type": "object",
            "properties": {"v": {
                "anyOf": [{"type": "string"}, {"type": "object", "properties": {"a": {}}}]
            }}
        });
        assert_eq!(unknown_member(&alternatives, &json!({"v": "text"})), None);
        assert_eq!(unknown_member(&alternatives, &json!({"v": {"a": 1}})), None);
        assert_eq!(
            unknown_member(&alternatives, &json!({"v": {"b": 1}}))
                .unwrap()
                .path,
            "v.b"
        );
        // A reference that leads nowhere says nothing, as `true` does.
        let dangling = json!({"type": "object", "properties": {"d": {"$ref": "#/$defs/Gone"}}});
        assert_eq!(unknown_member(&dangling, &json!({"d": {"any": 1}})), None);
    }

    /// The one-pass text check decides the usual shapes (nested types, `Option<T>`,
    /// arrays, maps, flattened parts) and leaves the rest to the tree walk.
    #[test]
    fn the_text_check_decides_usual_shapes_and_defers_the_rest() {
        let members = Members::compile(&schema());
        for clean in [
            r#"{"cart": {"id": "c", "items": ["a"]}}"#,
            r#"{"maybe": {"id": "c"}, "tags": {"x": "y"}, "any": {"z": [1, {"q": 2}]}}"#,
            r#"{"maybe": null, "carts": [{"id": "a"}, {"items": []}]}"#,
            r#"{"flat": {"id": "c", "extra": 1}}"#,
            r#" {"c\u0061rt": {"\u0069d": "escaped names"}} "#,
        ] {
            assert!(members.text_is_clean(clean), "{clean}");
        }
        for unknown in [
            r#"{"cart": {"id": "c", "gift": true}}"#,
            r#"{"maybe": {"id": "c", "x": 1}}"#,
            r#"{"carts": [{"id": "a"}, {"x": 1}]}"#,
            r#"{"flat": {"other": 1}}"#,
            r#"{"nope": 1}"#,
            r#"{"cart": {"id": "c", "gift": true}, "cart": {"id": "c"}}"#,
        ] {
            assert!(!members.text_is_clean(unknown), "{unknown}");
        }
        // Not an object, not JSON, or more after it: the caller's parse says why.
        for refused in ["[]", "null", "7", "", "{", r#"{"cart": {}} {}"#] {
            assert!(!members.text_is_clean(refused), "{refused:?}");
        }
        // Two object alternatives: only trying each tells, which one pass cannot.
        let two = Members::compile(&json!({
            "type": "object",
            "properties": {"v": {"anyOf": [
                {"type": "object", "properties": {"a": {}}},
                {"type": "object", "properties": {"b": {}}}
            ]}}
        }));
        assert!(!two.text_is_clean(r#"{"v": {"b": 1}}"#));
        assert!(two.text_is_clean(r#"{"v": "a string is no object"}"#));
        assert_eq!(two.unknown_member(&json!({"v": {"b": 1}})), None);
    }

    #[test]
    fn a_map_s_values_are_checked_against_its_value_schema() {
        let s = schema();
        let members = Members::compile(&s);
        for clean in [
            json!({"byId": {"a": {"id": "c"}, "b": {"items": ["x"]}}}),
            json!({"deep": {"a": {"b": {"id": "c"}}}}),
            json!({"flatMap": {"id": "x", "k": {"id": "c"}}}),
            json!({"anyMap": {"a": {"anything": 1}}}),
            json!({"emptyMap": {"a": {"anything": 1}}}),
            json!({"byNumber": {"7": {"id": "c"}}}),
            json!({"maybeMap": {"a": {"id": "c"}}}),
            json!({"maybeMap": null}),
            json!({"tree": {"name": "r", "children": {"a": {"name": "a", "children": {"b": {"name": "b"}}}}}}),
        ] {
            assert_eq!(unknown_member(&s, &clean), None, "{clean}");
            // Decided in the one pass, not deferred to the walk.
            assert!(members.text_is_clean(&clean.to_string()), "{clean}");
        }
        for (args, path) in [
            (
                json!({"byId": {"a": {"id": "c"}, "b": {"id": "c", "gift": 1}}}),
                "byId.b.gift",
            ),
            (
                json!({"deep": {"a": {"b": {"id": "c", "gift": 1}}}}),
                "deep.a.b.gift",
            ),
            (
                json!({"flatMap": {"id": "x", "k": {"gift": 1}}}),
                "flatMap.k.gift",
            ),
            (
                json!({"byNumber": {"7": {"id": "c", "gift": 1}}}),
                "byNumber.7.gift",
            ),
            (json!({"maybeMap": {"a": {"gift": 1}}}), "maybeMap.a.gift"),
        ] {
            let found = unknown_member(&s, &args).expect("refused");
            assert_eq!(found.path, path);
            assert_eq!(found.expected, ["id", "items"]);
            assert!(!members.text_is_clean(&args.to_string()), "{args}");
        }
        // A recursive map: refused at any depth, through the cycle.
        let deep = json!({"tree": {"name": "r", "children": {"a": {"name": "a", "children": {"b": {"name": "b", "gift": 1}}}}}});
        let found = unknown_member(&s, &deep).expect("refused");
        assert_eq!(found.path, "tree.children.a.children.b.gift");
        let mut expected = found.expected;
        expected.sort();
        assert_eq!(expected, ["children", "name"]);
        assert!(!members.text_is_clean(&deep.to_string()));
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
