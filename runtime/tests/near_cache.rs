//! The near cache's rules (docs/stores.md, "Near cache"), on stores whose behaviour a test
//! controls: a store whose clock runs an hour ahead of or behind the worker's, a store an
//! operator empties behind the cache's back, small bounds. The backends' own clocks are
//! checked by `conformance::run_all_near_cached` in each backend's suite.

mod conformance;

use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use tool_contracts_runtime::store::{
    ClaimOutcome, ClaimRequest, Completion, HistoryEvent, HistoryKind, MemoryStore, NearCache,
    Observed, Record, RecordState, Resolution, ResolveRequest, Store, StoreResult,
};

use conformance::{acquire, completion, done, Counting};

const LONG: Duration = Duration::from_secs(30);

fn req(key: &str) -> ClaimRequest<'_> {
    ClaimRequest {
        key,
        tool: "near_tool",
        version: 1,
        scope: Some("tenant-n"),
        fingerprint: "fp",
        args: "{}",
        lease: LONG,
        ttl: Duration::from_secs(60),
        worker: "near-test",
    }
}

fn result_of(outcome: &ClaimOutcome) -> Option<&str> {
    match outcome {
        ClaimOutcome::Completed(record) => match &record.state {
            RecordState::Completed { result, .. } => Some(result),
            RecordState::InProgress { .. } => None,
        },
        _ => None,
    }
}

/// Completes `key` through `store` with `result`, kept `ttl`.
async fn complete(store: &dyn Store, key: &str, result: &str, ttl: Duration) {
    let token = acquire(store, req(key)).await;
    store
        .complete(key, token, completion(result, ttl))
        .await
        .unwrap();
}

// ---------------------------------------------------------------------------------------
// A store whose clock is not the worker's.

/// A `MemoryStore` seen through a clock `offset` away from this process's: every time it
/// reports (records, `observe`'s `now`, history) is moved by `offset`, as a server whose
/// clock runs ahead (or behind) would report them. Its decisions (expiry, leases) are the
/// inner store's, so they agree with the times it reports.
struct Skewed {
    inner: MemoryStore,
    ahead: bool,
    offset: Duration,
    /// How far behind its read `observe`'s `now` is, beyond `offset`: a store whose clock
    /// counts whole milliseconds reports up to 1 ms less than the instant it read.
    now_behind: Duration,
}

impl Skewed {
    fn shift(&self, t: SystemTime) -> SystemTime {
        if self.ahead {
            t + self.offset
        } else {
            t - self.offset
        }
    }

    fn record(&self, mut r: Record) -> Record {
        r.created_at = self.shift(r.created_at);
        r.updated_at = self.shift(r.updated_at);
        r.expires_at = self.shift(r.expires_at);
        r.state = match r.state {
            RecordState::InProgress {
                token,
                lease_expires_at,
            } => RecordState::InProgress {
                token,
                lease_expires_at: self.shift(lease_expires_at),
            },
            RecordState::Completed {
                result,
                is_error,
                completed_at,
            } => RecordState::Completed {
                result,
                is_error,
                completed_at: self.shift(completed_at),
            },
        };
        r
    }

    fn outcome(&self, outcome: ClaimOutcome) -> ClaimOutcome {
        match outcome {
            ClaimOutcome::Completed(r) => {
                ClaimOutcome::Completed(Arc::new(self.record((*r).clone())))
            }
            other => other,
        }
    }
}

