//! Shared by the bench binaries: the machine line printed before results, the run mode
//! (full, `--quick`, or criterion's test mode under `cargo test`), and small timing helpers.

use std::time::{Duration, Instant};

pub mod load;
pub mod paired;

/// How long and how hard a custom (non-criterion) measurement may run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `cargo bench`: full measurement.
    Full,
    /// `cargo bench -- --quick` or `TOOL_CONTRACTS_BENCH_QUICK=1`: short windows.
    Quick,
    /// Built and run as a test (`cargo test --benches`, no `--bench` flag): one pass each.
    Test,
}

impl Mode {
    /// Reads the mode from the command line and the environment.
    pub fn detect() -> Mode {
        let args: Vec<String> = std::env::args().collect();
        if !args.iter().any(|a| a == "--bench") {
            return Mode::Test;
        }
        let quick_env = std::env::var("TOOL_CONTRACTS_BENCH_QUICK").is_ok_and(|v| v == "1");
        if quick_env || args.iter().any(|a| a == "--quick") {
            Mode::Quick
        } else {
            Mode::Full
        }
    }

    /// The measuring window of one throughput cell.
    pub fn window(self) -> Duration {
        match self {
            Mode::Full => Duration::from_secs(5),
            Mode::Quick => Duration::from_millis(1500),
            Mode::Test => Duration::from_millis(50),
        }
    }
}

/// A criterion bench binary's `main`: runs `bench` under [`criterion()`]'s configuration,
/// then prints criterion's summary (what `criterion_group!` and `criterion_main!` expand
/// to).
pub fn criterion_main(bench: fn(&mut criterion::Criterion)) {
    let mut c = criterion();
    bench(&mut c);
    c.final_summary();
}

/// Applies `TOOL_CONTRACTS_BENCH_QUICK=1` to criterion too, so one variable makes every
/// bench short.
pub fn criterion() -> criterion::Criterion {
    let c = criterion::Criterion::default().configure_from_args();
    if std::env::var("TOOL_CONTRACTS_BENCH_QUICK").is_ok_and(|v| v == "1") {
        c.warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_secs(1))
            .sample_size(20)
    } else {
        c
    }
}

fn first_line_with(path: &str, prefix: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_owned())
}

/// One line naming the machine, its load and the time, printed before the figures.
pub fn machine_line() -> String {
    let cpu =
        first_line_with("/proc/cpuinfo", "model name").unwrap_or_else(|| "unknown cpu".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!(
        "machine: {cpu}, {cores} cores, load {} (1/5/15 min), unix time {secs}",
        load.join(" ")
    )
}

/// Prints the machine line once, loudly.
pub fn print_machine(bench: &str) {
    println!("== {bench} == {}", machine_line());
}

/// Resident set size of this process, in bytes (Linux `/proc/self/statm`).
pub fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// Nanoseconds per operation of `ops` operations in `elapsed`.
pub fn ns_per_op(elapsed: Duration, ops: u64) -> f64 {
    elapsed.as_nanos() as f64 / ops.max(1) as f64
}

/// Operations per second.
pub fn per_sec(ops: u64, elapsed: Duration) -> f64 {
    ops as f64 / elapsed.as_secs_f64().max(1e-9)
}

/// Runs `f` until `window` has passed; returns (iterations, elapsed).
pub fn time_for(window: Duration, mut f: impl FnMut()) -> (u64, Duration) {
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < window {
        for _ in 0..64 {
            f();
        }
        n += 64;
    }
    (n, start.elapsed())
}

/// A two-worker multi-thread runtime (the machine has two cores).
pub fn multi_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// The concurrencies to measure: the comma list in `TOOL_CONTRACTS_BENCH_CONCURRENCY`, or
/// `default`.
pub fn concurrencies(default: &[usize]) -> Vec<usize> {
    std::env::var("TOOL_CONTRACTS_BENCH_CONCURRENCY")
        .ok()
        .map(|v| {
            v.split(',')
                .filter_map(|c| c.trim().parse().ok())
                .collect::<Vec<usize>>()
        })
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_vec())
}

/// A set, non-empty environment variable (a store's URL).
pub fn env_url(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}
