//! Stores the suites build around a real one: [`Wrapped`], which hands every operation to
//! an inner store except those a test changes (a fault, a delay, another clock), and a
//! store holding what an older build stored. A file of its own (not in `support/mod.rs`):
//! it names `tool_contracts`, which `runtime/tests` do not depend on.
#![allow(dead_code)]

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tool_contracts::store::{
    ClaimOutcome, ClaimRequest, Completion, HistoryEvent, Observed, Record, ResolveRequest, Store,
    StoreError, StoreResult,
};
use tool_contracts::{registry, with_store, MemoryStore};

/// A store operation, as [`Delegate::fault`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Claim,
    Takeover,
    Complete,
    Release,
    Renew,
    Abandon,
    Lookup,
    Observe,
    Pending,
    Resolve,
    History,
    PurgeExpired,
}

/// What a test's store does differently from [`inner`](Delegate::inner): the methods it
/// overrides, and [`fault`](Delegate::fault). Every other operation goes to the inner store
/// unchanged; [`Wrapped`] makes it a [`Store`]. Only the methods some test changes are
/// here (the rest are delegated in one place, `Wrapped`'s `Store` impl): add one when a
/// test needs it.
#[async_trait::async_trait]
pub trait Delegate: Send + Sync + 'static {
    /// The store the operations go to.
    fn inner(&self) -> &dyn Store;

    /// `Some(error)` fails `op` with `error` before it reaches the store (or the method
    /// that overrides it). The default fails nothing.
    fn fault(&self, _op: Op) -> Option<StoreError> {
        None
    }

    async fn claim(&self, req: ClaimRequest<'_>) -> StoreResult<ClaimOutcome> {
        self.inner().claim(req).await
    }

    async fn takeover(&self, req: ClaimRequest<'_>, stale_token: u64) -> StoreResult<ClaimOutcome> {
        self.inner().takeover(req, stale_token).await
    }

    async fn complete(&self, key: &str, token: u64, completion: Completion<'_>) -> StoreResult {
        self.inner().complete(key, token, completion).await
    }

    async fn renew(&self, key: &str, token: u64, lease: Duration) -> StoreResult {
        self.inner().renew(key, token, lease).await
    }

    async fn lookup(&self, key: &str) -> StoreResult<Option<Record>> {
        self.inner().lookup(key).await
    }

    async fn observe(&self, key: &str) -> StoreResult<Option<Observed>> {
        self.inner().observe(key).await
    }

    /// The store's memory (`Store::completed_now`): by default none, so every call of a
    /// wrapped store claims (and meets the faults a test sets on claims).
    fn completed_now(&self, _key: &str, _scope: Option<&str>) -> Option<Arc<Record>> {
        None
    }
}

/// A [`Delegate`] as a [`Store`]; derefs to it, so a test reads what its store recorded.
pub struct Wrapped<D>(pub D);

impl<D> Deref for Wrapped<D> {
    type Target = D;

    fn deref(&self) -> &D {
        &self.0
    }
}

impl<D: Delegate> Wrapped<D> {
    fn check(&self, op: Op) -> StoreResult {
        self.0.fault(op).map_or(Ok(()), Err)
    }
}

