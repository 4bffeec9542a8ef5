//! The store trait: where claims and results live. One small, object-safe trait that every
//! backend implements with an atomic claim and fencing tokens.
//!
//! A key's life: [`Store::claim`] makes it *in progress* under a fencing token and a lease;
//! the holder of that token (and only it) may [`complete`](Store::complete) it with a
//! result, [`release`](Store::release) it (so a retry runs again) or
//! [`renew`](Store::renew) its lease. A claim whose lease ran out is *abandoned*: its
//! worker died mid-call and the outcome is unknown; [`takeover`](Store::takeover) hands it
//! to a new holder with a higher token, after which the stale holder can do nothing.
//!
//! A reader ([`operation`](crate::operation)) changes none of this: it reads a key with
//! [`Store::observe`], the record and the store's clock of the same read, so that it tells
//! a live lease from an abandoned one by the clock the store decides leases with.

use core::time::Duration;
use std::sync::Arc;
use std::time::SystemTime;

mod memory;
mod near;
mod open;
#[cfg(feature = "postgres")]
mod postgres;
mod purge;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "sqlite")]
mod sqlite;

pub use memory::MemoryStore;
pub use near::{NearCache, NearCacheBuilder, DEFAULT_NEAR_CACHE_BYTES, DEFAULT_NEAR_CACHE_ENTRIES};
pub use open::open;
#[cfg(feature = "postgres")]
pub use postgres::{PostgresStore, PostgresStoreBuilder};
pub use purge::DEFAULT_PURGE_INTERVAL;
#[cfg(feature = "redis")]
pub use redis::{RedisStore, RedisStoreBuilder};
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;

/// What every [`Store`] method returns (`()` unless it answers with a value).
pub type StoreResult<T = ()> = Result<T, StoreError>;

/// Why a store operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The caller's fencing token is not the current holder's: its lease was taken over,
    /// or the key was completed, released or purged meanwhile.
    #[error(
        "the lease on this key is no longer held by this worker (fencing token {token} is stale)"
    )]
    LeaseLost {
        /// The stale token.
        token: u64,
    },
    /// The backend could not be reached or failed. Its message says what the store was
    /// doing; its [`source`](std::error::Error::source) is the backend's own error
    /// (`rusqlite::Error`, `redis::RedisError`, `tokio_postgres::Error`, a pool or I/O
    /// error), where there is one. Made by [`StoreError::unavailable`] and
    /// [`StoreError::unavailable_message`].
    #[error(transparent)]
    Unavailable(Unavailable),
    /// [`Store::resolve`] was asked for a key that is completed or absent.
    #[error("the key is not pending (it is completed or absent); nothing was changed")]
    NotPending,
    /// The backend answered with something that is not a valid record.
    #[error("store returned a corrupt record: {0}")]
    Corrupt(String),
}

impl StoreError {
    /// The backend failed: `context` says what the store was doing (`"postgres claim"`,
    /// `"cannot connect to redis at 10.0.0.5:6379"`), `source` is the backend's error,
    /// kept as the [`source`](std::error::Error::source) of the result.
    pub fn unavailable(
        context: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        StoreError::Unavailable(Unavailable {
            context: context.into(),
            source: Some(Arc::new(source)),
        })
    }

    /// The store cannot serve, for a reason no underlying error describes (a refused
    /// setting, a timeout, a schema from a newer version): `message` says what failed and
    /// what to do.
    pub fn unavailable_message(message: impl Into<String>) -> Self {
        StoreError::Unavailable(Unavailable {
            context: message.into(),
            source: None,
        })
    }
}

