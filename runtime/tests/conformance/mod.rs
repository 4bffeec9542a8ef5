//! The store conformance suite: every backend runs `run_all` against a fresh store.
//!
//! Leases and expiry are real time on every backend (shared backends use the server's
//! clock), so the suite uses short leases and real sleeps, with margins wide enough for a
//! loaded 2-core CI machine.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tool_contracts_runtime::store::{
    ClaimOutcome, ClaimRequest, Completion, HistoryEvent, HistoryKind, NearCache, Observed, Record,
    RecordState, Resolution, ResolveRequest, Store, StoreError, StoreResult,
};

/// A fresh prefix per suite run, so suites can share one server.
pub fn unique(prefix: &str) -> String {
    use std::time::{SystemTime, UNIX_EPOCH};
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{prefix}-{}-{nanos}", std::process::id())
}

/// An operator's decision for `key`.
fn by_operator<'a>(key: &'a str, resolution: Resolution<'a>) -> ResolveRequest<'a> {
    ResolveRequest {
        key,
        resolution,
        kind: HistoryKind::Resolved,
        worker: "operator",
    }
}

fn req<'a>(key: &'a str, lease: Duration) -> ClaimRequest<'a> {
    ClaimRequest {
        key,
        tool: "conformance_tool",
        version: 1,
        scope: Some("tenant-ä"),
        fingerprint: "note=abc",
        args: r#"{"note":"x"}"#,
        lease,
        ttl: Duration::from_secs(60),
        worker: "conformance-worker",
    }
}

const LONG: Duration = Duration::from_secs(30);

/// A successful result, kept for `ttl`.
pub fn completion(result: &str, ttl: Duration) -> Completion<'_> {
    Completion {
        result,
        is_error: false,
        ttl,
    }
}

/// A successful result, kept for a minute.
pub fn done(result: &str) -> Completion<'_> {
    completion(result, Duration::from_secs(60))
}

/// Runs `attempts` claims at once (`attempt(i)` makes the i-th) and returns how many
/// acquired; every other must be `InProgress`: a loser that answered from an out-of-date
/// view would say otherwise.
pub async fn winners<F, Fut>(attempts: usize, attempt: F) -> usize
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<ClaimOutcome, StoreError>> + Send + 'static,
{
    let tasks: Vec<_> = (0..attempts).map(|i| tokio::spawn(attempt(i))).collect();
    let mut won = 0;
    for task in tasks {
        match task.await.unwrap().unwrap() {
            ClaimOutcome::Acquired { .. } => won += 1,
            ClaimOutcome::InProgress { .. } => {}
            other => panic!("a loser must see the winner's claim, got {other:?}"),
        }
    }
    won
}

/// Claims `r.key`, which must be free, and returns the new token.
pub async fn acquire(store: &dyn Store, r: ClaimRequest<'_>) -> u64 {
    match store.claim(r).await.expect("claim") {
        ClaimOutcome::Acquired { token } => token,
        other => panic!("expected Acquired for {}, got {other:?}", r.key),
    }
}

/// Runs every case; `p` prefixes keys so runs on a shared server don't collide.
pub async fn run_all(store: Arc<dyn Store>, p: &str) {
    claim_complete_replay(&*store, p).await;
    concurrent_claims_have_one_winner(Arc::clone(&store), p).await;
    stale_holder_is_fenced_after_takeover(&*store, p).await;
    release_frees_the_key_and_tokens_never_repeat(&*store, p).await;
    renewal_keeps_a_claim_alive(&*store, p).await;
    expired_claim_is_abandoned_not_free(&*store, p).await;
    takeover_of_a_live_claim_reports_it(&*store, p).await;
    expired_results_are_claimable_and_purged(&*store, p).await;
    large_results_round_trip(&*store, p).await;
    non_ascii_keys_and_scopes_round_trip(&*store, p).await;
    error_results_keep_their_flag(&*store, p).await;
    abandon_makes_the_outcome_unknown_at_once(&*store, p).await;
    operators_list_and_resolve_pending_keys(&*store, p).await;
    history_records_every_transition(&*store, p).await;
    observe_reads_a_record_by_the_stores_clock_and_changes_nothing(&*store, p).await;
    version_and_update_time_follow_every_transition(&*store, p).await;
    completed_now_answers_only_as_a_claim_would(&*store, p).await;
}

