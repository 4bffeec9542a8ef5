//! Keys sent downstream (feature `http-client`): the call's idempotency key goes with the
//! HTTP requests a tool body makes, so a payment provider's own idempotency protects the
//! effect too, and a downstream outcome is mapped onto the engine's semantics.
//!
//! - [`DownstreamKeys`] is a [`reqwest_middleware::Middleware`]: inside a tool body, it sets
//!   `Idempotency-Key` on each request that can have an effect (every method but `GET`,
//!   `HEAD`, `OPTIONS` and `TRACE`) to the call's key, or, for a request labelled with
//!   [`DownstreamLabel`], to a key derived from the call's key and the label
//!   ([`derive_key`]). Outside a tool body it sets nothing, and it never replaces a header
//!   the caller set. [`KeyForm::Uuid`] sends the UUID form ([`key_uuid`]) instead.
//! - [`DownstreamOutcome::of`] classifies what came back (the precedence table below), and
//!   [`check`] turns a failed one into a [`DownstreamError`] for the tool's error type;
//!   [`unknown_outcome`] is a ready `unknown_outcome_if = …` predicate.
//!
//! # The label rule
//!
//! A body that makes one downstream request with an effect may send it unlabelled: the
//! provider gets the call's key itself. A body that makes several labels each one with a
//! name of its own (`"charge"`, `"refund"`): each label names **one downstream effect**,
//! so two effects never share a key and a retry of the same call derives the same keys.
//! Reusing a label is how a body *retries* the same effect (a retry middleware, a loop
//! after a timeout): the middleware does not refuse it, since it cannot tell a retry from
//! a second effect. Two different effects under one label would be deduplicated by the
//! provider into one: that is the body's bug to avoid.
//!
//! # Derived keys
//!
//! ```text
//! derived = lowercase_hex( SHA-256( JCS {"contract":"tool-contracts/downstream/v1","key":K,"label":L} ) )
//! ```
//!
//! with `K` the call's key and `L` the label, written as canonical JSON exactly as
//! docs/key-spec.md writes a key document (64 characters, `[0-9a-f]`). The UUID form of a
//! key (derived or not) is the UUID version 5 of its text in the namespace of
//! [`current_key_uuid`](crate::current_key_uuid), so an unlabelled request's UUID is
//! `current_key_uuid()`. Test vectors are in docs/http.md, "Keys sent downstream".
//!
//! # Precedence table
//!
//! The first row that applies decides ([`DownstreamOutcome::of`]):
//!
//! | what came back | outcome | the engine |
//! |---|---|---|
//! | the request was not sent: a builder error, a connect error (refused, DNS, connect timeout), a label this middleware refused | [`NotSent`](DownstreamOutcome::NotSent) | release: nothing happened, safe to retry |
//! | any other error: a timeout after connecting, a connection reset or closed after sending, a redirect error, an error of another middleware | [`Unknown`](DownstreamOutcome::Unknown) | unknown outcome: keep the key, reconcile |
//! | `429 Too Many Requests` | [`RateLimited`](DownstreamOutcome::RateLimited) | not applied: release, retry after `Retry-After` |
//! | `409 Conflict` | [`StillRunning`](DownstreamOutcome::StillRunning) | the provider still runs the first request with that key: unknown until it answers |
//! | `408`, `500`, `502`, `503`, `504`, and every other `5xx` | [`Unknown`](DownstreamOutcome::Unknown) | unknown outcome |
//! | any other `4xx` | [`Failed`](DownstreamOutcome::Failed) | definite failure: release |
//! | `2xx`, `3xx` | [`Succeeded`](DownstreamOutcome::Succeeded) | success |
//!
//! Other `5xx` (`501`, `505`, ...) count as unknown: a server error says nothing certain
//! about what the server did before failing. The classifier reads only what `send()`
//! returns: an error while reading a successful response's body comes after the provider
//! answered with success.

