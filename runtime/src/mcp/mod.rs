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
//! [`McpServer`] implements rmcp's [`ServerHandler`](rmcp::ServerHandler) by hand (the tool set is dynamic), so it
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
//!   which key, and what to do next. An unknown tool is a JSON-RPC error (`-32602`), and
//!   so are malformed params (no `name`, `arguments` not an object), with a message naming
//!   what to send.
//!   Every result carries `_meta["dev.tool-contracts/call"]`:
//!   `{"outcome": "executed" | "replayed" | "reconciled" | "rejected" | "failed", "replayed",
//!   "key", …}`.
//! - A call that carries `_meta.progressToken` gets `notifications/progress` each time its
//!   lease is renewed (every third of the tool's lease) while it runs.
//! - Over HTTP, a request whose `Origin` is not allowed is refused with `403` (DNS-rebinding
//!   protection): by default only pages of this machine, see
//!   [`with_allowed_origins`](McpServer::with_allowed_origins); one without an `Origin` is
//!   served.
//! - Tasks (SEP-2663): a tool with `task = "optional"` (or `"required"`) called by a client
//!   that declares the `io.modelcontextprotocol/tasks` extension is answered at once with a
//!   `CreateTaskResult` whose `taskId` is the call's key, and runs on in the background;
//!   `tasks/get` and `tasks/cancel` answer from the store, in the server's scope, so a
//!   retry names the same task and any process sharing the store answers for it (`tasks.rs`).
//! - Approval: a call that waits for a person's approval asks that person through a client
//!   that declared form elicitation (`elicitation/create` up to protocol 2025-11-25, an
//!   `input_required` result from 2026-07-28 on), stores the answer as the decision and
//!   runs the call once if approved (`approval.rs`); any other client gets the
//!   `awaiting_approval` tool error with the operation's link.
//! - A client may send its own intent key, as `params.idempotencyKey` or
//!   `params._meta["dev.tool-contracts/idempotencyKey"]` (1 to 255 characters, no control
//!   characters). It is folded into the key as a scope `client:<key>` inside any scope the
//!   server has, so it narrows a key and can never merge two intents or reach another
//!   tenant's results.
//!
//! The module is split by concern: this file holds the server type and its builder,
//! `handler.rs` what the server answers (`tools/list`, `tools/call`, results, `_meta`, client
//! keys), `approval.rs` approval through the client (elicitation), `tasks.rs` the task
//! methods and task-augmented calls, `transport.rs` how it is served (stdio and streamable
//! HTTP, on rmcp's transports).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::Tool;
use tokio_util::task::TaskTracker;

use crate::registry::Registry;
use crate::store::Store;

mod approval;
mod handler;
mod tasks;
#[cfg(test)]
mod tests;
mod transport;

pub use approval::{APPROVAL_META_KEY, DEFAULT_ELICITATION_TIMEOUT};
pub use tasks::DEFAULT_TASK_POLL_INTERVAL;

pub use transport::{serve_http, serve_stdio};

/// Re-exported: the MCP SDK this module is built on, for its transports and model types.
pub use ::rmcp;

/// The URI of the operation of `key`, as a result's `resource_link` names it and
/// `resources/read` reads it: `tool-contracts://operations/{key}`.
pub fn operation_uri(key: &str) -> String {
    format!("{OPERATION_URI_PREFIX}{key}")
}

/// The prefix of every operation URI; the resource template is this plus `{key}`.
pub const OPERATION_URI_PREFIX: &str = "tool-contracts://operations/";

/// The name of the read-only tool that returns an operation by its key (see
/// [`McpServer::without_operation_tool`]).
pub const OPERATION_TOOL: &str = "get_operation";

/// `_meta` key of a tool's idempotency contract in `tools/list`.
pub const IDEMPOTENCY_META_KEY: &str = "dev.tool-contracts/idempotency";
/// `_meta` key of a `tools/call` result's outcome: `{"outcome", "replayed", "key", …}`.
pub const CALL_META_KEY: &str = "dev.tool-contracts/call";
/// Request `_meta` key under which a client sends its own intent key.
pub const CLIENT_KEY_META_KEY: &str = "dev.tool-contracts/idempotencyKey";
/// The `tools/call` parameter under which a client may send its own intent key (the shape
/// of the MCP idempotency proposal).
pub const CLIENT_KEY_PARAM: &str = "idempotencyKey";
/// The longest client key accepted, in characters (the same over HTTP).
pub const CLIENT_KEY_MAX_CHARS: usize = crate::ambient::CLIENT_KEY_MAX_CHARS;
/// The member a non-object result is wrapped in: `{"result": <value>}`.
pub const WRAPPED_RESULT_FIELD: &str = "result";

