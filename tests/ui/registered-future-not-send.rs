use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

async fn tick() {}

// The registry runs tools on any thread, so a registered tool's future must be `Send`.
#[mutating_tool(idempotency_key_fields = [user_id])]
pub async fn create_order(user_id: u64) -> Result<u64, ShopError> {
    let local = std::rc::Rc::new(user_id);
    tick().await;
    Ok(*local)
}

fn main() {}
