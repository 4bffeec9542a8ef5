//! A Redis store: claims and results shared by a fleet of workers.
//!
//! # Guarantees
//!
//! Every state change is ONE Lua script run with `EVALSHA` (the `redis` crate loads it
//! again after a `NOSCRIPT`), so it is atomic with respect to every other operation and
//! costs one round trip: a first call is one claim and one completion, a replay one claim.
//! Scripts read the clock with `redis.call('TIME')`, so leases and expiry follow the
//! server's clock and a worker with a skewed clock cannot steal another's lease.
//! Fencing tokens come from a counter key (`INCR`): one for the store, or one per bucket
//! on Redis Cluster (below); either way never reused for any key even after a release or
//! purge.
//!
//! # Durability
//!
//! What Redis gives: with `appendonly yes` and `appendfsync always` a claim survives a
//! crash of the server; with the defaults (RDB snapshots or `appendfsync everysec`) the
//! last second or more of claims and results can be lost, and a lost claim lets a retry
//! run the tool again. Replication to a replica is asynchronous: a failover can lose
//! acknowledged writes (`WAIT` is not used). Run the server with
//! `maxmemory-policy noeviction`: an evicting policy may drop live records (they carry a
//! TTL), which again lets a retry run twice. Fencing tokens are unique only while the
//! counter key survives: a `FLUSHDB` or a failover that loses it restarts them. On a
//! cluster all of this holds per primary (the store checks every primary's `appendonly`).
//!
//! # Keys
//!
//! With the prefix `{prefix}` (default `tc:`; give each tenant or test run its own), on
//! one server (on Redis Cluster, see below):
//!
//! | key | type | what |
//! | --- | --- | --- |
//! | `{prefix}r:{key}` | hash | the record of one idempotency key (fields below) |
//! | `{prefix}h:{key}` | list | its history, one `kind\|token\|at_ms\|worker` entry per event, oldest first |
//! | `{prefix}pending` | sorted set | keys of in-progress records, scored by creation time (ms) |
//! | `{prefix}expiry` | sorted set | keys of records, scored by expiry time (ms), read by the purge |
//! | `{prefix}token` | string | the store-wide fencing token counter (never expires) |
//!
//! So the record of `order-42` is the hash `tc:r:order-42`. Idempotency keys are stored as
//! their UTF-8 bytes; Redis keys are binary-safe, so any key works, and the `r:`/`h:`
//! namespaces keep a key named `pending` or `token` from meeting the indexes.
//!
//! Record fields: `st` (`p` in progress, `c` completed), `tok` (fencing token), `lease`
//! (ms, in progress only), `tool`, `ver` (the tool contract's version), `scope` (absent
//! for no scope), `fp`, `args`, `worker`, `created`, `upd` (the last state change),
//! `expires` (ms), and once completed `result`, `err` (`0`/`1`), `done` (ms). Records an
//! older build wrote have no `ver` and no `upd` (read as "not kept").
//! Times are milliseconds since the Unix epoch by the server's clock. A hash with a
//! missing or malformed field is answered with [`StoreError::Corrupt`].
//!
//! # Expiry
//!
//! Each record carries a Redis TTL (`PEXPIREAT` its `expires`), so Redis itself deletes
//! expired records; the history list expires with (never before) its record. This differs
//! from [`MemoryStore`](super::MemoryStore) in one way: an expired record is gone at once
//! rather than at the next purge, so [`lookup`](Store::lookup) no longer returns it and an
//! abandoned claim past its record's expiry is free. See
//! [`purge_expired`](RedisStore#method.purge_expired) for what a purge still does.
//!
//! # Redis Cluster
//!
//! Connect with a `redis+cluster://HOST:PORT,HOST:PORT` URL or
//! [`RedisStore::cluster_builder`] (any nodes of the cluster; the rest are discovered).
//! Requires Redis 7.0 or later. A cluster runs a script only if all its keys are in one
//! hash slot, so the keys above are spread over 256 **buckets**, each a namespace of its
//! own whose name ends in a hash tag:
//!
//! | key | what |
//! | --- | --- |
//! | `{prefix}{TAG}r:{key}`, `{prefix}{TAG}h:{key}` | the record and history of a key in the bucket |
//! | `{prefix}{TAG}pending`, `{prefix}{TAG}expiry` | the bucket's two indexes |
//! | `{prefix}{TAG}token` | the bucket's fencing token counter |
//!
//! A key's bucket is the first byte of the SHA-256 of the key; bucket `b`'s `TAG` is a
//! decimal whose slot is `64 * b`, so the 256 buckets sit evenly over the 16384 slots and
//! an even split of the slots between primaries is an even split of the keys. Every
//! script's keys (a record, its history, its bucket's indexes and counter) share one slot:
//! each operation is still one script on one primary. The prefix cannot hold a `{`.
//!
//! - **Fencing counter: per bucket.** A key always falls in the same bucket, so its
//!   tokens strictly increase and are never reused for it; two keys of different buckets
//!   can be handed the same number. Fencing compares a token only with the token of the
//!   same key, so that is all it needs.
//! - **Listing and purge read every bucket**: [`pending`](Store::pending) runs one script
//!   per bucket (each returns at most `limit` records; the lists are merged by creation
//!   time) and [`purge_expired`](RedisStore#method.purge_expired) two or more per bucket,
//!   up to 32 scripts in flight at a time. So a listing or purge costs 256 (512) small
//!   scripts even when nothing is pending or due: a few milliseconds, once per recovery
//!   pass or purge interval, never on a call's path. The per-bucket indexes keep both
//!   proportional to the pending and expired keys, not to every key (a `SCAN` per node
//!   would read them all).
//! - **Clocks**: a script reads `TIME` on the primary of its key's slot, so a key's lease
//!   is judged by one node's clock until its slot moves (resharding, failover). Keep the
//!   nodes' clocks in step (NTP) to well within the shortest lease: a new primary whose
//!   clock runs ahead ends the leases it inherits early by the difference.
//! - **Redirections**: the cluster client follows `MOVED` and `ASK` and re-sends after a
//!   `TRYAGAIN` or a dropped connection, up to `reconnect_attempts` times. A re-sent
//!   script whose first send was applied changes nothing twice: a repeated claim or
//!   takeover finds its own claim and answers *in progress* (the call waits for the
//!   lease, then finds it abandoned: nothing runs twice), a repeated completion or release
//!   answers `LeaseLost` (the first one stood), a repeated resolution `NotPending`.
//! - **Slot migration**: while a slot moves, a script whose keys are split between the
//!   two nodes gets `TRYAGAIN`, and after the retries the operation fails with
//!   [`StoreError::Unavailable`] (the call fails closed). A listing or sweep that runs on
//!   the importing node sees the records not yet moved as absent; it keeps their index
//!   entries while their expiry lies ahead.
//! - **From one server to a cluster**: the names differ, and nothing is migrated. A store
//!   moved to a cluster starts empty: records made on the single server (results still
//!   to be replayed, claims in flight) are not seen there.
//!
//! On one server the keys carry no hash tag. Use a standalone server or a primary with
//! replicas behind Sentinel (through a URL that names the current primary) with Redis 5.0
//! or later (scripts that read `TIME` before writing rely on effect replication).

mod connection;
mod keys;

use core::time::Duration;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use futures::stream::{self, StreamExt, TryStreamExt};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::{FromRedisValue, IntoConnectionInfo, RedisError, Script, Value};

use self::connection::Conn;
use self::keys::{Layout, Namespace};

use super::{
    ClaimOutcome, ClaimRequest, Completion, HistoryEvent, HistoryKind, Observed, Record,
    RecordState, Resolution, ResolveRequest, Store, StoreError, StoreResult,
};

/// The default key prefix.
const DEFAULT_PREFIX: &str = "tc:";

/// The longest lease or TTL sent to Redis: about 100 years. Longer durations are clamped,
/// so `now + duration` stays an exact integer in Lua's doubles (below 2^53 ms).
const MAX_DURATION_MS: u64 = 100 * 365 * 24 * 60 * 60 * 1000;
// Any time until the year 2100 (4.2e12 ms) plus the longest duration stays below 2^53.
const _: () = assert!(4_200_000_000_000 + MAX_DURATION_MS < 1 << 53);

/// How many index entries one purge script handles, so one call never blocks the server
/// for long; `purge_expired` runs it until the work is done.
const PURGE_BATCH: usize = 500;

/// How many per-bucket scripts `pending` and `purge_expired` keep in flight at once on a
/// cluster (each bucket is one script, or a few for a large purge).
const FAN_OUT: usize = 32;

/// The error code the scripts use for a malformed record.
const CORRUPT_CODE: &str = "TC_CORRUPT";

