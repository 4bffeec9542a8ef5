//! Store faults: the server goes away in the middle of a workload, and a store answers
//! slower than the lease.
//!
//! The Redis and PostgreSQL tests run PRIVATE servers on free ports (a `redis-server` with
//! `appendonly yes` + `appendfsync always`, the configuration the README names for crash
//! safety, and a throwaway `initdb` cluster), so stopping them disturbs no other test. A
//! guard stops them and deletes their files even when a test fails.
//!
//! - `*_stopped_mid_workload_fails_closed_and_recovers_without_duplicates`: a concurrent
//!   workload runs; the server is killed (`SIGKILL` / `pg_ctl stop -m immediate`) while
//!   calls are in flight. While it is down every call fails with `Error::Store` within the
//!   builder's timeouts and no tool body starts; after a restart the workload completes,
//!   every verified intent has exactly one effect, plain intents at most one, and a
//!   second pass reads the same results.
//! - `*_renewal_slower_than_the_lease_cannot_complete_as_a_stale_holder`: worker A's
//!   store delays `renew` until after its lease ran out; worker B takes the key over and
//!   completes; A's late renewal and completion are refused (fencing token), the stored
//!   result and the key's history are B's.
//!
//! Each test's summary line is printed and recorded as a figure (`tests/figures/mod.rs`).

#[path = "support/calls.rs"]
mod calls;
mod figures;
#[path = "support/stores.rs"]
mod stores;
mod support;
use calls::ToolError;
use stores::{Delegate, Wrapped};

use std::collections::BTreeMap;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tool_contracts::store::{
    Completion, HistoryKind, PostgresStore, RecordState, RedisStore, Store, StoreError,
};
use tool_contracts::{mutating_tool, with_scope, with_store, MemoryStore};

// ---------------------------------------------------------------------------------------
// Effects: every body start, with its time, per (kind, store id, intent).

