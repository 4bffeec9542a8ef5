use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
    #[error("timed out")]
    Timeout,
}

// The classifier takes the error by reference: `fn(&ShopError) -> bool`.
pub fn is_timeout(error: ShopError) -> bool {
    matches!(error, ShopError::Timeout)
}

#[mutating_tool(idempotency_key_fields = [order_id], unknown_outcome_if = is_timeout)]
pub async fn place_order(order_id: u64) -> Result<String, ShopError> {
    Ok(order_id.to_string())
}

fn main() {}
