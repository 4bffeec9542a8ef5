//! A PostgreSQL store: the shared store for a fleet of workers.
//!
//! # Guarantees
//!
//! Every operation is one SQL statement (one round trip, its own transaction), so each
//! is atomic, and concurrent operations on one key serialize on its row lock and unique
//! index. A claim is a single statement that either inserts the key, takes over an expired
//! result (or, for [`Store::takeover`], the exact stale claim), or reads back who holds
//! it. (A claim first runs a cheaper statement that only inserts an absent key; only if
//! that finds an expired result does it run the one that reclaims it.) Completing,
//! releasing, renewing and abandoning are single statements fenced by
//! `key = $1 AND token = $2 AND state = 'in_progress'`, so a worker whose lease was taken
//! over can change nothing. Fencing tokens come from one store-wide `SEQUENCE`, so a
//! token is never reused for a key, even after a release or a purge. Leases and expiry use
//! the server's clock (`clock_timestamp()`), never the worker's.
//!
//! # Durability
//!
//! A state change is durable once its statement returns: it is a committed transaction,
//! as durable as the server's `fsync`/`synchronous_commit` settings make it. With
//! asynchronous replication a failover can lose the latest commits (a stored result could
//! vanish and its call run again); use synchronous replication where that matters.
//!
//! # Schema
//!
//! Tables live in the connection's `search_path` (or in the schema chosen with
//! [`PostgresStoreBuilder::schema`]) and are named with a prefix (default
//! `tool_contracts_`, see [`PostgresStoreBuilder::table_prefix`]):
//!
//! - `<prefix>records`: one row per key (`key` is the primary key): who claimed it,
//!   `state` (`in_progress` or `completed`), the holder's `token` and `lease_expires_at`,
//!   the stored `result`, `created_at` and `expires_at`, and the record's own history
//!   events as four parallel arrays (`ev_at`, `ev_kind`, `ev_token`, `ev_worker`), so a
//!   claim or a completion writes one row. Indexed, partially, on `expires_at WHERE
//!   state = 'completed'` (purge) and `key WHERE state = 'in_progress'` (pending, sorted
//!   by `created_at` after the index scan, and purge of expired claims). Since version 3
//!   also `version` (the tool contract's) and `updated_at` (the last state change), both
//!   `NULL` in rows an older build wrote.
//! - `<prefix>history`: the events of released keys (moved there, in order, by the
//!   release that deletes the record), primary key `(key, id)`; each event keeps the
//!   record's `expires_at` of its time (indexed), so the history of a released key is
//!   purged once that time passed and no live record holds the key.
//!   [`Store::history`] lists these, then the live record's events.
//! - `<prefix>token_seq`: the fencing-token sequence.
//! - `<prefix>schema_version`: the version of these tables, for later migrations.
//!
//! [`PostgresStore::connect`] creates or migrates the tables itself, in a transaction
//! guarded by an advisory lock, so any number of processes may connect at once.
//!
//! Needs PostgreSQL 12 or later (`WITH ... AS MATERIALIZED`).
//!
//! Waiting duplicates poll (the trait's default [`Store::wait`]): LISTEN/NOTIFY would
//! need a dedicated connection per process and takes a database-wide lock at every
//! notifying commit, which would slow every completion down.

use core::fmt;
use core::time::Duration;
use std::error::Error as StdError;
use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row, Statement};

use super::{
    ClaimOutcome, ClaimRequest, Completion, HistoryEvent, HistoryKind, Observed, Record,
    RecordState, Resolution, ResolveRequest, Store, StoreError, StoreResult,
};

/// The table-name prefix used unless [`PostgresStoreBuilder::table_prefix`] says otherwise.
const DEFAULT_TABLE_PREFIX: &str = "tool_contracts_";

/// The pool size unless [`PostgresStoreBuilder::max_connections`] says otherwise: enough
/// commits in flight for the server to group them at high concurrency, few enough that
/// three busy processes fit in a default server (`max_connections = 100`).
const DEFAULT_MAX_CONNECTIONS: usize = 32;

/// Longest accepted prefix: PostgreSQL truncates identifiers at 63 bytes, and the longest
/// name built from the prefix (`<prefix>history_expires_at_idx`) adds 22.
const MAX_PREFIX_LEN: usize = 40;

/// Longest accepted schema name (PostgreSQL's identifier limit).
const MAX_SCHEMA_LEN: usize = 63;

/// Durations are capped at 1000 years before they reach SQL, so `Duration::MAX` ("keep
/// forever") cannot overflow PostgreSQL's timestamp range.
const MAX_MICROS: i64 = 1000 * 366 * 24 * 3600 * 1_000_000;

/// How often a claim is retried when its snapshot raced a concurrent writer (see
/// [`PostgresStore::claim_or_takeover`]); each retry sees a newer snapshot, so more than
/// one or two retries means the key is being rewritten continuously.
const CLAIM_ATTEMPTS: usize = 8;

/// Every connecting process takes this advisory lock while it creates or migrates tables:
/// `CREATE ... IF NOT EXISTS` alone races (two creators both pass the check).
const MIGRATION_LOCK: &str = "tool_contracts.store.migrate";

/// The columns of a record row, in the order every statement returns them.
const RECORD_COLUMNS: &str = "key, tool, scope, fingerprint, args, worker, state, token, \
     lease_expires_at, result, is_error, completed_at, created_at, expires_at, version, \
     updated_at";

