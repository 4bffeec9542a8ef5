//! Clocks: leases and expiry are decided by the store's clock, never by a worker's.
//!
//! The engine's own clock is tokio's `Instant`, used only for sleeps (heartbeats, waiting
//! for a running duplicate). Shared stores read the server's clock inside each operation
//! (Redis `TIME`, PostgreSQL `clock_timestamp()`), so a worker whose clock jumps ahead
//! cannot see another worker's live lease as expired and steal it. Here worker B's tokio
//! clock jumps one hour ahead (`tokio::time::pause()` + `advance(1 h)`, then `resume()`, so
//! its clock keeps running an hour ahead while it talks to the server) and B still sees
//! worker A's lease as live: `Error::InProgress` through the engine, and
//! `ClaimOutcome::InProgress` from the store.
//!
//! Stores without a server clock make a documented assumption instead:
//! - `SqliteStore` reads the machine's system clock (`SystemTime`) in its transaction:
//!   one clock for every process of one machine, which is why it must not sit on a
//!   network share. A jump of the engine's tokio clock does not affect it (tested).
//! - `MemoryStore` reads the process's tokio clock: every worker sharing it lives in the
//!   one process and sees the same clock, so a jump moves every lease at once (tested, so
//!   the assumption is pinned: it is the store for one process and for paused-time tests).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::json;
use tool_contracts::store::{
    ClaimOutcome, ClaimRequest, PostgresStore, RedisStore, SqliteStore, Store,
};
use tool_contracts::{mutating_tool, registry, with_scope, with_store, Error, MemoryStore};

#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
pub enum ClockError {
    #[error("{0}")]
    Contract(String),
}

impl From<Error> for ClockError {
    fn from(e: Error) -> Self {
        ClockError::Contract(format!("{}: {e}", e.code()))
    }
}

const LEASE: Duration = Duration::from_secs(3);

/// Holds its key until the test sends on the job's channel.
#[mutating_tool(idempotency_key_fields = [job], lease = "3s", concurrent = "reject")]
pub async fn clock_hold(job: String) -> Result<String, ClockError> {
    let release = HOLDS.lock().unwrap().remove(&job);
    if let Some(release) = release {
        let _ = release.await;
    }
    Ok(format!("held-{job}"))
}

static HOLDS: std::sync::Mutex<
    std::collections::BTreeMap<String, tokio::sync::oneshot::Receiver<()>>,
> = std::sync::Mutex::new(std::collections::BTreeMap::new());

fn unique(label: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{label}-{}-{nanos}", std::process::id())
}

fn key_of(job: &str) -> String {
    registry()
        .get("clock_hold")
        .unwrap()
        .key(&json!({ "job": job }))
        .unwrap()
        .unwrap()
}

fn request<'a>(key: &'a str) -> ClaimRequest<'a> {
    ClaimRequest {
        key,
        tool: "clock_hold",
        scope: None,
        fingerprint: "",
        args: "{}",
        lease: LEASE,
        ttl: Duration::from_secs(86_400),
        worker: "worker-b",
    }
}

type Opener = Arc<
    dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = Arc<dyn Store>> + Send>>
        + Send
        + Sync,
>;

/// Worker A (real clock) holds `clock_hold(job)`; worker B, whose tokio clock jumped an hour
/// ahead, must still see A's lease as live, through the engine and through the store.
fn skewed_worker_sees_the_live_lease(label: &str, open: Opener) {
    let job = unique(label);
    let scope = unique("clock");
    let (release, hold) = tokio::sync::oneshot::channel();
    HOLDS.lock().unwrap().insert(job.clone(), hold);

    // Worker A: a real-time runtime on its own thread, holding the key (heartbeat on).
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let a = {
        let (open, job, scope) = (Arc::clone(&open), job.clone(), scope.clone());
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap()
                .block_on(async move {
                    let store = open().await;
                    let task = with_store(store, with_scope(scope, clock_hold(job)));
                    let task = tokio::spawn(task);
                    started_tx.send(()).unwrap();
                    task.await.unwrap()
                })
        })
    };
    started_rx.recv().unwrap();
    // A's body has taken its hold: A claimed the key and runs.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while HOLDS.lock().unwrap().contains_key(&job) {
        assert!(
            std::time::Instant::now() < deadline,
            "[{label}] worker A never started"
        );
        std::thread::sleep(Duration::from_millis(5));
    }

    // Worker B: a runtime whose clock jumps an hour ahead before it touches the store.
    let b_runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let (engine_view, store_view, skew) = b_runtime.block_on(async {
        let before = tokio::time::Instant::now();
        tokio::time::advance(Duration::from_secs(3600)).await;
        tokio::time::resume();
        let skew = tokio::time::Instant::now() - before;
        let store = open().await;
        let key = with_scope(scope.clone(), async { key_of(&job) }).await;
        assert!(
            store.lookup(&key).await.unwrap().is_some(),
            "[{label}] A holds the key"
        );
        let engine_view = with_store(
            Arc::clone(&store),
            with_scope(scope.clone(), clock_hold(job.clone())),
        )
        .await;
        let store_view = store.claim(request(&key)).await.unwrap();
        (engine_view, store_view, skew)
    });
    assert!(
        skew >= Duration::from_secs(3600),
        "[{label}] B's clock jumped: {skew:?}"
    );
    match engine_view {
        Err(ClockError::Contract(e)) => assert!(
            e.starts_with("in_progress"),
            "[{label}] B sees A's call in progress, not abandoned: {e}"
        ),
        Ok(v) => panic!("[{label}] B ran or replayed while A holds the key: {v}"),
    }
    match store_view {
        ClaimOutcome::InProgress {
            lease_remaining, ..
        } => assert!(
            !lease_remaining.is_zero() && lease_remaining <= LEASE,
            "[{label}] the server's lease is live and at most {LEASE:?}: {lease_remaining:?}"
        ),
        other => panic!("[{label}] a skewed worker must see the live lease, got {other:?}"),
    }

    // A finishes; B, still an hour ahead, now gets A's result.
    release.send(()).unwrap();
    let a_result = a.join().unwrap();
    assert_eq!(a_result.unwrap(), format!("held-{job}"));
    let replay = b_runtime.block_on(async {
        let store = open().await;
        with_store(store, with_scope(scope, clock_hold(job.clone()))).await
    });
    assert_eq!(
        replay.unwrap(),
        format!("held-{job}"),
        "[{label}] B replays A's result"
    );
    println!("clock[{label}]: worker B's clock 1h ahead still saw worker A's live lease (InProgress), then replayed A's result");
}

