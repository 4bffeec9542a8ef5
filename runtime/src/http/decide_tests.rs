//! Approval over HTTP (`decide.rs`), driven with `tower::ServiceExt::oneshot` over
//! hand-built tools that ask for approval and the real engine: what a call awaiting a
//! decision and a denied one answer, the decision routes (every status), tenant scope,
//! cross-origin posts, the approver function, the page's forms, and an approval that
//! continues the call once while agents retry it.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use serde_json::{json, Value};

use super::tests::{send, Answer};
use super::{HttpTools, Problem, ProblemType, Registry, OUTCOME_HEADER};
use crate::store::MemoryStore;

mod fixtures {
    //! `refund` (`approval = "required"`, keyed on `order_id`; `SLOW` sleeps, `DECLINED`
    //! fails) and `brief` (the same, its request open for 300 ms), built by hand as the
    //! attribute macro builds tools.
    use core::time::Duration;
    use std::collections::HashMap;
    use std::sync::Mutex;

    use serde::Deserialize;
    use serde_json::{json, Value};

    use crate::__private::{
        decode_args, decode_tool_input, execute_with, Attempt, CallBuilder, Codec, Ops, SchemaCell,
    };
    use crate::error::Error;
    use crate::registry::{BoxFuture, CallArgs, CallResult, Context, ToolDescriptor};
    use crate::spec::{ApprovalRule, SourceLocation, ToolKind, ToolSpec};

    const HERE: SourceLocation = SourceLocation {
        module_path: module_path!(),
        file: file!(),
        line: line!(),
        column: 1,
    };

    /// Order ids with a behaviour of their own.
    pub(crate) const SLOW: u64 = 900;
    pub(crate) const DECLINED: u64 = 901;

    static REFUND_SPEC: ToolSpec = ToolSpec {
        description: "Refund an order. A person approves every refund.",
        approval: ApprovalRule::Required,
        ..ToolSpec::fixture(
            "refund",
            ToolKind::Mutating,
            &["order_id"],
            &["order_id", "amount_cents", "note"],
            HERE,
        )
    };

    static BRIEF_SPEC: ToolSpec = ToolSpec {
        description: "Refund, asked for a moment only.",
        approval: ApprovalRule::Required,
        approval_expires: Duration::from_millis(300),
        ..ToolSpec::fixture(
            "brief",
            ToolKind::Mutating,
            &["order_id"],
            &["order_id", "amount_cents", "note"],
            HERE,
        )
    };

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Args {
        order_id: u64,
        amount_cents: u64,
        note: String,
    }

    static EFFECTS: Mutex<Option<HashMap<u64, usize>>> = Mutex::new(None);

    /// How many times a refund ran for `order_id` (every test uses its own ids).
    pub(crate) fn effects(order_id: u64) -> usize {
        let effects = EFFECTS.lock().unwrap_or_else(|p| p.into_inner());
        effects
            .as_ref()
            .and_then(|e| e.get(&order_id).copied())
            .unwrap_or(0)
    }

    fn effect(order_id: u64) -> usize {
        let mut effects = EFFECTS.lock().unwrap_or_else(|p| p.into_inner());
        let n = effects
            .get_or_insert_with(HashMap::new)
            .entry(order_id)
            .or_default();
        *n += 1;
        *n
    }

    fn builder(spec: &'static ToolSpec, args: &Args) -> CallBuilder {
        let mut builder = CallBuilder::new(spec);
        builder.key_field("order_id", &args.order_id);
        builder.arg("order_id", &args.order_id);
        builder.arg("amount_cents", &args.amount_cents);
        builder.arg("note", &args.note);
        builder
    }

    async fn refund(spec: &'static ToolSpec, args: Args) -> Result<Value, Error> {
        let call = builder(spec, &args).finish();
        let ops = Ops::new(Codec::<Value>::json(), |e| e);
        let body = async move {
            Attempt::Ran(
                async {
                    match args.order_id {
                        DECLINED => {
                            return Err(Error::ToolFailed {
                                tool: spec.name.to_owned(),
                                key: None,
                                message: "the provider declined the refund".to_owned(),
                            })
                        }
                        SLOW => tokio::time::sleep(Duration::from_millis(300)).await,
                        _ => {}
                    }
                    let run = effect(args.order_id);
                    Ok(json!({"order_id": args.order_id, "refunded_cents": args.amount_cents, "run": run}))
                }
                .await,
            )
        };
        execute_with(call, ops, move || body, None, false).await
    }