/// A store in a PostgreSQL (12+) database, shared by every worker that connects to it.
///
/// Every operation is one statement and one round trip; leases and expiry follow the
/// server's clock; fencing tokens come from one sequence. The store creates its own
/// tables on [`connect`](Self::connect) (`tool_contracts_records`, `..._history`, ...;
/// another prefix or schema with [`builder`](Self::builder)). Share it behind an `Arc`:
/// it holds a connection pool (deadpool-postgres, at most 32 connections unless
/// [`max_connections`](PostgresStoreBuilder::max_connections) says otherwise, each
/// caching its prepared statements).
///
/// ```no_run
/// # async fn demo() -> Result<(), tool_contracts_runtime::store::StoreError> {
/// use tool_contracts_runtime::store::PostgresStore;
///
/// let store = PostgresStore::builder("postgres://app@db.internal/app")
///     .schema("agents")
///     .max_connections(32)
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
pub struct PostgresStore {
    pool: Pool,
    sql: Arc<Sql>,
    operation_timeout: Duration,
    /// `"schema".prefix` or `prefix`, for `Debug`.
    name: String,
    /// When the next new claim purges expired records in the background.
    purge: Arc<super::purge::PurgeSchedule>,
}

/// Options for [`PostgresStore`]: where its tables live, pool size and timeouts. Made
/// by [`PostgresStore::builder`].
#[derive(Clone)]
pub struct PostgresStoreBuilder {
    url: String,
    schema: Option<String>,
    prefix: String,
    max_connections: Option<usize>,
    connect_timeout: Option<Duration>,
    operation_timeout: Duration,
}

/// The URL is left out: it may hold a password.
impl fmt::Debug for PostgresStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStoreBuilder")
            .field("schema", &self.schema)
            .field("prefix", &self.prefix)
            .field("max_connections", &self.max_connections)
            .field("connect_timeout", &self.connect_timeout)
            .field("operation_timeout", &self.operation_timeout)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = self.pool.status();
        f.debug_struct("PostgresStore")
            .field("tables", &self.name)
            .field("connections", &status.size)
            .field("max_connections", &status.max_size)
            .finish_non_exhaustive()
    }
}

impl PostgresStoreBuilder {
    /// Creates the tables in this schema (created if missing) instead of the first schema
    /// of the connection's `search_path`. Lowercase ASCII letters, digits and `_`.
    pub fn schema(mut self, schema: &str) -> Self {
        self.schema = Some(schema.to_owned());
        self
    }

    /// Names the tables `<prefix>records`, `<prefix>history`, ... (default
    /// `tool_contracts_`), so several stores, or test runs, can share a database
    /// without seeing each other. Lowercase ASCII letters, digits and `_`, at most 40.
    pub fn table_prefix(mut self, prefix: &str) -> Self {
        self.prefix = prefix.to_owned();
        self
    }

    /// The most connections the pool opens (default 32).
    ///
    /// Connections are opened lazily, one per operation in flight, so a process opens
    /// this many only under that much concurrency. More connections let the server group
    /// more commits into one WAL flush (a first call is two commits); keep the sum over
    /// every process of the fleet below the server's `max_connections`.
    pub fn max_connections(mut self, max: usize) -> Self {
        self.max_connections = Some(max.max(1));
        self
    }

    /// How long opening one connection may take before the store answers
    /// [`StoreError::Unavailable`] (default: the URL's `connect_timeout`, else 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// How long one store operation (waiting for a connection included) may take before
    /// it answers [`StoreError::Unavailable`] (default 30 s). A statement cut off this way
    /// may still commit: a claim then stays held until its lease runs out (abandoned),
    /// which is the fail-closed outcome.
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// Opens the pool, then creates or migrates the store's tables.
    ///
    /// Fails with [`StoreError::Unavailable`] if the URL or a name is invalid, the server
    /// cannot be reached, or its tables are from a newer version of this library.
    pub async fn connect(self) -> StoreResult<PostgresStore> {
        let schema = match &self.schema {
            Some(schema) => Some(identifier("schema", schema, MAX_SCHEMA_LEN)?),
            None => None,
        };
        let prefix = identifier("table prefix", &self.prefix, MAX_PREFIX_LEN)?;
        let mut config: tokio_postgres::Config = self
            .url
            .parse()
            .map_err(|e| unavailable("parsing the connection URL", e))?;
        let connect_timeout = match (self.connect_timeout, config.get_connect_timeout()) {
            (Some(timeout), _) => timeout,
            (None, Some(timeout)) => *timeout,
            (None, None) => Duration::from_secs(5),
        };
        config.connect_timeout(connect_timeout);
        if config.get_application_name().is_none() {
            config.application_name("tool-contracts");
        }
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .runtime(Runtime::Tokio1)
            .create_timeout(Some(connect_timeout))
            .recycle_timeout(Some(connect_timeout))
            .max_size(self.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS))
            .build()
            .map_err(|e| unavailable("building the connection pool", e))?;
        let names = Names::new(schema, prefix);
        let store = PostgresStore {
            pool,
            sql: Arc::new(Sql::new(&names)),
            operation_timeout: self.operation_timeout,
            name: names.display(),
            purge: Arc::new(super::purge::PurgeSchedule::new()),
        };
        store
            .timed("migrating the schema", store.migrate(&names))
            .await?;
        Ok(store)
    }
}

/// Checks a name spliced into SQL: identifiers cannot be bind parameters, so only a
/// plain lowercase identifier is accepted (it then needs no quoting rules).
fn identifier(what: &str, name: &str, max_len: usize) -> StoreResult<String> {
    let mut chars = name.chars();
    let starts_well = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if starts_well && rest_ok && name.len() <= max_len {
        Ok(name.to_owned())
    } else {
        Err(StoreError::unavailable_message(format!(
            "postgres: invalid {what} {name:?}: use at most {max_len} lowercase ASCII \
             letters, digits and `_`, not starting with a digit"
        )))
    }
}

/// `<prefix><name>`, quoted, in `schema` if there is one: a table, sequence or index name.
fn qualify(schema: Option<&str>, prefix: &str, name: &str) -> String {
    match schema {
        Some(schema) => format!("\"{schema}\".\"{prefix}{name}\""),
        None => format!("\"{prefix}{name}\""),
    }
}

