//! The bad-input catalogue: every way a caller (an agent, an MCP client, a buggy SDK) can
//! send garbage through `Registry::call`, and what it gets back.
//!
//! Each test pins three things: the error says what was wrong (and names the field), the
//! tool's body did not run, and nothing was claimed in the store.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tool_contracts::store::{ClaimOutcome, ClaimRequest, Record, StoreError};
use tool_contracts::{mutating_tool, registry, with_scope, with_store, Error, MemoryStore, Store};

#[path = "support/stores.rs"]
mod stores;
use stores::{Delegate, Wrapped};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Cart {
    pub id: String,
    pub items: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum BadError {
    #[error(transparent)]
    Contract(#[from] Error),
}

static NEVER_RUNS: AtomicUsize = AtomicUsize::new(0);

/// Every call in this file that must be refused goes to this tool: its body never runs.
#[mutating_tool(idempotency_key_fields = [user_id, cart.id])]
pub async fn never_order(user_id: u64, cart: Cart, note: String) -> Result<String, BadError> {
    NEVER_RUNS.fetch_add(1, SeqCst);
    Ok(format!("{user_id}/{}/{note}", cart.id))
}

/// A tool whose argument is a map of the user's own type: every call to it here is refused.
#[mutating_tool(idempotency_key_fields = [order_id])]
pub async fn never_bulk(
    order_id: String,
    carts: std::collections::BTreeMap<String, Cart>,
) -> Result<usize, BadError> {
    NEVER_RUNS.fetch_add(1, SeqCst);
    Ok(carts.len() + order_id.len())
}

fn valid_args() -> Value {
    json!({"user_id": 7, "cart": {"id": "c-1", "items": ["book"]}, "note": "gift"})
}

/// Calls `never_order` on a fresh store and returns the error, after checking that the body
/// did not run and the store is empty.
async fn refused(args: Value) -> Error {
    refused_in(None, args).await
}

///
/// The same arguments as JSON text (`Registry::call_json`, which decodes them without a
/// `Value`) must be refused with the same error, just as nothing ran or was claimed.
async fn refused_in(scope: Option<&str>, args: Value) -> Error {
    let text = serde_json::to_string(&args).unwrap();
    let err = refused_as(scope, registry().call("never_order", args)).await;
    let from_text = refused_as(scope, registry().call_json("never_order", &text)).await;
    assert_eq!(
        from_text, err,
        "the text path refuses {text} as the Value path does"
    );
    err
}

async fn refused_as<T: std::fmt::Debug>(
    scope: Option<&str>,
    call: impl std::future::Future<Output = Result<tool_contracts::ToolOutput<T>, Error>>,
) -> Error {
    let store = Arc::new(MemoryStore::new());
    let result = match scope {
        Some(scope) => with_store(Arc::clone(&store), with_scope(scope, call)).await,
        None => with_store(Arc::clone(&store), call).await,
    };
    let err = match result {
        Ok(out) => panic!("expected an error, got {out:?}"),
        Err(e) => e,
    };
    assert_eq!(NEVER_RUNS.load(SeqCst), 0, "the body ran for: {err}");
    assert!(
        store.is_empty(),
        "something was claimed for: {err} ({store:?})"
    );
    err
}

fn invalid(err: &Error) -> (Option<&str>, &str) {
    match err {
        Error::InvalidArguments {
            tool,
            field,
            message,
        } => {
            assert_eq!(tool, "never_order");
            (field.as_deref(), message.as_str())
        }
        other => panic!("expected InvalidArguments, got {other:?}"),
    }
}

#[tokio::test]
async fn a_field_of_the_wrong_type_is_named_with_the_type_expected() {
    let mut args = valid_args();
    args["user_id"] = json!("seven");
    let err = refused(args).await;
    let (field, message) = invalid(&err);
    assert_eq!(field, Some("user_id"));
    assert!(message.contains("expected u64"), "{message}");
    assert!(err.to_string().contains("at `user_id`"), "{err}");

    let mut args = valid_args();
    args["cart"]["items"] = json!(["book", 3]);
    let err = refused(args).await;
    let (field, message) = invalid(&err);
    assert_eq!(field, Some("cart.items[1]"));
    assert!(message.contains("expected a string"), "{message}");
    figures::passed("bad_input");
}

#[tokio::test]
async fn a_missing_field_is_named() {
    let mut args = valid_args();
    args.as_object_mut().unwrap().remove("cart");
    let err = refused(args).await;
    let (_, message) = invalid(&err);
    assert!(message.contains("missing field `cart`"), "{message}");

    let mut args = valid_args();
    args["cart"].as_object_mut().unwrap().remove("id");
    let err = refused(args).await;
    let (field, message) = invalid(&err);
    assert_eq!(field, Some("cart"));
    assert!(message.contains("missing field `id`"), "{message}");
    figures::passed("bad_input");
}

#[tokio::test]
async fn an_extra_field_is_rejected_naming_it_and_the_expected_fields() {
    // deny_unknown_fields: a misspelled optional parameter must not be silently dropped.
    let mut args = valid_args();
    args["coupon"] = json!("FREE");
    let err = refused(args).await;
    let (_, message) = invalid(&err);
    assert!(message.contains("unknown field `coupon`"), "{message}");
    assert!(
        message.contains("`note`"),
        "lists the expected fields: {message}"
    );
    figures::passed("bad_input");
}

#[tokio::test]
async fn an_unknown_nested_field_is_refused_like_a_top_level_one() {
    // `Cart` does not deny unknown fields itself: serde would drop `gift` unseen.
    let mut args = valid_args();
    args["cart"]["gift"] = json!(true);
    let err = refused(args).await;
    let (field, message) = invalid(&err);
    assert_eq!(field, Some("cart.gift"));
    assert!(
        message.contains("unknown field `gift` in `cart`, expected one of `id`, `items`"),
        "{message}"
    );
    // The key of such a call is refused the same way.
    let mut args = valid_args();
    args["cart"]["gift"] = json!(true);
    let key = registry().get("never_order").unwrap().key(&args);
    assert!(
        matches!(key, Err(Error::InvalidArguments { ref field, .. }) if field.as_deref() == Some("cart.gift")),
        "{key:?}"
    );
    figures::passed("bad_input");
}

#[tokio::test]
async fn an_unknown_field_in_a_map_value_is_refused_like_a_nested_one() {
    // The values of a `BTreeMap<String, Cart>` are `Cart`s: `gift` in one of them is as
    // undeclared as in `cart.gift`, on both the `Value` path and the text path.
    let args = json!({"order_id": "o-1", "carts": {"a": {"id": "c-1", "items": []}, "b": {"id": "c-2", "items": [], "gift": true}}});
    let text = serde_json::to_string(&args).unwrap();
    let err = refused_as(None, registry().call("never_bulk", args.clone())).await;
    let from_text = refused_as(None, registry().call_json("never_bulk", &text)).await;
    assert_eq!(from_text, err);
    match &err {
        Error::InvalidArguments {
            tool,
            field,
            message,
        } => {
            assert_eq!(tool, "never_bulk");
            assert_eq!(field.as_deref(), Some("carts.b.gift"));
            assert!(
                message
                    .contains("unknown field `gift` in `carts.b`, expected one of `id`, `items`"),
                "{message}"
            );
        }
        other => panic!("expected InvalidArguments, got {other:?}"),
    }
    let key = registry().get("never_bulk").unwrap().key(&args);
    assert!(
        matches!(key, Err(Error::InvalidArguments { ref field, .. }) if field.as_deref() == Some("carts.b.gift")),
        "{key:?}"
    );
    figures::passed("bad_input");
}

#[tokio::test]
async fn arguments_that_are_not_an_object_are_refused_naming_the_expected_fields() {
    for args in [json!([7, "c-1"]), json!("7"), json!(7), json!(true)] {
        let err = refused(args.clone()).await;
        let (field, message) = invalid(&err);
        assert_eq!(field, None);
        assert!(
            message.contains("must be a JSON object with the fields user_id, cart, note"),
            "{args}: {message}"
        );
    }
    // `null` means "no arguments": every field is then missing.
    let err = refused(Value::Null).await;
    assert!(invalid(&err).1.contains("missing field"), "{err}");
    figures::passed("bad_input");
}

static BIG_RUNS: AtomicUsize = AtomicUsize::new(0);

/// Accepts a note of any size.
#[mutating_tool(idempotency_key_fields = [user_id])]
pub async fn big_note(user_id: u64, note: String) -> Result<usize, BadError> {
    BIG_RUNS.fetch_add(1, SeqCst);
    Ok(note.len() + usize::try_from(user_id).unwrap_or(0))
}

const SIXTEEN_MIB: usize = 16 * 1024 * 1024;

/// Arguments over the process's limit (default 1 MiB of canonical JSON) are refused before
/// anything is claimed or run, with an error that names the size, the limit and the remedy;
/// a raised limit lets the same call through, stored whole and replayed. One test, since
/// the limit is process-wide.
#[tokio::test]
async fn sixteen_mib_arguments_are_refused_over_the_limit_and_accepted_under_a_raised_one() {
    let note = "x".repeat(SIXTEEN_MIB);
    let args = json!({"user_id": 1, "note": note});
    assert_eq!(
        tool_contracts::max_argument_bytes(),
        tool_contracts::DEFAULT_MAX_ARGUMENT_BYTES
    );
    let store = Arc::new(MemoryStore::new());
    let err = with_store(
        Arc::clone(&store),
        registry().call("big_note", args.clone()),
    )
    .await
    .unwrap_err();
    let Error::InvalidArguments {
        tool,
        field,
        message,
    } = &err
    else {
        panic!("expected InvalidArguments, got {err:?}");
    };
    assert_eq!(
        (tool.as_str(), field.as_deref()),
        ("big_note", Some("note"))
    );
    assert!(
        message.contains("over this process's limit of 1048576 bytes")
            && message.contains("set_max_argument_bytes"),
        "{message}"
    );
    assert!(message.len() < 1024, "{} bytes", message.len());
    assert_eq!(BIG_RUNS.load(SeqCst), 0, "nothing ran");
    assert!(store.is_empty(), "nothing was claimed");
    // Just under the limit passes.
    let fits = json!({"user_id": 2, "note": "y".repeat(1024 * 1024 - 64)});
    with_store(Arc::clone(&store), registry().call("big_note", fits))
        .await
        .unwrap();
    assert_eq!(BIG_RUNS.load(SeqCst), 1);

    tool_contracts::set_max_argument_bytes(32 * 1024 * 1024);
    let store = Arc::new(MemoryStore::new());
    let started = Instant::now();
    let first = with_store(
        Arc::clone(&store),
        registry().call("big_note", args.clone()),
    )
    .await;
    let second = with_store(
        Arc::clone(&store),
        registry().call("big_note", args.clone()),
    )
    .await;
    tool_contracts::set_max_argument_bytes(tool_contracts::DEFAULT_MAX_ARGUMENT_BYTES);
    let (first, second) = (first.unwrap(), second.unwrap());
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(first.value, json!(SIXTEEN_MIB + 1));
    assert_eq!(second.outcome, tool_contracts::Outcome::Replayed);
    assert_eq!(BIG_RUNS.load(SeqCst), 2);
    let record = store
        .lookup(first.key.as_deref().unwrap_or_default())
        .await
        .unwrap()
        .unwrap();
    assert!(
        record.args.len() > SIXTEEN_MIB,
        "the arguments are stored whole"
    );
    figures::passed("bad_input");
}

#[tokio::test]
async fn sixteen_mib_of_the_wrong_type_is_refused_naming_the_field_in_a_short_message() {
    let mut args = valid_args();
    args["user_id"] = Value::String("9".repeat(SIXTEEN_MIB));
    let err = refused(args).await;
    assert_eq!(invalid(&err).0, Some("user_id"));
    // serde's message quotes the offending value whole; `decode_args` shortens it so a
    // 16 MiB value never becomes a 16 MiB error in an LLM's context or a log line.
    let message = err.to_string();
    assert!(message.len() < 1024, "{} bytes", message.len());
    assert!(
        message.contains("bytes elided") && message.contains("expected u64"),
        "{message}"
    );
    figures::passed("bad_input");
}

fn nested_text(depth: usize) -> String {
    let mut text = String::with_capacity(depth * 2 + 32);
    text.push_str(r#"{"user_id": 7, "cart": {"id": "c", "items": []}, "note": "#);
    text.push_str(&"[".repeat(depth));
    text.push_str(&"]".repeat(depth));
    text.push('}');
    text
}

fn nested_value(depth: usize) -> Value {
    let mut v = json!("bottom");
    for _ in 0..depth {
        v = Value::Array(vec![v]);
    }
    v
}

#[tokio::test]
async fn json_nested_ten_thousand_deep_is_refused_without_overflowing_the_stack() {
    // From JSON text (what MCP clients send): serde_json stops at 128 levels.
    let err = serde_json::from_str::<Value>(&nested_text(10_000)).unwrap_err();
    assert!(
        err.to_string().contains("recursion limit exceeded"),
        "{err}"
    );
    // 100 levels parse; the typed decoder then names the field.
    let args: Value = serde_json::from_str(&nested_text(100)).unwrap();
    let err = refused(args).await;
    let (field, message) = invalid(&err);
    assert_eq!(field, Some("note"));
    assert!(message.contains("expected a string"), "{message}");

    // Built in Rust, past any parser: the typed decoder rejects it at the first level.
    for slot in ["note", "user_id", "cart"] {
        let mut args = valid_args();
        args[slot] = nested_value(10_000);
        // Never cloned: `Value::clone` recurses (serde_json), and 10,000 levels overflow a
        // 2 MiB test thread's stack in a debug build. Dropping it inside the call is fine.
        // No text twin: its text is what the parser refuses (below).
        let err = refused_as(None, registry().call("never_order", args)).await;
        let (field, _) = invalid(&err);
        assert!(field.is_some_and(|f| f.starts_with(slot)), "{slot}: {err}");
    }
    figures::passed("bad_input");
}

#[tokio::test]
async fn json_text_that_is_not_one_json_object_is_refused_naming_the_parser_error() {
    // `Registry::call_json` (what the HTTP surface calls with a request body) parses the
    // text itself: what serde_json refuses is refused before anything is claimed or run.
    for (text, says) in [
        (nested_text(10_000), "recursion limit exceeded"),
        (
            r#"{"user_id": 7, "cart": {"id": "\ud800", "items": []}, "note": ""}"#.to_owned(),
            "escape",
        ),
        (r#"{"user_id": 7,"#.to_owned(), "EOF"),
        (
            r#"{"user_id": 7} trailing"#.to_owned(),
            "trailing characters",
        ),
        (String::new(), "EOF"),
    ] {
        let err = refused_as(None, registry().call_json("never_order", &text)).await;
        let (field, message) = invalid(&err);
        assert_eq!(field, None, "{message}");
        assert!(message.contains("the arguments are not JSON"), "{message}");
        assert!(message.contains(says), "{message}");
        assert!(message.contains("user_id, cart, note"), "{message}");
    }
    // 100 levels parse: the typed decoder names the field, as for a `Value`.
    let err = refused_as(None, registry().call_json("never_order", &nested_text(100))).await;
    assert_eq!(invalid(&err).0, Some("note"));
    figures::passed("bad_input");
}

#[tokio::test]
async fn a_lone_surrogate_escape_is_refused_by_the_json_parser() {
    // What this pins: the parser every surface uses (serde_json, with our features) refuses
    // the text. The crate's own entry point is exercised by
    // `the_mcp_server_refuses_hostile_raw_input_and_stays_usable`.
    for text in [
        r#"{"user_id": 7, "cart": {"id": "\ud800", "items": []}, "note": ""}"#,
        r#"{"user_id": 7, "cart": {"id": "c", "items": []}, "note": "\udc00x"}"#,
    ] {
        let err = serde_json::from_str::<Value>(text).unwrap_err().to_string();
        assert!(err.contains("surrogate") || err.contains("escape"), "{err}");
    }
    // A valid pair is an ordinary character.
    let ok: Value = serde_json::from_str(
        r#"{"user_id": 7, "cart": {"id": "\ud83d\ude00", "items": []}, "note": ""}"#,
    )
    .unwrap();
    assert_eq!(ok["cart"]["id"], "😀");
    figures::passed("bad_input");
}

/// The same hostile texts as above, as an MCP client would send them: raw lines into the
/// crate's own MCP server (not serde_json alone). None gets a result, nothing runs or is
/// claimed, and the session stays usable.
#[tokio::test]
async fn the_mcp_server_refuses_hostile_raw_input_and_stays_usable() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    let store = Arc::new(MemoryStore::new());
    let server =
        tool_contracts::mcp::McpServer::new(registry().clone()).with_store(Arc::clone(&store));
    let (client, server_side) = tokio::io::duplex(1 << 22);
    let (server_read, server_write) = tokio::io::split(server_side);
    tokio::spawn(server.serve_io(server_read, server_write));
    let (read, mut write) = tokio::io::split(client);
    let mut lines = BufReader::new(read).lines();
    fn send(line: String) -> Vec<u8> {
        let mut bytes = line.into_bytes();
        bytes.push(b'\n');
        bytes
    }
    async fn next_answer<R: tokio::io::AsyncBufRead + Unpin>(
        lines: &mut tokio::io::Lines<R>,
    ) -> String {
        tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("an answer within 20 s")
            .expect("readable")
            .expect("the server kept the session open")
    }
    write
        .write_all(&send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "hostile", "version": "1"}}}).to_string()))
        .await
        .unwrap();
    let init = next_answer(&mut lines).await;
    assert!(init.contains("\"result\""), "{init}");
    write
        .write_all(&send(
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string(),
        ))
        .await
        .unwrap();

    let call = |id: u64, arguments: &str| {
        format!(
            r#"{{"jsonrpc": "2.0", "id": {id}, "method": "tools/call", "params": {{"name": "never_order", "arguments": {arguments}}}}}"#
        )
    };
    let hostile = [
        call(
            2,
            r#"{"user_id": 7, "cart": {"id": "\ud800", "items": []}, "note": ""}"#,
        ),
        call(
            3,
            r#"{"user_id": 7, "cart": {"id": "c", "items": []}, "note": "\udc00x"}"#,
        ),
        call(4, &nested_text(10_000)),
    ];
    for (i, line) in hostile.into_iter().enumerate() {
        let hostile_id = 2 + i as u64;
        write.write_all(&send(line)).await.unwrap();
        // A ping behind it: once its answer arrives, the hostile line has been handled.
        let ping = 100 + hostile_id;
        write
            .write_all(&send(
                json!({"jsonrpc": "2.0", "id": ping, "method": "ping"}).to_string(),
            ))
            .await
            .unwrap();
        loop {
            let answer = next_answer(&mut lines).await;
            let answer: Value =
                serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{e}: {answer}"));
            if answer["id"] == ping {
                break;
            }
            // The line is not JSON (`\ud800` alone, nesting past serde_json's 128 levels):
            // rmcp's transport drops it without an answer, or a future version answers
            // -32700. Either way never a result, and nothing runs.
            assert!(
                answer.get("error").is_some() || answer["result"]["isError"] == true,
                "hostile line {i}: {answer}"
            );
        }
    }
    // The session still works: a valid call after the garbage is answered.
    write
        .write_all(&send(
            json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list"}).to_string(),
        ))
        .await
        .unwrap();
    let listed: Value = serde_json::from_str(&next_answer(&mut lines).await).unwrap();
    assert_eq!(listed["id"], 9, "{listed}");
    assert!(listed["result"]["tools"].is_array(), "{listed}");
    assert_eq!(NEVER_RUNS.load(SeqCst), 0);
    assert!(store.is_empty(), "{store:?}");
    figures::passed("bad_input");
}

