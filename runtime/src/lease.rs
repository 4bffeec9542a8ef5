//! The lease layer: the one owner of a key's claim cycle.
//!
//! claim -> (wait | take over | settle) -> heartbeat while the body runs -> complete,
//! release or abandon, fenced by the token the claim returned. The engine (tool calls),
//! runs (the run itself, its steps and journal positions), recovery and the HTTP
//! `IdempotencyLayer` (feature `http`) all go through
//! [`acquire`] and [`Lease`]; nothing else in the crate calls the store's `claim`,
//! `takeover`, `renew`, `complete`, `release` or `abandon`. What differs between callers is
//! only their [`Policy`]: whether a duplicate waits for a live holder, whether an
//! abandoned claim is taken over, which argument fingerprints may share the key.

use core::future::Future;
use core::time::Duration;
use std::sync::Arc;

use crate::store::{ClaimOutcome, ClaimRequest, Completion, Record, Store, StoreError};
use crate::telemetry::LeaseHeld;

/// What a caller does when another live worker holds the key.
#[derive(Debug, Clone, Copy)]
pub(crate) enum OnBusy {
    /// Report [`Acquired::Busy`] at once.
    Report,
    /// Wait for the holder to finish, at most `max` in all (`None`: as long as it lives).
    Wait {
        /// The most this caller waits, from the first busy answer.
        max: Option<Duration>,
    },
}

/// How a caller acquires a key.
#[derive(Clone, Copy)]
pub(crate) struct Policy<'a> {
    /// A live holder: wait or report.
    pub(crate) on_busy: OnBusy,
    /// An abandoned claim (outcome unknown): take it over (`true`) or report it.
    pub(crate) take_over: bool,
    /// Whether a holder whose argument fingerprint is this one may share the key; a
    /// refused one is reported as [`Acquired::Mismatch`] before anything else is done.
    pub(crate) accepts: &'a (dyn Fn(&str) -> bool + Sync),
}

/// Accepts every fingerprint: for keys whose claims carry none (runs and steps).
pub(crate) fn any_fingerprint(_: &str) -> bool {
    true
}

/// Where [`acquire`] left the key.
pub(crate) enum Acquired {
    /// This caller holds the key.
    Held(Lease),
    /// The key is completed: its record (the stored result).
    Completed(Arc<Record>),
    /// A live holder (its policy said report, or the wait ran out).
    Busy {
        /// How long the holder's lease still runs.
        lease_remaining: Duration,
    },
    /// An abandoned claim the policy does not take over.
    Abandoned,
    /// A holder's fingerprint the policy refuses; `record` when the answer carried it
    /// (a completed key), else the caller may look the record up to explain.
    Mismatch {
        /// The other holder's fingerprint.
        fingerprint: String,
        /// Its record, if the store returned it.
        record: Option<Arc<Record>>,
    },
}

/// What [`acquire`] would answer for a key the store can tell is completed without I/O
/// ([`Store::completed_now`]: an in-process store, a near cache's copy), found before any
/// claim request is made: the record, or [`Acquired::Mismatch`] if `policy` refuses its
/// fingerprint. A record that holds exactly `args` (the caller's canonical arguments
/// document) holds the caller's own arguments, so it is accepted without asking `policy`:
/// a caller whose fingerprint is a digest of `args` need not compute it. `None`: claim
/// with [`acquire`].
pub(crate) fn completed_now(
    store: &Arc<dyn Store>,
    key: &str,
    scope: Option<&str>,
    args: &str,
    policy: &Policy<'_>,
) -> Option<Acquired> {
    let record = store.completed_now(key, scope)?;
    if record.args == args {
        return Some(Acquired::Completed(record));
    }
    Some(completed(record, policy))
}

/// A completed record under `policy`: the record, or a mismatch if its fingerprint is
/// refused.
fn completed(record: Arc<Record>, policy: &Policy<'_>) -> Acquired {
    if (policy.accepts)(&record.fingerprint) {
        Acquired::Completed(record)
    } else {
        Acquired::Mismatch {
            fingerprint: record.fingerprint.clone(),
            record: Some(record),
        }
    }
}

