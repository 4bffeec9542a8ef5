//! Serve a [`Registry`] as an MCP server, with the official Rust SDK [`rmcp`].
//!
//! ```no_run
//! # use tool_contracts_runtime as tool_contracts;
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! // Every tool linked into the program, over stdio (what desktop MCP clients launch):
//! tool_contracts::mcp::serve_stdio(tool_contracts::registry()).await?;
//! // …or over streamable HTTP at http://127.0.0.1:8080/mcp:
//! tool_contracts::mcp::serve_http(tool_contracts::registry(), "127.0.0.1:8080".parse()?).await?;
//! # Ok(()) }
//! ```
//!
//! [`McpServer`] implements rmcp's [`ServerHandler`] by hand (the tool set is dynamic), so it
//! also runs on any other rmcp transport: `McpServer::new(registry).serve(transport)`.
//!
//! What the server answers (the full contract is in `docs/mcp.md`):
//!
//! - `tools/list`: every tool's `name`, `description`, `inputSchema`, `outputSchema`,
//!   `annotations` and, under `_meta["dev.tool-contracts/idempotency"]`, its idempotency
//!   contract. A result type whose schema is not an object is published wrapped as
//!   `{"result": <schema>}` (MCP requires an object), and its results are wrapped alike.
//! - `tools/call`: runs the call through the dedup engine ([`Registry::call`]) and answers
//!   with `structuredContent` and a text block carrying the same JSON. Contract failures
//!   (key reused, in progress, outcome unknown, invalid arguments, store down) and the
//!   tool's own errors are results with `isError: true` whose text says what happened,
//!   which key, and what to do next. An unknown tool is a JSON-RPC error (`-32602`).
//!   Every result carries `_meta["dev.tool-contracts/call"]`:
//!   `{"outcome": "executed" | "replayed" | "reconciled" | "rejected" | "failed", "replayed",
//!   "key", …}`.
//! - A client may send its own intent key, as `params.idempotencyKey` or
//!   `params._meta["dev.tool-contracts/idempotencyKey"]` (1 to 255 characters, no control
//!   characters). It is folded into the key as a scope `client:<key>` inside any scope the
//!   server has, so it narrows a key and can never merge two intents or reach another
//!   tenant's results.

use std::borrow::Cow;
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorCode,
    Implementation, JsonObject, ListToolsResult, MetaObject, PaginatedRequestParams,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler, ServiceExt};
use serde_json::{json, Map, Value};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

use crate::ambient::{with_scope, with_store};
use crate::error::Error;
use crate::registry::{Registry, ToolDescriptor, ToolOutput};
use crate::store::Store;

/// Re-exported: the MCP SDK this module is built on, for its transports and model types.
pub use ::rmcp;

/// `_meta` key of a tool's idempotency contract in `tools/list`.
pub const IDEMPOTENCY_META_KEY: &str = "dev.tool-contracts/idempotency";
/// `_meta` key of a `tools/call` result's outcome: `{"outcome", "replayed", "key", …}`.
pub const CALL_META_KEY: &str = "dev.tool-contracts/call";
/// Request `_meta` key under which a client sends its own intent key.
pub const CLIENT_KEY_META_KEY: &str = "dev.tool-contracts/idempotencyKey";
/// The `tools/call` parameter under which a client may send its own intent key (the shape
/// of the MCP idempotency proposal).
pub const CLIENT_KEY_PARAM: &str = "idempotencyKey";
/// The longest client key accepted, in characters.
pub const CLIENT_KEY_MAX_CHARS: usize = 255;
/// The member a non-object result is wrapped in: `{"result": <value>}`.
pub const WRAPPED_RESULT_FIELD: &str = "result";

/// Where the transport adapters move `params.idempotencyKey` (rmcp drops unknown
/// parameters while decoding, `_meta` survives). A client-sent value under this key is
/// removed first, so only `params.idempotencyKey` can set it.
const PARAM_KEY_CARRIER: &str = "dev.tool-contracts/params.idempotencyKey";

