use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

#[mutating_tool(idempotency_key_fields = [user_id])]
pub async fn create_order<T: serde::Serialize>(user_id: u64, extra: T) -> Result<u64, ShopError> {
    let _ = serde_json::to_string(&extra);
    Ok(user_id)
}

#[mutating_tool(idempotency_key_fields = [user_id])]
pub async fn add_note(user_id: u64, note: impl Into<String>) -> Result<u64, ShopError> {
    let _: String = note.into();
    Ok(user_id)
}

fn main() {}
