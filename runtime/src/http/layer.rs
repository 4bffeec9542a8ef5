//! [`IdempotencyLayer`]: the `Idempotency-Key` header (IETF httpapi draft, as Stripe serves
//! it) for any axum route, with the first response stored through the same [`Store`] and
//! lease layer as tool calls, and replayed.
//!
//! One request's path through the layer: the method is one the layer guards (else the
//! request passes untouched) -> `Idempotency-Key` read (`400` missing or invalid) -> the
//! client's identity (the identity function's refusal, or `500` for an invalid scope) ->
//! the body read up to its limit (`413`) -> the key (route, identity, client key) and the
//! fingerprint (method, path and query, body) -> [`lease::acquire`]: held (the handler
//! runs under the lease's heartbeat, its response is stored or the key released), completed
//! (the stored response replayed with `Idempotent-Replayed: true`), busy (`409` +
//! `Retry-After`), abandoned (`500` unknown outcome, or a rerun with
//! [`at_least_once`](IdempotencyLayer::at_least_once)), another fingerprint (`422`).

use core::convert::Infallible;
use core::task::{Context, Poll};
use core::time::Duration;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::MatchedPath;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::headers;
use super::problem::retry_after_secs;
use super::{Problem, ProblemType, Rejection, TenantFn};
use crate::ambient;
use crate::key::{self, KeyBuilder};
use crate::lease::{self, Acquired, Lease, OnBusy, Policy};
use crate::registry::BoxFuture;
use crate::store::{ClaimRequest, Record, RecordState, Store, StoreError};

/// The header a replayed response carries (`Idempotent-Replayed: true`, Stripe's name): the
/// response is the stored one of the first request with this key, and the handler did not
/// run. A first execution does not carry it.
pub const REPLAYED_HEADER: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The default of [`IdempotencyLayer::with_ttl`]: 24 hours, as Stripe keeps keys. A key is
/// remembered that long after its first request (a retry after that runs again).
pub const DEFAULT_IDEMPOTENCY_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// The default of [`IdempotencyLayer::with_lease`]: 30 seconds, the tools' default lease.
/// The lease is renewed while the handler runs, so it only bounds how long a dead server's
/// claim blocks its key (`409`) before retries see an unknown outcome.
pub const DEFAULT_IDEMPOTENCY_LEASE: Duration = Duration::from_secs(30);

/// The default of [`IdempotencyLayer::with_max_response_bytes`]: 1 MiB of response body.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 1024 * 1024;

/// The response headers stored and replayed by default (besides the status and the body):
/// `Content-Type`, `Content-Language`, `Content-Location`, `Location` and `ETag`.
/// [`IdempotencyLayer::with_stored_headers`] adds the application's own. Never store
/// `Set-Cookie` or other per-session headers: a replay would hand them to whoever retries.
pub const DEFAULT_STORED_HEADERS: [HeaderName; 5] = [
    header::CONTENT_TYPE,
    header::CONTENT_LANGUAGE,
    header::CONTENT_LOCATION,
    header::LOCATION,
    header::ETAG,
];

/// The key document's contract (see `docs/http.md`): a key is the SHA-256 of the canonical
/// `{"contract", "fields": {"method", "route"}, "scope", "tool", "version"}` document, the
/// scope holding the identity and the client's key (`client:<key>`).
const KEY_CONTRACT: &str = "tool-contracts/http-idempotency/v1";

/// The version of the stored response document (the record's contract version).
const RECORD_FORMAT: u32 = 1;

