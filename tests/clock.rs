//! Clocks: leases and expiry are decided by the store's clock, never by a worker's.
//!
//! Worker A (this process, the machine's clock) holds a key; worker B is another process
//! whose *system clock* runs one hour ahead: the test binary re-executes itself
//! (`clock_worker_entry_point`, a no-op unless `TC_CLOCK_ROLE` is set) under libfaketime
//! (`faketime -f +1h`, Debian's `faketime` package), which moves every clock the process
//! reads (`SystemTime`, and tokio's clock with it). B must still see A's lease as live,
//! through the engine (`in_progress`), through the store (`ClaimOutcome::InProgress`) and
//! through a read of the operation (`tool_contracts::operation`: `in_progress`, judged by
//! `Store::observe`'s clock), and, once A finished, replay A's result.
//!
//! - Redis and PostgreSQL read the server's clock inside each operation (Redis `TIME`,
//!   PostgreSQL `clock_timestamp()`): B's clock does not enter, and the check passes.
//! - The check can fail: the same check, run on a store that decides lease expiry by the
//!   worker's `SystemTime::now()` (`WorkerClockLeases`, a deliberately broken wrapper over
//!   the same servers), must fail, and does (`the_check_catches_a_store_that_reads_the_
//!   worker_clock_*`). B's clock is also checked to be an hour ahead, so a faketime that
//!   silently did nothing fails the test instead of passing it.
//! - `SqliteStore` is embedded: it reads the clock of whichever process runs the
//!   transaction, i.e. the worker's. It is safe because every process of one machine shares
//!   the machine's clock (tested: B in another process without a skew sees the live lease);
//!   a process whose clock differs from the machine's, as under faketime, sees a live lease
//!   as abandoned (tested, so the limit documented in docs/guarantees.md is pinned).
//! - `MemoryStore` reads the process's tokio clock: every worker sharing it lives in the
//!   one process and sees the same clock, so a jump moves every lease at once (tested).
//!
//! Where `faketime` is not installed the skewed tests fail under `CI` and skip loudly
//! otherwise (`.ci/run` installs it). Each result is recorded as a figure (`clock[...]`).

#[path = "support/calls.rs"]
mod calls;
#[path = "support/cleanup.rs"]
mod cleanup;
mod figures;
#[path = "support/stores.rs"]
mod stores;
mod support;
#[path = "support/workers.rs"]
mod workers;
use calls::ToolError;
use cleanup::Cleanup;
use stores::{Delegate, Wrapped};

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::json;
use tool_contracts::store::{
    ClaimOutcome, ClaimRequest, Observed, PostgresStore, Record, RecordState, RedisStore,
    SqliteStore, Store, StoreError,
};
use tool_contracts::{mutating_tool, operation, with_scope, with_store, MemoryStore};

const LEASE: Duration = Duration::from_secs(3);

/// How far ahead worker B's clock runs.
const SKEW: &str = "+1h";
const SKEW_SECS: u64 = 3600;

/// Holds its key until the test sends on the job's channel.
#[mutating_tool(idempotency_key_fields = [job], lease = "3s", concurrent = "reject")]
pub async fn clock_hold(job: String) -> Result<String, ToolError> {
    let release = HOLDS.lock().unwrap().remove(&job);
    if let Some(release) = release {
        let _ = release.await;
    }
    Ok(format!("held-{job}"))
}

static HOLDS: std::sync::Mutex<
    std::collections::BTreeMap<String, tokio::sync::oneshot::Receiver<()>>,
> = std::sync::Mutex::new(std::collections::BTreeMap::new());

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn request<'a>(key: &'a str) -> ClaimRequest<'a> {
    ClaimRequest {
        key,
        tool: "clock_hold",
        version: 1,
        scope: None,
        fingerprint: "clock-hold",
        args: "{}",
        lease: LEASE,
        ttl: Duration::from_secs(86_400),
        worker: "worker-b",
    }
}

