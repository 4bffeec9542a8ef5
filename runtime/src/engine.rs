//! The dedup engine: claim, run once, store, replay.

use core::future::Future;
use core::time::Duration;
use std::cell::Cell;
use std::sync::{Arc, OnceLock};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::ambient;
use crate::approval::Gate;
use crate::decoded::{self, Keeper};
use crate::error::Error;
use crate::key::{self, KeyBuilder, KeyFieldError};
use crate::lease::{self, Acquired, Lease, OnBusy, Policy};
use crate::registry::Outcome;
use crate::spec::{Concurrent, Mismatch, OnUnknown, ToolSpec};
use crate::store::{ClaimRequest, Record, RecordState, Store, StoreError};
use crate::telemetry::{self, CallTelemetry, Decision};

/// One call, ready to run: its key and what identifies its arguments.
#[doc(hidden)]
#[derive(Debug)]
pub struct Call {
    spec: &'static ToolSpec,
    /// A `String`: replays never need it shared; a body that runs gets an `Arc` copy.
    key: String,
    scope: Option<Arc<str>>,
    /// The fingerprint of `args` (`key::fingerprint`), made when first needed: a replay
    /// of a record that holds the same `args` never needs it.
    fingerprint: OnceLock<String>,
    /// The JSON arguments, kept in the store for reconciliation.
    args: String,
    /// Whether the call waits for a person's approval before its key is claimed.
    approval: bool,
    /// What a registry call's [`replay_now`] already learned from the store's memory, so
    /// the full path does not ask again.
    asked: Option<Box<Asked>>,
}

/// The store's memory's answer for a call that [`replay_now`] could not replay, and the
/// default store it asked (the task had none): [`start`] takes both instead of asking.
struct Asked {
    answer: Option<Acquired>,
    default_store: Option<Arc<dyn Store>>,
}

impl core::fmt::Debug for Asked {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Asked").finish_non_exhaustive()
    }
}

/// Builds a [`Call`] from the tool's arguments, by reference, before the body moves them.
#[doc(hidden)]
pub struct CallBuilder {
    spec: &'static ToolSpec,
    key: KeyBuilder,
    error: Option<Error>,
    args: Vec<u8>,
    /// Whether the call waits for approval (the tool's rule, then its policy function).
    approval: bool,
    /// The key document's end as `#[mutating_tool]` encoded it ([`key::key_tail`]), or
    /// `None` to encode it from the spec.
    tail: Option<&'static str>,
}

impl CallBuilder {
    /// Starts a call of `spec` in the current scope.
    pub fn new(spec: &'static ToolSpec) -> Self {
        // The buffer a finished call on this thread gave back, else room for a typical
        // call's arguments, so the document is not reallocated.
        let mut args = SPARE_ARGS.try_with(Cell::take).unwrap_or_default();
        args.clear();
        args.reserve(256);
        args.push(b'{');
        Self {
            spec,
            key: KeyBuilder::new(key::TOOL_KEY_CONTRACT),
            error: None,
            args,
            approval: crate::approval::required_by_rule(spec),
            tail: None,
        }
    }

    /// [`new`](Self::new) with the end of the key document already encoded: `tail` is
    /// [`key::key_tail`] of the spec's name and version, which `#[mutating_tool]` writes
    /// out at compile time so a call does not encode it again.
    pub fn keyed(spec: &'static ToolSpec, tail: &'static str) -> Self {
        let mut builder = Self::new(spec);
        builder.tail = Some(tail);
        builder
    }

    /// `approval = policy`: the policy function's answer for this call's arguments.
    pub fn require_approval(&mut self, needed: bool) {
        self.approval = needed;
    }

    /// Adds a key field; paths come in the order of `spec.key_fields`.
    pub fn key_field<T: ?Sized + Serialize>(&mut self, path: &'static str, value: &T) {
        if self.error.is_some() {
            return;
        }
        if let Err(e) = self.key.field(path, value) {
            self.error = Some(key_field_error(self.spec, e));
        }
    }

    /// [`key_field`](Self::key_field) with the member's name already encoded (`member` is
    /// `"<path>":`, written out by `#[mutating_tool]`; see [`KeyBuilder::field_member`]).
    /// Inlined, so the member's length is a constant where it is copied.
    #[inline]
    pub fn key_member<T: ?Sized + Serialize>(
        &mut self,
        member: &'static str,
        path: &'static str,
        value: &T,
    ) {
        if self.error.is_some() {
            return;
        }
        if let Err(e) = self.key.field_member(member, path, value) {
            self.error = Some(key_field_error(self.spec, e));
        }
    }

    /// Adds a JSON argument: part of the stored arguments, which the fingerprint hashes.
    pub fn arg<T: ?Sized + Serialize>(&mut self, name: &'static str, value: &T) {
        if self.error.is_some() {
            return;
        }
        let start = self.args.len();
        if start > 1 {
            self.args.push(b',');
        }
        // Parameter names are Rust identifiers: no escaping needed.
        self.args.push(b'"');
        self.args.extend_from_slice(name.as_bytes());
        self.args.extend_from_slice(b"\":");
        if let Err(e) = self.key.write_value(value, &mut self.args) {
            self.args.truncate(start);
            self.error = Some(Error::InvalidArguments {
                tool: self.spec.name.to_owned(),
                field: Some(name.to_owned()),
                message: format!("the value cannot be written as JSON: {e}"),
            });
            return;
        }
        let limit = ambient::max_argument_bytes();
        // `+ 1` for the closing brace `finish` adds.
        if self.args.len() + 1 > limit {
            let size = self.args.len() + 1;
            self.args = Vec::new();
            self.error = Some(Error::InvalidArguments {
                tool: self.spec.name.to_owned(),
                field: Some(name.to_owned()),
                message: format!(
                    "the arguments take {size} bytes of JSON, over this process's limit of {limit} bytes (every store keeps them with the record); send a reference to the content (an id, a URL) instead of the content, or raise the limit with `tool_contracts::set_max_argument_bytes`"
                ),
            });
        }
    }

    fn scope(&self) -> Result<Option<Arc<str>>, Error> {
        ambient::caller_scope(self.spec.name)
    }

    /// The key alone (what [`ToolDescriptor::key`](crate::ToolDescriptor::key) reports):
    /// through [`finish`](Self::finish), so it refuses exactly what a call refuses.
    pub fn key(self) -> Result<String, Error> {
        self.finish().map(|mut call| core::mem::take(&mut call.key))
    }