/// The longest line (stdio) or body (HTTP) the adapters rewrite; longer input passes
/// through untouched (rmcp refuses it the same way: 16 MiB lines, 4 MiB bodies).
const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;
const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// How a tool's results map onto `structuredContent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OutputShape {
    /// The result schema is an object: the result is the structured content.
    Object,
    /// The result schema is not an object: published and answered as `{"result": …}`.
    Wrapped,
    /// No schema: object results are structured content, others are text only.
    Unknown,
}

/// An MCP server over a [`Registry`]: implements rmcp's [`ServerHandler`], so it runs on
/// any rmcp transport; [`serve_stdio`](McpServer::serve_stdio) and
/// [`serve_http`](McpServer::serve_http) cover the two standard ones.
///
/// Cheap to clone (everything is shared).
#[derive(Clone)]
pub struct McpServer {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    store: Option<Arc<dyn Store>>,
    scope: Option<String>,
    name: String,
    version: String,
    instructions: Option<String>,
    tools: Vec<Tool>,
    shapes: HashMap<&'static str, OutputShape>,
}

impl core::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.inner.name)
            .field("tools", &self.inner.registry)
            .field("scope", &self.inner.scope)
            .field("store", &self.inner.store.as_ref().map(|_| "custom"))
            .finish()
    }
}

impl From<Registry> for McpServer {
    fn from(registry: Registry) -> Self {
        McpServer::new(registry)
    }
}

impl From<&Registry> for McpServer {
    fn from(registry: &Registry) -> Self {
        McpServer::new(registry.clone())
    }
}

const DEFAULT_INSTRUCTIONS: &str = "Tools marked mutating in `_meta[\"dev.tool-contracts/idempotency\"]` are idempotent by their key fields: repeating a call with the same key fields returns the first call's stored result and does nothing again, so retrying after a timeout or lost answer is safe. Change only what the intent is about to make a new call; a retry must repeat the same arguments.";

impl McpServer {
    /// A server for these tools, using the process's store
    /// ([`set_default_store`](crate::set_default_store)) and no scope.
    pub fn new(registry: Registry) -> Self {
        let mut tools = Vec::with_capacity(registry.len());
        let mut shapes = HashMap::with_capacity(registry.len());
        for descriptor in registry.iter() {
            let (json, shape) = tool_json(descriptor);
            shapes.insert(descriptor.name(), shape);
            match serde_json::from_value::<Tool>(json) {
                Ok(tool) => tools.push(tool),
                // Our descriptors always produce a valid tool; never hide one silently.
                Err(e) => {
                    tracing::error!(tool = descriptor.name(), error = %e, "tool-contracts: tool cannot be published over MCP")
                }
            }
        }
        McpServer {
            inner: Arc::new(Inner {
                registry,
                store: None,
                scope: None,
                name: "tool-contracts".to_owned(),
                version: env!("CARGO_PKG_VERSION").to_owned(),
                instructions: Some(DEFAULT_INSTRUCTIONS.to_owned()),
                tools,
                shapes,
            }),
        }
    }

    fn map(self, f: impl FnOnce(&mut Inner)) -> Self {
        let mut inner = match Arc::try_unwrap(self.inner) {
            Ok(inner) => inner,
            Err(shared) => Inner {
                registry: shared.registry.clone(),
                store: shared.store.clone(),
                scope: shared.scope.clone(),
                name: shared.name.clone(),
                version: shared.version.clone(),
                instructions: shared.instructions.clone(),
                tools: shared.tools.clone(),
                shapes: shared.shapes.clone(),
            },
        };
        f(&mut inner);
        McpServer {
            inner: Arc::new(inner),
        }
    }

    /// Runs every call with this store (rmcp runs each request in its own task, where a
    /// store installed with [`with_store`] around the server is not seen).
    pub fn with_store<S: Store>(self, store: S) -> Self {
        let store: Arc<dyn Store> = Arc::new(store);
        self.map(|inner| inner.store = Some(store))
    }

    /// Folds `scope` (a tenant, a deployment) into every key this server makes; client
    /// keys nest inside it. An invalid scope (empty, control characters) makes every
    /// mutating call fail with an `isError` result.
    pub fn with_scope(self, scope: impl Into<String>) -> Self {
        let scope = scope.into();
        self.map(|inner| inner.scope = Some(scope))
    }

