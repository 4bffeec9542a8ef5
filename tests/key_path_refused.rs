//! A key field whose Rust path is not its JSON path is refused when the registry is built:
//! `tools/list` would publish a path no client can follow in the JSON it sends. serde's
//! `rename`, `rename_all` and `flatten`, and a newtype's `.0`, each make such a path. The
//! error names the tool, the path, the part that resolved, the JSON members found there,
//! and what to do. These tools break `registry()` for the whole binary, hence a binary of
//! their own (`tests/key_paths.rs` has the paths that resolve).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tool_contracts::__private::inventory;
use tool_contracts::{mutating_tool, try_registry, Error, Registry, ToolDescriptor};

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Contract(#[from] Error),
}

/// A cart whose id is `cartId` in JSON.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Cart {
    /// The cart's id.
    #[serde(rename = "cartId")]
    pub cart_id: String,
    /// Free text.
    pub note: String,
}

/// Every field camelCased in JSON.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Shipment {
    /// The carrier's tracking number.
    pub tracking_number: String,
}

/// Its members appear at the level of the struct that flattens it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Extra {
    /// A coupon.
    pub coupon: String,
}

/// Flattens `Extra`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Order {
    /// The order's id.
    pub id: String,
    /// Flattened.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A newtype: its JSON is the inner string, with no `0` in it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct OrderRef(pub String);

/// Keyed on a renamed field by its Rust name.
#[mutating_tool(idempotency_key_fields = [cart.cart_id])]
pub async fn renamed(cart: Cart) -> Result<String, ShopError> {
    Ok(cart.cart_id)
}

/// Keyed on a `rename_all`ed field by its Rust name.
#[mutating_tool(idempotency_key_fields = [shipment.tracking_number])]
pub async fn renamed_all(shipment: Shipment) -> Result<String, ShopError> {
    Ok(shipment.tracking_number)
}

/// Keyed through a flattened field.
#[mutating_tool(idempotency_key_fields = [order.extra.coupon])]
pub async fn flattened(order: Order) -> Result<String, ShopError> {
    Ok(order.extra.coupon)
}

/// Keyed on a newtype's inner value by index.
#[mutating_tool(idempotency_key_fields = [order.0])]
pub async fn newtype(order: OrderRef) -> Result<String, ShopError> {
    Ok(order.0)
}

/// Keyed on the parent of a renamed field: resolves.
#[mutating_tool(idempotency_key_fields = [cart])]
pub async fn parent(cart: Cart) -> Result<String, ShopError> {
    Ok(cart.note)
}

fn tool(name: &str) -> &'static ToolDescriptor {
    inventory::iter::<ToolDescriptor>
        .into_iter()
        .find(|t| t.name() == name)
        .unwrap_or_else(|| panic!("`{name}` is submitted"))
}

fn refusal(name: &str) -> Error {
    Registry::from_tools([tool(name)]).unwrap_err()
}

#[test]
fn a_renamed_field_named_by_its_rust_name_is_refused_naming_tool_path_stop_and_remedy() {
    let error = refusal("renamed");
    let Error::KeyFieldUnresolved {
        tool,
        path,
        resolved,
        reason,
    } = &error
    else {
        panic!("not KeyFieldUnresolved: {error:?}");
    };
    assert_eq!(tool, "renamed");
    assert_eq!(path, "cart.cart_id");
    assert_eq!(resolved, "cart");
    assert_eq!(
        reason,
        "`cart` has no member `cart_id` (its JSON members are `cartId`, `note`)"
    );
    assert_eq!(error.code(), "key_field_unresolved");
    assert_eq!(error.tool(), Some("renamed"));
    let message = error.to_string();
    for part in [
        "tool `renamed`",
        "key field `cart.cart_id` is not a path in the JSON arguments a client sends",
        "`cart` has no member `cart_id` (its JSON members are `cartId`, `note`)",
        "Key on the parent object instead (`cart`",
        "or drop the rename",
    ] {
        assert!(message.contains(part), "missing {part:?} in: {message}");
    }
}

#[test]
fn rename_all_flatten_and_a_newtype_index_are_refused_where_they_stop() {
    for (name, path, resolved, reason) in [
        (
            "renamed_all",
            "shipment.tracking_number",
            "shipment",
            "its JSON members are `trackingNumber`",
        ),
        (
            "flattened",
            "order.extra.coupon",
            "order",
            "its JSON members are `coupon`, `id`",
        ),
        (
            "newtype",
            "order.0",
            "order",
            "it is not an object or a tuple in JSON",
        ),
    ] {
        match refusal(name) {
            Error::KeyFieldUnresolved {
                tool,
                path: p,
                resolved: r,
                reason: why,
                ..
            } => {
                assert_eq!(
                    (tool.as_str(), p.as_str(), r.as_str()),
                    (name, path, resolved)
                );
                assert!(why.contains(reason), "{name}: {why}");
            }
            other => panic!("{name}: not KeyFieldUnresolved: {other:?}"),
        }
    }
}

#[test]
fn the_parent_of_a_renamed_field_resolves() {
    let registry = Registry::from_tools([tool("parent")]).unwrap();
    assert_eq!(registry.len(), 1);
}

#[test]
fn the_program_registry_is_refused_with_the_same_error() {
    let error = try_registry().unwrap_err();
    assert_eq!(error.code(), "key_field_unresolved", "{error}");
    // The first refused tool in name order.
    assert_eq!(error.tool(), Some("flattened"), "{error}");
}
