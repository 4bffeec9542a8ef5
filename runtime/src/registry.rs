//! Tool descriptors, collected at link time, and the registry agents call tools through.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use serde_json::{json, Map, Value};

use crate::engine;
use crate::error::Error;
use crate::spec::{
    Concurrent, Mismatch, OnUnknown, SourceLocation, TaskSupport, ToolKind, ToolSpec,
};

/// A boxed `Send` future, the return type of a tool's registry entry point.
#[doc(hidden)]
pub type BoxFuture<'a, T> = core::pin::Pin<Box<dyn core::future::Future<Output = T> + Send + 'a>>;
/// A tool's registry entry point: decode JSON arguments, call the tool, encode its result.
#[doc(hidden)]
pub type InvokeFn =
    for<'a> fn(&'a Context, CallArgs<'a>) -> BoxFuture<'a, Result<CallResult, Error>>;

/// A registry call's arguments as its caller has them: a parsed `Value` ([`Registry::call`])
/// or JSON text ([`Registry::call_json`], decoded without building a `Value`).
#[doc(hidden)]
#[derive(Debug)]
pub enum CallArgs<'a> {
    /// Parsed JSON.
    Value(Value),
    /// JSON text.
    Text(&'a str),
}

impl CallArgs<'_> {
    /// Whether the caller gave JSON text, and so takes the result as JSON text.
    pub fn is_text(&self) -> bool {
        matches!(self, CallArgs::Text(_))
    }
}

/// A tool's result as its registry entry point encoded it: a `Value` for a call given a
/// `Value`, JSON text for one given text (no `Value` built either way).
#[doc(hidden)]
#[derive(Debug)]
pub enum CallResult {
    /// The result as a `Value`.
    Value(Value),
    /// The result as JSON text.
    Text(String),
}

impl From<Value> for CallResult {
    fn from(value: Value) -> Self {
        CallResult::Value(value)
    }
}

#[cfg(test)]
impl CallArgs<'_> {
    /// The arguments as a `Value` (text that is not JSON becomes `null`), for tests' own
    /// entry points.
    pub(crate) fn into_value(self) -> Value {
        match self {
            CallArgs::Value(value) => value,
            CallArgs::Text(text) => serde_json::from_str(text).unwrap_or(Value::Null),
        }
    }
}
/// What a mutating tool's registry entry point that may replay at once ([`FastFn`]) did
/// with a call.
#[doc(hidden)]
pub enum Fast<'a> {
    /// Refused before the engine: arguments that do not decode.
    Refused(Error),
    /// A replay answered from the store's memory (`engine::replay_now`): no future made.
    Done(Result<CallResult, Error>, crate::engine::Report),
    /// The rest: the call's future, with the call already made for the tool to take.
    Run(BoxFuture<'a, Result<CallResult, Error>>),
}

/// A mutating tool's registry entry point: decode, make the call, and replay it at once
/// if the store's memory holds it, else the call's future (the one [`InvokeFn`] makes,
/// with the call already made for the tool to take).
#[doc(hidden)]
pub type FastFn = for<'a> fn(&'a Context, CallArgs<'a>) -> Fast<'a>;

/// A tool's key derivation from JSON arguments.
#[doc(hidden)]
pub type KeyOfFn = fn(&Value) -> Result<String, Error>;
/// A tool's `verify` over stored JSON arguments: `Some(result JSON)` if the effect happened.
#[doc(hidden)]
pub type ReconcileFn =
    for<'a> fn(&'a Context, &'a str) -> BoxFuture<'a, Result<Option<String>, Error>>;

/// The reverse-DNS prefix of this crate's entries in MCP `_meta` objects.
pub const META_PREFIX: &str = "dev.tool-contracts";

/// Everything known about one registered tool: its contract, schema and entry point.
pub struct ToolDescriptor {
    spec: &'static ToolSpec,
    key_of: Option<KeyOfFn>,
    invoke: InvokeFn,
    input_schema: fn() -> Value,
    output_schema: fn() -> Option<Value>,
    reconcile: Option<ReconcileFn>,
    fast: Option<FastFn>,
}