    /// The name and version announced in `serverInfo` (default: `tool-contracts` and this
    /// crate's version).
    pub fn with_server_info(self, name: impl Into<String>, version: impl Into<String>) -> Self {
        let (name, version) = (name.into(), version.into());
        self.map(|inner| {
            inner.name = name;
            inner.version = version;
        })
    }

    /// The `instructions` sent at initialization (default: a paragraph telling the model
    /// that mutating tools are safe to retry with the same arguments); `None` sends none.
    pub fn with_instructions(self, instructions: Option<String>) -> Self {
        self.map(|inner| inner.instructions = instructions)
    }

    /// The registry served.
    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// The tools as published in `tools/list`.
    pub fn tools(&self) -> &[Tool] {
        &self.inner.tools
    }

    /// Runs one `tools/call`: what [`ServerHandler::call_tool`] answers, without a
    /// transport. `client_key` is the client's intent key, if it sent one (validated here).
    ///
    /// # Errors
    /// A JSON-RPC error for an unknown tool; every other failure is an `isError` result.
    pub async fn call(
        &self,
        name: &str,
        arguments: Option<JsonObject>,
        client_key: Option<&Value>,
    ) -> Result<CallToolResult, ErrorData> {
        let args = arguments.map_or(Value::Null, Value::Object);
        let client_key = match client_key.map(|k| validate_client_key(name, k)).transpose() {
            Ok(k) => k,
            Err(e) => return Ok(self.error_result(name, e, None)),
        };
        let call = self.inner.registry.call(name, args);
        let call: Pin<Box<dyn Future<Output = Result<ToolOutput, Error>> + Send + '_>> =
            match &client_key {
                Some(k) => Box::pin(with_scope(format!("client:{k}"), call)),
                None => Box::pin(call),
            };
        let call: Pin<Box<dyn Future<Output = Result<ToolOutput, Error>> + Send + '_>> =
            match &self.inner.scope {
                Some(scope) => Box::pin(with_scope(scope.clone(), call)),
                None => call,
            };
        let outcome = match &self.inner.store {
            Some(store) => with_store(Arc::clone(store), call).await,
            None => call.await,
        };
        match outcome {
            Ok(output) => Ok(self.success_result(name, output, client_key.as_deref())),
            Err(Error::UnknownTool { name, suggestion }) => {
                let message = Error::UnknownTool {
                    name: name.clone(),
                    suggestion: suggestion.clone(),
                }
                .to_string();
                Err(ErrorData::new(
                    ErrorCode::INVALID_PARAMS,
                    message,
                    Some(json!({ "code": "unknown_tool", "tool": name, "suggestion": suggestion })),
                ))
            }
            Err(e) => Ok(self.error_result(name, e, client_key.as_deref())),
        }
    }

    fn success_result(
        &self,
        name: &str,
        output: ToolOutput,
        client_key: Option<&str>,
    ) -> CallToolResult {
        let shape = self
            .inner
            .shapes
            .get(name)
            .copied()
            .unwrap_or(OutputShape::Unknown);
        let ToolOutput {
            value,
            key,
            outcome,
            ..
        } = output;
        let (outcome, key) = (outcome.as_str(), key.as_deref());
        let structured = match shape {
            OutputShape::Object => Some(value),
            OutputShape::Wrapped => Some(json!({ WRAPPED_RESULT_FIELD: value })),
            OutputShape::Unknown if value.is_object() => Some(value),
            OutputShape::Unknown => {
                let text = value.to_string();
                let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
                result.meta = Some(call_meta(outcome, key, client_key, None));
                return result;
            }
        };
        let text = structured
            .as_ref()
            .map_or_else(String::new, Value::to_string);
        let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
        result.structured_content = structured;
        result.meta = Some(call_meta(outcome, key, client_key, None));
        result
    }

    fn error_result(&self, name: &str, error: Error, client_key: Option<&str>) -> CallToolResult {
        let outcome = match error {
            Error::ToolFailed { .. } => "failed",
            _ => "rejected",
        };
        tracing::debug!(tool = name, code = error.code(), key = ?error.key(), "tool-contracts: MCP call answered with an error result");
        let mut result = CallToolResult::error(vec![ContentBlock::text(error.to_string())]);
        result.meta = Some(call_meta(outcome, error.key(), client_key, Some(&error)));
        result
    }

