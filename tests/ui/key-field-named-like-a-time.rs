use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

#[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Order {
    pub id: String,
    pub created_at: String,
}

// Names that say time or a per-attempt value: each retry would make a new key.
#[mutating_tool(idempotency_key_fields = [user_id, created_at_ms])]
pub async fn create_order(user_id: u64, created_at_ms: i64) -> Result<u64, ShopError> {
    let _ = created_at_ms;
    Ok(user_id)
}

#[mutating_tool(idempotency_key_fields = [order.created_at, request_nonce, attempt])]
pub async fn ship(order: Order, request_nonce: String, attempt: u32) -> Result<u32, ShopError> {
    let _ = (order, request_nonce);
    Ok(attempt)
}

// `#[intent]` where the name says nothing of time, and a marker that is not `#[intent]`.
#[mutating_tool(idempotency_key_fields = [#[intent] user_id])]
pub async fn refund(user_id: u64) -> Result<u64, ShopError> {
    Ok(user_id)
}

#[mutating_tool(idempotency_key_fields = [#[allow(time)] sent_at])]
pub async fn notify(sent_at: String) -> Result<u64, ShopError> {
    let _ = sent_at;
    Ok(1)
}

fn main() {}
