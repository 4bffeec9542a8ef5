//! A durable store in one SQLite file: claims and results for the processes of one machine.
//!
//! # Guarantees
//!
//! - **Atomic claims across processes.** Every read-modify-write runs inside a
//!   `BEGIN IMMEDIATE` transaction, which takes SQLite's single write lock before it reads,
//!   so two claims for one key (from this process or from another process that opened the
//!   same file) are serialised and exactly one of them wins. A writer that finds the lock
//!   taken waits up to `BUSY_TIMEOUT` (5 s) before the operation fails with
//!   [`StoreError::Unavailable`].
//! - **Durability.** The file uses WAL journaling with `synchronous=FULL`: the WAL is
//!   fsynced at every commit, so once a claim, completion or release has returned it
//!   survives a crash of the process *and* a power cut. `synchronous=NORMAL` would fsync
//!   only at checkpoints: still safe against a process crash, but a power cut could roll
//!   back the last commits. A lost *completion* is the dangerous case: the key would look
//!   free (or abandoned) again and a retry would run the tool's effect a second time,
//!   which is exactly what this library exists to prevent, so we pay one fsync per commit.
//!   Writes queued at the same moment share one commit (group commit, each in its own
//!   savepoint), and no caller is answered before its commit is on disk.
//! - **Clock.** SQLite has no server clock, so leases and expiry use the system clock in
//!   unix milliseconds, read inside the transaction. All processes on one machine share
//!   that clock, which is what makes it safe here; do not put the file on a network share
//!   (SQLite's locking is not reliable there either).
//! - **Fencing tokens** come from one store-wide counter row, incremented in the same
//!   transaction as the claim, so a token is never reused for a key, even after release
//!   or purge, and even across restarts.
//!
//! # Schema (version 2, kept in `PRAGMA user_version`)
//!
//! - `records`: one row per key (`key TEXT PRIMARY KEY`), with `tool`, `scope`, `worker`
//!   (the claimer), `fingerprint`, `args`, `state` (`in_progress` or `completed`), `token`
//!   (the holder's fencing token), `lease_expires_ms` (in progress only), `result` and
//!   `is_error` (completed only), `created_ms`, `completed_ms` and `expires_ms`; since
//!   version 2 also `version` (the tool contract's) and `updated_ms` (the last state
//!   change), both `NULL` in rows an older build wrote. Indexed
//!   on `expires_ms` (purge) and on `(state, created_ms, key)` (the pending list, oldest
//!   first, without a sort).
//! - `history`: append-only events (`key`, `at_ms`, `kind`, `token`, `worker`) indexed on
//!   `key`; ordered by their rowid, i.e. by commit order.
//! - `meta`: named integers; `last_token` is the fencing counter.
//! - `released`: keys released since the last purge. A released key has no record but
//!   keeps its history until the next purge, as in the in-memory store; this small table
//!   lets the purge find those histories without scanning `history`.
//!
//! The schema is created or migrated on open, inside an immediate transaction, so several
//! processes may open a new file at once: [`MIGRATIONS`] are applied in order, each
//! bringing the file one version up. A file from a newer schema version is refused.
//!
//! # Cancellation
//!
//! Each operation runs to completion (on the writer thread or tokio's blocking pool) even
//! if its caller's future is dropped. A claim abandoned that way may still commit: its key then stays in progress
//! until the lease runs out and is reported `Abandoned`, never silently free.

use core::time::Duration;
use std::hash::{BuildHasher, RandomState};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};
use tokio::sync::oneshot;
use tokio::sync::Notify;

use super::{
    ClaimOutcome, ClaimRequest, Completion, HistoryEvent, HistoryKind, Observed, Record,
    RecordState, Resolution, ResolveRequest, Store, StoreError, StoreResult,
};

/// How long a write waits for another connection's (or process's) write lock before the
/// operation fails as unavailable.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// What brings a file from version `n` to `n + 1` is `MIGRATIONS[n]`: version 1 is
/// [`SCHEMA_V1`]. Append new ones; never edit a released one.
const MIGRATIONS: &[&str] = &[SCHEMA_V1, SCHEMA_V2];

/// The schema version this build writes and understands.
const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// At most this many queued writes share one transaction, so a burst does not hold the
/// file's write lock (and other processes) for long.
const MAX_BATCH: usize = 128;

/// Reader connections: at most this many reads run at once (more queue asynchronously),
/// so the pool never opens and closes connections under load.
const MAX_READERS: usize = 16;

/// Waiters are woken per shard of keys (a collision only costs a spurious re-claim).
const WAKE_SHARDS: usize = 64;

/// How often a waiter re-checks: changes made by *other processes* are only seen by
/// polling, since SQLite has no cross-process notification.
const POLL: Duration = Duration::from_millis(20);

const SCHEMA_V1: &str = "
CREATE TABLE records (
    key              TEXT PRIMARY KEY NOT NULL,
    tool             TEXT NOT NULL,
    scope            TEXT,
    worker           TEXT NOT NULL,
    fingerprint      TEXT NOT NULL,
    args             TEXT NOT NULL,
    state            TEXT NOT NULL,
    token            INTEGER NOT NULL,
    lease_expires_ms INTEGER,
    result           TEXT,
    is_error         INTEGER NOT NULL DEFAULT 0,
    created_ms       INTEGER NOT NULL,
    completed_ms     INTEGER,
    expires_ms       INTEGER NOT NULL
);
CREATE INDEX records_expires ON records (expires_ms);
CREATE INDEX records_pending ON records (state, created_ms, key);
CREATE TABLE history (
    id     INTEGER PRIMARY KEY,
    key    TEXT NOT NULL,
    at_ms  INTEGER NOT NULL,
    kind   TEXT NOT NULL,
    token  INTEGER NOT NULL,
    worker TEXT NOT NULL
);
CREATE INDEX history_key ON history (key);
CREATE TABLE meta (
    name  TEXT PRIMARY KEY NOT NULL,
    value INTEGER NOT NULL
);
INSERT INTO meta (name, value) VALUES ('last_token', 0);
CREATE TABLE released (
    key TEXT PRIMARY KEY NOT NULL
);
";

