//! An in-process store: the default when nothing else is installed, and the reference
//! implementation of the trait's semantics.

use core::time::Duration;
use std::collections::HashMap;

use hashbrown::HashTable;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::{
    ClaimOutcome, ClaimRequest, Completion, HistoryEvent, HistoryKind, Observed, Record,
    RecordState, Resolution, ResolveRequest, Store, StoreError, StoreResult,
};

/// Shards keep two workers on different keys from contending for one lock.
const SHARDS: usize = 16;

/// A store that lives in this process's memory: fast, forgotten on exit.
///
/// Leases and expiry use `tokio::time::Instant`, so tests under `tokio::time::pause()`
/// can move time forward. Waiting duplicates are woken as soon as the holder finishes.
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    /// foldhash (seeded per store), not SipHash: every key the crate makes is the hex of a
    /// SHA-256 digest, which no caller can choose, so flooding one bucket would take
    /// SHA-256 preimages under a secret seed; a replay then hashes its key in a fraction
    /// of SipHash's time.
    hasher: foldhash::fast::RandomState,
    /// Fencing tokens come from one counter, so a token is never reused for a key even
    /// after its record was released or purged.
    next_token: AtomicU64,
    /// When the next claim purges expired records (see [`MemoryStore::set_purge_interval`]).
    purge: super::purge::PurgeSchedule,
}

#[derive(Default)]
struct Shard {
    records: Records,
    /// History of released keys (which have no record), until the next purge or until the
    /// key is claimed again and its history moves back into the entry.
    released: HashMap<Box<str>, Vec<Event>>,
    /// The last worker id seen. One process claims under one id, so its events share one
    /// allocation instead of a copy each.
    worker: Option<Arc<str>>,
}

/// One shard's records, keyed by the key inside each record (a `HashMap` would hold a
/// second copy of every key). Each entry keeps its key's hash: probes compare it before
/// touching the record, and growing the table never hashes again.
#[derive(Default)]
struct Records(HashTable<Entry>);

impl Records {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn get(&self, hash: u64, key: &str) -> Option<&Entry> {
        self.0.find(hash, |e| e.hash == hash && e.record.key == key)
    }

    fn get_mut(&mut self, hash: u64, key: &str) -> Option<&mut Entry> {
        self.0
            .find_mut(hash, |e| e.hash == hash && e.record.key == key)
    }

    /// Inserts `entry`, replacing the entry of the same key if there is one.
    fn insert(&mut self, entry: Entry) {
        let hash = entry.hash;
        match self.0.entry(
            hash,
            |e| e.hash == hash && e.record.key == entry.record.key,
            |e| e.hash,
        ) {
            hashbrown::hash_table::Entry::Occupied(mut slot) => *slot.get_mut() = entry,
            hashbrown::hash_table::Entry::Vacant(slot) => {
                slot.insert(entry);
            }
        }
    }

    fn remove(&mut self, hash: u64, key: &str) -> Option<Entry> {
        self.0
            .find_entry(hash, |e| e.hash == hash && e.record.key == key)
            .ok()
            .map(|slot| slot.remove().0)
    }

    fn values(&self) -> impl Iterator<Item = &Entry> {
        self.0.iter()
    }

    fn retain(&mut self, keep: impl FnMut(&mut Entry) -> bool) {
        self.0.retain(keep);
    }
}

impl Shard {
    fn worker(&mut self, worker: &str) -> Arc<str> {
        match &self.worker {
            Some(w) if **w == *worker => Arc::clone(w),
            _ => {
                let w: Arc<str> = Arc::from(worker);
                self.worker = Some(Arc::clone(&w));
                w
            }
        }
    }
}

/// A history event, stored compactly (the worker id is shared).
#[derive(Clone)]
struct Event {
    at: SystemTime,
    kind: HistoryKind,
    token: u64,
    worker: Arc<str>,
}

impl Event {
    fn new(kind: HistoryKind, token: u64, worker: Arc<str>) -> Self {
        Self {
            at: SystemTime::now(),
            kind,
            token,
            worker,
        }
    }

