//! Methods are deduplicated but not registered (a nested item cannot name
//! `Self`): `&self`, `&mut self`, generic methods and borrowed arguments.
#![deny(warnings)]

use std::sync::atomic::{AtomicUsize, Ordering};

use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

#[derive(serde::Serialize)]
pub struct Line<'a> {
    pub sku: &'a str,
}

pub struct Shop {
    pub runs: AtomicUsize,
    pub log: Vec<String>,
}

impl Shop {
    /// Refunds an order once.
    #[mutating_tool(idempotency_key_fields = [order_id])]
    pub async fn refund(&self, order_id: u64, amount: u64) -> Result<u64, ShopError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(order_id * 100 + amount)
    }

    #[mutating_tool(idempotency_key_fields = [entry], name = "shop.append")]
    pub async fn append(&mut self, entry: &str) -> Result<usize, ShopError> {
        self.log.push(entry.to_owned());
        Ok(self.log.len())
    }

    #[mutating_tool(idempotency_key_fields = [id, line.sku])]
    pub async fn tag<T: serde::Serialize + Send>(
        &self,
        id: u64,
        line: Line<'_>,
        extra: T,
    ) -> Result<String, ShopError> {
        Ok(format!(
            "{id}:{}:{}",
            line.sku,
            serde_json::to_string(&extra).unwrap()
        ))
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut shop = Shop {
            runs: AtomicUsize::new(0),
            log: Vec::new(),
        };
        assert_eq!(shop.refund(3, 5).await.unwrap(), 305);
        assert_eq!(shop.refund(3, 5).await.unwrap(), 305);
        assert_eq!(shop.runs.load(Ordering::SeqCst), 1);
        assert_eq!(shop.append("a").await.unwrap(), 1);
        assert_eq!(shop.append("a").await.unwrap(), 1, "replayed");
        assert_eq!(shop.append("b").await.unwrap(), 2);
        let tagged = shop.tag(1, Line { sku: "x" }, [1, 2]).await.unwrap();
        assert_eq!(tagged, "1:x:[1,2]");
    });
    // Methods are never in the registry.
    assert!(tool_contracts::registry().is_empty());
}
