//! The one error type of the crate: data an operator (or an LLM) can act on.

use crate::spec::SourceLocation;

/// Everything that can go wrong around a tool call, apart from the tool's own errors.
///
/// Every variant names the tool and, where one exists, the idempotency key, and its
/// message says what to do next. Tools declare `E: From<Error>` so these reach the caller
/// through the tool's own error type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A call with the same key is still running, and the tool's policy is
    /// `concurrent = "reject"` or this duplicate already waited `max_wait` for it.
    #[error("tool `{tool}`: a call with idempotency key {key} is still in progress; retry once it has finished (its lease expires within {lease_remaining_ms} ms if its worker died)")]
    InProgress {
        /// Tool name.
        tool: String,
        /// Idempotency key.
        key: String,
        /// How long the running call's lease still has, in milliseconds.
        lease_remaining_ms: u64,
    },
    /// The key was used before with other non-key arguments.
    #[error("tool `{tool}`: idempotency key {key} was already used with different values for {params}; a retry must repeat the same arguments, and a new intent needs different key fields ({key_fields})", params = list(.params), key_fields = list(.key_fields))]
    KeyReused {
        /// Tool name.
        tool: String,
        /// Idempotency key.
        key: String,
        /// Where the arguments differ from the first call's: the deepest differing paths,
        /// e.g. `note`, `cart.items` (lengths differ) or `cart.items.1`.
        params: Vec<String>,
        /// The tool's key fields, to say what makes a new intent.
        key_fields: Vec<String>,
    },
    /// An earlier call with this key claimed it and never finished: its worker died or lost
    /// its lease mid-call, so the effect may or may not have happened.
    #[error("tool `{tool}`: the outcome of an earlier call with idempotency key {key} is unknown (its worker stopped mid-call); check whether the effect happened before retrying, then resolve the key with an operator tool")]
    OutcomeUnknown {
        /// Tool name.
        tool: String,
        /// Idempotency key.
        key: String,
    },
    /// The store failed or could not be reached; nothing ran (fail closed).
    #[error("tool `{tool}`: the idempotency store failed{for_key}: {source}; nothing was run, retry when the store is back", for_key = key_suffix(.key))]
    Store {
        /// Tool name.
        tool: String,
        /// Idempotency key (`None` if none was derived yet).
        key: Option<String>,
        /// What the store said, with its cause.
        #[source]
        source: crate::store::StoreError,
    },
    /// The arguments cannot make a valid call; nothing was claimed or run.
    #[error("tool `{tool}`: invalid arguments{at}: {message}", at = field_suffix(.field))]
    InvalidArguments {
        /// Tool name.
        tool: String,
        /// The offending field path, if one is known.
        field: Option<String>,
        /// What was wrong and what to send instead.
        message: String,
    },
    /// No tool of that name is registered.
    #[error("no tool named `{name}` is registered{hint}", hint = unknown_tool_hint(.suggestion))]
    UnknownTool {
        /// The name asked for.
        name: String,
        /// The closest registered name, if any is close.
        suggestion: Option<String>,
    },
    /// A value could not be encoded or a stored value could not be decoded.
    #[error("tool `{tool}`: {message}{in_key}", in_key = key_note(.key))]
    Codec {
        /// Tool name.
        tool: String,
        /// Idempotency key (`None` before one is derived, or for read-only tools).
        key: Option<String>,
        /// What failed and the remedy.
        message: String,
    },
    /// A `#[context]` parameter has no value in the registry.
    #[error("tool `{tool}`: no context value of type `{type_name}` for parameter `{param}`; add one with `Registry::with_context(value)`")]
    MissingContext {
        /// Tool name.
        tool: String,
        /// Parameter name.
        param: String,
        /// Rust type expected.
        type_name: String,
    },
    /// The tool ran and returned its own error (reported by [`Registry::call`](crate::Registry::call)).
    #[error("tool `{tool}` failed: {message}")]
    ToolFailed {
        /// Tool name.
        tool: String,
        /// Idempotency key (`None` for read-only tools).
        key: Option<String>,
        /// The tool error's `Display`.
        message: String,
    },
    /// Two tools (free functions or methods) share a name: their keys would collide, so
    /// neither is called and nothing is claimed.
    #[error("two tools are named `{name}`: one at {first}, one at {second}; their calls would share stored results, so nothing ran. Give one of them `name = \"...\"`")]
    DuplicateTool {
        /// The shared name.
        name: String,
        /// Where the first was declared.
        first: SourceLocation,
        /// Where the second was declared.
        second: SourceLocation,
    },
    /// A mutating tool's key field is not a path in the JSON its callers send: serde renamed
    /// or flattened a field on the way (`#[serde(rename)]`, `rename_all`, `flatten`), so the
    /// Rust path the attribute names is not the JSON path `tools/list` publishes and clients
    /// follow. Reported when the registry is built; no tool of it is called.
    #[error("tool `{tool}`: key field `{path}` is not a path in the JSON arguments a client sends: {reason}. Key fields are published in `tools/list` and followed in the call's JSON, but serde renamed or moved that field (`rename`, `rename_all`, `flatten`), so its Rust path names nothing there. {remedy}", remedy = key_field_remedy(.path, .resolved))]
    KeyFieldUnresolved {
        /// Tool name.
        tool: String,
        /// The key field path as written in the attribute.
        path: String,
        /// The leading segments of `path` that do resolve (empty if none does).
        resolved: String,
        /// Why the next segment does not resolve, with the JSON names found there.
        reason: String,
    },
    /// On resume, the code asked for another step than the journal recorded at that
    /// position: the task's code changed under a running task.
    #[error("run `{run}` (key {key}): at position {position} the journal recorded `{recorded}` but the code now asks for `{requested}`; the task's code changed while it was running. Finish or resolve the old run before deploying a new step order, or start the task under a new intent or run version")]
    NonDeterministic {
        /// Run name.
        run: String,
        /// Run key.
        key: String,
        /// Position in the journal (0-based).
        position: u32,
        /// What the journal holds there (`step:name` or `tool:name`).
        recorded: String,
        /// What the code asked for.
        requested: String,
    },
    /// A step was asked of a run this handle does not own (another worker runs it, or it
    /// is finished).
    #[error("run `{run}` (key {key}) is {} and not owned by this handle; wait for its result with `Run::wait` instead of running its steps", match .state { crate::run::RunState::Finished => "finished", _ => "running elsewhere" })]
    RunNotOwned {
        /// Run name.
        run: String,
        /// Run key.
        key: String,
        /// Where the run stands: running elsewhere (or abandoned), or finished.
        state: crate::run::RunState,
    },
    /// The call needs a human's approval and none was given yet: nothing ran and nothing
    /// was claimed but the request (docs/approval.md). Retry the same call once someone
    /// approved it: it runs once.
    #[error("tool `{tool}`: this call needs a person's approval before it runs, and none was given yet; nothing ran. Operation {key} is awaiting approval: ask a person to approve it (`tool-contracts approve {key}`, `POST /operations/{key}/approve`, or `tool_contracts::approve`), then retry this same call and it runs once. The request expires in {expires_in_ms} ms if nobody answers")]
    AwaitingApproval {
        /// Tool name.
        tool: String,
        /// The call's idempotency key: the operation id to approve.
        key: String,
        /// How long the request stays open, in milliseconds.
        expires_in_ms: u64,
    },
    /// Someone denied this intent: nothing ran, and every retry of it gets this denial
    /// until the decision expires (the tool's `ttl`).
    #[error("tool `{tool}`: {by} denied this call (operation {key}){}; nothing ran. Do not retry it: every retry of this intent gets this denial. Tell the user, or ask for a different action", reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default())]
    Denied {
        /// Tool name.
        tool: String,
        /// The call's idempotency key.
        key: String,
        /// Who denied it, and through which channel.
        by: String,
        /// The reason they gave.
        reason: Option<String>,
    },
    /// A decision was asked for a call that is not waiting for one.
    #[error("operation {key} cannot be decided: {message}")]
    NoPendingApproval {
        /// The call's idempotency key.
        key: String,
        /// Why, and what to do.
        message: String,
    },
    /// The run is compensating (or was compensated): no new step or tool call runs in it.
    /// Replay its finished steps and call `Run::compensate`, which resumes the
    /// compensation where it stopped.
    #[error("run `{run}` (key {key}) is being compensated: {message}")]
    RunCompensating {
        /// Run name.
        run: String,
        /// Run key.
        key: String,
        /// What was refused and what to do.
        message: String,
    },
}

