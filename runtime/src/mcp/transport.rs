//! How the server is served: stdio (newline-delimited JSON-RPC) and streamable HTTP, on
//! rmcp's own transports.
//!
//! - Streamable HTTP is rmcp's [`StreamableHttpService`] at `/mcp` in an [`axum::Router`]
//!   (its `handle`, called by the route's handler: see [`serve_mcp`]), served by
//!   [`axum::serve()`] with graceful shutdown and `TCP_NODELAY`, as rmcp's own examples
//!   serve it. rmcp checks the `Host` and the `Origin` (DNS-rebinding protection, with
//!   [`LOCAL_ORIGINS`] or the operator's list), the sessions and the body limit.
//! - Stdio frames lines with rmcp's [`JsonRpcMessageCodec`] and answers through rmcp's
//!   writer ([`TransportWriter`]).
//!
//! # The one workaround: `params.idempotencyKey`
//!
//! rmcp 3.11 decodes `tools/call` parameters into [`CallToolRequestParams`]
//! (`rmcp::model`), a struct with `_meta`, `name`, `arguments`, `inputResponses` and
//! `requestState` only and no catch-all member, so serde drops every other member of
//! `params`: a client key sent as `params.idempotencyKey` (the shape of the MCP idempotency
//! proposal) never reaches [`ServerHandler::call_tool`](rmcp::ServerHandler::call_tool).
//! Each transport therefore reads that one member from the raw message before rmcp decodes
//! it, and hands it to the handler out of band as a [`ParamsIdempotencyKey`] extension; the
//! message itself is never rewritten:
//!
//! - over HTTP, the `/mcp` handler ([`keep_params_idempotency_key`]) reads the body and puts the
//!   key in the HTTP request's extensions, which rmcp passes on to the handler inside
//!   [`http::request::Parts`](axum::http::request::Parts);
//! - over stdio, each line is decoded as a [`KeyedMessage`] (rmcp's message type plus that
//!   member), which puts the key in the message's own extensions. rmcp's stdio transport
//!   (`AsyncRwTransport`) decodes straight into rmcp's message type with no hook, so
//!   [`LineTransport`] replaces its read loop, on rmcp's codec.
//!
//! `rmcp_still_drops_unknown_tools_call_params` (in `tests.rs`) fails once rmcp keeps such
//! members: then this workaround can go. Without it, `params_idempotency_key_reaches_the_
//! handler_over_stdio` (`tests.rs`) and `over_http_each_client_key_in_params_is_its_own_
//! intent` (`tests/mcp_e2e.rs`) fail.
//!
//! [`CallToolRequestParams`]: rmcp::model::CallToolRequestParams

use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::serve::ListenerExt as _;
use futures::{SinkExt, StreamExt};
use rmcp::model::JsonRpcMessage;
use rmcp::service::{RequestContext, RoleServer, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::async_rw::{
    JsonRpcMessageCodec, JsonRpcMessageCodecError, TransportWriter, DEFAULT_MAX_LINE_LENGTH,
};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService, Transport};
use rmcp::{ErrorData, ServiceExt};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Mutex;
use tokio_util::bytes::BytesMut;
use tokio_util::codec::{Decoder, FramedRead};
use tokio_util::sync::CancellationToken;

use super::{McpServer, CLIENT_KEY_PARAM};

/// The largest HTTP request body accepted (rmcp's default too); larger ones get `413`.
const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// The browser origins accepted by default: pages served from this machine, any port
/// (rmcp's origin syntax: `:*` is any port). rmcp's own default accepts every `Origin`.
const LOCAL_ORIGINS: [&str; 6] = [
    "http://localhost:*",
    "https://localhost:*",
    "http://127.0.0.1:*",
    "https://127.0.0.1:*",
    "http://[::1]:*",
    "https://[::1]:*",
];

impl McpServer {
    /// Serves over stdin/stdout (newline-delimited JSON-RPC) until the client closes stdin
    /// and the calls running as tasks have ended.
    pub async fn serve_stdio(self) -> std::io::Result<()> {
        let (stdin, stdout) = rmcp::transport::stdio();
        self.serve_io(stdin, stdout).await
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
        let server = self.clone();
        let served =
            match self.serve(LineTransport::new(reader, writer)).await {
                Ok(running) => running.waiting().await.map(drop).map_err(|e| {
                    std::io::Error::other(format!("the MCP service task failed: {e}"))
                }),
                Err(e) => Err(std::io::Error::other(format!(
                    "the MCP session did not start: {e}"
                ))),
            };
        // Calls running as tasks end (store their results) before the server returns.
        server.wait_for_tasks().await;
        served
    }