use std::borrow::Cow;
use std::fmt;
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use reqwest::{Request, Response, StatusCode};
use reqwest_middleware::{Middleware, Next};
use sha2::{Digest, Sha256};

use crate::ambient::{current_key, KEY_UUID_NAMESPACE};
use crate::key::{push_hex, write_canonical_str};

/// Re-exported: the client this module's middleware and classifier are built for (0.13,
/// without default features: enable a TLS backend, e.g. `rustls`, on your own dependency).
pub use ::reqwest;
/// Re-exported: [`DownstreamKeys`] is a `reqwest_middleware::Middleware` (0.5).
pub use ::reqwest_middleware;

/// The contract string of derived downstream keys (see [`derive_key`]).
pub const DOWNSTREAM_KEY_CONTRACT: &str = "tool-contracts/downstream/v1";

/// The key derived from a call's key and a label: one per downstream effect of the call.
///
/// `lowercase_hex(SHA-256(JCS {"contract":"tool-contracts/downstream/v1","key":call_key,"label":label}))`,
/// 64 characters. Deterministic: a retry of the same call (same key) derives the same keys;
/// two labels never give the same key.
///
/// ```
/// use tool_contracts_runtime::downstream::derive_key;
///
/// let call = "bec0122880ff4d1e654d42b6b140900156bc9787bc0d667cc0d8446a30c3ae0e";
/// assert_eq!(
///     derive_key(call, "charge"),
///     "f31f1000c9ad323c397f9439041aa10afb1fb9d976afe5d739f56a0d90640449"
/// );
/// assert_ne!(derive_key(call, "charge"), derive_key(call, "refund"));
/// ```
#[must_use]
pub fn derive_key(call_key: &str, label: &str) -> String {
    // The document written member by member in JCS order (contract < key < label) with the
    // key spec's string writer, which cannot fail (`write_canonical` can, for numbers).
    let mut doc = Vec::with_capacity(64 + call_key.len() + label.len());
    doc.extend_from_slice(b"{\"contract\":");
    write_canonical_str(&mut doc, DOWNSTREAM_KEY_CONTRACT);
    doc.extend_from_slice(b",\"key\":");
    write_canonical_str(&mut doc, call_key);
    doc.extend_from_slice(b",\"label\":");
    write_canonical_str(&mut doc, label);
    doc.push(b'}');
    let mut key = String::with_capacity(64);
    push_hex(&mut key, &Sha256::digest(&doc));
    key
}

/// The UUID form of a key sent downstream: UUID version 5 of the key's text in the
/// namespace of [`current_key_uuid`](crate::current_key_uuid), for providers that demand
/// UUID idempotency keys. `key_uuid(&current_key()?)` is `current_key_uuid()`.
#[must_use]
pub fn key_uuid(key: &str) -> uuid::Uuid {
    uuid::Uuid::new_v5(&KEY_UUID_NAMESPACE, key.as_bytes())
}

/// The key [`DownstreamKeys`] sends (in [`KeyForm::Hex`]) for a request labelled `label`
/// (`None`: unlabelled) made in the current tool body; `None` outside a tool body. A
/// `verify` function uses it to ask the provider about the effect by its key.
#[must_use]
pub fn current_downstream_key(label: Option<&str>) -> Option<String> {
    let key = current_key()?;
    Some(match label {
        Some(label) => derive_key(&key, label),
        None => key,
    })
}

/// Names one downstream effect of a tool body, so that it gets a key of its own: put it on
/// the request as an extension (`.with_extension(DownstreamLabel::new("charge"))`). See
/// the label rule in the [module documentation](self).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DownstreamLabel(Cow<'static, str>);

impl DownstreamLabel {
    /// A label: non-empty, without control characters (else the request is refused before
    /// it is sent, [`DownstreamOutcome::NotSent`]).
    pub fn new(label: impl Into<Cow<'static, str>>) -> Self {
        Self(label.into())
    }