/// Version 2: what the operation view shows and version 1 did not keep. Nullable, so the
/// change is instant on a large file and rows written before it read as "not kept".
const SCHEMA_V2: &str = "
ALTER TABLE records ADD COLUMN version INTEGER;
ALTER TABLE records ADD COLUMN updated_ms INTEGER;
";

/// The record columns, in the order [`RawRow::read`] expects them.
macro_rules! record_columns {
    () => {
        "key, tool, scope, worker, fingerprint, args, state, token, lease_expires_ms, \
         result, is_error, created_ms, completed_ms, expires_ms, version, updated_ms"
    };
}

const SELECT_RECORD: &str = concat!("SELECT ", record_columns!(), " FROM records WHERE key = ?1");
const SELECT_PENDING: &str = concat!(
    "SELECT ",
    record_columns!(),
    " FROM records WHERE state = 'in_progress' ORDER BY created_ms, key LIMIT ?1"
);
const INSERT_FRESH: &str = concat!(
    "INSERT OR REPLACE INTO records (",
    record_columns!(),
    ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'in_progress', ?7, ?8, NULL, 0, ?9, NULL, ?10, ?11, ?12)"
);

const IN_PROGRESS: &str = "in_progress";
const COMPLETED: &str = "completed";

/// A durable store in one SQLite file, shared safely by every process of one machine.
///
/// - Claims are atomic across processes: every read-modify-write runs inside a
///   `BEGIN IMMEDIATE` transaction, so of several concurrent claims for a key exactly one
///   wins.
/// - A write that returned survives a process crash and a power cut (WAL journaling with
///   `synchronous=FULL`): a completed result is never lost, so a retry never re-runs it.
/// - Leases and expiry use the system clock (unix milliseconds), which every process on
///   the machine shares. Keep the file on a local disk, not a network share.
/// - Duplicates waiting for a running call are woken at once by changes made through the
///   same `SqliteStore`, and within 20 ms by changes from other processes.
///
/// # Connections
///
/// rusqlite is blocking, so no operation runs on the async executor. Writes go to ONE
/// connection owned by a dedicated writer thread, through a channel: SQLite allows one
/// writer at a time anyway, and queueing this process's writers in a channel is much
/// cheaper than letting several connections spin on SQLite's busy handler (which sleeps
/// in steps of milliseconds). The thread commits whatever queued up meanwhile in ONE
/// transaction (group commit: each operation in its own savepoint, one fsync for all),
/// and answers each caller only after that commit; under concurrency this multiplies the
/// write rate that `synchronous=FULL` would otherwise cap at one fsync per operation.
/// Reads (`lookup`, `pending`, `history`, and the read-only first look of a `claim`) use a
/// pool of up to 16 `query_only` connections, which WAL lets run in parallel with the
/// writer and with each other.
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    /// The path as shown in error messages.
    label: String,
    /// The writer thread's queue; dropping it (with the store) stops the thread.
    jobs: mpsc::Sender<Box<dyn Job>>,
    /// Idle reader connections, opened on first need.
    readers: Mutex<Vec<Connection>>,
    /// One permit per reader connection that may exist.
    reader_permits: Arc<tokio::sync::Semaphore>,
    /// Wakes this process's waiters when a key changes here; other processes' changes
    /// are found by polling.
    wakers: Box<[Notify]>,
    hasher: RandomState,
    /// When the next new claim purges expired records in the background.
    purge: super::purge::PurgeSchedule,
}

impl core::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.inner.path)
            .finish_non_exhaustive()
    }
}

/// Why an operation inside a blocking task failed, before it is given its context.
enum Failure {
    Sql(rusqlite::Error),
    Corrupt(String),
    Store(StoreError),
}

impl From<rusqlite::Error> for Failure {
    fn from(e: rusqlite::Error) -> Self {
        Failure::Sql(e)
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::Store(e)
    }
}

/// Turns a failure into the store error the caller sees, naming the file and operation.
fn contextualize(label: &str, op: &str, failure: Failure) -> StoreError {
    match failure {
        Failure::Store(e) => e,
        Failure::Corrupt(msg) => StoreError::Corrupt(format!("SQLite store {label}: {op}: {msg}")),
        Failure::Sql(e) => {
            let corrupt = match &e {
                rusqlite::Error::SqliteFailure(code, _) => matches!(
                    code.code,
                    rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase
                ),
                // A column holds a value of the wrong type: the row is not one we wrote.
                rusqlite::Error::FromSqlConversionFailure(..)
                | rusqlite::Error::InvalidColumnType(..)
                | rusqlite::Error::IntegralValueOutOfRange(..)
                | rusqlite::Error::Utf8Error(..) => true,
                _ => false,
            };
            if corrupt {
                StoreError::Corrupt(format!("SQLite store {label}: {op}: {e}"))
            } else {
                StoreError::unavailable(format!("SQLite store {label}: {op}"), e)
            }
        }
    }
}

/// The system clock in unix milliseconds (the store's clock; see the module doc).
fn now_ms() -> Result<i64, Failure> {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).map_err(|_| {
        Failure::Store(StoreError::unavailable_message(
            "SQLite store: the system clock is before 1970",
        ))
    })?;
    Ok(i64::try_from(since.as_millis()).unwrap_or(i64::MAX))
}