    fn invoke<'a>(
        spec: &'static ToolSpec,
        schema: &'static SchemaCell,
        args: CallArgs<'a>,
    ) -> BoxFuture<'a, Result<CallResult, Error>> {
        Box::pin(async move {
            let args: Args = decode_tool_input(spec, schema, refund_schema, &args)?;
            refund(spec, args).await.map(CallResult::Value)
        })
    }

    fn refund_invoke<'a>(
        _: &'a Context,
        args: CallArgs<'a>,
    ) -> BoxFuture<'a, Result<CallResult, Error>> {
        static SCHEMA: SchemaCell = SchemaCell::new();
        invoke(&REFUND_SPEC, &SCHEMA, args)
    }

    fn brief_invoke<'a>(
        _: &'a Context,
        args: CallArgs<'a>,
    ) -> BoxFuture<'a, Result<CallResult, Error>> {
        static SCHEMA: SchemaCell = SchemaCell::new();
        invoke(&BRIEF_SPEC, &SCHEMA, args)
    }

    fn refund_key(args: &Value) -> Result<String, Error> {
        let args: Args = decode_args(&REFUND_SPEC, args)?;
        builder(&REFUND_SPEC, &args).key()
    }

    fn brief_key(args: &Value) -> Result<String, Error> {
        let args: Args = decode_args(&BRIEF_SPEC, args)?;
        builder(&BRIEF_SPEC, &args).key()
    }

    fn refund_schema() -> Value {
        json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {
                "order_id": {"type": "integer", "minimum": 0},
                "amount_cents": {"type": "integer", "minimum": 0},
                "note": {"type": "string"}
            },
            "required": ["order_id", "amount_cents", "note"],
            "additionalProperties": false
        })
    }

    fn no_output() -> Option<Value> {
        None
    }

    pub(crate) static REFUND: ToolDescriptor = ToolDescriptor::new(
        &REFUND_SPEC,
        Some(refund_key),
        refund_invoke,
        refund_schema,
        no_output,
    );

    pub(crate) static BRIEF: ToolDescriptor = ToolDescriptor::new(
        &BRIEF_SPEC,
        Some(brief_key),
        brief_invoke,
        refund_schema,
        no_output,
    );
}

use fixtures::{effects, DECLINED, SLOW};

fn registry() -> Registry {
    Registry::from_tools([&fixtures::REFUND, &fixtures::BRIEF]).unwrap()
}

/// The router with decisions on, `by` from the body, and the `x-tenant` header as the
/// tenant when sent.
fn app() -> Router {
    tools().into_router()
}

fn tools() -> HttpTools {
    HttpTools::new(registry())
        .with_store(MemoryStore::new())
        .with_tenant(|parts| {
            Ok(parts
                .headers
                .get("x-tenant")
                .and_then(|t| t.to_str().ok())
                .map(str::to_owned))
        })
        .with_approver(|_| Ok(None))
}

fn refund(order_id: u64, note: &str) -> Value {
    json!({"order_id": order_id, "amount_cents": 2500, "note": note})
}

