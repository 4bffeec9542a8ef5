//! Behaviour of the dedup engine through `#[mutating_tool]`: each test is named after the
//! failure it prevents.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tool_contracts::{
    mutating_tool, read_only_tool, registry, with_scope, with_store, Error, MemoryStore,
};

#[path = "support/calls.rs"]
mod calls;
#[path = "support/stores.rs"]
mod stores;
use calls::abandon_first_call;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Cart {
    pub id: String,
    pub items: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Order {
    pub order_no: usize,
    pub user_id: u64,
    pub cart_id: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Contract(#[from] Error),
    #[error("payment declined")]
    Declined,
}

impl ShopError {
    fn contract(self) -> Error {
        match self {
            ShopError::Contract(e) => e,
            other => panic!("expected a contract error, got {other:?}"),
        }
    }
}

fn cart(id: &str) -> Cart {
    Cart {
        id: id.to_owned(),
        items: vec!["book".to_owned()],
    }
}

static SEQUENTIAL_RUNS: AtomicUsize = AtomicUsize::new(0);

/// Place an order.
#[mutating_tool(idempotency_key_fields = [user_id, cart.id])]
pub async fn sequential_order(user_id: u64, cart: Cart, note: String) -> Result<Order, ShopError> {
    let _ = note;
    let n = SEQUENTIAL_RUNS.fetch_add(1, SeqCst);
    Ok(Order {
        order_no: n,
        user_id,
        cart_id: cart.id,
    })
}

#[tokio::test]
async fn hundred_sequential_retries_run_the_body_once() {
    with_store(MemoryStore::new(), async {
        let mut results = Vec::new();
        for _ in 0..100 {
            results.push(
                sequential_order(7, cart("c-1"), "gift".into())
                    .await
                    .unwrap(),
            );
        }
        assert_eq!(SEQUENTIAL_RUNS.load(SeqCst), 1);
        assert!(results.iter().all(|r| r == &results[0]));
    })
    .await;
}

static CONCURRENT_RUNS: AtomicUsize = AtomicUsize::new(0);

/// Charge slowly, so that duplicates arrive while the first call runs.
#[mutating_tool(idempotency_key_fields = [user_id, cart.id])]
pub async fn concurrent_order(user_id: u64, cart: Cart) -> Result<Order, ShopError> {
    let n = CONCURRENT_RUNS.fetch_add(1, SeqCst);
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok(Order {
        order_no: n,
        user_id,
        cart_id: cart.id,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_concurrent_calls_run_the_body_once() {
    let store = Arc::new(MemoryStore::new());
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let store = Arc::clone(&store);
            tokio::spawn(with_store(store, concurrent_order(1, cart("c-64"))))
        })
        .collect();
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap().unwrap());
    }
    assert_eq!(CONCURRENT_RUNS.load(SeqCst), 1);
    assert_eq!(results.len(), 64);
    assert!(results.iter().all(|r| r == &results[0]));
}

static DISTINCT_RUNS: AtomicUsize = AtomicUsize::new(0);

/// One run per intent.
#[mutating_tool(idempotency_key_fields = [user_id])]
pub async fn distinct_order(user_id: u64) -> Result<u64, ShopError> {
    DISTINCT_RUNS.fetch_add(1, SeqCst);
    Ok(user_id * 2)
}

#[tokio::test]
async fn thousand_distinct_intents_run_the_body_a_thousand_times() {
    with_store(MemoryStore::new(), async {
        for user in 0..1000u64 {
            assert_eq!(distinct_order(user).await.unwrap(), user * 2);
        }
        for user in 0..1000u64 {
            assert_eq!(distinct_order(user).await.unwrap(), user * 2);
        }
    })
    .await;
    assert_eq!(DISTINCT_RUNS.load(SeqCst), 1000);
}

static FLAKY_RUNS: AtomicUsize = AtomicUsize::new(0);

/// Fails twice, then succeeds.
#[mutating_tool(idempotency_key_fields = [user_id])]
pub async fn flaky_charge(user_id: u64) -> Result<String, ShopError> {
    let n = FLAKY_RUNS.fetch_add(1, SeqCst);
    if n < 2 {
        return Err(ShopError::Declined);
    }
    Ok(format!("charged {user_id} on attempt {n}"))
}

#[tokio::test]
async fn an_error_releases_the_key_so_a_retry_runs_then_success_is_replayed() {
    with_store(MemoryStore::new(), async {
        assert!(matches!(flaky_charge(1).await, Err(ShopError::Declined)));
        assert!(matches!(flaky_charge(1).await, Err(ShopError::Declined)));
        let ok = flaky_charge(1).await.unwrap();
        assert_eq!(ok, "charged 1 on attempt 2");
        assert_eq!(flaky_charge(1).await.unwrap(), ok);
        assert_eq!(flaky_charge(1).await.unwrap(), ok);
    })
    .await;
    assert_eq!(FLAKY_RUNS.load(SeqCst), 3);
}

static REUSED_RUNS: AtomicUsize = AtomicUsize::new(0);

/// Note is not part of the key.
#[mutating_tool(idempotency_key_fields = [user_id, cart.id])]
pub async fn reused_order(user_id: u64, cart: Cart, note: String) -> Result<String, ShopError> {
    REUSED_RUNS.fetch_add(1, SeqCst);
    Ok(format!("{user_id}/{}/{note}", cart.id))
}

#[tokio::test]
async fn a_key_reused_with_another_argument_is_rejected_naming_it() {
    with_store(MemoryStore::new(), async {
        reused_order(1, cart("c"), "first".into()).await.unwrap();
        let err = reused_order(1, cart("c"), "second".into())
            .await
            .unwrap_err()
            .contract();
        match &err {
            Error::KeyReused { params, tool, .. } => {
                assert_eq!(params, &vec!["note".to_owned()]);
                assert_eq!(tool, "reused_order");
            }
            other => panic!("expected KeyReused, got {other:?}"),
        }
        assert!(err.to_string().contains("`note`"), "{err}");
        // The whole cart is an argument too: other items under the same cart id differ.
        let mut other_items = cart("c");
        other_items.items.push("pen".into());
        let err = reused_order(1, other_items, "first".into())
            .await
            .unwrap_err()
            .contract();
        // The deepest differing path is named: the items, not the whole cart.
        assert!(
            matches!(err, Error::KeyReused { ref params, .. } if params == &["cart.items"]),
            "{err}"
        );
    })
    .await;
    assert_eq!(REUSED_RUNS.load(SeqCst), 1);
}

static SLOW_REUSED_RUNS: AtomicUsize = AtomicUsize::new(0);

/// Like `reused_order`, slow enough for a second call to arrive while it runs.
#[mutating_tool(idempotency_key_fields = [user_id], concurrent = "reject")]
pub async fn slow_reused_order(user_id: u64, note: String) -> Result<String, ShopError> {
    SLOW_REUSED_RUNS.fetch_add(1, SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(format!("{user_id}/{note}"))
}

// The store runs on tokio's clock: a paused clock orders the two calls exactly.
#[tokio::test(start_paused = true)]
async fn a_key_reused_while_the_first_call_runs_is_rejected_naming_the_parameter() {
    // The store answers an in-progress claim with the holder's fingerprint only; the
    // engine must still name the differing parameter, not give a vague answer.
    with_store(MemoryStore::new(), async {
        let (first, second) = tokio::join!(slow_reused_order(5, "a".into()), async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            slow_reused_order(5, "b".into()).await
        });
        assert_eq!(first.unwrap(), "5/a");
        let err = second.unwrap_err().contract();
        assert!(
            matches!(err, Error::KeyReused { ref params, .. } if params == &["note"]),
            "{err}"
        );
    })
    .await;
    assert_eq!(SLOW_REUSED_RUNS.load(SeqCst), 1);
}

static SHARED_RUNS: AtomicUsize = AtomicUsize::new(0);
static SEEN_KEY: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// Direct and registry calls share one key.
#[mutating_tool(idempotency_key_fields = [user_id, cart.id], version = 2)]
pub async fn shared_order(user_id: u64, cart: Cart, note: String) -> Result<Order, ShopError> {
    let _ = note;
    *SEEN_KEY.lock().unwrap() = tool_contracts::current_key();
    let n = SHARED_RUNS.fetch_add(1, SeqCst);
    Ok(Order {
        order_no: n,
        user_id,
        cart_id: cart.id,
    })
}

#[tokio::test]
async fn a_registry_call_and_a_direct_call_of_one_intent_run_the_body_once() {
    with_store(MemoryStore::new(), async {
        let direct = shared_order(5, cart("c-5"), "n".into()).await.unwrap();
        let args = json!({"user_id": 5, "cart": {"id": "c-5", "items": ["book"]}, "note": "n"});
        let out = registry().call("shared_order", args.clone()).await.unwrap();
        assert_eq!(out.outcome, tool_contracts::Outcome::Replayed);
        assert_eq!(out.value, serde_json::to_value(&direct).unwrap());
        let key = stores::key_of("shared_order", &args);
        assert_eq!(out.key.as_deref(), Some(key.as_str()));
        assert_eq!(SEEN_KEY.lock().unwrap().as_deref(), Some(key.as_str()));
    })
    .await;
    assert_eq!(SHARED_RUNS.load(SeqCst), 1);
}

static TEXT_RUNS: AtomicUsize = AtomicUsize::new(0);

/// Called through the registry, whose replays are decided before any future is made
/// (`__private::replay_now`).
#[mutating_tool(idempotency_key_fields = [user_id, cart.id])]
pub async fn text_order(user_id: u64, cart: Cart) -> Result<Order, ShopError> {
    let n = TEXT_RUNS.fetch_add(1, SeqCst);
    Ok(Order {
        order_no: n,
        user_id,
        cart_id: cart.id,
    })
}

/// Calls `text_order` for another user from its body: the inner call makes its own key.
#[mutating_tool(idempotency_key_fields = [user_id])]
pub async fn text_order_for_two(user_id: u64, other: u64) -> Result<String, ShopError> {
    let inner = text_order(other, cart("c-two")).await?;
    Ok(format!("{user_id}+{}", inner.user_id))
}

/// A `MemoryStore` counting how often a call asks its memory (`completed_now`) and claims.
#[derive(Default)]
struct Asking {
    store: MemoryStore,
    asked: AtomicUsize,
    claims: AtomicUsize,
}

#[async_trait::async_trait]
impl stores::Delegate for Asking {
    fn inner(&self) -> &dyn tool_contracts::store::Store {
        &self.store
    }
    fn completed_now(
        &self,
        key: &str,
        scope: Option<&str>,
    ) -> Option<Arc<tool_contracts::store::Record>> {
        use tool_contracts::store::Store as _;
        self.asked.fetch_add(1, SeqCst);
        self.store.completed_now(key, scope)
    }
    async fn claim(
        &self,
        req: tool_contracts::store::ClaimRequest<'_>,
    ) -> tool_contracts::store::StoreResult<tool_contracts::store::ClaimOutcome> {
        use tool_contracts::store::Store as _;
        self.claims.fetch_add(1, SeqCst);
        self.store.claim(req).await
    }
}

#[tokio::test]
async fn a_registry_call_given_text_asks_the_store_once_and_replays_as_a_value_call_does() {
    let store = Arc::new(stores::Wrapped(Asking::default()));
    with_store(Arc::clone(&store), async {
        let text = r#"{"user_id":3,"cart":{"id":"c-3","items":["book"]}}"#;
        let args: serde_json::Value = serde_json::from_str(text).unwrap();
        let key = stores::key_of("text_order", &args);

        // A first call asks the store's memory once (the registry's entry point asks, the
        // claim takes its answer), claims once, runs once.
        let first = registry().call_json("text_order", text).await.unwrap();
        assert_eq!(first.outcome, tool_contracts::Outcome::Executed);
        assert_eq!(first.key.as_deref(), Some(key.as_str()));
        assert_eq!(
            store.asked.load(SeqCst),
            1,
            "a first call asks the memory once"
        );
        assert_eq!(store.claims.load(SeqCst), 1);

        // Its retry is answered from memory: the stored text, the key, no claim.
        let replay = registry().call_json("text_order", text).await.unwrap();
        assert_eq!(replay.outcome, tool_contracts::Outcome::Replayed);
        assert_eq!(replay.key.as_deref(), Some(key.as_str()));
        assert_eq!(replay.value, first.value);
        assert_eq!(store.asked.load(SeqCst), 2);
        assert_eq!(store.claims.load(SeqCst), 1);

        // The same as the `Value` form gets (decoded from a `Value`, encoded as one).
        let value = registry().call("text_order", args).await.unwrap();
        assert_eq!(value.outcome, tool_contracts::Outcome::Replayed);
        assert_eq!(value.key, replay.key);
        assert_eq!(
            value.value,
            serde_json::from_str::<serde_json::Value>(&replay.value).unwrap()
        );

        // A call the registry's entry point refuses (an empty key field) is refused as the
        // `Value` form refuses it: nothing asked, claimed or run.
        let empty = r#"{"user_id":3,"cart":{"id":"","items":[]}}"#;
        let from_text = registry().call_json("text_order", empty).await.unwrap_err();
        let from_value = registry()
            .call("text_order", serde_json::from_str(empty).unwrap())
            .await
            .unwrap_err();
        assert!(
            matches!(from_text, Error::InvalidArguments { .. }),
            "{from_text}"
        );
        assert_eq!(from_text.to_string(), from_value.to_string());
        assert_eq!(store.asked.load(SeqCst), 3);
        assert_eq!(store.claims.load(SeqCst), 1);

        // A tool calling a tool: each call has the key of its own arguments.
        let outer_args = json!({"user_id": 8, "other": 9});
        let outer = registry()
            .call_json("text_order_for_two", &outer_args.to_string())
            .await
            .unwrap();
        assert_eq!(outer.value, "\"8+9\"");
        assert_eq!(
            outer.key.as_deref(),
            Some(stores::key_of("text_order_for_two", &outer_args).as_str())
        );
        let inner_key = stores::key_of(
            "text_order",
            &json!({"user_id": 9, "cart": {"id": "c-two", "items": ["book"]}}),
        );
        let inner = tool_contracts::operation(&inner_key).await.unwrap();
        assert!(inner.is_some(), "the inner call ran under its own key");
    })
    .await;
    assert_eq!(TEXT_RUNS.load(SeqCst), 2);
}

static INVALID_RUNS: AtomicUsize = AtomicUsize::new(0);

/// Never reached by invalid arguments.
#[mutating_tool(idempotency_key_fields = [user_id])]
pub async fn invalid_order(user_id: u64, cart: Cart) -> Result<String, ShopError> {
    INVALID_RUNS.fetch_add(1, SeqCst);
    Ok(format!("{user_id}{}", cart.id))
}

#[tokio::test]
async fn invalid_json_arguments_run_nothing_and_claim_nothing() {
    let store = Arc::new(MemoryStore::new());
    with_store(Arc::clone(&store), async {
        let cases = [
            (
                json!({"user_id": "seven", "cart": {"id": "c", "items": []}}),
                Some("user_id"),
            ),
            (json!({"cart": {"id": "c", "items": []}}), None),
            (
                json!({"user_id": 1, "cart": {"id": 5, "items": []}}),
                Some("cart.id"),
            ),
            (
                json!({"user_id": 1, "cart": {"id": "c", "items": []}, "extra": 1}),
                None,
            ),
            (json!([1, 2]), None),
            (
                json!({"user_id": -1, "cart": {"id": "c", "items": []}}),
                Some("user_id"),
            ),
        ];
        for (args, field) in cases {
            let err = registry()
                .call("invalid_order", args.clone())
                .await
                .unwrap_err();
            match &err {
                Error::InvalidArguments { field: f, tool, .. } => {
                    assert_eq!(tool, "invalid_order");
                    if let Some(field) = field {
                        assert_eq!(f.as_deref(), Some(field), "{args}: {err}");
                    }
                }
                other => panic!("{args}: expected InvalidArguments, got {other:?}"),
            }
        }
        let err = registry()
            .call("no_such_tool", json!({}))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::UnknownTool { .. }), "{err}");
        let err = registry()
            .call("invalid_ordr", json!({}))
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("did you mean `invalid_order`"),
            "{err}"
        );
    })
    .await;
    assert_eq!(INVALID_RUNS.load(SeqCst), 0);
    assert!(store.is_empty(), "nothing may be claimed: {store:?}");
}