inventory::collect!(ToolDescriptor);

impl core::fmt::Debug for ToolDescriptor {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ToolDescriptor")
            .field("spec", self.spec)
            .finish_non_exhaustive()
    }
}

impl ToolDescriptor {
    /// Built by the attribute macros.
    #[doc(hidden)]
    pub const fn new(
        spec: &'static ToolSpec,
        key_of: Option<KeyOfFn>,
        invoke: InvokeFn,
        input_schema: fn() -> Value,
        output_schema: fn() -> Option<Value>,
    ) -> Self {
        Self {
            spec,
            key_of,
            invoke,
            input_schema,
            output_schema,
            reconcile: None,
            fast: None,
        }
    }

    /// Adds the tool's registry entry point that replays without making a future.
    #[doc(hidden)]
    pub const fn with_fast(mut self, fast: FastFn) -> Self {
        self.fast = Some(fast);
        self
    }

    /// Adds the tool's `verify`, used to reconcile abandoned calls.
    #[doc(hidden)]
    pub const fn with_reconcile(mut self, reconcile: ReconcileFn) -> Self {
        self.reconcile = Some(reconcile);
        self
    }

    /// Whether the tool declares `verify`, so abandoned calls can be reconciled.
    pub fn has_verify(&self) -> bool {
        self.reconcile.is_some()
    }

    /// Whether the tool declares `compensate = path`: called inside a run, its call can be
    /// undone by the run's compensation (README "Compensation").
    pub fn is_compensable(&self) -> bool {
        self.spec.compensate.is_some()
    }

    pub(crate) fn reconcile_fn(&self) -> Option<ReconcileFn> {
        self.reconcile
    }

