//! One mutating tool, called twice with the same intent: the second call is a replay.
//! (bench/first_run.sh builds this crate cold; it runs it once to check it works.)

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tool_contracts::{mutating_tool, with_store, MemoryStore};

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Cart {
    pub id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Order {
    pub order_id: u64,
}

/// The tool's error: the library's error converts into it (written by hand, so the crate
/// needs no error-derive crate beyond what the library brings).
#[derive(Debug)]
pub struct ShopError(tool_contracts::Error);

impl std::fmt::Display for ShopError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for ShopError {}

impl From<tool_contracts::Error> for ShopError {
    fn from(e: tool_contracts::Error) -> Self {
        ShopError(e)
    }
}

/// Place an order for the user's cart.
#[mutating_tool(idempotency_key_fields = [user_id, cart.id])]
pub async fn create_order(user_id: u64, cart: Cart, note: String) -> Result<Order, ShopError> {
    let _ = (cart, note);
    Ok(Order {
        order_id: user_id * 10 + 1,
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), ShopError> {
    let cart = Cart { id: "c-42".into() };
    let (first, again) = with_store(MemoryStore::new(), async {
        let first = create_order(7, cart.clone(), "gift".into()).await?;
        let again = create_order(7, cart.clone(), "gift".into()).await?;
        Ok::<_, ShopError>((first, again))
    })
    .await?;
    println!(
        "first: order {}, again: order {}",
        first.order_id, again.order_id
    );
    Ok(())
}