    fn public(&self) -> HistoryEvent {
        HistoryEvent {
            at: self.at,
            kind: self.kind,
            token: self.token,
            worker: self.worker.to_string(),
        }
    }
}

struct Entry {
    /// The hash of `record.key` under the store's hasher.
    hash: u64,
    /// The record as `lookup` reports it. Shared, so a replay hands out a reference count
    /// instead of copying the key, arguments and result. Its state and times are
    /// authoritative once completed; while in progress they are refreshed from the fields
    /// below on every read (renewals move the lease).
    record: Arc<Record>,
    /// The worker that claimed the key (its events are logged under it).
    worker: Arc<str>,
    state: State,
    created_at: Instant,
    expires_at: Instant,
    history: Vec<Event>,
}

enum State {
    InProgress {
        token: u64,
        lease_until: Instant,
        notify: Arc<Notify>,
    },
    Completed,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl core::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("len", &self.len())
            .finish()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: foldhash::fast::RandomState::default(),
            next_token: AtomicU64::new(1),
            purge: super::purge::PurgeSchedule::new(),
        }
    }

    /// How often expired records are purged without anyone calling
    /// [`purge_expired`](Store::purge_expired): the first new claim after the interval
    /// purges them, in its own call (default
    /// [`DEFAULT_PURGE_INTERVAL`](super::DEFAULT_PURGE_INTERVAL); `None` turns it off).
    pub fn set_purge_interval(&self, interval: Option<Duration>) {
        self.purge.set_interval(interval);
    }

    /// Drops every expired record and the history of released keys; the count dropped.
    fn purge_now(&self) -> u64 {
        let now = Instant::now();
        let mut purged = 0u64;
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            shard.records.retain(|e| {
                let keep = e.expires_at > now;
                if !keep {
                    wake(&e.state);
                    purged += 1;
                }
                keep
            });
            // A released key has no record, so nothing keeps its history past a purge.
            shard.released.clear();
        }
        purged
    }

    /// Number of records held (any state, expired ones included until purged).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).records.len()).sum()
    }

    /// Whether the store holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The key's hash and its shard, locked. The shard comes from bits 32 to 35 of the
    /// hash: the table inside uses the low bits for buckets and the top seven as tags, so
    /// taking either for the shard would leave every key of a shard alike in them.
    fn shard(&self, key: &str) -> (u64, MutexGuard<'_, Shard>) {
        let hash = self.hasher.hash_one(key);
        let index = ((hash >> 32) as usize) % SHARDS;
        (hash, lock(&self.shards[index]))
    }

    fn token(&self) -> u64 {
        self.next_token.fetch_add(1, Ordering::Relaxed)
    }

    /// A new in-progress entry for `req`, its claim logged as `kind`; `history` is what
    /// the key had before (a released or taken-over key keeps its earlier events).
    fn fresh(
        &self,
        shard: &mut Shard,
        hash: u64,
        req: &ClaimRequest<'_>,
        now: Instant,
        kind: HistoryKind,
        mut history: Vec<Event>,
    ) -> (u64, Entry) {
        let token = self.token();
        let sys_now = SystemTime::now();
        let lease_until = now + req.lease;
        let expires_at = now + req.ttl.max(req.lease);
        let worker = shard.worker(req.worker);
        // Most keys log exactly two events (claimed, completed); a first push would
        // otherwise reserve four.
        history.reserve_exact(2);
        history.push(Event::new(kind, token, Arc::clone(&worker)));
        let record = Record {
            key: req.key.to_owned(),
            tool: req.tool.to_owned(),
            version: Some(req.version),
            scope: req.scope.map(str::to_owned),
            fingerprint: req.fingerprint.to_owned(),
            args: req.args.to_owned(),
            state: RecordState::InProgress {
                token,
                lease_expires_at: to_system(lease_until, now, sys_now),
            },
            created_at: sys_now,
            updated_at: sys_now,
            expires_at: to_system(expires_at, now, sys_now),
        };
        let entry = Entry {
            hash,
            record: Arc::new(record),
            worker,
            state: State::InProgress {
                token,
                lease_until,
                notify: Arc::new(Notify::new()),
            },
            created_at: now,
            expires_at,
            history,
        };
        (token, entry)
    }
}

