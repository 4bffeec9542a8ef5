//! Reconciling unknown outcomes: `verify = path` asks whether an abandoned call's effect
//! happened, `unknown_outcome_if = path` names the errors that leave the outcome unknown,
//! and the recovery task reconciles abandoned calls nobody retries. Each test is named
//! after the failure it prevents.
//!
//! The pattern (as in `tests/dedup.rs`): the first call's body records its effect and
//! hangs; the caller times out, which drops the call mid-body; past the lease the claim
//! counts as abandoned. Time is paused, so the waits cost nothing.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::json;
use tool_contracts::store::{Store, StoreError};
use tool_contracts::{mutating_tool, recover_once, registry, with_store, Error, MemoryStore};

#[path = "support/calls.rs"]
mod calls;
#[path = "support/stores.rs"]
mod stores;
use calls::abandon_first_call;
use stores::Op;

#[derive(Debug, thiserror::Error)]
pub enum BankError {
    #[error(transparent)]
    Contract(#[from] Error),
    #[error("the ledger is unreachable")]
    LedgerDown,
    #[error("the bank did not answer in time")]
    Timeout,
    #[error("the transfer was declined")]
    Declined,
}

impl BankError {
    fn contract(self) -> Error {
        match self {
            BankError::Contract(e) => e,
            other => panic!("expected a contract error, got {other:?}"),
        }
    }

    /// The request may have reached the bank: the outcome is unknown.
    pub fn is_timeout(&self) -> bool {
        matches!(self, BankError::Timeout)
    }
}

/// What the outside world saw: one entry per effect, keyed by intent.
#[derive(Default)]
pub struct Ledger(Mutex<BTreeMap<u64, Vec<String>>>);

impl Ledger {
    const fn new() -> Self {
        Ledger(Mutex::new(BTreeMap::new()))
    }

    fn record(&self, id: u64, what: String) {
        self.0.lock().unwrap().entry(id).or_default().push(what);
    }

    fn effects(&self, id: u64) -> Vec<String> {
        self.0.lock().unwrap().get(&id).cloned().unwrap_or_default()
    }