static NUL_RUNS: AtomicUsize = AtomicUsize::new(0);

/// Keyed on a string that may hold NUL.
#[mutating_tool(idempotency_key_fields = [cart.id])]
pub async fn nul_order(cart: Cart) -> Result<String, BadError> {
    NUL_RUNS.fetch_add(1, SeqCst);
    Ok(cart.id.replace('\0', "<NUL>"))
}

#[tokio::test]
async fn a_nul_in_a_key_field_gives_a_stable_distinct_key_and_stores_fine() {
    let store = Arc::new(MemoryStore::new());
    let args = |id: &str| json!({"cart": {"id": id, "items": []}});
    let key = |id: &str| {
        registry()
            .get("nul_order")
            .unwrap()
            .key(&args(id))
            .unwrap()
            .unwrap()
    };
    let first = with_store(
        Arc::clone(&store),
        registry().call("nul_order", args("c\0-1")),
    )
    .await
    .unwrap();
    let again = with_store(
        Arc::clone(&store),
        registry().call("nul_order", args("c\0-1")),
    )
    .await
    .unwrap();
    assert_eq!(first.value, json!("c<NUL>-1"));
    assert_eq!(again.outcome, tool_contracts::Outcome::Replayed);
    assert_eq!(first.key, again.key);
    assert_eq!(first.key, Some(key("c\0-1")), "stable");
    // Known value, pinned: the canonical document escapes NUL as \u0000.
    let fields = json!("c\0-1");
    assert_eq!(
        first.key,
        Some(tool_contracts::key::tool_key("nul_order", 1, None, &[("cart.id", &fields)]).unwrap())
    );
    for other in ["c-1", "c\0-2", "c\0\0-1", "c-1\0"] {
        assert_ne!(first.key, Some(key(other)), "{other:?}");
    }
    assert_eq!(NUL_RUNS.load(SeqCst), 1);
    let record = store
        .lookup(first.key.as_deref().unwrap_or_default())
        .await
        .unwrap()
        .unwrap();
    assert!(record.args.contains(r"c\u0000-1"), "{}", record.args);
    let stored: Value = serde_json::from_str(&record.args).unwrap();
    assert_eq!(stored["cart"]["id"], "c\0-1");
    figures::passed("bad_input");
}

