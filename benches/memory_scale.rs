//! Issue item 5: memory per stored record in `MemoryStore` at 1,000,000 records, and how
//! first-call and replay cost change from 1,000 to 1,000,000 records (they must stay flat).
//!
//! A custom harness (no criterion): each size needs a store filled by real tool calls, and
//! criterion's sample loop would keep adding records to the "1,000" store. For each size N:
//! fill a fresh store with N first calls (keys `user_id = 0..N`), then
//! - first calls: `ROUNDS` rounds of `BATCH` new keys (the store grows by at most
//!   `ROUNDS * BATCH`, i.e. 1,000 -> 6,000 for the smallest size, see the printed sizes);
//! - replays: `ROUNDS` rounds of `REPLAYS` calls on keys spread over the whole store
//!   (a stride through 0..N, so the 1,000,000 case misses the CPU caches like real traffic);
//!
//! and reports the median round in ns per call.
//!
//! Memory: resident set size (`/proc/self/statm`) before and after filling 1,000,000
//! records, divided by the count. RSS includes allocator slack: it is what a process pays.
//!
//! Run: `cargo bench -p tool-contracts-benches --bench memory_scale` (`-- --quick` stops at
//! 1,000,000 all the same, with fewer rounds; under `cargo test` only 1,000 records).

#[allow(dead_code)]
#[path = "common/mod.rs"]
mod common;
#[allow(dead_code)]
#[path = "common/tool.rs"]
mod tool;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Mode;
use tool::call;
use tool_contracts::{with_store, MemoryStore};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

struct Row {
    records: u64,
    first_ns: f64,
    replay_ns: f64,
    fill: Duration,
}

fn measure(
    rt: &tokio::runtime::Runtime,
    n: u64,
    rounds: usize,
    batch: u64,
    replays: u64,
) -> (Row, f64) {
    let store = Arc::new(MemoryStore::new());
    let rss_before = common::rss_bytes();
    let fill_start = Instant::now();
    rt.block_on(with_store(Arc::clone(&store), async {
        for u in 0..n {
            call(u).await;
        }
    }));
    let fill = fill_start.elapsed();
    let rss_after = common::rss_bytes();
    let bytes_per_record = rss_after.saturating_sub(rss_before) as f64 / n as f64;

    let mut firsts = Vec::new();
    let mut replay_rounds = Vec::new();
    let mut next = n;
    // An odd stride visits keys all over 0..n without a pattern the prefetcher follows.
    let stride = 7_919 % n.max(1);
    let mut cursor = 0u64;
    rt.block_on(with_store(Arc::clone(&store), async {
        for _ in 0..rounds {
            let start = Instant::now();
            for _ in 0..batch {
                call(next).await;
                next += 1;
            }
            firsts.push(common::ns_per_op(start.elapsed(), batch));

            let start = Instant::now();
            for _ in 0..replays {
                call(cursor).await;
                cursor = (cursor + stride.max(1)) % n;
            }
            replay_rounds.push(common::ns_per_op(start.elapsed(), replays));
        }
    }));
    assert_eq!(store.len() as u64, next, "every first call made one record");
    let row = Row {
        records: n,
        first_ns: median(firsts),
        replay_ns: median(replay_rounds),
        fill,
    };
    // Dropping a million records takes a while: do it outside every timed region.
    drop(store);
    (row, bytes_per_record)
}

fn main() {
    let mode = Mode::detect();
    common::print_machine("memory_scale");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (sizes, rounds, batch, replays): (&[u64], usize, u64, u64) = match mode {
        Mode::Full => (&[1_000, 10_000, 100_000, 1_000_000], 9, 1_000, 20_000),
        Mode::Quick => (&[1_000, 100_000, 1_000_000], 5, 1_000, 10_000),
        Mode::Test => (&[1_000], 1, 100, 100),
    };
    let mut rows = Vec::new();
    let mut per_record = None;
    for &n in sizes {
        let (row, bytes) = measure(&rt, n, rounds, batch, replays);
        if n == 1_000_000 {
            per_record = Some(bytes);
        }
        println!(
            "records {:>9}: first call {:>7.0} ns, replay {:>7.0} ns  (filled in {:.2} s; store ends at {})",
            row.records,
            row.first_ns,
            row.replay_ns,
            row.fill.as_secs_f64(),
            row.records + rounds as u64 * batch
        );
        rows.push(row);
    }
    if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
        println!(
            "ratio {} -> {} records: first call x{:.2}, replay x{:.2}",
            first.records,
            last.records,
            last.first_ns / first.first_ns,
            last.replay_ns / first.replay_ns
        );
    }
    match per_record {
        Some(b) => {
            println!("memory per stored record at 1,000,000 records: {b:.0} bytes (RSS delta)")
        }
        None => println!("memory per record: not measured in this mode (needs 1,000,000 records)"),
    }
}