/// The `Idempotency-Key` header for any axum route (IETF httpapi draft
/// `draft-ietf-httpapi-idempotency-key-header`, and Stripe's behaviour): the first response
/// to a key is stored and every retry with the key gets it back, while the handler runs
/// once.
///
/// ```no_run
/// # use tool_contracts_runtime as tool_contracts;
/// use tool_contracts::http::axum::{routing::post, Router};
/// use tool_contracts::http::IdempotencyLayer;
///
/// async fn pay() -> &'static str { "paid" }
///
/// let app: Router = Router::new()
///     .route("/payments", post(pay))
///     .route_layer(
///         IdempotencyLayer::new()
///             // Keys are per client: here the account your auth layer put in the extensions.
///             .with_identity(|parts| Ok(parts.headers.get("x-account")
///                 .and_then(|v| v.to_str().ok()).map(str::to_owned))),
///     );
/// ```
///
/// | the request | the answer |
/// |---|---|
/// | a method the layer does not guard (default: all but `POST` and `PATCH`) | passed to the handler untouched |
/// | no `Idempotency-Key`, or an invalid one | `400` ([`ProblemType::InvalidArguments`], `field: Idempotency-Key`) |
/// | a body over [`with_max_body_bytes`](Self::with_max_body_bytes) | `413` |
/// | the first request of a key | the handler runs under a lease; its response is stored (below) |
/// | a retry while the first still runs | `409` + `Retry-After` ([`ProblemType::InProgress`]) |
/// | a retry after the first completed | the stored status, headers and body, plus `Idempotent-Replayed: true` |
/// | the key with another method, path or body | `422` ([`ProblemType::KeyReused`], `params` names them) |
/// | a retry after the first died mid-handler | `500` ([`ProblemType::OutcomeUnknown`]); with [`at_least_once`](Self::at_least_once), the handler runs again |
/// | the store fails | `503`, nothing ran |
///
/// What is stored: `2xx`, `3xx` and `4xx` responses (the draft and Stripe replay errors
/// too), except `408`, `425` and `429`, which ask the client to try again and so release
/// the key; `5xx` responses release the key (a retry runs again) unless
/// [`store_server_errors`](Self::store_server_errors). A response body over
/// [`with_max_response_bytes`](Self::with_max_response_bytes) is passed to the client but
/// not stored: the key is abandoned, so a retry gets the unknown outcome, never a second run.
///
/// A handler dropped mid-flight (hyper drops it when the client disconnects) is treated as
/// the engine treats a dropped tool call: the lease's heartbeat stops, the claim stays until
/// the lease runs out and then counts as abandoned (the effect may have happened), so a
/// retry gets the unknown outcome (`409` until then).
///
/// Keys are scoped per route (the method and axum's [`MatchedPath`], the route template,
/// when the layer runs inside the router, as with `route_layer` or `Router::layer`; the
/// request path otherwise) and per client identity ([`with_identity`](Self::with_identity)),
/// with the same scope rules as the tools' tenants and client keys.
#[derive(Clone)]
pub struct IdempotencyLayer {
    config: Arc<Config>,
}

#[derive(Clone)]
struct Config {
    store: Option<Arc<dyn Store>>,
    methods: Vec<Method>,
    identity: Option<Arc<TenantFn>>,
    max_body_bytes: usize,
    max_response_bytes: usize,
    stored_headers: Vec<HeaderName>,
    store_server_errors: bool,
    at_least_once: bool,
    lease: Duration,
    ttl: Duration,
}

impl core::fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let c = &self.config;
        f.debug_struct("IdempotencyLayer")
            .field("store", &c.store.as_ref().map(|_| "custom"))
            .field("methods", &c.methods)
            .field("identity", &c.identity.as_ref().map(|_| "fn"))
            .field("max_body_bytes", &c.max_body_bytes)
            .field("max_response_bytes", &c.max_response_bytes)
            .field("stored_headers", &c.stored_headers)
            .field("store_server_errors", &c.store_server_errors)
            .field("at_least_once", &c.at_least_once)
            .field("lease", &c.lease)
            .field("ttl", &c.ttl)
            .finish()
    }
}

impl Default for IdempotencyLayer {
    fn default() -> Self {
        IdempotencyLayer::new()
    }
}