static EMPTY_RUNS: AtomicUsize = AtomicUsize::new(0);

/// Keys on an optional string and a list.
#[mutating_tool(idempotency_key_fields = [account, tags])]
pub async fn empty_intent(account: Option<String>, tags: Vec<String>) -> Result<(), ShopError> {
    let _ = (account, tags);
    EMPTY_RUNS.fetch_add(1, SeqCst);
    Ok(())
}

#[tokio::test]
async fn a_null_or_empty_key_field_is_rejected_so_calls_never_collapse_onto_one_key() {
    let store = Arc::new(MemoryStore::new());
    with_store(Arc::clone(&store), async {
        for (account, tags) in [
            (None, vec!["a".to_owned()]),
            (Some(String::new()), vec!["a".to_owned()]),
            (Some("acct".to_owned()), vec![]),
        ] {
            let err = empty_intent(account, tags).await.unwrap_err().contract();
            assert!(
                matches!(err, Error::InvalidArguments { field: Some(_), .. }),
                "{err}"
            );
        }
    })
    .await;
    assert_eq!(EMPTY_RUNS.load(SeqCst), 0);
    assert!(store.is_empty());
}

macro_rules! falsy_tool {
    ($name:ident, $ty:ty, $value:expr) => {
        /// Returns a falsy value.
        #[mutating_tool(idempotency_key_fields = [id])]
        pub async fn $name(id: u64) -> Result<$ty, ShopError> {
            let _ = id;
            Ok($value)
        }
    };
}
falsy_tool!(falsy_zero, u32, 0);
falsy_tool!(falsy_false, bool, false);
falsy_tool!(falsy_empty_string, String, String::new());
falsy_tool!(falsy_none, Option<u32>, None);
falsy_tool!(falsy_unit, (), ());
falsy_tool!(falsy_empty_vec, Vec<u8>, Vec::new());
falsy_tool!(falsy_some_zero, Option<u32>, Some(0));

