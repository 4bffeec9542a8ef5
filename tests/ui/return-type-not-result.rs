use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

#[mutating_tool(idempotency_key_fields = [user_id])]
pub async fn create_order(user_id: u64) -> u64 {
    user_id
}

#[mutating_tool(idempotency_key_fields = [user_id])]
pub async fn cancel_order(user_id: u64) {
    let _ = user_id;
}

fn main() {}
