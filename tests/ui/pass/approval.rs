//! `approval` in its three forms, and a policy that reads the parameters by reference.
#![deny(warnings)]

use std::time::Duration;

use tool_contracts::{mutating_tool, registry, ApprovalRule};

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

#[derive(Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Refund {
    pub order_id: u64,
    pub cents: u64,
}

/// Above ten euros, a person approves.
pub fn above_ten_euros(request: &Refund, _note: &Option<String>) -> bool {
    request.cents > 1000
}

/// Refunds an order.
#[mutating_tool(idempotency_key_fields = [request.order_id], approval = above_ten_euros, approval_expires = "2h")]
pub async fn refund(request: Refund, note: Option<String>) -> Result<u64, ShopError> {
    let _ = note;
    Ok(request.cents)
}

/// Deletes an account.
#[mutating_tool(idempotency_key_fields = [account], approval = "required", destructive)]
pub async fn delete_account(account: String) -> Result<(), ShopError> {
    let _ = account;
    Ok(())
}

/// Destructive, and never asks whatever the process-wide policy says.
#[mutating_tool(idempotency_key_fields = [cache], approval = "never", destructive)]
pub async fn flush_cache(cache: String) -> Result<(), ShopError> {
    let _ = cache;
    Ok(())
}

fn main() {
    let tool = registry().get("refund").unwrap();
    assert_eq!(tool.approval(), ApprovalRule::Policy);
    assert_eq!(tool.approval_expires(), Duration::from_secs(7200));
    assert_eq!(registry().get("delete_account").unwrap().approval(), ApprovalRule::Required);
    assert_eq!(registry().get("flush_cache").unwrap().approval(), ApprovalRule::Never);
}