    /// The finished call, or the reason no call may be made: a tool name that another
    /// contract shares (checked first: such a call would share the other's results), bad
    /// arguments, an invalid scope.
    pub fn finish(mut self) -> Result<Call, Error> {
        crate::contracts::check_unique(self.spec.name)?;
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        let scope = self.scope()?;
        let spec = self.spec;
        self.args.push(b'}');
        // The canonical writer emits valid UTF-8 (it writes `str`s and ASCII only).
        let args = String::from_utf8(self.args).map_err(|e| Error::Codec {
            tool: spec.name.to_owned(),
            key: None,
            message: format!("arguments are not valid UTF-8: {e}"),
        })?;
        let key = match self.tail {
            Some(tail) => self
                .key
                .finish_tail(scope.as_deref(), tail, spec.name, spec.version),
            None => self.key.finish(scope.as_deref(), spec.name, spec.version),
        };
        Ok(Call {
            spec,
            key,
            scope,
            fingerprint: OnceLock::new(),
            args,
            approval: self.approval,
            asked: None,
        })
    }
}

/// Arguments buffers larger than this are dropped rather than kept for the next call.
const SPARE_ARGS_MAX_BYTES: usize = 64 * 1024;

thread_local! {
    /// The arguments buffer of the last call finished on this thread, for the next
    /// [`CallBuilder`]: a call's arguments document then costs no allocation once warm.
    static SPARE_ARGS: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

impl Call {
    /// A call [`derived::recall`](crate::derived::recall) kept from an earlier derivation
    /// of byte-identical arguments: `key` and `args` as that derivation made them in
    /// `scope`, the approval rule read again.
    pub(crate) fn recalled(
        spec: &'static ToolSpec,
        key: String,
        scope: Option<Arc<str>>,
        args: String,
    ) -> Self {
        Call {
            spec,
            key,
            scope,
            fingerprint: OnceLock::new(),
            args,
            approval: crate::approval::required_by_rule(spec),
            asked: None,
        }
    }

    /// What a derivation made that [`derived`](crate::derived) keeps: the key, the scope it
    /// was made in, the canonical arguments.
    pub(crate) fn derived(&self) -> (&str, Option<&Arc<str>>, &str) {
        (&self.key, self.scope.as_ref(), &self.args)
    }
}

impl Drop for Call {
    /// Gives the arguments buffer back to this thread's [`SPARE_ARGS`] (unless it is large).
    fn drop(&mut self) {
        let args = core::mem::take(&mut self.args).into_bytes();
        if args.capacity() <= SPARE_ARGS_MAX_BYTES {
            // During thread teardown there is nowhere to keep it: it is dropped.
            let _ = SPARE_ARGS.try_with(|spare| spare.set(args));
        }
    }
}

fn key_field_error(spec: &ToolSpec, e: KeyFieldError) -> Error {
    match e {
        KeyFieldError::Empty { field, found } => Error::InvalidArguments {
            tool: spec.name.to_owned(),
            message: format!(
                "key field `{field}` is {found}; a missing intent would collapse different calls onto one key, so nothing ran. Send the value this call is about (a user, cart or order id)"
            ),
            field: Some(field),
        },
        KeyFieldError::Encode { field, source } => Error::InvalidArguments {
            tool: spec.name.to_owned(),
            message: format!("key field `{field}` cannot be written as canonical JSON: {source}"),
            field: Some(field),
        },
        other => Error::InvalidArguments {
            tool: spec.name.to_owned(),
            field: None,
            message: other.to_string(),
        },
    }
}

/// An arguments document's parameters with their values, in the document's order
/// (declaration order; serde_json's own map would sort them).
fn args_in_order(args: &str) -> Option<Vec<(String, serde_json::Value)>> {
    struct InOrder;
    impl<'de> serde::de::Visitor<'de> for InOrder {
        type Value = Vec<(String, serde_json::Value)>;
        fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            f.write_str("an arguments object")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            let mut params = Vec::new();
            while let Some(entry) = map.next_entry()? {
                params.push(entry);
            }
            Ok(params)
        }
    }
    let mut de = serde_json::Deserializer::from_str(args);
    serde::Deserializer::deserialize_map(&mut de, InOrder).ok()
}

impl Call {
    /// The arguments' fingerprint, computed on first use.
    fn fingerprint(&self) -> &str {
        self.fingerprint
            .get_or_init(|| key::fingerprint(&self.args))
    }

    fn request(&self) -> ClaimRequest<'_> {
        ClaimRequest {
            key: &self.key,
            tool: self.spec.name,
            version: self.spec.version,
            scope: self.scope.as_deref(),
            fingerprint: self.fingerprint(),
            args: &self.args,
            lease: self.spec.lease,
            ttl: self.spec.ttl,
            worker: ambient::worker_id(),
        }
    }

    fn store_error(&self, e: StoreError) -> Error {
        Error::Store {
            tool: self.spec.name.to_owned(),
            key: Some(self.key.clone()),
            source: e,
        }
    }

    /// Whether a call whose arguments have fingerprint `theirs` may share our key: the
    /// same arguments, or `payload_mismatch = "replay"`.
    fn accepts(&self, theirs: &str) -> bool {
        self.spec.payload_mismatch == Mismatch::Replay || theirs == self.fingerprint()
    }

    /// The key was used with other arguments, stored as `their_args` (if they could be
    /// read): name the parameters that differ.
    fn key_reused(&self, their_args: Option<&str>) -> Error {
        let params = differing_params(&self.args, their_args);
        tracing::info!(tool = self.spec.name, key = %self.key, decision = "rejected", reason = "key_reused", "tool-contracts: key reused with other arguments");
        Error::KeyReused {
            tool: self.spec.name.to_owned(),
            key: self.key.clone(),
            params,
            key_fields: self
                .spec
                .key_fields
                .iter()
                .map(|f| (*f).to_owned())
                .collect(),
        }
    }
}

/// The deepest paths (`note`, `cart.items`, `cart.items.1`) at which two arguments
/// documents differ: ours in declaration order, then what only the first call had.
fn differing_params(ours: &str, theirs: Option<&str>) -> Vec<String> {
    let (Some(ours), Some(theirs)) = (args_in_order(ours), theirs.and_then(args_in_order)) else {
        // Only on a store that lost the record between two reads, or arguments nested
        // deeper than serde_json parses: say so rather than guess.
        return vec!["(the first call's arguments could not be read back to compare)".to_owned()];
    };
    fn value_in<'a>(
        params: &'a [(String, serde_json::Value)],
        name: &str,
    ) -> Option<&'a serde_json::Value> {
        params.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }
    let mut paths = Vec::new();
    for (name, value) in &ours {
        match value_in(&theirs, name) {
            Some(their) => differing_paths(name.clone(), value, their, &mut paths),
            None => paths.push(name.clone()),
        }
    }
    paths.extend(
        theirs
            .iter()
            .filter(|(name, _)| value_in(&ours, name).is_none())
            .map(|(name, _)| name.clone()),
    );
    if paths.is_empty() {
        // Same values, different bytes (an encoder change): say so rather than name nothing.
        paths.push("(the argument encoding)".to_owned());
    }
    paths
}

