use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

#[mutating_tool(idempotency_key_fields = [pair, pair.0])]
pub async fn create_order(pair: (u64, u64)) -> Result<u64, ShopError> {
    Ok(pair.1)
}

fn main() {}
