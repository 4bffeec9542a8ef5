//! `#[read_only_tool]`: registered, never deduplicated, no `From<Error>` needed.
#![deny(warnings)]

use std::sync::atomic::{AtomicUsize, Ordering};

use tool_contracts::read_only_tool;

#[derive(Debug, thiserror::Error)]
#[error("lookup failed")]
pub struct LookupError;

pub struct Db {
    pub reads: AtomicUsize,
}

/// Lists a user's orders.
#[read_only_tool(open_world)]
pub async fn list_orders(user_id: u64, #[context] db: &Db) -> Result<Vec<u64>, LookupError> {
    db.reads.fetch_add(1, Ordering::SeqCst);
    if user_id == 0 {
        return Err(LookupError);
    }
    Ok(vec![user_id, user_id + 1])
}

#[read_only_tool(name = "ping", description = "Answers pong.")]
pub async fn ping() -> Result<String, LookupError> {
    Ok("pong".into())
}

pub struct Catalog;

impl Catalog {
    #[read_only_tool]
    pub async fn count(&self) -> Result<usize, LookupError> {
        Ok(3)
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let db = Db {
            reads: AtomicUsize::new(0),
        };
        assert_eq!(list_orders(1, &db).await.unwrap(), [1, 2]);
        assert_eq!(list_orders(1, &db).await.unwrap(), [1, 2]);
        assert_eq!(
            db.reads.load(Ordering::SeqCst),
            2,
            "read-only tools run every time"
        );
        assert_eq!(Catalog.count().await.unwrap(), 3);

        let registry = tool_contracts::registry().with_context(Db {
            reads: AtomicUsize::new(0),
        });
        let names: Vec<_> = registry.iter().map(|t| t.name()).collect();
        assert_eq!(names, ["list_orders", "ping"]);
        let list = registry.get("list_orders").unwrap();
        assert!(!list.is_mutating());
        assert_eq!(list.description(), "Lists a user's orders.");
        assert_eq!(list.annotations()["openWorldHint"], true);
        assert_eq!(
            list.key(&serde_json::json!({ "user_id": 1 })).unwrap(),
            None
        );
        let out = registry.call("ping", serde_json::json!({})).await.unwrap();
        assert_eq!(out.value, serde_json::json!("pong"));
        assert_eq!(registry.get("ping").unwrap().description(), "Answers pong.");
    });
}
