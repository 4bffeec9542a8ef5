//! The real-client suites' shell scripts (`tests/http/*.sh`, `tests/mcp/run.sh`), run from
//! a Rust test so `cargo test` runs them. A file of its own (not in `support/mod.rs`): it
//! finds the scripts under this package's directory (`tests/`), which `runtime/tests`,
//! the other users of `support/mod.rs`, are not in.
#![allow(dead_code)]

/// Runs `tests/{name}` with bash, its output not captured (the script's own lines say what
/// it checked and, on a failure, why), and fails the test when the script fails.
pub fn run_script(name: &str) {
    let script = format!("{}/{name}", env!("CARGO_MANIFEST_DIR"));
    let status = std::process::Command::new("bash")
        .arg(&script)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {script}: {e}"));
    assert!(
        status.success(),
        "{script} failed ({status}); its output above says why"
    );
}
