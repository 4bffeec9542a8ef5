use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

#[mutating_tool(idempotency_key_fields = [user_id], ttl = "1 hour", lease = "0s")]
pub async fn create_order(user_id: u64) -> Result<u64, ShopError> {
    Ok(user_id)
}

#[mutating_tool(idempotency_key_fields = [order_id], ttl = "30m1h")]
pub async fn refund(order_id: u64) -> Result<u64, ShopError> {
    Ok(order_id)
}

fn main() {}