    /// Serves over stdin/stdout (newline-delimited JSON-RPC) until the client closes stdin.
    pub async fn serve_stdio(self) -> std::io::Result<()> {
        self.serve_io(tokio::io::stdin(), tokio::io::stdout()).await
    }

    /// Serves over any byte stream pair carrying newline-delimited JSON-RPC (stdio's
    /// framing), until `reader` ends: a child process's pipes, a socket, or an in-memory
    /// [`tokio::io::duplex`] in tests. Unlike passing the pair to rmcp directly, this accepts
    /// a client key sent as `params.idempotencyKey`.
    pub async fn serve_io<R, W>(self, reader: R, writer: W) -> std::io::Result<()>
    where
        R: AsyncRead + Send + Unpin + 'static,
        W: AsyncWrite + Send + Unpin + 'static,
    {
        let (to_rmcp, from_pump) = tokio::io::duplex(64 * 1024);
        let pump = tokio::spawn(normalize_lines(reader, to_rmcp));
        let outcome =
            match self.serve((from_pump, writer)).await {
                Ok(running) => running.waiting().await.map(drop).map_err(|e| {
                    std::io::Error::other(format!("the MCP service task failed: {e}"))
                }),
                Err(e) => Err(std::io::Error::other(format!(
                    "the MCP session did not start: {e}"
                ))),
            };
        pump.abort();
        outcome
    }

    /// Serves streamable HTTP at `http://<addr>/mcp` until the process ends.
    pub async fn serve_http(self, addr: SocketAddr) -> std::io::Result<()> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        self.serve_http_listener(listener, core::future::pending::<()>())
            .await
    }

    /// Serves streamable HTTP at `/mcp` on a bound listener until `shutdown` completes
    /// (open connections then finish on their own). Binding port 0 and reading
    /// [`local_addr`](tokio::net::TcpListener::local_addr) gives a free port.
    ///
    /// Requests are accepted for the hosts `localhost`, `127.0.0.1` and `::1` only (rmcp's
    /// DNS-rebinding protection); put a reverse proxy in front to serve other names.
    pub async fn serve_http_listener(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> std::io::Result<()> {
        use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
        use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};

        let server = self;
        let service = StreamableHttpService::new(
            move || Ok(server.clone()),
            Arc::new(LocalSessionManager::default()),
            StreamableHttpServerConfig::default(),
        );
        let mut shutdown = core::pin::pin!(shutdown);
        loop {
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors and the like: back off, keep serving.
                        tracing::warn!(error = %e, "tool-contracts: MCP HTTP accept failed");
                        tokio::time::sleep(core::time::Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = &mut shutdown => return Ok(()),
            };
            let service = service.clone();
            tokio::spawn(async move {
                let handler = hyper::service::service_fn(move |request| {
                    let service = service.clone();
                    async move { Ok::<_, Infallible>(handle_http(&service, request).await) }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                if let Err(e) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, handler)
                    .await
                {
                    tracing::debug!(%peer, error = %e, "tool-contracts: MCP HTTP connection ended with an error");
                }
            });
        }
    }
}

type HttpResponse = hyper::Response<BoxBody<Bytes, Infallible>>;

async fn handle_http<M>(
    service: &rmcp::transport::StreamableHttpService<McpServer, M>,
    request: hyper::Request<hyper::body::Incoming>,
) -> HttpResponse
where
    M: rmcp::transport::streamable_http_server::SessionManager,
{
    if request.uri().path() != "/mcp" {
        return plain_response(
            hyper::StatusCode::NOT_FOUND,
            "the MCP endpoint of this server is /mcp",
        );
    }
    if request.method() != hyper::Method::POST {
        return service.handle(request).await;
    }
    let (mut parts, body) = request.into_parts();
    let bytes = match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            return plain_response(
                hyper::StatusCode::PAYLOAD_TOO_LARGE,
                &format!(
                    "the request body could not be read or exceeds {MAX_BODY_BYTES} bytes: {e}"
                ),
            )
        }
    };
    let bytes = normalize_bytes(bytes);
    parts.headers.remove(hyper::header::CONTENT_LENGTH);
    service
        .handle(hyper::Request::from_parts(parts, Full::new(bytes)))
        .await
}

