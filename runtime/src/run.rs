//! Long-running tasks: a run identified by the caller's intent, whose steps are journaled
//! so a restart re-reads finished steps instead of running them again, and whose duplicate
//! start returns the existing run instead of starting a second one.
//!
//! The journal lives in the same store as tool results, as ordinary records:
//! - the run itself: key `tool-contracts/run/v1` over the intent; in progress while a worker
//!   owns it (its lease renewed by a heartbeat), completed by [`Run::finish`];
//! - one record per step: key over (run key, step name, ordinal among steps of that name);
//! - one record per journal position: what the code asked for at that position, so a
//!   resumed run whose code asks for something else fails with
//!   [`Error::NonDeterministic`] instead of silently mixing journals.
//!
//! Steps and tool calls inside a run must be sequential (awaited one after another), as in
//! every journaling system: positions are handed out in call order.
//!
//! A step may declare its undo ([`Run::step_with_undo`]), and so may a tool
//! (`#[mutating_tool(compensate = path)]`, registered for each of its calls made in
//! [`Run::enter`]); a run that fails is compensated by [`Run::compensate`], which undoes its
//! completed steps and tool calls in reverse order (see [`undo`]'s docs and README
//! "Compensation").

mod undo;

pub use undo::{
    CompensateFn, Compensation, CompensationState, IntoUndo, StepCompensation, Undo, UndoContext,
    UndoOutcome,
};

use core::future::Future;
use core::time::Duration;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ambient::{self, CallJournal};
use crate::error::Error;
use crate::key::KeyBuilder;
use crate::lease::{self, Acquired, KeepAlive, Lease, OnBusy, Policy};
use crate::spec::{OnUnknown, ToolSpec};
use crate::store::{ClaimRequest, Record, RecordState, Store, StoreError};
use crate::telemetry::{self, Decision, StepTelemetry};

/// Contract string of run keys.
pub const RUN_KEY_CONTRACT: &str = "tool-contracts/run/v1";
const STEP_CONTRACT: &str = "tool-contracts/step/v1";
const POSITION_CONTRACT: &str = "tool-contracts/position/v1";

/// Where a run stands, as seen by the handle [`Run::start`] returned.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum RunStatus {
    /// This handle created the run and owns it.
    Started,
    /// The run's previous worker died; this handle took it over and owns it. Finished
    /// steps replay their recorded results.
    Resumed,
    /// Another live worker owns the run: [`Run::wait`] for its result.
    Running,
    /// The run finished with this result.
    Finished(Value),
    /// The run's previous worker died while compensating it; this handle took it over and
    /// owns it. Replay its steps (finished steps return their stored results; no new step
    /// runs: [`Error::RunCompensating`]), then call [`Run::compensate`], which resumes.
    Compensating,
    /// The run was compensated: what was undone, and whether it needs intervention.
    Compensated(Compensation),
}

/// How a run is kept.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct RunOptions {
    /// How long the owner's claim on the run (and on each step) lasts without a heartbeat
    /// before a restarted worker may resume it.
    pub lease: Duration,
    /// How long the journal and result are kept after the last write.
    pub ttl: Duration,
    /// Version of the task's code contract, part of the run key: bump it when the steps
    /// change, so an old run is never resumed by new code.
    pub version: u32,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(30),
            ttl: Duration::from_secs(7 * 24 * 3600),
            version: 1,
        }
    }
}

impl RunOptions {
    /// With another lease.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }
    /// With another ttl.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }
    /// With another version.
    pub fn version(mut self, version: u32) -> Self {
        self.version = version;
        self
    }
}

/// Per-step policy.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct StepOptions {
    /// What a step does when it finds its own earlier attempt abandoned mid-run.
    pub on_unknown: OnUnknown,
}

impl Default for StepOptions {
    fn default() -> Self {
        Self {
            on_unknown: OnUnknown::Fail,
        }
    }
}

impl StepOptions {
    /// Rerun a step whose earlier attempt was abandoned: for steps that are idempotent on
    /// their own (for example, steps that only call `#[mutating_tool]`s, whose keys protect
    /// them).
    pub fn rerun_if_unknown() -> Self {
        Self {
            on_unknown: OnUnknown::Rerun,
        }
    }
}

/// What a journal position holds: a step of the run, or a tool call made inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EntryKind {
    /// A [`Run::step`].
    Step,
    /// A `#[mutating_tool]` call made inside [`Run::enter`], outside any step.
    Tool,
}

/// Where a journal entry's step or tool call stands in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EntryStatus {
    /// Finished: its result is recorded.
    Completed,
    /// Running under a live lease.
    InProgress,
    /// Its worker stopped mid-call: the outcome is unknown.
    Abandoned,
    /// No record: released (it failed and will run again) or purged.
    Missing,
}

/// Where a run stands in the store, as an operator sees it ([`RunInfo::state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RunState {
    /// A live worker owns it.
    Running,
    /// Its worker stopped: the next [`Run::start`] of the intent resumes it.
    Abandoned,
    /// It finished with a result.
    Finished,
    /// Its compensation has begun and is running (or its worker died: the next
    /// [`Run::start`] resumes it).
    Compensating,
    /// Every completed step was undone.
    Compensated,
    /// Compensated as far as it could be: some completed step has no undo, or its undo
    /// failed or has an unknown outcome ([`RunInfo::compensation`] says which).
    NeedsIntervention,
}

crate::lowercase_names! {
    EntryKind { Step => "step", Tool => "tool" }
    EntryStatus {
        Completed => "completed",
        InProgress => "in_progress",
        Abandoned => "abandoned",
        Missing => "missing",
    }
    RunState {
        Running => "running",
        Abandoned => "abandoned",
        Finished => "finished",
        Compensating => "compensating",
        Compensated => "compensated",
        NeedsIntervention => "needs_intervention",
    }
}