/// What [`StoreError::Unavailable`] holds: what the store was doing, and the backend's
/// error that stopped it, if there is one.
///
/// The message (`Display`) is complete on its own: `store unavailable: <context>: <the
/// cause and each of its own causes, each once>`, because most readers (logs, MCP
/// clients, an operator's terminal) see one line. [`source`](std::error::Error::source)
/// returns the backend's error itself, so code can walk the chain or downcast it (to
/// `rusqlite::Error`, `redis::RedisError`, `tokio_postgres::Error`, ...). A reporter that
/// prints the whole chain repeats the cause's text; that is the price of a complete
/// one-line message.
///
/// The cause is shared (`Arc`), so the error stays `Clone` (one failed write answers
/// every caller that shared its transaction). Two values are equal when their messages
/// are: backend errors are not comparable, and the message is what an operator acts on.
#[derive(Debug, Clone)]
pub struct Unavailable {
    context: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Unavailable {
    /// What the store was doing when it failed, and what to do about it, without the
    /// cause's text.
    pub fn context(&self) -> &str {
        &self.context
    }
}

impl core::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "store unavailable: {}", self.context)?;
        match std::error::Error::source(self) {
            Some(cause) => write!(f, ": {}", describe(cause)),
            None => Ok(()),
        }
    }
}

/// `err`'s message and those of its causes, each once, on one line. Some errors print
/// their causes (redis), some only their kind (tokio-postgres says "db error" and keeps
/// the server's message in its source).
pub(crate) fn describe(err: &(dyn std::error::Error + 'static)) -> String {
    let mut message = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

impl std::error::Error for Unavailable {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        // The backend's error itself (not the `Arc`), so a caller can downcast it.
        let source: &(dyn std::error::Error + Send + Sync + 'static) = self.source.as_deref()?;
        Some(source)
    }
}

/// Compares the messages (see the type's documentation).
impl PartialEq for Unavailable {
    fn eq(&self, other: &Self) -> bool {
        self.to_string() == other.to_string()
    }
}

impl Eq for Unavailable {}

/// What a claim attempt asks for.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRequest<'a> {
    /// The idempotency key.
    pub key: &'a str,
    /// Tool name (kept for operators).
    pub tool: &'a str,
    /// The version of the tool's contract (a run's version, for runs and their steps),
    /// kept for the operation view.
    pub version: u32,
    /// Scope the key was made in (kept for operators, and checked by reads).
    pub scope: Option<&'a str>,
    /// Fingerprint of the call's arguments (never empty), compared by the engine on later
    /// calls; a run's journal position carries what the code asked for there instead.
    pub fingerprint: &'a str,
    /// The call's JSON arguments, kept so a recovery task can reconcile an abandoned call.
    pub args: &'a str,
    /// How long the claim is held before it counts as abandoned.
    pub lease: Duration,
    /// How long the record is kept after it was created or completed.
    pub ttl: Duration,
    /// Who claims: the process's worker id (host, pid and a random part), for history.
    pub worker: &'a str,
}

/// The answer to a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The key was free (or expired): the caller now holds it under this fencing token.
    Acquired {
        /// Fencing token; higher than any token issued before for this key.
        token: u64,
    },
    /// The key was completed: here is its record. Shared, so an in-process store answers
    /// a replay without copying the record.
    Completed(Arc<Record>),
    /// Another worker holds the key and its lease is live.
    InProgress {
        /// The holder's argument fingerprint.
        fingerprint: String,
        /// How long the holder's lease still runs.
        lease_remaining: Duration,
    },
    /// A claim whose lease ran out: the outcome is unknown. Nothing changed in the store.
    Abandoned {
        /// The stale holder's token, to pass to [`Store::takeover`].
        token: u64,
        /// The stale holder's argument fingerprint.
        fingerprint: String,
    },
}

/// The state of a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordState {
    /// Claimed and not finished.
    InProgress {
        /// Current holder's fencing token.
        token: u64,
        /// When the holder's lease runs out.
        lease_expires_at: SystemTime,
    },
    /// Finished: the result is stored.
    Completed {
        /// JSON text of the stored `Ok` value or, if `is_error`, of the `Err` value.
        result: String,
        /// Whether `result` is a stored error (`cache_errors = true`).
        is_error: bool,
        /// When it completed.
        completed_at: SystemTime,
    },
}