impl IdempotencyLayer {
    /// A layer with every default: `POST` and `PATCH` guarded, the process's store
    /// ([`set_default_store`](crate::set_default_store)), no identity, bodies up to
    /// [`DEFAULT_MAX_BODY_BYTES`](super::DEFAULT_MAX_BODY_BYTES), responses stored up to
    /// [`DEFAULT_MAX_RESPONSE_BYTES`] with [`DEFAULT_STORED_HEADERS`], `5xx` not stored,
    /// exactly once ([`at_least_once`](Self::at_least_once) off), a
    /// [`DEFAULT_IDEMPOTENCY_LEASE`] and a [`DEFAULT_IDEMPOTENCY_TTL`].
    pub fn new() -> Self {
        IdempotencyLayer {
            config: Arc::new(Config {
                store: None,
                methods: vec![Method::POST, Method::PATCH],
                identity: None,
                max_body_bytes: super::DEFAULT_MAX_BODY_BYTES,
                max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
                stored_headers: DEFAULT_STORED_HEADERS.to_vec(),
                store_server_errors: false,
                at_least_once: false,
                lease: DEFAULT_IDEMPOTENCY_LEASE,
                ttl: DEFAULT_IDEMPOTENCY_TTL,
            }),
        }
    }

    fn edit(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(Arc::make_mut(&mut self.config));
        self
    }

    /// Keeps keys and responses in this store (default: the process's store, read at each
    /// request; axum runs each request in a task of its own, where a store installed with
    /// [`with_store`](crate::with_store) around the server is not seen).
    pub fn with_store<S: Store>(self, store: S) -> Self {
        let store = crate::telemetry::measured(store);
        self.edit(|c| c.store = Some(store))
    }

    /// The methods that require an `Idempotency-Key` (default `POST` and `PATCH`, the
    /// draft's non-idempotent methods); requests with other methods pass untouched.
    pub fn with_methods<I: IntoIterator<Item = Method>>(self, methods: I) -> Self {
        let methods = methods.into_iter().collect();
        self.edit(|c| c.methods = methods)
    }

    /// The client identity each key is scoped to, from the request: the same shape as
    /// [`HttpTools::with_tenant`](super::HttpTools::with_tenant) (one function can serve
    /// both). `Ok(Some(identity))` scopes the key to it, so two clients that pick the same
    /// `Idempotency-Key` never share a response; `Ok(None)` is one scope for every client;
    /// `Err(rejection)` answers the rejection and nothing runs. An identity that is empty
    /// or has control characters is a `500` ([`ProblemType::Misconfigured`]).
    pub fn with_identity<F>(self, identity: F) -> Self
    where
        F: Fn(&Parts) -> Result<Option<String>, Rejection> + Send + Sync + 'static,
    {
        self.edit(|c| c.identity = Some(Arc::new(identity)))
    }

    /// The largest request body accepted, in bytes (default
    /// [`DEFAULT_MAX_BODY_BYTES`](super::DEFAULT_MAX_BODY_BYTES)); a larger one is `413` and
    /// nothing runs. The layer reads the whole body to fingerprint it.
    pub fn with_max_body_bytes(self, limit: usize) -> Self {
        self.edit(|c| c.max_body_bytes = limit)
    }

    /// The largest response body stored, in bytes (default [`DEFAULT_MAX_RESPONSE_BYTES`]).
    /// A larger response still reaches the client, but is not stored: its key is left as
    /// an unknown outcome (the handler ran; a retry must not run it again).
    pub fn with_max_response_bytes(self, limit: usize) -> Self {
        self.edit(|c| c.max_response_bytes = limit)
    }

    /// Response headers to store and replay besides [`DEFAULT_STORED_HEADERS`]: the
    /// application's own (`x-payment-id`). Headers not listed are not replayed.
    pub fn with_stored_headers<I: IntoIterator<Item = HeaderName>>(self, names: I) -> Self {
        let names: Vec<HeaderName> = names.into_iter().collect();
        self.edit(|c| {
            for name in names {
                if !c.stored_headers.contains(&name) {
                    c.stored_headers.push(name);
                }
            }
        })
    }

    /// Stores `5xx` responses too, so a retry replays the server error instead of running
    /// again. By default a `5xx` releases the key: a server error usually means the effect
    /// did not happen, and the retry is the client's way to try again.
    pub fn store_server_errors(self) -> Self {
        self.edit(|c| c.store_server_errors = true)
    }

