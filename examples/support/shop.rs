//! The shop both shop examples serve (`mcp_shop` over MCP, `http_shop` over HTTP), included
//! by each with `#[path = "support/shop.rs"] mod shop;`: the tools `create_order`,
//! `charge_card` (with `verify`, and `compensate` by a refund), `ship_order`,
//! `refund_charge`, `refund_order` (which a person approves first, `approval = "required"`)
//! and the read-only `get_order`, and the ledger they append their effects to.
//!
//! Every side effect (an order placed, a card charged) is appended to the ledger, one JSON
//! object a line and synced before the tool returns: the stand-in for the outside world,
//! which the end-to-end tests count.
//!
//! Crash windows for tests, each a sleep *after* the effect and before the result is
//! stored: `MCP_SHOP_CHARGE_DELAY_MS` (`charge_card`, which `verify` reconciles),
//! `SHOP_REFUND_DELAY_MS` (`refund_charge`, which has no `verify`: a crash there leaves an
//! unknown outcome), `SHOP_ORDER_DELAY_MS` (`create_order`), `SHOP_PAYMENT_DELAY_MS`
//! (`record_payment`, the plain `POST /payments` handler of `http_shop`) and
//! `SHOP_ORDER_REFUND_DELAY_MS` (`record_order_refund`, `http_shop`'s `refund_order`).

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

/// Sets the ledger file every tool appends to (once per process; later calls are ignored).
pub fn install_ledger(path: PathBuf) {
    let _ = LEDGER.set(Ledger {
        path,
        lock: Mutex::new(()),
    });
}

/// What both shop servers do first: the SQLite store at `db` as the process's store, and the
/// ledger at `ledger` (default: `db` + `.ledger.jsonl`). Returns the ledger's path.
pub async fn open(db: &std::path::Path, ledger: Option<PathBuf>) -> Result<PathBuf, String> {
    let ledger = ledger.unwrap_or_else(|| {
        let mut path = db.as_os_str().to_owned();
        path.push(".ledger.jsonl");
        PathBuf::from(path)
    });
    let store = tool_contracts::store::SqliteStore::open(db)
        .await
        .map_err(|e| format!("cannot open the store {}: {e}", db.display()))?;
    tool_contracts::set_default_store(store);
    install_ledger(ledger.clone());
    Ok(ledger)
}

/// Every effect in the ledger, oldest first.
// Read by `http_shop`'s `GET /ledger`; `mcp_shop` has `get_order` instead.
#[allow(dead_code)]
pub fn ledger_entries() -> Result<Vec<Value>, ShopError> {
    ledger()?.entries()
}

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
    // The crash window: ordered, result not yet stored.
    crash_window("SHOP_ORDER_DELAY_MS").await;
    decode(&entry)
}

/// Sleeps as long as the environment variable `name` says, in milliseconds (0 if unset):
/// the tests' window between an effect and its stored result.
async fn crash_window(name: &str) {
    let delay = std::env::var(name)
        .ok()
        .and_then(|ms| ms.parse::<u64>().ok())
        .unwrap_or(0);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
}

/// A payment taken by `http_shop`'s plain `POST /payments` handler (no tool, no
/// registry: the legacy route `IdempotencyLayer` protects): appended to the ledger as
/// `{"effect": "payment", "payment_id", "amount_cents", "reference"}`, then the
/// `SHOP_PAYMENT_DELAY_MS` crash window.
// Used by `http_shop` only.
#[allow(dead_code)]
pub async fn record_payment(amount_cents: u64, reference: &str) -> Result<Value, ShopError> {
    let entry = ledger()?.record(|entries| {
        let payment_id = entries.iter().filter(|e| e["effect"] == "payment").count() as u64 + 1;
        json!({
            "effect": "payment", "payment_id": payment_id, "amount_cents": amount_cents,
            "reference": reference, "pid": std::process::id(),
        })
    })?;
    crash_window("SHOP_PAYMENT_DELAY_MS").await;
    Ok(entry)
}

