//! Key field paths are JSON paths: every key field a registry publishes (`keyFields` in
//! `tools/list`) names, in the JSON arguments a client sends, the value the key holds, so a
//! client that follows the published paths computes the key the server computes. Paths
//! that go through a `$ref`'d struct, a tuple or tuple struct index, a `Box`, and paths that
//! end at an `Option`, an enum or a struct with a `#[serde(rename)]` field (keyed whole,
//! under its JSON names) all resolve through the arguments' JSON Schema when the registry
//! is built. The refusal of a renamed path is in `tests/key_path_refused.rs` (a refused
//! registry would break this binary's).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tool_contracts::key::tool_key;
use tool_contracts::{mutating_tool, registry, with_scope, Error};

#[derive(Debug, thiserror::Error)]
pub enum ShipError {
    #[error(transparent)]
    Contract(#[from] Error),
}

/// A postal address; its JSON spells `post_code` as `postCode`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Address {
    /// Street and number.
    pub street: String,
    /// Postal code.
    #[serde(rename = "postCode")]
    pub post_code: String,
}

/// A parcel, with its address nested (a `$ref` to `$defs/Address` in the schema).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Parcel {
    /// The parcel's id.
    pub id: String,
    /// Where it goes.
    pub to: Address,
}

/// A tuple struct: an array in JSON, indexed like the tuple.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Slot(pub String, pub u32);

/// A gift note, optional as a whole and in part; renamed member inside.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Gift {
    /// Who it is for.
    #[serde(rename = "for")]
    pub recipient: String,
    /// An optional message.
    pub message: Option<String>,
}

/// Delivery speed: an enum, keyed whole.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub enum Speed {
    /// Days.
    Standard,
    /// Within hours.
    Express {
        /// How many.
        hours: u32,
    },
}

/// Ships a parcel; keyed on paths of every shape the schema check resolves.
// One parameter per path shape, so one tool shows them all.
#[allow(clippy::too_many_arguments)]
#[mutating_tool(idempotency_key_fields = [
    parcel.id, parcel.to, pair.1, slot.0, gift, speed, boxed.to.street,
    r#type, note
])]
pub async fn ship(
    parcel: Parcel,
    pair: (String, u32),
    slot: Slot,
    gift: Option<Gift>,
    speed: Speed,
    boxed: Box<Parcel>,
    r#type: String,
    note: Option<String>,
) -> Result<String, ShipError> {
    let _ = (pair, slot, gift, speed, boxed, r#type, note);
    Ok(parcel.id)
}

/// The same key under a name of its own and a version: the tail the macro writes out.
#[mutating_tool(name = "ship.v2-express", version = 12, idempotency_key_fields = [parcel.id])]
pub async fn ship_express(parcel: Parcel) -> Result<String, ShipError> {
    Ok(parcel.id)
}

fn ship_args() -> Value {
    json!({
        "parcel": {"id": "p-1", "to": {"street": "Hauptstr. 1", "postCode": "10115"}},
        "pair": ["a", 7],
        "slot": ["morning", 2],
        "gift": {"for": "Ana", "message": "Happy birthday"},
        "speed": {"Express": {"hours": 4}},
        "boxed": {"id": "p-2", "to": {"street": "Ring 9", "postCode": "80331"}},
        "type": "fragile",
        "note": "leave at the door"
    })
}

/// Follows a published key field path in JSON arguments, as a client would: object members
/// by name, array elements by index.
fn follow<'a>(args: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(args, |v, segment| match v {
        Value::Array(items) => &items[segment.parse::<usize>().unwrap()],
        _ => &v[segment],
    })
}

/// The key a client computes from the published contract and the JSON it sends.
fn client_key(tool: &str, scope: Option<&str>, args: &Value) -> String {
    let descriptor = registry().get(tool).unwrap();
    let meta = descriptor.idempotency_meta();
    let paths: Vec<&str> = meta["keyFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    let fields: Vec<(&str, &Value)> = paths.iter().map(|p| (*p, follow(args, p))).collect();
    for (path, value) in &fields {
        assert!(!value.is_null(), "`{path}` is not in the arguments {args}");
    }
    let version = u32::try_from(meta["version"].as_u64().unwrap()).unwrap();
    tool_key(tool, version, scope, &fields).unwrap()
}

#[test]
fn the_registry_builds_and_publishes_the_paths_as_written() {
    let ship = registry().get("ship").expect("`ship` is registered");
    assert_eq!(
        ship.idempotency_meta()["keyFields"],
        // In key order (the JCS order of the names), as the attribute's paths.
        json!([
            "boxed.to.street",
            "gift",
            "note",
            "pair.1",
            "parcel.id",
            "parcel.to",
            "slot.0",
            "speed",
            "type"
        ])
    );
}

#[test]
fn the_key_of_a_call_is_the_key_of_the_values_at_the_published_json_paths() {
    let args = ship_args();
    let server = registry().get("ship").unwrap().key(&args).unwrap().unwrap();
    assert_eq!(server, client_key("ship", None, &args));

    // Another value at any one path is another key, found by the client too.
    for (path, other) in [
        ("/parcel/to/postCode", json!("10117")),
        ("/pair/1", json!(8)),
        ("/slot/0", json!("evening")),
        ("/gift/for", json!("Bo")),
        ("/speed", json!("Standard")),
        ("/boxed/to/street", json!("Ring 10")),
    ] {
        let mut changed = ship_args();
        *changed.pointer_mut(path).unwrap() = other;
        let key = registry()
            .get("ship")
            .unwrap()
            .key(&changed)
            .unwrap()
            .unwrap();
        assert_ne!(key, server, "{path}");
        assert_eq!(key, client_key("ship", None, &changed), "{path}");
    }
}

#[tokio::test]
async fn a_named_versioned_tool_s_key_is_the_client_s_too() {
    let args = json!({"parcel": {"id": "p-9", "to": {"street": "Ring 9", "postCode": "80331"}}});
    let express = registry().get("ship.v2-express").unwrap();
    assert_eq!(
        express.key(&args).unwrap().unwrap(),
        client_key("ship.v2-express", None, &args)
    );
    let scoped = with_scope("tenant-7", async { express.key(&args).unwrap().unwrap() }).await;
    assert_eq!(
        scoped,
        client_key("ship.v2-express", Some("tenant-7"), &args)
    );
}

#[tokio::test]
async fn a_scoped_key_is_the_key_of_the_same_values_with_the_scope() {
    let args = ship_args();
    let server = with_scope("tenant-7", async {
        registry().get("ship").unwrap().key(&args).unwrap().unwrap()
    })
    .await;
    assert_eq!(server, client_key("ship", Some("tenant-7"), &args));
    assert_ne!(server, client_key("ship", None, &args));
}

#[test]
fn a_keyed_object_counts_in_the_form_its_type_writes_back() {
    // `gift.message` omitted decodes as `None` and is keyed as `null`: the key is that of
    // the completed object, which is what a client must send (or key) to predict it.
    let mut omitted = ship_args();
    omitted["gift"] = json!({"for": "Ana"});
    let mut completed = ship_args();
    completed["gift"] = json!({"for": "Ana", "message": null});
    let ship = registry().get("ship").unwrap();
    let server = ship.key(&omitted).unwrap().unwrap();
    assert_eq!(server, ship.key(&completed).unwrap().unwrap());
    assert_eq!(server, client_key("ship", None, &completed));
    assert_ne!(server, client_key("ship", None, &omitted));
}
