use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

// Under `reject` a duplicate never waits: a bound on the wait means nothing.
#[mutating_tool(idempotency_key_fields = [order_id], concurrent = "reject", max_wait = "5s")]
pub async fn cancel_order(order_id: u64) -> Result<u64, ShopError> {
    Ok(order_id)
}

fn main() {}
