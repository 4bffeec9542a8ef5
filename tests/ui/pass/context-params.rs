//! A registered free function with `#[context]` parameters: `&T` (borrowed from
//! the registry) and owned `T: Clone` (cloned out of it).
#![deny(warnings)]

use std::sync::atomic::{AtomicUsize, Ordering};

use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

pub struct Db {
    pub runs: AtomicUsize,
}

#[derive(Clone)]
pub struct Config {
    pub prefix: String,
}

#[mutating_tool(idempotency_key_fields = [user_id])]
pub async fn create_order(
    user_id: u64,
    note: String,
    #[context] db: &Db,
    #[context] config: Config,
) -> Result<String, ShopError> {
    db.runs.fetch_add(1, Ordering::SeqCst);
    Ok(format!("{}-{user_id}-{note}", config.prefix))
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        // Called directly.
        let db = Db {
            runs: AtomicUsize::new(0),
        };
        let config = Config {
            prefix: "order".into(),
        };
        let first = create_order(7, "gift".into(), &db, config.clone())
            .await
            .unwrap();
        let again = create_order(7, "gift".into(), &db, config.clone())
            .await
            .unwrap();
        assert_eq!(first, "order-7-gift");
        assert_eq!(again, first);
        assert_eq!(db.runs.load(Ordering::SeqCst), 1, "the retry replayed");

        // Called through the registry, which injects the context values.
        let registry = tool_contracts::registry()
            .with_context(Db {
                runs: AtomicUsize::new(0),
            })
            .with_context(Config {
                prefix: "reg".into(),
            });
        let tool = registry.get("create_order").expect("registered");
        assert_eq!(tool.params(), ["user_id", "note"]);
        assert_eq!(tool.idempotency_key_fields(), ["user_id"]);
        let out = registry
            .call(
                "create_order",
                serde_json::json!({ "user_id": 8, "note": "n" }),
            )
            .await
            .unwrap();
        assert_eq!(out.value, serde_json::json!("reg-8-n"));
        assert_ne!(out.outcome, tool_contracts::Outcome::Replayed);
        let out = registry
            .call(
                "create_order",
                serde_json::json!({ "user_id": 8, "note": "n" }),
            )
            .await
            .unwrap();
        assert_eq!(out.outcome, tool_contracts::Outcome::Replayed);
    });
}
