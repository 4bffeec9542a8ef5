//! Serve a [`Registry`] over plain HTTP with Post/Redirect/Get, as an [`axum::Router`] to
//! nest and layer.
//!
//! ```no_run
//! # use tool_contracts_runtime as tool_contracts;
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use tool_contracts::http::HttpTools;
//!
//! let app = HttpTools::new(tool_contracts::registry().clone())
//!     // The tenant of each request, from its authentication (here a stand-in header).
//!     .with_tenant(|parts| Ok(parts.headers.get("x-tenant").and_then(|v| v.to_str().ok()).map(str::to_owned)))
//!     .into_router::<()>();
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8090").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```
//!
//! | route | answers |
//! |---|---|
//! | `POST /tools/{name}` | runs the tool (JSON or form body) through the same engine as a Rust or MCP call: `303 See Other` to `Location: {prefix}/operations/{key}`, the same for an execution and a replay; `200` with the result and `Content-Location` for `Prefer: return=representation`; `200` with the result for a read-only tool; a call awaiting approval: `202 Accepted` with the operation (a browser: `303` to its page), a denied one `403` |
//! | `GET /operations/{key}` | the operation document: `200` completed, `202` + `Retry-After` in progress, `202` awaiting approval or approved, `403` denied, `422` failed (a stored error), `500` unknown outcome, `404` unknown or another tenant's; HTML for `Accept: text/html` (with the approval's forms), JSON otherwise; `?history=true` adds the history |
//! | `POST /operations/{key}/approve`, `/deny` | a person's decision (JSON or form: `by`, `reason`), with [`HttpTools::with_approver`]; an approval continues the call at once, once; `200` with the operation (a browser: `303` to its page), `409` when nothing is pending |
//! | `GET /tools` | the tool list ([`Registry::to_json`]) |
//! | `GET /openapi.json` | an OpenAPI 3.1 document of these routes |
//!
//! Errors are RFC 9457 problem details ([`Problem`], one [`ProblemType`] per kind). The
//! full contract (statuses, the form mapping, tenants, what is not built yet) is in
//! `docs/http.md`.
//!
//! [`IdempotencyLayer`] brings the `Idempotency-Key` header (IETF httpapi draft, Stripe) to
//! any other axum route: the first response stored and replayed, `409` while it runs, `422`
//! for a key reused with another request.
//!
//! The module is split by concern: this file holds the router, its builder and the
//! handlers; `decide.rs` the approval routes and the answers to calls that await or were
//! denied a decision; `headers.rs` what is read from request headers (`Idempotency-Key`, `Prefer`,
//! `Accept`, `Content-Type`, cross-origin requests); `forms.rs` form bodies as JSON
//! arguments; `problem.rs` errors as problem details; `html.rs` the pages; `openapi.rs`
//! the OpenAPI document; `layer.rs` the `IdempotencyLayer`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{DefaultBodyLimit, OriginalUri, Path, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::future::Either;
use serde_json::{Map, Value};

use crate::ambient::{client_scope, with_measured_store, with_scope};
use crate::error::Error;
use crate::operation::{Operation, OperationState};
use crate::registry::{CallArgs, CallResult, Outcome, Registry, ToolDescriptor, ToolOutput};
use crate::store::Store;

mod decide;
#[cfg(test)]
mod decide_tests;
mod forms;
mod headers;
mod html;
mod layer;
#[cfg(test)]
mod layer_tests;
mod openapi;
mod problem;
#[cfg(test)]
mod tests;

pub use decide::ApproverFn;
pub use headers::IDEMPOTENCY_KEY;
pub use layer::{
    IdempotencyLayer, IdempotencyService, DEFAULT_IDEMPOTENCY_LEASE, DEFAULT_IDEMPOTENCY_TTL,
    DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_STORED_HEADERS, REPLAYED_HEADER,
};
pub use problem::{Problem, ProblemType, PROBLEM_JSON};

/// Re-exported: the web framework the router is built with, to serve, nest and layer it.
pub use ::axum;

/// The response header that says how a tool call came by its result: `executed`,
/// `replayed` or `reconciled` ([`Outcome`]'s names, as MCP's `_meta`).
pub const OUTCOME_HEADER: &str = "tool-contracts-outcome";

