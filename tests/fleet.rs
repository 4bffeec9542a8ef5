//! Fleets and crashes, across real OS processes, on every durable backend.
//!
//! The test binary re-executes itself as the worker: `fleet_worker_entry_point` is a no-op
//! unless `TC_FLEET_ROLE` is set, in which case it runs the role the parent asked for and
//! prints one JSON line per call on stdout.
//!
//! - fleet: 4 processes call the same 200 intents concurrently; the side-effect ledger must
//!   hold exactly 200 effects and every process must see the same result per intent.
//! - crash: a worker is SIGKILLed while a body sleeps after its side effect; a new process
//!   retrying the same intent gets `OutcomeUnknown` (no `verify`) or the reconciled result
//!   (with `verify`), and the ledger never shows a second effect.
//!
//! Each fleet's summary line is printed and recorded as a figure (`tests/figures/mod.rs`).

#[path = "support/calls.rs"]
mod calls;
#[path = "support/cleanup.rs"]
mod cleanup;
mod figures;
mod support;
#[path = "support/workers.rs"]
mod workers;
use calls::ToolError;

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tool_contracts::{mutating_tool, with_scope, with_store};

fn ledger_path() -> PathBuf {
    PathBuf::from(std::env::var("TC_FLEET_LEDGER").unwrap_or_default())
}

/// Appends one line per effect with a single `write` (lines under PIPE_BUF written with
/// O_APPEND do not interleave); `writeln!` would issue one `write` per format piece and let
/// concurrent processes interleave them.
fn record_effect(intent: u64) -> Result<(), ToolError> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(ledger_path())
        .map_err(|e| ToolError::Ledger(e.to_string()))?;
    f.write_all(format!("{intent} {}\n", std::process::id()).as_bytes())
        .map_err(|e| ToolError::Ledger(e.to_string()))
}

fn effects(ledger: &Path) -> BTreeMap<u64, usize> {
    let text = std::fs::read_to_string(ledger).unwrap_or_default();
    let mut counts = BTreeMap::new();
    for line in text.lines() {
        let intent: u64 = line
            .split(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("malformed ledger line {line:?} in {}", ledger.display()));
        *counts.entry(intent).or_default() += 1;
    }
    counts
}

/// The fleet's tool: one effect per intent, whoever runs it.
#[mutating_tool(idempotency_key_fields = [intent], lease = "10s")]
pub async fn fleet_charge(intent: u64) -> Result<String, ToolError> {
    record_effect(intent)?;
    tokio::time::sleep(Duration::from_millis(intent % 7)).await;
    Ok(format!("charged-{intent}-by-{}", std::process::id()))
}

/// Sleeps after its effect so the parent can kill it mid-call; no `verify`.
#[mutating_tool(idempotency_key_fields = [intent], lease = "1s")]
pub async fn crash_unverified(intent: u64) -> Result<String, ToolError> {
    record_effect(intent)?;
    tokio::time::sleep(Duration::from_secs(60)).await;
    Ok(format!("unverified-{intent}"))
}

/// Like `crash_unverified`, with a `verify` that reads the ledger.
#[mutating_tool(idempotency_key_fields = [intent], lease = "1s", verify = verify_crash)]
pub async fn crash_verified(intent: u64) -> Result<String, ToolError> {
    record_effect(intent)?;
    tokio::time::sleep(Duration::from_secs(60)).await;
    Ok(format!("verified-{intent}"))
}

/// The effect happened iff the ledger has a line for the intent.
pub async fn verify_crash(intent: &u64) -> Result<Option<String>, ToolError> {
    let done = effects(&ledger_path()).contains_key(intent);
    Ok(done.then(|| format!("verified-{intent}")))
}

#[derive(Serialize, Deserialize)]
struct Line {
    intent: u64,
    result: Result<String, String>,
}

