//! The replay path alone, for `valgrind --tool=callgrind` (instruction counts do not move
//! with the machine's load, unlike times): N replays of one completed key from
//! `MemoryStore`, and as many bare calls, in one process.
//!
//! `cargo build --release -p tool-contracts-benches --example replay_profile` then
//! `valgrind --tool=callgrind target/release/examples/replay_profile replay 10000`
//! (or `bare`, `registry`, `registry-text` (`Registry::call_json`), `registry-text-alternating` (two other texts of the same call in turn, so every call decodes, as `dedup_path`'s alternating row), `decode-then-replay` (the same text decoded by `serde_json` alone, then the direct call), `first`, `key` (the 3-field key of `key_derivation` alone, as the macro derives it; `key-by-path` through `KeyBuilder::field`; `key-4k` and `key-4k-by-path` the 4 KiB key),
//! `sizes` (the size of a call's future, which each `.await` moves); `redis` replays from
//! a `RedisStore` at `TOOL_CONTRACTS_REDIS_URL`, key prefix `tcprofile:`; `sqlite-first` first
//! calls on a `SqliteStore` in a scratch directory, for `strace -c -f`). `redis-conc C` replays 1,000
//! completed keys from `RedisStore` with C concurrent tasks on a 2-worker runtime for five
//! seconds and prints the rate (for `perf`, which sees the kernel's side too).

#[allow(dead_code)]
#[path = "../common/tool.rs"]
mod tool;

#[path = "../common/load.rs"]
mod load;

#[path = "../common/big_cart.rs"]
mod big_cart;

use std::hint::black_box;
use std::sync::Arc;

use serde_json::json;
use tool::{
    body, cart, create_order, BenchError, Cart, Order, PlainArgs, ARGS_TEXT, ARGS_TEXTS_SPACED,
};
use tool_contracts::key::{KeyBuilder, TOOL_KEY_CONTRACT};
use tool_contracts::store::{RedisStore, Store};
use tool_contracts::{registry, with_store, MemoryStore};

async fn bare_create_order(user_id: u64, cart: Cart, note: String) -> Result<Order, BenchError> {
    let _ = black_box(note);
    Ok(body(user_id, cart))
}