    /// At-least-once for this route: a retry of a request whose first attempt died
    /// mid-handler (its lease ran out without a response stored) takes the key over and
    /// runs the handler again, instead of answering the unknown outcome (`500`). Only for
    /// handlers whose effect is safe to repeat (or that check for it themselves).
    pub fn at_least_once(self) -> Self {
        self.edit(|c| c.at_least_once = true)
    }

    /// How long a claim lives without renewal (default [`DEFAULT_IDEMPOTENCY_LEASE`]): the
    /// handler's heartbeat renews it every third of it; a server that died leaves the key
    /// `409` for at most this long, then an unknown outcome.
    pub fn with_lease(self, lease: Duration) -> Self {
        self.edit(|c| c.lease = lease)
    }

    /// How long a key and its stored response are kept (default
    /// [`DEFAULT_IDEMPOTENCY_TTL`], 24 h); a retry after that runs as a new request.
    pub fn with_ttl(self, ttl: Duration) -> Self {
        self.edit(|c| c.ttl = ttl)
    }
}

impl<S> tower_layer::Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

/// The service [`IdempotencyLayer`] wraps a route's service in.
#[derive(Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> core::fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("IdempotencyService").finish_non_exhaustive()
    }
}

impl<S> tower_service::Service<Request<Body>> for IdempotencyService<S>
where
    S: tower_service::Service<Request<Body>, Error = Infallible> + Clone + Send + 'static,
    S::Response: IntoResponse,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        // The service that was polled ready serves this request; a clone takes its place
        // (tower's documented pattern for services called from a future).
        let clone = self.inner.clone();
        let inner = core::mem::replace(&mut self.inner, clone);
        let config = Arc::clone(&self.config);
        Box::pin(async move { Ok(handle(&config, inner, request).await) })
    }
}

/// The inner service's answer to `request`.
async fn forward<S>(mut inner: S, request: Request<Body>) -> Response
where
    S: tower_service::Service<Request<Body>, Error = Infallible>,
    S::Response: IntoResponse,
{
    match inner.call(request).await {
        Ok(response) => response.into_response(),
        Err(never) => match never {},
    }
}

/// What identifies one guarded request: its route, the client's key, the store key and
/// the fingerprint of the request.
struct Guarded {
    /// `POST /payments/{id}`: the record's tool name, and what errors name.
    label: String,
    /// The client's `Idempotency-Key`.
    client_key: String,
    /// The store key (64 hex digits).
    key: String,
    scope: Option<Arc<str>>,
    /// The request document (`method`, `path`, `body`: its length and SHA-256), stored
    /// with the claim to name what differs when the key is reused.
    args: String,
    /// The digest of `args`, made when first needed: a replay of a record holding these
    /// very `args` never needs it.
    fingerprint: std::sync::OnceLock<String>,
}

impl Guarded {
    fn fingerprint(&self) -> &str {
        self.fingerprint
            .get_or_init(|| key::fingerprint(&self.args))
    }
}