// Header names and values every answer sends, validated once at compile time:
// `HeaderName::from_static` and `HeaderValue::from_static` called at run time check each
// byte on every call (a few hundred instructions a replay).
/// [`OUTCOME_HEADER`] as a header name.
const OUTCOME_NAME: HeaderName = HeaderName::from_static(OUTCOME_HEADER);
/// `Preference-Applied` (RFC 7240).
const PREFERENCE_APPLIED: HeaderName = HeaderName::from_static("preference-applied");
/// `Preference-Applied: return=representation`.
const RETURN_REPRESENTATION: HeaderValue = HeaderValue::from_static("return=representation");
/// `Content-Type: application/json`.
const APPLICATION_JSON: HeaderValue = HeaderValue::from_static("application/json");

/// The [`OUTCOME_HEADER`] value of `outcome`.
fn outcome_value(outcome: Outcome) -> HeaderValue {
    const EXECUTED: HeaderValue = HeaderValue::from_static("executed");
    const REPLAYED: HeaderValue = HeaderValue::from_static("replayed");
    const RECONCILED: HeaderValue = HeaderValue::from_static("reconciled");
    match outcome {
        Outcome::Executed => EXECUTED,
        Outcome::Replayed => REPLAYED,
        Outcome::Reconciled => RECONCILED,
    }
}

/// The default of [`HttpTools::with_max_body_bytes`]: 2 MiB, twice the default
/// argument limit ([`DEFAULT_MAX_ARGUMENT_BYTES`](crate::DEFAULT_MAX_ARGUMENT_BYTES)), room
/// for whitespace and form encoding.
pub const DEFAULT_MAX_BODY_BYTES: usize = 2 * 1024 * 1024;

/// The function that gives each request's tenant scope: `Ok(Some(scope))` runs and reads
/// in that scope, `Ok(None)` in none, `Err(rejection)` refuses the request with the
/// rejection's response (a `401` [`Problem`], say).
pub type TenantFn = dyn Fn(&Parts) -> Result<Option<String>, Rejection> + Send + Sync;

/// A tenant function's refusal: the response the request gets instead, nothing run. Made
/// from anything axum can answer with:
/// `Err(Problem::from_status(StatusCode::UNAUTHORIZED).into())`. (Boxed, so a tenant
/// function's `Result` stays small.)
#[derive(Debug)]
pub struct Rejection(Box<Response>);

impl Rejection {
    /// A refusal answered with `response`.
    pub fn new(response: impl IntoResponse) -> Rejection {
        Rejection(Box::new(response.into_response()))
    }

    /// The response the request gets.
    pub fn into_response(self) -> Response {
        *self.0
    }
}

impl<R: IntoResponse> From<R> for Rejection {
    fn from(response: R) -> Rejection {
        Rejection::new(response)
    }
}

/// The tools of a [`Registry`] over HTTP: a builder of the [`axum::Router`] that serves
/// them ([`into_router`](HttpTools::into_router)).
///
/// Cheap to clone (the registry and the functions are shared).
#[derive(Clone)]
pub struct HttpTools {
    registry: Registry,
    store: Option<Arc<dyn Store>>,
    tenant: Option<Arc<TenantFn>>,
    approver: Option<Arc<ApproverFn>>,
    max_body_bytes: usize,
    trusted_origins: Vec<String>,
    base_path: Option<String>,
    title: String,
    version: String,
}

impl core::fmt::Debug for HttpTools {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("HttpTools")
            .field("tools", &self.registry)
            .field("store", &self.store.as_ref().map(|_| "custom"))
            .field("tenant", &self.tenant.as_ref().map(|_| "fn"))
            .field("approver", &self.approver.as_ref().map(|_| "fn"))
            .field("max_body_bytes", &self.max_body_bytes)
            .field("trusted_origins", &self.trusted_origins)
            .field("base_path", &self.base_path)
            .finish()
    }
}

impl From<Registry> for HttpTools {
    fn from(registry: Registry) -> Self {
        HttpTools::new(registry)
    }
}

/// The router of `registry`'s tools with every default: the process's store, no tenant.
/// Shorthand for `HttpTools::new(registry.clone()).into_router()`.
pub fn router(registry: &Registry) -> axum::Router {
    HttpTools::new(registry.clone()).into_router()
}

