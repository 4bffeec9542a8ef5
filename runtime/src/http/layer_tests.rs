//! [`IdempotencyLayer`] on plain axum handlers, driven with `tower::ServiceExt::oneshot`:
//! every status, replays, what is stored, scoping, concurrency, and a handler that dies
//! mid-flight. (Against a real server and client: `tests/http/httpx_e2e.py`.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, Request, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use serde_json::json;

use super::tests::{send, Answer, DownStore};
use super::*;
use crate::store::MemoryStore;

/// How many times the handlers ran.
type Hits = Arc<AtomicUsize>;

fn hit(hits: &Hits) -> usize {
    hits.fetch_add(1, Ordering::SeqCst) + 1
}

/// A payment: `201` with a `Location`, an application header the layer is told to store,
/// one it is not, and a cookie it must never replay.
async fn pay(State(hits): State<Hits>, body: String) -> impl IntoResponse {
    let n = hit(&hits);
    (
        StatusCode::CREATED,
        [
            (header::LOCATION, format!("/payments/{n}")),
            (
                header::HeaderName::from_static("x-payment-id"),
                format!("pay_{n}"),
            ),
            (
                header::HeaderName::from_static("x-not-stored"),
                "1".to_owned(),
            ),
            (header::SET_COOKIE, "session=secret".to_owned()),
            (header::CONTENT_TYPE, "application/json".to_owned()),
        ],
        json!({"payment": n, "body": body}).to_string(),
    )
}

async fn status(State(hits): State<Hits>, Path(code): Path<u16>) -> impl IntoResponse {
    let n = hit(&hits);
    (
        StatusCode::from_u16(code).unwrap_or(StatusCode::IM_A_TEAPOT),
        format!("status {code}, run {n}"),
    )
}

async fn slow(State(hits): State<Hits>) -> String {
    let n = hit(&hits);
    tokio::time::sleep(Duration::from_millis(300)).await;
    format!("run {n}")
}

/// Never answers on its first run (a server that hangs or dies mid-handler); answers on
/// later runs.
async fn hang_once(State(hits): State<Hits>) -> String {
    let n = hit(&hits);
    if n == 1 {
        std::future::pending::<()>().await;
    }
    format!("run {n}")
}

async fn big(State(hits): State<Hits>) -> String {
    hit(&hits);
    "x".repeat(100)
}

/// The routes, guarded by `layer` (with `route_layer`, or `Router::layer` when `outer`).
fn app_with(layer: IdempotencyLayer, outer: bool) -> (Router, Hits) {
    let hits = Hits::default();
    let routes = Router::new()
        .route("/payments", post(pay).get(|| async { "listed" }))
        .route("/orders/{id}", post(pay).patch(pay))
        .route("/status/{code}", post(status))
        .route("/slow", post(slow))
        .route("/hang", post(hang_once))
        .route("/big", post(big));
    let routes = if outer {
        routes.layer(layer)
    } else {
        routes.route_layer(layer)
    };
    (routes.with_state(Arc::clone(&hits)), hits)
}

fn layer() -> IdempotencyLayer {
    IdempotencyLayer::new()
        .with_store(MemoryStore::new())
        .with_stored_headers([header::HeaderName::from_static("x-payment-id")])
}

fn app(layer: IdempotencyLayer) -> (Router, Hits) {
    app_with(layer, false)
}

fn post_keyed(path: &str, key: &str, body: &str) -> Request<Body> {
    Request::post(path)
        .header("idempotency-key", key)
        .body(Body::from(body.to_owned()))
        .unwrap()
}

fn runs(hits: &Hits) -> usize {
    hits.load(Ordering::SeqCst)
}

fn replayed(answer: &Answer) -> bool {
    answer.header("idempotent-replayed") == Some("true")
}

#[tokio::test]
async fn a_retry_gets_the_first_response_back_and_the_handler_runs_once() {
    let (app, hits) = app(layer());
    let first = send(&app, post_keyed("/payments", "k-1", "100 EUR")).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text);
    assert!(!replayed(&first), "a first execution is not marked");
    assert_eq!(first.header("set-cookie"), Some("session=secret"));
    for key in ["k-1", "\"k-1\""] {
        // Bare or as the draft's Structured Field String: the same key.
        let again = send(&app, post_keyed("/payments", key, "100 EUR")).await;
        assert!(replayed(&again), "{key}");
        assert_eq!(again.status, first.status);
        assert_eq!(again.text, first.text, "the same body, byte for byte");
        for name in ["content-type", "location", "x-payment-id"] {
            assert_eq!(again.header(name), first.header(name), "{name} replayed");
        }
        assert_eq!(again.header("x-not-stored"), None, "only listed headers");
        assert_eq!(again.header("set-cookie"), None, "never a cookie");
    }
    assert_eq!(runs(&hits), 1);
    assert_eq!(first.json()["payment"], 1);
    // Another key is another request.
    let other = send(&app, post_keyed("/payments", "k-2", "100 EUR")).await;
    assert_eq!(other.json()["payment"], 2);
    assert!(!replayed(&other));
}