/// One entry of a run's journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalEntry {
    /// Position in the run (0-based).
    pub position: u32,
    /// A step or a tool call.
    pub kind: EntryKind,
    /// Step or tool name.
    pub name: String,
    /// The step's or tool call's key.
    pub key: String,
    /// Where it stands.
    pub status: EntryStatus,
    /// When the entry was recorded.
    pub at: SystemTime,
    /// The step's undo, when it declared one ([`Run::step_with_undo`], not
    /// [`Undo::nothing`]), or the tool call's, when its tool has `compensate = path`: its key
    /// and where it stands (`Missing` until compensation runs it).
    pub undo: Option<EntryUndo>,
}

/// The undo of a journal entry ([`JournalEntry::undo`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryUndo {
    /// The undo's key ([`UndoContext::key`]).
    pub key: String,
    /// Where it stands: `Completed` once undone (or its failure stored), `Abandoned` if its
    /// worker died mid-undo.
    pub status: EntryStatus,
}

/// A run, as seen by operators ([`Run::status_of`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RunInfo {
    /// The run key.
    pub key: String,
    /// Running, abandoned or finished.
    pub state: RunState,
    /// The result, if finished.
    pub result: Option<Value>,
    /// When it was first started.
    pub created_at: SystemTime,
    /// What compensation did, when it was compensated.
    pub compensation: Option<Compensation>,
}

/// Whether a journaled step declared an undo, as its position entry records it (absent in
/// entries written before compensation existed, and for steps without one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Declared {
    /// An undo that runs.
    Undo,
    /// [`Undo::nothing`].
    Nothing,
}

#[derive(Serialize, Deserialize)]
struct PositionEntry {
    kind: EntryKind,
    name: String,
    key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    undo: Option<Declared>,
}

struct Shared {
    name: String,
    key: Arc<str>,
    scope: Option<Arc<str>>,
    store: Arc<dyn Store>,
    options: RunOptions,
    /// Whether this handle owns the run (holds its lease).
    owner: bool,
    cursor: Mutex<Cursor>,
    /// The undos of the steps this handle ran or replayed, by step key.
    undos: Mutex<HashMap<String, undo::Registered>>,
    /// Whether the run's compensation has begun: no new step or tool call runs.
    compensating: AtomicBool,
}

#[derive(Default)]
struct Cursor {
    position: u32,
    ordinals: HashMap<String, u32>,
}

/// A long-running task: see the module docs.
pub struct Run {
    shared: Arc<Shared>,
    status: RunStatus,
    /// The run's claim, if this handle owns it, renewed by `_keep_alive` until dropped.
    lease: Option<Lease>,
    _keep_alive: Option<KeepAlive>,
}

impl core::fmt::Debug for Run {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Run")
            .field("name", &self.shared.name)
            .field("key", &self.shared.key)
            .field("status", &self.status)
            .finish()
    }
}

fn run_key(name: &str, intent: &Value, scope: Option<&str>, version: u32) -> Result<String, Error> {
    let invalid = |message: String, field: Option<String>| Error::InvalidArguments {
        tool: name.to_owned(),
        field,
        message,
    };
    let Value::Object(fields) = intent else {
        return Err(invalid(
            "a run's intent must serialize to a JSON object whose members identify the task (user, cart, order)".to_owned(),
            None,
        ));
    };
    if fields.is_empty() {
        return Err(invalid(
            "a run's intent is empty; name the user, cart or order the task is about".to_owned(),
            None,
        ));
    }
    let mut names: Vec<&String> = fields.keys().collect();
    names.sort_by(|a, b| crate::key::jcs_cmp(a, b));
    let mut builder = KeyBuilder::new(RUN_KEY_CONTRACT);
    for field in names {
        builder
            .field(field, &fields[field])
            .map_err(|e| invalid(e.to_string(), Some(field.clone())))?;
    }
    Ok(builder.finish(scope, name, version))
}

/// The run of `intent` in the caller's scope: the intent as JSON, the scope, the run key.
/// One rule for `start` and `status_of`, so a read finds exactly what a start made.
fn locate<I: Serialize + ?Sized>(
    name: &str,
    intent: &I,
    version: u32,
) -> Result<(Value, Option<Arc<str>>, String), Error> {
    let intent = serde_json::to_value(intent).map_err(|e| Error::InvalidArguments {
        tool: name.to_owned(),
        field: None,
        message: format!("the intent cannot be encoded as JSON: {e}"),
    })?;
    let scope = ambient::caller_scope(name)?;
    let key = run_key(name, &intent, scope.as_deref(), version)?;
    Ok((intent, scope, key))
}

fn store_error(what: &str, key: &str, e: StoreError) -> Error {
    Error::Store {
        tool: what.to_owned(),
        key: Some(key.to_owned()),
        source: e,
    }
}

/// An answer the caller's lease policy rules out (a store breaking its contract).
fn unexpected(what: &str, key: &str) -> Error {
    store_error(
        what,
        key,
        StoreError::Corrupt(
            "the store answered a claim with a state the policy rules out".to_owned(),
        ),
    )
}

fn decode_result(what: &str, key: &str, record: &Record) -> Result<Value, Error> {
    match &record.state {
        RecordState::Completed { result, .. } => {
            serde_json::from_str(result).map_err(|e| Error::Codec {
                tool: what.to_owned(),
                key: Some(key.to_owned()),
                message: format!("the run's stored result does not decode: {e}"),
            })
        }
        RecordState::InProgress { .. } => Ok(Value::Null),
    }
}

/// The compensation stored as a compensated run's result (a run stores an error only
/// then), or `None` for a run finished by [`Run::finish`].
fn stored_compensation(
    what: &str,
    key: &str,
    record: &Record,
) -> Result<Option<Compensation>, Error> {
    match &record.state {
        RecordState::Completed {
            result,
            is_error: true,
            ..
        } => serde_json::from_str::<undo::Stored>(result)
            .map(|stored| Some(stored.compensation))
            .map_err(|e| Error::Codec {
                tool: what.to_owned(),
                key: Some(key.to_owned()),
                message: format!("the run's stored compensation does not decode: {e}"),
            }),
        _ => Ok(None),
    }
}

