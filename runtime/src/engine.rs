//! The dedup engine: claim, run once, store, replay.

use core::future::Future;
use core::time::Duration;
use std::cell::Cell;
use std::sync::{Arc, Mutex};

use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::ambient;
use crate::error::Error;
use crate::key::{self, KeyBuilder, KeyFieldError};
use crate::spec::{Concurrent, Mismatch, OnUnknown, ToolSpec};
use crate::store::{ClaimOutcome, ClaimRequest, Completion, Store, StoreError};

/// One call, ready to run: its key and what identifies its arguments.
#[doc(hidden)]
#[derive(Debug)]
pub struct Call {
    spec: &'static ToolSpec,
    key: Arc<str>,
    scope: Option<Arc<str>>,
    /// `name=digest;…` over every JSON argument, in declaration order.
    fingerprint: String,
    /// The JSON arguments, kept in the store for reconciliation.
    args: String,
}

/// Builds a [`Call`] from the tool's arguments, by reference, before the body moves them.
#[doc(hidden)]
pub struct CallBuilder {
    spec: &'static ToolSpec,
    key: KeyBuilder,
    error: Option<Error>,
    fingerprint: String,
    args: Vec<u8>,
    scratch: Vec<u8>,
}

impl CallBuilder {
    /// Starts a call of `spec` in the current scope.
    pub fn new(spec: &'static ToolSpec) -> Self {
        let mut args = Vec::with_capacity(64);
        args.push(b'{');
        Self {
            spec,
            key: KeyBuilder::new(key::TOOL_KEY_CONTRACT),
            error: None,
            fingerprint: String::new(),
            args,
            scratch: Vec::new(),
        }
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

    /// Adds a JSON argument: part of the fingerprint and of the stored arguments.
    pub fn arg<T: ?Sized + Serialize>(&mut self, name: &'static str, value: &T) {
        if self.error.is_some() {
            return;
        }
        self.scratch.clear();
        if let Err(e) = key::write_canonical(value, &mut self.scratch) {
            self.error = Some(Error::InvalidArguments {
                tool: self.spec.name.to_owned(),
                field: Some(name.to_owned()),
                message: format!("the value cannot be written as JSON: {e}"),
            });
            return;
        }
        let digest = Sha256::digest(&self.scratch);
        if !self.fingerprint.is_empty() {
            self.fingerprint.push(';');
        }
        self.fingerprint.push_str(name);
        self.fingerprint.push('=');
        push_hex(&mut self.fingerprint, &digest[..12]);
        if self.args.len() > 1 {
            self.args.push(b',');
        }
        // Parameter names are Rust identifiers: no escaping needed.
        self.args.push(b'"');
        self.args.extend_from_slice(name.as_bytes());
        self.args.extend_from_slice(b"\":");
        self.args.extend_from_slice(&self.scratch);
    }

    fn scope(&self) -> Result<Option<Arc<str>>, Error> {
        match ambient::current_scope() {
            None => Ok(None),
            Some(Ok(scope)) => Ok(Some(scope)),
            Some(Err(message)) => Err(Error::InvalidArguments {
                tool: self.spec.name.to_owned(),
                field: None,
                message,
            }),
        }
    }

    /// The key alone (what [`ToolDescriptor::key`](crate::ToolDescriptor::key) reports).
    pub fn key(self) -> Result<String, Error> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let scope = self.scope()?;
        Ok(self
            .key
            .finish(scope.as_deref(), self.spec.name, self.spec.version))
    }

    /// The finished call.
    pub fn finish(mut self) -> Result<Call, Error> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        let scope = self.scope()?;
        let spec = self.spec;
        self.args.push(b'}');
        // The canonical writer emits valid UTF-8 (it writes `str`s and ASCII only).
        let args = String::from_utf8(self.args).map_err(|e| Error::Codec {
            tool: spec.name.to_owned(),
            key: String::new(),
            message: format!("arguments are not valid UTF-8: {e}"),
        })?;
        let key = self.key.finish(scope.as_deref(), spec.name, spec.version);
        Ok(Call {
            spec,
            key: Arc::from(key),
            scope,
            fingerprint: self.fingerprint,
            args,
        })
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

fn push_hex(out: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(HEX[(b >> 4) as usize] as char);
        out.push(HEX[(b & 15) as usize] as char);
    }
}

