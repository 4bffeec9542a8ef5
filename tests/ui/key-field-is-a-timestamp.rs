use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

use std::time::SystemTime;

#[mutating_tool(idempotency_key_fields = [user_id, created])]
pub async fn create_order(user_id: u64, created: SystemTime) -> Result<u64, ShopError> {
    let _ = created;
    Ok(user_id)
}

#[mutating_tool(idempotency_key_fields = [at])]
pub async fn schedule(at: Option<std::time::SystemTime>) -> Result<u64, ShopError> {
    Ok(at.is_some() as u64)
}

fn main() {}