fn plain_response(status: hyper::StatusCode, text: &str) -> HttpResponse {
    let mut response = hyper::Response::new(Full::new(Bytes::from(text.to_owned())).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// Rewrites one JSON-RPC body (a message or a batch) so `params.idempotencyKey` survives
/// rmcp's decoding; anything that is not JSON passes unchanged (rmcp reports it).
fn normalize_bytes(bytes: Bytes) -> Bytes {
    let Ok(mut value) = serde_json::from_slice::<Value>(&bytes) else {
        return bytes;
    };
    if !normalize_message(&mut value) {
        return bytes;
    }
    match serde_json::to_vec(&value) {
        Ok(rewritten) => Bytes::from(rewritten),
        Err(_) => bytes,
    }
}

/// Moves `params.idempotencyKey` of a `tools/call` request (or of each in a batch) into
/// `params._meta`, where rmcp keeps it. Returns whether anything changed.
fn normalize_message(message: &mut Value) -> bool {
    match message {
        Value::Array(batch) => batch
            .iter_mut()
            .fold(false, |changed, m| normalize_message(m) | changed),
        Value::Object(message) => {
            if message.get("method").and_then(Value::as_str) != Some("tools/call") {
                return false;
            }
            let Some(Value::Object(params)) = message.get_mut("params") else {
                return false;
            };
            let mut changed = false;
            if let Some(Value::Object(meta)) = params.get_mut("_meta") {
                changed |= meta.remove(PARAM_KEY_CARRIER).is_some();
            }
            if let Some(key) = params.remove(CLIENT_KEY_PARAM) {
                let meta = params
                    .entry("_meta")
                    .or_insert_with(|| Value::Object(Map::new()));
                if !meta.is_object() {
                    *meta = Value::Object(Map::new());
                }
                if let Value::Object(meta) = meta {
                    meta.insert(PARAM_KEY_CARRIER.to_owned(), key);
                }
                changed = true;
            }
            changed
        }
        _ => false,
    }
}

/// Copies newline-delimited JSON-RPC from `reader` to `writer`, normalizing each line.
async fn normalize_lines<R, W>(reader: R, mut writer: W) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut reader = BufReader::new(reader);
    let mut line = Vec::new();
    // Set while passing an over-long line through untouched, until its newline.
    let mut passthrough = false;
    loop {
        let buf = reader.fill_buf().await?;
        if buf.is_empty() {
            if !line.is_empty() {
                writer.write_all(&normalize_line(&line)).await?;
            }
            writer.shutdown().await?;
            return Ok(());
        }
        let newline = buf.iter().position(|b| *b == b'\n');
        let take = newline.map_or(buf.len(), |i| i + 1);
        if passthrough {
            writer.write_all(&buf[..take]).await?;
            passthrough = newline.is_none();
        } else if line.len() + take > MAX_LINE_BYTES {
            writer.write_all(&line).await?;
            writer.write_all(&buf[..take]).await?;
            line.clear();
            passthrough = newline.is_none();
        } else {
            line.extend_from_slice(&buf[..take]);
            if newline.is_some() {
                let out = normalize_line(&line);
                writer.write_all(&out).await?;
                writer.flush().await?;
                line.clear();
            }
        }
        reader.consume(take);
    }
}

fn normalize_line(line: &[u8]) -> Cow<'_, [u8]> {
    let body = line.strip_suffix(b"\n").unwrap_or(line);
    let body = body.strip_suffix(b"\r").unwrap_or(body);
    let Ok(mut value) = serde_json::from_slice::<Value>(body) else {
        return Cow::Borrowed(line);
    };
    if !normalize_message(&mut value) {
        return Cow::Borrowed(line);
    }
    match serde_json::to_vec(&value) {
        Ok(mut out) => {
            out.push(b'\n');
            Cow::Owned(out)
        }
        Err(_) => Cow::Borrowed(line),
    }
}

