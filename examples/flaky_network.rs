//! An agent calls `create_order` over a network that loses answers after the order was
//! placed, and retries until it hears back. Every retry carries the same intent, so the
//! order is placed once per intent however many times the agent asks.
//!
//! Run: `cargo run --example flaky_network`

use std::sync::atomic::{AtomicUsize, Ordering};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tool_contracts::{mutating_tool, registry};

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Cart {
    pub id: String,
    pub items: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Order {
    pub order_id: usize,
    pub total_cents: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Contract(#[from] tool_contracts::Error),
}

/// Orders placed: the side effect we must not repeat.
static ORDERS_PLACED: AtomicUsize = AtomicUsize::new(0);

/// Place an order for the user's cart.
#[mutating_tool(idempotency_key_fields = [user_id, cart.id])]
pub async fn create_order(user_id: u64, cart: Cart, note: String) -> Result<Order, ShopError> {
    let _ = (user_id, note);
    let order_id = ORDERS_PLACED.fetch_add(1, Ordering::SeqCst) + 1;
    Ok(Order {
        order_id,
        total_cents: 1_250 * cart.items.len() as u64,
    })
}

/// A deterministic flaky network: loses the answer of the calls whose number is in `lost`.
struct FlakyNetwork {
    calls: usize,
    lost: &'static [usize],
}

impl FlakyNetwork {
    async fn call(
        &mut self,
        tool: &str,
        args: serde_json::Value,
    ) -> Option<tool_contracts::ToolOutput> {
        self.calls += 1;
        // The server runs the call either way; only the answer goes missing.
        let output = registry().call(tool, args).await;
        if self.lost.contains(&self.calls) {
            return None;
        }
        match output {
            Ok(output) => Some(output),
            Err(e) => {
                println!("    error: {e}");
                None
            }
        }
    }
}

#[tokio::main]
async fn main() {
    let mut network = FlakyNetwork {
        calls: 0,
        lost: &[1, 2, 4, 6, 7],
    };
    let intents = [
        (1u64, "cart-a", vec!["book"]),
        (1u64, "cart-b", vec!["pen", "ink"]),
        (2u64, "cart-a", vec!["lamp"]),
    ];
    let intent_count = intents.len();
    for (user_id, cart_id, items) in intents {
        println!("agent: user {user_id} orders {cart_id}");
        let args = json!({
            "user_id": user_id,
            "cart": { "id": cart_id, "items": items },
            "note": "leave at the door",
        });
        for attempt in 1.. {
            match network.call("create_order", args.clone()).await {
                None => println!(
                    "  attempt {attempt}: no answer (timeout); retrying with the same intent"
                ),
                Some(out) => {
                    let verdict = match out.outcome {
                        tool_contracts::Outcome::Replayed => "replayed",
                        _ => "ran",
                    };
                    let key = out.key.unwrap_or_default();
                    println!(
                        "  attempt {attempt}: {verdict}: order #{} (key {}…)",
                        out.value["order_id"],
                        key.get(..12).unwrap_or(&key)
                    );
                    break;
                }
            }
        }
    }
    let placed = ORDERS_PLACED.load(Ordering::SeqCst);
    println!(
        "side effects: {placed} orders placed for {intent_count} intents over {} calls",
        network.calls
    );
    if placed != intent_count {
        eprintln!("BUG: expected one order per intent");
        std::process::exit(1);
    }
}
