//! What the server answers: rmcp's [`ServerHandler`] for [`McpServer`], `tools/list` (the
//! published tools and their output shapes), `tools/call` (the dedup engine's result as a
//! `CallToolResult` with its `_meta`), the client's own intent key, malformed `tools/call`
//! params (`-32602`), and progress notifications while a call runs. A task-augmented call
//! and the `tasks/*` methods are answered by `tasks.rs`, a call waiting for approval by
//! `approval.rs`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use futures::future::Either;
use rmcp::model::{
    CallToolRequestMethod, CallToolRequestParams, CallToolResponse, CallToolResult,
    CancelTaskParams, ConstString, ContentBlock, CustomRequest, CustomResult, ErrorCode,
    GetTaskParams, GetTaskResult, Implementation, JsonObject, ListResourceTemplatesResult,
    ListResourcesResult, ListToolsResult, MetaObject, PaginatedRequestParams,
    ProgressNotificationParam, ProgressToken, ReadResourceRequestParams, ReadResourceResponse,
    ReadResourceResult, Resource, ResourceContents, ResourceTemplate, ServerCapabilities,
    ServerConfig, Tool, UpdateTaskParams,
};
use rmcp::service::{Peer, RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler};
use serde_json::{json, Map, Value};

use super::approval::Asker;
use super::tasks::{tasks_capability_required, CallMode};
use super::{
    operation_uri, transport, McpServer, CALL_META_KEY, CLIENT_KEY_MAX_CHARS, CLIENT_KEY_META_KEY,
    CLIENT_KEY_PARAM, OPERATION_TOOL, OPERATION_URI_PREFIX, WRAPPED_RESULT_FIELD,
};
use crate::ambient::{client_scope, with_measured_store, with_progress, with_scope, ProgressHook};
use crate::error::Error;
use crate::registry::{ToolDescriptor, ToolOutput};
use crate::spec::TaskSupport;

/// How a tool's results map onto `structuredContent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OutputShape {
    /// The result schema is an object: the result is the structured content.
    Object,
    /// The result schema is not an object: published and answered as `{"result": …}`.
    Wrapped,
    /// No schema: object results are structured content, others are text only.
    Unknown,
}

impl McpServer {
    /// Runs one `tools/call`: what [`ServerHandler::call_tool`] answers, without a
    /// transport. `client_key` is the client's intent key, if it sent one (validated here).
    ///
    /// # Errors
    /// A JSON-RPC error for an unknown tool; every other failure is an `isError` result.
    pub async fn call(
        &self,
        name: &str,
        arguments: Option<JsonObject>,
        client_key: Option<&Value>,
    ) -> Result<CallToolResult, ErrorData> {
        let args = arguments.map_or(Value::Null, Value::Object);
        let client_key = match client_key.map(|k| validate_client_key(name, k)).transpose() {
            Ok(k) => k,
            Err(e) => return Ok(self.error_result(name, e, None)),
        };
        if name == OPERATION_TOOL && self.inner.registry.get(name).is_none() {
            return Ok(self.operation_tool_result(&args).await);
        }
        let outcome = self.run_call(name, args, client_key.as_deref()).await;
        self.answer(name, outcome, client_key.as_deref())
    }

    /// [`call`](Self::call) for a client that may be asked for an approval: a call waiting
    /// for one goes to `approval.rs`, which asks through `asker` (an `InputRequiredResult`
    /// from protocol 2026-07-28 on, hence the response type).
    async fn call_asking(
        &self,
        name: &str,
        arguments: Option<JsonObject>,
        client_key: Option<&Value>,
        asker: Asker,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = arguments.map_or(Value::Null, Value::Object);
        let client_key = match client_key.map(|k| validate_client_key(name, k)).transpose() {
            Ok(k) => k,
            Err(e) => return Ok(self.error_result(name, e, None).into()),
        };
        let client_key = client_key.as_deref();
        if name == OPERATION_TOOL && self.inner.registry.get(name).is_none() {
            return Ok(self.operation_tool_result(&args).await.into());
        }
        // The arguments are needed again only to run the call once its approval is decided
        // through this client; one that cannot be asked gets the `awaiting_approval` result
        // at once, so only for a client that can be asked are they copied (an allocation per
        // member and string, on every call).
        let again = asker.can_ask().then(|| args.clone());
        match (self.run_call(name, args, client_key).await, again) {
            (Err(pending @ Error::AwaitingApproval { .. }), Some(args)) => {
                self.answer_awaiting(name, args, client_key, pending, asker)
                    .await
            }
            (Err(pending @ Error::AwaitingApproval { .. }), None) => {
                Ok(self.error_result(name, pending, client_key).into())
            }
            (outcome, _) => self.answer(name, outcome, client_key).map(Into::into),
        }
    }

