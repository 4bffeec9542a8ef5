//! A description kept in a file, `#[doc = include_str!(..)]`, is the tool's description
//! (as rmcp keeps it), alone or after literal doc lines.
use tool_contracts::{mutating_tool, registry};

#[derive(Debug, thiserror::Error)]
pub enum PayError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

#[doc = include_str!("doc-include-str.md")]
#[mutating_tool(idempotency_key_fields = [payment_id])]
pub async fn refund(payment_id: String) -> Result<String, PayError> {
    Ok(payment_id)
}

/// Charge a card once.
#[doc = include_str!("doc-include-str.md")]
#[mutating_tool(idempotency_key_fields = [payment_id])]
pub async fn charge(payment_id: String) -> Result<String, PayError> {
    Ok(payment_id)
}

fn main() {
    let file = include_str!("doc-include-str.md");
    assert_eq!(registry().get("refund").unwrap().description(), file);
    assert_eq!(
        registry().get("charge").unwrap().description(),
        format!("Charge a card once.\n{file}")
    );
}
