//! An in-process store: the default when nothing else is installed, and the reference
//! implementation of the trait's semantics.

use core::time::Duration;
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::{
    ClaimOutcome, ClaimRequest, Completion, HistoryEvent, HistoryKind, Record, RecordState,
    Resolution, Store, StoreError,
};

/// Shards keep two workers on different keys from contending for one lock.
const SHARDS: usize = 16;

/// A store that lives in this process's memory: fast, forgotten on exit.
///
/// Leases and expiry use `tokio::time::Instant`, so tests under `tokio::time::pause()`
/// can move time forward. Waiting duplicates are woken as soon as the holder finishes.
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    /// Fencing tokens come from one counter, so a token is never reused for a key even
    /// after its record was released or purged.
    next_token: AtomicU64,
}

#[derive(Default)]
struct Shard {
    records: HashMap<Box<str>, Entry>,
    /// Kept apart from records: a released key has no record but keeps its history.
    history: HashMap<Box<str>, Vec<HistoryEvent>>,
}

impl Shard {
    fn log(&mut self, key: &str, kind: HistoryKind, token: u64, worker: &str) {
        let event = HistoryEvent {
            at: SystemTime::now(),
            kind,
            token,
            worker: worker.to_owned(),
        };
        match self.history.get_mut(key) {
            Some(events) => events.push(event),
            None => {
                self.history.insert(key.into(), vec![event]);
            }
        }
    }
}

struct Entry {
    tool: Box<str>,
    worker: Box<str>,
    scope: Option<Box<str>>,
    fingerprint: Box<str>,
    args: Box<str>,
    state: State,
    created_at: Instant,
    expires_at: Instant,
}

