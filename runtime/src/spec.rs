//! The static contract of one tool, as declared by its attribute.

use core::time::Duration;

/// Whether a tool changes the world (and so needs a key) or only reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolKind {
    /// Changes something outside the call: deduplicated by its idempotency key.
    Mutating,
    /// Only reads: idempotent by nature, runs every time.
    ReadOnly,
}

/// What a duplicate call does while the first is still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Concurrent {
    /// Wait for the first call's result and return it (the default).
    Wait,
    /// Fail at once with [`Error::InProgress`](crate::Error::InProgress).
    Reject,
}

/// What a call does when its key was already used with other non-key arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mismatch {
    /// Fail with [`Error::KeyReused`](crate::Error::KeyReused) naming the differing parameters (the default).
    Reject,
    /// Return the stored result anyway.
    Replay,
}

/// What a call does when it finds a claim whose lease expired: the worker died mid-call,
/// so the effect may or may not have happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OnUnknown {
    /// Fail with [`Error::OutcomeUnknown`](crate::Error::OutcomeUnknown) (the default).
    Fail,
    /// Take the claim over and run the body again (at-least-once).
    Rerun,
}

/// Whether an MCP client that declares the tasks extension (`io.modelcontextprotocol/tasks`,
/// SEP-2663) gets a task for a call of the tool: the `task` option, in the vocabulary of
/// MCP's `taskSupport` (docs/mcp.md, "Tasks").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TaskSupport {
    /// Every call is answered with its result (the default).
    Forbidden,
    /// A client that declares the extension gets a task (`CreateTaskResult`) whose id is
    /// the call's key; any other client gets the result.
    Optional,
    /// Only as a task: a client that does not declare the extension gets the error
    /// `-32021` (missing required client capability) and nothing runs.
    Required,
}

crate::lowercase_names! {
    TaskSupport {
        Forbidden => "forbidden",
        Optional => "optional",
        Required => "required",
    }
}

/// Whether a call of a mutating tool waits for a human's approval before it runs: the
/// `approval` option (docs/approval.md). An approval is a fact stored under the call's key,
/// so a retry never asks twice and every process sharing the store sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ApprovalRule {
    /// No approval (the default), unless the tool is `destructive` and the process
    /// requires approval for destructive tools
    /// ([`require_approval_for_destructive`](crate::require_approval_for_destructive)).
    Default,
    /// `approval = "never"`: never asks, whatever the process-wide policy says.
    Never,
    /// `approval = "required"`: every new intent waits for a decision.
    Required,
    /// `approval = path::to::policy`: the policy function decides per call from the
    /// tool's parameters (e.g. above an amount).
    Policy,
}

crate::lowercase_names! {
    ApprovalRule {
        Default => "default",
        Never => "never",
        Required => "required",
        Policy => "policy",
    }
}

/// Where a tool was declared, for error messages and operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SourceLocation {
    /// `module_path!()` of the tool.
    pub module_path: &'static str,
    /// `file!()` of the tool.
    pub file: &'static str,
    /// `line!()` of the tool's name.
    pub line: u32,
    /// `column!()` of the tool's name.
    pub column: u32,
}

impl core::fmt::Display for SourceLocation {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}

/// The static contract of one tool, built by the attribute macros as a `static`.
#[doc(hidden)]
#[derive(Debug)]
pub struct ToolSpec {
    pub name: &'static str,
    pub description: &'static str,
    pub kind: ToolKind,
    pub key_fields: &'static [&'static str],
    pub params: &'static [&'static str],
    pub version: u32,
    pub ttl: Duration,
    pub lease: Duration,
    /// How long a duplicate waits for a running call (`concurrent = "wait"`) before it gets
    /// `InProgress`.
    pub max_wait: Duration,
    pub concurrent: Concurrent,
    pub payload_mismatch: Mismatch,
    pub on_unknown: OnUnknown,
    pub cache_errors: bool,
    pub destructive: bool,
    pub open_world: bool,
    /// Whether an MCP call may become a task (`task = "optional"`).
    pub task: TaskSupport,
    /// Whether a call waits for a human's approval (`approval = ...`).
    pub approval: ApprovalRule,
    /// How long an approval request stays open, and how long a given approval may be used
    /// by the call's retry (`approval_expires`, default 24 h).
    pub approval_expires: Duration,
    /// The undo of `compensate = path`: registered for the call's journal entry when the
    /// tool is called inside a run; `None` without the option.
    pub compensate: Option<crate::run::CompensateFn>,
    pub location: SourceLocation,
}

impl ToolSpec {
    /// A spec with the attribute's default for every option (version 1, a day's ttl, a
    /// 30 s lease and max_wait, wait, reject, fail, no task): the one fixture that unit tests, fuzz
    /// targets and test suites start from when they build a descriptor by hand, overriding
    /// fields with struct update syntax.
    pub const fn fixture(
        name: &'static str,
        kind: ToolKind,
        key_fields: &'static [&'static str],
        params: &'static [&'static str],
        location: SourceLocation,
    ) -> Self {
        Self {
            name,
            description: "",
            kind,
            key_fields,
            params,
            version: 1,
            ttl: Duration::from_secs(86_400),
            lease: Duration::from_secs(30),
            max_wait: Duration::from_secs(30),
            concurrent: Concurrent::Wait,
            payload_mismatch: Mismatch::Reject,
            on_unknown: OnUnknown::Fail,
            cache_errors: false,
            destructive: false,
            open_world: false,
            task: TaskSupport::Forbidden,
            approval: ApprovalRule::Default,
            approval_expires: Duration::from_secs(86_400),
            compensate: None,
            location,
        }
    }
}