/// `redis-conc`: `concurrency` tasks replaying 1,000 completed keys for five seconds.
fn redis_concurrent(concurrency: u64) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let url = std::env::var("TOOL_CONTRACTS_REDIS_URL").expect("TOOL_CONTRACTS_REDIS_URL");
    let store = rt
        .block_on(
            RedisStore::builder(&url)
                .prefix("tcprofile:")
                .allow_without_persistence()
                .connect(),
        )
        .expect("RedisStore");
    let store: Arc<dyn Store> = Arc::new(store);
    rt.block_on(with_store(Arc::clone(&store), async {
        for user in 0..1_000 {
            black_box(create_order(user, cart("c-42"), "gift".into()).await.ok());
        }
    }));
    let (calls, elapsed) = rt.block_on(load::concurrent(
        usize::try_from(concurrency).expect("concurrency"),
        std::time::Duration::from_secs(5),
        0,
        move |i| {
            let store = Arc::clone(&store);
            async move {
                let user = i % 1_000;
                let out = with_store(store, create_order(user, cart("c-42"), "gift".into()));
                black_box(out.await.ok());
            }
        },
    ));
    println!(
        "{calls} replays with {concurrency} tasks in {:.2} s: {:.0}/s",
        elapsed.as_secs_f64(),
        calls as f64 / elapsed.as_secs_f64()
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let what = args.next().unwrap_or_else(|| "replay".to_owned());
    let n: u64 = args.next().and_then(|n| n.parse().ok()).unwrap_or(10_000);
    if what == "sizes" {
        let fut = create_order(7, cart("c-42"), "gift".into());
        println!(
            "create_order future: {} bytes",
            core::mem::size_of_val(&fut)
        );
        return;
    }
    if what == "redis-conc" {
        return redis_concurrent(n);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // The `sqlite-first` mode's scratch directory, removed when the calls are done.
    let mut scratch = None;
    let store: Arc<dyn Store> = if what == "redis" {
        let url = std::env::var("TOOL_CONTRACTS_REDIS_URL").expect("TOOL_CONTRACTS_REDIS_URL");
        let redis = rt.block_on(
            RedisStore::builder(&url)
                .prefix("tcprofile:")
                .allow_without_persistence()
                .connect(),
        );
        Arc::new(redis.expect("RedisStore"))
    } else if what == "sqlite-first" {
        // First calls on a `SqliteStore` in a scratch directory (for `strace -c -f`: the
        // writes and fsyncs of a first call).
        let dir = std::env::temp_dir().join(format!("tc-profile-sqlite-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        let sqlite = rt.block_on(tool_contracts::store::SqliteStore::open(dir.join("p.db")));
        scratch = Some(dir);
        Arc::new(sqlite.expect("SqliteStore"))
    } else {
        Arc::new(MemoryStore::new())
    };
    // The 4 KiB key field of `benches/key_derivation.rs` (`key-4k`, `key-4k-by-path`).
    let big = big_cart::big_cart();
    rt.block_on(with_store(store, async move {
        create_order(7, cart("c-42"), "gift".into())
            .await
            .expect("first call");
        for i in 0..n {
            match what.as_str() {
                "bare" => {
                    black_box(bare_create_order(black_box(7), cart("c-42"), "gift".into()).await.ok());
                }
                "registry" => {
                    let args = json!({"user_id": 7, "cart": {"id": "c-42", "items": ["book"]}, "note": "gift"});
                    black_box(registry().call("create_order", args).await.ok());
                }
                "decode-then-replay" => {
                    // `benches/dedup_path.rs`'s floor of the text variant: `serde_json` alone
                    // decodes the same text, then the direct call replays.
                    let args = String::from(ARGS_TEXT);
                    if let Ok(a) = serde_json::from_str::<PlainArgs>(black_box(&args)) {
                        black_box(create_order(a.user_id, a.cart, a.note).await.ok());
                    }
                }
                "registry-text" => {
                    let args = String::from(ARGS_TEXT);
                    black_box(registry().call_json("create_order", black_box(&args)).await.ok());
                }
                "registry-text-alternating" => {
                    let args = String::from(ARGS_TEXTS_SPACED[(i % 2) as usize]);
                    black_box(registry().call_json("create_order", black_box(&args)).await.ok());
                }
                "key" => {
                    // The 3-field intent of `benches/key_derivation.rs`.
                    // As the macro derives it (names and the end encoded at compile time).
                    let mut k = KeyBuilder::new(TOOL_KEY_CONTRACT);
                    k.field_member("\"amount_cents\":", "amount_cents", &black_box(4999_u64)).ok();
                    k.field_member("\"cart.id\":", "cart.id", black_box("c-42")).ok();
                    k.field_member("\"user_id\":", "user_id", &black_box(7_u64)).ok();
                    black_box(k.finish_tail(None, ",\"tool\":\"create_order\",\"version\":1}", "create_order", 1));
                }
                "key-by-path" => {
                    let mut k = KeyBuilder::new(TOOL_KEY_CONTRACT);
                    k.field("amount_cents", &black_box(4999_u64)).ok();
                    k.field("cart.id", black_box("c-42")).ok();
                    k.field("user_id", &black_box(7_u64)).ok();
                    black_box(k.finish(None, "create_order", 1));
                }
                "key-4k" => {
                    let mut k = KeyBuilder::new(TOOL_KEY_CONTRACT);
                    k.field_member("\"cart\":", "cart", black_box(&big)).ok();
                    k.field_member("\"user_id\":", "user_id", &black_box(7_u64)).ok();
                    black_box(k.finish_tail(None, ",\"tool\":\"create_order\",\"version\":1}", "create_order", 1));
                }
                "key-4k-by-path" => {
                    let mut k = KeyBuilder::new(TOOL_KEY_CONTRACT);
                    k.field("cart", black_box(&big)).ok();
                    k.field("user_id", &black_box(7_u64)).ok();
                    black_box(k.finish(None, "create_order", 1));
                }
                "first" | "sqlite-first" => {
                    black_box(create_order(black_box(1000 + i), cart("c-42"), "gift".into()).await.ok());
                }
                _ => {
                    black_box(create_order(black_box(7), cart("c-42"), "gift".into()).await.ok());
                }
            }
        }
    }));
    // The store (and its writer thread's connection) was dropped with the future above.
    if let Some(dir) = scratch {
        let _ = std::fs::remove_dir_all(dir);
    }
}