/// Helpers shared by every script. Kept to plain Lua 5.1 and commands of Redis 5.0.
const PRELUDE: &str = r#"
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function fmt(n) return string.format('%d', n) end
-- A decimal of at most 15 digits (exact in Lua's doubles), else nil.
local function uint(v)
  if type(v) == 'string' and #v <= 15 and string.find(v, '^%d+$') then return tonumber(v) end
  return nil
end
local function corrupt(field)
  return redis.error_reply('TC_CORRUPT field `' .. field .. '` is missing or malformed')
end
-- The record at rk (from `values`, its fields if already read): nil if absent; nil and an
-- error reply if its `st` or `expires` is malformed. `r.values` holds the fields a reader
-- needs, in the order of the Rust `RECORD_FIELDS` (false where absent). `HMGET` of those
-- fields rather than `HGETALL`: Redis turns each element of a reply into a Lua value at a
-- cost, and fifteen values cost the server less than some thirty names and values
-- (bench/redis_claim_time.sh).
local function read_record(rk, values)
  local v = values or redis.call('HMGET', rk, 'st', 'tok', 'fp', 'worker', 'created', 'expires', 'lease', 'tool', 'ver', 'scope', 'args', 'result', 'err', 'done', 'upd')
  local st = v[1]
  if not st then
    -- A hash without `st` (no field above, or only others) is malformed, not absent.
    if redis.call('EXISTS', rk) == 1 then return nil, corrupt('st') end
    return nil
  end
  if st ~= 'p' and st ~= 'c' then return nil, corrupt('st') end
  local expires = uint(v[6])
  if not expires then return nil, corrupt('expires') end
  return { values = v, st = st, expires = expires }
end
-- Checks the other fields the scripts decide on and sets them on r: nil if they hold,
-- else an error reply. The client checks the rest when it reads the record.
local function check(r)
  local v = r.values
  r.tok, r.fp, r.worker, r.created, r.lease = v[2], v[3], v[4], uint(v[5]), uint(v[7])
  if type(r.tok) ~= 'string' or #r.tok > 20 or not string.find(r.tok, '^[1-9]%d*$') then return corrupt('tok')
  elseif not r.created then return corrupt('created')
  elseif r.st == 'p' and not r.lease then return corrupt('lease')
  elseif type(r.fp) ~= 'string' then return corrupt('fp')
  elseif type(r.worker) ~= 'string' then return corrupt('worker') end
  return nil
end
-- read_record, then check.
local function read_checked(rk)
  local r, bad = read_record(rk)
  if r and not bad then bad = check(r) end
  if bad then return nil, bad end
  return r
end
-- Keeps the history at hk until at least keep_until (never shortens it).
local function keep(hk, keep_until, now)
  local pttl = redis.call('PTTL', hk)
  if pttl == -1 or (pttl >= 0 and now + pttl < keep_until) then
    redis.call('PEXPIREAT', hk, keep_until)
  end
end
local function log(hk, kind, tok, now, worker, keep_until)
  redis.call('RPUSH', hk, kind .. '|' .. tok .. '|' .. fmt(now) .. '|' .. worker)
  keep(hk, keep_until, now)
end
"#;

/// Shared by claim and takeover.
/// KEYS: 1 record, 2 history, 3 pending index, 4 expiry index, 5 token counter.
/// ARGV: 1 key, 2 tool, 3 has scope (`0`/`1`), 4 scope, 5 fingerprint, 6 args,
///       7 lease ms, 8 ttl ms, 9 worker, 10 contract version, 11 stale token (takeover
///       only).
const CLAIM_PRELUDE: &str = r#"
-- `present`: whether a record is there to replace (an expired result, a stale claim).
local function fresh(now, created, kind, present)
  local lease = tonumber(ARGV[7])
  local expires = now + math.max(tonumber(ARGV[8]), lease)
  local tok = fmt(redis.call('INCR', KEYS[5]))
  if present then redis.call('DEL', KEYS[1]) end
  redis.call('HSET', KEYS[1], 'st', 'p', 'tok', tok, 'lease', fmt(now + lease),
    'tool', ARGV[2], 'fp', ARGV[5], 'args', ARGV[6], 'worker', ARGV[9],
    'created', fmt(created), 'expires', fmt(expires), 'ver', ARGV[10], 'upd', fmt(now))
  if ARGV[3] == '1' then redis.call('HSET', KEYS[1], 'scope', ARGV[4]) end
  redis.call('PEXPIREAT', KEYS[1], expires)
  log(KEYS[2], kind, tok, now, ARGV[9], expires)
  redis.call('ZADD', KEYS[3], created, ARGV[1])
  redis.call('ZADD', KEYS[4], expires, ARGV[1])
  return { 'acquired', tok }
end
-- A completed record, answered as CLAIM_REPLAY answers it.
local function completed(r) return cmsgpack.pack(r.values) end
-- The answer for a record that stays (r checked).
local function existing(r, now)
  if r.st == 'c' then return completed(r) end
  if r.lease > now then return { 'in_progress', r.fp, fmt(r.lease - now) } end
  return { 'abandoned', r.tok, r.fp }
end
"#;

/// The start of the claim script, before [`PRELUDE`]: a replay answered before the
/// helpers are made (each is a closure made anew on every call). It reads the record with
/// the one `HMGET` of `read_record` and answers a completed, unexpired one with its values
/// alone, a bare string. Any other record goes on to [`CLAIM`] with `now` and `values`.
const CLAIM_REPLAY: &str = r#"
local now
do
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local values = redis.call('HMGET', KEYS[1], 'st', 'tok', 'fp', 'worker', 'created', 'expires', 'lease', 'tool', 'ver', 'scope', 'args', 'result', 'err', 'done', 'upd')
-- The reply is the values as ONE bulk string, a MessagePack array of strings (false where
-- absent) made by Redis's own C encoder (`cmsgpack`): the client parses one string much
-- faster than many bulk strings (the `redis` crate's reply parser costs more per element
-- than the rest of a replay), and a string costs the server less to send than an array
-- (bench/redis_claim_time.sh). Decided on `st` and `expires` alone: a malformed `expires`
-- that Lua still reads as a number is refused by the client, which checks every field it
-- reads (`parse_values`), so the server skips the other checks on the path most claims take.
local expires = tonumber(values[6])
if values[1] == 'c' and expires and expires > now then return cmsgpack.pack(values) end
"#;

/// The rest of the claim script, after [`CLAIM_REPLAY`] (`now`, `values`), [`PRELUDE`] and
/// [`CLAIM_PRELUDE`].
const CLAIM: &str = r#"
local r, bad = read_record(KEYS[1], values)
if bad then return bad end
if r then
  bad = check(r)
  if bad then return bad end
  -- An expired result counts as absent (Redis normally deleted it already).
  if not (r.st == 'c' and r.expires <= now) then return existing(r, now) end
end
return fresh(now, now, 'claimed', r ~= nil)
"#;

const TAKEOVER: &str = r#"
local now = now_ms()
local r, bad = read_checked(KEYS[1])
if bad then return bad end
if not r then return fresh(now, now, 'claimed', false) end
local expired_result = r.st == 'c' and r.expires <= now
local stale_claim = r.st == 'p' and r.lease <= now and r.tok == ARGV[11]
if not (expired_result or stale_claim) then return existing(r, now) end
-- The call is the same one, resumed: it keeps its place in the pending list.
return fresh(now, r.created, 'taken_over', true)
"#;

/// The start of every holder's script (complete, release, renew, abandon): the script
/// answers `lease_lost` unless the token ARGV[2] holds the key (an error reply if the
/// record is malformed); its body runs with the record `r` and the time `now`.
/// KEYS: 1 record, 2 history. ARGV: 1 key, 2 the holder's token.
const HOLDER_PRELUDE: &str = r#"
local now = now_ms()
local r, bad = read_checked(KEYS[1])
if bad then return bad end
if not r or r.st ~= 'p' or r.tok ~= ARGV[2] then return 'lease_lost' end
"#;

/// Shared by the scripts that settle an in-progress key, a holder's (complete, release)
/// or an operator's (resolve), so both settle it the same way.
/// KEYS: 1 record, 2 history, 3 pending index, 4 expiry index. ARGV: 1 key.
const SETTLE_PRELUDE: &str = r#"
-- Stores the result under token `tok`, kept until `expires`, and logs `kind` by `worker`.
local function complete_record(now, tok, result, err, expires, kind, worker)
  redis.call('HDEL', KEYS[1], 'lease')
  redis.call('HSET', KEYS[1], 'st', 'c', 'tok', tok, 'result', result, 'err', err,
    'done', fmt(now), 'upd', fmt(now), 'expires', fmt(expires))
  log(KEYS[2], kind, tok, now, worker, expires)
  redis.call('PEXPIREAT', KEYS[1], expires)
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('ZADD', KEYS[4], expires, ARGV[1])
end
-- Frees the key and logs `kind` by `worker` under token `tok`. The history outlives the
-- record: it expires when the record would have (`expires`).
local function release_record(now, tok, kind, worker, expires)
  redis.call('DEL', KEYS[1])
  log(KEYS[2], kind, tok, now, worker, expires)
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('ZREM', KEYS[4], ARGV[1])
end
"#;

/// KEYS: 1 record, 2 history, 3 pending index, 4 expiry index.
/// ARGV: 1 key, 2 token, 3 result, 4 is error (`0`/`1`), 5 ttl ms.
const COMPLETE: &str = r#"
complete_record(now, r.tok, ARGV[3], ARGV[4], now + tonumber(ARGV[5]), 'completed', r.worker)
return 'ok'
"#;

/// KEYS: 1 record, 2 history, 3 pending index, 4 expiry index. ARGV: 1 key, 2 token.
const RELEASE: &str = r#"
release_record(now, r.tok, 'released', r.worker, r.expires)
return 'ok'
"#;

/// KEYS: 1 record, 2 history, 3 expiry index. ARGV: 1 key, 2 token, 3 lease ms.
const RENEW: &str = r#"
if r.lease <= now then return 'lease_lost' end
local lease = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'lease', fmt(lease))
if r.expires < lease then
  redis.call('HSET', KEYS[1], 'expires', fmt(lease))
  redis.call('PEXPIREAT', KEYS[1], lease)
  redis.call('ZADD', KEYS[3], lease, ARGV[1])
  keep(KEYS[2], lease, now)
