//! `RedisStore` passes the store conformance suite, fails closed when the server is
//! unreachable, and reports a malformed record as corrupt.
//!
//! Needs a server: `TOOL_CONTRACTS_REDIS_URL=redis://127.0.0.1:6379`. Without it the
//! tests skip locally and fail in CI (`CI` set), so a CI run can never pass silently
//! without the backend.
#![cfg(feature = "redis")]

mod conformance;
#[path = "../../tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tool_contracts_runtime::store::{ClaimOutcome, ClaimRequest, RedisStore, Store, StoreError};

/// A store under a prefix no other run uses, its prefix, and a raw connection to poke at
/// its keys; `None` without a server (the test is skipped, see `support::url`).
async fn fresh_store(
    name: &str,
) -> Option<(RedisStore, String, redis::aio::MultiplexedConnection)> {
    let url = support::url(&support::REDIS, "the Redis store suite")?;
    let prefix = format!("{}:", conformance::unique(name));
    let store = RedisStore::with_prefix(&url, &prefix).await.unwrap();
    let raw = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    Some((store, prefix, raw))
}

/// Deletes every key under `prefix`, so runs leave the shared server clean.
async fn cleanup(raw: &mut redis::aio::MultiplexedConnection, prefix: &str) {
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(raw)
        .await
        .unwrap();
    for key in keys {
        let _: () = redis::cmd("DEL").arg(key).query_async(raw).await.unwrap();
    }
}

fn corrupt<T>(r: &Result<T, StoreError>) -> bool {
    matches!(r, Err(StoreError::Corrupt(_)))
}