#[async_trait::async_trait]
impl Store for Skewed {
    async fn claim(&self, req: ClaimRequest<'_>) -> StoreResult<ClaimOutcome> {
        Ok(self.outcome(self.inner.claim(req).await?))
    }
    async fn takeover(&self, req: ClaimRequest<'_>, stale_token: u64) -> StoreResult<ClaimOutcome> {
        Ok(self.outcome(self.inner.takeover(req, stale_token).await?))
    }
    async fn complete(&self, key: &str, token: u64, completion: Completion<'_>) -> StoreResult {
        self.inner.complete(key, token, completion).await
    }
    async fn release(&self, key: &str, token: u64) -> StoreResult {
        self.inner.release(key, token).await
    }
    async fn renew(&self, key: &str, token: u64, lease: Duration) -> StoreResult {
        self.inner.renew(key, token, lease).await
    }
    async fn abandon(&self, key: &str, token: u64) -> StoreResult {
        self.inner.abandon(key, token).await
    }
    async fn lookup(&self, key: &str) -> StoreResult<Option<Record>> {
        Ok(self.inner.lookup(key).await?.map(|r| self.record(r)))
    }
    async fn observe(&self, key: &str) -> StoreResult<Option<Observed>> {
        Ok(self.inner.observe(key).await?.map(|seen| {
            let now = self.shift(seen.now) - self.now_behind;
            Observed::new(self.record(seen.record), now)
        }))
    }
    async fn pending(&self, limit: usize) -> StoreResult<Vec<Record>> {
        let pending = self.inner.pending(limit).await?;
        Ok(pending.into_iter().map(|r| self.record(r)).collect())
    }
    async fn resolve(&self, request: ResolveRequest<'_>) -> StoreResult {
        self.inner.resolve(request).await
    }
    async fn history(&self, key: &str) -> StoreResult<Vec<HistoryEvent>> {
        let history = self.inner.history(key).await?;
        Ok(history
            .into_iter()
            .map(|e| HistoryEvent {
                at: self.shift(e.at),
                ..e
            })
            .collect())
    }
    async fn purge_expired(&self) -> StoreResult<u64> {
        self.inner.purge_expired().await
    }
}

/// A `MemoryStore` whose clock is an hour ahead of the worker's, or behind it.
fn skewed(ahead: bool) -> Arc<Skewed> {
    Arc::new(Skewed {
        inner: MemoryStore::new(),
        ahead,
        offset: Duration::from_secs(3600),
        now_behind: Duration::ZERO,
    })
}

/// A store an hour ahead of the worker would let a cache that counts by the worker's wall
/// clock (`expires_at - SystemTime::now()`) serve a copy for an hour too long. By the
/// store's own clock, the copy ends at the store's expiry. The whole suite passes too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_end_at_the_expiry_of_a_store_whose_clock_runs_ahead() {
    let p = conformance::unique("ahead");
    conformance::near_cache_never_serves_past_the_stores_expiry(skewed(true), &p).await;
    conformance::run_all_near_cached(skewed(true), &p).await;
}

/// A store an hour behind would leave that cache keeping nothing (every record expired
/// by the worker's clock); by the store's, copies serve until the store's expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_serve_until_the_expiry_of_a_store_whose_clock_runs_behind() {
    let p = conformance::unique("behind");
    conformance::near_cache_never_serves_past_the_stores_expiry(skewed(false), &p).await;
    conformance::run_all_near_cached(skewed(false), &p).await;
}

