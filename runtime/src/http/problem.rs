//! Errors as RFC 9457 problem details (`application/problem+json`): one [`ProblemType`] per
//! kind of failure, each with a fixed status, and the one mapping from [`Error`] onto them.

use std::borrow::Cow;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};

use crate::error::Error;

/// The media type of a problem document (RFC 9457, section 3).
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Where the problem types are documented: each type's URI is this page with the variant's
/// anchor, so a person who follows a `type` lands on its description.
const TYPE_BASE: &str =
    "https://docs.rs/tool-contracts/latest/tool_contracts/http/enum.ProblemType.html#variant.";

/// The problem types this router answers with. A problem's `type` is
/// `https://docs.rs/tool-contracts/latest/tool_contracts/http/enum.ProblemType.html#variant.<Variant>`,
/// which documents it (RFC 9457 asks that a type URI lead to its documentation), and its
/// `code` member is the short name (`key_reused`), the same as
/// [`Error::code`](crate::Error::code) where an [`Error`] caused it.
///
/// Every problem carries `detail` (what happened and what to do next, written to be read
/// by a person or a model) and, where they apply, the extension members `code`, `tool`,
/// `key` (the idempotency key) and `operation` (the path of the operation to read instead
/// of calling again).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProblemType {
    /// `400`: the arguments cannot make a valid call (a form value that does not convert,
    /// a JSON body that does not parse, an argument of the wrong type, an unknown member,
    /// an invalid `Idempotency-Key`, or none where an `IdempotencyLayer` requires one).
    /// Nothing was claimed or run. Member `field`: the offending argument's dotted path, or
    /// `Idempotency-Key`, when one is known.
    InvalidArguments,
    /// `403`: a browser sent a state-changing request from another origin (a cross-site
    /// form post); nothing ran. Add the origin with `HttpTools::with_trusted_origins`
    /// if it is yours.
    CrossOrigin,
    /// `404`: no tool of that name. Member `suggestion`: the closest name, if any.
    UnknownTool,
    /// `404`: no operation with that key for this reader: never made, expired, or made by
    /// another tenant (the three are answered alike).
    OperationNotFound,
    /// `405`: the route does not take that method; `Allow` lists those it takes.
    MethodNotAllowed,
    /// `409`: a call with the same key is still running (under `concurrent = "reject"`,
    /// or after waiting `max_wait`). `Retry-After` says when to retry; member
    /// `lease_remaining_ms`, and `operation` to poll instead.
    InProgress,
    /// `413`: the request body is larger than the router accepts; nothing ran.
    PayloadTooLarge,
    /// `415`: the body is neither JSON nor a form; `Accept-Post` lists what is accepted.
    UnsupportedMediaType,
    /// `422`: the key was used before with other non-key arguments. Members `params` (where
    /// the arguments differ) and `key_fields` (what makes a new intent). Nothing ran.
    KeyReused,
    /// `422`: the tool ran and returned its own error. Released (a retry runs again) unless
    /// the tool stores its errors (`cache_errors`), when `operation` links the stored one.
    ToolFailed,
    /// `403`: the call needs a person's approval and none was given yet; nothing ran.
    /// Member `operation`: the operation page, where it can be approved
    /// (`POST {operation}/approve`). The tools router does not answer a call with it (a
    /// call awaiting approval is `202 Accepted` with its operation, docs/http.md
    /// "Approval over HTTP"); it is the problem [`Problem::from_error`] makes of
    /// [`Error::AwaitingApproval`] for routes of your own.
    AwaitingApproval,
    /// `403`: a person denied this intent; nothing ran, and retries get this denial until
    /// it expires. Members `by` (who denied), `channel` (through which: `http`, `cli`,
    /// `rust`, …), `decided_at`, `reason` and `operation`.
    Denied,
    /// `409`: a decision was sent for an operation that is not waiting for one (never
    /// asked, expired unanswered, or already decided the other way). Member `operation`.
    NoPendingApproval,
    /// `403`: `POST /operations/{key}/approve` or `/deny` on a router that does not take
    /// decisions over HTTP (no `HttpTools::with_approver`); nothing was decided.
    DecisionsDisabled,
    /// `500`: an earlier call with this key stopped mid-call (its worker died): the effect
    /// may or may not have happened, and nothing runs again until an operator resolves
    /// the key. Never a success.
    OutcomeUnknown,
    /// `500`: a stored value does not decode (a result type changed without a new
    /// `version`), or a result cannot be encoded.
    Codec,
    /// `500`: the server is set up wrong (a missing `#[context]` value, two tools of one
    /// name, a key field that is not a JSON path, a tenant function that returned an
    /// invalid scope). Nothing ran.
    Misconfigured,
    /// `500`: any other failure of the server.
    Internal,
    /// `503`: the idempotency store failed or cannot be reached. Nothing ran: the call
    /// fails closed; retry when the store is back.
    StoreUnavailable,
}