#[tokio::test]
async fn a_missing_or_invalid_key_is_400_and_nothing_runs() {
    let (app, hits) = app(layer());
    let bare = Request::post("/payments").body(Body::from("x")).unwrap();
    let missing = send(&app, bare).await;
    let doc = missing.problem(ProblemType::InvalidArguments);
    assert_eq!(doc["field"], "Idempotency-Key");
    assert!(doc["detail"]
        .as_str()
        .unwrap()
        .contains("requires an `Idempotency-Key`"));
    for bad in ["\"unclosed", &"k".repeat(256), "\"\""] {
        let answer = send(&app, post_keyed("/payments", bad, "x")).await;
        assert_eq!(
            answer.problem(ProblemType::InvalidArguments)["field"],
            "Idempotency-Key"
        );
    }
    let twice = Request::post("/payments")
        .header("idempotency-key", "a")
        .header("idempotency-key", "a")
        .body(Body::empty())
        .unwrap();
    send(&app, twice)
        .await
        .problem(ProblemType::InvalidArguments);
    // Methods the layer does not guard pass without a key.
    let listed = send(&app, Request::get("/payments").body(Body::empty()).unwrap()).await;
    assert_eq!(
        (listed.status, listed.text.as_str()),
        (StatusCode::OK, "listed")
    );
    assert_eq!(runs(&hits), 0);
}

#[tokio::test]
async fn a_key_reused_with_another_request_is_422_naming_what_differs() {
    for outer in [false, true] {
        let (app, hits) = app_with(layer(), outer);
        assert_eq!(
            send(&app, post_keyed("/orders/1", "k", "a")).await.status,
            StatusCode::CREATED
        );
        let body = send(&app, post_keyed("/orders/1", "k", "b")).await;
        assert_eq!(
            body.problem(ProblemType::KeyReused)["params"],
            json!(["body"])
        );
        // One route template (`/orders/{id}`, axum's `MatchedPath`), another path.
        let path = send(&app, post_keyed("/orders/2", "k", "a")).await;
        assert_eq!(
            path.problem(ProblemType::KeyReused)["params"],
            json!(["path"]),
            "outer: {outer}"
        );
        let query = send(&app, post_keyed("/orders/1?x=1", "k", "a")).await;
        assert_eq!(
            query.problem(ProblemType::KeyReused)["params"],
            json!(["path"])
        );
        assert_eq!(runs(&hits), 1, "nothing ran again");
        // Keys are per route: the same key on another method or route is another request.
        let patch = Request::patch("/orders/1")
            .header("idempotency-key", "k")
            .body(Body::from("b"))
            .unwrap();
        assert!(!replayed(&send(&app, patch).await));
        assert!(!replayed(
            &send(&app, post_keyed("/payments", "k", "c")).await
        ));
        assert_eq!(runs(&hits), 3);
    }
}

#[tokio::test]
async fn keys_are_scoped_per_client_identity() {
    let layer = layer().with_identity(|parts| match parts.headers.get("x-account") {
        Some(account) => Ok(account.to_str().ok().map(str::to_owned)),
        None => Err(Problem::from_status(StatusCode::UNAUTHORIZED).into()),
    });
    let (app, hits) = app(layer);
    let as_account = |account: &str| {
        let mut request = post_keyed("/payments", "shared-key", "1 EUR");
        request
            .headers_mut()
            .insert("x-account", account.parse().unwrap());
        request
    };
    let acme = send(&app, as_account("acme")).await;
    let globex = send(&app, as_account("globex")).await;
    assert!(
        !replayed(&acme) && !replayed(&globex),
        "two clients, two requests"
    );
    assert_ne!(acme.text, globex.text);
    let acme_again = send(&app, as_account("acme")).await;
    assert!(replayed(&acme_again));
    assert_eq!(acme_again.text, acme.text);
    let anonymous = send(&app, post_keyed("/payments", "shared-key", "1 EUR")).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    assert_eq!(runs(&hits), 2);
}

#[tokio::test]
async fn what_is_stored_4xx_yes_5xx_and_try_again_statuses_no() {
    let (app, hits) = app(layer());
    // One key per status: `/status/{code}` is one route, so one key on two codes is 422.
    let post = |code: u16| post_keyed(&format!("/status/{code}"), &format!("k-{code}"), "");
    // A 5xx releases the key: the retry runs again.
    let failed = send(&app, post(500)).await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    let retried = send(&app, post(500)).await;
    assert!(!replayed(&retried));
    assert_eq!(runs(&hits), 2);
    // A 4xx is the request's answer: stored and replayed (the draft, Stripe).
    let refused = send(&app, post(422)).await;
    let again = send(&app, post(422)).await;
    assert!(replayed(&again));
    assert_eq!((again.status, &again.text), (refused.status, &refused.text));
    assert_eq!(runs(&hits), 3);
    // 429 says "try again": released.
    send(&app, post(429)).await;
    assert!(!replayed(&send(&app, post(429)).await));
    assert_eq!(runs(&hits), 5);

    let (app, hits) = app_with(layer().store_server_errors(), false);
    let first = send(&app, post(503)).await;
    let again = send(&app, post(503)).await;
    assert!(replayed(&again), "store_server_errors replays a 5xx");
    assert_eq!(again.text, first.text);
    assert_eq!(runs(&hits), 1);
}