impl HttpTools {
    /// The tools of `registry`, on the process's store
    /// ([`set_default_store`](crate::set_default_store)), without a tenant.
    pub fn new(registry: Registry) -> Self {
        HttpTools {
            registry,
            store: None,
            tenant: None,
            approver: None,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            trusted_origins: Vec::new(),
            base_path: None,
            title: "tool-contracts".to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
        }
    }

    /// Runs every call and read with this store (axum runs each request in a task of its
    /// own, where a store installed with [`with_store`](crate::with_store) around the
    /// server is not seen).
    pub fn with_store<S: Store>(mut self, store: S) -> Self {
        // Wrapped once here (with the `otel` feature, timed), not on every call.
        self.store = Some(crate::telemetry::measured(store));
        self
    }

    /// The tenant scope of each request, from the request (in practice from its
    /// authentication: read what your auth layer put in `parts.extensions`). Calls run, and
    /// operations are read, in that scope: another tenant's operation is `404`, exactly
    /// like a key never used (docs/security.md, "Reading operations"). `Err(rejection)`
    /// refuses the request with the [`Rejection`]'s response; nothing runs.
    ///
    /// It runs for `POST /tools/{name}`, `GET /operations/{key}` and the decisions
    /// (`POST /operations/{key}/approve`, `/deny`), not for `/tools` and `/openapi.json`. A scope that is empty or has control characters is a `500`
    /// ([`ProblemType::Misconfigured`]).
    ///
    /// ```
    /// # use tool_contracts_runtime as tool_contracts;
    /// use tool_contracts::http::axum::http::StatusCode;
    /// use tool_contracts::http::{HttpTools, Problem};
    ///
    /// #[derive(Clone)]
    /// struct Account { tenant: String } // put in the extensions by your auth layer
    ///
    /// let tools = HttpTools::new(tool_contracts::registry().clone()).with_tenant(|parts| {
    ///     match parts.extensions.get::<Account>() {
    ///         Some(account) => Ok(Some(account.tenant.clone())),
    ///         None => Err(Problem::from_status(StatusCode::UNAUTHORIZED).into()),
    ///     }
    /// });
    /// ```
    pub fn with_tenant<F>(mut self, tenant: F) -> Self
    where
        F: Fn(&Parts) -> Result<Option<String>, Rejection> + Send + Sync + 'static,
    {
        self.tenant = Some(Arc::new(tenant));
        self
    }

    /// Takes decisions on calls awaiting approval over HTTP (`POST /operations/{key}/approve`
    /// and `/deny`, and the forms of the operation page), and says who decides: `approver`
    /// reads the request (in practice its authentication, as [`with_tenant`](Self::with_tenant)
    /// does) and returns `Ok(Some(name))` to decide as `name`, `Ok(None)` to take the
    /// body's `by`, or `Err(rejection)` to refuse (a `403` for an agent's credentials: an
    /// agent that may call a tool must not approve its own call).
    ///
    /// Off by default: without it the two routes answer `403`
    /// ([`ProblemType::DecisionsDisabled`]), because an agent that can post to
    /// `/tools/{name}` could otherwise post its own approval. Decisions keep the request's
    /// tenant scope (another tenant's operation is `404`) and refuse cross-origin browser
    /// posts, like calls. docs/http.md, "Approval over HTTP".
    ///
    /// ```
    /// # use tool_contracts_runtime as tool_contracts;
    /// use tool_contracts::http::axum::http::StatusCode;
    /// use tool_contracts::http::{HttpTools, Problem};
    ///
    /// #[derive(Clone)]
    /// struct Account { name: String, may_approve: bool } // put there by your auth layer
    ///
    /// let tools = HttpTools::new(tool_contracts::registry().clone()).with_approver(|parts| {
    ///     match parts.extensions.get::<Account>() {
    ///         Some(account) if account.may_approve => Ok(Some(account.name.clone())),
    ///         Some(_) => Err(Problem::from_status(StatusCode::FORBIDDEN).into()),
    ///         None => Err(Problem::from_status(StatusCode::UNAUTHORIZED).into()),
    ///     }
    /// });
    /// ```
    pub fn with_approver<F>(mut self, approver: F) -> Self
    where
        F: Fn(&Parts) -> Result<Option<String>, Rejection> + Send + Sync + 'static,
    {
        self.approver = Some(Arc::new(approver));
        self
    }

