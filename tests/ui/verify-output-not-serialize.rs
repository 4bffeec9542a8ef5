use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

pub struct Receipt {
    pub id: u64,
}

// The registry's reconcile entry stores `verify`'s result too: still one error
// per missing bound, on `Receipt`.
#[mutating_tool(idempotency_key_fields = [order_id], verify = order_was_placed)]
pub async fn place_order(order_id: u64) -> Result<Receipt, ShopError> {
    Ok(Receipt { id: order_id })
}

pub async fn order_was_placed(order_id: &u64) -> Result<Option<Receipt>, ShopError> {
    Ok(Some(Receipt { id: *order_id }))
}

fn main() {}