    fn last(&self, id: u64) -> Option<String> {
        self.0
            .lock()
            .unwrap()
            .get(&id)
            .and_then(|e| e.last().cloned())
    }
}

// (a) verify finds the effect.

static FOUND_LEDGER: Ledger = Ledger::new();
static FOUND_RUNS: AtomicUsize = AtomicUsize::new(0);
static FOUND_VERIFIES: AtomicUsize = AtomicUsize::new(0);

/// Transfers once; the first run hangs after its effect.
#[mutating_tool(idempotency_key_fields = [id], lease = "1s", verify = found_verify)]
pub async fn found_transfer(id: u64, cents: u64) -> Result<String, BankError> {
    let n = FOUND_RUNS.fetch_add(1, SeqCst);
    let receipt = format!("sent {cents} for {id} (run {n})");
    FOUND_LEDGER.record(id, receipt.clone());
    if n == 0 {
        std::future::pending::<()>().await;
    }
    Ok(receipt)
}

pub async fn found_verify(id: &u64, cents: &u64) -> Result<Option<String>, BankError> {
    FOUND_VERIFIES.fetch_add(1, SeqCst);
    assert_eq!(*cents, 500, "verify sees the call's arguments");
    Ok(FOUND_LEDGER.last(*id))
}

#[tokio::test(start_paused = true)]
async fn an_abandoned_call_whose_effect_happened_is_reconciled_not_run_again() {
    with_store(MemoryStore::new(), async {
        abandon_first_call(found_transfer(1, 500)).await;
        // Through the registry, so the output says how the result came to be.
        let args = serde_json::json!({"id": 1, "cents": 500});
        let out = tool_contracts::registry()
            .call("found_transfer", args.clone())
            .await
            .unwrap();
        assert_eq!(out.value, "sent 500 for 1 (run 0)", "verify's result");
        assert_eq!(out.outcome, tool_contracts::Outcome::Reconciled, "{out:?}");
        // The reconciled result is stored: later retries replay it without verifying.
        let again = tool_contracts::registry()
            .call("found_transfer", args)
            .await
            .unwrap();
        assert_eq!(again.value, out.value);
        assert_eq!(
            again.outcome,
            tool_contracts::Outcome::Replayed,
            "{again:?}"
        );
        assert_eq!(
            found_transfer(1, 500).await.unwrap(),
            "sent 500 for 1 (run 0)"
        );
    })
    .await;
    assert_eq!(FOUND_RUNS.load(SeqCst), 1, "the body never ran again");
    assert_eq!(FOUND_VERIFIES.load(SeqCst), 1);
    assert_eq!(FOUND_LEDGER.effects(1).len(), 1, "one effect");
}

// (b) verify finds no effect.

static MISSING_LEDGER: Ledger = Ledger::new();
static MISSING_RUNS: AtomicUsize = AtomicUsize::new(0);
static MISSING_VERIFIES: AtomicUsize = AtomicUsize::new(0);

/// The first run hangs *before* its effect.
#[mutating_tool(idempotency_key_fields = [id], lease = "1s", verify = missing_verify)]
pub async fn missing_transfer(id: u64) -> Result<String, BankError> {
    let n = MISSING_RUNS.fetch_add(1, SeqCst);
    if n == 0 {
        std::future::pending::<()>().await;
    }
    let receipt = format!("sent for {id} (run {n})");
    MISSING_LEDGER.record(id, receipt.clone());
    Ok(receipt)
}

pub async fn missing_verify(id: &u64) -> Result<Option<String>, BankError> {
    MISSING_VERIFIES.fetch_add(1, SeqCst);
    Ok(MISSING_LEDGER.last(*id))
}

#[tokio::test(start_paused = true)]
async fn an_abandoned_call_whose_effect_did_not_happen_runs_once_more() {
    with_store(MemoryStore::new(), async {
        abandon_first_call(missing_transfer(2)).await;
        assert_eq!(missing_transfer(2).await.unwrap(), "sent for 2 (run 1)");
        assert_eq!(missing_transfer(2).await.unwrap(), "sent for 2 (run 1)");
    })
    .await;
    assert_eq!(
        MISSING_RUNS.load(SeqCst),
        2,
        "the dropped run and the rerun"
    );
    assert_eq!(MISSING_VERIFIES.load(SeqCst), 1);
    assert_eq!(MISSING_LEDGER.effects(2).len(), 1, "one effect");
}

// (c) verify fails.

static FLAKY_LEDGER: Ledger = Ledger::new();
static FLAKY_RUNS: AtomicUsize = AtomicUsize::new(0);
static FLAKY_VERIFIES: AtomicUsize = AtomicUsize::new(0);

#[mutating_tool(idempotency_key_fields = [id], lease = "1s", verify = flaky_verify)]
pub async fn flaky_transfer(id: u64) -> Result<String, BankError> {
    let n = FLAKY_RUNS.fetch_add(1, SeqCst);
    FLAKY_LEDGER.record(id, format!("sent for {id}"));
    if n == 0 {
        std::future::pending::<()>().await;
    }
    Ok(format!("sent for {id}"))
}

/// The ledger is down on the first attempt.
pub async fn flaky_verify(id: &u64) -> Result<Option<String>, BankError> {
    if FLAKY_VERIFIES.fetch_add(1, SeqCst) == 0 {
        return Err(BankError::LedgerDown);
    }
    Ok(FLAKY_LEDGER.last(*id))
}

#[tokio::test(start_paused = true)]
async fn a_failed_verify_keeps_the_outcome_unknown_and_the_next_call_verifies_again() {
    with_store(MemoryStore::new(), async {
        abandon_first_call(flaky_transfer(3)).await;
        let err = flaky_transfer(3).await.unwrap_err();
        assert!(
            matches!(err, BankError::LedgerDown),
            "verify's error: {err:?}"
        );
        // Still unknown, and marked so at once: the next call verifies without waiting
        // for a lease.
        let start = tokio::time::Instant::now();
        assert_eq!(flaky_transfer(3).await.unwrap(), "sent for 3");
        assert_eq!(start.elapsed(), Duration::ZERO, "no lease wait");
    })
    .await;
    assert_eq!(FLAKY_RUNS.load(SeqCst), 1, "the body never ran again");
    assert_eq!(FLAKY_VERIFIES.load(SeqCst), 2);
}

// (d) unknown_outcome_if.

static CLASSIFIED_RUNS: AtomicUsize = AtomicUsize::new(0);

/// Times out on its first run, is declined on its second (for another intent), succeeds
/// otherwise. No `verify`: an unknown outcome is reported as such.
#[mutating_tool(idempotency_key_fields = [id], lease = "30s", unknown_outcome_if = BankError::is_timeout)]
pub async fn classified_transfer(id: u64) -> Result<u64, BankError> {
    CLASSIFIED_RUNS.fetch_add(1, SeqCst);
    match id {
        10 => Err(BankError::Timeout),
        11 => Err(BankError::Declined),
        _ => Ok(id),
    }
}

#[tokio::test(start_paused = true)]
async fn an_error_that_leaves_the_outcome_unknown_is_not_released_for_a_blind_retry() {
    with_store(MemoryStore::new(), async {
        let err = classified_transfer(10).await.unwrap_err();
        assert!(matches!(err, BankError::Timeout), "{err:?}");
        // The key is abandoned at once: no 30s lease wait, no second run.
        let start = tokio::time::Instant::now();
        let err = classified_transfer(10).await.unwrap_err().contract();
        assert!(matches!(err, Error::OutcomeUnknown { .. }), "{err}");
        assert_eq!(start.elapsed(), Duration::ZERO, "no lease wait");
        assert_eq!(CLASSIFIED_RUNS.load(SeqCst), 1);

        // An error the classifier does not name releases the key: the retry runs.
        assert!(matches!(
            classified_transfer(11).await,
            Err(BankError::Declined)
        ));
        assert!(matches!(
            classified_transfer(11).await,
            Err(BankError::Declined)
        ));
        assert_eq!(CLASSIFIED_RUNS.load(SeqCst), 3);
    })
    .await;
}

static TIMEOUT_LEDGER: Ledger = Ledger::new();
static TIMEOUT_RUNS: AtomicUsize = AtomicUsize::new(0);
static TIMEOUT_VERIFIES: AtomicUsize = AtomicUsize::new(0);

/// The request reaches the bank, but the answer times out.
#[mutating_tool(
    idempotency_key_fields = [id],
    lease = "30s",
    verify = timeout_verify,
    unknown_outcome_if = BankError::is_timeout,
)]
pub async fn timeout_transfer(id: u64) -> Result<String, BankError> {
    TIMEOUT_RUNS.fetch_add(1, SeqCst);
    TIMEOUT_LEDGER.record(id, format!("sent for {id}"));
    Err(BankError::Timeout)
}

