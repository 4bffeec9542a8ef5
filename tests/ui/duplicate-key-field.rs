use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

#[mutating_tool(idempotency_key_fields = [user_id, pair.0, user_id])]
pub async fn create_order(user_id: u64, pair: (u64, u64)) -> Result<u64, ShopError> {
    Ok(user_id + pair.1)
}

fn main() {}
