//! The near cache: completed results kept in this process, so that a repeated replay on a
//! shared store (Redis, PostgreSQL) is answered without a round trip.
//!
//! A completed record never changes until it expires (nothing overwrites a result: a
//! holder's `complete` is fenced, `resolve` refuses a completed key, and `purge_expired`
//! removes only expired records), so a copy is exact for as long as the store keeps the
//! record. The rules (also in docs/stores.md, "Near cache"):
//!
//! - **Only completed records**, read from the store. In progress and abandoned answers are
//!   never kept: they change by the second.
//! - **Never past the store's expiry.** A copy is served until a deadline on this process's
//!   monotonic clock: the instant *before* the read was sent, plus the time the record had
//!   left by the store's own clock at that read (`expires_at - now` of one
//!   [`Store::observe`]), less 1 ms (the stores' clock resolution) and 0.1% of it (the
//!   clocks' rates). The worker's wall clock never enters, so a worker whose clock runs
//!   ahead or behind the server's neither keeps a copy too long nor drops it early.
//!   `max_age` bounds it further.
//! - **Scope-exact.** A copy is served only to a claim of the same key *and* the scope the
//!   record was made in; any other claim goes to the store.
//! - **Bounded.** At most `max_entries` records and `max_bytes` (results, arguments and
//!   keys counted) in [`quick_cache`]'s S3-FIFO cache; a record bigger than one shard's
//!   budget (`max_bytes` split over up to 4 shards per core, each of at least 4 MiB where
//!   `max_bytes` allows) is not kept.
//! - **Invalidated in this process** by every write through the wrapper on the key
//!   (`complete`, `release`, `abandon`, `takeover`, `resolve`) and, for expired copies, by
//!   `purge_expired`. What another process does (an operator deleting a key by hand) is
//!   not seen: copies here serve until their deadline.
//!
//! No extra round trip: a claim the store answers with a completed record (or a
//! `complete` through the wrapper) leaves a *hint*; the next claim of that key reads it
//! with `observe` (one round trip, like the claim it replaces), which gives the record and
//! the store's clock together, and answers from that read when the record is completed
//! and live in the caller's scope; from then on claims are served here.

use core::time::Duration;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use quick_cache::sync::Cache;
use quick_cache::Weighter;
use tokio::time::Instant;

use super::{
    ClaimOutcome, ClaimRequest, Completion, HistoryEvent, Observed, Record, RecordState,
    Resolution, ResolveRequest, Store, StoreResult,
};

/// Taken off every copy's time left: the resolution of the stores' clocks. Redis's
/// scripts count whole milliseconds (`TIME` floored), so a read's `now` can lie up to 1 ms
/// behind the instant it was taken, and a deadline counted from it up to 1 ms past the
/// store's expiry (seen once in CI: a copy served in that last millisecond).
const CLOCK_MARGIN: Duration = Duration::from_millis(1);

/// And a thousandth of the time left (1,000 ppm): the most this process's monotonic clock
/// and the store's clock may differ in rate (NTP slews a clock by at most 500 ppm).
const RATE_MARGIN_DIVISOR: u32 = 1_000;

/// The default of [`NearCacheBuilder::max_entries`].
pub const DEFAULT_NEAR_CACHE_ENTRIES: usize = 10_000;

/// The default of [`NearCacheBuilder::max_bytes`]: 64 MiB.
pub const DEFAULT_NEAR_CACHE_BYTES: u64 = 64 * 1024 * 1024;

/// What an entry costs beyond its strings: the record, the entry and the cache's own
/// bookkeeping (an estimate; the bound is on what this counts).
const ENTRY_OVERHEAD: u64 =
    (core::mem::size_of::<Record>() + core::mem::size_of::<Held>() + 64) as u64;