/// Key of a record derived for the run `name` (version `version`) under `contract`: steps,
/// journal positions, undos and the compensation mark.
fn derive_key(
    contract: &str,
    name: &str,
    version: u32,
    fields: impl FnOnce(&mut KeyBuilder) -> Result<(), crate::key::KeyFieldError>,
) -> Result<String, Error> {
    let mut builder = KeyBuilder::new(contract);
    fields(&mut builder).map_err(|e| Error::InvalidArguments {
        tool: name.to_owned(),
        field: None,
        message: e.to_string(),
    })?;
    Ok(builder.finish(None, name, version))
}

/// Key of the record that marks the run `run_key` (of `name`, `version`) as compensating:
/// for the operation view, which tells a compensating run from a running one by it.
pub(crate) fn compensation_key(run_key: &str, name: &str, version: u32) -> Result<String, Error> {
    derive_key(undo::COMPENSATION_CONTRACT, name, version, |b| {
        b.field("run", run_key)
    })
}

/// Key of the undo of the step `step_key` in the run `name` (`version`): fields in JCS
/// order, docs/key-spec.md "Undo keys".
pub(crate) fn undo_key(step_key: &str, name: &str, version: u32) -> Result<String, Error> {
    derive_key(undo::UNDO_CONTRACT, name, version, |b| {
        b.field("step", step_key)
    })
}

/// What an undo's completed record says: its result, or its stored failure.
fn stored_undo(label: &str, key: &str, record: &Record) -> Result<UndoOutcome, Error> {
    let RecordState::Completed {
        result, is_error, ..
    } = &record.state
    else {
        return Err(unexpected(label, key));
    };
    let value: Value = serde_json::from_str(result).map_err(|e| Error::Codec {
        tool: label.to_owned(),
        key: Some(key.to_owned()),
        message: format!("the undo's stored outcome does not decode: {e}"),
    })?;
    Ok(match is_error {
        false => UndoOutcome::Undone { result: value },
        true => UndoOutcome::Failed {
            error: value
                .get("message")
                .and_then(Value::as_str)
                .map_or_else(|| value.to_string(), str::to_owned),
        },
    })
}

/// Where a record stands by the wall clock: completed, held, or abandoned.
fn record_state(record: &Record) -> EntryStatus {
    match record.state {
        RecordState::Completed { .. } => EntryStatus::Completed,
        RecordState::InProgress {
            lease_expires_at, ..
        } if lease_expires_at <= SystemTime::now() => EntryStatus::Abandoned,
        RecordState::InProgress { .. } => EntryStatus::InProgress,
    }
}

impl Run {
    /// Starts the run for this intent, or returns a handle to the existing one: a duplicate
    /// start never starts a second task. `intent` must serialize to a JSON object; every
    /// member is part of the run key.
    pub async fn start<I: Serialize + ?Sized>(name: &str, intent: &I) -> Result<Run, Error> {
        Self::start_with(name, intent, RunOptions::default()).await
    }

    /// [`Run::start`] with options.
    pub async fn start_with<I: Serialize + ?Sized>(
        name: &str,
        intent: &I,
        options: RunOptions,
    ) -> Result<Run, Error> {
        let (intent, scope, key) = locate(name, intent, options.version)?;
        let store = ambient::current_store();
        let args = intent.to_string();
        let fingerprint = crate::key::fingerprint(&args);
        let req = ClaimRequest {
            key: &key,
            tool: name,
            version: options.version,
            scope: scope.as_deref(),
            fingerprint: &fingerprint,
            args: &args,
            lease: options.lease,
            ttl: options.ttl,
            worker: ambient::worker_id(),
        };
        // A live owner is reported (the handle waits only if asked); a dead one's run is
        // taken over and resumed.
        let policy = Policy {
            on_busy: OnBusy::Report,
            take_over: true,
            accepts: &lease::any_fingerprint,
        };
        let acquired = lease::acquire(&store, req, policy)
            .await
            .map_err(|e| store_error(name, &key, e))?;
        let (status, lease) = match acquired {
            Acquired::Held(lease) if lease.taken_over() => {
                // Its compensation had begun: it resumes compensating, never runs forward.
                let mark = compensation_key(&key, name, options.version)?;
                let compensating = store
                    .lookup(&mark)
                    .await
                    .map_err(|e| store_error(name, &mark, e))?
                    .is_some();
                match compensating {
                    true => {
                        tracing::info!(run = name, key = %key, "tool-contracts: resuming the compensation of an abandoned run");
                        (RunStatus::Compensating, Some(lease))
                    }
                    false => {
                        tracing::info!(run = name, key = %key, "tool-contracts: resuming an abandoned run");
                        (RunStatus::Resumed, Some(lease))
                    }
                }
            }
            Acquired::Held(lease) => (RunStatus::Started, Some(lease)),
            Acquired::Busy { .. } => (RunStatus::Running, None),
            Acquired::Completed(record) => match stored_compensation(name, &key, &record)? {
                Some(compensation) => (RunStatus::Compensated(compensation), None),
                None => (
                    RunStatus::Finished(decode_result(name, &key, &record)?),
                    None,
                ),
            },
            Acquired::Abandoned | Acquired::Mismatch { .. } => return Err(unexpected(name, &key)),
        };
        let keep_alive = lease.as_ref().and_then(Lease::keep_alive);
        let shared = Arc::new(Shared {
            name: name.to_owned(),
            key: Arc::from(key.as_str()),
            scope,
            store,
            options,
            owner: lease.is_some(),
            cursor: Mutex::new(Cursor::default()),
            undos: Mutex::new(HashMap::new()),
            compensating: AtomicBool::new(status == RunStatus::Compensating),
        });
        Ok(Run {
            shared,
            status,
            lease,
            _keep_alive: keep_alive,
        })
    }

    /// Where the run stood when this handle was made.
    pub fn status(&self) -> &RunStatus {
        &self.status
    }

    /// The run key.
    pub fn key(&self) -> &str {
        &self.shared.key
    }

    /// Whether this handle owns the run (it may run steps and finish it).
    pub fn is_owner(&self) -> bool {
        self.shared.owner
    }

