use tool_contracts::{mutating_tool, UndoContext};

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

pub struct Receipt {
    pub id: u64,
}

// The undo decodes the stored result as the tool's `T`: a `T` that is not
// `Serialize + DeserializeOwned` is still reported once per trait, at `T`.
#[mutating_tool(idempotency_key_fields = [user_id], compensate = cancel_order)]
pub async fn create_order(user_id: u64) -> Result<Receipt, ShopError> {
    Ok(Receipt { id: user_id })
}

pub async fn cancel_order(_user_id: &u64, _receipt: &Receipt, _cx: UndoContext) -> Result<(), ShopError> {
    Ok(())
}

fn main() {}
