//! The servers and the client of the surfaces bench (`benches/surfaces.rs`) and of its
//! callgrind example (`examples/surfaces_profile.rs`): `McpServer`, `HttpTools` and
//! `IdempotencyLayer` on `MemoryStore`s, the bare rmcp server and the bare axum handler, and
//! an HTTP/1.1 client (hyper) speaking to each. Needs `mod tool` (`common/tool.rs`) at the
//! crate root.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::routing::post;
use axum::Json;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::Value;
use tool_contracts::http::{HttpTools, IdempotencyLayer};
use tool_contracts::mcp::rmcp;
use tool_contracts::mcp::McpServer;
use tool_contracts::MemoryStore;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, ServerHandler};

use crate::tool;

/// The protocol version the client initializes with.
pub const PROTOCOL: &str = "2025-06-18";

/// `McpServer`'s transport settings (runtime/src/mcp/transport.rs), for the bare server:
/// rmcp's defaults (session mode, event streams), a 4 MiB body limit and the loopback
/// `Origin`s, validated.
pub fn mcp_transport_config() -> StreamableHttpServerConfig {
    StreamableHttpServerConfig::default()
        .with_max_request_body_bytes(4 * 1024 * 1024)
        .with_allowed_origins([
            "http://localhost:*",
            "https://localhost:*",
            "http://127.0.0.1:*",
            "https://127.0.0.1:*",
            "http://[::1]:*",
            "https://[::1]:*",
        ])
        .enforce_origin_validation()
}

// ------------------------------------------------------------------ the bare servers

/// The tool's arguments, as the registry decodes them (unknown members refused).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Args {
    user_id: u64,
    cart: tool::Cart,
    note: String,
}

/// The bare axum handler: the tool's work without deduplication.
pub async fn bare_handler(Json(args): Json<Args>) -> Json<tool::Order> {
    let _ = args.note;
    Json(tool::body(args.user_id, args.cart))
}

/// A bare rmcp server exposing the same tool (the same published `Tool`), no dedup.
#[derive(Clone)]
pub struct BareMcp {
    tools: Arc<Vec<Tool>>,
}

impl ServerHandler for BareMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        #[allow(clippy::field_reassign_with_default)]
        let result = {
            let mut result = ListToolsResult::default();
            result.tools = self.tools.as_ref().clone();
            result
        };
        Ok(result)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if request.name != "create_order" {
            return Err(ErrorData::invalid_params("unknown tool", None));
        }
        let args = Value::Object(request.arguments.unwrap_or_default());
        let args: Args = serde_json::from_value(args)
            .map_err(|e| ErrorData::invalid_params(e.to_string(), None))?;
        let _ = args.note;
        let order = tool::body(args.user_id, args.cart);
        let value = serde_json::to_value(order)
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        Ok(CallToolResult::structured(value).into())
    }
}

/// The addresses of every server under test.
#[derive(Clone, Copy)]
pub struct Servers {
    /// `McpServer::serve_http_listener`.
    pub mcp_ours: SocketAddr,
    /// The bare rmcp server.
    pub mcp_bare: SocketAddr,
    /// `HttpTools::into_router`.
    pub tools: SocketAddr,
    /// `POST /orders`: the bare handler behind `IdempotencyLayer`.
    pub layer: SocketAddr,
    /// The bare handler at `POST /orders` and `POST /tools/create_order`.
    pub bare: SocketAddr,
}

async fn listener() -> (tokio::net::TcpListener, SocketAddr) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local addr");
    (listener, addr)
}

/// Serves `router` as `axum::serve` does, with `TCP_NODELAY` on each connection (as
/// `McpServer::serve_http_listener` sets it).
fn serve_router(listener: tokio::net::TcpListener, router: axum::Router) {
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|stream| {
        if let Err(e) = stream.set_nodelay(true) {
            eprintln!("TCP_NODELAY not set: {e}");
        }
    });
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            eprintln!("server stopped: {e}");
        }
    });
}

