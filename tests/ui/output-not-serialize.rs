use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

pub struct Receipt {
    pub id: u64,
}

#[mutating_tool(idempotency_key_fields = [user_id])]
pub async fn create_order(user_id: u64) -> Result<Receipt, ShopError> {
    Ok(Receipt { id: user_id })
}

fn main() {}
