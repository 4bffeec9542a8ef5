use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

#[mutating_tool(idempotency_key_fields = [user_id])]
pub async fn create_order(user_id: u64) -> Result<u64, ShopError> {
    let _ = &__tc_call;
    let _ = __TC_SPEC.name;
    Ok(user_id)
}

fn main() {}
