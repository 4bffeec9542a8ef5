//! An agent task of five steps, three of them mutating tools, journaled in a durable store:
//! kill it at any point and start it again with the same intent; finished steps are
//! re-read, not re-run, and every side effect happens once.
//!
//! ```sh
//! cargo run --example agent_task --features sqlite -- --order 42
//! cargo run --example agent_task --features sqlite -- --order 42   # a duplicate start: same result, nothing runs
//! ```
//!
//! Options: `--store URL` (default `sqlite:` in the temp dir), `--ledger PATH` (where side
//! effects are written, one line each), `--scope S`. With `TC_PAUSE_AT_BOUNDARY=N` the task
//! prints `boundary N` after step N and stalls there (tests kill it at that moment).

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;
use tool_contracts::{mutating_tool, with_scope, with_store, Run, RunOptions, RunStatus};

#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error(transparent)]
    Contract(#[from] tool_contracts::Error),
    #[error("ledger: {0}")]
    Ledger(#[from] std::io::Error),
}

fn ledger_path() -> PathBuf {
    std::env::var_os("TC_AGENT_LEDGER")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("tool-contracts-agent-ledger.txt"))
}

/// One line per side effect: `<scope> <effect> <order>`.
fn effect(what: &str, order: u64) -> Result<(), TaskError> {
    let scope = std::env::var("TC_AGENT_SCOPE").unwrap_or_else(|_| "-".to_owned());
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(ledger_path())?;
    // One `write` per line: `writeln!` would split it into several and a kill between them
    // would leave half a line.
    f.write_all(format!("{scope} {what} {order}\n").as_bytes())?;
    Ok(())
}

/// Reserve the order's stock in the warehouse.
#[mutating_tool(idempotency_key_fields = [order], lease = "2s")]
pub async fn reserve_stock(order: u64, items: u32) -> Result<String, TaskError> {
    effect("reserve", order)?;
    Ok(format!("res-{order}-{items}"))
}

/// Charge the customer's card.
#[mutating_tool(idempotency_key_fields = [order], lease = "2s")]
pub async fn charge_card(order: u64, cents: u64) -> Result<String, TaskError> {
    effect("charge", order)?;
    Ok(format!("ch-{order}-{cents}"))
}

/// Email the confirmation.
#[mutating_tool(idempotency_key_fields = [order], lease = "2s")]
pub async fn send_confirmation(order: u64, charge: String) -> Result<String, TaskError> {
    effect("email", order)?;
    Ok(format!("mail-{order}-{charge}"))
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub reservation: String,
    pub charge: String,
    pub label: String,
    pub email: String,
    pub cents: u64,
}

/// With `TC_PAUSE_AT_BOUNDARY=N`, announces the end of step N and stalls there, so a test
/// can SIGKILL the task exactly between two steps.
fn boundary(n: u32) {
    if std::env::var("TC_PAUSE_AT_BOUNDARY")
        .ok()
        .and_then(|v| v.parse().ok())
        == Some(n)
    {
        println!("boundary {n}");
        let _ = std::io::stdout().flush();
        std::thread::sleep(Duration::from_secs(30));
    }
}

async fn task(order: u64) -> Result<serde_json::Value, TaskError> {
    let options = RunOptions::default().lease(Duration::from_millis(500));
    let run = loop {
        let run = Run::start_with("fulfil_order", &json!({ "order": order }), options).await?;
        match run.status() {
            RunStatus::Finished(result) => {
                println!("run {}: finished earlier; nothing runs", &run.key()[..12]);
                return Ok(result.clone());
            }
            RunStatus::Running => {
                println!(
                    "run {}: running in another worker; waiting",
                    &run.key()[..12]
                );
                match run.wait().await {
                    Ok(result) => return Ok(result),
                    // Its worker died before finishing: start again, which resumes it.
                    Err(tool_contracts::Error::OutcomeUnknown { .. }) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            RunStatus::Started => println!("run {}: started", &run.key()[..12]),
            RunStatus::Resumed => println!("run {}: resumed after a crash", &run.key()[..12]),
            // This task never calls `Run::compensate`: a compensated run is not its own.
            other => {
                println!("run {}: {other:?}; nothing runs", &run.key()[..12]);
                return Ok(serde_json::Value::Null);
            }
        }
        break run;
    };
    let cents = run
        .step(
            "quote",
            || async move { Ok::<_, TaskError>(1_000 + order % 97) },
        )
        .await?;
    boundary(1);
    let reservation = run.enter(reserve_stock(order, 3)).await?;
    boundary(2);
    let charge = run.enter(charge_card(order, cents)).await?;
    boundary(3);
    let label = run
        .step("label", || {
            let reservation = reservation.clone();
            async move { Ok::<_, TaskError>(format!("label-{reservation}")) }
        })
        .await?;
    boundary(4);
    let email = run.enter(send_confirmation(order, charge.clone())).await?;
    boundary(5);
    for entry in run.journal().await? {
        println!(
            "  journal {}: {}:{} {} ({}…)",
            entry.position,
            entry.kind,
            entry.name,
            entry.status,
            &entry.key[..12]
        );
    }
    let outcome = Outcome {
        reservation,
        charge,
        label,
        email,
        cents,
    };
    let result = serde_json::to_value(&outcome).map_err(|e| tool_contracts::Error::Codec {
        tool: "fulfil_order".into(),
        key: Some(run.key().into()),
        message: e.to_string(),
    })?;
    run.finish(&result).await?;
    Ok(result)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    cli(std::env::args().skip(1).collect()).await
}

/// The command line, as a function so `tests/run_kills.rs` can run it in a child process.
pub async fn cli(args: Vec<String>) -> Result<(), Box<dyn std::error::Error>> {
    let mut args = args.into_iter();
    let mut store = format!(
        "sqlite:{}",
        std::env::temp_dir()
            .join("tool-contracts-agent.db")
            .display()
    );
    let mut order = 42u64;
    let mut scope = "demo".to_owned();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--store" => store = args.next().ok_or("--store needs a URL")?,
            "--order" => order = args.next().ok_or("--order needs a number")?.parse()?,
            "--scope" => scope = args.next().ok_or("--scope needs a value")?,
            "--ledger" => std::env::set_var(
                "TC_AGENT_LEDGER",
                args.next().ok_or("--ledger needs a path")?,
            ),
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    std::env::set_var("TC_AGENT_SCOPE", &scope);
    let store = tool_contracts::store::open(&store).await?;
    let result = with_store(store, with_scope(scope, task(order))).await?;
    println!("result: {result}");
    Ok(())
}
