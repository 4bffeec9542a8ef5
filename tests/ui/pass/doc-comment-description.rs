//! The description defaults to the doc comment: each line loses one leading
//! space, lines are joined with `\n`, the whole is trimmed.
#![deny(warnings)]

use tool_contracts::{mutating_tool, read_only_tool};

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

/// Place an order for the user's cart.
///
/// Safe to retry:   the same `user_id` replays.
#[mutating_tool(idempotency_key_fields = [user_id])]
pub async fn create_order(user_id: u64) -> Result<u64, ShopError> {
    Ok(user_id)
}

#[read_only_tool]
pub async fn undocumented() -> Result<u64, ShopError> {
    Ok(1)
}

fn main() {
    let registry = tool_contracts::registry();
    assert_eq!(
        registry.get("create_order").unwrap().description(),
        "Place an order for the user's cart.\n\nSafe to retry:   the same `user_id` replays."
    );
    assert_eq!(registry.get("undocumented").unwrap().description(), "");
}