impl ProblemType {
    /// The status a problem of this type is answered with.
    pub fn status(self) -> StatusCode {
        match self {
            ProblemType::InvalidArguments => StatusCode::BAD_REQUEST,
            ProblemType::CrossOrigin
            | ProblemType::AwaitingApproval
            | ProblemType::Denied
            | ProblemType::DecisionsDisabled => StatusCode::FORBIDDEN,
            ProblemType::NoPendingApproval => StatusCode::CONFLICT,
            ProblemType::UnknownTool | ProblemType::OperationNotFound => StatusCode::NOT_FOUND,
            ProblemType::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ProblemType::InProgress => StatusCode::CONFLICT,
            ProblemType::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ProblemType::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ProblemType::KeyReused | ProblemType::ToolFailed => StatusCode::UNPROCESSABLE_ENTITY,
            ProblemType::OutcomeUnknown
            | ProblemType::Codec
            | ProblemType::Misconfigured
            | ProblemType::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            ProblemType::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The short, stable name (the `code` member): `key_reused`.
    pub fn code(self) -> &'static str {
        match self {
            ProblemType::InvalidArguments => "invalid_arguments",
            ProblemType::CrossOrigin => "cross_origin",
            ProblemType::UnknownTool => "unknown_tool",
            ProblemType::OperationNotFound => "operation_not_found",
            ProblemType::MethodNotAllowed => "method_not_allowed",
            ProblemType::InProgress => "in_progress",
            ProblemType::PayloadTooLarge => "payload_too_large",
            ProblemType::UnsupportedMediaType => "unsupported_media_type",
            ProblemType::KeyReused => "key_reused",
            ProblemType::ToolFailed => "tool_failed",
            ProblemType::AwaitingApproval => "awaiting_approval",
            ProblemType::Denied => "denied",
            ProblemType::NoPendingApproval => "no_pending_approval",
            ProblemType::DecisionsDisabled => "decisions_disabled",
            ProblemType::OutcomeUnknown => "outcome_unknown",
            ProblemType::Codec => "codec",
            ProblemType::Misconfigured => "misconfigured",
            ProblemType::Internal => "internal",
            ProblemType::StoreUnavailable => "store",
        }
    }

    /// The `title`: the same for every occurrence of the type (RFC 9457, 3.1.3).
    pub fn title(self) -> &'static str {
        match self {
            ProblemType::InvalidArguments => "Invalid arguments",
            ProblemType::CrossOrigin => "Cross-origin request refused",
            ProblemType::UnknownTool => "Unknown tool",
            ProblemType::OperationNotFound => "Operation not found",
            ProblemType::MethodNotAllowed => "Method not allowed",
            ProblemType::InProgress => "Call in progress",
            ProblemType::PayloadTooLarge => "Request body too large",
            ProblemType::UnsupportedMediaType => "Unsupported media type",
            ProblemType::KeyReused => "Idempotency key reused with other arguments",
            ProblemType::ToolFailed => "Tool failed",
            ProblemType::AwaitingApproval => "Awaiting approval",
            ProblemType::Denied => "Denied",
            ProblemType::NoPendingApproval => "No approval pending",
            ProblemType::DecisionsDisabled => "Decisions over HTTP are off",
            ProblemType::OutcomeUnknown => "Outcome unknown",
            ProblemType::Codec => "Stored value does not decode",
            ProblemType::Misconfigured => "Server misconfigured",
            ProblemType::Internal => "Internal error",
            ProblemType::StoreUnavailable => "Idempotency store unavailable",
        }
    }