/// The store's qualified object names.
struct Names {
    schema: Option<String>,
    prefix: String,
    records: String,
    history: String,
    token_seq: String,
    version: String,
}

impl Names {
    fn new(schema: Option<String>, prefix: String) -> Self {
        let q = |name: &str| qualify(schema.as_deref(), &prefix, name);
        Names {
            records: q("records"),
            history: q("history"),
            token_seq: q("token_seq"),
            version: q("schema_version"),
            schema,
            prefix,
        }
    }

    fn display(&self) -> String {
        match &self.schema {
            Some(schema) => format!("{schema}.{}", self.prefix),
            None => self.prefix.clone(),
        }
    }

    /// The migrations, in order: the tables are at version `n` once the first `n` ran.
    /// Append new ones; never edit a released one.
    fn migrations(&self) -> Vec<String> {
        let Names {
            schema,
            prefix,
            records,
            history,
            token_seq,
            ..
        } = self;
        let old_expires_idx = qualify(schema.as_deref(), prefix, "records_expires_at_idx");
        let old_pending_idx = qualify(schema.as_deref(), prefix, "records_pending_idx");
        // No CHECK on `state`: readers validate every row and answer
        // `StoreError::Corrupt`, and a later version may add states.
        vec![
            format!(
                "CREATE SEQUENCE IF NOT EXISTS {token_seq} AS bigint;
             CREATE TABLE IF NOT EXISTS {records} (
                 key text PRIMARY KEY,
                 tool text NOT NULL,
                 scope text,
                 fingerprint text NOT NULL,
                 args text NOT NULL,
                 worker text NOT NULL,
                 state text NOT NULL,
                 token bigint NOT NULL,
                 lease_expires_at timestamptz,
                 result text,
                 is_error boolean NOT NULL DEFAULT false,
                 completed_at timestamptz,
                 created_at timestamptz NOT NULL,
                 expires_at timestamptz NOT NULL
             );
             CREATE INDEX IF NOT EXISTS \"{prefix}records_expires_at_idx\"
                 ON {records} (expires_at);
             CREATE INDEX IF NOT EXISTS \"{prefix}records_pending_idx\"
                 ON {records} (created_at, key) WHERE state = 'in_progress';
             CREATE TABLE IF NOT EXISTS {history} (
                 key text NOT NULL,
                 id bigint GENERATED ALWAYS AS IDENTITY,
                 at timestamptz NOT NULL,
                 kind text NOT NULL,
                 token bigint NOT NULL,
                 worker text NOT NULL,
                 expires_at timestamptz NOT NULL,
                 PRIMARY KEY (key, id)
             );
             CREATE INDEX IF NOT EXISTS \"{prefix}history_expires_at_idx\"
                 ON {history} (expires_at);"
            ),
            // Version 2: a live record carries its own events (four parallel arrays), so
            // a claim or a completion writes one row instead of two; the history table
            // keeps the events of released keys (and those written before version 2).
            // Purge finds expired results through a partial index, so a claim updates
            // one index fewer (expired claims are found through the pending index). The
            // pending index is keyed by `key`: keyed by `created_at` the planner used it
            // for the fenced updates' `key = $1`, a scan of every pending entry, and all
            // claims appended to its rightmost page.
            format!(
                "ALTER TABLE {records}
                     ADD COLUMN IF NOT EXISTS ev_at timestamptz[] NOT NULL DEFAULT '{{}}',
                     ADD COLUMN IF NOT EXISTS ev_kind text[] NOT NULL DEFAULT '{{}}',
                     ADD COLUMN IF NOT EXISTS ev_token bigint[] NOT NULL DEFAULT '{{}}',
                     ADD COLUMN IF NOT EXISTS ev_worker text[] NOT NULL DEFAULT '{{}}';
                 CREATE INDEX IF NOT EXISTS \"{prefix}records_purge_idx\"
                     ON {records} (expires_at) WHERE state = 'completed';
                 CREATE INDEX IF NOT EXISTS \"{prefix}records_inflight_idx\"
                     ON {records} (key) WHERE state = 'in_progress';
                 DROP INDEX IF EXISTS {old_expires_idx};
                 DROP INDEX IF EXISTS {old_pending_idx};"
            ),
            // Version 3: what the operation view shows and version 2 did not keep: the
            // tool contract's version and the time of the last state change. Nullable
            // without a default, so adding them rewrites no row; rows written before read
            // as "not kept" (`updated_at` falls back to the completion or creation time).
            format!(
                "ALTER TABLE {records}
                     ADD COLUMN IF NOT EXISTS version bigint,
                     ADD COLUMN IF NOT EXISTS updated_at timestamptz;"
            ),
        ]
    }
}

/// The store's statements, built once: deadpool caches each connection's prepared
/// statement by its text.
struct Sql {
    claim_fast: String,
    claim: String,
    takeover: String,
    complete: String,
    release: String,
    renew: String,
    abandon: String,
    lookup: String,
    observe: String,
    pending: String,
    resolve_complete: String,
    resolve_release: String,
    history: String,
    purge: String,
}