    /// The label's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Which form of the key [`DownstreamKeys`] sends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyForm {
    /// The key as it is: 64 lowercase hex digits ([`current_key`] or [`derive_key`]).
    #[default]
    Hex,
    /// Its UUID form ([`key_uuid`]), hyphenated lowercase, for providers that demand UUIDs.
    Uuid,
}

/// The middleware that sends the current call's key downstream (see the
/// [module documentation](self) for the rules).
///
/// ```
/// use tool_contracts_runtime::downstream::{reqwest, reqwest_middleware, DownstreamKeys, KeyForm};
///
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(DownstreamKeys::new().form(KeyForm::Uuid))
///     .build();
/// # let _ = client;
/// ```
#[derive(Clone, Debug)]
pub struct DownstreamKeys {
    form: KeyForm,
    header: HeaderName,
}

impl Default for DownstreamKeys {
    fn default() -> Self {
        Self::new()
    }
}

impl DownstreamKeys {
    /// Sends the key in [`KeyForm::Hex`] as `Idempotency-Key` (the IETF httpapi draft's and
    /// Stripe's name).
    pub fn new() -> Self {
        Self {
            form: KeyForm::Hex,
            header: HeaderName::from_static("idempotency-key"),
        }
    }

    /// Sends the key in `form`.
    #[must_use]
    pub fn form(mut self, form: KeyForm) -> Self {
        self.form = form;
        self
    }

    /// Sends the key in the header `name` instead of `Idempotency-Key` (a provider with a
    /// header of its own, e.g. `X-Request-Id`).
    #[must_use]
    pub fn header(mut self, name: HeaderName) -> Self {
        self.header = name;
        self
    }

    /// The header value for a request labelled `label` in the current call, if any.
    fn value(&self, label: Option<&DownstreamLabel>) -> Result<Option<HeaderValue>, LabelError> {
        if let Some(label) = label {
            check_label(label.as_str())?;
        }
        let Some(key) = current_downstream_key(label.map(DownstreamLabel::as_str)) else {
            return Ok(None);
        };
        let text = match self.form {
            KeyForm::Hex => key,
            KeyForm::Uuid => key_uuid(&key).hyphenated().to_string(),
        };
        // Hex digits and hyphens: always a valid header value.
        Ok(HeaderValue::from_str(&text).ok())
    }
}

#[async_trait::async_trait]
impl Middleware for DownstreamKeys {
    async fn handle(
        &self,
        mut req: Request,
        extensions: &mut ::http::Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        // Safe methods have no effect to protect; a header the caller set is theirs.
        if !req.method().is_safe() && !req.headers().contains_key(&self.header) {
            match self.value(extensions.get::<DownstreamLabel>()) {
                Ok(Some(value)) => {
                    req.headers_mut().insert(self.header.clone(), value);
                }
                Ok(None) => {}
                Err(e) => return Err(reqwest_middleware::Error::middleware(e)),
            }
        }
        next.run(req, extensions).await
    }
}

/// A [`DownstreamLabel`] the middleware refused: the request was not sent.
#[derive(Debug, thiserror::Error)]
#[error("the downstream label {label:?} is {problem}; the request was not sent. Name each downstream effect of a tool body with printable text, e.g. DownstreamLabel::new(\"charge\")")]
pub struct LabelError {
    label: String,
    problem: &'static str,
}

fn check_label(label: &str) -> Result<(), LabelError> {
    let problem = if label.is_empty() {
        "empty"
    } else if label.chars().any(char::is_control) {
        "not printable (it contains a control character)"
    } else {
        return Ok(());
    };
    Err(LabelError {
        label: label.to_owned(),
        problem,
    })
}