    /// The tool's name, unique in a registry.
    pub fn name(&self) -> &'static str {
        self.spec.name
    }
    /// The description shown to models (the doc comment unless set in the attribute).
    pub fn description(&self) -> &'static str {
        self.spec.description
    }
    /// Mutating (keyed) or read-only.
    pub fn kind(&self) -> ToolKind {
        self.spec.kind
    }
    /// Whether the tool is deduplicated by an idempotency key.
    pub fn is_mutating(&self) -> bool {
        self.spec.kind == ToolKind::Mutating
    }
    /// The key fields as written in the attribute, in key order.
    pub fn idempotency_key_fields(&self) -> &'static [&'static str] {
        self.spec.key_fields
    }
    /// The names of the JSON arguments, in declaration order.
    pub fn params(&self) -> &'static [&'static str] {
        self.spec.params
    }
    /// Contract version, part of every key.
    pub fn version(&self) -> u32 {
        self.spec.version
    }
    /// How long a completed result is kept.
    pub fn ttl(&self) -> core::time::Duration {
        self.spec.ttl
    }
    /// How long an in-progress claim is held before it counts as abandoned.
    pub fn lease(&self) -> core::time::Duration {
        self.spec.lease
    }
    /// How long a duplicate waits for a running call before it gets `InProgress`.
    pub fn max_wait(&self) -> core::time::Duration {
        self.spec.max_wait
    }
    /// Policy for duplicates that arrive while the first call runs.
    pub fn concurrent(&self) -> Concurrent {
        self.spec.concurrent
    }
    /// Policy for a key reused with other arguments.
    pub fn payload_mismatch(&self) -> Mismatch {
        self.spec.payload_mismatch
    }
    /// Policy for abandoned calls.
    pub fn on_unknown(&self) -> OnUnknown {
        self.spec.on_unknown
    }
    /// Whether calls wait for a person's approval: `Required`, `Policy` (its function
    /// decides per call) or `Never`, with the process-wide policy for destructive tools
    /// applied ([`require_approval_for_destructive`](crate::require_approval_for_destructive)).
    pub fn approval(&self) -> crate::ApprovalRule {
        match self.spec.kind {
            ToolKind::Mutating => crate::approval::effective_rule(self.spec),
            ToolKind::ReadOnly => crate::ApprovalRule::Never,
        }
    }
    /// How long an approval request stays open, and an approval usable.
    pub fn approval_expires(&self) -> core::time::Duration {
        self.spec.approval_expires
    }
    /// Whether `Err` results are stored and replayed.
    pub fn cache_errors(&self) -> bool {
        self.spec.cache_errors
    }
    /// Whether an MCP call of the tool may become a task (`task = "optional"`); always
    /// [`Forbidden`](TaskSupport::Forbidden) for a read-only tool, which has no key to
    /// name a task by.
    pub fn task_support(&self) -> TaskSupport {
        match self.spec.kind {
            ToolKind::Mutating => self.spec.task,
            ToolKind::ReadOnly => TaskSupport::Forbidden,
        }
    }
    /// Where the tool was declared.
    pub fn location(&self) -> SourceLocation {
        self.spec.location
    }
    /// JSON Schema of the tool's JSON arguments (an object schema).
    pub fn input_schema(&self) -> Value {
        (self.input_schema)()
    }
    /// JSON Schema of the tool's result, where its type gives one.
    pub fn output_schema(&self) -> Option<Value> {
        (self.output_schema)()
    }

    /// MCP tool annotations: `readOnlyHint`, `destructiveHint`, `idempotentHint` (true for
    /// both kinds: a mutating tool is made idempotent by its key) and `openWorldHint`.
    pub fn annotations(&self) -> Value {
        json!({
            "readOnlyHint": !self.is_mutating(),
            "destructiveHint": self.is_mutating() && self.spec.destructive,
            "idempotentHint": true,
            "openWorldHint": self.spec.open_world,
        })
    }

    /// The idempotency contract, as published under `_meta` in MCP `tools/list`.
    pub fn idempotency_meta(&self) -> Value {
        if !self.is_mutating() {
            return json!({ "kind": "read_only" });
        }
        json!({
            "kind": "mutating",
            "keySpec": crate::key::TOOL_KEY_CONTRACT,
            "keyFields": self.spec.key_fields,
            "version": self.spec.version,
            "ttlSeconds": self.spec.ttl.as_secs(),
            "leaseSeconds": self.spec.lease.as_secs_f64(),
            "concurrent": match self.spec.concurrent { Concurrent::Wait => "wait", Concurrent::Reject => "reject" },
            "payloadMismatch": match self.spec.payload_mismatch { Mismatch::Reject => "reject", Mismatch::Replay => "replay" },
            "onUnknown": match self.spec.on_unknown { OnUnknown::Fail => "fail", OnUnknown::Rerun => "rerun" },
            "cacheErrors": self.spec.cache_errors,
            "verify": self.reconcile.is_some(),
            "task": self.task_support().as_str(),
            "approval": self.approval().as_str(),
            "approvalExpiresSeconds": self.spec.approval_expires.as_secs(),
            "compensable": self.is_compensable(),
        })
    }

    /// The key a call with these JSON arguments would get, in the current scope; `None`
    /// for a read-only tool. Invalid arguments give the same error the call would.
    pub fn key(&self, args: &Value) -> Result<Option<String>, Error> {
        match self.key_of {
            Some(key_of) => key_of(args).map(Some),
            None => Ok(None),
        }
    }

    /// This tool as an entry of an MCP `tools/list` result.
    pub fn to_mcp_json(&self) -> Value {
        let mut tool = Map::new();
        tool.insert("name".into(), self.name().into());
        tool.insert("description".into(), self.description().into());
        tool.insert("inputSchema".into(), self.input_schema());
        if let Some(schema) = self.output_schema() {
            // MCP requires an object at the root of an output schema.
            if schema.get("type").and_then(Value::as_str) == Some("object") {
                tool.insert("outputSchema".into(), schema);
            }
        }
        tool.insert("annotations".into(), self.annotations());
        tool.insert(
            "_meta".into(),
            json!({ format!("{META_PREFIX}/idempotency"): self.idempotency_meta() }),
        );
        Value::Object(tool)
    }
}