// ---------------------------------------------------------------------------------------
// The broken store the check must catch.

/// Deliberately broken: decides whether a lease is live by the worker's own
/// `SystemTime::now()` instead of the server's clock, takes over what the worker's clock
/// says has expired (abandoning it for its holder first, so the server lets it), and
/// reads records with the worker's clock (`observe`).
/// Never use this: it exists to show the clock check fails on such a store.
struct WorkerClockLeases(Arc<dyn Store>);

impl WorkerClockLeases {
    /// The holder's token, if the worker's clock says its lease has run out.
    async fn expired_by_my_clock(&self, key: &str) -> Result<Option<u64>, StoreError> {
        Ok(match self.0.lookup(key).await? {
            Some(Record {
                state:
                    RecordState::InProgress {
                        token,
                        lease_expires_at,
                    },
                ..
            }) if lease_expires_at <= SystemTime::now() => Some(token),
            _ => None,
        })
    }
}

#[async_trait::async_trait]
impl Delegate for WorkerClockLeases {
    fn inner(&self) -> &dyn Store {
        &*self.0
    }
    async fn claim(&self, r: ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        match self.0.claim(r).await? {
            ClaimOutcome::InProgress { fingerprint, .. } => {
                match self.expired_by_my_clock(r.key).await? {
                    Some(token) => Ok(ClaimOutcome::Abandoned { token, fingerprint }),
                    None => self.0.claim(r).await,
                }
            }
            other => Ok(other),
        }
    }
    async fn takeover(&self, r: ClaimRequest<'_>, t: u64) -> Result<ClaimOutcome, StoreError> {
        if self.expired_by_my_clock(r.key).await? == Some(t) {
            self.0.abandon(r.key, t).await?;
        }
        self.0.takeover(r, t).await
    }
    /// Reads with the worker's clock too (the trait's default, which a store whose clock
    /// is not this process's must override).
    async fn observe(&self, key: &str) -> Result<Option<Observed>, StoreError> {
        let record = self.0.lookup(key).await?;
        Ok(record.map(|record| Observed::new(record, SystemTime::now())))
    }
}

// ---------------------------------------------------------------------------------------
// Stores, as both processes open them.

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Backend {
    /// `sqlite`, `redis` or `postgres`.
    kind: String,
    /// File path or server URL.
    url: String,
    /// Redis key prefix or PostgreSQL schema.
    ns: String,
    /// Wrap the store in the broken `WorkerClockLeases`.
    broken: bool,
}

impl Backend {
    async fn open(&self) -> Arc<dyn Store> {
        let store: Arc<dyn Store> = match self.kind.as_str() {
            "sqlite" => Arc::new(SqliteStore::open(&self.url).await.unwrap()),
            "redis" => Arc::new(RedisStore::with_prefix(&self.url, &self.ns).await.unwrap()),
            "postgres" => Arc::new(
                PostgresStore::builder(&self.url)
                    .schema(&self.ns)
                    .max_connections(2)
                    .connect()
                    .await
                    .unwrap(),
            ),
            other => panic!("unknown backend {other}"),
        };
        if self.broken {
            Arc::new(Wrapped(WorkerClockLeases(store)))
        } else {
            store
        }
    }
}

// ---------------------------------------------------------------------------------------
// Worker B: a child process, under faketime.

/// What worker B saw.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct View {
    /// B's `SystemTime::now()` when it started, in unix ms.
    b_now_ms: u64,
    /// B found A's record.
    record_seen: bool,
    /// The engine's answer to B's call.
    engine: Result<String, String>,
    /// The store's answer to B's claim (absent after A finished).
    store: Option<String>,
    /// The lease remaining, if the store answered `InProgress`.
    lease_remaining_ms: Option<u64>,
    /// The state of the operation as B read it (`in_progress`, `unknown`, `completed`).
    operation: Option<String>,
}

