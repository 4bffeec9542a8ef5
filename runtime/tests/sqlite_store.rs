//! `SqliteStore` passes the store conformance suite, keeps its records across restarts,
//! stays atomic when several stores share one file, and reports bad files as errors.

#![cfg(feature = "sqlite")]

mod conformance;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tool_contracts_runtime::store::{
    ClaimOutcome, ClaimRequest, RecordState, SqliteStore, Store, StoreError,
};

/// A database file in the temp directory, deleted (with its WAL files) when dropped.
struct TempDb(PathBuf);

impl TempDb {
    fn new(name: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let unique = conformance::unique(&format!("tc-sqlite-{name}-{n}"));
        Self(std::env::temp_dir().join(format!("{unique}.db")))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut file = self.0.clone().into_os_string();
            file.push(suffix);
            let _ = std::fs::remove_file(file);
        }
    }
}

fn req(key: &str) -> ClaimRequest<'_> {
    ClaimRequest {
        key,
        tool: "sqlite_tool",
        version: 1,
        scope: None,
        fingerprint: "fp",
        args: "{}",
        lease: Duration::from_secs(30),
        ttl: Duration::from_secs(60),
        worker: "sqlite-test",
    }
}

async fn acquire(store: &dyn Store, key: &str) -> u64 {
    conformance::acquire(store, req(key)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_passes_the_conformance_suite() {
    let db = TempDb::new("conformance");
    let store = SqliteStore::open(db.path()).await.unwrap();
    conformance::run_all(Arc::new(store), &conformance::unique("sqlite")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_passes_the_conformance_suite_with_a_near_cache() {
    let db = TempDb::new("conformance-near");
    let store = SqliteStore::open(db.path()).await.unwrap();
    conformance::run_all_near_cached(Arc::new(store), &conformance::unique("sqlite")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_purges_expired_records_in_the_background() {
    let db = TempDb::new("bg-purge");
    let store = SqliteStore::open(db.path()).await.unwrap();
    let p = conformance::unique("sqlite-purge");
    store.set_purge_interval(None);
    conformance::expired_records_are_purged_in_the_background(&store, &p, false).await;
    store.set_purge_interval(Some(Duration::from_millis(200)));
    conformance::expired_records_are_purged_in_the_background(&store, &p, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_survive_reopening_the_file() {
    let db = TempDb::new("reopen");
    let (first_token, pending_token) = {
        let store = SqliteStore::open(db.path()).await.unwrap();
        let token = acquire(&store, "done").await;
        store
            .complete("done", token, conformance::done("\"paid\""))
            .await
            .unwrap();
        let pending = acquire(&store, "running").await;
        (token, pending)
    };
    // The first store is dropped: a restarted process opens the same file.
    let store = SqliteStore::open(db.path()).await.unwrap();
    match store.claim(req("done")).await.unwrap() {
        ClaimOutcome::Completed(rec) => assert!(matches!(
            rec.state,
            RecordState::Completed { ref result, .. } if result == "\"paid\""
        )),
        other => panic!("a completed result must survive a restart: {other:?}"),
    }
    assert!(matches!(
        store.lookup("running").await.unwrap().map(|r| r.state),
        Some(RecordState::InProgress { token, .. }) if token == pending_token
    ));
    assert_eq!(store.history("done").await.unwrap().len(), 2);
    let fresh = acquire(&store, "new").await;
    assert!(
        fresh > pending_token && fresh > first_token,
        "the fencing counter survives a restart: {fresh}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_stores_on_one_file_have_one_winner() {
    let db = TempDb::new("race");
    let a: Arc<dyn Store> = Arc::new(SqliteStore::open(db.path()).await.unwrap());
    let b: Arc<dyn Store> = Arc::new(SqliteStore::open(db.path()).await.unwrap());
    let winners = conformance::winners(32, |i| {
        let store = Arc::clone(if i % 2 == 0 { &a } else { &b });
        async move { store.claim(req("contended")).await }
    })
    .await;
    assert_eq!(
        winners, 1,
        "exactly one of 32 claims through two stores wins"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stores_opening_a_new_file_at_once_share_one_schema() {
    let db = TempDb::new("open-race");
    let path = db.path().to_path_buf();
    let opens: Vec<_> = (0..4)
        .map(|_| {
            let path = path.clone();
            tokio::spawn(async move { SqliteStore::open(path).await })
        })
        .collect();
    let mut stores = Vec::new();
    for open in opens {
        stores.push(open.await.unwrap().unwrap());
    }
    let token = acquire(&stores[0], "shared").await;
    assert!(matches!(
        stores[3].claim(req("shared")).await.unwrap(),
        ClaimOutcome::InProgress { .. }
    ));
    stores[3]
        .complete("shared", token, conformance::done("1"))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_corrupt_row_is_an_error_not_a_panic() {
    let db = TempDb::new("corrupt");
    let store = SqliteStore::open(db.path()).await.unwrap();
    acquire(&store, "bad-state").await;
    acquire(&store, "bad-token").await;
    let raw = rusqlite::Connection::open(db.path()).unwrap();
    raw.execute(
        "UPDATE records SET state = 'garbage' WHERE key = 'bad-state'",
        [],
    )
    .unwrap();
    raw.execute(
        "UPDATE records SET token = 'not a number' WHERE key = 'bad-token'",
        [],
    )
    .unwrap();
    raw.execute(
        "INSERT INTO history (key, at_ms, kind, token, worker) VALUES ('bad-state', 0, 'exploded', 1, 'x')",
        [],
    )
    .unwrap();
    drop(raw);

    for key in ["bad-state", "bad-token"] {
        let lookup = store.lookup(key).await;
        assert!(
            matches!(lookup, Err(StoreError::Corrupt(ref m)) if m.contains(key)),
            "{lookup:?}"
        );
        let claim = store.claim(req(key)).await;
        assert!(matches!(claim, Err(StoreError::Corrupt(_))), "{claim:?}");
        let takeover = store.takeover(req(key), 1).await;
        assert!(
            matches!(takeover, Err(StoreError::Corrupt(_))),
            "{takeover:?}"
        );
    }
    let pending = store.pending(10).await;
    assert!(
        matches!(pending, Err(StoreError::Corrupt(_))),
        "{pending:?}"
    );
    let history = store.history("bad-state").await;
    assert!(
        matches!(history, Err(StoreError::Corrupt(ref m)) if m.contains("exploded")),
        "{history:?}"
    );
    // Other keys are unaffected.
    acquire(&store, "fine").await;
}

#[tokio::test]
async fn opening_in_a_missing_directory_names_the_path() {
    let dir = std::env::temp_dir().join(conformance::unique("tc-sqlite-missing-dir"));
    let path = dir.join("store.db");
    let err = SqliteStore::open(&path).await.unwrap_err();
    match &err {
        StoreError::Unavailable(e) => {
            let msg = e.to_string();
            assert!(msg.contains(&path.display().to_string()), "{msg}");
            assert!(msg.contains("does not exist"), "{msg}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    // The cause is kept, not only its text: SQLite's own error, for code that asks.
    let cause = std::error::Error::source(&err).expect("the cause is kept");
    assert!(
        cause.downcast_ref::<rusqlite::Error>().is_some(),
        "{cause:?}"
    );
    assert!(!dir.exists(), "opening must not create directories");
}

#[tokio::test]
async fn a_file_from_a_newer_version_is_refused() {
    let db = TempDb::new("newer");
    drop(SqliteStore::open(db.path()).await.unwrap());
    let raw = rusqlite::Connection::open(db.path()).unwrap();
    raw.pragma_update(None, "user_version", 99).unwrap();
    drop(raw);
    match SqliteStore::open(db.path()).await {
        Err(StoreError::Unavailable(e)) => {
            assert!(e.to_string().contains("schema version 99"), "{e}")
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[tokio::test]
async fn a_file_of_schema_version_1_is_migrated_with_its_records() {
    let db = TempDb::new("v1");
    // The version-1 layout as an earlier release left it: today's, with version 2's
    // columns taken back, and a claim and a result written the way version 1 did.
    drop(SqliteStore::open(db.path()).await.unwrap());
    let raw = rusqlite::Connection::open(db.path()).unwrap();
    raw.execute_batch(
        "ALTER TABLE records DROP COLUMN version;
         ALTER TABLE records DROP COLUMN updated_ms;
         PRAGMA user_version = 1;
         INSERT INTO records (key, tool, scope, worker, fingerprint, args, state, token,
             lease_expires_ms, created_ms, expires_ms)
         VALUES ('live-v1', 'sqlite_tool', NULL, 'old-worker', 'fp', '{}', 'in_progress', 7,
             9000000000000, 1000, 9000000000000);
         INSERT INTO records (key, tool, scope, worker, fingerprint, args, state, token,
             result, is_error, created_ms, completed_ms, expires_ms)
         VALUES ('done-v1', 'sqlite_tool', NULL, 'old-worker', 'fp', '{}', 'completed', 8,
             '\"old\"', 0, 1000, 2000, 9000000000000);
         UPDATE meta SET value = 8 WHERE name = 'last_token';",
    )
    .unwrap();
    drop(raw);

    let store = SqliteStore::open(db.path()).await.unwrap();
    let version: i64 = rusqlite::Connection::open(db.path())
        .unwrap()
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .unwrap();
    assert_eq!(version, 2);
    let at = |ms| std::time::UNIX_EPOCH + Duration::from_millis(ms);
    let live = store
        .lookup("live-v1")
        .await
        .unwrap()
        .expect("the old claim");
    assert_eq!((live.version, live.updated_at), (None, at(1000)));
    let done = store
        .lookup("done-v1")
        .await
        .unwrap()
        .expect("the old result");
    assert_eq!((done.version, done.updated_at), (None, at(2000)));
    // The old claim is still held by its token, and completes under it.
    assert!(matches!(
        store.claim(req("live-v1")).await.unwrap(),
        ClaimOutcome::InProgress { .. }
    ));
    store
        .complete("live-v1", 7, conformance::done("1"))
        .await
        .unwrap();
    let live = store.lookup("live-v1").await.unwrap().expect("the result");
    assert!(live.updated_at > at(1000), "{live:?}");
    assert_eq!(live.version, None, "completing does not invent a version");
}

#[tokio::test]
async fn a_file_that_is_not_a_database_is_refused() {
    let db = TempDb::new("not-a-db");
    std::fs::write(db.path(), vec![0x42u8; 8192]).unwrap();
    match SqliteStore::open(db.path()).await {
        Err(e @ (StoreError::Corrupt(_) | StoreError::Unavailable(_))) => {
            let msg = e.to_string();
            assert!(msg.contains(&db.path().display().to_string()), "{msg}")
        }
        other => panic!("expected an error, got {other:?}"),
    }
}

#[tokio::test]
async fn released_history_is_purged_with_expired_records() {
    let db = TempDb::new("purge");
    let store = SqliteStore::open(db.path()).await.unwrap();
    let token = acquire(&store, "released").await;
    store.release("released", token).await.unwrap();
    assert_eq!(
        store.history("released").await.unwrap().len(),
        2,
        "history survives release"
    );
    let token = acquire(&store, "kept").await;
    store
        .complete("kept", token, conformance::done("1"))
        .await
        .unwrap();
    let token = acquire(&store, "short").await;
    let short = conformance::completion("1", Duration::from_millis(1));
    store.complete("short", token, short).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(store.purge_expired().await.unwrap(), 1);
    assert!(store.history("short").await.unwrap().is_empty());
    assert!(store.history("released").await.unwrap().is_empty());
    assert_eq!(store.history("kept").await.unwrap().len(), 2);
}

const CHILD_DB: &str = "TC_SQLITE_CHILD_DB";

/// Not a test of its own: `four_processes_racing_on_one_file_have_one_winner_per_key`
/// runs this binary four times with only this test selected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run as a child process by four_processes_racing_on_one_file_have_one_winner_per_key"]
async fn child_process_claims_every_key() {
    let Ok(path) = std::env::var(CHILD_DB) else {
        return;
    };
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).await.unwrap());
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let key = format!("fleet-{i}");
                match store.claim(req(&key)).await.unwrap() {
                    ClaimOutcome::Acquired { token } => {
                        store
                            .complete(&key, token, conformance::done("1"))
                            .await
                            .unwrap();
                        1
                    }
                    ClaimOutcome::InProgress { .. } | ClaimOutcome::Completed(_) => 0,
                    other => panic!("unexpected {other:?}"),
                }
            })
        })
        .collect();
    let mut won = 0;
    for task in tasks {
        won += task.await.unwrap();
    }
    println!("WON {won}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_racing_on_one_file_have_one_winner_per_key() {
    let db = TempDb::new("processes");
    let exe = std::env::current_exe().unwrap();
    // The children create the file and its schema concurrently, too.
    let children: Vec<_> = (0..4)
        .map(|_| {
            std::process::Command::new(&exe)
                .args(["--exact", "child_process_claims_every_key", "--ignored"])
                .args(["--nocapture", "--test-threads=1"])
                .env(CHILD_DB, db.path())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut won = 0;
    for child in children {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "child failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        won += stdout
            .split("WON ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or_else(|| panic!("no WON line in child output: {stdout}"));
    }
    assert_eq!(won, 50, "each of 50 keys is won by exactly one process");
    let store = SqliteStore::open(db.path()).await.unwrap();
    for i in 0..50 {
        let history = store.history(&format!("fleet-{i}")).await.unwrap();
        assert_eq!(
            history.len(),
            2,
            "one claim and one completion: {history:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_write_does_not_undo_the_writes_committed_with_it() {
    // Concurrent writes share one transaction (group commit): a fenced-out completion
    // must roll back alone, and the others in its batch must still commit.
    let db = TempDb::new("batch");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(db.path()).await.unwrap());
    let mut tokens = Vec::new();
    for i in 0..32 {
        tokens.push(acquire(&*store, &format!("batch-{i}")).await);
    }
    let tasks: Vec<_> = tokens
        .iter()
        .enumerate()
        .map(|(i, &token)| {
            let store = Arc::clone(&store);
            // Odd keys are completed under a stale token.
            let token = if i % 2 == 0 { token } else { token + 1_000 };
            tokio::spawn(async move {
                store
                    .complete(&format!("batch-{i}"), token, conformance::done("\"ok\""))
                    .await
            })
        })
        .collect();
    for (i, task) in tasks.into_iter().enumerate() {
        let result = task.await.unwrap();
        let rec = store.lookup(&format!("batch-{i}")).await.unwrap().unwrap();
        if i % 2 == 0 {
            assert_eq!(result, Ok(()));
            assert!(
                matches!(rec.state, RecordState::Completed { .. }),
                "{rec:?}"
            );
        } else {
            assert!(
                matches!(result, Err(StoreError::LeaseLost { .. })),
                "{result:?}"
            );
            assert!(
                matches!(rec.state, RecordState::InProgress { .. }),
                "{rec:?}"
            );
        }
    }
}
