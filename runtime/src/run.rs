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

use core::future::Future;
use core::time::Duration;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ambient::{self, CallJournal};
use crate::error::Error;
use crate::key::KeyBuilder;
use crate::lease::{self, Acquired, KeepAlive, Lease, OnBusy, Policy};
use crate::spec::OnUnknown;
use crate::store::{ClaimRequest, Record, RecordState, Store, StoreError};
use crate::telemetry::{self, Decision, StepTelemetry};

/// Contract string of run keys.
pub const RUN_KEY_CONTRACT: &str = "tool-contracts/run/v1";
const STEP_CONTRACT: &str = "tool-contracts/step/v1";
const POSITION_CONTRACT: &str = "tool-contracts/position/v1";

/// Where a run stands, as seen by the handle [`Run::start`] returned.
#[derive(Debug, Clone, PartialEq)]
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
}

crate::lowercase_names! {
    EntryKind { Step => "step", Tool => "tool" }
    EntryStatus {
        Completed => "completed",
        InProgress => "in_progress",
        Abandoned => "abandoned",
        Missing => "missing",
    }
    RunState { Running => "running", Abandoned => "abandoned", Finished => "finished" }
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
}

#[derive(Serialize, Deserialize)]
struct PositionEntry {
    kind: EntryKind,
    name: String,
    key: String,
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
                tracing::info!(run = name, key = %key, "tool-contracts: resuming an abandoned run");
                (RunStatus::Resumed, Some(lease))
            }
            Acquired::Held(lease) => (RunStatus::Started, Some(lease)),
            Acquired::Busy { .. } => (RunStatus::Running, None),
            Acquired::Completed(record) => (
                RunStatus::Finished(decode_result(name, &key, &record)?),
                None,
            ),
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
            state: match self.status {
                RunStatus::Finished(_) => RunState::Finished,
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
        telemetry::instrument(telemetry.span(), self.step_in(name, options, f, &telemetry)).await
    }

    async fn step_in<T, E, F, Fut>(
        &self,
        name: &str,
        options: StepOptions,
        f: F,
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
        self.shared
            .journal(EntryKind::Step, name, &step_key)
            .await
            .map_err(|e| failed(Decision::Rejected, e))?;
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
    /// and recorded in its journal.
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

    /// Waits until the run finishes and returns its result (for handles that do not own
    /// it). Fails with [`Error::OutcomeUnknown`] if the owner died: resume it with
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
        let (state, result) = match record_state(&rec) {
            EntryStatus::Completed => (RunState::Finished, decode_result(name, &key, &rec).ok()),
            EntryStatus::Abandoned => (RunState::Abandoned, None),
            _ => (RunState::Running, None),
        };
        Ok(Some(RunInfo {
            key,
            state,
            result,
            created_at: rec.created_at,
        }))
    }
}

impl Shared {
    fn derive(
        &self,
        contract: &str,
        fields: impl FnOnce(&mut KeyBuilder) -> Result<(), crate::key::KeyFieldError>,
    ) -> Result<String, Error> {
        let mut builder = KeyBuilder::new(contract);
        fields(&mut builder).map_err(|e| Error::InvalidArguments {
            tool: self.name.clone(),
            field: None,
            message: e.to_string(),
        })?;
        Ok(builder.finish(None, &self.name, self.options.version))
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
    async fn journal(&self, kind: EntryKind, name: &str, key: &str) -> Result<(), Error> {
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

    async fn read_journal(&self) -> Result<Vec<JournalEntry>, Error> {
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
            let status = match self.store.lookup(&entry.key).await.map_err(fail)? {
                None => EntryStatus::Missing,
                Some(r) => record_state(&r),
            };
            entries.push(JournalEntry {
                position,
                kind: entry.kind,
                name: entry.name,
                key: entry.key,
                status,
                at: rec.created_at,
            });
        }
        Ok(entries)
    }
}

/// Inside [`Run::enter`] (outside any step), each tool call takes the next journal
/// position before it claims its key: the engine calls this through
/// [`ambient::journal_call`], without knowing about runs.
impl CallJournal for Shared {
    fn record<'a>(
        &'a self,
        tool: &'a str,
        key: &'a str,
    ) -> core::pin::Pin<Box<dyn Future<Output = Result<(), Error>> + Send + 'a>> {
        Box::pin(self.journal(EntryKind::Tool, tool, key))
    }
}