/// Milliseconds of a duration, saturating (a lease of centuries is just "very long").
fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn to_system(ms: i64, what: &str, key: &str) -> Result<SystemTime, Failure> {
    u64::try_from(ms)
        .ok()
        .and_then(|ms| UNIX_EPOCH.checked_add(Duration::from_millis(ms)))
        .ok_or_else(|| Failure::Corrupt(format!("record {key:?} has an invalid {what} ({ms})")))
}

fn to_token(raw: i64, key: &str) -> Result<u64, Failure> {
    u64::try_from(raw)
        .map_err(|_| Failure::Corrupt(format!("record {key:?} has a negative token ({raw})")))
}

/// Opens and configures one connection. `writer` connections also switch the file to WAL
/// (a persistent property of the file, so readers opened later find it set).
fn connect(path: &Path, label: &str, writer: bool) -> StoreResult<Connection> {
    let conn = Connection::open(path).map_err(|e| {
        let hint = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() && !dir.is_dir() => {
                format!(" (directory {} does not exist)", dir.display())
            }
            _ => String::new(),
        };
        StoreError::unavailable(format!("cannot open SQLite store {label}{hint}"), e)
    })?;
    configure(&conn, label, writer).map_err(|f| contextualize(label, "open (configure)", f))?;
    Ok(conn)
}

fn configure(conn: &Connection, label: &str, writer: bool) -> Result<(), Failure> {
    // First, so that even the pragmas below wait for another process's lock.
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.set_prepared_statement_cache_capacity(32);
    if writer {
        let mode: String = retry_busy(|| {
            Ok(conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))?)
        })?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(Failure::Store(StoreError::unavailable_message(format!(
                "SQLite store {label}: cannot use WAL journaling (journal_mode is {mode:?}); \
                 use a file on a local disk"
            ))));
        }
    }
    // Per connection, not stored in the file: every connection must set it.
    conn.pragma_update(None, "synchronous", "FULL")?;
    if !writer {
        conn.pragma_update(None, "query_only", true)?;
    }
    Ok(())
}

/// Retries `f` while SQLite reports the file busy, for up to `BUSY_TIMEOUT`. Needed where
/// SQLite answers `SQLITE_BUSY` at once instead of calling the busy handler: switching the
/// journal mode while another process is opening the same file (seen with 4 processes
/// opening a new file together).
fn retry_busy<T>(mut f: impl FnMut() -> Result<T, Failure>) -> Result<T, Failure> {
    let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
    loop {
        match f() {
            Err(Failure::Sql(rusqlite::Error::SqliteFailure(e, _)))
                if matches!(
                    e.code,
                    rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                ) && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            other => return other,
        }
    }
}

/// Creates the schema in a new file, or checks the version of an existing one.
fn migrate(conn: &mut Connection, label: &str) -> Result<(), Failure> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let version: i64 = tx.pragma_query_value(None, "user_version", |row| row.get(0))?;
    match version {
        // Plain CREATE TABLE in version 1: a file that already has unrelated `records`
        // tables is refused rather than silently adopted.
        v if (0..SCHEMA_VERSION).contains(&v) => {
            for migration in MIGRATIONS.iter().skip(usize::try_from(v).unwrap_or(0)) {
                tx.execute_batch(migration)?;
            }
            tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
        }
        SCHEMA_VERSION => {}
        v if v > SCHEMA_VERSION => {
            return Err(Failure::Store(StoreError::unavailable_message(format!(
                "SQLite store {label} has schema version {v}, newer than this build \
                 understands ({SCHEMA_VERSION}); upgrade tool-contracts"
            ))))
        }
        v => {
            return Err(Failure::Corrupt(format!(
                "unknown schema version {v} (expected {SCHEMA_VERSION})"
            )))
        }
    }
    tx.commit()?;
    Ok(())
}

/// A record row as stored, before its invariants are checked.
struct RawRow {
    key: String,
    tool: String,
    scope: Option<String>,
    fingerprint: String,
    args: String,
    state: String,
    token: i64,
    lease_expires_ms: Option<i64>,
    result: Option<String>,
    is_error: i64,
    created_ms: i64,
    completed_ms: Option<i64>,
    expires_ms: i64,
    version: Option<i64>,
    updated_ms: Option<i64>,
}

impl RawRow {
    fn read(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            key: row.get(0)?,
            tool: row.get(1)?,
            scope: row.get(2)?,
            // Column 3 (`worker`) is not part of a `Record`; it is read by the writes.
            fingerprint: row.get(4)?,
            args: row.get(5)?,
            state: row.get(6)?,
            token: row.get(7)?,
            lease_expires_ms: row.get(8)?,
            result: row.get(9)?,
            is_error: row.get(10)?,
            created_ms: row.get(11)?,
            completed_ms: row.get(12)?,
            expires_ms: row.get(13)?,
            version: row.get(14)?,
            updated_ms: row.get(15)?,
        })
    }

    fn check(self) -> Result<Row, Failure> {
        let key = self.key;
        let corrupt = |what: &str| Failure::Corrupt(format!("record {key:?} {what}"));
        let state = match self.state.as_str() {
            IN_PROGRESS => RowState::InProgress {
                token: to_token(self.token, &key)?,
                lease_expires_ms: self
                    .lease_expires_ms
                    .ok_or_else(|| corrupt("is in progress without a lease"))?,
            },
            COMPLETED => RowState::Completed {
                result: self
                    .result
                    .ok_or_else(|| corrupt("is completed without a result"))?,
                is_error: match self.is_error {
                    0 => false,
                    1 => true,
                    other => return Err(corrupt(&format!("has is_error = {other}"))),
                },
                completed_ms: self
                    .completed_ms
                    .ok_or_else(|| corrupt("is completed without a completion time"))?,
            },
            other => return Err(corrupt(&format!("has an unknown state {other:?}"))),
        };
        let version = match self.version {
            Some(v) => Some(
                u32::try_from(v).map_err(|_| corrupt(&format!("has an invalid version {v}")))?,
            ),
            None => None,
        };
        Ok(Row {
            key,
            tool: self.tool,
            version,
            updated_ms: self.updated_ms,
            scope: self.scope,
            fingerprint: self.fingerprint,
            args: self.args,
            state,
            created_ms: self.created_ms,
            expires_ms: self.expires_ms,
        })
    }
}

