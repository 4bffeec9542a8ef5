//! `tool-contracts`: the operator's view of a store. Lists keys whose outcome is pending or
//! unknown, shows an operation (its state, result and history, as every surface shows it)
//! or a key's raw record and history, resolves a key (the effect happened: store its
//! result; or it did not: release it), and purges expired records.
//!
//! ```text
//! tool-contracts pending --store sqlite:/var/lib/app/keys.db --older-than 2h
//! tool-contracts show    --store sqlite:/var/lib/app/keys.db --scope tenant-42 KEY
//! tool-contracts history --store redis://127.0.0.1:6379 KEY
//! tool-contracts resolve --store postgres://postgres@127.0.0.1/test KEY --result '{"order_id": 7}' --ttl 7days
//! tool-contracts resolve --store … KEY --release
//! tool-contracts purge   --store …
//! ```
//!
//! Durations are read and written as humantime writes them (`90s`, `2h 30m`, `7days`); a
//! plain number is still read as seconds, as `--ttl-secs` took it. Times are RFC 3339 in
//! UTC. JSON lines keep their numeric fields (`age_secs`, `at_ms`) beside the RFC 3339
//! times, so scripts written for them keep working.

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand};
use serde_json::Value;
use tool_contracts_runtime::approval::{self, Decision, Verdict};
use tool_contracts_runtime::store::{self, HistoryKind, Record, RecordState, Resolution};
use tool_contracts_runtime::{operation_with_history, with_scope, with_store, Operation};

