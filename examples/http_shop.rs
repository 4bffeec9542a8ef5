//! The shop over plain HTTP with Post/Redirect/Get, and an HTML order form without
//! JavaScript: the 1990s double-order bug, fixed again. Submit the form, land on the
//! order's operation page; reload it, or go back and submit the same form again: the
//! ledger still shows one order.
//!
//! ```sh
//! cargo run --example http_shop --features http,sqlite -- --addr 127.0.0.1:8090 --db /tmp/shop.db
//! # then open http://127.0.0.1:8090/ , or:
//! curl -i -d user_id=7 -d cart.id=c-1 -d cart.items.0.sku=beans -d cart.items.0.qty=1 \
//!      -d cart.items.0.unit_cents=1250 -d note=hi http://127.0.0.1:8090/tools/create_order
//! curl http://127.0.0.1:8090/ledger
//! ```
//!
//! Routes: `/` the form, `/refund` a refund form, `/ledger` every effect so far (JSON), the
//! tools router (`POST /tools/{name}`, `GET /operations/{key}`,
//! `POST /operations/{key}/approve` and `/deny`, `GET /tools`, `GET /openapi.json`), and
//! `POST /payments`: a plain axum handler (no tool, no registry; a legacy route) guarded by
//! `IdempotencyLayer`, which requires an `Idempotency-Key` and replays the first response
//! to every retry with it (`Idempotent-Replayed: true`):
//!
//! ```sh
//! curl -i -H 'Idempotency-Key: 8e03978e-40d5-43e8-bc93-6894a57f9324' \
//!      -H 'Content-Type: application/json' -d '{"amount_cents":1250,"reference":"inv-1"}' \
//!      http://127.0.0.1:8090/payments
//! ```
//!
//! `refund_order` needs a person's approval (`approval = "required"`): a call answers `202`
//! with its operation (a browser lands on the operation page), and nothing runs until
//! someone approves it, on that page or with `POST /operations/{key}/approve`; then it runs
//! once. Who decides is the `X-User` request header when sent (a stand-in for
//! authentication), else the `by` the form or body names:
//!
//! ```sh
//! curl -i -H 'Content-Type: application/json' \
//!      -d '{"order_id":1,"amount_cents":2500,"reason":"damaged"}' http://127.0.0.1:8090/tools/refund_order
//! curl -i -H 'Content-Type: application/json' -d '{"by":"alice"}' \
//!      http://127.0.0.1:8090/operations/<key>/approve
//! ```
//!
//! `--tenant-header` makes the `X-Tenant` request header each request's tenant: a
//! stand-in for authentication (a real service derives the tenant from its credentials).
//! Without the header such a server answers `401`; an operation read with another tenant's
//! header is `404`. Keys live in the SQLite file `--db`; effects are appended to the ledger,
//! `<db>.ledger.jsonl` unless `--ledger` says otherwise (the tools and the ledger are
//! `support/shop.rs`, shared with `mcp_shop`). `--addr` with port 0 picks a free port; the
//! address is printed as `http_shop: listening on http://…`. The tests' crash windows are
//! environment variables read by `support/shop.rs` (`SHOP_PAYMENT_DELAY_MS` for
//! `/payments`, `SHOP_ORDER_DELAY_MS` for `create_order`, …).

#[path = "support/shop.rs"]
mod shop;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tool_contracts::http::axum;
use tool_contracts::http::{HttpTools, IdempotencyLayer, Problem, Rejection};

use axum::body::Bytes;
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};

struct Options {
    addr: SocketAddr,
    db: PathBuf,
    ledger: Option<PathBuf>,
    tenant_header: bool,
}

const USAGE: &str =
    "usage: http_shop --db <path> [--addr <host:port>] [--ledger <path>] [--tenant-header]";

/// The request header that names the tenant with `--tenant-header`.
const TENANT_HEADER: &str = "x-tenant";

/// The request header that names who approves or denies a refund (a stand-in for
/// authentication); without it, the decision's `by`.
const USER_HEADER: &str = "x-user";

