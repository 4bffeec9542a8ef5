use tool_contracts::{mutating_tool, UndoContext};

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

#[derive(Debug)]
pub struct RefundFailed;

// An undo's error is stored as its message: it must be `Display`.
#[mutating_tool(idempotency_key_fields = [order_id], compensate = cancel_order)]
pub async fn place_order(order_id: u64) -> Result<u64, ShopError> {
    Ok(order_id)
}

pub async fn cancel_order(_order_id: &u64, _placed: &u64, _cx: UndoContext) -> Result<(), RefundFailed> {
    Err(RefundFailed)
}

fn main() {}
