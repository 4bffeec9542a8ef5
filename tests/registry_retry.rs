//! A retried registry call: a retry with byte-identical JSON text (`Registry::call_json`,
//! as the HTTP tools router hands its bodies over) or an equal `Value` (`Registry::call`,
//! as MCP does) on the same thread takes the key and arguments derived before instead of
//! decoding again (`runtime/src/derived.rs`), and never makes a different call than a
//! decode would: other bytes, another scope, another store, a lowered size limit, a number
//! of another kind each get exactly the full path's answer.
//!
//! Each test counts the decodes of the tool's `cart` parameter. The tests share one process
//! setting (the arguments' size limit) and one counter, so they take [`SERIAL`] in turn.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use serde::{Deserialize, Deserializer, Serialize};
use tool_contracts::{
    mutating_tool, registry, set_max_argument_bytes, with_scope, with_store, Error, MemoryStore,
    Outcome, DEFAULT_MAX_ARGUMENT_BYTES,
};

/// Taken by every test here: the decode counter and the size limit are the process's.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

static DECODES: AtomicUsize = AtomicUsize::new(0);
static RUNS: AtomicUsize = AtomicUsize::new(0);

/// A cart that counts how many times it was decoded.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Cart {
    /// The cart's id.
    pub id: String,
}

impl<'de> Deserialize<'de> for Cart {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Plain {
            id: String,
        }
        DECODES.fetch_add(1, SeqCst);
        Plain::deserialize(d).map(|p| Cart { id: p.id })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Contract(#[from] Error),
}

/// Places an order for a user's cart.
#[mutating_tool(idempotency_key_fields = [user_id, cart.id])]
pub async fn text_order(user_id: u64, cart: Cart, note: String) -> Result<String, ShopError> {
    let run = RUNS.fetch_add(1, SeqCst);
    Ok(format!("order {run} for {user_id}/{}: {note}", cart.id))
}

const TEXT: &str = r#"{"user_id":7,"cart":{"id":"c-42"},"note":"gift"}"#;
/// The same arguments, spaced differently: other bytes, the same call.
const SPACED: &str = r#"{ "user_id": 7, "cart": { "id": "c-42" }, "note": "gift" }"#;

fn counts() -> (usize, usize) {
    (DECODES.load(SeqCst), RUNS.load(SeqCst))
}

/// [`TEXT`] called `times` times through `call_json` on this thread (twice in a row keeps
/// it derived).
async fn call_text(times: usize) {
    for _ in 0..times {
        registry().call_json("text_order", TEXT).await.unwrap();
    }
}

/// The key the full path derives for [`TEXT`] in the current scope.
fn derived_key() -> String {
    let args = serde_json::from_str(TEXT).unwrap();
    let tool = registry().get("text_order").unwrap();
    tool.key(&args).unwrap().unwrap()
}

#[tokio::test]
async fn a_retry_with_the_same_text_replays_without_decoding_and_as_a_decode_would() {
    let _serial = SERIAL.lock().await;
    with_store(MemoryStore::new(), async {
        let first = registry().call_json("text_order", TEXT).await.unwrap();
        assert_eq!(first.outcome, Outcome::Executed);
        let key = first.key.clone().unwrap();
        let (decodes, runs) = counts();
        // The first replay derives again (and keeps it: the second time in a row); the
        // rest take what it kept.
        for i in 0..5 {
            let out = registry().call_json("text_order", TEXT).await.unwrap();
            assert_eq!(out.outcome, Outcome::Replayed, "replay {i}");
            assert_eq!(out.key.as_deref(), Some(key.as_str()));
            assert_eq!(out.value, first.value);
        }
        assert_eq!(
            counts(),
            (decodes + 1, runs),
            "decoded on the first replay only"
        );
        // Other bytes for the same call: decoded, the same key, the same replay.
        let spaced = registry().call_json("text_order", SPACED).await.unwrap();
        assert_eq!(spaced.outcome, Outcome::Replayed);
        assert_eq!(spaced.key, first.key);
        assert_eq!(spaced.value, first.value);
        assert_eq!(counts(), (decodes + 2, runs));
        // The key is the full path's, and a `Value` call's.
        assert_eq!(key, derived_key());
        let value = serde_json::from_str(TEXT).unwrap();
        let by_value = registry().call("text_order", value).await.unwrap();
        assert_eq!(by_value.key, first.key);
    })
    .await;
}

#[tokio::test]
async fn a_retry_with_an_equal_value_replays_without_decoding_and_refuses_what_a_decode_refuses() {
    let _serial = SERIAL.lock().await;
    with_store(MemoryStore::new(), async {
        let value: serde_json::Value = serde_json::from_str(TEXT).unwrap();
        let first = registry().call("text_order", value.clone()).await.unwrap();
        assert_eq!(first.outcome, Outcome::Executed);
        let (decodes, runs) = counts();
        for i in 0..5 {
            let out = registry().call("text_order", value.clone()).await.unwrap();
            assert_eq!(out.outcome, Outcome::Replayed, "replay {i}");
            assert_eq!(out.key, first.key);
            assert_eq!(out.value, first.value);
        }
        assert_eq!(
            counts(),
            (decodes + 1, runs),
            "decoded on the first replay only"
        );
        // The members in another order are an equal value: recalled, the same key.
        let reordered: serde_json::Value = serde_json::from_str(SPACED).unwrap();
        let out = registry().call("text_order", reordered).await.unwrap();
        assert_eq!(
            (out.key, out.outcome),
            (first.key.clone(), Outcome::Replayed)
        );
        assert_eq!(counts(), (decodes + 1, runs));
        // `7.0` is not `7`: decoded, and refused as a decode refuses it.
        let float = serde_json::json!({"user_id": 7.0, "cart": {"id": "c-42"}, "note": "gift"});
        let refused = registry().call("text_order", float).await;
        assert!(
            matches!(refused, Err(Error::InvalidArguments { .. })),
            "{refused:?}"
        );
        assert_eq!(counts().1, runs, "nothing ran");
    })
    .await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_kept_text_in_another_scope_or_store_is_the_full_paths_call() {
    let _serial = SERIAL.lock().await;
    with_store(MemoryStore::new(), async {
        call_text(3).await;
        let unscoped = derived_key();
        // Another tenant: its own key, its own run, whatever this thread kept.
        let (decodes, runs) = counts();
        let scoped = with_scope("tenant-b", async {
            let out = registry().call_json("text_order", TEXT).await.unwrap();
            assert_eq!(out.key.as_deref(), Some(derived_key().as_str()));
            out
        })
        .await;
        assert_ne!(scoped.key.as_deref(), Some(unscoped.as_str()));
        assert_eq!(scoped.outcome, Outcome::Executed);
        assert_eq!(counts().1, runs + 1, "the tenant's call ran");
        assert!(counts().0 > decodes, "and was decoded");
    })
    .await;
    // Another store, where the kept key has no record: the body runs, on arguments decoded
    // from the text.
    with_store(MemoryStore::new(), async {
        call_text(2).await;
        let key = derived_key();
        let (decodes, runs) = counts();
        with_store(MemoryStore::new(), async {
            let out = registry().call_json("text_order", TEXT).await.unwrap();
            assert_eq!(out.outcome, Outcome::Executed);
            assert_eq!(out.key.as_deref(), Some(key.as_str()));
            assert_eq!(out.value, format!("\"order {runs} for 7/c-42: gift\""));
        })
        .await;
        assert_eq!(counts(), (decodes + 1, runs + 1));
    })
    .await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_lowered_size_limit_refuses_a_kept_text_as_it_refuses_a_decoded_one() {
    let _serial = SERIAL.lock().await;
    with_store(MemoryStore::new(), async {
        call_text(3).await;
        let runs = counts().1;
        set_max_argument_bytes(16);
        let refused = registry().call_json("text_order", TEXT).await;
        set_max_argument_bytes(DEFAULT_MAX_ARGUMENT_BYTES);
        assert!(
            matches!(refused, Err(Error::InvalidArguments { ref message, .. }) if message.contains("over this process's limit")),
            "{refused:?}"
        );
        assert_eq!(counts().1, runs, "nothing ran");
        let again = registry().call_json("text_order", TEXT).await.unwrap();
        assert_eq!(again.outcome, Outcome::Replayed);
    })
    .await;
}

/// A registry call given a `Value` takes a replay's result as the `Value` this thread
/// encoded before from the same stored text (`runtime/src/decoded.rs`): the same value a
/// decode gives, and never another record's.
#[tokio::test(flavor = "current_thread")]
async fn a_value_replay_is_the_stored_results_own_whatever_this_thread_kept() {
    let _serial = SERIAL.lock().await;
    let value: serde_json::Value = serde_json::from_str(TEXT).unwrap();
    let kept = with_store(MemoryStore::new(), async {
        let first = registry().call("text_order", value.clone()).await.unwrap();
        for i in 0..4 {
            let out = registry().call("text_order", value.clone()).await.unwrap();
            assert_eq!(out.outcome, Outcome::Replayed, "replay {i}");
            assert_eq!(out.value, first.value, "replay {i}");
        }
        first.value
    })
    .await;
    // Another store: the same key, another record (another run's result). Its replays are
    // its own result, not the `Value` kept from the first store's.
    with_store(MemoryStore::new(), async {
        let first = registry().call("text_order", value.clone()).await.unwrap();
        assert_eq!(first.outcome, Outcome::Executed);
        assert_ne!(first.value, kept);
        for i in 0..4 {
            let out = registry().call("text_order", value.clone()).await.unwrap();
            assert_eq!(out.outcome, Outcome::Replayed, "replay {i}");
            assert_eq!(out.value, first.value, "replay {i}");
        }
    })
    .await;
}
