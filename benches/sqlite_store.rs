//! Issue item 3: `SqliteStore` first calls per second against a bare rusqlite `INSERT` into
//! an equivalent table with the same durability settings (WAL, `synchronous=FULL`): the floor.
//!
//! Custom harness (calls per second over a time window, printed as a table).
//! - `ours first call`: a fresh key per call: claim + completion, two durable commits
//!   (the writer thread group-commits whatever queued meanwhile).
//! - `ours replay`: a completed key, answered by the read-only first look of `claim`.
//! - `floor insert`: one `INSERT` of a row of the same shape into a table with the same
//!   columns and indexes, autocommit (one durable commit per row), on one connection.
//! - `floor insert+update`: the same two commits a first call needs (insert the claim,
//!   update it with the result): what a store without group commit could reach at best.
//! - `ours Run::step`: journaled steps of one run, one after the other (concurrency 1): each
//!   step takes its journal position and stores its result, two durable commits like a
//!   first call, so its ceiling is the two-commit floor.
//!
//! The files live under `std::env::temp_dir()` (set `TMPDIR` to bench another disk).
//! Run: `cargo bench -p tool-contracts-benches --bench sqlite_store` (add `-- --quick`).

#[allow(dead_code)]
#[path = "common/mod.rs"]
mod common;
#[allow(dead_code)]
#[path = "common/tool.rs"]
mod tool;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::Mode;
use rusqlite::{params, Connection};
use tool_contracts::store::SqliteStore;
use tool_contracts::with_store;

const FLOOR_SCHEMA: &str = "
CREATE TABLE records (
    key TEXT PRIMARY KEY NOT NULL, tool TEXT NOT NULL, scope TEXT, worker TEXT NOT NULL,
    fingerprint TEXT NOT NULL, args TEXT NOT NULL, state TEXT NOT NULL, token INTEGER NOT NULL,
    lease_expires_ms INTEGER, result TEXT, is_error INTEGER NOT NULL DEFAULT 0,
    created_ms INTEGER NOT NULL, completed_ms INTEGER, expires_ms INTEGER NOT NULL
);
CREATE INDEX records_expires ON records (expires_ms);
CREATE INDEX records_pending ON records (state, created_ms, key);
";

fn scratch_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tc-bench-sqlite-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn open_floor(path: &Path) -> Connection {
    let conn = Connection::open(path).expect("open");
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
        .expect("wal");
    assert_eq!(mode, "wal");
    conn.pragma_update(None, "synchronous", "FULL")
        .expect("sync");
    conn.execute_batch(FLOOR_SCHEMA).expect("schema");
    conn
}

fn insert(conn: &Connection, i: u64) {
    let key = format!("{i:064x}");
    conn.prepare_cached(
        "INSERT INTO records (key, tool, scope, worker, fingerprint, args, state, token, \
         lease_expires_ms, result, is_error, created_ms, completed_ms, expires_ms) \
         VALUES (?1, 'create_order', NULL, 'bench-worker', ?2, ?3, 'in_progress', ?4, ?5, NULL, 0, ?5, NULL, ?6)",
    )
    .expect("prepare")
    .execute(params![
        key,
        "cart=0123456789abcdef01234567;note=0123456789abcdef01234567;user_id=0123456789abcdef01234567",
        r#"{"cart":{"id":"c-42","items":["book"]},"note":"gift","user_id":7}"#,
        i as i64,
        1_700_000_000_000_i64 + i as i64,
        1_700_086_400_000_i64 + i as i64
    ])
    .expect("insert");
}

fn complete(conn: &Connection, i: u64) {
    let key = format!("{i:064x}");
    conn.prepare_cached(
        "UPDATE records SET state = 'completed', result = ?2, completed_ms = ?3, lease_expires_ms = NULL \
         WHERE key = ?1 AND token = ?4",
    )
    .expect("prepare")
    .execute(params![
        key,
        r#"{"cart_id":"c-42","order_id":71,"total_cents":4999}"#,
        1_700_000_000_000_i64 + i as i64,
        i as i64
    ])
    .expect("update");
}