/// A [`Store`] that keeps the completed records it reads, so repeated replays are answered
/// in this process; every other operation goes to the inner store. Off unless you wrap a
/// store in it (or open one with `?near_cache=N`, see [`open`](super::open)).
///
/// - Only completed records are kept; in progress and abandoned answers never are.
/// - A copy is served until the record's expiry **by the store's clock**: a deadline on this
///   process's monotonic clock, from the instant before a [`Store::observe`] was sent plus
///   `expires_at - now` of that read less 1 ms and 0.1% (the clocks' resolution and rates;
///   never the worker's wall clock), and at most [`max_age`](NearCacheBuilder::max_age)
///   after it.
/// - A copy is served only to a claim of its key in the scope its record was made in.
/// - At most [`max_entries`](NearCacheBuilder::max_entries) keys and
///   [`max_bytes`](NearCacheBuilder::max_bytes) are kept (quick_cache's S3-FIFO eviction).
/// - `complete`, `release`, `abandon`, `takeover` and `resolve` through the wrapper drop the
///   key's copy; `purge_expired` drops expired copies. An operator's removal of a key on
///   the server, from another process, is **not seen**: copies serve until their deadline
///   (hence `max_age`, and off by default).
/// - No call pays an extra round trip: a completed answer leaves a hint, and the next
///   claim of the key reads it with `observe` in place of the claim.
///
/// ```no_run
/// # #[cfg(feature = "redis")]
/// # async fn demo() -> Result<(), tool_contracts_runtime::store::StoreError> {
/// use std::time::Duration;
/// use tool_contracts_runtime::store::{NearCache, RedisStore};
///
/// let redis = RedisStore::connect("redis://10.0.0.5:6379").await?;
/// tool_contracts_runtime::set_default_store(
///     NearCache::builder(redis)
///         .max_entries(10_000)
///         .max_age(Duration::from_secs(60)) // an operator's removal is seen within a minute
///         .build(),
/// );
/// # Ok(()) }
/// ```
///
/// docs/stores.md ("Near cache") has the invalidation table and what a removal elsewhere
/// means for the copies.
pub struct NearCache<S> {
    inner: S,
    /// `None` when a bound is zero: every operation goes to the store.
    cache: Option<Cache<Box<str>, Held, ByWeight>>,
    max_age: Option<Duration>,
    /// The least an entry weighs: `max_bytes / max_entries`, rounded up, so that at most
    /// `max_entries` fit in the one weight capacity, `max_bytes`.
    floor: u64,
    hits: AtomicU64,
}

/// Options of a [`NearCache`]: [`NearCache::builder`].
#[derive(Debug, Clone)]
pub struct NearCacheBuilder<S> {
    inner: S,
    max_entries: usize,
    max_bytes: u64,
    max_age: Option<Duration>,
}

/// What the cache holds for a key.
#[derive(Clone)]
enum Held {
    /// The store said this key is completed (a claim's answer, or a `complete` through the
    /// wrapper), but not yet with its clock: the next claim reads it with `observe`.
    Hint { weight: u64 },
    /// A completed record, served until `until` (this process's monotonic clock).
    Copy {
        record: Arc<Record>,
        until: Instant,
        weight: u64,
    },
}

impl Held {
    fn weight(&self) -> u64 {
        match self {
            Held::Hint { weight } | Held::Copy { weight, .. } => *weight,
        }
    }
}

/// Weighs an entry by its bytes, and at least `max_bytes / max_entries`, so that both
/// bounds hold with one weight capacity (`max_bytes`).
#[derive(Clone)]
struct ByWeight;

impl Weighter<Box<str>, Held> for ByWeight {
    fn weight(&self, _key: &Box<str>, held: &Held) -> u64 {
        held.weight()
    }
}

/// The least budget of one shard where `max_bytes` allows: a record must fit in one
/// shard's budget to be kept, and results of a few MiB are common.
const SHARD_BUDGET: u64 = 4 * 1024 * 1024;