end
return 'ok'
"#;

/// KEYS: 1 record, 2 history. ARGV: 1 key, 2 token.
const ABANDON: &str = r#"
redis.call('HSET', KEYS[1], 'lease', fmt(now), 'upd', fmt(now))
log(KEYS[2], 'abandoned', r.tok, now, r.worker, r.expires)
return 'ok'
"#;

/// KEYS: 1 record, 2 history, 3 pending index, 4 expiry index, 5 token counter.
/// ARGV: 1 key, 2 history kind, 3 worker, 4 `complete` or `release`, 5 result, 6 ttl ms.
const RESOLVE: &str = r#"
local now = now_ms()
local r, bad = read_checked(KEYS[1])
if bad then return bad end
if not r or r.st ~= 'p' then return 'not_pending' end
-- A new token fences out the holder and names the decision in the history.
local tok = fmt(redis.call('INCR', KEYS[5]))
if ARGV[4] == 'complete' then
  complete_record(now, tok, ARGV[5], '0', now + tonumber(ARGV[6]), ARGV[2], ARGV[3])
else
  release_record(now, tok, ARGV[2], ARGV[3], r.expires)
end
return 'ok'
"#;

/// KEYS: 1 record. A script rather than a bare `HGETALL` so the reply has one shape
/// (a flat array) whatever protocol (RESP2 or RESP3) the connection speaks.
const LOOKUP: &str = r#"
return redis.call('HGETALL', KEYS[1])
"#;

/// KEYS: 1 record. The server's clock and the record, read by one script:
/// `{now_ms, fields}` (`fields` empty if there is no record).
const OBSERVE: &str = r#"
return { fmt(now_ms()), redis.call('HGETALL', KEYS[1]) }
"#;

/// Shared by the scripts that clean the pending index (listing, sweep).
/// KEYS: 1 pending index, 2 expiry index.
const INDEX_PRELUDE: &str = r#"
-- Whether key k, whose record is absent, is gone for good: its expiry index entry is
-- missing or due. Else the record is elsewhere for now: on Redis Cluster, a script sent to
-- the node importing a slot (after an `ASK`) sees the records not yet moved as absent.
-- Records removed early (`DEL`, eviction) leave their entries until the purge at expiry.
local function gone(k, now)
  local due = redis.call('ZSCORE', KEYS[2], k)
  return not due or tonumber(due) <= now
end
"#;