impl Sql {
    fn new(names: &Names) -> Self {
        let Names {
            records,
            history,
            token_seq,
            ..
        } = names;
        let us = "* interval '1 microsecond'";
        let returning = RECORD_COLUMNS
            .split(", ")
            .map(|c| format!("r.{c}"))
            .collect::<Vec<_>>()
            .join(", ");
        // Parameters: $1 key, $2 tool, $3 scope, $4 fingerprint, $5 args, $6 worker,
        // $7 lease (µs), $8 record lifetime (µs), $9 the contract's version, $10 stale
        // token (takeover only).
        //
        // `cur` is the key's row in this statement's snapshot. `tok` draws the new token
        // only when `cur` says the claim can win: the key is absent, its result expired
        // (or, for a takeover, it is the stale claim), so replays and live duplicates write
        // nothing at all. `upd` reclaims an expired result (`tk` takes over the stale
        // claim); `ins` inserts an absent key (DO NOTHING: no row lock). Each logs its
        // event in the row it writes. `won` holds the new claim, if any; otherwise the
        // answer is `cur`. If a concurrent writer committed after the snapshot was taken,
        // `cur` can be missing or out of date: the caller detects that and runs the
        // statement again (see `claim_or_takeover`).
        let log = |kind: &str, token: &str, worker: &str| {
            format!(
                "ev_at = r.ev_at || c.now, ev_kind = r.ev_kind || '{kind}'::text,
                 ev_token = r.ev_token || {token}, ev_worker = r.ev_worker || {worker}"
            )
        };
        // A new claim's row, with its `claimed` event; `c` is the clock and `t.tok` the
        // token (the two claim statements draw it differently).
        let insert_claim = format!(
            "INSERT INTO {records} AS r (key, tool, scope, fingerprint, args, worker,
                 state, token, lease_expires_at, is_error, created_at, expires_at,
                 version, updated_at, ev_at, ev_kind, ev_token, ev_worker)
             SELECT $1::text, $2::text, $3::text, $4::text, $5::text, $6::text,
                 'in_progress', t.tok,
                 c.now + $7::bigint {us}, false, c.now, c.now + $8::bigint {us},
                 $9::bigint, c.now,
                 ARRAY[c.now], ARRAY['claimed'::text], ARRAY[t.tok], ARRAY[$6::text]"
        );
        let claim = |takeover: bool| {
            let (tk, tk_won, tk_gate) = if takeover {
                (
                    format!(
                        "tk AS (
                             UPDATE {records} AS r SET tool = $2, scope = $3,
                                 fingerprint = $4, args = $5, worker = $6,
                                 state = 'in_progress', token = t.tok,
                                 lease_expires_at = c.now + $7::bigint {us},
                                 result = NULL, is_error = false, completed_at = NULL,
                                 expires_at = c.now + $8::bigint {us},
                                 version = $9::bigint, updated_at = c.now,
                                 {}
                             FROM clock c, tok t
                             WHERE r.key = $1 AND r.state = 'in_progress'
                                 AND r.token = $10::bigint AND r.lease_expires_at <= c.now
                             RETURNING {returning}
                         ),",
                        log("taken_over", "t.tok", "$6::text")
                    ),
                    "SELECT * FROM tk UNION ALL ",
                    " OR (k.state = 'in_progress' AND k.token = $10::bigint
                          AND k.lease_expires_at <= c.now)",
                )
            } else {
                (String::new(), "", "")
            };
            format!(
                "WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS now),
                 cur AS MATERIALIZED (SELECT {RECORD_COLUMNS} FROM {records} WHERE key = $1),
                 tok AS MATERIALIZED (
                     SELECT nextval('{token_seq}') AS tok FROM clock c
                     WHERE NOT EXISTS (SELECT 1 FROM cur) OR EXISTS (
                         SELECT 1 FROM cur k
                         WHERE (k.state = 'completed' AND k.expires_at <= c.now){tk_gate}
                     )
                 ),
                 {tk}
                 upd AS (
                     UPDATE {records} AS r SET tool = $2, scope = $3, fingerprint = $4,
                         args = $5, worker = $6, state = 'in_progress', token = t.tok,
                         lease_expires_at = c.now + $7::bigint {us},
                         result = NULL, is_error = false, completed_at = NULL,
                         created_at = c.now, expires_at = c.now + $8::bigint {us},
                         version = $9::bigint, updated_at = c.now,
                         {upd_log}
                     FROM clock c, tok t
                     WHERE r.key = $1 AND r.state = 'completed' AND r.expires_at <= c.now
                     RETURNING {returning}
                 ),
                 ins AS (
                     {insert_claim}
                     FROM clock c, tok t
                     WHERE NOT EXISTS (SELECT 1 FROM cur)
                     ON CONFLICT (key) DO NOTHING
                     RETURNING {returning}
                 ),
                 won AS MATERIALIZED (
                     {tk_won}SELECT * FROM upd UNION ALL SELECT * FROM ins
                 )
                 SELECT true AS acquired, {RECORD_COLUMNS}, c.now AS now
                 FROM won, clock c
                 UNION ALL
                 SELECT false, {RECORD_COLUMNS}, c.now
                 FROM cur, clock c
                 WHERE NOT EXISTS (SELECT 1 FROM won)",
                upd_log = log("claimed", "t.tok", "$6::text"),
            )
        };
        // The common claim, same parameters and answer as `claim` but only inserting an
        // absent key: no `upd` and fewer CTEs, so a first call costs the server about a
        // fifth less. The token is drawn only if the key is absent in the snapshot (the
        // gate is a one-time filter above `nextval`). When the answer is an expired
        // result, the caller runs `claim`, which can reclaim it.
        let claim_fast = format!(
            "WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS now),
             ins AS (
                 {insert_claim}
                 FROM clock c, (SELECT nextval('{token_seq}') AS tok) t
                 WHERE NOT EXISTS (SELECT 1 FROM {records} WHERE key = $1)
                 ON CONFLICT (key) DO NOTHING
                 RETURNING {returning}
             )
             SELECT true AS acquired, {RECORD_COLUMNS}, c.now AS now
             FROM ins, clock c
             UNION ALL
             SELECT false, {RECORD_COLUMNS}, c.now
             FROM {records}, clock c
             WHERE key = $1 AND NOT EXISTS (SELECT 1 FROM ins)"
        );
        // The fenced updates: only the current holder's token matches, and only while the
        // key is in progress. Each logs its event in the row it changes.
        let fenced_event = |kind: &str, set: &str| {
            format!(
                "UPDATE {records} AS r SET {set}, {}
                 FROM (SELECT clock_timestamp() AS now) c
                 WHERE r.key = $1 AND r.token = $2 AND r.state = 'in_progress'",
                log(kind, "r.token", "r.worker")
            )
        };
        // A released record's events move to the history table, followed by `$kind`.
        let move_history = |gone: &str, kind: &str, token: &str, worker: &str| {
            format!(
                "INSERT INTO {history} (key, at, kind, token, worker, expires_at)
                 SELECT key, at, kind, token, worker, expires_at FROM (
                     SELECT g.key, e.at, e.kind, e.token, e.worker, g.expires_at,
                         0 AS src, e.ord
                     FROM {gone} g, unnest(g.ev_at, g.ev_kind, g.ev_token, g.ev_worker)
                         WITH ORDINALITY AS e (at, kind, token, worker, ord)
                     UNION ALL
                     SELECT g.key, clock_timestamp(), {kind}, {token}, {worker},
                         g.expires_at, 1, 0
                     FROM {gone} g
                 ) moved
                 ORDER BY src, ord"
            )
        };
        let gone_columns = "key, token, worker, expires_at, ev_at, ev_kind, ev_token, ev_worker";
        Sql {
            claim_fast,
            claim: claim(false),
            takeover: claim(true),
            // $3 result, $4 is_error, $5 ttl (µs).
            complete: fenced_event(
                "completed",
                &format!(
                    "state = 'completed', result = $3, is_error = $4, completed_at = c.now,
                     updated_at = c.now, lease_expires_at = NULL,
                     expires_at = c.now + $5::bigint {us}"
                ),
            ),
            abandon: fenced_event("abandoned", "lease_expires_at = c.now, updated_at = c.now"),
            release: format!(
                "WITH gone AS (
                     DELETE FROM {records}
                     WHERE key = $1 AND token = $2 AND state = 'in_progress'
                     RETURNING {gone_columns}
                 )
                 {}",
                move_history("gone", "'released'", "g.token", "g.worker")
            ),
            // $3 lease (µs). A lease that already ran out cannot be renewed.
            renew: format!(
                "UPDATE {records} AS r
                 SET lease_expires_at = c.now + $3::bigint {us},
                     expires_at = greatest(r.expires_at, c.now + $3::bigint {us})
                 FROM (SELECT clock_timestamp() AS now) c
                 WHERE r.key = $1 AND r.token = $2 AND r.state = 'in_progress'
                     AND r.lease_expires_at > c.now"
            ),
            lookup: format!("SELECT {RECORD_COLUMNS} FROM {records} WHERE key = $1"),
            // The record and the server's clock, in one statement.
            observe: format!(
                "SELECT {RECORD_COLUMNS}, clock_timestamp() AS now FROM {records} WHERE key = $1"
            ),
            pending: format!(
                "SELECT {RECORD_COLUMNS} FROM {records}
                 WHERE state = 'in_progress'
                 ORDER BY created_at, key
                 LIMIT $1"
            ),
            // $2 result, $3 ttl (µs), $4 kind, $5 worker. A new token fences the holder.
            resolve_complete: format!(
                "UPDATE {records} AS r SET state = 'completed', result = $2,
                     is_error = false, completed_at = c.now, updated_at = c.now,
                     lease_expires_at = NULL, token = t.tok,
                     expires_at = c.now + $3::bigint {us},
                     ev_at = r.ev_at || c.now, ev_kind = r.ev_kind || $4::text,
                     ev_token = r.ev_token || t.tok, ev_worker = r.ev_worker || $5::text
                 FROM (SELECT clock_timestamp() AS now) c,
                     (SELECT nextval('{token_seq}') AS tok) t
                 WHERE r.key = $1 AND r.state = 'in_progress'"
            ),
            // $2 kind, $3 worker.
            resolve_release: format!(
                "WITH gone AS (
                     DELETE FROM {records} WHERE key = $1 AND state = 'in_progress'
                     RETURNING {gone_columns}
                 )
                 {}",
                move_history(
                    "gone",
                    "$2::text",
                    &format!("nextval('{token_seq}')"),
                    "$3::text"
                )
            ),
            // The events of released keys (and those logged before schema version 2),
            // then the live record's own.
            history: format!(
                "SELECT at, kind, token, worker FROM (
                     SELECT at, kind, token, worker, 0 AS src, id AS ord
                     FROM {history} WHERE key = $1
                     UNION ALL
                     SELECT e.at, e.kind, e.token, e.worker, 1, e.ord
                     FROM {records} r,
                         unnest(r.ev_at, r.ev_kind, r.ev_token, r.ev_worker)
                             WITH ORDINALITY AS e (at, kind, token, worker, ord)
                     WHERE r.key = $1
                 ) events
                 ORDER BY src, ord"
            ),
            // Deletes expired records with their history, and the history of keys that
            // have no live record (released keys) once its own expiry passed. Expired
            // results are found through the purge index, expired claims through the
            // pending one (a `BitmapOr` of the two partial indexes).
            purge: format!(
                "WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS now),
                 gone AS (
                     DELETE FROM {records} AS r
                     WHERE (r.state = 'completed'
                             AND r.expires_at <= (SELECT now FROM clock))
                         OR (r.state = 'in_progress'
                             AND r.expires_at <= (SELECT now FROM clock))
                     RETURNING r.key
                 ),
                 gone_history AS (
                     DELETE FROM {history} AS h WHERE h.key IN (SELECT key FROM gone)
                 ),
                 orphans AS (
                     DELETE FROM {history} AS h USING clock c
                     WHERE h.expires_at <= c.now
                         AND NOT EXISTS (SELECT 1 FROM gone g WHERE g.key = h.key)
                         AND NOT EXISTS (
                             SELECT 1 FROM {records} r
                             WHERE r.key = h.key AND r.expires_at > c.now
                         )
                 )
                 SELECT count(*) AS purged FROM gone"
            ),
        }
    }
}

