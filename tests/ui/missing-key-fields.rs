use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

#[mutating_tool]
pub async fn create_order(user_id: u64, note: String) -> Result<u64, ShopError> {
    let _ = note;
    Ok(user_id)
}

#[mutating_tool(name = "refund")]
pub async fn refund(order_id: u64) -> Result<u64, ShopError> {
    Ok(order_id)
}

fn main() {}