fn post_json(path: &str, body: Value) -> Request<Body> {
    Request::post(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

/// A browser's post of a form from a page of this origin.
fn browser_form(path: &str, body: &str) -> Request<Body> {
    Request::post(path)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(header::ACCEPT, BROWSER_ACCEPT)
        .header("sec-fetch-site", "same-origin")
        .body(Body::from(body.to_owned()))
        .unwrap()
}

const BROWSER_ACCEPT: &str = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";

fn get(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).unwrap()
}

fn page(path: &str) -> Request<Body> {
    Request::get(path)
        .header(header::ACCEPT, BROWSER_ACCEPT)
        .body(Body::empty())
        .unwrap()
}

fn as_tenant(tenant: &str, mut request: Request<Body>) -> Request<Body> {
    request
        .headers_mut()
        .insert("x-tenant", tenant.parse().unwrap());
    request
}

fn decide(path: &str, verb: &str, body: Value) -> Request<Body> {
    post_json(&format!("{path}/{verb}"), body)
}

/// Asks for a refund; the `202`'s `Location`, checked.
async fn ask(app: &Router, request: Request<Body>) -> String {
    let answer = send(app, request).await;
    assert_eq!(answer.status, StatusCode::ACCEPTED, "{}", answer.text);
    let location = answer.header("location").expect("a Location").to_owned();
    assert_eq!(answer.header("content-location"), Some(location.as_str()));
    assert_eq!(
        answer.json()["state"],
        "awaiting_approval",
        "{}",
        answer.text
    );
    location
}

fn state(answer: &Answer) -> Value {
    answer.json()["state"].clone()
}

#[tokio::test]
async fn a_call_awaiting_approval_is_202_with_its_operation_and_a_browser_is_sent_to_its_page() {
    let app = app();
    let answer = send(&app, post_json("/tools/refund", refund(1, "hi"))).await;
    assert_eq!(answer.status, StatusCode::ACCEPTED, "{}", answer.text);
    let location = answer.header("location").unwrap().to_owned();
    let key = location.rsplit('/').next().unwrap().to_owned();
    assert_eq!(location, format!("/operations/{key}"));
    assert_eq!(answer.header("content-type"), Some("application/json"));
    assert_eq!(answer.header("cache-control"), Some("no-store"));
    let doc = answer.json();
    assert_eq!(doc["key"], key);
    assert_eq!(doc["tool"], "refund");
    assert_eq!(doc["approval"]["state"], "pending", "{doc}");
    assert!(
        doc.get("arguments").is_none(),
        "the document never holds arguments"
    );
    assert_eq!(
        answer.header(OUTCOME_HEADER),
        None,
        "nothing ran: no outcome"
    );

    // Asked again: the same request, still nothing ran; the JSON read agrees.
    assert_eq!(
        ask(&app, post_json("/tools/refund", refund(1, "hi"))).await,
        location
    );
    let read = send(&app, get(&location)).await;
    assert_eq!(read.status, StatusCode::ACCEPTED, "{}", read.text);
    assert_eq!(read.json(), doc);
    assert_eq!(effects(1), 0);

    // A browser's form post: the usual 303 to the operation page.
    let posted = send(
        &app,
        browser_form("/tools/refund", "order_id=1&amount_cents=2500&note=hi"),
    )
    .await;
    assert_eq!(posted.status, StatusCode::SEE_OTHER, "{}", posted.text);
    assert_eq!(posted.header("location"), Some(location.as_str()));
    assert_eq!(effects(1), 0);
}

#[tokio::test]
async fn approving_continues_the_call_once_and_answers_its_operation() {
    let app = app();
    let location = ask(&app, post_json("/tools/refund", refund(2, "damaged"))).await;
    let approved = send(&app, decide(&location, "approve", json!({"by": "alice"}))).await;
    assert_eq!(approved.status, StatusCode::OK, "{}", approved.text);
    assert_eq!(approved.header("content-location"), Some(location.as_str()));
    assert_eq!(approved.header(OUTCOME_HEADER), Some("executed"));
    let doc = approved.json();
    assert_eq!(doc["state"], "completed", "{doc}");
    assert_eq!(
        doc["result"],
        json!({"order_id": 2, "refunded_cents": 2500, "run": 1})
    );
    let decision = &doc["approval"]["decision"];
    assert_eq!(decision["verdict"], "approved");
    assert_eq!(decision["by"], "alice");
    assert_eq!(decision["channel"], "http");
    assert!(decision["at"].as_str().is_some(), "{decision}");
    assert_eq!(effects(2), 1, "approving ran the call");

    // The agent's retry replays it; the read agrees byte for byte.
    let retry = send(&app, post_json("/tools/refund", refund(2, "damaged"))).await;
    assert_eq!(retry.status, StatusCode::SEE_OTHER, "{}", retry.text);
    assert_eq!(retry.header("location"), Some(location.as_str()));
    assert_eq!(retry.header(OUTCOME_HEADER), Some("replayed"));
    let read = send(&app, get(&location)).await;
    assert_eq!(read.status, StatusCode::OK);
    assert_eq!(read.text, approved.text);

    // A double click answers the stored decision and runs nothing again.
    let again = send(&app, decide(&location, "approve", json!({"by": "bob"}))).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.text);
    assert_eq!(again.json()["approval"]["decision"]["by"], "alice");
    assert_eq!(again.header(OUTCOME_HEADER), Some("replayed"));
    // The other decision is refused: the first stands.
    let deny = send(
        &app,
        decide(&location, "deny", json!({"by": "mallory", "reason": "no"})),
    )
    .await;
    let problem = deny.problem(ProblemType::NoPendingApproval);
    assert_eq!(problem["operation"], location);
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("already approved by alice"),
        "{problem}"
    );
    assert_eq!(effects(2), 1);
}