    /// The `type` URI: this type's documentation.
    pub fn uri(self) -> String {
        let variant = match self {
            ProblemType::InvalidArguments => "InvalidArguments",
            ProblemType::CrossOrigin => "CrossOrigin",
            ProblemType::UnknownTool => "UnknownTool",
            ProblemType::OperationNotFound => "OperationNotFound",
            ProblemType::MethodNotAllowed => "MethodNotAllowed",
            ProblemType::InProgress => "InProgress",
            ProblemType::PayloadTooLarge => "PayloadTooLarge",
            ProblemType::UnsupportedMediaType => "UnsupportedMediaType",
            ProblemType::KeyReused => "KeyReused",
            ProblemType::ToolFailed => "ToolFailed",
            ProblemType::AwaitingApproval => "AwaitingApproval",
            ProblemType::Denied => "Denied",
            ProblemType::NoPendingApproval => "NoPendingApproval",
            ProblemType::DecisionsDisabled => "DecisionsDisabled",
            ProblemType::OutcomeUnknown => "OutcomeUnknown",
            ProblemType::Codec => "Codec",
            ProblemType::Misconfigured => "Misconfigured",
            ProblemType::Internal => "Internal",
            ProblemType::StoreUnavailable => "StoreUnavailable",
        };
        format!("{TYPE_BASE}{variant}")
    }

    /// Every type, for tables and tests.
    pub const ALL: [ProblemType; 19] = [
        ProblemType::InvalidArguments,
        ProblemType::CrossOrigin,
        ProblemType::UnknownTool,
        ProblemType::OperationNotFound,
        ProblemType::MethodNotAllowed,
        ProblemType::InProgress,
        ProblemType::PayloadTooLarge,
        ProblemType::UnsupportedMediaType,
        ProblemType::KeyReused,
        ProblemType::ToolFailed,
        ProblemType::AwaitingApproval,
        ProblemType::Denied,
        ProblemType::NoPendingApproval,
        ProblemType::DecisionsDisabled,
        ProblemType::OutcomeUnknown,
        ProblemType::Codec,
        ProblemType::Misconfigured,
        ProblemType::Internal,
        ProblemType::StoreUnavailable,
    ];

    /// The type of an [`Error`]: the one table every route answers by.
    pub fn of(error: &Error) -> ProblemType {
        match error {
            Error::InvalidArguments { .. } => ProblemType::InvalidArguments,
            Error::UnknownTool { .. } => ProblemType::UnknownTool,
            Error::InProgress { .. } => ProblemType::InProgress,
            Error::KeyReused { .. } => ProblemType::KeyReused,
            Error::ToolFailed { .. } => ProblemType::ToolFailed,
            Error::OutcomeUnknown { .. } => ProblemType::OutcomeUnknown,
            Error::AwaitingApproval { .. } => ProblemType::AwaitingApproval,
            Error::Denied { .. } => ProblemType::Denied,
            Error::NoPendingApproval { .. } => ProblemType::NoPendingApproval,
            Error::Store { .. } => ProblemType::StoreUnavailable,
            Error::Codec { .. } => ProblemType::Codec,
            Error::MissingContext { .. }
            | Error::DuplicateTool { .. }
            | Error::KeyFieldUnresolved { .. } => ProblemType::Misconfigured,
            Error::NonDeterministic { .. }
            | Error::RunNotOwned { .. }
            | Error::RunCompensating { .. } => ProblemType::Internal,
        }
    }
}

/// An RFC 9457 problem document, answered as `application/problem+json` with its status.
///
/// The router builds them from [`Error`]s; a tenant function (see
/// [`HttpTools::with_tenant`](super::HttpTools::with_tenant)) builds its own refusals with
/// [`Problem::from_status`] or [`Problem::custom`].
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    status: StatusCode,
    type_uri: Cow<'static, str>,
    title: Cow<'static, str>,
    detail: Option<String>,
    extensions: Map<String, Value>,
    retry_after: Option<u64>,
}

/// The members RFC 9457 defines: an extension may not replace them.
const STANDARD_MEMBERS: [&str; 5] = ["type", "status", "title", "detail", "instance"];

impl Problem {
    /// A problem of one of this router's types, with its `detail`.
    pub fn new(kind: ProblemType, detail: impl Into<String>) -> Problem {
        let mut problem = Problem {
            status: kind.status(),
            type_uri: Cow::Owned(kind.uri()),
            title: Cow::Borrowed(kind.title()),
            detail: Some(detail.into()),
            extensions: Map::new(),
            retry_after: None,
        };
        problem
            .extensions
            .insert("code".to_owned(), kind.code().into());
        problem
    }

    /// A problem that is just its status (`type` `about:blank`, the status's reason as
    /// `title`, RFC 9457 4.2.1): e.g. `401` from a tenant function.
    pub fn from_status(status: StatusCode) -> Problem {
        Problem::custom(
            status,
            "about:blank",
            status.canonical_reason().unwrap_or("Error"),
        )
    }

    /// A problem of the application's own type.
    pub fn custom(
        status: StatusCode,
        type_uri: impl Into<Cow<'static, str>>,
        title: impl Into<Cow<'static, str>>,
    ) -> Problem {
        Problem {
            status,
            type_uri: type_uri.into(),
            title: title.into(),
            detail: None,
            extensions: Map::new(),
            retry_after: None,
        }
    }

