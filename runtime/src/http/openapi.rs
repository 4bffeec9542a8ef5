//! `GET /openapi.json`: an OpenAPI 3.1 document of the router's routes, built from the
//! tools' schemas.
//!
//! OpenAPI 3.1 schemas are JSON Schema 2020-12, which schemars writes, so a tool's schema
//! is used as it is, except for where its definitions live: schemars puts them under the
//! schema's own `$defs` and refers to them as `#/$defs/Name`, which means nothing at the
//! root of an OpenAPI document. Each definition is moved to `components/schemas` and every
//! `$ref` rewritten to point there; the tool's arguments and result become components of
//! their own (`create_order.arguments`, `create_order.result`), so a `$ref` to a schema's
//! root (`#`, a recursive type) resolves too. Two tools whose definitions share a name but
//! differ get distinct components (`Cart`, `Cart_2`); identical ones share one.

use serde_json::{json, Map, Value};

use super::encode_segment;
use super::headers::{ACCEPTED_BODIES, IDEMPOTENCY_KEY_FIELD};
use super::problem::{ProblemType, PROBLEM_JSON};
use crate::approval::Verdict;
use crate::registry::{Registry, ToolDescriptor};
use crate::spec::ApprovalRule;

/// [`OUTCOME_HEADER`](super::OUTCOME_HEADER) as the document names it.
const OUTCOME_NAME: &str = "Tool-Contracts-Outcome";

/// The OpenAPI version written.
pub(super) const OPENAPI_VERSION: &str = "3.1.0";

/// The document for `registry`, served under `server` (the path the router is mounted at,
/// `/` at the root), titled `title` at `version`.
pub(super) fn document(registry: &Registry, title: &str, version: &str, server: &str) -> Value {
    let mut components = Components::default();
    let mut paths = Map::new();
    for tool in registry.iter() {
        let path = format!("/tools/{}", encode_segment(tool.name()));
        paths.insert(
            path,
            json!({ "post": tool_operation(tool, &mut components) }),
        );
    }
    paths.insert("/operations/{key}".to_owned(), operation_path());
    paths.insert(
        "/operations/{key}/approve".to_owned(),
        decision_path(Verdict::Approved),
    );
    paths.insert(
        "/operations/{key}/deny".to_owned(),
        decision_path(Verdict::Denied),
    );
    paths.insert(
        "/tools".to_owned(),
        json!({"get": {
            "operationId": "listTools",
            "summary": "The tools, with their schemas and idempotency contracts",
            "description": "The same content as an MCP `tools/list` result: each tool's `inputSchema`, `outputSchema`, `annotations` and, under `_meta[\"dev.tool-contracts/idempotency\"]`, its idempotency contract.",
            "responses": {"200": {"description": "The tool list", "content": {"application/json": {"schema": {
                "type": "object",
                "properties": {"tools": {"type": "array", "items": {"type": "object"}}},
                "required": ["tools"]
            }}}}}
        }}),
    );
    paths.insert(
        "/openapi.json".to_owned(),
        json!({"get": {
            "operationId": "openApi",
            "summary": "This document",
            "responses": {"200": {"description": "OpenAPI 3.1", "content": {"application/json": {"schema": {"type": "object"}}}}}
        }}),
    );
    components
        .schemas
        .insert("Operation".to_owned(), operation_schema());
    components
        .schemas
        .insert("Problem".to_owned(), problem_schema());
    json!({
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": title,
            "version": version,
            "description": "Tools served with Post/Redirect/Get: `POST /tools/{name}` runs a tool once per intent and answers `303 See Other` to its operation, which `GET /operations/{key}` reads as often as needed without running anything again. A call that needs a person's approval answers `202 Accepted` with its operation, and runs once when someone approves it (`POST /operations/{key}/approve`). Errors are RFC 9457 problem details."
        },
        "servers": [{"url": server}],
        "paths": paths,
        "components": {
            "schemas": components.schemas,
            "parameters": parameters(),
            "responses": responses(),
        }
    })
}