#[tokio::test]
async fn an_approval_and_agents_retrying_at_the_same_moment_run_the_call_once() {
    let app = app();
    let location = ask(&app, post_json("/tools/refund", refund(SLOW, ""))).await;
    // Two people approve and eight agent retries arrive while the approved call runs.
    let mut tasks = Vec::new();
    for who in ["alice", "bob"] {
        let (app, location) = (app.clone(), location.clone());
        tasks.push(tokio::spawn(async move {
            send(&app, decide(&location, "approve", json!({"by": who}))).await
        }));
    }
    // Retries every 50 ms, before the decision and while the approved call runs (300 ms).
    for i in 0..8 {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50 * i)).await;
            send(&app, post_json("/tools/refund", refund(SLOW, ""))).await
        }));
    }
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.unwrap().status);
    }
    assert_eq!(effects(SLOW), 1, "the body ran once: {statuses:?}");
    // The approvals ran or replayed it; each retry awaited, waited for it, or replayed it.
    for status in &statuses[..2] {
        assert_eq!(*status, StatusCode::OK, "{statuses:?}");
    }
    for status in &statuses[2..] {
        assert!(
            [StatusCode::ACCEPTED, StatusCode::SEE_OTHER].contains(status),
            "{statuses:?}"
        );
    }
    assert!(
        statuses[2..].contains(&StatusCode::SEE_OTHER),
        "some retry arrived while the approved call ran: {statuses:?}"
    );
    let read = send(&app, get(&location)).await;
    assert_eq!(read.status, StatusCode::OK, "{}", read.text);
    assert_eq!(read.json()["result"]["run"], 1);
}

#[tokio::test]
async fn a_call_made_with_an_idempotency_key_is_continued_under_that_key() {
    let app = app();
    let keyed = |id: &str| {
        let mut request = post_json("/tools/refund", refund(3, ""));
        request
            .headers_mut()
            .insert("idempotency-key", id.parse().unwrap());
        request
    };
    let location = ask(&app, keyed("click-1")).await;
    let plain = ask(&app, post_json("/tools/refund", refund(3, ""))).await;
    assert_ne!(location, plain, "the client key narrows the intent");
    let approved = send(&app, decide(&location, "approve", json!({"by": "alice"}))).await;
    assert_eq!(approved.status, StatusCode::OK, "{}", approved.text);
    assert_eq!(state(&approved), "completed", "{}", approved.text);
    assert_eq!(effects(3), 1);
    let retry = send(&app, keyed("click-1")).await;
    assert_eq!(retry.status, StatusCode::SEE_OTHER, "{}", retry.text);
    assert_eq!(retry.header("location"), Some(location.as_str()));
    assert_eq!(retry.header(OUTCOME_HEADER), Some("replayed"));
    // The other intent still waits.
    assert_eq!(state(&send(&app, get(&plain)).await), "awaiting_approval");
    assert_eq!(effects(3), 1);
}