    fn not_owned(&self) -> Error {
        Error::RunNotOwned {
            run: self.shared.name.clone(),
            key: self.shared.key.to_string(),
            state: match &self.status {
                RunStatus::Finished(_) => RunState::Finished,
                RunStatus::Compensated(c) => match c.state {
                    CompensationState::Compensated => RunState::Compensated,
                    _ => RunState::NeedsIntervention,
                },
                _ => RunState::Running,
            },
        }
    }

    /// Runs `f` as the step `name`, once: on resume, a finished step returns its recorded
    /// result without running. Tool calls inside `f` are scoped by the run.
    pub async fn step<T, E, F, Fut>(&self, name: &str, f: F) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.step_with(name, StepOptions::default(), f).await
    }

    /// [`Run::step`] with options.
    pub async fn step_with<T, E, F, Fut>(
        &self,
        name: &str,
        options: StepOptions,
        f: F,
    ) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        // Feature `otel`: the step's span, entered around the step; zero-sized without it.
        let telemetry = StepTelemetry::start(&self.shared.name, name);
        telemetry::instrument(
            telemetry.span(),
            self.step_in(name, options, f, None, &telemetry),
        )
        .await
    }

    /// [`Run::step`] with the step's undo: if the run is compensated ([`Run::compensate`])
    /// after this step completed, `undo` runs once with the step's stored result and an
    /// [`UndoContext`] (whose [`key`](UndoContext::key) it should forward downstream).
    /// `undo` is a closure `|result: T, cx: UndoContext| async { … }` or an [`Undo`] (with
    /// a `verify`, or [`Undo::nothing`] for a step with nothing to undo).
    ///
    /// ```no_run
    /// # async fn demo(run: &tool_contracts_runtime::Run) -> Result<(), tool_contracts_runtime::Error> {
    /// let charge: String = run
    ///     .step_with_undo(
    ///         "charge",
    ///         || async { Ok::<_, tool_contracts_runtime::Error>("ch_1".to_owned()) },
    ///         |charge: String, cx: tool_contracts_runtime::UndoContext| async move {
    ///             // refund(charge, idempotency_key = cx.key())
    ///             Ok::<_, tool_contracts_runtime::Error>(format!("refund of {charge} as {}", cx.key()))
    ///         },
    ///     )
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn step_with_undo<T, E, F, Fut, U>(&self, name: &str, f: F, undo: U) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        U: IntoUndo<T>,
    {
        let telemetry = StepTelemetry::start(&self.shared.name, name);
        let undo = undo.into_undo();
        telemetry::instrument(
            telemetry.span(),
            self.step_in(
                name,
                StepOptions::default(),
                f,
                Some(undo::Registered::from(undo)),
                &telemetry,
            ),
        )
        .await
    }

    async fn step_in<T, E, F, Fut>(
        &self,
        name: &str,
        options: StepOptions,
        f: F,
        undo: Option<undo::Registered>,
        telemetry: &StepTelemetry,
    ) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        // The crate's own error ends the step: on its span (feature `otel`), then returned.
        let failed = |decision: Decision, e: Error| -> E {
            telemetry.ended(decision, Some(e.code()));
            E::from(e)
        };
        if !self.shared.owner {
            return Err(failed(Decision::Rejected, self.not_owned()));
        }
        let ordinal = {
            let mut cursor = self.shared.cursor.lock().unwrap_or_else(|p| p.into_inner());
            let ordinal = cursor.ordinals.entry(name.to_owned()).or_insert(0);
            let current = *ordinal;
            *ordinal += 1;
            current
        };
        let step_key = self
            .shared
            .step_key(name, ordinal)
            .map_err(|e| failed(Decision::Rejected, e))?;
        telemetry.key(&step_key);
        if self.shared.compensating.load(Ordering::SeqCst) {
            self.shared
                .replay_only(name, &step_key)
                .await
                .map_err(|e| failed(Decision::Rejected, e))?;
        }
        let declared = undo.as_ref().map(|u| match u.action {
            Some(_) => Declared::Undo,
            None => Declared::Nothing,
        });
        self.shared
            .journal(EntryKind::Step, name, &step_key, declared)
            .await
            .map_err(|e| failed(Decision::Rejected, e))?;
        if let Some(undo) = undo {
            // Registered whether the step runs now or replays: compensation needs it either way.
            self.shared
                .undos
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(step_key.clone(), undo);
        }
        let label = format!("{}/{name}", self.shared.name);
        let req = ClaimRequest {
            key: &step_key,
            tool: &label,
            version: self.shared.options.version,
            scope: self.shared.scope.as_deref(),
            // A step has no arguments of its own: its key is its identity.
            fingerprint: &crate::key::fingerprint("{}"),
            args: "{}",
            lease: self.shared.options.lease,
            ttl: self.shared.options.ttl,
            worker: ambient::worker_id(),
        };
        let policy = Policy {
            on_busy: OnBusy::Wait { max: None },
            take_over: options.on_unknown == OnUnknown::Rerun,
            accepts: &lease::any_fingerprint,
        };
        let acquired = lease::acquire(&self.shared.store, req, policy)
            .await
            .map_err(|e| failed(Decision::Rejected, store_error(&label, &step_key, e)))?;
        let lease = match acquired {
            Acquired::Held(lease) => lease,
            Acquired::Completed(record) => {
                let RecordState::Completed { result, .. } = &record.state else {
                    return Err(failed(Decision::Rejected, unexpected(&label, &step_key)));
                };
                tracing::debug!(run = %self.shared.name, step = name, key = %step_key, decision = "replayed", "tool-contracts: step replayed from the journal");
                return match serde_json::from_str(result) {
                    Ok(value) => {
                        telemetry.ended(Decision::Replayed, None);
                        Ok(value)
                    }
                    Err(e) => Err(failed(Decision::Replayed, Error::Codec {
                        tool: label.clone(),
                        key: Some(step_key.clone()),
                        message: format!("the step's recorded result no longer decodes ({e}); bump the run's version"),
                    })),
                };
            }
            Acquired::Abandoned => {
                return Err(failed(
                    Decision::Unknown,
                    Error::OutcomeUnknown {
                        tool: label,
                        key: step_key,
                    },
                ))
            }
            Acquired::Busy { .. } | Acquired::Mismatch { .. } => {
                return Err(failed(Decision::Rejected, unexpected(&label, &step_key)))
            }
        };
        // Tool calls inside a step are not journaled one by one: the step's result is.
        // On the heap, as a tool call's body is (see the engine): steps nest tool calls.
        let body = Box::pin(ambient::with_call_journal(None, self.shared.scoped(f())));
        let result = lease.heartbeat(body).await;
        let recorded = match &result {
            Ok(value) => match serde_json::to_string(value) {
                Ok(json) => {
                    telemetry.ended(Decision::Executed, None);
                    lease.complete(&json, false).await
                }
                Err(e) => {
                    let _ = lease.abandon().await;
                    return Err(failed(
                        Decision::Unknown,
                        Error::Codec {
                            tool: label,
                            key: Some(step_key),
                            message: format!("the step's result cannot be stored as JSON: {e}"),
                        },
                    ));
                }
            },
            Err(_) => {
                telemetry.ended(Decision::Executed, Some(telemetry::TOOL_ERROR));
                lease.release().await
            }
        };
        if let Err(e) = recorded {
            tracing::error!(run = %self.shared.name, step = name, key = %step_key, error = %e, "tool-contracts: could not record the step's outcome");
        }
        result
    }

    /// Runs `future` inside the run: `#[mutating_tool]` calls in it are scoped by the run
    /// and recorded in its journal; a tool with `compensate = path` has its undo registered
    /// for the call, so [`Run::compensate`] undoes it as it undoes a step.
    pub async fn enter<F: Future>(&self, future: F) -> F::Output {
        let journal: Arc<dyn CallJournal> = self.shared.clone();
        ambient::with_call_journal(Some(journal), self.shared.scoped(future)).await
    }

    /// Stores the run's result; later starts of the same intent get it back as
    /// [`RunStatus::Finished`].
    pub async fn finish<T: Serialize>(mut self, result: &T) -> Result<(), Error> {
        let Some(lease) = self.lease.take() else {
            return Err(self.not_owned());
        };
        self._keep_alive = None;
        let json = serde_json::to_string(result).map_err(|e| Error::Codec {
            tool: self.shared.name.clone(),
            key: Some(self.shared.key.to_string()),
            message: format!("the run's result cannot be stored as JSON: {e}"),
        })?;
        lease
            .complete(&json, false)
            .await
            .map_err(|e| store_error(&self.shared.name, &self.shared.key, e))
    }

    /// Compensates the run: undoes its completed steps in reverse journal order, each undo
    /// once (journaled under its own key, [`UndoContext::key`]), then stores the
    /// [`Compensation`] as the run's outcome; later starts of the intent get it back as
    /// [`RunStatus::Compensated`]. `reason` is kept (the first call's, on a resume).
    ///
    /// Every completed entry is visited, newest first: a step with an undo is undone; one
    /// with [`Undo::nothing`] is passed over; a step or tool call without an undo, an undo
    /// that fails (its error is stored, never retried by itself), and an unknown outcome
    /// (a step, or an undo without `verify`, whose worker died mid-call) are recorded and
    /// compensation goes on with the older steps; the run then ends
    /// [`CompensationState::NeedsIntervention`] instead of `Compensated`.
    ///
    /// From the first call on, the run is compensating: a worker that dies mid-compensation
    /// leaves it to the next [`Run::start`] ([`RunStatus::Compensating`]), which replays the
    /// steps (registering their undos) and calls `compensate` again; undos already
    /// recorded are not run again. A store failure returns the error and gives the run up
    /// at once (so a new start resumes it).
    pub async fn compensate(mut self, reason: &str) -> Result<Compensation, Error> {
        let Some(lease) = self.lease.take() else {
            return Err(self.not_owned());
        };
        let compensation = match self.shared.compensate(reason).await {
            Ok(compensation) => compensation,
            Err(e) => {
                let _ = lease.abandon().await;
                return Err(e);
            }
        };
        let stored = undo::Stored { compensation };
        let json = serde_json::to_string(&stored).map_err(|e| Error::Codec {
            tool: self.shared.name.clone(),
            key: Some(self.shared.key.to_string()),
            message: format!("the run's compensation cannot be stored as JSON: {e}"),
        })?;
        // Stored as the run's error: a reader tells it from a result (`Run::finish` never
        // stores an error), and the mark record says it is a compensation.
        lease
            .complete(&json, true)
            .await
            .map_err(|e| store_error(&self.shared.name, &self.shared.key, e))?;
        self._keep_alive = None;
        tracing::info!(run = %self.shared.name, key = %self.shared.key, state = %stored.compensation.state, "tool-contracts: run compensated");
        Ok(stored.compensation)
    }

    /// Waits until the run finishes and returns its result (for handles that do not own
    /// it). A run that was compensated fails with [`Error::RunCompensating`] (read what was
    /// undone with [`Run::status_of`]). Fails with [`Error::OutcomeUnknown`] if the owner died: resume it with
    /// [`Run::start`].
    pub async fn wait(&self) -> Result<Value, Error> {
        if let RunStatus::Finished(v) = &self.status {
            return Ok(v.clone());
        }
        let store = &self.shared.store;
        let key = &*self.shared.key;
        loop {
            match store.lookup(key).await {
                Ok(Some(rec)) => match rec.state {
                    RecordState::Completed { is_error: true, .. } => {
                        return Err(Error::RunCompensating {
                            run: self.shared.name.clone(),
                            key: key.to_owned(),
                            message: "the run was compensated and has no result; read what was undone with `Run::status_of`".to_owned(),
                        })
                    }
                    RecordState::Completed { .. } => {
                        return decode_result(&self.shared.name, key, &rec)
                    }
                    RecordState::InProgress {
                        lease_expires_at, ..
                    } => {
                        let remaining = lease_expires_at
                            .duration_since(SystemTime::now())
                            .unwrap_or(Duration::ZERO);
                        if remaining.is_zero() && !self.shared.owner {
                            return Err(Error::OutcomeUnknown {
                                tool: self.shared.name.clone(),
                                key: key.to_owned(),
                            });
                        }
                        store
                            .wait(key, remaining.max(Duration::from_millis(10)))
                            .await;
                    }
                },
                Ok(None) => {
                    return Err(Error::OutcomeUnknown {
                        tool: self.shared.name.clone(),
                        key: key.to_owned(),
                    })
                }
                Err(e) => return Err(store_error(&self.shared.name, key, e)),
            }
        }
    }

    /// The journal of this run: every step and tool call in order, with its status.
    pub async fn journal(&self) -> Result<Vec<JournalEntry>, Error> {
        self.shared.read_journal().await
    }

    /// An operator's view of the run for `intent` in the current scope and store, if any.
    pub async fn status_of<I: Serialize + ?Sized>(
        name: &str,
        intent: &I,
        options: RunOptions,
    ) -> Result<Option<RunInfo>, Error> {
        // An invalid scope is refused, as by `start`: dropped, it would read the run of
        // the same intent outside any scope (another tenant's, or nobody's).
        let (_, _, key) = locate(name, intent, options.version)?;
        let store = ambient::current_store();
        let Some(rec) = store
            .lookup(&key)
            .await
            .map_err(|e| store_error(name, &key, e))?
        else {
            return Ok(None);
        };
        let compensation = stored_compensation(name, &key, &rec)?;
        let (state, result) = match (record_state(&rec), &compensation) {
            (EntryStatus::Completed, Some(c)) => match c.state {
                CompensationState::Compensated => (RunState::Compensated, None),
                _ => (RunState::NeedsIntervention, None),
            },
            (EntryStatus::Completed, None) => {
                (RunState::Finished, decode_result(name, &key, &rec).ok())
            }
            (EntryStatus::Abandoned, _) => (RunState::Abandoned, None),
            _ => {
                let mark = compensation_key(&key, name, options.version)?;
                match store
                    .lookup(&mark)
                    .await
                    .map_err(|e| store_error(name, &mark, e))?
                {
                    Some(_) => (RunState::Compensating, None),
                    None => (RunState::Running, None),
                }
            }
        };
        Ok(Some(RunInfo {
            key,
            state,
            result,
            created_at: rec.created_at,
            compensation,
        }))
    }
}

