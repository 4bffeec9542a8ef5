//! The server over a hand-built tool: results, and the stdio transport against rmcp's own.
//! (The HTTP server is tested end to end, with a real HTTP client, in `tests/mcp_e2e.rs`.)

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::*;
use std::sync::Arc;

use crate::registry::ToolDescriptor;

use rmcp::model::ErrorCode;
use rmcp::ServiceExt;

mod fixtures {
    //! A read-only tool built by hand as `#[read_only_tool]` builds one.
    use core::time::Duration;

    use serde_json::Value;

    use crate::error::Error;
    use crate::registry::{BoxFuture, CallArgs, CallResult, Context, ToolDescriptor};
    use crate::spec::{SourceLocation, ToolKind, ToolSpec};

    static SPEC: ToolSpec = ToolSpec {
        description: "Seven.",
        ttl: Duration::from_secs(60),
        ..ToolSpec::fixture(
            "seven",
            ToolKind::ReadOnly,
            &[],
            &[],
            SourceLocation {
                module_path: module_path!(),
                file: file!(),
                line: line!(),
                column: 1,
            },
        )
    };

    fn invoke<'a>(_: &'a Context, _: CallArgs<'a>) -> BoxFuture<'a, Result<CallResult, Error>> {
        Box::pin(async { Ok(Value::from(7).into()) })
    }

    fn input_schema() -> Value {
        serde_json::json!({"type": "object", "properties": {}})
    }

    fn output_schema() -> Option<Value> {
        Some(serde_json::json!({"type": "integer"}))
    }

    pub(super) static SEVEN: ToolDescriptor =
        ToolDescriptor::new(&SPEC, None, invoke, input_schema, output_schema);
}

fn seven() -> McpServer {
    McpServer::new(Registry::from_tools([&fixtures::SEVEN]).unwrap())
}

#[tokio::test]
async fn results_follow_the_published_output_shape() {
    let server = seven();
    let published = &server.tools()[0];
    assert_eq!(
        published
            .output_schema
            .as_deref()
            .map(|s| s["required"].clone()),
        Some(json!(["result"]))
    );
    let first = server.call("seven", None, None).await.unwrap();
    assert_eq!(first.structured_content, Some(json!({"result": 7})));
    assert_eq!(first.is_error, Some(false));
    let key = json!("k");
    let keyed = server.call("seven", None, Some(&key)).await.unwrap();
    let meta = &keyed.meta.unwrap().0[CALL_META_KEY];
    assert_eq!(meta["clientKey"], "k");
    assert_eq!(meta["outcome"], "executed");
    assert_eq!(meta["key"], Value::Null);
    let bad = json!("");
    let refused = server.call("seven", None, Some(&bad)).await.unwrap();
    assert_eq!(refused.is_error, Some(true));
    let unknown = server.call("sevn", None, None).await.unwrap_err();
    assert_eq!(unknown.code, ErrorCode::INVALID_PARAMS);
    assert!(
        unknown.message.contains("did you mean `seven`"),
        "{}",
        unknown.message
    );
}

#[test]
fn meta_keys_live_under_the_crate_prefix() {
    for key in [IDEMPOTENCY_META_KEY, CALL_META_KEY, CLIENT_KEY_META_KEY] {
        assert!(
            key.starts_with(&format!("{}/", crate::META_PREFIX)),
            "{key}"
        );
    }
}

/// The SDK limit `transport.rs` works around. When this fails, rmcp keeps unknown
/// `tools/call` parameters: drop the workaround (`ParamsIdempotencyKey` and what sets it).
#[test]
fn rmcp_still_drops_unknown_tools_call_params() {
    let line = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "seven", "arguments": {}, CLIENT_KEY_PARAM: "k"}});
    let decoded: rmcp::service::RxJsonRpcMessage<rmcp::RoleServer> =
        serde_json::from_value(line).unwrap();
    let again = serde_json::to_value(&decoded).unwrap();
    assert_eq!(again["params"]["name"], "seven", "{again}");
    assert_eq!(again["params"].get(CLIENT_KEY_PARAM), None, "{again}");
}

/// Writes `lines` to a server over an in-memory pipe, closes the pipe, and returns every
/// line the server wrote.
async fn exchange<F, Fut>(serve: F, lines: &[String]) -> Vec<Value>
where
    F: FnOnce(
        tokio::io::ReadHalf<tokio::io::DuplexStream>,
        tokio::io::WriteHalf<tokio::io::DuplexStream>,
    ) -> Fut,
    Fut: core::future::Future<Output = std::io::Result<()>> + Send + 'static,
{
    let (client, server_side) = tokio::io::duplex(1 << 20);
    let (server_read, server_write) = tokio::io::split(server_side);
    let server = tokio::spawn(serve(server_read, server_write));
    let (read, mut write) = tokio::io::split(client);
    let mut answers = BufReader::new(read).lines();
    let mut out = Vec::new();
    for line in lines {
        write.write_all(line.as_bytes()).await.unwrap();
        write.write_all(b"\n").await.unwrap();
        // Each script ends its steps with a ping (ids from 900): wait for its answer so
        // answers come in the order of the lines.
        if line.contains("\"ping\"") {
            loop {
                let answer =
                    tokio::time::timeout(core::time::Duration::from_secs(20), answers.next_line())
                        .await
                        .expect("an answer within 20 s")
                        .unwrap()
                        .expect("the server kept the pipe open");
                let answer: Value = serde_json::from_str(&answer).unwrap();
                let is_ping = answer["id"].as_u64().is_some_and(|id| id >= 900);
                out.push(answer);
                if is_ping {
                    break;
                }
            }
        }
    }
    write.shutdown().await.unwrap();
    tokio::time::timeout(core::time::Duration::from_secs(20), server)
        .await
        .expect("the server ends with its input")
        .unwrap()
        .unwrap();
    out
}

fn script(steps: &[&str]) -> Vec<String> {
    let mut lines = vec![
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}).to_string(),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string(),
    ];
    for (i, step) in steps.iter().enumerate() {
        lines.push((*step).to_owned());
        lines.push(json!({"jsonrpc": "2.0", "id": 900 + i, "method": "ping"}).to_string());
    }
    lines
}