#[tokio::test]
async fn a_denial_needs_a_reason_and_is_replayed_as_403_with_who_and_why() {
    let app = app();
    let location = ask(&app, post_json("/tools/refund", refund(4, ""))).await;
    for body in [
        json!({"by": "alice"}),
        json!({"by": "alice", "reason": "  "}),
    ] {
        let refused = send(&app, decide(&location, "deny", body)).await;
        let doc = refused.problem(ProblemType::InvalidArguments);
        assert_eq!(doc["field"], "reason");
    }
    assert_eq!(
        state(&send(&app, get(&location)).await),
        "awaiting_approval"
    );

    let denied = send(
        &app,
        decide(
            &location,
            "deny",
            json!({"by": "alice", "reason": "the customer kept the goods"}),
        ),
    )
    .await;
    assert_eq!(denied.status, StatusCode::OK, "{}", denied.text);
    assert_eq!(denied.header(OUTCOME_HEADER), None);
    let doc = denied.json();
    assert_eq!(doc["state"], "denied");
    assert_eq!(
        doc["approval"]["decision"]["reason"],
        "the customer kept the goods"
    );

    for _ in 0..3 {
        let retry = send(&app, post_json("/tools/refund", refund(4, ""))).await;
        let problem = retry.problem(ProblemType::Denied);
        assert_eq!(problem["by"], "alice");
        assert_eq!(problem["channel"], "http");
        assert_eq!(problem["reason"], "the customer kept the goods");
        assert_eq!(problem["operation"], location);
        assert_eq!(problem["decided_at"], doc["approval"]["decision"]["at"]);
        assert_eq!(problem["code"], "denied");
    }
    let read = send(&app, get(&location)).await;
    assert_eq!(read.status, StatusCode::FORBIDDEN);
    assert_eq!(state(&read), "denied");
    // Denying again answers the denial; approving is refused.
    let again = send(
        &app,
        decide(&location, "deny", json!({"by": "bob", "reason": "x"})),
    )
    .await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.json()["approval"]["decision"]["by"], "alice");
    send(&app, decide(&location, "approve", json!({"by": "bob"})))
        .await
        .problem(ProblemType::NoPendingApproval);
    assert_eq!(effects(4), 0);

    // A browser that posts the refund again gets the denial as a page.
    let posted = send(
        &app,
        browser_form("/tools/refund", "order_id=4&amount_cents=2500&note="),
    )
    .await;
    assert_eq!(posted.status, StatusCode::FORBIDDEN);
    assert!(
        posted.text.contains("the customer kept the goods"),
        "{}",
        posted.text
    );
    assert_eq!(effects(4), 0);
}

#[tokio::test]
async fn nothing_pending_is_409_and_a_key_this_reader_cannot_see_is_404() {
    let app = app();
    // Never asked: a key with no operation at all.
    let nothing = format!("/operations/{}", "0".repeat(64));
    send(&app, decide(&nothing, "approve", json!({"by": "alice"})))
        .await
        .problem(ProblemType::OperationNotFound);
    // Asked, but the request expired unanswered: 409, nothing decided.
    let location = ask(&app, post_json("/tools/brief", refund(5, ""))).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let late = send(&app, decide(&location, "approve", json!({"by": "alice"}))).await;
    let doc = late.problem(ProblemType::NoPendingApproval);
    assert!(
        doc["detail"]
            .as_str()
            .unwrap()
            .contains("expired unanswered"),
        "{doc}"
    );
    assert_eq!(effects(5), 0);
    // The next call asks again, and that request can be approved.
    assert_eq!(
        ask(&app, post_json("/tools/brief", refund(5, ""))).await,
        location
    );
    let approved = send(&app, decide(&location, "approve", json!({"by": "alice"}))).await;
    assert_eq!(state(&approved), "completed", "{}", approved.text);
    assert_eq!(effects(5), 1);
}

#[tokio::test]
async fn decisions_keep_the_tenant_scope() {
    let app = app();
    let location = ask(
        &app,
        as_tenant("acme", post_json("/tools/refund", refund(6, ""))),
    )
    .await;
    for request in [
        as_tenant(
            "globex",
            decide(&location, "approve", json!({"by": "mallory"})),
        ),
        decide(&location, "approve", json!({"by": "mallory"})),
        as_tenant(
            "globex",
            decide(&location, "deny", json!({"by": "mallory", "reason": "x"})),
        ),
    ] {
        send(&app, request)
            .await
            .problem(ProblemType::OperationNotFound);
    }
    assert_eq!(effects(6), 0);
    let approved = send(
        &app,
        as_tenant("acme", decide(&location, "approve", json!({"by": "alice"}))),
    )
    .await;
    assert_eq!(state(&approved), "completed", "{}", approved.text);
    assert_eq!(effects(6), 1);
    // Continued in acme's scope: acme's retry replays it, globex's is another intent.
    let retry = send(
        &app,
        as_tenant("acme", post_json("/tools/refund", refund(6, ""))),
    )
    .await;
    assert_eq!(retry.header(OUTCOME_HEADER), Some("replayed"));
    let other = ask(
        &app,
        as_tenant("globex", post_json("/tools/refund", refund(6, ""))),
    )
    .await;
    assert_ne!(other, location);
    assert_eq!(effects(6), 1);
}

