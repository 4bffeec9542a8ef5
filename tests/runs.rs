//! Long-running tasks: duplicate starts, journaled steps, resume, non-determinism.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tool_contracts::{mutating_tool, with_store, Error, MemoryStore, Run, RunOptions, RunStatus};

#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error(transparent)]
    Contract(#[from] Error),
}

static EMAILS: AtomicUsize = AtomicUsize::new(0);

/// Sends the confirmation email.
#[mutating_tool(idempotency_key_fields = [order_id])]
pub async fn send_email(order_id: u64) -> Result<usize, TaskError> {
    Ok(EMAILS.fetch_add(1, SeqCst) + 1)
}

fn short() -> RunOptions {
    RunOptions::default().lease(Duration::from_millis(300))
}

#[tokio::test]
async fn a_duplicate_start_returns_the_existing_run_not_a_second_one() {
    with_store(MemoryStore::new(), async {
        let intent = json!({"user": 1, "cart": "c-1"});
        let first = Run::start("checkout", &intent).await.unwrap();
        assert_eq!(first.status(), &RunStatus::Started);
        let second = Run::start("checkout", &intent).await.unwrap();
        assert_eq!(second.status(), &RunStatus::Running);
        assert_eq!(second.key(), first.key());
        let err = second
            .step("x", || async { Ok::<_, Error>(1) })
            .await
            .unwrap_err();
        assert!(matches!(err, Error::RunNotOwned { .. }), "{err}");
        first.finish(&json!({"order": 9})).await.unwrap();
        assert_eq!(second.wait().await.unwrap(), json!({"order": 9}));
        let third = Run::start("checkout", &intent).await.unwrap();
        assert_eq!(third.status(), &RunStatus::Finished(json!({"order": 9})));
    })
    .await;
}

static STEP_RUNS: AtomicUsize = AtomicUsize::new(0);

async fn counted(label: &str) -> Result<String, Error> {
    STEP_RUNS.fetch_add(1, SeqCst);
    Ok(format!("{label}-done"))
}

/// The run's first two steps: each answers its result, whether it ran or was reread.
async fn reserve_and_charge(run: &Run) {
    assert_eq!(
        run.step("reserve", || counted("reserve")).await.unwrap(),
        "reserve-done"
    );
    assert_eq!(
        run.step("charge", || counted("charge")).await.unwrap(),
        "charge-done"
    );
}

// MemoryStore runs on tokio's clock: the paused clock waits the lease out exactly.
#[tokio::test(start_paused = true)]
async fn a_resumed_run_rereads_finished_steps_instead_of_running_them() {
    let store = Arc::new(MemoryStore::new());
    let intent = json!({"order": 77});
    with_store(Arc::clone(&store), async {
        let run = Run::start_with("fulfil", &intent, short()).await.unwrap();
        reserve_and_charge(&run).await;
        let mails = run.enter(send_email(77)).await.unwrap();
        assert_eq!(mails, 1);
        // The worker dies here: its handle goes away without finishing.
        drop(run);
    })
    .await;
    assert_eq!(STEP_RUNS.load(SeqCst), 2);
    // Past the 300 ms lease of the dropped run (virtual time).
    tokio::time::sleep(Duration::from_millis(500)).await;
    with_store(Arc::clone(&store), async {
        let run = Run::start_with("fulfil", &intent, short()).await.unwrap();
        assert_eq!(run.status(), &RunStatus::Resumed);
        reserve_and_charge(&run).await;
        assert_eq!(
            run.enter(send_email(77)).await.unwrap(),
            1,
            "the email is replayed"
        );
        assert_eq!(
            run.step("ship", || counted("ship")).await.unwrap(),
            "ship-done"
        );
        let journal = run.journal().await.unwrap();
        let names: Vec<String> = journal
            .iter()
            .map(|e| format!("{}:{}", e.kind, e.name))
            .collect();
        assert_eq!(
            names,
            [
                "step:reserve",
                "step:charge",
                "tool:send_email",
                "step:ship"
            ]
        );
        assert!(
            journal
                .iter()
                .all(|e| e.status == tool_contracts::EntryStatus::Completed),
            "{journal:?}"
        );
        run.finish(&"shipped").await.unwrap();
    })
    .await;
    assert_eq!(STEP_RUNS.load(SeqCst), 3, "only `ship` ran on resume");
    assert_eq!(EMAILS.load(SeqCst), 1);
    // A tool call of the same intent outside the run is another key: runs scope their tools.
    with_store(store, async {
        assert_eq!(send_email(77).await.unwrap(), 2)
    })
    .await;
}

