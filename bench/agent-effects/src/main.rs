//! Issue item 6: the same workload on agent-effects 0.2.0 and on tool-contracts.
//!
//! The workload is `benches/common/tool.rs`: `create_order(user_id, cart, note)`, keyed
//! by `user_id` and `cart.id`, returning a small `Order`. On agent-effects it is
//! `runtime.effect("create_order", "{user_id}:{cart.id}").kind(IrreversibleWrite)
//! .input(&args).run(action)`: the closest equivalent (a stable key from the intent, the
//! full input fingerprinted so a reused key with other input is refused, the result
//! stored and replayed). Its logical key is a caller-formatted string, so it does no
//! canonical JSON or hashing for the key itself; ours derives the RFC 8785 + SHA-256 key.
//!
//! Rows (calls per second, concurrency 1 and 16, first calls on fresh keys, then replays
//! of the keys just made): memory stores, PostgreSQL stores (local server, both with their
//! own default pools), agent-effects' SQLite store (ours: `cargo bench -p tool-contracts-benches
//! --bench sqlite_store`, which cannot link in this binary: see Cargo.toml).
//!
//! Run: `bench/agent-effects.sh [--quick]`. PostgreSQL rows need
//! TOOL_CONTRACTS_POSTGRES_URL and print a loud SKIP line otherwise.

#[path = "../../../benches/common/load.rs"]
mod load;
#[allow(dead_code)]
#[path = "../../../benches/common/tool.rs"]
mod tool;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agent_effects::EffectStore;
use agent_effects::{EffectKind, EffectOutcome, Runtime};
use serde::Serialize;
use tool_contracts::{with_store, Store};

#[derive(Serialize)]
struct Args<'a> {
    user_id: u64,
    cart: &'a tool::Cart,
    note: &'a str,
}

/// Calls per second of [`load::concurrent`], the load loop `benches/` use.
async fn concurrent<F, Fut>(concurrency: usize, window: Duration, start: u64, f: F) -> f64
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (calls, elapsed) = load::concurrent(concurrency, window, start, f).await;
    calls as f64 / elapsed.as_secs_f64()
}

async fn ae_call<S: EffectStore + 'static>(rt: Runtime<S>, user_id: u64) {
    let cart = tool::cart("c-42");
    let note = "gift".to_owned();
    let args = Args {
        user_id,
        cart: &cart,
        note: &note,
    };
    let key = format!("{user_id}:{}", cart.id);
    let out = rt
        .effect("create_order", key)
        .kind(EffectKind::IrreversibleWrite)
        .input(&args)
        .run(move |_ctx| {
            let cart = cart.clone();
            async move {
                Ok(tool::Order {
                    order_id: user_id * 10 + 1,
                    cart_id: cart.id,
                    total_cents: 4999,
                })
            }
        })
        .await
        .expect("agent-effects infrastructure");
    match out {
        EffectOutcome::Committed(order) => {
            std::hint::black_box(order);
        }
        other => panic!("agent-effects: expected Committed, got {other:?}"),
    }
}

/// (first calls/s, replays/s) for agent-effects on `store`.
async fn ae<S: EffectStore + 'static>(
    store: S,
    c: usize,
    window: Duration,
    base: u64,
) -> (f64, f64) {
    let rt = Runtime::new(store);
    let r = rt.clone();
    let made = Arc::new(AtomicU64::new(0));
    let m = Arc::clone(&made);
    let first = concurrent(c, window, base, move |u| {
        m.fetch_add(1, Ordering::Relaxed);
        ae_call(r.clone(), u)
    })
    .await;
    let made = made.load(Ordering::Relaxed).max(1);
    let r = rt.clone();
    let replay = concurrent(c, window, 0, move |i| ae_call(r.clone(), base + i % made)).await;
    (first, replay)
}