/// An MCP server over a [`Registry`]: implements rmcp's [`ServerHandler`](rmcp::ServerHandler), so it runs on
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
    /// The `Origin`s the HTTP server accepts; `None`: pages on this machine only.
    allowed_origins: Option<Vec<String>>,
    /// Whether `get_operation` is published (the default) beside the registry's tools.
    operation_tool: bool,
    /// The `pollIntervalMs` a working task suggests.
    task_poll_interval: Duration,
    /// Whether a call waiting for approval asks the person through a client that can be
    /// asked (`approval.rs`).
    elicitation: bool,
    /// How long an `elicitation/create` waits for the client's answer.
    elicitation_timeout: Duration,
    /// The calls running as tasks, which the transports wait for before they return.
    tasks: TaskTracker,
    tools: Vec<Tool>,
    shapes: HashMap<&'static str, handler::OutputShape>,
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
            let (json, shape) = handler::tool_json(descriptor);
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
                allowed_origins: None,
                operation_tool: true,
                task_poll_interval: DEFAULT_TASK_POLL_INTERVAL,
                elicitation: true,
                elicitation_timeout: DEFAULT_ELICITATION_TIMEOUT,
                tasks: TaskTracker::new(),
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
                allowed_origins: shared.allowed_origins.clone(),
                operation_tool: shared.operation_tool,
                task_poll_interval: shared.task_poll_interval,
                elicitation: shared.elicitation,
                elicitation_timeout: shared.elicitation_timeout,
                tasks: shared.tasks.clone(),
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
    /// store installed with [`with_store`](crate::with_store) around the server is not seen).
    pub fn with_store<S: Store>(self, store: S) -> Self {
        // Wrapped once here (with the `otel` feature, timed), not on every call.
        let store = crate::telemetry::measured(store);
        self.map(|inner| inner.store = Some(store))
    }

    /// Leaves the read-only `get_operation` tool out of `tools/list` (it is published by
    /// default, for model clients that call tools but never read resources; the same
    /// document stays readable with `resources/read`). A registry tool of that name always
    /// takes precedence over the built-in one.
    pub fn without_operation_tool(self) -> Self {
        self.map(|inner| inner.operation_tool = false)
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

    /// The browser origins the HTTP server accepts, replacing the default (pages served
    /// from this machine: `http` and `https` on `localhost`, `127.0.0.1` and `[::1]`, any
    /// port). The MCP spec requires a streamable HTTP server to validate the `Origin` of
    /// every request against DNS rebinding: a request whose `Origin` is not listed is
    /// refused with `403`, and one without an `Origin` (every client that is not a browser)
    /// is accepted.
    ///
    /// Each entry is an origin with its scheme, as rmcp's
    /// [`StreamableHttpServerConfig::allowed_origins`](rmcp::transport::StreamableHttpServerConfig)
    /// reads it: `"https://app.example.com"` (its default port, 443), `"http://localhost:*"`
    /// (any port), `"https://app.example.com:8443"`, or `"null"` (a sandboxed page). An empty
    /// list refuses every request that carries an `Origin`. The `Host` check is separate:
    /// requests are still accepted for `localhost`, `127.0.0.1` and `::1` only.
    ///
    /// ```
    /// # use tool_contracts_runtime as tool_contracts;
    /// # use tool_contracts::mcp::McpServer;
    /// let server = McpServer::new(tool_contracts::registry().clone())
    ///     .with_allowed_origins(["https://app.example.com", "http://localhost:*"]);
    /// ```
    pub fn with_allowed_origins<I, S>(self, origins: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let origins: Vec<String> = origins.into_iter().map(Into::into).collect();
        self.map(|inner| inner.allowed_origins = Some(origins))
    }

    /// The `pollIntervalMs` a working task suggests to its client (default
    /// [`DEFAULT_TASK_POLL_INTERVAL`], 1 s); at least 1 ms.
    pub fn with_task_poll_interval(self, interval: Duration) -> Self {
        let interval = interval.max(Duration::from_millis(1));
        self.map(|inner| inner.task_poll_interval = interval)
    }

    /// Never asks for an approval through the MCP client: a call waiting for approval
    /// always answers the `awaiting_approval` tool error, and people decide through the
    /// other channels (the CLI, HTTP, Rust). For deployments where the person behind the
    /// MCP client is not the one who may approve: a decision made through elicitation is
    /// made by whoever answers the client's form, named by the client's self-declared
    /// `clientInfo.name` (docs/mcp.md, "Approval through elicitation").
    pub fn without_approval_elicitation(self) -> Self {
        self.map(|inner| inner.elicitation = false)
    }

    /// How long an `elicitation/create` asking for an approval waits for the client's
    /// answer (default [`DEFAULT_ELICITATION_TIMEOUT`], 10 minutes; never longer than the
    /// request stays open, the tool's `approval_expires`). Past it nothing is decided and
    /// the call answers `awaiting_approval`. (From protocol 2026-07-28 on the question is
    /// an `input_required` result and the client takes its own time.)
    pub fn with_elicitation_timeout(self, timeout: Duration) -> Self {
        self.map(|inner| inner.elicitation_timeout = timeout)
    }

    /// Waits until every call this server runs as a task has ended (stored its result,
    /// released or abandoned its key). [`serve_stdio`](Self::serve_stdio),
    /// [`serve_io`](Self::serve_io) and [`serve_http_listener`](Self::serve_http_listener)
    /// do so before they return; call it after serving on another rmcp transport, so a
    /// shutdown does not cut a running call (which would leave its outcome unknown).
    pub async fn wait_for_tasks(&self) {
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
        self.inner.tasks.reopen();
    }

    /// The registry served.
    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// The tools as published in `tools/list`.
    pub fn tools(&self) -> &[Tool] {
        &self.inner.tools
    }
}