/// Starts every server on its own ephemeral port; they run until the process ends.
pub async fn start_servers() -> Servers {
    let registry = tool_contracts::registry().clone();

    let (l, mcp_ours) = listener().await;
    let ours = McpServer::new(registry.clone()).with_store(MemoryStore::new());
    let tools = Arc::new(ours.tools().to_vec());
    tokio::spawn(async move {
        if let Err(e) = ours
            .serve_http_listener(l, core::future::pending::<()>())
            .await
        {
            eprintln!("McpServer stopped: {e}");
        }
    });

    let (l, mcp_bare) = listener().await;
    let bare = BareMcp { tools };
    let service = StreamableHttpService::new(
        move || Ok(bare.clone()),
        Arc::new(LocalSessionManager::default()),
        mcp_transport_config(),
    );
    serve_router(l, axum::Router::new().route_service("/mcp", service));

    let (l, tools_addr) = listener().await;
    let router = HttpTools::new(registry)
        .with_store(MemoryStore::new())
        .into_router();
    serve_router(l, router);

    let (l, layer) = listener().await;
    let router = axum::Router::new()
        .route("/orders", post(bare_handler))
        .route_layer(IdempotencyLayer::new().with_store(MemoryStore::new()));
    serve_router(l, router);

    let (l, bare) = listener().await;
    let router = axum::Router::new()
        .route("/orders", post(bare_handler))
        .route("/tools/create_order", post(bare_handler));
    serve_router(l, router);

    Servers {
        mcp_ours,
        mcp_bare,
        tools: tools_addr,
        layer,
        bare,
    }
}

// ------------------------------------------------------------------ the client

/// What one client request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// `tools/call` over streamable HTTP (either MCP server).
    Mcp,
    /// `POST /tools/create_order` with `Prefer: return=representation` (ours or bare).
    ToolsRepresentation,
    /// `POST /tools/create_order` answered `303`, then `GET` of its `Location`.
    ToolsFollow,
    /// `POST /orders` with `Idempotency-Key: k-<user_id>` (layer or bare).
    Orders,
}

/// One client: a keep-alive HTTP/1.1 connection (and an MCP session).
pub struct Client {
    sender: SendRequest<Full<Bytes>>,
    session: Option<String>,
    next_id: u64,
}

pub struct Answer {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

pub fn order_args(user: u64) -> String {
    format!(r#"{{"user_id":{user},"cart":{{"id":"c-42","items":["book"]}},"note":"gift"}}"#)
}

impl Client {
    pub async fn connect(addr: SocketAddr) -> Client {
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        let (sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .expect("handshake");
        tokio::spawn(connection);
        Client {
            sender,
            session: None,
            next_id: 0,
        }
    }

    async fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: String,
    ) -> Answer {
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "127.0.0.1");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(session) = &self.session {
            request = request
                .header("mcp-session-id", session.as_str())
                .header("mcp-protocol-version", PROTOCOL);
        }
        let request = request.body(Full::new(Bytes::from(body))).expect("request");
        self.sender.ready().await.expect("connection ready");
        let response = self.sender.send_request(request).await.expect("response");
        let (parts, body) = response.into_parts();
        let body = body.collect().await.expect("body").to_bytes();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    async fn mcp(&mut self, method: &str, params: &str) -> Answer {
        self.next_id += 1;
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{},"method":"{method}","params":{params}}}"#,
            self.next_id
        );
        self.send(
            "POST",
            "/mcp",
            &[
                ("content-type", "application/json"),
                ("accept", "application/json, text/event-stream"),
            ],
            body,
        )
        .await
    }

    /// Opens an MCP session on this connection.
    pub async fn initialize(&mut self) {
        let params = format!(
            r#"{{"protocolVersion":"{PROTOCOL}","capabilities":{{}},"clientInfo":{{"name":"bench","version":"1"}}}}"#
        );
        let answer = self.mcp("initialize", &params).await;
        assert_eq!(answer.status, StatusCode::OK, "initialize: {answer:?}");
        let session = answer
            .headers
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .expect("a session id")
            .to_owned();
        self.session = Some(session);
        let answer = self
            .send(
                "POST",
                "/mcp",
                &[
                    ("content-type", "application/json"),
                    ("accept", "application/json, text/event-stream"),
                ],
                r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_owned(),
            )
            .await;
        assert_eq!(
            answer.status,
            StatusCode::ACCEPTED,
            "initialized: {answer:?}"
        );
    }

    /// Ends the MCP session (rmcp keeps a worker task per session).
    pub async fn close(&mut self) {
        if self.session.is_some() {
            let answer = self.send("DELETE", "/mcp", &[], String::new()).await;
            if !answer.status.is_success() {
                eprintln!("closing an MCP session: {answer:?}");
            }
            self.session = None;
        }
    }

    /// One call for `user`; the answer of its last request.
    pub async fn call(&mut self, call: Call, user: u64) -> Answer {
        match call {
            Call::Mcp => {
                let params = format!(
                    r#"{{"name":"create_order","arguments":{}}}"#,
                    order_args(user)
                );
                self.mcp("tools/call", &params).await
            }
            Call::ToolsRepresentation => {
                self.send(
                    "POST",
                    "/tools/create_order",
                    &[
                        ("content-type", "application/json"),
                        ("prefer", "return=representation"),
                    ],
                    order_args(user),
                )
                .await
            }
            Call::ToolsFollow => {
                let answer = self
                    .send(
                        "POST",
                        "/tools/create_order",
                        &[("content-type", "application/json")],
                        order_args(user),
                    )
                    .await;
                assert_eq!(answer.status, StatusCode::SEE_OTHER, "{answer:?}");
                let location = answer
                    .headers
                    .get("location")
                    .and_then(|v| v.to_str().ok())
                    .expect("a Location")
                    .to_owned();
                self.send(
                    "GET",
                    &location,
                    &[("accept", "application/json")],
                    String::new(),
                )
                .await
            }
            Call::Orders => {
                let key = format!("k-{user}");
                self.send(
                    "POST",
                    "/orders",
                    &[
                        ("content-type", "application/json"),
                        ("idempotency-key", key.as_str()),
                    ],
                    order_args(user),
                )
                .await
            }
        }
    }
}