/// `serve_io` replaces the read loop of rmcp's stdio transport (for
/// `params.idempotencyKey`): everything else must be answered exactly as rmcp answers it,
/// including input that is no message at all.
#[tokio::test]
async fn the_stdio_transport_answers_everything_else_as_rmcps_own() {
    let long = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"tools/list\",\"params\":{{\"x\":\"{}\"}}}}",
        "x".repeat(rmcp::transport::async_rw::DEFAULT_MAX_LINE_LENGTH)
    );
    let steps = [
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"seven","_meta":{"dev.tool-contracts/idempotencyKey":"m"}}}"#,
        // Not JSON, JSON that is no message, a notification outside MCP, an empty line, a
        // BOM, CRLF, a line over rmcp's limit.
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call""#,
        r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"arguments":{}}}"#,
        r#"{"jsonrpc":"2.0","id":8,"nothing":true}"#,
        r#"{"jsonrpc":"2.0","method":"$/progress","params":{}}"#,
        "",
        "\u{feff}{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"tools/call\",\"params\":{\"name\":\"seven\"}}",
        "{\"jsonrpc\":\"2.0\",\"id\":6,\"method\":\"tools/call\",\"params\":{\"name\":\"sevn\"}}\r",
        &long,
    ];
    let lines = script(&steps);
    let ours = exchange(|r, w| seven().serve_io(r, w), &lines).await;
    let rmcps = exchange(
        |r, w| async move {
            let running = seven().serve((r, w)).await.map_err(std::io::Error::other)?;
            running
                .waiting()
                .await
                .map(drop)
                .map_err(std::io::Error::other)
        },
        &lines,
    )
    .await;
    // The order of an answer without an id (Invalid Request) among the others is free.
    let sorted = |answers: &[Value]| {
        let mut answers: Vec<String> = answers.iter().map(Value::to_string).collect();
        answers.sort();
        answers
    };
    assert_eq!(sorted(&ours), sorted(&rmcps));
    let by_id = |id: u64| ours.iter().find(|a| a["id"] == id);
    assert_eq!(
        by_id(2).unwrap()["result"]["_meta"][CALL_META_KEY]["clientKey"],
        "m"
    );
    assert!(by_id(3).is_none(), "not JSON: no answer");
    assert!(
        ours.iter()
            .any(|a| a["id"].is_null() && a["error"]["code"] == -32600),
        "no message: Invalid Request, as rmcp answers it: {ours:?}"
    );
    assert_eq!(
        by_id(5).unwrap()["result"]["structuredContent"],
        json!({"result": 7})
    );
    assert_eq!(by_id(6).unwrap()["error"]["code"], -32602);
    assert!(by_id(7).is_none(), "a line over the limit is dropped");
    assert!(by_id(8).is_none(), "{ours:?}");
}

/// The workaround itself, over the stdio transport: a key sent as `params.idempotencyKey`
/// is the client key (echoed in `_meta`, validated, compared with a `_meta` key). Fails
/// when `KeyedMessage` no longer keeps it.
#[tokio::test]
async fn params_idempotency_key_reaches_the_handler_over_stdio() {
    let call = |id: u64, params: Value| {
        let mut params_with_name = json!({"name": "seven"});
        if let (Value::Object(all), Value::Object(more)) = (&mut params_with_name, params) {
            all.extend(more);
        }
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params_with_name})
            .to_string()
    };
    let steps = [
        call(1, json!({CLIENT_KEY_PARAM: "p-1"})),
        call(2, json!({CLIENT_KEY_PARAM: ""})),
        call(3, json!({CLIENT_KEY_PARAM: "p-1", "_meta": {CLIENT_KEY_META_KEY: "m-1"}})),
        call(4, json!({CLIENT_KEY_PARAM: "p-1", "_meta": {CLIENT_KEY_META_KEY: "p-1"}})),
        // Only `tools/call` has the parameter.
        json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list", "params": {CLIENT_KEY_PARAM: "x"}}).to_string(),
    ];
    let steps: Vec<&str> = steps.iter().map(String::as_str).collect();
    let answers = exchange(|r, w| seven().serve_io(r, w), &script(&steps)).await;
    let result = |id: u64| {
        answers
            .iter()
            .find(|a| a["id"] == id)
            .map(|a| a["result"].clone())
            .unwrap_or_else(|| panic!("no answer {id}: {answers:?}"))
    };
    let meta = |id: u64| result(id)["_meta"][CALL_META_KEY].clone();
    assert_eq!(meta(1)["clientKey"], "p-1", "{answers:?}");
    assert_eq!(result(2)["isError"], true);
    assert_eq!(meta(2)["error"], "invalid_arguments");
    assert_eq!(result(3)["isError"], true);
    assert!(
        result(3)["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("two different")),
        "{answers:?}"
    );
    assert_eq!(meta(4)["clientKey"], "p-1");
    assert!(result(5)["tools"].is_array());
}

/// JSON-RPC's Invalid params (`-32602`), not Method not found: rmcp 3.11 decodes a
/// `tools/call` whose params do not fit `CallToolRequestParams` as a custom request, and its
/// default `on_custom_request` answers `-32601 "tools/call"`. Fails without
/// `McpServer::on_custom_request` (handler.rs).
#[tokio::test]
async fn malformed_tools_call_params_are_invalid_params_naming_what_to_send() {
    let call = |id: u64, params: Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}).to_string()
    };
    let steps = [
        call(1, json!({"arguments": {}})),
        call(2, json!({"name": "seven", "arguments": "{}"})),
        call(3, json!({"name": "seven", "arguments": [1, 2]})),
        call(4, json!({"name": 7})),
        call(5, json!({"arguments": 5})),
        json!({"jsonrpc": "2.0", "id": 6, "method": "tools/call"}).to_string(),
        json!({"jsonrpc": "2.0", "id": 7, "method": "no/such/method", "params": {}}).to_string(),
    ];
    let steps: Vec<&str> = steps.iter().map(String::as_str).collect();
    let answers = exchange(|r, w| seven().serve_io(r, w), &script(&steps)).await;
    let error = |id: u64| {
        answers
            .iter()
            .find(|a| a["id"] == id)
            .map(|a| a["error"].clone())
            .unwrap_or_else(|| panic!("no answer {id}: {answers:?}"))
    };
    let expected: [(u64, &[&str], &[&str]); 6] = [
        (
            1,
            &["params.name"],
            &["`params.name` is missing: send the tool's name as a string"],
        ),
        (
            2,
            &["params.arguments"],
            &["not a string holding JSON text: send the object itself"],
        ),
        (
            3,
            &["params.arguments"],
            &["must be an object mapping each argument's name to its value, not an array"],
        ),
        (
            4,
            &["params.name"],
            &["must be the tool's name as a string, not a number"],
        ),
        (
            5,
            &["params.name", "params.arguments"],
            &["`params.name` is missing", "not a number: send `{}`"],
        ),
        (6, &["params"], &["`tools/call` has no `params`"]),
    ];
    for (id, fields, says) in expected {
        let error = error(id);
        assert_eq!(error["code"], -32602, "{id}: {error}");
        assert_eq!(error["data"]["fields"], json!(fields), "{id}: {error}");
        let message = error["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with("Invalid params for `tools/call`, nothing ran. "),
            "{message}"
        );
        for said in says {
            assert!(message.contains(said), "{id}: {message}");
        }
    }
    assert_eq!(
        error(7)["code"],
        -32601,
        "an unknown method stays Method not found"
    );
    assert_eq!(error(7)["message"], "no/such/method");
}

/// The SDK limit `McpServer::on_custom_request` works around. When this fails, rmcp no
/// longer turns a `tools/call` it cannot decode into a custom request: check what it
/// answers then, and drop the override if it is `-32602`.
#[test]
fn rmcp_still_decodes_malformed_tools_call_as_a_custom_request() {
    use rmcp::model::{ClientRequest, JsonRpcMessage};
    let line = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"arguments": "{}"}});
    let decoded: rmcp::service::RxJsonRpcMessage<rmcp::RoleServer> =
        serde_json::from_value(line).unwrap();
    let JsonRpcMessage::Request(request) = decoded else {
        panic!("not a request: {decoded:?}");
    };
    assert!(
        matches!(&request.request, ClientRequest::CustomRequest(c) if c.method == "tools/call"),
        "{:?}",
        request.request
    );
}

