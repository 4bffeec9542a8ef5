//! MCP Tasks (SEP-2663, the `io.modelcontextprotocol/tasks` extension) tied to idempotency
//! keys: a task is the operation of one call, named by the call's key.
//!
//! - **Starting**: a `tools/call` of a tool with `task = "optional"` (or `"required"`) from a
//!   client that declares the extension runs through the engine as any call does (same key,
//!   scope, lease, store), in a background task of the server. The answer is a
//!   `CreateTaskResult` once the key is in the store (the claim is made, or the call had
//!   already ended, or another call of the same intent holds it): `tasks/get` of the id
//!   resolves from then on, as SEP-2663 requires. A retry of the same intent names the same
//!   task and starts nothing (the engine reports the live holder instead of waiting for it,
//!   `engine::as_task_start`); a call refused before its key holds anything of its intent
//!   (invalid arguments, key reused with other arguments, store down) is answered as a plain
//!   call, with its error.
//! - **Reading**: `tasks/get`, `tasks/cancel` and `tasks/update` read the operation of the
//!   id ([`crate::operation`]) in the server's scope and nothing else: no state lives in this
//!   process (rmcp's `TaskManager` keeps tasks in memory under random ids, so it is not
//!   used), and any process sharing the store answers for any task, after a restart too. An
//!   id of another scope, of a tool that takes no tasks, or never used is "unknown task"
//!   (`-32602`) alike.
//!
//! The states map as docs/mcp.md ("Tasks") tabulates: in progress is `working`, a stored
//! result `completed` with the `tools/call` result inline, a stored tool error `completed`
//! with an `isError` result (SEP-2663 keeps `failed` for JSON-RPC errors), and an unknown
//! outcome `failed` with a `-32603` error whose `data.code` is `outcome_unknown`.

use rmcp::model::{
    CallToolResponse, ClientCapabilities, CreateTaskResult, DetailedTask, ErrorCode, JsonObject,
    MetaObject, Task, TaskPayload, TaskStatus,
};
use rmcp::ErrorData;
use serde_json::{json, Map, Value};

use super::{operation_uri, McpServer, CALL_META_KEY};
use crate::error::Error;
use crate::operation::{rfc3339_text, Operation, OperationState};
use crate::registry::{Outcome, ToolDescriptor, ToolOutput};
use crate::spec::TaskSupport;

/// The `pollIntervalMs` a working task suggests by default: a second, the interval rmcp's
/// own `TaskManager` suggests. A task's state changes only when its call ends, and every
/// poll is one store read; see [`McpServer::with_task_poll_interval`].
pub const DEFAULT_TASK_POLL_INTERVAL: core::time::Duration = core::time::Duration::from_secs(1);

/// How a `tools/call` is answered, by the tool's `task` option and the client's
/// declaration of the extension.
pub(super) enum CallMode {
    /// With the call's result.
    Plain,
    /// With a task.
    Task,
    /// With `-32021`: the tool runs only as a task and the client does not take tasks.
    MissingCapability,
}

impl CallMode {
    pub(super) fn of(tool: Option<&ToolDescriptor>, client_takes_tasks: bool) -> CallMode {
        match (tool.map(ToolDescriptor::task_support), client_takes_tasks) {
            (Some(TaskSupport::Optional | TaskSupport::Required), true) => CallMode::Task,
            (Some(TaskSupport::Required), false) => CallMode::MissingCapability,
            _ => CallMode::Plain,
        }
    }
}

/// `-32021` for a client that does not declare the tasks extension, naming it.
pub(super) fn tasks_capability_required() -> ErrorData {
    ErrorData::missing_required_client_capability(
        ClientCapabilities::builder().enable_tasks().build(),
    )
}

/// SEP-2663's answer to an id `tasks/get` cannot resolve: `-32602`, the same words for an
/// id never used, expired, of a tool that takes no tasks, or of another tenant.
fn unknown_task(task_id: &str) -> ErrorData {
    ErrorData::invalid_params(
        format!("no task {task_id} in this server's scope: it was never created here, has expired, or belongs to another tenant; the call that made it can be made again (the same arguments are safe to repeat)"),
        Some(json!({ "code": "unknown_task", "taskId": task_id })),
    )
}

fn store_failed(task_id: &str, e: &Error) -> ErrorData {
    ErrorData::internal_error(
        format!("task {task_id} cannot be read: {e}"),
        Some(json!({ "code": e.code(), "taskId": task_id })),
    )
}

/// A JSON object from a value that serializes to one (rmcp's result types do).
fn object_of(value: impl serde::Serialize) -> JsonObject {
    match serde_json::to_value(value) {
        Ok(Value::Object(map)) => map,
        // rmcp's `CallToolResult` is a struct: unreachable in practice, and an empty
        // object is still a well-formed (if empty) result.
        _ => Map::new(),
    }
}