#[tokio::test]
async fn a_cross_site_decision_is_403_and_decides_nothing() {
    let app = app();
    let location = ask(&app, post_json("/tools/refund", refund(7, ""))).await;
    for verb in ["approve", "deny"] {
        let mut request = browser_form(&format!("{location}/{verb}"), "by=mallory&reason=x");
        request
            .headers_mut()
            .insert("sec-fetch-site", "cross-site".parse().unwrap());
        let answer = send(&app, request).await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN);
        assert!(answer.text.contains("another origin"), "{}", answer.text);
    }
    let mut request = decide(&location, "approve", json!({"by": "mallory"}));
    request
        .headers_mut()
        .insert(header::ORIGIN, "https://evil.example".parse().unwrap());
    request
        .headers_mut()
        .insert(header::HOST, "shop.example".parse().unwrap());
    send(&app, request).await.problem(ProblemType::CrossOrigin);
    assert_eq!(
        state(&send(&app, get(&location)).await),
        "awaiting_approval"
    );
    assert_eq!(effects(7), 0);
}

#[tokio::test]
async fn without_an_approver_decisions_are_refused_and_the_page_has_no_forms() {
    let app = HttpTools::new(registry())
        .with_store(MemoryStore::new())
        .into_router();
    let location = ask(&app, post_json("/tools/refund", refund(8, ""))).await;
    for verb in ["approve", "deny"] {
        let answer = send(
            &app,
            decide(&location, verb, json!({"by": "agent", "reason": "x"})),
        )
        .await;
        let doc = answer.problem(ProblemType::DecisionsDisabled);
        assert!(
            doc["detail"].as_str().unwrap().contains("with_approver"),
            "{doc}"
        );
    }
    let shown = send(&app, page(&location)).await;
    assert!(!shown.text.contains("<form"), "{}", shown.text);
    assert!(
        shown.text.contains("tool-contracts approve"),
        "{}",
        shown.text
    );
    assert_eq!(
        state(&send(&app, get(&location)).await),
        "awaiting_approval"
    );
    assert_eq!(effects(8), 0);
}

#[tokio::test]
async fn the_approver_function_names_the_decider_or_refuses() {
    let app = HttpTools::new(registry())
        .with_store(MemoryStore::new())
        .with_approver(
            |parts| match parts.headers.get("x-user").map(|u| u.to_str()) {
                Some(Ok("agent")) => Err(Problem::from_status(StatusCode::FORBIDDEN)
                    .with_detail("agents do not approve")
                    .into()),
                Some(Ok(user)) => Ok(Some(user.to_owned())),
                _ => Err(Problem::from_status(StatusCode::UNAUTHORIZED).into()),
            },
        )
        .into_router();
    let location = ask(&app, post_json("/tools/refund", refund(9, ""))).await;
    let with_user = |user: &str, mut request: Request<Body>| {
        request
            .headers_mut()
            .insert("x-user", user.parse().unwrap());
        request
    };
    let refused = send(
        &app,
        with_user(
            "agent",
            decide(&location, "approve", json!({"by": "alice"})),
        ),
    )
    .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert_eq!(refused.json()["detail"], "agents do not approve");
    let anonymous = send(&app, decide(&location, "approve", json!({"by": "alice"}))).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    assert_eq!(effects(9), 0);

    // The page: no forms for the agent, forms without a name field for a person.
    let agent_page = send(&app, with_user("agent", page(&location))).await;
    assert!(!agent_page.text.contains("<form"), "{}", agent_page.text);
    let carol_page = send(&app, with_user("carol", page(&location))).await;
    assert!(carol_page
        .text
        .contains("Deciding as <strong>carol</strong>"));
    assert!(carol_page.text.contains("id=\"approve-form\""));
    assert!(
        !carol_page.text.contains("name=\"by\""),
        "{}",
        carol_page.text
    );

    // The authenticated name is who decided, whatever the body says.
    let approved = send(
        &app,
        with_user(
            "carol",
            decide(&location, "approve", json!({"by": "alice"})),
        ),
    )
    .await;
    assert_eq!(approved.status, StatusCode::OK, "{}", approved.text);
    assert_eq!(approved.json()["approval"]["decision"]["by"], "carol");
    assert_eq!(effects(9), 1);
}

