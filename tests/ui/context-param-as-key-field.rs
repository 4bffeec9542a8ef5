use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

pub struct Db;

#[mutating_tool(idempotency_key_fields = [user_id, db])]
pub async fn create_order(user_id: u64, #[context] db: &Db) -> Result<u64, ShopError> {
    let _ = db;
    Ok(user_id)
}

fn main() {}
