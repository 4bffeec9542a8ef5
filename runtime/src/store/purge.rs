//! Background purge of expired records, so a store that keeps them in tables or memory
//! (MemoryStore, SqliteStore, PostgresStore) does not grow until someone calls
//! [`Store::purge_expired`](super::Store::purge_expired). Redis expires its keys itself.
//!
//! No timer task of its own: the first claim after the interval has passed wins the purge
//! (one compare-and-swap; the others carry on) and runs it beside the claim, in a task of
//! its own where a tokio runtime is present. A store nobody calls needs no purge.

use core::time::Duration;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// How often, by default, expired records are purged (`set_purge_interval` changes it).
pub const DEFAULT_PURGE_INTERVAL: Duration = Duration::from_secs(60);

/// When the next purge of one store is due, shared by all its callers.
#[derive(Debug)]
pub(crate) struct PurgeSchedule {
    base: Instant,
    /// Milliseconds between purges; 0 turns the background purge off.
    interval_ms: AtomicU64,
    /// Milliseconds after `base` at which the next purge is due.
    next_ms: AtomicU64,
}

impl PurgeSchedule {
    pub(crate) fn new() -> Self {
        let interval = millis(Some(DEFAULT_PURGE_INTERVAL));
        Self {
            base: Instant::now(),
            interval_ms: AtomicU64::new(interval),
            next_ms: AtomicU64::new(interval),
        }
    }

    /// Purge every `interval` (`None`: never in the background), the next one an interval
    /// from now.
    pub(crate) fn set_interval(&self, interval: Option<Duration>) {
        let interval = millis(interval);
        self.interval_ms.store(interval, Ordering::Relaxed);
        self.next_ms
            .store(self.now_ms().saturating_add(interval), Ordering::Relaxed);
    }

    /// Whether this caller should purge now: true for one caller per interval.
    pub(crate) fn take_due(&self) -> bool {
        let interval = self.interval_ms.load(Ordering::Relaxed);
        if interval == 0 {
            return false;
        }
        let now = self.now_ms();
        let next = self.next_ms.load(Ordering::Relaxed);
        now >= next
            && self
                .next_ms
                .compare_exchange(
                    next,
                    now.saturating_add(interval),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// `interval` in milliseconds, at least 1; `None` is 0 (off).
fn millis(interval: Option<Duration>) -> u64 {
    interval.map_or(0, |d| {
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
    })
}

/// If a purge is due by `schedule`, runs `store().purge_expired()` in a task of its own
/// (where a tokio runtime is present); its outcome is logged (a failed purge is retried at
/// the next interval). `store` makes the handle the task owns, only when one is due.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn purge_if_due<S: super::Store>(
    schedule: &PurgeSchedule,
    name: &'static str,
    store: impl FnOnce() -> S,
) {
    if !schedule.take_due() {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let store = store();
    runtime.spawn(async move {
        match store.purge_expired().await {
            Ok(purged) => {
                tracing::debug!(store = name, purged, "tool-contracts: purged expired records")
            }
            Err(e) => {
                tracing::warn!(store = name, error = %e, "tool-contracts: background purge failed; retrying at the next interval")
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_caller_per_interval_wins_the_purge() {
        let schedule = PurgeSchedule::new();
        assert!(!schedule.take_due(), "not due before the first interval");
        schedule.set_interval(Some(Duration::from_millis(1)));
        std::thread::sleep(Duration::from_millis(5));
        assert!(schedule.take_due());
        assert!(!schedule.take_due(), "the next one is an interval away");
        schedule.set_interval(None);
        std::thread::sleep(Duration::from_millis(5));
        assert!(!schedule.take_due(), "off");
    }
}
