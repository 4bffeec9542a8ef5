//! Worker processes: the suites that need another OS process (`tests/clock.rs`,
//! `tests/crash_injection.rs`, `tests/fleet.rs`, `tests/run_kills.rs`) re-execute their
//! own test binary, running only an entry-point test that does nothing unless the
//! variables its parent sets say what to do. The worker reports to its parent in marked
//! JSON lines on stdout, which libtest's own output cannot be mistaken for.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::Command;

use serde::de::DeserializeOwned;
use serde::Serialize;

/// The arguments that make the test binary run `entry_point` alone, its output not
/// captured.
pub fn entry_point_args(entry_point: &str) -> [&str; 4] {
    ["--exact", entry_point, "--nocapture", "--test-threads=1"]
}

/// This test binary, run as a worker: only `entry_point` runs.
pub fn command(entry_point: &str) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(entry_point_args(entry_point));
    cmd
}

/// The runtime a worker (or a worker thread of the test) runs on.
pub fn runtime(worker_threads: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(worker_threads)
        .enable_all()
        .build()
        .unwrap()
}

/// Reports `value` to the parent: one JSON line after `mark`, on a line of its own
/// (libtest prints its own text on the same stream, possibly on the same line).
pub fn report<T: Serialize>(mark: &str, value: &T) {
    println!("\n{mark}{}", serde_json::to_string(value).unwrap());
}

/// Every value a worker reported under `mark` on its `stdout`, in order.
pub fn reports<T: DeserializeOwned>(mark: &str, stdout: &[u8]) -> Vec<T> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| l.strip_prefix(mark))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Spawns `cmd`, a worker (its stdout piped) that prints the line `boundary {boundary}` and
/// stalls there, and SIGKILLs it at that line; returns once it is gone. Fails the test when
/// the worker ends before that line.
pub fn kill_at_boundary(cmd: &mut Command, boundary: u32) {
    let mut child = cmd.spawn().unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "the task ended before boundary {boundary}"
        );
        // libtest may print its own text at the start of the child's first line.
        if line.trim_end().ends_with(&format!("boundary {boundary}")) {
            break;
        }
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
}