/// The `post` of one tool.
fn tool_operation(tool: &ToolDescriptor, components: &mut Components) -> Value {
    let arguments = components.add(&format!("{}.arguments", tool.name()), tool.input_schema());
    let result = tool
        .output_schema()
        .map(|schema| components.add(&format!("{}.result", tool.name()), schema));
    let result_schema = match &result {
        Some(name) => json!({"$ref": format!("#/components/schemas/{name}")}),
        None => json!({}),
    };
    let body_schema = json!({"$ref": format!("#/components/schemas/{arguments}")});
    let summary = summary(tool.description());
    let mut operation = json!({
        "operationId": tool.name(),
        "summary": summary,
        "description": tool.description(),
        "requestBody": {
            "description": "The tool's arguments, as JSON or as an HTML form (dotted names for nested members, `cart.id`; values converted by the schema).",
            "required": false,
            "content": {
                "application/json": {"schema": body_schema.clone()},
                "application/x-www-form-urlencoded": {"schema": body_schema}
            }
        },
        "x-idempotency": tool.idempotency_meta(),
    });
    let problem = |status: &str| json!({"$ref": format!("#/components/responses/Problem{status}")});
    let representation = json!({"application/json": {"schema": result_schema}});
    let outcome_header = json!({"description": "How the call came by its result: `executed`, `replayed` (stored by an earlier call; nothing ran) or `reconciled` (an earlier call's effect, found by the tool's `verify`).", "schema": {"type": "string", "enum": ["executed", "replayed", "reconciled"]}});
    let responses = if tool.is_mutating() {
        operation["parameters"] = json!([
            {"$ref": "#/components/parameters/IdempotencyKey"},
            {"$ref": "#/components/parameters/Prefer"}
        ]);
        json!({
            "303": {
                "description": "The call ran (or an earlier call of the same intent had): read its operation at `Location`. The same for an execution and a replay.",
                "headers": {
                    "Location": {"description": "The operation: `{prefix}/operations/{key}`.", "schema": {"type": "string"}},
                    OUTCOME_NAME: outcome_header
                }
            },
            "200": {
                "description": "With `Prefer: return=representation`: the result itself (exactly what the operation holds).",
                "headers": {
                    "Content-Location": {"description": "The operation the result is stored in.", "schema": {"type": "string"}},
                    "Preference-Applied": {"schema": {"type": "string", "const": "return=representation"}},
                    OUTCOME_NAME: outcome_header
                },
                "content": representation
            },
            "400": problem("400"),
            "403": problem("403"),
            "409": problem("409"),
            "413": problem("413"),
            "415": problem("415"),
            "422": problem("422"),
            "500": problem("500"),
            "503": problem("503")
        })
    } else {
        json!({
            "200": {"description": "A read-only tool: its result, directly (it has no key and no operation).", "content": representation},
            "400": problem("400"),
            "403": problem("403"),
            "413": problem("413"),
            "415": problem("415"),
            "422": problem("422"),
            "500": problem("500")
        })
    };
    let mut responses = responses;
    if tool.is_mutating() && tool.approval() != ApprovalRule::Never {
        responses["202"] = json!({
            "description": "The call needs a person's approval (`x-idempotency.approval`) and has none yet: nothing ran. The body is its operation (`state: awaiting_approval`); it runs once when someone approves it (`POST {Location}/approve`), and a retry of the same call then replays its result. A browser gets `303 See Other` to the operation page instead, where the decision is made. A denied call is `403` (`denied`).",
            "headers": {
                "Location": {"description": "The operation: `{prefix}/operations/{key}`.", "schema": {"type": "string"}},
                "Content-Location": {"description": "The same: the body is its representation.", "schema": {"type": "string"}}
            },
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Operation"}}}
        });
    }
    operation["responses"] = responses;
    operation
}

