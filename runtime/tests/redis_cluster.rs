//! `RedisStore` on Redis Cluster, against a local cluster of three primaries the test
//! starts itself (`tests/support/redis_cluster.rs`) and tears down after: the store
//! conformance suite, keys spread over every primary with each call's keys in one slot,
//! a stable cluster answering every operation without a redirection, and how a cluster is
//! named (URL, builder) and checked on connect.
//!
//! Needs `redis-server` and `redis-cli` (Redis 7.0 or later) on the `PATH`; without them
//! the tests skip with a notice, and fail under `CI`.
#![cfg(feature = "redis")]

mod conformance;
#[path = "../../tests/support/redis_cluster.rs"]
mod redis_cluster;
#[path = "../../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis_cluster::{LocalCluster, PRIMARIES};
use tool_contracts_runtime::store::{
    ClaimOutcome, ClaimRequest, RecordState, RedisStore, Resolution, ResolveRequest, Store,
    StoreError,
};

/// A store on `cluster` under a fresh prefix (labelled `label`), and that prefix.
async fn cluster_store(cluster: &LocalCluster, label: &str) -> (RedisStore, String) {
    let prefix = format!("{}:", conformance::unique(label));
    let store = RedisStore::cluster_builder(cluster.node_urls())
        .prefix(&prefix)
        .allow_without_persistence()
        .connect()
        .await
        .unwrap();
    (store, prefix)
}

/// A plain connection to each node (no cluster routing), to look at what each holds.
async fn nodes(cluster: &LocalCluster) -> Vec<(u16, MultiplexedConnection)> {
    let mut out = Vec::new();
    for (port, url) in cluster.ports().iter().zip(cluster.node_urls()) {
        let conn = redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        out.push((*port, conn));
    }
    out
}

/// Every key on one node that matches `pattern`.
async fn keys_on(conn: &mut MultiplexedConnection, pattern: &str) -> Vec<String> {
    let mut keys = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .unwrap();
        keys.extend(batch);
        if next == 0 {
            return keys;
        }
        cursor = next;
    }
}

async fn slot_of(conn: &mut MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap()
}

