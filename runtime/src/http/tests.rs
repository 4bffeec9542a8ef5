//! The router over hand-built tools and the real engine, driven with
//! `tower::ServiceExt::oneshot`: every status of the routes, the form mapping end to end,
//! tenants, prefixes and the OpenAPI document. (A real client, `curl` against
//! `examples/http_shop`, is `tests/http/curl.sh`.)

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use super::*;
use crate::store::{
    ClaimOutcome, ClaimRequest, Completion, HistoryEvent, MemoryStore, Record, ResolveRequest,
    StoreError, StoreResult,
};

mod fixtures {
    //! `place` (mutating, `concurrent = "reject"`, errors that leave the outcome unknown)
    //! and `seven` (read-only), built by hand as the attribute macros build tools.
    use core::time::Duration;
    use std::collections::HashMap;
    use std::sync::Mutex;

    use serde::{Deserialize, Serialize};
    use serde_json::{json, Value};

    use crate::__private::{
        decode_args, decode_tool_input, execute_with, Attempt, CallBuilder, Codec, Ops, SchemaCell,
    };
    use crate::error::Error;
    use crate::registry::{BoxFuture, CallArgs, CallResult, Context, ToolDescriptor};
    use crate::spec::{Concurrent, SourceLocation, ToolKind, ToolSpec};

    const HERE: SourceLocation = SourceLocation {
        module_path: module_path!(),
        file: file!(),
        line: line!(),
        column: 1,
    };

    /// User ids with a behaviour of their own.
    pub(crate) const CRASHES: u64 = 13;
    pub(crate) const SLOW: u64 = 14;
    pub(crate) const DECLINED: u64 = 15;

    static PLACE_SPEC: ToolSpec = ToolSpec {
        description: "Place an order.\nKeyed on the user and the cart.",
        concurrent: Concurrent::Reject,
        lease: Duration::from_secs(2),
        ..ToolSpec::fixture(
            "place",
            ToolKind::Mutating,
            &["cart.id", "user_id"],
            &["user_id", "cart", "note"],
            HERE,
        )
    };

    #[derive(Debug, Serialize, Deserialize)]
    pub(crate) struct Cart {
        pub(crate) id: String,
        #[serde(default)]
        pub(crate) express: bool,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Args {
        user_id: u64,
        cart: Cart,
        note: String,
    }

    #[derive(Debug, thiserror::Error)]
    enum Fail {
        #[error(transparent)]
        Contract(Error),
        #[error("card declined for user {0}")]
        Declined(u64),
        #[error("the connection dropped mid-call")]
        Crashed,
    }

    static EFFECTS: Mutex<Option<HashMap<u64, usize>>> = Mutex::new(None);

    /// How many times `place` ran for `user_id` (every test uses its own user ids).
    pub(crate) fn effects(user_id: u64) -> usize {
        let effects = EFFECTS.lock().unwrap_or_else(|p| p.into_inner());
        effects
            .as_ref()
            .and_then(|e| e.get(&user_id).copied())
            .unwrap_or(0)
    }

    fn effect(user_id: u64) -> usize {
        let mut effects = EFFECTS.lock().unwrap_or_else(|p| p.into_inner());
        let n = effects
            .get_or_insert_with(HashMap::new)
            .entry(user_id)
            .or_default();
        *n += 1;
        *n
    }

    fn builder(args: &Args) -> CallBuilder {
        let mut builder = CallBuilder::new(&PLACE_SPEC);
        builder.key_field("cart.id", &args.cart.id);
        builder.key_field("user_id", &args.user_id);
        builder.arg("user_id", &args.user_id);
        builder.arg("cart", &args.cart);
        builder.arg("note", &args.note);
        builder
    }

    async fn place(args: Args) -> Result<Value, Fail> {
        let call = builder(&args).finish();
        let ops = Ops::new(Codec::<Value>::json(), Fail::Contract);
        let body = async move {
            Attempt::Ran(
                async {
                    match args.user_id {
                        DECLINED => return Err(Fail::Declined(args.user_id)),
                        CRASHES => {
                            effect(args.user_id);
                            return Err(Fail::Crashed);
                        }
                        SLOW => tokio::time::sleep(Duration::from_millis(600)).await,
                        _ => {}
                    }
                    let run = effect(args.user_id);
                    Ok(json!({"user_id": args.user_id, "cart_id": args.cart.id, "run": run}))
                }
                .await,
            )
        };
        let crashed: fn(&Fail) -> bool = |e| matches!(e, Fail::Crashed);
        execute_with(call, ops, move || body, Some(crashed), false).await
    }