#[tokio::test]
async fn falsy_results_replay_as_themselves_not_as_null_or_a_default() {
    with_store(MemoryStore::new(), async {
        for _ in 0..2 {
            assert_eq!(falsy_zero(1).await.unwrap(), 0);
            assert!(!falsy_false(1).await.unwrap());
            assert_eq!(falsy_empty_string(1).await.unwrap(), "");
            assert_eq!(falsy_none(1).await.unwrap(), None);
            falsy_unit(1).await.unwrap();
            assert_eq!(falsy_empty_vec(1).await.unwrap(), Vec::<u8>::new());
            assert_eq!(falsy_some_zero(1).await.unwrap(), Some(0));
        }
        let out = registry()
            .call("falsy_false", json!({"id": 1}))
            .await
            .unwrap();
        assert_eq!(out.outcome, tool_contracts::Outcome::Replayed);
        assert_eq!(out.value, json!(false));
        let out = registry()
            .call("falsy_empty_string", json!({"id": 1}))
            .await
            .unwrap();
        assert_eq!(out.value, json!(""));
    })
    .await;
}

static REJECT_RUNS: AtomicUsize = AtomicUsize::new(0);

/// Duplicates are rejected while running.
#[mutating_tool(idempotency_key_fields = [id], concurrent = "reject")]
pub async fn rejecting_tool(id: u64) -> Result<u64, ShopError> {
    REJECT_RUNS.fetch_add(1, SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(id)
}

// The store runs on tokio's clock: a paused clock orders the two calls exactly.
#[tokio::test(start_paused = true)]
async fn a_duplicate_under_concurrent_reject_gets_in_progress() {
    with_store(MemoryStore::new(), async {
        let (first, second) = tokio::join!(rejecting_tool(3), async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            rejecting_tool(3).await
        });
        assert_eq!(first.unwrap(), 3);
        let err = second.unwrap_err().contract();
        assert!(matches!(err, Error::InProgress { .. }), "{err}");
        assert_eq!(rejecting_tool(3).await.unwrap(), 3);
    })
    .await;
    assert_eq!(REJECT_RUNS.load(SeqCst), 1);
}

