//! One effect, run twice with the same intent: the second run is answered from the store.
//! (bench/first_run.sh builds this crate cold; it runs it once to check it works.)

use agent_effects::{EffectKind, EffectOutcome, Runtime};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Cart {
    pub id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Order {
    pub order_id: u64,
}

#[derive(Serialize)]
struct Args<'a> {
    user_id: u64,
    cart: &'a Cart,
    note: &'a str,
}

/// Place an order for the user's cart, keyed by `user_id` and `cart.id`.
async fn create_order(
    rt: &Runtime<agent_effects_memory::MemoryStore>,
    user_id: u64,
    cart: &Cart,
    note: &str,
) -> Result<u64, String> {
    let args = Args {
        user_id,
        cart,
        note,
    };
    let out = rt
        .effect("create_order", format!("{user_id}:{}", cart.id))
        .kind(EffectKind::IrreversibleWrite)
        .input(&args)
        .run(move |_ctx| async move {
            Ok(Order {
                order_id: user_id * 10 + 1,
            })
        })
        .await
        .map_err(|e| format!("agent-effects: {e:?}"))?;
    match out {
        EffectOutcome::Committed(order) => Ok(order.order_id),
        other => Err(format!("agent-effects: expected Committed, got {other:?}")),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), String> {
    let rt = Runtime::new(agent_effects_memory::MemoryStore::new());
    let cart = Cart { id: "c-42".into() };
    let first = create_order(&rt, 7, &cart, "gift").await?;
    let again = create_order(&rt, 7, &cart, "gift").await?;
    println!("first: order {first}, again: order {again}");
    Ok(())
}
