//! A parameter named like its tool: the registry's entry point still calls the tool.
#![deny(warnings)]

use tool_contracts::{mutating_tool, registry};

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

#[derive(Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Refund {
    pub order_id: u64,
}

/// Refunds an order.
#[mutating_tool(idempotency_key_fields = [refund.order_id])]
pub async fn refund(refund: Refund) -> Result<u64, ShopError> {
    Ok(refund.order_id)
}

fn main() {
    assert!(registry().get("refund").is_some());
}