/// KEYS: 1 pending index, 2 expiry index. ARGV: 1 prefix, 2 limit.
/// Returns `{key, fields}` pairs, oldest first. Entries whose record is completed or gone
/// (see `gone`) are dropped from the index on the way; a malformed record is returned as
/// it is, for the client to report.
const PENDING: &str = r#"
local now = now_ms()
local limit = tonumber(ARGV[2])
local out, stale, start = {}, {}, 0
while #out < limit do
  local ks = redis.call('ZRANGE', KEYS[1], start, start + 255)
  if #ks == 0 then break end
  for _, k in ipairs(ks) do
    local flat = redis.call('HGETALL', ARGV[1] .. 'r:' .. k)
    local st
    for i = 1, #flat, 2 do if flat[i] == 'st' then st = flat[i + 1] end end
    if st == 'c' or (#flat == 0 and gone(k, now)) then
      stale[#stale + 1] = k
    elseif #flat > 0 and #out < limit then
      out[#out + 1] = { k, flat }
    end
  end
  start = start + #ks
end
for _, k in ipairs(stale) do redis.call('ZREM', KEYS[1], k) end
return out
"#;

/// KEYS: 1 expiry index, 2 pending index. ARGV: 1 prefix, 2 batch size.
/// Returns `{removed, examined}`: deletes records (and their history) whose expiry passed
/// and counts the ones Redis already deleted, each once, since its index entry goes too.
const PURGE: &str = r#"
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local removed = 0
for _, k in ipairs(due) do
  local rk = ARGV[1] .. 'r:' .. k
  local expires = uint(redis.call('HGET', rk, 'expires'))
  if expires and expires > now then
    -- The index lagged behind the record: move the entry, keep the record.
    redis.call('ZADD', KEYS[1], expires, k)
  else
    -- Gone already (Redis's TTL) or due by the index, which the scripts wrote together
    -- with the record's own expiry: either way the record is purged now.
    redis.call('DEL', rk, ARGV[1] .. 'h:' .. k)
    redis.call('ZREM', KEYS[1], k)
    redis.call('ZREM', KEYS[2], k)
    removed = removed + 1
  end
end
return { removed, #due }
"#;

/// KEYS: 1 pending index, 2 expiry index. ARGV: 1 prefix, 2 start rank, 3 batch size.
/// Returns `{examined, dropped}`: drops index entries whose record is completed or gone
/// (see `gone`).
const SWEEP_PENDING: &str = r#"
local now = now_ms()
local start = tonumber(ARGV[2])
local ks = redis.call('ZRANGE', KEYS[1], start, start + tonumber(ARGV[3]) - 1)
local dropped = 0
for _, k in ipairs(ks) do
  local rk = ARGV[1] .. 'r:' .. k
  local st = redis.call('HGET', rk, 'st')
  if st == 'c' or (not st and redis.call('EXISTS', rk) == 0 and gone(k, now)) then
    redis.call('ZREM', KEYS[1], k)
    dropped = dropped + 1
  end
end
return { #ks, dropped }
"#;

/// The compiled scripts (each knows its SHA1, sent with `EVALSHA`).
struct Scripts {
    claim: Script,
    takeover: Script,
    complete: Script,
    release: Script,
    renew: Script,
    abandon: Script,
    resolve: Script,
    lookup: Script,
    observe: Script,
    pending: Script,
    purge: Script,
    sweep_pending: Script,
}

impl Scripts {
    fn new() -> Self {
        let script = |parts: &[&str]| Script::new(&format!("{PRELUDE}{}", parts.concat()));
        let plain = |body: &str| script(&[body]);
        let claiming = |body: &str| script(&[CLAIM_PRELUDE, body]);
        let holding = |body: &str| script(&[HOLDER_PRELUDE, body]);
        let settling = |body: &str| script(&[SETTLE_PRELUDE, HOLDER_PRELUDE, body]);
        Self {
            claim: Script::new(&[CLAIM_REPLAY, PRELUDE, CLAIM_PRELUDE, CLAIM].concat()),
            takeover: claiming(TAKEOVER),
            complete: settling(COMPLETE),
            release: settling(RELEASE),
            renew: holding(RENEW),
            abandon: holding(ABANDON),
            resolve: script(&[SETTLE_PRELUDE, RESOLVE]),
            lookup: plain(LOOKUP),
            observe: plain(OBSERVE),
            pending: script(&[INDEX_PRELUDE, PENDING]),
            purge: plain(PURGE),
            sweep_pending: script(&[INDEX_PRELUDE, SWEEP_PENDING]),
        }
    }

    fn all(&self) -> [&Script; 12] {
        [
            &self.claim,
            &self.takeover,
            &self.complete,
            &self.release,
            &self.renew,
            &self.abandon,
            &self.resolve,
            &self.lookup,
            &self.observe,
            &self.pending,
            &self.purge,
            &self.sweep_pending,
        ]
    }
}

/// The longest wait, in milliseconds, between two sends of one operation on a cluster.
const CLUSTER_RETRY_WAIT_MS: u64 = 500;

/// The shortest wait, in milliseconds, between two sends of one operation on a cluster
/// (after a `TRYAGAIN` or a dropped connection; a `MOVED` or `ASK` is followed at once).
/// Set because the redis crate's default (1,280 ms) is above [`CLUSTER_RETRY_WAIT_MS`],
/// and its back-off then waits its minimum, not the cap: every re-send took 1.28 s.
const CLUSTER_MIN_RETRY_WAIT_MS: u64 = 10;

/// Settings for [`RedisStore`], from [`RedisStore::builder`] (one server, or a cluster by
/// a `redis+cluster://` URL) or [`RedisStore::cluster_builder`] (a cluster by its nodes).
///
/// The timeouts bound how long an operation can hang on an unreachable or stalled
/// server: past them the operation fails with [`StoreError::Unavailable`] and the engine
/// fails closed (the tool does not run).
#[derive(Debug, Clone)]
#[must_use = "call `.connect().await` to open the store"]
pub struct RedisStoreBuilder {
    target: Target,
    prefix: String,
    connect_timeout: Duration,
    response_timeout: Duration,
    reconnect_attempts: usize,
    allow_without_persistence: bool,
}

/// What a builder connects to.
#[derive(Debug, Clone)]
enum Target {
    /// A URL: one server, or a cluster (`redis+cluster://`).
    Url(String),
    /// The seed nodes of a cluster, one URL each.
    Cluster(Vec<String>),
}

impl RedisStoreBuilder {
    /// Accepts a server that keeps no append-only file (`appendonly no`), which
    /// [`connect`](Self::connect) otherwise refuses: such a server loses every claim in
    /// flight when it restarts, and a retry then runs the tool a second time. For tests,
    /// and for tools whose duplicates cost nothing; never for money or messages. The URL
    /// form (for [`open`](crate::store::open) and the CLI) is the query parameter
    /// `allow_without_persistence=true`. On a cluster it covers every primary.
    pub fn allow_without_persistence(mut self) -> Self {
        self.allow_without_persistence = true;
        self
    }

    /// Namespaces every key under `prefix` (default `tc:`), so tenants, environments or
    /// test runs can share one server without seeing each other's keys. On Redis Cluster
    /// the prefix cannot hold a `{` (the store adds a hash tag of its own after it).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long one attempt to open a connection may take (default 2 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long the server may take to answer one operation (default 5 s). On a cluster
    /// each send of an operation gets this long, so with `N` [re-sends](Self::reconnect_attempts)
    /// an operation fails after at most `(N + 1) x (timeout + 0.5 s)`.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How many times a failed connection attempt is retried, with a short backoff,
    /// before an operation gives up (default 2). On one server, operations themselves are
    /// never retried: a claim whose answer was lost might have been applied. On a cluster
    /// this is also how often the cluster client re-sends an operation after a redirection
    /// (`MOVED`, `ASK`: at once), a `TRYAGAIN` or a dropped connection (after a wait that
    /// starts at 10 ms and doubles, jittered, up to 500 ms): see "Redis Cluster" in the
    /// module docs for why a re-sent script is safe.
    pub fn reconnect_attempts(mut self, attempts: usize) -> Self {
        self.reconnect_attempts = attempts;
        self
    }

    /// Connects, checks the server's persistence, loads the scripts and returns the store.
    ///
    /// Fails with [`StoreError::Unavailable`] if the URL is invalid, the server cannot be
    /// reached within the connect timeout and retries, or it keeps no append-only file
    /// (`appendonly no`) and [`allow_without_persistence`](Self::allow_without_persistence)
    /// was not given. Warns once per process when `appendfsync` is not `always` (up to a
    /// second of claims can be lost in a crash). Where the server does not let a client
    /// read its settings (`INFO`/`CONFIG` disabled), it warns and connects. On a cluster
    /// each of these checks covers every primary.
    pub async fn connect(mut self) -> StoreResult<RedisStore> {
        let nodes = match &self.target {
            Target::Url(url) => {
                let (url, allowed_by_url) = strip_persistence_opt_in(url);
                self.allow_without_persistence |= allowed_by_url;
                match connection::cluster_nodes(&url) {
                    Some(nodes) => nodes.map_err(|why| {
                        StoreError::unavailable_message(format!("invalid redis URL: {why}"))
                    })?,
                    None => return self.connect_single(&url).await,
                }
            }
            Target::Cluster(nodes) => nodes
                .iter()
                .map(|node| {
                    let (node, allowed_by_url) = strip_persistence_opt_in(node);
                    self.allow_without_persistence |= allowed_by_url;
                    node
                })
                .collect(),
        };
        self.connect_cluster(nodes).await
    }

    async fn connect_single(self, url: &str) -> StoreResult<RedisStore> {
        let client = redis::Client::open(url)
            .map_err(|e| StoreError::unavailable("invalid redis URL", e))?;
        // The address only: the URL may carry a password.
        let addr = client.get_connection_info().addr().to_string();
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout))
            .set_number_of_retries(self.reconnect_attempts)
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| {
                StoreError::unavailable(format!("cannot connect to redis at {addr}"), e)
            })?;
        let mut conn = Conn::Single(conn);
        refuse_cluster_node(&mut conn, &addr).await?;
        let layout = Layout::standalone(&self.prefix);
        self.finish(conn, addr, layout).await
    }

    async fn connect_cluster(self, nodes: Vec<String>) -> StoreResult<RedisStore> {
        let layout = Layout::cluster(&self.prefix).map_err(StoreError::unavailable_message)?;
        if nodes.is_empty() {
            return Err(StoreError::unavailable_message(
                "no Redis Cluster node given: name at least one, e.g. RedisStore::cluster_builder([\"redis://10.0.0.5:7000\"])",
            ));
        }
        let mut addrs = Vec::with_capacity(nodes.len());
        for node in &nodes {
            let info = node
                .as_str()
                .into_connection_info()
                .map_err(|e| StoreError::unavailable("invalid redis URL of a cluster node", e))?;
            addrs.push(info.addr().to_string());
        }
        // The addresses only: the URLs may carry a password.
        let addr = format!("cluster {}", addrs.join(","));
        let retries = u32::try_from(self.reconnect_attempts).unwrap_or(u32::MAX);
        // The cluster client bounds a whole request, re-sends included, by its overall
        // timeout, which defaults to the response timeout: the re-sends and the waits
        // between them then ran out of time before `reconnect_attempts` was reached (a
        // listing during a slot migration, under CI load). Each send gets its own
        // response window and each wait its longest back-off, so the bound stays
        // finite: (attempts + 1) x (response timeout + the 500 ms back-off).
        let overall = self
            .response_timeout
            .saturating_add(Duration::from_millis(CLUSTER_RETRY_WAIT_MS))
            .saturating_mul(retries.saturating_add(1));
        let client = ClusterClientBuilder::new(nodes)
            .connection_timeout(self.connect_timeout)
            .response_timeout(self.response_timeout)
            .overall_response_timeout(Some(overall))
            .retries(retries)
            .min_retry_wait(CLUSTER_MIN_RETRY_WAIT_MS)
            .max_retry_wait(CLUSTER_RETRY_WAIT_MS)
            .build()
            .map_err(|e| StoreError::unavailable("invalid redis cluster URLs", e))?;
        let conn = client
            .get_async_connection()
            .await
            .map_err(|e| StoreError::unavailable(format!("cannot connect to redis {addr}"), e))?;
        self.finish(Conn::Cluster(conn), addr, layout).await
    }

    /// Checks persistence and loads the scripts (on every primary of a cluster).
    async fn finish(self, mut conn: Conn, addr: String, layout: Layout) -> StoreResult<RedisStore> {
        check_persistence(&mut conn, &addr, self.allow_without_persistence).await?;
        let scripts = Scripts::new();
        // Loaded up front so a script error shows at startup, not on the first call.
        // After a server restart `EVALSHA` reports `NOSCRIPT` and the crate reloads it
        // (on a cluster, on every primary).
        for script in scripts.all() {
            script.load_async(&mut conn).await.map_err(|e| {
                StoreError::unavailable(format!("cannot load scripts into redis at {addr}"), e)
            })?;
        }
        Ok(RedisStore {
            conn,
            layout,
            scripts,
        })
    }
}

/// The URL without the `allow_without_persistence=true` query parameter, and whether it
/// was there (the redis crate would ignore it, but it is ours to read).
fn strip_persistence_opt_in(url: &str) -> (String, bool) {
    const OPT_IN: &str = "allow_without_persistence=true";
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_owned(), false);
    };
    let mut found = false;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|part| {
            let ours = *part == OPT_IN;
            found |= ours;
            !ours && !part.is_empty()
        })
        .collect();
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    (url, found)
}

/// Refuses a node of a Redis Cluster reached by a plain URL: that connection would reach
/// only the keys of the node's own slots (the others answer `MOVED`). A server that will
/// not say (`INFO` refused) is taken for a standalone one.
async fn refuse_cluster_node(conn: &mut Conn, addr: &str) -> StoreResult {
    let info: Result<String, _> = redis::cmd("INFO").arg("cluster").query_async(conn).await;
    let clustered = info.is_ok_and(|text| text.lines().any(|l| l.trim() == "cluster_enabled:1"));
    if clustered {
        return Err(StoreError::unavailable_message(format!(
            "redis at {addr} is a Redis Cluster node: a connection to one node reaches only the keys of its own slots. Connect with `redis+cluster://{addr}` (any nodes of the cluster, comma-separated) or `RedisStore::cluster_builder([\"redis://{addr}\"])`"
        )));
    }
    Ok(())
}