    /// What [`ServerHandler::call_tool`] answers (see there for why it is boxed).
    async fn answer_call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        // rmcp moves the request's `_meta` into the context; typed params keep none (the
        // context's member counts first). Looked up in place: the maps are not copied.
        let in_meta = context.meta.0 .0.get(CLIENT_KEY_META_KEY).or_else(|| {
            request
                .meta
                .as_ref()
                .and_then(|meta| meta.0 .0.get(CLIENT_KEY_META_KEY))
        });
        let in_params = transport::params_idempotency_key(&context);
        let client_key = match client_key_of(&name, in_meta, in_params) {
            Ok(k) => k,
            Err(e) => return Ok(self.error_result(&name, e, None).into()),
        };
        let takes_tasks = context
            .client_capabilities()
            .is_some_and(|capabilities| capabilities.supports_tasks());
        let tool = self.inner.registry.get(&name);
        match (CallMode::of(tool, takes_tasks), tool) {
            (CallMode::Task, Some(tool)) => {
                let client_key = match client_key.map(|k| validate_client_key(&name, k)) {
                    Some(Err(e)) => return Ok(self.error_result(&name, e, None).into()),
                    Some(Ok(k)) => Some(k),
                    None => None,
                };
                let args = request.arguments.map_or(Value::Null, Value::Object);
                return self.start_task(tool, args, client_key).await;
            }
            (CallMode::MissingCapability, _) => return Err(tasks_capability_required()),
            _ => {}
        }
        let asker = match self.inner.elicitation {
            true => Asker::of(&context, request.input_responses, request.request_state),
            false => Asker::none(),
        };
        let call = self.call_asking(&name, request.arguments, client_key, asker);
        match context.meta.get_progress_token() {
            Some(token) => with_progress_notifications(&context.peer, token, call).await,
            None => call.await,
        }
    }

    /// Runs a registry call as this client's: in the server's scope and store, with the
    /// client's key (already validated) as a scope nested inside.
    pub(super) async fn run_call(
        &self,
        name: &str,
        args: Value,
        client_key: Option<&str>,
    ) -> Result<ToolOutput, Error> {
        self.as_caller(client_key, self.inner.registry.call(name, args))
            .await
    }

    /// Runs `future` as a call of this client runs: [`in_context`](Self::in_context), with
    /// the client key's scope inside the server's.
    pub(super) async fn as_caller<T>(
        &self,
        client_key: Option<&str>,
        future: impl Future<Output = T> + Send,
    ) -> T {
        let future: Pin<Box<dyn Future<Output = T> + Send + '_>> = match client_key {
            Some(k) => Box::pin(with_scope(client_scope(k), future)),
            None => Box::pin(future),
        };
        self.in_context(future).await
    }

    /// The `tools/call` answer to a call's outcome: a result (`isError` for every failure)
    /// or, for an unknown tool, a JSON-RPC error.
    pub(super) fn answer(
        &self,
        name: &str,
        outcome: Result<ToolOutput, Error>,
        client_key: Option<&str>,
    ) -> Result<CallToolResult, ErrorData> {
        match outcome {
            Ok(output) => Ok(self.success_result(name, output, client_key)),
            Err(Error::UnknownTool { name, suggestion }) => {
                let message = Error::UnknownTool {
                    name: name.clone(),
                    suggestion: suggestion.clone(),
                }
                .to_string();
                Err(ErrorData::new(
                    ErrorCode::INVALID_PARAMS,
                    message,
                    Some(json!({ "code": "unknown_tool", "tool": name, "suggestion": suggestion })),
                ))
            }
            Err(e) => Ok(self.error_result(name, e, client_key)),
        }
    }

    /// Runs `future` as this server runs every request: in its scope, on its store.
    fn in_context<'a, T: 'a>(
        &'a self,
        future: impl Future<Output = T> + Send + 'a,
    ) -> impl Future<Output = T> + Send + 'a {
        // Built, not an `async fn`, and the call's future boxed only inside a scope: an
        // `async` frame would hold it more than once.
        let scoped = match &self.inner.scope {
            Some(scope) => {
                let future: Pin<Box<dyn Future<Output = T> + Send + 'a>> =
                    Box::pin(with_scope(scope.clone(), future));
                Either::Left(future)
            }
            None => Either::Right(future),
        };
        match &self.inner.store {
            Some(store) => Either::Left(with_measured_store(Arc::clone(store), scoped)),
            None => Either::Right(scoped),
        }
    }

    /// The operation of `key` as this server's callers may see it (its scope and store):
    /// `None` for a key never used, purged, or made in another scope, alike.
    pub(super) async fn operation(&self, key: &str) -> Result<Option<crate::Operation>, Error> {
        self.in_context(crate::operation(key)).await
    }

    /// `get_operation`: the operation document as structured content, or a tool error
    /// saying it is not found (the model can then retry the call itself).
    async fn operation_tool_result(&self, args: &Value) -> CallToolResult {
        let Some(key) = args.get("key").and_then(Value::as_str) else {
            return CallToolResult::error(vec![ContentBlock::text(format!(
                "`{OPERATION_TOOL}` takes {{\"key\": \"<the key from a result's _meta or resource link>\"}}"
            ))]);
        };
        match self.operation(key).await {
            Ok(Some(op)) => match serde_json::to_value(&op) {
                Ok(doc) => {
                    let mut result =
                        CallToolResult::success(vec![ContentBlock::text(doc.to_string())]);
                    result.structured_content = Some(doc);
                    result
                }
                Err(e) => CallToolResult::error(vec![ContentBlock::text(format!(
                    "the operation {key} cannot be encoded: {e}"
                ))]),
            },
            Ok(None) => CallToolResult::error(vec![ContentBlock::text(not_found(key))]),
            Err(e) => CallToolResult::error(vec![ContentBlock::text(e.to_string())]),
        }
    }

    /// The one place that reads a [`ToolOutput`]: its value shaped as the tool publishes it,
    /// its outcome and key in `_meta`.
    pub(super) fn success_result(
        &self,
        name: &str,
        output: ToolOutput,
        client_key: Option<&str>,
    ) -> CallToolResult {
        let shape = self
            .inner
            .shapes
            .get(name)
            .copied()
            .unwrap_or(OutputShape::Unknown);
        let ToolOutput {
            value,
            key,
            outcome,
            ..
        } = output;
        let (outcome, key) = (outcome.as_str(), key.as_deref());
        let structured = match shape {
            OutputShape::Object => Some(value),
            OutputShape::Wrapped => Some(json!({ WRAPPED_RESULT_FIELD: value })),
            OutputShape::Unknown if value.is_object() => Some(value),
            OutputShape::Unknown => {
                let text = serde_json::to_string(&value).unwrap_or_default();
                let mut result =
                    CallToolResult::success(with_link(vec![ContentBlock::text(text)], key));
                result.meta = Some(call_meta(outcome, key, client_key, None));
                return result;
            }
        };
        // `to_string` writes into one buffer; `Value`'s `Display` goes through
        // `fmt::Formatter` a token at a time (about a third more work, in the profile).
        // Writing a `Value` cannot fail (its keys are strings).
        let text = structured
            .as_ref()
            .and_then(|v| serde_json::to_string(v).ok())
            .unwrap_or_default();
        let mut result = CallToolResult::success(with_link(vec![ContentBlock::text(text)], key));
        result.structured_content = structured;
        result.meta = Some(call_meta(outcome, key, client_key, None));
        result
    }

    pub(super) fn error_result(
        &self,
        name: &str,
        error: Error,
        client_key: Option<&str>,
    ) -> CallToolResult {
        let outcome = match error {
            Error::ToolFailed { .. } => "failed",
            _ => "rejected",
        };
        tracing::debug!(tool = name, code = error.code(), key = ?error.key(), "tool-contracts: MCP call answered with an error result");
        // A call waiting for approval, or denied, is an operation to read (or to approve):
        // its link, as a success carries it.
        let link = match &error {
            Error::AwaitingApproval { key, .. } | Error::Denied { key, .. } => Some(key.as_str()),
            _ => None,
        };
        let mut content = vec![ContentBlock::text(error.to_string())];
        if let Some(key) = link {
            content = with_link(content, Some(key));
        }
        let mut result = CallToolResult::error(content);
        let mut meta = call_meta(outcome, error.key(), client_key, Some(&error));
        if let (Some(key), Some(Value::Object(call))) = (link, meta.0.get_mut(CALL_META_KEY)) {
            call.insert("operation".into(), operation_uri(key).into());
        }
        result.meta = Some(meta);
        result
    }
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_resources();
        // The tasks extension, when a tool takes tasks: then `tasks/*` are served (rmcp
        // answers them `-32601` otherwise, and `-32021` to a client that does not declare it).
        let takes_tasks = self
            .inner
            .registry
            .iter()
            .any(|tool| tool.task_support() != TaskSupport::Forbidden);
        let capabilities = match takes_tasks {
            true => capabilities.enable_tasks().build(),
            false => capabilities.build(),
        };
        let mut info = ServerConfig::new(capabilities);
        info.server_info = Implementation::new(self.inner.name.clone(), self.inner.version.clone());
        info.instructions = self.inner.instructions.clone();
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        // `ListToolsResult` is `#[non_exhaustive]` without a constructor: no struct literal.
        #[allow(clippy::field_reassign_with_default)]
        let result = {
            let mut result = ListToolsResult::default();
            result.tools = self.inner.tools.clone();
            if self.inner.operation_tool && self.inner.registry.get(OPERATION_TOOL).is_none() {
                result.tools.push(operation_tool());
            }
            result
        };
        Ok(result)
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        let builtin = self.inner.operation_tool && name == OPERATION_TOOL;
        self.inner
            .tools
            .iter()
            .find(|t| t.name == name)
            .cloned()
            .or_else(|| builtin.then(operation_tool))
    }

    /// No listing: an operation is found by its key (the link a result carries), never by
    /// browsing another caller's calls.
    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        Ok(ListResourcesResult::default())
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let template = ResourceTemplate::new(format!("{OPERATION_URI_PREFIX}{{key}}"), "operation")
            .with_title("Operation by idempotency key")
            .with_description("What became of a mutating tool call: its state (in_progress, completed, failed, unknown) and, once completed, the stored result. Reading never runs or repeats anything.")
            .with_mime_type("application/json");
        #[allow(clippy::field_reassign_with_default)]
        let result = {
            let mut result = ListResourceTemplatesResult::default();
            result.resource_templates = vec![template];
            result
        };
        Ok(result)
    }

    /// `resources/read` of `tool-contracts://operations/{key}`: the operation document, in
    /// this server's scope; a key never used or of another scope is the MCP
    /// resource-not-found error (`-32002`), alike.
    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let uri = request.uri;
        let Some(key) = uri.strip_prefix(OPERATION_URI_PREFIX) else {
            return Err(ErrorData::resource_not_found(
                format!("no resource {uri}: this server serves {OPERATION_URI_PREFIX}{{key}}"),
                Some(json!({ "uri": uri })),
            ));
        };
        // Boxed: see `call_tool`.
        match Box::pin(self.operation(key)).await {
            Ok(Some(op)) => {
                let text = serde_json::to_string(&op).map_err(|e| {
                    ErrorData::internal_error(format!("the operation cannot be encoded: {e}"), None)
                })?;
                let contents = ResourceContents::text(text, uri).with_mime_type("application/json");
                Ok(ReadResourceResult::new(vec![contents]).into())
            }
            Ok(None) => Err(ErrorData::resource_not_found(
                not_found(key),
                Some(json!({ "uri": uri })),
            )),
            Err(e) => Err(ErrorData::internal_error(
                e.to_string(),
                Some(json!({ "uri": uri, "code": e.code() })),
            )),
        }
    }

    /// Boxed, as the other methods that read the store: rmcp runs each request in a task of
    /// its own whose future holds the handler's, and moves it whole (into the task, then
    /// its cell) before it runs. A call's future is kilobytes (the engine, approval, tasks,
    /// progress), so every request, replays included, paid those copies; one allocation
    /// costs less (benches/surfaces.rs, BENCHMARKS.md "The surfaces").
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        Box::pin(self.answer_call_tool(request, context)).await
    }

    /// `tasks/get` (SEP-2663), from the store: see `tasks.rs`.
    async fn get_task(
        &self,
        request: GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let task = Box::pin(self.get_task_by_id(&request.task_id)).await?;
        Ok(GetTaskResult::new(task))
    }

    /// `tasks/cancel` (SEP-2663): acknowledged for a working task, which runs on; `-32602`
    /// for a finished or unknown one (`tasks.rs`, docs/mcp.md).
    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Box::pin(self.cancel_task_by_id(&request.task_id)).await
    }

    /// `tasks/update` (SEP-2663): no task here asks for input; acknowledged for a known id.
    async fn update_task(
        &self,
        request: UpdateTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Box::pin(self.update_task_by_id(&request.task_id)).await
    }

    /// rmcp 3.11 decodes a client request into `ClientRequest`, a `#[serde(untagged)]` enum
    /// whose last variant is `CustomRequest`: a `tools/call` whose params do not fit
    /// `CallToolRequestParams` (no `name`, `arguments` a string or an array) becomes a
    /// custom request named `tools/call`, and rmcp's default answer to those is `-32601`
    /// (Method not found) with the method as its message. JSON-RPC wants `-32602` (Invalid
    /// params) for a method that exists: a `tools/call` gets it here, with a message saying
    /// what is wrong and what to send. Any other method stays `-32601`. (Params that are no
    /// object at all make the message no MCP request: rmcp answers `-32600`.)
    /// Without this, `malformed_tools_call_params_are_invalid_params_naming_what_to_send`
    /// (`tests.rs`) and `over_http_malformed_tools_call_params_are_invalid_params`
    /// (`tests/mcp_e2e.rs`) fail.
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, ErrorData> {
        Err(if request.method == CallToolRequestMethod::VALUE {
            invalid_tools_call_params(request.params.as_ref())
        } else {
            // rmcp's own answer.
            ErrorData::new(ErrorCode::METHOD_NOT_FOUND, request.method, None)
        })
    }
}