/// One key's record, as an operator or the engine sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The idempotency key.
    pub key: String,
    /// Tool name.
    pub tool: String,
    /// The version of the tool's contract the claim was made under; `None` for a record
    /// written before stores kept it.
    pub version: Option<u32>,
    /// Scope the key was made in.
    pub scope: Option<String>,
    /// Fingerprint of the arguments of the call that claimed it.
    pub fingerprint: String,
    /// JSON arguments of that call.
    pub args: String,
    /// In progress or completed.
    pub state: RecordState,
    /// When the key was first claimed.
    pub created_at: SystemTime,
    /// When the record last changed state: its latest claim, takeover, abandonment or
    /// completion (a lease renewal is not a transition). For a record written before
    /// stores kept it: its completion, else its creation.
    pub updated_at: SystemTime,
    /// When the record expires and may be purged.
    pub expires_at: SystemTime,
}

/// A record as a reader sees it: the record and the store's clock when it was read, so
/// that a reader tells a live lease from an abandoned one by the same clock the store
/// decides leases with (the server's, for shared stores), never by its own.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Observed {
    /// The key's record.
    pub record: Record,
    /// The store's clock at the read (the server's for Redis and PostgreSQL).
    pub now: SystemTime,
}

impl Observed {
    /// `record`, read when the store's clock said `now`.
    pub fn new(record: Record, now: SystemTime) -> Self {
        Self { record, now }
    }
}

/// What a holder stores on completion.
#[derive(Debug, Clone, Copy)]
pub struct Completion<'a> {
    /// JSON text of the result (or of the error, if `is_error`).
    pub result: &'a str,
    /// Whether `result` is an error to replay.
    pub is_error: bool,
    /// How long to keep the result from now.
    pub ttl: Duration,
}

/// What an operator decides for a pending key.
#[derive(Debug, Clone, Copy)]
pub enum Resolution<'a> {
    /// The effect happened: store this JSON result, replayed to every later call.
    Complete {
        /// JSON text of the result.
        result: &'a str,
        /// How long to keep it.
        ttl: Duration,
    },
    /// The effect did not happen: free the key so the next call runs.
    Release,
}

/// What [`Store::resolve`] is asked to do: an operator's (or a reconciliation's) decision
/// for a key that is not completed.
#[derive(Debug, Clone, Copy)]
pub struct ResolveRequest<'a> {
    /// The idempotency key to decide.
    pub key: &'a str,
    /// Complete the key with a result, or release it.
    pub resolution: Resolution<'a>,
    /// The history entry the decision is logged as: [`HistoryKind::Resolved`] for an
    /// operator, [`HistoryKind::Reconciled`] for a reconciliation.
    pub kind: HistoryKind,
    /// Who decided (an operator's name, or a worker id), for history.
    pub worker: &'a str,
}

/// What happened to a key, in its append-only history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HistoryKind {
    /// A worker claimed the free key.
    Claimed,
    /// The holder stored a result.
    Completed,
    /// The holder released the key (its call failed and is retryable).
    Released,
    /// The holder gave up its lease at once: its outcome is unknown.
    Abandoned,
    /// A worker took over an abandoned claim.
    TakenOver,
    /// A reconciliation (`verify`) completed or released an abandoned claim.
    Reconciled,
    /// An operator completed or released the key.
    Resolved,
    /// A call that needs approval asked for it (in its call's history: the claims of its
    /// approval record, docs/approval.md).
    ApprovalRequested,
    /// Someone approved the call (`worker`: who, and through which channel).
    Approved,
    /// Someone denied the call (`worker`: who, and through which channel).
    Denied,
}

impl HistoryKind {
    /// The stable lowercase name stored by backends.
    pub fn as_str(self) -> &'static str {
        match self {
            HistoryKind::Claimed => "claimed",
            HistoryKind::Completed => "completed",
            HistoryKind::Released => "released",
            HistoryKind::Abandoned => "abandoned",
            HistoryKind::TakenOver => "taken_over",
            HistoryKind::Reconciled => "reconciled",
            HistoryKind::Resolved => "resolved",
            HistoryKind::ApprovalRequested => "approval_requested",
            HistoryKind::Approved => "approved",
            HistoryKind::Denied => "denied",
        }
    }

    /// Parses [`as_str`](Self::as_str).
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "claimed" => HistoryKind::Claimed,
            "completed" => HistoryKind::Completed,
            "released" => HistoryKind::Released,
            "abandoned" => HistoryKind::Abandoned,
            "taken_over" => HistoryKind::TakenOver,
            "reconciled" => HistoryKind::Reconciled,
            "resolved" => HistoryKind::Resolved,
            "approval_requested" => HistoryKind::ApprovalRequested,
            "approved" => HistoryKind::Approved,
            "denied" => HistoryKind::Denied,
            _ => return None,
        })
    }
}

