//! The operation view of a key: what every surface (Rust, the CLI, MCP, HTTP) shows of a
//! call, built here and nowhere else, so that no two surfaces disagree about a key.
//!
//! A call's key is its operation id (the redirect of Post/Redirect/Get); reading it here is
//! the GET: [`Store::observe`] and [`Store::history`], nothing else. A read never claims,
//! renews, takes over or runs anything, and answers only in the reader's scope
//! (`ambient::may_read`, docs/security.md "Reading operations").

use core::time::Duration;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::de::DeserializeOwned;
use serde::ser::{SerializeSeq, SerializeStruct};
use serde::{Serialize, Serializer};
use serde_json::Value;

use crate::ambient;
use crate::error::Error;
use crate::registry::ToolDescriptor;
use crate::store::{HistoryEvent, Observed, RecordState, Store};

/// Where a call stands, as every surface names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OperationState {
    /// A worker holds the key under a live lease: the call is running.
    InProgress,
    /// The call finished and its result is stored: every retry replays
    /// [`Operation::result`].
    Completed,
    /// The call finished with an error that its tool stores and replays
    /// (`cache_errors = true`): [`Operation::error`].
    Failed,
    /// The lease ran out mid-call (its worker died, or gave the call up without knowing
    /// whether the effect happened): the effect may or may not have happened. Never a
    /// success: a retry gets `OutcomeUnknown` (or a reconciliation, with `verify`) until
    /// someone finds out, and an operator can resolve it.
    Unknown,
    /// A run whose compensation has begun and whose worker is alive: its completed steps
    /// are being undone ([`Run::compensate`](crate::Run::compensate)).
    Compensating,
    /// A run that was compensated: every completed step was undone. `error` holds the
    /// compensation (`{"compensation": {"state", "reason", "steps"}}`).
    Compensated,
    /// A run compensated as far as it could be: some completed step has no undo, or its
    /// undo failed or has an unknown outcome. `error` holds the compensation, whose
    /// `steps` say which; an operator must finish the job.
    NeedsIntervention,
    /// The call needs a person's approval and asked for it: nothing ran yet
    /// ([`Operation::approval`] says until when; docs/approval.md).
    AwaitingApproval,
    /// Approved and not run yet: the call's next attempt runs it (once).
    Approved,
    /// Denied: nothing ran, and the intent's attempts get the denial until it expires.
    Denied,
}

crate::lowercase_names! {
    OperationState {
        InProgress => "in_progress",
        Completed => "completed",
        Failed => "failed",
        Unknown => "unknown",
        Compensating => "compensating",
        Compensated => "compensated",
        NeedsIntervention => "needs_intervention",
        AwaitingApproval => "awaiting_approval",
        Approved => "approved",
        Denied => "denied",
    }
}

/// Serialized as [`as_str`](OperationState::as_str): one table of names.
impl Serialize for OperationState {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// One call as its key's reader sees it: the operation document every surface shows.
///
/// Read with [`operation`](crate::operation) (by key) or
/// [`ToolDescriptor::operation`] (by the call's arguments). It never holds the call's
/// arguments (which may hold [`Secret`](crate::Secret) digests) nor its scope (which may
/// hold a client's intent key). Serialized (`serde_json::to_value`) it is the JSON
/// document of every surface:
///
/// ```json
/// {
///   "key": "3b1f…",
///   "tool": "create_order",
///   "version": 1,
///   "state": "completed",
///   "result": {"order_no": 7},
///   "created_at": "2026-11-30T17:35:18.123Z",
///   "updated_at": "2026-11-30T17:35:18.164Z",
///   "expires_at": "2026-12-01T17:35:18.164Z"
/// }
/// ```
///
/// - `result` only when `completed` (present even when the result is `null`), `error` only
///   when `failed`: each exactly the JSON a replay returns;
/// - `lease_remaining_ms` only when `in_progress`: how long the holder's lease still runs,
///   by the store's clock;
/// - `version` is `null` for a record written before stores kept it;
/// - times are RFC 3339 in UTC, to the millisecond;
/// - `history` only when asked for ([`operation_with_history`](crate::operation_with_history)):
///   `[{"at": …, "kind": "claimed", "token": 3, "worker": "host-42-1a2b3c4d"}, …]`,
///   oldest first.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Operation {
    /// The idempotency key: the operation's id.
    pub key: String,
    /// The tool (or run, or `run/step`) that made the call.
    pub tool: String,
    /// The version of the tool's contract; `None` for a record an older build wrote.
    pub version: Option<u32>,
    /// Where the call stands.
    pub state: OperationState,
    /// The stored result, exactly what a replay returns, when [`Completed`](OperationState::Completed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// The stored error, exactly what a replay returns, when [`Failed`](OperationState::Failed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
    /// When the key was first claimed.
    #[serde(serialize_with = "rfc3339")]
    pub created_at: SystemTime,
    /// When the call last changed state (claimed, taken over, abandoned, completed).
    #[serde(serialize_with = "rfc3339")]
    pub updated_at: SystemTime,
    /// When the store forgets the key (a later call then runs again).
    #[serde(serialize_with = "rfc3339")]
    pub expires_at: SystemTime,
    /// How long the holder's lease still runs, by the store's clock, when
    /// [`InProgress`](OperationState::InProgress).
    #[serde(
        rename = "lease_remaining_ms",
        skip_serializing_if = "Option::is_none",
        serialize_with = "millis"
    )]
    pub lease_remaining: Option<Duration>,
    /// The call's approval, for a tool that asked for one: requested, pending, decided
    /// (who, when, through which channel, why), expired.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval: Option<crate::approval::Approval>,
    /// The key's history, oldest first, when asked for (with its approval's: requested,
    /// approved, denied).
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "history")]
    pub history: Option<Vec<HistoryEvent>>,
}