/// A tool's summary: the first sentence of its description's first paragraph (doc
/// comments wrap their lines, so the first line may end mid-sentence).
fn summary(description: &str) -> String {
    let paragraph = description
        .split("\n\n")
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    match paragraph.find(". ") {
        Some(end) => paragraph[..=end].to_owned(),
        None => paragraph,
    }
}

/// `GET /operations/{key}`.
fn operation_path() -> Value {
    let operation = json!({"$ref": "#/components/schemas/Operation"});
    let problem = json!({"$ref": "#/components/schemas/Problem"});
    let document = |description: &str| {
        json!({
            "description": description,
            "content": {
                "application/json": {"schema": operation},
                "text/html": {"schema": {"type": "string"}}
            }
        })
    };
    let mut accepted = document("In progress: read again after `Retry-After`. Or `awaiting_approval` (a person must decide: `POST …/approve` or `…/deny`), or `approved` and not run yet (its agent's retry runs it).");
    accepted["headers"] = json!({"Retry-After": {"description": "In progress: seconds until the running call's lease ends.", "schema": {"type": "integer", "minimum": 1}}});
    let mut unknown = document(
        "The outcome is unknown (`state: unknown`: the call stopped midway; its effect may or may not have happened), or the stored value does not decode (a problem).",
    );
    unknown["content"][PROBLEM_JSON] = json!({"schema": problem});
    json!({"get": {
        "operationId": "getOperation",
        "summary": "Read an operation by its key: never runs or repeats anything",
        "description": "The operation document of a call. Read in the caller's tenant scope: a key of another tenant is `404`, like a key never used. No `Idempotency-Key` is needed. HTML for `Accept: text/html`, JSON otherwise.",
        "parameters": [
            {"$ref": "#/components/parameters/OperationKey"},
            {"$ref": "#/components/parameters/History"}
        ],
        "responses": {
            "200": document("Completed: `result` is the stored result."),
            "202": accepted,
            "403": document("Denied (`state: denied`): `approval.decision` says who denied it, when, through which channel and why. Nothing ran; a retry of the call gets the denial."),
            "404": {"$ref": "#/components/responses/Problem404"},
            "422": document("Failed: `error` is the tool's stored error (`cache_errors`)."),
            "500": unknown,
            "503": {"$ref": "#/components/responses/Problem503"}
        }
    }})
}

/// `POST /operations/{key}/approve` or `/deny`.
fn decision_path(verdict: Verdict) -> Value {
    let (id, summary, description, reason) = match verdict {
        Verdict::Approved => (
            "approveOperation",
            "Approve a call awaiting approval: it runs, once",
            "Stores the approval (the first decision wins; the same one again answers it), then continues the call at once with the arguments its request stored, under its own key: it runs once, however many retries of it arrive meanwhile (a tool with `payloadMismatch: replay`, or one this server does not serve, is left to its agent's retry). Needs `HttpTools::with_approver` on the server; keeps the caller's tenant scope.",
            "Optional: why.",
        ),
        Verdict::Denied => (
            "denyOperation",
            "Deny a call awaiting approval: it never runs",
            "Stores the denial (the first decision wins): nothing runs, and every retry of the call gets `403` `denied` until the decision expires (the tool's `ttl`). Needs `HttpTools::with_approver` on the server; keeps the caller's tenant scope.",
            "Required: what the agent and its user are told.",
        ),
    };
    let body = json!({
        "type": "object",
        "properties": {
            "by": {"type": "string", "minLength": 1, "maxLength": 256, "description": "Who decides, when the server's approver function does not name them from the request's authentication (then `by` is ignored)."},
            "reason": {"type": "string", "maxLength": 1024, "description": reason}
        },
        "additionalProperties": false
    });
    let problem = |status: &str| json!({"$ref": format!("#/components/responses/Problem{status}")});
    json!({"post": {
        "operationId": id,
        "summary": summary,
        "description": description,
        "parameters": [{"$ref": "#/components/parameters/OperationKey"}],
        "requestBody": {
            "required": false,
            "content": {
                "application/json": {"schema": body.clone()},
                "application/x-www-form-urlencoded": {"schema": body}
            }
        },
        "responses": {
            "200": {
                "description": "Decided (now, or earlier the same way): the operation as it stands after the decision (`completed` with the result when the approved call ran, `denied`, …). A browser gets `303 See Other` to the operation page instead.",
                "headers": {
                    "Content-Location": {"description": "The operation.", "schema": {"type": "string"}},
                    OUTCOME_NAME: {"description": "After an approval that ran the call: how it came by its result.", "schema": {"type": "string", "enum": ["executed", "replayed", "reconciled"]}}
                },
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Operation"}}}
            },
            "303": {
                "description": "A browser: the operation page.",
                "headers": {"Location": {"schema": {"type": "string"}}}
            },
            "400": problem("400"),
            "403": problem("403"),
            "404": problem("404"),
            "409": problem("409"),
            "415": problem("415"),
            "500": problem("500"),
            "503": problem("503")
        }
    }})
}