/// Claims `req.key` under `policy`: loops over the store's answers until the key is held
/// or settled (completed, busy, abandoned, refused).
pub(crate) async fn acquire(
    store: &Arc<dyn Store>,
    req: ClaimRequest<'_>,
    policy: Policy<'_>,
) -> Result<Acquired, StoreError> {
    let mut answer = store.claim(req).await?;
    // A waiting duplicate's patience runs from the first busy answer (tokio's clock: it
    // measures only this caller's patience, never a lease).
    let mut deadline: Option<tokio::time::Instant> = None;
    let mut taken_over = false;
    loop {
        answer = match answer {
            ClaimOutcome::Acquired { token } => {
                return Ok(Acquired::Held(Lease {
                    store: Arc::clone(store),
                    key: req.key.to_owned(),
                    tool: req.tool.to_owned(),
                    token,
                    lease: req.lease,
                    ttl: req.ttl,
                    taken_over,
                    _held: LeaseHeld::new(req.tool),
                }))
            }
            ClaimOutcome::Completed(record) => return Ok(completed(record, &policy)),
            ClaimOutcome::InProgress {
                fingerprint,
                lease_remaining,
            } => {
                if !(policy.accepts)(&fingerprint) {
                    return Ok(Acquired::Mismatch {
                        fingerprint,
                        record: None,
                    });
                }
                let patience = match policy.on_busy {
                    OnBusy::Report => return Ok(Acquired::Busy { lease_remaining }),
                    OnBusy::Wait { max: None } => Duration::MAX,
                    OnBusy::Wait { max: Some(max) } => {
                        let now = tokio::time::Instant::now();
                        deadline
                            .get_or_insert(now + max)
                            .saturating_duration_since(now)
                    }
                };
                if patience.is_zero() {
                    return Ok(Acquired::Busy { lease_remaining });
                }
                tracing::debug!(
                    tool = req.tool,
                    key = req.key,
                    decision = "waited",
                    "tool-contracts: waiting for the running call"
                );
                // Past the lease the holder counts as dead: wake then to see it abandoned.
                store
                    .wait(
                        req.key,
                        (lease_remaining + Duration::from_millis(5)).min(patience),
                    )
                    .await;
                store.claim(req).await?
            }
            ClaimOutcome::Abandoned { token, fingerprint } => {
                if !(policy.accepts)(&fingerprint) {
                    return Ok(Acquired::Mismatch {
                        fingerprint,
                        record: None,
                    });
                }
                if !policy.take_over {
                    return Ok(Acquired::Abandoned);
                }
                taken_over = true;
                store.takeover(req, token).await?
            }
        };
    }
}

/// A held claim on a key: run the body under it with [`Lease::heartbeat`] or
/// [`Lease::keep_alive`], then end it with [`complete`](Lease::complete),
/// [`release`](Lease::release) or [`abandon`](Lease::abandon); each is fenced by the
/// token, so a holder whose lease was taken over changes nothing.
///
/// Dropped without an ending, the claim stays until its lease runs out and then counts as
/// abandoned (outcome unknown), which is what a crash leaves too.
pub(crate) struct Lease {
    store: Arc<dyn Store>,
    key: String,
    tool: String,
    token: u64,
    lease: Duration,
    ttl: Duration,
    taken_over: bool,
    /// Counts this lease as held (`tool_contracts.leases.held`, feature `otel`) until it
    /// is ended or dropped; zero-sized without the feature.
    _held: LeaseHeld,
}

impl Lease {
    /// Whether the claim was taken over from a worker that died mid-call.
    pub(crate) fn taken_over(&self) -> bool {
        self.taken_over
    }

    /// Stores the result (or, with `is_error`, a tool error to replay) and ends the claim.
    pub(crate) async fn complete(self, result: &str, is_error: bool) -> Result<(), StoreError> {
        let completion = Completion {
            result,
            is_error,
            ttl: self.ttl,
        };
        self.store.complete(&self.key, self.token, completion).await
    }

    /// Frees the key: the next call runs again.
    pub(crate) async fn release(self) -> Result<(), StoreError> {
        self.store.release(&self.key, self.token).await
    }

    /// Gives the lease up at once, leaving the outcome unknown (for results that do not
    /// say whether the effect happened).
    pub(crate) async fn abandon(self) -> Result<(), StoreError> {
        self.store.abandon(&self.key, self.token).await
    }

