//! Approval over HTTP (docs/http.md, "Approval over HTTP"): `POST /operations/{key}/approve`
//! and `/deny`, the call they continue, and what `POST /tools/{name}` answers for a call that
//! awaits a decision or was denied.
//!
//! A decision is stored by [`approval::decide`] (the one door every channel uses: first
//! decision wins, in every process sharing the store), in the reader's tenant scope. An
//! approval then continues the call at once: the arguments the request stored go through
//! the registry, under the call's own key, so the engine's claim makes it run once however
//! many agent retries arrive at the same moment.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{OriginalUri, Path, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;

use super::html::{Asking, Who};
use super::{
    headers, json_response, not_found, operation_path, respond_problem, with_vary, HttpTools,
    Problem, ProblemType, Rejection, Tools, OUTCOME_NAME,
};
use crate::approval::{self, channel, ApprovalState, Verdict};
use crate::error::Error;
use crate::registry::Outcome;
use crate::spec::Mismatch;

/// The function that says who decides a pending approval over HTTP, from the request (in
/// practice from its authentication): `Ok(Some(name))` decides as `name` (a `by` in the
/// body is ignored), `Ok(None)` takes the body's `by`, `Err(rejection)` refuses the
/// decision with the rejection's response (a `403` for someone who may call tools but not
/// approve them). Set with [`HttpTools::with_approver`].
pub type ApproverFn = dyn Fn(&Parts) -> Result<Option<String>, Rejection> + Send + Sync;

/// The longest `reason`, in characters (as [`approval::decide`] checks it).
const MAX_REASON_CHARS: usize = 1024;

/// `POST /operations/{key}/approve`.
pub(super) async fn approve(
    tools: Tools,
    original: OriginalUri,
    key: Result<Path<String>, PathRejection>,
    parts: Parts,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    decision(Verdict::Approved, tools, original, key, parts, body).await
}

/// `POST /operations/{key}/deny`.
pub(super) async fn deny(
    tools: Tools,
    original: OriginalUri,
    key: Result<Path<String>, PathRejection>,
    parts: Parts,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    decision(Verdict::Denied, tools, original, key, parts, body).await
}