impl Call {
    fn request(&self) -> ClaimRequest<'_> {
        ClaimRequest {
            key: &self.key,
            tool: self.spec.name,
            scope: self.scope.as_deref(),
            fingerprint: &self.fingerprint,
            args: &self.args,
            lease: self.spec.lease,
            ttl: self.spec.ttl,
            worker: ambient::worker_id(),
        }
    }

    fn store_error(&self, e: StoreError) -> Error {
        Error::Store {
            tool: self.spec.name.to_owned(),
            key: self.key.to_string(),
            message: e.to_string(),
        }
    }

    /// Compares the fingerprint of the call that holds the key with ours.
    fn check_fingerprint(&self, theirs: &str) -> Result<(), Error> {
        if theirs == self.fingerprint || self.spec.payload_mismatch == Mismatch::Replay {
            return Ok(());
        }
        let params = differing_params(&self.fingerprint, theirs);
        tracing::info!(tool = self.spec.name, key = %self.key, decision = "rejected", reason = "key_reused", "tool-contracts: key reused with other arguments");
        Err(Error::KeyReused {
            tool: self.spec.name.to_owned(),
            key: self.key.to_string(),
            params,
            key_fields: self
                .spec
                .key_fields
                .iter()
                .map(|f| (*f).to_owned())
                .collect(),
        })
    }
}

fn differing_params(ours: &str, theirs: &str) -> Vec<String> {
    let parse = |s: &str| -> Vec<(String, String)> {
        s.split(';')
            .filter(|p| !p.is_empty())
            .map(|p| match p.split_once('=') {
                Some((n, d)) => (n.to_owned(), d.to_owned()),
                None => (p.to_owned(), String::new()),
            })
            .collect()
    };
    let (ours, theirs) = (parse(ours), parse(theirs));
    let mut names: Vec<String> = Vec::new();
    for (name, digest) in &ours {
        if theirs.iter().find(|(n, _)| n == name).map(|(_, d)| d) != Some(digest) {
            names.push(name.clone());
        }
    }
    for (name, _) in &theirs {
        if !ours.iter().any(|(n, _)| n == name) {
            names.push(name.clone());
        }
    }
    if names.is_empty() {
        // Same parameters, different encoding: say so rather than name nothing.
        names.push("(the argument encoding)".to_owned());
    }
    names
}

/// What a registry call learns about the engine's decision.
#[derive(Debug, Default)]
pub(crate) struct CallReport {
    pub(crate) key: Option<String>,
    pub(crate) replayed: bool,
    pub(crate) error: Option<Error>,
}

pub(crate) type ReportSlot = Arc<Mutex<CallReport>>;

tokio::task_local! {
    /// Set by `Registry::call`; taken by the first engine run inside, so a tool that calls
    /// another tool does not overwrite the outer call's report.
    static REPORT: Cell<Option<ReportSlot>>;
}

pub(crate) async fn with_report<F: Future>(slot: ReportSlot, future: F) -> F::Output {
    REPORT.scope(Cell::new(Some(slot)), future).await
}

pub(crate) fn take_report() -> Option<ReportSlot> {
    REPORT.try_with(Cell::take).ok().flatten()
}

fn report(slot: &Option<ReportSlot>, f: impl FnOnce(&mut CallReport)) {
    if let Some(slot) = slot {
        let mut guard = slot.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard);
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
        }
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
/// A plain `fn` with no bounds on `T` and `E` (everything it needs from them is in
/// `ops`): an `async fn` with `T: Serialize` in its where-clause would report every
/// missing bound a second time, at the generated call.
#[doc(hidden)]
pub fn execute<T, E, F>(
    call: Result<Call, Error>,
    ops: Ops<T, E>,
    body: F,
) -> impl Future<Output = Result<T, E>>
where
    F: Future<Output = Result<T, E>>,
{
    run(call, ops, async { Attempt::Ran(body.await) }, None, false)
}

/// The general entry point: `attempt` may verify first (`verify = …`, then `has_verify`
/// is true), `unknown_if` classifies errors that leave the outcome unknown
/// (`unknown_outcome_if = …`). No bounds on `T` and `E`, as for [`execute`].
#[doc(hidden)]
pub fn execute_with<T, E, F>(
    call: Result<Call, Error>,
    ops: Ops<T, E>,
    attempt: F,
    unknown_if: Option<fn(&E) -> bool>,
    has_verify: bool,
) -> impl Future<Output = Result<T, E>>
where
    F: Future<Output = Attempt<T, E>>,
{
    run(call, ops, attempt, unknown_if, has_verify)
}