/// The `-32602` answer to a `tools/call` whose params rmcp could not decode (see
/// [`McpServer::on_custom_request`]): every problem found, each with what to send instead.
fn invalid_tools_call_params(params: Option<&Value>) -> ErrorData {
    const SHAPE: &str = "`{\"name\": \"<tool>\", \"arguments\": {…}}`";
    let kind = crate::__private::json_kind;
    let mut problems = Vec::new();
    let mut fields = Vec::new();
    match params {
        None => {
            problems.push(format!("`tools/call` has no `params`: send {SHAPE}."));
            fields.push("params");
        }
        Some(Value::Object(params)) => {
            match params.get("name") {
                None => problems.push(format!(
                    "`params.name` is missing: send the tool's name as a string, as in {SHAPE} (`tools/list` lists the names)."
                )),
                Some(Value::String(_)) => {}
                Some(other) => problems.push(format!(
                    "`params.name` must be the tool's name as a string, not {}.",
                    kind(other)
                )),
            }
            if !matches!(params.get("name"), Some(Value::String(_))) {
                fields.push("params.name");
            }
            match params.get("arguments") {
                None | Some(Value::Null | Value::Object(_)) => {}
                Some(Value::String(text))
                    if serde_json::from_str::<Value>(text).is_ok_and(|v| v.is_object()) =>
                {
                    fields.push("params.arguments");
                    problems.push(
                        "`params.arguments` must be an object, not a string holding JSON text: send the object itself, as in `\"arguments\": {\"user_id\": 7}`.".to_owned(),
                    );
                }
                Some(other) => {
                    fields.push("params.arguments");
                    problems.push(format!(
                        "`params.arguments` must be an object mapping each argument's name to its value, not {}: send `{{}}` for a tool without arguments.",
                        kind(other)
                    ));
                }
            }
            if problems.is_empty() {
                // Another member of the wrong type: serde's own words.
                let detail =
                    serde_json::from_value::<CallToolRequestParams>(Value::Object(params.clone()))
                        .err()
                        .map_or_else(
                            || "they do not match the MCP schema".to_owned(),
                            |e| e.to_string(),
                        );
                problems.push(format!("{detail}: send {SHAPE}."));
            }
        }
        Some(other) => {
            problems.push(format!(
                "`params` must be an object, not {}: send {SHAPE}.",
                kind(other)
            ));
            fields.push("params");
        }
    }
    let message = format!(
        "Invalid params for `tools/call`, nothing ran. {}",
        problems.join(" ")
    );
    ErrorData::invalid_params(
        message,
        Some(
            json!({ "code": "invalid_params", "method": CallToolRequestMethod::VALUE, "fields": fields }),
        ),
    )
}