#[tokio::test]
async fn bodies_over_the_limit_are_413_and_nothing_runs() {
    let (app, hits) = app(layer().with_max_body_bytes(16));
    // Streamed (no Content-Length) and declared.
    let streamed = send(&app, post_keyed("/payments", "k", &"x".repeat(17))).await;
    streamed.problem(ProblemType::PayloadTooLarge);
    let mut declared = post_keyed("/payments", "k", &"x".repeat(17));
    declared
        .headers_mut()
        .insert(header::CONTENT_LENGTH, "17".parse().unwrap());
    send(&app, declared)
        .await
        .problem(ProblemType::PayloadTooLarge);
    assert_eq!(runs(&hits), 0);
    let fits = send(&app, post_keyed("/payments", "k", &"x".repeat(16))).await;
    assert_eq!(fits.status, StatusCode::CREATED);
}

#[tokio::test]
async fn a_response_too_large_to_store_reaches_the_client_and_the_key_is_unknown() {
    let (app, hits) = app(layer().with_max_response_bytes(10));
    let first = send(&app, post_keyed("/big", "k", "")).await;
    assert_eq!((first.status, first.text.len()), (StatusCode::OK, 100));
    let retry = send(&app, post_keyed("/big", "k", "")).await;
    retry.problem(ProblemType::OutcomeUnknown);
    assert_eq!(runs(&hits), 1, "never a second run");
}

#[tokio::test]
async fn a_store_that_is_down_is_503_and_nothing_runs() {
    let (app, hits) = app(IdempotencyLayer::new().with_store(DownStore));
    send(&app, post_keyed("/payments", "k", "x"))
        .await
        .problem(ProblemType::StoreUnavailable);
    assert_eq!(runs(&hits), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_concurrent_requests_with_one_key_run_the_handler_once() {
    let (app, hits) = app(layer());
    let answers = futures::future::join_all((0..40).map(|_| {
        let app = app.clone();
        tokio::spawn(async move { send(&app, post_keyed("/slow", "one", "")).await })
    }))
    .await;
    let answers: Vec<Answer> = answers.into_iter().map(Result::unwrap).collect();
    assert_eq!(runs(&hits), 1, "exactly one execution");
    let executed = answers
        .iter()
        .filter(|a| a.status == StatusCode::OK && !replayed(a))
        .count();
    assert_eq!(executed, 1);
    for answer in &answers {
        match answer.status {
            StatusCode::OK => assert_eq!(answer.text, "run 1"),
            StatusCode::CONFLICT => {
                answer.problem(ProblemType::InProgress);
                assert!(answer.header("retry-after").is_some());
            }
            other => panic!("unexpected {other}: {}", answer.text),
        }
    }
    // After the first finished, every retry replays.
    let late = send(&app, post_keyed("/slow", "one", "")).await;
    assert!(replayed(&late));
    assert_eq!(late.text, "run 1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_dropped_mid_handler_leaves_an_unknown_outcome_never_a_second_run() {
    let lease = Duration::from_millis(150);
    let (app, hits) = app(layer().with_lease(lease));
    let first = {
        let app = app.clone();
        tokio::spawn(async move { send(&app, post_keyed("/hang", "k", "")).await })
    };
    while runs(&hits) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Past several leases, the heartbeat keeps the running handler's claim: 409.
    tokio::time::sleep(lease * 3).await;
    let busy = send(&app, post_keyed("/hang", "k", "")).await;
    busy.problem(ProblemType::InProgress);
    assert!(busy.header("retry-after").is_some());
    // The client goes away: the server drops the handler, its lease runs out.
    first.abort();
    let _ = first.await;
    tokio::time::sleep(lease * 2).await;
    let retry = send(&app, post_keyed("/hang", "k", "")).await;
    let doc = retry.problem(ProblemType::OutcomeUnknown);
    assert_eq!(doc["idempotency_key"], "k");
    assert_eq!(runs(&hits), 1, "never run again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_least_once_reruns_a_request_that_died_mid_handler() {
    let lease = Duration::from_millis(100);
    let (app, hits) = app(layer().with_lease(lease).at_least_once());
    let first = {
        let app = app.clone();
        tokio::spawn(async move { send(&app, post_keyed("/hang", "k", "")).await })
    };
    while runs(&hits) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    first.abort();
    let _ = first.await;
    tokio::time::sleep(lease * 2).await;
    let rerun = send(&app, post_keyed("/hang", "k", "")).await;
    assert_eq!(
        (rerun.status, rerun.text.as_str()),
        (StatusCode::OK, "run 2")
    );
    assert!(!replayed(&rerun));
    let replay = send(&app, post_keyed("/hang", "k", "")).await;
    assert!(replayed(&replay));
    assert_eq!(runs(&hits), 2);
}