    /// The problem of an [`Error`]: its [`ProblemType`], its message as `detail`, and the
    /// members that say which call (`code`, `tool`, `key`), what was wrong (`field`,
    /// `params`, `key_fields`, `suggestion`, `lease_remaining_ms`, a denial's `by` and
    /// `reason`) and, with `operation`,
    /// where the call's operation can be read; `Retry-After` for a call in progress.
    pub fn from_error(error: &Error, operation: Option<String>) -> Problem {
        let mut problem = Problem::new(ProblemType::of(error), error.to_string());
        let mut put = |name: &str, value: Value| {
            problem.extensions.insert(name.to_owned(), value);
        };
        put("code", error.code().into());
        if let Some(tool) = error.tool() {
            put("tool", tool.into());
        }
        if let Some(key) = error.key() {
            put("key", key.into());
        }
        match error {
            Error::InvalidArguments {
                field: Some(field), ..
            } => put("field", field.as_str().into()),
            Error::UnknownTool {
                suggestion: Some(suggestion),
                ..
            } => put("suggestion", suggestion.as_str().into()),
            Error::KeyReused {
                params, key_fields, ..
            } => {
                put("params", params.clone().into());
                put("key_fields", key_fields.clone().into());
            }
            Error::InProgress {
                lease_remaining_ms, ..
            } => put("lease_remaining_ms", (*lease_remaining_ms).into()),
            Error::Denied { by, reason, .. } => {
                put("by", by.as_str().into());
                if let Some(reason) = reason {
                    put("reason", reason.as_str().into());
                }
            }
            _ => {}
        }
        if let Some(operation) = operation {
            put("operation", operation.into());
        }
        if let Error::InProgress {
            lease_remaining_ms, ..
        } = error
        {
            problem.retry_after = Some(retry_after_secs(*lease_remaining_ms));
        }
        problem
    }

    /// With a `detail`: what happened to this request, and what to do.
    pub fn with_detail(mut self, detail: impl Into<String>) -> Problem {
        self.detail = Some(detail.into());
        self
    }

    /// With an extension member (RFC 9457, 3.2). The standard members (`type`, `status`,
    /// `title`, `detail`, `instance`) are not extensions: such a name is ignored.
    pub fn with_extension(mut self, name: impl Into<String>, value: impl Into<Value>) -> Problem {
        let name = name.into();
        if !STANDARD_MEMBERS.contains(&name.as_str()) {
            self.extensions.insert(name, value.into());
        }
        self
    }

    /// With a `Retry-After` header of `seconds`.
    pub fn with_retry_after(mut self, seconds: u64) -> Problem {
        self.retry_after = Some(seconds);
        self
    }

    /// The status answered.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The `type` URI.
    pub fn type_uri(&self) -> &str {
        &self.type_uri
    }

    /// The `title`.
    pub fn title(&self) -> &str {
        &self.title
    }

    /// The `detail`, if any.
    pub fn detail(&self) -> Option<&str> {
        self.detail.as_deref()
    }

    /// An extension member.
    pub fn extension(&self, name: &str) -> Option<&Value> {
        self.extensions.get(name)
    }

    /// The `Retry-After` seconds, if any.
    pub fn retry_after(&self) -> Option<u64> {
        self.retry_after
    }

    /// The problem document.
    pub fn to_json(&self) -> Value {
        let mut doc = Map::new();
        doc.insert("type".to_owned(), self.type_uri.as_ref().into());
        doc.insert("status".to_owned(), self.status.as_u16().into());
        doc.insert("title".to_owned(), self.title.as_ref().into());
        if let Some(detail) = &self.detail {
            doc.insert("detail".to_owned(), detail.as_str().into());
        }
        for (name, value) in &self.extensions {
            doc.insert(name.clone(), value.clone());
        }
        Value::Object(doc)
    }

    /// The headers every answer of this problem carries beside its body.
    pub(super) fn apply_headers(&self, response: &mut Response) {
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let body = self.to_json().to_string();
        let mut response = (
            self.status,
            [(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON))],
            body,
        )
            .into_response();
        self.apply_headers(&mut response);
        response
    }
}

/// `Retry-After` for a lease that still runs `ms`: whole seconds, rounded up, at least 1
/// (`0` would invite a retry before the lease can have ended).
pub(super) fn retry_after_secs(ms: u64) -> u64 {
    ms.div_ceil(1000).max(1)
}