/// Runs `call`, sending `notifications/progress` with the client's `token` each time the
/// call's lease is renewed (every third of the tool's lease, through the lease heartbeat's
/// hook, [`with_progress`]): a client that asked for progress sees a long call alive, and
/// can reset its request timeout on each one. The notifications are sent from this task, in
/// order, with an increasing `progress` and no `total`; they stop when the call ends, so
/// none follows the response.
async fn with_progress_notifications<F: Future>(
    peer: &Peer<RoleServer>,
    token: ProgressToken,
    call: F,
) -> F::Output {
    let (renewed, mut renewals) = tokio::sync::mpsc::unbounded_channel::<()>();
    let hook: ProgressHook = Arc::new(move || {
        // Closed once the call has ended: nothing is left to report.
        let _ = renewed.send(());
    });
    let call = with_progress(hook, call);
    let notify = async {
        let mut progress = 0_u32;
        while renewals.recv().await.is_some() {
            progress = progress.saturating_add(1);
            let notification = ProgressNotificationParam::new(token.clone(), f64::from(progress))
                .with_message("still running; lease renewed");
            if let Err(e) = peer.notify_progress(notification).await {
                tracing::debug!(error = %e, "tool-contracts: MCP progress notification not sent");
            }
        }
        core::future::pending::<core::convert::Infallible>().await
    };
    tokio::select! {
        biased;
        out = call => out,
        never = notify => match never {},
    }
}