async fn decision(
    verdict: Verdict,
    State(tools): Tools,
    OriginalUri(original): OriginalUri,
    key: Result<Path<String>, PathRejection>,
    parts: Parts,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let html = headers::prefers_html(&parts.headers);
    let refuse = |problem: Problem| with_vary(respond_problem(problem, html));
    let verb = match verdict {
        Verdict::Approved => "approve",
        Verdict::Denied => "deny",
    };
    let Ok(Path(key)) = key else {
        return refuse(not_found("(not valid percent-encoded UTF-8)"));
    };
    if headers::is_cross_origin(&parts.method, &parts.headers, &tools.trusted_origins) {
        return refuse(Problem::new(
            ProblemType::CrossOrigin,
            format!("a page of another origin asked this browser to {verb} operation {key}; nothing was decided. If that origin is yours, add it with `HttpTools::with_trusted_origins`"),
        ));
    }
    let Some(approver) = &tools.approver else {
        return refuse(Problem::new(
            ProblemType::DecisionsDisabled,
            format!("this server does not take decisions over HTTP; nothing was decided. Decide with the operator CLI (`tool-contracts {verb} {key}`), or ask the server's operator to name who may decide with `HttpTools::with_approver`"),
        ));
    };
    let tenant = match tools.tenant_of(&parts, html) {
        Ok(tenant) => tenant,
        Err(rejection) => return rejection.into_response(),
    };
    let named = match approver(&parts) {
        Ok(named) => named,
        Err(rejection) => return rejection.into_response(),
    };
    let body = match decision_body(&parts, body) {
        Ok(body) => body,
        Err(e) => return refuse(Problem::from_error(&e, None)),
    };
    let Some(by) = named.or(body.by) else {
        return refuse(Problem::from_error(
            &invalid("by", "name who decides: send `by` (a person or a service), as JSON `{\"by\": \"…\"}` or a form field; nothing was decided"),
            None,
        ));
    };
    let reason = body.reason.filter(|r| !r.trim().is_empty());
    if verdict == Verdict::Denied && reason.is_none() {
        return refuse(Problem::from_error(
            &invalid("reason", "a denial needs a reason: send `reason` (what the agent and its user are told); nothing was decided"),
            None,
        ));
    }
    let prefix = tools.prefix(&original, "/operations/");
    let decide = approval::decide(&key, verdict, &by, channel::HTTP, reason.as_deref());
    match tools.in_context(tenant.clone(), None, decide).await {
        Ok(_) => {}
        Err(e @ Error::NoPendingApproval { .. }) => {
            // Nothing this reader may see under the key: the same 404 as a read of it.
            let known = tools.in_context(tenant.clone(), None, exists(&key)).await;
            return match known {
                Ok(false) => refuse(not_found(&key)),
                Ok(true) => refuse(Problem::from_error(&e, Some(operation_path(&prefix, &key)))),
                Err(e) => refuse(Problem::from_error(&e, None)),
            };
        }
        Err(e) => return refuse(Problem::from_error(&e, None)),
    }
    let outcome = match verdict {
        Verdict::Approved => continue_call(&tools, tenant.clone(), &key).await,
        Verdict::Denied => None,
    };
    let location = operation_path(&prefix, &key);
    let mut response = if html {
        see_other(&location)
    } else {
        let read = crate::operation(&key);
        match tools.in_context(tenant, None, read).await {
            Ok(Some(op)) => match serde_json::to_value(&op) {
                Ok(doc) => {
                    let mut response = json_response(StatusCode::OK, &doc);
                    if let Ok(location) = HeaderValue::from_str(&location) {
                        response
                            .headers_mut()
                            .insert(header::CONTENT_LOCATION, location);
                    }
                    response
                        .headers_mut()
                        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
                    response
                }
                Err(e) => {
                    return refuse(Problem::new(
                        ProblemType::Codec,
                        format!(
                        "the decision is stored, but the operation {key} cannot be encoded: {e}"
                    ),
                    ))
                }
            },
            // Decided, then gone at once (a `ttl` of 0): as a read of it.
            Ok(None) => return refuse(not_found(&key)),
            Err(e) => return refuse(Problem::from_error(&e, None)),
        }
    };
    if let Some(outcome) = outcome {
        response
            .headers_mut()
            .insert(OUTCOME_NAME, super::outcome_value(outcome));
    }
    with_vary(response)
}

/// `303 See Other` to `location`, or the `500` of a base path a header cannot carry.
fn see_other(location: &str) -> Response {
    match HeaderValue::from_str(location) {
        Ok(value) => (StatusCode::SEE_OTHER, [(header::LOCATION, value)]).into_response(),
        Err(_) => Problem::new(
            ProblemType::Misconfigured,
            format!("the operation path `{location}` cannot be sent as a header; the server's base path is invalid. Read the operation by its key"),
        )
        .into_response(),
    }
}

/// Whether the reader sees anything under `key`: an operation, or an approval request
/// (an expired one too, which the operation view no longer shows).
async fn exists(key: &str) -> Result<bool, Error> {
    if crate::operation(key).await?.is_some() {
        return Ok(true);
    }
    Ok(approval::approval_request(key).await?.is_some())
}

fn invalid(field: &str, message: &str) -> Error {
    Error::InvalidArguments {
        tool: "approval".to_owned(),
        field: Some(field.to_owned()),
        message: message.to_owned(),
    }
}

/// What a decision's body may say.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DecisionBody {
    /// Who decides, when the approver function does not name them.
    by: Option<String>,
    /// Why (required to deny).
    reason: Option<String>,
}

