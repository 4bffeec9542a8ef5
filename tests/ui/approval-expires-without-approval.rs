use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

// `approval_expires` without anything that asks for approval.
#[mutating_tool(idempotency_key_fields = [order_id], approval_expires = "1h")]
pub async fn refund(order_id: u64) -> Result<u64, ShopError> {
    Ok(order_id)
}

fn main() {}