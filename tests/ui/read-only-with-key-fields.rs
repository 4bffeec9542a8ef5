use tool_contracts::read_only_tool;

#[derive(Debug, thiserror::Error)]
#[error("lookup failed")]
pub struct LookupError;

#[read_only_tool(idempotency_key_fields = [order_id])]
pub async fn get_order(order_id: u64) -> Result<u64, LookupError> {
    Ok(order_id)
}

#[read_only_tool(ttl = "1h", open_world)]
pub async fn list_orders(user_id: u64) -> Result<Vec<u64>, LookupError> {
    Ok(vec![user_id])
}

fn main() {}