// MemoryStore runs on tokio's clock: the paused clock waits the lease out exactly.
#[tokio::test(start_paused = true)]
async fn a_resume_whose_code_asks_for_other_steps_fails_instead_of_mixing_journals() {
    let store = Arc::new(MemoryStore::new());
    let intent = json!({"order": 5});
    with_store(Arc::clone(&store), async {
        let run = Run::start_with("refund", &intent, short()).await.unwrap();
        run.step("lookup", || async { Ok::<_, Error>(1) })
            .await
            .unwrap();
        run.step("refund", || async { Ok::<_, Error>(2) })
            .await
            .unwrap();
        drop(run);
    })
    .await;
    // Past the 300 ms lease of the dropped run (virtual time).
    tokio::time::sleep(Duration::from_millis(500)).await;
    with_store(store, async {
        let run = Run::start_with("refund", &intent, short()).await.unwrap();
        run.step("lookup", || async { Ok::<_, Error>(1) })
            .await
            .unwrap();
        let err = run
            .step("notify", || async { Ok::<_, Error>(3) })
            .await
            .unwrap_err();
        match err {
            Error::NonDeterministic {
                position,
                recorded,
                requested,
                ..
            } => {
                assert_eq!(position, 1);
                assert_eq!(recorded, "step:refund");
                assert_eq!(requested, "step:notify");
            }
            other => panic!("expected NonDeterministic, got {other:?}"),
        }
    })
    .await;
}

// MemoryStore runs on tokio's clock: the paused clock waits the lease out exactly.
#[tokio::test(start_paused = true)]
async fn a_step_error_is_not_recorded_so_the_resume_runs_it_again() {
    let store = Arc::new(MemoryStore::new());
    let attempts = AtomicUsize::new(0);
    let step = || async {
        if attempts.fetch_add(1, SeqCst) == 0 {
            Err(Error::InvalidArguments {
                tool: "t".into(),
                field: None,
                message: "boom".into(),
            })
        } else {
            Ok(7)
        }
    };
    with_store(Arc::clone(&store), async {
        let run = Run::start_with("flaky", &json!({"id": 1}), short())
            .await
            .unwrap();
        assert!(run.step("call", step).await.is_err());
        drop(run);
    })
    .await;
    // Past the 300 ms lease of the dropped run (virtual time).
    tokio::time::sleep(Duration::from_millis(500)).await;
    with_store(store, async {
        let run = Run::start_with("flaky", &json!({"id": 1}), short())
            .await
            .unwrap();
        assert_eq!(run.status(), &RunStatus::Resumed);
        assert_eq!(run.step("call", step).await.unwrap(), 7);
        assert_eq!(
            run.step("call", step).await.unwrap(),
            7,
            "a second `call` is its own step"
        );
        let err = Run::start("flaky", &json!({})).await.unwrap_err();
        assert!(
            matches!(err, Error::InvalidArguments { .. }),
            "an empty intent is refused: {err}"
        );
    })
    .await;
    assert_eq!(attempts.load(SeqCst), 3);
}

#[tokio::test]
async fn an_invalid_scope_is_refused_by_status_of_as_by_start_never_dropped() {
    with_store(MemoryStore::new(), async {
        let intent = json!({"order": 901});
        // A run of this intent outside any scope...
        let run = Run::start("scoped_status", &intent).await.unwrap();
        run.finish(&"shipped").await.unwrap();
        assert!(
            Run::status_of("scoped_status", &intent, RunOptions::default())
                .await
                .unwrap()
                .is_some()
        );
        // ...is not what a reader with an invalid scope gets: an error, as `start` gives.
        tool_contracts::with_scope("tenant\u{1}7", async {
            let read = Run::status_of("scoped_status", &intent, RunOptions::default()).await;
            assert!(
                matches!(read, Err(Error::InvalidArguments { .. })),
                "an invalid scope must not fall back to no scope: {read:?}"
            );
            assert!(matches!(
                Run::start("scoped_status", &intent).await,
                Err(Error::InvalidArguments { .. })
            ));
        })
        .await;
    })
    .await;
}

// ---------------------------------------------------------------------------------------
// Compensation.

use std::sync::Mutex;
use tool_contracts::{
    operation, CompensationState, EntryStatus, OperationState, RunState, Undo, UndoContext,
    UndoOutcome,
};