impl core::fmt::Debug for Answer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "{} {:?} {}",
            self.status,
            self.headers,
            String::from_utf8_lossy(&self.body)
        )
    }
}

/// The JSON-RPC answer in an MCP event stream.
pub fn mcp_result(answer: &Answer) -> Value {
    let text = String::from_utf8_lossy(&answer.body);
    text.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
        .find(|message| message.get("id").is_some())
        .unwrap_or_else(|| panic!("no JSON-RPC answer in {answer:?}"))
}

/// Checks, before any figure is printed, that each surface answers what it should: a first
/// call executed, its retry replayed (the same body), and the bare servers the same result.
pub async fn check(servers: Servers) {
    let user = 999_999_999;
    let expected =
        serde_json::json!({"order_id": user * 10 + 1, "cart_id": "c-42", "total_cents": 4999});

    for (addr, ours) in [(servers.mcp_ours, true), (servers.mcp_bare, false)] {
        let mut client = Client::connect(addr).await;
        client.initialize().await;
        for round in 0..2 {
            let answer = mcp_result(&client.call(Call::Mcp, user).await);
            let result = &answer["result"];
            assert_eq!(result["structuredContent"], expected, "{answer}");
            assert_ne!(result["isError"], true, "{answer}");
            if ours {
                let outcome = &result["_meta"]["dev.tool-contracts/call"]["outcome"];
                let want = if round == 0 { "executed" } else { "replayed" };
                assert_eq!(outcome, want, "{answer}");
            }
        }
        client.close().await;
    }

    let mut client = Client::connect(servers.tools).await;
    for (call, round) in [
        (Call::ToolsRepresentation, 0),
        (Call::ToolsRepresentation, 1),
        (Call::ToolsFollow, 1),
    ] {
        let answer = client.call(call, user).await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        let body: Value = serde_json::from_slice(&answer.body).expect("JSON");
        if call == Call::ToolsRepresentation {
            assert_eq!(body, expected, "{answer:?}");
            let want = if round == 0 { "executed" } else { "replayed" };
            assert_eq!(answer.headers["tool-contracts-outcome"], want, "{answer:?}");
        } else {
            assert_eq!(body["state"], "completed", "{answer:?}");
            assert_eq!(body["result"], expected, "{answer:?}");
        }
    }

    let mut client = Client::connect(servers.layer).await;
    for round in 0..2 {
        let answer = client.call(Call::Orders, user).await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        let body: Value = serde_json::from_slice(&answer.body).expect("JSON");
        assert_eq!(body, expected, "{answer:?}");
        assert_eq!(
            answer.headers.contains_key("idempotent-replayed"),
            round == 1,
            "{answer:?}"
        );
    }

    let mut client = Client::connect(servers.bare).await;
    for call in [Call::ToolsRepresentation, Call::Orders] {
        let answer = client.call(call, user).await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        let body: Value = serde_json::from_slice(&answer.body).expect("JSON");
        assert_eq!(body, expected, "{answer:?}");
    }
}
