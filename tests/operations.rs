//! Reading operations, the GET of Post/Redirect/Get, on every backend (memory, SQLite,
//! Redis, PostgreSQL; the shared servers as `tests/support` finds them): a call's key is
//! read back as its operation, in each state a call can be in, only in the caller's scope,
//! and without changing anything.
//!
//! Every backend runs [`every_read`]: a completed call reads back `completed` with exactly
//! the replayed JSON; a call blocked in its body reads `in_progress` with a lease left; a
//! call dropped mid-body reads `unknown` once its lease ran out; a stored error reads
//! `failed`; a key read from another scope is `None` exactly like a key never used; a call
//! made under a client's key is read in the server's scope without it; `ToolDescriptor::
//! operation` finds the same operation from the arguments; reading changes neither the
//! record nor the history, and runs nothing.

#[path = "support/calls.rs"]
mod calls;
#[path = "support/cleanup.rs"]
mod cleanup;
mod support;
use calls::ToolError;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tool_contracts::store::{PostgresStore, Record, RecordState, RedisStore, SqliteStore, Store};
use tool_contracts::{
    mutating_tool, operation, operation_with_history, read_only_tool, registry, with_scope,
    with_store, MemoryStore, Operation, OperationState, Outcome, Secret,
};

// ---------------------------------------------------------------------------------------
// The tools.

/// How many times each tool body ran, by id (ids are unique per backend).
static RUNS: Mutex<BTreeMap<String, usize>> = Mutex::new(BTreeMap::new());

fn ran(id: &str) -> usize {
    let mut runs = RUNS.lock().unwrap();
    let n = runs.entry(id.to_owned()).or_insert(0);
    *n += 1;
    *n
}