fn parameters() -> Value {
    json!({
        "IdempotencyKey": {
            "name": IDEMPOTENCY_KEY_FIELD,
            "in": "header",
            "required": false,
            "description": "The client's own intent key (1 to 255 characters, bare or as a Structured Field String). It narrows the call's identity (a scope `client:<key>`): the same key and arguments replay, another key is a new call. Never needed to read an operation.",
            "schema": {"type": "string", "minLength": 1}
        },
        "Prefer": {
            "name": "Prefer",
            "in": "header",
            "required": false,
            "description": "`return=representation`: answer `200` with the result instead of `303`.",
            "schema": {"type": "string"}
        },
        "OperationKey": {
            "name": "key",
            "in": "path",
            "required": true,
            "description": "The operation's idempotency key, from a `Location` or `Content-Location`.",
            "schema": {"type": "string"}
        },
        "History": {
            "name": "history",
            "in": "query",
            "required": false,
            "description": "`true` adds the key's history (claims, takeovers, completion).",
            "schema": {"type": "boolean"}
        }
    })
}

/// One response per problem status, so routes refer to them by status.
fn responses() -> Value {
    let mut responses = Map::new();
    let mut statuses: Vec<u16> = ProblemType::ALL
        .iter()
        .map(|t| t.status().as_u16())
        .collect();
    statuses.sort_unstable();
    statuses.dedup();
    for status in statuses {
        let types: Vec<String> = ProblemType::ALL
            .iter()
            .filter(|t| t.status().as_u16() == status)
            .map(|t| format!("`{}`", t.code()))
            .collect();
        let mut response = json!({
            "description": format!("A problem: {}.", types.join(", ")),
            "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}
        });
        match status {
            409 => {
                response["headers"] =
                    json!({"Retry-After": {"schema": {"type": "integer", "minimum": 1}}});
            }
            405 => {
                response["headers"] = json!({"Allow": {"schema": {"type": "string"}}});
            }
            415 => {
                response["headers"] = json!({"Accept-Post": {"schema": {"type": "string", "const": ACCEPTED_BODIES}}});
            }
            _ => {}
        }
        responses.insert(format!("Problem{status}"), response);
    }
    Value::Object(responses)
}