/// A poisoned shard only means another thread panicked while holding it; every update
/// below leaves an entry consistent before anything can panic, so the data is still valid.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn to_system(at: Instant, now: Instant, sys_now: SystemTime) -> SystemTime {
    if at >= now {
        sys_now + (at - now)
    } else {
        sys_now
            .checked_sub(now - at)
            .unwrap_or(SystemTime::UNIX_EPOCH)
    }
}

fn wake(state: &State) {
    if let State::InProgress { notify, .. } = state {
        notify.notify_waiters();
    }
}

impl Entry {
    fn outcome(&self, now: Instant) -> ClaimOutcome {
        match &self.state {
            State::InProgress {
                token, lease_until, ..
            } => {
                if *lease_until > now {
                    ClaimOutcome::InProgress {
                        fingerprint: self.record.fingerprint.clone(),
                        lease_remaining: *lease_until - now,
                    }
                } else {
                    ClaimOutcome::Abandoned {
                        token: *token,
                        fingerprint: self.record.fingerprint.clone(),
                    }
                }
            }
            State::Completed => ClaimOutcome::Completed(Arc::clone(&self.record)),
        }
    }

    /// The record as read at `now` (`sys_now` on the system clock): an in-progress
    /// record's lease and expiry are converted from the store's clock at that moment.
    fn record(&self, now: Instant, sys_now: SystemTime) -> Record {
        let mut record = Record::clone(&self.record);
        if let State::InProgress {
            token, lease_until, ..
        } = &self.state
        {
            record.state = RecordState::InProgress {
                token: *token,
                lease_expires_at: to_system(*lease_until, now, sys_now),
            };
            record.expires_at = to_system(self.expires_at, now, sys_now);
        }
        record
    }

    fn holds(&self, token: u64) -> bool {
        matches!(self.state, State::InProgress { token: t, .. } if t == token)
    }

    /// Completes the entry with `result`, waking whoever waits for it.
    fn complete(&mut self, result: &str, is_error: bool, ttl: Duration, now: Instant) {
        let sys_now = SystemTime::now();
        let old = core::mem::replace(&mut self.state, State::Completed);
        wake(&old);
        self.expires_at = now + ttl;
        // Not shared while in progress (only completed records are handed out), so this
        // updates in place.
        let record = Arc::make_mut(&mut self.record);
        record.state = RecordState::Completed {
            result: result.to_owned(),
            is_error,
            completed_at: sys_now,
        };
        record.updated_at = sys_now;
        record.expires_at = sys_now + ttl;
    }

    fn log(&mut self, kind: HistoryKind, token: u64, worker: Arc<str>) {
        self.history.push(Event::new(kind, token, worker));
    }
}

