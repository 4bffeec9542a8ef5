//! A shop served as an MCP server: `create_order`, `charge_card` and `ship_order` are safe
//! to call twice, even across a crash of the server, and `get_order` reads.
//!
//! ```sh
//! cargo run --example mcp_shop --features mcp,sqlite -- --stdio --db /tmp/shop.db
//! cargo run --example mcp_shop --features mcp,sqlite -- --http 127.0.0.1:8080 --db /tmp/shop.db
//! cargo run --example mcp_shop --features mcp,sqlite -- --stdio --db /tmp/shop.db --tenant acme
//! ```
//!
//! Keys live in the SQLite file given by `--db`. Every side effect (an order placed, a card
//! charged) is appended to a ledger, `<db>.ledger.jsonl` unless `--ledger` says otherwise,
//! one JSON object a line and synced before the tool returns: the stand-in for the
//! outside world, which the end-to-end test (`tests/mcp/test_e2e.py`) counts.
//!
//! `MCP_SHOP_CHARGE_DELAY_MS` makes `charge_card` sleep that long *after* charging, so a
//! test can kill the server between the effect and the stored result.
//!
//! `create_order` and `charge_card` take MCP tasks (`task = "optional"`): a client that
//! declares the tasks extension gets a task whose id is the call's key, and polls
//! `tasks/get` for the result (docs/mcp.md, "Tasks").

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tool_contracts::{mutating_tool, read_only_tool};

/// One line of a cart.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Item {
    /// Stock-keeping unit.
    pub sku: String,
    /// How many.
    pub qty: u32,
    /// Price of one, in cents.
    pub unit_cents: u64,
}

/// What the user wants to buy.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Cart {
    /// The cart's id: with the user, the intent of an order.
    pub id: String,
    /// Its lines.
    pub items: Vec<Item>,
}

/// A placed order.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Order {
    /// Order number, from 1.
    pub order_id: u64,
    /// Who ordered.
    pub user_id: u64,
    /// The cart it was placed from.
    pub cart_id: String,
    /// Sum of the lines, in cents.
    pub total_cents: u64,
}

/// A card charge.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Charge {
    /// The payment provider's charge id.
    pub charge_id: String,
    /// The order paid.
    pub order_id: u64,
    /// Amount, in cents.
    pub amount_cents: u64,
}

/// Where an order is shipped. Its JSON names follow the carrier's API (`postalCode`,
/// `countryCode`), not the Rust names: `ship_order` keys on the address as a whole, which
/// is keyed under those JSON names, the ones a client sends.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Address {
    /// Street and number.
    pub line1: String,
    /// Postal code.
    #[serde(rename = "postalCode")]
    pub postal_code: String,
    /// ISO 3166-1 alpha-2 country code.
    #[serde(rename = "countryCode")]
    pub country: String,
}

/// A shipment booked with a carrier.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Shipment {
    /// The carrier's tracking number.
    pub tracking: String,
    /// The order shipped.
    pub order_id: u64,
    /// The carrier.
    pub carrier: String,
}

/// An order with its charges.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct OrderView {
    /// The order.
    pub order: Order,
    /// Charges made for it.
    pub charges: Vec<Charge>,
}

/// Errors of the shop's tools.
#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    /// A contract failure (key reused, outcome unknown…), passed through.
    #[error(transparent)]
    Contract(#[from] tool_contracts::Error),
    /// The ledger could not be read or written.
    #[error("the shop's ledger failed: {0}; retry later")]
    Ledger(String),
    /// A cart without lines.
    #[error("cart `{0}` is empty; add items before ordering")]
    EmptyCart(String),
}

/// The outside world: an append-only JSON-lines file of effects.
struct Ledger {
    path: PathBuf,
    /// Serializes read-then-append (order numbers) inside this process.
    lock: Mutex<()>,
}

static LEDGER: OnceLock<Ledger> = OnceLock::new();

fn ledger() -> Result<&'static Ledger, ShopError> {
    LEDGER
        .get()
        .ok_or_else(|| ShopError::Ledger("no ledger configured".to_owned()))
}

