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