    fn place_invoke<'a>(
        _: &'a Context,
        args: CallArgs<'a>,
    ) -> BoxFuture<'a, Result<CallResult, Error>> {
        Box::pin(async move {
            static SCHEMA: SchemaCell = SchemaCell::new();
            let args: Args = decode_tool_input(&PLACE_SPEC, &SCHEMA, place_schema, &args)?;
            place(args)
                .await
                .map(CallResult::Value)
                .map_err(|e| match e {
                    Fail::Contract(e) => e,
                    other => Error::ToolFailed {
                        tool: "place".to_owned(),
                        key: None,
                        message: other.to_string(),
                    },
                })
        })
    }

    fn place_key(args: &Value) -> Result<String, Error> {
        let args: Args = decode_args(&PLACE_SPEC, args)?;
        builder(&args).key()
    }

    /// What schemars writes for `place`'s arguments.
    pub(crate) fn place_schema() -> Value {
        json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "place",
            "type": "object",
            "properties": {
                "user_id": {"type": "integer", "format": "uint64", "minimum": 0},
                "cart": {"$ref": "#/$defs/Cart"},
                "note": {"type": "string"}
            },
            "required": ["user_id", "cart", "note"],
            "additionalProperties": false,
            "$defs": {"Cart": {"type": "object", "properties": {
                "id": {"type": "string"},
                "express": {"type": "boolean", "default": false}
            }, "required": ["id"]}}
        })
    }

    fn place_output() -> Option<Value> {
        Some(json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "Receipt",
            "type": "object",
            "properties": {"user_id": {"type": "integer"}, "cart_id": {"type": "string"}, "run": {"type": "integer"}},
            "required": ["user_id", "cart_id", "run"]
        }))
    }

    pub(crate) static PLACE: ToolDescriptor = ToolDescriptor::new(
        &PLACE_SPEC,
        Some(place_key),
        place_invoke,
        place_schema,
        place_output,
    );

    static SEVEN_SPEC: ToolSpec = ToolSpec {
        description: "Seven.",
        ..ToolSpec::fixture("seven", ToolKind::ReadOnly, &[], &[], HERE)
    };

    fn seven_invoke<'a>(
        _: &'a Context,
        _: CallArgs<'a>,
    ) -> BoxFuture<'a, Result<CallResult, Error>> {
        Box::pin(async { Ok(Value::from(7).into()) })
    }

    fn seven_schema() -> Value {
        json!({"type": "object", "properties": {}})
    }

    fn seven_output() -> Option<Value> {
        Some(json!({"type": "integer"}))
    }

    pub(crate) static SEVEN: ToolDescriptor =
        ToolDescriptor::new(&SEVEN_SPEC, None, seven_invoke, seven_schema, seven_output);
}

use fixtures::{effects, CRASHES, DECLINED, SLOW};

fn registry() -> Registry {
    Registry::from_tools([&fixtures::PLACE, &fixtures::SEVEN]).unwrap()
}

/// The router on a store of its own.
fn app() -> (Router, Arc<MemoryStore>) {
    let store = Arc::new(MemoryStore::new());
    let router = HttpTools::new(registry())
        .with_store(Arc::clone(&store))
        .into_router();
    (router, store)
}

/// A router whose tenant is the `x-tenant` header (`401` without it).
fn tenant_app() -> Router {
    HttpTools::new(registry())
        .with_store(MemoryStore::new())
        .with_tenant(|parts| match parts.headers.get("x-tenant") {
            Some(tenant) => Ok(Some(tenant.to_str().unwrap_or("").to_owned())),
            None => Err(Problem::from_status(StatusCode::UNAUTHORIZED)
                .with_detail("send x-tenant")
                .into()),
        })
        .into_router()
}

pub(super) struct Answer {
    pub(super) status: StatusCode,
    pub(super) headers: HeaderMap,
    pub(super) text: String,
}

impl Answer {
    pub(super) fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("{e}: {}", self.text))
    }

    pub(super) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn location(&self) -> &str {
        self.header("location").expect("a Location")
    }

    /// A problem document, checked for its RFC 9457 shape; returns it.
    pub(super) fn problem(&self, kind: ProblemType) -> Value {
        assert_eq!(self.status, kind.status(), "{}", self.text);
        assert_eq!(
            self.header("content-type"),
            Some(PROBLEM_JSON),
            "{}",
            self.text
        );
        let doc = self.json();
        assert_eq!(doc["type"], kind.uri(), "{doc}");
        assert_eq!(doc["status"], kind.status().as_u16(), "{doc}");
        assert_eq!(doc["title"], kind.title(), "{doc}");
        assert!(
            doc["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{doc}"
        );
        doc
    }
}