static ABANDONED_RUNS: AtomicUsize = AtomicUsize::new(0);

/// Hangs forever after its effect: the caller gives up.
#[mutating_tool(idempotency_key_fields = [id], lease = "1s")]
pub async fn hanging_transfer(id: u64) -> Result<u64, ShopError> {
    ABANDONED_RUNS.fetch_add(1, SeqCst);
    std::future::pending::<()>().await;
    Ok(id)
}

#[tokio::test(start_paused = true)]
async fn a_call_dropped_mid_body_leaves_an_unknown_outcome_not_a_second_effect() {
    with_store(MemoryStore::new(), async {
        // Within the lease a duplicate waits; after it, the claim counts as abandoned.
        abandon_first_call(hanging_transfer(9)).await;
        let err = hanging_transfer(9).await.unwrap_err().contract();
        assert!(matches!(err, Error::OutcomeUnknown { .. }), "{err}");
        assert!(err.to_string().contains("hanging_transfer"));
    })
    .await;
    assert_eq!(ABANDONED_RUNS.load(SeqCst), 1);
}

static RERUN_RUNS: AtomicUsize = AtomicUsize::new(0);

/// At-least-once tool: an abandoned call is run again.
#[mutating_tool(idempotency_key_fields = [id], lease = "1s", on_unknown = "rerun")]
pub async fn rerun_tool(id: u64) -> Result<u64, ShopError> {
    let n = RERUN_RUNS.fetch_add(1, SeqCst);
    if n == 0 {
        std::future::pending::<()>().await;
    }
    Ok(id)
}

