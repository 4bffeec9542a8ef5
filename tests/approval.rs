//! Approval (docs/approval.md): a call that needs a person's yes runs nothing until one is
//! stored under its key; a retry after the approval runs the body exactly once; a denial
//! is replayed; the CLI (another process) decides on the same SQLite file.

#[path = "support/cleanup.rs"]
mod cleanup;
mod support;

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use serde_json::json;
use tool_contracts::store::{HistoryKind, PostgresStore, RedisStore, SqliteStore};
use tool_contracts::{
    approval_request, approve, deny, mutating_tool, operation, operation_with_history, registry,
    with_scope, with_store, Error, MemoryStore, OperationState,
};

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Contract(#[from] Error),
}

/// Refunds made, per order: tests run in parallel, each with orders of its own.
static REFUNDS: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());

/// How many times the body refunded `order_id`.
fn refunds(order_id: u64) -> usize {
    REFUNDS
        .lock()
        .unwrap()
        .iter()
        .filter(|o| **o == order_id)
        .count()
}

/// Refunds an order: always asks a person first.
#[mutating_tool(idempotency_key_fields = [order_id], approval = "required")]
pub async fn refund_order(order_id: u64, amount_cents: u64) -> Result<u64, ShopError> {
    REFUNDS.lock().unwrap().push(order_id);
    Ok(amount_cents)
}

/// Above 1000 cents, a person must approve the transfer.
pub fn large(_account: &String, amount_cents: &u64) -> bool {
    *amount_cents > 1000
}

static TRANSFERS: AtomicUsize = AtomicUsize::new(0);

/// Transfers money; large amounts need approval.
#[mutating_tool(idempotency_key_fields = [account, amount_cents], approval = large)]
pub async fn transfer(account: String, amount_cents: u64) -> Result<u64, ShopError> {
    TRANSFERS.fetch_add(1, SeqCst);
    Ok(amount_cents)
}

static EXPIRING: AtomicUsize = AtomicUsize::new(0);

/// Asks, but the request is only open for a moment.
#[mutating_tool(idempotency_key_fields = [id], approval = "required", approval_expires = "300ms")]
pub async fn wipe(id: u64) -> Result<(), ShopError> {
    EXPIRING.fetch_add(1, SeqCst);
    Ok(())
}

static SQLITE_REFUNDS: AtomicUsize = AtomicUsize::new(0);

/// The tool of the SQLite test (its own counter: tests run in parallel).
#[mutating_tool(idempotency_key_fields = [order_id], approval = "required")]
pub async fn refund_on_file(order_id: u64) -> Result<u64, ShopError> {
    Ok(SQLITE_REFUNDS.fetch_add(1, SeqCst) as u64 + 1)
}

fn awaiting(result: Result<impl std::fmt::Debug, ShopError>) -> String {
    match result {
        Err(ShopError::Contract(Error::AwaitingApproval { key, .. })) => key,
        other => panic!("expected AwaitingApproval, got {other:?}"),
    }
}

#[tokio::test]
async fn a_call_waits_for_approval_then_runs_exactly_once() {
    with_store(MemoryStore::new(), async {
        let key = awaiting(refund_order(1, 500).await);
        // Asked twice: one request, still nothing ran.
        assert_eq!(awaiting(refund_order(1, 500).await), key);
        assert_eq!(refunds(1), 0);

        let op = operation(&key)
            .await
            .unwrap()
            .expect("the request is an operation");
        assert_eq!(op.state, OperationState::AwaitingApproval);
        assert_eq!(op.tool, "refund_order");
        let doc = serde_json::to_value(&op).unwrap();
        assert_eq!(doc["state"], "awaiting_approval");
        assert_eq!(doc["approval"]["state"], "pending");
        let request = approval_request(&key).await.unwrap().unwrap();
        assert_eq!(
            request.arguments,
            json!({"order_id": 1, "amount_cents": 500})
        );

        let decision = approve(&key, "alice").await.unwrap();
        assert_eq!(
            (decision.by.as_str(), decision.channel.as_str()),
            ("alice", "rust")
        );
        // A double click answers the same decision.
        assert_eq!(approve(&key, "bob").await.unwrap().by, "alice");
        assert_eq!(
            operation(&key).await.unwrap().unwrap().state,
            OperationState::Approved
        );
        assert_eq!(refunds(1), 0, "approving runs nothing by itself");

        // The retry runs once; the next ones replay.
        assert_eq!(refund_order(1, 500).await.unwrap(), 500);
        assert_eq!(refund_order(1, 500).await.unwrap(), 500);
        assert_eq!(refunds(1), 1);

        let op = operation_with_history(&key).await.unwrap().unwrap();
        assert_eq!(op.state, OperationState::Completed);
        let doc = serde_json::to_value(&op).unwrap();
        assert_eq!(doc["approval"]["decision"]["by"], "alice");
        let kinds: Vec<_> = op.history.unwrap().iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [
                HistoryKind::ApprovalRequested,
                HistoryKind::Approved,
                HistoryKind::Claimed,
                HistoryKind::Completed
            ]
        );
        // Denying after the approval is refused: the first decision stands.
        let err = deny(&key, "mallory", "changed my mind").await.unwrap_err();
        assert!(matches!(err, Error::NoPendingApproval { .. }), "{err}");
    })
    .await;
}