impl Operation {
    /// The operation a reader sees in `observed`, with `history` if it was read: `None`
    /// for a result past its expiry, which a call treats as absent (it runs again).
    fn from_observed(
        observed: Observed,
        history: Option<Vec<HistoryEvent>>,
    ) -> Result<Option<Operation>, Error> {
        let Observed { record, now, .. } = observed;
        let json = |what: &str, text: &str| {
            serde_json::from_str::<Value>(text).map_err(|e| Error::Codec {
                tool: record.tool.clone(),
                key: Some(record.key.clone()),
                message: format!(
                    "the stored {what} is not JSON ({e}); the store holds a value the engine did not write"
                ),
            })
        };
        let (state, result, error, lease_remaining) = match &record.state {
            RecordState::InProgress {
                lease_expires_at, ..
            } => match lease_expires_at.duration_since(now) {
                // The store's own rule: live while the lease ends after its `now`.
                Ok(remaining) if !remaining.is_zero() => {
                    (OperationState::InProgress, None, None, Some(remaining))
                }
                _ => (OperationState::Unknown, None, None, None),
            },
            RecordState::Completed { .. } if record.expires_at <= now => return Ok(None),
            RecordState::Completed {
                result,
                is_error: false,
                ..
            } => (
                OperationState::Completed,
                Some(json("result", result)?),
                None,
                None,
            ),
            RecordState::Completed {
                result,
                is_error: true,
                ..
            } => (
                OperationState::Failed,
                None,
                Some(json("error", result)?),
                None,
            ),
        };
        Ok(Some(Operation {
            state,
            result,
            error,
            lease_remaining,
            version: record.version,
            created_at: record.created_at,
            updated_at: record.updated_at,
            expires_at: record.expires_at,
            approval: None,
            history,
            key: record.key,
            tool: record.tool,
        }))
    }

    /// The operation of a call that has not claimed its key, from its approval record:
    /// awaiting approval, approved (not run yet) or denied. `None` for an expired request
    /// or decision: the next call asks again, as for a key never used.
    fn from_approval(
        key: &str,
        observed: &Observed,
        history: Option<Vec<HistoryEvent>>,
    ) -> Result<Option<Operation>, Error> {
        let approval =
            crate::approval::from_observed(observed).map_err(|message| Error::Codec {
                tool: observed.record.tool.clone(),
                key: Some(key.to_owned()),
                message,
            })?;
        let Some(approval) = approval else {
            return Ok(None);
        };
        let state = match approval.state {
            crate::approval::ApprovalState::Pending => OperationState::AwaitingApproval,
            crate::approval::ApprovalState::Approved => OperationState::Approved,
            crate::approval::ApprovalState::Denied => OperationState::Denied,
            _ => return Ok(None),
        };
        let record = &observed.record;
        Ok(Some(Operation {
            key: key.to_owned(),
            tool: crate::approval::tool_of(&record.tool).to_owned(),
            version: record.version,
            state,
            result: None,
            error: None,
            created_at: record.created_at,
            updated_at: record.updated_at,
            expires_at: approval.expires_at,
            lease_remaining: None,
            approval: Some(approval),
            history,
        }))
    }