/// A checked record row.
struct Row {
    key: String,
    tool: String,
    version: Option<u32>,
    /// `None` in rows written before schema version 2.
    updated_ms: Option<i64>,
    scope: Option<String>,
    fingerprint: String,
    args: String,
    state: RowState,
    created_ms: i64,
    expires_ms: i64,
}

enum RowState {
    InProgress {
        token: u64,
        lease_expires_ms: i64,
    },
    Completed {
        result: String,
        is_error: bool,
        completed_ms: i64,
    },
}

impl Row {
    /// An expired result counts as absent for claims.
    fn is_expired_result(&self, now: i64) -> bool {
        matches!(self.state, RowState::Completed { .. }) && self.expires_ms <= now
    }

    /// What a claim finding this row answers (the caller has ruled out expired results).
    fn outcome(self, now: i64) -> Result<ClaimOutcome, Failure> {
        match self.state {
            RowState::InProgress {
                token,
                lease_expires_ms,
            } => Ok(if lease_expires_ms > now {
                let remaining = u64::try_from(lease_expires_ms - now).unwrap_or(0);
                ClaimOutcome::InProgress {
                    fingerprint: self.fingerprint,
                    lease_remaining: Duration::from_millis(remaining),
                }
            } else {
                ClaimOutcome::Abandoned {
                    token,
                    fingerprint: self.fingerprint,
                }
            }),
            RowState::Completed { .. } => Ok(ClaimOutcome::Completed(std::sync::Arc::new(
                self.into_record()?,
            ))),
        }
    }

    fn into_record(self) -> Result<Record, Failure> {
        let key = self.key;
        // Rows written before schema version 2: their last known change.
        let updated_ms = match (&self.state, self.updated_ms) {
            (_, Some(ms)) => ms,
            (RowState::Completed { completed_ms, .. }, None) => *completed_ms,
            (RowState::InProgress { .. }, None) => self.created_ms,
        };
        let state = match self.state {
            RowState::InProgress {
                token,
                lease_expires_ms,
            } => RecordState::InProgress {
                token,
                lease_expires_at: to_system(lease_expires_ms, "lease expiry", &key)?,
            },
            RowState::Completed {
                result,
                is_error,
                completed_ms,
            } => RecordState::Completed {
                result,
                is_error,
                completed_at: to_system(completed_ms, "completion time", &key)?,
            },
        };
        Ok(Record {
            created_at: to_system(self.created_ms, "creation time", &key)?,
            updated_at: to_system(updated_ms, "update time", &key)?,
            expires_at: to_system(self.expires_ms, "expiry", &key)?,
            key,
            tool: self.tool,
            version: self.version,
            scope: self.scope,
            fingerprint: self.fingerprint,
            args: self.args,
            state,
        })
    }
}

fn select_row(conn: &Connection, key: &str) -> Result<Option<Row>, Failure> {
    let raw = conn
        .prepare_cached(SELECT_RECORD)?
        .query_row([key], |row| Ok(RawRow::read(row)))
        .optional()?;
    raw.map(|raw| raw.map_err(|e| row_error(key, e))?.check())
        .transpose()
}

/// Names the key in a column conversion error (a value of the wrong type in its row).
fn row_error(key: &str, e: rusqlite::Error) -> Failure {
    match e {
        rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::InvalidColumnType(..)
        | rusqlite::Error::IntegralValueOutOfRange(..)
        | rusqlite::Error::Utf8Error(..) => Failure::Corrupt(format!("record {key:?}: {e}")),
        other => Failure::Sql(other),
    }
}

/// The next fencing token, from the store-wide counter (inside the caller's transaction).
fn next_token(conn: &Connection) -> Result<u64, Failure> {
    let raw: Option<i64> = conn
        .prepare_cached(
            "UPDATE meta SET value = value + 1 WHERE name = 'last_token' RETURNING value",
        )?
        .query_row([], |row| row.get(0))
        .optional()?;
    let raw = raw.ok_or_else(|| Failure::Corrupt("the fencing counter row is missing".into()))?;
    u64::try_from(raw)
        .map_err(|_| Failure::Corrupt(format!("the fencing counter is negative ({raw})")))
}

fn log(
    conn: &Connection,
    key: &str,
    at_ms: i64,
    kind: HistoryKind,
    token: u64,
    worker: &str,
) -> Result<(), Failure> {
    conn.prepare_cached(
        "INSERT INTO history (key, at_ms, kind, token, worker) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(rusqlite::params![
        key,
        at_ms,
        kind.as_str(),
        sql_token(token)?,
        worker
    ])?;
    Ok(())
}