fn url_or_skip(var: &str, what: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var_os("CI").is_some() => {
            panic!("{what} clock test skipped in CI: set {var}")
        }
        _ => {
            eprintln!("skipped: set {var} to run the {what} clock test");
            None
        }
    }
}

#[test]
fn redis_worker_whose_clock_jumps_an_hour_still_sees_a_live_lease() {
    let Some(url) = url_or_skip("TOOL_CONTRACTS_REDIS_URL", "Redis") else {
        return;
    };
    let prefix = format!("{}:", unique("tc-clock"));
    let (u, p) = (url.clone(), prefix.clone());
    let open: Opener = Arc::new(move || {
        let (u, p) = (u.clone(), p.clone());
        Box::pin(async move {
            Arc::new(RedisStore::with_prefix(&u, &p).await.unwrap()) as Arc<dyn Store>
        })
    });
    let _cleanup = Cleanup(Box::new(move || redis_delete_prefix(&url, &prefix)));
    skewed_worker_sees_the_live_lease("redis", open);
}

#[test]
fn postgres_worker_whose_clock_jumps_an_hour_still_sees_a_live_lease() {
    let Some(url) = url_or_skip("TOOL_CONTRACTS_POSTGRES_URL", "PostgreSQL") else {
        return;
    };
    let schema = unique("tc_clock").replace('-', "_");
    let (u, s) = (url.clone(), schema.clone());
    let open: Opener = Arc::new(move || {
        let (u, s) = (u.clone(), s.clone());
        Box::pin(async move {
            let store = PostgresStore::builder(&u).schema(&s).max_connections(2);
            Arc::new(store.connect().await.unwrap()) as Arc<dyn Store>
        })
    });
    skewed_worker_sees_the_live_lease("postgres", open);
    let _ = std::process::Command::new("psql")
        .args([
            url.as_str(),
            "-q",
            "-c",
            &format!("DROP SCHEMA IF EXISTS {schema} CASCADE"),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
}

/// SQLite has no server clock: it reads the machine's system clock, shared by every
/// process of the machine (the single-machine assumption). The engine's tokio clock does
/// not enter into it.
#[test]
fn sqlite_leases_follow_the_machine_clock_not_the_engine_clock() {
    let path = std::env::temp_dir().join(format!("{}.db", unique("tc-clock")));
    let p = path.clone();
    let open: Opener = Arc::new(move || {
        let p = p.clone();
        Box::pin(async move { Arc::new(SqliteStore::open(&p).await.unwrap()) as Arc<dyn Store> })
    });
    let _cleanup = Cleanup(Box::new(move || {
        for ext in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{ext}", path.display()));
        }
    }));
    skewed_worker_sees_the_live_lease("sqlite", open);
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

/// Removes what a test left in a shared server, pass or fail.
struct Cleanup(Box<dyn Fn()>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        (self.0)();
    }
}

/// Deletes every key under `prefix` on the server at `url`, speaking RESP directly.
fn redis_delete_prefix(url: &str, prefix: &str) {
    use std::io::{Read, Write};
    let addr = url
        .trim_start_matches("redis://")
        .split('/')
        .next()
        .unwrap_or("127.0.0.1:6379");
    let script =
        "for _, k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) end return 0";
    let args = ["EVAL", script, "0", &format!("{prefix}*")];
    let mut cmd = format!("*{}\r\n", args.len());
    for a in args {
        cmd.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    if let Ok(mut s) = std::net::TcpStream::connect(addr) {
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = s.write_all(cmd.as_bytes());
        let _ = s.read(&mut [0u8; 64]);
    }
}