fn req(key: &str) -> ClaimRequest<'_> {
    ClaimRequest {
        key,
        tool: "redis_tool",
        version: 1,
        scope: None,
        fingerprint: "fp",
        args: "{}",
        lease: Duration::from_secs(30),
        ttl: Duration::from_secs(60),
        worker: "redis-test",
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_passes_the_conformance_suite() {
    let Some((store, prefix, mut raw)) = fresh_store("tc-redis").await else {
        return;
    };
    conformance::run_all(Arc::new(store), &conformance::unique("redis")).await;
    cleanup(&mut raw, &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_passes_the_conformance_suite_with_a_near_cache() {
    let Some((store, prefix, mut raw)) = fresh_store("tc-redis-near").await else {
        return;
    };
    conformance::run_all_near_cached(Arc::new(store), &conformance::unique("redis")).await;
    cleanup(&mut raw, &prefix).await;
}

#[tokio::test]
async fn an_unreachable_server_is_unavailable_quickly() {
    // Port 1 on loopback: nothing listens, so the connection is refused. No server needed.
    let started = Instant::now();
    let result = RedisStore::builder("redis://127.0.0.1:1")
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await;
    match result {
        Err(StoreError::Unavailable(e)) => {
            let msg = e.to_string();
            assert!(
                msg.contains("127.0.0.1:1"),
                "the message names the server: {msg}"
            );
            // The cause is kept, not only its text: the redis crate's own error.
            let cause = std::error::Error::source(&e).expect("the cause is kept");
            assert!(
                cause.downcast_ref::<redis::RedisError>().is_some(),
                "{cause:?}"
            );
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "gave up after {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn an_invalid_url_is_unavailable() {
    assert!(matches!(
        RedisStore::connect("not a url").await,
        Err(StoreError::Unavailable(_))
    ));
}

#[tokio::test]
async fn a_garbage_token_in_a_record_is_reported_corrupt() {
    let Some((store, prefix, mut raw)) = fresh_store("tc-redis-corrupt").await else {
        return;
    };
    let key = "corrupt-🔑";
    let token = conformance::acquire(&store, req(key)).await;
    let _: () = redis::cmd("HSET")
        .arg(format!("{prefix}r:{key}"))
        .arg("tok")
        .arg("not-a-number")
        .query_async(&mut raw)
        .await
        .unwrap();
    let claimed = store.claim(req(key)).await;
    assert!(corrupt(&claimed), "claim: {claimed:?}");
    let looked_up = store.lookup(key).await;
    assert!(corrupt(&looked_up), "lookup: {looked_up:?}");
    let completed = store
        .complete(
            key,
            token,
            conformance::completion("1", Duration::from_secs(1)),
        )
        .await;
    assert!(corrupt(&completed), "complete: {completed:?}");
    let listed = store.pending(10).await;
    assert!(corrupt(&listed), "pending: {listed:?}");
    // The message names the key and the field an operator must fix.
    match claimed {
        Err(StoreError::Corrupt(msg)) => {
            assert!(msg.contains(key) && msg.contains("`tok`"), "{msg}")
        }
        other => panic!("{other:?}"),
    }
    cleanup(&mut raw, &prefix).await;
}

/// A claim answers a completed record after the script checks only its state and expiry
/// (the replay's fast path: its expiry only read as a number); every other field is checked
/// by the client, so a completed record with a malformed token, no worker, no state or an
/// expiry not of the record's form is still reported corrupt, naming the field, and is left
/// as it was.
#[tokio::test]
async fn a_malformed_completed_record_is_reported_corrupt_on_replay() {
    let Some((store, prefix, mut raw)) = fresh_store("tc-redis-corrupt-done").await else {
        return;
    };
    for (i, (edit, field)) in [
        (&["HSET", "tok", "not-a-number"][..], "`tok`"),
        (&["HSET", "tok", "0"][..], "`tok`"),
        (&["HDEL", "worker"][..], "`worker`"),
        (&["HDEL", "st"][..], "`st`"),
        (&["HSET", "expires", "soon"][..], "`expires`"),
        // Numbers to Lua, past now, but not the record's form: refused by the client.
        (&["HSET", "expires", "1e20"][..], "`expires`"),
        (&["HSET", "expires", "99999999999999999"][..], "`expires`"),
        (&["HSET", "expires", " 9999999999999"][..], "`expires`"),
        (&["HSET", "err", "2"][..], "`err`"),
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("done-{i}");
        let token = conformance::acquire(&store, req(&key)).await;
        store
            .complete(
                &key,
                token,
                conformance::completion("1", Duration::from_secs(600)),
            )
            .await
            .unwrap();
        let hash = format!("{prefix}r:{key}");
        let _: () = redis::cmd(edit[0])
            .arg(&hash)
            .arg(&edit[1..])
            .query_async(&mut raw)
            .await
            .unwrap();
        let before: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(&hash)
            .query_async(&mut raw)
            .await
            .unwrap();
        match store.claim(req(&key)).await {
            Err(StoreError::Corrupt(msg)) => {
                assert!(msg.contains(&key) && msg.contains(field), "{field}: {msg}")
            }
            other => panic!("{edit:?}: {other:?}"),
        }
        let after: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(&hash)
            .query_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(
            before, after,
            "{edit:?}: the claim changed the malformed record"
        );
    }
    cleanup(&mut raw, &prefix).await;
}

#[tokio::test]
async fn a_value_of_the_wrong_type_or_a_bad_history_entry_is_corrupt() {
    let Some((store, prefix, mut raw)) = fresh_store("tc-redis-wrongtype").await else {
        return;
    };
    let _: () = redis::cmd("SET")
        .arg(format!("{prefix}r:plain-string"))
        .arg("x")
        .query_async(&mut raw)
        .await
        .unwrap();
    let claimed = store.claim(req("plain-string")).await;
    assert!(corrupt(&claimed), "{claimed:?}");
    let _: () = redis::cmd("RPUSH")
        .arg(format!("{prefix}h:bad-history"))
        .arg("claimed|nope")
        .query_async(&mut raw)
        .await
        .unwrap();
    let history = store.history("bad-history").await;
    assert!(corrupt(&history), "{history:?}");
    cleanup(&mut raw, &prefix).await;
}

#[tokio::test]
async fn records_and_history_carry_a_redis_ttl() {
    let Some((store, prefix, mut raw)) = fresh_store("tc-redis-ttl").await else {
        return;
    };
    let token = conformance::acquire(&store, req("ttl")).await;
    let done = conformance::completion("1", Duration::from_secs(120));
    store.complete("ttl", token, done).await.unwrap();
    for kind in ["r", "h"] {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(format!("{prefix}{kind}:ttl"))
            .query_async(&mut raw)
            .await
            .unwrap();
        assert!((100_000..=120_000).contains(&pttl), "{kind}: {pttl}");
    }
    // A completed key leaves the pending index; the token counter is the only other key.
    let pending: i64 = redis::cmd("ZCARD")
        .arg(format!("{prefix}pending"))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(pending, 0);
    cleanup(&mut raw, &prefix).await;
}

/// A `redis-server` of this test's own on a free loopback port, with the given
/// persistence settings; stopped when dropped.
struct PrivateRedis {
    child: std::process::Child,
    dir: std::path::PathBuf,
    port: u16,
}

impl PrivateRedis {
    /// `None` (after a visible notice; a failure under `CI`) when `redis-server` is absent.
    async fn start(settings: &[&str]) -> Option<PrivateRedis> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap();
        let dir = std::env::temp_dir().join(format!("tc-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut command = std::process::Command::new("redis-server");
        command
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .arg("--dir")
            .arg(&dir)
            .args(settings)
            .stdout(std::process::Stdio::null());
        let child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                assert!(std::env::var_os("CI").is_none(), "redis-server: {e}");
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "\nSKIPPED the Redis persistence test: redis-server ({e})"
                );
                return None;
            }
        };
        let server = PrivateRedis { child, dir, port };
        let client = redis::Client::open(server.url()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut c) = client.get_multiplexed_async_connection().await {
                let pong: Result<String, _> = redis::cmd("PING").query_async(&mut c).await;
                if pong.is_ok() {
                    return Some(server);
                }
            }
            assert!(
                Instant::now() < deadline,
                "the private redis-server did not start"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test]
async fn a_server_that_keeps_nothing_on_disk_is_refused_unless_opted_in() {
    let Some(server) = PrivateRedis::start(&["--appendonly", "no"]).await else {
        return;
    };
    match RedisStore::connect(&server.url()).await {
        Err(StoreError::Unavailable(e)) => {
            let message = e.to_string();
            assert!(message.contains("appendonly no"), "{message}");
            assert!(
                message.contains("allow_without_persistence"),
                "the remedy: {message}"
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // The explicit opt-ins: the builder's, and the URL's (for `store::open` and the CLI).
    RedisStore::builder(&server.url())
        .allow_without_persistence()
        .connect()
        .await
        .expect("opted in by the builder");
    let url = format!("{}/?allow_without_persistence=true", server.url());
    tool_contracts_runtime::store::open(&url)
        .await
        .expect("opted in by the URL");
}

#[tokio::test]
async fn a_server_with_an_append_only_file_is_accepted_whatever_its_fsync() {
    for fsync in ["always", "everysec"] {
        let Some(server) =
            PrivateRedis::start(&["--appendonly", "yes", "--appendfsync", fsync]).await
        else {
            return;
        };
        let store = RedisStore::connect(&server.url())
            .await
            .unwrap_or_else(|e| panic!("appendfsync {fsync}: {e}"));
        // And it works: one claim.
        assert!(matches!(
            store.claim(req("persisted")).await.unwrap(),
            ClaimOutcome::Acquired { .. }
        ));
    }
}

/// `?near_cache=N` on a Redis URL keeps completed results in the process: a key an
/// operator deletes on the server (`DEL`, as from another process) is still replayed here
/// until `near_cache_max_age`, then the server's answer is back (docs/stores.md).
#[tokio::test]
async fn a_near_cache_from_the_url_serves_a_deleted_key_until_its_max_age() {
    let Some(url) = support::url(&support::REDIS, "the Redis near cache test") else {
        return;
    };
    let joiner = if url.contains('?') { '&' } else { '?' };
    let near_url = format!("{url}{joiner}near_cache=100&near_cache_max_age=600ms");
    let store = tool_contracts_runtime::store::open(&near_url)
        .await
        .unwrap();
    assert_eq!(store.backend(), "redis");
    let mut raw = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let key = conformance::unique("near-url");
    let token = conformance::acquire(&*store, req(&key)).await;
    let kept = conformance::completion("\"kept\"", Duration::from_secs(60));
    store.complete(&key, token, kept).await.unwrap();
    let read = std::time::Instant::now();
    assert!(matches!(
        store.claim(req(&key)).await.unwrap(),
        ClaimOutcome::Completed(_)
    ));
    // The operator's removal, on the server (the store's default prefix is `tc:`).
    let _: () = redis::cmd("DEL")
        .arg(format!("tc:r:{key}"))
        .arg(format!("tc:h:{key}"))
        .query_async(&mut raw)
        .await
        .unwrap();
    let answer = store.claim(req(&key)).await.unwrap();
    if read.elapsed() < Duration::from_millis(500) {
        assert!(
            matches!(answer, ClaimOutcome::Completed(_)),
            "within max_age the copy here answers: {answer:?}"
        );
    }
    tokio::time::sleep(Duration::from_millis(700).saturating_sub(read.elapsed())).await;
    match store.claim(req(&key)).await.unwrap() {
        ClaimOutcome::Acquired { token } => store.release(&key, token).await.unwrap(),
        other => panic!("past max_age the server answers, yet: {other:?}"),
    }
    // Leave the shared server as found: the released key's history and index entries.
    let _: () = redis::cmd("DEL")
        .arg(format!("tc:r:{key}"))
        .arg(format!("tc:h:{key}"))
        .query_async(&mut raw)
        .await
        .unwrap();
    for index in ["tc:expiry", "tc:pending"] {
        let _: () = redis::cmd("ZREM")
            .arg(index)
            .arg(&key)
            .query_async(&mut raw)
            .await
            .unwrap();
    }
}