impl Shared {
    fn derive(
        &self,
        contract: &str,
        fields: impl FnOnce(&mut KeyBuilder) -> Result<(), crate::key::KeyFieldError>,
    ) -> Result<String, Error> {
        derive_key(contract, &self.name, self.options.version, fields)
    }

    /// Key of the `ordinal`-th step named `step` (fields in JCS order).
    fn step_key(&self, step: &str, ordinal: u32) -> Result<String, Error> {
        self.derive(STEP_CONTRACT, |b| {
            b.field("ordinal", &ordinal)?;
            b.field("run", &*self.key)?;
            b.field("step", step)
        })
    }

    fn position_key(&self, position: u32) -> Result<String, Error> {
        self.derive(POSITION_CONTRACT, |b| {
            b.field("position", &position)?;
            b.field("run", &*self.key)
        })
    }

    fn scoped<F: Future>(&self, future: F) -> impl Future<Output = F::Output> {
        ambient::with_scope(format!("run:{}", self.key), future)
    }

    /// Records what the code asks for at the next position, or checks it against what
    /// an earlier attempt of this run recorded there.
    async fn journal(
        &self,
        kind: EntryKind,
        name: &str,
        key: &str,
        undo: Option<Declared>,
    ) -> Result<(), Error> {
        let position = {
            let mut cursor = self.cursor.lock().unwrap_or_else(|p| p.into_inner());
            let p = cursor.position;
            cursor.position += 1;
            p
        };
        let pos_key = self.position_key(position)?;
        let requested = format!("{}:{name}", kind.as_str());
        let entry = PositionEntry {
            kind,
            name: name.to_owned(),
            key: key.to_owned(),
            undo,
        };
        let entry = serde_json::to_string(&entry).map_err(|e| Error::Codec {
            tool: self.name.clone(),
            key: Some(self.key.to_string()),
            message: e.to_string(),
        })?;
        let req = ClaimRequest {
            key: &pos_key,
            tool: &self.name,
            version: self.options.version,
            scope: self.scope.as_deref(),
            fingerprint: &requested,
            args: &entry,
            // A position record is completed right after its claim: a short lease lets a
            // resume take over one whose worker died in between.
            lease: Duration::from_millis(500),
            ttl: self.options.ttl,
            worker: ambient::worker_id(),
        };
        // The fingerprint is what the code asked for there: another request, live,
        // abandoned or recorded, is code that changed under the run.
        let accepts = |recorded: &str| recorded == requested;
        let policy = Policy {
            on_busy: OnBusy::Wait { max: None },
            take_over: true,
            accepts: &accepts,
        };
        let fail = |e| store_error(&self.name, &pos_key, e);
        match lease::acquire(&self.store, req, policy)
            .await
            .map_err(fail)?
        {
            Acquired::Held(lease) => lease.complete(&entry, false).await.map_err(fail),
            Acquired::Completed(_) => Ok(()),
            Acquired::Mismatch { fingerprint, .. } => Err(Error::NonDeterministic {
                run: self.name.clone(),
                key: self.key.to_string(),
                position,
                recorded: fingerprint,
                requested,
            }),
            Acquired::Busy { .. } | Acquired::Abandoned => Err(unexpected(&self.name, &pos_key)),
        }
    }