/// Runs every case on `inner` wrapped in a [`NearCache`] (every store's suite must pass
/// with it on), then the near cache's own cases against the backend's real clock: repeated
/// replays answered without a round trip, never past the store's expiry, and only in the
/// record's scope.
pub async fn run_all_near_cached(inner: Arc<dyn Store>, p: &str) {
    run_all(
        Arc::new(NearCache::new(Arc::clone(&inner))),
        &format!("{p}-near"),
    )
    .await;
    near_cache_replays_without_a_round_trip(Arc::clone(&inner), p).await;
    near_cache_never_serves_past_the_stores_expiry(Arc::clone(&inner), p).await;
    near_cache_is_scope_exact(inner, p).await;
}

/// A store that counts the operations that reach `inner` (claims and reads), to tell a
/// near cache's answer from the store's.
pub struct Counting {
    pub inner: Arc<dyn Store>,
    pub claims: AtomicU64,
    pub observes: AtomicU64,
}

impl Counting {
    pub fn new(inner: Arc<dyn Store>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            claims: AtomicU64::new(0),
            observes: AtomicU64::new(0),
        })
    }

    /// Claims and reads that reached the store so far.
    pub fn round_trips(&self) -> u64 {
        self.claims.load(Ordering::SeqCst) + self.observes.load(Ordering::SeqCst)
    }
}

#[async_trait::async_trait]
impl Store for Counting {
    async fn claim(&self, req: ClaimRequest<'_>) -> StoreResult<ClaimOutcome> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        self.inner.claim(req).await
    }
    async fn takeover(&self, req: ClaimRequest<'_>, stale_token: u64) -> StoreResult<ClaimOutcome> {
        self.inner.takeover(req, stale_token).await
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
        self.observes.fetch_add(1, Ordering::SeqCst);
        self.inner.lookup(key).await
    }
    async fn observe(&self, key: &str) -> StoreResult<Option<Observed>> {
        self.observes.fetch_add(1, Ordering::SeqCst);
        self.inner.observe(key).await
    }
    async fn pending(&self, limit: usize) -> StoreResult<Vec<Record>> {
        self.inner.pending(limit).await
    }
    async fn resolve(&self, request: ResolveRequest<'_>) -> StoreResult {
        self.inner.resolve(request).await
    }
    async fn history(&self, key: &str) -> StoreResult<Vec<HistoryEvent>> {
        self.inner.history(key).await
    }
    async fn purge_expired(&self) -> StoreResult<u64> {
        self.inner.purge_expired().await
    }
    async fn wait(&self, key: &str, timeout: Duration) {
        self.inner.wait(key, timeout).await
    }
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
}

/// A completed key is read from the store once more (with `observe`, in place of the
/// claim it answers), then served here: ten replays, one round trip.
pub async fn near_cache_replays_without_a_round_trip(inner: Arc<dyn Store>, p: &str) {
    let counting = Counting::new(inner);
    let near = NearCache::new(Arc::clone(&counting));
    let key = format!("{p}/near-replay");
    let token = acquire(&near, req(&key, LONG)).await;
    near.complete(&key, token, done("{\"n\":1}")).await.unwrap();
    let before = counting.round_trips();
    for _ in 0..10 {
        let ClaimOutcome::Completed(record) = near.claim(req(&key, LONG)).await.unwrap() else {
            panic!("a completed key replays");
        };
        assert!(
            matches!(&record.state, RecordState::Completed { result, .. } if result == "{\"n\":1}")
        );
        assert_eq!(record.scope.as_deref(), Some("tenant-ä"));
    }
    assert_eq!(
        counting.round_trips() - before,
        1,
        "ten replays, one read of the store"
    );
    assert_eq!(near.hits(), 9);
}

/// A result kept 700 ms by the store: replayed from the cache meanwhile, and never once the
/// store counts it expired (checked against the store itself before each claim, by its
/// own clock: the server's for Redis and PostgreSQL).
pub async fn near_cache_never_serves_past_the_stores_expiry(inner: Arc<dyn Store>, p: &str) {
    let near = NearCache::new(Arc::clone(&inner));
    let key = format!("{p}/near-expiry");
    let token = acquire(&near, req(&key, LONG)).await;
    let short = completion("\"short\"", Duration::from_millis(700));
    near.complete(&key, token, short).await.unwrap();
    let started = std::time::Instant::now();
    let mut replays_while_live = 0;
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the key never became claimable again"
        );
        // Expired by the store's count at this read (expiry never comes undone).
        let expired = match inner.observe(&key).await.unwrap() {
            None => true,
            Some(seen) => seen.record.expires_at <= seen.now,
        };
        match near.claim(req(&key, LONG)).await.unwrap() {
            ClaimOutcome::Completed(_) if expired => panic!(
                "a copy was served after the store's expiry ({:?} after completion)",
                started.elapsed()
            ),
            ClaimOutcome::Completed(_) => replays_while_live += 1,
            ClaimOutcome::Acquired { token } => {
                near.release(&key, token).await.unwrap();
                break;
            }
            other => panic!("{other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        near.hits() > 0 && replays_while_live > 0,
        "the cache served nothing ({} hits): the check proved nothing",
        near.hits()
    );
}