fn parse_args() -> Result<Options, String> {
    let mut args = std::env::args().skip(1);
    let mut options = Options {
        addr: SocketAddr::from(([127, 0, 0, 1], 8090)),
        db: PathBuf::new(),
        ledger: None,
        tenant_header: false,
    };
    let mut db = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--addr" => {
                let addr = args
                    .next()
                    .ok_or("--addr needs an address, e.g. 127.0.0.1:8090")?;
                options.addr = addr
                    .parse()
                    .map_err(|e| format!("--addr {addr}: not a socket address ({e})"))?;
            }
            "--db" => db = Some(PathBuf::from(args.next().ok_or("--db needs a path")?)),
            "--ledger" => {
                options.ledger = Some(PathBuf::from(args.next().ok_or("--ledger needs a path")?))
            }
            "--tenant-header" => options.tenant_header = true,
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument `{other}`\n{USAGE}")),
        }
    }
    options.db = db.ok_or_else(|| format!("say --db <path>\n{USAGE}"))?;
    Ok(options)
}

#[tokio::main]
async fn main() {
    if let Err(message) = run().await {
        eprintln!("http_shop: {message}");
        std::process::exit(2);
    }
}

async fn run() -> Result<(), String> {
    let options = parse_args()?;
    let ledger_path = shop::open(&options.db, options.ledger).await?;
    let registry = tool_contracts::try_registry().map_err(|e| e.to_string())?;
    let mut tools = HttpTools::new(registry.clone())
        .with_info("http_shop", env!("CARGO_PKG_VERSION"))
        .with_approver(approver_of);
    // The plain route's guard: a 2 s lease (renewed while the handler runs), so a retry
    // after a crash learns the unknown outcome 2 s after the server died.
    let mut guard = IdempotencyLayer::new().with_lease(Duration::from_secs(2));
    if options.tenant_header {
        tools = tools.with_tenant(tenant_of);
        // One function for both: keys of the plain route are per tenant too.
        guard = guard.with_identity(tenant_of);
    }
    let payments = axum::Router::new()
        .route("/payments", post(take_payment))
        .route_layer(guard);
    let app = axum::Router::new()
        .route("/", get(order_form))
        .route("/refund", get(refund_form))
        .route("/ledger", get(ledger))
        .merge(payments)
        .merge(tools.into_router());
    let listener = tokio::net::TcpListener::bind(options.addr)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", options.addr))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    eprintln!(
        "http_shop: pid {}, store {}, ledger {}",
        std::process::id(),
        options.db.display(),
        ledger_path.display()
    );
    eprintln!("http_shop: listening on http://{bound}");
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown())
        .await
        .map_err(|e| e.to_string())
}

/// The request's tenant with `--tenant-header`: the `X-Tenant` header (a stand-in for
/// authentication), `401` without it.
fn tenant_of(parts: &Parts) -> Result<Option<String>, Rejection> {
    match parts.headers.get(TENANT_HEADER) {
        Some(value) => match value.to_str() {
            Ok(tenant) => Ok(Some(tenant.to_owned())),
            Err(_) => Err(Problem::from_status(StatusCode::BAD_REQUEST)
                .with_detail("`X-Tenant` must be visible ASCII")
                .into()),
        },
        None => Err((
            [(header::WWW_AUTHENTICATE, "X-Tenant")],
            Problem::from_status(StatusCode::UNAUTHORIZED).with_detail(
                "this shop runs with --tenant-header: send `X-Tenant: <tenant>` (a stand-in for real authentication)",
            ),
        )
            .into()),
    }
}

/// Who decides a refund: the `X-User` header when sent (a stand-in for authentication: a
/// real service names the person from their credentials, and refuses the agent's), else
/// the `by` of the decision's body or form.
fn approver_of(parts: &Parts) -> Result<Option<String>, Rejection> {
    match parts.headers.get(USER_HEADER) {
        Some(value) => match value.to_str() {
            Ok(user) if !user.is_empty() => Ok(Some(user.to_owned())),
            _ => Err(Problem::from_status(StatusCode::BAD_REQUEST)
                .with_detail("`X-User` must be visible ASCII")
                .into()),
        },
        None => Ok(None),
    }
}

/// What `POST /payments` takes.
#[derive(serde::Deserialize)]
struct PaymentRequest {
    amount_cents: u64,
    reference: String,
}