/// The cache: as many shards as quick_cache would use (4 per core, for concurrency), but
/// fewer where that would leave a shard less than [`SHARD_BUDGET`] (all of `max_bytes` in
/// one shard when it is smaller), so a small cache still keeps records of its size.
fn sharded(max_entries: usize, max_bytes: u64) -> Cache<Box<str>, Held, ByWeight> {
    let concurrency = std::thread::available_parallelism().map_or(1, |n| n.get().saturating_mul(4));
    let by_budget = usize::try_from(max_bytes / SHARD_BUDGET).unwrap_or(usize::MAX);
    let wanted = concurrency.min(by_budget).max(1);
    // A power of two (quick_cache rounds up; rounding down keeps each shard's budget).
    let shards = 1usize << wanted.ilog2();
    let options = quick_cache::OptionsBuilder::new()
        .shards(shards)
        .estimated_items_capacity(max_entries)
        .weight_capacity(max_bytes)
        .build();
    match options {
        Ok(options) => {
            Cache::with_options(options, ByWeight, Default::default(), Default::default())
        }
        // Not reached (every option is set); quick_cache's own sharding then.
        Err(_) => Cache::with_weighter(max_entries, max_bytes, ByWeight),
    }
}

impl<S> NearCacheBuilder<S> {
    /// At most this many keys are kept (default [`DEFAULT_NEAR_CACHE_ENTRIES`]); `0` keeps
    /// none (the wrapper then only passes operations through).
    pub fn max_entries(mut self, max_entries: usize) -> Self {
        self.max_entries = max_entries;
        self
    }

    /// At most this many bytes of records are kept (default [`DEFAULT_NEAR_CACHE_BYTES`]):
    /// key, tool, scope, fingerprint, arguments and result, plus a fixed overhead per
    /// entry. `0` keeps none.
    pub fn max_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// A copy is served at most this long after it was read, even where the store keeps
    /// the record longer: how long an operator's removal of a key in another process may
    /// go unseen here. Default: none (until the store's expiry).
    pub fn max_age(mut self, max_age: Duration) -> Self {
        self.max_age = Some(max_age);
        self
    }

    /// The near cache over the store.
    pub fn build(self) -> NearCache<S> {
        let cache = (self.max_entries > 0 && self.max_bytes > 0)
            .then(|| sharded(self.max_entries, self.max_bytes));
        NearCache {
            inner: self.inner,
            cache,
            max_age: self.max_age,
            floor: self
                .max_bytes
                .div_ceil(u64::try_from(self.max_entries.max(1)).unwrap_or(u64::MAX)),
            hits: AtomicU64::new(0),
        }
    }
}

impl<S> NearCache<S> {
    /// `inner` with a near cache of the default bounds
    /// ([`DEFAULT_NEAR_CACHE_ENTRIES`], [`DEFAULT_NEAR_CACHE_BYTES`], no `max_age`).
    pub fn new(inner: S) -> Self {
        Self::builder(inner).build()
    }

    /// Options for a near cache over `inner`.
    pub fn builder(inner: S) -> NearCacheBuilder<S> {
        NearCacheBuilder {
            inner,
            max_entries: DEFAULT_NEAR_CACHE_ENTRIES,
            max_bytes: DEFAULT_NEAR_CACHE_BYTES,
            max_age: None,
        }
    }

    /// The store every operation the cache does not answer goes to.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// How many keys the cache holds now (copies and hints).
    pub fn len(&self) -> usize {
        self.cache.as_ref().map_or(0, Cache::len)
    }

    /// Whether the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes the cache counts for what it holds now (at most `max_bytes`).
    pub fn weight(&self) -> u64 {
        self.cache.as_ref().map_or(0, Cache::weight)
    }

    /// How many claims (and [`Store::completed_now`] asks) were answered here without
    /// reaching the store.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Drops every copy and hint: the next claim of each key goes to the store.
    pub fn clear(&self) {
        if let Some(cache) = &self.cache {
            cache.clear();
        }
    }

    /// The weight of an entry of `bytes` bytes beyond the fixed overhead.
    fn weigh(&self, bytes: usize) -> u64 {
        let bytes = u64::try_from(bytes).unwrap_or(u64::MAX);
        bytes.saturating_add(ENTRY_OVERHEAD).max(self.floor)
    }

    /// Forgets `key`: a write through the wrapper changed it (or may have).
    fn forget(&self, key: &str) {
        if let Some(cache) = &self.cache {
            cache.remove(key);
        }
    }