/// A copy is served only in the scope its record was made in: a claim of the same key in
/// another scope goes to the store (and gets the store's answer), and a claim in the
/// record's scope is still served here.
pub async fn near_cache_is_scope_exact(inner: Arc<dyn Store>, p: &str) {
    let counting = Counting::new(inner);
    let near = NearCache::new(Arc::clone(&counting));
    let key = format!("{p}/near-scope");
    let token = acquire(&near, req(&key, LONG)).await;
    near.complete(&key, token, done("\"ä\"")).await.unwrap();
    assert!(matches!(
        near.claim(req(&key, LONG)).await.unwrap(),
        ClaimOutcome::Completed(_)
    ));
    for other_scope in [Some("tenant-b"), None, Some("tenant-ä/child")] {
        let before = counting.claims.load(Ordering::SeqCst);
        let mut other = req(&key, LONG);
        other.scope = other_scope;
        let answer = near.claim(other).await.unwrap();
        assert_eq!(
            counting.claims.load(Ordering::SeqCst),
            before + 1,
            "a claim in scope {other_scope:?} must reach the store"
        );
        // The store's own answer, whatever it is, passed through unchanged.
        assert_eq!(answer, counting.inner.claim(other).await.unwrap());
    }
    let hits = near.hits();
    let round_trips = counting.round_trips();
    assert!(matches!(
        near.claim(req(&key, LONG)).await.unwrap(),
        ClaimOutcome::Completed(_)
    ));
    assert_eq!(near.hits(), hits + 1, "its own scope is still served here");
    assert_eq!(counting.round_trips(), round_trips);
}

/// The record and the store's clock of one read: a live lease ends after `now`, an
/// abandoned one at or before it, whatever the reader's clock says.
fn lease_left(observed: &Observed) -> Option<Duration> {
    match observed.record.state {
        RecordState::InProgress {
            lease_expires_at, ..
        } => Some(
            lease_expires_at
                .duration_since(observed.now)
                .unwrap_or(Duration::ZERO),
        ),
        RecordState::Completed { .. } => None,
    }
}

