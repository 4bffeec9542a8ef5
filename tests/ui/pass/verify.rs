//! `verify` and `unknown_outcome_if`, alone and together, with `#[context]`
//! parameters (passed to `verify` by the same rule: `&T` as is, owned `T` as
//! `&T`), with `cache_errors`, and on a method (deduplicated, not registered:
//! `verify` gets the receiver first, so `Self::...` paths work).
#![deny(warnings)]

use std::sync::atomic::{AtomicUsize, Ordering};

use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum ShopError {
    #[error("contract: {0}")]
    Tool(String),
    #[error("timed out")]
    Timeout,
}

impl From<tool_contracts::Error> for ShopError {
    fn from(e: tool_contracts::Error) -> Self {
        ShopError::Tool(e.to_string())
    }
}

impl ShopError {
    pub fn is_timeout(&self) -> bool {
        matches!(self, ShopError::Timeout)
    }
}

pub struct Db {
    pub runs: AtomicUsize,
}

#[derive(Clone)]
pub struct Config {
    pub prefix: String,
}

mod checks {
    use super::{Config, Db, ShopError};

    pub async fn order_was_placed(
        user_id: &u64,
        note: &str,
        db: &Db,
        config: &Config,
    ) -> Result<Option<String>, ShopError> {
        let _ = (note, db);
        Ok(Some(format!("{}-{user_id}", config.prefix)))
    }
}

/// Places an order; asks the database whether an abandoned one went through.
#[mutating_tool(
    idempotency_key_fields = [user_id],
    verify = checks::order_was_placed,
    unknown_outcome_if = ShopError::is_timeout,
    cache_errors = true,
)]
pub async fn create_order(
    user_id: u64,
    note: String,
    #[context] db: &Db,
    #[context] config: Config,
) -> Result<String, ShopError> {
    db.runs.fetch_add(1, Ordering::SeqCst);
    if note.is_empty() {
        return Err(ShopError::Timeout);
    }
    Ok(format!("{}-{user_id}", config.prefix))
}

/// Only a classifier.
#[mutating_tool(idempotency_key_fields = [id], unknown_outcome_if = ShopError::is_timeout)]
pub async fn classified(id: u64) -> Result<u64, ShopError> {
    Ok(id)
}

pub struct Shop {
    pub refunds: AtomicUsize,
}

impl Shop {
    /// Refunds an order once.
    #[mutating_tool(idempotency_key_fields = [order_id], verify = Self::refund_went_through)]
    pub async fn refund(&self, order_id: u64, reason: &str) -> Result<u64, ShopError> {
        let _ = reason;
        self.refunds.fetch_add(1, Ordering::SeqCst);
        Ok(order_id)
    }

    async fn refund_went_through(
        &self,
        order_id: &u64,
        reason: &str,
    ) -> Result<Option<u64>, ShopError> {
        let _ = reason;
        Ok((self.refunds.load(Ordering::SeqCst) > 0).then_some(*order_id))
    }
}

fn main() {
    let registry = tool_contracts::registry()
        .with_context(Db {
            runs: AtomicUsize::new(0),
        })
        .with_context(Config {
            prefix: "order".into(),
        });
    assert!(registry.get("create_order").unwrap().has_verify());
    assert!(!registry.get("classified").unwrap().has_verify());
    assert_eq!(registry.len(), 2, "methods are not registered");

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let db = Db {
            runs: AtomicUsize::new(0),
        };
        let config = Config {
            prefix: "order".into(),
        };
        let first = create_order(7, "gift".into(), &db, config.clone()).await;
        assert_eq!(first.unwrap(), "order-7");
        let again = create_order(7, "gift".into(), &db, config.clone()).await;
        assert_eq!(again.unwrap(), "order-7");
        assert_eq!(db.runs.load(Ordering::SeqCst), 1);

        // A classified error abandons the key; the next call verifies.
        assert!(matches!(
            create_order(8, String::new(), &db, config.clone()).await,
            Err(ShopError::Timeout)
        ));
        let verified = create_order(8, String::new(), &db, config.clone()).await;
        assert_eq!(verified.unwrap(), "order-8");
        assert_eq!(db.runs.load(Ordering::SeqCst), 2);

        assert_eq!(classified(3).await.unwrap(), 3);

        let shop = Shop {
            refunds: AtomicUsize::new(0),
        };
        assert_eq!(shop.refund(5, "damaged").await.unwrap(), 5);
        assert_eq!(shop.refund(5, "damaged").await.unwrap(), 5);
        assert_eq!(shop.refunds.load(Ordering::SeqCst), 1);
    });
}