    /// Notes that the store holds a completed record of `key`, so that its next claim
    /// reads it with `observe` instead (one round trip either way) and keeps it.
    fn hint(&self, key: &str) {
        if let Some(cache) = &self.cache {
            let weight = self.weigh(key.len() * 2);
            cache.insert(key.into(), Held::Hint { weight });
        }
    }
}

/// What a claim finds here.
enum Found {
    /// A live copy in the caller's scope: the answer.
    Copy(Arc<Record>),
    /// A hint: read the key with `observe`.
    Hint,
    /// Nothing usable: ask the store.
    Nothing,
}

impl<S: Store> NearCache<S> {
    fn find(&self, req: &ClaimRequest<'_>) -> Found {
        let Some(cache) = &self.cache else {
            return Found::Nothing;
        };
        match cache.get(req.key) {
            Some(Held::Copy { record, until, .. }) => {
                match live(cache, req.key, req.scope, record, until) {
                    Some(record) => Found::Copy(record),
                    None => Found::Nothing,
                }
            }
            Some(Held::Hint { .. }) => Found::Hint,
            None => Found::Nothing,
        }
    }

    /// The live copy of `key` in `scope`, if the cache holds one (a hint is not a copy).
    fn copy(&self, key: &str, scope: Option<&str>) -> Option<Arc<Record>> {
        let cache = self.cache.as_ref()?;
        match cache.get(key)? {
            Held::Copy { record, until, .. } => live(cache, key, scope, record, until),
            Held::Hint { .. } => None,
        }
    }

    /// Reads a hinted key with `observe`: if the store holds it completed and live, in the
    /// caller's scope, keeps a copy until the store's expiry and answers with it; else
    /// drops the hint and answers `None` (the caller claims).
    async fn confirm(&self, req: &ClaimRequest<'_>) -> StoreResult<Option<Arc<Record>>> {
        let Some(cache) = &self.cache else {
            return Ok(None);
        };
        // Taken before the read is sent: the store read its clock at or after this
        // instant, so a deadline counted from here, less the margin `copy_of` takes for the
        // store clock's resolution and rate, ends no later than the store's expiry.
        let sent = Instant::now();
        let observed = self.inner.observe(req.key).await?;
        let copy = observed.and_then(|seen| self.copy_of(req, seen, sent));
        match &copy {
            Some((record, until, weight)) => cache.insert(
                req.key.into(),
                Held::Copy {
                    record: Arc::clone(record),
                    until: *until,
                    weight: *weight,
                },
            ),
            None => {
                cache.remove(req.key);
            }
        }
        Ok(copy.map(|(record, _, _)| record))
    }

    /// The copy of `seen` to keep and its deadline and weight, if it is a completed record
    /// of `req`'s key and scope that the store counts live.
    fn copy_of(
        &self,
        req: &ClaimRequest<'_>,
        seen: Observed,
        sent: Instant,
    ) -> Option<(Arc<Record>, Instant, u64)> {
        let record = seen.record;
        let RecordState::Completed { result, .. } = &record.state else {
            return None;
        };
        if record.key != req.key || record.scope.as_deref() != req.scope {
            return None;
        }
        // What the record has left by the store's clock, at the store's read, less a
        // margin for the two clocks (`CLOCK_MARGIN`, `RATE_MARGIN_DIVISOR`).
        let left = record.expires_at.duration_since(seen.now).ok()?;
        let left = left.saturating_sub(CLOCK_MARGIN + left / RATE_MARGIN_DIVISOR);
        let left = match self.max_age {
            Some(max_age) => left.min(max_age),
            None => left,
        };
        if left.is_zero() {
            return None;
        }
        let until = sent.checked_add(left)?;
        let bytes = record.key.len() * 2
            + record.tool.len()
            + record.scope.as_ref().map_or(0, String::len)
            + record.fingerprint.len()
            + record.args.len()
            + result.len();
        let weight = self.weigh(bytes);
        Some((Arc::new(record), until, weight))
    }
}