#[derive(Parser)]
#[command(
    name = "tool-contracts",
    version,
    about = "Inspect and resolve idempotency keys in a tool-contracts store",
    after_help = "Durations: `90s`, `15m`, `2h 30m`, `7days` (humantime); a plain number is \
                  seconds. Times are printed in RFC 3339, UTC."
)]
struct Cli {
    /// Store URL: memory:, sqlite:PATH, redis://HOST:PORT, postgres://USER@HOST/DB.
    #[arg(long, global = true, env = "TOOL_CONTRACTS_STORE")]
    store: Option<String>,
    /// Print JSON lines instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Keys claimed and not completed (running, or abandoned: outcome unknown), oldest first.
    Pending {
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Only keys claimed at least this long ago (`30m`, `2h`; a plain number is
        /// seconds): the ones stuck, not the calls running now.
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        older_than: Option<Duration>,
    },
    /// An operation as every surface shows it (state, times, result or error, history),
    /// read in a scope: a key made in another scope is not found, like one never used.
    /// Never the call's arguments. With `--json`, the operation document on one line.
    Show {
        /// The idempotency key (the operation's id).
        key: String,
        /// The scope to read in, as the application passed it to `with_scope` (a
        /// tenant); repeat it for nested scopes, outermost first. Default: no scope. A
        /// client's own intent key (`client:…`) need not be given: the scope it was made
        /// in reads it.
        #[arg(long = "scope", value_name = "SCOPE")]
        scopes: Vec<String>,
    },
    /// A key's raw record (arguments included, whatever its scope) and its append-only
    /// history.
    History {
        /// The idempotency key.
        key: String,
    },
    /// Decide a pending key: `--result JSON` if the effect happened, `--release` if not.
    Resolve {
        /// The idempotency key.
        key: String,
        /// The result to replay to every later call (JSON).
        #[arg(long, conflicts_with = "release", required_unless_present = "release")]
        result: Option<String>,
        /// Free the key so the next call runs the tool.
        #[arg(long)]
        release: bool,
        /// How long to keep the result (`24h`, `7days`; a plain number is seconds).
        #[arg(
            long,
            alias = "ttl-secs",
            value_name = "DURATION",
            default_value = "24h",
            value_parser = parse_ttl
        )]
        ttl: Duration,
    },
    /// Approve a call waiting for approval (its operation key): its next attempt runs
    /// it, once. The first decision wins, in every process sharing the store.
    Approve {
        /// The operation's key (the call's idempotency key).
        key: String,
        /// Who approves, as the history shows it. Default: `operator:$USER`.
        #[arg(long)]
        by: Option<String>,
        /// The scope the call was made in (repeat for nested scopes, outermost first).
        #[arg(long = "scope", value_name = "SCOPE")]
        scopes: Vec<String>,
    },
    /// Deny a call waiting for approval: nothing runs, and every retry of the intent gets
    /// the denial until it expires (the tool's ttl).
    Deny {
        /// The operation's key (the call's idempotency key).
        key: String,
        /// Why: shown to the caller (an agent reads it) and kept in the history.
        #[arg(long)]
        reason: String,
        /// Who denies. Default: `operator:$USER`.
        #[arg(long)]
        by: Option<String>,
        /// The scope the call was made in (repeat for nested scopes, outermost first).
        #[arg(long = "scope", value_name = "SCOPE")]
        scopes: Vec<String>,
    },
    /// Delete records past their expiry.
    Purge,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("tool-contracts: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), String> {
    let url = cli
        .store
        .ok_or("no store: pass --store URL or set TOOL_CONTRACTS_STORE")?;
    let store = store::open(&url).await.map_err(|e| format!("{url}: {e}"))?;
    match cli.command {
        Command::Pending { limit, older_than } => {
            let mut records = store.pending(limit).await.map_err(|e| e.to_string())?;
            // Oldest first: the ones old enough are a prefix of the store's answer, so
            // filtering after the limit still gives the `limit` oldest of them.
            if let Some(min_age) = older_than {
                records.retain(|r| age(r.created_at) >= min_age);
            }
            if records.is_empty() && !cli.json {
                match older_than {
                    Some(min_age) => println!(
                        "no pending keys older than {}",
                        humantime::format_duration(min_age)
                    ),
                    None => println!("no pending keys"),
                }
            }
            for record in records {
                print_record(&record, cli.json);
            }
        }
        Command::Show { key, scopes } => {
            let Some(op) = show(store, &scopes, &key).await? else {
                let scope = match scopes.is_empty() {
                    true => "outside any scope (pass --scope for a tenant's key)".to_owned(),
                    false => format!("in scope {}", scopes.join(" > ")),
                };
                return Err(format!(
                    "{key}: no operation {scope}: never called, released, expired, or made in another scope"
                ));
            };
            let doc = serde_json::to_value(&op).map_err(|e| format!("{key}: {e}"))?;
            if cli.json {
                println!("{doc}");
            } else {
                print_operation(&op, &doc);
            }
        }
        Command::History { key } => {
            match store.lookup(&key).await.map_err(|e| e.to_string())? {
                Some(record) => print_record(&record, cli.json),
                None if !cli.json => {
                    println!("{key}: no record (never claimed, released or purged)")
                }
                None => {}
            }
            for event in store.history(&key).await.map_err(|e| e.to_string())? {
                if cli.json {
                    println!(
                        "{}",
                        serde_json::json!({"at": rfc3339(event.at), "at_ms": millis(event.at), "event": event.kind.as_str(), "token": event.token, "worker": event.worker})
                    );
                } else {
                    println!(
                        "  {}  {:<10}  token {:<6}  {}",
                        rfc3339(event.at),
                        event.kind.as_str(),
                        event.token,
                        event.worker
                    );
                }
            }
        }
        Command::Resolve {
            key,
            result,
            release,
            ttl,
        } => {
            let resolution = match (&result, release) {
                (Some(json), false) => {
                    serde_json::from_str::<serde_json::Value>(json)
                        .map_err(|e| format!("--result is not valid JSON: {e}"))?;
                    Resolution::Complete { result: json, ttl }
                }
                _ => Resolution::Release,
            };
            store
                .resolve(store::ResolveRequest {
                    key: &key,
                    resolution,
                    kind: HistoryKind::Resolved,
                    worker: &operator(),
                })
                .await
                .map_err(|e| format!("{key}: {e}"))?;
            if cli.json {
                let state = if release { "released" } else { "completed" };
                println!("{}", serde_json::json!({"key": key, "resolved": state}));
            } else {
                println!(
                    "{key}: {}",
                    if release {
                        "released: the next call runs the tool"
                    } else {
                        "completed: every later call replays the result"
                    }
                );
            }
        }
        Command::Approve { key, by, scopes } => {
            let by = by.unwrap_or_else(operator);
            let decision = decide(store, &scopes, &key, Verdict::Approved, &by, None).await?;
            print_decision(&key, &decision, cli.json);
        }
        Command::Deny {
            key,
            reason,
            by,
            scopes,
        } => {
            let by = by.unwrap_or_else(operator);
            let decision =
                decide(store, &scopes, &key, Verdict::Denied, &by, Some(&reason)).await?;
            print_decision(&key, &decision, cli.json);
        }
        Command::Purge => {
            let n = store.purge_expired().await.map_err(|e| e.to_string())?;
            if cli.json {
                println!("{}", serde_json::json!({"purged": n}));
            } else {
                println!("purged {n} expired records");
            }
        }
    }
    Ok(())
}

