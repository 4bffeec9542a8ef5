//! Repeated replays on the shared stores with and without the near cache
//! (`store::NearCache`, docs/stores.md), against a replay from `MemoryStore`: one key,
//! completed before measuring, replayed over and over by one caller (concurrency 1). The
//! issue's target: a repeated replay on `RedisStore` or `PostgresStore` within 3x a
//! `MemoryStore` replay, with the near cache on.
//!
//! Same tool and arguments as `dedup_path` (`benches/common/tool.rs`); each replay builds
//! its arguments, derives the key and goes through the engine (and, for the shared
//! stores, the near cache or a round trip to the local server).
//!
//! Needs `TOOL_CONTRACTS_REDIS_URL` and/or `TOOL_CONTRACTS_POSTGRES_URL`; without one, its
//! rows print a loud SKIP line and the `MemoryStore` row still runs. Keys live under
//! `tcbench-near:` (Redis) and tables under `tcbench_near_` (PostgreSQL); both are removed
//! at the start and the end.
//! Run: `cargo bench -p tool-contracts-benches --bench near_cache` (add `-- --quick`).

#[allow(dead_code)]
#[path = "common/mod.rs"]
mod common;
#[allow(dead_code)]
#[path = "common/tool.rs"]
mod tool;

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use criterion::{BenchmarkGroup, Criterion};
use tool::{cart, create_order};
use tool_contracts::store::{NearCache, PostgresStore, RedisStore};
use tool_contracts::{with_store, MemoryStore, Store};

const REDIS_PREFIX: &str = "tcbench-near:";
const PG_PREFIX: &str = "tcbench_near_";

/// Completes the key once, then measures replays of it on `store`.
fn replays<M: criterion::measurement::Measurement<Value = std::time::Duration>>(
    g: &mut BenchmarkGroup<'_, M>,
    rt: &tokio::runtime::Runtime,
    name: &str,
    store: Arc<dyn Store>,
) {
    rt.block_on(with_store(Arc::clone(&store), async {
        create_order(7, cart("c-42"), "gift".into())
            .await
            .expect("first call");
    }));
    g.bench_function(name, |b| {
        b.iter_custom(|iters| {
            rt.block_on(with_store(Arc::clone(&store), async move {
                let start = Instant::now();
                for _ in 0..iters {
                    let out = create_order(black_box(7), cart("c-42"), "gift".into()).await;
                    black_box(out.expect("replay"));
                }
                start.elapsed()
            }))
        });
    });
}

async fn redis_clean(url: &str) {
    let Ok(client) = redis::Client::open(url) else {
        return;
    };
    let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
        return;
    };
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{REDIS_PREFIX}*"))
        .query_async(&mut conn)
        .await
        .unwrap_or_default();
    if !keys.is_empty() {
        let _: Result<u64, _> = redis::cmd("UNLINK").arg(&keys).query_async(&mut conn).await;
    }
}

async fn pg_drop_tables(url: &str) {
    let Ok((client, conn)) = tokio_postgres::connect(url, tokio_postgres::NoTls).await else {
        return;
    };
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let rows = client
        .query(
            "SELECT format('DROP TABLE IF EXISTS %I CASCADE', tablename) FROM pg_tables \
             WHERE tablename LIKE 'tcbench\\_near\\_%'",
            &[],
        )
        .await
        .unwrap_or_default();
    for row in rows {
        let sql: String = row.get(0);
        let _ = client.batch_execute(&sql).await;
    }
    let _ = client
        .batch_execute(
            "DO $$ DECLARE s text; BEGIN FOR s IN SELECT sequencename FROM pg_sequences \
             WHERE sequencename LIKE 'tcbench\\_near\\_%' LOOP EXECUTE format('DROP SEQUENCE IF EXISTS %I CASCADE', s); \
             END LOOP; END $$;",
        )
        .await;
}

fn bench(c: &mut Criterion) {
    common::print_machine("near_cache");
    let rt = common::multi_thread_runtime();
    let mut g = c.benchmark_group("repeated_replay");

    replays(&mut g, &rt, "memory", Arc::new(MemoryStore::new()));

    match common::env_url("TOOL_CONTRACTS_REDIS_URL") {
        Some(url) => {
            rt.block_on(redis_clean(&url));
            // The bench measures round trips; whether the server fsyncs is its own setting.
            let connect = || {
                let builder = RedisStore::builder(&url)
                    .prefix(REDIS_PREFIX)
                    .allow_without_persistence();
                rt.block_on(builder.connect()).expect("RedisStore")
            };
            replays(&mut g, &rt, "redis", Arc::new(connect()));
            replays(&mut g, &rt, "redis_near", Arc::new(NearCache::new(connect())));
            rt.block_on(redis_clean(&url));
        }
        None => println!(
            "!!!!!!!! SKIPPED RedisStore near cache benches: TOOL_CONTRACTS_REDIS_URL is not set (e.g. redis://127.0.0.1:6379) !!!!!!!!"
        ),
    }

    match common::env_url("TOOL_CONTRACTS_POSTGRES_URL") {
        Some(url) => {
            rt.block_on(pg_drop_tables(&url));
            let connect = || {
                rt.block_on(PostgresStore::builder(&url).table_prefix(PG_PREFIX).connect())
                    .expect("PostgresStore")
            };
            replays(&mut g, &rt, "postgres", Arc::new(connect()));
            replays(&mut g, &rt, "postgres_near", Arc::new(NearCache::new(connect())));
            rt.block_on(pg_drop_tables(&url));
        }
        None => println!(
            "!!!!!!!! SKIPPED PostgresStore near cache benches: TOOL_CONTRACTS_POSTGRES_URL is not set (e.g. postgres://postgres@127.0.0.1:5432/test) !!!!!!!!"
        ),
    }
    g.finish();
}

fn main() {
    common::criterion_main(bench);
}