    /// Serves streamable HTTP at `http://<addr>/mcp` until the process ends.
    pub async fn serve_http(self, addr: SocketAddr) -> std::io::Result<()> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        self.serve_http_listener(listener, core::future::pending::<()>())
            .await
    }

    /// Serves streamable HTTP at `/mcp` on a bound listener until `shutdown` completes:
    /// then it stops accepting connections, ends rmcp's sessions and event streams, and
    /// returns once the requests in flight are answered and the calls running as tasks
    /// have ended. Binding port 0 and reading
    /// [`local_addr`](tokio::net::TcpListener::local_addr) gives a free port.
    ///
    /// Requests are accepted for the hosts `localhost`, `127.0.0.1` and `::1` only, and
    /// from browser pages of those hosts only ([`with_allowed_origins`] changes that; a
    /// request without an `Origin` is accepted): rmcp's DNS-rebinding protection, `403`
    /// otherwise. Put a reverse proxy in front to serve other names. Any other path is
    /// `404`, a body over 4 MiB `413`.
    ///
    /// [`with_allowed_origins`]: McpServer::with_allowed_origins
    pub async fn serve_http_listener(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> std::io::Result<()> {
        let stop = CancellationToken::new();
        let server = self.clone();
        // `TCP_NODELAY` on every connection: a `tools/call` answer is an event stream that
        // hyper writes in several small chunks (head and event, then the last chunk). With
        // Nagle's algorithm on (`axum::serve` leaves it on), the last chunk waits for the
        // client's delayed ACK, about 40 ms on Linux: 22 calls per second on one connection
        // instead of thousands (benches/surfaces.rs).
        let listener = listener.tap_io(|stream| {
            if let Err(e) = stream.set_nodelay(true) {
                tracing::debug!(error = %e, "tool-contracts: TCP_NODELAY not set on an MCP connection");
            }
        });
        let serving = axum::serve(listener, self.router(stop.child_token()))
            .with_graceful_shutdown(stop.clone().cancelled_owned())
            .into_future();
        let mut serving = core::pin::pin!(serving);
        // `shutdown` is polled here rather than handed to axum, which would need it `Send`
        // and `'static`.
        let served = tokio::select! {
            result = &mut serving => result,
            () = shutdown => {
                stop.cancel();
                serving.await
            }
        };
        // Calls running as tasks end (store their results) before the server returns.
        server.wait_for_tasks().await;
        served
    }

    /// `/mcp` is rmcp's streamable HTTP service (its sessions end when `stop` is
    /// cancelled); every other path is `404`.
    fn router(self, stop: CancellationToken) -> axum::Router {
        let origins = match &self.inner.allowed_origins {
            Some(origins) => {
                for origin in origins
                    .iter()
                    .filter(|o| *o != "null" && !o.contains("://"))
                {
                    tracing::warn!(origin = %origin, "tool-contracts: an allowed MCP origin has no scheme and matches nothing; write it as `https://host`, `https://host:port` or `http://host:*`");
                }
                origins.clone()
            }
            None => LOCAL_ORIGINS.map(String::from).to_vec(),
        };
        let server = self;
        let mcp: Arc<Mcp> = Arc::new(StreamableHttpService::new(
            move || Ok(server.clone()),
            Arc::new(LocalSessionManager::default()),
            StreamableHttpServerConfig::default()
                .with_cancellation_token(stop)
                .with_max_request_body_bytes(MAX_BODY_BYTES)
                // Validated even when the operator's list is empty (then every `Origin` is
                // refused); rmcp skips an empty list otherwise.
                .with_allowed_origins(origins)
                .enforce_origin_validation(),
        ));
        axum::Router::new()
            .route(
                "/mcp",
                axum::routing::any(move |request: Request| serve_mcp(Arc::clone(&mcp), request)),
            )
            .fallback(|| async {
                (
                    StatusCode::NOT_FOUND,
                    "the MCP endpoint of this server is /mcp",
                )
            })
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

/// A `tools/call`'s `params.idempotencyKey`, which rmcp's `CallToolRequestParams` drops (see
/// the module docs): carried beside the message as an extension, where no client can set it.
#[derive(Debug, Clone)]
pub(super) struct ParamsIdempotencyKey(pub(super) Value);

/// The `params.idempotencyKey` of a `tools/call` request, if it has one.
fn params_idempotency_key_of(message: &Value) -> Option<Value> {
    if message.get("method").and_then(Value::as_str) != Some("tools/call") {
        return None;
    }
    message.get("params")?.get(CLIENT_KEY_PARAM).cloned()
}

/// The `params.idempotencyKey` a transport kept for this request: in the message's
/// extensions (stdio) or in those of the HTTP request that carried it.
pub(super) fn params_idempotency_key(context: &RequestContext<RoleServer>) -> Option<&Value> {
    context
        .extensions
        .get::<ParamsIdempotencyKey>()
        .or_else(|| {
            context
                .extensions
                .get::<axum::http::request::Parts>()?
                .extensions
                .get::<ParamsIdempotencyKey>()
        })
        .map(|key| &key.0)
}

/// rmcp's streamable HTTP service, as `/mcp` serves it.
type Mcp = StreamableHttpService<McpServer, LocalSessionManager>;

/// One request to `/mcp`: the workaround first (see the module docs), then rmcp's
/// streamable HTTP service answers it. Called through [`StreamableHttpService::handle`] on a
/// shared reference: its `tower::Service` impl clones the whole service for each request,
/// its settings included (the allowed hosts and origins, a `String` each), and axum's
/// routing clones a route's service again (and once more through a route layer): eight
/// copies of those lists per request (benches/surfaces.rs).
async fn serve_mcp(mcp: Arc<Mcp>, request: Request) -> Response {
    match keep_params_idempotency_key(request).await {
        Ok(request) => mcp.handle(request).await.into_response(),
        Err(refusal) => refusal,
    }
}

/// HTTP half of the workaround (see the module docs): reads a POST body (one JSON-RPC
/// message) and keeps its `params.idempotencyKey` in the request's extensions; the body
/// goes on to rmcp unchanged. A body that cannot be read is answered here (`413`).
async fn keep_params_idempotency_key(request: Request) -> Result<Request, Response> {
    if request.method() != Method::POST {
        return Ok(request);
    }
    let (mut parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(bytes) => bytes,
        Err(e) => {
            return Err((
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the request body could not be read or exceeds {MAX_BODY_BYTES} bytes: {e}"
                ),
            )
                .into_response())
        }
    };
    if let Some(key) = body_params_idempotency_key(&bytes) {
        parts.extensions.insert(ParamsIdempotencyKey(key));
    }
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

/// The `params.idempotencyKey` of a `tools/call` in an HTTP body: none when the body cannot
/// hold that member, else read through [`Probe`], which builds nothing but that member (the
/// whole message as a [`Value`] cost every request a second full decode beside rmcp's). A
/// body the probe does not read (not an object, `params` not an object, a member name with
/// escapes, not JSON) is read as a `Value`, so what is kept is always what
/// [`params_idempotency_key_of`] finds. Not JSON: rmcp answers it.
fn body_params_idempotency_key(bytes: &[u8]) -> Option<Value> {
    // A member named `idempotencyKey` is in the body as those bytes, or written with an
    // escape (a backslash); a body with neither has none, and nothing is decoded.
    if memchr::memmem::find(bytes, CLIENT_KEY_PARAM.as_bytes()).is_none()
        && memchr::memchr(b'\\', bytes).is_none()
    {
        return None;
    }
    match serde_json::from_slice::<Probe<'_>>(bytes) {
        Ok(probe) if probe.method == Some("tools/call") => probe.params?.key,
        Ok(_) => None,
        Err(_) => params_idempotency_key_of(&serde_json::from_slice::<Value>(bytes).ok()?),
    }
}

/// The two members of a JSON-RPC message the HTTP half of the workaround reads; every other
/// member is skipped without being built. Only an object is read (an array or a scalar is
/// an error here, so [`body_params_idempotency_key`] reads it as a `Value`), and a member
/// given twice counts last, as in a [`Value`].
struct Probe<'a> {
    method: Option<&'a str>,
    params: Option<ProbeParams>,
}