enum State {
    InProgress {
        token: u64,
        lease_until: Instant,
        notify: Arc<Notify>,
    },
    Completed {
        result: Box<str>,
        is_error: bool,
        completed_at: Instant,
    },
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
            hasher: RandomState::new(),
            next_token: AtomicU64::new(1),
        }
    }

    /// Number of records held (any state, expired ones included until purged).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).records.len()).sum()
    }

    /// Whether the store holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, Shard> {
        let index = (self.hasher.hash_one(key) as usize) % SHARDS;
        lock(&self.shards[index])
    }

    fn token(&self) -> u64 {
        self.next_token.fetch_add(1, Ordering::Relaxed)
    }

    fn fresh(&self, req: &ClaimRequest<'_>, now: Instant) -> (u64, Entry) {
        let token = self.token();
        let entry = Entry {
            tool: req.tool.into(),
            worker: req.worker.into(),
            scope: req.scope.map(Into::into),
            fingerprint: req.fingerprint.into(),
            args: req.args.into(),
            state: State::InProgress {
                token,
                lease_until: now + req.lease,
                notify: Arc::new(Notify::new()),
            },
            created_at: now,
            expires_at: now + req.ttl.max(req.lease),
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
    fn outcome(&self, key: &str, now: Instant) -> ClaimOutcome {
        match &self.state {
            State::InProgress {
                token, lease_until, ..
            } => {
                if *lease_until > now {
                    ClaimOutcome::InProgress {
                        fingerprint: self.fingerprint.to_string(),
                        lease_remaining: *lease_until - now,
                    }
                } else {
                    ClaimOutcome::Abandoned {
                        token: *token,
                        fingerprint: self.fingerprint.to_string(),
                    }
                }
            }
            State::Completed { .. } => ClaimOutcome::Completed(self.record(key, now)),
        }
    }

    fn record(&self, key: &str, now: Instant) -> Record {
        let sys_now = SystemTime::now();
        let state = match &self.state {
            State::InProgress {
                token, lease_until, ..
            } => RecordState::InProgress {
                token: *token,
                lease_expires_at: to_system(*lease_until, now, sys_now),
            },
            State::Completed {
                result,
                is_error,
                completed_at,
            } => RecordState::Completed {
                result: result.to_string(),
                is_error: *is_error,
                completed_at: to_system(*completed_at, now, sys_now),
            },
        };
        Record {
            key: key.to_owned(),
            tool: self.tool.to_string(),
            scope: self.scope.as_deref().map(str::to_owned),
            fingerprint: self.fingerprint.to_string(),
            args: self.args.to_string(),
            state,
            created_at: to_system(self.created_at, now, sys_now),
            expires_at: to_system(self.expires_at, now, sys_now),
        }
    }

    fn holds(&self, token: u64) -> bool {
        matches!(self.state, State::InProgress { token: t, .. } if t == token)
    }
}

#[async_trait::async_trait]
impl Store for MemoryStore {
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        let now = Instant::now();
        let mut shard = self.shard(req.key);
        if let Some(entry) = shard.records.get(req.key) {
            let expired_result =
                matches!(entry.state, State::Completed { .. }) && entry.expires_at <= now;
            if !expired_result {
                return Ok(entry.outcome(req.key, now));
            }
        }
        let (token, entry) = self.fresh(&req, now);
        shard.records.insert(req.key.into(), entry);
        shard.log(req.key, HistoryKind::Claimed, token, req.worker);
        Ok(ClaimOutcome::Acquired { token })
    }

    async fn takeover(
        &self,
        req: ClaimRequest<'_>,
        stale_token: u64,
    ) -> Result<ClaimOutcome, StoreError> {
        let now = Instant::now();
        let mut shard = self.shard(req.key);
        let abandoned = match shard.records.get(req.key) {
            Some(entry) => match entry.outcome(req.key, now) {
                ClaimOutcome::Abandoned { token, .. } if token == stale_token => true,
                ClaimOutcome::Completed(_) if entry.expires_at <= now => true,
                other => return Ok(other),
            },
            None => true,
        };
        debug_assert!(abandoned);
        let (token, mut entry) = self.fresh(&req, now);
        let kind = match shard.records.get(req.key) {
            Some(old) => {
                entry.created_at = old.created_at;
                wake(&old.state);
                HistoryKind::TakenOver
            }
            None => HistoryKind::Claimed,
        };
        shard.records.insert(req.key.into(), entry);
        shard.log(req.key, kind, token, req.worker);
        Ok(ClaimOutcome::Acquired { token })
    }

    async fn complete(
        &self,
        key: &str,
        token: u64,
        completion: Completion<'_>,
    ) -> Result<(), StoreError> {
        let now = Instant::now();
        let mut shard = self.shard(key);
        match shard.records.get_mut(key) {
            Some(entry) if entry.holds(token) => {
                let old = core::mem::replace(
                    &mut entry.state,
                    State::Completed {
                        result: completion.result.into(),
                        is_error: completion.is_error,
                        completed_at: now,
                    },
                );
                entry.expires_at = now + completion.ttl;
                wake(&old);
                let worker = entry.worker.clone();
                shard.log(key, HistoryKind::Completed, token, &worker);
                Ok(())
            }
            _ => Err(StoreError::LeaseLost { token }),
        }
    }

    async fn release(&self, key: &str, token: u64) -> Result<(), StoreError> {
        let mut shard = self.shard(key);
        match shard.records.get(key) {
            Some(entry) if entry.holds(token) => {
                if let Some(old) = shard.records.remove(key) {
                    wake(&old.state);
                    shard.log(key, HistoryKind::Released, token, &old.worker);
                }
                Ok(())
            }
            _ => Err(StoreError::LeaseLost { token }),
        }
    }

    async fn abandon(&self, key: &str, token: u64) -> Result<(), StoreError> {
        let now = Instant::now();
        let mut shard = self.shard(key);
        match shard.records.get_mut(key) {
            Some(Entry {
                state:
                    State::InProgress {
                        token: t,
                        lease_until,
                        notify,
                    },
                worker,
                ..
            }) if *t == token => {
                *lease_until = now;
                notify.notify_waiters();
                let worker = worker.clone();
                shard.log(key, HistoryKind::Abandoned, token, &worker);
                Ok(())
            }
            _ => Err(StoreError::LeaseLost { token }),
        }
    }

    async fn renew(&self, key: &str, token: u64, lease: Duration) -> Result<(), StoreError> {
        let now = Instant::now();
        let mut shard = self.shard(key);
        match shard.records.get_mut(key) {
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

    async fn lookup(&self, key: &str) -> Result<Option<Record>, StoreError> {
        let now = Instant::now();
        Ok(self.shard(key).records.get(key).map(|e| e.record(key, now)))
    }

    async fn pending(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        let now = Instant::now();
        let mut pending: Vec<(Instant, Record)> = Vec::new();
        for shard in self.shards.iter() {
            let shard = lock(shard);
            pending.extend(
                shard
                    .records
                    .iter()
                    .filter(|(_, e)| matches!(e.state, State::InProgress { .. }))
                    .map(|(k, e)| (e.created_at, e.record(k, now))),
            );
        }
        pending.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.key.cmp(&b.1.key)));
        Ok(pending.into_iter().take(limit).map(|(_, r)| r).collect())
    }

    async fn resolve(
        &self,
        key: &str,
        resolution: Resolution<'_>,
        kind: HistoryKind,
        worker: &str,
    ) -> Result<(), StoreError> {
        let now = Instant::now();
        let token = self.token();
        let mut shard = self.shard(key);
        let Some(entry) = shard.records.get_mut(key) else {
            return Err(StoreError::NotPending);
        };
        if !matches!(entry.state, State::InProgress { .. }) {
            return Err(StoreError::NotPending);
        }
        match resolution {
            Resolution::Complete { result, ttl } => {
                let old = core::mem::replace(
                    &mut entry.state,
                    State::Completed {
                        result: result.into(),
                        is_error: false,
                        completed_at: now,
                    },
                );
                entry.expires_at = now + ttl;
                wake(&old);
            }
            Resolution::Release => {
                if let Some(old) = shard.records.remove(key) {
                    wake(&old.state);
                }
            }
        }
        shard.log(key, kind, token, worker);
        Ok(())
    }

    async fn history(&self, key: &str) -> Result<Vec<HistoryEvent>, StoreError> {
        Ok(self
            .shard(key)
            .history
            .get(key)
            .cloned()
            .unwrap_or_default())
    }

    async fn purge_expired(&self) -> Result<u64, StoreError> {
        let now = Instant::now();
        let mut purged = 0u64;
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            let Shard { records, history } = &mut *shard;
            records.retain(|_, e| {
                let keep = e.expires_at > now;
                if !keep {
                    wake(&e.state);
                    purged += 1;
                }
                keep
            });
            history.retain(|k, _| records.contains_key(k));
        }
        Ok(purged)
    }

    async fn wait(&self, key: &str, timeout: Duration) {
        // Armed while the shard is locked, so a holder finishing right after the caller's
        // last claim cannot wake nobody: either we see it finished, or we get its wake.
        let armed = {
            let shard = self.shard(key);
            match shard.records.get(key) {
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