pub(super) async fn send(app: &Router, request: Request<Body>) -> Answer {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        text: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

fn post_json(path: &str, body: Value) -> Request<Body> {
    Request::post(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn post_form(path: &str, body: &str) -> Request<Body> {
    Request::post(path)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(body.to_owned()))
        .unwrap()
}

fn get(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).unwrap()
}

fn order(user_id: u64, cart: &str, note: &str) -> Value {
    json!({"user_id": user_id, "cart": {"id": cart}, "note": note})
}

fn key_of(location: &str) -> &str {
    location.rsplit('/').next().unwrap()
}

#[tokio::test]
async fn a_call_redirects_to_its_operation_and_a_replay_to_the_same_one() {
    let (app, _) = app();
    let first = send(&app, post_json("/tools/place", order(101, "c-1", "hi"))).await;
    assert_eq!(first.status, StatusCode::SEE_OTHER, "{}", first.text);
    let location = first.location().to_owned();
    let key = key_of(&location);
    assert_eq!(location, format!("/operations/{key}"));
    assert_eq!(key.len(), 64, "{key}");
    assert_eq!(first.header(OUTCOME_HEADER), Some("executed"));
    assert_eq!(
        Some(key.to_owned()),
        fixtures::PLACE.key(&order(101, "c-1", "hi")).unwrap(),
        "the key a Rust or MCP call of the same intent gets"
    );

    let replay = send(&app, post_json("/tools/place", order(101, "c-1", "hi"))).await;
    assert_eq!(replay.status, StatusCode::SEE_OTHER);
    assert_eq!(replay.location(), location);
    assert_eq!(replay.header(OUTCOME_HEADER), Some("replayed"));
    assert_eq!(effects(101), 1);

    // The same intent as a form: the same key, nothing runs again.
    let form = send(
        &app,
        post_form("/tools/place", "user_id=101&cart.id=c-1&note=hi"),
    )
    .await;
    assert_eq!(form.status, StatusCode::SEE_OTHER, "{}", form.text);
    assert_eq!(form.location(), location);
    assert_eq!(effects(101), 1);

    // The tool's own route and the captured `/tools/{name}` (here reached by a
    // percent-encoded name) are one tool: the same key, nothing runs again.
    let encoded = send(&app, post_json("/tools/pl%61ce", order(101, "c-1", "hi"))).await;
    assert_eq!(encoded.status, StatusCode::SEE_OTHER, "{}", encoded.text);
    assert_eq!(encoded.location(), location);
    assert_eq!(encoded.header(OUTCOME_HEADER), Some("replayed"));
    assert_eq!(effects(101), 1);
    assert!(is_plain_segment("place") && is_plain_segment("a.b-c_d~1"));
    assert!(!is_plain_segment("") && !is_plain_segment("..") && !is_plain_segment("{x}"));

    for _ in 0..3 {
        let read = send(&app, get(&location)).await;
        assert_eq!(read.status, StatusCode::OK, "{}", read.text);
        assert_eq!(read.header("content-type"), Some("application/json"));
        assert_eq!(read.header("cache-control"), Some("no-store"));
        let doc = read.json();
        assert_eq!(doc["state"], "completed");
        assert_eq!(doc["key"], key);
        assert_eq!(doc["tool"], "place");
        assert_eq!(
            doc["result"],
            json!({"user_id": 101, "cart_id": "c-1", "run": 1})
        );
    }
    assert_eq!(effects(101), 1, "reads run nothing");

    let history = send(&app, get(&format!("{location}?history=true"))).await;
    let history = history.json();
    let kinds: Vec<&str> = history["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds.first(), Some(&"claimed"), "{history}");
    assert!(send(&app, get(&location))
        .await
        .json()
        .get("history")
        .is_none());
}

#[tokio::test]
async fn prefer_return_representation_answers_the_result_where_it_is_stored() {
    let (app, _) = app();
    let request = Request::post("/tools/place")
        .header(header::CONTENT_TYPE, "application/json")
        .header("prefer", "return=representation")
        .body(Body::from(order(102, "c-1", "").to_string()))
        .unwrap();
    let answer = send(&app, request).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    assert_eq!(
        answer.json(),
        json!({"user_id": 102, "cart_id": "c-1", "run": 1})
    );
    assert_eq!(
        answer.header("preference-applied"),
        Some("return=representation")
    );
    let location = answer.header("content-location").unwrap().to_owned();
    let read = send(&app, get(&location)).await;
    assert_eq!(
        read.json()["result"].to_string(),
        answer.text,
        "a retry of the POST and a GET agree, byte for byte"
    );
}

#[tokio::test]
async fn read_only_tools_answer_their_result_directly() {
    let (app, _) = app();
    let answer = send(&app, post_json("/tools/seven", json!({}))).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.json(), json!(7));
    assert!(answer.header("location").is_none());
    let empty = send(
        &app,
        Request::post("/tools/seven").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(
        empty.status,
        StatusCode::OK,
        "an empty body is no arguments"
    );
}

#[tokio::test]
async fn the_idempotency_key_header_narrows_a_call_as_the_mcp_client_key_does() {
    let (app, _) = app();
    let plain = send(&app, post_json("/tools/place", order(103, "c-1", ""))).await;
    let keyed = |key: &str| {
        Request::post("/tools/place")
            .header(header::CONTENT_TYPE, "application/json")
            .header(IDEMPOTENCY_KEY, key)
            .body(Body::from(order(103, "c-1", "").to_string()))
            .unwrap()
    };
    let a = send(&app, keyed("intent-a")).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);
    assert_ne!(
        a.location(),
        plain.location(),
        "another client key is another call"
    );
    assert_eq!(effects(103), 2);
    // Bare or as an RFC 8941 string: the same key.
    let again = send(&app, keyed("\"intent-a\"")).await;
    assert_eq!(again.location(), a.location());
    assert_eq!(again.header(OUTCOME_HEADER), Some("replayed"));
    assert_eq!(effects(103), 2);
    // Exactly the key MCP's `idempotencyKey: "intent-a"` makes: the scope `client:intent-a`.
    let expected = with_scope(crate::ambient::client_scope("intent-a"), async {
        fixtures::PLACE.key(&order(103, "c-1", ""))
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(key_of(a.location()), expected);
    // The link is followed without the key.
    let read = send(&app, get(a.location())).await;
    assert_eq!(read.status, StatusCode::OK, "{}", read.text);

    let too_long = send(&app, keyed(&"k".repeat(256))).await;
    let doc = too_long.problem(ProblemType::InvalidArguments);
    assert_eq!(doc["field"], "Idempotency-Key");
    assert_eq!(effects(103), 2);
}

#[tokio::test]
async fn another_tenants_operation_is_404_exactly_like_a_key_never_used() {
    let app = tenant_app();
    let as_tenant = |tenant: &str, request: Request<Body>| {
        let (mut parts, body) = request.into_parts();
        parts.headers.insert("x-tenant", tenant.parse().unwrap());
        Request::from_parts(parts, body)
    };
    let made = send(
        &app,
        as_tenant("acme", post_json("/tools/place", order(104, "c-1", ""))),
    )
    .await;
    assert_eq!(made.status, StatusCode::SEE_OTHER, "{}", made.text);
    let location = made.location().to_owned();
    let own = send(&app, as_tenant("acme", get(&location))).await;
    assert_eq!(own.status, StatusCode::OK);
    let foreign = send(&app, as_tenant("globex", get(&location))).await;
    let foreign = foreign.problem(ProblemType::OperationNotFound);
    let never = format!("/operations/{}", "0".repeat(64));
    let never = send(&app, as_tenant("acme", get(&never))).await;
    let never = never.problem(ProblemType::OperationNotFound);
    assert_eq!(
        foreign["detail"]
            .as_str()
            .unwrap()
            .replace(key_of(&location), "K"),
        never["detail"]
            .as_str()
            .unwrap()
            .replace(&"0".repeat(64), "K"),
        "nothing tells a foreign key from one never used"
    );
    // The same intent in another tenant is another call.
    let other = send(
        &app,
        as_tenant("globex", post_json("/tools/place", order(104, "c-1", ""))),
    )
    .await;
    assert_ne!(other.location(), location);
    assert_eq!(effects(104), 2);

    // The tenant function's refusal is the answer; nothing runs.
    let refused = send(&app, post_json("/tools/place", order(104, "c-2", ""))).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    assert_eq!(refused.json()["type"], "about:blank");
    let refused = send(&app, get(&location)).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    assert_eq!(effects(104), 2);
    // A scope the tenant function should never give is the server's fault.
    let bad = send(
        &app,
        as_tenant("", post_json("/tools/place", order(104, "c-3", ""))),
    )
    .await;
    bad.problem(ProblemType::Misconfigured);
    assert_eq!(effects(104), 2);
}

#[tokio::test]
async fn invalid_arguments_are_400_naming_the_field_and_run_nothing() {
    let (app, _) = app();
    let cases = [
        (
            post_json(
                "/tools/place",
                json!({"user_id": "x", "cart": {"id": "c"}, "note": ""}),
            ),
            Some("user_id"),
        ),
        (
            post_json(
                "/tools/place",
                json!({"user_id": 105, "cart": {"id": "c", "gift": 1}, "note": ""}),
            ),
            Some("cart.gift"),
        ),
        (post_json("/tools/place", json!([1])), None),
        (
            post_form("/tools/place", "user_id=seven&cart.id=c&note="),
            Some("user_id"),
        ),
        (
            post_form(
                "/tools/place",
                "user_id=105&cart.id=c&cart.express=maybe&note=",
            ),
            Some("cart.express"),
        ),
        (
            post_form("/tools/place", "user_id=105&cart.idd=c&note="),
            Some("cart.idd"),
        ),
        (
            Request::post("/tools/place")
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from("{\"user_id\": 105,"))
                .unwrap(),
            None,
        ),
        // Not UTF-8, so not JSON (RFC 8259 section 8.1): refused before the registry.
        (
            Request::post("/tools/place")
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(&b"{\"user_id\": 105, \"note\": \"\xff\"}"[..]))
                .unwrap(),
            None,
        ),
        // Escaped member names are names: `c\u0061rt` is `cart`, and its `gift` refused.
        (
            Request::post("/tools/place")
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(
                    r#"{"user_id": 105, "c\u0061rt": {"id": "c", "g\u0069ft": 1}, "note": ""}"#,
                ))
                .unwrap(),
            Some("cart.gift"),
        ),
    ];
    for (request, field) in cases {
        let answer = send(&app, request).await;
        let doc = answer.problem(ProblemType::InvalidArguments);
        assert_eq!(doc["code"], "invalid_arguments");
        assert_eq!(doc["tool"], "place");
        assert_eq!(doc.get("field").and_then(Value::as_str), field, "{doc}");
    }
    // A form with a checkbox: converted by the schema, and a valid call.
    let ok = send(
        &app,
        post_form(
            "/tools/place",
            "user_id=105&cart.id=c&cart.express=false&cart.express=on&note=",
        ),
    )
    .await;
    assert_eq!(ok.status, StatusCode::SEE_OTHER, "{}", ok.text);
    assert_eq!(effects(105), 1);
}