/// Values a registry injects into `#[context]` parameters, by type.
#[doc(hidden)]
#[derive(Default, Clone)]
pub struct Context {
    values: HashMap<TypeId, Arc<dyn Any + Send + Sync>>,
}

impl Context {
    /// The context value for a `&T` parameter.
    pub fn get<T: Any + Send + Sync>(
        &self,
        spec: &'static ToolSpec,
        param: &'static str,
    ) -> Result<&T, Error> {
        self.values
            .get(&TypeId::of::<T>())
            .and_then(|v| v.downcast_ref::<T>())
            .ok_or_else(|| Error::MissingContext {
                tool: spec.name.to_owned(),
                param: param.to_owned(),
                type_name: core::any::type_name::<T>().to_owned(),
            })
    }

    /// The context value for an owned `T` parameter (cloned).
    pub fn get_cloned<T: Any + Send + Sync + Clone>(
        &self,
        spec: &'static ToolSpec,
        param: &'static str,
    ) -> Result<T, Error> {
        self.get::<T>(spec, param).cloned()
    }
}

/// How a call that returned a result came by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// The tool's body ran for this call (read-only tools always run).
    Executed,
    /// The result was stored by an earlier call with the same key and replayed: nothing ran.
    Replayed,
    /// An earlier call of this intent had been abandoned (its worker died mid-call) and the
    /// tool's `verify` found its effect: the result is that call's, now stored; the body did
    /// not run.
    Reconciled,
}

crate::lowercase_names! {
    Outcome { Executed => "executed", Replayed => "replayed", Reconciled => "reconciled" }
}

impl ToolOutput<CallResult> {
    /// The result in the form the caller asked for; one that came back in the other form
    /// and does not convert is a codec error naming the tool `name`.
    fn convert<T>(
        self,
        name: &str,
        form: impl FnOnce(CallResult) -> Result<T, serde_json::Error>,
    ) -> Result<ToolOutput<T>, Error> {
        let ToolOutput {
            value,
            key,
            outcome,
        } = self;
        match form(value) {
            Ok(value) => Ok(ToolOutput {
                value,
                key,
                outcome,
            }),
            Err(e) => Err(Error::Codec {
                tool: name.to_owned(),
                key,
                message: format!("the result cannot be given as JSON in the form asked for: {e}"),
            }),
        }
    }
}

/// The result of [`Registry::call`] (`T` = `Value`) or [`Registry::call_json`] (`T` =
/// `String`, the result as JSON text).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ToolOutput<T = Value> {
    /// The tool's result as JSON.
    pub value: T,
    /// The call's idempotency key (`None` for read-only tools, which have none).
    pub key: Option<String>,
    /// Whether the tool ran, or the result was replayed or reconciled.
    pub outcome: Outcome,
}

/// Every tool an agent may call, by name, with the context values tools need.
#[derive(Clone)]
pub struct Registry {
    tools: Arc<[&'static ToolDescriptor]>,
    context: Arc<Context>,
}

impl core::fmt::Debug for Registry {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list()
            .entries(self.tools.iter().map(|t| t.name()))
            .finish()
    }
}

static GLOBAL: OnceLock<Result<Registry, Error>> = OnceLock::new();

/// The registry of every tool linked into this program (built on first use).
///
/// # Panics
/// If two tools share a name (naming both source locations) or a key field is not a path
/// in the tool's JSON arguments (see [`Registry::from_tools`]): program bugs that
/// [`try_registry`] reports as an error instead.
pub fn registry() -> &'static Registry {
    match try_registry() {
        Ok(registry) => registry,
        Err(e) => panic!("tool-contracts: {e}"),
    }
}

