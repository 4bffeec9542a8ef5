//! What the process-spawning suites (`tests/clock.rs`, `tests/crash_injection.rs`,
//! `tests/fleet.rs`, `tests/run_kills.rs`) leave in the shared servers and the temporary
//! directory, removed when the test ends, pass or fail. A file of its own (not in
//! `support/mod.rs`): it needs the `redis` and `tokio-postgres` clients, which
//! `runtime/tests` may build without. Its test file declares `mod support;` beside it.
//! Also where the suites whose workers open a store by URL (`tests/run_kills.rs`,
//! `tests/compensation_kills.rs`) get that URL per backend ([`Suite::on`]).
#![allow(dead_code)]

use std::future::Future;

/// A durable store a suite's workers open by URL.
#[derive(Debug, Clone, Copy)]
pub enum Durable {
    /// A fresh SQLite file of the suite's own.
    Sqlite,
    /// The Redis server of [`crate::support::url`].
    Redis,
    /// The PostgreSQL server of [`crate::support::url`].
    Postgres,
}

/// A suite whose tests take a store URL: the label of its SQLite files and its name in the
/// notice of a skipped backend ("`name` on Redis").
pub struct Suite {
    /// The stem of its SQLite files' names.
    pub label: &'static str,
    /// What the suite is, in a skip notice.
    pub name: &'static str,
}

impl Suite {
    /// Runs `test` with the URL of `store`: a fresh SQLite file, deleted when the test ends
    /// (pass or fail), or the server's URL; without a server, a visible skip (a failure
    /// under `CI`, see [`crate::support::url`]).
    pub fn on(&self, store: Durable, test: impl FnOnce(String)) {
        let backend = match store {
            Durable::Sqlite => {
                let (path, _cleanup) = sqlite_file(self.label);
                test(format!("sqlite:{path}"));
                return;
            }
            Durable::Redis => &crate::support::REDIS,
            Durable::Postgres => &crate::support::POSTGRES,
        };
        if let Some(url) =
            crate::support::url(backend, &format!("{} on {}", self.name, backend.name))
        {
            test(url);
        }
    }
}

/// Runs its closure when dropped: the test's cleanup, pass or fail.
pub struct Cleanup(pub Box<dyn Fn()>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        (self.0)();
    }
}

/// A fresh SQLite file's path in the temporary directory, and the guard that deletes it
/// with its `-wal` and `-shm` files.
pub fn sqlite_file(label: &str) -> (String, Cleanup) {
    let path = crate::support::temp_path(label, "db").display().to_string();
    let file = path.clone();
    let cleanup = Cleanup(Box::new(move || {
        for ext in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{file}{ext}"));
        }
    }));
    (path, cleanup)
}

/// A fresh Redis key prefix (ending in `:`), and the guard that deletes every key under it
/// on the server at `url`.
pub fn redis_prefix(url: &str, label: &str) -> (String, Cleanup) {
    let prefix = format!("{}:", crate::support::unique(label));
    let (u, p) = (url.to_owned(), prefix.clone());
    (
        prefix,
        Cleanup(Box::new(move || redis_delete_prefix(&u, &p))),
    )
}

/// A fresh PostgreSQL schema name, and the guard that drops the schema on the server at
/// `url`.
pub fn postgres_schema(url: &str, label: &str) -> (String, Cleanup) {
    let schema = crate::support::unique(label).replace('-', "_");
    let (u, s) = (url.to_owned(), schema.clone());
    (
        schema,
        Cleanup(Box::new(move || postgres_drop_schema(&u, &s))),
    )
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
    let (url, sql) = (
        url.to_owned(),
        format!("DROP SCHEMA IF EXISTS {schema} CASCADE"),
    );
    let dropped = block_on(async move {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        client.batch_execute(&sql).await
    });
    if let Err(e) = dropped {
        eprintln!("cleanup: could not drop schema {schema}: {e}");
    }
}

/// Runs `task` to its end on a runtime of its own, on a thread of its own: a guard may be
/// dropped inside a test's runtime, where no other runtime can be started.
fn block_on<T: Send + 'static>(task: impl Future<Output = T> + Send + 'static) -> T {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a cleanup runtime")
            .block_on(task)
    })
    .join()
    .expect("the cleanup thread")
}