/// `params.idempotencyKey` of a [`Probe`], kept as sent (`null` too: the handler refuses
/// what is not a string, as for a key in `_meta`); `params` must be an object.
struct ProbeParams {
    key: Option<Value>,
}

impl<'de> Deserialize<'de> for Probe<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Probe<'de>;
            fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str("a JSON-RPC message object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Probe<'de>, A::Error> {
                let mut probe = Probe {
                    method: None,
                    params: None,
                };
                // Names with escapes are no `&str`: an error, so the caller reads a `Value`.
                while let Some(name) = map.next_key::<&'de str>()? {
                    match name {
                        "method" => probe.method = map.next_value::<Option<&'de str>>()?,
                        "params" => probe.params = map.next_value::<Option<ProbeParams>>()?,
                        _ => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                        }
                    }
                }
                Ok(probe)
            }
        }
        deserializer.deserialize_map(Visit)
    }
}

impl<'de> Deserialize<'de> for ProbeParams {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = ProbeParams;
            fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str("`tools/call` params as an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<ProbeParams, A::Error> {
                let mut key = None;
                while let Some(name) = map.next_key::<&'de str>()? {
                    if name == CLIENT_KEY_PARAM {
                        key = Some(map.next_value::<Value>()?);
                    } else {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
                Ok(ProbeParams { key })
            }
        }
        deserializer.deserialize_map(Visit)
    }
}