fn runs(id: &str) -> usize {
    RUNS.lock().unwrap().get(id).copied().unwrap_or(0)
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Receipt {
    pub order: String,
    pub run: usize,
    pub total: f64,
    pub gift: Option<bool>,
}

/// One effect per id. The card is a `Secret` and not a key field: the store keeps its
/// digest in the record's arguments, which no read shows.
#[mutating_tool(idempotency_key_fields = [id], version = 3)]
pub async fn op_order(id: String, card: Secret<String>) -> Result<Receipt, ToolError> {
    let _ = card;
    Ok(Receipt {
        run: ran(&id),
        order: id,
        total: 12.5,
        gift: None,
    })
}

/// Holds its key until the test sends on the id's channel.
#[mutating_tool(idempotency_key_fields = [id], lease = "30s")]
pub async fn op_hold(id: String) -> Result<String, ToolError> {
    ran(&id);
    let release = HOLDS.lock().unwrap().remove(&id);
    if let Some(release) = release {
        let _ = release.await;
    }
    Ok(format!("held-{id}"))
}

static HOLDS: Mutex<BTreeMap<String, tokio::sync::oneshot::Receiver<()>>> =
    Mutex::new(BTreeMap::new());

/// Never returns: the caller drops it mid-body and its 1 s lease runs out.
#[mutating_tool(idempotency_key_fields = [id], lease = "1s")]
pub async fn op_hang(id: String) -> Result<String, ToolError> {
    ran(&id);
    std::future::pending::<()>().await;
    Ok(id)
}

/// Declines, and stores the decline: a retry replays it.
#[mutating_tool(idempotency_key_fields = [id], cache_errors = true)]
pub async fn op_decline(id: String) -> Result<String, ToolError> {
    ran(&id);
    Err(ToolError::Ledger(format!("card declined for {id}")))
}

/// Read-only: no key, so no operation.
#[read_only_tool]
pub async fn op_lookup(id: String) -> Result<String, ToolError> {
    Ok(id)
}

// ---------------------------------------------------------------------------------------
// What every backend must show.

/// A fresh id for `label` on `backend`.
fn id(backend: &str, label: &str) -> String {
    support::unique(&format!("{backend}-{label}"))
}

/// The card number a call sends (a `Secret`: never in the operation document).
const CARD: &str = "4111 1111 1111 1111";

fn order_args(id: &str) -> Value {
    json!({"id": id, "card": CARD})
}

/// The record and history of `key`, as the store holds them (for before/after checks).
async fn snapshot(store: &Arc<dyn Store>, key: &str) -> (Option<Record>, Vec<String>) {
    let record = store.lookup(key).await.unwrap();
    let history = store.history(key).await.unwrap();
    let history = history
        .iter()
        .map(|e| format!("{}|{}|{:?}|{}", e.kind.as_str(), e.token, e.at, e.worker))
        .collect();
    (record, history)
}

/// Reading changed nothing: the same history, and the same record (a live lease read
/// from the memory store is recomputed from its clock at each read, so its times may move
/// by the time between two reads: a renewal would move them by a whole lease).
fn unchanged(before: &(Option<Record>, Vec<String>), after: &(Option<Record>, Vec<String>)) {
    assert_eq!(before.1, after.1, "reading changed the history");
    let (Some(a), Some(b)) = (&before.0, &after.0) else {
        assert_eq!(before.0, after.0, "reading created or removed a record");
        return;
    };
    let near = |x: std::time::SystemTime, y: std::time::SystemTime| {
        let d = x.duration_since(y).unwrap_or_else(|e| e.duration());
        d < Duration::from_millis(50)
    };
    match (&a.state, &b.state) {
        (
            RecordState::InProgress {
                token: ta,
                lease_expires_at: la,
            },
            RecordState::InProgress {
                token: tb,
                lease_expires_at: lb,
            },
        ) => {
            assert_eq!(ta, tb, "reading took the key over");
            assert!(near(*la, *lb), "reading moved the lease: {la:?} -> {lb:?}");
            assert!(near(a.expires_at, b.expires_at));
            let strip = |r: &Record| Record {
                state: RecordState::InProgress {
                    token: 0,
                    lease_expires_at: std::time::UNIX_EPOCH,
                },
                expires_at: std::time::UNIX_EPOCH,
                ..r.clone()
            };
            assert_eq!(strip(a), strip(b));
        }
        _ => assert_eq!(a, b, "reading changed the record"),
    }
}

/// Reads `key` in the current scope, three ways, and checks they agree.
async fn read(key: &str) -> Option<Operation> {
    let first = operation(key).await.unwrap();
    let with_history = operation_with_history(key).await.unwrap();
    assert_eq!(first.is_some(), with_history.is_some());
    if let (Some(a), Some(b)) = (&first, &with_history) {
        assert_eq!(a.state, b.state);
        assert_eq!(a.key, b.key);
        assert!(a.history.is_none() && b.history.is_some());
    }
    first
}

/// The JSON document of `op`, checked for what it must never hold.
fn document(op: &Operation) -> Value {
    let doc = serde_json::to_value(op).unwrap();
    let text = doc.to_string();
    assert!(
        doc.get("args").is_none() && doc.get("scope").is_none(),
        "{doc}"
    );
    assert!(
        // The whole card number: a fragment such as "4111" may occur in a hex key by chance.
        !text.contains(CARD) && !text.contains("sha256") && !text.contains("client:"),
        "the document holds arguments or scope: {doc}"
    );
    doc
}

async fn every_read(backend: &str, store: Arc<dyn Store>) {
    let s = || Arc::clone(&store);
    completed_reads_back_exactly_the_replayed_json(backend, &store).await;
    with_store(
        s(),
        in_progress_reads_in_progress_with_a_lease_left(backend, &store),
    )
    .await;
    with_store(
        s(),
        a_call_dropped_mid_body_reads_unknown_never_success(backend, &store),
    )
    .await;
    with_store(s(), a_stored_error_reads_failed(backend, &store)).await;
    with_store(
        s(),
        another_scope_reads_nothing_exactly_like_a_key_never_used(backend),
    )
    .await;
    client_key_calls_are_read_in_the_servers_scope_without_the_key(backend, &store).await;
}

async fn completed_reads_back_exactly_the_replayed_json(backend: &str, store: &Arc<dyn Store>) {
    with_store(Arc::clone(store), async {
        let id = id(backend, "completed");
        let args = order_args(&id);
        let first = registry().call("op_order", args.clone()).await.unwrap();
        assert_eq!(first.outcome, Outcome::Executed);
        let key = first.key.clone().expect("a mutating tool's key");

        let before = snapshot(store, &key).await;
        let op = read(&key).await.expect("the completed call");
        assert_eq!(op.state, OperationState::Completed);
        assert_eq!((op.tool.as_str(), op.version), ("op_order", Some(3)));
        assert_eq!(op.key, key);
        assert_eq!(op.error, None);
        assert_eq!(op.lease_remaining, None);
        assert!(op.created_at <= op.updated_at && op.updated_at < op.expires_at);
        let receipt: Receipt = op.result_as().unwrap().expect("completed");
        assert_eq!(receipt.run, 1);

        // A retry of the POST and the GET agree, byte for byte in JSON.
        let replay = registry().call("op_order", args.clone()).await.unwrap();
        assert_eq!(replay.outcome, Outcome::Replayed);
        let read_back = op.result.as_ref().expect("a result");
        assert_eq!(read_back.to_string(), replay.value.to_string());
        assert_eq!(read_back.to_string(), first.value.to_string());
        assert_eq!(
            read_back["gift"],
            Value::Null,
            "a null member survives the read"
        );

        // The document, as every surface shows it.
        let doc = document(&op);
        assert_eq!(doc["state"], "completed");
        assert_eq!(doc["version"], 3);
        assert_eq!(doc["result"].to_string(), replay.value.to_string());
        for time in ["created_at", "updated_at", "expires_at"] {
            let text = doc[time].as_str().unwrap();
            assert!(text.ends_with('Z') && text.len() == 24, "{time}: {text}");
        }
        assert!(doc.get("lease_remaining_ms").is_none() && doc.get("error").is_none());
        let with_history = operation_with_history(&key).await.unwrap().unwrap();
        let kinds: Vec<&str> = with_history
            .history
            .as_ref()
            .unwrap()
            .iter()
            .map(|e| e.kind.as_str())
            .collect();
        assert_eq!(kinds, ["claimed", "completed"]);
        let doc = document(&with_history);
        assert_eq!(doc["history"][1]["kind"], "completed");
        assert!(doc["history"][0]["at"].as_str().unwrap().ends_with('Z'));

        // From the arguments, as a call would derive the key.
        let tool = registry().get("op_order").unwrap();
        assert_eq!(tool.operation(&args).await.unwrap(), Some(op.clone()));
        let other = order_args(&format!("{id}-never"));
        assert_eq!(tool.operation(&other).await.unwrap(), None);
        let lookup = registry().get("op_lookup").unwrap();
        assert_eq!(lookup.operation(&json!({"id": id})).await.unwrap(), None);
        assert!(
            tool.operation(&json!({"id": 7})).await.is_err(),
            "the call's own argument errors"
        );

        // Nothing ran, nothing changed (the replay above is the only other call).
        let after = snapshot(store, &key).await;
        unchanged(&before, &after);
        assert_eq!(runs(&id), 1);
    })
    .await;
}

async fn in_progress_reads_in_progress_with_a_lease_left(backend: &str, store: &Arc<dyn Store>) {
    let id = id(backend, "held");
    let (release, held) = tokio::sync::oneshot::channel();
    HOLDS.lock().unwrap().insert(id.clone(), held);
    let args = json!({ "id": id });
    let key = registry()
        .get("op_hold")
        .unwrap()
        .key(&args)
        .unwrap()
        .unwrap();
    let call = tokio::spawn(with_store(
        Arc::clone(store),
        registry().call("op_hold", args.clone()),
    ));
    // The body runs once the key is claimed.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while runs(&id) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the call never ran");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let before = snapshot(store, &key).await;
    let op = read(&key).await.expect("the running call");
    assert_eq!(op.state, OperationState::InProgress);
    let left = op.lease_remaining.expect("a live lease");
    assert!(
        left > Duration::ZERO && left <= Duration::from_secs(30),
        "{left:?}"
    );
    assert_eq!((op.result.as_ref(), op.error.as_ref()), (None, None));
    let doc = document(&op);
    assert_eq!(doc["state"], "in_progress");
    assert!(doc["lease_remaining_ms"].as_u64().unwrap() > 0, "{doc}");
    assert!(doc.get("result").is_none());
    let by_args = registry().get("op_hold").unwrap().operation(&args).await;
    assert_eq!(
        by_args.unwrap().map(|op| op.state),
        Some(OperationState::InProgress)
    );
    unchanged(&before, &snapshot(store, &key).await);

    release.send(()).unwrap();
    let out = call.await.unwrap().unwrap();
    let op = read(&key).await.expect("the finished call");
    assert_eq!(op.state, OperationState::Completed);
    assert_eq!(op.result, Some(out.value));
    assert!(op.updated_at > op.created_at);
    assert_eq!(runs(&id), 1);
}

async fn a_call_dropped_mid_body_reads_unknown_never_success(
    backend: &str,
    store: &Arc<dyn Store>,
) {
    let id = id(backend, "dropped");
    let key = calls_key("op_hang", &json!({ "id": id }));
    let first = tokio::time::timeout(Duration::from_millis(300), op_hang(id.clone())).await;
    assert!(first.is_err(), "the call was dropped mid-body");
    // Within its lease the call still counts as running; a read does not renew it.
    let op = read(&key).await.expect("the dropped call");
    assert_eq!(op.state, OperationState::InProgress);
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let before = snapshot(store, &key).await;
    let op = read(&key).await.expect("the abandoned call");
    assert_eq!(op.state, OperationState::Unknown);
    assert_eq!(op.lease_remaining, None);
    assert_eq!((op.result.as_ref(), op.error.as_ref()), (None, None));
    assert_eq!(document(&op)["state"], "unknown");
    unchanged(&before, &snapshot(store, &key).await);
    // A read took nothing over: the retry still finds an unknown outcome, nothing reran.
    let retry = op_hang(id.clone()).await.unwrap_err();
    assert!(retry.to_string().starts_with("outcome_unknown"), "{retry}");
    assert_eq!(runs(&id), 1);
}

async fn a_stored_error_reads_failed(backend: &str, store: &Arc<dyn Store>) {
    let id = id(backend, "declined");
    let key = calls_key("op_decline", &json!({ "id": id }));
    let first = op_decline(id.clone()).await.unwrap_err();
    let before = snapshot(store, &key).await;
    let op = read(&key).await.expect("the declined call");
    assert_eq!(op.state, OperationState::Failed);
    assert_eq!(op.result, None);
    // Exactly the error a replay returns.
    let replayed = op_decline(id.clone()).await.unwrap_err();
    assert_eq!(op.error, Some(serde_json::to_value(&replayed).unwrap()));
    assert_eq!(op.error, Some(serde_json::to_value(&first).unwrap()));
    let typed: ToolError = op.error_as().unwrap().expect("failed");
    assert_eq!(typed.to_string(), first.to_string());
    assert_eq!(
        document(&op)["error"],
        serde_json::to_value(&first).unwrap()
    );
    unchanged(&before, &snapshot(store, &key).await);
    assert_eq!(runs(&id), 1);
}

async fn another_scope_reads_nothing_exactly_like_a_key_never_used(backend: &str) {
    let id = id(backend, "tenant");
    let args = order_args(&id);
    let tenant_a = format!("{backend}-tenant-a");
    let tenant_b = format!("{backend}-tenant-b");
    let out = with_scope(tenant_a.clone(), registry().call("op_order", args.clone()))
        .await
        .unwrap();
    let key = out.key.unwrap();
    let never = with_scope(tenant_b.clone(), async {
        registry()
            .get("op_order")
            .unwrap()
            .key(&order_args(&format!("{id}-never")))
            .unwrap()
            .unwrap()
    })
    .await;

    let own = with_scope(tenant_a.clone(), read(&key)).await;
    assert_eq!(own.map(|op| op.state), Some(OperationState::Completed));
    // Another tenant, no tenant, a tenant nested deeper, a client inside the tenant:
    // each gets exactly what a key never used gets.
    let absent = with_scope(tenant_b.clone(), operation(&never)).await;
    assert_eq!(absent, Ok(None));
    let readers: [(&str, Vec<&str>); 4] = [
        ("another tenant", vec![tenant_b.as_str()]),
        ("no scope", vec![]),
        ("a sub-scope of the tenant", vec![tenant_a.as_str(), "team"]),
        (
            "a client inside the tenant",
            vec![tenant_a.as_str(), "client:k"],
        ),
    ];
    for (who, scopes) in readers {
        let read_in = |key: String| {
            let scopes: Vec<String> = scopes.iter().map(|s| (*s).to_owned()).collect();
            async move { in_scopes(&scopes, operation_with_history(&key)).await }
        };
        assert_eq!(read_in(key.clone()).await, Ok(None), "{who} read the key");
        assert_eq!(read_in(key.clone()).await, read_in(never.clone()).await);
    }
    // From the arguments: the key another tenant derives is another key.
    let elsewhere = with_scope(
        tenant_b,
        registry().get("op_order").unwrap().operation(&args),
    )
    .await;
    assert_eq!(elsewhere, Ok(None));
}

/// Runs `fut` inside `scopes`, outermost first.
async fn in_scopes<F: std::future::Future>(scopes: &[String], fut: F) -> F::Output {
    match scopes.split_first() {
        None => fut.await,
        Some((outer, inner)) => with_scope(outer.clone(), Box::pin(in_scopes(inner, fut))).await,
    }
}

async fn client_key_calls_are_read_in_the_servers_scope_without_the_key(
    backend: &str,
    store: &Arc<dyn Store>,
) {
    let id = id(backend, "client");
    let tenant = format!("{backend}-tenant-c");
    // As a server folds a client's key: `client:<key>` nested inside its own scope.
    let out = with_store(
        Arc::clone(store),
        with_scope(
            tenant.clone(),
            with_scope("client:k-1", registry().call("op_order", order_args(&id))),
        ),
    )
    .await
    .unwrap();
    let key = out.key.unwrap();
    let read_in = |scopes: Vec<String>| {
        let key = key.clone();
        with_store(Arc::clone(store), async move {
            in_scopes(&scopes, operation(&key)).await.unwrap()
        })
    };
    let followed = read_in(vec![tenant.clone()])
        .await
        .expect("the client's call");
    assert_eq!(followed.state, OperationState::Completed);
    assert_eq!(followed.result, Some(out.value.clone()));
    let resent = read_in(vec![tenant.clone(), "client:k-1".to_owned()]).await;
    assert_eq!(resent, Some(followed.clone()), "with the key resent, too");
    assert_eq!(read_in(vec![format!("{backend}-tenant-d")]).await, None);
    assert_eq!(read_in(vec![]).await, None);
    assert_eq!(
        read_in(vec![tenant.clone(), "client:k-2".to_owned()]).await,
        None,
        "another client of the tenant, sending its own key"
    );

    // Through the MCP server itself: its `tools/call` with `idempotencyKey`, then a read
    // in the scope the server runs in.
    {
        let server = tool_contracts::mcp::McpServer::new(registry().clone())
            .with_store(Arc::clone(store))
            .with_scope(tenant.clone());
        let args = order_args(&format!("{id}-mcp"));
        let result = server
            .call(
                "op_order",
                args.as_object().cloned(),
                Some(&json!("mcp-client-key")),
            )
            .await
            .unwrap();
        let result = serde_json::to_value(&result).unwrap();
        let call = &result["_meta"]["dev.tool-contracts/call"];
        let key = call["key"].as_str().expect("the call's key").to_owned();
        let followed = with_store(
            Arc::clone(store),
            with_scope(tenant.clone(), operation(&key)),
        )
        .await
        .unwrap()
        .expect("the MCP client's call, read in the server's scope");
        assert_eq!(followed.result.as_ref(), Some(&result["structuredContent"]));
        let foreign = with_store(
            Arc::clone(store),
            with_scope(format!("{backend}-tenant-d"), operation(&key)),
        )
        .await;
        assert_eq!(foreign, Ok(None));
    }
}

/// The key `registry()` gives the call of `tool` with `args`, in the current scope.
fn calls_key(tool: &str, args: &Value) -> String {
    registry()
        .get(tool)
        .unwrap()
        .key(args)
        .unwrap()
        .expect("a mutating tool's key")
}

// ---------------------------------------------------------------------------------------
// The backends.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_read_back_on_the_memory_store() {
    every_read("memory", Arc::new(MemoryStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_read_back_on_sqlite() {
    let (path, _cleanup) = cleanup::sqlite_file("operations");
    let store = SqliteStore::open(&path).await.unwrap();
    every_read("sqlite", Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_read_back_on_redis() {
    let Some(url) = support::url(&support::REDIS, "operations on Redis") else {
        return;
    };
    let (prefix, _cleanup) = cleanup::redis_prefix(&url, "operations");
    let store = RedisStore::builder(&url)
        .prefix(prefix)
        .connect()
        .await
        .unwrap();
    every_read("redis", Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_read_back_on_postgres() {
    let Some(url) = support::url(&support::POSTGRES, "operations on PostgreSQL") else {
        return;
    };
    let (schema, _cleanup) = cleanup::postgres_schema(&url, "operations");
    let store = PostgresStore::builder(&url)
        .schema(&schema)
        .max_connections(4)
        .connect()
        .await
        .unwrap();
    every_read("postgres", Arc::new(store)).await;
}