/// What a downstream request's outcome means for the call (the precedence table of the
/// [module documentation](self)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DownstreamOutcome {
    /// `2xx` or `3xx`: the provider did it.
    Succeeded,
    /// The request was never sent (builder or connect error, a refused label): nothing
    /// happened downstream; release the key, a retry is safe.
    NotSent,
    /// The request may have had its effect (a timeout or a connection lost after sending,
    /// `408`, `5xx`): keep the key as an unknown outcome and reconcile.
    Unknown,
    /// `409`: the provider still runs the first request with this key; unknown until it
    /// answers. `retry_after` is its `Retry-After`, if it sent one.
    StillRunning {
        /// When to ask again, from `Retry-After`.
        retry_after: Option<Duration>,
    },
    /// `429`: not applied; retry after `retry_after` (from `Retry-After`, if sent).
    RateLimited {
        /// When to retry, from `Retry-After`.
        retry_after: Option<Duration>,
    },
    /// Another `4xx`: a definite failure; nothing to reconcile, fix the request.
    Failed,
}

impl DownstreamOutcome {
    /// Classifies what `send()` returned (the precedence table of the
    /// [module documentation](self)).
    pub fn of(result: &Result<Response, reqwest_middleware::Error>) -> Self {
        match result {
            Ok(response) => Self::of_status(response.status(), response.headers()),
            Err(error) => Self::of_error(error),
        }
    }

    /// Classifies an error of `send()`: [`NotSent`](Self::NotSent) when the request
    /// never left (builder, connect, a label [`DownstreamKeys`] refused), else
    /// [`Unknown`](Self::Unknown).
    pub fn of_error(error: &reqwest_middleware::Error) -> Self {
        match error {
            reqwest_middleware::Error::Reqwest(e) => Self::of_reqwest_error(e),
            reqwest_middleware::Error::Middleware(e)
                if e.downcast_ref::<LabelError>().is_some() =>
            {
                Self::NotSent
            }
            // Another middleware failed: it may have sent the request first (a retry
            // middleware gives up after attempts), so nothing certain.
            reqwest_middleware::Error::Middleware(_) => Self::Unknown,
        }
    }

    /// Classifies a `reqwest` error: builder and connect errors (a connect timeout
    /// included) were before sending, everything else may have been after.
    pub fn of_reqwest_error(error: &reqwest::Error) -> Self {
        if error.is_builder() || error.is_connect() {
            Self::NotSent
        } else {
            Self::Unknown
        }
    }

    /// Classifies a response's status (and its `Retry-After` for `409` and `429`).
    pub fn of_status(status: StatusCode, headers: &HeaderMap) -> Self {
        match status.as_u16() {
            429 => Self::RateLimited {
                retry_after: retry_after(headers),
            },
            409 => Self::StillRunning {
                retry_after: retry_after(headers),
            },
            408 => Self::Unknown,
            400..=499 => Self::Failed,
            200..=399 => Self::Succeeded,
            // 5xx, and a 1xx that reached here as a final status (nothing certain).
            _ => Self::Unknown,
        }
    }

    /// Whether the effect may have happened: [`Unknown`](Self::Unknown) and
    /// [`StillRunning`](Self::StillRunning). What `unknown_outcome_if` should keep.
    pub fn is_unknown_outcome(&self) -> bool {
        matches!(self, Self::Unknown | Self::StillRunning { .. })
    }

    /// The provider's `Retry-After`, for [`RateLimited`](Self::RateLimited) and
    /// [`StillRunning`](Self::StillRunning).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::RateLimited { retry_after } | Self::StillRunning { retry_after } => *retry_after,
            _ => None,
        }
    }

    /// The stable lowercase name (`succeeded`, `not_sent`, `unknown`, `still_running`,
    /// `rate_limited`, `failed`).
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::NotSent => "not_sent",
            Self::Unknown => "unknown",
            Self::StillRunning { .. } => "still_running",
            Self::RateLimited { .. } => "rate_limited",
            Self::Failed => "failed",
        }
    }
}

