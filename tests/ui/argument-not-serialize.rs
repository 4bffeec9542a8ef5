use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

pub struct Opaque;

pub struct Shop;

impl Shop {
    #[mutating_tool(idempotency_key_fields = [order_id])]
    pub async fn refund(&self, order_id: u64, reason: Opaque) -> Result<u64, ShopError> {
        let _ = reason;
        Ok(order_id)
    }
}

fn main() {}