/// `record`, kept until `until`, if it may answer a claim of `key` in `scope` now: before
/// its deadline (an expired copy is removed, never served again) and of the same scope
/// (another scope's record is the store's to answer, as it would be without the cache).
fn live(
    cache: &Cache<Box<str>, Held, ByWeight>,
    key: &str,
    scope: Option<&str>,
    record: Arc<Record>,
    until: Instant,
) -> Option<Arc<Record>> {
    if Instant::now() >= until {
        // Expired by the store's count (or past `max_age`).
        cache.remove(key);
        return None;
    }
    (record.scope.as_deref() == scope).then_some(record)
}

impl<S> core::fmt::Debug for NearCache<S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("NearCache")
            .field("len", &self.len())
            .field("weight", &self.weight())
            .field("max_age", &self.max_age)
            .field("hits", &self.hits())
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl<S: Store> Store for NearCache<S> {
    async fn claim(&self, req: ClaimRequest<'_>) -> StoreResult<ClaimOutcome> {
        match self.find(&req) {
            Found::Copy(record) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(ClaimOutcome::Completed(record));
            }
            Found::Hint => {
                if let Some(record) = self.confirm(&req).await? {
                    return Ok(ClaimOutcome::Completed(record));
                }
            }
            Found::Nothing => {}
        }
        let outcome = self.inner.claim(req).await?;
        if let ClaimOutcome::Completed(record) = &outcome {
            if record.scope.as_deref() == req.scope {
                self.hint(req.key);
            }
        }
        Ok(outcome)
    }

    /// A live copy in `scope` (a hit, as a claim answered here is), else the inner
    /// store's own answer (an in-process store's).
    fn completed_now(&self, key: &str, scope: Option<&str>) -> Option<Arc<Record>> {
        if let Some(record) = self.copy(key, scope) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Some(record);
        }
        self.inner.completed_now(key, scope)
    }

    async fn takeover(&self, req: ClaimRequest<'_>, stale_token: u64) -> StoreResult<ClaimOutcome> {
        let outcome = self.inner.takeover(req, stale_token).await;
        self.forget(req.key);
        outcome
    }

    async fn complete(&self, key: &str, token: u64, completion: Completion<'_>) -> StoreResult {
        let done = self.inner.complete(key, token, completion).await;
        match done {
            Ok(()) => self.hint(key),
            Err(_) => self.forget(key),
        }
        done
    }

    async fn release(&self, key: &str, token: u64) -> StoreResult {
        let released = self.inner.release(key, token).await;
        self.forget(key);
        released
    }

    async fn renew(&self, key: &str, token: u64, lease: Duration) -> StoreResult {
        self.inner.renew(key, token, lease).await
    }

    async fn abandon(&self, key: &str, token: u64) -> StoreResult {
        let abandoned = self.inner.abandon(key, token).await;
        self.forget(key);
        abandoned
    }

    /// Always the store's record: operator reads are never served from the cache.
    async fn lookup(&self, key: &str) -> StoreResult<Option<Record>> {
        self.inner.lookup(key).await
    }

    /// Always the store's read: operator reads are never served from the cache.
    async fn observe(&self, key: &str) -> StoreResult<Option<Observed>> {
        self.inner.observe(key).await
    }

    async fn pending(&self, limit: usize) -> StoreResult<Vec<Record>> {
        self.inner.pending(limit).await
    }

    async fn resolve(&self, request: ResolveRequest<'_>) -> StoreResult {
        let resolved = self.inner.resolve(request).await;
        match (&resolved, request.resolution) {
            (Ok(()), Resolution::Complete { .. }) => self.hint(request.key),
            _ => self.forget(request.key),
        }
        resolved
    }

    async fn history(&self, key: &str) -> StoreResult<Vec<HistoryEvent>> {
        self.inner.history(key).await
    }

    /// Purges the store, then drops the copies whose deadline passed (those the store
    /// purged; a live copy is of a record the store keeps).
    async fn purge_expired(&self) -> StoreResult<u64> {
        let purged = self.inner.purge_expired().await;
        if let Some(cache) = &self.cache {
            let now = Instant::now();
            cache.retain(|_, held| match held {
                Held::Copy { until, .. } => *until > now,
                Held::Hint { .. } => true,
            });
        }
        purged
    }

    async fn wait(&self, key: &str, timeout: Duration) {
        self.inner.wait(key, timeout).await
    }

    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
}
