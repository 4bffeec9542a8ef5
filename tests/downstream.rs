//! Keys sent downstream (`tool_contracts::downstream`, feature `http-client`) against a real
//! provider: an axum server on 127.0.0.1:0 that records the `Idempotency-Key` of every
//! request and deduplicates by it itself, as a payment provider does. Real `reqwest`
//! requests through the real middleware, real `#[mutating_tool]`s, no mocks.
//!
//! Each test is named after the failure it prevents.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tool_contracts::downstream::reqwest::{self, header::HeaderValue, StatusCode};
use tool_contracts::downstream::reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use tool_contracts::downstream::{
    check, derive_key, key_uuid, DownstreamError, DownstreamFailure, DownstreamKeys,
    DownstreamLabel, DownstreamOutcome, KeyForm,
};
use tool_contracts::http::axum::{
    self,
    extract::{Path, State},
    http::HeaderMap,
    response::IntoResponse,
    routing::{any, get, post},
    Router,
};
use tool_contracts::{mutating_tool, operation, with_store, Error, MemoryStore, OperationState};

// ---------------------------------------------------------------------------------------
// The provider
// ---------------------------------------------------------------------------------------

/// What the provider stored for a key: the answer it gives every request with that key.
#[derive(Clone)]
struct Stored {
    body: String,
}

/// A payment provider in miniature: one effect per new `Idempotency-Key` (or per request
/// without one), the same answer again for a key it has seen.
#[derive(Default)]
struct Provider {
    /// Every request: (effect name, `Idempotency-Key` if any), in arrival order.
    seen: Mutex<Vec<(String, Option<String>)>>,
    /// The provider's own idempotency table.
    by_key: Mutex<HashMap<String, Stored>>,
    /// Effects applied (charges made, emails sent), counting every one.
    effects: AtomicUsize,
    /// Effect names whose first request per key is refused with `429` (not applied).
    rate_limited_once: Mutex<HashMap<String, usize>>,
}

impl Provider {
    fn keys_for(&self, effect: &str) -> Vec<Option<String>> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(name, _)| name == effect)
            .map(|(_, key)| key.clone())
            .collect()
    }

    fn requests(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// Applies `effect` once per key: the stored answer for a key seen before, else a new
    /// effect whose answer is stored before `delay` (a slow provider that commits first and
    /// answers late, as a timed-out request leaves it).
    async fn apply(
        &self,
        effect: String,
        headers: &HeaderMap,
        delay: Duration,
    ) -> (StatusCode, String) {
        let key = headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        self.seen
            .lock()
            .unwrap()
            .push((effect.clone(), key.clone()));
        if let Some(key) = &key {
            if let Some(stored) = self.by_key.lock().unwrap().get(key) {
                return (StatusCode::OK, stored.body.clone());
            }
            let mut refused = self.rate_limited_once.lock().unwrap();
            if let Some(left) = refused.get_mut(&effect) {
                if *left > 0 {
                    *left -= 1;
                    return (StatusCode::TOO_MANY_REQUESTS, "slow down".to_owned());
                }
            }
        }
        let n = self.effects.fetch_add(1, SeqCst) + 1;
        let body = format!("{effect}-{n}");
        if let Some(key) = key {
            self.by_key
                .lock()
                .unwrap()
                .insert(key, Stored { body: body.clone() });
        }
        tokio::time::sleep(delay).await;
        (StatusCode::OK, body)
    }
}

type Shared = State<Arc<Provider>>;

