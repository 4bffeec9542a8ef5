use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

// `approval` is "required", "never" or a path to a policy function, not a flag.
#[mutating_tool(idempotency_key_fields = [order_id], approval = "yes")]
pub async fn refund(order_id: u64) -> Result<u64, ShopError> {
    Ok(order_id)
}

fn main() {}