pub async fn observe_reads_a_record_by_the_stores_clock_and_changes_nothing(
    store: &dyn Store,
    p: &str,
) {
    let absent = format!("{p}/observe-absent");
    assert_eq!(store.observe(&absent).await.unwrap(), None);
    assert!(store.history(&absent).await.unwrap().is_empty());

    // In progress: a live lease, by the store's clock; reading it twice changes nothing,
    // and a claim still finds the holder.
    let live = format!("{p}/observe-live");
    let token = acquire(store, req(&live, LONG)).await;
    let history = store.history(&live).await.unwrap();
    let seen = store.observe(&live).await.unwrap().expect("a live claim");
    let left = lease_left(&seen).expect("in progress");
    assert!(
        left > Duration::from_secs(20) && left <= LONG,
        "a 30 s lease just claimed has {left:?} left by the store's clock"
    );
    assert!(matches!(seen.record.state, RecordState::InProgress { token: t, .. } if t == token));
    assert_eq!(seen.record.scope.as_deref(), Some("tenant-ä"));
    assert_eq!(seen.record.args, r#"{"note":"x"}"#);
    assert!(seen.record.created_at <= seen.now && seen.record.updated_at <= seen.now);
    let again = store.observe(&live).await.unwrap().expect("still there");
    assert!(matches!(again.record.state, RecordState::InProgress { token: t, .. } if t == token));
    assert!(
        again.now >= seen.now,
        "the store's clock does not run back between reads"
    );
    assert_eq!(store.history(&live).await.unwrap(), history);
    assert!(matches!(
        store.claim(req(&live, LONG)).await.unwrap(),
        ClaimOutcome::InProgress { .. }
    ));

    // Completed: the record a replay gets, read without claiming.
    store
        .complete(&live, token, done("{\"ok\":true}"))
        .await
        .unwrap();
    let seen = store.observe(&live).await.unwrap().expect("a result");
    assert!(matches!(&seen.record.state,
        RecordState::Completed { result, is_error: false, .. } if result == "{\"ok\":true}"));
    assert_eq!(lease_left(&seen), None);
    assert_eq!(
        store.lookup(&live).await.unwrap(),
        Some(seen.record.clone())
    );
    let ClaimOutcome::Completed(replayed) = store.claim(req(&live, LONG)).await.unwrap() else {
        panic!("a completed key replays");
    };
    assert_eq!(*replayed, seen.record, "a read and a replay see one record");

    // Abandoned: the lease ran out by the store's clock, and the record says so.
    let expired = format!("{p}/observe-expired");
    acquire(store, req(&expired, Duration::from_millis(150))).await;
    tokio::time::sleep(Duration::from_millis(350)).await;
    let history = store.history(&expired).await.unwrap();
    let seen = store
        .observe(&expired)
        .await
        .unwrap()
        .expect("an abandoned claim");
    assert_eq!(lease_left(&seen), Some(Duration::ZERO), "{seen:?}");
    assert_eq!(
        store.history(&expired).await.unwrap(),
        history,
        "a read takes nothing over"
    );
    assert!(matches!(
        store.claim(req(&expired, LONG)).await.unwrap(),
        ClaimOutcome::Abandoned { .. }
    ));

    // Abandoned at once by its holder.
    let given_up = format!("{p}/observe-abandoned");
    let token = acquire(store, req(&given_up, LONG)).await;
    store.abandon(&given_up, token).await.unwrap();
    let seen = store
        .observe(&given_up)
        .await
        .unwrap()
        .expect("an abandoned claim");
    assert_eq!(lease_left(&seen), Some(Duration::ZERO));
}

pub async fn version_and_update_time_follow_every_transition(store: &dyn Store, p: &str) {
    let pause = || tokio::time::sleep(Duration::from_millis(30));
    let key = format!("{p}/version");
    let claim = |version, lease| ClaimRequest {
        version,
        ..req(&key, lease)
    };
    let record = || async { store.observe(&key).await.unwrap().expect("a record").record };
    // Claimed under version 7: created and updated at the claim.
    let t1 = acquire(store, claim(7, Duration::from_millis(150))).await;
    let claimed = record().await;
    assert_eq!(claimed.version, Some(7));
    assert_eq!(claimed.updated_at, claimed.created_at);
    let listed = store.pending(100_000).await.unwrap();
    let listed = listed.iter().find(|r| r.key == key).expect("pending");
    assert_eq!(
        (listed.version, listed.updated_at),
        (Some(7), claimed.updated_at)
    );

    // A renewal is not a transition.
    pause().await;
    store
        .renew(&key, t1, Duration::from_millis(150))
        .await
        .unwrap();
    assert_eq!(record().await.updated_at, claimed.updated_at);

    // Taken over under version 8 once the lease ran out: a new update time, the same
    // creation time.
    tokio::time::sleep(Duration::from_millis(350)).await;
    let ClaimOutcome::Acquired { token: t2 } = store.takeover(claim(8, LONG), t1).await.unwrap()
    else {
        panic!("an abandoned claim is taken over");
    };
    let taken = record().await;
    assert_eq!(taken.version, Some(8));
    assert_eq!(taken.created_at, claimed.created_at);
    assert!(taken.updated_at > claimed.updated_at, "{taken:?}");

    // Abandoned by its holder, then resolved by an operator: each moves the update time.
    pause().await;
    store.abandon(&key, t2).await.unwrap();
    let abandoned = record().await;
    assert!(abandoned.updated_at > taken.updated_at, "{abandoned:?}");
    pause().await;
    let resolution = Resolution::Complete {
        result: "\"resolved\"",
        ttl: LONG,
    };
    store.resolve(by_operator(&key, resolution)).await.unwrap();
    let resolved = record().await;
    assert!(resolved.updated_at > abandoned.updated_at, "{resolved:?}");
    assert_eq!(
        resolved.version,
        Some(8),
        "an operator's decision keeps the version"
    );
    let RecordState::Completed { completed_at, .. } = resolved.state else {
        panic!("resolved: {resolved:?}");
    };
    assert_eq!(resolved.updated_at, completed_at);

    // Completed by its holder: updated at the completion.
    let other = format!("{p}/version-complete");
    let token = acquire(
        store,
        ClaimRequest {
            version: 2,
            ..req(&other, LONG)
        },
    )
    .await;
    pause().await;
    store.complete(&other, token, done("1")).await.unwrap();
    let done_record = store
        .observe(&other)
        .await
        .unwrap()
        .expect("a result")
        .record;
    let RecordState::Completed { completed_at, .. } = done_record.state else {
        panic!("completed: {done_record:?}");
    };
    assert_eq!(done_record.version, Some(2));
    assert_eq!(done_record.updated_at, completed_at);
    assert!(done_record.updated_at > done_record.created_at);
}

pub async fn abandon_makes_the_outcome_unknown_at_once(store: &dyn Store, p: &str) {
    let key = format!("{p}/abandon-now");
    let token = acquire(store, req(&key, LONG)).await;
    store.abandon(&key, token).await.unwrap();
    assert!(matches!(
        store.claim(req(&key, LONG)).await.unwrap(),
        ClaimOutcome::Abandoned { token: t, .. } if t == token
    ));
    assert_eq!(
        store.complete(&key, token + 1_000_000, done("1")).await,
        Err(StoreError::LeaseLost {
            token: token + 1_000_000
        })
    );
}

pub async fn operators_list_and_resolve_pending_keys(store: &dyn Store, p: &str) {
    let first = format!("{p}/pending-1");
    let second = format!("{p}/pending-2");
    let t1 = acquire(store, req(&first, LONG)).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let t2 = acquire(store, req(&second, LONG)).await;
    let pending = store.pending(100_000).await.unwrap();
    let ours: Vec<&str> = pending
        .iter()
        .map(|r| r.key.as_str())
        .filter(|k| *k == first || *k == second)
        .collect();
    assert_eq!(ours, vec![first.as_str(), second.as_str()], "oldest first");
    let rec = pending.iter().find(|r| r.key == first).unwrap();
    assert_eq!(
        rec.args, r#"{"note":"x"}"#,
        "arguments kept for reconciliation"
    );
    assert!(matches!(rec.state, RecordState::InProgress { token, .. } if token == t1));

    let done_result = Resolution::Complete {
        result: "\"resolved\"",
        ttl: LONG,
    };
    store
        .resolve(by_operator(&first, done_result))
        .await
        .unwrap();
    assert_eq!(
        store.complete(&first, t1, done("1")).await,
        Err(StoreError::LeaseLost { token: t1 }),
        "the old holder is fenced out by a resolution"
    );
    assert!(matches!(
        store.claim(req(&first, LONG)).await.unwrap(),
        ClaimOutcome::Completed(ref rec) if matches!(rec.state, RecordState::Completed { ref result, .. } if result == "\"resolved\"")
    ));
    assert_eq!(
        store
            .resolve(by_operator(&first, Resolution::Release))
            .await,
        Err(StoreError::NotPending),
        "a completed result is never overwritten by an operator"
    );
    store
        .resolve(by_operator(&second, Resolution::Release))
        .await
        .unwrap();
    assert_eq!(
        store.release(&second, t2).await,
        Err(StoreError::LeaseLost { token: t2 })
    );
    let t3 = acquire(store, req(&second, LONG)).await;
    assert!(t3 > t2);
    assert_eq!(
        store
            .resolve(by_operator(
                &format!("{p}/never-claimed"),
                Resolution::Release
            ))
            .await,
        Err(StoreError::NotPending)
    );
}

pub async fn history_records_every_transition(store: &dyn Store, p: &str) {
    let key = format!("{p}/history");
    let t1 = acquire(store, req(&key, Duration::from_millis(150))).await;
    store.release(&key, t1).await.unwrap();
    let t2 = acquire(store, req(&key, Duration::from_millis(150))).await;
    tokio::time::sleep(Duration::from_millis(350)).await;
    let t3 = match store.takeover(req(&key, LONG), t2).await.unwrap() {
        ClaimOutcome::Acquired { token } => token,
        other => panic!("{other:?}"),
    };
    store.complete(&key, t3, done("7")).await.unwrap();
    let history = store.history(&key).await.unwrap();
    let kinds: Vec<HistoryKind> = history.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        vec![
            HistoryKind::Claimed,
            HistoryKind::Released,
            HistoryKind::Claimed,
            HistoryKind::TakenOver,
            HistoryKind::Completed
        ]
    );
    let tokens: Vec<u64> = history.iter().map(|e| e.token).collect();
    assert_eq!(tokens, vec![t1, t1, t2, t3, t3]);
    assert!(history.iter().all(|e| e.worker == "conformance-worker"));
    assert!(history.windows(2).all(|w| w[0].at <= w[1].at));
}