#[tokio::test]
async fn a_denial_is_replayed_and_nothing_runs() {
    with_store(MemoryStore::new(), async {
        let key = awaiting(refund_order(2, 900).await);
        let decision = deny(&key, "alice", "the customer kept the goods")
            .await
            .unwrap();
        assert_eq!(
            decision.reason.as_deref(),
            Some("the customer kept the goods")
        );
        for _ in 0..3 {
            match refund_order(2, 900).await {
                Err(ShopError::Contract(Error::Denied {
                    by, reason, key: k, ..
                })) => {
                    assert_eq!(by, "alice via rust");
                    assert_eq!(reason.as_deref(), Some("the customer kept the goods"));
                    assert_eq!(k, key);
                }
                other => panic!("expected the denial, got {other:?}"),
            }
        }
        assert_eq!(refunds(2), 0);
        assert_eq!(
            operation(&key).await.unwrap().unwrap().state,
            OperationState::Denied
        );
        let err = approve(&key, "bob").await.unwrap_err();
        assert!(err.to_string().contains("already denied by alice"), "{err}");
        // Through the registry (the MCP and HTTP surfaces' door): the same denial.
        let err = registry()
            .call("refund_order", json!({"order_id": 2, "amount_cents": 900}))
            .await
            .unwrap_err();
        assert_eq!(err.code(), "denied", "{err}");
    })
    .await;
}

#[tokio::test]
async fn a_policy_function_asks_only_for_the_calls_it_names() {
    with_store(MemoryStore::new(), async {
        let before = TRANSFERS.load(SeqCst);
        assert_eq!(transfer("acc-1".into(), 300).await.unwrap(), 300);
        assert_eq!(TRANSFERS.load(SeqCst), before + 1);
        let key = awaiting(transfer("acc-1".into(), 5000).await);
        assert_eq!(TRANSFERS.load(SeqCst), before + 1);
        approve(&key, "alice").await.unwrap();
        assert_eq!(transfer("acc-1".into(), 5000).await.unwrap(), 5000);
        assert_eq!(TRANSFERS.load(SeqCst), before + 2);
        let meta = registry().get("transfer").unwrap().idempotency_meta();
        assert_eq!(meta["approval"], "policy");
        let meta = registry().get("refund_order").unwrap().idempotency_meta();
        assert_eq!(meta["approval"], "required");
        assert_eq!(meta["approvalExpiresSeconds"], 86_400);
    })
    .await;
}

#[tokio::test]
async fn the_same_key_with_other_arguments_is_refused_while_it_waits() {
    with_store(MemoryStore::new(), async {
        let key = awaiting(refund_order(3, 100).await);
        match refund_order(3, 999).await {
            Err(ShopError::Contract(Error::KeyReused { params, key: k, .. })) => {
                assert_eq!(params, ["amount_cents"]);
                assert_eq!(k, key);
            }
            other => panic!("expected KeyReused, got {other:?}"),
        }
    })
    .await;
}

#[tokio::test]
async fn an_unanswered_request_expires_and_the_next_call_asks_again() {
    with_store(MemoryStore::new(), async {
        let key = awaiting(wipe(1).await);
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(
            operation(&key).await.unwrap().is_none(),
            "an expired request is gone"
        );
        let err = approve(&key, "alice").await.unwrap_err();
        assert!(err.to_string().contains("expired unanswered"), "{err}");
        assert_eq!(awaiting(wipe(1).await), key);
        let op = operation_with_history(&key).await.unwrap().unwrap();
        assert_eq!(op.state, OperationState::AwaitingApproval);
        let asked = op
            .history
            .unwrap()
            .iter()
            .filter(|e| e.kind == HistoryKind::ApprovalRequested)
            .count();
        assert_eq!(asked, 2);
        approve(&key, "alice").await.unwrap();
        wipe(1).await.unwrap();
        assert_eq!(EXPIRING.load(SeqCst), 1);
    })
    .await;
}