    /// The largest request body accepted, in bytes (default [`DEFAULT_MAX_BODY_BYTES`]);
    /// a larger one is `413` and nothing runs. Applied with axum's [`DefaultBodyLimit`] on
    /// this router's routes, over any limit an outer layer set.
    pub fn with_max_body_bytes(mut self, limit: usize) -> Self {
        self.max_body_bytes = limit;
        self
    }

    /// Browser origins (`https://app.example.com`) whose pages may post to the tools from
    /// another origin. By default a browser's cross-origin `POST` (a form on another site:
    /// cross-site request forgery) is refused with `403`; requests from non-browser clients
    /// (no `Sec-Fetch-Site`, no `Origin`) and same-origin pages are served.
    pub fn with_trusted_origins<I, S>(mut self, origins: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.trusted_origins = origins.into_iter().map(Into::into).collect();
        self
    }

    /// The path the router is reachable at from clients, for `Location`,
    /// `Content-Location` and the OpenAPI `servers` (default: found from the request, the
    /// path the router was nested at: `/api` for a router nested with
    /// `Router::nest("/api", …)`). Set it when a proxy strips a prefix before the request
    /// reaches the server: `with_base_path("/shop")`.
    pub fn with_base_path(mut self, path: impl Into<String>) -> Self {
        let path: String = path.into();
        self.base_path = Some(path.trim_end_matches('/').to_owned());
        self
    }

    /// The `info.title` and `info.version` of the OpenAPI document (default:
    /// `tool-contracts` and this crate's version).
    pub fn with_info(mut self, title: impl Into<String>, version: impl Into<String>) -> Self {
        self.title = title.into();
        self.version = version.into();
        self
    }

    /// The registry served.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The router: `POST /tools/{name}`, `GET /operations/{key}`,
    /// `POST /operations/{key}/approve` and `/deny`, `GET /tools`, `GET /openapi.json`, for
    /// any state type `S` of the application it is nested in or
    /// merged with.
    pub fn into_router<S: Clone + Send + Sync + 'static>(self) -> axum::Router<S> {
        let limit = self.max_body_bytes;
        let mut router = axum::Router::new()
            .route("/tools", get(list_tools))
            .route("/tools/{name}", post(call_tool));
        // Each tool whose name is a plain path segment gets a route of its own: a static
        // route matches without the captured parameter (and the extensions map axum builds
        // for it), which showed in a replay's profile. Other names, percent-encoded ones
        // and unknown ones reach `/tools/{name}`, which answers them the same way.
        for tool in self.registry.iter() {
            let name = tool.name();
            if is_plain_segment(name) {
                let handler = move |State(tools): Tools, request: axum::extract::Request| {
                    call_named(tools, name, request)
                };
                router = router.route(&format!("/tools/{name}"), post(handler));
            }
        }
        router
            .route("/operations/{key}", get(read_operation))
            .route("/operations/{key}/approve", post(decide::approve))
            .route("/operations/{key}/deny", post(decide::deny))
            .route("/openapi.json", get(openapi_document))
            .method_not_allowed_fallback(method_not_allowed)
            .layer(DefaultBodyLimit::max(limit))
            .with_state(Arc::new(self))
    }

    /// The prefix clients reach the router at: the configured base path, or the request's
    /// path up to the route's own part (`route`, e.g. `/tools/`).
    fn prefix(&self, original: &axum::http::Uri, route: &str) -> String {
        if let Some(base) = &self.base_path {
            return base.clone();
        }
        let path = original.path();
        debug_assert!(!route.is_empty(), "a route part to search for");
        // A byte-window search: `str::rfind` sets up a two-way searcher per call, which
        // costs more than scanning a request path this short.
        path.as_bytes()
            .windows(route.len())
            .rposition(|window| window == route.as_bytes())
            .and_then(|i| path.get(..i))
            .map_or_else(String::new, str::to_owned)
    }

    /// The request's tenant scope, or the refusal.
    fn tenant_of(&self, parts: &Parts, html: bool) -> Result<Option<String>, Rejection> {
        let Some(tenant) = &self.tenant else {
            return Ok(None);
        };
        let scope = tenant(parts)?;
        if let Some(scope) = &scope {
            if let Err(message) = crate::ambient::validate_scope(scope) {
                tracing::error!(%message, "tool-contracts: the HTTP tenant function returned an invalid scope");
                let problem = Problem::new(
                    ProblemType::Misconfigured,
                    "the server's tenant function gave this request an invalid scope (empty, or with control characters); nothing ran. This is the server's fault: tell its operator",
                );
                return Err(Rejection::new(respond_problem(problem, html)));
            }
        }
        Ok(scope)
    }

    /// Runs `future` as every request runs: on this router's store, in the request's tenant
    /// scope and, nested inside it, the client's intent key (`client:<key>`, as MCP folds
    /// its `idempotencyKey`).
    fn in_context<'a, T: 'a>(
        &'a self,
        tenant: Option<String>,
        client_key: Option<&str>,
        future: impl Future<Output = T> + Send + 'a,
    ) -> impl Future<Output = T> + Send + 'a {
        // Built, not an `async fn`: its frame would hold the call's future two or three
        // times over, and every call's future is boxed and moved by axum.
        let scoped = if tenant.is_none() && client_key.is_none() {
            // No scope to nest: the call's future is awaited in place, not boxed.
            Either::Left(future)
        } else {
            let future: Pin<Box<dyn Future<Output = T> + Send + 'a>> = match client_key {
                Some(key) => Box::pin(with_scope(client_scope(key), future)),
                None => Box::pin(future),
            };
            let future: Pin<Box<dyn Future<Output = T> + Send + 'a>> = match tenant {
                Some(tenant) => Box::pin(with_scope(tenant, future)),
                None => future,
            };
            Either::Right(future)
        };
        match &self.store {
            Some(store) => Either::Left(with_measured_store(Arc::clone(store), scoped)),
            None => Either::Right(scoped),
        }
    }
}