async fn worker(role: &str) {
    let url = std::env::var("TC_FLEET_STORE").unwrap();
    let scope = std::env::var("TC_FLEET_SCOPE").unwrap();
    let store = tool_contracts::store::open(&url).await.unwrap();
    let out = |intent: u64, result: Result<String, ToolError>| {
        let line = Line {
            intent,
            result: result.map_err(|e| e.to_string()),
        };
        workers::report(MARK, &line);
    };
    match role {
        "fleet" => {
            let seed: u64 = std::env::var("TC_FLEET_SEED").unwrap().parse().unwrap();
            // Each process walks the intents in its own order, 16 calls in flight.
            let mut order: Vec<u64> = (0..200).collect();
            order.sort_by_key(|i| (i.wrapping_mul(2654435761).wrapping_add(seed * 97)) % 200);
            let results = with_store(
                store,
                with_scope(scope, async {
                    use futures::stream::{self, StreamExt};
                    stream::iter(order)
                        .map(|i| async move { (i, fleet_charge(i).await) })
                        .buffer_unordered(16)
                        .collect::<Vec<_>>()
                        .await
                }),
            )
            .await;
            for (i, r) in results {
                out(i, r);
            }
        }
        "crash-unverified" | "crash-verified" => {
            let intent: u64 = std::env::var("TC_FLEET_INTENT").unwrap().parse().unwrap();
            let verified = role == "crash-verified";
            let r = with_store(
                store,
                with_scope(scope, async {
                    if verified {
                        crash_verified(intent).await
                    } else {
                        crash_unverified(intent).await
                    }
                }),
            )
            .await;
            out(intent, r);
        }
        other => panic!("unknown role {other}"),
    }
}

/// Not a test of its own: the entry point of the worker processes the tests below start.
#[test]
fn fleet_worker_entry_point() {
    let Ok(role) = std::env::var("TC_FLEET_ROLE") else {
        return;
    };
    workers::runtime(2).block_on(worker(&role));
}

struct Env {
    store: String,
    scope: String,
    ledger: PathBuf,
}

fn spawn(env: &Env, role: &str, extra: &[(&str, String)]) -> std::process::Child {
    let mut cmd = workers::command("fleet_worker_entry_point");
    cmd.env("TC_FLEET_ROLE", role)
        .env("TC_FLEET_STORE", &env.store)
        .env("TC_FLEET_SCOPE", &env.scope)
        .env("TC_FLEET_LEDGER", &env.ledger)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

const MARK: &str = "TC_FLEET_LINE ";

fn run_fleet(store: String) {
    let backend = store.split(':').next().unwrap_or("").to_owned();
    let started = Instant::now();
    let env = Env {
        store,
        scope: support::unique("fleet"),
        ledger: support::temp_path("fleet", "ledger"),
    };
    let children: Vec<_> = (0..4)
        .map(|seed| spawn(&env, "fleet", &[("TC_FLEET_SEED", seed.to_string())]))
        .collect();
    let mut per_intent: HashMap<u64, Vec<String>> = HashMap::new();
    for child in children {
        let output = child.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "a worker failed: {:?}",
            output.status
        );
        let lines: Vec<Line> = workers::reports(MARK, &output.stdout);
        assert_eq!(lines.len(), 200, "every worker answers every intent");
        for line in lines {
            let result = line
                .result
                .unwrap_or_else(|e| panic!("intent {} failed: {e}", line.intent));
            per_intent.entry(line.intent).or_default().push(result);
        }
    }
    let effects = effects(&env.ledger);
    let _ = std::fs::remove_file(&env.ledger);
    assert_eq!(effects.len(), 200, "every intent took effect");
    assert!(
        effects.values().all(|n| *n == 1),
        "no intent took effect twice: {effects:?}"
    );
    assert_eq!(per_intent.len(), 200);
    for (intent, results) in per_intent {
        assert_eq!(results.len(), 4);
        assert!(
            results.iter().all(|r| r == &results[0]),
            "intent {intent}: {results:?}"
        );
    }
    let duplicates = effects.values().filter(|n| **n > 1).count();
    let line = format!(
        "fleet[{backend}]: 4 processes x 200 intents, 16 calls in flight each; effects {}, \
         duplicates seen {duplicates}, every caller read one result per intent; took {:.1}s",
        effects.values().sum::<usize>(),
        started.elapsed().as_secs_f64()
    );
    println!("{line}");
    figures::record(
        "fleet",
        &backend,
        &line,
        serde_json::json!({
            "processes": 4,
            "intents": 200,
            "effects": effects.values().sum::<usize>(),
            "duplicates": duplicates,
        }),
    );
}

