//! `Secret<T>`: a card number used as a key field takes part in the key (hashed) but never
//! reaches the store, the registry's output, error messages or logs in clear.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tool_contracts::{mutating_tool, registry, with_store, Error, MemoryStore, Secret, Store};

const CARD: &str = "4111111111111111";
const OTHER_CARD: &str = "5500005555555559";
/// Letters, not digits: the logs' timestamps and hex keys hold every short run of digits
/// sooner or later, so a 3-digit value could be "found" there by chance (it was, once).
const CVC: &str = "QZX";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Payment {
    pub order_id: u64,
    pub charged_cents: u64,
    pub attempt: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum PayError {
    #[error(transparent)]
    Contract(#[from] Error),
}

static PAY_RUNS: AtomicUsize = AtomicUsize::new(0);

/// Charge a card once per (card, order).
#[mutating_tool(idempotency_key_fields = [card, order_id])]
pub async fn pay(
    order_id: u64,
    card: Secret<String>,
    cvc: Secret<String>,
    amount_cents: u64,
) -> Result<Payment, PayError> {
    // The body sees the clear values; formatting them does not.
    assert_eq!(card.expose().len(), 16);
    assert_eq!(cvc.expose().len(), 3);
    assert_eq!(format!("{card:?} {cvc}"), "Secret(***) Secret(***)");
    let attempt = PAY_RUNS.fetch_add(1, SeqCst);
    Ok(Payment {
        order_id,
        charged_cents: amount_cents,
        attempt,
    })
}

fn args(card: &str, order_id: u64) -> Value {
    json!({"order_id": order_id, "card": card, "cvc": CVC, "amount_cents": 1250})
}

fn key_of(args: &Value) -> String {
    registry().get("pay").unwrap().key(args).unwrap().unwrap()
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn assert_no_clear_value(what: &str, text: &str) {
    for secret in [CARD, OTHER_CARD, CVC] {
        assert!(
            !text.contains(secret),
            "{what} contains the clear value {secret}: {text}"
        );
    }
}

#[tokio::test]
async fn the_store_never_holds_a_secret_in_clear_neither_in_args_nor_fingerprint() {
    logs();
    let store = Arc::new(MemoryStore::new());
    let a = args(CARD, 1);
    let out = with_store(Arc::clone(&store), registry().call("pay", a.clone()))
        .await
        .unwrap();
    assert_eq!(out.key, Some(key_of(&a)));
    let record = store
        .lookup(out.key.as_deref().unwrap_or_default())
        .await
        .unwrap()
        .unwrap();
    assert_no_clear_value("stored args", &record.args);
    assert_no_clear_value("fingerprint", &record.fingerprint);
    assert_no_clear_value("the whole record", &format!("{record:?}"));
    assert_no_clear_value("registry output", &format!("{out:?}"));
    for pending in store.pending(10).await.unwrap() {
        assert_no_clear_value("pending", &format!("{pending:?}"));
    }
    // What is stored instead: the digest of the value's canonical JSON, so an operator can
    // still tell two calls apart, and reconciliation gets `{"sha256": ...}`.
    let stored: Value = serde_json::from_str(&record.args).unwrap();
    assert_eq!(
        stored["card"],
        json!({"sha256": sha256_hex(format!("\"{CARD}\"").as_bytes())})
    );
    assert_eq!(
        stored["cvc"],
        json!({"sha256": sha256_hex(format!("\"{CVC}\"").as_bytes())})
    );
    assert_eq!(
        stored["amount_cents"], 1250,
        "other arguments are stored as they are"
    );
}

#[tokio::test]
async fn a_secret_key_field_gives_a_stable_key_that_differs_per_secret_and_replays() {
    logs();
    let store = Arc::new(MemoryStore::new());
    let first = with_store(
        Arc::clone(&store),
        registry().call("pay", args(OTHER_CARD, 2)),
    )
    .await
    .unwrap();
    let again = with_store(
        Arc::clone(&store),
        registry().call("pay", args(OTHER_CARD, 2)),
    )
    .await
    .unwrap();
    assert_ne!(first.outcome, tool_contracts::Outcome::Replayed);
    assert_eq!(
        again.outcome,
        tool_contracts::Outcome::Replayed,
        "the retry is replayed"
    );
    assert_eq!(first.value, again.value);
    assert_eq!(first.key, again.key, "stable across calls");
    assert_eq!(
        first.key,
        Some(key_of(&args(OTHER_CARD, 2))),
        "stable across processes: a pure function"
    );
    assert_ne!(
        first.key,
        Some(key_of(&args(CARD, 2))),
        "another card is another intent"
    );
    assert_ne!(first.key, Some(key_of(&args(OTHER_CARD, 3))));
    // Any client can compute it: the key field's value is the digest object.
    let digest = json!({"sha256": sha256_hex(format!("\"{OTHER_CARD}\"").as_bytes())});
    let order = json!(2);
    let expected =
        tool_contracts::key::tool_key("pay", 1, None, &[("card", &digest), ("order_id", &order)])
            .unwrap();
    assert_eq!(first.key, Some(expected));

    // A direct call shares the key with the registry call.
    let direct = with_store(
        Arc::clone(&store),
        pay(
            2,
            Secret::new(OTHER_CARD.to_owned()),
            Secret::new(CVC.to_owned()),
            1250,
        ),
    )
    .await
    .unwrap();
    assert_eq!(serde_json::to_value(&direct).unwrap(), first.value);
}

#[tokio::test]
async fn errors_about_secret_parameters_name_them_without_their_value() {
    logs();
    let store = Arc::new(MemoryStore::new());
    with_store(Arc::clone(&store), registry().call("pay", args(CARD, 4)))
        .await
        .unwrap();
    // Same card and order, another cvc: KeyReused names `cvc`, not its value.
    let mut other = args(CARD, 4);
    other["cvc"] = json!("999");
    let err = with_store(Arc::clone(&store), registry().call("pay", other))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::KeyReused { params, .. } if params == &["cvc"]),
        "{err}"
    );
    assert_no_clear_value("KeyReused", &format!("{err} {err:?}"));
    assert!(!err.to_string().contains("999"));

    // An empty secret key field is still an empty intent.
    let err = with_store(Arc::clone(&store), registry().call("pay", args("", 5)))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArguments { field: Some(f), .. } if f == "card"),
        "{err}"
    );

    // A secret of the wrong type: the error names the field, not the value.
    let mut wrong = args(CARD, 6);
    wrong["cvc"] = json!(737);
    let err = with_store(Arc::clone(&store), registry().call("pay", wrong))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArguments { field: Some(f), .. } if f == "cvc"),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("not a valid `alloc::string::String`"),
        "{err}"
    );
    assert_no_clear_value("a decoding error", &format!("{err} {err:?}"));
    assert!(!format!("{err} {err:?}").contains("737"), "{err:?}");
}

