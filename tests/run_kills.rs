//! The agent task of `examples/agent_task.rs` (five steps, three mutating tools), killed
//! with SIGKILL at each step boundary in turn and resumed, on every durable store: every
//! side effect happens exactly once and the final result equals an uninterrupted run's.
//! Also: two processes starting the same task at once make one run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use cleanup::Durable::{Postgres, Redis, Sqlite};
use cleanup::Suite;

/// The example itself, compiled into this test binary so the child processes are exactly it.
#[allow(dead_code)]
#[path = "../examples/agent_task.rs"]
mod agent_task;
#[path = "support/cleanup.rs"]
mod cleanup;
mod support;
#[path = "support/workers.rs"]
mod workers;

/// Not a test of its own: the child processes below re-execute this binary, and this entry
/// point runs the example's command line from `TC_AGENT_ARGS` (a JSON array).
#[test]
fn agent_task_entry_point() {
    let Ok(args) = std::env::var("TC_AGENT_ARGS") else {
        return;
    };
    let args: Vec<String> = serde_json::from_str(&args).unwrap();
    if let Err(e) = workers::runtime(2).block_on(agent_task::cli(args)) {
        eprintln!("agent task failed: {e}");
        std::process::exit(1);
    }
}

struct Case {
    store: String,
    ledger: PathBuf,
    order: u64,
}

fn command(case: &Case, scope: &str, pause_at: Option<u32>) -> Command {
    let args = [
        "--store".to_owned(),
        case.store.clone(),
        "--order".to_owned(),
        case.order.to_string(),
        "--scope".to_owned(),
        scope.to_owned(),
        "--ledger".to_owned(),
        case.ledger.display().to_string(),
    ];
    let mut cmd = workers::command("agent_task_entry_point");
    cmd.env("TC_AGENT_ARGS", serde_json::to_string(&args).unwrap())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    match pause_at {
        Some(n) => cmd.env("TC_PAUSE_AT_BOUNDARY", n.to_string()),
        None => cmd.env_remove("TC_PAUSE_AT_BOUNDARY"),
    };
    cmd
}

fn result_of(stdout: &str) -> serde_json::Value {
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("result: ").map(|(_, json)| json))
        .unwrap_or_else(|| panic!("no result line in:\n{stdout}"));
    serde_json::from_str(line).unwrap()
}

fn run_to_end(case: &Case, scope: &str) -> (serde_json::Value, String) {
    let out = command(case, scope, None).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "the task failed:\n{stdout}");
    (result_of(&stdout), stdout)
}

/// Effects per (scope, effect) from the ledger.
fn effects(ledger: &Path) -> BTreeMap<(String, String), usize> {
    let text = std::fs::read_to_string(ledger).unwrap_or_default();
    let mut counts = BTreeMap::new();
    for line in text.lines() {
        let mut parts = line.split(' ');
        let scope = parts.next().unwrap().to_owned();
        let what = parts.next().unwrap().to_owned();
        *counts.entry((scope, what)).or_default() += 1;
    }
    counts
}

fn kill_at_every_boundary(store: String) {
    let case = Case {
        store,
        ledger: support::temp_path("agent", "ledger"),
        order: 4242,
    };
    let base = support::unique("s");
    let (expected, _) = run_to_end(&case, &format!("{base}-uninterrupted"));
    for boundary in 1..=5u32 {
        let scope = format!("{base}-kill{boundary}");
        workers::kill_at_boundary(&mut command(&case, &scope, Some(boundary)), boundary);
        let (result, stdout) = run_to_end(&case, &scope);
        assert!(stdout.contains("resumed after a crash"), "{stdout}");
        assert_eq!(result, expected, "killed at boundary {boundary}");
        // A duplicate start of the finished task runs nothing and returns the same result.
        let (again, stdout) = run_to_end(&case, &scope);
        assert!(stdout.contains("finished earlier"), "{stdout}");
        assert_eq!(again, expected);
    }
    let effects = effects(&case.ledger);
    let _ = std::fs::remove_file(&case.ledger);
    let mut scopes = 0;
    for scope in std::iter::once(format!("{base}-uninterrupted"))
        .chain((1..=5).map(|b| format!("{base}-kill{b}")))
    {
        scopes += 1;
        for what in ["reserve", "charge", "email"] {
            assert_eq!(
                effects.get(&(scope.clone(), what.to_owned())),
                Some(&1),
                "{scope}: `{what}` must happen exactly once: {effects:?}"
            );
        }
    }
    assert_eq!(effects.len(), scopes * 3, "no other effects: {effects:?}");
}

fn two_processes_start_one_run(store: String) {
    let case = Case {
        store,
        ledger: support::temp_path("dup", "ledger"),
        order: 777,
    };
    let scope = support::unique("dup");
    let children: Vec<_> = (0..2)
        .map(|_| command(&case, &scope, None).spawn().unwrap())
        .collect();
    let mut results = Vec::new();
    let mut started = 0;
    for child in children {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{stdout}");
        started += usize::from(stdout.contains(": started"));
        results.push(result_of(&stdout));
    }
    assert_eq!(started, 1, "exactly one process started the run");
    assert_eq!(results[0], results[1]);
    let effects = effects(&case.ledger);
    let _ = std::fs::remove_file(&case.ledger);
    assert_eq!(
        effects.values().copied().collect::<Vec<_>>(),
        vec![1, 1, 1],
        "{effects:?}"
    );
}

/// The SQLite files' label and the suite's name in a skip notice.
const KILLS: Suite = Suite {
    label: "agent",
    name: "the agent-task kill tests",
};

/// Both scenarios on one server (on SQLite each is a test of its own, on a file of its own).
fn both(store: String) {
    kill_at_every_boundary(store.clone());
    two_processes_start_one_run(store);
}

#[test]
fn sqlite_agent_task_killed_at_every_step_boundary_resumes_exactly_once() {
    KILLS.on(Sqlite, kill_at_every_boundary);
}

#[test]
fn sqlite_duplicate_start_from_two_processes_is_one_run() {
    KILLS.on(Sqlite, two_processes_start_one_run);
}

#[test]
fn redis_agent_task_killed_at_every_step_boundary_resumes_exactly_once() {
    KILLS.on(Redis, both);
}

#[test]
fn postgres_agent_task_killed_at_every_step_boundary_resumes_exactly_once() {
    KILLS.on(Postgres, both);
}