/// [`Store::completed_now`] (how the engine replays without a claim) may always say
/// nothing, but what it says is what a claim would answer at that moment: nothing for an
/// absent, in-progress or expired key, and for a completed one the very record a claim
/// returns, in the record's scope only.
pub async fn completed_now_answers_only_as_a_claim_would(store: &dyn Store, p: &str) {
    let key = format!("{p}/completed-now");
    let scope = Some("tenant-ä");
    assert_eq!(store.completed_now(&key, scope), None, "an absent key");
    let token = acquire(store, req(&key, LONG)).await;
    assert_eq!(store.completed_now(&key, scope), None, "a key in progress");
    let short = completion("\"now\"", Duration::from_millis(400));
    store.complete(&key, token, short).await.unwrap();
    // A near cache keeps a copy once a claim has read the record: claim first.
    let ClaimOutcome::Completed(claimed) = store.claim(req(&key, LONG)).await.unwrap() else {
        panic!("a completed key replays");
    };
    if let Some(now) = store.completed_now(&key, scope) {
        assert_eq!(*now, *claimed, "the record a claim answers");
    }
    assert_eq!(
        store.completed_now(&key, Some("tenant-b")),
        None,
        "another scope's record is never answered"
    );
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        store.completed_now(&key, scope),
        None,
        "an expired result counts as absent, as for a claim"
    );
    let again = acquire(store, req(&key, LONG)).await;
    store.release(&key, again).await.unwrap();
}