#[tokio::test]
async fn an_unknown_tool_is_404_with_the_closest_name() {
    let (app, _) = app();
    let doc = send(&app, post_json("/tools/plaec", json!({})))
        .await
        .problem(ProblemType::UnknownTool);
    assert_eq!(doc["suggestion"], "place");
    assert!(doc["detail"]
        .as_str()
        .unwrap()
        .contains("did you mean `place`"));
}

#[tokio::test]
async fn a_duplicate_of_a_running_call_is_409_and_its_operation_202() {
    let (app, _) = app();
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, post_json("/tools/place", order(SLOW, "c-1", ""))).await }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let second = send(&app, post_json("/tools/place", order(SLOW, "c-1", ""))).await;
    let doc = second.problem(ProblemType::InProgress);
    let retry: u64 = second.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry), "{retry}");
    let operation = doc["operation"].as_str().unwrap().to_owned();
    assert_eq!(doc["key"], key_of(&operation));

    let running = send(&app, get(&operation)).await;
    assert_eq!(running.status, StatusCode::ACCEPTED, "{}", running.text);
    assert_eq!(running.json()["state"], "in_progress");
    let retry: u64 = running.header("retry-after").unwrap().parse().unwrap();
    assert!(retry >= 1, "{retry}");

    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::SEE_OTHER);
    assert_eq!(first.location(), operation);
    assert_eq!(send(&app, get(&operation)).await.status, StatusCode::OK);
    assert_eq!(effects(SLOW), 1);
}