#[tokio::test]
async fn decision_bodies_are_checked_and_decide_nothing_when_wrong() {
    let app = app();
    let location = ask(&app, post_json("/tools/refund", refund(10, ""))).await;
    let approve = format!("{location}/approve");
    let cases: Vec<(Request<Body>, &str)> = vec![
        (post_json(&approve, json!({})), "by"),
        (post_json(&approve, json!({"by": ""})), "by"),
        (post_json(&approve, json!({"by": "eve\n"})), "by"),
        (
            post_json(&approve, json!({"by": "alice", "as": "root"})),
            "body",
        ),
        (post_json(&approve, json!(["alice"])), "body"),
        (
            Request::post(&approve)
                .header(header::CONTENT_TYPE, "text/plain")
                .body(Body::from("alice"))
                .unwrap(),
            "body",
        ),
        (browser_form(&approve, "by=alice&by=bob"), "by"),
        (browser_form(&approve, "by=alice&role=admin"), "role"),
        (browser_form(&approve, "by="), "by"),
        (
            post_json(
                &format!("{location}/deny"),
                json!({"by": "alice", "reason": "x".repeat(1025)}),
            ),
            "reason",
        ),
    ];
    for (request, field) in cases {
        let answer = send(&app, request).await;
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "{field}: {}",
            answer.text
        );
        if answer.header("content-type") == Some(super::PROBLEM_JSON) {
            assert_eq!(answer.json()["field"], field, "{}", answer.text);
        }
    }
    assert_eq!(
        state(&send(&app, get(&location)).await),
        "awaiting_approval"
    );
    // A form is a decision too (a browser's: `303` to the page).
    let approved = send(&app, browser_form(&approve, "by=alice+smith")).await;
    assert_eq!(approved.status, StatusCode::SEE_OTHER, "{}", approved.text);
    assert_eq!(approved.header("location"), Some(location.as_str()));
    assert_eq!(approved.header(OUTCOME_HEADER), Some("executed"));
    assert_eq!(effects(10), 1);
}