impl Ledger {
    fn entries(&self) -> Result<Vec<Value>, ShopError> {
        match std::fs::read_to_string(&self.path) {
            Ok(text) => Ok(text
                .lines()
                .filter_map(|line| serde_json::from_str(line).ok())
                .collect()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(ShopError::Ledger(format!("{}: {e}", self.path.display()))),
        }
    }

    /// Appends one effect and syncs it to disk, computing it from the current entries
    /// under the lock.
    fn record(&self, make: impl FnOnce(&[Value]) -> Value) -> Result<Value, ShopError> {
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let entry = make(&self.entries()?);
        let fail = |e: std::io::Error| ShopError::Ledger(format!("{}: {e}", self.path.display()));
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(fail)?;
        file.write_all(format!("{entry}\n").as_bytes())
            .map_err(fail)?;
        file.sync_data().map_err(fail)?;
        Ok(entry)
    }
}

fn decode<T: serde::de::DeserializeOwned>(entry: &Value) -> Result<T, ShopError> {
    serde_json::from_value(entry.clone())
        .map_err(|e| ShopError::Ledger(format!("bad entry {entry}: {e}")))
}

/// Place an order for the user's cart. Safe to retry: the same user and cart id give the
/// same order. `note` is free text for the packer.
#[mutating_tool(idempotency_key_fields = [user_id, cart.id], task = "optional")]
pub async fn create_order(user_id: u64, cart: Cart, note: String) -> Result<Order, ShopError> {
    let _ = note;
    if cart.items.is_empty() {
        return Err(ShopError::EmptyCart(cart.id));
    }
    let total_cents: u64 = cart
        .items
        .iter()
        .map(|i| i.unit_cents * u64::from(i.qty))
        .sum();
    let key = tool_contracts::current_key();
    let entry = ledger()?.record(|entries| {
        let order_id = entries.iter().filter(|e| e["effect"] == "order").count() as u64 + 1;
        json!({
            "effect": "order", "order_id": order_id, "user_id": user_id, "cart_id": cart.id,
            "total_cents": total_cents, "key": key, "pid": std::process::id(),
        })
    })?;
    decode(&entry)
}

/// Charge the card for an order. Safe to retry: one charge per order, even if the server
/// dies mid-call (the provider is asked whether the charge went through).
#[mutating_tool(
    idempotency_key_fields = [order_id],
    verify = find_charge,
    lease = "2s",
    open_world,
    task = "optional"
)]
pub async fn charge_card(
    order_id: u64,
    amount_cents: u64,
    card_token: String,
) -> Result<Charge, ShopError> {
    let _ = card_token;
    // The provider's own idempotency key: the innermost layer of protection.
    let key = tool_contracts::current_key().unwrap_or_default();
    let charge_id = format!("ch_{}", key.get(..16).unwrap_or(&key));
    let entry = ledger()?.record(|_| {
        json!({
            "effect": "charge", "charge_id": charge_id, "order_id": order_id,
            "amount_cents": amount_cents, "key": key, "pid": std::process::id(),
        })
    })?;
    let delay = std::env::var("MCP_SHOP_CHARGE_DELAY_MS")
        .ok()
        .and_then(|ms| ms.parse::<u64>().ok())
        .unwrap_or(0);
    // The crash window: charged, result not yet stored.
    tokio::time::sleep(Duration::from_millis(delay)).await;
    decode(&entry)
}

/// `verify` of `charge_card`: asks the provider (the ledger) whether the order was charged.
async fn find_charge(
    order_id: &u64,
    amount_cents: &u64,
    card_token: &str,
) -> Result<Option<Charge>, ShopError> {
    let _ = (amount_cents, card_token);
    ledger()?
        .entries()?
        .iter()
        .find(|e| e["effect"] == "charge" && e["order_id"] == *order_id)
        .map(decode)
        .transpose()
}

/// Ship an order to an address. Safe to retry: one shipment per order and address (another
/// address is another shipment). `carrier` names who carries it.
#[mutating_tool(idempotency_key_fields = [order_id, address])]
pub async fn ship_order(
    order_id: u64,
    address: Address,
    carrier: String,
) -> Result<Shipment, ShopError> {
    let key = tool_contracts::current_key().unwrap_or_default();
    let tracking = format!("trk_{}", key.get(..16).unwrap_or(&key));
    let entry = ledger()?.record(|_| {
        json!({
            "effect": "shipment", "tracking": tracking, "order_id": order_id,
            "carrier": carrier, "postal_code": address.postal_code, "key": key,
            "pid": std::process::id(),
        })
    })?;
    decode(&entry)
}