// ---------------------------------------------------------------------------------------
// Tasks (SEP-2663): a task is the operation of one call, named by its key (`tasks.rs`).
// ---------------------------------------------------------------------------------------

mod shop {
    //! Mutating tools built by hand as `#[mutating_tool(idempotency_key_fields = [order],
    //! cache_errors = true, task = …)]` builds them: `place_order` (`task = "optional"`),
    //! `place_plain` (no tasks) and `place_only_as_task` (`task = "required"`). Each counts
    //! the runs of its body per order (the effects), and an order with a gate waits in its
    //! body until the test opens the gate.
    use core::time::Duration;
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    use serde::{Deserialize, Serialize};
    use serde_json::{json, Value};

    use crate::__private::{encode_result, execute, CallBuilder, Codec, Ops};
    use crate::error::Error;
    use crate::registry::{BoxFuture, CallResult, Context, ToolDescriptor};
    use crate::spec::{SourceLocation, TaskSupport, ToolKind, ToolSpec};

    #[derive(Debug, Serialize, Deserialize)]
    pub(super) enum PlaceError {
        Contract(String),
        Refused(String),
    }

    impl core::fmt::Display for PlaceError {
        fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            match self {
                PlaceError::Contract(m) | PlaceError::Refused(m) => f.write_str(m),
            }
        }
    }

    impl From<Error> for PlaceError {
        fn from(e: Error) -> Self {
            PlaceError::Contract(e.to_string())
        }
    }

    static EFFECTS: Mutex<Vec<(&str, u64)>> = Mutex::new(Vec::new());
    static GATES: Mutex<Option<HashMap<u64, Arc<tokio::sync::Semaphore>>>> = Mutex::new(None);

    /// How many times the body of `tool` ran for `order`.
    pub(super) fn effects(tool: &str, order: u64) -> usize {
        let effects = EFFECTS.lock().unwrap();
        effects.iter().filter(|e| **e == (tool, order)).count()
    }

    /// Makes the body for `order` wait until [`open`] is called.
    pub(super) fn gate(order: u64) {
        let mut gates = GATES.lock().unwrap();
        gates
            .get_or_insert_with(HashMap::new)
            .insert(order, Arc::new(tokio::sync::Semaphore::new(0)));
    }

    /// Lets the body for `order` finish.
    pub(super) fn open(order: u64) {
        let gates = GATES.lock().unwrap();
        if let Some(gate) = gates.as_ref().and_then(|g| g.get(&order)) {
            gate.add_permits(1_000);
        }
    }

    async fn body(tool: &'static str, order: u64, refuse: bool) -> Result<Value, PlaceError> {
        EFFECTS.lock().unwrap().push((tool, order));
        let gate = GATES
            .lock()
            .unwrap()
            .as_ref()
            .and_then(|g| g.get(&order).cloned());
        if let Some(gate) = gate {
            let _permit = gate.acquire().await;
        }
        if refuse {
            return Err(PlaceError::Refused(format!("order {order} is refused")));
        }
        Ok(json!({"order": order, "placed": true}))
    }

    fn builder(spec: &'static ToolSpec, args: &Value) -> (CallBuilder, u64, bool) {
        let order = args["order"].as_u64().unwrap_or(0);
        let refuse = args["refuse"].as_bool().unwrap_or(false);
        let mut call = CallBuilder::new(spec);
        call.key_field("order", &order);
        call.arg("order", &order);
        call.arg("refuse", &refuse);
        (call, order, refuse)
    }

    fn invoke(
        spec: &'static ToolSpec,
        args: Value,
    ) -> BoxFuture<'static, Result<CallResult, Error>> {
        Box::pin(async move {
            let (call, order, refuse) = builder(spec, &args);
            let ops = Ops::new(Codec::json(), PlaceError::from).caching_errors(Codec::json());
            let result = execute(call.finish(), ops, move || body(spec.name, order, refuse)).await;
            encode_result(spec, result, false, None)
        })
    }

    const fn spec(name: &'static str, task: TaskSupport) -> ToolSpec {
        ToolSpec {
            description: "Place an order.",
            cache_errors: true,
            task,
            ttl: Duration::from_secs(3_600),
            // Short, so a worker dropped mid-body leaves an unknown outcome soon.
            lease: Duration::from_millis(300),
            ..ToolSpec::fixture(
                name,
                ToolKind::Mutating,
                &["order"],
                &["order", "refuse"],
                SourceLocation {
                    module_path: module_path!(),
                    file: file!(),
                    line: line!(),
                    column: 1,
                },
            )
        }
    }

    fn input_schema() -> Value {
        json!({"type": "object", "properties": {"order": {"type": "integer"}, "refuse": {"type": "boolean"}}, "required": ["order"]})
    }

    fn output_schema() -> Option<Value> {
        Some(
            json!({"type": "object", "properties": {"order": {"type": "integer"}, "placed": {"type": "boolean"}}}),
        )
    }

    macro_rules! tool {
        ($descriptor:ident, $spec:ident, $name:literal, $task:expr) => {
            static $spec: ToolSpec = spec($name, $task);
            pub(super) static $descriptor: ToolDescriptor = ToolDescriptor::new(
                &$spec,
                Some(|args| builder(&$spec, args).0.key()),
                |_: &Context, args| invoke(&$spec, args.into_value()),
                input_schema,
                output_schema,
            );
        };
    }

    static APPROVED_SPEC: ToolSpec = ToolSpec {
        approval: crate::spec::ApprovalRule::Required,
        ..spec("place_approved", TaskSupport::Forbidden)
    };
    /// `place_order` with `approval = "required"`: every new intent waits for a decision.
    pub(super) static APPROVED: ToolDescriptor = ToolDescriptor::new(
        &APPROVED_SPEC,
        Some(|args| builder(&APPROVED_SPEC, args).0.key()),
        |_: &Context, args| invoke(&APPROVED_SPEC, args.into_value()),
        input_schema,
        output_schema,
    );

    tool!(PLACE, PLACE_SPEC, "place_order", TaskSupport::Optional);
    tool!(PLAIN, PLAIN_SPEC, "place_plain", TaskSupport::Forbidden);

    /// The undo of `place_undoable`, as `compensate = path` builds one (never called here).
    fn unplace(
        _args: String,
        _output: String,
        _cx: crate::UndoContext,
    ) -> core::pin::Pin<Box<dyn core::future::Future<Output = Result<Value, String>> + Send>> {
        Box::pin(async { Ok(Value::Null) })
    }

    static UNDOABLE_SPEC: ToolSpec = ToolSpec {
        compensate: Some(unplace),
        ..spec("place_undoable", TaskSupport::Forbidden)
    };
    /// `place_plain` with `compensate`.
    pub(super) static UNDOABLE: ToolDescriptor = ToolDescriptor::new(
        &UNDOABLE_SPEC,
        Some(|args| builder(&UNDOABLE_SPEC, args).0.key()),
        |_: &Context, args| invoke(&UNDOABLE_SPEC, args.into_value()),
        input_schema,
        output_schema,
    );
    tool!(
        ONLY_AS_TASK,
        ONLY_AS_TASK_SPEC,
        "place_only_as_task",
        TaskSupport::Required
    );
}