/// The client key of a request: from `_meta`, or from `params.idempotencyKey` (moved into
/// `_meta` by the transport adapters). Both present and different is an error.
fn client_key_of(tool: &str, meta: &JsonObject) -> Result<Option<Value>, Error> {
    match (meta.get(CLIENT_KEY_META_KEY), meta.get(PARAM_KEY_CARRIER)) {
        (Some(a), Some(b)) if a != b => Err(Error::InvalidArguments {
            tool: tool.to_owned(),
            field: Some(CLIENT_KEY_PARAM.to_owned()),
            message: format!(
                "the request carries two different client idempotency keys, `params.{CLIENT_KEY_PARAM}` and `_meta[\"{CLIENT_KEY_META_KEY}\"]`; nothing ran. Send one of them"
            ),
        }),
        (Some(k), _) | (None, Some(k)) => Ok(Some(k.clone())),
        (None, None) => Ok(None),
    }
}

/// A client key: a string of 1 to 255 characters without control characters.
fn validate_client_key(tool: &str, key: &Value) -> Result<String, Error> {
    let invalid = |message: String| Error::InvalidArguments {
        tool: tool.to_owned(),
        field: Some(CLIENT_KEY_PARAM.to_owned()),
        message,
    };
    let Value::String(key) = key else {
        return Err(invalid(format!(
            "the client idempotency key must be a string of 1 to {CLIENT_KEY_MAX_CHARS} characters, not {key}; nothing ran. Send the same string with every retry of one intent"
        )));
    };
    let chars = key.chars().count();
    if chars == 0 || chars > CLIENT_KEY_MAX_CHARS {
        return Err(invalid(format!(
            "the client idempotency key has {chars} characters; it must have 1 to {CLIENT_KEY_MAX_CHARS}, nothing ran. Send a shorter id (a UUID fits), the same with every retry of one intent"
        )));
    }
    if let Some(c) = key.chars().find(|c| c.is_control()) {
        return Err(invalid(format!(
            "the client idempotency key contains the control character {c:?}; nothing ran. Send printable text, the same with every retry of one intent"
        )));
    }
    Ok(key.clone())
}

fn call_meta(
    outcome: &str,
    key: Option<&str>,
    client_key: Option<&str>,
    error: Option<&Error>,
) -> MetaObject {
    let mut call = Map::new();
    call.insert("outcome".into(), outcome.into());
    call.insert("replayed".into(), (outcome == "replayed").into());
    call.insert("key".into(), key.map_or(Value::Null, Value::from));
    if let Some(k) = client_key {
        call.insert("clientKey".into(), k.into());
    }
    if let Some(e) = error {
        call.insert("error".into(), e.code().into());
    }
    let mut meta = Map::new();
    meta.insert(CALL_META_KEY.to_owned(), Value::Object(call));
    MetaObject(meta)
}

/// Whether a JSON Schema describes an object at its root (what MCP requires of an output
/// schema).
fn is_object_schema(schema: &Value) -> bool {
    schema.get("type").and_then(Value::as_str) == Some("object")
}

/// Wraps a non-object result schema as `{"type":"object","properties":{"result":…}}`,
/// keeping `$schema` and `$defs` at the root where the inner `$ref`s point.
fn wrap_schema(schema: Value) -> Value {
    let mut root = Map::new();
    let inner = match schema {
        Value::Object(mut inner) => {
            if let Some(dialect) = inner.remove("$schema") {
                root.insert("$schema".into(), dialect);
            }
            let defs = inner.remove("$defs");
            let title = inner.remove("title");
            root.insert("type".into(), "object".into());
            if let Some(Value::String(title)) = title {
                root.insert("title".into(), title.clone().into());
                inner.insert("title".into(), title.into());
            }
            root.insert(
                "properties".into(),
                json!({ WRAPPED_RESULT_FIELD: Value::Object(inner) }),
            );
            if let Some(defs) = defs {
                root.insert("$defs".into(), defs);
            }
            root.insert("required".into(), json!([WRAPPED_RESULT_FIELD]));
            return Value::Object(root);
        }
        other => other,
    };
    root.insert("type".into(), "object".into());
    root.insert("properties".into(), json!({ WRAPPED_RESULT_FIELD: inner }));
    root.insert("required".into(), json!([WRAPPED_RESULT_FIELD]));
    Value::Object(root)
}