const MARK: &str = "TC_CLOCK_VIEW ";

async fn worker_b(role: &str) -> View {
    let b_now_ms = now_ms();
    let backend: Backend = serde_json::from_str(&std::env::var("TC_CLOCK_BACKEND").unwrap())
        .expect("TC_CLOCK_BACKEND");
    let job = std::env::var("TC_CLOCK_JOB").unwrap();
    let scope = std::env::var("TC_CLOCK_SCOPE").unwrap();
    let store = backend.open().await;
    let key = with_scope(scope.clone(), async {
        stores::key_of("clock_hold", &json!({ "job": job }))
    })
    .await;
    let record_seen = store.lookup(&key).await.unwrap().is_some();
    let read = with_store(
        Arc::clone(&store),
        with_scope(scope.clone(), operation(&key)),
    );
    let operation = read.await.unwrap().map(|op| op.state.as_str().to_owned());
    let engine = with_store(
        Arc::clone(&store),
        with_scope(scope.clone(), clock_hold(job.clone())),
    )
    .await
    .map_err(|e| e.to_string());
    let (store_view, lease_remaining_ms) = if role == "while-held" {
        match store.claim(request(&key)).await.unwrap() {
            ClaimOutcome::InProgress {
                lease_remaining, ..
            } => (
                Some("in_progress".to_owned()),
                Some(lease_remaining.as_millis() as u64),
            ),
            other => (Some(format!("{other:?}")), None),
        }
    } else {
        (None, None)
    };
    View {
        b_now_ms,
        record_seen,
        engine,
        store: store_view,
        lease_remaining_ms,
        operation,
    }
}

/// Not a test of its own: the entry point of worker B's process.
#[test]
fn clock_worker_entry_point() {
    let Ok(role) = std::env::var("TC_CLOCK_ROLE") else {
        return;
    };
    let view = workers::runtime(1).block_on(worker_b(&role));
    workers::report(MARK, &view);
}

/// Runs worker B (`role`: `while-held` or `after`), under `faketime` when `skew` is set.
fn run_b(role: &str, backend: &Backend, scope: &str, job: &str, skew: Option<&str>) -> View {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = match skew {
        Some(skew) => {
            let mut c = Command::new("faketime");
            c.args(["-f", skew]).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    let out = cmd
        .args(workers::entry_point_args("clock_worker_entry_point"))
        .arg("-q")
        .env("TC_CLOCK_ROLE", role)
        .env("TC_CLOCK_BACKEND", serde_json::to_string(backend).unwrap())
        .env("TC_CLOCK_SCOPE", scope)
        .env("TC_CLOCK_JOB", job)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "worker B ({role}) failed: {:?}",
        out.status
    );
    workers::reports(MARK, &out.stdout)
        .into_iter()
        .next()
        .unwrap_or_else(|| {
            let text = String::from_utf8_lossy(&out.stdout);
            panic!("worker B ({role}) reported nothing:\n{text}")
        })
}

/// One trial: A holds the key; B looks while A holds it, then after A finished.
struct Trial {
    label: String,
    job: String,
    /// How far B's clock was ahead of A's, in ms (A's clock read just before B started).
    skew_ms: i64,
    while_held: View,
    after: View,
    a_result: Result<String, String>,
}

fn trial(label: &str, backend: &Backend, skew: Option<&str>) -> Trial {
    let job = support::unique(label);
    let scope = support::unique("clock");
    let (release, hold) = tokio::sync::oneshot::channel();
    HOLDS.lock().unwrap().insert(job.clone(), hold);

    // Worker A: a runtime on its own thread, holding the key (heartbeat on).
    let a = {
        let (backend, job, scope) = (backend.clone(), job.clone(), scope.clone());
        std::thread::spawn(move || {
            workers::runtime(1).block_on(async move {
                let store = backend.open().await;
                with_store(store, with_scope(scope, clock_hold(job))).await
            })
        })
    };
    // A's body has taken its hold: A claimed the key and runs.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while HOLDS.lock().unwrap().contains_key(&job) {
        assert!(
            std::time::Instant::now() < deadline,
            "[{label}] worker A never started"
        );
        std::thread::sleep(Duration::from_millis(5));
    }

    let a_now_ms = now_ms();
    let while_held = run_b("while-held", backend, &scope, &job, skew);
    release.send(()).unwrap();
    let a_result = a.join().unwrap().map_err(|e| e.to_string());
    let after = run_b("after", backend, &scope, &job, skew);
    Trial {
        label: label.to_owned(),
        job,
        skew_ms: while_held.b_now_ms as i64 - a_now_ms as i64,
        while_held,
        after,
        a_result,
    }
}