/// Refuses a server without an append-only file unless `allowed`; warns (once) when its
/// fsync policy can lose the last second. Settings a server will not show are warned
/// about, not refused: managed services often disable `CONFIG`. On a cluster every
/// primary is asked, and the first one without an append-only file is named.
async fn check_persistence(conn: &mut Conn, addr: &str, allowed: bool) -> StoreResult {
    static WARNED: std::sync::Once = std::sync::Once::new();
    let info = conn
        .on_primaries(redis::cmd("INFO").arg("persistence"), addr)
        .await;
    // Per primary: whether it keeps an append-only file (`None`: it would not say).
    let aof: Vec<(String, Option<bool>)> = match info {
        Ok(replies) => replies
            .into_iter()
            .map(|(node, reply)| {
                let enabled = reply
                    .ok()
                    .and_then(|v| String::from_redis_value(v).ok())
                    .and_then(|text| {
                        text.lines()
                            .find_map(|line| line.trim().strip_prefix("aof_enabled:"))
                            .map(|v| v.trim() == "1")
                    });
                (node, enabled)
            })
            .collect(),
        Err(_) => vec![(addr.to_owned(), None)],
    };
    if let Some((node, _)) = aof.iter().find(|(_, enabled)| *enabled == Some(false)) {
        if !allowed {
            return Err(StoreError::unavailable_message(format!(
                "redis at {node} keeps no append-only file (appendonly no): a restart would lose every claim in flight, and a retry would then run the tool a second time. Turn persistence on (`CONFIG SET appendonly yes`, and `appendfsync always` to lose nothing), or, for tests and tools whose duplicates cost nothing, opt in with `RedisStore::builder(url).allow_without_persistence()` (URL: `?allow_without_persistence=true`)"
            )));
        }
        tracing::warn!(addr = %node, "tool-contracts: redis keeps no append-only file; accepted by allow_without_persistence: a server restart loses claims in flight");
        return Ok(());
    }
    if let Some((node, _)) = aof.iter().find(|(_, enabled)| enabled.is_none()) {
        WARNED.call_once(|| tracing::warn!(addr = %node, "tool-contracts: cannot read redis persistence settings (INFO persistence refused); make sure appendonly is yes"));
        return Ok(());
    }
    let fsync = conn
        .on_primaries(redis::cmd("CONFIG").arg("GET").arg("appendfsync"), addr)
        .await
        .unwrap_or_else(|_| vec![(addr.to_owned(), Ok(Value::Nil))]);
    for (node, reply) in fsync {
        let policy = reply
            .ok()
            .and_then(|v| Vec::<String>::from_redis_value(v).ok());
        match policy.as_deref() {
            Some([_, policy]) if policy == "always" => {}
            Some([_, policy]) => WARNED.call_once(|| {
                tracing::warn!(addr = %node, appendfsync = %policy, "tool-contracts: redis fsyncs its append-only file less than always: a crash can lose the last second of claims")
            }),
            _ => WARNED.call_once(|| {
                tracing::warn!(addr = %node, "tool-contracts: cannot read redis appendfsync (CONFIG refused); `always` loses nothing in a crash")
            }),
        }
    }
    Ok(())
}

/// A store in Redis, shared by every worker that connects to the same server (or cluster)
/// and prefix.
///
/// - **Atomic, one round trip.** Each operation is one Lua script (`EVALSHA`); leases
///   and expiry use the server's clock (`TIME`), fencing tokens one `INCR` counter.
/// - **Durability is the server's**: a claim or result survives a server crash only with
///   `appendonly yes` + `appendfsync always`; replication is asynchronous. Run with
///   `maxmemory-policy noeviction`: an evicted record lets a retry run the tool again.
/// - **Keys**, under a prefix (default `tc:`): a hash `{prefix}r:{key}` per record, a
///   list `{prefix}h:{key}` of its history, sorted sets `{prefix}pending` and
///   `{prefix}expiry`, and the counter `{prefix}token`. Records carry a Redis TTL, so an
///   expired record disappears at once (see [`Store::purge_expired`] on this type).
/// - **Redis Cluster** (a `redis+cluster://` URL or [`RedisStore::cluster_builder`]): the
///   same keys in 256 buckets, each under a hash tag of its own (`{prefix}{TAG}r:{key}`),
///   so every script touches one slot; one fencing counter per bucket. See the module
///   docs, "Redis Cluster".
/// - Redis 5.0 or later; Redis Cluster 7.0 or later.
///
/// Cheap to share: one multiplexed connection (per node, on a cluster) serves all
/// operations and reconnects after a failure (the operation that saw the failure returns
/// [`StoreError::Unavailable`]).
pub struct RedisStore {
    conn: Conn,
    layout: Layout,
    scripts: Scripts,
}

impl core::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.layout.prefix())
            .field("cluster", &self.layout.is_cluster())
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects to `url` with the default prefix `tc:` and default timeouts: one server
    /// (`redis://host:port/db`, `rediss://` for TLS), or a Redis Cluster by any of its
    /// nodes (`redis+cluster://host:port,host:port`, the rest are discovered).
    pub async fn connect(url: &str) -> StoreResult<RedisStore> {
        Self::builder(url).connect().await
    }

    /// Connects to `url` with every key under `prefix`, so tenants or test runs sharing a
    /// server stay apart.
    pub async fn with_prefix(url: &str, prefix: &str) -> StoreResult<RedisStore> {
        Self::builder(url).prefix(prefix).connect().await
    }

    /// Settings beyond the URL: prefix and timeouts. A `redis+cluster://` URL connects to a
    /// Redis Cluster, like [`cluster_builder`](Self::cluster_builder).
    pub fn builder(url: &str) -> RedisStoreBuilder {
        Self::builder_for(Target::Url(url.to_owned()))
    }

    /// A store on Redis Cluster, reached through `nodes` (`redis://host:port` each; any
    /// primaries or replicas: the cluster client discovers the rest and sends each
    /// script to the primary of its key's slot). The URL form is
    /// `redis+cluster://host:port,host:port` with [`builder`](Self::builder).
    pub fn cluster_builder<I, S>(nodes: I) -> RedisStoreBuilder
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let nodes = nodes.into_iter().map(|n| n.as_ref().to_owned()).collect();
        Self::builder_for(Target::Cluster(nodes))
    }

    fn builder_for(target: Target) -> RedisStoreBuilder {
        RedisStoreBuilder {
            target,
            prefix: DEFAULT_PREFIX.to_owned(),
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(5),
            reconnect_attempts: 2,
            allow_without_persistence: false,
        }
    }

    /// Runs a prepared script, mapping failures for the operation `op` on `key`.
    async fn run(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
        op: &'static str,
        key: &str,
    ) -> StoreResult<Value> {
        let mut conn = self.conn.clone();
        invocation
            .invoke_async::<Value>(&mut conn)
            .await
            .map_err(|e| map_error(op, key, e))
    }

    async fn claim_like(
        &self,
        req: &ClaimRequest<'_>,
        stale_token: Option<u64>,
    ) -> StoreResult<ClaimOutcome> {
        let (script, op) = match stale_token {
            Some(_) => (&self.scripts.takeover, "takeover"),
            None => (&self.scripts.claim, "claim"),
        };
        let ns = self.layout.of(req.key);
        let mut inv = script.prepare_invoke();
        inv.key(ns.record(req.key))
            .key(ns.history(req.key))
            .key(ns.pending.as_slice())
            .key(ns.expiry.as_slice())
            .key(ns.token.as_slice())
            .arg(req.key)
            .arg(req.tool)
            .arg(if req.scope.is_some() { "1" } else { "0" })
            .arg(req.scope.unwrap_or(""))
            .arg(req.fingerprint)
            .arg(req.args)
            .arg(millis(req.lease))
            .arg(millis(req.ttl))
            .arg(req.worker)
            .arg(req.version);
        if let Some(stale) = stale_token {
            inv.arg(stale);
        }
        let reply = self.run(&inv, op, req.key).await?;
        parse_outcome(req.key, op, reply)
    }

    /// Runs one of the holder's scripts (see [`HOLDER_PRELUDE`]) for `token`: KEYS 1
    /// and 2 are `key`'s record and history, ARGV 1 and 2 the key and the token; `more`
    /// adds the script's other keys (of `key`'s namespace) and arguments.
    async fn fenced(
        &self,
        script: &Script,
        op: &'static str,
        key: &str,
        token: u64,
        more: impl FnOnce(&Namespace, &mut redis::ScriptInvocation<'_>),
    ) -> StoreResult {
        let ns = self.layout.of(key);
        let mut inv = script.prepare_invoke();
        inv.key(ns.record(key))
            .key(ns.history(key))
            .arg(key)
            .arg(token);
        more(ns, &mut inv);
        match self.run(&inv, op, key).await? {
            v if is(&v, b"ok") => Ok(()),
            v if is(&v, b"lease_lost") => Err(StoreError::LeaseLost { token }),
            other => Err(unexpected(op, key, &other)),
        }
    }

    /// The records `pending` finds in one namespace, oldest first.
    async fn pending_in(&self, ns: &Namespace, limit: usize) -> StoreResult<Vec<Record>> {
        let mut inv = self.scripts.pending.prepare_invoke();
        inv.key(ns.pending.as_slice())
            .key(ns.expiry.as_slice())
            .arg(ns.prefix.as_slice())
            .arg(limit);
        let reply = self.run(&inv, "pending", "").await?;
        let entries = array(&reply).ok_or_else(|| unexpected("pending", "", &reply))?;
        entries
            .iter()
            .map(|entry| match array(entry) {
                Some([key, fields]) => {
                    let key = text(key).ok_or_else(|| {
                        StoreError::Corrupt("redis pending index holds a non-UTF-8 key".into())
                    })?;
                    let fields =
                        array(fields).ok_or_else(|| unexpected("pending", &key, fields))?;
                    let fields =
                        flat_fields(fields).ok_or_else(|| unexpected("pending", &key, entry))?;
                    parse_record(&key, &fields)
                }
                _ => Err(unexpected("pending", "", entry)),
            })
            .collect()
    }

    /// Purges one namespace (see [`Store::purge_expired`] on this type): the records it
    /// removed or found removed.
    async fn purge_in(&self, ns: &Namespace) -> StoreResult<u64> {
        let mut removed = 0u64;
        loop {
            let mut inv = self.scripts.purge.prepare_invoke();
            inv.key(ns.expiry.as_slice())
                .key(ns.pending.as_slice())
                .arg(ns.prefix.as_slice())
                .arg(PURGE_BATCH);
            let reply = self.run(&inv, "purge_expired", "").await?;
            let (gone, examined) =
                pair(&reply).ok_or_else(|| unexpected("purge_expired", "", &reply))?;
            removed += gone;
            if examined < PURGE_BATCH as u64 {
                break;
            }
        }
        let mut start = 0u64;
        loop {
            let mut inv = self.scripts.sweep_pending.prepare_invoke();
            inv.key(ns.pending.as_slice())
                .key(ns.expiry.as_slice())
                .arg(ns.prefix.as_slice())
                .arg(start)
                .arg(PURGE_BATCH);
            let reply = self.run(&inv, "purge_expired", "").await?;
            let (examined, dropped) =
                pair(&reply).ok_or_else(|| unexpected("purge_expired", "", &reply))?;
            if examined < PURGE_BATCH as u64 {
                break;
            }
            // Dropped entries shifted the later ones down by as many ranks.
            start += examined - dropped.min(examined);
        }
        Ok(removed)
    }
}

