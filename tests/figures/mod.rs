//! Figures: what a test measured, written where `tests/figures.py render` reads it.
//!
//! docs/guarantees.md's Figures section is rendered from these records, never typed by
//! hand. A record is one JSON line in `target/figures/<run>.jsonl` (one file per test
//! process), stamped with the hash of the sources the test ran on. The record format and
//! the stamp are defined in one place, `tests/figures.py` (`record` and `stamp`): this
//! module only hands it what the test measured, so Rust, `fuzz/run.sh` and the renderer
//! cannot disagree on either.
//!
//! Recording never fails a test: a test's verdict is its assertions. When a record cannot
//! be written (no `python3`, no git checkout) the test says so on stderr, and
//! `tests/figures.py render` then refuses for want of a record with the current stamp,
//! which is where a missing figure is caught.

#![allow(dead_code)] // each test file uses part of it

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The record file of this process: `<unix ms>-<test binary>-<pid>`.
fn run_id() -> &'static str {
    static RUN: OnceLock<String> = OnceLock::new();
    RUN.get_or_init(|| {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let exe = std::env::current_exe()
            .ok()
            .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "test".to_owned());
        format!("{ms}-{exe}-{}", std::process::id())
    })
}

/// Records one figure of `test` (the test file's stem), named `figure` (a backend, a
/// case): `line` is the human summary the renderer quotes, `values` the numbers it adds up.
pub fn record(test: &str, figure: &str, line: &str, values: serde_json::Value) {
    let record = serde_json::json!({
        "test": test,
        "figure": figure,
        "line": line,
        "values": values,
    });
    // This package's manifest is tests/Cargo.toml: the script sits beside it, and runs
    // from the workspace root as it always did.
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/figures.py");
    let outcome = Command::new("python3")
        .args([script, "record", "--run", run_id()])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            if let Some(mut stdin) = child.stdin.take() {
                stdin.write_all(record.to_string().as_bytes())?;
            }
            child.wait_with_output()
        });
    match outcome {
        Ok(out) if out.status.success() => {}
        Ok(out) => eprintln!(
            "figures: could not record {test}/{figure}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(e) => eprintln!("figures: could not record {test}/{figure}: python3: {e}"),
    }
}

/// Records that the calling test passed its checks, named by its test thread (libtest
/// names each test's thread after the test): one line at the end of a test.
pub fn passed(test: &str) {
    let thread = std::thread::current();
    let name = thread.name().unwrap_or("unnamed");
    record(
        test,
        name,
        &format!("{name}: passed"),
        serde_json::json!({ "passed": 1 }),
    );
}
