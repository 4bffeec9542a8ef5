//! Crash injection: a worker process is SIGKILLed at random instants, hundreds of times,
//! on every durable store, and the invariants still hold when the dust settles.
//!
//! The test binary re-executes itself as the worker (as `tests/fleet.rs` does):
//! `crash_worker_entry_point` is a no-op unless `TC_CRASH_ROLE` is set. Roles:
//!
//! - `work`: a long-lived worker. For intents `from..to`, in order, it calls
//!   `crash_charge_verified` (with `verify`), `crash_charge_plain` (without) and a
//!   three-position `Run` (`quote` step, `reserve` step that calls a verified tool, and
//!   `crash_ship` through `run.enter`). Each effect appends one line to a ledger file
//!   (the "outside world"); each finished intent appends its results to a report file.
//! - `recover`: waits until no lease is live, runs `recover_once(&registry())` and lists
//!   what is still pending.
//! - `audit`: the final clean process: re-runs every intent and dumps each key's history.
//!
//! The parent kills `work` children at a random delay of 5-150 ms after spawn (seeded;
//! `TC_CRASH_SEED` overrides, `TC_CRASH_KILLS` sets the number of kills, default 200),
//! restarting from the first unfinished intent each time, then: a recovery pass, one
//! uninterrupted `work` child to finish the workload, the `audit` child, and a second
//! recovery pass. The parent then checks:
//!
//! - at most one effect per intent and tool; exactly one for the `verify` tools, the run's
//!   tool calls, and every plain call whose result was stored;
//! - every stored result is the one its effect produced (the ledger's tag), and the audit
//!   reads back exactly what the first caller got;
//! - every key's history has exactly one completion, and nothing after it (a finished
//!   step never runs again; `quote` ran at most once per acquisition of its key);
//! - after the last lease passed, the only pending keys are plain calls whose worker died
//!   mid-call (unknown by design, `OutcomeUnknown`), and recovery leaves exactly those.
//!
//! One summary line per store is printed (`crash_injection[...]`) and recorded as a
//! figure (`tests/figures/mod.rs`), from which `docs/guarantees.md` is rendered.

#[path = "support/calls.rs"]
mod calls;
#[path = "support/cleanup.rs"]
mod cleanup;
mod figures;
#[path = "support/stores.rs"]
mod stores;
mod support;
#[path = "support/workers.rs"]
mod workers;
use calls::ToolError;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tool_contracts::store::{PostgresStore, RedisStore, SqliteStore, Store};
use tool_contracts::{
    mutating_tool, recover_once, registry, with_scope, with_store, Error, Run, RunOptions,
    RunStatus, StepOptions,
};

/// Intents a worker runs at once.
const LANES: usize = 4;

/// Lease of every tool and run: short, so a restarted worker waits little for a dead one.
const LEASE: Duration = Duration::from_millis(300);

// ---------------------------------------------------------------------------------------
// The outside world: an append-only ledger of effects, one line each.

fn env_path(var: &str) -> PathBuf {
    PathBuf::from(std::env::var(var).unwrap_or_default())
}

/// Appends `line` with one `write` to a file opened with `O_APPEND`, so lines never
/// interleave, framed as `\n{line}\u{1e}\n`: a SIGKILL can cut a write short where it
/// crosses a page of the page cache (seen once in this test: a `done` line cut after 67
/// bytes, the next `ready` appended to it), and the framing leaves such a torn line on a
/// line of its own, without its end mark, where [`complete_lines`] skips it. The mark is
/// the record separator U+001E, which no line can hold: `serde_json` escapes control
/// characters inside strings, and ledger lines are `kind intent tag`. A torn ledger line is
/// an effect whose write failed: it did not happen.
fn append_line(path: &Path, line: &str) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    f.write_all(format!("\n{line}{END}\n").as_bytes())
}

/// The end mark of a whole line (see [`append_line`]).
const END: char = '\u{1e}';