/// Appends to `out` the deepest paths under `path` where `a` and `b` differ: into objects
/// member by member (a member only one side has is named itself), into arrays of equal
/// length element by element (`items.1`); anything else that differs is named whole.
fn differing_paths(
    path: String,
    a: &serde_json::Value,
    b: &serde_json::Value,
    out: &mut Vec<String>,
) {
    use serde_json::Value;
    if a == b {
        return;
    }
    // A `Secret` is stored as `{"sha256": …}`: its digest is the value, named as a whole.
    let digest = |v: &serde_json::Map<String, Value>| v.len() == 1 && v.contains_key("sha256");
    match (a, b) {
        (Value::Object(a), Value::Object(b)) if !(digest(a) && digest(b)) => {
            for (name, value) in a {
                let inner = format!("{path}.{name}");
                match b.get(name) {
                    Some(other) => differing_paths(inner, value, other, out),
                    None => out.push(inner),
                }
            }
            out.extend(
                b.keys()
                    .filter(|name| !a.contains_key(*name))
                    .map(|name| format!("{path}.{name}")),
            );
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                differing_paths(format!("{path}.{i}"), x, y, out);
            }
        }
        _ => out.push(path),
    }
}

/// What a registry call learns about the engine's decision.
#[derive(Debug, Default)]
pub(crate) struct CallReport {
    pub(crate) key: Option<String>,
    /// How the call ended, if it produced a result (executed, replayed or reconciled).
    pub(crate) outcome: Option<Outcome>,
    /// The engine's own refusal, more precise than the tool error it became (boxed: the
    /// report is moved in and out of its task-local slot on every poll of the call).
    pub(crate) error: Option<Box<Error>>,
    /// A replay's stored result as the store kept it, when the call takes its result as
    /// JSON text: the registry sends it on instead of encoding the decoded value again.
    pub(crate) stored: Option<String>,
}

/// A registry call's report as its task holds it: the report, and whether an engine run
/// has taken it (the first one inside, so a tool that calls another tool does not
/// overwrite the outer call's report).
#[derive(Debug, Default)]
pub(crate) struct ReportScope {
    taken: bool,
    /// Whether the registry call takes its result as JSON text ([`CallReport::stored`]).
    text: bool,
    report: CallReport,
}

impl ReportScope {
    /// The report the engine run wrote.
    pub(crate) fn into_report(self) -> CallReport {
        self.report
    }
}

/// Held by the engine run that took its task's report: that run writes it ([`report`]).
///
/// The report lives in the task (a task-local `RefCell`), not behind an `Arc<Mutex>`: the
/// engine run is polled inside the registry call's future, so every write happens in that
/// task, and a call costs no allocation and no atomic operation for it (`perf` had put
/// about 4% of a registry replay's time on the `Arc`'s and the lock's atomic operations).
#[derive(Debug)]
pub(crate) struct ReportSlot(());

tokio::task_local! {
    /// Set by `Registry::call` and `call_json`; taken by the first engine run inside.
    static REPORT: core::cell::RefCell<ReportScope>;
}

/// `future` with a report for the first engine run inside (`text`: the call takes its
/// result as JSON text); the registry reads it back with `TaskLocalFuture::take_value`
/// once the future is done.
pub(crate) fn with_report<F: Future>(
    future: F,
    text: bool,
) -> tokio::task::futures::TaskLocalFuture<core::cell::RefCell<ReportScope>, F> {
    let scope = ReportScope {
        text,
        ..ReportScope::default()
    };
    REPORT.scope(core::cell::RefCell::new(scope), future)
}

/// The stored result text of this task's replay, if its registry call takes text and the
/// engine run holding the report replayed (taken: the registry's encoder uses it once).
pub(crate) fn take_stored_text() -> Option<String> {
    REPORT
        .try_with(|scope| scope.try_borrow_mut().ok()?.report.stored.take())
        .ok()
        .flatten()
}

/// Whether this task's registry call takes its result as JSON text (so a replay keeps the
/// stored text for it, [`CallReport::stored`]).
fn report_wants_text() -> bool {
    REPORT
        .try_with(|scope| scope.try_borrow().is_ok_and(|scope| scope.text))
        .unwrap_or(false)
}

pub(crate) fn take_report() -> Option<ReportSlot> {
    REPORT
        .try_with(|scope| {
            let mut scope = scope.try_borrow_mut().ok()?;
            (!core::mem::replace(&mut scope.taken, true)).then_some(ReportSlot(()))
        })
        .ok()
        .flatten()
}

/// What a call that may become an MCP task asks of the engine (`mcp/tasks.rs`): a signal
/// once the call holds its key's lease (the claim is in the store, so `tasks/get` of the
/// key resolves), and a live holder of the same intent reported at once rather than
/// waited for (that holder *is* the task a retry names).
pub(crate) struct TaskStart {
    held: tokio::sync::oneshot::Sender<()>,
}

tokio::task_local! {
    /// Set by the MCP server around a call it may answer with a task; taken by the first
    /// engine run inside, as [`REPORT`] is, so a tool calling a tool changes nothing.
    static TASK_START: Cell<Option<TaskStart>>;
}

/// Runs `future` (a registry call) as the start of a task: its engine run sends on `held`
/// once it holds the key's lease, and reports a live holder (`InProgress`) without waiting.
#[cfg(feature = "mcp")]
pub(crate) async fn as_task_start<F: Future>(
    held: tokio::sync::oneshot::Sender<()>,
    future: F,
) -> F::Output {
    TASK_START
        .scope(Cell::new(Some(TaskStart { held })), future)
        .await
}

fn take_task_start() -> Option<TaskStart> {
    TASK_START.try_with(Cell::take).ok().flatten()
}

fn report(slot: &Option<ReportSlot>, f: impl FnOnce(&mut CallReport)) {
    if slot.is_some() {
        // Outside the scope (not possible for the run holding the slot) or borrowed (no
        // write holds it across another), nothing is written: a report is best effort.
        let _ = REPORT.try_with(|scope| {
            if let Ok(mut scope) = scope.try_borrow_mut() {
                f(&mut scope.report);
            }
        });
    }
}

/// A JSON round trip for one type, as plain function pointers.
///
/// Built only by [`Codec::json`] (through `__private::assert_output` and
/// `__private::assert_cacheable_error`, which the expansion calls spanned at the user's
/// type): the engine's entry points carry no trait bounds on the tool's `T` and `E`, so a
/// missing `Serialize` is reported once, at the type the user wrote, and never again at
/// the generated call.
#[doc(hidden)]
pub struct Codec<T> {
    encode: fn(&T) -> Result<String, serde_json::Error>,
    decode: fn(&str) -> Result<T, serde_json::Error>,
}

impl<T> Clone for Codec<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Codec<T> {}