#[tokio::test]
async fn a_key_reused_with_other_arguments_is_422_naming_them() {
    let (app, _) = app();
    let first = send(&app, post_json("/tools/place", order(106, "c-1", "a"))).await;
    let changed = send(&app, post_json("/tools/place", order(106, "c-1", "b"))).await;
    let doc = changed.problem(ProblemType::KeyReused);
    assert_eq!(doc["params"], json!(["note"]));
    assert_eq!(doc["key_fields"], json!(["cart.id", "user_id"]));
    assert_eq!(doc["operation"], first.location());
    assert_eq!(effects(106), 1);
}

#[tokio::test]
async fn a_tool_error_is_422_and_leaves_no_operation() {
    let (app, _) = app();
    let answer = send(&app, post_json("/tools/place", order(DECLINED, "c-1", ""))).await;
    let doc = answer.problem(ProblemType::ToolFailed);
    assert!(
        doc["detail"].as_str().unwrap().contains("card declined"),
        "{doc}"
    );
    assert!(doc.get("operation").is_none(), "released: nothing to read");
    let key = doc["key"].as_str().unwrap();
    let read = send(&app, get(&format!("/operations/{key}"))).await;
    read.problem(ProblemType::OperationNotFound);
}

#[tokio::test]
async fn an_unknown_outcome_is_500_on_the_retry_and_on_the_operation() {
    let (app, _) = app();
    let first = send(&app, post_json("/tools/place", order(CRASHES, "c-1", ""))).await;
    first.problem(ProblemType::ToolFailed);
    let retry = send(&app, post_json("/tools/place", order(CRASHES, "c-1", ""))).await;
    let doc = retry.problem(ProblemType::OutcomeUnknown);
    assert_eq!(effects(CRASHES), 1, "never a second run");
    let operation = doc["operation"].as_str().unwrap();
    let read = send(&app, get(operation)).await;
    assert_eq!(
        read.status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "{}",
        read.text
    );
    assert_eq!(read.header("content-type"), Some("application/json"));
    assert_eq!(read.json()["state"], "unknown");
}