/// Reads `key`'s operation with its history from `store`, inside `scopes` (outermost
/// first), as the application's own read would.
async fn show(
    store: std::sync::Arc<dyn store::Store>,
    scopes: &[String],
    key: &str,
) -> Result<Option<Operation>, String> {
    let mut read: Pin<Box<dyn Future<Output = _> + '_>> = Box::pin(operation_with_history(key));
    for scope in scopes.iter().rev() {
        read = Box::pin(with_scope(scope.clone(), read));
    }
    with_store(store, read).await.map_err(|e| e.to_string())
}

/// Decides `key` in `scopes` (outermost first) through the CLI channel.
async fn decide(
    store: std::sync::Arc<dyn store::Store>,
    scopes: &[String],
    key: &str,
    verdict: Verdict,
    by: &str,
    reason: Option<&str>,
) -> Result<Decision, String> {
    let mut decide: Pin<Box<dyn Future<Output = _> + '_>> = Box::pin(
        tool_contracts_runtime::decide(key, verdict, by, approval::channel::CLI, reason),
    );
    for scope in scopes.iter().rev() {
        decide = Box::pin(with_scope(scope.clone(), decide));
    }
    with_store(store, decide).await.map_err(|e| e.to_string())
}

fn print_decision(key: &str, decision: &Decision, json: bool) {
    if json {
        let mut doc = serde_json::to_value(decision).unwrap_or(Value::Null);
        doc["key"] = Value::String(key.to_owned());
        println!("{doc}");
        return;
    }
    let what = match decision.verdict {
        Verdict::Approved => "approved: its next attempt runs it, once",
        _ => "denied: every retry of this intent gets the denial",
    };
    println!(
        "{key}: {what} (by {} via {} at {})",
        decision.by,
        decision.channel,
        rfc3339(decision.at)
    );
}