/// What the undos of one test did, in order: `(step, undo key)`.
type Undone = Arc<Mutex<Vec<(String, String)>>>;

fn undo_into(
    log: &Undone,
) -> impl FnOnce(String, UndoContext) -> std::future::Ready<Result<String, Error>> {
    let log = Arc::clone(log);
    move |done: String, cx: UndoContext| {
        log.lock()
            .unwrap()
            .push((cx.step().to_owned(), cx.key().to_owned()));
        std::future::ready(Ok(format!("undid {done}")))
    }
}

/// [`undo_into`] with a `verify` that finds the undo in the log by its key.
fn verified(log: &Undone) -> Undo<String> {
    let found_in = Arc::clone(log);
    Undo::new(undo_into(log)).verify(move |done: String, cx: UndoContext| {
        let found = found_in.lock().unwrap().iter().any(|(_, k)| k == cx.key());
        std::future::ready(Ok::<_, Error>(found.then(|| format!("undid {done}"))))
    })
}

async fn refused() -> Result<String, Error> {
    Err(Error::InvalidArguments {
        tool: "ship".to_owned(),
        field: None,
        message: "refused".to_owned(),
    })
}

#[tokio::test]
async fn a_failed_run_is_compensated_newest_first_once_and_reads_compensated_everywhere() {
    with_store(MemoryStore::new(), async {
        let log: Undone = Arc::default();
        let intent = json!({"order": 1});
        let run = Run::start("saga", &intent).await.unwrap();
        let key = run.key().to_owned();
        for step in ["reserve", "charge", "label"] {
            run.step_with_undo(
                step,
                || async move { Ok::<_, Error>(step.to_owned()) },
                undo_into(&log),
            )
            .await
            .unwrap();
        }
        // A step with nothing to undo does not make the run need intervention.
        run.step_with_undo("quote", || async { Ok::<_, Error>(7u32) }, Undo::nothing())
            .await
            .unwrap();
        assert!(run.step("ship", refused).await.is_err());
        let journal = run.journal().await.unwrap();
        let undo_keys: Vec<String> = journal
            .iter()
            .filter_map(|e| e.undo.as_ref().map(|u| u.key.clone()))
            .collect();
        assert_eq!(undo_keys.len(), 3, "{journal:?}");
        let c = run.compensate("the courier refused").await.unwrap();
        assert_eq!(c.state, CompensationState::Compensated, "{c:?}");
        let names: Vec<&str> = c.steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["quote", "label", "charge", "reserve"]);
        assert_eq!(c.steps[0].outcome, UndoOutcome::NothingToUndo);
        let undone = log.lock().unwrap().clone();
        let order: Vec<&str> = undone.iter().map(|(s, _)| s.as_str()).collect();
        assert_eq!(order, ["label", "charge", "reserve"]);
        // Each undo was handed its own key, the one the journal lists for its step.
        let mut handed: Vec<String> = undone.iter().map(|(_, k)| k.clone()).collect();
        handed.reverse();
        assert_eq!(handed, undo_keys);
        // Every surface reads it the same: the run handle, the operator view, the operation.
        let again = Run::start("saga", &intent).await.unwrap();
        assert_eq!(again.status(), &RunStatus::Compensated(c.clone()));
        let info = Run::status_of("saga", &intent, RunOptions::default())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(info.state, RunState::Compensated);
        let op = operation(&key).await.unwrap().unwrap();
        assert_eq!(op.state, OperationState::Compensated);
        assert_eq!(
            op.error.unwrap()["compensation"]["reason"],
            "the courier refused"
        );
        assert!(matches!(
            again.wait().await,
            Err(Error::RunCompensating { .. })
        ));
        assert_eq!(log.lock().unwrap().len(), 3, "no undo ran twice");
    })
    .await;
}