/// (first calls/s, replays/s) for tool-contracts on `store`.
async fn ours<S: Store + Clone>(store: S, c: usize, window: Duration, base: u64) -> (f64, f64) {
    let made = Arc::new(AtomicU64::new(0));
    let (s, m) = (store.clone(), Arc::clone(&made));
    let first = concurrent(c, window, base, move |u| {
        m.fetch_add(1, Ordering::Relaxed);
        with_store(s.clone(), tool::call(u))
    })
    .await;
    let made = made.load(Ordering::Relaxed).max(1);
    let s = store.clone();
    let replay = concurrent(c, window, 0, move |i| {
        with_store(s.clone(), tool::call(base + i % made))
    })
    .await;
    (first, replay)
}

fn row(what: &str, c: usize, ours: (f64, f64), theirs: (f64, f64)) {
    println!(
        "{what:<11} conc {c:>2} | first: ours {:>9.0}/s  agent-effects {:>9.0}/s  x{:>6.2} | replay: ours {:>9.0}/s  agent-effects {:>9.0}/s  x{:>6.2}",
        ours.0, theirs.0, ours.0 / theirs.0, ours.1, theirs.1, ours.1 / theirs.1
    );
}

async fn pg_reset(url: &str) {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("postgres");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
        .batch_execute("DROP SCHEMA IF EXISTS tcbench_ae CASCADE; CREATE SCHEMA tcbench_ae; DROP SCHEMA IF EXISTS tcbench_ours CASCADE; CREATE SCHEMA tcbench_ours;")
        .await
        .expect("reset schemas");
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick")
        || std::env::var("TOOL_CONTRACTS_BENCH_QUICK").is_ok_and(|v| v == "1");
    let window = if quick {
        Duration::from_millis(1500)
    } else {
        Duration::from_secs(5)
    };
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "== agent-effects 0.2.0 vs tool-contracts == load {}",
        load.trim()
    );

    for c in [1usize, 16] {
        let base = c as u64 * 1_000_000_000;
        let o = ours(
            Arc::new(tool_contracts::MemoryStore::new()),
            c,
            window,
            base,
        )
        .await;
        let t = ae(agent_effects_memory::MemoryStore::new(), c, window, base).await;
        row("memory", c, o, t);
    }

    let dir = std::env::temp_dir().join(format!("tc-bench-ae-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    for c in [1usize, 16] {
        let base = c as u64 * 1_000_000_000;
        let store = agent_effects_sqlite::SqliteStore::open(dir.join(format!("ae-{c}.db")))
            .await
            .expect("agent-effects sqlite");
        let (f, r) = ae(store, c, window, base).await;
        println!(
            "sqlite      conc {c:>2} | first: agent-effects {f:>9.0}/s | replay: agent-effects {r:>9.0}/s   (ours: sqlite_store bench, same workload)"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);

    match std::env::var("TOOL_CONTRACTS_POSTGRES_URL") {
        Ok(url) => {
            for c in [1usize, 16] {
                pg_reset(&url).await;
                let base = c as u64 * 1_000_000_000;
                let ours_store = tool_contracts::store::PostgresStore::builder(&url)
                    .schema("tcbench_ours")
                    .connect()
                    .await
                    .expect("PostgresStore");
                let o = ours(Arc::new(ours_store), c, window, base).await;
                let theirs = agent_effects_postgres::PostgresOptions::new()
                    .schema("tcbench_ae")
                    .connect(&url)
                    .await
                    .expect("agent-effects postgres");
                let t = ae(theirs, c, window, base).await;
                row("postgres", c, o, t);
            }
            pg_reset(&url).await;
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .expect("postgres");
            tokio::spawn(async move {
                let _ = conn.await;
            });
            let _ = client
                .batch_execute("DROP SCHEMA IF EXISTS tcbench_ae CASCADE; DROP SCHEMA IF EXISTS tcbench_ours CASCADE;")
                .await;
        }
        Err(_) => println!(
            "!!!!!!!! SKIPPED PostgreSQL rows: TOOL_CONTRACTS_POSTGRES_URL is not set (e.g. postgres://postgres@127.0.0.1:5432/test) !!!!!!!!"
        ),
    }
}
