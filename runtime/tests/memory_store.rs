//! `MemoryStore` passes the store conformance suite.

mod conformance;

use std::sync::Arc;

use tool_contracts_runtime::MemoryStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_passes_the_conformance_suite() {
    conformance::run_all(Arc::new(MemoryStore::new()), &conformance::unique("mem")).await;
}
