//! A worker that ships parcels through a durable SQLite store: kill it at any moment
//! (Ctrl-C, `kill -9`) and start it again; shipped parcels are replayed, the one cut off
//! mid-shipment is reconciled through `verify`, and no parcel ships twice.
//!
//! Run: `cargo run --example durable --features sqlite` (again and again; `--reset` starts over)

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use tool_contracts::store::SqliteStore;
use tool_contracts::{mutating_tool, set_default_store};

#[derive(Debug, thiserror::Error)]
pub enum ShipError {
    #[error(transparent)]
    Contract(#[from] tool_contracts::Error),
    #[error("ledger: {0}")]
    Ledger(#[from] std::io::Error),
}

fn dir() -> PathBuf {
    std::env::temp_dir().join("tool-contracts-durable-demo")
}

/// The carrier's ledger: one line per parcel handed over (the side effect).
fn ledger() -> PathBuf {
    dir().join("carrier-ledger.txt")
}

fn shipped(order_id: u64) -> Option<String> {
    let text = std::fs::read_to_string(ledger()).ok()?;
    text.lines()
        .find(|l| l.split(' ').next() == Some(&order_id.to_string()))
        .map(|l| l.split(' ').nth(1).unwrap_or("").to_owned())
}

/// Hand the order's parcel to the carrier.
#[mutating_tool(idempotency_key_fields = [order_id], lease = "2s", verify = was_shipped)]
pub async fn ship_parcel(order_id: u64) -> Result<String, ShipError> {
    let tracking = format!("TRK-{order_id:05}");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(ledger())?;
    // One `write` per line, so a kill never leaves half a line.
    f.write_all(format!("{order_id} {tracking}\n").as_bytes())?;
    // The slow part after the effect: the window in which a kill leaves the outcome unknown.
    tokio::time::sleep(Duration::from_millis(700)).await;
    Ok(tracking)
}

/// Asks the carrier whether the parcel was handed over already.
pub async fn was_shipped(order_id: &u64) -> Result<Option<String>, ShipError> {
    Ok(shipped(*order_id))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::args().any(|a| a == "--reset") {
        let _ = std::fs::remove_dir_all(dir());
    }
    std::fs::create_dir_all(dir())?;
    let db = dir().join("keys.db");
    set_default_store(SqliteStore::open(&db).await?);
    println!("store: {} (pid {})", db.display(), std::process::id());
    for order_id in 1..=8u64 {
        let before = shipped(order_id).is_some();
        let started = std::time::Instant::now();
        let tracking = ship_parcel(order_id).await?;
        let verdict = match (before, started.elapsed() > Duration::from_millis(600)) {
            (false, _) => "shipped now",
            (true, true) => "reconciled (verify found the earlier shipment)",
            (true, false) => "replayed",
        };
        println!("order {order_id}: {tracking}: {verdict}");
    }
    let lines = std::fs::read_to_string(ledger())?;
    let mut ids: Vec<&str> = lines.lines().filter_map(|l| l.split(' ').next()).collect();
    let total = ids.len();
    ids.sort_unstable();
    ids.dedup();
    println!("carrier ledger: {total} handovers for {} orders", ids.len());
    if total != ids.len() {
        return Err("a parcel was shipped twice".into());
    }
    Ok(())
}
