//! What the process-spawning suites (`tests/clock.rs`, `tests/crash_injection.rs`) leave
//! in the shared servers, removed when the test ends, pass or fail. A file of its own (not
//! in `support/mod.rs`): it needs the `redis` client, which `runtime/tests` may build
//! without.

use std::process::{Command, Stdio};

/// Runs its closure when dropped: the test's cleanup, pass or fail.
pub struct Cleanup(pub Box<dyn Fn()>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        (self.0)();
    }
}

/// Deletes every key under `prefix` on the Redis server at `url`.
pub fn redis_delete_prefix(url: &str, prefix: &str) {
    let script =
        "for _, k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) end return 0";
    let deleted = redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .and_then(|mut conn| {
            redis::cmd("EVAL")
                .arg(script)
                .arg(0)
                .arg(format!("{prefix}*"))
                .query::<i64>(&mut conn)
        });
    if let Err(e) = deleted {
        eprintln!("cleanup: could not delete {prefix}* on {url}: {e}");
    }
}

/// Drops the PostgreSQL schema a test made.
pub fn postgres_drop_schema(url: &str, schema: &str) {
    let _ = Command::new("psql")
        .args([
            url,
            "-q",
            "-c",
            &format!("DROP SCHEMA IF EXISTS {schema} CASCADE"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}