/// `compensable` in the idempotency contract of `tools/list` says which tools a run's
/// compensation can undo (`compensate = path`); a read-only tool's contract stays as it was.
#[tokio::test]
async fn tools_list_says_which_tools_can_be_undone() {
    let registry = Registry::from_tools([&shop::PLAIN, &shop::UNDOABLE, &fixtures::SEVEN]).unwrap();
    let mut client = Client::connect(McpServer::new(registry), false).await;
    let tools = client.result("tools/list", json!({})).await;
    let contract = |name: &str| {
        tools["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .map(|t| t["_meta"][IDEMPOTENCY_META_KEY].clone())
            .unwrap()
    };
    assert_eq!(contract("place_undoable")["compensable"], true);
    assert_eq!(contract("place_plain")["compensable"], false);
    assert_eq!(contract("seven"), json!({"kind": "read_only"}));
    client.close().await;
}

/// A server of the shop's tools on `store` (shared by servers built from the same one, as
/// processes share a durable store), in `scope` if given.
fn shop_server(store: &Arc<dyn crate::store::Store>, scope: Option<&str>) -> McpServer {
    let registry = Registry::from_tools([&shop::PLACE, &shop::PLAIN, &shop::ONLY_AS_TASK]).unwrap();
    let server = McpServer::new(registry);
    let store = Arc::clone(store);
    let server = server.map(|inner| inner.store = Some(store));
    match scope {
        Some(scope) => server.with_scope(scope),
        None => server,
    }
}

fn memory_store() -> Arc<dyn crate::store::Store> {
    Arc::new(crate::store::MemoryStore::new())
}

/// The key `tool` derives for `args` in `scope`: what its task is named.
async fn key_of(tool: &ToolDescriptor, args: &Value, scope: Option<&str>) -> String {
    let key = async { tool.key(args).unwrap().unwrap() };
    match scope {
        Some(scope) => crate::with_scope(scope, key).await,
        None => key.await,
    }
}

/// An MCP client speaking raw JSON-RPC to `McpServer::serve_io` over an in-memory pipe,
/// one request at a time.
struct Client {
    write: tokio::io::WriteHalf<tokio::io::DuplexStream>,
    lines: tokio::io::Lines<BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>,
    next_id: u64,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    /// What `initialize` answered.
    init: Value,
    /// From protocol 2026-07-28 on (no `initialize`): the `_meta` every request carries.
    stamp: Option<Value>,
}

impl Client {
    /// Connects and initializes; `takes_tasks`: the client declares the tasks extension
    /// (SEP-2663) in its capabilities.
    async fn connect(server: McpServer, takes_tasks: bool) -> Client {
        let capabilities = match takes_tasks {
            true => json!({"extensions": {rmcp::model::TASKS_EXTENSION_ID: {}}}),
            false => json!({}),
        };
        Client::connect_with(server, capabilities).await
    }

    /// A client on the pipe of a running `server`, not initialized.
    fn open(server: McpServer) -> Client {
        let (client, server_side) = tokio::io::duplex(1 << 20);
        let (server_read, server_write) = tokio::io::split(server_side);
        let server = tokio::spawn(server.serve_io(server_read, server_write));
        let (read, write) = tokio::io::split(client);
        Client {
            write,
            lines: BufReader::new(read).lines(),
            next_id: 1,
            server,
            init: Value::Null,
            stamp: None,
        }
    }

    /// A client of protocol 2026-07-28: no `initialize`; every request carries the
    /// version, `clientInfo` and these `capabilities` in its `_meta`.
    fn modern(server: McpServer, capabilities: Value) -> Client {
        let mut client = Client::open(server);
        client.stamp = Some(json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": capabilities,
        }));
        client
    }

    /// Connects and initializes (protocol 2025-11-25) declaring `capabilities`.
    async fn connect_with(server: McpServer, capabilities: Value) -> Client {
        let mut client = Client::open(server);
        let init = client
            .request(
                "initialize",
                json!({"protocolVersion": "2025-11-25", "capabilities": capabilities, "clientInfo": {"name": "test", "version": "1"}}),
            )
            .await;
        client.init = init["result"].clone();
        client
            .send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        client
    }

    async fn send(&mut self, message: &Value) {
        self.write
            .write_all(format!("{message}\n").as_bytes())
            .await
            .unwrap();
    }

    /// The whole response to one request (`result` or `error`), notifications skipped.
    async fn request(&mut self, method: &str, params: Value) -> Value {
        self.request_answering(method, params, |_| {
            panic!("the server asked the client something")
        })
        .await
        .1
    }

    /// The whole response to one request, answering each request the server sends
    /// meanwhile with `answer(request)` (a JSON-RPC `result`, or `{"error": …}` for an
    /// error); returns the server's requests too.
    async fn request_answering(
        &mut self,
        method: &str,
        mut params: Value,
        mut answer: impl FnMut(&Value) -> Value,
    ) -> (Vec<Value>, Value) {
        let id = self.next_id;
        self.next_id += 1;
        if let (Some(stamp), Value::Object(params)) = (&self.stamp, &mut params) {
            let meta = params.entry("_meta").or_insert_with(|| json!({}));
            if let (Value::Object(meta), Value::Object(stamp)) = (meta, stamp) {
                meta.extend(stamp.clone());
            }
        }
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        let mut asked = Vec::new();
        loop {
            let line =
                tokio::time::timeout(core::time::Duration::from_secs(20), self.lines.next_line())
                    .await
                    .expect("an answer within 20 s")
                    .unwrap()
                    .expect("the server kept the pipe open");
            let message: Value = serde_json::from_str(&line).unwrap();
            if message.get("method").is_some() && message.get("id").is_some() {
                let reply = answer(&message);
                let reply = match reply.get("error") {
                    Some(error) => json!({"jsonrpc": "2.0", "id": message["id"], "error": error}),
                    None => json!({"jsonrpc": "2.0", "id": message["id"], "result": reply}),
                };
                asked.push(message);
                self.send(&reply).await;
            } else if message["id"] == id {
                return (asked, message);
            }
        }
    }

    async fn result(&mut self, method: &str, params: Value) -> Value {
        let answer = self.request(method, params).await;
        assert!(answer.get("error").is_none(), "{method}: {answer}");
        answer["result"].clone()
    }

    async fn error(&mut self, method: &str, params: Value) -> Value {
        let answer = self.request(method, params).await;
        assert!(answer.get("result").is_none(), "{method}: {answer}");
        answer["error"].clone()
    }

    async fn call(&mut self, tool: &str, args: Value) -> Value {
        self.result("tools/call", json!({"name": tool, "arguments": args}))
            .await
    }

    async fn get(&mut self, task_id: &str) -> Value {
        self.result("tasks/get", json!({"taskId": task_id})).await
    }

    /// Polls `tasks/get` until the task leaves `working`.
    async fn settled(&mut self, task_id: &str) -> Value {
        for _ in 0..400 {
            let task = self.get(task_id).await;
            if task["status"] != "working" {
                return task;
            }
            tokio::time::sleep(core::time::Duration::from_millis(10)).await;
        }
        panic!("task {task_id} still working after 4 s");
    }

    /// Closes the pipe and waits for the server to return (after its running tasks).
    async fn close(mut self) {
        self.write.shutdown().await.unwrap();
        tokio::time::timeout(core::time::Duration::from_secs(20), self.server)
            .await
            .expect("the server ends with its input")
            .unwrap()
            .unwrap();
    }
}