#[tokio::test]
async fn a_stored_error_is_read_with_422() {
    let (app, store) = app();
    let request = ClaimRequest {
        key: "k-failed",
        tool: "place",
        version: 1,
        scope: None,
        fingerprint: "f",
        args: "{}",
        lease: Duration::from_secs(30),
        ttl: Duration::from_secs(60),
        worker: "w",
    };
    let ClaimOutcome::Acquired { token } = store.claim(request).await.unwrap() else {
        panic!("fresh key");
    };
    let completion = Completion {
        result: r#"{"code":"declined"}"#,
        is_error: true,
        ttl: Duration::from_secs(60),
    };
    store.complete("k-failed", token, completion).await.unwrap();
    let read = send(&app, get("/operations/k-failed")).await;
    assert_eq!(
        read.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        read.text
    );
    assert_eq!(read.json()["state"], "failed");
    assert_eq!(read.json()["error"], json!({"code": "declined"}));
}

/// A store that is down: every operation fails.
pub(super) struct DownStore;

fn down<T>() -> StoreResult<T> {
    Err(StoreError::unavailable_message("connection refused"))
}

#[async_trait::async_trait]
impl Store for DownStore {
    async fn claim(&self, _: ClaimRequest<'_>) -> StoreResult<ClaimOutcome> {
        down()
    }
    async fn takeover(&self, _: ClaimRequest<'_>, _: u64) -> StoreResult<ClaimOutcome> {
        down()
    }
    async fn complete(&self, _: &str, _: u64, _: Completion<'_>) -> StoreResult {
        down()
    }
    async fn release(&self, _: &str, _: u64) -> StoreResult {
        down()
    }
    async fn renew(&self, _: &str, _: u64, _: Duration) -> StoreResult {
        down()
    }
    async fn abandon(&self, _: &str, _: u64) -> StoreResult {
        down()
    }
    async fn lookup(&self, _: &str) -> StoreResult<Option<Record>> {
        down()
    }
    async fn pending(&self, _: usize) -> StoreResult<Vec<Record>> {
        down()
    }
    async fn resolve(&self, _: ResolveRequest<'_>) -> StoreResult {
        down()
    }
    async fn history(&self, _: &str) -> StoreResult<Vec<HistoryEvent>> {
        down()
    }
    async fn purge_expired(&self) -> StoreResult<u64> {
        down()
    }
}

#[tokio::test]
async fn a_store_that_is_down_is_503_and_nothing_runs() {
    let app: Router = HttpTools::new(registry())
        .with_store(DownStore)
        .into_router();
    let answer = send(&app, post_json("/tools/place", order(107, "c-1", ""))).await;
    let doc = answer.problem(ProblemType::StoreUnavailable);
    assert_eq!(doc["code"], "store");
    assert!(
        doc["detail"].as_str().unwrap().contains("nothing was run"),
        "{doc}"
    );
    assert_eq!(effects(107), 0);
    let read = send(&app, get(&format!("/operations/{}", "0".repeat(64)))).await;
    read.problem(ProblemType::StoreUnavailable);
}