/// The lines [`append_line`] wrote whole, without their end mark: blank lines (the framing)
/// and torn ones (cut short by a kill, or still being written) are skipped.
fn complete_lines(text: &str) -> impl Iterator<Item = &str> {
    text.split('\n').filter_map(|line| line.strip_suffix(END))
}

static EXECUTION: AtomicU64 = AtomicU64::new(0);

/// A tag no other execution of any process shares.
fn fresh_tag() -> String {
    let n = EXECUTION.fetch_add(1, Ordering::Relaxed);
    format!("{}.{n}.{}", std::process::id(), now_nanos() % 1_000_000_007)
}

fn now_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// Performs the effect `kind` for `intent`: one ledger line, then a short pause so kills
/// also land between the effect and the stored result (the unknown-outcome window).
async fn effect(kind: &str, intent: u64) -> Result<String, ToolError> {
    let tag = fresh_tag();
    append_line(
        &env_path("TC_CRASH_LEDGER"),
        &format!("{kind} {intent} {tag}"),
    )
    .map_err(|e| ToolError::Ledger(e.to_string()))?;
    let pause = (now_nanos() % 3_000) as u64;
    tokio::time::sleep(Duration::from_micros(pause)).await;
    Ok(format!("{kind}{intent}@{tag}"))
}

/// A line cut short by a kill (the torn `done` line of a real run, with the next process's
/// `ready` appended after it) is skipped, as is one cut right after a `;` of an error
/// message inside its JSON; the lines around them are read whole.
#[test]
fn a_torn_line_is_skipped_and_its_neighbours_read() {
    let e = END;
    let text = format!(
        "\nready{e}\n\nstart 303{e}\n\ndone {{\"intent\":303,\"plain\":{{\nready{e}\n\ndone {{\"intent\":4,\"plain\":{{\"Err\":\"in progress;\nstart 9{e}\n\nstart 1"
    );
    assert_eq!(
        complete_lines(&text).collect::<Vec<_>>(),
        ["ready", "start 303", "ready", "start 9"]
    );
    // What `append_line` writes is read back whole, `;` and all.
    let line = r#"done {"intent":4,"plain":{"Err":"in progress; retry"}}"#;
    let framed = format!("\n{line}{e}\n");
    assert_eq!(complete_lines(&framed).collect::<Vec<_>>(), [line]);
    // serde_json never writes the end mark raw.
    assert!(!serde_json::to_string(&format!("a{e}b"))
        .unwrap()
        .contains(e));
}

/// Ledger lines, `(kind, intent) -> tags` in order.
fn read_ledger(path: &Path) -> BTreeMap<(String, u64), Vec<String>> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut out: BTreeMap<(String, u64), Vec<String>> = BTreeMap::new();
    for line in complete_lines(&text) {
        let mut parts = line.split(' ');
        let (Some(kind), Some(intent), Some(tag)) = (parts.next(), parts.next(), parts.next())
        else {
            panic!("malformed ledger line {line:?}");
        };
        let intent: u64 = intent.parse().expect("ledger intent");
        out.entry((kind.to_owned(), intent))
            .or_default()
            .push(tag.to_owned());
    }
    out
}

/// What `verify` sees: the effect's result if the ledger has it.
fn find_effect(kind: &str, intent: u64) -> Option<String> {
    let ledger = read_ledger(&env_path("TC_CRASH_LEDGER"));
    let tags = ledger.get(&(kind.to_owned(), intent))?;
    Some(format!("{kind}{intent}@{}", tags[0]))
}

// ---------------------------------------------------------------------------------------
// The workload's tools.

/// Charges once; an abandoned call is reconciled by reading the ledger.
#[mutating_tool(idempotency_key_fields = [intent], lease = "300ms", ttl = "1h", verify = verify_charge)]
pub async fn crash_charge_verified(intent: u64) -> Result<String, ToolError> {
    effect("v", intent).await
}

pub async fn verify_charge(intent: &u64) -> Result<Option<String>, ToolError> {
    Ok(find_effect("v", *intent))
}

/// Charges once; no `verify`: an abandoned call stays an unknown outcome.
#[mutating_tool(idempotency_key_fields = [intent], lease = "300ms", ttl = "1h")]
pub async fn crash_charge_plain(intent: u64) -> Result<String, ToolError> {
    effect("p", intent).await
}