    /// [`result`](Self::result) as the tool's output type `T`: `Ok(None)` unless
    /// [`Completed`](OperationState::Completed); [`Error::Codec`] if it does not decode as
    /// `T` (another tool's key, or a type changed without a new `version`).
    pub fn result_as<T: DeserializeOwned>(&self) -> Result<Option<T>, Error> {
        self.decode("result", self.result.as_ref())
    }

    /// [`error`](Self::error) as the tool's error type `E`: `Ok(None)` unless
    /// [`Failed`](OperationState::Failed); [`Error::Codec`] if it does not decode as `E`.
    pub fn error_as<E: DeserializeOwned>(&self) -> Result<Option<E>, Error> {
        self.decode("error", self.error.as_ref())
    }

    fn decode<T: DeserializeOwned>(
        &self,
        what: &str,
        value: Option<&Value>,
    ) -> Result<Option<T>, Error> {
        value
            .map(|value| {
                T::deserialize(value).map_err(|e| Error::Codec {
                    tool: self.tool.clone(),
                    key: Some(self.key.clone()),
                    message: format!(
                        "the stored {what} does not decode as {} ({e})",
                        core::any::type_name::<T>()
                    ),
                })
            })
            .transpose()
    }
}

/// Reads the operation of `key` from the current store (the task's, else the process's
/// default), in the current scope: `Ok(None)` if there is none *for this reader*.
///
/// A key made in another scope answers `Ok(None)`, exactly like a key that was never
/// used, released, or expired: a key is an id, not a capability (docs/security.md,
/// "Reading operations"). A client's call made under its own intent key (MCP
/// `idempotencyKey`) is read in the scope the server runs in, without that key.
///
/// Reads only ([`Store::observe`]): never claims, renews, takes over or runs anything,
/// from any process sharing the store. Fails with [`Error::InvalidArguments`] for an
/// invalid scope and [`Error::Store`] if the store fails.
///
/// ```no_run
/// # async fn demo(output: tool_contracts_runtime::ToolOutput) -> Result<(), tool_contracts_runtime::Error> {
/// use tool_contracts_runtime::{operation, OperationState};
///
/// if let Some(key) = &output.key {
///     if let Some(op) = operation(key).await? {
///         assert_eq!(op.state, OperationState::Completed);
///         assert_eq!(op.result.as_ref(), Some(&output.value));
///     }
/// }
/// # Ok(()) }
/// ```
pub async fn operation(key: &str) -> Result<Option<Operation>, Error> {
    read(READER, key, false).await
}

/// [`operation`] with the key's history ([`Operation::history`], oldest first).
pub async fn operation_with_history(key: &str) -> Result<Option<Operation>, Error> {
    read(READER, key, true).await
}

/// What errors of a read by key name as their tool (none is known before the read).
const READER: &str = "operation";

impl ToolDescriptor {
    /// The operation a call of this tool with these JSON arguments made, in the current
    /// scope: its key derived exactly as the call derives it ([`key`](Self::key)), then
    /// read like [`operation`](crate::operation). `Ok(None)` for a read-only tool (no
    /// key) or a call not made (or not in this scope); invalid arguments give the error
    /// the call would.
    pub async fn operation(&self, args: &Value) -> Result<Option<Operation>, Error> {
        match self.key(args)? {
            Some(key) => read(self.name(), &key, false).await,
            None => Ok(None),
        }
    }
}