    /// Runs `body` while a task of its own renews the lease every third of it. The
    /// renewals run on the runtime's other threads, so a body that blocks its thread (a
    /// synchronous client, `std::thread::sleep`) keeps its lease on a multi-thread
    /// runtime; on a current-thread runtime nothing can run while the body blocks (see
    /// docs/guarantees.md). The heartbeat stops when the body ends or is dropped, and no
    /// renewal is in flight once this returns.
    pub(crate) async fn heartbeat<F: Future>(&self, body: F) -> F::Output {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // Polled off a tokio runtime (another executor): renew beside the body in its
            // own task, which needs tokio's timers only once the body has to wait.
            let renewals = async {
                self.renewals(crate::ambient::current_progress()).await;
                core::future::pending::<core::convert::Infallible>().await
            };
            return tokio::select! {
                biased;
                out = body => out,
                never = renewals => match never {},
            };
        };
        let (stop, renewals) = self.spawn_renewals(&runtime);
        // Wait until the heartbeat task has run once (its timer is armed): a task spawned
        // but never polled sits in this thread's LIFO slot, which other workers do not
        // steal, so a body that blocks at once would stop it from ever starting.
        let _ = renewals.started.await;
        let out = body.await;
        let _ = stop.send(());
        // A renewal in flight finishes before the caller completes or releases the key.
        // A panic is in practice a runtime built without `enable_time`, where no lease can
        // be timed; a cancellation is a runtime shutting down.
        if let Some(e) = renewals
            .task
            .await
            .err()
            .filter(tokio::task::JoinError::is_panic)
        {
            tracing::error!(tool = %self.tool, key = %self.key, error = %e, "tool-contracts: the lease heartbeat failed (is the tokio runtime built with `enable_time`?); the lease was not renewed");
        }
        out
    }

    /// Renews the lease in the background until the returned guard is dropped: for a
    /// claim held across many awaits of its owner (a run).
    pub(crate) fn keep_alive(&self) -> Option<KeepAlive> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let (stop, renewals) = self.spawn_renewals(&runtime);
        Some(KeepAlive {
            _stop: stop,
            task: renewals.task,
        })
    }

    fn spawn_renewals(
        &self,
        runtime: &tokio::runtime::Handle,
    ) -> (tokio::sync::oneshot::Sender<()>, Renewals) {
        // Dropped with its sender (the caller gave up on the body): the heartbeat then
        // stops, and the lease runs out as it should for an abandoned call.
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let (started_tx, started) = tokio::sync::oneshot::channel::<()>();
        // Taken here: the task below does not see this task's task-locals.
        let progress = crate::ambient::current_progress();
        let copy = Lease {
            store: Arc::clone(&self.store),
            key: self.key.clone(),
            tool: self.tool.clone(),
            // The heartbeat's copy renews this lease; it is not a lease of its own.
            _held: LeaseHeld::none(),
            ..*self
        };
        let task = runtime.spawn(async move {
            let _ = started_tx.send(());
            tokio::select! {
                biased;
                _ = &mut stopped => {}
                () = copy.renewals(progress) => {}
            }
        });
        (stop, Renewals { started, task })
    }

    /// Renews every third of the lease until the lease is lost, telling `progress` (the
    /// caller's [`ProgressHook`](crate::ambient::ProgressHook)) after each renewal.
    async fn renewals(&self, progress: Option<crate::ambient::ProgressHook>) {
        let period = (self.lease / 3).max(Duration::from_millis(1));
        loop {
            tokio::time::sleep(period).await;
            match self.store.renew(&self.key, self.token, self.lease).await {
                Ok(()) => {
                    if let Some(report) = &progress {
                        report();
                    }
                }
                Err(StoreError::LeaseLost { .. }) => {
                    tracing::error!(tool = %self.tool, key = %self.key, "tool-contracts: lease lost while the body runs (another worker took the key over); this worker's result will not be stored");
                    return;
                }
                Err(e) => {
                    tracing::warn!(tool = %self.tool, key = %self.key, error = %e, "tool-contracts: lease renewal failed; retrying at the next heartbeat");
                }
            }
        }
    }
}

struct Renewals {
    started: tokio::sync::oneshot::Receiver<()>,
    task: tokio::task::JoinHandle<()>,
}

/// Background renewal of a [`Lease`] held across awaits; stops when dropped.
pub(crate) struct KeepAlive {
    _stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    fn request<'a>(key: &'a str, fingerprint: &'a str, lease: Duration) -> ClaimRequest<'a> {
        ClaimRequest {
            key,
            tool: "lease_test",
            version: 1,
            scope: None,
            fingerprint,
            args: "{}",
            lease,
            ttl: Duration::from_secs(60),
            worker: "test",
        }
    }