/// The client key of a request, from `_meta` or from `params.idempotencyKey` (kept beside
/// the message by the transport, see `transport.rs`). Both present and different is an
/// error.
fn client_key_of<'a>(
    tool: &str,
    in_meta: Option<&'a Value>,
    in_params: Option<&'a Value>,
) -> Result<Option<&'a Value>, Error> {
    match (in_meta, in_params) {
        (Some(a), Some(b)) if a != b => Err(Error::InvalidArguments {
            tool: tool.to_owned(),
            field: Some(CLIENT_KEY_PARAM.to_owned()),
            message: format!(
                "the request carries two different client idempotency keys, `params.{CLIENT_KEY_PARAM}` and `_meta[\"{CLIENT_KEY_META_KEY}\"]`; nothing ran. Send one of them"
            ),
        }),
        (Some(k), _) | (None, Some(k)) => Ok(Some(k)),
        (None, None) => Ok(None),
    }
}

/// A client key: a string, then the rule every surface keeps
/// ([`validate_client_key`](crate::ambient::validate_client_key)).
fn validate_client_key(tool: &str, key: &Value) -> Result<String, Error> {
    let Value::String(key) = key else {
        return Err(Error::InvalidArguments {
            tool: tool.to_owned(),
            field: Some(CLIENT_KEY_PARAM.to_owned()),
            message: format!(
                "the client idempotency key must be a string of 1 to {CLIENT_KEY_MAX_CHARS} characters, not {key}; nothing ran. Send the same string with every retry of one intent"
            ),
        });
    };
    crate::ambient::validate_client_key(tool, CLIENT_KEY_PARAM, key)?;
    Ok(key.clone())
}