fn req(key: &str) -> ClaimRequest<'_> {
    ClaimRequest {
        key,
        tool: "cluster_tool",
        version: 1,
        scope: None,
        fingerprint: "fp",
        args: "{}",
        lease: Duration::from_secs(30),
        ttl: Duration::from_secs(60),
        worker: "cluster-test",
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_store_passes_the_conformance_suite() {
    let Some(cluster) = LocalCluster::shared("the Redis Cluster store suite") else {
        return;
    };
    let (store, _) = cluster_store(&cluster, "tc-cluster").await;
    conformance::run_all(Arc::new(store), &conformance::unique("cluster")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_store_passes_the_conformance_suite_with_a_near_cache() {
    let Some(cluster) = LocalCluster::shared("the Redis Cluster store suite") else {
        return;
    };
    let (store, _) = cluster_store(&cluster, "tc-cluster-near").await;
    conformance::run_all_near_cached(Arc::new(store), &conformance::unique("cluster")).await;
}

/// 100 claims land on every primary (the cluster is really used), and each key's record,
/// history, indexes and fencing counter sit on one node in one slot (what lets each
/// operation be one script). `pending` merges the buckets oldest first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_spread_over_every_primary_and_each_calls_keys_share_a_slot() {
    let Some(cluster) = LocalCluster::shared("the Redis Cluster spread test") else {
        return;
    };
    let (store, prefix) = cluster_store(&cluster, "tc-spread").await;
    let mut open = Vec::new();
    for i in 0..100 {
        let key = format!("spread-{i}");
        let token = conformance::acquire(&store, req(&key)).await;
        if i % 2 == 0 {
            let done = conformance::completion("1", Duration::from_secs(60));
            store.complete(&key, token, done).await.unwrap();
        } else {
            open.push(key);
        }
    }
    let mut records_per_node = BTreeMap::new();
    let mut total = 0;
    for (port, mut conn) in nodes(&cluster).await {
        let keys = keys_on(&mut conn, &format!("{prefix}*")).await;
        let records: Vec<&String> = keys.iter().filter(|k| k.contains("}r:")).collect();
        for record in &records {
            // `{prefix}{TAG}r:{key}`: the same bucket's other keys are on this node, in
            // this slot.
            let (bucket, key) = record.split_once("}r:").unwrap();
            let bucket = format!("{bucket}}}");
            for sibling in [
                format!("{bucket}h:{key}"),
                format!("{bucket}token"),
                format!("{bucket}expiry"),
            ] {
                assert!(
                    keys.contains(&sibling),
                    "{sibling} beside {record} on node {port}"
                );
                assert_eq!(
                    slot_of(&mut conn, &sibling).await,
                    slot_of(&mut conn, record).await
                );
            }
        }
        total += records.len();
        records_per_node.insert(port, records.len());
    }
    assert_eq!(total, 100, "{records_per_node:?}");
    assert_eq!(records_per_node.len(), PRIMARIES);
    assert!(
        records_per_node.values().all(|n| *n >= 15),
        "every primary holds a share of the keys: {records_per_node:?}"
    );

    let pending = store.pending(1000).await.unwrap();
    let mut listed: Vec<&str> = pending.iter().map(|r| r.key.as_str()).collect();
    assert!(
        pending
            .windows(2)
            .all(|w| (w[0].created_at, &w[0].key) <= (w[1].created_at, &w[1].key)),
        "oldest first across the buckets"
    );
    assert!(pending
        .iter()
        .all(|r| matches!(r.state, RecordState::InProgress { .. })));
    let first_ten: Vec<String> = store
        .pending(10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.key)
        .collect();
    assert_eq!(first_ten, listed[..10].to_vec());
    listed.sort_unstable();
    open.sort_unstable();
    assert_eq!(listed, open);
}

/// On a cluster whose slots stay put, no operation is ever redirected (`MOVED`, `ASK`),
/// refused for keys of several slots (`CROSSSLOT`) or told to retry (`TRYAGAIN`): each
/// script goes straight to the primary of its keys' one slot. Read from every node's
/// error statistics, which do count a redirection (shown at the end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stable_cluster_answers_every_operation_without_a_redirection() {
    let Some(cluster) = LocalCluster::shared("the Redis Cluster redirection test") else {
        return;
    };
    let mut nodes = nodes(&cluster).await;
    for (_, conn) in &mut nodes {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(conn)
            .await
            .unwrap();
    }
    let (store, prefix) = cluster_store(&cluster, "tc-direct").await;
    for i in 0..60 {
        let key = format!("direct-{i}");
        let token = conformance::acquire(&store, req(&key)).await;
        store
            .renew(&key, token, Duration::from_secs(30))
            .await
            .unwrap();
        assert!(store.observe(&key).await.unwrap().is_some());
        match i % 4 {
            0 => store.release(&key, token).await.unwrap(),
            1 => {
                store.abandon(&key, token).await.unwrap();
                let resolution = Resolution::Complete {
                    result: "\"checked\"",
                    ttl: Duration::from_secs(60),
                };
                store
                    .resolve(ResolveRequest {
                        key: &key,
                        resolution,
                        kind: tool_contracts_runtime::store::HistoryKind::Resolved,
                        worker: "operator",
                    })
                    .await
                    .unwrap();
            }
            _ => {
                let done = conformance::completion("1", Duration::from_millis(300));
                store.complete(&key, token, done).await.unwrap();
                assert!(matches!(
                    store.claim(req(&key)).await.unwrap(),
                    ClaimOutcome::Completed(_)
                ));
            }
        }
        assert!(!store.history(&key).await.unwrap().is_empty());
        assert!(store.lookup(&format!("never-{i}")).await.unwrap().is_none());
    }
    store.pending(100).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(store.purge_expired().await.unwrap() >= 30);

    let mut record = None;
    for (port, conn) in &mut nodes {
        let stats: String = redis::cmd("INFO")
            .arg("errorstats")
            .query_async(conn)
            .await
            .unwrap();
        for error in ["MOVED", "ASK", "CROSSSLOT", "TRYAGAIN"] {
            assert!(
                !stats.contains(&format!("errorstat_{error}:")),
                "node {port} answered {error}: {stats}"
            );
        }
        record = record.or(keys_on(conn, &format!("{prefix}*r:*")).await.pop());
    }
    // The statistics do see a redirection: a record read from a node that does not hold it.
    let record = record.expect("a record on some node");
    let mut redirected = false;
    for (port, conn) in &mut nodes {
        let read: Result<Vec<String>, _> =
            redis::cmd("HGETALL").arg(&record).query_async(conn).await;
        if let Err(e) = read {
            assert_eq!(e.code(), Some("MOVED"), "{e}");
            let stats: String = redis::cmd("INFO")
                .arg("errorstats")
                .query_async(conn)
                .await
                .unwrap();
            assert!(stats.contains("errorstat_MOVED:"), "node {port}: {stats}");
            redirected = true;
        }
    }
    assert!(redirected, "{record} read from every node without a MOVED");
}

/// The URL form reaches the cluster through `store::open`; every primary must keep an
/// append-only file unless opted out; a prefix holding a hash tag of its own and a plain
/// `redis://` URL of a cluster node are refused with what to write instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_is_named_by_url_or_nodes_and_checked_on_connect() {
    let Some(cluster) = LocalCluster::shared("the Redis Cluster connect test") else {
        return;
    };
    match RedisStore::connect(&cluster.url()).await {
        Err(StoreError::Unavailable(e)) => {
            let message = e.to_string();
            assert!(message.contains("appendonly no"), "{message}");
            assert!(
                message.contains("127.0.0.1:"),
                "names the primary: {message}"
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let url = format!("{}/?allow_without_persistence=true", cluster.url());
    let store = tool_contracts_runtime::store::open(&url).await.unwrap();
    assert_eq!(store.backend(), "redis");
    let key = conformance::unique("by-url");
    let token = conformance::acquire(&*store, req(&key)).await;
    store.release(&key, token).await.unwrap();

    let braced = RedisStore::cluster_builder(cluster.node_urls())
        .prefix("{tc}:")
        .allow_without_persistence()
        .connect()
        .await;
    match braced {
        Err(StoreError::Unavailable(e)) => {
            assert!(e.to_string().contains("without braces"), "{e}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let node = &cluster.node_urls()[0];
    let single = RedisStore::builder(node)
        .allow_without_persistence()
        .connect()
        .await;
    match single {
        Err(StoreError::Unavailable(e)) => {
            assert!(e.to_string().contains("redis+cluster://"), "{e}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// `CLUSTER MYID` of a node.
async fn node_id(conn: &mut MultiplexedConnection) -> String {
    redis::cmd("CLUSTER")
        .arg("MYID")
        .query_async(conn)
        .await
        .unwrap()
}

/// Moves `keys` from the node of `conn` to the node on `port` (the slot already marked
/// migrating there and importing here), as `redis-cli --cluster reshard` does.
async fn migrate(conn: &mut MultiplexedConnection, port: u16, keys: &[&str]) {
    let _: () = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(port)
        .arg("")
        .arg(0)
        .arg(5000)
        .arg("KEYS")
        .arg(keys)
        .query_async(conn)
        .await
        .unwrap();
}

/// A resharding caught in the middle: the slot of a bucket is moving from one primary to
/// another, and the bucket's indexes and counter have moved, with one pending key's record
/// and history (`ahead`), while another pending key (`behind`) has not. A claim of
/// `behind` would touch both halves and fails closed (`TRYAGAIN`); a listing and a purge
/// run on the importing node (after an `ASK`), where `behind`'s record is not yet, and
/// must not drop its pending entry as if the record were gone; once the slot has moved
/// both keys are listed again and `behind`'s holder completes it on the new primary (the
/// client follows `MOVED`). A cluster of its own: the slot's state would disturb the
/// other tests' keys of that bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_moving_between_primaries_keeps_its_pending_keys_and_fails_closed_while_split() {
    let Some(cluster) = LocalCluster::start("the Redis Cluster slot migration test") else {
        return;
    };
    let prefix = format!("{}:", conformance::unique("tc-move"));
    // More re-sends than the default 2: the redis crate sends `ASKING` as a command of its
    // own on the node's multiplexed connection, so a script sent there at the same moment
    // (`pending` has 32 in flight) can take its one-time flag, and the redirected script
    // comes back `MOVED` and goes round again.
    let store = RedisStore::cluster_builder(cluster.node_urls())
        .prefix(&prefix)
        .allow_without_persistence()
        .reconnect_attempts(16)
        .connect()
        .await
        .unwrap();
    let mut nodes = nodes(&cluster).await;
    // Pending keys until two share a bucket (256 buckets: a few dozen keys do it).
    let mut tokens = BTreeMap::new();
    let mut by_bucket: BTreeMap<String, Vec<(usize, String)>> = BTreeMap::new();
    let (a, bucket) = 'found: {
        for i in 0..400 {
            let key = format!("moving-{i}");
            tokens.insert(key.clone(), conformance::acquire(&store, req(&key)).await);
            for (n, (_, conn)) in nodes.iter_mut().enumerate() {
                if let Some(record) = keys_on(conn, &format!("{prefix}*r:{key}")).await.pop() {
                    let bucket = record.strip_suffix(&format!("r:{key}")).unwrap().to_owned();
                    let keys = by_bucket.entry(bucket.clone()).or_default();
                    keys.push((n, key.clone()));
                    if keys.len() == 2 {
                        break 'found (n, bucket);
                    }
                }
            }
        }
        panic!("400 keys and no two in one of 256 buckets");
    };
    let (behind, ahead) = (
        by_bucket[&bucket][0].1.clone(),
        by_bucket[&bucket][1].1.clone(),
    );
    let b = (a + 1) % PRIMARIES;
    let slot = slot_of(&mut nodes[a].1, &format!("{bucket}token")).await;
    let (a_id, b_id) = (
        node_id(&mut nodes[a].1).await,
        node_id(&mut nodes[b].1).await,
    );
    let port_b = nodes[b].0;
    let setslot = |state: &str, id: &str| {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SETSLOT").arg(slot).arg(state).arg(id);
        cmd
    };
    let _: () = setslot("IMPORTING", &a_id)
        .query_async(&mut nodes[b].1)
        .await
        .unwrap();
    let _: () = setslot("MIGRATING", &b_id)
        .query_async(&mut nodes[a].1)
        .await
        .unwrap();
    let names = |key: &str| [format!("{bucket}r:{key}"), format!("{bucket}h:{key}")];
    let mut first_half = vec![
        format!("{bucket}pending"),
        format!("{bucket}expiry"),
        format!("{bucket}token"),
    ];
    first_half.extend(names(&ahead));
    let first_half: Vec<&str> = first_half.iter().map(String::as_str).collect();
    migrate(&mut nodes[a].1, port_b, &first_half).await;

    // With the default 2 re-sends (the listing store's 16 would wait out the timeout).
    let strict = RedisStore::cluster_builder(cluster.node_urls())
        .prefix(&prefix)
        .allow_without_persistence()
        .connect()
        .await
        .unwrap();
    match strict.claim(req(&behind)).await {
        Err(StoreError::Unavailable(e)) => {
            let cause = format!("{e:?}");
            assert!(cause.contains("TryAgain"), "{cause}");
        }
        other => panic!("a claim across the split must fail closed, got {other:?}"),
    }
    let listed: Vec<String> = store
        .pending(1000)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.key)
        .collect();
    assert!(
        listed.contains(&ahead) && !listed.contains(&behind),
        "{listed:?}"
    );
    store.purge_expired().await.unwrap();

    let second_half = names(&behind);
    let second_half: Vec<&str> = second_half.iter().map(String::as_str).collect();
    migrate(&mut nodes[a].1, port_b, &second_half).await;
    for i in [b, a, (b + 1) % PRIMARIES] {
        let _: () = setslot("NODE", &b_id)
            .query_async(&mut nodes[i].1)
            .await
            .unwrap();
    }
    let listed: Vec<String> = store
        .pending(1000)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.key)
        .collect();
    assert!(
        listed.contains(&ahead) && listed.contains(&behind),
        "both pending entries outlived the move: {listed:?}"
    );
    let done = conformance::completion("\"moved\"", Duration::from_secs(60));
    store
        .complete(&behind, tokens[&behind], done)
        .await
        .unwrap();
    assert!(matches!(
        store.claim(req(&behind)).await.unwrap(),
        ClaimOutcome::Completed(_)
    ));
    let on_b = keys_on(&mut nodes[b].1, &format!("{bucket}*")).await;
    assert!(on_b.contains(&format!("{bucket}r:{behind}")), "{on_b:?}");
}

/// No server needed: a cluster named without a node, or with a database other than 0,
/// is refused before anything connects, with what to write.
#[tokio::test]
async fn a_cluster_named_without_a_node_or_with_a_database_is_refused() {
    for (result, says) in [
        (
            RedisStore::cluster_builder(Vec::<String>::new())
                .connect()
                .await,
            "name at least one",
        ),
        (
            RedisStore::connect("redis+cluster://").await,
            "HOST:PORT,HOST:PORT",
        ),
        (
            RedisStore::connect("redis+cluster://127.0.0.1:1/2").await,
            "only database 0",
        ),
    ] {
        match result {
            Err(StoreError::Unavailable(e)) => assert!(e.to_string().contains(says), "{e}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
}