    fn policy(on_busy: OnBusy, take_over: bool) -> Policy<'static> {
        Policy {
            on_busy,
            take_over,
            accepts: &any_fingerprint,
        }
    }

    fn held(acquired: Acquired) -> Lease {
        match acquired {
            Acquired::Held(lease) => lease,
            _ => panic!("expected a held lease"),
        }
    }

    #[tokio::test]
    async fn a_held_key_is_reported_or_waited_for_by_policy_then_replayed() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let long = Duration::from_secs(30);
        let first = held(
            acquire(
                &store,
                request("k", "f", long),
                policy(OnBusy::Report, false),
            )
            .await
            .unwrap(),
        );
        assert!(!first.taken_over());
        let busy = acquire(
            &store,
            request("k", "f", long),
            policy(OnBusy::Report, false),
        )
        .await
        .unwrap();
        assert!(matches!(busy, Acquired::Busy { .. }));
        // A wait bounded by `max` gives up as busy.
        let waited = acquire(
            &store,
            request("k", "f", long),
            policy(
                OnBusy::Wait {
                    max: Some(Duration::from_millis(30)),
                },
                false,
            ),
        )
        .await
        .unwrap();
        assert!(matches!(waited, Acquired::Busy { .. }));
        // A foreign fingerprint is refused before anything else.
        let only_g = |f: &str| f == "g";
        let refused = acquire(
            &store,
            request("k", "g", long),
            Policy {
                on_busy: OnBusy::Report,
                take_over: true,
                accepts: &only_g,
            },
        )
        .await
        .unwrap();
        assert!(
            matches!(refused, Acquired::Mismatch { ref fingerprint, record: None } if fingerprint == "f")
        );
        first.complete("7", false).await.unwrap();
        match acquire(
            &store,
            request("k", "f", long),
            policy(OnBusy::Report, false),
        )
        .await
        .unwrap()
        {
            Acquired::Completed(record) => assert!(
                matches!(&record.state, crate::store::RecordState::Completed { result, .. } if result == "7")
            ),
            _ => panic!("expected the completed record"),
        }
    }

    #[tokio::test]
    async fn an_abandoned_key_is_taken_over_only_when_the_policy_says_so_and_fences_the_old_holder()
    {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let short = Duration::from_millis(20);
        let stale = held(
            acquire(
                &store,
                request("k", "f", short),
                policy(OnBusy::Report, false),
            )
            .await
            .unwrap(),
        );
        tokio::time::sleep(Duration::from_millis(40)).await;
        let reported = acquire(
            &store,
            request("k", "f", short),
            policy(OnBusy::Report, false),
        )
        .await
        .unwrap();
        assert!(matches!(reported, Acquired::Abandoned));
        let fresh = held(
            acquire(
                &store,
                request("k", "f", Duration::from_secs(30)),
                policy(OnBusy::Report, true),
            )
            .await
            .unwrap(),
        );
        assert!(fresh.taken_over());
        // The stale holder's ending changes nothing: its token was fenced out.
        assert!(matches!(
            stale.complete("1", false).await,
            Err(StoreError::LeaseLost { .. })
        ));
        fresh.complete("2", false).await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_heartbeat_keeps_a_long_body_s_lease_and_stops_with_it() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let lease = Duration::from_millis(60);
        let holder = held(
            acquire(
                &store,
                request("k", "f", lease),
                policy(OnBusy::Report, false),
            )
            .await
            .unwrap(),
        );
        let busy_during = holder
            .heartbeat(async {
                tokio::time::sleep(Duration::from_millis(200)).await;
                acquire(
                    &store,
                    request("k", "f", lease),
                    policy(OnBusy::Report, false),
                )
                .await
            })
            .await
            .unwrap();
        assert!(
            matches!(busy_during, Acquired::Busy { .. }),
            "renewed past three leases"
        );
        // Stopped with the body: the lease now runs out.
        tokio::time::sleep(Duration::from_millis(120)).await;
        let after = acquire(
            &store,
            request("k", "f", lease),
            policy(OnBusy::Report, false),
        )
        .await
        .unwrap();
        assert!(matches!(after, Acquired::Abandoned));
    }
}