pub async fn timeout_verify(id: &u64) -> Result<Option<String>, BankError> {
    TIMEOUT_VERIFIES.fetch_add(1, SeqCst);
    Ok(TIMEOUT_LEDGER.last(*id))
}

#[tokio::test(start_paused = true)]
async fn an_error_that_leaves_the_outcome_unknown_goes_through_verify_on_the_next_call() {
    with_store(MemoryStore::new(), async {
        assert!(matches!(
            timeout_transfer(20).await,
            Err(BankError::Timeout)
        ));
        let start = tokio::time::Instant::now();
        assert_eq!(timeout_transfer(20).await.unwrap(), "sent for 20");
        assert_eq!(start.elapsed(), Duration::ZERO, "no lease wait");
        assert_eq!(timeout_transfer(20).await.unwrap(), "sent for 20");
    })
    .await;
    assert_eq!(TIMEOUT_RUNS.load(SeqCst), 1);
    assert_eq!(TIMEOUT_VERIFIES.load(SeqCst), 1);
    assert_eq!(TIMEOUT_LEDGER.effects(20).len(), 1);
}

// (e) The recovery task, with no caller.

static RECOVERED_RUNS: AtomicUsize = AtomicUsize::new(0);

/// Hangs on the first run of every intent; odd intents hang after their effect, even
/// ones before it. The ledger is a `#[context]` value, which recovery resolves from the
/// registry like `invoke` does.
#[mutating_tool(idempotency_key_fields = [id], lease = "1s", verify = recovered_verify)]
pub async fn recovered_transfer(id: u64, #[context] ledger: &Ledger) -> Result<String, BankError> {
    let n = RECOVERED_RUNS.fetch_add(1, SeqCst);
    let receipt = format!("sent for {id} (run {n})");
    let effect_first = id % 2 == 1;
    if effect_first {
        ledger.record(id, receipt.clone());
    }
    if n < 2 {
        std::future::pending::<()>().await;
    }
    if !effect_first {
        ledger.record(id, receipt.clone());
    }
    Ok(receipt)
}

pub async fn recovered_verify(id: &u64, ledger: &Ledger) -> Result<Option<String>, BankError> {
    Ok(ledger.last(*id))
}