/// The clock check: B saw A's lease as live, through the engine and the store, then
/// replayed A's result. `Err` says what B saw instead.
fn check(t: &Trial) -> Result<(), String> {
    let label = &t.label;
    if !t.while_held.record_seen {
        return Err(format!("[{label}] B did not find A's record"));
    }
    match &t.while_held.engine {
        Err(e) if e.starts_with("in_progress") => {}
        other => {
            return Err(format!(
                "[{label}] B must see A's call in progress, got {other:?}"
            ))
        }
    }
    match (
        t.while_held.store.as_deref(),
        t.while_held.lease_remaining_ms,
    ) {
        (Some("in_progress"), Some(ms)) if ms > 0 && ms <= LEASE.as_millis() as u64 => {}
        other => {
            return Err(format!(
                "[{label}] the store must show B a live lease of at most {LEASE:?}, got {other:?}"
            ))
        }
    }
    if t.while_held.operation.as_deref() != Some("in_progress") {
        return Err(format!(
            "[{label}] a read of the operation must show B a call in progress, got {:?}",
            t.while_held.operation
        ));
    }
    if t.after.operation.as_deref() != Some("completed") {
        return Err(format!(
            "[{label}] a read after A finished must show a completed call, got {:?}",
            t.after.operation
        ));
    }
    let expected = format!("held-{}", t.job);
    if t.a_result.as_deref() != Ok(expected.as_str()) {
        return Err(format!("[{label}] A's call: {:?}", t.a_result));
    }
    if t.after.engine.as_deref() != Ok(expected.as_str()) {
        return Err(format!(
            "[{label}] B must replay A's result {expected:?}, got {:?}",
            t.after.engine
        ));
    }
    Ok(())
}

/// B's clock really ran an hour ahead of A's (a faketime that did nothing fails here).
fn assert_skewed(t: &Trial) {
    let ahead = Duration::from_secs(SKEW_SECS).as_millis() as i64;
    assert!(
        (ahead - 60_000..ahead + 60_000).contains(&t.skew_ms),
        "[{}] B's clock must run {SKEW} ahead of A's, ran {} ms ahead",
        t.label,
        t.skew_ms
    );
}

/// `faketime` on the PATH, or a loud skip (a failure under `CI`).
fn faketime_or_skip() -> bool {
    let ok = Command::new("faketime")
        .args(["-f", "+0", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "faketime is not installed: the clock tests need it in CI (apt-get install faketime)"
        );
        eprintln!("skipped: install faketime (apt-get install faketime) to run the clock tests");
    }
    ok
}

/// A shared backend (`redis` or `postgres`) under a fresh prefix or schema, and the guard
/// that deletes it.
fn shared_backend(kind: &str, broken: bool) -> Option<(Backend, Cleanup)> {
    let (url, (ns, cleanup)) = match kind {
        "redis" => {
            let url = support::url(&support::REDIS, "the clock test on Redis")?;
            let ns = cleanup::redis_prefix(&url, "tc-clock");
            (url, ns)
        }
        "postgres" => {
            let url = support::url(&support::POSTGRES, "the clock test on PostgreSQL")?;
            let ns = cleanup::postgres_schema(&url, "tc_clock");
            (url, ns)
        }
        other => panic!("not a shared backend: {other}"),
    };
    let backend = Backend {
        kind: kind.to_owned(),
        url,
        ns,
        broken,
    };
    Some((backend, cleanup))
}