#[async_trait::async_trait]
impl Store for MemoryStore {
    fn backend(&self) -> &'static str {
        "memory"
    }

    /// A completed, unexpired record made in `scope`: what [`claim`](Store::claim) would
    /// answer, read under the same shard lock.
    fn completed_now(&self, key: &str, scope: Option<&str>) -> Option<Arc<Record>> {
        let now = Instant::now();
        let (hash, shard) = self.shard(key);
        let entry = shard.records.get(hash, key)?;
        let live = matches!(entry.state, State::Completed) && entry.expires_at > now;
        (live && entry.record.scope.as_deref() == scope).then(|| Arc::clone(&entry.record))
    }

    async fn claim(&self, req: ClaimRequest<'_>) -> StoreResult<ClaimOutcome> {
        let now = Instant::now();
        let (hash, mut guard) = self.shard(req.key);
        let shard = &mut *guard;
        // An expired result counts as absent; its history carries on into the new claim.
        let history = match shard.records.get_mut(hash, req.key) {
            Some(entry) => {
                let expired = matches!(entry.state, State::Completed) && entry.expires_at <= now;
                if !expired {
                    return Ok(entry.outcome(now));
                }
                core::mem::take(&mut entry.history)
            }
            None => shard.released.remove(req.key).unwrap_or_default(),
        };
        let (token, entry) = self.fresh(shard, hash, &req, now, HistoryKind::Claimed, history);
        shard.records.insert(entry);
        drop(guard);
        // The store grows only here: purge what expired, once per interval.
        if self.purge.take_due() {
            self.purge_now();
        }
        Ok(ClaimOutcome::Acquired { token })
    }

    async fn takeover(&self, req: ClaimRequest<'_>, stale_token: u64) -> StoreResult<ClaimOutcome> {
        let now = Instant::now();
        let (hash, mut guard) = self.shard(req.key);
        let shard = &mut *guard;
        let (kind, history, created_at) = match shard.records.get_mut(hash, req.key) {
            Some(entry) => {
                let outcome = entry.outcome(now);
                let stale = match &outcome {
                    ClaimOutcome::Abandoned { token, .. } => *token == stale_token,
                    ClaimOutcome::Completed(_) => entry.expires_at <= now,
                    _ => false,
                };
                if !stale {
                    return Ok(outcome);
                }
                wake(&entry.state);
                let history = core::mem::take(&mut entry.history);
                // The call resumed keeps its creation time, on both clocks (converting the
                // instant back would move it by the time elapsed between the two clocks'
                // readings).
                let created = (entry.created_at, entry.record.created_at);
                (HistoryKind::TakenOver, history, Some(created))
            }
            None => (
                HistoryKind::Claimed,
                shard.released.remove(req.key).unwrap_or_default(),
                None,
            ),
        };
        let (token, mut entry) = self.fresh(shard, hash, &req, now, kind, history);
        if let Some((created_at, created_sys)) = created_at {
            entry.created_at = created_at;
            Arc::make_mut(&mut entry.record).created_at = created_sys;
        }
        shard.records.insert(entry);
        Ok(ClaimOutcome::Acquired { token })
    }

    async fn complete(&self, key: &str, token: u64, completion: Completion<'_>) -> StoreResult {
        let now = Instant::now();
        let (hash, mut shard) = self.shard(key);
        match shard.records.get_mut(hash, key) {
            Some(entry) if entry.holds(token) => {
                entry.complete(completion.result, completion.is_error, completion.ttl, now);
                let worker = Arc::clone(&entry.worker);
                entry.log(HistoryKind::Completed, token, worker);
                Ok(())
            }
            _ => Err(StoreError::LeaseLost { token }),
        }
    }

    async fn release(&self, key: &str, token: u64) -> StoreResult {
        let (hash, mut guard) = self.shard(key);
        let shard = &mut *guard;
        match shard.records.get(hash, key) {
            Some(entry) if entry.holds(token) => {
                if let Some(mut old) = shard.records.remove(hash, key) {
                    wake(&old.state);
                    old.log(HistoryKind::Released, token, Arc::clone(&old.worker));
                    shard.released.insert(key.into(), old.history);
                }
                Ok(())
            }
            _ => Err(StoreError::LeaseLost { token }),
        }
    }

    async fn abandon(&self, key: &str, token: u64) -> StoreResult {
        let now = Instant::now();
        let (hash, mut shard) = self.shard(key);
        let Some(entry) = shard.records.get_mut(hash, key) else {
            return Err(StoreError::LeaseLost { token });
        };
        match &mut entry.state {
            State::InProgress {
                token: t,
                lease_until,
                notify,
            } if *t == token => {
                *lease_until = now;
                notify.notify_waiters();
                // Not shared while in progress: updated in place.
                Arc::make_mut(&mut entry.record).updated_at = SystemTime::now();
                let worker = Arc::clone(&entry.worker);
                entry.log(HistoryKind::Abandoned, token, worker);
                Ok(())
            }
            _ => Err(StoreError::LeaseLost { token }),
        }
    }

    async fn renew(&self, key: &str, token: u64, lease: Duration) -> StoreResult {
        let now = Instant::now();
        let (hash, mut shard) = self.shard(key);
        match shard.records.get_mut(hash, key) {
            Some(Entry {
                state:
                    State::InProgress {
                        token: t,
                        lease_until,
                        ..
                    },
                expires_at,
                ..
            }) if *t == token && *lease_until > now => {
                *lease_until = now + lease;
                if *expires_at < *lease_until {
                    *expires_at = *lease_until;
                }
                Ok(())
            }
            _ => Err(StoreError::LeaseLost { token }),
        }
    }

    async fn lookup(&self, key: &str) -> StoreResult<Option<Record>> {
        let now = Instant::now();
        let (hash, shard) = self.shard(key);
        Ok(shard
            .records
            .get(hash, key)
            .map(|e| e.record(now, SystemTime::now())))
    }

    /// The record and the clock it was converted by: the store's leases run on tokio's
    /// clock, so `now` is the system time that clock's present was converted to.
    async fn observe(&self, key: &str) -> StoreResult<Option<Observed>> {
        let (now, sys_now) = (Instant::now(), SystemTime::now());
        let (hash, shard) = self.shard(key);
        Ok(shard
            .records
            .get(hash, key)
            .map(|e| Observed::new(e.record(now, sys_now), sys_now)))
    }

    async fn pending(&self, limit: usize) -> StoreResult<Vec<Record>> {
        let (now, sys_now) = (Instant::now(), SystemTime::now());
        let mut pending: Vec<(Instant, Record)> = Vec::new();
        for shard in self.shards.iter() {
            let shard = lock(shard);
            pending.extend(
                shard
                    .records
                    .values()
                    .filter(|e| matches!(e.state, State::InProgress { .. }))
                    .map(|e| (e.created_at, e.record(now, sys_now))),
            );
        }
        pending.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.key.cmp(&b.1.key)));
        Ok(pending.into_iter().take(limit).map(|(_, r)| r).collect())
    }

    async fn resolve(&self, request: ResolveRequest<'_>) -> StoreResult {
        let now = Instant::now();
        let token = self.token();
        let key = request.key;
        let (hash, mut guard) = self.shard(key);
        let shard = &mut *guard;
        let worker: Arc<str> = Arc::from(request.worker);
        let Some(entry) = shard.records.get_mut(hash, key) else {
            return Err(StoreError::NotPending);
        };
        if !matches!(entry.state, State::InProgress { .. }) {
            return Err(StoreError::NotPending);
        }
        match request.resolution {
            Resolution::Complete { result, ttl } => {
                entry.complete(result, false, ttl, now);
                entry.log(request.kind, token, worker);
            }
            Resolution::Release => {
                if let Some(mut old) = shard.records.remove(hash, key) {
                    wake(&old.state);
                    old.log(request.kind, token, worker);
                    shard.released.insert(key.into(), old.history);
                }
            }
        }
        Ok(())
    }

    async fn history(&self, key: &str) -> StoreResult<Vec<HistoryEvent>> {
        let (hash, shard) = self.shard(key);
        let events = match shard.records.get(hash, key) {
            Some(entry) => &entry.history,
            None => match shard.released.get(key) {
                Some(events) => events,
                None => return Ok(Vec::new()),
            },
        };
        Ok(events.iter().map(Event::public).collect())
    }

    async fn purge_expired(&self) -> StoreResult<u64> {
        Ok(self.purge_now())
    }

    async fn wait(&self, key: &str, timeout: Duration) {
        // Armed while the shard is locked, so a holder finishing right after the caller's
        // last claim cannot wake nobody: either we see it finished, or we get its wake.
        let armed = {
            let (hash, shard) = self.shard(key);
            match shard.records.get(hash, key) {
                Some(Entry {
                    state: State::InProgress { notify, .. },
                    ..
                }) => {
                    let mut notified = Box::pin(Arc::clone(notify).notified_owned());
                    notified.as_mut().enable();
                    notified
                }
                _ => return,
            }
        };
        let _ = tokio::time::timeout(timeout, armed).await;
    }
}