/// The operation document, for a person: one field a line, then its history. Times are
/// the document's RFC 3339 strings; durations are written by humantime from `op`.
fn print_operation(op: &Operation, doc: &Value) {
    let text = |field: &str| match &doc[field] {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    };
    let version = match &doc["version"] {
        Value::Null => "version not kept".to_owned(),
        v => format!("version {v}"),
    };
    println!("operation {}", text("key"));
    println!("  tool      {} ({version})", text("tool"));
    println!("  state     {}", text("state"));
    match doc["state"].as_str() {
        Some("in_progress") => println!(
            "  lease     {} left, by the store's clock",
            op.lease_remaining
                .map_or_else(|| "-".to_owned(), |left| human(left, Precision::Millis))
        ),
        Some("unknown") => println!(
            "  note      its lease ran out mid-call: the effect may or may not have happened; \
             check, then `resolve` it"
        ),
        Some("compensating") => println!(
            "  note      a run being compensated: its completed steps are being undone, newest first"
        ),
        Some("needs_intervention") => println!(
            "  note      a compensated run whose steps marked `!` below could not be undone: \
             finish them by hand"
        ),
        Some("awaiting_approval") => println!(
            "  note      waiting for a person: `tool-contracts approve {key}` or \
             `tool-contracts deny {key} --reason TEXT`",
            key = text("key")
        ),
        _ => {}
    }
    let approval = &doc["approval"];
    if approval.is_object() {
        let decision = &approval["decision"];
        match decision["verdict"].as_str() {
            Some(verdict) => println!(
                "  approval  {verdict} by {} via {} at {}{}",
                decision["by"].as_str().unwrap_or("-"),
                decision["channel"].as_str().unwrap_or("-"),
                decision["at"].as_str().unwrap_or("-"),
                decision["reason"]
                    .as_str()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            ),
            None => println!(
                "  approval  {} since {}, open until {}",
                approval["state"].as_str().unwrap_or("-"),
                approval["requested_at"].as_str().unwrap_or("-"),
                approval["expires_at"].as_str().unwrap_or("-")
            ),
        }
    }
    // A compensated run: what was done about each completed step, newest first.
    let steps = doc["error"]["compensation"]["steps"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    for step in steps {
        let outcome = step["outcome"].as_str().unwrap_or("-");
        let flag = match outcome {
            "undone" | "nothing_to_undo" => ' ',
            _ => '!',
        };
        println!(
            "  undo    {flag} {:<12} {:<16} step {}  undo {}",
            step["name"].as_str().unwrap_or("-"),
            outcome,
            step["key"].as_str().unwrap_or("-"),
            step["undo_key"].as_str().unwrap_or("-")
        );
    }
    println!("  created   {}", text("created_at"));
    println!("  updated   {}", text("updated_at"));
    println!(
        "  expires   {} ({})",
        text("expires_at"),
        relative(op.expires_at, SystemTime::now())
    );
    if let Some(result) = doc.get("result") {
        println!("  result    {result}");
    }
    if let Some(error) = doc.get("error") {
        println!("  error     {error}");
    }
    let events = doc["history"].as_array().map_or(&[][..], Vec::as_slice);
    println!("history");
    for event in events {
        println!(
            "  {}  {:<18}  token {:<6}  {}",
            event["at"].as_str().unwrap_or("-"),
            event["kind"].as_str().unwrap_or("-"),
            event["token"],
            event["worker"].as_str().unwrap_or("-")
        );
    }
}

fn operator() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "unknown".to_owned());
    format!("operator:{user}")
}

/// A duration as humantime writes it (`90s`, `2h 30m`, `7days`), or a plain number of
/// seconds (what `--ttl-secs` took, kept so existing scripts still work).
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|_| "more seconds than a duration holds: write e.g. `7days`".to_owned());
    }
    humantime::parse_duration(text).map_err(|e| {
        format!("{e}: write a duration such as `90s`, `15m`, `2h 30m` or `7days`, or a number of seconds")
    })
}

/// `--ttl`: a [`parse_duration`] more than zero, since a result kept for no time expires
/// at once and the next call would run the tool again.
fn parse_ttl(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        Duration::ZERO => Err(
            "a result kept for no time expires at once and the next call runs the tool again: \
             give a TTL such as `24h`"
                .to_owned(),
        ),
        ttl => Ok(ttl),
    }
}

/// How finely [`human`] writes a duration.
#[derive(Clone, Copy)]
enum Precision {
    Seconds,
    Millis,
}

/// `d` as humantime writes it, cut to whole seconds or milliseconds: an operator reads
/// "23h 59m 58s", not the nanoseconds the clocks happen to differ by.
fn human(d: Duration, precision: Precision) -> String {
    let cut = match precision {
        Precision::Seconds => Duration::from_secs(d.as_secs()),
        Precision::Millis => {
            Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        }
    };
    humantime::format_duration(cut).to_string()
}