#[tokio::test(start_paused = true)]
async fn on_unknown_rerun_takes_an_abandoned_claim_over() {
    with_store(MemoryStore::new(), async {
        abandon_first_call(rerun_tool(4)).await;
        assert_eq!(rerun_tool(4).await.unwrap(), 4);
        assert_eq!(rerun_tool(4).await.unwrap(), 4);
    })
    .await;
    assert_eq!(RERUN_RUNS.load(SeqCst), 2);
}

static LONG_RUNS: AtomicUsize = AtomicUsize::new(0);

/// Runs for ten leases: the heartbeat must keep the claim alive.
#[mutating_tool(idempotency_key_fields = [id], lease = "1s")]
pub async fn long_tool(id: u64) -> Result<u64, ShopError> {
    LONG_RUNS.fetch_add(1, SeqCst);
    tokio::time::sleep(Duration::from_secs(10)).await;
    Ok(id + 1)
}

#[tokio::test(start_paused = true)]
async fn a_body_longer_than_its_lease_is_not_taken_for_dead() {
    with_store(MemoryStore::new(), async {
        let (a, b) = tokio::join!(long_tool(1), async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            long_tool(1).await
        });
        assert_eq!(a.unwrap(), 2);
        assert_eq!(b.unwrap(), 2, "the duplicate waited for the result");
    })
    .await;
    assert_eq!(LONG_RUNS.load(SeqCst), 1);
}