/// The registry of every tool linked into this program, or the error that refuses it: a
/// duplicate name or an unresolvable key field (see [`Registry::from_tools`]).
///
/// A crate that nothing references may be dropped by the linker with its tools: reference
/// it (`use my_tools as _;`) from the binary.
pub fn try_registry() -> Result<&'static Registry, Error> {
    GLOBAL
        .get_or_init(|| {
            let registry = Registry::from_tools(inventory::iter::<ToolDescriptor>)?;
            // Methods are not listed, but a method sharing a listed tool's name (or two
            // methods sharing one) would share stored results: refuse those too.
            match crate::contracts::first_duplicate() {
                Some(e) => Err(e),
                None => Ok(registry),
            }
        })
        .as_ref()
        .map_err(Clone::clone)
}

impl Registry {
    /// A registry of these tools (sorted by name), refusing duplicate names
    /// ([`Error::DuplicateTool`]) and key fields that are not paths in the JSON arguments a
    /// client sends ([`Error::KeyFieldUnresolved`]: a field renamed or flattened by serde
    /// on the way), so every published `keyFields` entry can be followed by a client.
    pub fn from_tools(
        tools: impl IntoIterator<Item = &'static ToolDescriptor>,
    ) -> Result<Registry, Error> {
        let mut tools: Vec<&'static ToolDescriptor> = tools.into_iter().collect();
        if let Some(pair) = crate::contracts::shared_names(tools.iter().map(|t| t.spec)).first() {
            return Err(crate::contracts::duplicate_error(pair));
        }
        // Names are unique now: name order is the registry's order.
        tools.sort_by(|a, b| a.name().cmp(b.name()));
        // Key fields are published as JSON paths: each must be one (see `key_paths`).
        for tool in &tools {
            crate::key_paths::check(tool)?;
        }
        Ok(Registry {
            tools: tools.into(),
            context: Arc::new(Context::default()),
        })
    }

    /// A copy of this registry that also injects `value` into `#[context]` parameters of
    /// type `&T` or `T` (replacing an earlier value of the same type).
    pub fn with_context<T: Any + Send + Sync>(&self, value: T) -> Registry {
        let mut context = Context::clone(&self.context);
        context.values.insert(TypeId::of::<T>(), Arc::new(value));
        Registry {
            tools: Arc::clone(&self.tools),
            context: Arc::new(context),
        }
    }