#[async_trait::async_trait]
impl Store for RedisStore {
    fn backend(&self) -> &'static str {
        "redis"
    }

    async fn claim(&self, req: ClaimRequest<'_>) -> StoreResult<ClaimOutcome> {
        self.claim_like(&req, None).await
    }

    async fn takeover(&self, req: ClaimRequest<'_>, stale_token: u64) -> StoreResult<ClaimOutcome> {
        self.claim_like(&req, Some(stale_token)).await
    }

    async fn complete(&self, key: &str, token: u64, completion: Completion<'_>) -> StoreResult {
        self.fenced(&self.scripts.complete, "complete", key, token, |ns, inv| {
            inv.key(ns.pending.as_slice())
                .key(ns.expiry.as_slice())
                .arg(completion.result)
                .arg(if completion.is_error { "1" } else { "0" })
                .arg(millis(completion.ttl));
        })
        .await
    }

    async fn release(&self, key: &str, token: u64) -> StoreResult {
        self.fenced(&self.scripts.release, "release", key, token, |ns, inv| {
            inv.key(ns.pending.as_slice()).key(ns.expiry.as_slice());
        })
        .await
    }

    async fn renew(&self, key: &str, token: u64, lease: Duration) -> StoreResult {
        self.fenced(&self.scripts.renew, "renew", key, token, |ns, inv| {
            inv.key(ns.expiry.as_slice()).arg(millis(lease));
        })
        .await
    }

    async fn abandon(&self, key: &str, token: u64) -> StoreResult {
        self.fenced(&self.scripts.abandon, "abandon", key, token, |_, _| {})
            .await
    }

    /// Reads a key's record. Redis deletes a record when it expires, so an expired
    /// record is absent here (unlike [`MemoryStore`](super::MemoryStore), which keeps it
    /// until a purge).
    async fn lookup(&self, key: &str) -> StoreResult<Option<Record>> {
        let mut inv = self.scripts.lookup.prepare_invoke();
        inv.key(self.layout.of(key).record(key));
        let reply = self.run(&inv, "lookup", key).await?;
        let fields = array(&reply).ok_or_else(|| unexpected("lookup", key, &reply))?;
        if fields.is_empty() {
            return Ok(None);
        }
        let fields = flat_fields(fields).ok_or_else(|| unexpected("lookup", key, &reply))?;
        parse_record(key, &fields).map(Some)
    }

    /// The record and the server's clock (`TIME`), read by one script. Like
    /// [`lookup`](Store::lookup), an expired record is absent.
    async fn observe(&self, key: &str) -> StoreResult<Option<Observed>> {
        let mut inv = self.scripts.observe.prepare_invoke();
        inv.key(self.layout.of(key).record(key));
        let reply = self.run(&inv, "observe", key).await?;
        let bad = || unexpected("observe", key, &reply);
        let [now, fields] = array(&reply).ok_or_else(bad)? else {
            return Err(bad());
        };
        let now = uint(now).ok_or_else(bad)?;
        let fields = array(fields).ok_or_else(bad)?;
        if fields.is_empty() {
            return Ok(None);
        }
        let fields = flat_fields(fields).ok_or_else(bad)?;
        Ok(Some(Observed::new(parse_record(key, &fields)?, at(now))))
    }

    /// The in-progress records, oldest first. On a cluster each bucket is listed by a
    /// script of its own (256 scripts, up to 32 at a time, each returning at most `limit`
    /// records) and the lists are merged by creation time.
    async fn pending(&self, limit: usize) -> StoreResult<Vec<Record>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let all = self.layout.all();
        // By index: a closure over `&Namespace` is not `Send` enough for async-trait.
        let lists: Vec<Vec<Record>> = stream::iter(0..all.len())
            .map(|i| self.pending_in(&all[i], limit))
            .buffer_unordered(FAN_OUT)
            .try_collect()
            .await?;
        let mut records: Vec<Record> = lists.into_iter().flatten().collect();
        // The index's own order (creation time, then key) across the lists.
        records.sort_by(|a, b| (a.created_at, &a.key).cmp(&(b.created_at, &b.key)));
        records.truncate(limit);
        Ok(records)
    }

    async fn resolve(&self, request: ResolveRequest<'_>) -> StoreResult {
        let key = request.key;
        let (mode, result, ttl) = match request.resolution {
            Resolution::Complete { result, ttl } => ("complete", result, ttl),
            Resolution::Release => ("release", "", Duration::ZERO),
        };
        let ns = self.layout.of(key);
        let mut inv = self.scripts.resolve.prepare_invoke();
        inv.key(ns.record(key))
            .key(ns.history(key))
            .key(ns.pending.as_slice())
            .key(ns.expiry.as_slice())
            .key(ns.token.as_slice())
            .arg(key)
            .arg(request.kind.as_str())
            .arg(request.worker)
            .arg(mode)
            .arg(result)
            .arg(millis(ttl));
        match self.run(&inv, "resolve", key).await? {
            v if is(&v, b"ok") => Ok(()),
            v if is(&v, b"not_pending") => Err(StoreError::NotPending),
            other => Err(unexpected("resolve", key, &other)),
        }
    }

    async fn history(&self, key: &str) -> StoreResult<Vec<HistoryEvent>> {
        let mut conn = self.conn.clone();
        let entries: Vec<Vec<u8>> = redis::cmd("LRANGE")
            .arg(self.layout.of(key).history(key))
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .map_err(|e| map_error("history", key, e))?;
        entries.iter().map(|e| parse_event(key, e)).collect()
    }

    /// Deletes records past their expiry, with their history, and cleans the indexes.
    ///
    /// Redis normally deletes an expired record itself (it carries a TTL) before any
    /// purge runs; the expiry index still remembers it, so the purge counts it then,
    /// once. The count is therefore the number of records that expired since the last
    /// purge, whether Redis or this call deleted them; it is 0 when no record expired
    /// (and may miss a record that expired and was claimed again before the purge).
    /// Records that vanished before their expiry (eviction, `DEL`) keep their index
    /// entries until that expiry, then are counted like the rest. Runs in batches of a
    /// few hundred keys, each one script, so a large purge never blocks the server for
    /// long; on a cluster, each bucket on its own (up to 32 at a time).
    async fn purge_expired(&self) -> StoreResult<u64> {
        let all = self.layout.all();
        stream::iter(0..all.len())
            .map(|i| self.purge_in(&all[i]))
            .buffer_unordered(FAN_OUT)
            .try_fold(0u64, |sum, removed| async move { Ok(sum + removed) })
            .await
    }
}

/// A duration in whole milliseconds for a script, clamped (see [`MAX_DURATION_MS`]).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).map_or(MAX_DURATION_MS, |ms| ms.min(MAX_DURATION_MS))
}

/// Names what an operation was about, for error messages: the key, if it had one.
fn subject(op: &str, key: &str) -> String {
    if key.is_empty() {
        format!("redis {op}")
    } else {
        format!("redis {op} of key {key:?}")
    }
}

fn map_error(op: &str, key: &str, e: RedisError) -> StoreError {
    match e.code() {
        Some(CORRUPT_CODE) => StoreError::Corrupt(format!(
            "{}: the stored record is malformed: {}",
            subject(op, key),
            e.detail().unwrap_or("unknown field")
        )),
        // Something that is not a hash or list sits where a record or history belongs.
        Some("WRONGTYPE") => StoreError::Corrupt(format!(
            "{}: a key holds the wrong type of value: {e}",
            subject(op, key)
        )),
        _ => StoreError::unavailable(format!("{} failed", subject(op, key)), e),
    }
}

/// A script answered something none of them returns: the server is not running these
/// scripts (or runs a different version of them).
fn unexpected(op: &str, key: &str, reply: &Value) -> StoreError {
    StoreError::Corrupt(format!(
        "{} returned an unexpected reply: {reply:?}",
        subject(op, key)
    ))
}

fn bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        Value::Okay => Some(b"OK"),
        _ => None,
    }
}