fn call_meta(
    outcome: &str,
    key: Option<&str>,
    client_key: Option<&str>,
    error: Option<&Error>,
) -> MetaObject {
    let mut call = Map::new();
    call.insert("outcome".into(), outcome.into());
    call.insert("replayed".into(), (outcome == "replayed").into());
    call.insert("key".into(), key.map_or(Value::Null, Value::from));
    if let Some(k) = client_key {
        call.insert("clientKey".into(), k.into());
    }
    if let Some(e) = error {
        call.insert("error".into(), e.code().into());
    }
    let mut meta = Map::new();
    meta.insert(CALL_META_KEY.to_owned(), Value::Object(call));
    MetaObject(meta)
}

/// Whether a JSON Schema describes an object at its root (what MCP requires of an output
/// schema).
fn is_object_schema(schema: &Value) -> bool {
    schema.get("type").and_then(Value::as_str) == Some("object")
}

/// Wraps a non-object result schema as `{"type":"object","properties":{"result":…}}`,
/// keeping `$schema` and `$defs` at the root where the inner `$ref`s point.
fn wrap_schema(schema: Value) -> Value {
    let mut root = Map::new();
    let inner = match schema {
        Value::Object(mut inner) => {
            if let Some(dialect) = inner.remove("$schema") {
                root.insert("$schema".into(), dialect);
            }
            let defs = inner.remove("$defs");
            let title = inner.remove("title");
            root.insert("type".into(), "object".into());
            if let Some(Value::String(title)) = title {
                root.insert("title".into(), title.clone().into());
                inner.insert("title".into(), title.into());
            }
            root.insert(
                "properties".into(),
                json!({ WRAPPED_RESULT_FIELD: Value::Object(inner) }),
            );
            if let Some(defs) = defs {
                root.insert("$defs".into(), defs);
            }
            root.insert("required".into(), json!([WRAPPED_RESULT_FIELD]));
            return Value::Object(root);
        }
        other => other,
    };
    root.insert("type".into(), "object".into());
    root.insert("properties".into(), json!({ WRAPPED_RESULT_FIELD: inner }));
    root.insert("required".into(), json!([WRAPPED_RESULT_FIELD]));
    Value::Object(root)
}