/// `POST /payments`: a plain handler, written as any axum handler is (no tool, no key
/// fields): it appends a payment to the ledger and answers `201` with the payment. Run
/// once per `Idempotency-Key` by the `IdempotencyLayer` in front of it.
async fn take_payment(body: Bytes) -> Response {
    let request: PaymentRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => {
            return Problem::from_status(StatusCode::BAD_REQUEST)
                .with_detail(format!(
                    "the body must be {{\"amount_cents\": <integer>, \"reference\": <text>}} ({e})"
                ))
                .into_response()
        }
    };
    match shop::record_payment(request.amount_cents, &request.reference).await {
        Ok(payment) => (
            StatusCode::CREATED,
            [
                (header::CONTENT_TYPE, "application/json".to_owned()),
                (
                    header::LOCATION,
                    format!("/payments/{}", payment["payment_id"]),
                ),
            ],
            payment.to_string(),
        )
            .into_response(),
        Err(e) => Problem::from_status(StatusCode::INTERNAL_SERVER_ERROR)
            .with_detail(e.to_string())
            .into_response(),
    }
}

/// Ctrl-C or SIGTERM.
async fn shutdown() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}

/// A page of this shop: the same head and style around `body`.
fn page(title: &str, body: &str) -> Html<String> {
    Html(format!(
        r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>http_shop: {title}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:40rem;margin:2rem auto;padding:0 1rem}}label{{display:block;margin:.5rem 0}}</style>
</head>
<body>
{body}</body>
</html>
"#
    ))
}

/// `GET /`: a plain HTML form that posts to `create_order`, its field names the dotted
/// paths of the tool's arguments. No script: the browser posts, follows the `303` and
/// shows the operation page.
async fn order_form() -> Html<String> {
    page(
        "place an order",
        r#"<h1>Place an order</h1>
<p>Submit once, reload the page you land on, go back and submit again: the
<a href="ledger">ledger</a> shows one order, because the order is keyed on the user and
the cart.</p>
<form method="post" action="tools/create_order">
<label>User id <input name="user_id" type="number" min="0" value="7" required></label>
<label>Cart id <input name="cart.id" value="cart-1" required></label>
<fieldset>
<legend>Item</legend>
<label>Product <select name="cart.items.0.sku">
<option value="coffee-beans">Coffee beans (12.50)</option>
<option value="tea-leaves">Tea leaves (12.50)</option>
</select></label>
<label>Quantity <input name="cart.items.0.qty" type="number" min="1" value="1" required></label>
<input type="hidden" name="cart.items.0.unit_cents" value="1250">
</fieldset>
<label>Note for the packer <textarea name="note"></textarea></label>
<button type="submit">Place order</button>
</form>
<p><a href="refund">Refund an order</a> (a person approves each refund first).</p>
"#,
    )
}

/// `GET /refund`: a plain HTML form that posts to `refund_order`, which needs a person's
/// approval: the browser lands on the operation page, awaiting approval, with the forms
/// that approve or deny it.
async fn refund_form() -> Html<String> {
    page(
        "refund an order",
        r#"<h1>Refund an order</h1>
<p>A person approves every refund before it runs: you land on the refund's page, where it
can be approved or denied. Approving it runs it once; the <a href="ledger">ledger</a> shows
one refund however often the page is reloaded or the form sent.</p>
<form method="post" action="tools/refund_order">
<label>Order number <input name="order_id" type="number" min="0" value="1" required></label>
<label>Amount in cents <input name="amount_cents" type="number" min="0" value="2500" required></label>
<label>Reason <input name="reason" value="arrived damaged" required></label>
<button type="submit">Ask for the refund</button>
</form>
"#,
    )
}

/// `GET /ledger`: every effect so far (orders, charges, shipments, refunds), as JSON.
async fn ledger() -> Response {
    match shop::ledger_entries() {
        Ok(entries) => (
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::Value::Array(entries).to_string(),
        )
            .into_response(),
        Err(e) => Problem::from_status(StatusCode::INTERNAL_SERVER_ERROR)
            .with_detail(e.to_string())
            .into_response(),
    }
}