fn run_crash(store: String, verified: bool) {
    let env = Env {
        store,
        scope: support::unique("crash"),
        ledger: support::temp_path("crash", "ledger"),
    };
    let role = if verified {
        "crash-verified"
    } else {
        "crash-unverified"
    };
    let intent = [("TC_FLEET_INTENT", "41".to_owned())];
    let mut child = spawn(&env, role, &intent);
    let deadline = Instant::now() + Duration::from_secs(60);
    while effects(&env.ledger).is_empty() {
        assert!(Instant::now() < deadline, "the worker never took effect");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SIGKILL: no destructor, no release, the claim is left as the process left it.
    child.kill().unwrap();
    child.wait().unwrap();
    std::thread::sleep(Duration::from_millis(1500)); // past the 1 s lease
    let output = spawn(&env, role, &intent).wait_with_output().unwrap();
    assert!(output.status.success());
    let lines: Vec<Line> = workers::reports(MARK, &output.stdout);
    assert_eq!(lines.len(), 1);
    if verified {
        assert_eq!(
            lines[0].result.as_deref(),
            Ok("verified-41"),
            "reconciled through verify"
        );
    } else {
        let err = lines[0].result.as_ref().unwrap_err();
        assert!(err.starts_with("outcome_unknown"), "{err}");
    }
    let effects = effects(&env.ledger);
    let _ = std::fs::remove_file(&env.ledger);
    assert_eq!(
        effects.get(&41),
        Some(&1),
        "exactly one effect: {effects:?}"
    );
}

#[test]
fn sqlite_fleet_of_four_processes_makes_one_effect_per_intent() {
    let (path, _cleanup) = cleanup::sqlite_file("fleet");
    run_fleet(format!("sqlite:{path}"));
}

#[test]
fn sqlite_crash_mid_call_gives_unknown_outcome_not_a_second_effect() {
    let (path, _cleanup) = cleanup::sqlite_file("crash");
    run_crash(format!("sqlite:{path}"), false);
}

#[test]
fn sqlite_crash_mid_call_is_reconciled_by_verify() {
    let (path, _cleanup) = cleanup::sqlite_file("crash");
    run_crash(format!("sqlite:{path}"), true);
}

#[test]
fn redis_fleet_of_four_processes_makes_one_effect_per_intent() {
    if let Some(url) = support::url(&support::REDIS, "the fleet and crash tests on Redis") {
        run_fleet(url);
    }
}

#[test]
fn redis_crash_mid_call_is_unknown_or_reconciled_never_repeated() {
    if let Some(url) = support::url(&support::REDIS, "the fleet and crash tests on Redis") {
        run_crash(url.clone(), false);
        run_crash(url, true);
    }
}

#[test]
fn postgres_fleet_of_four_processes_makes_one_effect_per_intent() {
    if let Some(url) = support::url(
        &support::POSTGRES,
        "the fleet and crash tests on PostgreSQL",
    ) {
        run_fleet(url);
    }
}

#[test]
fn postgres_crash_mid_call_is_unknown_or_reconciled_never_repeated() {
    if let Some(url) = support::url(
        &support::POSTGRES,
        "the fleet and crash tests on PostgreSQL",
    ) {
        run_crash(url.clone(), false);
        run_crash(url, true);
    }
}