/// Reserves stock for an order; called from inside a run step.
#[mutating_tool(idempotency_key_fields = [order], lease = "300ms", ttl = "1h", verify = verify_reserve)]
pub async fn crash_reserve(order: u64) -> Result<String, ToolError> {
    effect("r", order).await
}

pub async fn verify_reserve(order: &u64) -> Result<Option<String>, ToolError> {
    Ok(find_effect("r", *order))
}

/// Ships an order; called through `run.enter`.
#[mutating_tool(idempotency_key_fields = [order], lease = "300ms", ttl = "1h", verify = verify_ship)]
pub async fn crash_ship(order: u64) -> Result<String, ToolError> {
    effect("s", order).await
}

pub async fn verify_ship(order: &u64) -> Result<Option<String>, ToolError> {
    Ok(find_effect("s", *order))
}

fn run_options() -> RunOptions {
    RunOptions::default()
        .lease(LEASE)
        .ttl(Duration::from_secs(3600))
}

/// The multi-step task: resumed by whichever worker comes next after a kill.
async fn fulfil(order: u64) -> Result<Value, ToolError> {
    let intent = json!({ "order": order });
    loop {
        let run = Run::start_with("crash_fulfil", &intent, run_options()).await?;
        match run.status().clone() {
            RunStatus::Finished(result) => return Ok(result),
            // Only one worker runs at a time: a running run's owner was killed. Wait for
            // its lease to run out, then resume it.
            RunStatus::Running => match run.wait().await {
                Ok(result) => return Ok(result),
                Err(Error::OutcomeUnknown { .. }) => continue,
                Err(e) => return Err(e.into()),
            },
            RunStatus::Started | RunStatus::Resumed => {
                // A pure step: rerunning an abandoned attempt is harmless, a finished one
                // must never run again (checked against the key's history).
                let quote: String = run
                    .step_with("quote", StepOptions::rerun_if_unknown(), || {
                        effect("q", order)
                    })
                    .await?;
                // A step that only calls a keyed tool: rerunning it is protected by the key.
                let reserve: String = run
                    .step_with("reserve", StepOptions::rerun_if_unknown(), || {
                        crash_reserve(order)
                    })
                    .await?;
                let ship: String = run.enter(crash_ship(order)).await?;
                let result = json!({ "quote": quote, "reserve": reserve, "ship": ship });
                run.finish(&result).await?;
                return Ok(result);
            }
            // This run never calls `Run::compensate`.
            other => panic!("a run that is never compensated reads {other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------
// The worker process.

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Done {
    intent: u64,
    verified: Result<String, String>,
    plain: Result<String, String>,
    run: Result<Value, String>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Audit {
    done: Done,
    /// History kinds of the verified, plain and run keys.
    verified_history: Vec<String>,
    plain_history: Vec<String>,
    run_history: Vec<String>,
    /// `kind:name`, status and history kinds of each journal position.
    journal: Vec<(String, String, Vec<String>)>,
}

#[derive(Debug, Serialize, Deserialize)]
struct RecoveryOut {
    completed: Vec<String>,
    released: Vec<String>,
    unresolved: Vec<String>,
    /// `(tool, args)` of every pending record after the pass.
    pending: Vec<(String, String)>,
}

fn env(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| panic!("{var} is not set"))
}

async fn open_store() -> Arc<dyn Store> {
    let url = env("TC_CRASH_URL");
    let ns = env("TC_CRASH_NS");
    match env("TC_CRASH_BACKEND").as_str() {
        "sqlite" => Arc::new(SqliteStore::open(&url).await.expect("open sqlite")),
        "redis" => Arc::new(
            RedisStore::builder(&url)
                .prefix(ns)
                .connect()
                .await
                .expect("connect redis"),
        ),
        "postgres" => Arc::new(
            PostgresStore::builder(&url)
                .schema(&ns)
                .max_connections(2 * LANES)
                .connect()
                .await
                .expect("connect postgres"),
        ),
        other => panic!("unknown backend {other}"),
    }
}

async fn one_intent(intent: u64) -> Done {
    let err = |e: ToolError| e.to_string();
    Done {
        intent,
        verified: crash_charge_verified(intent).await.map_err(err),
        plain: crash_charge_plain(intent).await.map_err(err),
        run: fulfil(intent).await.map_err(err),
    }
}

fn kinds(events: Vec<tool_contracts::store::HistoryEvent>) -> Vec<String> {
    events.iter().map(|e| e.kind.as_str().to_owned()).collect()
}

async fn audit_intent(store: &dyn Store, intent: u64) -> Audit {
    let done = one_intent(intent).await;
    let history = |key: String| async move { kinds(store.history(&key).await.expect("history")) };
    let verified_history = history(stores::key_of(
        "crash_charge_verified",
        &json!({ "intent": intent }),
    ))
    .await;
    let plain_history = history(stores::key_of(
        "crash_charge_plain",
        &json!({ "intent": intent }),
    ))
    .await;
    let run = Run::start_with("crash_fulfil", &json!({ "order": intent }), run_options())
        .await
        .expect("run handle");
    let run_history = history(run.key().to_owned()).await;
    let mut journal = Vec::new();
    for entry in run.journal().await.expect("journal") {
        let h = history(entry.key.clone()).await;
        journal.push((
            format!("{}:{}", entry.kind, entry.name),
            entry.status.as_str().to_owned(),
            h,
        ));
    }
    Audit {
        done,
        verified_history,
        plain_history,
        run_history,
        journal,
    }
}

async fn recovery_pass(store: &dyn Store) -> RecoveryOut {
    // Wait until every lease has run out (the store decides, by its clock).
    let deadline = Instant::now() + Duration::from_secs(20);
    let report = loop {
        let report = recover_once(registry()).await.expect("recovery pass");
        if report.live == 0 {
            break report;
        }
        assert!(
            Instant::now() < deadline,
            "leases never ran out: {report:?}"
        );
        tokio::time::sleep(LEASE / 3).await;
    };
    let tool_of = |key: String| async move {
        store
            .lookup(&key)
            .await
            .expect("lookup")
            .map(|r| r.tool)
            .unwrap_or_else(|| format!("(gone) {key}"))
    };
    let mut out = RecoveryOut {
        completed: Vec::new(),
        released: Vec::new(),
        unresolved: Vec::new(),
        pending: Vec::new(),
    };
    for key in report.completed {
        out.completed.push(tool_of(key).await);
    }
    for key in report.released {
        // A released key has no record any more: name it by its history's absence.
        out.released.push(key);
    }
    for key in report.unresolved {
        out.unresolved.push(tool_of(key).await);
    }
    for record in store.pending(100_000).await.expect("pending") {
        out.pending.push((record.tool, record.args));
    }
    out
}

async fn worker(role: &str) {
    let store = open_store().await;
    let out = env_path("TC_CRASH_OUT");
    let scope = env("TC_CRASH_SCOPE");
    let from: u64 = std::env::var("TC_CRASH_FROM").map_or(0, |v| v.parse().unwrap());
    let to: u64 = std::env::var("TC_CRASH_TO").map_or(u64::MAX, |v| v.parse().unwrap());
    let task = async {
        match role {
            "work" => {
                // Resume where the workers before left off: first every started intent
                // not reported done (their keys may be held by a dead worker), then new
                // ones, LANES at a time so one key waiting out a dead lease does not
                // stall the others.
                let mut seen = Progress::default();
                seen.update(&out);
                let next = seen.max_started.map_or(0, |m| m + 1);
                let unfinished: Vec<u64> =
                    (0..next).filter(|i| !seen.done.contains_key(i)).collect();
                let todo = unfinished.into_iter().chain(next..to.max(next));
                append_line(&out, "ready").unwrap();
                use futures::stream::{self, StreamExt};
                stream::iter(todo)
                    .map(|intent| {
                        let out = &out;
                        async move {
                            append_line(out, &format!("start {intent}")).unwrap();
                            let done = one_intent(intent).await;
                            let line = format!("done {}", serde_json::to_string(&done).unwrap());
                            append_line(out, &line).unwrap();
                        }
                    })
                    .buffer_unordered(LANES)
                    .collect::<Vec<()>>()
                    .await;
            }
            "audit" => {
                for intent in from..to {
                    let audit = audit_intent(&*store, intent).await;
                    append_line(&out, &serde_json::to_string(&audit).unwrap()).unwrap();
                }
            }
            "recover" => {
                let report = recovery_pass(&*store).await;
                append_line(&out, &serde_json::to_string(&report).unwrap()).unwrap();
            }
            other => panic!("unknown role {other}"),
        }
    };
    with_store(Arc::clone(&store), with_scope(scope, task)).await;
}

/// Not a test of its own: the entry point of the worker processes the tests below start.
#[test]
fn crash_worker_entry_point() {
    let Ok(role) = std::env::var("TC_CRASH_ROLE") else {
        return;
    };
    workers::runtime(2).block_on(worker(&role));
}

// ---------------------------------------------------------------------------------------
// The parent: kill, restart, check.

/// splitmix64: a small seeded generator, so a failing seed can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

struct Campaign {
    backend: &'static str,
    url: String,
    ns: String,
    scope: String,
    dir: PathBuf,
}

impl Campaign {
    fn ledger(&self) -> PathBuf {
        self.dir.join("ledger")
    }
    fn reports(&self) -> PathBuf {
        self.dir.join("reports")
    }
    fn stderr(&self) -> PathBuf {
        self.dir.join("stderr")
    }

    fn command(&self, role: &str, out: &Path, from: u64, to: Option<u64>) -> Command {
        let mut cmd = workers::command("crash_worker_entry_point");
        cmd.arg("-q")
            .env("TC_CRASH_ROLE", role)
            .env("TC_CRASH_BACKEND", self.backend)
            .env("TC_CRASH_URL", &self.url)
            .env("TC_CRASH_NS", &self.ns)
            .env("TC_CRASH_SCOPE", &self.scope)
            .env("TC_CRASH_LEDGER", self.ledger())
            .env("TC_CRASH_OUT", out)
            .env("TC_CRASH_FROM", from.to_string())
            .env_remove("TC_CRASH_TO")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(self.stderr_file());
        if let Some(to) = to {
            cmd.env("TC_CRASH_TO", to.to_string());
        }
        cmd
    }

    fn stderr_file(&self) -> Stdio {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.stderr())
            .unwrap();
        Stdio::from(f)
    }

    fn stderr_tail(&self) -> String {
        let text = std::fs::read_to_string(self.stderr()).unwrap_or_default();
        let start = text.len().saturating_sub(4000);
        let start = (start..text.len())
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(text.len());
        text[start..].to_owned()
    }

    /// Runs a child to completion; its output file's lines.
    fn run_to_end(&self, role: &str, from: u64, to: Option<u64>) -> Vec<String> {
        let out = self.dir.join(format!("{role}-{}.out", now_nanos()));
        self.run_into(role, &out, from, to);
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        complete_lines(&text).map(str::to_owned).collect()
    }

    /// Runs a child to completion, appending to `out`.
    fn run_into(&self, role: &str, out: &Path, from: u64, to: Option<u64>) {
        let status = self.command(role, out, from, to).status().unwrap();
        assert!(
            status.success(),
            "[{}] the {role} child failed: {status:?}\n{}",
            self.backend,
            self.stderr_tail()
        );
    }
}

/// What the `work` children reported so far.
#[derive(Default)]
struct Progress {
    done: BTreeMap<u64, Done>,
    max_started: Option<u64>,
    ready: usize,
    offset: usize,
}

impl Progress {
    /// Reads the lines appended since the last call; returns how many `ready` lines.
    fn update(&mut self, path: &Path) -> usize {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(path) {
            f.read_to_string(&mut text).unwrap();
        }
        let new = &text[self.offset..];
        let Some(end) = new.rfind('\n') else {
            return 0;
        };
        let mut ready = 0;
        for line in complete_lines(&new[..end]) {
            if line == "ready" {
                ready += 1;
            } else if let Some(n) = line.strip_prefix("start ") {
                let n: u64 = n.parse().unwrap();
                self.max_started = Some(self.max_started.map_or(n, |m| m.max(n)));
            } else if let Some(json) = line.strip_prefix("done ") {
                let done: Done = serde_json::from_str(json).unwrap();
                let previous = self.done.insert(done.intent, done);
                assert!(previous.is_none(), "an intent was reported twice: {line}");
            } else {
                panic!("unexpected report line {line:?}");
            }
        }
        self.offset += end + 1;
        self.ready += ready;
        ready
    }

    fn next_intent(&self) -> u64 {
        self.done.len() as u64
    }
}

fn kills_wanted() -> usize {
    std::env::var("TC_CRASH_KILLS").map_or(200, |v| v.parse().expect("TC_CRASH_KILLS"))
}

fn seed() -> u64 {
    match std::env::var("TC_CRASH_SEED") {
        Ok(s) => s.parse().expect("TC_CRASH_SEED is a u64"),
        Err(_) => now_nanos() as u64,
    }
}

fn history_completed_once(label: &str, history: &[String]) {
    let completions = history.iter().filter(|k| *k == "completed").count();
    assert_eq!(completions, 1, "{label}: one completion, got {history:?}");
    assert_eq!(
        history.last().map(String::as_str),
        Some("completed"),
        "{label}: nothing happens to a key after its completion: {history:?}"
    );
}

fn acquisitions(history: &[String]) -> usize {
    history
        .iter()
        .filter(|k| *k == "claimed" || *k == "taken_over")
        .count()
}

/// The tag of a result `"{kind}{intent}@{tag}"`.
fn tag_of(result: &str) -> &str {
    result.split_once('@').map(|(_, t)| t).unwrap_or("")
}

fn campaign(backend: &'static str, url: String, ns: String) {
    let started = Instant::now();
    let seed = seed();
    let wanted = kills_wanted();
    println!("crash_injection[{backend}]: seed {seed} (replay with TC_CRASH_SEED={seed}), {wanted} kills");
    let mut rng = Rng(seed ^ backend.len() as u64);
    let dir = std::env::temp_dir().join(support::unique(&format!("tc-crash-{backend}")));
    std::fs::create_dir_all(&dir).unwrap();
    println!(
        "crash_injection[{backend}]: ledger and reports in {} (kept on failure)",
        dir.display()
    );
    let c = Campaign {
        backend,
        url,
        ns,
        scope: support::unique("crash"),
        dir,
    };

    // 1. Kill `work` children at random instants.
    let mut progress = Progress::default();
    let (mut kills, mut kills_after_ready) = (0usize, 0usize);
    let mut kill_cycle = Duration::ZERO;
    while kills < wanted {
        let cycle = Instant::now();
        let mut child = c.command("work", &c.reports(), 0, None).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(rng.between(5, 150)));
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "[{backend}] a worker exited by itself ({status:?}):\n{}",
                c.stderr_tail()
            );
        }
        // SIGKILL: no destructor runs, claims stay as the process left them.
        child.kill().unwrap();
        child.wait().unwrap();
        kills += 1;
        if progress.update(&c.reports()) > 0 {
            kills_after_ready += 1;
        }
        kill_cycle = kill_cycle.max(cycle.elapsed());
    }
    let kill_phase = started.elapsed();

    // 2. Recovery without the callers: reconciles what the last worker left abandoned.
    let first = c.run_to_end("recover", 0, None);
    let first: RecoveryOut = serde_json::from_str(&first[0]).unwrap();
    let reconciled = first.completed.len() + first.released.len();
    for tool in first.completed.iter().chain(&first.unresolved) {
        assert!(!tool.starts_with("(gone)"), "[{backend}] {tool}");
    }
    for tool in &first.completed {
        assert!(
            ["crash_charge_verified", "crash_reserve", "crash_ship"].contains(&tool.as_str()),
            "[{backend}] only verify tools are reconciled: {first:?}"
        );
    }

    // 3. One uninterrupted worker finishes the workload (every intent any worker started).
    let to = progress
        .max_started
        .map_or(0, |m| m + 1)
        .max(progress.next_intent());
    c.run_into("work", &c.reports(), progress.next_intent(), Some(to));
    progress.update(&c.reports());
    assert_eq!(
        progress.next_intent(),
        to,
        "[{backend}] the workload completed"
    );
    assert_eq!(
        progress.done.keys().copied().collect::<Vec<_>>(),
        (0..to).collect::<Vec<_>>(),
        "[{backend}] every intent reported exactly once"
    );

    // 4. The clean process: every caller reads the same results; histories dumped.
    let audits: Vec<Audit> = c
        .run_to_end("audit", 0, Some(to))
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(audits.len() as u64, to);

    // 5. After the last lease: only unknown-by-design keys are pending.
    let last: RecoveryOut = serde_json::from_str(&c.run_to_end("recover", 0, None)[0]).unwrap();

    // ---- Invariants.
    let ledger = read_ledger(&c.ledger());
    let count =
        |kind: &str, intent: u64| ledger.get(&(kind.to_owned(), intent)).map_or(0, Vec::len);
    let duplicates: Vec<_> = ledger
        .iter()
        .filter(|((kind, _), tags)| kind != "q" && tags.len() > 1)
        .collect();
    assert!(
        duplicates.is_empty(),
        "[{backend}] effects ran twice: {duplicates:?}"
    );
    let mut unknown = BTreeSet::new();
    for audit in &audits {
        let i = audit.done.intent;
        let first_seen = &progress.done[&i];
        assert_eq!(
            &audit.done, first_seen,
            "[{backend}] intent {i}: the clean process reads what the first caller got"
        );
        // Verified: exactly once, and the stored result is the effect's.
        let v = first_seen
            .verified
            .as_ref()
            .unwrap_or_else(|e| panic!("[{backend}] intent {i} verified: {e}"));
        assert_eq!(
            count("v", i),
            1,
            "[{backend}] intent {i}: exactly one verified charge"
        );
        assert_eq!(
            tag_of(v),
            ledger[&("v".to_owned(), i)][0],
            "[{backend}] intent {i}"
        );
        history_completed_once(
            &format!("[{backend}] verified {i}"),
            &audit.verified_history,
        );
        // Plain: at most once; a stored result is the effect's; else unknown by design.
        match &first_seen.plain {
            Ok(p) => {
                assert_eq!(
                    count("p", i),
                    1,
                    "[{backend}] intent {i}: a stored plain result had its effect"
                );
                assert_eq!(tag_of(p), ledger[&("p".to_owned(), i)][0]);
                history_completed_once(&format!("[{backend}] plain {i}"), &audit.plain_history);
            }
            Err(e) => {
                assert!(
                    e.starts_with("outcome_unknown"),
                    "[{backend}] intent {i} plain: {e}"
                );
                assert!(count("p", i) <= 1);
                assert!(!audit.plain_history.contains(&"completed".to_owned()));
                unknown.insert(i);
            }
        }
        // The run: finished once, its steps and tool call each completed once.
        let run = first_seen
            .run
            .as_ref()
            .unwrap_or_else(|e| panic!("[{backend}] intent {i} run: {e}"));
        history_completed_once(&format!("[{backend}] run {i}"), &audit.run_history);
        let names: Vec<&str> = audit.journal.iter().map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["step:quote", "step:reserve", "tool:crash_ship"],
            "[{backend}] run {i}"
        );
        for (name, status, history) in &audit.journal {
            assert_eq!(status, "completed", "[{backend}] run {i} {name}");
            history_completed_once(&format!("[{backend}] run {i} {name}"), history);
        }
        assert_eq!(
            count("r", i),
            1,
            "[{backend}] run {i}: exactly one reservation"
        );
        assert_eq!(
            count("s", i),
            1,
            "[{backend}] run {i}: exactly one shipment"
        );
        assert_eq!(
            run["reserve"],
            json!(format!("r{i}@{}", ledger[&("r".to_owned(), i)][0]))
        );
        assert_eq!(
            run["ship"],
            json!(format!("s{i}@{}", ledger[&("s".to_owned(), i)][0]))
        );
        // `quote` reran only after abandoned attempts: never more than once per
        // acquisition of its key, and its stored result is one of its executions.
        let quotes = &ledger[&("q".to_owned(), i)];
        assert!(
            quotes.len() <= acquisitions(&audit.journal[0].2),
            "[{backend}] run {i}: quote ran {} times for {:?}",
            quotes.len(),
            audit.journal[0].2
        );
        let q = run["quote"].as_str().unwrap();
        assert!(
            quotes.iter().any(|t| t == tag_of(q)),
            "[{backend}] run {i}: {q} {quotes:?}"
        );
    }
    // Nothing is claimed forever: what is pending is exactly the unknown plain calls.
    assert_eq!(
        last.completed.len() + last.released.len(),
        0,
        "[{backend}] {last:?}"
    );
    let mut pending_plain = BTreeSet::new();
    for (tool, args) in &last.pending {
        assert_eq!(
            tool, "crash_charge_plain",
            "[{backend}] only unknown plain calls stay pending: {last:?}"
        );
        let args: Value = serde_json::from_str(args).unwrap();
        pending_plain.insert(args["intent"].as_u64().unwrap());
    }
    assert_eq!(
        pending_plain, unknown,
        "[{backend}] pending == unknown plain calls"
    );
    assert_eq!(last.unresolved.len(), unknown.len(), "[{backend}] {last:?}");

    let effects: usize = ledger.values().map(Vec::len).sum();
    let per_kind = |kind: &str| -> usize {
        ledger
            .iter()
            .filter(|((k, _), _)| k == kind)
            .map(|(_, t)| t.len())
            .sum()
    };
    let line = format!(
        "crash_injection[{backend}]: seed={seed} kills survived={kills} (after the worker was up: {kills_after_ready}) \
         intents={to} effects={effects} (verified={} plain={} reserve={} ship={} quote={}) \
         unknown-by-design={} reconciled-by-recovery={reconciled} duplicates seen={} \
         slowest kill cycle={}ms kill phase={:.1}s total={:.1}s",
        per_kind("v"),
        per_kind("p"),
        per_kind("r"),
        per_kind("s"),
        per_kind("q"),
        unknown.len(),
        duplicates.len(),
        kill_cycle.as_millis(),
        kill_phase.as_secs_f64(),
        started.elapsed().as_secs_f64(),
    );
    println!("{line}");
    figures::record(
        "crash_injection",
        backend,
        &line,
        json!({
            "seed": seed,
            "kills": kills,
            "intents": to,
            "effects": effects,
            "unknown": unknown.len(),
            "reconciled": reconciled,
            "duplicates": duplicates.len(),
        }),
    );
    let _ = std::fs::remove_dir_all(&c.dir);
}

// ---------------------------------------------------------------------------------------
// Backends.

#[test]
fn sqlite_survives_hundreds_of_sigkills_without_a_duplicate_effect() {
    let (path, _cleanup) = cleanup::sqlite_file("tc-crash");
    campaign("sqlite", path, String::new());
}

#[test]
fn redis_survives_hundreds_of_sigkills_without_a_duplicate_effect() {
    let Some(url) = support::url(&support::REDIS, "the crash injection test on Redis") else {
        return;
    };
    let (prefix, _cleanup) = cleanup::redis_prefix(&url, "tc-crash");
    campaign("redis", url, prefix);
}

#[test]
fn postgres_survives_hundreds_of_sigkills_without_a_duplicate_effect() {
    let Some(url) = support::url(&support::POSTGRES, "the crash injection test on PostgreSQL")
    else {
        return;
    };
    let (schema, _cleanup) = cleanup::postgres_schema(&url, "tc_crash");
    campaign("postgres", url, schema);
}