#[tokio::test]
async fn an_invalid_caller_scope_is_refused_naming_the_problem() {
    for (scope, says) in [
        ("tenant\u{7}", "control character"),
        ("tenant\n1", "control character"),
        ("a\u{1f}b", "control character"),
        ("", "empty"),
    ] {
        let err = refused_in(Some(scope), valid_args()).await;
        match &err {
            Error::InvalidArguments { tool, message, .. } => {
                assert_eq!(tool, "never_order");
                assert!(message.contains(says), "{scope:?}: {message}");
            }
            other => panic!("{scope:?}: expected InvalidArguments, got {other:?}"),
        }
    }
    // An outer invalid scope poisons the nested ones too.
    let store = Arc::new(MemoryStore::new());
    let err = with_store(
        Arc::clone(&store),
        with_scope(
            "bad\u{0}",
            with_scope("fine", registry().call("never_order", valid_args())),
        ),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::InvalidArguments { .. }), "{err}");
    assert!(store.is_empty());
    assert_eq!(NEVER_RUNS.load(SeqCst), 0);
    figures::passed("bad_input");
}

#[tokio::test]
async fn an_unknown_tool_is_named_with_a_suggestion_when_one_is_close() {
    let store = Arc::new(MemoryStore::new());
    let err = with_store(
        Arc::clone(&store),
        registry().call("never_ordr", valid_args()),
    )
    .await
    .unwrap_err();
    assert_eq!(
        err,
        Error::UnknownTool {
            name: "never_ordr".into(),
            suggestion: Some("never_order".into())
        }
    );
    assert!(
        err.to_string().contains("did you mean `never_order`"),
        "{err}"
    );
    let err = with_store(
        Arc::clone(&store),
        registry().call("drop_all_tables", json!({})),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::UnknownTool {
                suggestion: None,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("`drop_all_tables`"), "{err}");
    assert!(store.is_empty());
    assert_eq!(NEVER_RUNS.load(SeqCst), 0);
    figures::passed("bad_input");
}

/// How a [`BrokenStore`] misbehaves.
#[derive(Clone, Copy)]
enum Breakage {
    /// Every read answers `StoreError::Corrupt` (a row that no longer parses).
    Corrupt,
    /// A claim answers "completed" with a record that holds no result.
    CompletedWithoutResult,
}

/// A store whose records are corrupted; writes go to an inner `MemoryStore`, which must
/// stay empty.
struct BrokenStore {
    inner: MemoryStore,
    breakage: Breakage,
}

impl BrokenStore {
    fn answer(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        match self.breakage {
            Breakage::Corrupt => Err(StoreError::Corrupt(format!(
                "record {}: state column holds \"garbage\"",
                req.key
            ))),
            Breakage::CompletedWithoutResult => Ok(ClaimOutcome::Completed(Arc::new(Record {
                key: req.key.to_owned(),
                tool: req.tool.to_owned(),
                version: Some(req.version),
                scope: None,
                fingerprint: req.fingerprint.to_owned(),
                args: req.args.to_owned(),
                state: tool_contracts::store::RecordState::InProgress {
                    token: 1,
                    lease_expires_at: std::time::SystemTime::now(),
                },
                created_at: std::time::SystemTime::now(),
                updated_at: std::time::SystemTime::now(),
                expires_at: std::time::SystemTime::now(),
            }))),
        }
    }
}

#[async_trait::async_trait]
impl Delegate for BrokenStore {
    fn inner(&self) -> &dyn Store {
        &self.inner
    }
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        self.answer(&req)
    }
    async fn takeover(
        &self,
        req: ClaimRequest<'_>,
        _stale_token: u64,
    ) -> Result<ClaimOutcome, StoreError> {
        self.answer(&req)
    }
    async fn lookup(&self, key: &str) -> Result<Option<Record>, StoreError> {
        Err(StoreError::Corrupt(format!("record {key} does not parse")))
    }
}

