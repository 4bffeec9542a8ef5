use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

#[mutating_tool(idempotency_key_fields = [order_id], verify = order_was_placed)]
pub async fn place_order(order_id: u64) -> Result<String, ShopError> {
    Ok(order_id.to_string())
}

// `verify` is an `async fn`.
pub fn order_was_placed(order_id: &u64) -> Result<Option<String>, ShopError> {
    Ok(Some(order_id.to_string()))
}

fn main() {}