/// A tool as published in `tools/list`, and how its results map to structured content.
pub(super) fn tool_json(descriptor: &ToolDescriptor) -> (Value, OutputShape) {
    let mut tool = descriptor.to_mcp_json();
    let shape = match descriptor.output_schema() {
        Some(schema) if is_object_schema(&schema) => OutputShape::Object,
        Some(schema) => {
            if let Value::Object(tool) = &mut tool {
                tool.insert("outputSchema".into(), wrap_schema(schema));
            }
            OutputShape::Wrapped
        }
        None => OutputShape::Unknown,
    };
    (tool, shape)
}

/// A result's content with the link to its operation (the redirect of Post/Redirect/Get),
/// when the call has a key.
fn with_link(mut content: Vec<ContentBlock>, key: Option<&str>) -> Vec<ContentBlock> {
    if let Some(key) = key {
        let link = Resource::new(operation_uri(key), format!("operation {key}"))
            .with_description("Read this to learn what became of the call, without calling again.")
            .with_mime_type("application/json");
        content.push(ContentBlock::resource_link(link));
    }
    content
}

fn not_found(key: &str) -> String {
    format!("no operation with key {key} in this server's scope: it was never made here, has expired, or belongs to another tenant; make the call (the same arguments are safe to repeat)")
}

