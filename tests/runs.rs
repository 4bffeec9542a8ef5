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