#[tokio::test]
async fn another_scope_cannot_see_or_decide_the_request() {
    with_store(MemoryStore::new(), async {
        let key = with_scope("tenant-a", async { awaiting(refund_order(4, 10).await) }).await;
        with_scope("tenant-b", async {
            assert!(operation(&key).await.unwrap().is_none());
            let err = approve(&key, "mallory").await.unwrap_err();
            assert!(matches!(err, Error::NoPendingApproval { .. }), "{err}");
        })
        .await;
        with_scope("tenant-a", async {
            approve(&key, "alice").await.unwrap();
        })
        .await;
    })
    .await;
}

#[tokio::test]
async fn recovery_leaves_approval_requests_alone() {
    with_store(MemoryStore::new(), async {
        let key = awaiting(refund_order(6, 10).await);
        let report = tool_contracts::recover_once(registry()).await.unwrap();
        assert!(
            report.unresolved.is_empty(),
            "a request is not an unknown outcome: {report:?}"
        );
        assert_eq!(
            operation(&key).await.unwrap().unwrap().state,
            OperationState::AwaitingApproval
        );
    })
    .await;
}

#[tokio::test]
async fn bad_decider_names_are_refused_and_nothing_is_decided() {
    with_store(MemoryStore::new(), async {
        let key = awaiting(refund_order(5, 10).await);
        let err = approve(&key, "").await.unwrap_err();
        assert!(
            matches!(&err, Error::InvalidArguments { field: Some(f), .. } if f == "by"),
            "{err}"
        );
        let err = approve(&key, "eve\n").await.unwrap_err();
        assert!(err.to_string().contains("control character"), "{err}");
        assert_eq!(
            operation(&key).await.unwrap().unwrap().state,
            OperationState::AwaitingApproval
        );
    })
    .await;
}