async fn run<T, E, F>(
    call: Result<Call, Error>,
    ops: Ops<T, E>,
    attempt: F,
    unknown_if: Option<fn(&E) -> bool>,
    has_verify: bool,
) -> Result<T, E>
where
    F: Future<Output = Attempt<T, E>>,
{
    let slot = take_report();
    let fail = |e: Error| -> E {
        report(&slot, |r| r.error = Some(e.clone()));
        (ops.contract_error)(e)
    };
    let call = match call {
        Ok(call) => call,
        Err(e) => return Err(fail(e)),
    };
    report(&slot, |r| r.key = Some(call.key.to_string()));
    if let Err(e) = crate::run::journal_tool_call(call.spec.name, &call.key).await {
        return Err(fail(e));
    }
    let spec = call.spec;
    let store = ambient::current_store();
    let mut outcome = store.claim(call.request()).await;
    let mut reconcile = false;
    let token = loop {
        match outcome {
            Err(e) => {
                tracing::warn!(tool = spec.name, key = %call.key, decision = "rejected", reason = "store", error = %e, "tool-contracts: store failed; nothing ran");
                return Err(fail(call.store_error(e)));
            }
            Ok(ClaimOutcome::Acquired { token }) => break token,
            Ok(ClaimOutcome::Completed(record)) => {
                if let Err(e) = call.check_fingerprint(&record.fingerprint) {
                    return Err(fail(e));
                }
                let crate::store::RecordState::Completed {
                    result, is_error, ..
                } = record.state
                else {
                    return Err(fail(call.store_error(StoreError::Corrupt(
                        "a completed claim without a result".to_owned(),
                    ))));
                };
                tracing::debug!(tool = spec.name, key = %call.key, decision = "replayed", "tool-contracts: replayed stored result");
                report(&slot, |r| r.replayed = true);
                return replay(&call, &ops, &result, is_error).map_err(|e| match e {
                    Replayed::Contract(e) => fail(e),
                    Replayed::Tool(e) => e,
                });
            }
            Ok(ClaimOutcome::InProgress {
                fingerprint,
                lease_remaining,
            }) => {
                if let Err(e) = call.check_fingerprint(&fingerprint) {
                    return Err(fail(e));
                }
                if spec.concurrent == Concurrent::Reject {
                    tracing::info!(tool = spec.name, key = %call.key, decision = "rejected", reason = "in_progress", "tool-contracts: duplicate while in progress");
                    return Err(fail(Error::InProgress {
                        tool: spec.name.to_owned(),
                        key: call.key.to_string(),
                        lease_remaining_ms: u64::try_from(lease_remaining.as_millis())
                            .unwrap_or(u64::MAX),
                    }));
                }
                tracing::debug!(tool = spec.name, key = %call.key, decision = "waited", "tool-contracts: waiting for the running call");
                // Past the lease the holder counts as dead: wake then to see it abandoned.
                store
                    .wait(&call.key, lease_remaining + Duration::from_millis(5))
                    .await;
                outcome = store.claim(call.request()).await;
            }
            Ok(ClaimOutcome::Abandoned { token, fingerprint }) => {
                if let Err(e) = call.check_fingerprint(&fingerprint) {
                    return Err(fail(e));
                }
                if has_verify {
                    tracing::info!(tool = spec.name, key = %call.key, decision = "reconciling", "tool-contracts: an earlier call was abandoned; taking it over to verify its effect");
                    reconcile = true;
                    outcome = store.takeover(call.request(), token).await;
                    continue;
                }
                match spec.on_unknown {
                    OnUnknown::Fail => {
                        tracing::warn!(tool = spec.name, key = %call.key, decision = "rejected", reason = "outcome_unknown", "tool-contracts: an earlier call was abandoned mid-run");
                        return Err(fail(Error::OutcomeUnknown {
                            tool: spec.name.to_owned(),
                            key: call.key.to_string(),
                        }));
                    }
                    OnUnknown::Rerun => {
                        tracing::warn!(tool = spec.name, key = %call.key, decision = "taken_over", "tool-contracts: rerunning an abandoned call (on_unknown = \"rerun\")");
                        outcome = store.takeover(call.request(), token).await;
                    }
                }
            }
        }
    };

    tracing::debug!(tool = spec.name, key = %call.key, decision = "executed", "tool-contracts: running tool body");
    let attempt = RECONCILING.scope(
        reconcile,
        ambient::with_current_key(Arc::clone(&call.key), attempt),
    );
    let result = match with_heartbeat(&*store, &call, token, attempt).await {
        Attempt::Ran(result) => result,
        Attempt::Verified(value) => {
            tracing::info!(tool = spec.name, key = %call.key, decision = "reconciled", "tool-contracts: verify found the effect of the abandoned call");
            Ok(value)
        }
        Attempt::VerifyFailed(e) => {
            tracing::warn!(tool = spec.name, key = %call.key, decision = "rejected", reason = "verify_failed", "tool-contracts: verify failed; the outcome stays unknown");
            abandon(&*store, &call, token).await;
            return Err(e);
        }
    };
    match &result {
        Ok(value) => match ops.output.encode(value) {
            Ok(json) => finish_claim(&*store, &call, token, Some((&json, false))).await,
            Err(e) => {
                // The effect happened but its result cannot be stored: keep the claim so it
                // expires into an unknown outcome rather than letting a retry run again.
                abandon(&*store, &call, token).await;
                let e = Error::Codec {
                    tool: spec.name.to_owned(),
                    key: call.key.to_string(),
                    message: format!("the result cannot be stored as JSON ({e}); the key is left as an unknown outcome"),
                };
                return Err(fail(e));
            }
        },
        Err(e) if unknown_if.is_some_and(|unknown| unknown(e)) => {
            tracing::warn!(tool = spec.name, key = %call.key, decision = "abandoned", "tool-contracts: the tool's error leaves the outcome unknown; keeping the key for reconciliation");
            abandon(&*store, &call, token).await;
        }
        Err(e) => match ops.stored_errors.map(|codec| codec.encode(e)) {
            Some(Ok(json)) => finish_claim(&*store, &call, token, Some((&json, true))).await,
            Some(Err(err)) => {
                tracing::error!(tool = spec.name, key = %call.key, error = %err, "tool-contracts: cannot store the tool's error; releasing the claim");
                finish_claim(&*store, &call, token, None).await
            }
            None => finish_claim(&*store, &call, token, None).await,
        },
    }
    result
}