fn row(name: &str, calls: u64, elapsed: Duration, floor: Option<f64>) -> f64 {
    let rate = common::per_sec(calls, elapsed);
    match floor {
        Some(f) => println!("{name:<44} {rate:>10.0} /s   x{:.2} of floor", rate / f),
        None => println!("{name:<44} {rate:>10.0} /s   (floor)"),
    }
    rate
}

fn main() {
    let mode = Mode::detect();
    common::print_machine("sqlite_store");
    let window = mode.window();
    let dir = scratch_dir();
    println!("files in {}", dir.display());

    // The floor: one connection, one durable commit per row. fsync latency on a shared
    // virtual disk drifts, so the floor is measured before and after ours and averaged.
    let floor_once = |name: &str| {
        let conn = open_floor(&dir.join(name));
        for i in 0..50 {
            insert(&conn, 1_000_000_000 + i);
        }
        let mut i = 0;
        let (n, el) = common::time_for(window, || {
            insert(&conn, i);
            i += 1;
        });
        common::per_sec(n, el)
    };
    let floor_before = floor_once("floor-a.db");
    println!("floor: bare INSERT (1 commit), before      {floor_before:>10.0} /s");
    let floor = floor_before;
    let two_commits = {
        let conn = open_floor(&dir.join("floor2.db"));
        let mut i = 0;
        let (n, el) = common::time_for(window, || {
            insert(&conn, i);
            complete(&conn, i);
            i += 1;
        });
        row(
            "floor: bare INSERT + UPDATE (2 commits)",
            n,
            el,
            Some(floor),
        )
    };

    let rt = common::multi_thread_runtime();
    let store = Arc::new(
        rt.block_on(SqliteStore::open(dir.join("ours.db")))
            .expect("open"),
    );
    for concurrency in [1usize, 16] {
        let base = concurrency as u64 * 100_000_000;
        let s = Arc::clone(&store);
        let (n, el) = rt.block_on(common::load::concurrent(
            concurrency,
            window,
            base,
            move |u| with_store(Arc::clone(&s), tool::call(u)),
        ));
        let first = row(
            &format!("ours: SqliteStore first call, conc {concurrency}"),
            n,
            el,
            Some(floor),
        );
        println!(
            "    first call, conc {concurrency} = x{:.2} of the two-commit floor ({two_commits:.0} /s)",
            first / two_commits
        );
        // Replays of the keys just made.
        let made = n.max(1);
        let s = Arc::clone(&store);
        let (n, el) = rt.block_on(common::load::concurrent(concurrency, window, 0, move |i| {
            with_store(Arc::clone(&s), tool::call(base + i % made))
        }));
        row(
            &format!("ours: SqliteStore replay, conc {concurrency}"),
            n,
            el,
            Some(floor),
        );
    }
    // Journaled steps of one run, sequentially: the cost of `Run::step` against the
    // two-commit floor (a step is a journal position claimed, then its result stored).
    let s = Arc::clone(&store);
    let (n, el) = rt.block_on(with_store(s, async move {
        let run = tool_contracts::Run::start("bench_steps", &serde_json::json!({ "run": 1 }))
            .await
            .expect("start the run");
        let start = std::time::Instant::now();
        let mut n = 0u64;
        while start.elapsed() < window {
            let step = format!("step-{n}");
            let out: u64 = run
                .step(&step, || async move { Ok::<_, tool_contracts::Error>(n) })
                .await
                .expect("step");
            std::hint::black_box(out);
            n += 1;
        }
        (n, start.elapsed())
    }));
    let rate = row("ours: Run::step (journaled), conc 1", n, el, Some(floor));
    println!(
        "    Run::step = x{:.2} of the two-commit floor ({two_commits:.0} /s)",
        rate / two_commits
    );
    drop(store);
    drop(rt);
    let floor_after = floor_once("floor-b.db");
    println!("floor: bare INSERT (1 commit), after       {floor_after:>10.0} /s");
    println!(
        "(ratios above use the 'before' floor; with the mean of both floors ({:.0} /s) multiply them by {:.2})",
        (floor_before + floor_after) / 2.0,
        floor_before / ((floor_before + floor_after) / 2.0)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