#[tokio::test]
async fn the_page_shows_the_arguments_and_forms_then_who_decided_all_escaped() {
    let app = app();
    let note = "<script>alert('x')</script> & \"ring\"";
    let location = ask(&app, post_json("/tools/refund", refund(11, note))).await;
    let shown = send(&app, page(&location)).await;
    assert_eq!(shown.status, StatusCode::ACCEPTED);
    assert_eq!(
        shown.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    let text = &shown.text;
    assert!(text.contains("data-state=\"awaiting_approval\""), "{text}");
    assert!(text.contains("<code>refund</code>"), "{text}");
    assert!(text.contains("id=\"arguments\""), "{text}");
    assert!(
        text.contains(
            "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; \\&quot;ring\\&quot;"
        ),
        "{text}"
    );
    assert!(!text.contains("<script>"), "{text}");
    assert!(
        text.contains(&format!("action=\"{location}/approve\"")),
        "{text}"
    );
    assert!(
        text.contains(&format!("action=\"{location}/deny\"")),
        "{text}"
    );
    assert!(text.contains("name=\"reason\" required"), "{text}");
    assert!(
        !text.contains("http-equiv=\"refresh\""),
        "a half-typed reason is not wiped"
    );

    let denied = send(
        &app,
        browser_form(
            &format!("{location}/deny"),
            "by=%3Cb%3Ealice%3C%2Fb%3E&reason=not+%3Cb%3Eours%3C%2Fb%3E",
        ),
    )
    .await;
    assert_eq!(denied.status, StatusCode::SEE_OTHER, "{}", denied.text);
    let shown = send(&app, page(&location)).await;
    assert_eq!(shown.status, StatusCode::FORBIDDEN);
    let text = &shown.text;
    assert!(text.contains("data-state=\"denied\""), "{text}");
    assert!(
        text.contains("<dd id=\"decided-by\">&lt;b&gt;alice&lt;/b&gt;</dd>"),
        "{text}"
    );
    assert!(text.contains("<dd id=\"decided-via\">http</dd>"), "{text}");
    assert!(
        text.contains("<dd id=\"decision-reason\">not &lt;b&gt;ours&lt;/b&gt;</dd>"),
        "{text}"
    );
    assert!(text.contains("id=\"decided-at\""), "{text}");
    assert!(!text.contains("<form"), "decided: no forms");
    assert!(!text.contains("id=\"arguments\""), "{text}");
}

#[tokio::test]
async fn an_approved_call_that_fails_is_released_and_stays_approved() {
    let app = app();
    let location = ask(&app, post_json("/tools/refund", refund(DECLINED, ""))).await;
    let approved = send(&app, decide(&location, "approve", json!({"by": "alice"}))).await;
    assert_eq!(approved.status, StatusCode::OK, "{}", approved.text);
    assert_eq!(approved.header(OUTCOME_HEADER), None);
    // Released (the tool does not store its errors): the approval stands, and the
    // agent's retry gets the tool's own error.
    assert_eq!(state(&approved), "approved");
    let retry = send(&app, post_json("/tools/refund", refund(DECLINED, ""))).await;
    retry.problem(ProblemType::ToolFailed);
}

#[tokio::test]
async fn nested_under_a_prefix_the_forms_and_links_keep_it() {
    let app = Router::new().nest("/api", app());
    let answer = send(&app, post_json("/api/tools/refund", refund(12, ""))).await;
    assert_eq!(answer.status, StatusCode::ACCEPTED, "{}", answer.text);
    let location = answer.header("location").unwrap().to_owned();
    assert!(location.starts_with("/api/operations/"), "{location}");
    let shown = send(&app, page(&location)).await;
    assert!(
        shown
            .text
            .contains(&format!("action=\"{location}/approve\"")),
        "{}",
        shown.text
    );
    let approved = send(
        &app,
        browser_form(&format!("{location}/approve"), "by=alice"),
    )
    .await;
    assert_eq!(approved.header("location"), Some(location.as_str()));
    let json = send(&app, decide(&location, "approve", json!({"by": "alice"}))).await;
    assert_eq!(json.header("content-location"), Some(location.as_str()));
    assert_eq!(effects(12), 1);
}

#[tokio::test]
async fn the_openapi_document_describes_the_decision_routes() {
    let doc = send(&app(), get("/openapi.json")).await.json();
    for (path, id) in [
        ("/operations/{key}/approve", "approveOperation"),
        ("/operations/{key}/deny", "denyOperation"),
    ] {
        let op = &doc["paths"][path]["post"];
        assert_eq!(op["operationId"], id, "{path}");
        for status in ["200", "303", "400", "403", "404", "409"] {
            assert!(op["responses"].get(status).is_some(), "{path} {status}");
        }
    }
    let refund = &doc["paths"]["/tools/refund"]["post"]["responses"];
    assert_eq!(
        refund["202"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/Operation"
    );
    let states = &doc["components"]["schemas"]["Operation"]["properties"]["state"]["enum"];
    for state in ["awaiting_approval", "approved", "denied"] {
        assert!(
            states.as_array().unwrap().contains(&json!(state)),
            "{states}"
        );
    }
    assert!(doc["paths"]["/operations/{key}"]["get"]["responses"]["403"].is_object());
}

#[tokio::test]
async fn a_decision_route_takes_only_post() {
    let app = app();
    let location = ask(&app, post_json("/tools/refund", refund(13, ""))).await;
    let answer = send(&app, get(&format!("{location}/approve"))).await;
    answer.problem(ProblemType::MethodNotAllowed);
    assert_eq!(answer.header("allow"), Some("POST"));
    assert_eq!(
        state(&send(&app, get(&location)).await),
        "awaiting_approval"
    );
}
