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

use crate::ambient;
use crate::engine;
use crate::error::Error;
use crate::key::KeyBuilder;
use crate::spec::OnUnknown;
use crate::store::{ClaimOutcome, ClaimRequest, Completion, RecordState, Store, StoreError};

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

/// One entry of a run's journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalEntry {
    /// Position in the run (0-based).
    pub position: u32,
    /// `step` or `tool`.
    pub kind: String,
    /// Step or tool name.
    pub name: String,
    /// The step's or tool call's key.
    pub key: String,
    /// `completed`, `in_progress`, `abandoned` or `missing` (released, purged).
    pub status: &'static str,
    /// When the entry was recorded.
    pub at: SystemTime,
}

/// A run, as seen by operators ([`Run::status`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RunInfo {
    /// The run key.
    pub key: String,
    /// `running`, `abandoned` or `finished`.
    pub status: &'static str,
    /// The result, if finished.
    pub result: Option<Value>,
    /// When it was first started.
    pub created_at: SystemTime,
}

#[derive(Serialize, Deserialize)]
struct PositionEntry {
    kind: String,
    name: String,
    key: String,
}

struct Shared {
    name: String,
    key: Arc<str>,
    scope: Option<Arc<str>>,
    store: Arc<dyn Store>,
    options: RunOptions,
    token: Option<u64>,
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
    heartbeat: Option<tokio::task::JoinHandle<()>>,
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

impl Drop for Run {
    fn drop(&mut self) {
        if let Some(h) = self.heartbeat.take() {
            h.abort();
        }
    }
}

tokio::task_local! {
    /// The run whose code is executing: tool calls inside it are journaled and scoped.
    static CURRENT: RunContext;
}

#[derive(Clone)]
struct RunContext {
    shared: Arc<Shared>,
    in_step: bool,
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

fn store_error(what: &str, key: &str, e: StoreError) -> Error {
    Error::Store {
        tool: what.to_owned(),
        key: key.to_owned(),
        message: e.to_string(),
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
        let intent = serde_json::to_value(intent).map_err(|e| Error::InvalidArguments {
            tool: name.to_owned(),
            field: None,
            message: format!("the intent cannot be encoded as JSON: {e}"),
        })?;
        let scope = ambient::caller_scope(name)?;
        let key = run_key(name, &intent, scope.as_deref(), options.version)?;
        let store = ambient::current_store();
        let args = intent.to_string();
        let req = ClaimRequest {
            key: &key,
            tool: name,
            scope: scope.as_deref(),
            fingerprint: "",
            args: &args,
            lease: options.lease,
            ttl: options.ttl,
            worker: ambient::worker_id(),
        };
        let fail = |e| store_error(name, &key, e);
        let mut outcome = store.claim(req).await.map_err(fail)?;
        let mut resumed = false;
        let (status, token) = loop {
            match outcome {
                ClaimOutcome::Acquired { token } if resumed => {
                    break (RunStatus::Resumed, Some(token))
                }
                ClaimOutcome::Acquired { token } => break (RunStatus::Started, Some(token)),
                ClaimOutcome::InProgress { .. } => break (RunStatus::Running, None),
                ClaimOutcome::Completed(rec) => {
                    let result = match &rec.state {
                        RecordState::Completed { result, .. } => serde_json::from_str(result)
                            .map_err(|e| Error::Codec {
                                tool: name.to_owned(),
                                key: key.clone(),
                                message: format!("the run's stored result does not decode: {e}"),
                            })?,
                        RecordState::InProgress { .. } => Value::Null,
                    };
                    break (RunStatus::Finished(result), None);
                }
                ClaimOutcome::Abandoned { token, .. } => {
                    tracing::info!(run = name, key = %key, "tool-contracts: resuming an abandoned run");
                    resumed = true;
                    outcome = store.takeover(req, token).await.map_err(fail)?;
                }
            }
        };
        let shared = Arc::new(Shared {
            name: name.to_owned(),
            key: Arc::from(key.as_str()),
            scope,
            store,
            options,
            token,
            cursor: Mutex::new(Cursor::default()),
        });
        let heartbeat = token.map(|token| {
            let shared = Arc::clone(&shared);
            tokio::spawn(async move {
                let period = (shared.options.lease / 3).max(Duration::from_millis(1));
                loop {
                    tokio::time::sleep(period).await;
                    match shared.store.renew(&shared.key, token, shared.options.lease).await {
                        Ok(()) => {}
                        Err(StoreError::LeaseLost { .. }) => {
                            tracing::error!(run = %shared.name, key = %shared.key, "tool-contracts: the run was taken over by another worker");
                            return;
                        }
                        Err(e) => tracing::warn!(run = %shared.name, key = %shared.key, error = %e, "tool-contracts: run lease renewal failed; retrying"),
                    }
                }
            })
        });
        Ok(Run {
            shared,
            status,
            heartbeat,
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
        self.shared.token.is_some()
    }

    fn not_owned(&self) -> Error {
        Error::RunNotOwned {
            run: self.shared.name.clone(),
            key: self.shared.key.to_string(),
            status: match self.status {
                RunStatus::Finished(_) => "finished".to_owned(),
                _ => "running elsewhere".to_owned(),
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
        let Some(_) = self.shared.token else {
            return Err(E::from(self.not_owned()));
        };
        let ordinal = {
            let mut cursor = self.shared.cursor.lock().unwrap_or_else(|p| p.into_inner());
            let ordinal = cursor.ordinals.entry(name.to_owned()).or_insert(0);
            let current = *ordinal;
            *ordinal += 1;
            current
        };
        let step_key = self.shared.step_key(name, ordinal).map_err(E::from)?;
        self.shared
            .journal("step", name, &step_key)
            .await
            .map_err(E::from)?;
        let label = format!("{}/{name}", self.shared.name);
        let store = &self.shared.store;
        let req = ClaimRequest {
            key: &step_key,
            tool: &label,
            scope: self.shared.scope.as_deref(),
            fingerprint: "",
            args: "{}",
            lease: self.shared.options.lease,
            ttl: self.shared.options.ttl,
            worker: ambient::worker_id(),
        };
        let fail = |e| E::from(store_error(&label, &step_key, e));
        let mut outcome = store.claim(req).await.map_err(fail)?;
        let token = loop {
            match outcome {
                ClaimOutcome::Acquired { token } => break token,
                ClaimOutcome::Completed(rec) => {
                    let RecordState::Completed { result, .. } = &rec.state else {
                        return Err(fail(StoreError::Corrupt(
                            "completed step without result".into(),
                        )));
                    };
                    tracing::debug!(run = %self.shared.name, step = name, key = %step_key, decision = "replayed", "tool-contracts: step replayed from the journal");
                    return serde_json::from_str(result).map_err(|e| {
                        E::from(Error::Codec {
                            tool: label.clone(),
                            key: step_key.clone(),
                            message: format!("the step's recorded result no longer decodes ({e}); bump the run's version"),
                        })
                    });
                }
                ClaimOutcome::InProgress {
                    lease_remaining, ..
                } => {
                    store
                        .wait(&step_key, lease_remaining + Duration::from_millis(5))
                        .await;
                    outcome = store.claim(req).await.map_err(fail)?;
                }
                ClaimOutcome::Abandoned { token, .. } => match options.on_unknown {
                    OnUnknown::Fail => {
                        return Err(E::from(Error::OutcomeUnknown {
                            tool: label.clone(),
                            key: step_key.clone(),
                        }))
                    }
                    OnUnknown::Rerun => {
                        outcome = store.takeover(req, token).await.map_err(fail)?;
                    }
                },
            }
        };
        let context = RunContext {
            shared: Arc::clone(&self.shared),
            in_step: true,
        };
        let body = CURRENT.scope(context, self.shared.scoped(f()));
        let result = engine::heartbeat(
            store,
            &label,
            &step_key,
            self.shared.options.lease,
            token,
            body,
        )
        .await;
        let outcome = match &result {
            Ok(value) => match serde_json::to_string(value) {
                Ok(json) => {
                    let completion = Completion {
                        result: &json,
                        is_error: false,
                        ttl: self.shared.options.ttl,
                    };
                    store.complete(&step_key, token, completion).await
                }
                Err(e) => {
                    let _ = store.abandon(&step_key, token).await;
                    return Err(E::from(Error::Codec {
                        tool: label,
                        key: step_key,
                        message: format!("the step's result cannot be stored as JSON: {e}"),
                    }));
                }
            },
            Err(_) => store.release(&step_key, token).await,
        };
        if let Err(e) = outcome {
            tracing::error!(run = %self.shared.name, step = name, key = %step_key, error = %e, "tool-contracts: could not record the step's outcome");
        }
        result
    }

    /// Runs `future` inside the run: `#[mutating_tool]` calls in it are scoped by the run
    /// and recorded in its journal.
    pub async fn enter<F: Future>(&self, future: F) -> F::Output {
        let context = RunContext {
            shared: Arc::clone(&self.shared),
            in_step: false,
        };
        CURRENT.scope(context, self.shared.scoped(future)).await
    }

    /// Stores the run's result; later starts of the same intent get it back as
    /// [`RunStatus::Finished`].
    pub async fn finish<T: Serialize>(mut self, result: &T) -> Result<(), Error> {
        let Some(token) = self.shared.token else {
            return Err(self.not_owned());
        };
        if let Some(h) = self.heartbeat.take() {
            h.abort();
        }
        let json = serde_json::to_string(result).map_err(|e| Error::Codec {
            tool: self.shared.name.clone(),
            key: self.shared.key.to_string(),
            message: format!("the run's result cannot be stored as JSON: {e}"),
        })?;
        let completion = Completion {
            result: &json,
            is_error: false,
            ttl: self.shared.options.ttl,
        };
        self.shared
            .store
            .complete(&self.shared.key, token, completion)
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
                    RecordState::Completed { result, .. } => {
                        return serde_json::from_str(&result).map_err(|e| Error::Codec {
                            tool: self.shared.name.clone(),
                            key: key.to_owned(),
                            message: format!("the run's stored result does not decode: {e}"),
                        })
                    }
                    RecordState::InProgress {
                        lease_expires_at, ..
                    } => {
                        let remaining = lease_expires_at
                            .duration_since(SystemTime::now())
                            .unwrap_or(Duration::ZERO);
                        if remaining.is_zero() && self.shared.token.is_none() {
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
        let intent = serde_json::to_value(intent).map_err(|e| Error::InvalidArguments {
            tool: name.to_owned(),
            field: None,
            message: format!("the intent cannot be encoded as JSON: {e}"),
        })?;
        // An invalid scope is refused, as by `start`: dropped, it would read the run of
        // the same intent outside any scope (another tenant's, or nobody's).
        let scope = ambient::caller_scope(name)?;
        let key = run_key(name, &intent, scope.as_deref(), options.version)?;
        let store = ambient::current_store();
        let Some(rec) = store
            .lookup(&key)
            .await
            .map_err(|e| store_error(name, &key, e))?
        else {
            return Ok(None);
        };
        let (status, result) = match rec.state {
            RecordState::Completed { result, .. } => {
                ("finished", serde_json::from_str(&result).ok())
            }
            RecordState::InProgress {
                lease_expires_at, ..
            } if lease_expires_at <= SystemTime::now() => ("abandoned", None),
            RecordState::InProgress { .. } => ("running", None),
        };
        Ok(Some(RunInfo {
            key,
            status,
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
    async fn journal(&self, kind: &str, name: &str, key: &str) -> Result<(), Error> {
        let position = {
            let mut cursor = self.cursor.lock().unwrap_or_else(|p| p.into_inner());
            let p = cursor.position;
            cursor.position += 1;
            p
        };
        let pos_key = self.position_key(position)?;
        let requested = format!("{kind}:{name}");
        let entry = PositionEntry {
            kind: kind.to_owned(),
            name: name.to_owned(),
            key: key.to_owned(),
        };
        let entry = serde_json::to_string(&entry).map_err(|e| Error::Codec {
            tool: self.name.clone(),
            key: self.key.to_string(),
            message: e.to_string(),
        })?;
        let req = ClaimRequest {
            key: &pos_key,
            tool: &self.name,
            scope: self.scope.as_deref(),
            fingerprint: &requested,
            args: &entry,
            // A position record is completed right after its claim: a short lease lets a
            // resume take over one whose worker died in between.
            lease: Duration::from_millis(500),
            ttl: self.options.ttl,
            worker: ambient::worker_id(),
        };
        let fail = |e| store_error(&self.name, &pos_key, e);
        let mut outcome = self.store.claim(req).await.map_err(fail)?;
        loop {
            match outcome {
                ClaimOutcome::Acquired { token } => {
                    let completion = Completion {
                        result: &entry,
                        is_error: false,
                        ttl: self.options.ttl,
                    };
                    return self
                        .store
                        .complete(&pos_key, token, completion)
                        .await
                        .map_err(fail);
                }
                ClaimOutcome::Completed(rec) if rec.fingerprint != requested => {
                    return Err(Error::NonDeterministic {
                        run: self.name.clone(),
                        key: self.key.to_string(),
                        position,
                        recorded: rec.fingerprint.clone(),
                        requested,
                    })
                }
                ClaimOutcome::Completed(_) => return Ok(()),
                ClaimOutcome::InProgress {
                    lease_remaining, ..
                } => {
                    self.store
                        .wait(&pos_key, lease_remaining + Duration::from_millis(5))
                        .await;
                    outcome = self.store.claim(req).await.map_err(fail)?;
                }
                ClaimOutcome::Abandoned { token, fingerprint } => {
                    if fingerprint != requested {
                        return Err(Error::NonDeterministic {
                            run: self.name.clone(),
                            key: self.key.to_string(),
                            position,
                            recorded: fingerprint,
                            requested,
                        });
                    }
                    outcome = self.store.takeover(req, token).await.map_err(fail)?;
                }
            }
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
                None => "missing",
                Some(r) => match r.state {
                    RecordState::Completed { .. } => "completed",
                    RecordState::InProgress {
                        lease_expires_at, ..
                    } if lease_expires_at <= SystemTime::now() => "abandoned",
                    RecordState::InProgress { .. } => "in_progress",
                },
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

/// Called by the engine before a tool call claims its key: inside a run (outside any
/// step) the call takes the next journal position.
pub(crate) async fn journal_tool_call(tool: &str, key: &str) -> Result<(), Error> {
    let Ok(context) = CURRENT.try_with(RunContext::clone) else {
        return Ok(());
    };
    if context.in_step {
        return Ok(());
    }
    context.shared.journal("tool", tool, key).await
}