/// A SQLite file, and the guard that deletes it.
fn sqlite_backend() -> (Backend, Cleanup) {
    let (path, cleanup) = cleanup::sqlite_file("tc-clock");
    let backend = Backend {
        kind: "sqlite".to_owned(),
        url: path,
        ns: String::new(),
        broken: false,
    };
    (backend, cleanup)
}

/// What B saw while A held the key, in a few words: the engine's error code or result,
/// and the store's answer.
fn seen(t: &Trial) -> String {
    let engine = match &t.while_held.engine {
        Ok(v) => format!("ran or replayed ({v})"),
        Err(e) => e.split(':').next().unwrap_or("").to_owned(),
    };
    let store = t.while_held.store.as_deref().unwrap_or("-");
    let store = store.split([' ', '{']).next().unwrap_or("");
    format!("engine `{engine}`, store `{store}`")
}

fn record(t: &Trial, line: &str, caught: bool) {
    println!("clock[{}]: {line}", t.label);
    figures::record(
        "clock",
        &t.label,
        &format!("clock[{}]: {line}", t.label),
        json!({ "skew_ms": t.skew_ms, "check_failed": caught }),
    );
}

/// A shared store passes the check with B an hour ahead.
fn shared_store_passes(backend: &Backend) {
    let t = trial(&backend.kind, backend, Some(SKEW));
    assert_skewed(&t);
    if let Err(e) = check(&t) {
        panic!("{e}");
    }
    record(
        &t,
        &format!(
            "worker B's system clock {:.0}s ahead (faketime) still saw worker A's live lease \
             (in_progress, {} ms left), then replayed A's result",
            t.skew_ms as f64 / 1000.0,
            t.while_held.lease_remaining_ms.unwrap_or(0)
        ),
        false,
    );
}

/// The same check on the same server, through the worker-clock store: it must fail.
fn broken_store_is_caught(backend: &Backend) {
    assert!(backend.broken);
    let label = format!("{}+worker-clock", backend.kind);
    let t = trial(&label, backend, Some(SKEW));
    assert_skewed(&t);
    let Err(caught) = check(&t) else {
        panic!("[{label}] the clock check passed a store that reads the worker's clock");
    };
    assert!(
        t.while_held
            .store
            .as_deref()
            .is_some_and(|s| s.starts_with("Abandoned")),
        "[{label}] the broken store showed B the live lease as abandoned: {caught}"
    );
    // It reads operations by the worker's clock, as the trait's default `observe` would.
    assert_eq!(
        t.while_held.operation.as_deref(),
        Some("unknown"),
        "[{label}] a read by the worker's clock shows the live call as unknown"
    );
    record(
        &t,
        &format!(
            "the same check on a deliberately broken store (lease expiry by the worker's clock) \
             failed, as it must: B an hour ahead saw {}",
            seen(&t)
        ),
        true,
    );
}

#[test]
fn redis_worker_whose_system_clock_runs_an_hour_ahead_still_sees_a_live_lease() {
    let Some((backend, _cleanup)) = shared_backend("redis", false) else {
        return;
    };
    if faketime_or_skip() {
        shared_store_passes(&backend);
    }
}

#[test]
fn postgres_worker_whose_system_clock_runs_an_hour_ahead_still_sees_a_live_lease() {
    let Some((backend, _cleanup)) = shared_backend("postgres", false) else {
        return;
    };
    if faketime_or_skip() {
        shared_store_passes(&backend);
    }
}