fn is(v: &Value, expected: &[u8]) -> bool {
    bytes(v) == Some(expected)
}

fn text(v: &Value) -> Option<String> {
    bytes(v).and_then(text_of)
}

fn uint(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        other => bytes(other).and_then(uint_of),
    }
}

fn array(v: &Value) -> Option<&[Value]> {
    match v {
        Value::Array(items) | Value::Set(items) => Some(items),
        _ => None,
    }
}

fn pair(v: &Value) -> Option<(u64, u64)> {
    match array(v)? {
        [a, b] => Some((uint(a)?, uint(b)?)),
        _ => None,
    }
}

fn at(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

fn parse_outcome(key: &str, op: &str, reply: Value) -> StoreResult<ClaimOutcome> {
    let bad = || unexpected(op, key, &reply);
    // A completed record: its values, packed (`CLAIM_REPLAY`).
    if let Value::BulkString(packed) = &reply {
        let values = unpack(packed).ok_or_else(bad)?;
        return Ok(ClaimOutcome::Completed(Arc::new(parse_values(
            key, &values,
        )?)));
    }
    let items = array(&reply).ok_or_else(bad)?;
    let (tag, rest) = items.split_first().ok_or_else(bad)?;
    let tag = bytes(tag).ok_or_else(bad)?;
    Ok(match (tag, rest) {
        (b"acquired", [token]) => ClaimOutcome::Acquired {
            token: uint(token).ok_or_else(bad)?,
        },
        (b"in_progress", [fingerprint, remaining]) => ClaimOutcome::InProgress {
            fingerprint: text(fingerprint).ok_or_else(|| corrupt_field(key, "fp"))?,
            lease_remaining: Duration::from_millis(uint(remaining).ok_or_else(bad)?),
        },
        (b"abandoned", [token, fingerprint]) => ClaimOutcome::Abandoned {
            token: uint(token).ok_or_else(|| corrupt_field(key, "tok"))?,
            fingerprint: text(fingerprint).ok_or_else(|| corrupt_field(key, "fp"))?,
        },
        _ => return Err(bad()),
    })
}

fn corrupt_field(key: &str, field: &str) -> StoreError {
    StoreError::Corrupt(format!(
        "redis record for key {key:?}: field `{field}` is missing or malformed"
    ))
}

/// The fields of a record hash, by name.
#[derive(Default)]
struct Fields<'a> {
    st: Option<&'a [u8]>,
    tok: Option<&'a [u8]>,
    lease: Option<&'a [u8]>,
    tool: Option<&'a [u8]>,
    ver: Option<&'a [u8]>,
    upd: Option<&'a [u8]>,
    scope: Option<&'a [u8]>,
    fp: Option<&'a [u8]>,
    args: Option<&'a [u8]>,
    created: Option<&'a [u8]>,
    expires: Option<&'a [u8]>,
    result: Option<&'a [u8]>,
    err: Option<&'a [u8]>,
    done: Option<&'a [u8]>,
    worker: Option<&'a [u8]>,
}

impl<'a> Fields<'a> {
    /// The slot of the field `name`; `None` for a field a later version adds.
    fn slot(&mut self, name: &[u8]) -> Option<&mut Option<&'a [u8]>> {
        Some(match name {
            b"st" => &mut self.st,
            b"tok" => &mut self.tok,
            b"lease" => &mut self.lease,
            b"tool" => &mut self.tool,
            b"ver" => &mut self.ver,
            b"upd" => &mut self.upd,
            b"scope" => &mut self.scope,
            b"fp" => &mut self.fp,
            b"args" => &mut self.args,
            b"created" => &mut self.created,
            b"expires" => &mut self.expires,
            b"result" => &mut self.result,
            b"err" => &mut self.err,
            b"done" => &mut self.done,
            b"worker" => &mut self.worker,
            _ => return None,
        })
    }
}

/// The fields the scripts' `read_record` reads with one `HMGET`, in its order: a replayed
/// claim's packed reply holds their values in this order (`parse_values`). The Lua list
/// must match (`the_scripts_read_the_record_fields_in_order` checks).
const RECORD_FIELDS: [&str; 15] = [
    "st", "tok", "fp", "worker", "created", "expires", "lease", "tool", "ver", "scope", "args",
    "result", "err", "done", "upd",
];

/// The MessagePack encoding of `false`: how `cmsgpack` packs a field `HMGET` found absent.
const PACKED_ABSENT: u8 = 0xc2;

/// The items of a record's values packed by the claim scripts (a MessagePack array whose
/// items are strings, or `false` for an absent field); `None` if the text is not exactly
/// such an array.
fn unpack(packed: &[u8]) -> Option<Vec<Option<&[u8]>>> {
    let mut rest = packed;
    let count = usize::try_from(rmp::decode::read_array_len(&mut rest).ok()?).ok()?;
    // Each item takes at least its one-byte header: a count past that is malformed.
    if count > rest.len() {
        return None;
    }
    let mut items = Vec::with_capacity(count);
    for _ in 0..count {
        if let Some((&PACKED_ABSENT, tail)) = rest.split_first() {
            items.push(None);
            rest = tail;
            continue;
        }
        let len = usize::try_from(rmp::decode::read_str_len(&mut rest).ok()?).ok()?;
        let (item, tail) = rest.split_at_checked(len)?;
        items.push(Some(item));
        rest = tail;
    }
    rest.is_empty().then_some(items)
}

/// The bulk strings of a flat `HGETALL` reply; `None` if one is not a string.
fn flat_fields(values: &[Value]) -> Option<Vec<&[u8]>> {
    values.iter().map(bytes).collect()
}

/// `bytes` as an owned UTF-8 string.
fn text_of(bytes: &[u8]) -> Option<String> {
    core::str::from_utf8(bytes).ok().map(str::to_owned)
}

/// `bytes` as a decimal `u64`.
fn uint_of(bytes: &[u8]) -> Option<u64> {
    core::str::from_utf8(bytes).ok()?.parse().ok()
}

/// Builds a [`Record`] from the fields of a flat `HGETALL` reply, checking every field
/// a record keeps (the scripts checked the token and the worker).
fn parse_record(key: &str, flat: &[&[u8]]) -> StoreResult<Record> {
    if !flat.len().is_multiple_of(2) {
        return Err(StoreError::Corrupt(format!(
            "redis record for key {key:?}: odd number of hash elements"
        )));
    }
    let mut f = Fields::default();
    for pair in flat.chunks_exact(2) {
        let (Some(&name), Some(&value)) = (pair.first(), pair.get(1)) else {
            continue;
        };
        if let Some(slot) = f.slot(name) {
            *slot = Some(value);
        }
    }
    record_of(key, &f)
}

/// Builds a [`Record`] from the values of [`RECORD_FIELDS`] (a replayed claim's packed
/// reply), checking every field, the token, the worker and the expiry's form included: the
/// claim script answers a completed record after checking only its state and that its
/// expiry reads as a number past now.
fn parse_values(key: &str, values: &[Option<&[u8]>]) -> StoreResult<Record> {
    if values.len() != RECORD_FIELDS.len() {
        return Err(StoreError::Corrupt(format!(
            "redis record for key {key:?}: {} values for {} fields",
            values.len(),
            RECORD_FIELDS.len()
        )));
    }
    let mut f = Fields::default();
    for (name, value) in RECORD_FIELDS.iter().zip(values) {
        if let Some(slot) = f.slot(name.as_bytes()) {
            *slot = *value;
        }
    }
    // As the scripts' `check`: a decimal of at most 20 digits without a leading zero.
    let token_ok = f.tok.is_some_and(|t| {
        t.len() <= 20
            && t.first().is_some_and(|d| (b'1'..=b'9').contains(d))
            && t.iter().all(u8::is_ascii_digit)
    });
    if !token_ok {
        return Err(corrupt_field(key, "tok"));
    }
    if f.worker.is_none() {
        return Err(corrupt_field(key, "worker"));
    }
    // As the scripts' `uint`: at most 15 digits (the claim script only read it as a number).
    if !f
        .expires
        .is_some_and(|e| !e.is_empty() && e.len() <= 15 && e.iter().all(u8::is_ascii_digit))
    {
        return Err(corrupt_field(key, "expires"));
    }
    record_of(key, &f)
}

/// The [`Record`] the fields describe; an error names the first missing or malformed one.
fn record_of(key: &str, f: &Fields<'_>) -> StoreResult<Record> {
    let string =
        |v: Option<&[u8]>, name| v.and_then(text_of).ok_or_else(|| corrupt_field(key, name));
    let number =
        |v: Option<&[u8]>, name| v.and_then(uint_of).ok_or_else(|| corrupt_field(key, name));
    let state = match f.st {
        Some(b"p") => RecordState::InProgress {
            token: number(f.tok, "tok")?,
            lease_expires_at: at(number(f.lease, "lease")?),
        },
        Some(b"c") => RecordState::Completed {
            result: string(f.result, "result")?,
            is_error: match f.err {
                Some(b"0") => false,
                Some(b"1") => true,
                _ => return Err(corrupt_field(key, "err")),
            },
            completed_at: at(number(f.done, "done")?),
        },
        _ => return Err(corrupt_field(key, "st")),
    };
    // Absent in records an older build wrote.
    let version = match f.ver {
        Some(v) => Some(
            uint_of(v)
                .and_then(|v| u32::try_from(v).ok())
                .ok_or_else(|| corrupt_field(key, "ver"))?,
        ),
        None => None,
    };
    let created_at = at(number(f.created, "created")?);
    let updated_at = match (f.upd, &state) {
        (Some(_), _) => at(number(f.upd, "upd")?),
        (None, RecordState::Completed { completed_at, .. }) => *completed_at,
        (None, RecordState::InProgress { .. }) => created_at,
    };
    Ok(Record {
        key: key.to_owned(),
        tool: string(f.tool, "tool")?,
        version,
        scope: match f.scope {
            Some(v) => Some(text_of(v).ok_or_else(|| corrupt_field(key, "scope"))?),
            None => None,
        },
        fingerprint: string(f.fp, "fp")?,
        args: string(f.args, "args")?,
        state,
        created_at,
        updated_at,
        expires_at: at(number(f.expires, "expires")?),
    })
}