impl fmt::Display for DownstreamOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `Retry-After` as a delay: delay-seconds or an HTTP date (RFC 9110, 10.2.3); a date in
/// the past is no delay; anything else is `None`.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let text = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = text.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(
        at.duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

/// A downstream request that did not succeed, classified: what a tool's error type wraps
/// (`#[from]`), so that [`unknown_outcome`] can tell an unknown outcome from a failure.
#[derive(Debug)]
pub struct DownstreamError {
    outcome: DownstreamOutcome,
    status: Option<StatusCode>,
    url: Option<String>,
    source: Option<reqwest_middleware::Error>,
}

impl DownstreamError {
    /// How the request failed.
    pub fn outcome(&self) -> DownstreamOutcome {
        self.outcome
    }

    /// The provider's status, when it answered.
    pub fn status(&self) -> Option<StatusCode> {
        self.status
    }

    /// Whether the effect may have happened ([`DownstreamOutcome::is_unknown_outcome`]).
    pub fn is_unknown_outcome(&self) -> bool {
        self.outcome.is_unknown_outcome()
    }
}

impl fmt::Display for DownstreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the downstream request")?;
        if let Some(url) = &self.url {
            write!(f, " to {url}")?;
        }
        match (self.status, &self.source) {
            (Some(status), _) => write!(f, " answered {status}")?,
            (None, Some(source)) => {
                // reqwest's own message ("error sending request") hides the cause (a
                // timeout, a refused connection) in its sources: name them all.
                write!(f, " failed ({source}")?;
                let mut cause = std::error::Error::source(source);
                while let Some(e) = cause {
                    write!(f, ": {e}")?;
                    cause = e.source();
                }
                f.write_str(")")?;
            }
            (None, None) => {}
        }
        let advice = match self.outcome {
            DownstreamOutcome::Succeeded => "",
            DownstreamOutcome::NotSent => {
                ": it was never sent, nothing happened downstream; the call may be retried"
            }
            DownstreamOutcome::Unknown => {
                ": the effect may have happened; reconcile (verify) before running it again"
            }
            DownstreamOutcome::StillRunning { .. } => {
                ": the provider still runs the first request with this key; retry later with the same key"
            }
            DownstreamOutcome::RateLimited { .. } => {
                ": it was not applied (rate limited); retry after the provider's delay"
            }
            DownstreamOutcome::Failed => {
                ": a definite failure, nothing happened to reconcile; fix the request"
            }
        };
        f.write_str(advice)?;
        if let Some(delay) = self.outcome.retry_after() {
            write!(f, " (Retry-After: {}s)", delay.as_secs())?;
        }
        Ok(())
    }
}

impl std::error::Error for DownstreamError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// The response of a request that [`Succeeded`](DownstreamOutcome::Succeeded), or a
/// [`DownstreamError`] saying how it failed: `let response = check(request.send().await)?;`
pub fn check(
    result: Result<Response, reqwest_middleware::Error>,
) -> Result<Response, DownstreamError> {
    match DownstreamOutcome::of(&result) {
        DownstreamOutcome::Succeeded => match result {
            Ok(response) => Ok(response),
            // `of` gives `Succeeded` only for a response.
            Err(source) => Err(DownstreamError {
                outcome: DownstreamOutcome::Unknown,
                status: None,
                url: source.url().map(ToString::to_string),
                source: Some(source),
            }),
        },
        outcome => Err(match result {
            Ok(response) => DownstreamError {
                outcome,
                status: Some(response.status()),
                url: Some(response.url().to_string()),
                source: None,
            },
            Err(source) => DownstreamError {
                outcome,
                status: None,
                url: source.url().map(ToString::to_string),
                source: Some(source),
            },
        }),
    }
}

/// An error type that may carry a downstream outcome: implement it for a tool's error
/// type to use [`unknown_outcome`] as its `unknown_outcome_if`.
pub trait DownstreamFailure {
    /// The downstream outcome this error carries, if it is a downstream failure.
    fn downstream_outcome(&self) -> Option<DownstreamOutcome>;
}