/// A store whose clock counts whole milliseconds (Redis's scripts floor `TIME`) reports a
/// `now` up to 1 ms behind the instant of its read, so a deadline counted from it could end
/// up to 1 ms past the store's expiry: the cache takes that millisecond off. Claimed the
/// moment the store counts the key expired, no copy is served; claimed a few milliseconds
/// before, the copy still is (the margin is not a blunt one). (Before the margin, Redis
/// Cluster's conformance run in CI served a copy in that last millisecond; with the margin
/// set to zero this test fails on its first round.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_ends_before_the_expiry_of_a_store_that_counts_whole_milliseconds() {
    const TTL: Duration = Duration::from_millis(300);
    let store = Arc::new(Skewed {
        inner: MemoryStore::new(),
        ahead: true,
        offset: Duration::ZERO,
        now_behind: Duration::from_micros(999),
    });
    let near = NearCache::new(Arc::clone(&store));
    for round in 0..6 {
        let key = format!("whole-ms-{round}");
        complete(&near, &key, "\"ms\"", TTL).await;
        // The first claim reads the key with `observe` and keeps a copy; the second is
        // served from it.
        let hits = near.hits();
        for _ in 0..2 {
            let outcome = near.claim(req(&key)).await.unwrap();
            assert_eq!(result_of(&outcome), Some("\"ms\""));
        }
        assert_eq!(near.hits(), hits + 1, "the copy was kept and served");
        // Sleep to 5 ms before the store's expiry: the copy still serves there.
        let expires_at = store.inner.lookup(&key).await.unwrap().unwrap().expires_at;
        let early = expires_at - Duration::from_millis(5);
        if let Ok(wait) = early.duration_since(std::time::SystemTime::now()) {
            tokio::time::sleep(wait).await;
            let hits = near.hits();
            let outcome = near.claim(req(&key)).await.unwrap();
            // Unless this thread was held up past the expiry meanwhile.
            if std::time::SystemTime::now() < expires_at - Duration::from_millis(2) {
                assert_eq!(result_of(&outcome), Some("\"ms\""));
                assert_eq!(near.hits(), hits + 1, "round {round}: served from the copy");
            }
        }
        // Wait, by the store's own count, for the key's expiry; then claim at once.
        loop {
            let seen = store.inner.observe(&key).await.unwrap().unwrap();
            if seen.record.expires_at <= seen.now {
                break;
            }
            std::hint::spin_loop();
        }
        let outcome = near.claim(req(&key)).await.unwrap();
        assert!(
            matches!(outcome, ClaimOutcome::Acquired { .. }),
            "round {round}: a copy was served after the store's expiry: {outcome:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Bounded memory.

#[tokio::test]
async fn the_cache_keeps_at_most_max_entries() {
    let counting = Counting::new(Arc::new(MemoryStore::new()));
    let near = NearCache::builder(Arc::clone(&counting))
        .max_entries(8)
        .build();
    let keys: Vec<String> = (0..100).map(|i| format!("entries-{i}")).collect();
    for key in &keys {
        complete(&near, key, "1", LONG).await;
        for _ in 0..3 {
            assert_eq!(result_of(&near.claim(req(key)).await.unwrap()), Some("1"));
        }
        assert!(near.len() <= 8, "{} entries kept", near.len());
    }
    assert!(near.hits() > 0 && !near.is_empty(), "it kept nothing");
    // Every key still replays: the evicted ones from the store.
    for key in &keys {
        assert_eq!(result_of(&near.claim(req(key)).await.unwrap()), Some("1"));
    }
    assert!(near.len() <= 8);
}

#[tokio::test]
async fn the_cache_keeps_at_most_max_bytes_and_no_record_larger_than_them() {
    const MAX: u64 = 64 * 1024;
    let counting = Counting::new(Arc::new(MemoryStore::new()));
    let near = NearCache::builder(Arc::clone(&counting))
        .max_bytes(MAX)
        .build();
    let ten_kib = format!("\"{}\"", "x".repeat(10 * 1024));
    for i in 0..50 {
        let key = format!("bytes-{i}");
        complete(&near, &key, &ten_kib, LONG).await;
        for _ in 0..3 {
            let answer = near.claim(req(&key)).await.unwrap();
            assert_eq!(result_of(&answer), Some(ten_kib.as_str()));
        }
        assert!(near.weight() <= MAX, "{} bytes kept", near.weight());
        assert!(near.len() <= 6, "{} records of 10 KiB kept", near.len());
    }
    assert!(near.hits() > 0, "it kept nothing");

    // A record larger than the whole budget is answered, and read from the store each time.
    let big = format!("\"{}\"", "y".repeat(100 * 1024));
    complete(&near, "bytes-big", &big, LONG).await;
    let before = counting.round_trips();
    for _ in 0..3 {
        let answer = near.claim(req("bytes-big")).await.unwrap();
        assert_eq!(result_of(&answer), Some(big.as_str()));
    }
    assert!(
        counting.round_trips() - before >= 3,
        "a record over max_bytes was kept"
    );
    assert!(near.weight() <= MAX);
}

// ---------------------------------------------------------------------------------------
// Invalidation.

/// A `MemoryStore` that an operator can empty (as a `DEL` or a `DELETE` in another process
/// would), without the near cache in front of it knowing.
struct Removable(RwLock<Arc<MemoryStore>>);

impl Removable {
    fn new() -> Arc<Self> {
        Arc::new(Self(RwLock::new(Arc::new(MemoryStore::new()))))
    }

    fn now(&self) -> Arc<MemoryStore> {
        Arc::clone(&self.0.read().unwrap())
    }

    /// An operator removes every key, elsewhere.
    fn remove_everything(&self) {
        *self.0.write().unwrap() = Arc::new(MemoryStore::new());
    }
}

#[async_trait::async_trait]
impl Store for Removable {
    async fn claim(&self, req: ClaimRequest<'_>) -> StoreResult<ClaimOutcome> {
        self.now().claim(req).await
    }
    async fn takeover(&self, req: ClaimRequest<'_>, stale_token: u64) -> StoreResult<ClaimOutcome> {
        self.now().takeover(req, stale_token).await
    }
    async fn complete(&self, key: &str, token: u64, completion: Completion<'_>) -> StoreResult {
        self.now().complete(key, token, completion).await
    }
    async fn release(&self, key: &str, token: u64) -> StoreResult {
        self.now().release(key, token).await
    }
    async fn renew(&self, key: &str, token: u64, lease: Duration) -> StoreResult {
        self.now().renew(key, token, lease).await
    }
    async fn abandon(&self, key: &str, token: u64) -> StoreResult {
        self.now().abandon(key, token).await
    }
    async fn lookup(&self, key: &str) -> StoreResult<Option<Record>> {
        self.now().lookup(key).await
    }
    async fn pending(&self, limit: usize) -> StoreResult<Vec<Record>> {
        self.now().pending(limit).await
    }
    async fn resolve(&self, request: ResolveRequest<'_>) -> StoreResult {
        self.now().resolve(request).await
    }
    async fn history(&self, key: &str) -> StoreResult<Vec<HistoryEvent>> {
        self.now().history(key).await
    }
    async fn purge_expired(&self) -> StoreResult<u64> {
        self.now().purge_expired().await
    }
}

/// A near cache holding `key`'s result "old", whose record an operator then removed in
/// another process, after which another worker claimed it (not through this cache): the
/// copy here is stale and still served, as documented, until this process writes the key.
async fn stale_copy(key: &str) -> (Arc<Removable>, NearCache<Arc<Removable>>, u64) {
    let store = Removable::new();
    let near = NearCache::new(Arc::clone(&store));
    complete(&near, key, "\"old\"", LONG).await;
    assert_eq!(
        result_of(&near.claim(req(key)).await.unwrap()),
        Some("\"old\"")
    );
    store.remove_everything();
    let token = acquire(&*store, req(key)).await;
    let hits = near.hits();
    assert_eq!(
        result_of(&near.claim(req(key)).await.unwrap()),
        Some("\"old\""),
        "a removal in another process is not seen here (docs/stores.md)"
    );
    assert_eq!(near.hits(), hits + 1);
    (store, near, token)
}

fn by_operator<'a>(key: &'a str, resolution: Resolution<'a>) -> ResolveRequest<'a> {
    ResolveRequest {
        key,
        resolution,
        kind: HistoryKind::Resolved,
        worker: "operator",
    }
}

#[tokio::test]
async fn resolving_a_key_in_this_process_drops_its_copy() {
    // Released by the operator: the next claim runs.
    let (_, near, _) = stale_copy("resolve-release").await;
    let release = by_operator("resolve-release", Resolution::Release);
    near.resolve(release).await.unwrap();
    assert!(matches!(
        near.claim(req("resolve-release")).await.unwrap(),
        ClaimOutcome::Acquired { .. }
    ));

    // Completed by the operator: the next claims replay the operator's result.
    let (_, near, _) = stale_copy("resolve-complete").await;
    let resolution = Resolution::Complete {
        result: "\"new\"",
        ttl: LONG,
    };
    near.resolve(by_operator("resolve-complete", resolution))
        .await
        .unwrap();
    for _ in 0..3 {
        let answer = near.claim(req("resolve-complete")).await.unwrap();
        assert_eq!(result_of(&answer), Some("\"new\""));
    }
}

#[tokio::test]
async fn a_holders_release_abandon_or_completion_in_this_process_drops_the_copy() {
    let (_, near, token) = stale_copy("release").await;
    near.release("release", token).await.unwrap();
    assert!(matches!(
        near.claim(req("release")).await.unwrap(),
        ClaimOutcome::Acquired { .. }
    ));

    let (_, near, token) = stale_copy("abandon").await;
    near.abandon("abandon", token).await.unwrap();
    assert!(matches!(
        near.claim(req("abandon")).await.unwrap(),
        ClaimOutcome::Abandoned { .. }
    ));

    let (_, near, token) = stale_copy("complete").await;
    near.complete("complete", token, done("\"new\""))
        .await
        .unwrap();
    assert_eq!(
        result_of(&near.claim(req("complete")).await.unwrap()),
        Some("\"new\"")
    );
}

/// `max_age` bounds how long a removal elsewhere goes unseen; without it, the copy serves
/// until the store's expiry (the documented limit).
#[tokio::test]
async fn max_age_bounds_how_long_a_removal_elsewhere_goes_unseen() {
    let store = Removable::new();
    let bounded = NearCache::builder(Arc::clone(&store))
        .max_age(Duration::from_millis(300))
        .build();
    let unbounded = NearCache::new(Arc::clone(&store));
    for near in [&bounded, &unbounded] {
        complete(near, "aged", "\"old\"", LONG).await;
        assert!(result_of(&near.claim(req("aged")).await.unwrap()).is_some());
        store.remove_everything();
    }
    complete(&*store, "aged", "\"new\"", LONG).await;
    for near in [&bounded, &unbounded] {
        let answer = near.claim(req("aged")).await.unwrap();
        assert_eq!(result_of(&answer), Some("\"old\""), "within max_age");
    }
    tokio::time::sleep(Duration::from_millis(350)).await;
    let answer = bounded.claim(req("aged")).await.unwrap();
    assert_eq!(
        result_of(&answer),
        Some("\"new\""),
        "past max_age: the store's"
    );
    let answer = unbounded.claim(req("aged")).await.unwrap();
    assert_eq!(
        result_of(&answer),
        Some("\"old\""),
        "no max_age: until expiry"
    );
}

#[tokio::test]
async fn purging_drops_the_copies_of_expired_records() {
    let near = NearCache::new(MemoryStore::new());
    complete(&near, "purged", "1", Duration::from_millis(200)).await;
    assert!(result_of(&near.claim(req("purged")).await.unwrap()).is_some());
    assert_eq!(near.len(), 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(near.purge_expired().await.unwrap(), 1);
    assert!(near.is_empty(), "{near:?}");
}

/// The URL form: `?near_cache=N` wraps the store, and the other parameters still reach it.
#[tokio::test]
async fn a_store_url_turns_the_near_cache_on() {
    let store = tool_contracts_runtime::store::open("memory:?near_cache=100&near_cache_max_age=1m")
        .await
        .unwrap();
    assert_eq!(store.backend(), "memory");
    complete(&*store, "url", "7", LONG).await;
    for _ in 0..3 {
        assert_eq!(
            result_of(&store.claim(req("url")).await.unwrap()),
            Some("7")
        );
    }
    let refused = tool_contracts_runtime::store::open("memory:?near_cache=many").await;
    assert!(refused.is_err());
}
