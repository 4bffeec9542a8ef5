//! The store trait: where claims and results live. One small, object-safe trait that every
//! backend implements with an atomic claim and fencing tokens.
//!
//! A key's life: [`Store::claim`] makes it *in progress* under a fencing token and a lease;
//! the holder of that token (and only it) may [`complete`](Store::complete) it with a
//! result, [`release`](Store::release) it (so a retry runs again) or
//! [`renew`](Store::renew) its lease. A claim whose lease ran out is *abandoned*: its
//! worker died mid-call and the outcome is unknown; [`takeover`](Store::takeover) hands it
//! to a new holder with a higher token, after which the stale holder can do nothing.

use core::time::Duration;
use std::time::SystemTime;

mod memory;

pub use memory::MemoryStore;

/// Why a store operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The caller's fencing token is not the current holder's: its lease was taken over,
    /// or the key was completed, released or purged meanwhile.
    #[error("the lease on this key is no longer held by this worker (fencing token {token} is stale)")]
    LeaseLost {
        /// The stale token.
        token: u64,
    },
    /// The backend could not be reached or failed.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The backend answered with something that is not a valid record.
    #[error("store returned a corrupt record: {0}")]
    Corrupt(String),
}

/// What a claim attempt asks for.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRequest<'a> {
    /// The idempotency key.
    pub key: &'a str,
    /// Tool name (kept for operators).
    pub tool: &'a str,
    /// Scope the key was made in (kept for operators).
    pub scope: Option<&'a str>,
    /// Fingerprint of the call's arguments, compared by the engine on later calls.
    pub fingerprint: &'a str,
    /// The call's JSON arguments, kept so a recovery task can reconcile an abandoned call.
    pub args: &'a str,
    /// How long the claim is held before it counts as abandoned.
    pub lease: Duration,
    /// How long the record is kept after it was created or completed.
    pub ttl: Duration,
}

/// The answer to a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The key was free (or expired): the caller now holds it under this fencing token.
    Acquired {
        /// Fencing token; higher than any token issued before for this key.
        token: u64,
    },
    /// The key was completed: here is its record.
    Completed(Record),
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
    /// When the record expires and may be purged.
    pub expires_at: SystemTime,
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
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError>;

    /// Takes over an abandoned claim held under `stale_token`; answers like
    /// [`claim`](Store::claim) if the key is no longer abandoned under that token (it was
    /// completed, released or taken over meanwhile).
    async fn takeover(
        &self,
        req: ClaimRequest<'_>,
        stale_token: u64,
    ) -> Result<ClaimOutcome, StoreError>;

    /// Stores the result, if `token` still holds the key; else [`StoreError::LeaseLost`].
    async fn complete(
        &self,
        key: &str,
        token: u64,
        completion: Completion<'_>,
    ) -> Result<(), StoreError>;

    /// Frees the key so a later call runs again, if `token` still holds it; else
    /// [`StoreError::LeaseLost`].
    async fn release(&self, key: &str, token: u64) -> Result<(), StoreError>;

    /// Extends the holder's lease to `lease` from now, if `token` still holds the key;
    /// else [`StoreError::LeaseLost`].
    async fn renew(&self, key: &str, token: u64, lease: Duration) -> Result<(), StoreError>;

    /// Reads a key's record, if any (expired records included until purged).
    async fn lookup(&self, key: &str) -> Result<Option<Record>, StoreError>;

    /// Deletes records past their expiry; returns how many.
    async fn purge_expired(&self) -> Result<u64, StoreError>;

    /// Waits until `key` may have changed state, or `timeout` passes. Used by duplicates
    /// that wait for a running call. The default sleeps a short while (polling backends);
    /// backends with notifications wake waiters directly.
    async fn wait(&self, _key: &str, timeout: Duration) {
        tokio::time::sleep(timeout.min(Duration::from_millis(20))).await;
    }
}

#[async_trait::async_trait]
impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        (**self).claim(req).await
    }
    async fn takeover(
        &self,
        req: ClaimRequest<'_>,
        stale_token: u64,
    ) -> Result<ClaimOutcome, StoreError> {
        (**self).takeover(req, stale_token).await
    }
    async fn complete(
        &self,
        key: &str,
        token: u64,
        completion: Completion<'_>,
    ) -> Result<(), StoreError> {
        (**self).complete(key, token, completion).await
    }
    async fn release(&self, key: &str, token: u64) -> Result<(), StoreError> {
        (**self).release(key, token).await
    }
    async fn renew(&self, key: &str, token: u64, lease: Duration) -> Result<(), StoreError> {
        (**self).renew(key, token, lease).await
    }
    async fn lookup(&self, key: &str) -> Result<Option<Record>, StoreError> {
        (**self).lookup(key).await
    }
    async fn purge_expired(&self) -> Result<u64, StoreError> {
        (**self).purge_expired().await
    }
    async fn wait(&self, key: &str, timeout: Duration) {
        (**self).wait(key, timeout).await
    }
}