/// When `at` is from `now`: "in 23h 59m 58s" or "5m ago".
fn relative(at: SystemTime, now: SystemTime) -> String {
    match at.duration_since(now) {
        Ok(ahead) => format!("in {}", human(ahead, Precision::Seconds)),
        Err(behind) => format!("{} ago", human(behind.duration(), Precision::Seconds)),
    }
}

/// Time since `t` by this machine's clock; zero for a time in the future.
fn age(t: SystemTime) -> Duration {
    SystemTime::now().duration_since(t).unwrap_or_default()
}

/// `t` in RFC 3339, UTC, to the millisecond (as the operation document writes times).
fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

fn millis(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

fn print_record(r: &Record, json: bool) {
    let now = SystemTime::now();
    let age = age(r.created_at);
    let request = approval::requested_call(r);
    let state = match &r.state {
        RecordState::InProgress {
            lease_expires_at, ..
        } if request.is_some() => {
            let call = request.as_deref().unwrap_or("-");
            match *lease_expires_at <= now {
                true => format!("approval request of {call} expired unanswered (nothing ran)"),
                false => {
                    format!("approval request of {call}: awaiting a decision (`approve {call}`)")
                }
            }
        }
        RecordState::InProgress {
            lease_expires_at,
            token,
        } if *lease_expires_at <= now => format!("abandoned (outcome unknown), token {token}"),
        RecordState::InProgress { token, .. } => format!("running, token {token}"),
        RecordState::Completed { is_error: true, .. } => "completed with a stored error".to_owned(),
        RecordState::Completed { .. } => "completed".to_owned(),
    };
    if json {
        println!(
            "{}",
            serde_json::json!({"key": r.key, "tool": r.tool, "scope": r.scope, "state": state, "created_at": rfc3339(r.created_at), "expires_at": rfc3339(r.expires_at), "age_secs": age.as_secs(), "args": r.args})
        );
    } else {
        println!(
            "{}  tool {}  scope {}  {}  age {}  args {}",
            r.key,
            r.tool,
            r.scope.as_deref().unwrap_or("-"),
            state,
            human(age, Precision::Seconds),
            r.args
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_humantime_or_a_plain_number_of_seconds() {
        let d = |text| parse_duration(text);
        assert_eq!(d("90"), Ok(Duration::from_secs(90)));
        assert_eq!(d(" 90 "), Ok(Duration::from_secs(90)));
        assert_eq!(d("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(d("2h 30m"), Ok(Duration::from_secs(9000)));
        assert_eq!(d("7days"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(d("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(d("1.5h"), Ok(Duration::from_secs(5400)));
        for bad in ["", "2x", "-5", "h", "5 parsecs"] {
            let err = d(bad).expect_err(bad);
            assert!(err.contains("or a number of seconds"), "{bad:?}: {err}");
        }
        assert_eq!(parse_ttl("24h"), Ok(Duration::from_secs(86_400)));
        assert!(parse_ttl("0").is_err() && parse_ttl("0s").is_err());
    }

    #[test]
    fn durations_are_written_cut_to_what_an_operator_reads() {
        let d = Duration::new(86_399, 873_000_123);
        assert_eq!(human(d, Precision::Seconds), "23h 59m 59s");
        assert_eq!(human(d, Precision::Millis), "23h 59m 59s 873ms");
        assert_eq!(human(Duration::ZERO, Precision::Seconds), "0s");
        assert_eq!(
            human(Duration::MAX, Precision::Millis),
            human(Duration::from_millis(u64::MAX), Precision::Millis)
        );
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(relative(now + Duration::from_secs(3_540), now), "in 59m");
        assert_eq!(
            relative(now - Duration::from_millis(300_400), now),
            "5m ago"
        );
        assert_eq!(
            rfc3339(now + Duration::from_millis(5)),
            "2023-11-14T22:13:20.005Z"
        );
    }
}