type Tools = State<Arc<HttpTools>>;

/// Whether `name` can be a route's path segment as it is (RFC 3986 unreserved characters,
/// not `.` or `..`), so that `/tools/{name}` reaches it without percent-encoding.
fn is_plain_segment(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'))
}

/// `POST /tools/{name}`: names without a route of their own (see
/// [`HttpTools::into_router`]), percent-encoded ones and unknown ones.
async fn call_tool(
    State(tools): Tools,
    name: Result<Path<String>, PathRejection>,
    request: axum::extract::Request,
) -> Response {
    let Ok(Path(name)) = name else {
        let html = headers::prefers_html(request.headers());
        return with_vary(respond_problem(
            Problem::new(
                ProblemType::UnknownTool,
                "the tool name in the path is not valid percent-encoded UTF-8; list the tools with GET /tools",
            ),
            html,
        ));
    };
    call_named(tools, &name, request).await
}

/// `POST /tools/{name}` for the tool `name`.
async fn call_named(
    tools: Arc<HttpTools>,
    name: &str,
    request: axum::extract::Request,
) -> Response {
    // The request taken apart rather than `Parts` extracted: that extractor clones the head
    // (headers, extensions), which showed in a replay's profile; the original URI is read
    // in place for the same reason (axum's router puts it in the extensions).
    let (parts, body) = request.into_parts();
    let original = parts
        .extensions
        .get::<OriginalUri>()
        .map_or(&parts.uri, |original| &original.0);
    let html = headers::prefers_html(&parts.headers);
    let refuse = |problem: Problem| with_vary(respond_problem(problem, html));
    if headers::is_cross_origin(&parts.method, &parts.headers, &tools.trusted_origins) {
        return refuse(Problem::new(
            ProblemType::CrossOrigin,
            format!("a page of another origin asked this browser to call `{name}`; nothing ran. If that origin is yours, add it with `HttpTools::with_trusted_origins`"),
        ));
    }
    let tenant = match tools.tenant_of(&parts, html) {
        Ok(tenant) => tenant,
        Err(rejection) => return rejection.into_response(),
    };
    let Some(tool) = tools.registry.get(name) else {
        return refuse(Problem::from_error(
            &tools.registry.unknown_tool(name),
            None,
        ));
    };
    let client_key = match headers::client_key(&parts.headers, name) {
        Ok(key) => key,
        Err(e) => return refuse(Problem::from_error(&e, None)),
    };
    let body = layer::read_body(body, &parts.headers, tools.max_body_bytes).await;
    let args = match arguments(tool, &parts, body) {
        Ok(args) => args,
        Err(problem) => return refuse(*problem),
    };
    let prefix = tools.prefix(original, "/tools/");
    let text;
    let args = match args {
        // JSON text goes to the tool's parameters with no `Value` built on the way.
        Arguments::Json(body) => {
            text = body;
            match std::str::from_utf8(&text) {
                Ok(json) => CallArgs::Text(json),
                Err(e) => return refuse(not_utf8(tool, &e)),
            }
        }
        Arguments::Value(value) => CallArgs::Value(value),
    };
    let call = tools.registry.call_args(name, args);
    match tools
        .in_context(tenant.clone(), client_key.as_deref(), call)
        .await
    {
        Ok(output) => answer(
            output,
            &prefix,
            headers::prefers_representation(&parts.headers),
        ),
        Err(e @ Error::AwaitingApproval { .. }) => {
            let key = e.key().unwrap_or_default().to_owned();
            // Boxed: these branches' futures (a read of the operation) would otherwise
            // make every call's future several kilobytes, which axum boxes and moves.
            Box::pin(decide::awaiting(&tools, tenant, &e, &key, &prefix, html)).await
        }
        Err(e @ Error::Denied { .. }) => {
            let key = e.key().unwrap_or_default().to_owned();
            Box::pin(decide::denied(&tools, tenant, &e, &key, &prefix, html)).await
        }
        Err(e) => {
            tracing::debug!(tool = %name, code = e.code(), key = ?e.key(), "tool-contracts: HTTP call answered with a problem");
            let operation = operation_link(tool, &e, &prefix);
            refuse(Problem::from_error(&e, operation))
        }
    }
}

