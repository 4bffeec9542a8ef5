//! Regression tests for defects that broke "nothing runs twice" (reliability round 2).
//! Each was written against the commit that had the defect and seen failing there; the
//! name says the failure it prevents. (Tools sharing a name live in
//! `tests/duplicate_names.rs`: a duplicate name makes this binary's `registry()` refuse.)

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{json, Value};
use tool_contracts::{
    current_key, mutating_tool, registry, set_max_argument_bytes, with_store, Error, MemoryStore,
};

#[derive(Debug, thiserror::Error)]
pub enum RefError {
    #[error(transparent)]
    Contract(#[from] Error),
}

impl RefError {
    fn contract(self) -> Error {
        match self {
            RefError::Contract(e) => e,
        }
    }
}

// Defect 1: integers beyond 64 bits reach the key as f64s, so distinct intents collided.

static BIG_RUNS: AtomicUsize = AtomicUsize::new(0);

/// Books an order by its external reference, whatever JSON shape it has.
#[mutating_tool(idempotency_key_fields = [order_ref])]
pub async fn book_by_ref(order_ref: Value) -> Result<usize, RefError> {
    let _ = order_ref;
    Ok(BIG_RUNS.fetch_add(1, SeqCst))
}

#[tokio::test]
async fn integers_beyond_64_bits_never_share_a_key_with_a_neighbour() {
    with_store(MemoryStore::new(), async {
        let first = registry()
            .call(
                "book_by_ref",
                json!({"order_ref": 18446744073709551615_u64}),
            )
            .await
            .expect("u64::MAX is an exact integer and keys as its digits");
        // Beyond u64, serde_json has already rounded to an f64: 2^64 and 2^64 + 1 are one
        // number by then. Two intents must never share a key: the call is refused,
        // naming the field and the remedy.
        for text in [
            "18446744073709551616",
            "18446744073709551617",
            "1e21",
            "-9.3e18",
        ] {
            let args: Value = serde_json::from_str(&format!("{{\"order_ref\":{text}}}")).unwrap();
            let err = registry()
                .call("book_by_ref", args)
                .await
                .expect_err("an inexact number in a key field is refused");
            match &err {
                Error::InvalidArguments { field, message, .. } => {
                    assert_eq!(field.as_deref(), Some("order_ref"), "{err}");
                    assert!(message.contains("as a string"), "{err}");
                }
                other => panic!("{text}: expected InvalidArguments, got {other:?}"),
            }
        }
        // Nested in a key field, too.
        let nested: Value =
            serde_json::from_str(r#"{"order_ref":{"ids":[1, 18446744073709551616]}}"#).unwrap();
        assert!(matches!(
            registry().call("book_by_ref", nested).await,
            Err(Error::InvalidArguments { .. })
        ));
        assert_eq!(first.value, json!(0));
        assert_eq!(BIG_RUNS.load(SeqCst), 1, "nothing ran for a refused call");
        // Ordinary floats below 2^53 and exact integers still key as before.
        let small = registry()
            .call("book_by_ref", json!({"order_ref": 19.99}))
            .await
            .unwrap();
        assert!(small.key.is_some_and(|k| k.len() == 64));
    })
    .await;
}

#[test]
fn a_secret_digest_refuses_inexact_numbers_too() {
    let a: Value = serde_json::from_str("18446744073709551616").unwrap();
    let b: Value = serde_json::from_str("18446744073709551617").unwrap();
    let da = serde_json::to_value(tool_contracts::Secret::new(a));
    let db = serde_json::to_value(tool_contracts::Secret::new(b));
    assert!(
        da.is_err() && db.is_err(),
        "two different secrets must not share one digest: {da:?} {db:?}"
    );
}

// Defect 3: the heartbeat ran inside the body's task, so a body that blocked its thread
// stopped its own renewals and a duplicate took the key over.

static BLOCKING_EFFECTS: AtomicUsize = AtomicUsize::new(0);

/// A tool whose body uses a synchronous client: it blocks its thread past the lease.
#[mutating_tool(idempotency_key_fields = [id], lease = "300ms", verify = blocking_verify)]
pub async fn blocking_charge(id: u64) -> Result<usize, RefError> {
    std::thread::sleep(Duration::from_millis(900));
    Ok(BLOCKING_EFFECTS.fetch_add(1, SeqCst) + 1)
}

pub async fn blocking_verify(id: &u64) -> Result<Option<usize>, RefError> {
    let _ = id;
    // The effect is recorded only at the end of the body: mid-body there is nothing yet.
    Ok(None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_blocks_its_thread_keeps_its_lease_on_a_multi_thread_runtime() {
    let store = std::sync::Arc::new(MemoryStore::new());
    let first = tokio::spawn(with_store(store.clone(), blocking_charge(7)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The duplicate waits for the running call; it must not find the lease expired.
    let second = with_store(store, blocking_charge(7)).await;
    let first = first.await.unwrap();
    assert_eq!(
        BLOCKING_EFFECTS.load(SeqCst),
        1,
        "one effect: the blocked body kept its lease (first {first:?}, second {second:?})"
    );
    assert_eq!(first.unwrap(), 1);
    assert_eq!(
        second.unwrap(),
        1,
        "the duplicate replayed the first result"
    );
}

// What no lease can protect: on a current-thread runtime the blocked body is the only
// thread, so nothing renews its lease. Forwarding the key downstream is the remedy.

/// The downstream system's own idempotency: effects keyed by the key it is sent.
static DOWNSTREAM: Mutex<Vec<String>> = Mutex::new(Vec::new());
static CURRENT_THREAD_RUNS: AtomicUsize = AtomicUsize::new(0);

/// A blocking body that forwards its key downstream (the remedy).
#[mutating_tool(idempotency_key_fields = [id], lease = "300ms", on_unknown = "rerun")]
pub async fn forwarded_charge(id: u64) -> Result<usize, RefError> {
    let _ = id;
    CURRENT_THREAD_RUNS.fetch_add(1, SeqCst);
    // The request goes out: the duplicate arrives meanwhile and waits for this call.
    tokio::time::sleep(Duration::from_millis(50)).await;
    // A synchronous client blocks the runtime's only thread past the lease ...
    std::thread::sleep(Duration::from_millis(900));
    // ... then the reply is awaited, and the waiting duplicate finds the lease expired.
    tokio::time::sleep(Duration::from_millis(1)).await;
    let key = current_key().expect("inside a tool body");
    let mut downstream = DOWNSTREAM.lock().unwrap();
    if !downstream.contains(&key) {
        downstream.push(key);
    }
    Ok(downstream.len())
}

#[test]
fn on_a_current_thread_runtime_a_blocked_body_loses_its_lease_and_the_forwarded_key_dedups() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(with_store(MemoryStore::new(), async {
        let first = forwarded_charge(9);
        let second = async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            forwarded_charge(9).await
        };
        let (a, b) = tokio::join!(first, second);
        // The documented limit: both bodies ran (the lease could not be renewed) ...
        assert_eq!(CURRENT_THREAD_RUNS.load(SeqCst), 2, "{a:?} {b:?}");
        // ... and the downstream system, given the same key, applied the effect once.
        assert_eq!(DOWNSTREAM.lock().unwrap().len(), 1);
    }));
}

// Defect 4: `ToolDescriptor::key` returned a key for arguments the call refuses.

static KEYED_RUNS: AtomicUsize = AtomicUsize::new(0);

/// A note attached to an order.
#[mutating_tool(idempotency_key_fields = [order_id])]
pub async fn attach_note(order_id: String, note: String, weight: f64) -> Result<usize, RefError> {
    let _ = (order_id, note, weight);
    Ok(KEYED_RUNS.fetch_add(1, SeqCst))
}

#[tokio::test]
async fn descriptor_key_refuses_what_the_call_refuses() {
    with_store(MemoryStore::new(), async {
        let tool = registry().get("attach_note").unwrap();
        // 2 MiB of note: over the default 1 MiB argument limit.
        let big = json!({"order_id": "o-1", "note": "x".repeat(2 << 20), "weight": 1.0});
        let call = registry().call("attach_note", big.clone()).await;
        assert!(matches!(call, Err(Error::InvalidArguments { .. })), "{call:?}");
        let key = tool.key(&big);
        assert!(
            matches!(key, Err(Error::InvalidArguments { ref field, .. }) if field.as_deref() == Some("note")),
            "key() must report the call's error, got {key:?}"
        );
        // A non-finite value outside the key fields (the JSON path cannot carry one; the
        // typed call can).
        let direct = attach_note("o-2".into(), "n".into(), f64::NAN).await;
        assert!(
            matches!(direct, Err(ref e) if matches!(e, RefError::Contract(Error::InvalidArguments { .. }))),
            "{direct:?}"
        );
        let _ = direct.map_err(RefError::contract);
        assert_eq!(KEYED_RUNS.load(SeqCst), 0);
        // Within the limit both agree.
        let ok = json!({"order_id": "o-3", "note": "hi", "weight": 2.5});
        let key = tool.key(&ok).unwrap().unwrap();
        assert_eq!(registry().call("attach_note", ok).await.unwrap().key, Some(key));
        set_max_argument_bytes(4 << 20);
        let raised = tool.key(&big).unwrap();
        set_max_argument_bytes(1 << 20);
        assert!(raised.is_some(), "a raised limit accepts the arguments");
    })
    .await;
}