impl PostgresStore {
    /// How often expired records are purged without anyone calling
    /// [`purge_expired`](Store::purge_expired): the first new claim after the interval
    /// starts a purge in a task of its own (default
    /// [`DEFAULT_PURGE_INTERVAL`](super::DEFAULT_PURGE_INTERVAL); `None` turns it off).
    /// Every process purges on its own schedule; the statement is idempotent.
    pub fn set_purge_interval(&self, interval: Option<Duration>) {
        self.purge.set_interval(interval);
    }

    /// Connects to `url` (a `postgres://` URL or a `key=value` connection string) with
    /// the default options, creating or migrating the store's tables.
    ///
    /// Fails with [`StoreError::Unavailable`] if the server cannot be reached within the
    /// connect timeout (5 s unless the URL sets `connect_timeout`).
    pub async fn connect(url: &str) -> StoreResult<PostgresStore> {
        Self::builder(url).connect().await
    }

    /// Options for a store at `url`: table prefix, schema, pool size, timeouts.
    pub fn builder(url: &str) -> PostgresStoreBuilder {
        PostgresStoreBuilder {
            url: url.to_owned(),
            schema: None,
            prefix: DEFAULT_TABLE_PREFIX.to_owned(),
            max_connections: None,
            connect_timeout: None,
            operation_timeout: Duration::from_secs(30),
        }
    }