static UNVERIFIED_RUNS: AtomicUsize = AtomicUsize::new(0);

/// No `verify`: recovery can only report it.
#[mutating_tool(idempotency_key_fields = [id], lease = "1s")]
pub async fn unverified_transfer(id: u64) -> Result<u64, BankError> {
    if UNVERIFIED_RUNS.fetch_add(1, SeqCst) == 0 {
        std::future::pending::<()>().await;
    }
    Ok(id)
}

#[tokio::test(start_paused = true)]
async fn recovery_reconciles_abandoned_calls_nobody_retries() {
    let registry = registry().with_context(Ledger::new());
    let key = |tool: &str, id: u64| {
        registry
            .get(tool)
            .unwrap()
            .key(&json!({ "id": id }))
            .unwrap()
            .unwrap()
    };
    with_store(MemoryStore::new(), async {
        assert!(registry.get("recovered_transfer").unwrap().has_verify());
        assert!(!registry.get("unverified_transfer").unwrap().has_verify());
        // Odd intent: effect recorded, then the worker is gone. Even intent: gone before.
        // Both through the registry, so the context ledger is the one recovery sees.
        for id in [31, 32] {
            let call = registry.call("recovered_transfer", json!({ "id": id }));
            let first = tokio::time::timeout(Duration::from_millis(100), call).await;
            assert!(first.is_err());
        }
        let first = tokio::time::timeout(Duration::from_millis(100), unverified_transfer(33)).await;
        assert!(first.is_err());
        tokio::time::sleep(Duration::from_secs(2)).await;

        let report = recover_once(&registry).await.unwrap();
        assert_eq!(report.completed, [key("recovered_transfer", 31)]);
        assert_eq!(report.released, [key("recovered_transfer", 32)]);
        assert_eq!(report.unresolved, [key("unverified_transfer", 33)]);
        assert_eq!(report.live, 0);

        // Completed: replayed, never run again.
        let out = registry
            .call("recovered_transfer", json!({ "id": 31 }))
            .await
            .unwrap();
        assert_eq!(out.outcome, tool_contracts::Outcome::Replayed);
        assert_eq!(out.value, json!("sent for 31 (run 0)"));
        // Released: the next call runs the body.
        let out = registry
            .call("recovered_transfer", json!({ "id": 32 }))
            .await
            .unwrap();
        assert_ne!(out.outcome, tool_contracts::Outcome::Replayed);
        assert_eq!(out.value, json!("sent for 32 (run 2)"));
        // Unresolved: still unknown.
        let err = unverified_transfer(33).await.unwrap_err().contract();
        assert!(matches!(err, Error::OutcomeUnknown { .. }), "{err}");

        // A second pass finds nothing left to do but the unresolved key.
        let report = recover_once(&registry).await.unwrap();
        assert!(report.completed.is_empty() && report.released.is_empty());
        assert_eq!(report.unresolved, [key("unverified_transfer", 33)]);
    })
    .await;
    assert_eq!(RECOVERED_RUNS.load(SeqCst), 3);
    assert_eq!(UNVERIFIED_RUNS.load(SeqCst), 1);
}

// The recovery loop, a takeover the store refuses, and the key as a UUID.

/// Runs of `looped_transfer` per intent (its tests run in parallel on other ids).
static LOOPED_RUNS: Mutex<BTreeMap<u64, usize>> = Mutex::new(BTreeMap::new());

fn looped_runs(id: u64) -> usize {
    LOOPED_RUNS.lock().unwrap().get(&id).copied().unwrap_or(0)
}

/// Hangs after its effect on the first run of an intent; `verify` reads the ledger.
#[mutating_tool(idempotency_key_fields = [id], lease = "1s", verify = looped_verify)]
pub async fn looped_transfer(id: u64, #[context] ledger: &Ledger) -> Result<String, BankError> {
    let n = {
        let mut runs = LOOPED_RUNS.lock().unwrap();
        let n = runs.entry(id).or_default();
        *n += 1;
        *n - 1
    };
    let receipt = format!("sent for {id} (run {n})");
    ledger.record(id, receipt.clone());
    if n == 0 {
        std::future::pending::<()>().await;
    }
    Ok(receipt)
}

pub async fn looped_verify(id: &u64, ledger: &Ledger) -> Result<Option<String>, BankError> {
    Ok(ledger.last(*id))
}