impl<T: Serialize + DeserializeOwned> Codec<T> {
    /// `serde_json` both ways.
    pub const fn json() -> Self {
        Self {
            encode: to_json::<T>,
            decode: from_json::<T>,
        }
    }
}

fn to_json<T: Serialize>(value: &T) -> Result<String, serde_json::Error> {
    serde_json::to_string(value)
}

fn from_json<T: DeserializeOwned>(json: &str) -> Result<T, serde_json::Error> {
    serde_json::from_str(json)
}

impl<T> Codec<T> {
    /// `value` as JSON.
    pub fn encode(&self, value: &T) -> Result<String, serde_json::Error> {
        (self.encode)(value)
    }

    /// A value back from JSON.
    pub fn decode(&self, json: &str) -> Result<T, serde_json::Error> {
        (self.decode)(json)
    }
}

/// Everything the engine does with a tool's `T` and `E`: store and replay `T`, turn a
/// contract [`Error`] into `E`, and (with `cache_errors = true`) store and replay `E`.
/// Each piece comes from a `__private::assert_*` helper whose bounds are checked where
/// the expansion calls it, at the user's tokens.
#[doc(hidden)]
pub struct Ops<T, E> {
    output: Codec<T>,
    contract_error: fn(Error) -> E,
    /// `Some`: an `Err` is stored and replayed; `None`: it releases the key (the default).
    stored_errors: Option<Codec<E>>,
    /// `Some` when `T: Clone`: a hot key's replays clone a decoded result kept per thread
    /// rather than decode it again ([`decoded`](crate::decoded)).
    keeper: Option<Keeper<T>>,
}

impl<T, E> Clone for Ops<T, E> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T, E> Copy for Ops<T, E> {}

impl<T, E> Ops<T, E> {
    /// The default policy: an `Err` releases the key, so a retry runs again.
    pub const fn new(output: Codec<T>, contract_error: fn(Error) -> E) -> Self {
        Self {
            output,
            contract_error,
            stored_errors: None,
            keeper: None,
        }
    }

    /// The result type's [`Keeper`] when it is `Clone` (`__private::KeepProbe`).
    pub const fn keeping(mut self, keeper: Option<Keeper<T>>) -> Self {
        self.keeper = keeper;
        self
    }

    /// `cache_errors = true`: an `Err` is stored and replayed like an `Ok`.
    pub const fn caching_errors(mut self, errors: Codec<E>) -> Self {
        self.stored_errors = Some(errors);
        self
    }
}

/// What one attempt of a tool produced.
#[doc(hidden)]
pub enum Attempt<T, E> {
    /// The body ran (possibly after `verify` said the effect had not happened).
    Ran(Result<T, E>),
    /// `verify` found the effect of an abandoned call: this is its result.
    Verified(T),
    /// `verify` failed: the outcome stays unknown.
    VerifyFailed(E),
}

/// A body's own result: it ran.
impl<T, E> From<Result<T, E>> for Attempt<T, E> {
    fn from(result: Result<T, E>) -> Self {
        Attempt::Ran(result)
    }
}

tokio::task_local! {
    static RECONCILING: bool;
}

/// Inside an attempt: whether it is reconciling an abandoned claim, so it must call the
/// tool's `verify` before (maybe) running the body.
#[doc(hidden)]
pub fn reconciling() -> bool {
    RECONCILING.try_with(|r| *r).unwrap_or(false)
}

/// Runs `body` at most once per key: the entry point of `#[mutating_tool]`.
///
/// `body` makes the body's future, and is called only if the body runs: a replay never
/// builds (or boxes) it.
///
/// A plain `fn` with no bounds on `T` and `E` (everything it needs from them is in
/// `ops`): an `async fn` with `T: Serialize` in its where-clause would report every
/// missing bound a second time, at the generated call.
///
/// It reads the task's scope (store, report slot, MCP task start, run journal) when called,
/// not when first polled: a replay from memory is decided right here. The generated code
/// calls it inside the tool's own `async fn` and awaits it at once, so both happen in the
/// same poll and the same scope.
#[doc(hidden)]
pub fn execute<T, E, B, F>(
    call: Result<Call, Error>,
    ops: Ops<T, E>,
    body: B,
) -> impl Future<Output = Result<T, E>>
where
    B: FnOnce() -> F,
    F: Future<Output = Result<T, E>>,
{
    // The body's own future, with no wrapper of ours around it: a body that is not `Send`
    // is then reported within the user's block, not within an engine type.
    start(call, ops, body, None, false)
}

/// The general entry point: the attempt `attempt` makes may verify first (`verify = …`,
/// then `has_verify` is true), `unknown_if` classifies errors that leave the outcome
/// unknown (`unknown_outcome_if = …`). No bounds on `T` and `E`, as for [`execute`].
#[doc(hidden)]
pub fn execute_with<T, E, A, F>(
    call: Result<Call, Error>,
    ops: Ops<T, E>,
    attempt: A,
    unknown_if: Option<fn(&E) -> bool>,
    has_verify: bool,
) -> impl Future<Output = Result<T, E>>
where
    A: FnOnce() -> F,
    F: Future<Output = Attempt<T, E>>,
{
    start(call, ops, attempt, unknown_if, has_verify)
}

/// A call's future: decided already (a replay answered from memory, a refusal), or the
/// full path on the heap. Either way small, so the `.await`s up the caller's stack, each
/// of which moves the future it awaits, move a few words rather than the whole path.
pub(crate) enum Execution<T, E, R> {
    /// The answer, known when the call started.
    Done(core::future::Ready<Result<T, E>>),
    /// The journal, the approval gate, the claim, the body.
    Running(core::pin::Pin<Box<R>>),
}

impl<T, E, R: Future<Output = Result<T, E>>> Future for Execution<T, E, R> {
    type Output = Result<T, E>;

    fn poll(
        self: core::pin::Pin<&mut Self>,
        cx: &mut core::task::Context<'_>,
    ) -> core::task::Poll<Self::Output> {
        match self.get_mut() {
            Execution::Done(answer) => core::pin::Pin::new(answer).poll(cx),
            Execution::Running(run) => run.as_mut().poll(cx),
        }
    }
}

/// What [`replay_now`] decided for a registry call.
#[doc(hidden)]
pub enum Now {
    /// A replay answered from the store's memory: the result as the registry's entry
    /// point encodes it, and the report the engine wrote.
    Done(Result<crate::registry::CallResult, Error>, Report),
    /// Not decided here: the call (or its refusal) for the tool's own future to take over
    /// ([`with_prepared`]); when the store's memory was asked, with its answer, so it is
    /// not asked twice.
    Run(Result<Call, Error>),
}

/// The engine's report of a call [`replay_now`] answered (what a registry call reads
/// back from its task-local report on the full path).
#[doc(hidden)]
#[derive(Debug)]
pub struct Report(pub(crate) CallReport);