/// Stdio half of the workaround (see the module docs): one client message as rmcp decodes
/// it, with a `tools/call`'s `params.idempotencyKey` kept in its extensions.
struct KeyedMessage(RxJsonRpcMessage<RoleServer>);

impl<'de> Deserialize<'de> for KeyedMessage {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Not JSON fails here, with serde_json's syntax error; not a message fails below,
        // with a data error: the two cases rmcp's codec and `LineTransport` tell apart.
        let value = Value::deserialize(deserializer)?;
        let key = params_idempotency_key_of(&value);
        let mut message =
            RxJsonRpcMessage::<RoleServer>::deserialize(value).map_err(D::Error::custom)?;
        if let Some(key) = key {
            message.insert_extension(ParamsIdempotencyKey(key));
        }
        Ok(KeyedMessage(message))
    }
}

/// What one line from the client is.
enum Line {
    /// A client message.
    Message(Box<RxJsonRpcMessage<RoleServer>>),
    /// Well-formed JSON that is no MCP message: answered with an Invalid Request error.
    NotAMessage,
}

/// rmcp's line codec ([`JsonRpcMessageCodec`], with rmcp's line limit) decoding
/// [`KeyedMessage`]s, and the policy of rmcp's `AsyncRwTransport` for what is not a message:
/// a line that is not JSON or longer than the limit is dropped, well-formed JSON that is no
/// message is [`Line::NotAMessage`], and the stream goes on in every case.
struct LineCodec(JsonRpcMessageCodec<KeyedMessage>);