/// Whole milliseconds, rounded up (a lease about to end still shows 1 ms).
fn millis(d: core::time::Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

impl McpServer {
    /// Answers a task-augmented `tools/call` (see the module docs): a `CreateTaskResult`
    /// naming the call's key once the store holds it, or the plain answer when the call
    /// was refused before anything of its intent was stored.
    pub(super) async fn start_task(
        &self,
        tool: &'static ToolDescriptor,
        args: Value,
        client_key: Option<String>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = tool.name();
        let key = match self
            .as_caller(client_key.as_deref(), async { tool.key(&args) })
            .await
        {
            Ok(Some(key)) => key,
            // A tool with no key takes no task (`task_support` says so); answer plainly.
            Ok(None) => {
                let outcome = self.run_call(name, args, client_key.as_deref()).await;
                return self
                    .answer(name, outcome, client_key.as_deref())
                    .map(Into::into);
            }
            Err(e) => return Ok(self.error_result(name, e, client_key.as_deref()).into()),
        };
        let (held, claimed) = tokio::sync::oneshot::channel();
        let server = self.clone();
        let caller = client_key.clone();
        let mut running = self.inner.tasks.spawn(async move {
            let call = server.run_call(name, args, caller.as_deref());
            crate::engine::as_task_start(held, call).await
        });
        let claimed = async { claimed.await.is_ok() };
        let ended = tokio::select! {
            biased;
            ended = &mut running => Some(ended),
            true = claimed => None,
        };
        let ended = match ended {
            None => None,
            Some(Ok(outcome)) => Some(outcome),
            Some(Err(e)) => {
                tracing::error!(tool = name, key = %key, error = %e, "tool-contracts: a call started as an MCP task panicked or was cancelled");
                return Err(ErrorData::internal_error(
                    format!("the call of `{name}` (key {key}) stopped before its task could be created: {e}"),
                    Some(json!({ "code": "internal", "key": key })),
                ));
            }
        };
        // Whether the store now holds this intent under the key: the claim was made, the call
        // ended with a result or a stored error, or another call of the same intent holds
        // it (the engine refuses another intent's holder as `KeyReused` first).
        let names_the_task = match &ended {
            None | Some(Ok(_)) => true,
            Some(Err(e)) => matches!(
                e,
                Error::InProgress { .. } | Error::ToolFailed { .. } | Error::OutcomeUnknown { .. }
            ),
        };
        if names_the_task {
            match self.operation(&key).await {
                Ok(Some(op)) => {
                    if ended.is_none() {
                        tracing::debug!(tool = name, key = %key, "tool-contracts: call runs on as an MCP task");
                    }
                    let created = CreateTaskResult::new(self.task_of(&op, tool).0)
                        .with_meta(self.task_meta(&key, client_key.as_deref()));
                    return Ok(created.into());
                }
                // Released (an error not stored) or expired at once: nothing to name.
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(tool = name, key = %key, error = %e, "tool-contracts: the task cannot be read back; answering the call with its result")
                }
            }
        }
        // Never a task id `tasks/get` cannot resolve: the call's own answer instead.
        let outcome = match ended {
            Some(outcome) => outcome,
            None => running.await.map_err(|e| {
                ErrorData::internal_error(
                    format!("the call of `{name}` (key {key}) stopped: {e}"),
                    Some(json!({ "code": "internal", "key": key })),
                )
            })?,
        };
        self.answer(name, outcome, client_key.as_deref())
            .map(Into::into)
    }

    /// The `_meta` of a `CreateTaskResult`: the key and the operation link (the redirect of
    /// Post/Redirect/Get), and the client key if one was sent.
    fn task_meta(&self, key: &str, client_key: Option<&str>) -> MetaObject {
        let mut call = Map::new();
        call.insert("key".into(), key.into());
        call.insert("operation".into(), operation_uri(key).into());
        if let Some(k) = client_key {
            call.insert("clientKey".into(), k.into());
        }
        let mut meta = Map::new();
        meta.insert(CALL_META_KEY.to_owned(), Value::Object(call));
        MetaObject(meta)
    }

    /// The operation of a task id, if it is a task here: readable in this server's scope,
    /// and made by one of its tools that take tasks.
    async fn task_operation(
        &self,
        task_id: &str,
    ) -> Result<(Operation, &'static ToolDescriptor), ErrorData> {
        let op = match self.operation(task_id).await {
            Ok(Some(op)) => op,
            Ok(None) => return Err(unknown_task(task_id)),
            Err(e) => return Err(store_failed(task_id, &e)),
        };
        match self.inner.registry.get(&op.tool) {
            Some(tool) if tool.task_support() != TaskSupport::Forbidden => Ok((op, tool)),
            _ => Err(unknown_task(task_id)),
        }
    }

    /// `tasks/get`: the task as the store has it now.
    pub(super) async fn get_task_by_id(&self, task_id: &str) -> Result<DetailedTask, ErrorData> {
        let (op, tool) = self.task_operation(task_id).await?;
        let (task, payload) = self.task_of(&op, tool);
        Ok(DetailedTask::new(task, payload))
    }

    /// `tasks/cancel`: acknowledged for a working task, which runs on (docs/mcp.md,
    /// "Cancelling a task"): its effect may be under way and cannot be un-sent, and a body
    /// stopped mid-effect would leave an unknown outcome, worse than the result. A finished
    /// task cannot be cancelled (`-32602`).
    pub(super) async fn cancel_task_by_id(&self, task_id: &str) -> Result<(), ErrorData> {
        let (op, _) = self.task_operation(task_id).await?;
        if op.state == OperationState::InProgress {
            tracing::info!(tool = %op.tool, key = %op.key, "tool-contracts: tasks/cancel acknowledged; the call runs to its end (a mutating call is never stopped mid-effect)");
            return Ok(());
        }
        Err(ErrorData::invalid_params(
            format!(
                "task {task_id} has already finished ({}): there is nothing left to cancel; `tasks/get` returns its outcome",
                op.state
            ),
            Some(json!({ "code": "task_finished", "taskId": task_id, "state": op.state.as_str() })),
        ))
    }

    /// `tasks/update`: no task of this server ever asks for input, so responses are
    /// acknowledged and ignored (SEP-2663: responses to requests that are not outstanding
    /// are ignored); an unknown id is `-32602`.
    pub(super) async fn update_task_by_id(&self, task_id: &str) -> Result<(), ErrorData> {
        self.task_operation(task_id).await.map(drop)
    }

    /// The task view of an operation: its base fields (their `status` the payload's), and
    /// its payload by state.
    fn task_of(&self, op: &Operation, tool: &ToolDescriptor) -> (Task, TaskPayload) {
        let (mut task, payload) = self.task_parts(op, tool);
        task.status = payload.status();
        (task, payload)
    }

    fn task_parts(&self, op: &Operation, tool: &ToolDescriptor) -> (Task, TaskPayload) {
        let ttl = op
            .expires_at
            .duration_since(op.created_at)
            .unwrap_or_default();
        let task = Task::new(
            op.key.clone(),
            TaskStatus::Working,
            rfc3339_text(op.created_at),
            rfc3339_text(op.updated_at),
        )
        .with_ttl_ms(millis(ttl));
        let name = tool.name();
        let key = Some(op.key.as_str());
        match op.state {
            OperationState::InProgress => {
                let left = op.lease_remaining.map_or(0, millis);
                let message = format!("running: its lease is renewed while it runs ({left} ms left now); poll `tasks/get` for the result");
                let task = task
                    .with_status_message(message)
                    .with_poll_interval_ms(millis(self.inner.task_poll_interval));
                (task, TaskPayload::Working)
            }
            OperationState::Completed => {
                let output = ToolOutput {
                    value: op.result.clone().unwrap_or(Value::Null),
                    key: Some(op.key.clone()),
                    // What every retry of the call answers: the stored result.
                    outcome: Outcome::Replayed,
                };
                let result = object_of(self.success_result(name, output, None));
                let task = task.with_status_message(
                    "completed: the result is stored, and every retry of the call returns it",
                );
                (task, TaskPayload::Completed { result })
            }
            OperationState::Failed => {
                let stored = op.error.as_ref().map_or_else(String::new, Value::to_string);
                let error = Error::ToolFailed {
                    tool: name.to_owned(),
                    key: key.map(str::to_owned),
                    message: stored,
                };
                let result = object_of(self.error_result(name, error, None));
                let task = task.with_status_message(
                    "completed with the tool's error (isError), which is stored: every retry of the call returns it",
                );
                (task, TaskPayload::Completed { result })
            }
            // `Unknown`, and any state a later version adds: never presented as a result.
            _ => {
                let next = if tool.has_verify() {
                    "call the tool again with the same arguments: its `verify` finds out whether the effect happened, and the task then completes"
                } else {
                    "check whether the effect happened before calling again (a retry reports the unknown outcome, or reruns with `on_unknown = \"rerun\"`), then resolve the key with an operator tool"
                };
                let message = format!("outcome unknown: the call's worker stopped mid-call, so the effect may or may not have happened; reading the task never reruns it. Next: {next}");
                let error = ErrorData::new(
                    ErrorCode::INTERNAL_ERROR,
                    Error::OutcomeUnknown {
                        tool: name.to_owned(),
                        key: op.key.clone(),
                    }
                    .to_string(),
                    Some(json!({
                        "code": "outcome_unknown",
                        "tool": name,
                        "key": op.key,
                        "verify": tool.has_verify(),
                    })),
                );
                let task = task.with_status_message(message);
                (
                    task,
                    TaskPayload::Failed {
                        error: object_of(error),
                    },
                )
            }
        }
    }
}