async fn handle<S>(config: &Config, inner: S, request: Request<Body>) -> Response
where
    S: tower_service::Service<Request<Body>, Error = Infallible>,
    S::Response: IntoResponse,
{
    if !config.methods.contains(request.method()) {
        return forward(inner, request).await;
    }
    let (parts, body) = request.into_parts();
    let route = parts
        .extensions
        .get::<MatchedPath>()
        .map_or_else(|| parts.uri.path().to_owned(), |m| m.as_str().to_owned());
    let label = format!("{} {route}", parts.method);
    let client_key = match headers::client_key(&parts.headers, &label) {
        Ok(Some(key)) => key,
        Ok(None) => {
            return Problem::new(
                ProblemType::InvalidArguments,
                format!("`{label}` requires an `Idempotency-Key` header (IETF httpapi Idempotency-Key draft); nothing ran. Send a unique key (a UUID) for each new request, the same with every retry of it"),
            )
            .with_extension("field", headers::IDEMPOTENCY_KEY_FIELD)
            .into_response()
        }
        Err(e) => return Problem::from_error(&e, None).into_response(),
    };
    let identity = match identity_of(config, &parts) {
        Ok(identity) => identity,
        Err(rejection) => return rejection.into_response(),
    };
    let body = match read_body(body, &parts.headers, config.max_body_bytes).await {
        Ok(body) => body,
        Err(problem) => return problem.into_response(),
    };
    let guarded = match guard(&parts, &body, &route, label, client_key, identity).await {
        Ok(guarded) => guarded,
        Err(problem) => return problem.into_response(),
    };
    let store = config.store.clone().unwrap_or_else(ambient::current_store);
    let accepts = |theirs: &str| theirs == guarded.fingerprint();
    let policy = Policy {
        on_busy: OnBusy::Report,
        take_over: config.at_least_once,
        accepts: &accepts,
    };
    // A completed key the store answers from memory needs no claim (and, holding this
    // very request document, no fingerprint), as for a tool call.
    let now = lease::completed_now(
        &store,
        &guarded.key,
        guarded.scope.as_deref(),
        &guarded.args,
        &policy,
    );
    let acquired = match now {
        Some(acquired) => acquired,
        None => {
            let claim = ClaimRequest {
                key: &guarded.key,
                tool: &guarded.label,
                version: RECORD_FORMAT,
                scope: guarded.scope.as_deref(),
                fingerprint: guarded.fingerprint(),
                args: &guarded.args,
                lease: config.lease,
                ttl: config.ttl,
                worker: ambient::worker_id(),
            };
            match lease::acquire(&store, claim, policy).await {
                Ok(acquired) => acquired,
                Err(e) => {
                    tracing::warn!(route = %guarded.label, key = %guarded.key, error = %e, "tool-contracts: store failed; the request was not run");
                    return store_unavailable(&guarded, &e);
                }
            }
        }
    };
    match acquired {
        Acquired::Held(lease) => {
            let request = Request::from_parts(parts, Body::from(body));
            run(config, inner, lease, request, &guarded).await
        }
        Acquired::Completed(record) => {
            tracing::debug!(route = %guarded.label, key = %guarded.key, decision = "replayed", "tool-contracts: replayed the stored response");
            replay(&record).unwrap_or_else(|message| {
                Problem::new(
                    ProblemType::Codec,
                    format!("the stored response of this `Idempotency-Key` to `{}` does not decode ({message}); nothing ran. Send a new key, or tell the server's operator", guarded.label),
                )
                .with_extension("key", guarded.key.as_str())
                .into_response()
            })
        }
        Acquired::Busy { lease_remaining } => {
            let ms = u64::try_from(lease_remaining.as_millis()).unwrap_or(u64::MAX);
            Problem::new(
                ProblemType::InProgress,
                format!("a request with this `Idempotency-Key` to `{}` is still being processed; nothing ran again. Retry after `Retry-After` seconds to get its response", guarded.label),
            )
            .with_extension("idempotency_key", guarded.client_key.as_str())
            .with_extension("key", guarded.key.as_str())
            .with_extension("lease_remaining_ms", ms)
            .with_retry_after(retry_after_secs(ms))
            .into_response()
        }
        Acquired::Abandoned => {
            tracing::warn!(route = %guarded.label, key = %guarded.key, decision = "rejected", reason = "outcome_unknown", "tool-contracts: an earlier request with this key stopped mid-handler");
            Problem::new(
                ProblemType::OutcomeUnknown,
                format!("an earlier request with this `Idempotency-Key` to `{}` stopped mid-handler (its server died or dropped it), so its effect may or may not have happened; it is not run again. Check whether the effect happened (read the resource) before sending the request with a new key", guarded.label),
            )
            .with_extension("idempotency_key", guarded.client_key.as_str())
            .with_extension("key", guarded.key.as_str())
            .into_response()
        }
        Acquired::Mismatch { record, .. } => {
            let theirs = match record {
                Some(record) => Some(record.args.clone()),
                None => store
                    .lookup(&guarded.key)
                    .await
                    .ok()
                    .flatten()
                    .map(|r| r.args),
            };
            let params = differing(&guarded.args, theirs.as_deref());
            tracing::info!(route = %guarded.label, key = %guarded.key, decision = "rejected", reason = "key_reused", "tool-contracts: Idempotency-Key reused with another request");
            Problem::new(
                ProblemType::KeyReused,
                format!("this `Idempotency-Key` was first used with another request to `{}` (its {} differ); nothing ran. A retry must repeat the same request; a new request needs a new key", guarded.label, params.join(", ")),
            )
            .with_extension("idempotency_key", guarded.client_key.as_str())
            .with_extension("key", guarded.key.as_str())
            .with_extension("params", params)
            .into_response()
        }
    }
}