/// Tokens are stored as SQLite integers; the counter cannot realistically pass i64::MAX.
fn sql_token(token: u64) -> Result<i64, Failure> {
    i64::try_from(token)
        .map_err(|_| Failure::Corrupt(format!("fencing token {token} exceeds SQLite's range")))
}

/// A claim request owned by the blocking task.
struct OwnedClaim {
    key: String,
    tool: String,
    version: u32,
    scope: Option<String>,
    fingerprint: String,
    args: String,
    lease_ms: i64,
    ttl_ms: i64,
    worker: String,
}

impl From<ClaimRequest<'_>> for OwnedClaim {
    fn from(req: ClaimRequest<'_>) -> Self {
        Self {
            key: req.key.to_owned(),
            tool: req.tool.to_owned(),
            version: req.version,
            scope: req.scope.map(str::to_owned),
            fingerprint: req.fingerprint.to_owned(),
            args: req.args.to_owned(),
            lease_ms: millis(req.lease),
            ttl_ms: millis(req.ttl),
            worker: req.worker.to_owned(),
        }
    }
}

impl OwnedClaim {
    /// Writes a fresh in-progress record under a new token and logs `kind`.
    fn insert(
        &self,
        conn: &Connection,
        now: i64,
        created_ms: i64,
        kind: HistoryKind,
    ) -> Result<ClaimOutcome, Failure> {
        let token = next_token(conn)?;
        let lease_expires = now.saturating_add(self.lease_ms);
        let expires = now.saturating_add(self.ttl_ms.max(self.lease_ms));
        conn.prepare_cached(INSERT_FRESH)?
            .execute(rusqlite::params![
                self.key,
                self.tool,
                self.scope,
                self.worker,
                self.fingerprint,
                self.args,
                sql_token(token)?,
                lease_expires,
                created_ms,
                expires,
                self.version,
                now,
            ])?;
        log(conn, &self.key, now, kind, token, &self.worker)?;
        Ok(ClaimOutcome::Acquired { token })
    }
}

/// One queued write, type-erased for the writer thread's channel.
trait Job: Send {
    /// Runs inside the batch's transaction; returns whether to keep its changes.
    fn run(&mut self, conn: &Connection, now: i64, label: &str) -> bool;
    /// Answers the caller once the batch is committed (`Ok`) or failed.
    fn finish(self: Box<Self>, committed: Result<(), StoreError>);
}

struct Task<T, F> {
    op: &'static str,
    f: Option<F>,
    outcome: Option<Result<T, StoreError>>,
    reply: oneshot::Sender<Result<T, StoreError>>,
}

impl<T, F> Job for Task<T, F>
where
    T: Send,
    F: FnOnce(&Connection, i64) -> Result<T, Failure> + Send,
{
    fn run(&mut self, conn: &Connection, now: i64, label: &str) -> bool {
        let Some(f) = self.f.take() else {
            return false;
        };
        // A panic must not take the writer thread (and every later write) down with it.
        let out = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(conn, now))) {
            Ok(out) => out.map_err(|failure| contextualize(label, self.op, failure)),
            Err(_) => Err(StoreError::unavailable_message(format!(
                "SQLite store {label}: {}: the operation panicked",
                self.op
            ))),
        };
        let keep = out.is_ok();
        self.outcome = Some(out);
        keep
    }

    fn finish(self: Box<Self>, committed: Result<(), StoreError>) {
        let answer = match (self.outcome, committed) {
            // Its own error stands: its changes were rolled back either way.
            (Some(Err(e)), _) => Err(e),
            (Some(Ok(value)), Ok(())) => Ok(value),
            (_, Err(e)) => Err(e),
            (None, Ok(())) => Err(StoreError::unavailable_message(format!(
                "SQLite store: {}: the operation was not run",
                self.op
            ))),
        };
        // The caller may have gone away; its operation still ran (see "Cancellation").
        let _ = self.reply.send(answer);
    }
}

/// The writer thread: runs until the store (the channel's sender) is dropped.
fn write_loop(conn: &Connection, label: &str, queue: &mpsc::Receiver<Box<dyn Job>>) {
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let committed = run_batch(conn, label, &mut batch)
            .map_err(|f| contextualize(label, "write transaction", f));
        for job in batch {
            job.finish(committed.clone());
        }
    }
}

/// Runs a batch in one immediate transaction, each job in its own savepoint.
fn run_batch(conn: &Connection, label: &str, batch: &mut [Box<dyn Job>]) -> Result<(), Failure> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let mut run = || {
        // Read after the lock is held, so the time is not stale by a lock wait.
        let now = now_ms()?;
        for job in batch.iter_mut() {
            conn.execute_batch("SAVEPOINT job")?;
            let keep = job.run(conn, now, label);
            if conn.is_autocommit() {
                // SQLite rolled the whole transaction back (e.g. disk full): a later
                // savepoint would silently start a new one, so stop here.
                return Err(Failure::Store(StoreError::unavailable_message(
                    "SQLite rolled the transaction back",
                )));
            }
            if !keep {
                conn.execute_batch("ROLLBACK TO job")?;
            }
            conn.execute_batch("RELEASE job")?;
        }
        conn.execute_batch("COMMIT")?;
        Ok(())
    };
    let result = run();
    if result.is_err() && !conn.is_autocommit() {
        // Best effort: the error that matters is `result`'s.
        let _ = conn.execute_batch("ROLLBACK");
    }
    result
}