/// The check is not vacuous: a store that reads the worker's clock fails it.
#[test]
fn the_check_catches_a_store_that_reads_the_worker_clock_on_redis() {
    let Some((backend, _cleanup)) = shared_backend("redis", true) else {
        return;
    };
    if faketime_or_skip() {
        broken_store_is_caught(&backend);
    }
}

/// The check is not vacuous: a store that reads the worker's clock fails it.
#[test]
fn the_check_catches_a_store_that_reads_the_worker_clock_on_postgres() {
    let Some((backend, _cleanup)) = shared_backend("postgres", true) else {
        return;
    };
    if faketime_or_skip() {
        broken_store_is_caught(&backend);
    }
}

/// SQLite reads the clock of the process running the transaction. Another process on the
/// machine's clock sees the live lease (the single-machine assumption holds).
#[test]
fn sqlite_process_on_the_machine_clock_sees_a_live_lease() {
    let (backend, _cleanup) = sqlite_backend();
    let t = trial("sqlite", &backend, None);
    if let Err(e) = check(&t) {
        panic!("{e}");
    }
    record(
        &t,
        &format!(
            "worker B in another process on the machine's clock saw worker A's live lease \
             (in_progress, {} ms left), then replayed A's result",
            t.while_held.lease_remaining_ms.unwrap_or(0)
        ),
        false,
    );
}

/// SQLite reads the clock of the process running the transaction. A process whose clock
/// runs an hour ahead of the machine's sees A's live lease as abandoned: SQLite's leases
/// are only as good as the agreement of its processes' clocks (documented limit).
#[test]
fn sqlite_process_whose_clock_runs_an_hour_ahead_sees_a_live_lease_as_abandoned() {
    if !faketime_or_skip() {
        return;
    }
    let (backend, _cleanup) = sqlite_backend();
    let t = trial("sqlite+faketime", &backend, Some(SKEW));
    assert_skewed(&t);
    let Err(failed) = check(&t) else {
        panic!("[sqlite+faketime] an embedded store cannot ignore its process's clock");
    };
    assert!(
        t.while_held
            .store
            .as_deref()
            .is_some_and(|s| s.starts_with("Abandoned")),
        "[sqlite+faketime] B's clock decides: {failed}"
    );
    assert_eq!(
        t.while_held.operation.as_deref(),
        Some("unknown"),
        "[sqlite+faketime] B's reads are judged by B's clock too"
    );
    assert!(
        t.while_held
            .engine
            .as_ref()
            .is_err_and(|e| e.starts_with("outcome_unknown")),
        "[sqlite+faketime] without verify, B reports an unknown outcome, never a second run: {:?}",
        t.while_held
    );
    record(
        &t,
        &format!(
            "worker B's system clock {:.0}s ahead (faketime) saw worker A's live lease as \
             abandoned ({}): the documented limit, SQLite's processes must share one clock",
            t.skew_ms as f64 / 1000.0,
            seen(&t)
        ),
        true,
    );
}

/// `MemoryStore` reads the process's tokio clock: all its workers share that one clock, so
/// a jump moves every lease at once. Pinned here so the single-process assumption is
/// explicit: a store used across clocks must have a clock of its own.
#[tokio::test(start_paused = true)]
async fn memory_store_leases_follow_the_one_process_clock_it_serves() {
    let store = MemoryStore::new();
    let key = "clock-memory";
    let first = store.claim(request(key)).await.unwrap();
    assert!(matches!(first, ClaimOutcome::Acquired { .. }), "{first:?}");
    let live = store.claim(request(key)).await.unwrap();
    assert!(matches!(live, ClaimOutcome::InProgress { .. }), "{live:?}");
    tokio::time::advance(Duration::from_secs(3600)).await;
    let after = store.claim(request(key)).await.unwrap();
    assert!(
        matches!(after, ClaimOutcome::Abandoned { .. }),
        "the one process clock moved for every worker of the process: {after:?}"
    );
}