/// A tool as published in `tools/list`, and how its results map to structured content.
fn tool_json(descriptor: &ToolDescriptor) -> (Value, OutputShape) {
    let mut tool = descriptor.to_mcp_json();
    let shape = match descriptor.output_schema() {
        Some(schema) if is_object_schema(&schema) => OutputShape::Object,
        Some(schema) => {
            if let Value::Object(tool) = &mut tool {
                tool.insert("outputSchema".into(), wrap_schema(schema));
            }
            OutputShape::Wrapped
        }
        None => OutputShape::Unknown,
    };
    (tool, shape)
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().build());
        info.server_info = Implementation::new(self.inner.name.clone(), self.inner.version.clone());
        info.instructions = self.inner.instructions.clone();
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        // `ListToolsResult` is `#[non_exhaustive]` without a constructor: no struct literal.
        #[allow(clippy::field_reassign_with_default)]
        let result = {
            let mut result = ListToolsResult::default();
            result.tools = self.inner.tools.clone();
            result
        };
        Ok(result)
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.inner.tools.iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        // rmcp moves the request's `_meta` into the context; typed params keep none.
        let mut meta = context.meta.0 .0.clone();
        if let Some(params_meta) = &request.meta {
            for (k, v) in params_meta.0 .0.iter() {
                meta.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        let client_key = match client_key_of(&name, &meta) {
            Ok(k) => k,
            Err(e) => return Ok(self.error_result(&name, e, None).into()),
        };
        self.call(&name, request.arguments, client_key.as_ref())
            .await
            .map(Into::into)
    }
}

/// Serves `registry` over stdin/stdout until the client closes stdin.
///
/// `serve_stdio(tool_contracts::registry())` serves every tool linked into the program;
/// pass an [`McpServer`] to choose its store or scope.
pub async fn serve_stdio(registry: impl Into<McpServer>) -> std::io::Result<()> {
    registry.into().serve_stdio().await
}

