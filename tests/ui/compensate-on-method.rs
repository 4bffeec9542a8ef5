use tool_contracts::{mutating_tool, UndoContext};

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

pub struct Shop;

impl Shop {
    // The undo runs when a run is compensated, from the arguments the store kept: there is
    // no `self` then.
    #[mutating_tool(idempotency_key_fields = [order_id], compensate = cancel_order)]
    pub async fn place_order(&self, order_id: u64) -> Result<u64, ShopError> {
        Ok(order_id)
    }
}

pub async fn cancel_order(_order_id: &u64, _placed: &u64, _cx: UndoContext) -> Result<(), ShopError> {
    Ok(())
}

fn main() {}