/// The one read: the reader's scope, the store's record and clock, the scope rule; then
/// the call's approval record, if it asked for one (docs/approval.md).
async fn read(label: &str, key: &str, with_history: bool) -> Result<Option<Operation>, Error> {
    let scope = ambient::caller_scope(label)?;
    let store = ambient::current_store();
    let store_error = |source| Error::Store {
        tool: label.to_owned(),
        key: Some(key.to_owned()),
        source,
    };
    let observed = match store.observe(key).await.map_err(store_error)? {
        // Indistinguishable from absent, and the history is not read at all.
        Some(o) if !ambient::may_read(scope.as_deref(), o.record.scope.as_deref()) => None,
        other => other,
    };
    // The approval record: always when the call's own key is absent (it may be waiting or
    // denied), else only for a tool that may ask (no second read for the others).
    let approval = match &observed {
        Some(o) if !crate::approval::may_ask(&o.record.tool) => None,
        _ => crate::approval::observe(&store, scope.as_deref(), key)
            .await
            .map_err(store_error)?,
    };
    let approval_history = match (&approval, with_history) {
        (Some((approval_key, _)), true) => {
            let mut events = store.history(approval_key).await.map_err(store_error)?;
            for event in &mut events {
                event.kind = crate::approval::history_kind(event.kind);
            }
            events
        }
        _ => Vec::new(),
    };
    let Some(observed) = observed else {
        return match approval {
            Some((_, approval)) => {
                Operation::from_approval(key, &approval, with_history.then_some(approval_history))
            }
            None => Ok(None),
        };
    };
    let history = match with_history {
        true => {
            let mut events = store.history(key).await.map_err(store_error)?;
            events.extend(approval_history);
            // Stable: a call's own events keep their order among equal times.
            events.sort_by_key(|e| e.at);
            Some(events)
        }
        false => None,
    };
    let Some(mut op) = Operation::from_observed(observed, history)? else {
        return Ok(None);
    };
    if let Some((_, approval)) = &approval {
        op.approval = crate::approval::from_observed(approval).ok().flatten();
    }
    op.state = run_state(&store, &op).await.map_err(store_error)?;
    Ok(Some(op))
}

/// A run's compensation states, told from the record that marks its compensation (only
/// `Run::compensate` writes it, under a key derived from the run's): a running run with
/// the mark is compensating, a run whose stored error is its compensation document is
/// compensated or needs intervention. Any other operation keeps its state.
async fn run_state(
    store: &std::sync::Arc<dyn Store>,
    op: &Operation,
) -> Result<OperationState, crate::store::StoreError> {
    let (OperationState::InProgress | OperationState::Failed, Some(version)) =
        (op.state, op.version)
    else {
        return Ok(op.state);
    };
    let Ok(mark) = crate::run::compensation_key(&op.key, &op.tool, version) else {
        return Ok(op.state);
    };
    if store.lookup(&mark).await?.is_none() {
        return Ok(op.state);
    }
    if op.state == OperationState::InProgress {
        return Ok(OperationState::Compensating);
    }
    let state = op
        .error
        .as_ref()
        .and_then(|e| e.get("compensation"))
        .and_then(|c| c.get("state"))
        .and_then(Value::as_str);
    Ok(match state {
        Some("compensated") => OperationState::Compensated,
        Some("needs_intervention") => OperationState::NeedsIntervention,
        _ => op.state,
    })
}

/// A time as RFC 3339 in UTC, to the millisecond. Times RFC 3339 cannot write (before
/// 1970, after 9999) are clamped to its range: a store's answer never makes this panic.
pub(crate) struct Rfc3339(pub(crate) SystemTime);

impl Serialize for Rfc3339 {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&rfc3339_text(self.0))
    }
}

/// `at` as the operation document writes its times (RFC 3339, UTC, to the millisecond),
/// for surfaces that show them outside the document (MCP task times).
pub(crate) fn rfc3339_text(at: SystemTime) -> String {
    // 9999-12-31T23:59:59.999Z, the last instant humantime writes.
    const LAST: Duration = Duration::from_millis(253_402_300_799_999);
    let at = match at.duration_since(UNIX_EPOCH) {
        Err(_) => UNIX_EPOCH,
        Ok(since) if since > LAST => UNIX_EPOCH + LAST,
        Ok(_) => at,
    };
    humantime::format_rfc3339_millis(at).to_string()
}

fn rfc3339<S: Serializer>(at: &SystemTime, serializer: S) -> Result<S::Ok, S::Error> {
    Rfc3339(*at).serialize(serializer)
}

/// Whole milliseconds, rounded up: a live lease never shows as 0.
fn millis<S: Serializer>(d: &Option<Duration>, serializer: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => {
            let ms = d.as_nanos().div_ceil(1_000_000);
            serializer.serialize_u64(u64::try_from(ms).unwrap_or(u64::MAX))
        }
        None => serializer.serialize_none(),
    }
}

fn history<S: Serializer>(
    events: &Option<Vec<HistoryEvent>>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    let Some(events) = events else {
        return serializer.serialize_none();
    };
    let mut seq = serializer.serialize_seq(Some(events.len()))?;
    for event in events {
        seq.serialize_element(&Event(event))?;
    }
    seq.end()
}

/// One history entry of the document: `{"at", "kind", "token", "worker"}`.
struct Event<'a>(&'a HistoryEvent);