/// The read-only `get_operation` tool as published in `tools/list`.
fn operation_tool() -> Tool {
    let json = json!({
        "name": OPERATION_TOOL,
        "description": "Read what became of an earlier mutating call by its idempotency key (from the call result's `_meta[\"dev.tool-contracts/call\"].key` or its resource link): state in_progress, completed (with the stored result), failed (a stored error) or unknown (its worker stopped mid-call). Never runs or repeats the call.",
        "inputSchema": {
            "type": "object",
            "properties": {"key": {"type": "string", "description": "The operation's idempotency key (64 hex digits)."}},
            "required": ["key"],
            "additionalProperties": false
        },
        "annotations": {"readOnlyHint": true, "idempotentHint": true, "destructiveHint": false, "openWorldHint": false}
    });
    // A fixed, valid tool: the fallback (no annotations) is never taken in practice.
    serde_json::from_value(json).unwrap_or_else(|_| Tool::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_keys_are_one_to_255_printable_characters() {
        assert_eq!(validate_client_key("t", &json!("a")).unwrap(), "a");
        assert!(validate_client_key("t", &json!("é".repeat(255))).is_ok());
        for bad in [
            json!(""),
            json!("x".repeat(256)),
            json!("a\nb"),
            json!("a\u{7f}"),
            json!(7),
            json!(null),
        ] {
            let e = validate_client_key("t", &bad).unwrap_err();
            assert_eq!(e.code(), "invalid_arguments");
            assert!(e.to_string().contains("idempotency key"), "{e}");
            assert!(e.to_string().contains("nothing ran"), "{e}");
        }
    }

    #[test]
    fn two_different_client_keys_are_refused_and_equal_ones_accepted() {
        let (a, b) = (json!("a"), json!("b"));
        assert_eq!(client_key_of("t", Some(&a), None).unwrap(), Some(&a));
        assert_eq!(client_key_of("t", None, Some(&a)).unwrap(), Some(&a));
        assert_eq!(client_key_of("t", Some(&a), Some(&a)).unwrap(), Some(&a));
        let e = client_key_of("t", Some(&a), Some(&b)).unwrap_err();
        assert!(e.to_string().contains("two different"), "{e}");
        assert_eq!(client_key_of("t", None, None).unwrap(), None);
    }

    #[test]
    fn a_non_object_result_schema_is_wrapped_with_its_defs_at_the_root() {
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "Nullable_Order",
            "anyOf": [{"$ref": "#/$defs/Order"}, {"type": "null"}],
            "$defs": {"Order": {"type": "object", "properties": {"id": {"type": "integer"}}}}
        });
        let wrapped = wrap_schema(schema);
        assert!(is_object_schema(&wrapped));
        assert_eq!(wrapped["required"], json!(["result"]));
        assert_eq!(
            wrapped["$schema"],
            "https://json-schema.org/draft/2020-12/schema"
        );
        assert!(wrapped["$defs"]["Order"].is_object());
        assert!(wrapped["properties"]["result"].get("$defs").is_none());
        assert_eq!(
            wrapped["properties"]["result"]["anyOf"][0]["$ref"],
            "#/$defs/Order"
        );
        let wrapped = wrap_schema(json!({"type": "string"}));
        assert_eq!(
            wrapped,
            json!({"type":"object","properties":{"result":{"type":"string"}},"required":["result"]})
        );
        let wrapped = wrap_schema(json!(true));
        assert_eq!(wrapped["properties"]["result"], json!(true));
    }
}
