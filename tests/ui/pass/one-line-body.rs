//! A one-line body is the user's own block: no lint may fire on it that would not fire
//! without the attribute (rustc's `unused_braces` once suggested deleting the function's
//! braces, and `cargo fix` broke the code).
#![deny(warnings)]

use tool_contracts::{mutating_tool, read_only_tool};

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

/// Echo the user id, once per user.
#[mutating_tool(idempotency_key_fields = [user_id])]
pub async fn echo(user_id: u64) -> Result<u64, ShopError> { Ok(user_id) }

/// Read the user id back.
#[read_only_tool]
pub async fn read_back(user_id: u64) -> Result<u64, ShopError> { Ok(user_id) }

fn main() {
    let _ = (echo, read_back);
}
