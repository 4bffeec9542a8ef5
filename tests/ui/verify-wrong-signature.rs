use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

// `verify` takes the tool's parameters by reference: `&u64`, `&String`.
#[mutating_tool(idempotency_key_fields = [order_id], verify = order_was_placed)]
pub async fn place_order(order_id: u64, note: String) -> Result<String, ShopError> {
    Ok(format!("{order_id}: {note}"))
}

pub async fn order_was_placed(order_id: u64, note: String) -> Result<Option<String>, ShopError> {
    Ok(Some(format!("{order_id}: {note}")))
}

fn main() {}