    /// Where the record of `key` stands (`Missing` without one).
    async fn status_of_key(&self, key: &str) -> Result<EntryStatus, Error> {
        match self.store.lookup(key).await {
            Ok(None) => Ok(EntryStatus::Missing),
            Ok(Some(r)) => Ok(record_state(&r)),
            Err(e) => Err(store_error(&self.name, key, e)),
        }
    }

    /// While compensating, a step or tool call may only replay: refused unless its key is
    /// completed.
    async fn replay_only(&self, name: &str, key: &str) -> Result<(), Error> {
        if self.status_of_key(key).await? == EntryStatus::Completed {
            return Ok(());
        }
        Err(Error::RunCompensating {
            run: self.name.clone(),
            key: self.key.to_string(),
            message: format!("`{name}` did not complete before the compensation began, so it does not run now; call `Run::compensate` to finish undoing the run"),
        })
    }

    /// Marks the run as compensating (once: a record under its compensation key, completed
    /// at once with the reason) and returns the reason the first mark stored.
    async fn mark_compensating(&self, reason: &str) -> Result<String, Error> {
        let mark = compensation_key(&self.key, &self.name, self.options.version)?;
        let args = serde_json::json!({ "reason": reason }).to_string();
        let label = format!("{}/compensation", self.name);
        let req = ClaimRequest {
            key: &mark,
            tool: &label,
            version: self.options.version,
            scope: self.scope.as_deref(),
            fingerprint: "compensation",
            args: &args,
            // Completed right after its claim, like a journal position.
            lease: Duration::from_millis(500),
            ttl: self.options.ttl,
            worker: ambient::worker_id(),
        };
        let policy = Policy {
            on_busy: OnBusy::Wait { max: None },
            take_over: true,
            accepts: &lease::any_fingerprint,
        };
        let fail = |e| store_error(&label, &mark, e);
        match lease::acquire(&self.store, req, policy)
            .await
            .map_err(fail)?
        {
            Acquired::Held(held) => {
                held.complete(&args, false).await.map_err(fail)?;
                Ok(reason.to_owned())
            }
            Acquired::Completed(record) => {
                let RecordState::Completed { result, .. } = &record.state else {
                    return Err(unexpected(&label, &mark));
                };
                let stored: Value = serde_json::from_str(result)
                    .map_err(|e| fail(StoreError::Corrupt(format!("compensation mark: {e}"))))?;
                Ok(stored
                    .get("reason")
                    .and_then(Value::as_str)
                    .unwrap_or(reason)
                    .to_owned())
            }
            Acquired::Busy { .. } | Acquired::Abandoned | Acquired::Mismatch { .. } => {
                Err(unexpected(&label, &mark))
            }
        }
    }