impl Decoder for LineCodec {
    type Item = Line;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> std::io::Result<Option<Line>> {
        loop {
            let before = buf.len();
            match self.0.decode(buf) {
                Ok(Some(KeyedMessage(message))) => {
                    return Ok(Some(Line::Message(Box::new(message))))
                }
                // rmcp's codec also answers `None` after skipping a line (a notification
                // outside MCP): decode on while it consumes lines.
                Ok(None) if buf.len() < before => {}
                Ok(None) => return Ok(None),
                Err(JsonRpcMessageCodecError::Serde(e))
                    if e.classify() == serde_json::error::Category::Data =>
                {
                    tracing::debug!(error = %e, "tool-contracts: MCP line is no MCP message");
                    return Ok(Some(Line::NotAMessage));
                }
                Err(JsonRpcMessageCodecError::Serde(e)) => {
                    tracing::debug!(error = %e, "tool-contracts: MCP line is not JSON, ignored");
                }
                Err(JsonRpcMessageCodecError::MaxLineLengthExceeded) => {
                    tracing::error!(
                        max_line_length = DEFAULT_MAX_LINE_LENGTH,
                        "tool-contracts: MCP line longer than the limit, discarded"
                    );
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> std::io::Result<Option<Line>> {
        let line = self.decode(buf)?;
        if line.is_none() {
            // A last line without its newline is incomplete: nothing to deliver (as in
            // rmcp's `AsyncRwTransport`).
            buf.clear();
        }
        Ok(line)
    }
}

/// rmcp's stdio transport with its read loop on [`LineCodec`]: reads with rmcp's codec,
/// writes with rmcp's writer.
struct LineTransport<R, W> {
    lines: FramedRead<R, LineCodec>,
    writer: Arc<Mutex<Option<TransportWriter<RoleServer, W>>>>,
}

impl<R: AsyncRead, W: AsyncWrite> LineTransport<R, W> {
    fn new(reader: R, writer: W) -> Self {
        let codec = JsonRpcMessageCodec::new_with_max_length(DEFAULT_MAX_LINE_LENGTH);
        LineTransport {
            lines: FramedRead::new(reader, LineCodec(codec)),
            writer: Arc::new(Mutex::new(Some(TransportWriter::<RoleServer, W>::new(
                writer,
                JsonRpcMessageCodec::default(),
            )))),
        }
    }
}

impl<R, W> Transport<RoleServer> for LineTransport<R, W>
where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = std::io::Result<()>> + Send + 'static {
        let writer = Arc::clone(&self.writer);
        async move {
            match writer.lock().await.as_mut() {
                Some(writer) => writer.send(item).await.map_err(Into::into),
                None => Err(std::io::Error::new(
                    std::io::ErrorKind::NotConnected,
                    "the MCP transport is closed",
                )),
            }
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            match self.lines.next().await? {
                Ok(Line::Message(message)) => return Some(*message),
                Ok(Line::NotAMessage) => {
                    // Sent from its own task: `receive` may be cancelled at any await.
                    let reply = JsonRpcMessage::error(
                        ErrorData::invalid_request("Invalid request", None),
                        None,
                    );
                    let send = self.send(reply);
                    tokio::spawn(async move {
                        if let Err(e) = send.await {
                            tracing::debug!(error = %e, "tool-contracts: MCP error reply not sent");
                        }
                    });
                }
                Err(e) => {
                    tracing::error!(error = %e, "tool-contracts: MCP input unreadable");
                    return None;
                }
            }
        }
    }

    async fn close(&mut self) -> std::io::Result<()> {
        drop(self.writer.lock().await.take());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::{body_params_idempotency_key, params_idempotency_key_of};

    /// The probe keeps exactly what reading the whole message as a `Value` keeps, whatever
    /// the shape of the body: it only skips building what it does not need.
    #[test]
    fn the_http_probe_keeps_what_a_full_decode_keeps() {
        let bodies = [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"a":[1,{"b":null}]},"idempotencyKey":"k-1"}}"#,
            r#"{"params":{"idempotencyKey":"k-2","name":"t"},"method":"tools/call","id":2,"jsonrpc":"2.0"}"#,
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"t","arguments":{}}}"#,
            r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"t","idempotencyKey":null}}"#,
            r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"t","idempotencyKey":7}}"#,
            r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"idempotencyKey":{"nested":["x"]}}}"#,
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/list","params":{"idempotencyKey":"k-7"}}"#,
            r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"idempotencyKey":"a","idempotencyKey":"b"}}"#,
            r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"idempotency\u004bey":"escaped-name"}}"#,
            r#"{"jsonrpc":"2.0","id":10,"method":"tools\/call","params":{"idempotencyKey":"escaped-method"}}"#,
            r#"{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"idempotencyKey":"k\n\u00e9"}}"#,
            r#"{"jsonrpc":"2.0","id":12,"method":"tools/call","params":["idempotencyKey","k"]}"#,
            r#"{"jsonrpc":"2.0","id":13,"method":"tools/call","params":null}"#,
            r#"{"jsonrpc":"2.0","id":14,"method":"tools/call"}"#,
            r#"{"jsonrpc":"2.0","id":15,"method":7,"params":{"idempotencyKey":"k"}}"#,
            r#"{"jsonrpc":"2.0","method":"tools/call","method":"tools/list","params":{"idempotencyKey":"k"}}"#,
            r#"{"jsonrpc":"2.0","method":"tools/list","method":"tools/call","params":{"idempotencyKey":"k"}}"#,
            r#"["tools/call",{"idempotencyKey":"k"}]"#,
            r#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"idempotencyKey":"k"}}]"#,
            r#"{"jsonrpc":"2.0","id":16,"method":"tools/call","params":{"name":"t","arguments":{"note":"a\nb \"q\""},"idempotencyKey":"k-16"}}"#,
            r#"{"jsonrpc":"2.0","id":17,"method":"tools/call","params":{"name":"t","arguments":{"note":"idempotencyKey"}}}"#,
            r#"{"jsonrpc":"2.0","id":18,"method":"tools/call","params":{"name":"t","arguments":{"note":"a\tb"}}}"#,
            r#""tools/call""#,
            "null",
            "not json",
            r#"{"method":"tools/call","params":{"idempotencyKey":"k"}"#,
            "",
        ];
        for body in bodies {
            let full = serde_json::from_slice::<Value>(body.as_bytes())
                .ok()
                .and_then(|message| params_idempotency_key_of(&message));
            assert_eq!(
                body_params_idempotency_key(body.as_bytes()),
                full,
                "body: {body}"
            );
        }
        // The cases above do reach a key where one is sent.
        assert_eq!(
            body_params_idempotency_key(bodies[0].as_bytes()),
            Some(json!("k-1"))
        );
        assert_eq!(
            body_params_idempotency_key(bodies[3].as_bytes()),
            Some(Value::Null)
        );
        assert_eq!(
            body_params_idempotency_key(bodies[8].as_bytes()),
            Some(json!("escaped-name"))
        );
    }
}
