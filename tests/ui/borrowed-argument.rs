use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

#[mutating_tool(idempotency_key_fields = [user_id])]
pub async fn create_order(
    user_id: u64,
    note: &str,
    tags: Option<&[String]>,
) -> Result<u64, ShopError> {
    let _ = (note, tags);
    Ok(user_id)
}

fn main() {}