static PANIC_RUNS: AtomicUsize = AtomicUsize::new(0);

/// Panics after its effect.
#[mutating_tool(idempotency_key_fields = [id], lease = "1s")]
pub async fn panicking_tool(id: u64) -> Result<u64, ShopError> {
    PANIC_RUNS.fetch_add(1, SeqCst);
    if id > 0 {
        panic!("boom after the effect");
    }
    Ok(id)
}

#[tokio::test(start_paused = true)]
async fn a_panicking_body_leaves_an_unknown_outcome() {
    let store = Arc::new(MemoryStore::new());
    let task = tokio::spawn(with_store(Arc::clone(&store), panicking_tool(1)));
    assert!(task.await.is_err(), "the body panicked");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let err = with_store(store, panicking_tool(1))
        .await
        .unwrap_err()
        .contract();
    assert!(matches!(err, Error::OutcomeUnknown { .. }), "{err}");
    assert_eq!(PANIC_RUNS.load(SeqCst), 1);
}

static SCOPED_RUNS: AtomicUsize = AtomicUsize::new(0);

/// Scoped per tenant.
#[mutating_tool(idempotency_key_fields = [id])]
pub async fn scoped_tool(id: u64) -> Result<String, ShopError> {
    let n = SCOPED_RUNS.fetch_add(1, SeqCst);
    Ok(format!("{id}-{n}"))
}

#[tokio::test]
async fn scopes_isolate_tenants() {
    with_store(MemoryStore::new(), async {
        let a = with_scope("tenant-a", scoped_tool(1)).await.unwrap();
        let b = with_scope("tenant-b", scoped_tool(1)).await.unwrap();
        let unscoped = scoped_tool(1).await.unwrap();
        assert_ne!(a, b);
        assert_ne!(a, unscoped);
        assert_eq!(with_scope("tenant-a", scoped_tool(1)).await.unwrap(), a);
        // Nesting composes: ("a", "b") is not the scope "a\u{1f}b" typed by a user, which is invalid.
        let nested = with_scope("tenant-a", with_scope("run-1", scoped_tool(1)))
            .await
            .unwrap();
        assert_ne!(nested, a);
        let bad = with_scope("tenant\u{1f}a", scoped_tool(1))
            .await
            .unwrap_err()
            .contract();
        assert!(matches!(bad, Error::InvalidArguments { .. }), "{bad}");
        let key_a = with_scope("tenant-a", async {
            stores::key_of("scoped_tool", &json!({"id": 1}))
        })
        .await;
        let key_b = with_scope("tenant-b", async {
            stores::key_of("scoped_tool", &json!({"id": 1}))
        })
        .await;
        assert_ne!(key_a, key_b);
    })
    .await;
    assert_eq!(SCOPED_RUNS.load(SeqCst), 4);
}

#[derive(Debug, PartialEq, thiserror::Error, Serialize, Deserialize)]
pub enum CachedError {
    #[error("contract: {0}")]
    Contract(String),
    #[error("card declined: {0}")]
    Declined(String),
}

impl From<Error> for CachedError {
    fn from(e: Error) -> Self {
        CachedError::Contract(e.to_string())
    }
}

static CACHED_ERR_RUNS: AtomicUsize = AtomicUsize::new(0);