#[tokio::test(start_paused = true)]
async fn the_recovery_loop_reconciles_an_abandoned_call_on_its_own() {
    let registry = registry().with_context(Ledger::new());
    let store = std::sync::Arc::new(MemoryStore::new());
    let key = stores::key_of("looped_transfer", &json!({ "id": 41 }));
    with_store(std::sync::Arc::clone(&store), async {
        let first = registry.call("looped_transfer", json!({ "id": 41 }));
        assert!(tokio::time::timeout(Duration::from_millis(100), first)
            .await
            .is_err());
    })
    .await;
    // Nobody retries: the loop, spawned beside the workers, finds the key once its lease
    // ran out and completes it with what `verify` found.
    let looping = tokio::spawn(with_store(
        std::sync::Arc::clone(&store),
        tool_contracts::recover(registry.clone(), Duration::from_millis(500)),
    ));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let record = tool_contracts::Store::lookup(&*store, &key)
        .await
        .unwrap()
        .expect("the record");
    assert!(
        matches!(
            record.state,
            tool_contracts::store::RecordState::Completed { .. }
        ),
        "{:?}",
        record.state
    );
    looping.abort();
    let out = with_store(
        std::sync::Arc::clone(&store),
        registry.call("looped_transfer", json!({ "id": 41 })),
    )
    .await
    .unwrap();
    assert_eq!(out.outcome, tool_contracts::Outcome::Replayed);
    assert_eq!(out.value, json!("sent for 41 (run 0)"));
    assert_eq!(looped_runs(41), 1);
}

/// A store whose takeovers fail (the server went away between the two statements).
fn takeover_fails() -> impl Store {
    stores::failing(|op| {
        (op == Op::Takeover)
            .then(|| StoreError::unavailable_message("connection reset during takeover"))
    })
}

#[tokio::test(start_paused = true)]
async fn a_takeover_the_store_refuses_is_reported_unresolved_not_dropped() {
    let registry = registry().with_context(Ledger::new());
    let store = std::sync::Arc::new(takeover_fails());
    let key = stores::key_of("looped_transfer", &json!({ "id": 42 }));
    with_store(std::sync::Arc::clone(&store), async {
        abandon_first_call(registry.call("looped_transfer", json!({ "id": 42 }))).await;
        let report = recover_once(&registry).await.unwrap();
        assert_eq!(report.unresolved, [key], "{report:?}");
        assert!(report.completed.is_empty() && report.released.is_empty());
    })
    .await;
}

#[tokio::test]
async fn the_key_as_a_uuid_is_stable_per_key_and_absent_outside_a_body() {
    assert_eq!(tool_contracts::current_key_uuid(), None);
    let registry = registry().with_context(Ledger::new());
    let seen = with_store(MemoryStore::new(), async {
        let a = uuid_of(&registry, 51).await;
        let again = uuid_of(&registry, 51).await;
        let b = uuid_of(&registry, 52).await;
        (a, again, b)
    })
    .await;
    let (a, again, b) = seen;
    assert_eq!(a, again, "one key, one UUID");
    assert_ne!(a, b, "two keys, two UUIDs");
    assert_eq!(a.get_version_num(), 5);
    // Version 5 of the key's text in the namespace the docs state (an independent
    // computation with the uuid crate, not the runtime's code path).
    let key = registry
        .get("uuid_probe")
        .unwrap()
        .key(&json!({ "id": 51 }))
        .unwrap()
        .unwrap();
    let namespace = tool_contracts::uuid::Uuid::new_v5(
        &tool_contracts::uuid::Uuid::NAMESPACE_URL,
        b"https://tool-contracts.dev/key/v1",
    );
    assert_eq!(
        a,
        tool_contracts::uuid::Uuid::new_v5(&namespace, key.as_bytes())
    );
}

async fn uuid_of(registry: &tool_contracts::Registry, id: u64) -> tool_contracts::uuid::Uuid {
    // Each probe runs the body once per key (the second call of a key replays).
    let out = registry
        .call("uuid_probe", json!({ "id": id }))
        .await
        .unwrap();
    tool_contracts::uuid::Uuid::parse_str(out.value.as_str().unwrap()).unwrap()
}

/// Returns the call's key as a UUID, as a provider that wants UUID keys would receive it.
#[mutating_tool(idempotency_key_fields = [id])]
pub async fn uuid_probe(id: u64) -> Result<String, BankError> {
    let _ = id;
    Ok(tool_contracts::current_key_uuid()
        .expect("inside a tool body")
        .to_string())
}