/// Serves `registry` over streamable HTTP at `http://<addr>/mcp` until the process ends.
pub async fn serve_http(registry: impl Into<McpServer>, addr: SocketAddr) -> std::io::Result<()> {
    registry.into().serve_http(addr).await
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[tokio::test]
    async fn results_follow_the_published_output_shape() {
        let registry = Registry::from_tools([&fixtures::SEVEN]).unwrap();
        let server = McpServer::new(registry);
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
        for key in [
            IDEMPOTENCY_META_KEY,
            CALL_META_KEY,
            CLIENT_KEY_META_KEY,
            PARAM_KEY_CARRIER,
        ] {
            assert!(
                key.starts_with(&format!("{}/", crate::META_PREFIX)),
                "{key}"
            );
        }
    }

    #[test]
    fn params_idempotency_key_moves_into_meta_and_a_forged_carrier_is_dropped() {
        let mut m = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{
            "name":"t","arguments":{},"idempotencyKey":"k-1",
            "_meta":{"progressToken":3}}});
        assert!(normalize_message(&mut m));
        assert_eq!(m["params"].get("idempotencyKey"), None);
        assert_eq!(m["params"]["_meta"][PARAM_KEY_CARRIER], "k-1");
        assert_eq!(m["params"]["_meta"]["progressToken"], 3);

        let mut forged = json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{
            "name":"t","_meta":{PARAM_KEY_CARRIER:"evil"}}});
        assert!(normalize_message(&mut forged));
        assert_eq!(forged["params"]["_meta"].get(PARAM_KEY_CARRIER), None);

        let mut other =
            json!({"jsonrpc":"2.0","id":3,"method":"tools/list","params":{"idempotencyKey":"x"}});
        assert!(!normalize_message(&mut other));
        let mut batch =
            json!([{"method":"tools/call","params":{"idempotencyKey":"a"}}, {"method":"ping"}]);
        assert!(normalize_message(&mut batch));
        assert_eq!(batch[0]["params"]["_meta"][PARAM_KEY_CARRIER], "a");
    }

    #[test]
    fn lines_that_are_not_tools_calls_pass_byte_for_byte() {
        let line = b"{\"jsonrpc\":\"2.0\",\"id\":1,  \"method\":\"ping\"}\r\n";
        assert!(matches!(normalize_line(line), Cow::Borrowed(l) if l == line));
        let garbage = b"not json\n";
        assert!(matches!(normalize_line(garbage), Cow::Borrowed(l) if l == garbage));
        let call = b"{\"method\":\"tools/call\",\"params\":{\"idempotencyKey\":\"k\"}}\n";
        let out = normalize_line(call);
        assert!(out.ends_with(b"\n"));
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["params"]["_meta"][PARAM_KEY_CARRIER], "k");
    }

    #[tokio::test]
    async fn the_line_pump_rewrites_each_line_and_ends_with_its_input() {
        let input = b"{\"method\":\"tools/call\",\"params\":{\"idempotencyKey\":\"k\"}}\n{\"method\":\"ping\"}\n{\"method\":\"x\"}".to_vec();
        let (tx, mut rx) = tokio::io::duplex(1024);
        normalize_lines(&input[..], tx).await.unwrap();
        let mut out = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut rx, &mut out)
            .await
            .unwrap();
        let lines: Vec<&str> = out.split('\n').collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert!(lines[0].contains(PARAM_KEY_CARRIER), "{out}");
        assert_eq!(lines[1], "{\"method\":\"ping\"}");
        assert_eq!(lines[2], "{\"method\":\"x\"}");
    }

    #[test]
    fn client_keys_are_one_to_255_printable_characters() {
        assert_eq!(validate_client_key("t", &json!("a")).unwrap(), "a");
        assert!(validate_client_key("t", &json!("é".repeat(255))).is_ok());
        for bad in [
            json!(""),
            json!("x".repeat(256)),
            json!("a\nb"),
            json!("a\u{7f}"),
            json!(7),
            json!(null),
        ] {
            let e = validate_client_key("t", &bad).unwrap_err();
            assert_eq!(e.code(), "invalid_arguments");
            assert!(e.to_string().contains("idempotency key"), "{e}");
            assert!(e.to_string().contains("nothing ran"), "{e}");
        }
    }

    #[test]
    fn two_different_client_keys_are_refused_and_equal_ones_accepted() {
        let mut meta = Map::new();
        meta.insert(CLIENT_KEY_META_KEY.into(), json!("a"));
        assert_eq!(client_key_of("t", &meta).unwrap(), Some(json!("a")));
        meta.insert(PARAM_KEY_CARRIER.into(), json!("a"));
        assert_eq!(client_key_of("t", &meta).unwrap(), Some(json!("a")));
        meta.insert(PARAM_KEY_CARRIER.into(), json!("b"));
        let e = client_key_of("t", &meta).unwrap_err();
        assert!(e.to_string().contains("two different"), "{e}");
        assert_eq!(client_key_of("t", &Map::new()).unwrap(), None);
    }

    #[test]
    fn a_non_object_result_schema_is_wrapped_with_its_defs_at_the_root() {
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "Nullable_Order",
            "anyOf": [{"$ref": "#/$defs/Order"}, {"type": "null"}],
            "$defs": {"Order": {"type": "object", "properties": {"id": {"type": "integer"}}}}
        });
        let wrapped = wrap_schema(schema);
        assert!(is_object_schema(&wrapped));
        assert_eq!(wrapped["required"], json!(["result"]));
        assert_eq!(
            wrapped["$schema"],
            "https://json-schema.org/draft/2020-12/schema"
        );
        assert!(wrapped["$defs"]["Order"].is_object());
        assert!(wrapped["properties"]["result"].get("$defs").is_none());
        assert_eq!(
            wrapped["properties"]["result"]["anyOf"][0]["$ref"],
            "#/$defs/Order"
        );
        let wrapped = wrap_schema(json!({"type": "string"}));
        assert_eq!(
            wrapped,
            json!({"type":"object","properties":{"result":{"type":"string"}},"required":["result"]})
        );
        let wrapped = wrap_schema(json!(true));
        assert_eq!(wrapped["properties"]["result"], json!(true));
    }
}