/// The client identity, or the response that refuses the request.
fn identity_of(config: &Config, parts: &Parts) -> Result<Option<String>, Rejection> {
    let Some(identity) = &config.identity else {
        return Ok(None);
    };
    let scope = identity(parts)?;
    if let Some(scope) = &scope {
        if let Err(message) = ambient::validate_scope(scope) {
            tracing::error!(%message, "tool-contracts: the IdempotencyLayer identity function returned an invalid scope");
            return Err(Rejection::new(Problem::new(
                ProblemType::Misconfigured,
                "the server's identity function gave this request an invalid scope (empty, or with control characters); nothing ran. This is the server's fault: tell its operator",
            )));
        }
    }
    Ok(scope)
}

/// The request body, read whole up to `limit` bytes (`413` over it).
pub(super) async fn read_body(
    body: Body,
    headers: &HeaderMap,
    limit: usize,
) -> Result<Bytes, Problem> {
    let too_large = || {
        Problem::new(
            ProblemType::PayloadTooLarge,
            format!(
                "the request body is larger than this route accepts ({limit} bytes); nothing ran"
            ),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > u64::try_from(limit).unwrap_or(u64::MAX)) {
        return Err(too_large());
    }
    match http_body_util::Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Err(e) => Err(Problem::new(
            ProblemType::InvalidArguments,
            format!("the request body could not be read ({e}); nothing ran"),
        )),
    }
}

/// The key and fingerprint of a guarded request.
async fn guard(
    parts: &Parts,
    body: &[u8],
    route: &str,
    label: String,
    client_key: String,
    identity: Option<String>,
) -> Result<Guarded, Problem> {
    let internal = |what: String| {
        Problem::new(
            ProblemType::Internal,
            format!("the idempotency key of this request could not be made ({what}); nothing ran"),
        )
    };
    // The scope every surface builds: the task's own scope, the identity nested in it and
    // the client's key nested in that (`client:<key>`), by `with_scope`'s rules.
    let scope = {
        let client = ambient::with_scope(ambient::client_scope(&client_key), async {
            ambient::caller_scope(&label)
        });
        match identity {
            Some(identity) => ambient::with_scope(identity, client).await,
            None => client.await,
        }
    }
    .map_err(|e| {
        Problem::new(
            ProblemType::Misconfigured,
            format!("the scope of this request is invalid ({e}); nothing ran. This is the server's fault: tell its operator"),
        )
    })?;
    let method = parts.method.as_str();
    let mut builder = KeyBuilder::new(KEY_CONTRACT);
    builder
        .field("method", method)
        .and_then(|()| builder.field("route", route))
        .map_err(|e| internal(e.to_string()))?;
    let key = builder.finish(scope.as_deref(), &label, RECORD_FORMAT);
    let path = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path(), |pq| pq.as_str());
    let mut digest = String::with_capacity(64);
    key::push_hex(&mut digest, &Sha256::digest(body));
    let request = RequestDocument {
        body: BodyDigest {
            bytes: body.len(),
            sha256: &digest,
        },
        method,
        path,
    };
    let mut args = Vec::with_capacity(128);
    key::write_canonical(&request, &mut args).map_err(|e| internal(e.to_string()))?;
    let args = String::from_utf8(args).map_err(|e| internal(e.to_string()))?;
    Ok(Guarded {
        label,
        client_key,
        key,
        scope,
        fingerprint: std::sync::OnceLock::new(),
        args,
    })
}

/// What the store keeps of a request (`{"body": {"bytes", "sha256"}, "method", "path"}`),
/// written canonically: a struct rather than a `json!` map, so no map is built per request.
#[derive(serde::Serialize)]
struct RequestDocument<'a> {
    body: BodyDigest<'a>,
    method: &'a str,
    path: &'a str,
}

