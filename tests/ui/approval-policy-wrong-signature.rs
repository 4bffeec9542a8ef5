use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

// A policy receives the parameters by reference and answers `bool`, synchronously.
#[mutating_tool(idempotency_key_fields = [order_id], approval = above_limit)]
pub async fn refund(order_id: u64, amount_cents: u64) -> Result<u64, ShopError> {
    Ok(order_id + amount_cents)
}

pub fn above_limit(amount_cents: u64) -> bool {
    amount_cents > 1000
}

fn main() {}