    /// The tools, in name order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &'static ToolDescriptor> + '_ {
        self.tools.iter().copied()
    }

    /// Number of tools.
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// Whether there is no tool.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// The tool of that name.
    pub fn get(&self, name: &str) -> Option<&'static ToolDescriptor> {
        self.tools
            .binary_search_by(|t| t.name().cmp(name))
            .ok()
            .map(|i| self.tools[i])
    }

    pub(crate) fn context(&self) -> &Context {
        &self.context
    }

    /// Calls a tool with JSON arguments through the same dedup engine as a direct call
    /// (same intent, same key). Invalid arguments fail before anything is claimed or run.
    pub async fn call(&self, name: &str, args: Value) -> Result<ToolOutput, Error> {
        let output = self.call_args(name, CallArgs::Value(args)).await?;
        output.convert(name, |result| match result {
            CallResult::Value(value) => Ok(value),
            CallResult::Text(text) => serde_json::from_str(&text),
        })
    }

    /// [`Registry::call`] with the arguments as JSON text (a request body, a message):
    /// decoded straight into the tool's parameters, with no `serde_json::Value` built on
    /// the way, under the same rules and with the same errors (an undeclared member at any
    /// depth, a field that does not decode, text that is not one JSON object:
    /// [`Error::InvalidArguments`], nothing claimed or run). The result comes back as JSON
    /// text, ready to be sent on: encoded straight from the tool's result type, or for a
    /// replay the stored text itself (once it has decoded into that type).
    pub async fn call_json(&self, name: &str, args: &str) -> Result<ToolOutput<String>, Error> {
        let output = self.call_args(name, CallArgs::Text(args)).await?;
        output.convert(name, |result| match result {
            CallResult::Text(text) => Ok(text),
            CallResult::Value(value) => serde_json::to_string(&value),
        })
    }

    /// [`Registry::call`] or [`Registry::call_json`], by the arguments' form.
    pub(crate) async fn call_args(
        &self,
        name: &str,
        args: CallArgs<'_>,
    ) -> Result<ToolOutput<CallResult>, Error> {
        let tool = self.get(name).ok_or_else(|| self.unknown_tool(name))?;
        if !tool.is_mutating() {
            let value = (tool.invoke)(&self.context, args).await?;
            return Ok(ToolOutput {
                value,
                key: None,
                outcome: Outcome::Executed,
            });
        }
        let telemetry = crate::telemetry::RegistryCall::start(tool.name());
        let text = args.is_text();
        let future = match tool.fast {
            Some(fast) => match fast(&self.context, args) {
                Fast::Refused(e) => {
                    telemetry.refused(e.code());
                    return Err(e);
                }
                Fast::Done(result, report) => return reported(result, report.0),
                Fast::Run(future) => future,
            },
            None => (tool.invoke)(&self.context, args),
        };
        let mut scoped = core::pin::pin!(engine::with_report(future, text));
        let result = scoped.as_mut().await;
        let report = scoped
            .take_value()
            .map(|scope| scope.into_inner().into_report())
            .unwrap_or_default();
        // The engine reports a key or an error for every call it sees: neither means the
        // call was refused before it (arguments that do not decode, a missing context).
        if let (Err(e), None, None) = (&result, &report.key, &report.error) {
            telemetry.refused(e.code());
        }
        reported(result, report)
    }

    /// The error for a tool `name` that is not here, with the closest name if one is close.
    pub(crate) fn unknown_tool(&self, name: &str) -> Error {
        Error::UnknownTool {
            name: name.to_owned(),
            suggestion: self.closest(name),
        }
    }

    fn closest(&self, name: &str) -> Option<String> {
        // The macros' rule (`macros/src/diag.rs`): at most a third of the longer name's
        // characters differ, one edit always tolerated, transpositions count one.
        let mut best: Option<(usize, &'static str)> = None;
        for tool in self.tools.iter() {
            let candidate = tool.name();
            let distance = strsim::osa_distance(name, candidate);
            let longest = name.chars().count().max(candidate.chars().count());
            if distance == 0 || distance > (longest / 3).max(1) {
                continue;
            }
            if best.is_none_or(|(d, _)| distance < d) {
                best = Some((distance, candidate));
            }
        }
        best.map(|(_, name)| name.to_owned())
    }

    /// The registry as an MCP `tools/list` result: `{"tools": [...]}`, each tool's
    /// idempotency contract under `_meta`.
    pub fn to_json(&self) -> Value {
        json!({ "tools": self.tools.iter().map(|t| t.to_mcp_json()).collect::<Vec<_>>() })
    }
}

/// A mutating tool's registry call as its caller gets it, from the entry point's result
/// and the engine's report: the key and how the call ended, or the engine's own refusal
/// (more precise than the tool error it became), or the tool's error with the key.
fn reported(
    result: Result<CallResult, Error>,
    report: engine::CallReport,
) -> Result<ToolOutput<CallResult>, Error> {
    let key = report.key;
    match (result, report.error) {
        (Ok(value), _) => Ok(ToolOutput {
            value,
            key,
            outcome: report.outcome.unwrap_or(Outcome::Executed),
        }),
        (Err(_), Some(engine_error)) => Err(*engine_error),
        (Err(Error::ToolFailed { tool, message, .. }), None) => {
            Err(Error::ToolFailed { tool, key, message })
        }
        (Err(e), None) => Err(e),
    }
}