    /// Creates the tables, or brings them to the current version, under a transaction-
    /// scoped advisory lock: concurrent connects wait for each other instead of racing on
    /// `CREATE ... IF NOT EXISTS`. Tables already current need neither the lock nor any
    /// DDL, so a role without `CREATE` privileges can connect once they exist.
    async fn migrate(&self, names: &Names) -> StoreResult {
        let step = |what: &'static str| move |e: tokio_postgres::Error| unavailable(what, e);
        let migrations = names.migrations();
        let latest = i32::try_from(migrations.len()).unwrap_or(i32::MAX);
        let mut client = self.client().await?;
        if schema_version(&**client, names).await? == latest {
            return Ok(());
        }
        let tx = client
            .transaction()
            .await
            .map_err(step("starting the migration"))?;
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
            &[&MIGRATION_LOCK],
        )
        .await
        .map_err(step("taking the migration lock"))?;
        let version_table = &names.version;
        let mut setup = String::new();
        if let Some(schema) = &names.schema {
            let exists = tx
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
                    &[schema],
                )
                .await
                .map_err(step("looking up the schema"))?;
            if !get::<bool>(&exists, "exists")? {
                setup.push_str(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\";"));
            }
        }
        setup.push_str(&format!(
            "CREATE TABLE IF NOT EXISTS {version_table} (
                 singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
                 version integer NOT NULL
             );"
        ));
        tx.batch_execute(&setup)
            .await
            .map_err(step("creating the schema-version table"))?;
        // Read again under the lock: another process may have migrated meanwhile.
        let current = schema_version(&*tx, names).await?;
        if current > latest {
            return Err(StoreError::unavailable_message(format!(
                "postgres: the tables `{}*` are at schema version {current}, newer than \
                 this version of tool-contracts understands ({latest}); upgrade it",
                names.display()
            )));
        }
        for migration in migrations
            .iter()
            .skip(usize::try_from(current).unwrap_or(0))
        {
            tx.batch_execute(migration)
                .await
                .map_err(step("migrating the tables"))?;
        }
        if current < latest {
            tx.execute(
                &format!(
                    "INSERT INTO {version_table} (singleton, version) VALUES (true, $1)
                     ON CONFLICT (singleton) DO UPDATE SET version = EXCLUDED.version"
                ),
                &[&latest],
            )
            .await
            .map_err(step("recording the schema version"))?;
        }
        tx.commit().await.map_err(step("committing the migration"))
    }

    async fn client(&self) -> StoreResult<Object> {
        self.pool
            .get()
            .await
            .map_err(|e| unavailable("getting a connection", e))
    }

    /// Runs `op`, answering [`StoreError::Unavailable`] if it takes longer than the
    /// operation timeout.
    async fn timed<T>(
        &self,
        what: &str,
        op: impl Future<Output = Result<T, StoreError>>,
    ) -> StoreResult<T> {
        match tokio::time::timeout(self.operation_timeout, op).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::unavailable_message(format!(
                "postgres {what}: no answer within {:?}",
                self.operation_timeout
            ))),
        }
    }

    /// A pooled connection with `sql` prepared on it (and cached there, by its text).
    async fn prepared(&self, what: &str, sql: &str) -> StoreResult<(Object, Statement)> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(sql)
            .await
            .map_err(|e| unavailable(what, e))?;
        Ok((client, statement))
    }

    /// Runs one prepared statement and returns its rows.
    async fn query(
        &self,
        what: &str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> StoreResult<Vec<Row>> {
        self.timed(what, async {
            let (client, statement) = self.prepared(what, sql).await?;
            let rows = client.query(&statement, params).await;
            rows.map_err(|e| unavailable(what, e))
        })
        .await
    }

    /// Runs one prepared statement and returns how many rows it changed.
    async fn execute(
        &self,
        what: &str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> StoreResult<u64> {
        self.timed(what, async {
            let (client, statement) = self.prepared(what, sql).await?;
            let changed = client.execute(&statement, params).await;
            changed.map_err(|e| unavailable(what, e))
        })
        .await
    }

    /// Runs a fenced statement: one changed row means `token` held the key.
    async fn fenced(
        &self,
        what: &str,
        sql: &str,
        key: &str,
        token: u64,
        extra: &[&(dyn ToSql + Sync)],
    ) -> StoreResult {
        // Tokens come from a bigint sequence: one beyond i64 was never issued.
        let Ok(db_token) = i64::try_from(token) else {
            return Err(StoreError::LeaseLost { token });
        };
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&key, &db_token];
        params.extend_from_slice(extra);
        match self.execute(what, sql, &params).await? {
            0 => Err(StoreError::LeaseLost { token }),
            _ => Ok(()),
        }
    }

    /// Claims `req.key`, or with `stale` also takes over the claim held under that token
    /// if its lease ran out.
    ///
    /// The statement answers from its snapshot when it wins nothing. A writer that
    /// committed after the snapshot was taken can make that answer wrong in two ways:
    /// no row (a concurrent first claim we then conflicted with), or a row this statement
    /// would have taken (an expired result or the stale claim, already taken by someone
    /// else). Both mean "look again": the retry runs with a newer snapshot.
    async fn claim_or_takeover(
        &self,
        req: ClaimRequest<'_>,
        stale: Option<u64>,
    ) -> StoreResult<ClaimOutcome> {
        let what = match stale {
            Some(_) => "takeover",
            None => "claim",
        };
        // A plain claim starts with the fast statement, which cannot reclaim an expired
        // result; it switches to the full one once it sees such a result.
        let mut full = false;
        let lease = micros(req.lease);
        let lifetime = micros(req.ttl.max(req.lease));
        // A stale token beyond i64 was never issued, so nothing can be taken over with it.
        let db_stale: Option<i64> = stale.and_then(|t| i64::try_from(t).ok());
        let version = i64::from(req.version);
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![
            &req.key,
            &req.tool,
            &req.scope,
            &req.fingerprint,
            &req.args,
            &req.worker,
            &lease,
            &lifetime,
            &version,
        ];
        if stale.is_some() {
            params.push(&db_stale);
        }
        for attempt in 0..CLAIM_ATTEMPTS {
            if attempt > 0 {
                tracing::debug!(
                    key = req.key,
                    attempt,
                    "postgres {what} raced a writer; retrying"
                );
            }
            let sql = match (stale, full) {
                (Some(_), _) => &self.sql.takeover,
                (None, true) => &self.sql.claim,
                (None, false) => &self.sql.claim_fast,
            };
            let rows = self.query(what, sql, &params).await?;
            let Some(row) = rows.first() else {
                continue;
            };
            let acquired: bool = get(row, "acquired")?;
            if acquired {
                return Ok(ClaimOutcome::Acquired {
                    token: token(row, "token")?,
                });
            }
            let now: SystemTime = get(row, "now")?;
            let record = record(row)?;
            match record.state {
                RecordState::Completed { .. } if record.expires_at <= now => {
                    full = true;
                    continue;
                }
                RecordState::Completed { .. } => {
                    return Ok(ClaimOutcome::Completed(std::sync::Arc::new(record)))
                }
                RecordState::InProgress {
                    token,
                    lease_expires_at,
                } => {
                    if lease_expires_at > now {
                        return Ok(ClaimOutcome::InProgress {
                            fingerprint: record.fingerprint,
                            lease_remaining: lease_expires_at
                                .duration_since(now)
                                .unwrap_or(Duration::ZERO),
                        });
                    }
                    if stale == Some(token) {
                        continue;
                    }
                    return Ok(ClaimOutcome::Abandoned {
                        token,
                        fingerprint: record.fingerprint,
                    });
                }
            }
        }
        Err(StoreError::unavailable_message(format!(
            "postgres {what}: key {:?} kept changing under {CLAIM_ATTEMPTS} attempts",
            req.key
        )))
    }
}