fn list(items: &[String]) -> String {
    items
        .iter()
        .map(|p| format!("`{p}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn field_suffix(field: &Option<String>) -> String {
    match field {
        Some(f) => format!(" at `{f}`"),
        None => String::new(),
    }
}

fn key_suffix(key: &Option<String>) -> String {
    key.as_ref()
        .map(|k| format!(" for key {k}"))
        .unwrap_or_default()
}

fn key_note(key: &Option<String>) -> String {
    key.as_ref()
        .map(|k| format!(" (idempotency key {k})"))
        .unwrap_or_default()
}

fn key_field_remedy(path: &str, resolved: &str) -> String {
    if resolved.is_empty() {
        format!("Name one of the tool's parameters in `idempotency_key_fields` instead of `{path}`")
    } else {
        format!("Key on the parent object instead (`{resolved}`: the whole value, keyed under its JSON names), or drop the rename so that `{path}` is also its JSON path")
    }
}

fn unknown_tool_hint(suggestion: &Option<String>) -> String {
    match suggestion {
        Some(s) => format!("; did you mean `{s}`?"),
        None => "; list the tools with `tools/list` or `Registry::iter()`".to_owned(),
    }
}

impl Error {
    /// The tool the error is about, if any.
    pub fn tool(&self) -> Option<&str> {
        match self {
            Error::InProgress { tool, .. }
            | Error::KeyReused { tool, .. }
            | Error::OutcomeUnknown { tool, .. }
            | Error::Store { tool, .. }
            | Error::InvalidArguments { tool, .. }
            | Error::Codec { tool, .. }
            | Error::MissingContext { tool, .. }
            | Error::ToolFailed { tool, .. }
            | Error::KeyFieldUnresolved { tool, .. }
            | Error::AwaitingApproval { tool, .. }
            | Error::Denied { tool, .. } => Some(tool),
            Error::NonDeterministic { run, .. }
            | Error::RunNotOwned { run, .. }
            | Error::RunCompensating { run, .. } => Some(run),
            Error::UnknownTool { .. }
            | Error::DuplicateTool { .. }
            | Error::NoPendingApproval { .. } => None,
        }
    }

    /// The idempotency key the error is about, if one was derived.
    pub fn key(&self) -> Option<&str> {
        match self {
            Error::InProgress { key, .. }
            | Error::KeyReused { key, .. }
            | Error::OutcomeUnknown { key, .. }
            | Error::NonDeterministic { key, .. }
            | Error::RunNotOwned { key, .. }
            | Error::RunCompensating { key, .. }
            | Error::AwaitingApproval { key, .. }
            | Error::Denied { key, .. }
            | Error::NoPendingApproval { key, .. } => Some(key),
            Error::Store { key, .. } | Error::Codec { key, .. } | Error::ToolFailed { key, .. } => {
                key.as_deref()
            }
            _ => None,
        }
    }

    /// A stable machine-readable code, e.g. for MCP results and metrics.
    pub fn code(&self) -> &'static str {
        match self {
            Error::InProgress { .. } => "in_progress",
            Error::KeyReused { .. } => "key_reused",
            Error::OutcomeUnknown { .. } => "outcome_unknown",
            Error::Store { .. } => "store",
            Error::InvalidArguments { .. } => "invalid_arguments",
            Error::UnknownTool { .. } => "unknown_tool",
            Error::Codec { .. } => "codec",
            Error::MissingContext { .. } => "missing_context",
            Error::ToolFailed { .. } => "tool_failed",
            Error::DuplicateTool { .. } => "duplicate_tool",
            Error::KeyFieldUnresolved { .. } => "key_field_unresolved",
            Error::NonDeterministic { .. } => "non_deterministic",
            Error::RunNotOwned { .. } => "run_not_owned",
            Error::RunCompensating { .. } => "run_compensating",
            Error::AwaitingApproval { .. } => "awaiting_approval",
            Error::Denied { .. } => "denied",
            Error::NoPendingApproval { .. } => "no_pending_approval",
        }
    }
}