#[tokio::test]
async fn a_step_without_undo_or_a_failing_undo_makes_the_run_need_intervention_after_undoing_the_rest(
) {
    with_store(MemoryStore::new(), async {
        let log: Undone = Arc::default();
        let intent = json!({"order": 2});
        let run = Run::start("saga", &intent).await.unwrap();
        let key = run.key().to_owned();
        run.step_with_undo(
            "reserve",
            || async { Ok::<_, Error>("r".to_owned()) },
            undo_into(&log),
        )
        .await
        .unwrap();
        run.step("charge", || async { Ok::<_, Error>("c".to_owned()) })
            .await
            .unwrap();
        // While it compensates, the run's operation reads `compensating`: the undo waits
        // for a read made beside it.
        let entered = Arc::new(tokio::sync::Notify::new());
        let proceed = Arc::new(tokio::sync::Notify::new());
        let (e, p) = (Arc::clone(&entered), Arc::clone(&proceed));
        run.step_with_undo(
            "label",
            || async { Ok::<_, Error>("l".to_owned()) },
            move |_: String, _: UndoContext| async move {
                e.notify_one();
                p.notified().await;
                Err::<(), _>("the label printer is offline")
            },
        )
        .await
        .unwrap();
        let (c, seen) = tokio::join!(run.compensate("refused"), async {
            entered.notified().await;
            let state = operation(&key).await.unwrap().map(|op| op.state);
            proceed.notify_one();
            state
        });
        let c = c.unwrap();
        assert_eq!(seen, Some(OperationState::Compensating));
        assert_eq!(c.state, CompensationState::NeedsIntervention, "{c:?}");
        let outcomes: Vec<(&str, &UndoOutcome)> = c
            .steps
            .iter()
            .map(|s| (s.name.as_str(), &s.outcome))
            .collect();
        assert_eq!(
            outcomes,
            [
                (
                    "label",
                    &UndoOutcome::Failed {
                        error: "the label printer is offline".to_owned()
                    }
                ),
                ("charge", &UndoOutcome::NoUndo),
                (
                    "reserve",
                    &UndoOutcome::Undone {
                        result: json!("undid r")
                    }
                ),
            ]
        );
        // The older step was still undone, once.
        assert_eq!(log.lock().unwrap().len(), 1);
        let op = operation(&key).await.unwrap().unwrap();
        assert_eq!(op.state, OperationState::NeedsIntervention);
        assert_eq!(op.state.as_str(), "needs_intervention");
        let info = Run::status_of("saga", &intent, RunOptions::default())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(info.state, RunState::NeedsIntervention);
        // The failed undo is stored under its key (never retried by itself).
        let again = Run::start("saga", &intent).await.unwrap();
        assert!(matches!(again.status(), RunStatus::Compensated(c2) if *c2 == c));
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_resumed_compensation_runs_no_new_step_and_never_repeats_a_recorded_undo() {
    with_store(MemoryStore::new(), async {
        let log: Undone = Arc::default();
        let intent = json!({"order": 3});
        let first = Run::start_with("saga", &intent, short()).await.unwrap();
        for step in ["reserve", "charge"] {
            first
                .step_with_undo(
                    step,
                    || async move { Ok::<_, Error>(step.to_owned()) },
                    verified(&log),
                )
                .await
                .unwrap();
        }
        // The worker dies mid-compensation, after the newest undo's journal entry (and
        // maybe inside the older undo: its `verify` settles that).
        let charge_undo = first.journal().await.unwrap()[1].undo.clone().unwrap().key;
        let dying = async move {
            let run = first;
            let _ = run.compensate("refused").await;
        };
        let watch = async {
            loop {
                let op = operation(&charge_undo).await.unwrap();
                if op.is_some_and(|op| op.state == OperationState::Completed) {
                    break;
                }
                tokio::task::yield_now().await;
            }
        };
        tokio::select! { _ = dying => panic!("compensation should not finish"), _ = watch => {} }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let run = Run::start_with("saga", &intent, short()).await.unwrap();
        assert_eq!(run.status(), &RunStatus::Compensating);
        // Finished steps replay; a step that never ran is refused, not run.
        for step in ["reserve", "charge"] {
            run.step_with_undo(
                step,
                || async move { Ok::<_, Error>(step.to_owned()) },
                verified(&log),
            )
            .await
            .unwrap();
        }
        let err = run
            .step("ship", || async { Ok::<_, Error>(1) })
            .await
            .unwrap_err();
        assert!(matches!(err, Error::RunCompensating { .. }), "{err}");
        let journal = run.journal().await.unwrap();
        assert_eq!(
            journal[1].undo.as_ref().unwrap().status,
            EntryStatus::Completed
        );
        let c = run.compensate("another reason").await.unwrap();
        assert_eq!(c.state, CompensationState::Compensated, "{c:?}");
        assert_eq!(c.reason, "refused", "the first reason is kept");
        let order: Vec<String> = log.lock().unwrap().iter().map(|(s, _)| s.clone()).collect();
        assert_eq!(order, ["charge", "reserve"], "each undo once");
    })
    .await;
}