/// A call's arguments as its body gave them.
enum Arguments {
    /// A JSON body, as sent: the registry decodes it as text ([`Registry::call_json`]),
    /// read in place (its UTF-8 checked once, at the call).
    Json(Bytes),
    /// An empty body (`{}`) or a form, turned into JSON here.
    Value(Value),
}

/// The call's arguments from its body: `{}` when empty, else JSON or a form by
/// `Content-Type`.
fn arguments(
    tool: &ToolDescriptor,
    parts: &Parts,
    body: Result<Bytes, Problem>,
) -> Result<Arguments, Box<Problem>> {
    let body = body.map_err(Box::new)?;
    if body.is_empty() {
        return Ok(Arguments::Value(Value::Object(Map::new())));
    }
    let invalid = |e: &Error| Box::new(Problem::from_error(e, None));
    match headers::body_kind(&parts.headers) {
        // Whether it is JSON is the registry's check (its UTF-8 is checked at the call).
        Ok(headers::BodyKind::Json) => Ok(Arguments::Json(body)),
        Ok(headers::BodyKind::Form) => {
            forms::form_to_args(tool.name(), &tool.input_schema(), &body)
                .map(Arguments::Value)
                .map_err(|e| invalid(&e))
        }
        Err(what) => {
            let problem = Problem::new(
                ProblemType::UnsupportedMediaType,
                format!("the body has {what}; nothing ran. Send the arguments as `application/json` (an object) or as an HTML form (`application/x-www-form-urlencoded`)"),
            );
            Err(Box::new(problem))
        }
    }
}

/// A JSON body that is not UTF-8, so not JSON (RFC 8259 section 8.1).
fn not_utf8(tool: &ToolDescriptor, e: &std::str::Utf8Error) -> Problem {
    let e = Error::InvalidArguments {
        tool: tool.name().to_owned(),
        field: None,
        message: format!("the body is not JSON ({e}); nothing ran. Send the arguments as one JSON object in UTF-8"),
    };
    Problem::from_error(&e, None)
}

/// The answer to a call that returned a result.
fn answer(output: ToolOutput<CallResult>, prefix: &str, representation: bool) -> Response {
    let ToolOutput {
        value,
        key,
        outcome,
        ..
    } = output;
    let Some(key) = key else {
        // A read-only tool: no key, no operation, nothing stored.
        return result_response(value);
    };
    let location = operation_path(prefix, &key);
    let outcome = (OUTCOME_NAME, outcome_value(outcome));
    let Ok(location) = HeaderValue::from_str(&location) else {
        // Keys are hex and a prefix found in a request path is a valid header: only a base
        // path set with characters a header cannot carry gets here.
        return Problem::new(
            ProblemType::Misconfigured,
            format!("the call ran (key {key}), but its operation path `{location}` cannot be sent as a header; the server's base path is invalid. Read the operation by its key"),
        )
        .into_response();
    };
    if representation {
        let mut response = result_response_with(value, 3);
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_LOCATION, location);
        headers.insert(PREFERENCE_APPLIED, RETURN_REPRESENTATION);
        headers.insert(outcome.0, outcome.1);
        return response;
    }
    (
        StatusCode::SEE_OTHER,
        [(header::LOCATION, location), outcome],
    )
        .into_response()
}

