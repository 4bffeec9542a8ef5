use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

#[mutating_tool(idempotency_key_fields = [user_idd, cart_id])]
pub async fn create_order(user_id: u64, cart_id: u64, note: String) -> Result<u64, ShopError> {
    let _ = (cart_id, note);
    Ok(user_id)
}

#[mutating_tool(idempotency_key_fields = [request])]
pub async fn refund(order_id: u64, amount: u64) -> Result<u64, ShopError> {
    Ok(order_id + amount)
}

fn main() {}