/// The body's length and SHA-256 (hex), in a [`RequestDocument`].
#[derive(serde::Serialize)]
struct BodyDigest<'a> {
    bytes: usize,
    sha256: &'a str,
}

/// Runs the handler under `lease`, then stores its response or releases the key.
async fn run<S>(
    config: &Config,
    inner: S,
    lease: Lease,
    request: Request<Body>,
    guarded: &Guarded,
) -> Response
where
    S: tower_service::Service<Request<Body>, Error = Infallible>,
    S::Response: IntoResponse,
{
    let label = &guarded.label;
    let key = &guarded.key;
    if lease.taken_over() {
        tracing::warn!(route = %label, key = %key, decision = "taken_over", "tool-contracts: rerunning a request whose first attempt died mid-handler (at_least_once)");
    }
    tracing::debug!(route = %label, key = %key, decision = "executed", "tool-contracts: running the handler");
    // Dropped here (the client went away): the heartbeat stops with the handler and the
    // claim runs out into an unknown outcome, as a dropped tool call's does.
    let response = lease.heartbeat(forward(inner, request)).await;
    let status = response.status();
    if !stores(status, config.store_server_errors) {
        tracing::debug!(route = %label, key = %key, status = status.as_u16(), "tool-contracts: response not stored; the key is released");
        if let Err(e) = lease.release().await {
            tracing::error!(route = %label, key = %key, error = %e, "tool-contracts: could not release the key; a retry sees an unknown outcome once its lease runs out");
        }
        return response;
    }
    let (head, body) = response.into_parts();
    match collect(body, config.max_response_bytes).await {
        Collected::Whole(bytes) => {
            let doc = encode(status, &head.headers, &config.stored_headers, &bytes);
            let is_error = status.is_client_error() || status.is_server_error();
            if let Err(e) = lease.complete(&doc, is_error).await {
                tracing::error!(route = %label, key = %key, error = %e, "tool-contracts: could not store the response; a retry sees an unknown outcome");
            }
            Response::from_parts(head, Body::from(bytes))
        }
        Collected::TooLarge { prefix, rest } => {
            tracing::warn!(route = %label, key = %key, limit = config.max_response_bytes, "tool-contracts: the response is larger than the layer stores; passed on, the key left as an unknown outcome");
            abandon(lease, guarded).await;
            use futures::StreamExt as _;
            let first = futures::stream::once(core::future::ready(Ok::<_, axum::Error>(prefix)));
            Response::from_parts(
                head,
                Body::from_stream(first.chain(rest.into_data_stream())),
            )
        }
        Collected::Broken(e) => {
            tracing::error!(route = %label, key = %key, error = %e, "tool-contracts: the handler's response body failed; the key is left as an unknown outcome");
            abandon(lease, guarded).await;
            Problem::new(
                ProblemType::Internal,
                format!("the handler of `{label}` ran but its response failed ({e}); its effect may have happened, so a retry with this key is answered as an unknown outcome"),
            )
            .into_response()
        }
    }
}

async fn abandon(lease: Lease, guarded: &Guarded) {
    if let Err(e) = lease.abandon().await {
        tracing::error!(route = %guarded.label, key = %guarded.key, error = %e, "tool-contracts: could not mark the key abandoned; it becomes so when its lease runs out");
    }
}

/// Whether a response of `status` is stored (else the key is released and a retry runs
/// again): see [`IdempotencyLayer`].
fn stores(status: StatusCode, server_errors: bool) -> bool {
    if status.is_server_error() {
        return server_errors;
    }
    // 408 Request Timeout, 425 Too Early, 429 Too Many Requests: "try again", not a result.
    !status.is_informational() && !matches!(status.as_u16(), 408 | 425 | 429)
}

/// A response body read up to the storable size.
enum Collected {
    Whole(Bytes),
    /// Over the limit: what was read, and the rest still to stream.
    TooLarge {
        prefix: Bytes,
        rest: Body,
    },
    Broken(axum::Error),
}