impl Serialize for Event<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut event = serializer.serialize_struct("Event", 4)?;
        event.serialize_field("at", &Rfc3339(self.0.at))?;
        event.serialize_field("kind", self.0.kind.as_str())?;
        event.serialize_field("token", &self.0.token)?;
        event.serialize_field("worker", &self.0.worker)?;
        event.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{HistoryKind, Record};

    fn record(state: RecordState, at: SystemTime) -> Record {
        Record {
            key: "k".to_owned(),
            tool: "t".to_owned(),
            version: Some(3),
            scope: Some("tenant".to_owned()),
            fingerprint: "fp".to_owned(),
            args: r#"{"card":{"sha256":"ab"}}"#.to_owned(),
            state,
            created_at: at,
            updated_at: at + Duration::from_millis(5),
            expires_at: at + Duration::from_secs(60),
        }
    }

    fn view(state: RecordState, now_after: Duration) -> Option<Operation> {
        let at = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let observed = Observed::new(record(state, at), at + now_after);
        Operation::from_observed(observed, None).unwrap()
    }

    #[test]
    fn the_lease_is_judged_by_the_stores_now_and_a_null_result_is_kept() {
        let at = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let in_progress = RecordState::InProgress {
            token: 1,
            lease_expires_at: at + Duration::from_secs(10),
        };
        let op = view(in_progress.clone(), Duration::from_secs(4)).unwrap();
        assert_eq!(op.state, OperationState::InProgress);
        assert_eq!(op.lease_remaining, Some(Duration::from_secs(6)));
        // At the lease's end exactly, the store's claim answers abandoned: so does a read.
        let op = view(in_progress, Duration::from_secs(10)).unwrap();
        assert_eq!(op.state, OperationState::Unknown);
        assert_eq!(op.lease_remaining, None);

        let null = RecordState::Completed {
            result: "null".to_owned(),
            is_error: false,
            completed_at: at,
        };
        let op = view(null.clone(), Duration::from_secs(1)).unwrap();
        let doc = serde_json::to_value(&op).unwrap();
        assert_eq!(doc.get("result"), Some(&Value::Null), "{doc}");
        assert!(doc.get("error").is_none() && doc.get("lease_remaining_ms").is_none());
        // A result past its expiry is what a call finds: nothing.
        assert_eq!(view(null, Duration::from_secs(60)), None);
    }

    #[test]
    fn the_document_has_its_documented_shape_and_never_the_arguments() {
        let at = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        let mut observed = Observed::new(
            record(
                RecordState::Completed {
                    result: r#"{"code":"declined"}"#.to_owned(),
                    is_error: true,
                    completed_at: at,
                },
                at,
            ),
            at,
        );
        observed.record.version = None;
        let history = vec![HistoryEvent {
            at,
            kind: HistoryKind::Claimed,
            token: 7,
            worker: "w".to_owned(),
        }];
        let op = Operation::from_observed(observed, Some(history))
            .unwrap()
            .unwrap();
        assert_eq!(
            op.error_as::<serde_json::Map<String, Value>>()
                .unwrap()
                .unwrap()["code"],
            "declined"
        );
        assert_eq!(op.result_as::<String>().unwrap(), None);
        assert_eq!(
            serde_json::to_value(&op).unwrap(),
            serde_json::json!({
                "key": "k",
                "tool": "t",
                "version": null,
                "state": "failed",
                "error": {"code": "declined"},
                "created_at": "2023-11-14T22:13:20.123Z",
                "updated_at": "2023-11-14T22:13:20.128Z",
                "expires_at": "2023-11-14T22:14:20.123Z",
                "history": [
                    {"at": "2023-11-14T22:13:20.123Z", "kind": "claimed", "token": 7, "worker": "w"}
                ],
            })
        );
    }

    #[test]
    fn times_rfc_3339_cannot_write_are_clamped_not_a_panic() {
        let text = |at| serde_json::to_value(Rfc3339(at)).unwrap();
        assert_eq!(
            text(UNIX_EPOCH - Duration::from_secs(5)),
            "1970-01-01T00:00:00.000Z"
        );
        assert_eq!(
            text(UNIX_EPOCH + Duration::from_secs(400_000_000_000)),
            "9999-12-31T23:59:59.999Z"
        );
    }

    #[test]
    fn a_stored_value_that_is_not_json_is_a_codec_error() {
        let at = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let bad = RecordState::Completed {
            result: "not json".to_owned(),
            is_error: false,
            completed_at: at,
        };
        let observed = Observed::new(record(bad, at), at);
        assert!(matches!(
            Operation::from_observed(observed, None),
            Err(Error::Codec { .. })
        ));
    }
}