impl SqliteStore {
    /// Opens (creating if needed) the store in the SQLite file at `path`, creating or
    /// checking its schema. Several processes may open the same file, at the same time.
    ///
    /// Fails with [`StoreError::Unavailable`] naming the path if the file cannot be
    /// opened (e.g. its directory does not exist), stays locked by another process for
    /// more than 5 seconds, cannot use WAL journaling, or has a newer schema version.
    pub async fn open(path: impl AsRef<Path>) -> StoreResult<SqliteStore> {
        let path = path.as_ref().to_path_buf();
        let label = path.display().to_string();
        let (path, label, writer) = {
            let joined = tokio::task::spawn_blocking(move || {
                let mut conn = connect(&path, &label, true)?;
                retry_busy(|| migrate(&mut conn, &label))
                    .map_err(|f| contextualize(&label, "open (schema)", f))?;
                Ok::<_, StoreError>((path, label, conn))
            })
            .await;
            match joined {
                Ok(opened) => opened?,
                Err(e) => {
                    return Err(StoreError::unavailable(
                        "SQLite store: opening failed in its worker thread",
                        e,
                    ))
                }
            }
        };
        let (jobs, queue) = mpsc::channel();
        let thread_label = label.clone();
        std::thread::Builder::new()
            .name("tool-contracts-sqlite-writer".to_owned())
            .spawn(move || write_loop(&writer, &thread_label, &queue))
            .map_err(|e| {
                StoreError::unavailable(
                    format!("SQLite store {label}: cannot start its writer thread"),
                    e,
                )
            })?;
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                path,
                label,
                jobs,
                readers: Mutex::new(Vec::new()),
                reader_permits: Arc::new(tokio::sync::Semaphore::new(MAX_READERS)),
                wakers: (0..WAKE_SHARDS).map(|_| Notify::new()).collect(),
                hasher: RandomState::new(),
                purge: super::purge::PurgeSchedule::new(),
            }),
        })
    }

    /// How often expired records are purged without anyone calling
    /// [`purge_expired`](Store::purge_expired): the first new claim after the interval
    /// starts a purge in a task of its own (default
    /// [`DEFAULT_PURGE_INTERVAL`](super::DEFAULT_PURGE_INTERVAL); `None` turns it off).
    pub fn set_purge_interval(&self, interval: Option<Duration>) {
        self.inner.purge.set_interval(interval);
    }

    /// The file this store lives in.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Runs `f` on the writer thread inside a `BEGIN IMMEDIATE` transaction (shared with
    /// other queued writes, in its own savepoint); its changes are kept if it returns `Ok`.
    /// Answers once the transaction is committed.
    async fn write<T, F>(&self, op: &'static str, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, i64) -> Result<T, Failure> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let task = Task {
            op,
            f: Some(f),
            outcome: None,
            reply,
        };
        let stopped = || {
            StoreError::unavailable_message(format!(
                "SQLite store {}: {op}: the writer thread has stopped",
                self.inner.label
            ))
        };
        self.inner
            .jobs
            .send(Box::new(task))
            .map_err(|_| stopped())?;
        answer.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// Runs `f` on a pooled read-only connection, on the blocking pool.
    async fn read<T, F>(&self, op: &'static str, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, i64) -> Result<T, Failure> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        // Held by the blocking task, like the writer's guard. The semaphore is never
        // closed, so acquiring cannot fail; if it somehow did, the read goes ahead anyway.
        let permit = Arc::clone(&inner.reader_permits).acquire_owned().await.ok();
        let joined = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let pooled = lock(&inner.readers).pop();
            let conn = match pooled {
                Some(conn) => conn,
                None => connect(&inner.path, &inner.label, false)?,
            };
            let out = now_ms()
                .and_then(|now| f(&conn, now))
                .map_err(|failure| contextualize(&inner.label, op, failure));
            lock(&inner.readers).push(conn);
            out
        })
        .await;
        self.joined(op, joined)
    }

    fn joined<T>(
        &self,
        op: &str,
        joined: Result<Result<T, StoreError>, tokio::task::JoinError>,
    ) -> StoreResult<T> {
        joined.unwrap_or_else(|e| {
            Err(StoreError::unavailable(
                format!(
                    "SQLite store {}: {op}: worker thread failed",
                    self.inner.label
                ),
                e,
            ))
        })
    }

    /// A holder's change: `change(conn, key, token, now)` runs the statement fenced by
    /// `key = ?1 AND token = ?2 AND state = 'in_progress'` and answers the holder's worker
    /// (`RETURNING worker`), or `None` if `token` does not hold the key
    /// ([`StoreError::LeaseLost`]). The change is logged as `kind` under that worker, and
    /// this process's waiters on the key are woken.
    async fn fenced<F>(
        &self,
        op: &'static str,
        key: &str,
        token: u64,
        kind: HistoryKind,
        change: F,
    ) -> Result<(), StoreError>
    where
        F: FnOnce(&Connection, &str, i64, i64) -> Result<Option<String>, Failure> + Send + 'static,
    {
        // Tokens are stored as SQLite integers: one beyond i64 was never issued.
        let Ok(sql_tok) = i64::try_from(token) else {
            return Err(StoreError::LeaseLost { token });
        };
        let owned_key = key.to_owned();
        self.write(op, move |conn, now| {
            let worker =
                change(conn, &owned_key, sql_tok, now)?.ok_or(StoreError::LeaseLost { token })?;
            log(conn, &owned_key, now, kind, token, &worker)
        })
        .await?;
        self.wake(key);
        Ok(())
    }

    fn wake(&self, key: &str) {
        self.waker(key).notify_waiters();
    }

    fn waker(&self, key: &str) -> &Notify {
        let index = (self.inner.hasher.hash_one(key) as usize) % WAKE_SHARDS;
        &self.inner.wakers[index]
    }
}