async fn collect(mut body: Body, limit: usize) -> Collected {
    let mut buffer: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                // Trailers are neither stored nor replayed.
                if let Ok(data) = frame.into_data() {
                    buffer.extend_from_slice(&data);
                    if buffer.len() > limit {
                        return Collected::TooLarge {
                            prefix: Bytes::from(buffer),
                            rest: body,
                        };
                    }
                }
            }
            Err(e) => return Collected::Broken(e),
        }
    }
    Collected::Whole(Bytes::from(buffer))
}

/// The stored response: `{"status", "headers": [[name, value], ...], "body"}`, the body as
/// text when it is UTF-8, else as `body_hex`.
fn encode(status: StatusCode, headers: &HeaderMap, stored: &[HeaderName], body: &[u8]) -> String {
    let kept: Vec<Value> = headers
        .iter()
        .filter(|(name, _)| stored.contains(name))
        .filter_map(|(name, value)| Some(json!([name.as_str(), value.to_str().ok()?])))
        .collect();
    let mut doc = json!({"status": status.as_u16(), "headers": kept});
    match core::str::from_utf8(body) {
        Ok(text) => doc["body"] = text.into(),
        Err(_) => {
            let mut hex = String::with_capacity(2 * body.len());
            key::push_hex(&mut hex, body);
            doc["body_hex"] = hex.into();
        }
    }
    doc.to_string()
}

/// A stored response as [`encode`] writes it, decoded straight from the record's text
/// (no `serde_json::Value` in between).
#[derive(serde::Deserialize)]
struct StoredResponse {
    status: u16,
    headers: Vec<(String, String)>,
    #[serde(default)]
    body: Option<String>,
    #[serde(default)]
    body_hex: Option<String>,
}

/// The stored response of `record`, marked as a replay.
fn replay(record: &Record) -> Result<Response, String> {
    let RecordState::Completed { result, .. } = &record.state else {
        return Err("the record is not completed".to_owned());
    };
    let stored: StoredResponse = serde_json::from_str(result).map_err(|e| e.to_string())?;
    let status = StatusCode::from_u16(stored.status).map_err(|_| "no valid status")?;
    let body = match (stored.body, stored.body_hex) {
        (Some(text), _) => Bytes::from(text),
        (None, Some(hex)) => Bytes::from(unhex(&hex).ok_or("`body_hex` is not hex")?),
        (None, None) => return Err("no body".to_owned()),
    };
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    for (name, value) in stored.headers {
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| e.to_string())?;
        let value = HeaderValue::from_str(&value).map_err(|e| e.to_string())?;
        headers.append(name, value);
    }
    headers.insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    Ok(response)
}

/// Lowercase or uppercase hex to bytes; `None` if it is not hex. Hand-written rather than
/// `const_hex::decode`, which also takes a `0x` prefix: stored text with one is not ours.
fn unhex(text: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| {
        char::from(c)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(2) {
        return None;
    }
    bytes
        .chunks_exact(2)
        .map(|pair| Some((digit(pair[0])? << 4) | digit(pair[1])?))
        .collect()
}

/// The members of two request documents that differ (`path`, `body`, `method`).
fn differing(ours: &str, theirs: Option<&str>) -> Vec<String> {
    let parse = |doc: &str| serde_json::from_str::<serde_json::Map<String, Value>>(doc).ok();
    let (Some(ours), Some(theirs)) = (parse(ours), theirs.and_then(parse)) else {
        return vec!["(the first request could not be read back to compare)".to_owned()];
    };
    let mut names: Vec<String> = ours
        .iter()
        .filter(|(name, value)| theirs.get(*name) != Some(*value))
        .map(|(name, _)| name.clone())
        .collect();
    names.extend(theirs.keys().filter(|n| !ours.contains_key(*n)).cloned());
    if names.is_empty() {
        names.push("(the request encoding)".to_owned());
    }
    names
}

fn store_unavailable(guarded: &Guarded, e: &StoreError) -> Response {
    Problem::new(
        ProblemType::StoreUnavailable,
        format!("the idempotency store failed ({e}); nothing ran. Retry when the store is back"),
    )
    .with_extension("key", guarded.key.as_str())
    .into_response()
}
