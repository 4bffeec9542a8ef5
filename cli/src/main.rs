//! `tool-contracts`: the operator's view of a store. Lists keys whose outcome is pending or
//! unknown, shows an operation (its state, result and history, as every surface shows it)
//! or a key's raw record and history, resolves a key (the effect happened: store its
//! result; or it did not: release it), and purges expired records.
//!
//! ```text
//! tool-contracts pending --store sqlite:/var/lib/app/keys.db
//! tool-contracts show    --store sqlite:/var/lib/app/keys.db --scope tenant-42 KEY
//! tool-contracts history --store redis://127.0.0.1:6379 KEY
//! tool-contracts resolve --store postgres://postgres@127.0.0.1/test KEY --result '{"order_id": 7}'
//! tool-contracts resolve --store … KEY --release
//! tool-contracts purge   --store …
//! ```

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand};
use serde_json::Value;
use tool_contracts_runtime::store::{self, HistoryKind, Record, RecordState, Resolution};
use tool_contracts_runtime::{operation_with_history, with_scope, with_store, Operation};

#[derive(Parser)]
#[command(
    name = "tool-contracts",
    version,
    about = "Inspect and resolve idempotency keys in a tool-contracts store"
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
        /// How long to keep the result, in seconds.
        #[arg(long, default_value_t = 24 * 3600)]
        ttl_secs: u64,
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
        Command::Pending { limit } => {
            let records = store.pending(limit).await.map_err(|e| e.to_string())?;
            if records.is_empty() && !cli.json {
                println!("no pending keys");
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
                print_operation(&doc);
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
                        serde_json::json!({"at_ms": millis(event.at), "event": event.kind.as_str(), "token": event.token, "worker": event.worker})
                    );
                } else {
                    println!(
                        "  {}  {:<10}  token {:<6}  {}",
                        millis(event.at),
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
            ttl_secs,
        } => {
            let resolution = match (&result, release) {
                (Some(json), false) => {
                    serde_json::from_str::<serde_json::Value>(json)
                        .map_err(|e| format!("--result is not valid JSON: {e}"))?;
                    Resolution::Complete {
                        result: json,
                        ttl: Duration::from_secs(ttl_secs),
                    }
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

/// The operation document, for a person: one field a line, then its history.
fn print_operation(doc: &Value) {
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
            "  lease     {} ms left, by the store's clock",
            text("lease_remaining_ms")
        ),
        Some("unknown") => println!(
            "  note      its lease ran out mid-call: the effect may or may not have happened; \
             check, then `resolve` it"
        ),
        _ => {}
    }
    println!("  created   {}", text("created_at"));
    println!("  updated   {}", text("updated_at"));
    println!("  expires   {}", text("expires_at"));
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
            "  {}  {:<10}  token {:<6}  {}",
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

fn millis(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

fn print_record(r: &Record, json: bool) {
    let now = SystemTime::now();
    let age = now
        .duration_since(r.created_at)
        .unwrap_or_default()
        .as_secs();
    let state = match &r.state {
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
            serde_json::json!({"key": r.key, "tool": r.tool, "scope": r.scope, "state": state, "age_secs": age, "args": r.args})
        );
    } else {
        println!(
            "{}  tool {}  scope {}  {}  age {}s  args {}",
            r.key,
            r.tool,
            r.scope.as_deref().unwrap_or("-"),
            state,
            age,
            r.args
        );
    }
}