#[test]
fn clients_see_the_plain_schema_and_debug_never_prints_the_value() {
    logs();
    let tool = registry().get("pay").unwrap();
    let schema = tool.input_schema();
    assert_eq!(schema["properties"]["card"]["type"], "string", "{schema}");
    assert_eq!(schema["properties"]["cvc"]["type"], "string", "{schema}");
    let secret = Secret::new(CARD.to_owned());
    assert_eq!(format!("{secret:?}"), "Secret(***)");
    assert_eq!(format!("{secret}"), "Secret(***)");
    assert_eq!(format!("{:?}", Some(&secret)), "Some(Secret(***))");
    assert_eq!(secret.expose(), CARD);
    let parsed: Secret<String> = serde_json::from_value(json!(CARD)).unwrap();
    assert_eq!(parsed, secret);
}

/// Captures everything a `tracing` subscriber writes.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Capture {
    type Writer = Capture;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// Every log line of this test binary, down to TRACE: installed globally before any test
/// makes a call (each test calls this first), so no callsite is cached as disabled.
fn logs() -> &'static Capture {
    static LOGS: OnceLock<Capture> = OnceLock::new();
    LOGS.get_or_init(|| {
        use tracing_subscriber::util::SubscriberInitExt;
        let capture = Capture::default();
        tracing_subscriber::fmt()
            .with_max_level(tracing_subscriber::filter::LevelFilter::TRACE)
            .with_writer(capture.clone())
            .with_ansi(false)
            .finish()
            .try_init()
            .expect("no other global subscriber in this test binary");
        capture
    })
}

#[tokio::test]
async fn logs_at_trace_level_never_contain_a_secret_or_a_key_field_value() {
    let capture = logs();
    let store = Arc::new(MemoryStore::new());
    for _ in 0..2 {
        with_store(Arc::clone(&store), registry().call("pay", args(CARD, 7)))
            .await
            .unwrap();
    }
    let mut reused = args(CARD, 7);
    reused["cvc"] = json!("000");
    let _ = with_store(Arc::clone(&store), registry().call("pay", reused)).await;

    // Everything logged so far, by this test and by the others of this file.
    let logs = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
    assert!(
        logs.contains("running tool body"),
        "the capture works: {logs}"
    );
    assert!(logs.contains("replayed stored result"), "{logs}");
    assert!(logs.contains("key reused"), "{logs}");
    assert_no_clear_value("logs", &logs);
    // Key fields appear only as the key (a digest); the order id is a key field too.
    assert!(!logs.contains("order_id"), "{logs}");
}