/// One entry of a key's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEvent {
    /// When (the store's clock).
    pub at: SystemTime,
    /// What happened.
    pub kind: HistoryKind,
    /// The fencing token involved (the new one, for claims and takeovers).
    pub token: u64,
    /// The worker (or `operator`) that did it.
    pub worker: String,
}

/// A backend for claims and results.
///
/// Every method is atomic with respect to the others for one key. Implementations use
/// their own clock (the server's, for shared backends) for leases and expiry, so one
/// worker's clock cannot steal another's lease. No method may hold a lock while the
/// caller's tool body runs: the engine calls them around the body, never across it.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// Atomically claims `req.key`, or reports who has it. An expired completed record
    /// counts as absent.
    async fn claim(&self, req: ClaimRequest<'_>) -> StoreResult<ClaimOutcome>;

    /// Takes over an abandoned claim held under `stale_token`; answers like
    /// [`claim`](Store::claim) if the key is no longer abandoned under that token (it was
    /// completed, released or taken over meanwhile).
    async fn takeover(&self, req: ClaimRequest<'_>, stale_token: u64) -> StoreResult<ClaimOutcome>;

    /// Stores the result, if `token` still holds the key; else [`StoreError::LeaseLost`].
    async fn complete(&self, key: &str, token: u64, completion: Completion<'_>) -> StoreResult;

    /// Frees the key so a later call runs again, if `token` still holds it; else
    /// [`StoreError::LeaseLost`].
    async fn release(&self, key: &str, token: u64) -> StoreResult;

    /// Extends the holder's lease to `lease` from now, if `token` still holds the key;
    /// else [`StoreError::LeaseLost`].
    async fn renew(&self, key: &str, token: u64, lease: Duration) -> StoreResult;

    /// Gives up the holder's lease at once, leaving the claim abandoned (outcome unknown):
    /// for errors that do not say whether the effect happened. Fenced like `release`.
    async fn abandon(&self, key: &str, token: u64) -> StoreResult;

    /// Reads a key's record, if any (expired records included until purged).
    async fn lookup(&self, key: &str) -> StoreResult<Option<Record>>;

    /// Reads a key's record with the store's clock at that moment ([`Observed::now`]):
    /// what a read of an operation needs to tell a live lease (in progress) from one that
    /// ran out (outcome unknown) without trusting the reader's clock. Changes nothing.
    ///
    /// The default is [`lookup`](Store::lookup) and this process's `SystemTime::now()`,
    /// right for a store whose clock is this machine's (memory, SQLite). A store that
    /// decides leases by another clock (a server's) must override it and read that clock
    /// in the same operation as the record.
    async fn observe(&self, key: &str) -> StoreResult<Option<Observed>> {
        let record = self.lookup(key).await?;
        Ok(record.map(|record| Observed::new(record, SystemTime::now())))
    }

    /// Records not completed (live or abandoned claims), oldest first, at most `limit`.
    async fn pending(&self, limit: usize) -> StoreResult<Vec<Record>>;

    /// An operator's decision for `request.key`, which must not be completed: completes
    /// or releases it and logs `request.kind` under `request.worker`. Fences out any
    /// holder (its token becomes stale). Refused with [`StoreError::NotPending`] if the
    /// key is completed or absent, so an operator never overwrites a real result.
    async fn resolve(&self, request: ResolveRequest<'_>) -> StoreResult;

    /// The key's history, oldest first (kept at least as long as its record).
    async fn history(&self, key: &str) -> StoreResult<Vec<HistoryEvent>>;

    /// Deletes records (and their history) past their expiry; returns how many records.
    async fn purge_expired(&self) -> StoreResult<u64>;

    /// Waits until `key` may have changed state, or `timeout` passes. Used by duplicates
    /// that wait for a running call. The default sleeps a short while (polling backends);
    /// backends with notifications wake waiters directly.
    async fn wait(&self, _key: &str, timeout: Duration) {
        tokio::time::sleep(timeout.min(Duration::from_millis(20))).await;
    }

    /// The record of `key` if this store can tell **without I/O or waiting** that it is
    /// completed, live (not expired) and made in `scope`: an in-process store's own
    /// table, a [`NearCache`]'s copy. `None` means "ask [`claim`](Store::claim)", and is
    /// the default.
    ///
    /// The engine asks this before it claims a tool call's key, so that a replay it
    /// answers costs no claim (no boxed future, no argument fingerprint when the record
    /// holds the same arguments). Only an answer [`claim`](Store::claim) would give at the
    /// same moment may be returned: `Some` is exactly the record a claim would answer
    /// [`ClaimOutcome::Completed`] with. A store that wraps another should forward it.
    fn completed_now(&self, _key: &str, _scope: Option<&str>) -> Option<Arc<Record>> {
        None
    }

    /// A short, stable name of the backend, for operators and metrics (the
    /// `tool_contracts.store.backend` attribute with the `otel` feature): `memory`, `sqlite`,
    /// `redis`, `postgresql`. The default, `custom`, suits a store of your own; a store
    /// that wraps another should return the inner store's.
    fn backend(&self) -> &'static str {
        "custom"
    }
}

#[async_trait::async_trait]
impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
    async fn claim(&self, req: ClaimRequest<'_>) -> StoreResult<ClaimOutcome> {
        (**self).claim(req).await
    }
    async fn takeover(&self, req: ClaimRequest<'_>, stale_token: u64) -> StoreResult<ClaimOutcome> {
        (**self).takeover(req, stale_token).await
    }
    async fn complete(&self, key: &str, token: u64, completion: Completion<'_>) -> StoreResult {
        (**self).complete(key, token, completion).await
    }
    async fn release(&self, key: &str, token: u64) -> StoreResult {
        (**self).release(key, token).await
    }
    async fn renew(&self, key: &str, token: u64, lease: Duration) -> StoreResult {
        (**self).renew(key, token, lease).await
    }
    async fn abandon(&self, key: &str, token: u64) -> StoreResult {
        (**self).abandon(key, token).await
    }
    async fn lookup(&self, key: &str) -> StoreResult<Option<Record>> {
        (**self).lookup(key).await
    }
    async fn observe(&self, key: &str) -> StoreResult<Option<Observed>> {
        (**self).observe(key).await
    }
    async fn pending(&self, limit: usize) -> StoreResult<Vec<Record>> {
        (**self).pending(limit).await
    }
    async fn resolve(&self, request: ResolveRequest<'_>) -> StoreResult {
        (**self).resolve(request).await
    }
    async fn history(&self, key: &str) -> StoreResult<Vec<HistoryEvent>> {
        (**self).history(key).await
    }
    async fn purge_expired(&self) -> StoreResult<u64> {
        (**self).purge_expired().await
    }
    async fn wait(&self, key: &str, timeout: Duration) {
        (**self).wait(key, timeout).await
    }
    fn completed_now(&self, key: &str, scope: Option<&str>) -> Option<Arc<Record>> {
        (**self).completed_now(key, scope)
    }
    fn backend(&self) -> &'static str {
        (**self).backend()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn an_unavailable_store_keeps_its_cause_and_says_it() {
        let cause = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = StoreError::unavailable("cannot connect to the store at db:5432", cause);
        assert_eq!(
            e.to_string(),
            "store unavailable: cannot connect to the store at db:5432: refused"
        );
        let source = e.source().expect("the cause is kept");
        let io = source
            .downcast_ref::<std::io::Error>()
            .expect("the cause itself");
        assert_eq!(io.kind(), std::io::ErrorKind::ConnectionRefused);
        assert_eq!(e.clone(), e, "clones share the cause and compare equal");
        let StoreError::Unavailable(inner) = &e else {
            panic!("{e:?}")
        };
        assert_eq!(inner.context(), "cannot connect to the store at db:5432");

        let plain = StoreError::unavailable_message("no answer within 30s");
        assert_eq!(plain.to_string(), "store unavailable: no answer within 30s");
        assert!(plain.source().is_none());
        assert_ne!(plain, e);
    }
}
