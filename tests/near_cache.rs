//! The near cache under the engine (docs/stores.md, "Near cache"): a tool's repeated
//! replays are answered in the process, through the telemetry wrapper every installed
//! store gets (`with_store`; this package builds with `otel`), with the engine's rules
//! intact: a payload mismatch is still refused, scopes never share a result, operation
//! reads still go to the store. On `MemoryStore` (counting what reaches it) and on Redis
//! opened from a URL with `?near_cache=N`, two "processes" sharing one server.

#[path = "support/calls.rs"]
mod calls;
#[path = "support/cleanup.rs"]
mod cleanup;
#[path = "support/stores.rs"]
mod stores;
mod support;
use calls::ToolError;
use stores::{Delegate, Wrapped};

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use tool_contracts::store::{
    ClaimOutcome, ClaimRequest, NearCache, Observed, RedisStore, Store, StoreResult,
};
use tool_contracts::{
    mutating_tool, operation, with_scope, with_store, Error, MemoryStore, OperationState, Outcome,
};

/// How many times the body ran, per order id.
static RUNS: Mutex<BTreeMap<String, usize>> = Mutex::new(BTreeMap::new());

fn runs(id: &str) -> usize {
    RUNS.lock().unwrap().get(id).copied().unwrap_or(0)
}

/// One effect per order id.
#[mutating_tool(idempotency_key_fields = [id])]
pub async fn near_order(id: String, note: String) -> Result<String, ToolError> {
    *RUNS.lock().unwrap().entry(id.clone()).or_default() += 1;
    Ok(format!("order {id} ({note})"))
}

/// A `MemoryStore` that counts the claims and reads reaching it.
#[derive(Default)]
struct Counted {
    store: MemoryStore,
    claims: AtomicU64,
    reads: AtomicU64,
}

#[async_trait::async_trait]
impl Delegate for Counted {
    fn inner(&self) -> &dyn Store {
        &self.store
    }
    async fn claim(&self, req: ClaimRequest<'_>) -> StoreResult<ClaimOutcome> {
        self.claims.fetch_add(1, SeqCst);
        self.store.claim(req).await
    }
    async fn observe(&self, key: &str) -> StoreResult<Option<Observed>> {
        self.reads.fetch_add(1, SeqCst);
        self.store.observe(key).await
    }
}

async fn call(id: &str, note: &str) -> Result<(String, Outcome, String), Error> {
    let out = tool_contracts::registry()
        .call("near_order", serde_json::json!({"id": id, "note": note}))
        .await?;
    let value = out.value.as_str().unwrap_or_default().to_owned();
    Ok((value, out.outcome, out.key.unwrap_or_default()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_are_answered_in_the_process_with_the_engines_rules_intact() {
    let counted = Arc::new(Wrapped(Counted::default()));
    let near = Arc::new(NearCache::new(Arc::clone(&counted)));
    with_store(Arc::clone(&near), async {
        let mut outcomes = Vec::new();
        for _ in 0..6 {
            let (value, outcome, _) = call("mem-1", "gift").await.unwrap();
            assert_eq!(value, "order mem-1 (gift)");
            outcomes.push(outcome);
        }
        assert_eq!(outcomes[0], Outcome::Executed);
        assert!(outcomes[1..].iter().all(|o| *o == Outcome::Replayed));
        assert_eq!(runs("mem-1"), 1);
        // The first call's claim, then one read of the result (in place of the second
        // call's claim); four replays answered here.
        assert_eq!(counted.claims.load(SeqCst), 1);
        assert_eq!(counted.reads.load(SeqCst), 1);
        assert_eq!(near.hits(), 4);

        // Another payload under the same key is still refused, from the copy's fingerprint.
        let reused = call("mem-1", "another note").await.unwrap_err();
        assert!(matches!(reused, Error::KeyReused { .. }), "{reused}");

        // Scopes never share a result: each tenant's first call runs.
        for tenant in ["tenant-a", "tenant-b"] {
            for _ in 0..3 {
                with_scope(tenant, call("mem-scoped", "x")).await.unwrap();
            }
        }
        assert_eq!(runs("mem-scoped"), 2);

        // An operation read is the store's, not the cache's.
        let (_, _, key) = call("mem-1", "gift").await.unwrap();
        let reads = counted.reads.load(SeqCst);
        let op = operation(&key).await.unwrap().expect("the operation");
        assert_eq!(op.state, OperationState::Completed);
        assert_eq!(counted.reads.load(SeqCst), reads + 1);
    })
    .await;
}

/// Two processes sharing one Redis, each with its own near cache: the second replays the
/// first's result, from the server once, then from its own copy. (The URL form,
/// `?near_cache=N`, is tested in runtime/tests/redis_store.rs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_on_redis_replay_from_their_own_copies() {
    let Some(url) = support::url(&support::REDIS, "the Redis near cache test") else {
        return;
    };
    let (prefix, _cleanup) = cleanup::redis_prefix(&url, "tc-near");
    let process = || async {
        let redis = RedisStore::with_prefix(&url, &prefix).await.unwrap();
        Arc::new(NearCache::new(redis))
    };
    let (first, second) = (process().await, process().await);
    let id = support::unique("redis");
    let (value, outcome, key) = with_store(Arc::clone(&first), call(&id, "gift"))
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Executed);
    for _ in 0..5 {
        let (replayed, outcome, _) = with_store(Arc::clone(&second), call(&id, "gift"))
            .await
            .unwrap();
        assert_eq!(
            (replayed.as_str(), outcome),
            (value.as_str(), Outcome::Replayed)
        );
    }
    assert_eq!(runs(&id), 1);
    assert_eq!(second.hits(), 3, "one claim, one read, then three copies");
    let op = with_store(Arc::clone(&second), operation(&key))
        .await
        .unwrap()
        .expect("the operation");
    assert_eq!(op.state, OperationState::Completed);
}
