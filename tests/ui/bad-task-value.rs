use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

// MCP's vocabulary (`taskSupport`): "forbidden", "optional" or "required", not a flag.
#[mutating_tool(idempotency_key_fields = [user_id], task = "yes")]
pub async fn create_order(user_id: u64) -> Result<u64, ShopError> {
    Ok(user_id)
}

fn main() {}
