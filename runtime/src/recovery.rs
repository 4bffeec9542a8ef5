//! Reconciling abandoned calls without their caller: a worker died mid-call, nobody
//! retries, and the key would stay "outcome unknown" until someone looks. The recovery task
//! finds such keys, takes each over, and asks the tool's `verify` whether the effect
//! happened, using the arguments the store kept.

use core::time::Duration;
use std::sync::Arc;

use crate::ambient;
use crate::error::Error;
use crate::lease::{self, Acquired, OnBusy, Policy};
use crate::registry::Registry;
use crate::store::{ClaimRequest, Record, Store};

/// What one recovery pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecoveryReport {
    /// Abandoned keys whose effect `verify` found: completed with its result.
    pub completed: Vec<String>,
    /// Abandoned keys whose effect had not happened: released, so the next call runs.
    pub released: Vec<String>,
    /// Abandoned keys left unknown: the tool has no `verify`, is not in the registry, or
    /// `verify` failed. An operator must resolve them.
    pub unresolved: Vec<String>,
    /// Pending keys still held by a live worker.
    pub live: usize,
}

/// How many pending keys one pass looks at.
const BATCH: usize = 1000;

/// One recovery pass over the current store (see [`with_store`](crate::with_store)).
pub async fn recover_once(registry: &Registry) -> Result<RecoveryReport, Error> {
    let store = ambient::current_store();
    let pending = store.pending(BATCH).await.map_err(|e| Error::Store {
        tool: "(recovery)".to_owned(),
        key: None,
        source: e,
    })?;
    let mut report = RecoveryReport::default();
    for record in pending {
        reconcile(&store, registry, &record, &mut report).await;
    }
    Ok(report)
}

/// Runs [`recover_once`] every `interval`, forever: spawn it beside your workers.
/// Errors are logged and the next pass tries again.
pub async fn recover(registry: Registry, interval: Duration) {
    loop {
        match recover_once(&registry).await {
            Ok(report) => {
                if !(report.completed.is_empty()
                    && report.released.is_empty()
                    && report.unresolved.is_empty())
                {
                    tracing::info!(
                        completed = report.completed.len(),
                        released = report.released.len(),
                        unresolved = report.unresolved.len(),
                        "tool-contracts: recovery pass"
                    );
                }
            }
            Err(e) => tracing::warn!(error = %e, "tool-contracts: recovery pass failed"),
        }
        tokio::time::sleep(interval).await;
    }
}

async fn reconcile(
    store: &Arc<dyn Store>,
    registry: &Registry,
    record: &Record,
    report: &mut RecoveryReport,
) {
    let key = record.key.clone();
    // An approval request is not a call: nothing ran, so there is nothing to reconcile; an
    // expired one is asked again by the call's next attempt (docs/approval.md).
    if crate::approval::is_request(record) {
        report.live += 1;
        return;
    }
    // A name two contracts share cannot say whose call this was: never let one tool's
    // `verify` settle another's effect.
    if let Err(e) = crate::contracts::check_unique(&record.tool) {
        tracing::warn!(key = %record.key, error = %e, "tool-contracts: recovery cannot tell which tool made this call; resolve it by hand");
        report.unresolved.push(key);
        return;
    }
    let Some(tool) = registry.get(&record.tool) else {
        report.unresolved.push(key);
        return;
    };
    let req = ClaimRequest {
        key: &record.key,
        tool: &record.tool,
        version: tool.version(),
        scope: record.scope.as_deref(),
        fingerprint: &record.fingerprint,
        args: &record.args,
        lease: tool.lease(),
        ttl: tool.ttl(),
        worker: ambient::worker_id(),
    };
    // The store decides, by its own clock, whether the claim is abandoned; only a tool
    // with a `verify` can settle one.
    let verify = tool.reconcile_fn();
    let policy = Policy {
        on_busy: OnBusy::Report,
        take_over: verify.is_some(),
        accepts: &lease::any_fingerprint,
    };
    let lease = match lease::acquire(store, req, policy).await {
        Ok(Acquired::Held(lease)) if lease.taken_over() => lease,
        Ok(Acquired::Held(lease)) => {
            // Released or purged meanwhile: we claimed a free key we have no call for.
            let _ = lease.release().await;
            return;
        }
        Ok(Acquired::Busy { .. }) => {
            report.live += 1;
            return;
        }
        // Settled meanwhile (by its caller or another recovery worker).
        Ok(Acquired::Completed(_)) => return,
        Ok(Acquired::Abandoned | Acquired::Mismatch { .. }) => {
            report.unresolved.push(key);
            return;
        }
        Err(e) => {
            tracing::warn!(key = %record.key, error = %e, "tool-contracts: recovery could not read or take over the key");
            report.unresolved.push(key);
            return;
        }
    };
    let Some(verify) = verify else {
        // Unreachable by the policy (no `verify`, no takeover); leave the key as it was.
        let _ = lease.abandon().await;
        report.unresolved.push(key);
        return;
    };
    match lease
        .heartbeat(verify(registry.context(), &record.args))
        .await
    {
        Ok(Some(result)) => match lease.complete(&result, false).await {
            Ok(()) => {
                tracing::info!(tool = tool.name(), key = %record.key, decision = "reconciled", "tool-contracts: verify found the effect; key completed");
                report.completed.push(key);
            }
            Err(_) => report.unresolved.push(key),
        },
        Ok(None) => match lease.release().await {
            Ok(()) => {
                tracing::info!(tool = tool.name(), key = %record.key, decision = "reconciled", "tool-contracts: verify found no effect; key released");
                report.released.push(key);
            }
            Err(_) => report.unresolved.push(key),
        },
        Err(e) => {
            tracing::warn!(tool = tool.name(), key = %record.key, error = %e, "tool-contracts: verify failed; the outcome stays unknown");
            let _ = lease.abandon().await;
            report.unresolved.push(key);
        }
    }
}