/// A declined card stays declined for this intent.
#[mutating_tool(idempotency_key_fields = [card], cache_errors = true)]
pub async fn cached_decline(card: String) -> Result<u64, CachedError> {
    CACHED_ERR_RUNS.fetch_add(1, SeqCst);
    Err(CachedError::Declined(card))
}

#[tokio::test]
async fn cache_errors_replays_the_stored_error() {
    with_store(MemoryStore::new(), async {
        for _ in 0..3 {
            assert_eq!(
                cached_decline("4242".into()).await,
                Err(CachedError::Declined("4242".into()))
            );
        }
    })
    .await;
    assert_eq!(CACHED_ERR_RUNS.load(SeqCst), 1);
}

/// Result type changed since the record was stored.
#[mutating_tool(idempotency_key_fields = [id])]
pub async fn retyped_tool(id: u64) -> Result<Order, ShopError> {
    Ok(Order {
        order_no: 0,
        user_id: id,
        cart_id: String::new(),
    })
}

#[tokio::test]
async fn a_stored_result_that_no_longer_decodes_is_a_codec_error_naming_the_remedy() {
    // An older version of the tool stored a string under the same key (and the fingerprint
    // a genuine call with these arguments stores).
    let (store, key) = stores::store_with_an_older_result(
        "retyped_tool",
        &json!({"id": 1}),
        "\"an old string result\"",
    )
    .await;
    let err = with_store(store, retyped_tool(1))
        .await
        .unwrap_err()
        .contract();
    match &err {
        Error::Codec {
            tool,
            key: k,
            message,
        } => {
            assert_eq!(tool, "retyped_tool");
            assert_eq!(k.as_ref(), Some(&key));
            assert!(message.contains("version"), "{message}");
        }
        other => panic!("expected Codec, got {other:?}"),
    }
}

static CLONED_DECODES: AtomicUsize = AtomicUsize::new(0);
static OPAQUE_DECODES: AtomicUsize = AtomicUsize::new(0);

/// A result that counts its decodes in `COUNTER` (a replay decodes the stored JSON).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Receipt<const COUNTER: u8> {
    pub user_id: u64,
    pub lines: Vec<String>,
}

impl<'de, const COUNTER: u8> Deserialize<'de> for Receipt<COUNTER> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Plain {
            user_id: u64,
            lines: Vec<String>,
        }
        let counter = if COUNTER == 0 {
            &CLONED_DECODES
        } else {
            &OPAQUE_DECODES
        };
        counter.fetch_add(1, SeqCst);
        let Plain { user_id, lines } = Plain::deserialize(d)?;
        Ok(Receipt { user_id, lines })
    }
}

/// The same result without `Clone`.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct OpaqueReceipt(Receipt<1>);

/// A tool whose result is `Clone`: a hot key's replays may clone a kept copy.
#[mutating_tool(idempotency_key_fields = [user_id])]
pub async fn cloned_receipt(user_id: u64) -> Result<Receipt<0>, ShopError> {
    Ok(Receipt {
        user_id,
        lines: vec!["a".into(), "b".into()],
    })
}

/// The same tool with a result that is not `Clone`: every replay decodes.
#[mutating_tool(idempotency_key_fields = [user_id])]
pub async fn opaque_receipt(user_id: u64) -> Result<OpaqueReceipt, ShopError> {
    Ok(OpaqueReceipt(Receipt {
        user_id,
        lines: vec!["a".into()],
    }))
}

#[tokio::test]
async fn a_hot_keys_replays_clone_the_decoded_result_and_equal_a_decode() {
    with_store(MemoryStore::new(), async {
        let first = cloned_receipt(1).await.unwrap();
        assert_eq!(
            CLONED_DECODES.load(SeqCst),
            0,
            "a first call decodes nothing"
        );
        for _ in 0..10 {
            assert_eq!(cloned_receipt(1).await.unwrap(), first);
        }
        // Decoded on its first two replays, cloned from this thread's copy after that.
        assert_eq!(CLONED_DECODES.load(SeqCst), 2);
        // Another key of the same tool: its own result, decoded (and no other's copy).
        let other = cloned_receipt(2).await.unwrap();
        assert_eq!(cloned_receipt(2).await.unwrap(), other);
        assert_eq!(other.user_id, 2);
        assert_eq!(CLONED_DECODES.load(SeqCst), 3);
        // The kept copy is of key 1's text: key 1 still replays its own.
        assert_eq!(cloned_receipt(1).await.unwrap(), first);
        // A result type that is not `Clone` compiles, and decodes on every replay.
        let opaque = opaque_receipt(1).await.unwrap();
        for _ in 0..5 {
            assert_eq!(opaque_receipt(1).await.unwrap(), opaque);
        }
        assert_eq!(OPAQUE_DECODES.load(SeqCst), 5);
    })
    .await;
}

