use tool_contracts::{mutating_tool, UndoContext};

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

// Every JSON parameter of the tool, then its result, then the context: `note` is missing.
#[mutating_tool(idempotency_key_fields = [order_id], compensate = cancel_order)]
pub async fn place_order(order_id: u64, note: String) -> Result<u64, ShopError> {
    let _ = note;
    Ok(order_id)
}

pub async fn cancel_order(order_id: &u64, placed: &u64, _cx: UndoContext) -> Result<(), ShopError> {
    let _ = (order_id, placed);
    Ok(())
}

fn main() {}