/// A registry call, decided before any future is made (no boxed future, no task-local
/// scope around one): a completed key the store answers from memory is replayed here,
/// with `encode` turning the tool's result (and, for a caller that gave JSON text, the
/// stored text it sends on) into the registry's, exactly as [`start`] replays it (same
/// telemetry, same report, same stored text). Anything else (a refusal, approval, a run's
/// journal, an MCP task start, no completed record) goes back as [`Now::Run`] for the
/// tool's own future, with the store's answer when it was asked (no completed record).
#[doc(hidden)]
pub fn replay_now<T, E>(
    call: Result<Call, Error>,
    ops: Ops<T, E>,
    has_verify: bool,
    text: bool,
    encode: impl FnOnce(Result<T, E>, Option<String>) -> Result<crate::registry::CallResult, Error>,
) -> Now {
    let mut call = match call {
        Ok(call) if !call.approval && !task_start_pending() && !ambient::journaling() => call,
        other => return Now::Run(other),
    };
    let accepts = |theirs: &str| call.accepts(theirs);
    let policy = policy(&call, has_verify, false, &accepts);
    let (answer, default_store) = ambient::with_current_store(|store| {
        lease::completed_now(store, &call.key, call.scope.as_deref(), &call.args, &policy)
    });
    let record = match answer {
        Some(Acquired::Completed(record)) => record,
        answer => {
            call.asked = Some(Box::new(Asked {
                answer,
                default_store,
            }));
            return Now::Run(Ok(call));
        }
    };
    let mut telemetry = CallTelemetry::start(Ok(call.spec.name));
    telemetry.key(&call.key);
    let span = telemetry.span();
    let mut written = CallReport::default();
    // A caller given a `Value`, for a tool whose result is kept (`decoded.rs`): the stored
    // text whose `Value` this thread may have kept.
    let value_text = match &record.state {
        RecordState::Completed {
            result,
            is_error: false,
            ..
        } if !text && ops.keeper.is_some() => Some(result.as_str()),
        _ => None,
    };
    let result = match value_text.and_then(|stored| decoded::kept_value(call.spec, stored)) {
        Some(value) => {
            telemetry::in_span(&span, || {
                count_replay(&call, &mut telemetry, Some(&mut written))
            });
            Ok(crate::registry::CallResult::Value(value))
        }
        None => {
            let out = telemetry::in_span(&span, || {
                replay_counted(
                    &call,
                    &ops,
                    &record,
                    &mut telemetry,
                    Some((&mut written, text)),
                )
            });
            let stored = written.stored.take();
            let result = encode(out, stored);
            if let (Some(stored), Ok(crate::registry::CallResult::Value(value))) =
                (value_text, &result)
            {
                decoded::note_value(call.spec, stored, value);
            }
            result
        }
    };
    // The call ends here: its key moves into the report rather than being copied.
    written.key = Some(core::mem::take(&mut call.key));
    Now::Done(result, Report(written))
}

/// Whether this task holds an MCP task start (`as_task_start`), which [`start`] takes:
/// such a call reports a live holder at once, so it is not decided by [`replay_now`].
fn task_start_pending() -> bool {
    TASK_START
        .try_with(|start| {
            let held = start.take();
            let pending = held.is_some();
            start.set(held);
            pending
        })
        .unwrap_or(false)
}

