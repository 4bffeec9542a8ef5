//! `PostgresStore` passes the store conformance suite, survives concurrent migrations,
//! and fails closed when the server is unreachable or a row is corrupt.
//!
//! Needs a server: `TOOL_CONTRACTS_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test`.
//! Every test works in a schema of its own and drops it when it passes.
#![cfg(feature = "postgres")]

mod conformance;
#[path = "../../tests/support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tool_contracts_runtime::store::{
    ClaimOutcome, ClaimRequest, PostgresStore, PostgresStoreBuilder, Store, StoreError,
};

/// A schema name no other run uses (PostgreSQL identifiers: lowercase, digits, `_`).
fn unique_schema(what: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "tc_test_{what}_{}_{nanos}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// A raw connection, for what the store API deliberately cannot do.
async fn raw(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// A schema of its own on the test server, for one test, dropped by [`TestSchema::drop`]
/// when the test passes.
struct TestSchema {
    url: String,
    name: String,
}

impl TestSchema {
    /// `None` without a server: the test is skipped with a notice (see `support::url`).
    fn new(what: &str) -> Option<Self> {
        let url = support::url(&support::POSTGRES, "the PostgreSQL store suite")?;
        Some(Self {
            url,
            name: unique_schema(what),
        })
    }

    /// Options for a store whose tables live in this schema.
    fn builder(&self) -> PostgresStoreBuilder {
        PostgresStore::builder(&self.url).schema(&self.name)
    }

    /// A store in this schema, with the default options.
    async fn connect(&self) -> PostgresStore {
        self.builder().connect().await.unwrap()
    }

    /// A store in this schema with a pool large enough for 24 concurrent claims.
    async fn contended(&self) -> Arc<dyn Store> {
        Arc::new(self.builder().max_connections(16).connect().await.unwrap())
    }

    async fn drop(self) {
        raw(&self.url)
            .await
            .batch_execute(&format!("DROP SCHEMA \"{}\" CASCADE", self.name))
            .await
            .unwrap();
    }
}

fn req(key: &str) -> ClaimRequest<'_> {
    ClaimRequest {
        key,
        tool: "pg_tool",
        version: 1,
        scope: None,
        fingerprint: "fp",
        args: "{}",
        lease: Duration::from_secs(30),
        ttl: Duration::from_secs(60),
        worker: "pg-test-worker",
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_passes_the_conformance_suite() {
    let Some(schema) = TestSchema::new("conf") else {
        return;
    };
    let store = schema
        .builder()
        .table_prefix("conformance_")
        .connect()
        .await
        .unwrap();
    conformance::run_all(Arc::new(store), &conformance::unique("pg")).await;
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_passes_the_conformance_suite_with_a_near_cache() {
    let Some(schema) = TestSchema::new("near") else {
        return;
    };
    let store = schema
        .builder()
        .table_prefix("conformance_")
        .connect()
        .await
        .unwrap();
    conformance::run_all_near_cached(Arc::new(store), &conformance::unique("pg")).await;
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_purges_expired_records_in_the_background() {
    let Some(schema) = TestSchema::new("purge") else {
        return;
    };
    let store = schema.connect().await;
    let p = conformance::unique("pg-purge");
    store.set_purge_interval(None);
    conformance::expired_records_are_purged_in_the_background(&store, &p, false).await;
    store.set_purge_interval(Some(std::time::Duration::from_millis(200)));
    conformance::expired_records_are_purged_in_the_background(&store, &p, true).await;
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_connects_both_create_the_schema() {
    let Some(schema) = TestSchema::new("race") else {
        return;
    };
    let (a, b) = tokio::join!(schema.connect(), schema.connect());
    // Both see the same tables: a claim through one is held against the other.
    let token = conformance::acquire(&a, req("shared")).await;
    assert!(matches!(
        b.claim(req("shared")).await.unwrap(),
        ClaimOutcome::InProgress { .. }
    ));
    b.release("shared", token).await.unwrap();
    // Connecting again to migrated tables is a no-op.
    schema.connect().await;
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_is_unavailable_within_the_connect_timeout() {
    if support::url(&support::POSTGRES, "the PostgreSQL store suite").is_none() {
        return;
    }
    let started = Instant::now();
    let result = PostgresStore::builder("postgres://postgres@127.0.0.1:1/test")
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await;
    match result {
        Err(StoreError::Unavailable(e)) => {
            assert!(e.to_string().contains("postgres"), "{e}");
            // The cause is kept, not only its text: the pool's error, and under it the
            // driver's.
            let mut causes = std::iter::successors(std::error::Error::source(&e), |c| c.source());
            assert!(
                causes.any(|c| c.downcast_ref::<tokio_postgres::Error>().is_some()),
                "{e:?}"
            );
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_table_prefix_is_refused_before_it_reaches_sql() {
    if support::url(&support::POSTGRES, "the PostgreSQL store suite").is_none() {
        return;
    }
    let result = PostgresStore::builder("postgres://postgres@127.0.0.1:1/test")
        .table_prefix("x\"; DROP TABLE users; --")
        .connect()
        .await;
    match result {
        Err(StoreError::Unavailable(e)) => {
            assert!(e.to_string().contains("table prefix"), "{e}")
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_row_is_reported_corrupt_not_trusted() {
    let Some(schema) = TestSchema::new("corrupt") else {
        return;
    };
    let store = schema.connect().await;
    let token = conformance::acquire(&store, req("victim")).await;
    store
        .complete("victim", token, conformance::done("1"))
        .await
        .unwrap();
    raw(&schema.url)
        .await
        .execute(
            &format!(
                "UPDATE \"{}\".tool_contracts_records SET state = 'garbage' \
                 WHERE key = 'victim'",
                schema.name
            ),
            &[],
        )
        .await
        .unwrap();
    for result in [
        store.claim(req("victim")).await.map(|_| ()),
        store.lookup("victim").await.map(|_| ()),
    ] {
        match result {
            Err(StoreError::Corrupt(message)) => {
                assert!(message.contains("garbage"), "{message}")
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reclaims_of_an_expired_result_have_one_winner() {
    let Some(schema) = TestSchema::new("reclaim") else {
        return;
    };
    let store = schema.contended().await;
    for round in 0..5 {
        let key = format!("expired-{round}");
        let token = conformance::acquire(&*store, req(&key)).await;
        let short = conformance::completion("1", Duration::from_millis(50));
        store.complete(&key, token, short).await.unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
        let won = conformance::winners(24, |_| {
            let (store, key) = (Arc::clone(&store), key.clone());
            async move { store.claim(req(&key)).await }
        })
        .await;
        assert_eq!(
            won, 1,
            "round {round}: exactly one reclaim of an expired result wins"
        );
    }
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_takeovers_of_an_abandoned_claim_have_one_winner() {
    let Some(schema) = TestSchema::new("takeover") else {
        return;
    };
    let store = schema.contended().await;
    for round in 0..5 {
        let key = format!("abandoned-{round}");
        let stale = conformance::acquire(&*store, req(&key)).await;
        store.abandon(&key, stale).await.unwrap();
        let won = conformance::winners(24, |_| {
            let (store, key) = (Arc::clone(&store), key.clone());
            async move { store.takeover(req(&key), stale).await }
        })
        .await;
        assert_eq!(won, 1, "round {round}: exactly one takeover wins");
        let history = store.history(&key).await.unwrap();
        let kinds: Vec<&str> = history.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(kinds, ["claimed", "abandoned", "taken_over"]);
    }
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_history_outlives_the_release_and_is_purged_after_its_expiry() {
    let Some(url) = support::url(&support::POSTGRES, "the PostgreSQL store suite") else {
        return;
    };
    // No schema: the tables go to the search path, named by the prefix alone.
    let prefix = format!("{}_", unique_schema("hist"));
    let store = PostgresStore::builder(&url)
        .table_prefix(&prefix[..prefix.len().min(40)])
        .connect()
        .await
        .unwrap();
    let prefix = &prefix[..prefix.len().min(40)];
    let mut short = req("released");
    short.lease = Duration::from_millis(100);
    short.ttl = Duration::from_millis(100);
    let token = conformance::acquire(&store, short).await;
    store.release("released", token).await.unwrap();
    let live = conformance::acquire(&store, req("live")).await;
    assert_eq!(
        store.history("released").await.unwrap().len(),
        2,
        "kept after release"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(store.purge_expired().await.unwrap(), 0, "no record expired");
    assert!(
        store.history("released").await.unwrap().is_empty(),
        "purged after expiry"
    );
    assert_eq!(
        store.history("live").await.unwrap().len(),
        1,
        "a live key keeps its history"
    );
    store.release("live", live).await.unwrap();
    raw(&url)
        .await
        .batch_execute(&format!(
            "DROP TABLE \"{prefix}records\", \"{prefix}history\", \"{prefix}schema_version\";
             DROP SEQUENCE \"{prefix}token_seq\";"
        ))
        .await
        .unwrap();
}

/// Runs `sql` in a transaction on a raw connection and keeps it open while `start`
/// launches a store operation; commits once that operation is blocked on the
/// transaction's row lock, and returns what it answered: the answer must reflect the
/// committed write, not the operation's older snapshot.
async fn race_with_open_transaction(
    url: &str,
    sql: &str,
    start: impl FnOnce() -> tokio::task::JoinHandle<Result<ClaimOutcome, StoreError>>,
) -> ClaimOutcome {
    let mut client = raw(url).await;
    let tx = client.transaction().await.unwrap();
    tx.batch_execute(sql).await.unwrap();
    let op = start();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !op.is_finished(),
        "the store's statement waits for the row lock"
    );
    tx.commit().await.unwrap();
    op.await.unwrap().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_that_wait_on_a_concurrent_writer_answer_with_its_write() {
    let Some(schema) = TestSchema::new("snapshot") else {
        return;
    };
    let store: Arc<dyn Store> = Arc::new(schema.connect().await);
    let records = format!("\"{}\".tool_contracts_records", schema.name);
    let seq = format!("\"{}\".tool_contracts_token_seq", schema.name);
    let url = &schema.url;
    let spawn_claim = |key: &'static str, stale: Option<u64>| {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            match stale {
                Some(stale) => store.takeover(req(key), stale).await,
                None => store.claim(req(key)).await,
            }
        })
    };
    let claim_in_tx = |key: &str| {
        format!(
            "INSERT INTO {records} (key, tool, fingerprint, args, worker, state, token,
                 lease_expires_at, created_at, expires_at)
             VALUES ('{key}', 't', 'other', '{{}}', 'raw', 'in_progress', nextval('{seq}'),
                 now() + interval '30 s', now(), now() + interval '60 s')"
        )
    };
    let take_in_tx = |key: &str| {
        format!(
            "UPDATE {records} SET state = 'in_progress', token = nextval('{seq}'),
                 fingerprint = 'other', lease_expires_at = clock_timestamp() + interval '30 s',
                 result = NULL, completed_at = NULL
             WHERE key = '{key}'"
        )
    };
    let expect_other = |outcome: ClaimOutcome| match outcome {
        ClaimOutcome::InProgress { fingerprint, .. } => assert_eq!(fingerprint, "other"),
        other => panic!("expected the concurrent writer's claim, got {other:?}"),
    };

    // A first claim racing another first claim (the INSERT conflicts after waiting).
    let op = || spawn_claim("absent", None);
    expect_other(race_with_open_transaction(url, &claim_in_tx("absent"), op).await);

    // A claim of an expired result racing another reclaim of it.
    let token = conformance::acquire(&*store, req("expired")).await;
    let short = conformance::completion("1", Duration::from_millis(10));
    store.complete("expired", token, short).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let op = || spawn_claim("expired", None);
    expect_other(race_with_open_transaction(url, &take_in_tx("expired"), op).await);

    // A takeover racing another takeover of the same stale claim.
    let stale = conformance::acquire(&*store, req("stale")).await;
    store.abandon("stale", stale).await.unwrap();
    let op = || spawn_claim("stale", Some(stale));
    expect_other(race_with_open_transaction(url, &take_in_tx("stale"), op).await);

    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_of_schema_version_1_are_migrated_with_their_live_claims_and_history() {
    let Some(test_schema) = TestSchema::new("v1") else {
        return;
    };
    let (url, schema) = (test_schema.url.as_str(), test_schema.name.as_str());
    // Build the version-1 layout as an earlier release left it: connect (latest version),
    // then take version 2's changes back and write rows the way version 1 did.
    test_schema.connect().await;
    let t = |name: &str| format!("\"{schema}\".\"tool_contracts_{name}\"");
    let (records, history) = (t("records"), t("history"));
    raw(url)
        .await
        .batch_execute(&format!(
            "DROP INDEX \"{schema}\".tool_contracts_records_purge_idx;
             DROP INDEX \"{schema}\".tool_contracts_records_inflight_idx;
             ALTER TABLE {records} DROP COLUMN ev_at, DROP COLUMN ev_kind,
                 DROP COLUMN ev_token, DROP COLUMN ev_worker,
                 DROP COLUMN version, DROP COLUMN updated_at;
             CREATE INDEX tool_contracts_records_expires_at_idx ON {records} (expires_at);
             CREATE INDEX tool_contracts_records_pending_idx
                 ON {records} (created_at, key) WHERE state = 'in_progress';
             UPDATE {version} SET version = 1;
             INSERT INTO {records} (key, tool, fingerprint, args, worker, state, token,
                 lease_expires_at, created_at, expires_at)
             VALUES ('live-v1', 'pg_tool', 'fp', '{{}}', 'old-worker', 'in_progress', 7,
                 clock_timestamp() + interval '30 s', clock_timestamp(),
                 clock_timestamp() + interval '60 s');
             INSERT INTO {history} (key, at, kind, token, worker, expires_at)
             VALUES ('live-v1', clock_timestamp(), 'claimed', 7, 'old-worker',
                 clock_timestamp() + interval '60 s');",
            version = t("schema_version"),
        ))
        .await
        .unwrap();
    // The new release connects: it migrates, and the claim made under version 1 is still
    // held (fenced by its token), completes, and keeps its earlier event. Its record did
    // not keep a contract version nor an update time: read as not kept, and as created.
    let store = test_schema.connect().await;
    assert!(matches!(
        store.claim(req("live-v1")).await.unwrap(),
        ClaimOutcome::InProgress { .. }
    ));
    let old = store
        .observe("live-v1")
        .await
        .unwrap()
        .expect("the old claim")
        .record;
    assert_eq!(old.version, None);
    assert_eq!(old.updated_at, old.created_at);
    let completion = conformance::done("1");
    assert!(matches!(
        store.complete("live-v1", 8, completion).await,
        Err(StoreError::LeaseLost { token: 8 })
    ));
    store.complete("live-v1", 7, completion).await.unwrap();
    let kinds: Vec<&str> = store
        .history("live-v1")
        .await
        .unwrap()
        .iter()
        .map(|e| e.kind.as_str())
        .collect();
    assert_eq!(kinds, ["claimed", "completed"]);
    let done = store.lookup("live-v1").await.unwrap().expect("the result");
    assert!(
        done.updated_at > old.updated_at,
        "the completion is recorded: {done:?}"
    );
    assert!(matches!(
        store.claim(req("live-v1")).await.unwrap(),
        ClaimOutcome::Completed(r) if matches!(&r.state,
            tool_contracts_runtime::store::RecordState::Completed { result, .. } if result == "1")
    ));
    let indexes: Vec<String> = raw(url)
        .await
        .query(
            "SELECT indexname::text FROM pg_indexes WHERE schemaname = $1 ORDER BY 1",
            &[&schema],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        indexes.contains(&"tool_contracts_records_inflight_idx".to_owned())
            && !indexes.contains(&"tool_contracts_records_pending_idx".to_owned()),
        "{indexes:?}"
    );
    test_schema.drop().await;
}
