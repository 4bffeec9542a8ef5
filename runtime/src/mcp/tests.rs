//! The server over a hand-built tool: results, and the stdio transport against rmcp's own.
//! (The HTTP server is tested end to end, with a real HTTP client, in `tests/mcp_e2e.rs`.)

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::*;
use rmcp::model::ErrorCode;
use rmcp::ServiceExt;

mod fixtures {
    //! A read-only tool built by hand as `#[read_only_tool]` builds one.
    use core::time::Duration;

    use serde_json::Value;

    use crate::error::Error;
    use crate::registry::{BoxFuture, Context, ToolDescriptor};
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

    fn invoke(_: &Context, _: Value) -> BoxFuture<'_, Result<Value, Error>> {
        Box::pin(async { Ok(Value::from(7)) })
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