tokio::task_local! {
    /// The call a registry entry point made for its tool ([`replay_now`]'s
    /// [`Now::Run`]), for the tool's own future to take instead of making it again.
    static PREPARED: Cell<Option<(&'static ToolSpec, Result<Call, Error>)>>;
}

/// `future` (the tool `spec`'s own, made by its registry entry point from the arguments
/// `call` was made from) with `call` for it to take ([`take_prepared`]) on its first poll.
#[doc(hidden)]
pub fn with_prepared<F: Future>(
    spec: &'static ToolSpec,
    call: Result<Call, Error>,
    future: F,
) -> impl Future<Output = F::Output> {
    PREPARED.scope(Cell::new(Some((spec, call))), future)
}

/// The call [`with_prepared`] holds for `spec`'s tool, taken (so a tool it calls makes
/// its own); `None` outside one, or for another tool.
#[doc(hidden)]
pub fn take_prepared(spec: &'static ToolSpec) -> Option<Result<Call, Error>> {
    PREPARED
        .try_with(|prepared| match prepared.take() {
            Some((of, call)) if core::ptr::eq(of, spec) => Some(call),
            other => {
                prepared.set(other);
                None
            }
        })
        .ok()
        .flatten()
}

/// Starts a call when its future is made (in the tool's own future, on its first poll):
/// a refusal, or a replay the store answers from memory, is decided here, synchronously
/// (or was, by [`replay_now`], whose answer the call then carries), and the full path's
/// future is built (on the heap) only for a call that needs it.
fn start<T, E, A, F>(
    call: Result<Call, Error>,
    ops: Ops<T, E>,
    attempt: A,
    unknown_if: Option<fn(&E) -> bool>,
    has_verify: bool,
) -> Execution<T, E, impl Future<Output = Result<T, E>>>
where
    A: FnOnce() -> F,
    F: Future,
    F::Output: Into<Attempt<T, E>>,
{
    // Feature `otel`: the call's span (entered around a replay decided here, and around the
    // full path), and on drop its count and duration. Without it, zero-sized and free.
    let mut telemetry = CallTelemetry::start(call.as_ref().map(|call| call.spec.name));
    let slot = take_report();
    let task_start = take_task_start();
    let mut call = match call {
        Ok(call) => call,
        Err(e) => {
            telemetry.decided(Decision::Rejected);
            let e = failed(&mut telemetry, &slot, &ops, e);
            return Execution::Done(core::future::ready(Err(e)));
        }
    };
    telemetry.key(&call.key);
    let mut memory = Memory::NotAsked;
    let mut default_store = None;
    if let Some(asked) = call.asked.take() {
        // `replay_now` asked already (same policy: no task start, not journaling).
        let Asked {
            answer,
            default_store: asked_default,
        } = *asked;
        memory = Memory::Answered(answer);
        default_store = asked_default;
    } else if !call.approval && !ambient::journaling() {
        let accepts = |theirs: &str| call.accepts(theirs);
        let policy = policy(&call, has_verify, task_start.is_some(), &accepts);
        let (answer, default) = ambient::with_current_store(|store| {
            lease::completed_now(store, &call.key, call.scope.as_deref(), &call.args, &policy)
        });
        default_store = default;
        match answer {
            Some(Acquired::Completed(record)) => {
                let span = telemetry.span();
                let out = telemetry::in_span(&span, || {
                    replayed(&call, &ops, &record, &slot, &mut telemetry)
                });
                // The call ends here: its key moves into the report rather than being copied.
                let key = core::mem::take(&mut call.key);
                report(&slot, |r| r.key = Some(key));
                return Execution::Done(core::future::ready(out));
            }
            answer => memory = Memory::Answered(answer),
        }
    }
    report(&slot, |r| r.key = Some(call.key.clone()));
    let store = default_store.unwrap_or_else(ambient::current_store);
    let decision = Decide {
        call,
        ops,
        unknown_if,
        has_verify,
        slot,
        task_start,
        store,
        memory,
    };
    Execution::Running(Box::pin(run(decision, attempt, telemetry)))
}

/// The full path of a call [`start`] could not decide, inside the call's span.
async fn run<T, E, A, F>(
    decision: Decide<T, E>,
    attempt: A,
    mut telemetry: CallTelemetry,
) -> Result<T, E>
where
    A: FnOnce() -> F,
    F: Future,
    F::Output: Into<Attempt<T, E>>,
{
    let span = telemetry.span();
    telemetry::instrument(span, decide(decision, attempt, &mut telemetry)).await
}

/// The engine's refusal `e` as the tool's error, counted and reported.
fn failed<T, E>(
    telemetry: &mut CallTelemetry,
    slot: &Option<ReportSlot>,
    ops: &Ops<T, E>,
    e: Error,
) -> E {
    telemetry.error(e.code());
    report(slot, |r| r.error = Some(Box::new(e.clone())));
    (ops.contract_error)(e)
}

/// A completed record's result as this call's answer, reported and counted as a replay.
fn replayed<T, E>(
    call: &Call,
    ops: &Ops<T, E>,
    record: &Record,
    slot: &Option<ReportSlot>,
    telemetry: &mut CallTelemetry,
) -> Result<T, E> {
    if slot.is_none() {
        // A direct call: nobody reads a report.
        return replay_counted(call, ops, record, telemetry, None);
    }
    let mut written = CallReport::default();
    let text = report_wants_text();
    let out = replay_counted(call, ops, record, telemetry, Some((&mut written, text)));
    report(slot, |r| {
        r.outcome = written.outcome;
        if written.error.is_some() {
            r.error = written.error;
        }
        if written.stored.is_some() {
            r.stored = written.stored;
        }
    });
    out
}

/// A replay counted: logged, decided in the call's telemetry, and its outcome written into
/// `report` if a registry call reads one.
fn count_replay(call: &Call, telemetry: &mut CallTelemetry, report: Option<&mut CallReport>) {
    tracing::debug!(tool = call.spec.name, key = %call.key, decision = "replayed", "tool-contracts: replayed stored result");
    telemetry.decided(Decision::Replayed);
    if let Some(r) = report {
        r.outcome = Some(Outcome::Replayed);
    }
}

/// A completed record's result as this call's answer, counted as a replay, and written
/// into `report` if a registry call reads one (with the stored result text if it takes
/// text, which it then sends on).
fn replay_counted<T, E>(
    call: &Call,
    ops: &Ops<T, E>,
    record: &Record,
    telemetry: &mut CallTelemetry,
    mut report: Option<(&mut CallReport, bool)>,
) -> Result<T, E> {
    count_replay(call, telemetry, report.as_mut().map(|(r, _)| &mut **r));
    match replay(call, ops, record) {
        Ok(value) => {
            if let (
                Some((r, true)),
                RecordState::Completed {
                    result,
                    is_error: false,
                    ..
                },
            ) = (report, &record.state)
            {
                r.stored = Some(result.clone());
            }
            Ok(value)
        }
        Err(Replayed::Contract(e)) => {
            telemetry.error(e.code());
            if let Some((r, _)) = report {
                r.error = Some(Box::new(e.clone()));
            }
            Err((ops.contract_error)(e))
        }
        Err(Replayed::Tool(e)) => {
            telemetry.error(telemetry::TOOL_ERROR);
            Err(e)
        }
    }
}

/// A call on the full path (not answered from memory by [`start`]), with what `start` took
/// from its task: the registry's report slot and the MCP task start.
struct Decide<T, E> {
    call: Call,
    ops: Ops<T, E>,
    unknown_if: Option<fn(&E) -> bool>,
    has_verify: bool,
    slot: Option<ReportSlot>,
    task_start: Option<TaskStart>,
    store: Arc<dyn Store>,
    /// What [`start`] learned from the store's memory, if it asked.
    memory: Memory,
}

/// Whether [`start`] (or [`replay_now`] before it) asked the store for a completed record
/// in memory ([`lease::completed_now`]), and its answer when it could not replay it: the claim then
/// uses that answer rather than asking again, so a call asks once (a near cache counts
/// each hit, and the `otel` wrapper times each lookup).
enum Memory {
    /// Not asked (a journaled call, or one awaiting approval, asks when it claims).
    NotAsked,
    /// Nothing there, or a record of other arguments.
    Answered(Option<Acquired>),
}

/// Everything up to the body: the journal, the approval gate, the lease (or a replay, or
/// a refusal). Whatever only an executed call needs is in [`run_held`], on the heap.
async fn decide<T, E, A, F>(
    decision: Decide<T, E>,
    attempt: A,
    telemetry: &mut CallTelemetry,
) -> Result<T, E>
where
    A: FnOnce() -> F,
    F: Future,
    F::Output: Into<Attempt<T, E>>,
{
    let Decide {
        call,
        ops,
        unknown_if,
        has_verify,
        slot,
        task_start,
        store,
        memory,
    } = decision;
    if let Err(e) = ambient::journal_call(call.spec, &call.key).await {
        telemetry.decided(Decision::Rejected);
        return Err(failed(telemetry, &slot, &ops, e));
    }
    if call.approval {
        // Boxed: a large future that only tools needing approval await.
        if let Some(e) = Box::pin(approval_gate(&call, &store)).await {
            telemetry.decided(Decision::Rejected);
            return Err(failed(telemetry, &slot, &ops, e));
        }
    }
    let lease = match acquire(&call, &store, has_verify, task_start.is_some(), memory).await {
        Ok(lease) => {
            if let Some(start) = task_start {
                // Nobody listening: the server answered already (the call ended first).
                let _ = start.held.send(());
            }
            lease
        }
        Err(Settled::Replay(record)) => {
            return replayed(&call, &ops, &record, &slot, telemetry);
        }
        Err(Settled::Refused(e)) => {
            telemetry.decided(match e {
                Error::OutcomeUnknown { .. } => Decision::Unknown,
                _ => Decision::Rejected,
            });
            return Err(failed(telemetry, &slot, &ops, e));
        }
    };
    let held = Held {
        call,
        ops,
        lease,
        unknown_if,
        has_verify,
        slot,
    };
    Box::pin(run_held(held, attempt, telemetry)).await
}

/// An executed call's state once its lease is held.
struct Held<T, E> {
    call: Call,
    ops: Ops<T, E>,
    lease: Lease,
    unknown_if: Option<fn(&E) -> bool>,
    has_verify: bool,
    slot: Option<ReportSlot>,
}

/// Runs the body (or `verify` first, after a takeover) under the held lease, then ends
/// the lease: complete, release or abandon.
async fn run_held<T, E, A, F>(
    held: Held<T, E>,
    attempt: A,
    telemetry: &mut CallTelemetry,
) -> Result<T, E>
where
    A: FnOnce() -> F,
    F: Future,
    F::Output: Into<Attempt<T, E>>,
{
    let Held {
        call,
        ops,
        lease,
        unknown_if,
        has_verify,
        slot,
    } = held;
    let spec = call.spec;
    telemetry.running();
    // On the heap: a body may call tools itself, and inline each level's future would
    // hold the whole nested state (the futures of nested calls and steps overflowed a
    // 2 MiB thread's stack). Made only here, so a replay never builds it.
    let attempt = Box::pin(attempt());
    // Taken over with a `verify`: the attempt verifies before (maybe) running the body.
    let reconcile = lease.taken_over() && has_verify;
    tracing::debug!(tool = spec.name, key = %call.key, decision = "executed", "tool-contracts: running tool body");
    let attempt = RECONCILING.scope(
        reconcile,
        ambient::with_current_key(Arc::from(call.key.as_str()), attempt),
    );
    let result = match lease.heartbeat(attempt).await.into() {
        Attempt::Ran(result) => {
            report(&slot, |r| r.outcome = Some(Outcome::Executed));
            telemetry.decided(Decision::Executed);
            result
        }
        Attempt::Verified(value) => {
            tracing::info!(tool = spec.name, key = %call.key, decision = "reconciled", "tool-contracts: verify found the effect of the abandoned call");
            report(&slot, |r| r.outcome = Some(Outcome::Reconciled));
            telemetry.decided(Decision::Reconciled);
            Ok(value)
        }
        Attempt::VerifyFailed(e) => {
            tracing::warn!(tool = spec.name, key = %call.key, decision = "rejected", reason = "verify_failed", "tool-contracts: verify failed; the outcome stays unknown");
            telemetry.decided(Decision::Unknown);
            telemetry.error(telemetry::TOOL_ERROR);
            abandoned(&call, lease.abandon().await);
            return Err(e);
        }
    };
    match &result {
        Ok(value) => match ops.output.encode(value) {
            Ok(json) => recorded(&call, true, lease.complete(&json, false).await),
            Err(e) => {
                // The effect happened but its result cannot be stored: keep the claim so it
                // expires into an unknown outcome rather than letting a retry run again.
                abandoned(&call, lease.abandon().await);
                let e = Error::Codec {
                    tool: spec.name.to_owned(),
                    key: Some(call.key.clone()),
                    message: format!("the result cannot be stored as JSON ({e}); the key is left as an unknown outcome"),
                };
                telemetry.decided(Decision::Unknown);
                return Err(failed(telemetry, &slot, &ops, e));
            }
        },
        Err(e) if unknown_if.is_some_and(|unknown| unknown(e)) => {
            tracing::warn!(tool = spec.name, key = %call.key, decision = "abandoned", "tool-contracts: the tool's error leaves the outcome unknown; keeping the key for reconciliation");
            telemetry.decided(Decision::Unknown);
            telemetry.error(telemetry::TOOL_ERROR);
            abandoned(&call, lease.abandon().await);
        }
        Err(e) => {
            telemetry.error(telemetry::TOOL_ERROR);
            match ops.stored_errors.map(|codec| codec.encode(e)) {
                Some(Ok(json)) => recorded(&call, true, lease.complete(&json, true).await),
                Some(Err(err)) => {
                    tracing::error!(tool = spec.name, key = %call.key, error = %err, "tool-contracts: cannot store the tool's error; releasing the claim");
                    recorded(&call, false, lease.release().await);
                }
                None => recorded(&call, false, lease.release().await),
            }
        }
    }
    result
}

/// A call that needs approval: `None` to go on (approved, or its key already claimed),
/// else why nothing runs.
async fn approval_gate(call: &Call, store: &Arc<dyn Store>) -> Option<Error> {
    let spec = call.spec;
    let accepts = |theirs: &str| call.accepts(theirs);
    let gate = crate::approval::gate(store, spec, call.request(), &accepts).await;
    match gate {
        Ok(Gate::Proceed) => None,
        Ok(Gate::Pending { expires_in }) => {
            tracing::info!(tool = spec.name, key = %call.key, decision = "awaiting_approval", "tool-contracts: the call waits for approval; nothing ran");
            Some(Error::AwaitingApproval {
                tool: spec.name.to_owned(),
                key: call.key.clone(),
                expires_in_ms: u64::try_from(expires_in.as_millis()).unwrap_or(u64::MAX),
            })
        }
        Ok(Gate::Denied(decision)) => {
            tracing::info!(tool = spec.name, key = %call.key, decision = "denied", "tool-contracts: the call was denied; replaying the denial");
            Some(Error::Denied {
                tool: spec.name.to_owned(),
                key: call.key.clone(),
                by: format!("{} via {}", decision.by, decision.channel),
                reason: decision.reason,
            })
        }
        Ok(Gate::Mismatch(theirs)) => Some(call.key_reused(theirs.as_deref())),
        Err(e) => {
            tracing::warn!(tool = spec.name, key = %call.key, decision = "rejected", reason = "store", error = %e, "tool-contracts: store failed; nothing ran");
            Some(call.store_error(e))
        }
    }
}

/// Why a call does not run its body: a stored result to replay, or a refusal.
enum Settled {
    Replay(Arc<Record>),
    Refused(Error),
}

/// The tool's policy, through the lease layer: a held lease, or how the call settles.
/// `task_start`: a live holder is reported at once (see [`TaskStart`]).
async fn acquire(
    call: &Call,
    store: &Arc<dyn Store>,
    has_verify: bool,
    task_start: bool,
    memory: Memory,
) -> Result<Lease, Settled> {
    let spec = call.spec;
    let accepts = |theirs: &str| call.accepts(theirs);
    let policy = policy(call, has_verify, task_start, &accepts);
    // A completed key the store answers from memory needs no claim (and, holding these
    // very arguments, no fingerprint); `start` asked already unless the call is journaled
    // or awaited approval (the store may hold the record by now).
    let now = match memory {
        Memory::Answered(now) => now,
        Memory::NotAsked => {
            lease::completed_now(store, &call.key, call.scope.as_deref(), &call.args, &policy)
        }
    };
    let acquired = match now {
        Some(acquired) => acquired,
        // Boxed: the claim loop's future is large, and a replay answered above skips it.
        None => Box::pin(lease::acquire(store, call.request(), policy))
            .await
            .map_err(|e| {
                tracing::warn!(tool = spec.name, key = %call.key, decision = "rejected", reason = "store", error = %e, "tool-contracts: store failed; nothing ran");
                Settled::Refused(call.store_error(e))
            })?,
    };
    let in_progress = |lease_remaining: Duration| Error::InProgress {
        tool: spec.name.to_owned(),
        key: call.key.clone(),
        lease_remaining_ms: u64::try_from(lease_remaining.as_millis()).unwrap_or(u64::MAX),
    };
    match acquired {
        Acquired::Held(lease) => {
            if lease.taken_over() && has_verify {
                tracing::info!(tool = spec.name, key = %call.key, decision = "reconciling", "tool-contracts: an earlier call was abandoned; taken over to verify its effect");
            } else if lease.taken_over() {
                tracing::warn!(tool = spec.name, key = %call.key, decision = "taken_over", "tool-contracts: rerunning an abandoned call (on_unknown = \"rerun\")");
            }
            Ok(lease)
        }
        Acquired::Completed(record) => Err(Settled::Replay(record)),
        Acquired::Mismatch { record, .. } => {
            // A live or abandoned holder came back with its fingerprint only: read its
            // arguments to name what differs (rare, and the lookup cannot change state).
            let theirs = match record {
                Some(record) => Some(record.args.clone()),
                None => store.lookup(&call.key).await.ok().flatten().map(|r| r.args),
            };
            Err(Settled::Refused(call.key_reused(theirs.as_deref())))
        }
        Acquired::Busy { lease_remaining } if task_start => {
            tracing::debug!(tool = spec.name, key = %call.key, decision = "in_progress", "tool-contracts: the call is already running: its task is answered");
            Err(Settled::Refused(in_progress(lease_remaining)))
        }
        Acquired::Busy { lease_remaining } if spec.concurrent == Concurrent::Reject => {
            tracing::info!(tool = spec.name, key = %call.key, decision = "rejected", reason = "in_progress", "tool-contracts: duplicate while in progress");
            Err(Settled::Refused(in_progress(lease_remaining)))
        }
        Acquired::Busy { lease_remaining } => {
            tracing::info!(tool = spec.name, key = %call.key, decision = "rejected", reason = "max_wait", "tool-contracts: the running call outlasted max_wait");
            Err(Settled::Refused(in_progress(lease_remaining)))
        }
        Acquired::Abandoned => {
            tracing::warn!(tool = spec.name, key = %call.key, decision = "rejected", reason = "outcome_unknown", "tool-contracts: an earlier call was abandoned mid-run");
            Err(Settled::Refused(Error::OutcomeUnknown {
                tool: spec.name.to_owned(),
                key: call.key.clone(),
            }))
        }
    }
}

/// How a call claims its key: what it does when the key is busy, whether it takes over
/// an abandoned claim, and which holders' fingerprints it accepts (`accepts`).
fn policy<'a>(
    call: &Call,
    has_verify: bool,
    task_start: bool,
    accepts: &'a (dyn Fn(&str) -> bool + Sync),
) -> Policy<'a> {
    let spec = call.spec;
    Policy {
        on_busy: match spec.concurrent {
            _ if task_start => OnBusy::Report,
            Concurrent::Reject => OnBusy::Report,
            Concurrent::Wait => OnBusy::Wait {
                max: Some(spec.max_wait),
            },
        },
        take_over: has_verify || spec.on_unknown == OnUnknown::Rerun,
        accepts,
    }
}