/// The operator CLI: another process deciding on the same SQLite file.
fn cli(args: &[&str]) -> (bool, String, String) {
    let bin =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/tool-contracts");
    let out = Command::new(&bin).args(args).output().unwrap_or_else(|e| {
        panic!(
            "run {}: {e} (build it: cargo build -p tool-contracts-cli)",
            bin.display()
        )
    });
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn two_processes_sharing_a_sqlite_file_see_one_approval() {
    let status = Command::new(env!("CARGO"))
        .args(["build", "-q", "-p", "tool-contracts-cli"])
        .status()
        .unwrap();
    assert!(status.success(), "building the CLI failed");
    let (path, _cleanup) = cleanup::sqlite_file("approval");
    let url = format!("sqlite:{path}");
    let store = SqliteStore::open(&path).await.unwrap();
    with_store(store, async {
        let key = awaiting(refund_on_file(7).await);
        // Another process reads the request and approves it; two more race to decide.
        let (ok, out, err) = cli(&["show", "--store", &url, &key]);
        assert!(ok, "{err}");
        assert!(out.contains("awaiting_approval"), "{out}");
        assert!(
            out.contains("tool-contracts approve"),
            "the CLI says what to do: {out}"
        );
        let url2 = url.clone();
        let key2 = key.clone();
        let racers = [("approve", "alice"), ("deny", "bob")].map(|(verb, by)| {
            let (url, key) = (url2.clone(), key2.clone());
            std::thread::spawn(move || {
                let mut args = vec![verb, "--store", &url, "--by", by, "--json", &key];
                if verb == "deny" {
                    args.extend(["--reason", "no"]);
                }
                cli(&args)
            })
        });
        let answers: Vec<_> = racers.into_iter().map(|t| t.join().unwrap()).collect();
        let won: Vec<_> = answers.iter().filter(|(ok, _, _)| *ok).collect();
        assert_eq!(won.len(), 1, "exactly one decision wins: {answers:?}");
        let lost = answers.iter().find(|(ok, _, _)| !*ok).unwrap();
        assert!(lost.2.contains("first decision stands"), "{lost:?}");
        let winner: serde_json::Value = serde_json::from_str(won[0].1.trim()).unwrap();
        // This process sees the other's decision.
        match winner["verdict"].as_str() {
            Some("approved") => {
                assert_eq!(refund_on_file(7).await.unwrap(), 1);
                assert_eq!(refund_on_file(7).await.unwrap(), 1);
                assert_eq!(SQLITE_REFUNDS.load(SeqCst), 1);
            }
            Some("denied") => {
                assert!(matches!(
                    refund_on_file(7).await,
                    Err(ShopError::Contract(Error::Denied { .. }))
                ));
                assert_eq!(SQLITE_REFUNDS.load(SeqCst), 0);
            }
            other => panic!("verdict {other:?}"),
        }
        let (ok, out, err) = cli(&["show", "--store", &url, &key]);
        assert!(ok, "{err}");
        let by = winner["by"].as_str().unwrap();
        assert!(out.contains("via cli") && out.contains(by), "{out}");
        assert!(out.contains("approval_requested"), "{out}");
        let (ok, out, err) = cli(&["show", "--store", &url, "--json", &key]);
        assert!(ok, "{err}");
        let doc: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(doc["approval"]["decision"]["channel"], "cli");
        assert_eq!(doc["approval"]["decision"]["by"], winner["by"]);
    })
    .await;
}

static CLOSED: AtomicUsize = AtomicUsize::new(0);

/// Closes an account: destructive, no `approval` option.
#[mutating_tool(idempotency_key_fields = [account], destructive)]
pub async fn close_account(account: String) -> Result<(), ShopError> {
    let _ = account;
    CLOSED.fetch_add(1, SeqCst);
    Ok(())
}

/// Destructive, but opted out of the process-wide policy.
#[mutating_tool(idempotency_key_fields = [cache], destructive, approval = "never")]
pub async fn flush_cache(cache: String) -> Result<(), ShopError> {
    let _ = cache;
    Ok(())
}

#[tokio::test]
async fn the_process_wide_policy_makes_destructive_tools_ask() {
    with_store(MemoryStore::new(), async {
        // Off by default: a destructive tool runs.
        close_account("acc-1".into()).await.unwrap();
        assert_eq!(
            registry().get("close_account").unwrap().idempotency_meta()["approval"],
            "never"
        );
        tool_contracts::require_approval_for_destructive(true);
        let key = awaiting(close_account("acc-2".into()).await);
        flush_cache("sessions".into()).await.unwrap();
        assert_eq!(
            registry().get("close_account").unwrap().idempotency_meta()["approval"],
            "required"
        );
        assert_eq!(
            registry().get("flush_cache").unwrap().idempotency_meta()["approval"],
            "never"
        );
        tool_contracts::require_approval_for_destructive(false);
        // Once asked, the request stands whatever the policy says now.
        assert_eq!(CLOSED.load(SeqCst), 1);
        approve(&key, "alice").await.unwrap();
        assert_eq!(
            operation(&key).await.unwrap().unwrap().state,
            OperationState::Approved
        );
    })
    .await;
}

/// One approval on `store`: asked, approved, the other verdict refused, run once.
async fn one_decision(store: impl tool_contracts::Store, order: u64, label: &str) {
    with_store(store, async {
        let key = awaiting(refund_order(order, 42).await);
        approve(&key, "alice").await.unwrap();
        let err = deny(&key, "bob", "late").await.unwrap_err();
        assert!(
            matches!(err, Error::NoPendingApproval { .. }),
            "{label}: {err}"
        );
        assert_eq!(refund_order(order, 42).await.unwrap(), 42);
        assert_eq!(refund_order(order, 42).await.unwrap(), 42);
        assert_eq!(refunds(order), 1, "{label}");
        let op = operation_with_history(&key).await.unwrap().unwrap();
        let approved = op
            .history
            .unwrap()
            .into_iter()
            .find(|e| e.kind == HistoryKind::Approved);
        assert_eq!(
            approved.map(|e| e.worker).as_deref(),
            Some("alice via rust"),
            "{label}"
        );
    })
    .await;
}

#[tokio::test]
async fn redis_keeps_one_decision() {
    let Some(url) = support::url(&support::REDIS, "approval on Redis") else {
        return;
    };
    let (prefix, _cleanup) = cleanup::redis_prefix(&url, "approval");
    let store = RedisStore::builder(&url)
        .prefix(prefix)
        .connect()
        .await
        .unwrap();
    one_decision(store, 101, "redis").await;
}

#[tokio::test]
async fn postgres_keeps_one_decision() {
    let Some(url) = support::url(&support::POSTGRES, "approval on PostgreSQL") else {
        return;
    };
    let (schema, _cleanup) = cleanup::postgres_schema(&url, "approval");
    let store = PostgresStore::builder(&url)
        .schema(&schema)
        .max_connections(4)
        .connect()
        .await
        .unwrap();
    one_decision(store, 102, "postgres").await;
}