async fn effect(
    State(p): Shared,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> impl IntoResponse {
    p.apply(name, &headers, Duration::ZERO).await
}

async fn slow_effect(
    State(p): Shared,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> impl IntoResponse {
    p.apply(name, &headers, Duration::from_secs(5)).await
}

/// Answers `code`, with `Retry-After: 3` on `409` and `429`.
async fn status(State(p): Shared, Path(code): Path<u16>, headers: HeaderMap) -> impl IntoResponse {
    p.seen
        .lock()
        .unwrap()
        .push((format!("status/{code}"), None));
    let _ = headers;
    let status = StatusCode::from_u16(code).unwrap();
    let mut response = (status, "").into_response();
    if matches!(code, 409 | 429) {
        response
            .headers_mut()
            .insert("retry-after", HeaderValue::from_static("3"));
    }
    response
}

/// Echoes the `Idempotency-Key` it got (empty if none), for any method.
async fn echo(headers: HeaderMap) -> String {
    headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

/// Starts the provider on a free loopback port; returns its base URL.
async fn start_provider() -> (Arc<Provider>, String) {
    let provider = Arc::new(Provider::default());
    let app = Router::new()
        .route("/effects/{name}", post(effect))
        .route("/slow/{name}", post(slow_effect))
        .route("/status/{code}", post(status))
        .route("/echo", any(echo))
        .route("/health", get(|| async { "ok" }))
        .with_state(Arc::clone(&provider));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (provider, format!("http://{addr}"))
}

/// A client with the middleware and no redirects (a `3xx` is an answer); a timeout long
/// enough for a loaded machine.
fn client(form: KeyForm) -> ClientWithMiddleware {
    client_with_timeout(form, Duration::from_secs(30))
}

/// A client that gives up after 1 s, well before the slow route answers (5 s).
fn impatient_client() -> ClientWithMiddleware {
    client_with_timeout(KeyForm::Hex, Duration::from_secs(1))
}

fn client_with_timeout(form: KeyForm, timeout: Duration) -> ClientWithMiddleware {
    let inner = reqwest::Client::builder()
        .timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    ClientBuilder::new(inner)
        .with(DownstreamKeys::new().form(form))
        .build()
}

// ---------------------------------------------------------------------------------------
// The tools
// ---------------------------------------------------------------------------------------

#[derive(Debug, thiserror::Error)]
pub enum PayError {
    #[error(transparent)]
    Contract(#[from] Error),
    #[error(transparent)]
    Downstream(#[from] DownstreamError),
    #[error("the provider's answer could not be read: {0}")]
    Unreadable(String),
}

/// Lets `tool_contracts::downstream::unknown_outcome` classify this error type.
impl DownstreamFailure for PayError {
    fn downstream_outcome(&self) -> Option<DownstreamOutcome> {
        match self {
            PayError::Downstream(e) => Some(e.outcome()),
            _ => None,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct Paid {
    /// The call's own key (what the derived keys are derived from).
    pub call_key: String,
    pub charge: String,
    pub email: String,
}

/// POSTs `url` labelled `label` and reads the answer.
async fn provider_call(
    client: &ClientWithMiddleware,
    url: String,
    label: &'static str,
) -> Result<String, PayError> {
    let request = client.post(url).with_extension(DownstreamLabel::new(label));
    let response = check(request.send().await)?;
    response
        .text()
        .await
        .map_err(|e| PayError::Unreadable(e.to_string()))
}

/// Charges an order and emails the receipt: two provider calls, two labels.
#[mutating_tool(idempotency_key_fields = [order_id])]
pub async fn pay_order(order_id: u64, provider: String, uuid: bool) -> Result<Paid, PayError> {
    let client = client(if uuid { KeyForm::Uuid } else { KeyForm::Hex });
    let charge = provider_call(&client, format!("{provider}/effects/charge"), "charge").await?;
    let email = provider_call(&client, format!("{provider}/effects/email"), "email").await?;
    let call_key =
        tool_contracts::current_key().ok_or_else(|| PayError::Unreadable("no key".into()))?;
    let _ = order_id;
    Ok(Paid {
        call_key,
        charge,
        email,
    })
}

static SLOW_KEYS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static SLOW_VERIFIES: AtomicUsize = AtomicUsize::new(0);

/// Charges through a provider that commits, then answers after the client gave up: the
/// first attempt times out, an unknown outcome the helper keeps for reconciliation.
#[mutating_tool(
    idempotency_key_fields = [order_id],
    unknown_outcome_if = tool_contracts::downstream::unknown_outcome,
    verify = slow_charge_settled,
)]
pub async fn slow_charge(order_id: u64, provider: String) -> Result<String, PayError> {
    let _ = order_id;
    if let Some(key) = tool_contracts::current_key() {
        SLOW_KEYS.lock().unwrap().push(key);
    }
    provider_call(
        &impatient_client(),
        format!("{provider}/slow/charge"),
        "charge",
    )
    .await
}

/// This provider has no lookup by key: verify cannot tell, so the body runs again, and the
/// provider's own idempotency (the same derived key) keeps it to one charge.
pub async fn slow_charge_settled(
    order_id: &u64,
    provider: &str,
) -> Result<Option<String>, PayError> {
    let _ = (order_id, provider);
    SLOW_VERIFIES.fetch_add(1, SeqCst);
    Ok(None)
}

// ---------------------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn two_provider_calls_of_one_tool_call_never_share_a_key() {
    let (provider, url) = start_provider().await;
    with_store(MemoryStore::new(), async {
        let paid = pay_order(1, url.clone(), false).await.unwrap();
        let charge = provider.keys_for("charge");
        let email = provider.keys_for("email");
        assert_eq!(charge, [Some(derive_key(&paid.call_key, "charge"))]);
        assert_eq!(email, [Some(derive_key(&paid.call_key, "email"))]);
        assert_ne!(charge, email, "two downstream effects shared one key");
        assert_ne!(charge[0].as_deref(), Some(paid.call_key.as_str()));
        assert_eq!(provider.effects.load(SeqCst), 2);
    })
    .await;
}

#[tokio::test]
async fn a_retry_of_the_same_intent_sends_the_same_keys_and_the_provider_charges_once() {
    let (provider, url) = start_provider().await;
    // The email's first request is refused with 429 (not applied): the call fails, the
    // engine releases the key, and the retry runs the body again.
    provider
        .rate_limited_once
        .lock()
        .unwrap()
        .insert("email".to_owned(), 1);
    with_store(MemoryStore::new(), async {
        let err = pay_order(2, url.clone(), false).await.unwrap_err();
        let PayError::Downstream(e) = &err else {
            panic!("expected a downstream error, got {err:?}")
        };
        assert_eq!(
            e.outcome(),
            DownstreamOutcome::RateLimited { retry_after: None }
        );
        assert!(!tool_contracts::downstream::unknown_outcome(&err));

        let paid = pay_order(2, url.clone(), false).await.unwrap();
        let charge = provider.keys_for("charge");
        let email = provider.keys_for("email");
        let expected_charge = Some(derive_key(&paid.call_key, "charge"));
        let expected_email = Some(derive_key(&paid.call_key, "email"));
        assert_eq!(
            charge,
            [expected_charge.clone(), expected_charge],
            "charge keys"
        );
        assert_eq!(
            email,
            [expected_email.clone(), expected_email],
            "email keys"
        );
        // The second charge request was the provider's replay: one charge, one email.
        assert_eq!(provider.effects.load(SeqCst), 2);
        assert_eq!(paid.charge, "charge-1");

        // Another intent: other keys.
        let other = pay_order(3, url.clone(), false).await.unwrap();
        assert_ne!(other.call_key, paid.call_key);
        let charge = provider.keys_for("charge");
        assert_eq!(charge.len(), 3);
        assert_eq!(charge[2], Some(derive_key(&other.call_key, "charge")));
        assert_ne!(charge[2], charge[0]);
        assert_eq!(provider.effects.load(SeqCst), 4);
    })
    .await;
}

#[tokio::test]
async fn the_uuid_form_is_the_documented_uuid_of_the_derived_key() {
    let (provider, url) = start_provider().await;
    with_store(MemoryStore::new(), async {
        let paid = pay_order(4, url.clone(), true).await.unwrap();
        let expected = key_uuid(&derive_key(&paid.call_key, "charge"))
            .hyphenated()
            .to_string();
        assert_eq!(provider.keys_for("charge"), [Some(expected)]);
    })
    .await;
}

/// Outside a tool body nothing is sent; a header the caller set is never replaced; safe
/// methods carry no key.
#[tokio::test]
async fn requests_outside_a_call_or_with_their_own_key_are_left_alone() {
    let (_provider, url) = start_provider().await;
    let c = client(KeyForm::Hex);
    let echo = |request: tool_contracts::downstream::reqwest_middleware::RequestBuilder| async move {
        request.send().await.unwrap().text().await.unwrap()
    };
    assert_eq!(
        echo(c.post(format!("{url}/echo"))).await,
        "",
        "outside a call"
    );
    assert_eq!(
        echo(
            c.post(format!("{url}/echo"))
                .header("Idempotency-Key", "mine")
        )
        .await,
        "mine"
    );

    /// Echoes the keys four requests carried, then the call's own key.
    #[mutating_tool(idempotency_key_fields = [id])]
    async fn echo_keys(id: u64, url: String) -> Result<Vec<String>, PayError> {
        let _ = id;
        let c = client(KeyForm::Hex);
        let mut seen = Vec::new();
        for request in [
            c.post(format!("{url}/echo")),
            c.post(format!("{url}/echo"))
                .header("Idempotency-Key", "mine"),
            c.get(format!("{url}/echo")),
            c.delete(format!("{url}/echo"))
                .with_extension(DownstreamLabel::new("cancel")),
        ] {
            seen.push(
                check(request.send().await)?
                    .text()
                    .await
                    .map_err(|e| PayError::Unreadable(e.to_string()))?,
            );
        }
        seen.push(tool_contracts::current_key().unwrap_or_default());
        Ok(seen)
    }

    with_store(MemoryStore::new(), async {
        let seen = echo_keys(1, url.clone()).await.unwrap();
        let key = &seen[4];
        assert_eq!(seen[0], *key, "an unlabelled request gets the call's key");
        assert_eq!(seen[1], "mine", "the caller's own header is kept");
        assert_eq!(seen[2], "", "a GET has no effect to protect");
        assert_eq!(seen[3], derive_key(key, "cancel"));
    })
    .await;
}

/// Each row of the precedence table, produced by a real server (or a real socket).
#[tokio::test]
async fn each_downstream_outcome_is_classified_from_what_really_happened() {
    let (provider, url) = start_provider().await;
    let c = client(KeyForm::Hex);
    let classify = |request: tool_contracts::downstream::reqwest_middleware::RequestBuilder| async move {
        DownstreamOutcome::of(&request.send().await)
    };
    let three = Some(Duration::from_secs(3));
    for (code, expected) in [
        (200, DownstreamOutcome::Succeeded),
        (201, DownstreamOutcome::Succeeded),
        (302, DownstreamOutcome::Succeeded),
        (400, DownstreamOutcome::Failed),
        (404, DownstreamOutcome::Failed),
        (422, DownstreamOutcome::Failed),
        (408, DownstreamOutcome::Unknown),
        (500, DownstreamOutcome::Unknown),
        (502, DownstreamOutcome::Unknown),
        (503, DownstreamOutcome::Unknown),
        (504, DownstreamOutcome::Unknown),
        (409, DownstreamOutcome::StillRunning { retry_after: three }),
        (429, DownstreamOutcome::RateLimited { retry_after: three }),
    ] {
        let got = classify(c.post(format!("{url}/status/{code}"))).await;
        assert_eq!(got, expected, "status {code}");
    }

    // A timeout after the request was sent: the provider committed, the client gave up.
    let before = provider.effects.load(SeqCst);
    let got = classify(impatient_client().post(format!("{url}/slow/timeout"))).await;
    assert_eq!(got, DownstreamOutcome::Unknown, "timeout");
    assert_eq!(
        provider.effects.load(SeqCst),
        before + 1,
        "the timed-out request had its effect"
    );

    // Connection refused (a port just closed): never sent.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let got = classify(c.post(format!("http://127.0.0.1:{port}/effects/charge"))).await;
    assert_eq!(got, DownstreamOutcome::NotSent, "connect refused");

    // A builder error: never sent.
    let got = classify(c.post("http://exa mple.invalid:notaport/")).await;
    assert_eq!(got, DownstreamOutcome::NotSent, "builder error");

    // A label the middleware refuses, inside a tool body: never sent.
    let requests_before = provider.requests();
    /// Sends one request with an empty label.
    #[mutating_tool(idempotency_key_fields = [id])]
    async fn bad_label(id: u64, url: String) -> Result<String, PayError> {
        let _ = id;
        let request = client(KeyForm::Hex)
            .post(format!("{url}/effects/charge"))
            .with_extension(DownstreamLabel::new(""));
        Ok(check(request.send().await)?.status().to_string())
    }
    let err = with_store(MemoryStore::new(), bad_label(1, url.clone()))
        .await
        .unwrap_err();
    let PayError::Downstream(e) = &err else {
        panic!("expected a downstream error, got {err:?}")
    };
    assert_eq!(e.outcome(), DownstreamOutcome::NotSent, "{err}");
    assert!(err.to_string().contains("label \"\" is empty"), "{err}");
    assert_eq!(
        provider.requests(),
        requests_before,
        "the request was sent anyway"
    );

    // The connection closed after the request was sent, before any answer. Hand-written
    // on a raw socket: axum always answers a request it accepted.
    let raw = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let raw_addr = raw.local_addr().unwrap();
    let received = tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let (mut socket, _) = raw.accept().await.unwrap();
        let mut request = Vec::new();
        let mut buf = [0_u8; 1024];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = socket.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            request.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&request).into_owned()
        // dropped here: the connection closes without an answer
    });
    let got = classify(c.post(format!("http://{raw_addr}/effects/charge"))).await;
    let request = received.await.unwrap();
    assert!(request.starts_with("POST /effects/charge"), "{request:?}");
    assert_eq!(got, DownstreamOutcome::Unknown, "closed after sending");
}

#[tokio::test]
async fn a_timed_out_provider_call_is_kept_unknown_and_its_retry_charges_nothing_twice() {
    let (provider, url) = start_provider().await;
    let store = MemoryStore::new();
    with_store(store, async {
        let err = slow_charge(7, url.clone()).await.unwrap_err();
        let PayError::Downstream(e) = &err else {
            panic!("expected a downstream error, got {err:?}")
        };
        assert_eq!(e.outcome(), DownstreamOutcome::Unknown, "{err}");
        assert!(err.to_string().contains("timed out"), "{err}");
        assert!(tool_contracts::downstream::unknown_outcome(&err));
        assert_eq!(provider.effects.load(SeqCst), 1, "the provider charged");

        // The engine kept the key as an unknown outcome (not released).
        let key = SLOW_KEYS.lock().unwrap()[0].clone();
        let op = operation(&key).await.unwrap().expect("the key is kept");
        assert_eq!(op.state, OperationState::Unknown);

        // The retry goes through verify (which cannot tell), runs the body again with the
        // same derived key, and the provider answers from its own idempotency table.
        let retry = slow_charge(7, url.clone()).await;
        assert_eq!(provider.effects.load(SeqCst), 1, "a second charge");
        assert_eq!(SLOW_VERIFIES.load(SeqCst), 1, "the retry reconciled first");
        assert_eq!(retry.unwrap(), "charge-1");
        let keys = provider.keys_for("charge");
        let derived = Some(derive_key(&key, "charge"));
        assert_eq!(keys, [derived.clone(), derived]);
        assert_eq!(SLOW_KEYS.lock().unwrap().as_slice(), [key.clone(), key]);
    })
    .await;
}
