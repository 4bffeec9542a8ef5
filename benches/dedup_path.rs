//! Issue item 2: the replay path (a duplicate answered from `MemoryStore`) and the
//! first-call path, against calling the bare function and against a `cached` crate
//! `#[cached]` memoization hit.
//!
//! Every variant builds the same arguments (a `Cart` with a `String` id and one item, a
//! `String` note) on each iteration, through `black_box` (`args`), so the argument
//! allocations are made in every variant and cancel out of the ratios; the registry
//! variants build them as the `serde_json::Value` a registry caller hands over
//! (`Registry::call`) or as the JSON text of a request body (`Registry::call_json`): the
//! same text every time (a retry's body, which a thread keeps derived after its second
//! time, `runtime/src/derived.rs`) or two texts of the same call in turn (every replay
//! decodes); one more decodes that text with `serde_json` alone before the direct call,
//! the floor of any registry that decodes JSON text.
//! Async variants run N calls inside one `block_on` (criterion's `iter_custom`), so the
//! executor's entry cost is not counted per call.
//!
//! Run: `cargo bench -p tool-contracts-benches --bench dedup_path` (add `-- --quick` for a
//! short run).

#[allow(dead_code)]
#[path = "common/mod.rs"]
mod common;

#[allow(dead_code)]
#[path = "common/tool.rs"]
mod tool;

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use cached::proc_macro::cached;
use criterion::Criterion;
use serde_json::json;
use tool::{
    body, cart, create_order, BenchError, Cart, Order, PlainArgs, ARGS_TEXT, ARGS_TEXTS_SPACED,
};
use tool_contracts::{registry, with_store, MemoryStore};

/// The same function, bare.
async fn bare_create_order(user_id: u64, cart: Cart, note: String) -> Result<Order, BenchError> {
    let _ = black_box(note);
    Ok(body(user_id, cart))
}