async fn abandon(store: &dyn Store, call: &Call, token: u64) {
    if let Err(e) = store.abandon(&call.key, token).await {
        tracing::error!(tool = call.spec.name, key = %call.key, error = %e, "tool-contracts: could not mark the key abandoned; it becomes so when its lease runs out");
    }
}

enum Replayed<E> {
    Contract(Error),
    Tool(E),
}

fn replay<T, E>(
    call: &Call,
    ops: &Ops<T, E>,
    json: &str,
    is_error: bool,
) -> Result<T, Replayed<E>> {
    let codec = |what: &str, e: serde_json::Error| {
        Replayed::Contract(Error::Codec {
            tool: call.spec.name.to_owned(),
            key: call.key.to_string(),
            message: format!(
                "the stored {what} no longer decodes ({e}); the tool's types changed since it was stored: bump the tool's `version` so old results are never replayed"
            ),
        })
    };
    if !is_error {
        return ops.output.decode(json).map_err(|e| codec("result", e));
    }
    match ops.stored_errors.map(|errors| errors.decode(json)) {
        Some(Ok(e)) => Err(Replayed::Tool(e)),
        Some(Err(e)) => Err(codec("error", e)),
        None => Err(Replayed::Contract(Error::Codec {
            tool: call.spec.name.to_owned(),
            key: call.key.to_string(),
            message: "a stored error was found but the tool no longer sets `cache_errors = true`; bump the tool's `version`".to_owned(),
        })),
    }
}

/// Completes (`Some`) or releases (`None`) the claim. A failure here cannot undo the
/// effect, so it is logged and the caller still gets the body's result.
async fn finish_claim(store: &dyn Store, call: &Call, token: u64, result: Option<(&str, bool)>) {
    let outcome = match result {
        Some((json, is_error)) => {
            store
                .complete(
                    &call.key,
                    token,
                    Completion {
                        result: json,
                        is_error,
                        ttl: call.spec.ttl,
                    },
                )
                .await
        }
        None => store.release(&call.key, token).await,
    };
    if let Err(e) = outcome {
        tracing::error!(tool = call.spec.name, key = %call.key, error = %e, stored = result.is_some(), "tool-contracts: could not record the call's outcome; a retry will see an unknown outcome");
    }
}

/// Polls `body` while renewing the lease every third of it, so a long body is not taken
/// for dead. The renewals run beside the body, never blocking it.
async fn with_heartbeat<F: Future>(
    store: &dyn Store,
    call: &Call,
    token: u64,
    body: F,
) -> F::Output {
    heartbeat(
        store,
        call.spec.name,
        &call.key,
        call.spec.lease,
        token,
        body,
    )
    .await
}

/// [`with_heartbeat`] for callers without a [`Call`] (recovery).
pub(crate) async fn heartbeat<F: Future>(
    store: &dyn Store,
    tool: &str,
    key: &str,
    lease: Duration,
    token: u64,
    body: F,
) -> F::Output {
    let period = (lease / 3).max(Duration::from_millis(1));
    let heartbeat = async {
        loop {
            tokio::time::sleep(period).await;
            match store.renew(key, token, lease).await {
                Ok(()) => {}
                Err(StoreError::LeaseLost { .. }) => {
                    tracing::error!(tool, key, "tool-contracts: lease lost while the body runs (another worker took the key over); this worker's result will not be stored");
                    break;
                }
                Err(e) => {
                    tracing::warn!(tool, key, error = %e, "tool-contracts: lease renewal failed; retrying at the next heartbeat");
                }
            }
        }
        core::future::pending::<core::convert::Infallible>().await
    };
    tokio::select! {
        biased;
        out = body => out,
        never = heartbeat => match never {},
    }
}
