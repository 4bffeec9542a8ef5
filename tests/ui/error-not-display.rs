use tool_contracts::mutating_tool;

/// A registered tool's error reaches the agent through `Display`.
#[derive(Debug)]
pub enum ShopError {
    Tool(tool_contracts::Error),
}

impl From<tool_contracts::Error> for ShopError {
    fn from(e: tool_contracts::Error) -> Self {
        ShopError::Tool(e)
    }
}

#[mutating_tool(idempotency_key_fields = [user_id])]
pub async fn create_order(user_id: u64) -> Result<u64, ShopError> {
    Ok(user_id)
}

fn main() {}