/// The same function, memoized by the `cached` crate (keyed by all arguments).
#[cached]
fn cached_create_order(user_id: u64, cart: Cart, note: String) -> Order {
    let _ = note;
    body(user_id, cart)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// The arguments every variant builds on each iteration, passed through `black_box`: the
/// optimizer can neither drop their allocations (a bare body that never reads
/// `cart.items` would otherwise lose the item's allocation in some builds and not in
/// others: the bare call measured 51 ns or 93 ns by how its loop was compiled) nor fold
/// them into the call.
fn args(user_id: u64) -> (u64, Cart, String) {
    black_box((user_id, cart("c-42"), "gift".to_owned()))
}

fn bench(c: &mut Criterion) {
    common::print_machine("dedup_path");
    let rt = runtime();

    // Replay: one key, completed once before measuring.
    let store = Arc::new(MemoryStore::new());
    rt.block_on(with_store(Arc::clone(&store), async {
        create_order(7, cart("c-42"), "gift".into())
            .await
            .expect("first call");
    }));

    // Each timed loop is written once and used by criterion and the paired harness alike.
    let replay = |n: u64| {
        rt.block_on(with_store(Arc::clone(&store), async move {
            let start = Instant::now();
            for _ in 0..n {
                let (user_id, cart, note) = args(7);
                let out = create_order(user_id, cart, note).await;
                black_box(out.expect("replay"));
            }
            start.elapsed()
        }))
    };
    let bare = |n: u64| {
        rt.block_on(async move {
            let start = Instant::now();
            for _ in 0..n {
                let (user_id, cart, note) = args(7);
                let out = bare_create_order(user_id, cart, note).await;
                black_box(out.expect("bare"));
            }
            start.elapsed()
        })
    };
    let registry_replay = |n: u64| {
        rt.block_on(with_store(Arc::clone(&store), async move {
            let start = Instant::now();
            for _ in 0..n {
                let args = black_box(
                    json!({"user_id": 7, "cart": {"id": "c-42", "items": ["book"]}, "note": "gift"}),
                );
                let out = registry().call("create_order", args).await;
                black_box(out.expect("replay"));
            }
            start.elapsed()
        }))
    };
    // The same call as JSON text (`Registry::call_json`: a request body, a message), built
    // on each iteration as one `String`, as a body arrives in one buffer.
    let registry_text_replay = |n: u64| {
        rt.block_on(with_store(Arc::clone(&store), async move {
            let start = Instant::now();
            for _ in 0..n {
                let args = black_box(String::from(ARGS_TEXT));
                let out = registry().call_json("create_order", &args).await;
                black_box(out.expect("replay"));
            }
            start.elapsed()
        }))
    };
    // The same call as two other texts (one leading space, one trailing space), sent in
    // turn, the turn kept across batches: a thread keeps arguments derived only on their
    // second derivation in a row (`runtime/src/derived.rs`), so here every replay decodes
    // the text and derives the key, as a retry whose text was encoded again with other
    // spacing does (and neither text is `ARGS_TEXT`, which the variant above keeps).
    let turn = std::cell::Cell::new(0_usize);
    let registry_text_alternating = |n: u64| {
        let turn = &turn;
        rt.block_on(with_store(Arc::clone(&store), async move {
            let start = Instant::now();
            for _ in 0..n {
                let text = ARGS_TEXTS_SPACED[turn.get() % 2];
                turn.set(turn.get() + 1);
                let args = black_box(String::from(text));
                let out = registry().call_json("create_order", &args).await;
                black_box(out.expect("replay"));
            }
            start.elapsed()
        }))
    };
    // The floor under the text variant: the same text decoded by `serde_json` alone, then
    // the direct call (its replay). What `call_json` costs above this is the registry's
    // own (the members check, the dispatch, the stored text handed back).
    let decode_then_replay = |n: u64| {
        rt.block_on(with_store(Arc::clone(&store), async move {
            let start = Instant::now();
            for _ in 0..n {
                let args = black_box(String::from(ARGS_TEXT));
                let a: PlainArgs = serde_json::from_str(&args).expect("arguments");
                let out = create_order(a.user_id, a.cart, a.note).await;
                black_box(out.expect("replay"));
            }
            start.elapsed()
        }))
    };

    let mut g = c.benchmark_group("call");
    g.bench_function("replay/ours_memory", |b| b.iter_custom(replay));
    g.bench_function("replay/ours_registry_json", |b| {
        b.iter_custom(registry_replay)
    });
    g.bench_function("replay/ours_registry_text", |b| {
        b.iter_custom(registry_text_replay)
    });
    g.bench_function("replay/ours_registry_text_alternating", |b| {
        b.iter_custom(registry_text_alternating)
    });
    g.bench_function("replay/serde_json_decode_then_direct", |b| {
        b.iter_custom(decode_then_replay)
    });
    g.bench_function("replay/cached_hit", |b| {
        let _ = cached_create_order(7, cart("c-42"), "gift".into());
        b.iter(|| {
            let (user_id, cart, note) = args(7);
            cached_create_order(user_id, cart, note)
        });
    });
    g.bench_function("bare_fn", |b| b.iter_custom(bare));

    // First calls: a fresh key each call, a fresh store each sample (dropped untimed).
    let next_user = AtomicU64::new(1_000_000);
    g.bench_function("first_call/ours_memory", |b| {
        b.iter_custom(|iters| {
            let store = Arc::new(MemoryStore::new());
            let base = next_user.fetch_add(iters, Ordering::Relaxed);
            let elapsed = rt.block_on(with_store(Arc::clone(&store), async move {
                let start = Instant::now();
                for i in 0..iters {
                    let (user_id, cart, note) = args(base + i);
                    let out = create_order(user_id, cart, note).await;
                    black_box(out.expect("first call"));
                }
                start.elapsed()
            }));
            drop(store);
            elapsed
        });
    });
    g.finish();

    // Replay / bare and registry / direct replay measured paired (`common/paired.rs`):
    // the two paths in alternating batches, so the machine's drift between criterion's
    // separate measurements does not enter the ratio.
    let mode = common::Mode::detect();
    let (rounds, batch) = common::paired::plan(mode, 1_000.0);
    let r = common::paired::paired(rounds, batch, replay, bare);
    println!("{}", r.line("call/replay/ours_memory / bare_fn"));
    let r = common::paired::paired(rounds, batch, registry_replay, replay);
    println!(
        "{}",
        r.line("call/replay/ours_registry_json / replay/ours_memory")
    );
    let r = common::paired::paired(rounds, batch, registry_text_replay, replay);
    println!(
        "{}",
        r.line("call/replay/ours_registry_text / replay/ours_memory")
    );
    let r = common::paired::paired(rounds, batch, registry_text_alternating, replay);
    println!(
        "{}",
        r.line("call/replay/ours_registry_text_alternating / replay/ours_memory")
    );
    // The text variant split in two: the decode floor over the direct replay, and ours
    // over that floor.
    let r = common::paired::paired(rounds, batch, decode_then_replay, replay);
    println!(
        "{}",
        r.line("call/replay/serde_json_decode_then_direct / replay/ours_memory")
    );
    let r = common::paired::paired(rounds, batch, registry_text_replay, decode_then_replay);
    println!(
        "{}",
        r.line("call/replay/ours_registry_text / replay/serde_json_decode_then_direct")
    );
}

fn main() {
    common::criterion_main(bench);
}