#[async_trait::async_trait]
impl<D: Delegate> Store for Wrapped<D> {
    async fn claim(&self, req: ClaimRequest<'_>) -> StoreResult<ClaimOutcome> {
        self.check(Op::Claim)?;
        self.0.claim(req).await
    }
    async fn takeover(&self, req: ClaimRequest<'_>, stale_token: u64) -> StoreResult<ClaimOutcome> {
        self.check(Op::Takeover)?;
        self.0.takeover(req, stale_token).await
    }
    async fn complete(&self, key: &str, token: u64, completion: Completion<'_>) -> StoreResult {
        self.check(Op::Complete)?;
        self.0.complete(key, token, completion).await
    }
    async fn release(&self, key: &str, token: u64) -> StoreResult {
        self.check(Op::Release)?;
        self.0.inner().release(key, token).await
    }
    async fn renew(&self, key: &str, token: u64, lease: Duration) -> StoreResult {
        self.check(Op::Renew)?;
        self.0.renew(key, token, lease).await
    }
    async fn abandon(&self, key: &str, token: u64) -> StoreResult {
        self.check(Op::Abandon)?;
        self.0.inner().abandon(key, token).await
    }
    async fn lookup(&self, key: &str) -> StoreResult<Option<Record>> {
        self.check(Op::Lookup)?;
        self.0.lookup(key).await
    }
    async fn observe(&self, key: &str) -> StoreResult<Option<Observed>> {
        self.check(Op::Observe)?;
        self.0.observe(key).await
    }
    /// The wrapped store's name, so `otel` figures label a faulty store by its backend.
    fn backend(&self) -> &'static str {
        self.0.inner().backend()
    }
    async fn pending(&self, limit: usize) -> StoreResult<Vec<Record>> {
        self.check(Op::Pending)?;
        self.0.inner().pending(limit).await
    }
    async fn resolve(&self, request: ResolveRequest<'_>) -> StoreResult {
        self.check(Op::Resolve)?;
        self.0.inner().resolve(request).await
    }
    async fn history(&self, key: &str) -> StoreResult<Vec<HistoryEvent>> {
        self.check(Op::History)?;
        self.0.inner().history(key).await
    }
    async fn purge_expired(&self) -> StoreResult<u64> {
        self.check(Op::PurgeExpired)?;
        self.0.inner().purge_expired().await
    }
    async fn wait(&self, key: &str, timeout: Duration) {
        self.0.inner().wait(key, timeout).await
    }
    fn completed_now(&self, key: &str, scope: Option<&str>) -> Option<Arc<Record>> {
        self.0.completed_now(key, scope)
    }
}

/// A [`MemoryStore`] whose operations fail where its closure answers `Some(error)`.
pub struct Failing<F>(pub MemoryStore, pub F);

impl<F: Fn(Op) -> Option<StoreError> + Send + Sync + 'static> Delegate for Failing<F> {
    fn inner(&self) -> &dyn Store {
        &self.0
    }
    fn fault(&self, op: Op) -> Option<StoreError> {
        (self.1)(op)
    }
}

/// A fresh in-memory store whose operations fail where `fault` answers `Some(error)`
/// (every one: a store that is down; only takeovers: a server lost between two
/// statements).
pub fn failing<F>(fault: F) -> Wrapped<Failing<F>>
where
    F: Fn(Op) -> Option<StoreError> + Send + Sync + 'static,
{
    Wrapped(Failing(MemoryStore::new(), fault))
}

/// The key `registry()` gives the call of `tool` with `args`.
pub fn key_of(tool: &str, args: &Value) -> String {
    registry()
        .get(tool)
        .expect("a registered tool")
        .key(args)
        .expect("valid arguments")
        .expect("a mutating tool has a key")
}

/// A fresh store in which an older build of `tool` completed the call with `args`,
/// storing `result` (JSON text), and the call's key. The key and the argument fingerprint
/// are today's: the fingerprint is read from a genuine call (which runs the body once) on
/// another store.
pub async fn store_with_an_older_result(
    tool: &str,
    args: &Value,
    result: &str,
) -> (Arc<MemoryStore>, String) {
    let key = key_of(tool, args);
    let genuine = Arc::new(MemoryStore::new());
    with_store(Arc::clone(&genuine), registry().call(tool, args.clone()))
        .await
        .expect("the genuine call");
    let fingerprint = genuine
        .lookup(&key)
        .await
        .unwrap()
        .expect("the genuine record")
        .fingerprint;
    let store = Arc::new(MemoryStore::new());
    let args = args.to_string();
    let req = ClaimRequest {
        key: &key,
        tool,
        version: 1,
        scope: None,
        fingerprint: &fingerprint,
        args: &args,
        lease: Duration::from_secs(30),
        ttl: Duration::from_secs(60),
        worker: "older-build",
    };
    let ClaimOutcome::Acquired { token } = store.claim(req).await.unwrap() else {
        panic!("{key} is fresh");
    };
    let old = Completion {
        result,
        is_error: false,
        ttl: Duration::from_secs(60),
    };
    store.complete(&key, token, old).await.unwrap();
    (store, key)
}