#[tokio::test]
async fn a_task_is_named_by_the_call_key_and_a_retry_names_the_same_task() {
    let store = memory_store();
    let mut client = Client::connect(shop_server(&store, None), true).await;
    assert_eq!(
        client.init["capabilities"]["extensions"][rmcp::model::TASKS_EXTENSION_ID],
        json!({}),
        "the server declares the tasks extension: {}",
        client.init
    );
    let args = json!({"order": 101});
    let key = key_of(&shop::PLACE, &args, None).await;
    shop::gate(101);

    let first = client.call("place_order", args.clone()).await;
    assert_eq!(first["resultType"], "task", "{first}");
    assert_eq!(
        first["taskId"], key,
        "the task id is the call's key: {first}"
    );
    assert_eq!(first["status"], "working", "{first}");
    assert_eq!(first["pollIntervalMs"], 1000, "{first}");
    assert_eq!(first["_meta"][CALL_META_KEY]["key"], key);
    assert_eq!(
        first["_meta"][CALL_META_KEY]["operation"],
        format!("tool-contracts://operations/{key}")
    );
    // The task's TTL is the tool's (an hour here), from its creation (the store's times, to
    // its clock's resolution).
    let ttl = first["ttlMs"].as_u64().unwrap();
    assert!((3_599_000..=3_601_000).contains(&ttl), "{first}");

    // While the first call runs: the same task, nothing started again.
    let retry = client.call("place_order", args.clone()).await;
    assert_eq!(retry["resultType"], "task", "{retry}");
    assert_eq!(retry["taskId"], key, "{retry}");
    assert_eq!(retry["status"], "working");
    let working = client.get(&key).await;
    assert_eq!(working["status"], "working", "{working}");
    assert_eq!(working["resultType"], "complete", "{working}");
    assert_eq!(shop::effects("place_order", 101), 1);

    shop::open(101);
    let done = client.settled(&key).await;
    assert_eq!(done["status"], "completed", "{done}");
    let result = &done["result"];
    assert_eq!(result["isError"], false, "{done}");
    assert_eq!(
        result["structuredContent"],
        json!({"order": 101, "placed": true})
    );
    assert_eq!(result["_meta"][CALL_META_KEY]["key"], key);
    assert_eq!(result["_meta"][CALL_META_KEY]["outcome"], "replayed");
    assert!(
        result["content"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "resource_link"
                && c["uri"] == format!("tool-contracts://operations/{key}")),
        "{done}"
    );
    assert!(done.get("pollIntervalMs").is_none(), "{done}");

    // After it finished: still the same task, now completed; and the plain result for a
    // client that does not take tasks is the one inlined.
    let after = client.call("place_order", args.clone()).await;
    assert_eq!(
        (&after["taskId"], &after["status"]),
        (&json!(key), &json!("completed"))
    );
    assert_eq!(shop::effects("place_order", 101), 1);
    client.close().await;
    let mut plain = Client::connect(shop_server(&store, None), false).await;
    let replayed = plain.call("place_order", args).await;
    assert_eq!(replayed["structuredContent"], result["structuredContent"]);
    plain.close().await;

    // Another server on the same store (a restart, or another process) answers for it.
    let mut other = Client::connect(shop_server(&store, None), true).await;
    assert_eq!(other.get(&key).await, done);
    other.close().await;
}

#[tokio::test]
async fn tasks_get_reports_a_stored_error_as_completed_and_an_unknown_outcome_as_failed() {
    let store = memory_store();
    let mut client = Client::connect(shop_server(&store, None), true).await;

    // A tool error the tool stores (`cache_errors`): completed, with the `isError` result.
    let refused = client
        .call("place_order", json!({"order": 202, "refuse": true}))
        .await;
    let key = refused["taskId"].as_str().unwrap().to_owned();
    let task = client.settled(&key).await;
    assert_eq!(task["status"], "completed", "{task}");
    assert_eq!(task["result"]["isError"], true, "{task}");
    assert_eq!(
        task["result"]["_meta"][CALL_META_KEY]["error"],
        "tool_failed"
    );
    assert!(
        task["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("order 202 is refused")),
        "{task}"
    );

    // A claim whose worker died (its lease ran out): failed, with what to do next; a read
    // never reruns it, and a retry names the same task without running the body.
    let args = json!({"order": 203});
    let key = key_of(&shop::PLACE, &args, None).await;
    let fingerprint = "dead worker";
    let outcome = store
        .claim(crate::store::ClaimRequest {
            key: &key,
            tool: "place_order",
            version: 1,
            scope: None,
            fingerprint,
            args: "{}",
            lease: core::time::Duration::from_millis(30),
            ttl: core::time::Duration::from_secs(3_600),
            worker: "a process that died",
        })
        .await
        .unwrap();
    assert!(
        matches!(outcome, crate::store::ClaimOutcome::Acquired { .. }),
        "{outcome:?}"
    );
    let working = client.get(&key).await;
    assert_eq!(working["status"], "working", "{working}");
    tokio::time::sleep(core::time::Duration::from_millis(60)).await;
    let unknown = client.get(&key).await;
    assert_eq!(unknown["status"], "failed", "{unknown}");
    assert_eq!(unknown["error"]["code"], -32603, "{unknown}");
    assert_eq!(unknown["error"]["data"]["code"], "outcome_unknown");
    assert!(
        unknown["statusMessage"]
            .as_str()
            .is_some_and(|m| m.starts_with("outcome unknown")),
        "{unknown}"
    );
    assert_eq!(client.get(&key).await["status"], "failed");
    assert_eq!(shop::effects("place_order", 203), 0);
    client.close().await;
}

#[tokio::test]
async fn a_retry_of_an_unknown_outcome_names_its_task_and_runs_nothing() {
    let store = memory_store();
    let server = shop_server(&store, None);
    let args = json!({"order": 204});
    let key = key_of(&shop::PLACE, &args, None).await;
    // A worker that dies mid-body: the call is dropped while its body waits, so its lease
    // (300 ms) runs out with the outcome unknown.
    shop::gate(204);
    let worker = {
        let (server, args) = (server.clone(), args.clone());
        tokio::spawn(async move { server.run_call("place_order", args, None).await })
    };
    while shop::effects("place_order", 204) == 0 {
        tokio::time::sleep(core::time::Duration::from_millis(5)).await;
    }
    worker.abort();
    let _ = worker.await;
    tokio::time::sleep(core::time::Duration::from_millis(400)).await;

    let mut client = Client::connect(server, true).await;
    let retry = client.call("place_order", args).await;
    assert_eq!(retry["resultType"], "task", "{retry}");
    assert_eq!(retry["taskId"], key, "{retry}");
    assert_eq!(retry["status"], "failed", "{retry}");
    let task = client.get(&key).await;
    assert_eq!(task["error"]["data"]["code"], "outcome_unknown", "{task}");
    assert_eq!(task["error"]["data"]["verify"], false, "{task}");
    shop::open(204);
    assert_eq!(
        shop::effects("place_order", 204),
        1,
        "the retry ran the body again"
    );
    client.close().await;
}

#[tokio::test]
async fn a_task_of_another_scope_reads_as_an_unknown_task() {
    let store = memory_store();
    let mut acme = Client::connect(shop_server(&store, Some("acme")), true).await;
    let created = acme.call("place_order", json!({"order": 301})).await;
    let key = created["taskId"].as_str().unwrap().to_owned();
    assert_eq!(
        key,
        key_of(&shop::PLACE, &json!({"order": 301}), Some("acme")).await
    );
    assert_eq!(acme.settled(&key).await["status"], "completed");
    acme.close().await;

    let mut globex = Client::connect(shop_server(&store, Some("globex")), true).await;
    let never = "0".repeat(64);
    for method in ["tasks/get", "tasks/cancel", "tasks/update"] {
        let mut params = json!({"taskId": key});
        let mut never_params = json!({"taskId": never});
        if method == "tasks/update" {
            params["inputResponses"] = json!({});
            never_params["inputResponses"] = json!({});
        }
        let foreign = globex.error(method, params).await;
        let unknown = globex.error(method, never_params).await;
        assert_eq!(foreign["code"], -32602, "{method}: {foreign}");
        assert_eq!(
            foreign.to_string().replace(&key, "K"),
            unknown.to_string().replace(&never, "K"),
            "{method}: another tenant's task must read like one never created"
        );
    }
    // A key of a tool that takes no tasks names no task either.
    let plain = globex.call("place_plain", json!({"order": 302})).await;
    assert!(
        plain.get("resultType").is_none_or(|t| t == "complete"),
        "{plain}"
    );
    let plain_key = plain["_meta"][CALL_META_KEY]["key"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        globex
            .error("tasks/get", json!({"taskId": plain_key}))
            .await["code"],
        -32602
    );
    globex.close().await;
}

#[tokio::test]
async fn cancel_is_acknowledged_while_working_runs_nothing_twice_and_refuses_a_finished_task() {
    let store = memory_store();
    let mut client = Client::connect(shop_server(&store, None), true).await;
    shop::gate(401);
    let created = client.call("place_order", json!({"order": 401})).await;
    let key = created["taskId"].as_str().unwrap().to_owned();
    let ack = client.result("tasks/cancel", json!({"taskId": key})).await;
    assert_eq!(ack, json!({"resultType": "complete"}));
    // The call is not stopped mid-effect: it runs to its end and its result is stored.
    assert_eq!(client.get(&key).await["status"], "working");
    shop::open(401);
    let done = client.settled(&key).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["structuredContent"]["order"], 401);
    let finished = client.error("tasks/cancel", json!({"taskId": key})).await;
    assert_eq!(finished["code"], -32602, "{finished}");
    assert!(
        finished["message"]
            .as_str()
            .is_some_and(|m| m.contains("already finished")),
        "{finished}"
    );
    assert_eq!(finished["data"]["state"], "completed");
    assert_eq!(shop::effects("place_order", 401), 1);
    // `tasks/update` on a known task: acknowledged (nothing here ever asks for input).
    let update = client
        .result("tasks/update", json!({"taskId": key, "inputResponses": {}}))
        .await;
    assert_eq!(update, json!({"resultType": "complete"}));
    client.close().await;
}