/// The decision's body: empty, JSON `{"by", "reason"}`, or a form with those fields.
fn decision_body(
    parts: &Parts,
    body: Result<Bytes, BytesRejection>,
) -> Result<DecisionBody, Error> {
    let body = body.map_err(|rejection| {
        invalid(
            "body",
            &format!("the request body could not be read ({rejection}); nothing was decided"),
        )
    })?;
    if body.is_empty() {
        return Ok(DecisionBody::default());
    }
    match headers::body_kind(&parts.headers) {
        Ok(headers::BodyKind::Json) => serde_json::from_slice(&body).map_err(|e| {
            invalid("body", &format!("the body is not a decision ({e}); send {{\"by\": \"…\", \"reason\": \"…\"}}; nothing was decided"))
        }),
        Ok(headers::BodyKind::Form) => {
            let mut decision = DecisionBody::default();
            for (name, value) in form_urlencoded::parse(&body) {
                let slot = match &*name {
                    "by" => &mut decision.by,
                    "reason" => &mut decision.reason,
                    other => {
                        return Err(invalid(other, &format!("a decision takes the fields `by` and `reason`, not `{other}`; nothing was decided")))
                    }
                };
                if slot.replace(value.into_owned()).is_some() {
                    return Err(invalid(&name, &format!("`{name}` was sent twice; send it once; nothing was decided")));
                }
            }
            // An empty form field is an unanswered one.
            decision.by = decision.by.filter(|by| !by.is_empty());
            Ok(decision)
        }
        Err(what) => Err(invalid(
            "body",
            &format!("the body has {what}; send the decision as `application/json` or as a form; nothing was decided"),
        )),
    }
}

/// Continues the approved call `key` at once: the stored arguments through the registry,
/// in exactly the scope the call was made in (so under the same key), in a task of its own
/// (a decider who closes the page does not drop the call halfway). The engine claims the
/// call's key as for any call: an agent's retry at the same moment waits for it or
/// replays it, and the body runs once. `None` when the call was not continued (its agent's
/// retry runs it) or did not return a result: the operation says where it stands.
async fn continue_call(
    tools: &Arc<HttpTools>,
    tenant: Option<String>,
    key: &str,
) -> Option<Outcome> {
    let found = tools
        .in_context(tenant, None, approval::request_with_scope(key))
        .await;
    let (request, scope) = match found {
        Ok(Some(found)) => found,
        Ok(None) => return None,
        Err(e) => {
            tracing::warn!(key, error = %e, "tool-contracts: approved over HTTP, but the request could not be read to continue the call; its agent's retry runs it");
            return None;
        }
    };
    if request.approval.state != ApprovalState::Approved {
        return None;
    }
    let Some(tool) = tools.registry.get(&request.tool) else {
        tracing::info!(key, tool = %request.tool, "tool-contracts: approved over HTTP a call of a tool this router does not serve; its agent's retry runs it");
        return None;
    };
    // Under `payload_mismatch = "reject"` the engine admits the continued call only if its
    // arguments are byte for byte the ones approved (the request's fingerprint); a tool
    // that replays other arguments would not prove that, so its retry runs it.
    if tool.payload_mismatch() != Mismatch::Reject {
        tracing::info!(key, tool = tool.name(), "tool-contracts: approved over HTTP; a tool with payload_mismatch = \"replay\" is not continued, its agent's retry runs it");
        return None;
    }
    let key = key.to_owned();
    let router = Arc::clone(tools);
    let task = tokio::spawn(async move {
        let call = async {
            // The key the stored arguments make in the call's scope: anything else (a new
            // `version` of the tool since, say) is another intent, never run for this one.
            match tool.key(&request.arguments) {
                Ok(Some(made)) if made == key => {}
                other => {
                    return Err(format!(
                        "the stored arguments make another key ({other:?}); not continued"
                    ))
                }
            }
            router
                .registry
                .call(tool.name(), request.arguments)
                .await
                .map_err(|e| e.to_string())
        };
        let call = crate::ambient::with_joined_scope(scope.as_deref(), call);
        (key.clone(), router.in_context(None, None, call).await)
    });
    match task.await {
        Ok((key, Ok(output))) => {
            tracing::info!(
                key,
                tool = tool.name(),
                outcome = output.outcome.as_str(),
                "tool-contracts: approved over HTTP and continued"
            );
            Some(output.outcome)
        }
        Ok((key, Err(message))) => {
            tracing::info!(key, tool = tool.name(), %message, "tool-contracts: approved over HTTP; continuing the call did not return a result (its operation says where it stands)");
            None
        }
        Err(e) => {
            tracing::error!(tool = tool.name(), error = %e, "tool-contracts: approved over HTTP; the continued call panicked");
            None
        }
    }
}

