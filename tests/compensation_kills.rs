//! A run with three compensable steps whose fourth step fails, killed with SIGKILL at every
//! boundary of its compensation (before each undo's effect, after its effect and before its
//! journal entry, after its journal entry) and started again, on every durable store: each
//! undo is applied exactly once. The proof is a ledger whose undo lines are keyed by the
//! undo's key: a second line with the same key is counted as a duplicate, never merged.
//!
//! The undos have a `verify` that looks their key up in the ledger: that is what settles a
//! kill between an undo's effect and its journal entry (an unknown outcome otherwise).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use cleanup::Durable::{Postgres, Redis, Sqlite};
use cleanup::Suite;
use serde_json::json;
use tool_contracts::{
    operation, with_scope, with_store, Compensation, CompensationState, Error, Run, RunOptions,
    RunStatus, Undo, UndoContext, UndoOutcome,
};

#[path = "support/cleanup.rs"]
mod cleanup;
mod support;
#[path = "support/workers.rs"]
mod workers;

/// The steps that can be undone, in run order; compensation undoes them in reverse.
const STEPS: [&str; 3] = ["reserve", "charge", "label"];
/// Boundaries per undo: before its effect, after its effect, after its journal entry.
const PER_UNDO: u32 = 3;
const MARK: &str = "COMPENSATION:";

/// Not a test of its own: the child processes re-execute this binary, and this entry
/// point runs the task described by `TC_COMP_ARGS` (`[store, scope, ledger, boundary]`).
#[test]
fn compensation_entry_point() {
    let Ok(args) = std::env::var("TC_COMP_ARGS") else {
        return;
    };
    let (store, scope, ledger, boundary): (String, String, PathBuf, Option<u32>) =
        serde_json::from_str(&args).unwrap();
    PAUSE_AT.store(boundary.unwrap_or(0), Ordering::SeqCst);
    // The boundary after an undo's journal entry is the runtime's own "undo recorded"
    // event: the subscriber below stalls the worker right there.
    tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::DEBUG)
        .with_writer(|| Tap)
        .with_ansi(false)
        .init();
    let runtime = workers::runtime(2);
    let out = runtime.block_on(async move {
        let store = tool_contracts::store::open(&store).await.unwrap();
        with_store(store, with_scope(scope.clone(), task(scope, ledger))).await
    });
    match out {
        Ok(report) => workers::report(MARK, &report),
        Err(e) => {
            eprintln!("compensation task failed: {e}");
            std::process::exit(1);
        }
    }
}

/// The boundary this process stalls at (0: none).
static PAUSE_AT: AtomicU32 = AtomicU32::new(0);
/// How many undos this process recorded.
static RECORDED: AtomicU32 = AtomicU32::new(0);

/// Announces boundary `n` and stalls there if it is the one asked for, so the parent can
/// SIGKILL the worker at that exact point.
fn boundary(n: u32) {
    if PAUSE_AT.load(Ordering::SeqCst) == n {
        println!("\nboundary {n}");
        let _ = std::io::stdout().flush();
        std::thread::sleep(Duration::from_secs(60));
    }
}

/// Where the log goes: stderr, and each "undo recorded" event is the boundary after that
/// undo's journal entry.
struct Tap;