    /// The run's compensation: see [`Run::compensate`].
    async fn compensate(&self, reason: &str) -> Result<Compensation, Error> {
        self.compensating.store(true, Ordering::SeqCst);
        let reason = self.mark_compensating(reason).await?;
        let mut steps = Vec::new();
        // A tool call repeated in the run with the same key (a replay of the first) is one
        // call with one effect: visited once, at its newest entry.
        let mut visited = std::collections::HashSet::new();
        for (entry, declared) in self.read_entries().await?.into_iter().rev() {
            if !visited.insert(entry.key.clone()) {
                continue;
            }
            let outcome = match (entry.status, declared) {
                // Released (it failed) or never recorded: nothing happened to undo.
                (EntryStatus::Missing, _) => continue,
                (EntryStatus::Completed, None) => UndoOutcome::NoUndo,
                (EntryStatus::Completed, Some(_)) => self.undo(&entry).await?,
                // The step's own outcome is unknown: nobody can say what to undo.
                _ => UndoOutcome::Unknown,
            };
            if outcome.needs_intervention() {
                tracing::warn!(run = %self.name, key = %self.key, step = %entry.name, outcome = ?outcome, "tool-contracts: a completed step could not be undone; the run needs intervention");
            }
            steps.push(StepCompensation {
                position: entry.position,
                name: entry.name,
                key: entry.key,
                undo_key: entry.undo.map(|u| u.key),
                outcome,
            });
        }
        let state = match steps.iter().any(|s| s.outcome.needs_intervention()) {
            true => CompensationState::NeedsIntervention,
            false => CompensationState::Compensated,
        };
        Ok(Compensation {
            state,
            reason,
            steps,
        })
    }