#[tokio::test]
async fn without_the_extension_or_the_option_a_call_gets_its_result() {
    let store = memory_store();
    // A client that takes tasks, a tool that does not: the result.
    let mut tasks = Client::connect(shop_server(&store, None), true).await;
    let plain = tasks.call("place_plain", json!({"order": 501})).await;
    assert_eq!(
        plain["structuredContent"],
        json!({"order": 501, "placed": true}),
        "{plain}"
    );
    // Refused before anything of its intent was stored (another intent holds the key): the
    // plain refusal, never a task naming the other intent's operation.
    let first = tasks.call("place_order", json!({"order": 502})).await;
    let key = first["taskId"].as_str().unwrap().to_owned();
    tasks.settled(&key).await;
    let reused = tasks
        .call("place_order", json!({"order": 502, "refuse": true}))
        .await;
    assert_eq!(reused["isError"], true, "{reused}");
    assert_eq!(
        reused["_meta"][CALL_META_KEY]["error"], "key_reused",
        "{reused}"
    );
    // Invalid arguments: the plain refusal too.
    let invalid = tasks
        .result("tools/call", json!({"name": "place_order", "arguments": {"order": 503}, "_meta": {CLIENT_KEY_META_KEY: ""}}))
        .await;
    assert_eq!(invalid["isError"], true, "{invalid}");
    tasks.close().await;

    // A client that does not declare the extension: the result, or -32021 for a tool that
    // runs only as a task; and the task methods are refused (rmcp's gate).
    let mut plain = Client::connect(shop_server(&store, None), false).await;
    let result = plain.call("place_order", json!({"order": 504})).await;
    assert_eq!(result["structuredContent"]["order"], 504, "{result}");
    assert!(result.get("taskId").is_none());
    let required = plain
        .error(
            "tools/call",
            json!({"name": "place_only_as_task", "arguments": {"order": 505}}),
        )
        .await;
    assert_eq!(required["code"], -32021, "{required}");
    assert_eq!(
        required["data"]["requiredCapabilities"]["extensions"][rmcp::model::TASKS_EXTENSION_ID],
        json!({})
    );
    assert_eq!(shop::effects("place_only_as_task", 505), 0);
    assert_eq!(
        plain.error("tasks/get", json!({"taskId": key})).await["code"],
        -32021
    );
    plain.close().await;

    // The option is published with the contract; a server whose tools take no tasks does
    // not declare the extension.
    let mut tasks = Client::connect(shop_server(&store, None), true).await;
    let tools = tasks.result("tools/list", json!({})).await;
    let task_of = |name: &str| {
        tools["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .map(|t| t["_meta"][IDEMPOTENCY_META_KEY]["task"].clone())
    };
    assert_eq!(task_of("place_order"), Some(json!("optional")));
    assert_eq!(task_of("place_plain"), Some(json!("forbidden")));
    assert_eq!(task_of("place_only_as_task"), Some(json!("required")));
    let only = tasks
        .call("place_only_as_task", json!({"order": 506}))
        .await;
    assert_eq!(only["resultType"], "task", "{only}");
    tasks.close().await;
    let seven = Client::connect(seven(), true).await;
    assert!(
        seven.init["capabilities"].get("extensions").is_none(),
        "{}",
        seven.init
    );
    seven.close().await;
}

#[tokio::test]
async fn the_server_returns_only_once_its_running_tasks_have_ended() {
    let store = memory_store();
    let mut client = Client::connect(shop_server(&store, None), true).await;
    shop::gate(601);
    let created = client.call("place_order", json!({"order": 601})).await;
    let key = created["taskId"].as_str().unwrap().to_owned();
    let opener = tokio::spawn(async {
        tokio::time::sleep(core::time::Duration::from_millis(200)).await;
        shop::open(601);
    });
    // The client goes away while the call runs: the server waits for it to end.
    client.close().await;
    opener.await.unwrap();
    let op = shop_server(&store, None).operation(&key).await.unwrap();
    assert_eq!(
        op.map(|op| op.state),
        Some(crate::OperationState::Completed)
    );
}

// ---------------------------------------------------------------------------------------
// Approval through the MCP client (`approval.rs`): `elicitation/create` up to 2025-11-25,
// an `input_required` result from 2026-07-28 on; without elicitation, the tool error.
// ---------------------------------------------------------------------------------------

/// A server of `place_approved` (`approval = "required"`) on `store`.
fn approval_server(store: &Arc<dyn crate::store::Store>) -> McpServer {
    let registry = Registry::from_tools([&shop::APPROVED]).unwrap();
    let store = Arc::clone(store);
    McpServer::new(registry).map(|inner| inner.store = Some(store))
}

/// What a client that declared elicitation answers: a JSON-RPC result, or `{"error": …}`.
fn answering(answer: Value) -> impl FnMut(&Value) -> Value {
    move |request: &Value| {
        assert_eq!(request["method"], "elicitation/create", "{request}");
        answer.clone()
    }
}

fn call_params(order: u64) -> Value {
    json!({"name": "place_approved", "arguments": {"order": order}})
}

fn text_of(result: &Value) -> String {
    result["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The operation document of `key` as `get_operation` returns it.
async fn operation_doc(client: &mut Client, key: &str) -> Value {
    let read = client.call(OPERATION_TOOL, json!({"key": key})).await;
    assert_eq!(read["isError"], false, "{read}");
    read["structuredContent"].clone()
}

/// What the person sees: the tool, the intent (arguments), the consequences, the link, and
/// a form with one optional `reason`.
fn assert_is_the_question(params: &Value, key: &str, order: u64) {
    let message = params["message"].as_str().unwrap_or_default();
    for said in [
        "Approve this call of `place_approved`?",
        &format!("{{\"order\":{order},\"refuse\":false}}"),
        "one intent per order",
        "About the tool: Place an order.",
        "runs once",
        "If you decline, it does not run",
        "If you cancel, nothing is decided",
        &operation_uri(key),
    ] {
        assert!(message.contains(said), "{said:?} not in {message}");
    }
    let schema = &params["requestedSchema"];
    assert_eq!(schema["type"], "object", "{schema}");
    assert_eq!(schema["properties"]["reason"]["type"], "string", "{schema}");
    assert!(schema.get("required").is_none(), "{schema}");
    let meta = &params["_meta"][APPROVAL_META_KEY];
    assert_eq!(meta["key"], key, "{params}");
    assert_eq!(meta["operation"], operation_uri(key), "{params}");
    assert_eq!(meta["arguments"]["order"], order, "{params}");
}

#[tokio::test]
async fn accepting_the_elicitation_approves_and_runs_the_call_once_and_a_retry_asks_nothing() {
    let store = memory_store();
    let mut client =
        Client::connect_with(approval_server(&store), json!({"elicitation": {}})).await;
    let key = key_of(&shop::APPROVED, &json!({"order": 301}), None).await;
    let accept = json!({"action": "accept", "content": {"reason": "the customer called"}});
    let (asked, answer) = client
        .request_answering("tools/call", call_params(301), answering(accept.clone()))
        .await;
    assert_eq!(asked.len(), 1, "one question: {asked:?}");
    assert_is_the_question(&asked[0]["params"], &key, 301);
    let result = &answer["result"];
    assert_eq!(result["isError"], false, "{answer}");
    assert_eq!(
        result["structuredContent"],
        json!({"order": 301, "placed": true})
    );
    assert_eq!(
        result["_meta"][CALL_META_KEY]["outcome"], "executed",
        "{result}"
    );
    assert_eq!(shop::effects("place_approved", 301), 1);

    let (asked, again) = client
        .request_answering("tools/call", call_params(301), answering(accept))
        .await;
    assert!(asked.is_empty(), "a retry asks nothing: {asked:?}");
    assert_eq!(
        again["result"]["_meta"][CALL_META_KEY]["outcome"], "replayed",
        "{again}"
    );
    assert_eq!(shop::effects("place_approved", 301), 1, "the body ran once");

    let op = operation_doc(&mut client, &key).await;
    assert_eq!(op["state"], "completed", "{op}");
    let decision = &op["approval"]["decision"];
    assert_eq!(decision["verdict"], "approved", "{op}");
    assert_eq!(decision["by"], "mcp-client:test", "{op}");
    assert_eq!(decision["channel"], "mcp-elicitation", "{op}");
    assert_eq!(decision["reason"], "the customer called", "{op}");
    client.close().await;
}

#[tokio::test]
async fn declining_the_elicitation_denies_and_a_retry_gets_the_denial_without_a_question() {
    let store = memory_store();
    let mut client =
        Client::connect_with(approval_server(&store), json!({"elicitation": {}})).await;
    let key = key_of(&shop::APPROVED, &json!({"order": 302}), None).await;
    for (round, reason) in [(1, "not this one"), (2, "")] {
        let decline = json!({"action": "decline", "content": {"reason": reason}});
        let (asked, answer) = client
            .request_answering("tools/call", call_params(302), answering(decline))
            .await;
        assert_eq!(
            asked.len(),
            usize::from(round == 1),
            "round {round}: {asked:?}"
        );
        let result = &answer["result"];
        assert_eq!(result["isError"], true, "{answer}");
        let meta = &result["_meta"][CALL_META_KEY];
        assert_eq!(meta["error"], "denied", "{result}");
        assert_eq!(meta["key"], key.as_str());
        assert_eq!(meta["operation"], operation_uri(&key));
        let text = text_of(result);
        assert!(
            text.contains("mcp-client:test via mcp-elicitation denied this call"),
            "{text}"
        );
        assert!(
            text.contains("not this one"),
            "the first reason stands: {text}"
        );
        assert!(
            result["content"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["type"] == "resource_link" && c["uri"] == operation_uri(&key)),
            "{result}"
        );
    }
    assert_eq!(shop::effects("place_approved", 302), 0);
    let op = operation_doc(&mut client, &key).await;
    assert_eq!(op["state"], "denied", "{op}");
    client.close().await;
}

#[tokio::test]
async fn a_decline_without_a_reason_is_stored_as_declined_in_the_client() {
    let store = memory_store();
    let mut client = Client::connect_with(
        approval_server(&store),
        json!({"elicitation": {"form": {}}}),
    )
    .await;
    let key = key_of(&shop::APPROVED, &json!({"order": 303}), None).await;
    let (_, answer) = client
        .request_answering(
            "tools/call",
            call_params(303),
            answering(json!({"action": "decline"})),
        )
        .await;
    assert_eq!(
        answer["result"]["_meta"][CALL_META_KEY]["error"], "denied",
        "{answer}"
    );
    let op = operation_doc(&mut client, &key).await;
    assert_eq!(
        op["approval"]["decision"]["reason"],
        super::approval::DECLINED,
        "{op}"
    );
    client.close().await;
}

#[tokio::test]
async fn a_cancel_or_a_failed_elicitation_decides_nothing_and_the_call_stays_pending() {
    let store = memory_store();
    let mut client =
        Client::connect_with(approval_server(&store), json!({"elicitation": {}})).await;
    let key = key_of(&shop::APPROVED, &json!({"order": 304}), None).await;
    let answers = [
        (
            json!({"action": "cancel"}),
            "cancelled the approval question",
        ),
        (
            json!({"error": {"code": -32600, "message": "no human here"}}),
            "gave no answer",
        ),
    ];
    for (reply, why) in answers {
        let (asked, answer) = client
            .request_answering("tools/call", call_params(304), answering(reply))
            .await;
        assert_eq!(
            asked.len(),
            1,
            "asked again: nothing was decided: {asked:?}"
        );
        let result = &answer["result"];
        assert_eq!(result["isError"], true, "{answer}");
        assert_eq!(
            result["_meta"][CALL_META_KEY]["error"], "awaiting_approval",
            "{result}"
        );
        let text = text_of(result);
        assert!(text.contains(why), "{text}");
        assert!(text.contains("nothing was decided"), "{text}");
        assert!(text.contains(&operation_uri(&key)), "{text}");
        let op = operation_doc(&mut client, &key).await;
        assert_eq!(op["state"], "awaiting_approval", "{op}");
        assert!(op["approval"].get("decision").is_none(), "{op}");
    }
    assert_eq!(shop::effects("place_approved", 304), 0);
    client.close().await;
}

#[tokio::test]
async fn without_elicitation_the_call_is_a_tool_error_naming_how_to_approve() {
    let store = memory_store();
    // No capability; the capability but the channel off; only URL elicitation.
    let clients = [
        (approval_server(&store), json!({}), 305),
        (
            approval_server(&store).without_approval_elicitation(),
            json!({"elicitation": {}}),
            306,
        ),
        (
            approval_server(&store),
            json!({"elicitation": {"url": {}}}),
            307,
        ),
    ];
    for (server, capabilities, order) in clients {
        let mut client = Client::connect_with(server, capabilities).await;
        let key = key_of(&shop::APPROVED, &json!({"order": order}), None).await;
        let (asked, answer) = client
            .request_answering("tools/call", call_params(order), |r| panic!("asked: {r}"))
            .await;
        assert!(asked.is_empty());
        let result = &answer["result"];
        assert_eq!(result["isError"], true, "{answer}");
        let meta = &result["_meta"][CALL_META_KEY];
        assert_eq!(meta["error"], "awaiting_approval", "{result}");
        assert_eq!(meta["key"], key.as_str());
        assert_eq!(meta["operation"], operation_uri(&key));
        let text = text_of(result);
        for said in [
            "needs a person's approval".to_owned(),
            format!("tool-contracts approve {key}"),
            format!("POST /operations/{key}/approve"),
            "retry this same call".to_owned(),
        ] {
            assert!(text.contains(&said), "{said:?} not in {text}");
        }
        let link = result["content"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "resource_link")
            .unwrap_or_else(|| panic!("no link: {result}"));
        assert_eq!(link["uri"], operation_uri(&key));
        let read = client
            .result("resources/read", json!({"uri": operation_uri(&key)}))
            .await;
        let doc: Value =
            serde_json::from_str(read["contents"][0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(doc["state"], "awaiting_approval", "{doc}");
        client.close().await;
    }
}

/// The first round of a 2026-07-28 call needing approval: its `input_required` result.
async fn input_required(client: &mut Client, order: u64) -> Value {
    let first = client.result("tools/call", call_params(order)).await;
    assert_eq!(first["resultType"], "input_required", "{first}");
    first
}

/// The retry of the call with `answer` to the question of `first`.
async fn answer_round(client: &mut Client, order: u64, first: &Value, answer: Value) -> Value {
    let mut params = call_params(order);
    params["inputResponses"] = json!({APPROVAL_META_KEY: answer});
    params["requestState"] = first["requestState"].clone();
    client.result("tools/call", params).await
}

#[tokio::test]
async fn from_2026_07_28_the_question_is_an_input_required_result_answered_by_the_retry() {
    let store = memory_store();
    let caps = json!({"elicitation": {"form": {}}});
    let mut client = Client::modern(approval_server(&store), caps);

    // Accept: the retry carrying the answer runs the body once; a later retry replays.
    let key = key_of(&shop::APPROVED, &json!({"order": 311}), None).await;
    let first = input_required(&mut client, 311).await;
    let question = &first["inputRequests"][APPROVAL_META_KEY];
    assert_eq!(question["method"], "elicitation/create", "{first}");
    assert_is_the_question(&question["params"], &key, 311);
    assert_eq!(
        shop::effects("place_approved", 311),
        0,
        "asking runs nothing"
    );
    let done = answer_round(&mut client, 311, &first, json!({"action": "accept"})).await;
    assert_eq!(done["isError"], false, "{done}");
    assert_eq!(
        done["_meta"][CALL_META_KEY]["outcome"], "executed",
        "{done}"
    );
    let again = client.call("place_approved", json!({"order": 311})).await;
    assert_eq!(
        again["_meta"][CALL_META_KEY]["outcome"], "replayed",
        "no question: {again}"
    );
    assert_eq!(shop::effects("place_approved", 311), 1);
    let op = operation_doc(&mut client, &key).await;
    assert_eq!(op["approval"]["decision"]["by"], "mcp-client:test", "{op}");
    assert_eq!(
        op["approval"]["decision"]["channel"], "mcp-elicitation",
        "{op}"
    );

    // Decline: denied; a retry gets the denial, not a question.
    let first = input_required(&mut client, 312).await;
    let denied = answer_round(
        &mut client,
        312,
        &first,
        json!({"action": "decline", "content": {"reason": "no"}}),
    )
    .await;
    assert_eq!(
        denied["_meta"][CALL_META_KEY]["error"], "denied",
        "{denied}"
    );
    let again = client.call("place_approved", json!({"order": 312})).await;
    assert_eq!(again["_meta"][CALL_META_KEY]["error"], "denied", "{again}");
    assert_eq!(shop::effects("place_approved", 312), 0);

    // Cancel: nothing decided; the next call asks again.
    let first = input_required(&mut client, 313).await;
    let pending = answer_round(&mut client, 313, &first, json!({"action": "cancel"})).await;
    assert_eq!(
        pending["_meta"][CALL_META_KEY]["error"], "awaiting_approval",
        "{pending}"
    );
    assert!(text_of(&pending).contains("cancelled"), "{pending}");
    input_required(&mut client, 313).await;

    // An answer to the question about another call (its state names another key) decides
    // nothing here: this call is asked about.
    let other = input_required(&mut client, 314).await;
    let mut params = call_params(315);
    params["inputResponses"] = json!({APPROVAL_META_KEY: {"action": "accept"}});
    params["requestState"] = other["requestState"].clone();
    let asked = client.result("tools/call", params).await;
    assert_eq!(asked["resultType"], "input_required", "{asked}");
    let key_314 = key_of(&shop::APPROVED, &json!({"order": 314}), None).await;
    assert_eq!(
        operation_doc(&mut client, &key_314).await["state"],
        "awaiting_approval"
    );
    assert_eq!(
        shop::effects("place_approved", 314) + shop::effects("place_approved", 315),
        0
    );

    // A 2026-07-28 client without elicitation: the tool error, at once.
    let mut plain = Client::modern(approval_server(&store), json!({}));
    let refused = plain.call("place_approved", json!({"order": 316})).await;
    assert_eq!(
        refused["_meta"][CALL_META_KEY]["error"], "awaiting_approval",
        "{refused}"
    );
    client.close().await;
    plain.close().await;
}