#[tokio::test]
async fn a_corrupted_stored_record_fails_closed_as_a_store_error_and_nothing_runs() {
    for (breakage, says) in [
        (Breakage::Corrupt, "corrupt record"),
        (Breakage::CompletedWithoutResult, "without a result"),
    ] {
        let store = Arc::new(Wrapped(BrokenStore {
            inner: MemoryStore::new(),
            breakage,
        }));
        let args = valid_args();
        let key = stores::key_of("never_order", &args);
        let err = with_store(Arc::clone(&store), registry().call("never_order", args))
            .await
            .unwrap_err();
        match &err {
            Error::Store {
                tool,
                key: k,
                source,
            } => {
                assert_eq!(tool, "never_order");
                assert_eq!(k.as_ref(), Some(&key));
                let message = source.to_string();
                assert!(message.contains(says), "{message}");
            }
            other => panic!("expected Store, got {other:?}"),
        }
        assert!(err.to_string().contains("nothing was run"), "{err}");
        assert!(store.inner.is_empty());
    }
    assert_eq!(NEVER_RUNS.load(SeqCst), 0);
    figures::passed("bad_input");
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Receipt {
    pub order_no: u64,
    pub total_cents: u64,
}

static RETYPED_RUNS: AtomicUsize = AtomicUsize::new(0);

/// Its result type changed since an older build stored a plain string under the same key.
#[mutating_tool(idempotency_key_fields = [order])]
pub async fn retyped_receipt(order: u64) -> Result<Receipt, BadError> {
    RETYPED_RUNS.fetch_add(1, SeqCst);
    Ok(Receipt {
        order_no: order,
        total_cents: 0,
    })
}

#[tokio::test]
async fn a_stored_result_of_an_older_type_is_a_codec_error_naming_version() {
    let args = json!({"order": 3});
    // An older build stored a plain string, under today's key and argument fingerprint
    // (read from a genuine call, which ran the body once).
    let (store, key) =
        stores::store_with_an_older_result("retyped_receipt", &args, "\"receipt #3\"").await;
    assert_eq!(RETYPED_RUNS.load(SeqCst), 1);
    let before = store.lookup(&key).await.unwrap().unwrap();

    let err = with_store(Arc::clone(&store), registry().call("retyped_receipt", args))
        .await
        .unwrap_err();
    match &err {
        Error::Codec {
            tool,
            key: k,
            message,
        } => {
            assert_eq!(tool, "retyped_receipt");
            assert_eq!(k.as_ref(), Some(&key));
            assert!(message.contains("`version`"), "{message}");
            assert!(message.contains("no longer decodes"), "{message}");
        }
        other => panic!("expected Codec, got {other:?}"),
    }
    assert_eq!(RETYPED_RUNS.load(SeqCst), 1, "the body did not run again");
    let after = store.lookup(&key).await.unwrap().unwrap();
    assert_eq!(
        (&after.fingerprint, &after.args),
        (&before.fingerprint, &before.args)
    );
    assert!(
        matches!(after.state, tool_contracts::store::RecordState::Completed { ref result, .. } if result == "\"receipt #3\""),
        "the record is untouched: {after:?}"
    );
    figures::passed("bad_input");
}

mod figures;
