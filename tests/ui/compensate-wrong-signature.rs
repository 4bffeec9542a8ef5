use tool_contracts::{mutating_tool, UndoContext};

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

// The undo takes the tool's parameters and its result by reference, then the context:
// `&u64`, `&String`, `&u64`, `UndoContext`.
#[mutating_tool(idempotency_key_fields = [order_id], compensate = cancel_order)]
pub async fn place_order(order_id: u64, note: String) -> Result<u64, ShopError> {
    let _ = note;
    Ok(order_id)
}

pub async fn cancel_order(order_id: u64, note: String, placed: u64, _cx: UndoContext) -> Result<(), ShopError> {
    let _ = (order_id, note, placed);
    Ok(())
}

fn main() {}
