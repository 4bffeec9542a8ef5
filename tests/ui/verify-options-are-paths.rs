use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
    #[error("timed out")]
    Timeout,
}

#[mutating_tool(idempotency_key_fields = [order_id], verify = "order_was_placed", unknown_outcome_if = is_timeout(e))]
pub async fn place_order(order_id: u64) -> Result<String, ShopError> {
    Ok(order_id.to_string())
}

fn main() {}