/// A poisoned pool only means a thread panicked while pushing or popping a connection;
/// the vector itself is still valid.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn claim(&self, req: ClaimRequest<'_>) -> StoreResult<ClaimOutcome> {
        // A replay or a duplicate of a running call changes nothing: answer it from a
        // reader, in parallel with other readers, without taking the write lock.
        let key = req.key.to_owned();
        let seen = self
            .read("claim", move |conn, now| match select_row(conn, &key)? {
                Some(row) if !row.is_expired_result(now) => row.outcome(now).map(Some),
                _ => Ok(None),
            })
            .await?;
        if let Some(outcome) = seen {
            return Ok(outcome);
        }
        // The key looked free: decide again under the write lock.
        let req = OwnedClaim::from(req);
        let outcome = self
            .write("claim", move |conn, now| {
                match select_row(conn, &req.key)? {
                    Some(row) if !row.is_expired_result(now) => row.outcome(now),
                    _ => req.insert(conn, now, now, HistoryKind::Claimed),
                }
            })
            .await;
        // The table grows only here: purge what expired, once per interval, beside us.
        super::purge::purge_if_due(&self.inner.purge, "sqlite", || SqliteStore {
            inner: Arc::clone(&self.inner),
        });
        outcome
    }

    async fn takeover(&self, req: ClaimRequest<'_>, stale_token: u64) -> StoreResult<ClaimOutcome> {
        let req = OwnedClaim::from(req);
        let key = req.key.clone();
        let outcome = self
            .write("takeover", move |conn, now| {
                let created_ms = match select_row(conn, &req.key)? {
                    None => None,
                    Some(row) => {
                        let takeable = match row.state {
                            RowState::InProgress {
                                token,
                                lease_expires_ms,
                            } => token == stale_token && lease_expires_ms <= now,
                            RowState::Completed { .. } => row.expires_ms <= now,
                        };
                        if !takeable {
                            return row.outcome(now);
                        }
                        Some(row.created_ms)
                    }
                };
                match created_ms {
                    Some(created) => req.insert(conn, now, created, HistoryKind::TakenOver),
                    None => req.insert(conn, now, now, HistoryKind::Claimed),
                }
            })
            .await?;
        if matches!(outcome, ClaimOutcome::Acquired { .. }) {
            self.wake(&key);
        }
        Ok(outcome)
    }

    async fn complete(&self, key: &str, token: u64, completion: Completion<'_>) -> StoreResult {
        let result = completion.result.to_owned();
        let is_error = completion.is_error;
        let ttl_ms = millis(completion.ttl);
        self.fenced(
            "complete",
            key,
            token,
            HistoryKind::Completed,
            move |conn, key, sql_tok, now| {
                Ok(conn
                    .prepare_cached(
                        "UPDATE records SET state = 'completed', result = ?3, is_error = ?4, \
                         completed_ms = ?5, updated_ms = ?5, expires_ms = ?6, \
                         lease_expires_ms = NULL \
                         WHERE key = ?1 AND state = 'in_progress' AND token = ?2 \
                         RETURNING worker",
                    )?
                    .query_row(
                        rusqlite::params![
                            key,
                            sql_tok,
                            result,
                            is_error,
                            now,
                            now.saturating_add(ttl_ms)
                        ],
                        |row| row.get(0),
                    )
                    .optional()?)
            },
        )
        .await
    }

    async fn release(&self, key: &str, token: u64) -> StoreResult {
        self.fenced(
            "release",
            key,
            token,
            HistoryKind::Released,
            |conn, key, sql_tok, _now| {
                let worker = conn
                    .prepare_cached(
                        "DELETE FROM records WHERE key = ?1 AND state = 'in_progress' \
                         AND token = ?2 RETURNING worker",
                    )?
                    .query_row(rusqlite::params![key, sql_tok], |row| row.get(0))
                    .optional()?;
                if worker.is_some() {
                    mark_released(conn, key)?;
                }
                Ok(worker)
            },
        )
        .await
    }

    async fn renew(&self, key: &str, token: u64, lease: Duration) -> StoreResult {
        let Ok(sql_tok) = i64::try_from(token) else {
            return Err(StoreError::LeaseLost { token });
        };
        let owned_key = key.to_owned();
        let lease_ms = millis(lease);
        self.write("renew", move |conn, now| {
            let until = now.saturating_add(lease_ms);
            let changed = conn
                .prepare_cached(
                    "UPDATE records SET lease_expires_ms = ?3, expires_ms = MAX(expires_ms, ?3) \
                     WHERE key = ?1 AND state = 'in_progress' AND token = ?2 \
                     AND lease_expires_ms > ?4",
                )?
                .execute(rusqlite::params![owned_key, sql_tok, until, now])?;
            if changed == 0 {
                return Err(StoreError::LeaseLost { token }.into());
            }
            Ok(())
        })
        .await
    }

    async fn abandon(&self, key: &str, token: u64) -> StoreResult {
        self.fenced(
            "abandon",
            key,
            token,
            HistoryKind::Abandoned,
            |conn, key, sql_tok, now| {
                Ok(conn
                    .prepare_cached(
                        "UPDATE records SET lease_expires_ms = ?3, updated_ms = ?3 \
                         WHERE key = ?1 AND state = 'in_progress' AND token = ?2 \
                         RETURNING worker",
                    )?
                    .query_row(rusqlite::params![key, sql_tok, now], |row| row.get(0))
                    .optional()?)
            },
        )
        .await
    }

    async fn lookup(&self, key: &str) -> StoreResult<Option<Record>> {
        let key = key.to_owned();
        self.read("lookup", move |conn, _now| {
            select_row(conn, &key)?.map(Row::into_record).transpose()
        })
        .await
    }

    /// The record and the clock of the same read (this machine's, as for every operation).
    async fn observe(&self, key: &str) -> StoreResult<Option<Observed>> {
        let key = key.to_owned();
        self.read("observe", move |conn, now| {
            let Some(row) = select_row(conn, &key)? else {
                return Ok(None);
            };
            let now = to_system(now, "clock reading", &key)?;
            Ok(Some(Observed::new(row.into_record()?, now)))
        })
        .await
    }

    async fn pending(&self, limit: usize) -> StoreResult<Vec<Record>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read("pending", move |conn, _now| {
            let mut stmt = conn.prepare_cached(SELECT_PENDING)?;
            let raws = stmt.query_map([limit], |row| {
                // The key first, so a bad row can be named.
                let key = row.get::<_, String>(0).unwrap_or_default();
                Ok((key, RawRow::read(row)))
            })?;
            let mut records = Vec::new();
            for raw in raws {
                let (key, raw) = raw?;
                let raw = raw.map_err(|e| row_error(&key, e))?;
                records.push(raw.check()?.into_record()?);
            }
            Ok(records)
        })
        .await
    }

    async fn resolve(&self, request: ResolveRequest<'_>) -> StoreResult {
        enum Decision {
            Complete { result: String, ttl_ms: i64 },
            Release,
        }
        let decision = match request.resolution {
            Resolution::Complete { result, ttl } => Decision::Complete {
                result: result.to_owned(),
                ttl_ms: millis(ttl),
            },
            Resolution::Release => Decision::Release,
        };
        let owned_key = request.key.to_owned();
        let (kind, worker) = (request.kind, request.worker.to_owned());
        self.write("resolve", move |conn, now| {
            let pending = matches!(
                select_row(conn, &owned_key)?,
                Some(Row {
                    state: RowState::InProgress { .. },
                    ..
                })
            );
            if !pending {
                return Err(StoreError::NotPending.into());
            }
            // A new token fences out the holder and identifies the decision in history.
            let token = next_token(conn)?;
            match decision {
                Decision::Complete { result, ttl_ms } => {
                    conn.prepare_cached(
                        "UPDATE records SET state = 'completed', token = ?2, result = ?3, \
                         is_error = 0, completed_ms = ?4, updated_ms = ?4, expires_ms = ?5, \
                         lease_expires_ms = NULL WHERE key = ?1",
                    )?
                    .execute(rusqlite::params![
                        owned_key,
                        sql_token(token)?,
                        result,
                        now,
                        now.saturating_add(ttl_ms)
                    ])?;
                }
                Decision::Release => {
                    conn.prepare_cached("DELETE FROM records WHERE key = ?1")?
                        .execute([&owned_key])?;
                    mark_released(conn, &owned_key)?;
                }
            }
            log(conn, &owned_key, now, kind, token, &worker)
        })
        .await?;
        self.wake(request.key);
        Ok(())
    }

    async fn history(&self, key: &str) -> StoreResult<Vec<HistoryEvent>> {
        let key = key.to_owned();
        self.read("history", move |conn, _now| {
            let mut stmt = conn.prepare_cached(
                "SELECT at_ms, kind, token, worker FROM history WHERE key = ?1 ORDER BY id",
            )?;
            let rows = stmt.query_map([&key], |row| {
                Ok((
                    row.get::<_, i64>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, i64>(2)?,
                    row.get::<_, String>(3)?,
                ))
            })?;
            let mut events = Vec::new();
            for row in rows {
                let (at_ms, kind, token, worker) = row?;
                let kind = HistoryKind::parse(&kind).ok_or_else(|| {
                    Failure::Corrupt(format!("history of {key:?} has an unknown kind {kind:?}"))
                })?;
                events.push(HistoryEvent {
                    at: to_system(at_ms, "history time", &key)?,
                    kind,
                    token: to_token(token, &key)?,
                    worker,
                });
            }
            Ok(events)
        })
        .await
    }

    async fn purge_expired(&self) -> StoreResult<u64> {
        let purged = self
            .write("purge_expired", |conn, now| {
                // Each step walks an index (expires_ms, the history key index, the small
                // `released` table); none scans `records` or `history`.
                conn.prepare_cached(
                    "DELETE FROM history WHERE key IN \
                     (SELECT key FROM records WHERE expires_ms <= ?1)",
                )?
                .execute([now])?;
                let purged = conn
                    .prepare_cached("DELETE FROM records WHERE expires_ms <= ?1")?
                    .execute([now])?;
                // Released keys keep their history until now, unless claimed again since.
                conn.prepare_cached(
                    "DELETE FROM history WHERE key IN (SELECT released.key FROM released \
                     WHERE NOT EXISTS (SELECT 1 FROM records WHERE records.key = released.key))",
                )?
                .execute([])?;
                conn.prepare_cached("DELETE FROM released")?.execute([])?;
                Ok(u64::try_from(purged).unwrap_or(u64::MAX))
            })
            .await?;
        if purged > 0 {
            // Purged claims free their keys: wake every local waiter to look again.
            for waker in self.inner.wakers.iter() {
                waker.notify_waiters();
            }
        }
        Ok(purged)
    }

    async fn wait(&self, key: &str, timeout: Duration) {
        // Woken at once by a change made through this store; changes made by other
        // processes are seen at the next poll.
        let _ = tokio::time::timeout(timeout.min(POLL), self.waker(key).notified()).await;
    }
}

fn mark_released(conn: &Connection, key: &str) -> Result<(), Failure> {
    conn.prepare_cached("INSERT OR IGNORE INTO released (key) VALUES (?1)")?
        .execute([key])?;
    Ok(())
}
