//! Concurrent load for the throughput benches (`common::load`), and
//! `bench/agent-effects` (a workspace of its own, without criterion) takes in this file
//! alone by `#[path]`, so both comparisons drive their stores with the same loop.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs `concurrency` tasks on the current multi-thread runtime, each calling `f(i)` with
/// a fresh `i` from one counter (starting at `start`) until `window` has passed.
/// Returns (calls, elapsed).
pub async fn concurrent<F, Fut>(
    concurrency: usize,
    window: Duration,
    start: u64,
    f: F,
) -> (u64, Duration)
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let f = Arc::new(f);
    let next = Arc::new(AtomicU64::new(start));
    let began = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let f = Arc::clone(&f);
            let next = Arc::clone(&next);
            tokio::spawn(async move {
                let mut n = 0u64;
                while began.elapsed() < window {
                    f(next.fetch_add(1, Ordering::Relaxed)).await;
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("bench task");
    }
    (total, began.elapsed())
}