/// Look an order up with its charges; `null` if there is none with that number.
#[read_only_tool]
pub async fn get_order(order_id: u64) -> Result<Option<OrderView>, ShopError> {
    let entries = ledger()?.entries()?;
    let Some(order) = entries
        .iter()
        .find(|e| e["effect"] == "order" && e["order_id"] == order_id)
    else {
        return Ok(None);
    };
    let charges = entries
        .iter()
        .filter(|e| e["effect"] == "charge" && e["order_id"] == order_id)
        .map(decode)
        .collect::<Result<_, _>>()?;
    Ok(Some(OrderView {
        order: decode(order)?,
        charges,
    }))
}

enum Mode {
    Stdio,
    Http(std::net::SocketAddr),
}

struct Options {
    mode: Mode,
    db: PathBuf,
    ledger: Option<PathBuf>,
    tenant: Option<String>,
}

const USAGE: &str =
    "usage: mcp_shop (--stdio | --http <addr>) --db <path> [--ledger <path>] [--tenant <name>]";

fn parse_args() -> Result<Options, String> {
    let mut args = std::env::args().skip(1);
    let (mut mode, mut db, mut ledger, mut tenant) = (None, None, None, None);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--stdio" => mode = Some(Mode::Stdio),
            "--http" => {
                let addr = args
                    .next()
                    .ok_or("--http needs an address, e.g. 127.0.0.1:8080")?;
                let addr = addr
                    .parse()
                    .map_err(|e| format!("--http {addr}: not a socket address ({e})"))?;
                mode = Some(Mode::Http(addr));
            }
            "--db" => db = Some(PathBuf::from(args.next().ok_or("--db needs a path")?)),
            "--ledger" => ledger = Some(PathBuf::from(args.next().ok_or("--ledger needs a path")?)),
            "--tenant" => tenant = Some(args.next().ok_or("--tenant needs a name")?),
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument `{other}`\n{USAGE}")),
        }
    }
    Ok(Options {
        mode: mode.ok_or_else(|| format!("say --stdio or --http <addr>\n{USAGE}"))?,
        db: db.ok_or_else(|| format!("say --db <path>\n{USAGE}"))?,
        ledger,
        tenant,
    })
}

#[tokio::main]
async fn main() {
    if let Err(message) = run().await {
        eprintln!("mcp_shop: {message}");
        std::process::exit(2);
    }
}

async fn run() -> Result<(), String> {
    let options = parse_args()?;
    let ledger_path = options.ledger.unwrap_or_else(|| {
        let mut path = options.db.clone().into_os_string();
        path.push(".ledger.jsonl");
        PathBuf::from(path)
    });
    let store = tool_contracts::store::SqliteStore::open(&options.db)
        .await
        .map_err(|e| format!("cannot open the store {}: {e}", options.db.display()))?;
    tool_contracts::set_default_store(store);
    let _ = LEDGER.set(Ledger {
        path: ledger_path.clone(),
        lock: Mutex::new(()),
    });
    let registry = tool_contracts::try_registry().map_err(|e| e.to_string())?;
    let server = tool_contracts::mcp::McpServer::new(registry.clone())
        .with_server_info("mcp_shop", env!("CARGO_PKG_VERSION"));
    // The tenant scopes everything this process does: its keys, and which operations its
    // clients may read (another tenant's on the same store read as not found).
    let server = match options.tenant {
        Some(tenant) => server.with_scope(tenant),
        None => server,
    };
    eprintln!(
        "mcp_shop: pid {}, store {}, ledger {}",
        std::process::id(),
        options.db.display(),
        ledger_path.display()
    );
    match options.mode {
        Mode::Stdio => server.serve_stdio().await,
        Mode::Http(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
            let bound = listener.local_addr().map_err(|e| e.to_string())?;
            eprintln!("mcp_shop: listening on http://{bound}/mcp");
            server
                .serve_http_listener(listener, async {
                    let _ = tokio::signal::ctrl_c().await;
                })
                .await
        }
    }
    .map_err(|e| e.to_string())
}
