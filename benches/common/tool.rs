//! The tool every store bench calls: `create_order`, keyed by `user_id` and `cart.id`,
//! with a small result.

use std::hint::black_box;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tool_contracts::mutating_tool;

/// A cart, as an agent sends it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub struct Cart {
    /// Cart id: part of the intent.
    pub id: String,
    /// Items.
    pub items: Vec<String>,
}

/// The (small) result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Order {
    /// Order number.
    pub order_id: u64,
    /// Cart it was made from.
    pub cart_id: String,
    /// Total.
    pub total_cents: u64,
}

/// The tool's error type.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A contract failure.
    #[error(transparent)]
    Contract(#[from] tool_contracts::Error),
}

/// A registry call's JSON arguments (`Registry::call_json`), as every text variant of
/// `dedup_path` and `replay_profile` sends them.
pub const ARGS_TEXT: &str = r#"{"user_id":7,"cart":{"id":"c-42","items":["book"]},"note":"gift"}"#;

/// [`ARGS_TEXT`] with one leading space, and with one trailing space: two other texts of
/// the same call, which `dedup_path` sends in turn so that a thread never keeps either
/// derived (`runtime/src/derived.rs` keeps arguments on their second derivation in a row).
pub const ARGS_TEXTS_SPACED: [&str; 2] = [
    r#" {"user_id":7,"cart":{"id":"c-42","items":["book"]},"note":"gift"}"#,
    r#"{"user_id":7,"cart":{"id":"c-42","items":["book"]},"note":"gift"} "#,
];

/// `create_order`'s arguments decoded by `serde_json` alone (its derive, unknown fields
/// refused, no members check): the floor of any registry that decodes JSON text with
/// `serde_json` before a direct call, measured beside ours.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlainArgs {
    /// The user.
    pub user_id: u64,
    /// The cart.
    pub cart: Cart,
    /// The note.
    pub note: String,
}

/// The cart every call sends.
pub fn cart(id: &str) -> Cart {
    Cart {
        id: id.to_owned(),
        items: vec!["book".to_owned()],
    }
}

/// What the tool does, shared with the bare and memoized variants `dedup_path` compares.
pub fn body(user_id: u64, cart: Cart) -> Order {
    Order {
        order_id: user_id * 10 + 1,
        cart_id: cart.id,
        total_cents: 4999,
    }
}

/// Place an order (deduplicated).
#[mutating_tool(idempotency_key_fields = [user_id, cart.id])]
pub async fn create_order(user_id: u64, cart: Cart, note: String) -> Result<Order, BenchError> {
    let _ = note;
    Ok(body(user_id, cart))
}

/// One call of the tool for `user_id`, in the ambient store; panics on a contract error.
pub async fn call(user_id: u64) {
    let out = create_order(user_id, cart("c-42"), "gift".into()).await;
    black_box(out.expect("tool call"));
}
