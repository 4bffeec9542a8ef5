//! Shared by the test binaries (`tests/` and, through `#[path]`, `runtime/tests/`): where
//! the backend suites find their servers, and fresh names for what a test makes in them.
//! Only `std` here: what names `tool_contracts` or a client crate lives in a file of its
//! own beside this one (`calls.rs`, `cleanup.rs`, `stores.rs`, `workers.rs`, each taken in
//! by `#[path]`), which `runtime/tests` do not build.
//!
//! A suite runs against the URL in its variable; without one, against the server on its
//! default local port if one listens there, so `cargo test --workspace --all-features`
//! on a machine with Redis and PostgreSQL runs everything with nothing set. Where none
//! is found the suite is skipped with a notice written straight to the process's stderr
//! (libtest hides what a passing test prints, not this); with `CI` set it fails instead,
//! so CI can never pass without its backends.
#![allow(dead_code)]

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A backend the suites can run against.
pub struct Backend {
    /// The variable that names its URL.
    pub var: &'static str,
    /// The URL of the server on its default local port.
    pub default_url: &'static str,
    /// That server's address, probed when the variable is not set.
    pub default_addr: &'static str,
    /// Its name in messages.
    pub name: &'static str,
    /// A query parameter every suite URL gets: Redis's opt-in to a server without an
    /// append-only file (the machine's default Redis keeps nothing on disk, and only
    /// `tests/store_faults.rs` restarts a server: it starts its own, with persistence).
    pub test_opt_in: Option<&'static str>,
}

/// Redis (the machine's default server keeps nothing on disk: fine for every suite that
/// does not restart the server).
pub const REDIS: Backend = Backend {
    var: "TOOL_CONTRACTS_REDIS_URL",
    default_url: "redis://127.0.0.1:6379",
    default_addr: "127.0.0.1:6379",
    name: "Redis",
    test_opt_in: Some("allow_without_persistence=true"),
};

/// PostgreSQL, database `test`, user `postgres`, trust authentication.
pub const POSTGRES: Backend = Backend {
    var: "TOOL_CONTRACTS_POSTGRES_URL",
    default_url: "postgres://postgres@127.0.0.1:5432/test",
    default_addr: "127.0.0.1:5432",
    name: "PostgreSQL",
    test_opt_in: None,
};

/// The URL `suite` runs against, or `None` after a visible notice (a panic under `CI`).
pub fn url(backend: &Backend, suite: &str) -> Option<String> {
    found_url(backend, suite).map(|url| match backend.test_opt_in {
        Some(opt_in) if !url.contains(opt_in) => {
            let joiner = if url.contains('?') { '&' } else { '?' };
            format!("{url}{joiner}{opt_in}")
        }
        _ => url,
    })
}

fn found_url(backend: &Backend, suite: &str) -> Option<String> {
    if let Ok(url) = std::env::var(backend.var) {
        if !url.is_empty() {
            return Some(url);
        }
    }
    let listening = backend
        .default_addr
        .parse::<SocketAddr>()
        .is_ok_and(|addr| TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_ok());
    if listening {
        return Some(backend.default_url.to_owned());
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{suite} needs {name}: set {var} (nothing listens on {addr}); CI never skips a backend",
        name = backend.name,
        var = backend.var,
        addr = backend.default_addr,
    );
    // Straight to the process's stderr: libtest captures `eprintln!`, not this.
    let _ = writeln!(
        std::io::stderr(),
        "\nSKIPPED {suite}: no {name} server (set {var}, or start one on {addr})",
        name = backend.name,
        var = backend.var,
        addr = backend.default_addr,
    );
    None
}

/// A name no other test, process or run shares: `label`, this process's id and the time
/// in nanoseconds (a Redis prefix, a schema, a scope, a temporary file's stem).
pub fn unique(label: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{label}-{}-{nanos}", std::process::id())
}

/// A fresh path in the temporary directory: `unique(label)`, then `.extension`.
pub fn temp_path(label: &str, extension: &str) -> PathBuf {
    std::env::temp_dir().join(format!("{}.{extension}", unique(label)))
}