/// Parses one history entry, `kind|token|at_ms|worker` (the worker may contain `|`).
fn parse_event(key: &str, entry: &[u8]) -> StoreResult<HistoryEvent> {
    let bad = || {
        StoreError::Corrupt(format!(
            "redis history of key {key:?} holds a malformed entry: {:?}",
            String::from_utf8_lossy(entry)
        ))
    };
    let entry = core::str::from_utf8(entry).map_err(|_| bad())?;
    let mut parts = entry.splitn(4, '|');
    let kind = parts.next().and_then(HistoryKind::parse).ok_or_else(bad)?;
    let token = parts.next().and_then(|t| t.parse().ok()).ok_or_else(bad)?;
    let at_ms = parts.next().and_then(|t| t.parse().ok()).ok_or_else(bad)?;
    let worker = parts.next().ok_or_else(bad)?;
    Ok(HistoryEvent {
        at: at(at_ms),
        kind,
        token,
        worker: worker.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_clamped_to_what_lua_adds_exactly() {
        assert_eq!(millis(Duration::from_millis(1500)), 1500);
        assert_eq!(millis(Duration::MAX), MAX_DURATION_MS);
    }

    #[test]
    fn history_entries_keep_a_pipe_in_the_worker() {
        let e = parse_event("k", b"claimed|7|1700000000000|host|42|x").unwrap();
        assert_eq!(e.kind, HistoryKind::Claimed);
        assert_eq!(e.token, 7);
        assert_eq!(e.worker, "host|42|x");
        assert!(matches!(
            parse_event("k", b"claimed|x|1|w"),
            Err(StoreError::Corrupt(_))
        ));
        assert!(matches!(
            parse_event("k", b"nope|1|1|w"),
            Err(StoreError::Corrupt(_))
        ));
    }

    #[test]
    fn a_record_an_older_build_wrote_has_no_version_and_its_completion_as_update() {
        let s = |v: &'static str| v.as_bytes();
        let mut flat = vec![
            s("st"),
            s("c"),
            s("tok"),
            s("3"),
            s("tool"),
            s("t"),
            s("fp"),
            s("f"),
            s("args"),
            s("{}"),
            s("created"),
            s("1000"),
            s("expires"),
            s("9000"),
            s("result"),
            s("1"),
            s("err"),
            s("0"),
            s("done"),
            s("2000"),
        ];
        let old = parse_record("k", &flat).unwrap();
        assert_eq!((old.version, old.updated_at), (None, at(2000)));
        flat.extend([s("ver"), s("4"), s("upd"), s("2500")]);
        let new = parse_record("k", &flat).unwrap();
        assert_eq!((new.version, new.updated_at), (Some(4), at(2500)));
        flat.extend([s("ver"), s("-1")]);
        match parse_record("k", &flat) {
            Err(StoreError::Corrupt(msg)) => assert!(msg.contains("`ver`"), "{msg}"),
            other => panic!("{other:?}"),
        }
    }

    /// What the claim scripts pack (a MessagePack array of strings, `false` for an absent
    /// field) comes back item by item, bytes of any kind and every string header size
    /// included; a text that is not exactly such an array is refused rather than read short.
    #[test]
    fn packed_fields_unpack_exactly() {
        let long = |n: usize| "x".repeat(n);
        let (l31, l32, l256, l70k) = (long(31), long(32), long(256), long(70_000));
        let items: Vec<Option<&[u8]>> = vec![
            Some(b"st"),
            Some(b"c"),
            None,
            Some(b""),
            Some(b"12:34"),
            Some("\u{e9}\n\"x\"".as_bytes()),
            None,
            Some(l31.as_bytes()),
            Some(l32.as_bytes()),
            Some(l256.as_bytes()),
            Some(l70k.as_bytes()),
        ];
        let pack = |items: &[Option<&[u8]>]| {
            let mut out = Vec::new();
            rmp::encode::write_array_len(&mut out, items.len() as u32).unwrap();
            for item in items {
                match item {
                    Some(item) => {
                        rmp::encode::write_str_len(&mut out, item.len() as u32).unwrap();
                        out.extend_from_slice(item);
                    }
                    None => rmp::encode::write_bool(&mut out, false).unwrap(),
                }
            }
            out
        };
        let packed = pack(&items);
        assert_eq!(unpack(&packed).unwrap(), items);
        assert_eq!(unpack(&pack(&[])).unwrap(), Vec::<Option<&[u8]>>::new());
        // Cut short, one byte too many, a count past the bytes, a non-string item, `true`,
        // not an array.
        let mut extra = packed.clone();
        extra.push(0xa0);
        let mut int_item = pack(&[Some(b"st")]);
        int_item[0] = 0x92;
        int_item.push(0x01);
        for bad in [
            &packed[..packed.len() - 1],
            &extra[..],
            &[0xdd, 0xff, 0xff, 0xff, 0xff, 0xa0][..],
            &int_item[..],
            &[0x91, 0xc3][..],
            b"2:st",
            b"",
        ] {
            assert_eq!(unpack(bad), None, "{bad:?}");
        }
    }

    /// The scripts' `HMGET`s name the fields in [`RECORD_FIELDS`]' order, which
    /// `parse_values` reads a replayed claim's values by.
    #[test]
    fn the_scripts_read_the_record_fields_in_order() {
        let listed = RECORD_FIELDS.map(|f| format!("'{f}'")).join(", ");
        assert!(
            PRELUDE.contains(&format!("redis.call('HMGET', rk, {listed})")),
            "PRELUDE's read_record must read exactly {listed}"
        );
        assert!(
            CLAIM_REPLAY.contains(&format!("redis.call('HMGET', KEYS[1], {listed})")),
            "CLAIM_REPLAY must read exactly {listed}"
        );
    }

    /// A replayed claim's values are checked as the scripts check a record they decide
    /// on: the token and the worker too, which the claim script skips on that path.
    #[test]
    fn replayed_values_are_checked_in_full() {
        let good: [&[u8]; 15] = [
            b"c", b"3", b"f", b"w", b"1000", b"9000", b"", b"t", b"4", b"", b"{}", b"1", b"0",
            b"2000", b"2500",
        ];
        type Values = Vec<Option<&'static [u8]>>;
        let values = |edit: &dyn Fn(&mut Values)| {
            let mut v: Values = good.iter().map(|f| Some(*f)).collect();
            v[6] = None; // no lease
            v[9] = None; // no scope
            edit(&mut v);
            v
        };
        let record = parse_values("k", &values(&|_| {})).unwrap();
        assert_eq!((record.version, record.updated_at), (Some(4), at(2500)));
        assert_eq!(record.scope, None);
        let field_of = |v: Values| match parse_values("k", &v) {
            Err(StoreError::Corrupt(msg)) => msg,
            other => panic!("{other:?}"),
        };
        for (at_, value, field) in [
            (1, None, "`tok`"),
            (1, Some(&b"0"[..]), "`tok`"),
            (1, Some(&b"03"[..]), "`tok`"),
            (1, Some(&b"+3"[..]), "`tok`"),
            (1, Some(&b"123456789012345678901"[..]), "`tok`"),
            (3, None, "`worker`"),
            (4, Some(&b"x"[..]), "`created`"),
            (11, None, "`result`"),
            (5, Some(&b"1e20"[..]), "`expires`"),
            (5, Some(&b"9999999999999999"[..]), "`expires`"),
            (5, None, "`expires`"),
        ] {
            let msg = field_of(values(&|v| v[at_] = value));
            assert!(msg.contains(field), "{field}: {msg}");
        }
        assert!(field_of(values(&|v| v.truncate(14))).contains("14 values"));
    }

    #[test]
    fn a_record_without_its_token_is_corrupt() {
        let s = |v: &'static str| v.as_bytes();
        let flat = [
            s("st"),
            s("p"),
            s("tok"),
            s("garbage"),
            s("lease"),
            s("1"),
            s("tool"),
            s("t"),
            s("fp"),
            s("f"),
            s("args"),
            s("{}"),
            s("created"),
            s("1"),
            s("expires"),
            s("2"),
        ];
        match parse_record("k", &flat) {
            Err(StoreError::Corrupt(msg)) => assert!(msg.contains("`tok`"), "{msg}"),
            other => panic!("{other:?}"),
        }
    }
}