/// The operation document's schema (`Operation`'s serialization, `operation.rs`).
fn operation_schema() -> Value {
    let time = json!({"type": "string", "format": "date-time"});
    json!({
        "type": "object",
        "description": "What became of a call: the same document on every surface (Rust `operation(key)`, MCP `resources/read`, HTTP).",
        "properties": {
            "key": {"type": "string"},
            "tool": {"type": "string"},
            "version": {"type": ["integer", "null"], "minimum": 0},
            "state": {"type": "string", "enum": [
                "in_progress", "completed", "failed", "unknown", "compensating", "compensated",
                "needs_intervention", "awaiting_approval", "approved", "denied"
            ]},
            "result": {"description": "The stored result, exactly what a replay returns (when `completed`)."},
            "error": {"description": "The stored error (when `failed`)."},
            "created_at": time,
            "updated_at": time,
            "expires_at": time,
            "lease_remaining_ms": {"type": "integer", "minimum": 0},
            "approval": {
                "type": "object",
                "description": "For a call that asked for a person's approval: where it stands and, once decided, the decision.",
                "properties": {
                    "state": {"type": "string", "enum": ["pending", "approved", "denied", "expired"]},
                    "requested_at": time,
                    "expires_at": time,
                    "decision": {
                        "type": "object",
                        "properties": {
                            "verdict": {"type": "string", "enum": ["approved", "denied"]},
                            "by": {"type": "string"},
                            "channel": {"type": "string", "description": "`http`, `cli`, `rust`, `mcp-elicitation`, or a channel of the application's own."},
                            "at": time,
                            "reason": {"type": "string"}
                        },
                        "required": ["verdict", "by", "channel", "at"]
                    }
                },
                "required": ["state", "requested_at", "expires_at"]
            },
            "history": {"type": "array", "items": {
                "type": "object",
                "properties": {
                    "at": time,
                    "kind": {"type": "string"},
                    "token": {"type": "integer", "minimum": 0},
                    "worker": {"type": "string"}
                },
                "required": ["at", "kind", "token", "worker"]
            }}
        },
        "required": ["key", "tool", "version", "state", "created_at", "updated_at", "expires_at"]
    })
}

/// An RFC 9457 problem document with this router's extension members.
fn problem_schema() -> Value {
    json!({
        "type": "object",
        "description": "RFC 9457 problem details.",
        "properties": {
            "type": {"type": "string", "format": "uri-reference"},
            "status": {"type": "integer"},
            "title": {"type": "string"},
            "detail": {"type": "string"},
            "code": {"type": "string", "description": "The short name of the problem (`key_reused`)."},
            "tool": {"type": "string"},
            "key": {"type": "string", "description": "The idempotency key concerned."},
            "operation": {"type": "string", "description": "Where the call's operation can be read."},
            "field": {"type": "string", "description": "The offending argument's dotted path."},
            "params": {"type": "array", "items": {"type": "string"}},
            "key_fields": {"type": "array", "items": {"type": "string"}},
            "suggestion": {"type": "string"},
            "lease_remaining_ms": {"type": "integer", "minimum": 0},
            "by": {"type": "string", "description": "Who denied the call (`denied`)."},
            "channel": {"type": "string", "description": "Through which channel it was denied."},
            "decided_at": {"type": "string", "format": "date-time"},
            "reason": {"type": "string", "description": "Why it was denied."}
        },
        "required": ["type", "status", "title"]
    })
}

/// `components/schemas`, filled tool by tool.
#[derive(Default)]
pub(super) struct Components {
    schemas: Map<String, Value>,
}

impl Components {
    /// The schemas so far.
    #[cfg(test)]
    pub(super) fn schemas(&self) -> &Map<String, Value> {
        &self.schemas
    }