/// Where a failed call's operation can be read, when there is one to read: a call still
/// running, one whose outcome is unknown, the first call of a reused key, a stored error
/// (`cache_errors`), and a call awaiting or denied approval. A released failure leaves
/// nothing behind.
fn operation_link(tool: &ToolDescriptor, error: &Error, prefix: &str) -> Option<String> {
    let readable = match error {
        Error::InProgress { .. }
        | Error::OutcomeUnknown { .. }
        | Error::KeyReused { .. }
        | Error::AwaitingApproval { .. }
        | Error::Denied { .. } => true,
        Error::ToolFailed { .. } => tool.cache_errors(),
        _ => false,
    };
    error
        .key()
        .filter(|_| readable)
        .map(|key| operation_path(prefix, key))
}

/// `{prefix}/operations/{key}`, the key percent-encoded as a path segment.
fn operation_path(prefix: &str, key: &str) -> String {
    let mut path = String::with_capacity(prefix.len() + "/operations/".len() + key.len());
    path.push_str(prefix);
    path.push_str("/operations/");
    // A store key is 64 hex digits: nothing to encode (checked, so any key stays correct).
    if key.bytes().all(|b| b.is_ascii_alphanumeric()) {
        path.push_str(key);
    } else {
        path.push_str(&encode_segment(key));
    }
    path
}

/// What RFC 3986 lets a path segment carry as it is (unreserved characters); the rest is
/// percent-encoded.
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `text` as one URL path segment (an operation key, a tool name).
pub(crate) fn encode_segment(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, SEGMENT).to_string()
}

/// `GET /operations/{key}`.
async fn read_operation(
    State(tools): Tools,
    OriginalUri(original): OriginalUri,
    key: Result<Path<String>, PathRejection>,
    parts: Parts,
) -> Response {
    let html = headers::prefers_html(&parts.headers);
    let refuse = |problem: Problem| with_vary(respond_problem(problem, html));
    let Ok(Path(key)) = key else {
        return refuse(not_found("(not valid percent-encoded UTF-8)"));
    };
    let tenant = match tools.tenant_of(&parts, html) {
        Ok(tenant) => tenant,
        Err(rejection) => return rejection.into_response(),
    };
    let history = parts.uri.query().is_some_and(|query| {
        form_urlencoded::parse(query.as_bytes())
            .any(|(name, value)| name == "history" && !matches!(&*value, "false" | "0"))
    });
    let read = async {
        match history {
            true => crate::operation_with_history(&key).await,
            false => crate::operation(&key).await,
        }
    };
    match tools.in_context(tenant.clone(), None, read).await {
        Ok(Some(op)) if html && op.state == OperationState::AwaitingApproval => {
            let prefix = tools.prefix(&original, "/operations/");
            let asking = decide::asking(&tools, tenant, &parts, &key, &prefix).await;
            with_vary(operation_response(&op, html, asking.as_ref()))
        }
        Ok(Some(op)) => with_vary(operation_response(&op, html, None)),
        Ok(None) => refuse(not_found(&key)),
        Err(e) => refuse(Problem::from_error(&e, None)),
    }
}

fn not_found(key: &str) -> Problem {
    Problem::new(
        ProblemType::OperationNotFound,
        format!("no operation with key {key} for this caller: it was never made here, has expired, or belongs to another tenant. Make the call (the same arguments are safe to repeat)"),
    )
}

/// The status an operation is read with: the outcome of the call it stands for, so a client
/// that followed the redirect ends on the call's status, never a success for a call that
/// did not succeed.
fn operation_status(state: OperationState) -> StatusCode {
    match state {
        OperationState::Completed => StatusCode::OK,
        OperationState::InProgress => StatusCode::ACCEPTED,
        OperationState::Failed => ProblemType::ToolFailed.status(),
        OperationState::Unknown => ProblemType::OutcomeUnknown.status(),
        // A run: undoing, as running; undone, as a failed call; not fully undone, as an
        // unknown outcome (an operator must act).
        OperationState::Compensating => StatusCode::ACCEPTED,
        OperationState::Compensated => ProblemType::ToolFailed.status(),
        OperationState::NeedsIntervention => ProblemType::OutcomeUnknown.status(),
        // Approval: nothing ran; waiting (for a person, or for the approved call's retry)
        // is pending work, a denial is the refusal the call itself gets.
        OperationState::AwaitingApproval | OperationState::Approved => StatusCode::ACCEPTED,
        OperationState::Denied => ProblemType::Denied.status(),
    }
}

