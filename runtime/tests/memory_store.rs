//! `MemoryStore` passes the store conformance suite.

mod conformance;

use std::sync::Arc;

use tool_contracts_runtime::MemoryStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_purges_expired_records_in_the_background() {
    let store = MemoryStore::new();
    let p = conformance::unique("mem-purge");
    store.set_purge_interval(None);
    conformance::expired_records_are_purged_in_the_background(&store, &p, false).await;
    store.set_purge_interval(Some(std::time::Duration::from_millis(200)));
    conformance::expired_records_are_purged_in_the_background(&store, &p, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_passes_the_conformance_suite() {
    conformance::run_all(Arc::new(MemoryStore::new()), &conformance::unique("mem")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_passes_the_conformance_suite_with_a_near_cache() {
    let store = Arc::new(MemoryStore::new());
    conformance::run_all_near_cached(store, &conformance::unique("mem")).await;
}

/// The engine replays from this store without a claim: a completed, live key is answered
/// by `completed_now` (the conformance suite checks that the answer is the claim's).
#[tokio::test]
async fn memory_store_answers_completed_keys_without_a_claim() {
    use std::time::Duration;
    use tool_contracts_runtime::store::{ClaimOutcome, ClaimRequest, Completion, Store};

    let store = MemoryStore::new();
    let req = ClaimRequest {
        key: "k",
        tool: "t",
        version: 1,
        scope: None,
        fingerprint: "a1:x",
        args: "{}",
        lease: Duration::from_secs(30),
        ttl: Duration::from_secs(60),
        worker: "w",
    };
    let ClaimOutcome::Acquired { token } = store.claim(req).await.unwrap() else {
        panic!("a free key is acquired");
    };
    let done = Completion {
        result: "1",
        is_error: false,
        ttl: Duration::from_secs(60),
    };
    store.complete("k", token, done).await.unwrap();
    let record = store
        .completed_now("k", None)
        .expect("answered from memory");
    assert_eq!(
        store.claim(req).await.unwrap(),
        ClaimOutcome::Completed(record)
    );
}
