#![deny(missing_docs, unused_variables, dead_code)]
//! Lints are never silenced on the user's code: the generated scaffolding
//! carries its own `#[allow]`s, the body carries none.

use tool_contracts::mutating_tool;

/// The error.
#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    /// From the runtime.
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

#[mutating_tool(idempotency_key_fields = [user_id])]
pub async fn create_order(user_id: u64) -> Result<u64, ShopError> {
    let unused = 5;
    fn helper() {}
    if user_id == 0 {
        return Ok(0);
    }
    Ok(user_id)
}

fn main() {}