type EffectLog = BTreeMap<(&'static str, u64, u64), Vec<Instant>>;
static EFFECTS: Mutex<EffectLog> = Mutex::new(BTreeMap::new());

fn record_effect(kind: &'static str, store_id: u64, intent: u64) {
    EFFECTS
        .lock()
        .unwrap()
        .entry((kind, store_id, intent))
        .or_default()
        .push(Instant::now());
}

fn effects_of(kind: &'static str, store_id: u64) -> BTreeMap<u64, Vec<Instant>> {
    EFFECTS
        .lock()
        .unwrap()
        .iter()
        .filter(|((k, s, _), _)| *k == kind && *s == store_id)
        .map(|((_, _, i), v)| (*i, v.clone()))
        .collect()
}

fn effect_count(store_id: u64) -> usize {
    EFFECTS
        .lock()
        .unwrap()
        .iter()
        .filter(|((_, s, _), _)| *s == store_id)
        .map(|(_, v)| v.len())
        .sum()
}

/// Charges once; `verify` looks at the effect log.
#[mutating_tool(idempotency_key_fields = [store_id, intent], lease = "1s", verify = verify_fault_charge)]
pub async fn fault_charge(store_id: u64, intent: u64) -> Result<String, ToolError> {
    record_effect("verified", store_id, intent);
    tokio::time::sleep(Duration::from_millis(15)).await;
    Ok(format!("charged-{store_id}-{intent}"))
}

pub async fn verify_fault_charge(
    store_id: &u64,
    intent: &u64,
) -> Result<Option<String>, ToolError> {
    let done = effects_of("verified", *store_id).contains_key(intent);
    Ok(done.then(|| format!("charged-{store_id}-{intent}")))
}

/// Charges once, without `verify`.
#[mutating_tool(idempotency_key_fields = [store_id, intent], lease = "1s")]
pub async fn fault_charge_plain(store_id: u64, intent: u64) -> Result<String, ToolError> {
    record_effect("plain", store_id, intent);
    tokio::time::sleep(Duration::from_millis(15)).await;
    Ok(format!("plain-{store_id}-{intent}"))
}

// ---------------------------------------------------------------------------------------
// Private servers.

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn run(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn run_checked(what: &str, cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Skips loudly (or fails in CI) when a server binary is missing.
fn skip(what: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("{what} fault tests skipped in CI: install it");
    }
    eprintln!("skipped: {what} is not installed; the {what} fault tests need it");
}

fn port_open(port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", port)).is_ok()
}

fn wait_until(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A `redis-server` of our own, with an append-only file fsynced at every write.
#[derive(Clone)]
struct PrivateRedis {
    port: u16,
    dir: PathBuf,
}

impl PrivateRedis {
    fn start() -> Option<RedisGuard> {
        if !run(Command::new("redis-server").arg("--version")) {
            skip("redis-server");
            return None;
        }
        let dir = std::env::temp_dir().join(support::unique("tc-faults-redis"));
        std::fs::create_dir_all(&dir).unwrap();
        let server = PrivateRedis {
            port: free_port(),
            dir,
        };
        let guard = RedisGuard(server.clone());
        server.up();
        Some(guard)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn pid(&self) -> Option<String> {
        std::fs::read_to_string(self.dir.join("redis.pid"))
            .ok()
            .map(|p| p.trim().to_owned())
    }

    /// The server answers `PONG` (not `LOADING`: it has read its append-only file).
    fn ping(&self) -> bool {
        let timeout = Some(Duration::from_secs(1));
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(1)))
            .and_then(|mut conn| {
                conn.set_read_timeout(timeout)?;
                redis::cmd("PING").query::<String>(&mut conn)
            })
            .is_ok_and(|pong| pong == "PONG")
    }

    fn up(&self) {
        let dir = self.dir.display().to_string();
        run_checked(
            "redis-server",
            Command::new("redis-server").args([
                "--daemonize",
                "yes",
                "--bind",
                "127.0.0.1",
                "--port",
                &self.port.to_string(),
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--dir",
                &dir,
                "--pidfile",
                &format!("{dir}/redis.pid"),
                "--logfile",
                &format!("{dir}/redis.log"),
            ]),
        );
        wait_until("redis to answer PING", Duration::from_secs(20), || {
            self.ping()
        });
    }

    /// SIGKILL: a crash, not a shutdown.
    fn down(&self) {
        if let Some(pid) = self.pid() {
            run(Command::new("kill").args(["-9", &pid]));
        }
        wait_until("redis to stop", Duration::from_secs(20), || {
            !port_open(self.port)
        });
    }
}

struct RedisGuard(PrivateRedis);

impl Drop for RedisGuard {
    fn drop(&mut self) {
        if let Some(pid) = self.0.pid() {
            run(Command::new("kill").args(["-9", &pid]));
        }
        let _ = std::fs::remove_dir_all(&self.0.dir);
    }
}

/// A PostgreSQL cluster of our own, made by `initdb` and run by `pg_ctl`.
#[derive(Clone)]
struct PrivatePostgres {
    port: u16,
    bin: PathBuf,
    dir: PathBuf,
    /// Run the server binaries as the `postgres` OS user (PostgreSQL refuses root).
    as_postgres: bool,
}

fn postgres_bin() -> Option<PathBuf> {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("initdb").exists())
        .collect();
    versions.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    if let Some(bin) = versions.pop() {
        return Some(bin);
    }
    let out = Command::new("pg_config").arg("--bindir").output().ok()?;
    let bin = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    bin.join("initdb").exists().then_some(bin)
}

impl PrivatePostgres {
    fn start() -> Option<PostgresGuard> {
        let Some(bin) = postgres_bin() else {
            skip("PostgreSQL (initdb)");
            return None;
        };
        let as_postgres = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        let dir = std::env::temp_dir().join(support::unique("tc-faults-pg"));
        std::fs::create_dir_all(&dir).unwrap();
        if as_postgres {
            run_checked("chown", Command::new("chown").arg("postgres").arg(&dir));
        }
        let server = PrivatePostgres {
            port: free_port(),
            bin,
            dir,
            as_postgres,
        };
        let guard = PostgresGuard(server.clone());
        run_checked(
            "initdb",
            server.command("initdb").arg("-D").arg(server.data()).args([
                "-U",
                "postgres",
                "--auth=trust",
                "-N",
                "-E",
                "UTF8",
            ]),
        );
        server.up();
        Some(guard)
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn command(&self, program: &str) -> Command {
        let program = self.bin.join(program);
        if self.as_postgres {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(program);
            cmd
        } else {
            Command::new(program)
        }
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn up(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=on",
            self.port,
            self.dir.display()
        );
        run_checked(
            "pg_ctl start",
            self.command("pg_ctl")
                .arg("-D")
                .arg(self.data())
                .args(["-o", &options, "-l"])
                .arg(self.dir.join("server.log"))
                .args(["-w", "-t", "60", "start"]),
        );
    }

    /// `-m immediate`: the server stops without a checkpoint, like a crash.
    fn down(&self) {
        run_checked(
            "pg_ctl stop",
            self.command("pg_ctl").arg("-D").arg(self.data()).args([
                "-m",
                "immediate",
                "-w",
                "stop",
            ]),
        );
        wait_until("postgres to stop", Duration::from_secs(20), || {
            !port_open(self.port)
        });
    }
}

struct PostgresGuard(PrivatePostgres);

impl Drop for PostgresGuard {
    fn drop(&mut self) {
        let _ = self
            .0
            .command("pg_ctl")
            .arg("-D")
            .arg(self.0.data())
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.0.dir);
    }
}

// ---------------------------------------------------------------------------------------
// The stop/start workload.

#[derive(Debug)]
struct Outcome {
    result: Result<String, String>,
    store_errors: usize,
}

/// Calls `intent` until it answers something other than a store error.
async fn call_until_answered(plain: bool, store_id: u64, intent: u64) -> Outcome {
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut store_errors = 0;
    loop {
        let r = if plain {
            fault_charge_plain(store_id, intent).await
        } else {
            fault_charge(store_id, intent).await
        };
        match r.map_err(|e| e.to_string()) {
            Err(e) if e.starts_with("store:") => {
                store_errors += 1;
                assert!(
                    Instant::now() < deadline,
                    "intent {intent}: the store never came back: {e}"
                );
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            result => {
                return Outcome {
                    result,
                    store_errors,
                }
            }
        }
    }
}

async fn workload(store_id: u64, intents: std::ops::Range<u64>) -> Vec<(u64, Outcome, Outcome)> {
    use futures::stream::{self, StreamExt};
    stream::iter(intents)
        .map(|i| async move {
            let verified = call_until_answered(false, store_id, i).await;
            let plain = call_until_answered(true, store_id, i).await;
            (i, verified, plain)
        })
        .buffer_unordered(4)
        .collect()
        .await
}

/// Stops a private server in the middle of a workload on `store` and starts it again.
async fn stop_start(
    label: &str,
    store_id: u64,
    store: Arc<dyn Store>,
    down: impl FnOnce() + Send + 'static,
    up: impl FnOnce() + Send + 'static,
) {
    let started = Instant::now();
    let scope = support::unique(label);
    let (store2, scope2) = (Arc::clone(&store), scope.clone());
    // Before the fault: 10 intents done.
    let before = with_store(
        Arc::clone(&store),
        with_scope(scope.clone(), workload(store_id, 0..10)),
    )
    .await;
    assert!(
        before
            .iter()
            .all(|(_, v, p)| v.result.is_ok() && p.result.is_ok()),
        "{before:?}"
    );
    // The workload under test: 40 more intents, four at a time, retried on store errors.
    let running = tokio::spawn(with_store(
        store2,
        with_scope(scope2, workload(store_id, 10..50)),
    ));
    let deadline = Instant::now() + Duration::from_secs(30);
    while effect_count(store_id) < 2 * 10 + 16 {
        assert!(
            Instant::now() < deadline,
            "[{label}] the workload made no progress"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // Kill the server with calls in flight.
    tokio::task::spawn_blocking(down).await.unwrap();
    let down_from = Instant::now();
    // While it is down: calls fail closed, quickly, and run nothing.
    let (mut probes, mut slowest) = (0, Duration::ZERO);
    with_store(
        Arc::clone(&store),
        with_scope(scope.clone(), async {
            for intent in [3, 1000, 1001] {
                for plain in [false, true] {
                    let t = Instant::now();
                    let r = if plain {
                        fault_charge_plain(store_id, intent).await
                    } else {
                        fault_charge(store_id, intent).await
                    };
                    let took = t.elapsed();
                    let e = r
                        .expect_err("a call with the store down must fail")
                        .to_string();
                    assert!(
                        e.starts_with("store:"),
                        "[{label}] fails with Error::Store: {e}"
                    );
                    assert!(
                        took < Duration::from_secs(5),
                        "[{label}] failed in {took:?}, not bounded by the timeouts"
                    );
                    slowest = slowest.max(took);
                    probes += 1;
                }
            }
        }),
    )
    .await;
    // Keep it down past the lease (1 s), so claims cut off mid-call become abandoned.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let down_to = Instant::now();
    tokio::task::spawn_blocking(up).await.unwrap();
    let results = running.await.unwrap();
    let downtime = down_to - down_from;

    // No body started while the server was down (fail closed).
    for kind in ["verified", "plain"] {
        for (intent, starts) in effects_of(kind, store_id) {
            for at in starts {
                assert!(
                    !(down_from <= at && at <= down_to),
                    "[{label}] {kind} {intent} ran while the store was down"
                );
            }
        }
    }
    assert!(
        !effects_of("verified", store_id).contains_key(&1000),
        "[{label}] a probe ran"
    );
    // Exactly one effect per verified intent, at most one per plain intent.
    let verified = effects_of("verified", store_id);
    let plain = effects_of("plain", store_id);
    let store_errors: usize = results
        .iter()
        .map(|(_, v, p)| v.store_errors + p.store_errors)
        .sum();
    assert!(
        store_errors > 0,
        "[{label}] the workload never met the outage"
    );
    let mut unknown = 0;
    for (i, v, p) in &results {
        assert_eq!(
            v.result.as_deref(),
            Ok(format!("charged-{store_id}-{i}").as_str()),
            "[{label}] {i}"
        );
        assert_eq!(
            verified[i].len(),
            1,
            "[{label}] intent {i}: one verified effect"
        );
        match &p.result {
            Ok(r) => {
                assert_eq!(r, &format!("plain-{store_id}-{i}"));
                assert_eq!(plain[i].len(), 1, "[{label}] intent {i}: one plain effect");
            }
            Err(e) => {
                assert!(e.starts_with("outcome_unknown"), "[{label}] {i}: {e}");
                assert!(plain.get(i).map_or(0, Vec::len) <= 1);
                unknown += 1;
            }
        }
    }
    // A second pass over every intent, in a fresh call: the same answers, nothing reruns.
    let again = with_store(
        Arc::clone(&store),
        with_scope(scope.clone(), workload(store_id, 0..50)),
    )
    .await;
    let mut lost_completions = 0;
    for (i, v, p) in &again {
        assert_eq!(
            v.result.as_deref(),
            Ok(format!("charged-{store_id}-{i}").as_str()),
            "[{label}] second pass {i}"
        );
        if let Ok(r) = &p.result {
            assert_eq!(r, &format!("plain-{store_id}-{i}"));
        }
        let first = results
            .iter()
            .find(|(j, _, _)| j == i)
            .map(|(_, _, p)| &p.result);
        if let Some(Ok(first)) = first {
            // A plain result its caller got stays the answer, unless its completion was
            // lost in the outage (then the key is an unknown outcome, never a rerun).
            match &p.result {
                Ok(r) => assert_eq!(r, first),
                Err(e) => {
                    assert!(e.starts_with("outcome_unknown"), "{e}");
                    lost_completions += 1;
                }
            }
        }
    }
    assert_eq!(
        effects_of("verified", store_id)
            .values()
            .map(Vec::len)
            .sum::<usize>(),
        50
    );
    assert!(effects_of("plain", store_id).values().all(|v| v.len() == 1));
    let duplicates = ["verified", "plain"]
        .iter()
        .map(|kind| {
            effects_of(kind, store_id)
                .values()
                .filter(|v| v.len() > 1)
                .count()
        })
        .sum::<usize>();
    let line = format!(
        "store_faults[{label}]: server killed mid-workload with calls in flight, down {:.1}s; \
         {probes} probe calls failed closed (slowest {}ms); workload store errors {store_errors}; \
         50 verified intents, 50 effects; plain unknown-by-design {unknown} (+{lost_completions} whose \
         completion the outage lost); duplicates seen {duplicates}; took {:.1}s",
        downtime.as_secs_f64(),
        slowest.as_millis(),
        started.elapsed().as_secs_f64()
    );
    println!("{line}");
    figures::record(
        "store_faults",
        &format!("{label} server crash"),
        &line,
        serde_json::json!({
            "server_crashes": 1,
            "probes_failed_closed": probes,
            "unknown": unknown,
            "lost_completions": lost_completions,
            "duplicates": duplicates,
        }),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_mid_workload_fails_closed_and_recovers_without_duplicates() {
    let Some(server) = PrivateRedis::start() else {
        return;
    };
    let store = RedisStore::builder(&server.0.url())
        .connect_timeout(Duration::from_millis(300))
        .response_timeout(Duration::from_millis(500))
        .reconnect_attempts(1)
        .connect()
        .await
        .unwrap();
    let (a, b) = (server.0.clone(), server.0.clone());
    stop_start(
        "redis",
        1,
        Arc::new(store),
        move || a.down(),
        move || b.up(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stopped_mid_workload_fails_closed_and_recovers_without_duplicates() {
    let Some(server) = PrivatePostgres::start() else {
        return;
    };
    let store = PostgresStore::builder(&server.0.url())
        .connect_timeout(Duration::from_millis(300))
        .operation_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    let (a, b) = (server.0.clone(), server.0.clone());
    stop_start(
        "postgres",
        2,
        Arc::new(store),
        move || a.down(),
        move || b.up(),
    )
    .await;
}

// ---------------------------------------------------------------------------------------
// A store that answers slower than the lease.

/// Delays every `renew` until the test opens the gate (long after the lease ran out), and
/// records what `renew` and `complete` answered, per token.
struct SlowRenew {
    inner: Arc<dyn Store>,
    gate: watch::Receiver<bool>,
    renewals: Mutex<Vec<(u64, Result<(), StoreError>)>>,
    completions: Mutex<Vec<(u64, Result<(), StoreError>)>>,
}

#[async_trait::async_trait]
impl Delegate for SlowRenew {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }
    async fn complete(&self, key: &str, token: u64, c: Completion<'_>) -> Result<(), StoreError> {
        let r = self.inner.complete(key, token, c).await;
        self.completions.lock().unwrap().push((token, r.clone()));
        r
    }
    async fn renew(&self, key: &str, token: u64, lease: Duration) -> Result<(), StoreError> {
        let mut gate = self.gate.clone();
        let _ = gate.wait_for(|open| *open).await;
        let r = self.inner.renew(key, token, lease).await;
        self.renewals.lock().unwrap().push((token, r.clone()));
        r
    }
}

/// Per job: how many bodies ran, and the gate that holds the first one.
/// Bodies run so far, and the gate that holds the first.
type Job = (usize, Option<Arc<tokio::sync::Notify>>);
static JOBS: Mutex<BTreeMap<u64, Job>> = Mutex::new(BTreeMap::new());

/// The first body (worker A) runs until the test lets it go; later bodies return at once.
#[mutating_tool(idempotency_key_fields = [job], lease = "200ms", on_unknown = "rerun")]
pub async fn slow_job(job: u64) -> Result<String, ToolError> {
    let (n, hold) = {
        let mut jobs = JOBS.lock().unwrap();
        let entry = jobs.entry(job).or_default();
        entry.0 += 1;
        (entry.0, entry.1.clone())
    };
    if n == 1 {
        if let Some(hold) = hold {
            hold.notified().await;
        }
        Ok(format!("job-{job}-by-A"))
    } else {
        Ok(format!("job-{job}-by-B"))
    }
}

async fn stale_holder_is_fenced(label: &str, job: u64, inner: Arc<dyn Store>) {
    let hold = Arc::new(tokio::sync::Notify::new());
    JOBS.lock()
        .unwrap()
        .insert(job, (0, Some(Arc::clone(&hold))));
    let (open, gate) = watch::channel(false);
    let slow = Arc::new(Wrapped(SlowRenew {
        inner: Arc::clone(&inner),
        gate,
        renewals: Mutex::new(Vec::new()),
        completions: Mutex::new(Vec::new()),
    }));
    let scope = support::unique(label);
    // Worker A: its renewals never land in time.
    let a = tokio::spawn(with_store(
        Arc::clone(&slow),
        with_scope(scope.clone(), slow_job(job)),
    ));
    let deadline = Instant::now() + Duration::from_secs(10);
    while JOBS.lock().unwrap()[&job].0 == 0 {
        assert!(Instant::now() < deadline, "[{label}] A never started");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // Worker B: waits out A's lease (the store says when), takes over, runs, completes.
    let b = with_store(Arc::clone(&inner), with_scope(scope.clone(), slow_job(job))).await;
    assert_eq!(
        b.unwrap(),
        format!("job-{job}-by-B"),
        "[{label}] B took over and completed"
    );
    // A's delayed renewal now reaches the store: refused.
    open.send(true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while slow.renewals.lock().unwrap().is_empty() {
        assert!(
            Instant::now() < deadline,
            "[{label}] A's renewal never reached the store"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A's body finishes late; its completion is refused.
    hold.notify_one();
    let a_result = a.await.unwrap();
    let renewals = slow.renewals.lock().unwrap().clone();
    let completions = slow.completions.lock().unwrap().clone();
    assert!(
        renewals
            .iter()
            .all(|(_, r)| matches!(r, Err(StoreError::LeaseLost { .. }))),
        "[{label}] A's late renewal is refused: {renewals:?}"
    );
    assert_eq!(
        completions.len(),
        1,
        "[{label}] A tried to complete once: {completions:?}"
    );
    let (a_token, a_completion) = &completions[0];
    assert!(
        matches!(a_completion, Err(StoreError::LeaseLost { token }) if token == a_token),
        "[{label}] A's late completion is refused: {a_completion:?}"
    );
    // A's caller got its own body's value (the effect happened), but the store kept B's.
    assert_eq!(a_result.unwrap(), format!("job-{job}-by-A"));
    let third = with_store(Arc::clone(&inner), with_scope(scope.clone(), slow_job(job))).await;
    assert_eq!(
        third.unwrap(),
        format!("job-{job}-by-B"),
        "[{label}] later callers get B's result"
    );
    let key = with_scope(scope, async {
        stores::key_of("slow_job", &serde_json::json!({ "job": job }))
    })
    .await;
    let record = inner.lookup(&key).await.unwrap().expect("record");
    match record.state {
        RecordState::Completed { result, .. } => {
            assert_eq!(
                result,
                format!("\"job-{job}-by-B\""),
                "[{label}] stored result is B's"
            )
        }
        other => panic!("[{label}] not completed: {other:?}"),
    }
    let history = inner.history(&key).await.unwrap();
    let events: Vec<(HistoryKind, u64)> = history.iter().map(|e| (e.kind, e.token)).collect();
    assert_eq!(events.len(), 3, "[{label}] {events:?}");
    assert_eq!(
        events[0],
        (HistoryKind::Claimed, *a_token),
        "[{label}] A claimed"
    );
    assert_eq!(events[1].0, HistoryKind::TakenOver, "[{label}] B took over");
    assert!(
        events[1].1 > *a_token,
        "[{label}] with a higher token: {events:?}"
    );
    assert_eq!(
        events[2],
        (HistoryKind::Completed, events[1].1),
        "[{label}] B completed, not A"
    );
    assert_eq!(
        JOBS.lock().unwrap()[&job].0,
        2,
        "[{label}] two bodies ran: A's and B's takeover"
    );
    let line = format!(
        "store_faults[{label}]: renew delayed past the 200ms lease; B took over (token {} > {a_token}) \
         and completed; A's late renewal ({} attempt(s)) and completion refused (LeaseLost)",
        events[1].1,
        renewals.len()
    );
    println!("{line}");
    figures::record(
        "store_faults",
        &format!("{label} slow renewal"),
        &line,
        serde_json::json!({ "stale_holders_fenced": 1 }),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_renewal_slower_than_the_lease_cannot_complete_as_a_stale_holder() {
    stale_holder_is_fenced("memory", 1, Arc::new(MemoryStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_renewal_slower_than_the_lease_cannot_complete_as_a_stale_holder() {
    let Some(server) = PrivateRedis::start() else {
        return;
    };
    let store = RedisStore::connect(&server.0.url()).await.unwrap();
    stale_holder_is_fenced("redis", 2, Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_renewal_slower_than_the_lease_cannot_complete_as_a_stale_holder() {
    let Some(server) = PrivatePostgres::start() else {
        return;
    };
    let store = PostgresStore::connect(&server.0.url()).await.unwrap();
    stale_holder_is_fenced("postgres", 3, Arc::new(store)).await;
}
