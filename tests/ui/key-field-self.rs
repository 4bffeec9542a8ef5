use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

pub struct Shop {
    pub id: u64,
}

impl Shop {
    #[mutating_tool(idempotency_key_fields = [self.id, order_id])]
    pub async fn refund(&self, order_id: u64) -> Result<u64, ShopError> {
        Ok(self.id + order_id)
    }
}

fn main() {}