impl DownstreamFailure for DownstreamError {
    fn downstream_outcome(&self) -> Option<DownstreamOutcome> {
        Some(self.outcome)
    }
}

/// The `unknown_outcome_if = tool_contracts::downstream::unknown_outcome` predicate: true
/// for an error whose downstream outcome may have had its effect
/// ([`DownstreamOutcome::is_unknown_outcome`]), so the engine keeps the key for
/// reconciliation; false for every other error, which releases it.
pub fn unknown_outcome<E: DownstreamFailure>(error: &E) -> bool {
    error
        .downstream_outcome()
        .is_some_and(|outcome| outcome.is_unknown_outcome())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(retry_after: Option<&'static str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(v) = retry_after {
            h.insert(RETRY_AFTER, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn statuses_map_onto_the_precedence_table() {
        let none = headers(None);
        let of = |code: u16| {
            DownstreamOutcome::of_status(StatusCode::from_u16(code).expect("valid code"), &none)
        };
        for code in [200, 201, 204, 301, 303, 304] {
            assert_eq!(of(code), DownstreamOutcome::Succeeded, "{code}");
        }
        for code in [408, 500, 501, 502, 503, 504, 599] {
            assert_eq!(of(code), DownstreamOutcome::Unknown, "{code}");
        }
        for code in [400, 401, 402, 403, 404, 410, 422] {
            assert_eq!(of(code), DownstreamOutcome::Failed, "{code}");
        }
        assert_eq!(
            of(409),
            DownstreamOutcome::StillRunning { retry_after: None }
        );
        assert_eq!(
            of(429),
            DownstreamOutcome::RateLimited { retry_after: None }
        );
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        assert_eq!(
            retry_after(&headers(Some("7"))),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            retry_after(&headers(Some("Sun, 06 Nov 1994 08:49:37 GMT"))),
            Some(Duration::ZERO)
        );
        let later = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(120));
        let mut h = HeaderMap::new();
        h.insert(
            RETRY_AFTER,
            HeaderValue::from_str(&later).expect("an HTTP date"),
        );
        let delay = retry_after(&h).expect("a future date");
        assert!(delay > Duration::from_secs(100) && delay <= Duration::from_secs(120));
        assert_eq!(retry_after(&headers(Some("soon"))), None);
        assert_eq!(retry_after(&headers(None)), None);
    }

    #[test]
    fn labels_must_be_printable_and_non_empty() {
        assert!(check_label("charge").is_ok());
        assert!(check_label("").is_err());
        assert!(check_label("a\nb").is_err());
    }

    /// The vectors of docs/http.md, "Keys sent downstream" (computed there with Python's
    /// hashlib, json and uuid, independently of this code).
    #[test]
    fn derived_keys_and_uuids_match_the_documented_vectors() {
        let call = "bec0122880ff4d1e654d42b6b140900156bc9787bc0d667cc0d8446a30c3ae0e";
        assert_eq!(
            derive_key(call, "charge"),
            "f31f1000c9ad323c397f9439041aa10afb1fb9d976afe5d739f56a0d90640449"
        );
        assert_eq!(
            derive_key(call, "refund"),
            "a39e228224f5eff0e5e2a5880634e38fe476dbfba6566516c3063b6d3ef4d787"
        );
        assert_eq!(
            derive_key(call, "Zahlung \"€\""),
            "34e3fd3d11b06d3986aaf5ae93b0d9fce4ebab4d6cbeb0973fa4863696193291"
        );
        let uuid = |key: &str| key_uuid(key).hyphenated().to_string();
        assert_eq!(uuid(call), "bedbb5a1-cb95-56cb-b2c7-eb58ce0f0a08");
        assert_eq!(
            uuid(&derive_key(call, "charge")),
            "47d06f8b-7ce4-538d-8f30-52f376615cb2"
        );
    }
}