    /// Adds `schema` (a schemars root, with its `$defs`) as the component `name` (made
    /// unique), its definitions as components of their own; returns the name used.
    pub(super) fn add(&mut self, name: &str, mut schema: Value) -> String {
        let defs = match &mut schema {
            Value::Object(root) => {
                root.remove("$schema");
                match root.remove("$defs") {
                    Some(Value::Object(defs)) => defs,
                    _ => Map::new(),
                }
            }
            _ => Map::new(),
        };
        let root_name = self.unique(&sanitize(name));
        let mut names: Vec<(String, String)> =
            defs.keys().map(|d| (d.clone(), sanitize(d))).collect();
        // A definition keeps its name unless another component holds a different schema
        // under it, or another definition of this schema took it; renaming one changes the
        // `$ref`s of the others, so go round until nothing changes (a few rounds at most:
        // names only grow).
        for _ in 0..=names.len() {
            let mut changed = false;
            for i in 0..names.len() {
                if self.fits(&defs, &names, i, &names[i].1, &root_name) {
                    continue;
                }
                let base = sanitize(&names[i].0);
                if let Some(free) = (2..)
                    .map(|n| format!("{base}_{n}"))
                    .find(|c| self.fits(&defs, &names, i, c, &root_name))
                {
                    names[i].1 = free;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        for (def, component) in &names {
            if let Some(def_schema) = defs.get(def) {
                let mut def_schema = def_schema.clone();
                rewrite_refs(&mut def_schema, &root_name, &names);
                self.schemas.entry(component.clone()).or_insert(def_schema);
            }
        }
        rewrite_refs(&mut schema, &root_name, &names);
        self.schemas.insert(root_name.clone(), schema);
        root_name
    }

    /// Whether definition `i` may be the component `candidate`: no other definition of
    /// this schema has that name, and no component holds another schema under it.
    fn fits(
        &self,
        defs: &Map<String, Value>,
        names: &[(String, String)],
        i: usize,
        candidate: &str,
        root: &str,
    ) -> bool {
        if candidate == root
            || names
                .iter()
                .enumerate()
                .any(|(j, (_, c))| j != i && c == candidate)
        {
            return false;
        }
        let Some(existing) = self.schemas.get(candidate) else {
            return true;
        };
        let mut trial = names.to_vec();
        trial[i].1 = candidate.to_owned();
        let mut mine = defs.get(&names[i].0).cloned().unwrap_or(Value::Null);
        rewrite_refs(&mut mine, root, &trial);
        *existing == mine
    }

    /// `name`, or `name_2`, `name_3`, … if a component already has it.
    fn unique(&self, name: &str) -> String {
        if !self.schemas.contains_key(name) {
            return name.to_owned();
        }
        (2..)
            .map(|n| format!("{name}_{n}"))
            .find(|candidate| !self.schemas.contains_key(candidate))
            .unwrap_or_else(|| name.to_owned())
    }
}

/// Rewrites every `$ref` of a schema moved into `components/schemas` as `root`, whose
/// definitions became the components `names` (definition name, component name).
fn rewrite_refs(schema: &mut Value, root: &str, names: &[(String, String)]) {
    match schema {
        Value::Object(obj) => {
            for (member, value) in obj.iter_mut() {
                match (member.as_str(), value) {
                    ("$ref", Value::String(reference)) => {
                        if let Some(new) = rewritten(reference, root, names) {
                            *reference = new;
                        }
                    }
                    // Values, not schemas: a `$ref` inside them is data.
                    ("enum" | "const" | "default" | "examples" | "example", _) => {}
                    (_, value) => rewrite_refs(value, root, names),
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                rewrite_refs(item, root, names);
            }
        }
        _ => {}
    }
}

/// Where a local `$ref` points once moved; `None` for one that leaves the document.
fn rewritten(reference: &str, root: &str, names: &[(String, String)]) -> Option<String> {
    let pointer = reference.strip_prefix('#')?;
    if let Some(rest) = pointer.strip_prefix("/$defs/") {
        let (def, tail) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        // JSON Pointer escapes (`~1` is `/`, `~0` is `~`), then the definition's component.
        let def = def.replace("~1", "/").replace("~0", "~");
        let component = names
            .iter()
            .find(|(d, _)| *d == def)
            .map_or_else(|| sanitize(&def), |(_, c)| c.clone());
        return Some(format!("#/components/schemas/{component}{tail}"));
    }
    Some(format!("#/components/schemas/{root}{pointer}"))
}

/// A component name OpenAPI accepts (`^[a-zA-Z0-9._-]+$`): other characters become `_`.
fn sanitize(name: &str) -> String {
    let clean: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean.is_empty() {
        "_".to_owned()
    } else {
        clean
    }
}