/// Lists orders: read-only.
#[read_only_tool]
pub async fn list_orders(user_id: u64) -> Result<Vec<u64>, ShopError> {
    Ok(vec![user_id])
}

#[tokio::test]
async fn the_registry_holds_exactly_the_declared_tools_in_name_order() {
    let names: Vec<&str> = registry().iter().map(|t| t.name()).collect();
    let mut expected = vec![
        "cached_decline",
        "cloned_receipt",
        "concurrent_order",
        "distinct_order",
        "empty_intent",
        "falsy_empty_string",
        "falsy_empty_vec",
        "falsy_false",
        "falsy_none",
        "falsy_some_zero",
        "falsy_unit",
        "falsy_zero",
        "flaky_charge",
        "hanging_transfer",
        "invalid_order",
        "list_orders",
        "long_tool",
        "opaque_receipt",
        "panicking_tool",
        "patient_tool",
        "rejecting_tool",
        "rerun_tool",
        "retyped_tool",
        "reused_order",
        "scoped_tool",
        "sequential_order",
        "shared_order",
        "slow_reused_order",
        "text_order",
        "text_order_for_two",
    ];
    expected.sort();
    assert_eq!(names, expected);
    let list = registry().to_json();
    let tools = list["tools"].as_array().unwrap();
    assert_eq!(tools.len(), expected.len());
    let shared = tools.iter().find(|t| t["name"] == "shared_order").unwrap();
    assert_eq!(
        shared["description"],
        "Direct and registry calls share one key."
    );
    assert_eq!(shared["inputSchema"]["type"], "object");
    assert_eq!(shared["annotations"]["idempotentHint"], true);
    assert_eq!(shared["annotations"]["readOnlyHint"], false);
    let meta = &shared["_meta"]["dev.tool-contracts/idempotency"];
    assert_eq!(meta["keyFields"], json!(["cart.id", "user_id"]));
    assert_eq!(meta["version"], 2);
    let list_orders = tools.iter().find(|t| t["name"] == "list_orders").unwrap();
    assert_eq!(list_orders["annotations"]["readOnlyHint"], true);
    let out = registry()
        .call("list_orders", json!({"user_id": 3}))
        .await
        .unwrap();
    assert_eq!(out.value, json!([3]));
    assert_ne!(out.outcome, tool_contracts::Outcome::Replayed);
}

static PATIENT_RUNS: AtomicUsize = AtomicUsize::new(0);
static PATIENT_GATE: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// A long call: its duplicates wait at most `max_wait`, whatever the lease.
#[mutating_tool(idempotency_key_fields = [id], lease = "1h", max_wait = "2s")]
pub async fn patient_tool(id: u64) -> Result<u64, ShopError> {
    PATIENT_RUNS.fetch_add(1, SeqCst);
    PATIENT_GATE.notified().await;
    Ok(id)
}

#[tokio::test(start_paused = true)]
async fn a_waiting_duplicate_gives_up_after_max_wait_with_in_progress() {
    with_store(MemoryStore::new(), async {
        let first = patient_tool(5);
        tokio::pin!(first);
        let duplicate = async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let started = tokio::time::Instant::now();
            let result = patient_tool(5).await;
            (result, started.elapsed())
        };
        let (duplicate, waited) = tokio::select! {
            biased;
            _ = &mut first => unreachable!("the first call is gated"),
            done = duplicate => done,
        };
        match duplicate.map_err(ShopError::contract) {
            Err(Error::InProgress { tool, .. }) => assert_eq!(tool, "patient_tool"),
            other => panic!("expected InProgress after max_wait, got {other:?}"),
        }
        assert_eq!(waited, Duration::from_secs(2), "waited exactly max_wait");
        assert_eq!(
            PATIENT_RUNS.load(SeqCst),
            1,
            "the duplicate never ran the body"
        );
        // The first call still finishes, and a later duplicate replays it.
        PATIENT_GATE.notify_one();
        assert_eq!(first.await.unwrap(), 5);
        assert_eq!(patient_tool(5).await.unwrap(), 5);
        assert_eq!(PATIENT_RUNS.load(SeqCst), 1);
    })
    .await;
}