    /// Runs the undo of the completed step `entry` once: claimed under its own key through
    /// the lease layer, like a step.
    async fn undo(&self, entry: &JournalEntry) -> Result<UndoOutcome, Error> {
        let registered = self
            .undos
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&entry.key);
        let Some(registered) = registered else {
            let kind = match entry.kind {
                EntryKind::Tool => "tool call",
                _ => "step",
            };
            return Err(undo::not_replayed(&self.name, &self.key, kind, &entry.name));
        };
        let Some(action) = registered.action else {
            return Ok(UndoOutcome::NothingToUndo);
        };
        let key = undo_key(&entry.key, &self.name, self.options.version)?;
        let label = format!("{}/{}/undo", self.name, entry.name);
        // What the undo is handed: the entry's stored result and arguments (read first: a
        // tool call that stored its error has nothing to undo, and claims no undo key).
        let done = match self.store.lookup(&entry.key).await {
            Ok(Some(record)) => {
                if let RecordState::Completed { is_error: true, .. } = record.state {
                    return Ok(UndoOutcome::NothingToUndo);
                }
                undo::Done {
                    result: decode_result(&label, &entry.key, &record)?,
                    args: record.args,
                }
            }
            Ok(None) => undo::Done {
                result: Value::Null,
                args: "{}".to_owned(),
            },
            Err(e) => return Err(store_error(&label, &entry.key, e)),
        };
        let fail = |e| store_error(&label, &key, e);
        let req = ClaimRequest {
            key: &key,
            tool: &label,
            version: self.options.version,
            scope: self.scope.as_deref(),
            fingerprint: &crate::key::fingerprint("{}"),
            args: "{}",
            lease: self.options.lease,
            ttl: self.options.ttl,
            worker: ambient::worker_id(),
        };
        let policy = Policy {
            on_busy: OnBusy::Wait { max: None },
            take_over: registered.verify.is_some() || registered.on_unknown == OnUnknown::Rerun,
            accepts: &lease::any_fingerprint,
        };
        let held = match lease::acquire(&self.store, req, policy)
            .await
            .map_err(fail)?
        {
            Acquired::Held(held) => held,
            // Undone in an earlier attempt (or its failure stored): never again.
            Acquired::Completed(record) => return stored_undo(&label, &key, &record),
            Acquired::Abandoned => return Ok(UndoOutcome::Unknown),
            Acquired::Busy { .. } | Acquired::Mismatch { .. } => {
                return Err(unexpected(&label, &key))
            }
        };
        let cx = UndoContext {
            key: key.clone(),
            step: entry.name.clone(),
            step_key: entry.key.clone(),
        };
        if held.taken_over() {
            tracing::info!(run = %self.name, step = %entry.name, key = %key, "tool-contracts: an undo's worker died mid-undo; settling it");
            if let Some(verify) = registered.verify {
                let body = Box::pin(ambient::with_call_journal(
                    None,
                    self.scoped(verify(
                        undo::Done {
                            result: done.result.clone(),
                            args: done.args.clone(),
                        },
                        cx.clone(),
                    )),
                ));
                match held.heartbeat(body).await {
                    Ok(Some(found)) => {
                        return self.record_undo(held, &label, &key, Ok(found)).await;
                    }
                    // The undo did not happen: run it under this claim.
                    Ok(None) => {}
                    Err(message) => {
                        tracing::warn!(run = %self.name, step = %entry.name, key = %key, error = %message, "tool-contracts: the undo's verify failed; its outcome stays unknown");
                        let _ = held.abandon().await;
                        return Ok(UndoOutcome::Unknown);
                    }
                }
            }
        }
        // Tool calls inside an undo are not journaled one by one: the undo's result is.
        let body = Box::pin(ambient::with_call_journal(
            None,
            self.scoped(action(done, cx)),
        ));
        let out = held.heartbeat(body).await;
        self.record_undo(held, &label, &key, out).await
    }

    /// Stores an undo's outcome under its key: a result, or its failure (as an error, never
    /// retried by itself).
    async fn record_undo(
        &self,
        held: Lease,
        label: &str,
        key: &str,
        out: Result<Value, String>,
    ) -> Result<UndoOutcome, Error> {
        let fail = |e| store_error(label, key, e);
        let (json, is_error, outcome) = match out {
            Ok(result) => (result.to_string(), false, UndoOutcome::Undone { result }),
            Err(error) => (
                serde_json::json!({ "message": error }).to_string(),
                true,
                UndoOutcome::Failed { error },
            ),
        };
        held.complete(&json, is_error).await.map_err(fail)?;
        // Tests stop a worker right here (after the undo's journal entry, before anything
        // else): keep this event's text.
        tracing::debug!(run = %self.name, key = %key, "tool-contracts: undo recorded");
        Ok(outcome)
    }

    async fn read_journal(&self) -> Result<Vec<JournalEntry>, Error> {
        Ok(self
            .read_entries()
            .await?
            .into_iter()
            .map(|(entry, _)| entry)
            .collect())
    }

    /// The journal, each entry with what its step declared about its undo.
    async fn read_entries(&self) -> Result<Vec<(JournalEntry, Option<Declared>)>, Error> {
        let mut entries = Vec::new();
        for position in 0.. {
            let pos_key = self.position_key(position)?;
            let fail = |e| store_error(&self.name, &pos_key, e);
            let Some(rec) = self.store.lookup(&pos_key).await.map_err(fail)? else {
                break;
            };
            let entry: PositionEntry = serde_json::from_str(&rec.args).map_err(|e| {
                store_error(
                    &self.name,
                    &pos_key,
                    StoreError::Corrupt(format!("journal entry: {e}")),
                )
            })?;
            let status = self.status_of_key(&entry.key).await?;
            let undo = match entry.undo {
                Some(Declared::Undo) => {
                    let key = undo_key(&entry.key, &self.name, self.options.version)?;
                    let status = self.status_of_key(&key).await?;
                    Some(EntryUndo { key, status })
                }
                _ => None,
            };
            entries.push((
                JournalEntry {
                    position,
                    kind: entry.kind,
                    name: entry.name,
                    key: entry.key,
                    status,
                    at: rec.created_at,
                    undo,
                },
                entry.undo,
            ));
        }
        Ok(entries)
    }
}

/// Inside [`Run::enter`] (outside any step), each tool call takes the next journal
/// position before it claims its key: the engine calls this through
/// [`ambient::journal_call`], without knowing about runs. A tool with `compensate` has its
/// undo registered for the entry, as [`Run::step_with_undo`] registers a step's.
impl CallJournal for Shared {
    fn record<'a>(
        &'a self,
        tool: &'static ToolSpec,
        key: &'a str,
    ) -> core::pin::Pin<Box<dyn Future<Output = Result<(), Error>> + Send + 'a>> {
        Box::pin(async move {
            if self.compensating.load(Ordering::SeqCst) {
                self.replay_only(tool.name, key).await?;
            }
            let declared = tool.compensate.map(|_| Declared::Undo);
            self.journal(EntryKind::Tool, tool.name, key, declared)
                .await?;
            if let Some(compensate) = tool.compensate {
                // Registered whether the call runs now or replays, as a step's undo is.
                self.undos
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key.to_owned(), undo::Registered::tool(compensate));
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vector of docs/key-spec.md "Undo keys": an undo's key depends on its step's key
    /// (and the run's name and version) alone.
    #[test]
    fn the_undo_key_matches_its_documented_vector() {
        let step = "a63b2208f648767293039cca84fbe432812d89700f4e36a9b2b7f169ff420c5f";
        let key = undo_key(step, "saga", 1).unwrap();
        assert_eq!(
            key,
            "7724cd60bd77625eb79f1f0bb79257767987172d13616841989eb012adc0f20a"
        );
        assert_ne!(undo_key(step, "saga", 2).unwrap(), key);
        assert_eq!(
            compensation_key(step, "saga", 1).unwrap().len(),
            64,
            "a key of its own contract"
        );
    }
}