#[tokio::test]
async fn bodies_are_bounded_typed_and_methods_checked() {
    let app: Router = HttpTools::new(registry())
        .with_store(MemoryStore::new())
        .with_max_body_bytes(64)
        .into_router();
    let big = order(108, &"c".repeat(100), "");
    send(&app, post_json("/tools/place", big))
        .await
        .problem(ProblemType::PayloadTooLarge);

    let plain = Request::post("/tools/place")
        .header(header::CONTENT_TYPE, "text/plain")
        .body(Body::from("user_id=108"))
        .unwrap();
    let answer = send(&app, plain).await;
    answer.problem(ProblemType::UnsupportedMediaType);
    assert_eq!(
        answer.header("accept-post"),
        Some("application/json, application/x-www-form-urlencoded")
    );
    let untyped = Request::post("/tools/place")
        .body(Body::from("{}"))
        .unwrap();
    send(&app, untyped)
        .await
        .problem(ProblemType::UnsupportedMediaType);

    let wrong = send(&app, get("/tools/place")).await;
    wrong.problem(ProblemType::MethodNotAllowed);
    assert_eq!(wrong.header("allow"), Some("POST"));
    let wrong = send(
        &app,
        Request::delete("/operations/k")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    wrong.problem(ProblemType::MethodNotAllowed);
    assert_eq!(effects(108), 0);
}

#[tokio::test]
async fn a_cross_site_form_post_is_403_and_runs_nothing() {
    let (app, _) = app();
    let forged = |site: &str| {
        Request::post("/tools/place")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header("sec-fetch-site", site)
            .body(Body::from("user_id=109&cart.id=c&note="))
            .unwrap()
    };
    send(&app, forged("cross-site"))
        .await
        .problem(ProblemType::CrossOrigin);
    assert_eq!(effects(109), 0);
    let own = send(&app, forged("same-origin")).await;
    assert_eq!(own.status, StatusCode::SEE_OTHER);
    let trusting: Router = HttpTools::new(registry())
        .with_store(MemoryStore::new())
        .with_trusted_origins(["https://shop.example"])
        .into_router();
    let (mut parts, body) = forged("cross-site").into_parts();
    parts
        .headers
        .insert(header::ORIGIN, "https://shop.example".parse().unwrap());
    let trusted = send(&trusting, Request::from_parts(parts, body)).await;
    assert_eq!(trusted.status, StatusCode::SEE_OTHER, "{}", trusted.text);
}

#[tokio::test]
async fn browsers_get_pages_with_everything_escaped() {
    let (app, _) = app();
    let hostile = "<script>alert('x')</script>";
    let made = send(&app, post_json("/tools/place", order(110, hostile, ""))).await;
    let location = made.location().to_owned();
    let browser = |path: &str| {
        Request::get(path)
            .header(
                header::ACCEPT,
                "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
            )
            .body(Body::empty())
            .unwrap()
    };
    let page = send(&app, browser(&location)).await;
    assert_eq!(page.status, StatusCode::OK);
    assert_eq!(
        page.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    assert_eq!(page.header("vary"), Some("accept"));
    assert!(
        page.text.contains("data-state=\"completed\""),
        "{}",
        page.text
    );
    assert!(page
        .text
        .contains("&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;"));
    assert!(!page.text.contains("<script>"), "{}", page.text);
    // Problems too, for a browser.
    let missing = send(&app, browser("/operations/%3Cb%3Enope%3C%2Fb%3E")).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(
        missing.text.contains("&lt;b&gt;nope&lt;/b&gt;"),
        "{}",
        missing.text
    );
    assert!(!missing.text.contains("<b>nope"));
}

#[tokio::test]
async fn nested_under_a_prefix_the_links_keep_it() {
    let tools = HttpTools::new(registry()).with_store(MemoryStore::new());
    let app: Router = Router::new().nest("/api/v1", tools.clone().into_router());
    let made = send(
        &app,
        post_json("/api/v1/tools/place", order(111, "c-1", "")),
    )
    .await;
    assert!(
        made.location().starts_with("/api/v1/operations/"),
        "{}",
        made.location()
    );
    assert_eq!(
        send(&app, get(made.location())).await.status,
        StatusCode::OK
    );
    let doc = send(&app, get("/api/v1/openapi.json")).await.json();
    assert_eq!(doc["servers"][0]["url"], "/api/v1");

    // Behind a proxy that strips `/shop`: the base path says where clients reach it.
    let proxied: Router = tools.with_base_path("/shop/").into_router();
    let made = send(&proxied, post_json("/tools/place", order(111, "c-2", ""))).await;
    assert!(
        made.location().starts_with("/shop/operations/"),
        "{}",
        made.location()
    );
}

#[tokio::test]
async fn tools_are_listed_as_the_registry_lists_them() {
    let (app, _) = app();
    let listed = send(&app, get("/tools")).await;
    assert_eq!(listed.status, StatusCode::OK);
    assert_eq!(listed.json(), registry().to_json());
}

/// Every `$ref` in `node` resolves in `doc`.
fn assert_refs_resolve(doc: &Value, node: &Value) {
    match node {
        Value::Object(obj) => {
            for (name, value) in obj {
                if name == "$ref" {
                    let reference = value.as_str().unwrap();
                    let pointer = reference.strip_prefix('#').unwrap();
                    assert!(
                        doc.pointer(pointer).is_some(),
                        "{reference} does not resolve"
                    );
                } else {
                    assert_refs_resolve(doc, value);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| assert_refs_resolve(doc, i)),
        _ => {}
    }
}

#[tokio::test]
async fn the_openapi_document_describes_every_route_and_its_refs_resolve() {
    let (app, _) = app();
    let doc = send(&app, get("/openapi.json")).await.json();
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc["servers"][0]["url"], "/");
    assert_refs_resolve(&doc, &doc);
    let place = &doc["paths"]["/tools/place"]["post"];
    assert_eq!(place["operationId"], "place");
    assert_eq!(place["summary"], "Place an order.");
    assert!(place["responses"]["303"]["headers"]["Location"].is_object());
    assert_eq!(
        place["requestBody"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/place.arguments"
    );
    let arguments = &doc["components"]["schemas"]["place.arguments"];
    assert_eq!(
        arguments["properties"]["cart"]["$ref"],
        "#/components/schemas/Cart"
    );
    assert!(arguments.get("$defs").is_none() && arguments.get("$schema").is_none());
    assert_eq!(
        doc["paths"]["/tools/seven"]["post"]["responses"]["200"]["content"]["application/json"]
            ["schema"]["$ref"],
        "#/components/schemas/seven.result"
    );
    assert!(doc["paths"]["/tools/seven"]["post"]["responses"]
        .get("303")
        .is_none());
    for path in ["/operations/{key}", "/tools", "/openapi.json"] {
        assert!(doc["paths"][path]["get"].is_object(), "{path}");
    }
}

#[test]
fn moved_definitions_keep_apart_when_they_differ_and_share_when_equal() {
    let mut components = openapi::Components::default();
    let a = json!({"type": "object", "properties": {"cart": {"$ref": "#/$defs/Cart"}, "me": {"$ref": "#"}},
        "$defs": {"Cart": {"type": "object", "properties": {"id": {"type": "string"}, "parent": {"$ref": "#/$defs/Cart"}}}}});
    let b = json!({"type": "object", "properties": {"cart": {"$ref": "#/$defs/Cart"}},
        "$defs": {"Cart": {"type": "object", "properties": {"id": {"type": "integer"}}}}});
    let a_name = components.add("a.arguments", a.clone());
    let b_name = components.add("b.arguments", b);
    let again = components.add("c.arguments", a);
    let schemas = components.schemas();
    assert_eq!(
        schemas[&a_name]["properties"]["cart"]["$ref"],
        "#/components/schemas/Cart"
    );
    assert_eq!(
        schemas[&a_name]["properties"]["me"]["$ref"],
        "#/components/schemas/a.arguments"
    );
    assert_eq!(
        schemas["Cart"]["properties"]["parent"]["$ref"],
        "#/components/schemas/Cart"
    );
    assert_eq!(
        schemas[&b_name]["properties"]["cart"]["$ref"],
        "#/components/schemas/Cart_2"
    );
    assert_eq!(schemas["Cart_2"]["properties"]["id"]["type"], "integer");
    assert_eq!(
        schemas[&again]["properties"]["cart"]["$ref"], "#/components/schemas/Cart",
        "equal definitions share one component"
    );
    assert!(!schemas.contains_key("Cart_3"));
}

#[test]
fn every_problem_type_has_its_status_code_title_and_documented_uri() {
    for kind in ProblemType::ALL {
        assert!(
            kind.uri().starts_with("https://docs.rs/tool-contracts/"),
            "{kind:?}"
        );
        assert!(
            kind.uri().ends_with(&format!("#variant.{kind:?}")),
            "{kind:?}"
        );
        assert!(!kind.title().is_empty());
        assert!(kind.status().is_client_error() || kind.status().is_server_error());
    }
    let statuses: Vec<(ProblemType, u16)> = ProblemType::ALL
        .iter()
        .map(|k| (*k, k.status().as_u16()))
        .collect();
    for (kind, status) in [
        (ProblemType::InvalidArguments, 400),
        (ProblemType::UnknownTool, 404),
        (ProblemType::InProgress, 409),
        (ProblemType::KeyReused, 422),
        (ProblemType::StoreUnavailable, 503),
        (ProblemType::OutcomeUnknown, 500),
    ] {
        assert!(statuses.contains(&(kind, status)), "{kind:?}");
    }
}
