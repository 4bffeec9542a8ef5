//! `#[mutating_tool(compensate = path)]`: a call of the tool made inside a run is a journal
//! entry whose undo the run's compensation runs, exactly as it runs a step's
//! (`Run::step_with_undo`): newest first, once, under the key derived from the entry's key
//! (docs/key-spec.md 5.1), handed the call's arguments and result.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tool_contracts::key::KeyBuilder;
use tool_contracts::store::StoreError;
use tool_contracts::{
    mutating_tool, registry, with_store, CompensationState, EntryKind, EntryStatus, Error,
    MemoryStore, Run, RunOptions, RunState, RunStatus, UndoContext, UndoOutcome,
};

#[path = "support/stores.rs"]
mod stores;
use stores::Op;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Contract(#[from] Error),
    #[error("the card was declined")]
    Declined,
    #[error("the payment provider refused the refund")]
    RefundRefused,
}

impl Serialize for ShopError {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for ShopError {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(|_| ShopError::Declined)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Cart {
    pub id: String,
    pub cents: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Charge {
    pub id: String,
    pub cents: u64,
}

/// One refund an undo made: what it was handed.
#[derive(Debug, Clone, PartialEq)]
struct Refund {
    user_id: u64,
    cart: Cart,
    note: String,
    charge: Charge,
    key: String,
    step: String,
    step_key: String,
}

/// Every refund made, by every test of this binary (each test uses user ids of its own).
static REFUNDS: Mutex<Vec<Refund>> = Mutex::new(Vec::new());
/// The users `charge` ran for, once per run of its body.
static CHARGED: Mutex<Vec<u64>> = Mutex::new(Vec::new());

fn charged(user_id: u64) -> usize {
    CHARGED
        .lock()
        .unwrap()
        .iter()
        .filter(|u| **u == user_id)
        .count()
}

fn refunds_of(user_ids: &[u64]) -> Vec<Refund> {
    REFUNDS
        .lock()
        .unwrap()
        .iter()
        .filter(|r| user_ids.contains(&r.user_id))
        .cloned()
        .collect()
}

/// Charges the user's cart.
#[mutating_tool(idempotency_key_fields = [user_id, cart.id], compensate = refund)]
pub async fn charge(user_id: u64, cart: Cart, note: String) -> Result<Charge, ShopError> {
    CHARGED.lock().unwrap().push(user_id);
    Ok(Charge {
        id: format!("ch-{user_id}-{}", cart.id),
        cents: cart.cents,
    })
}

/// The user whose refunds the provider refuses (`a_failing_undo_...`).
const REFUSED_USER: u64 = 307;
/// The user whose refund takes the store down for one claim (`a_compensation_...`).
const CRASH_USER: u64 = 402;
/// Set by the crash test's newest refund: the next store claim fails, as if the worker
/// stopped between two undos.
static FAIL_NEXT_CLAIM: AtomicBool = AtomicBool::new(false);

/// The undo of `charge`: the tool's JSON parameters by reference, its result by
/// reference, and the undo's context.
async fn refund(
    user_id: &u64,
    cart: &Cart,
    note: &str,
    charge: &Charge,
    cx: UndoContext,
) -> Result<String, ShopError> {
    if *user_id == REFUSED_USER {
        return Err(ShopError::RefundRefused);
    }
    REFUNDS.lock().unwrap().push(Refund {
        user_id: *user_id,
        cart: cart.clone(),
        note: note.to_owned(),
        charge: charge.clone(),
        key: cx.key().to_owned(),
        step: cx.step().to_owned(),
        step_key: cx.step_key().to_owned(),
    });
    if *user_id == CRASH_USER + 1 {
        FAIL_NEXT_CLAIM.store(true, SeqCst);
    }
    Ok(format!("refunded {} as {}", charge.id, cx.key()))
}

/// Records a declined card: its error is stored (`cache_errors`), so the call completed
/// without an effect to undo.
#[mutating_tool(idempotency_key_fields = [user_id], compensate = refund_declined, cache_errors = true)]
pub async fn declined_charge(user_id: u64) -> Result<Charge, ShopError> {
    Err(ShopError::Declined)
}

static DECLINED_REFUNDS: AtomicUsize = AtomicUsize::new(0);

async fn refund_declined(
    _user_id: &u64,
    _charge: &Charge,
    _cx: UndoContext,
) -> Result<(), ShopError> {
    DECLINED_REFUNDS.fetch_add(1, SeqCst);
    Ok(())
}

/// Sends a receipt: a tool without `compensate`.
#[mutating_tool(idempotency_key_fields = [user_id])]
pub async fn send_receipt(user_id: u64) -> Result<u64, ShopError> {
    Ok(user_id)
}

fn cart(id: &str) -> Cart {
    Cart {
        id: id.to_owned(),
        cents: 1250,
    }
}

/// The undo key docs/key-spec.md 5.1 gives the entry `step_key` of the run `run` (version 1),
/// computed here from the spec, not by the runtime's own function.
fn spec_undo_key(step_key: &str, run: &str) -> String {
    let mut builder = KeyBuilder::new("tool-contracts/undo/v1");
    builder.field("step", step_key).unwrap();
    builder.finish(None, run, 1)
}

#[tokio::test]
async fn a_compensable_tool_called_in_a_run_is_undone_once_with_the_derived_key_and_its_output() {
    with_store(MemoryStore::new(), async {
        let intent = json!({"order": 101});
        let run = Run::start("checkout", &intent).await.unwrap();
        // A direct call and a registry call: both are entries of the run.
        let first = run
            .enter(charge(101, cart("c-1"), "gift".to_owned()))
            .await
            .unwrap();
        let second = run
            .enter(registry().call(
                "charge",
                json!({"user_id": 102, "cart": {"id": "c-2", "cents": 1250}, "note": "n"}),
            ))
            .await
            .unwrap();
        assert_eq!(second.outcome, tool_contracts::Outcome::Executed);
        let journal = run.journal().await.unwrap();
        assert_eq!(journal.len(), 2, "{journal:?}");
        for entry in &journal {
            assert_eq!(entry.kind, EntryKind::Tool);
            let undo = entry
                .undo
                .as_ref()
                .expect("a compensable call declares its undo");
            assert_eq!(undo.key, spec_undo_key(&entry.key, "checkout"));
            assert_eq!(undo.status, EntryStatus::Missing, "not undone yet");
        }
        assert_eq!(second.key.as_deref(), Some(journal[1].key.as_str()));

        let c = run.compensate("the courier refused").await.unwrap();
        assert_eq!(c.state, CompensationState::Compensated, "{c:?}");
        let visited: Vec<(&str, Option<&str>)> = c
            .steps
            .iter()
            .map(|s| (s.key.as_str(), s.undo_key.as_deref()))
            .collect();
        assert_eq!(
            visited,
            [
                (
                    journal[1].key.as_str(),
                    Some(journal[1].undo.as_ref().unwrap().key.as_str())
                ),
                (
                    journal[0].key.as_str(),
                    Some(journal[0].undo.as_ref().unwrap().key.as_str())
                ),
            ],
            "newest first"
        );
        let refunds = refunds_of(&[101, 102]);
        assert_eq!(refunds.len(), 2, "each undo once: {refunds:?}");
        // Newest first; each handed the call's arguments, its output and the derived key.
        assert_eq!(
            refunds[0],
            Refund {
                user_id: 102,
                cart: cart("c-2"),
                note: "n".to_owned(),
                charge: serde_json::from_value(second.value.clone()).unwrap(),
                key: spec_undo_key(&journal[1].key, "checkout"),
                step: "charge".to_owned(),
                step_key: journal[1].key.clone(),
            }
        );
        assert_eq!(
            refunds[1],
            Refund {
                user_id: 101,
                cart: cart("c-1"),
                note: "gift".to_owned(),
                charge: first,
                key: spec_undo_key(&journal[0].key, "checkout"),
                step: "charge".to_owned(),
                step_key: journal[0].key.clone(),
            }
        );
        assert_eq!(
            c.steps[1].outcome,
            UndoOutcome::Undone {
                result: json!(format!("refunded ch-101-c-1 as {}", refunds[1].key))
            }
        );
        // Compensated everywhere, and a later start undoes nothing again.
        let again = Run::start("checkout", &intent).await.unwrap();
        assert_eq!(again.status(), &RunStatus::Compensated(c.clone()));
        let journal = again.journal().await.unwrap();
        assert!(journal
            .iter()
            .all(|e| e.undo.as_ref().unwrap().status == EntryStatus::Completed));
        assert_eq!(refunds_of(&[101, 102]).len(), 2);
    })
    .await;
}

#[tokio::test]
async fn without_compensate_a_completed_tool_call_still_needs_intervention_and_a_stored_error_has_nothing_to_undo(
) {
    with_store(MemoryStore::new(), async {
        let run = Run::start("checkout", &json!({"order": 201}))
            .await
            .unwrap();
        run.enter(charge(201, cart("c-9"), "x".to_owned()))
            .await
            .unwrap();
        // The same intent again: a replay of the first call, one effect, undone once.
        run.enter(charge(201, cart("c-9"), "x".to_owned()))
            .await
            .unwrap();
        assert_eq!(charged(201), 1);
        run.enter(send_receipt(201)).await.unwrap();
        assert!(matches!(
            run.enter(declined_charge(201)).await,
            Err(ShopError::Declined)
        ));
        let journal = run.journal().await.unwrap();
        assert_eq!(journal.len(), 4, "{journal:?}");
        assert!(journal[2].undo.is_none(), "no compensate, no undo");
        let c = run.compensate("cancelled").await.unwrap();
        assert_eq!(c.state, CompensationState::NeedsIntervention, "{c:?}");
        let outcomes: Vec<(&str, &UndoOutcome)> = c
            .steps
            .iter()
            .map(|s| (s.name.as_str(), &s.outcome))
            .collect();
        assert_eq!(outcomes.len(), 3, "the replayed call is one call: {c:?}");
        assert_eq!(
            outcomes[0],
            ("declined_charge", &UndoOutcome::NothingToUndo)
        );
        assert_eq!(outcomes[1], ("send_receipt", &UndoOutcome::NoUndo));
        assert_eq!(outcomes[2].0, "charge");
        assert!(matches!(outcomes[2].1, UndoOutcome::Undone { .. }));
        assert_eq!(refunds_of(&[201]).len(), 1, "undone once");
        assert_eq!(
            DECLINED_REFUNDS.load(SeqCst),
            0,
            "a failed call is not undone"
        );
        let info = Run::status_of("checkout", &json!({"order": 201}), RunOptions::default())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(info.state, RunState::NeedsIntervention);
    })
    .await;
}

#[tokio::test]
async fn a_failing_undo_is_stored_under_its_key_and_the_run_needs_intervention() {
    with_store(MemoryStore::new(), async {
        let run = Run::start("checkout", &json!({"order": 307}))
            .await
            .unwrap();
        run.enter(charge(REFUSED_USER, cart("c-7"), String::new()))
            .await
            .unwrap();
        let c = run.compensate("cancelled").await.unwrap();
        assert_eq!(c.state, CompensationState::NeedsIntervention);
        assert_eq!(
            c.steps[0].outcome,
            UndoOutcome::Failed {
                error: "the payment provider refused the refund".to_owned()
            }
        );
        let undo_key = c.steps[0].undo_key.clone().unwrap();
        let op = tool_contracts::operation(&undo_key).await.unwrap().unwrap();
        assert_eq!(op.state, tool_contracts::OperationState::Failed, "{op:?}");
    })
    .await;
}

/// A store whose next claim fails once [`FAIL_NEXT_CLAIM`] is set.
fn fails_the_claim_after_the_newest_refund() -> impl tool_contracts::Store {
    stores::failing(|op| {
        (op == Op::Claim && FAIL_NEXT_CLAIM.swap(false, SeqCst))
            .then(|| StoreError::unavailable_message("the worker stopped between two undos"))
    })
}

/// The run's code: two charges inside the run (run again on resume, where they replay).
async fn charge_twice(run: &Run) {
    for user in [CRASH_USER, CRASH_USER + 1] {
        run.enter(charge(user, cart("c-4"), "twice".to_owned()))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn a_compensation_stopped_between_two_tool_undos_resumes_without_undoing_twice() {
    let store = Arc::new(fails_the_claim_after_the_newest_refund());
    with_store(Arc::clone(&store), async {
        let intent = json!({"order": 402});
        let run = Run::start("checkout", &intent).await.unwrap();
        charge_twice(&run).await;
        // The newest refund runs; the claim of the older one's undo fails: the run is given
        // up mid-compensation.
        let err = run.compensate("the courier refused").await.unwrap_err();
        assert!(matches!(err, Error::Store { .. }), "{err}");
        assert_eq!(refunds_of(&[CRASH_USER, CRASH_USER + 1]).len(), 1);

        let run = Run::start("checkout", &intent).await.unwrap();
        assert_eq!(run.status(), &RunStatus::Compensating);
        // The code replays its calls (nothing runs again) and compensates again.
        charge_twice(&run).await;
        assert_eq!(
            (charged(CRASH_USER), charged(CRASH_USER + 1)),
            (1, 1),
            "replayed, not run"
        );
        let c = run.compensate("another reason").await.unwrap();
        assert_eq!(c.state, CompensationState::Compensated, "{c:?}");
        assert_eq!(c.reason, "the courier refused");
        let order: Vec<u64> = refunds_of(&[CRASH_USER, CRASH_USER + 1])
            .iter()
            .map(|r| r.user_id)
            .collect();
        assert_eq!(
            order,
            [CRASH_USER + 1, CRASH_USER],
            "each undo once, newest first"
        );
        let results: Vec<&Value> = c
            .steps
            .iter()
            .map(|s| match &s.outcome {
                UndoOutcome::Undone { result } => result,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(results.len(), 2);
    })
    .await;
}
