use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

#[mutating_tool(idempotency_key_fields = [user_id])]
pub fn create_order(user_id: u64) -> Result<u64, ShopError> {
    Ok(user_id)
}

fn main() {}