/// Logs a failed abandon: the key becomes abandoned anyway when its lease runs out.
fn abandoned(call: &Call, outcome: Result<(), StoreError>) {
    if let Err(e) = outcome {
        tracing::error!(tool = call.spec.name, key = %call.key, error = %e, "tool-contracts: could not mark the key abandoned; it becomes so when its lease runs out");
    }
}

/// Logs a failed complete (`stored`) or release. A failure here cannot undo the effect,
/// so the caller still gets the body's result.
fn recorded(call: &Call, stored: bool, outcome: Result<(), StoreError>) {
    if let Err(e) = outcome {
        tracing::error!(tool = call.spec.name, key = %call.key, error = %e, stored, "tool-contracts: could not record the call's outcome; a retry will see an unknown outcome");
    }
}

enum Replayed<E> {
    Contract(Error),
    Tool(E),
}

fn replay<T, E>(call: &Call, ops: &Ops<T, E>, record: &Record) -> Result<T, Replayed<E>> {
    let codec = |message: String| {
        Replayed::Contract(Error::Codec {
            tool: call.spec.name.to_owned(),
            key: Some(call.key.clone()),
            message,
        })
    };
    let RecordState::Completed {
        result, is_error, ..
    } = &record.state
    else {
        return Err(Replayed::Contract(call.store_error(StoreError::Corrupt(
            "a completed claim without a result".to_owned(),
        ))));
    };
    let stale = |what: &str, e: serde_json::Error| {
        codec(format!(
            "the stored {what} no longer decodes ({e}); the tool's types changed since it was stored: bump the tool's `version` so old results are never replayed"
        ))
    };
    if !is_error {
        return decoded::decode(call.spec, ops.keeper, &ops.output, result)
            .map_err(|e| stale("result", e));
    }
    match ops.stored_errors.map(|errors| errors.decode(result)) {
        Some(Ok(e)) => Err(Replayed::Tool(e)),
        Some(Err(e)) => Err(stale("error", e)),
        None => Err(codec("a stored error was found but the tool no longer sets `cache_errors = true`; bump the tool's `version`".to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::differing_params;

    #[test]
    fn a_nested_difference_is_named_at_its_deepest_path() {
        let first =
            r#"{"user_id":1,"cart":{"id":"c","items":["book","pen"],"gift":true},"note":"a"}"#;
        let second =
            r#"{"user_id":1,"cart":{"id":"c","items":["book","ink"],"wrap":1},"note":"b"}"#;
        assert_eq!(
            differing_params(second, Some(first)),
            ["cart.items.1", "cart.wrap", "cart.gift", "note"]
        );
        let longer = r#"{"user_id":1,"cart":{"id":"c","items":["book"],"gift":true},"note":"a"}"#;
        assert_eq!(differing_params(longer, Some(first)), ["cart.items"]);
        // A `Secret`'s stored digest is named by its parameter, not `cvc.sha256`.
        assert_eq!(
            differing_params(
                r#"{"cvc":{"sha256":"ab"}}"#,
                Some(r#"{"cvc":{"sha256":"cd"}}"#)
            ),
            ["cvc"]
        );
        assert_eq!(
            differing_params(r#"{"user_id":2}"#, Some(r#"{"user_id":1,"x":[]}"#)),
            ["user_id", "x"]
        );
    }
}
