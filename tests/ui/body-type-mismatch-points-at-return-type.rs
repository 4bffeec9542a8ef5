use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

#[mutating_tool(idempotency_key_fields = [user_id])]
pub async fn create_order(user_id: u64) -> Result<u64, ShopError> {
    if user_id == 0 {
        return Ok("zero");
    }
    Ok(user_id)
}

#[mutating_tool(idempotency_key_fields = [order_id])]
pub async fn refund(order_id: u64) -> Result<u64, ShopError> {
    order_id
}

fn main() {}