pub async fn claim_complete_replay(store: &dyn Store, p: &str) {
    let key = format!("{p}/replay");
    let token = acquire(store, req(&key, LONG)).await;
    match store.claim(req(&key, LONG)).await.unwrap() {
        ClaimOutcome::InProgress {
            fingerprint,
            lease_remaining,
        } => {
            assert_eq!(fingerprint, "note=abc");
            assert!(
                lease_remaining > Duration::from_secs(20),
                "{lease_remaining:?}"
            );
        }
        other => panic!("expected InProgress, got {other:?}"),
    }
    store.complete(&key, token, done("false")).await.unwrap();
    for _ in 0..3 {
        match store.claim(req(&key, LONG)).await.unwrap() {
            ClaimOutcome::Completed(rec) => {
                assert_eq!(rec.key, key);
                assert_eq!(rec.tool, "conformance_tool");
                assert_eq!(rec.scope.as_deref(), Some("tenant-ä"));
                assert_eq!(rec.fingerprint, "note=abc");
                assert_eq!(rec.args, r#"{"note":"x"}"#);
                match &rec.state {
                    RecordState::Completed {
                        result, is_error, ..
                    } => {
                        assert_eq!(result, "false", "a falsy result is stored as itself");
                        assert!(!*is_error);
                    }
                    other => panic!("{other:?}"),
                }
            }
            other => panic!("expected Completed, got {other:?}"),
        }
    }
    // Completing twice is refused: the claim is no longer held.
    assert_eq!(
        store.complete(&key, token, done("true")).await,
        Err(StoreError::LeaseLost { token })
    );
    let rec = store.lookup(&key).await.unwrap().expect("record");
    assert!(matches!(rec.state, RecordState::Completed { ref result, .. } if result == "false"));
}

pub async fn concurrent_claims_have_one_winner(store: Arc<dyn Store>, p: &str) {
    let key = format!("{p}/race");
    let won = winners(32, |_| {
        let (store, key) = (Arc::clone(&store), key.clone());
        async move { store.claim(req(&key, LONG)).await }
    })
    .await;
    assert_eq!(won, 1, "exactly one of 32 concurrent claims wins");
}

pub async fn stale_holder_is_fenced_after_takeover(store: &dyn Store, p: &str) {
    let key = format!("{p}/fence");
    let stale = acquire(store, req(&key, Duration::from_millis(200))).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let abandoned = match store.claim(req(&key, LONG)).await.unwrap() {
        ClaimOutcome::Abandoned { token, fingerprint } => {
            assert_eq!(fingerprint, "note=abc");
            token
        }
        other => panic!("expected Abandoned, got {other:?}"),
    };
    assert_eq!(abandoned, stale);
    let fresh = match store.takeover(req(&key, LONG), stale).await.unwrap() {
        ClaimOutcome::Acquired { token } => token,
        other => panic!("expected Acquired on takeover, got {other:?}"),
    };
    assert!(fresh > stale, "fencing tokens increase: {fresh} > {stale}");
    // A second takeover with the same stale token sees the new holder.
    assert!(matches!(
        store.takeover(req(&key, LONG), stale).await.unwrap(),
        ClaimOutcome::InProgress { .. }
    ));
    assert_eq!(
        store.complete(&key, stale, done("1")).await,
        Err(StoreError::LeaseLost { token: stale })
    );
    assert_eq!(
        store.release(&key, stale).await,
        Err(StoreError::LeaseLost { token: stale })
    );
    assert_eq!(
        store.renew(&key, stale, LONG).await,
        Err(StoreError::LeaseLost { token: stale })
    );
    store.complete(&key, fresh, done("2")).await.unwrap();
    match store.claim(req(&key, LONG)).await.unwrap() {
        ClaimOutcome::Completed(rec) => {
            assert!(matches!(rec.state, RecordState::Completed { ref result, .. } if result == "2"))
        }
        other => panic!("{other:?}"),
    }
}

pub async fn release_frees_the_key_and_tokens_never_repeat(store: &dyn Store, p: &str) {
    let key = format!("{p}/release");
    let first = acquire(store, req(&key, LONG)).await;
    store.release(&key, first).await.unwrap();
    let second = acquire(store, req(&key, LONG)).await;
    assert!(
        second > first,
        "a released key's next token is higher: {second} > {first}"
    );
    assert_eq!(
        store.release(&key, first).await,
        Err(StoreError::LeaseLost { token: first })
    );
    assert_eq!(
        store.complete(&key, first, done("0")).await,
        Err(StoreError::LeaseLost { token: first })
    );
    store.release(&key, second).await.unwrap();
    assert!(store.lookup(&key).await.unwrap().is_none());
}

pub async fn renewal_keeps_a_claim_alive(store: &dyn Store, p: &str) {
    let lease = Duration::from_millis(600);
    // The server's clock decides, so the test measures its own pace instead of trusting
    // its sleeps: an attempt in which the machine stalled near a lease between two
    // renewals proves nothing and is tried again (bounded).
    for attempt in 0..5 {
        let key = format!("{p}/renew-{attempt}");
        let token = acquire(store, req(&key, lease)).await;
        let claimed = std::time::Instant::now();
        let mut last = claimed;
        let mut steady = true;
        // Renew every quarter lease until well past the first lease.
        while claimed.elapsed() < lease + Duration::from_millis(400) {
            tokio::time::sleep(lease / 4).await;
            steady &= last.elapsed() < lease / 2;
            store.renew(&key, token, lease).await.unwrap();
            last = std::time::Instant::now();
        }
        let outcome = store.claim(req(&key, lease)).await.unwrap();
        steady &= last.elapsed() < lease / 2;
        store.complete(&key, token, done("\"ok\"")).await.unwrap();
        if steady {
            // Past its first lease: still held thanks to the renewals.
            assert!(
                matches!(outcome, ClaimOutcome::InProgress { .. }),
                "renewed every quarter lease, yet: {outcome:?}"
            );
            return;
        }
    }
    panic!("the machine stalled for half a lease in each of 5 attempts: nothing was shown");
}

pub async fn expired_claim_is_abandoned_not_free(store: &dyn Store, p: &str) {
    let key = format!("{p}/abandoned");
    let token = acquire(store, req(&key, Duration::from_millis(150))).await;
    tokio::time::sleep(Duration::from_millis(350)).await;
    for _ in 0..2 {
        match store.claim(req(&key, LONG)).await.unwrap() {
            ClaimOutcome::Abandoned { token: t, .. } => assert_eq!(t, token),
            other => panic!("an expired claim is an unknown outcome, not free: {other:?}"),
        }
    }
    // Renewing after the lease ran out is refused: the holder must notice it lost the key.
    assert_eq!(
        store.renew(&key, token, LONG).await,
        Err(StoreError::LeaseLost { token })
    );
}

pub async fn takeover_of_a_live_claim_reports_it(store: &dyn Store, p: &str) {
    let key = format!("{p}/live-takeover");
    let token = acquire(store, req(&key, LONG)).await;
    assert!(matches!(
        store.takeover(req(&key, LONG), token).await.unwrap(),
        ClaimOutcome::InProgress { .. }
    ));
    store.complete(&key, token, done("3")).await.unwrap();
    assert!(matches!(
        store.takeover(req(&key, LONG), token).await.unwrap(),
        ClaimOutcome::Completed(_)
    ));
}

pub async fn expired_results_are_claimable_and_purged(store: &dyn Store, p: &str) {
    let key = format!("{p}/expiry");
    let token = acquire(store, req(&key, LONG)).await;
    let short = completion("1", Duration::from_millis(200));
    store.complete(&key, token, short).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let purged = store.purge_expired().await.unwrap();
    assert!(purged >= 1, "purge removed the expired record");
    assert!(store.lookup(&key).await.unwrap().is_none());
    let again = acquire(store, req(&key, LONG)).await;
    assert!(again > token);
    let short = completion("1", Duration::from_millis(200));
    store.complete(&key, again, short).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    // Expired but not yet purged: a claim treats it as absent.
    let third = acquire(store, req(&key, LONG)).await;
    store.release(&key, third).await.unwrap();
}

pub async fn large_results_round_trip(store: &dyn Store, p: &str) {
    let key = format!("{p}/large");
    let big = format!("\"{}\"", "é".repeat(512 * 1024)); // 1 MiB of UTF-8
    let token = acquire(store, req(&key, LONG)).await;
    store.complete(&key, token, done(&big)).await.unwrap();
    match store.claim(req(&key, LONG)).await.unwrap() {
        ClaimOutcome::Completed(rec) => {
            assert!(
                matches!(rec.state, RecordState::Completed { ref result, .. } if *result == big)
            )
        }
        other => panic!("{other:?}"),
    }
}

pub async fn non_ascii_keys_and_scopes_round_trip(store: &dyn Store, p: &str) {
    let key = format!("{p}/ключ-鍵-🔑");
    let mut r = req(&key, LONG);
    r.scope = Some("テナント-Zürich");
    let token = acquire(store, r).await;
    store.complete(&key, token, done("\"✓\"")).await.unwrap();
    let rec = store.lookup(&key).await.unwrap().expect("record");
    assert_eq!(rec.key, key);
    assert_eq!(rec.scope.as_deref(), Some("テナント-Zürich"));
    // A key that differs only in the emoji is a different key.
    let other = format!("{p}/ключ-鍵-🗝");
    acquire(store, req(&other, LONG)).await;
}

pub async fn error_results_keep_their_flag(store: &dyn Store, p: &str) {
    let key = format!("{p}/error");
    let token = acquire(store, req(&key, LONG)).await;
    let err = Completion {
        result: r#"{"Declined":"4242"}"#,
        is_error: true,
        ttl: LONG,
    };
    store.complete(&key, token, err).await.unwrap();
    match store.claim(req(&key, LONG)).await.unwrap() {
        ClaimOutcome::Completed(rec) => assert!(matches!(
            rec.state,
            RecordState::Completed { is_error: true, .. }
        )),
        other => panic!("{other:?}"),
    }
}

/// Expired records go without anyone calling `purge_expired`: the first new claim after
/// the store's purge interval purges them. The caller sets the interval: short with
/// `expect_purge`, off without (then the record must still be there, which shows it is
/// the background purge, not expiry itself, that removed it). Not for Redis, whose keys
/// expire on their own.
pub async fn expired_records_are_purged_in_the_background(
    store: &dyn Store,
    p: &str,
    expect_purge: bool,
) {
    let old = format!("{p}/bg-purge-old-{expect_purge}");
    let token = acquire(store, req(&old, LONG)).await;
    let short = completion("1", Duration::from_millis(100));
    store.complete(&old, token, short).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        store.lookup(&old).await.unwrap().is_some(),
        "expired, but nothing has purged it yet"
    );
    acquire(
        store,
        req(&format!("{p}/bg-purge-new-{expect_purge}"), LONG),
    )
    .await;
    // The purge may run beside the claim: poll against a deadline.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut present = true;
    while std::time::Instant::now() < deadline {
        present = store.lookup(&old).await.unwrap().is_some();
        if !present || !expect_purge {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if !expect_purge {
        tokio::time::sleep(Duration::from_millis(200)).await;
        present = store.lookup(&old).await.unwrap().is_some();
    }
    assert_eq!(
        present,
        !expect_purge,
        "background purge {}: the expired record is {}",
        if expect_purge { "on" } else { "off" },
        if present { "still there" } else { "gone" }
    );
}