/// What `POST /tools/{name}` answers for a call awaiting approval: a browser is sent to
/// the operation page (where the decision is made), as for any call; a JSON client gets
/// `202 Accepted` with the operation, to poll at `Location`.
pub(super) async fn awaiting(
    tools: &HttpTools,
    tenant: Option<String>,
    error: &Error,
    key: &str,
    prefix: &str,
    html: bool,
) -> Response {
    let location = operation_path(prefix, key);
    if html {
        return with_vary(see_other(&location));
    }
    let read = crate::operation(key);
    let op = match tools.in_context(tenant, None, read).await {
        Ok(Some(op)) => op,
        // Expired, or the store failed, between the call and this read: the problem the
        // call itself is.
        _ => {
            return with_vary(Problem::from_error(error, Some(location)).into_response());
        }
    };
    let Ok(doc) = serde_json::to_value(&op) else {
        return with_vary(Problem::from_error(error, Some(location)).into_response());
    };
    let mut response = json_response(StatusCode::ACCEPTED, &doc);
    if let Ok(value) = HeaderValue::from_str(&location) {
        let headers = response.headers_mut();
        headers.insert(header::LOCATION, value.clone());
        headers.insert(header::CONTENT_LOCATION, value);
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    with_vary(response)
}

/// The `403` problem of a denied call, with who denied it, through which channel, when and
/// why, read from the decision (the error names them together).
pub(super) async fn denied(
    tools: &HttpTools,
    tenant: Option<String>,
    error: &Error,
    key: &str,
    prefix: &str,
    html: bool,
) -> Response {
    let mut problem = Problem::from_error(error, Some(operation_path(prefix, key)));
    let read = approval::approval_request(key);
    if let Ok(Some(request)) = tools.in_context(tenant, None, read).await {
        if let Some(decision) = request.approval.decision {
            let at = serde_json::to_value(&decision)
                .ok()
                .and_then(|d| d.get("at").cloned())
                .unwrap_or(Value::Null);
            problem = problem
                .with_extension("by", decision.by)
                .with_extension("channel", decision.channel)
                .with_extension("decided_at", at);
        }
    }
    with_vary(respond_problem(problem, html))
}

/// Who may decide, for the operation page's forms.
pub(super) fn who(tools: &HttpTools, parts: &Parts) -> Who {
    match &tools.approver {
        None => Who::Disabled,
        Some(approver) => match approver(parts) {
            Ok(Some(name)) => Who::Named(name),
            Ok(None) => Who::Ask,
            Err(_) => Who::Refused,
        },
    }
}

/// What the page of an operation awaiting approval shows to decide it: the arguments the
/// request stored, and the forms.
pub(super) async fn asking(
    tools: &HttpTools,
    tenant: Option<String>,
    parts: &Parts,
    key: &str,
    prefix: &str,
) -> Option<Asking> {
    let read = approval::approval_request(key);
    let request = tools.in_context(tenant, None, read).await.ok().flatten()?;
    let path = operation_path(prefix, key);
    Some(Asking {
        arguments: request.arguments,
        approve: format!("{path}/approve"),
        deny: format!("{path}/deny"),
        who: who(tools, parts),
        max_reason: MAX_REASON_CHARS,
    })
}