impl Write for Tap {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        std::io::stderr().write_all(buf)?;
        if String::from_utf8_lossy(buf).contains("tool-contracts: undo recorded") {
            let undo = RECORDED.fetch_add(1, Ordering::SeqCst);
            boundary(undo * PER_UNDO + 3);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// One `write` per line (a kill never leaves half a line): `<scope> <what> <key>`.
fn append(ledger: &Path, line: &str) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(ledger)?;
    f.write_all(format!("{line}\n").as_bytes())
}

/// Whether the ledger holds the undo keyed `key` (what the undo's `verify` asks).
fn ledger_has(ledger: &Path, key: &str) -> std::io::Result<bool> {
    let text = std::fs::read_to_string(ledger)?;
    Ok(text
        .lines()
        .any(|l| l.split(' ').nth(1) == Some("undo") && l.ends_with(key)))
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Report {
    status: String,
    compensation: Compensation,
    operation_state: Option<String>,
}

fn undo_of(scope: &str, ledger: &Path, index: u32) -> Undo<String> {
    let (scope, ledger, check) = (scope.to_owned(), ledger.to_owned(), ledger.to_owned());
    Undo::new(move |done: String, cx: UndoContext| async move {
        boundary(index * PER_UNDO + 1);
        append(
            &ledger,
            &format!("{scope} undo {} {done} {}", cx.step(), cx.key()),
        )?;
        boundary(index * PER_UNDO + 2);
        Ok::<_, std::io::Error>(format!("undid {done}"))
    })
    .verify(move |done: String, cx: UndoContext| async move {
        Ok::<_, std::io::Error>(ledger_has(&check, cx.key())?.then(|| format!("undid {done}")))
    })
}

async fn task(scope: String, ledger: PathBuf) -> Result<Report, Error> {
    let options = RunOptions::default().lease(Duration::from_millis(500));
    let intent = json!({ "order": 31 });
    let (run, status) = loop {
        let run = Run::start_with("ship_order", &intent, options).await?;
        match run.status().clone() {
            RunStatus::Compensated(compensation) => {
                let state = operation(run.key()).await?.map(|op| op.state.to_string());
                return Ok(Report {
                    status: "compensated earlier".to_owned(),
                    compensation,
                    operation_state: state,
                });
            }
            // A live (or not yet expired) owner: wait, then start again to resume it.
            RunStatus::Running => match run.wait().await {
                Err(Error::OutcomeUnknown { .. } | Error::RunCompensating { .. }) => continue,
                other => panic!("the run cannot finish: {other:?}"),
            },
            status => break (run, format!("{status:?}")),
        }
    };
    let forward = async {
        for (index, step) in STEPS.into_iter().enumerate() {
            let (scope, ledger) = (scope.clone(), ledger.clone());
            // Compensation visits the steps newest first: `label` is undo 0.
            let undo_index = (STEPS.len() - 1 - index) as u32;
            let undo = undo_of(&scope, &ledger, undo_index);
            run.step_with_undo(
                step,
                || async move {
                    append(&ledger, &format!("{scope} do {step} -")).map_err(|e| {
                        Error::InvalidArguments {
                            tool: step.to_owned(),
                            field: None,
                            message: e.to_string(),
                        }
                    })?;
                    Ok::<_, Error>(format!("{step}-31"))
                },
                undo,
            )
            .await?;
        }
        // The courier refuses the parcel: the run fails and is compensated.
        run.step("book_courier", || async {
            Err::<String, _>(Error::InvalidArguments {
                tool: "book_courier".to_owned(),
                field: None,
                message: "the courier refused the parcel".to_owned(),
            })
        })
        .await
    };
    let failure = match forward.await {
        Ok(_) => panic!("the courier step always fails"),
        Err(e) => e.to_string(),
    };
    let key = run.key().to_owned();
    let compensation = run.compensate(&failure).await?;
    let state = operation(&key).await?.map(|op| op.state.to_string());
    Ok(Report {
        status,
        compensation,
        operation_state: state,
    })
}

fn command(store: &str, scope: &str, ledger: &Path, boundary: Option<u32>) -> Command {
    let mut cmd = workers::command("compensation_entry_point");
    let args = serde_json::to_string(&(store, scope, ledger, boundary)).unwrap();
    cmd.env("TC_COMP_ARGS", args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    cmd
}

fn run_to_end(store: &str, scope: &str, ledger: &Path) -> Report {
    let out = command(store, scope, ledger, None).output().unwrap();
    assert!(out.status.success(), "the compensation task failed");
    let mut reports = workers::reports::<Report>(MARK, &out.stdout);
    assert_eq!(reports.len(), 1);
    reports.remove(0)
}

/// Lines of the ledger per (scope, what, step, key): `what` is `do` or `undo`.
fn ledger_lines(ledger: &Path) -> BTreeMap<(String, String, String, String), usize> {
    let text = std::fs::read_to_string(ledger).unwrap_or_default();
    let mut counts = BTreeMap::new();
    for line in text.lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        let key = match parts[1] {
            "undo" => parts[4].to_owned(),
            _ => String::new(),
        };
        let entry = (
            parts[0].to_owned(),
            parts[1].to_owned(),
            parts[2].to_owned(),
            key,
        );
        *counts.entry(entry).or_default() += 1;
    }
    counts
}

/// Checks one scope's run: compensated, each step done once and undone once, in reverse
/// order, under the keys the compensation reports.
fn check_scope(
    scope: &str,
    report: &Report,
    lines: &BTreeMap<(String, String, String, String), usize>,
) {
    let c = &report.compensation;
    assert_eq!(c.state, CompensationState::Compensated, "{scope}: {c:?}");
    assert!(c.reason.contains("the courier refused the parcel"), "{c:?}");
    assert_eq!(report.operation_state.as_deref(), Some("compensated"));
    let visited: Vec<&str> = c.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        visited,
        ["label", "charge", "reserve"],
        "reverse order: {c:?}"
    );
    for step in &c.steps {
        assert!(
            matches!(step.outcome, UndoOutcome::Undone { .. }),
            "{scope}: {step:?}"
        );
        let undo_key = step.undo_key.clone().unwrap();
        let applied = lines.get(&(
            scope.to_owned(),
            "undo".to_owned(),
            step.name.clone(),
            undo_key.clone(),
        ));
        assert_eq!(
            applied,
            Some(&1),
            "{scope}: the undo of `{}` (key {undo_key}) must be applied exactly once: {lines:?}",
            step.name
        );
        let done = lines.get(&(
            scope.to_owned(),
            "do".to_owned(),
            step.name.clone(),
            String::new(),
        ));
        assert_eq!(done, Some(&1), "{scope}: `{}` ran once", step.name);
    }
    let of_scope = lines.iter().filter(|((s, ..), _)| s == scope).count();
    assert_eq!(
        of_scope, 6,
        "{scope}: three steps, three undos, nothing else: {lines:?}"
    );
}

fn kill_at_every_compensation_boundary(store: String) {
    let ledger = support::temp_path("compensation", "ledger");
    let base = support::unique("c");
    let mut reports = Vec::new();
    let uninterrupted = format!("{base}-uninterrupted");
    let report = run_to_end(&store, &uninterrupted, &ledger);
    assert_eq!(report.status, "Started");
    reports.push((uninterrupted, report));
    let boundaries = STEPS.len() as u32 * PER_UNDO;
    for boundary in 1..=boundaries {
        let scope = format!("{base}-kill{boundary}");
        workers::kill_at_boundary(
            &mut command(&store, &scope, &ledger, Some(boundary)),
            boundary,
        );
        let report = run_to_end(&store, &scope, &ledger);
        assert_eq!(
            report.status, "Compensating",
            "killed at boundary {boundary}"
        );
        // A start of the compensated run runs nothing and answers the same compensation.
        let again = run_to_end(&store, &scope, &ledger);
        assert_eq!(again.status, "compensated earlier");
        assert_eq!(again.compensation, report.compensation);
        reports.push((scope, report));
    }
    let lines = ledger_lines(&ledger);
    let _ = std::fs::remove_file(&ledger);
    for (scope, report) in &reports {
        check_scope(scope, report, &lines);
    }
    let duplicates: usize = lines.values().map(|n| n - 1).sum();
    eprintln!(
        "compensation kills: {boundaries} SIGKILLs, {} runs compensated, {} undos, {duplicates} duplicates",
        reports.len(),
        reports.len() * STEPS.len()
    );
}

/// The SQLite files' label and the suite's name in a skip notice.
const KILLS: Suite = Suite {
    label: "compensation",
    name: "the compensation kill tests",
};

#[test]
fn sqlite_compensation_killed_at_every_boundary_applies_each_undo_once() {
    KILLS.on(Sqlite, kill_at_every_compensation_boundary);
}

#[test]
fn redis_compensation_killed_at_every_boundary_applies_each_undo_once() {
    KILLS.on(Redis, kill_at_every_compensation_boundary);
}

#[test]
fn postgres_compensation_killed_at_every_boundary_applies_each_undo_once() {
    KILLS.on(Postgres, kill_at_every_compensation_boundary);
}