/// The version the store's tables are at: 0 if they do not exist yet.
async fn schema_version(
    client: &impl tokio_postgres::GenericClient,
    names: &Names,
) -> StoreResult<i32> {
    let table = &names.version;
    let exists = client
        .query_one("SELECT to_regclass($1) IS NOT NULL AS exists", &[table])
        .await
        .map_err(|e| unavailable("looking up the schema-version table", e))?;
    if !get::<bool>(&exists, "exists")? {
        return Ok(0);
    }
    let row = client
        .query_opt(&format!("SELECT version FROM {table}"), &[])
        .await
        .map_err(|e| unavailable("reading the schema version", e))?;
    match row {
        Some(row) => get(&row, "version"),
        None => Ok(0),
    }
}

/// A duration as whole microseconds for SQL, capped at [`MAX_MICROS`].
fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).map_or(MAX_MICROS, |us| us.min(MAX_MICROS))
}

/// The server or the pool failed while the store was doing `what`; `err` is kept as the
/// cause (its message, server's included, is part of the error's).
fn unavailable(what: &str, err: impl StdError + Send + Sync + 'static) -> StoreError {
    StoreError::unavailable(format!("postgres {what}"), err)
}

fn corrupt(what: &str, err: &(dyn StdError + 'static)) -> StoreError {
    StoreError::Corrupt(format!("postgres: {what}: {}", super::describe(err)))
}

/// Reads a column, answering [`StoreError::Corrupt`] if it is missing or mistyped.
fn get<'a, T: tokio_postgres::types::FromSql<'a>>(row: &'a Row, column: &str) -> StoreResult<T> {
    row.try_get(column)
        .map_err(|e| corrupt(&format!("column `{column}`"), &e))
}

/// Reads a fencing token: issued by the sequence, so never negative.
fn token(row: &Row, column: &str) -> StoreResult<u64> {
    let raw: i64 = get(row, column)?;
    u64::try_from(raw)
        .map_err(|_| StoreError::Corrupt(format!("postgres: negative fencing token {raw}")))
}

/// Reads a record row (the columns of [`RECORD_COLUMNS`]), checking that its state is
/// known and has the fields that state needs.
fn record(row: &Row) -> StoreResult<Record> {
    let key: String = get(row, "key")?;
    let state: String = get(row, "state")?;
    let missing = |column: &str| {
        StoreError::Corrupt(format!(
            "postgres: record {key:?} is {state} but has no {column}"
        ))
    };
    let record_state = match state.as_str() {
        "in_progress" => RecordState::InProgress {
            token: token(row, "token")?,
            lease_expires_at: get::<Option<SystemTime>>(row, "lease_expires_at")?
                .ok_or_else(|| missing("lease_expires_at"))?,
        },
        "completed" => RecordState::Completed {
            result: get::<Option<String>>(row, "result")?.ok_or_else(|| missing("result"))?,
            is_error: get(row, "is_error")?,
            completed_at: get::<Option<SystemTime>>(row, "completed_at")?
                .ok_or_else(|| missing("completed_at"))?,
        },
        other => {
            return Err(StoreError::Corrupt(format!(
                "postgres: record {key:?} has unknown state {other:?}"
            )))
        }
    };
    let version = match get::<Option<i64>>(row, "version")? {
        Some(v) => Some(u32::try_from(v).map_err(|_| {
            StoreError::Corrupt(format!(
                "postgres: record {key:?} has an invalid version {v}"
            ))
        })?),
        None => None,
    };
    let created_at: SystemTime = get(row, "created_at")?;
    // Rows written before schema version 3: their last known change.
    let updated_at = match (get::<Option<SystemTime>>(row, "updated_at")?, &record_state) {
        (Some(at), _) => at,
        (None, RecordState::Completed { completed_at, .. }) => *completed_at,
        (None, RecordState::InProgress { .. }) => created_at,
    };
    Ok(Record {
        tool: get(row, "tool")?,
        version,
        scope: get(row, "scope")?,
        fingerprint: get(row, "fingerprint")?,
        args: get(row, "args")?,
        state: record_state,
        created_at,
        updated_at,
        expires_at: get(row, "expires_at")?,
        key,
    })
}

#[async_trait::async_trait]
impl Store for PostgresStore {
    fn backend(&self) -> &'static str {
        "postgresql"
    }

    async fn claim(&self, req: ClaimRequest<'_>) -> StoreResult<ClaimOutcome> {
        let outcome = self.claim_or_takeover(req, None).await;
        // The tables grow only by claims: purge what expired, once per interval, beside us.
        if matches!(outcome, Ok(ClaimOutcome::Acquired { .. })) {
            super::purge::purge_if_due(&self.purge, "postgres", || PostgresStore {
                pool: self.pool.clone(),
                sql: Arc::clone(&self.sql),
                operation_timeout: self.operation_timeout,
                name: self.name.clone(),
                purge: Arc::clone(&self.purge),
            });
        }
        outcome
    }

    async fn takeover(&self, req: ClaimRequest<'_>, stale_token: u64) -> StoreResult<ClaimOutcome> {
        self.claim_or_takeover(req, Some(stale_token)).await
    }

    async fn complete(&self, key: &str, token: u64, completion: Completion<'_>) -> StoreResult {
        let ttl = micros(completion.ttl);
        let extra: [&(dyn ToSql + Sync); 3] = [&completion.result, &completion.is_error, &ttl];
        self.fenced("complete", &self.sql.complete, key, token, &extra)
            .await
    }

    async fn release(&self, key: &str, token: u64) -> StoreResult {
        self.fenced("release", &self.sql.release, key, token, &[])
            .await
    }

    async fn renew(&self, key: &str, token: u64, lease: Duration) -> StoreResult {
        let lease = micros(lease);
        self.fenced("renew", &self.sql.renew, key, token, &[&lease])
            .await
    }

    async fn abandon(&self, key: &str, token: u64) -> StoreResult {
        self.fenced("abandon", &self.sql.abandon, key, token, &[])
            .await
    }

    async fn lookup(&self, key: &str) -> StoreResult<Option<Record>> {
        let rows = self.query("lookup", &self.sql.lookup, &[&key]).await?;
        rows.first().map(record).transpose()
    }

    /// The record and the server's clock (`clock_timestamp()`), read by one statement.
    async fn observe(&self, key: &str) -> StoreResult<Option<Observed>> {
        let rows = self.query("observe", &self.sql.observe, &[&key]).await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        Ok(Some(Observed::new(record(row)?, get(row, "now")?)))
    }

    async fn pending(&self, limit: usize) -> StoreResult<Vec<Record>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self.query("pending", &self.sql.pending, &[&limit]).await?;
        rows.iter().map(record).collect()
    }

    async fn resolve(&self, request: ResolveRequest<'_>) -> StoreResult {
        let (key, kind, worker) = (request.key, request.kind.as_str(), request.worker);
        let changed = match request.resolution {
            Resolution::Complete { result, ttl } => {
                let ttl = micros(ttl);
                self.execute(
                    "resolve",
                    &self.sql.resolve_complete,
                    &[&key, &result, &ttl, &kind, &worker],
                )
                .await?
            }
            Resolution::Release => {
                self.execute(
                    "resolve",
                    &self.sql.resolve_release,
                    &[&key, &kind, &worker],
                )
                .await?
            }
        };
        match changed {
            0 => Err(StoreError::NotPending),
            _ => Ok(()),
        }
    }

    async fn history(&self, key: &str) -> StoreResult<Vec<HistoryEvent>> {
        let rows = self.query("history", &self.sql.history, &[&key]).await?;
        rows.iter()
            .map(|row| {
                let kind: String = get(row, "kind")?;
                Ok(HistoryEvent {
                    at: get(row, "at")?,
                    kind: HistoryKind::parse(&kind).ok_or_else(|| {
                        StoreError::Corrupt(format!(
                            "postgres: history of {key:?} has unknown event kind {kind:?}"
                        ))
                    })?,
                    token: token(row, "token")?,
                    worker: get(row, "worker")?,
                })
            })
            .collect()
    }

    async fn purge_expired(&self) -> StoreResult<u64> {
        let rows = self.query("purge", &self.sql.purge, &[]).await?;
        let purged: i64 = match rows.first() {
            Some(row) => get(row, "purged")?,
            None => 0,
        };
        u64::try_from(purged)
            .map_err(|_| StoreError::Corrupt(format!("postgres: purge counted {purged} rows")))
    }
}