fn operation_response(op: &Operation, html: bool, asking: Option<&html::Asking>) -> Response {
    let status = operation_status(op.state);
    let retry_after = op.lease_remaining.map(|lease| {
        problem::retry_after_secs(u64::try_from(lease.as_millis()).unwrap_or(u64::MAX))
    });
    let mut response = if html {
        html_response(status, html::operation_page(op, retry_after, asking))
    } else {
        match serde_json::to_value(op) {
            Ok(doc) => json_response(status, &doc),
            Err(e) => {
                return Problem::new(
                    ProblemType::Codec,
                    format!("the operation {} cannot be encoded: {e}", op.key),
                )
                .into_response()
            }
        }
    };
    let headers = response.headers_mut();
    // Per-tenant data that changes state: never kept by a shared cache.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let (OperationState::InProgress | OperationState::Compensating, Some(seconds)) =
        (op.state, retry_after)
    {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

/// `GET /tools`.
async fn list_tools(State(tools): Tools) -> Response {
    json_response(StatusCode::OK, &tools.registry.to_json())
}

/// `GET /openapi.json`.
async fn openapi_document(State(tools): Tools, OriginalUri(original): OriginalUri) -> Response {
    let prefix = tools.prefix(&original, "/openapi.json");
    let server = if prefix.is_empty() { "/" } else { &prefix };
    let doc = openapi::document(&tools.registry, &tools.title, &tools.version, server);
    json_response(StatusCode::OK, &doc)
}

/// Any other method on a route (axum adds `Allow`).
async fn method_not_allowed(parts: Parts) -> Response {
    let problem = Problem::new(
        ProblemType::MethodNotAllowed,
        format!(
            "{} is not served at {}: tools are called with POST, operations and lists read with GET",
            parts.method,
            parts.uri.path()
        ),
    );
    with_vary(respond_problem(
        problem,
        headers::prefers_html(&parts.headers),
    ))
}

/// A problem as JSON, or as a page for a browser.
fn respond_problem(problem: Problem, html: bool) -> Response {
    let status = problem.status();
    let mut response = if html {
        let mut response = html_response(status, html::problem_page(&problem));
        problem.apply_headers(&mut response);
        response
    } else {
        problem.into_response()
    };
    if status == StatusCode::UNSUPPORTED_MEDIA_TYPE {
        // RFC 9110 15.5.16: say which media types would be accepted.
        response.headers_mut().insert(
            HeaderName::from_static("accept-post"),
            HeaderValue::from_static(headers::ACCEPTED_BODIES),
        );
    }
    response
}

/// A `200 OK` with a call's result, sent as the registry encoded it (a JSON body's call
/// comes back as JSON text, written as it is).
fn result_response(result: CallResult) -> Response {
    result_response_with(result, 0)
}

/// A `200` with the result as its JSON body and room for `extra` more headers: the
/// response built in place, its header map allocated once (the tuple form sets a
/// `text/plain` type, replaces it and grows the map for each header added after).
fn result_response_with(result: CallResult, extra: usize) -> Response {
    let body = match result {
        CallResult::Value(value) => serde_json::to_vec(&value).unwrap_or_default(),
        CallResult::Text(text) => text.into_bytes(),
    };
    let mut response = Response::new(axum::body::Body::from(body));
    let headers = response.headers_mut();
    headers.reserve(1 + extra);
    headers.insert(header::CONTENT_TYPE, APPLICATION_JSON);
    response
}

fn json_response(status: StatusCode, value: &Value) -> Response {
    // `to_vec` writes straight into the buffer; `to_string` goes through `fmt::Display`.
    let body = serde_json::to_vec(value).unwrap_or_default();
    (status, [(header::CONTENT_TYPE, APPLICATION_JSON)], body).into_response()
}

fn html_response(status: StatusCode, page: String) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        )],
        page,
    )
        .into_response()
}

fn with_vary(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::VARY, HeaderValue::from_static("accept"));
    response
}
