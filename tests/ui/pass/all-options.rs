//! Every option of `#[mutating_tool]`, and how each reaches the descriptor.
#![deny(warnings)]

use std::time::Duration;

use tool_contracts::{mutating_tool, Concurrent, Mismatch, OnUnknown};

#[derive(Debug, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum ShopError {
    #[error("contract: {0}")]
    Tool(String),
    #[error("declined")]
    Declined,
}

impl From<tool_contracts::Error> for ShopError {
    fn from(e: tool_contracts::Error) -> Self {
        ShopError::Tool(e.to_string())
    }
}

/// Not this text: the attribute's description wins.
#[mutating_tool(
    idempotency_key_fields = [payment_id],
    name = "payments.charge-v2",
    description = "Charge a card once.",
    version = 3,
    ttl = "7d",
    lease = "1m30s",
    concurrent = "reject",
    payload_mismatch = "replay",
    on_unknown = "rerun",
    cache_errors = true,
    destructive,
    open_world = true,
)]
pub async fn charge(payment_id: String, cents: u64) -> Result<u64, ShopError> {
    if cents == 0 {
        return Err(ShopError::Declined);
    }
    Ok(cents)
}

#[mutating_tool(idempotency_key_fields = [id], ttl = "500ms", lease = "1h30m", max_wait = "2m", destructive = false, open_world = false)]
pub async fn small(id: u64) -> Result<u64, ShopError> {
    Ok(id)
}

fn main() {
    let registry = tool_contracts::registry();
    let tool = registry.get("payments.charge-v2").expect("renamed");
    assert_eq!(tool.description(), "Charge a card once.");
    assert_eq!(tool.version(), 3);
    assert_eq!(tool.ttl(), Duration::from_secs(7 * 24 * 3600));
    assert_eq!(tool.lease(), Duration::from_secs(90));
    assert_eq!(tool.concurrent(), Concurrent::Reject);
    assert_eq!(tool.payload_mismatch(), Mismatch::Replay);
    assert_eq!(tool.on_unknown(), OnUnknown::Rerun);
    assert!(tool.cache_errors());
    assert_eq!(tool.annotations()["destructiveHint"], true);
    assert_eq!(tool.annotations()["openWorldHint"], true);
    assert_eq!(tool.params(), ["payment_id", "cents"]);

    let small = registry.get("small").unwrap();
    assert_eq!(small.version(), 1);
    assert_eq!(small.ttl(), Duration::from_millis(500));
    assert_eq!(small.lease(), Duration::from_secs(5400));
    assert_eq!(small.max_wait(), Duration::from_secs(120));
    assert_eq!(tool.max_wait(), Duration::from_secs(30), "the default");
    assert_eq!(small.concurrent(), Concurrent::Wait);
    assert_eq!(small.payload_mismatch(), Mismatch::Reject);
    assert_eq!(small.on_unknown(), OnUnknown::Fail);
    assert!(!small.cache_errors());
    assert_eq!(small.annotations()["destructiveHint"], false);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        assert_eq!(charge("p1".into(), 5).await.unwrap(), 5);
        // cache_errors: the error is stored and replayed.
        assert!(matches!(
            charge("p2".into(), 0).await,
            Err(ShopError::Declined)
        ));
        assert!(matches!(
            charge("p2".into(), 0).await,
            Err(ShopError::Declined)
        ));
    });
}