/// An order refunded by `http_shop`'s `refund_order` (a tool a person approves first):
/// appended to the ledger as `{"effect": "order_refund", "refund_id", "order_id",
/// "amount_cents", "reason", "key"}`, then the `SHOP_ORDER_REFUND_DELAY_MS` crash window.
pub async fn record_order_refund(
    order_id: u64,
    amount_cents: u64,
    reason: &str,
) -> Result<Value, ShopError> {
    let key = tool_contracts::current_key().unwrap_or_default();
    let refund_id = format!("or_{}", key.get(..16).unwrap_or(&key));
    let entry = ledger()?.record(|_| {
        json!({
            "effect": "order_refund", "refund_id": refund_id, "order_id": order_id,
            "amount_cents": amount_cents, "reason": reason, "key": key,
            "pid": std::process::id(),
        })
    })?;
    crash_window("SHOP_ORDER_REFUND_DELAY_MS").await;
    Ok(entry)
}

/// Charge the card for an order. Safe to retry: one charge per order, even if the server
/// dies mid-call (the provider is asked whether the charge went through). Charged inside a
/// run that fails, it is refunded when the run is compensated.
#[mutating_tool(
    idempotency_key_fields = [order_id],
    verify = find_charge,
    lease = "2s",
    open_world,
    task = "optional",
    compensate = refund_on_compensation
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

/// The undo of `charge_card` (`compensate`), run when a run that charged the card is
/// compensated: refunds the charge through `refund_charge` (one refund per charge), its
/// reason naming the undo's key.
async fn refund_on_compensation(
    order_id: &u64,
    amount_cents: &u64,
    card_token: &str,
    charge: &Charge,
    cx: tool_contracts::UndoContext,
) -> Result<Refund, ShopError> {
    let _ = (order_id, card_token);
    let reason = format!("compensation {}", cx.key());
    refund_charge(charge.charge_id.clone(), *amount_cents, reason).await
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

/// A refund of a charge.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Refund {
    /// The refund's id at the payment provider.
    pub refund_id: String,
    /// The charge refunded.
    pub charge_id: String,
    /// Amount, in cents.
    pub amount_cents: u64,
}

/// Refund a charge. Safe to retry: one refund per charge. The provider's refunds are slow,
/// so a duplicate that arrives while the first runs is refused at once (`409` with
/// `Retry-After` over HTTP) rather than held waiting.
#[mutating_tool(idempotency_key_fields = [charge_id], concurrent = "reject", lease = "2s")]
pub async fn refund_charge(
    charge_id: String,
    amount_cents: u64,
    reason: String,
) -> Result<Refund, ShopError> {
    let key = tool_contracts::current_key().unwrap_or_default();
    let refund_id = format!("re_{}", key.get(..16).unwrap_or(&key));
    let entry = ledger()?.record(|_| {
        json!({
            "effect": "refund", "refund_id": refund_id, "charge_id": charge_id,
            "amount_cents": amount_cents, "reason": reason, "key": key,
            "pid": std::process::id(),
        })
    })?;
    let delay = std::env::var("SHOP_REFUND_DELAY_MS")
        .ok()
        .and_then(|ms| ms.parse::<u64>().ok())
        .unwrap_or(0);
    // The crash window: refunded, result not yet stored (no `verify`: an unknown outcome).
    tokio::time::sleep(Duration::from_millis(delay)).await;
    decode(&entry)
}

/// A refund of an order, made once a person approved it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct OrderRefund {
    /// The refund's id at the payment provider.
    pub refund_id: String,
    /// The order refunded.
    pub order_id: u64,
    /// Amount, in cents.
    pub amount_cents: u64,
    /// Why, as the customer said (empty when not given).
    #[serde(default)]
    pub reason: String,
}

/// Refund an order to the customer's card. A person approves every refund before it runs;
/// it runs once when approved, and retries return the same refund. One refund per order.
/// Shared by `mcp_shop` and `http_shop` (one tool of this name per program).
#[mutating_tool(idempotency_key_fields = [order_id], approval = "required")]
pub async fn refund_order(
    order_id: u64,
    amount_cents: u64,
    reason: Option<String>,
) -> Result<OrderRefund, ShopError> {
    let entry =
        record_order_refund(order_id, amount_cents, reason.as_deref().unwrap_or("")).await?;
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
