//! Approval: a call that needs a human's decision runs nothing until one is stored.
//!
//! The request and the decision live in one record of their own, under a key derived
//! from the call's key alone (docs/key-spec.md 5.2), so every surface reads it from the
//! operation key and every process sharing the store sees one decision:
//!
//! - a call that needs approval and finds no record claims it (through `lease.rs`, like
//!   any claim) with a lease of `approval_expires` that nobody renews: "awaiting approval".
//!   The call itself is not claimed and its body does not run;
//! - a decision completes that record through [`Store::resolve`] (the operator's door
//!   for a pending key): the first decision wins, atomically, in every backend; the
//!   record's history says who decided, through which channel, by the store's clock;
//! - a later call of the same intent finds the decision: approved, it claims its own key
//!   and runs once (the call's key, as always, makes sure of that); denied, it gets the
//!   denial until the decision expires (the tool's `ttl`);
//! - a request nobody answered within `approval_expires` counts as expired: the next call
//!   takes it over and asks again; a late decision on it is refused.
//!
//! Why not a new state in every store's record: the request needs exactly a claim with a
//! lease, and the decision exactly a first-writer-wins completion with a history entry,
//! which every backend already makes atomic and tests in its conformance suite.

use core::time::Duration;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

use crate::ambient;
use crate::error::Error;
use crate::key::KeyBuilder;
use crate::lease::{self, Acquired, OnBusy, Policy};
use crate::operation::Rfc3339;
use crate::spec::{ApprovalRule, ToolSpec};
use crate::store::{
    ClaimRequest, HistoryKind, Observed, RecordState, Resolution, ResolveRequest, Store, StoreError,
};

/// The key contract of approval records (docs/key-spec.md 5.2).
pub(crate) const APPROVAL_CONTRACT: &str = "tool-contracts/approval/v1";

/// The suffix of an approval record's `tool` (`create_order/approval`): tool names never
/// hold `/`, so recovery and operators never mistake the request for a call of the tool.
const LABEL_SUFFIX: &str = "/approval";

/// The channels this crate decides through; any other name may be given to [`decide`].
pub mod channel {
    /// [`approve`](super::approve) / [`deny`](super::deny) from Rust.
    pub const RUST: &str = "rust";
    /// `tool-contracts approve KEY` / `deny KEY`.
    pub const CLI: &str = "cli";
    /// `POST /operations/{key}/approve` / `deny`.
    pub const HTTP: &str = "http";
    /// An MCP client's answer to the server's elicitation.
    pub const MCP_ELICITATION: &str = "mcp-elicitation";
}

static DESTRUCTIVE: AtomicBool = AtomicBool::new(false);

/// Makes every `destructive` tool without an `approval` option wait for approval, in this
/// whole process (off by default: turning it on stops such tools until someone approves,
/// so it is a deployment's choice, not a library's). `approval = "never"` opts a tool out.
pub fn require_approval_for_destructive(on: bool) {
    DESTRUCTIVE.store(on, Ordering::Relaxed);
}

/// Whether [`require_approval_for_destructive`] is on.
pub fn approval_required_for_destructive() -> bool {
    DESTRUCTIVE.load(Ordering::Relaxed)
}

/// Whether a call of `spec` needs approval before any policy function speaks: the
/// tool's rule, and the process-wide policy for destructive tools.
pub(crate) fn required_by_rule(spec: &ToolSpec) -> bool {
    match spec.approval {
        ApprovalRule::Required => true,
        ApprovalRule::Default => spec.destructive && approval_required_for_destructive(),
        ApprovalRule::Never | ApprovalRule::Policy => false,
    }
}

/// Whether a call of the tool named `tool` may have asked for approval: false only for a
/// tool this program declares (`#[mutating_tool]`) whose rule can never ask, so a read of
/// its operation skips the approval record; any other name (a hand-built descriptor, a
/// run, a route) is read as it may.
pub(crate) fn may_ask(tool: &str) -> bool {
    match crate::contracts::spec_of(tool) {
        Some(spec) => {
            spec.kind == crate::spec::ToolKind::Mutating
                && spec.approval != ApprovalRule::Never
                && (spec.approval != ApprovalRule::Default || spec.destructive)
        }
        None => true,
    }
}

/// The rule a descriptor shows (`_meta`): the process-wide policy applied.
pub(crate) fn effective_rule(spec: &ToolSpec) -> ApprovalRule {
    match spec.approval {
        ApprovalRule::Default if required_by_rule(spec) => ApprovalRule::Required,
        ApprovalRule::Default => ApprovalRule::Never,
        rule => rule,
    }
}

/// The key of the approval record of the call `call_key`: `tool-contracts/approval/v1`,
/// fields `{"call": call_key}`, no scope (the call key holds it), tool `approval`,
/// version 1 (docs/key-spec.md 5.2). Derived from the key alone, so a reader who has
/// only the operation id finds it.
pub fn approval_key(call_key: &str) -> Result<String, Error> {
    let mut builder = KeyBuilder::new(APPROVAL_CONTRACT);
    builder
        .field("call", call_key)
        .map_err(|e| Error::InvalidArguments {
            tool: "approval".to_owned(),
            field: Some("key".to_owned()),
            message: e.to_string(),
        })?;
    Ok(builder.finish(None, "approval", 1))
}

/// A human's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// The call may run (once).
    Approved,
    /// The call must not run; retries of the intent get the denial until it expires.
    Denied,
}

crate::lowercase_names! {
    Verdict {
        Approved => "approved",
        Denied => "denied",
    }
}

/// A decision as stored: who, through which channel, why; when comes from the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Stored {
    verdict: Verdict,
    by: String,
    channel: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

/// A decision on a call: who, when (the store's clock), through which channel, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decision {
    /// Approved or denied.
    pub verdict: Verdict,
    /// Who decided, as the channel named them.
    pub by: String,
    /// Through which channel ([`channel`]).
    pub channel: String,
    /// When, by the store's clock.
    pub at: SystemTime,
    /// The reason given (always asked of a denial).
    pub reason: Option<String>,
}

impl Serialize for Decision {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("verdict", &self.verdict)?;
        map.serialize_entry("by", &self.by)?;
        map.serialize_entry("channel", &self.channel)?;
        map.serialize_entry("at", &Rfc3339(self.at))?;
        if let Some(reason) = &self.reason {
            map.serialize_entry("reason", reason)?;
        }
        map.end()
    }
}

/// Where an approval request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ApprovalState {
    /// Asked, not answered, not expired.
    Pending,
    /// Approved: the call's next attempt runs (once).
    Approved,
    /// Denied: the call's attempts get the denial.
    Denied,
    /// Nobody answered in time: the call's next attempt asks again.
    Expired,
}

crate::lowercase_names! {
    ApprovalState {
        Pending => "pending",
        Approved => "approved",
        Denied => "denied",
        Expired => "expired",
    }
}

impl Serialize for ApprovalState {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// The approval of one call, as the operation view shows it (`"approval"`): never the
/// call's arguments ([`ApprovalRequest`] has them, for the people asked).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Approval {
    /// Where it stands.
    pub state: ApprovalState,
    /// When it was (last) asked for, by the store's clock.
    pub requested_at: SystemTime,
    /// Pending: when the request expires. Decided: when the decision does (an approval
    /// not used by then is asked for again; a denial stops being replayed).
    pub expires_at: SystemTime,
    /// The decision, once there is one.
    pub decision: Option<Decision>,
}

impl Serialize for Approval {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("state", &self.state)?;
        map.serialize_entry("requested_at", &Rfc3339(self.requested_at))?;
        map.serialize_entry("expires_at", &Rfc3339(self.expires_at))?;
        if let Some(decision) = &self.decision {
            map.serialize_entry("decision", decision)?;
        }
        map.end()
    }
}

/// What the people asked see: the call's key (the operation id), tool, arguments as the
/// store keeps them ([`Secret`](crate::Secret) values as their digests), and the approval.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ApprovalRequest {
    /// The call's key: the operation id every surface links to.
    pub key: String,
    /// The tool that asks.
    pub tool: String,
    /// The version of the tool's contract.
    pub version: Option<u32>,
    /// The call's arguments, as stored.
    pub arguments: Value,
    /// Where the approval stands.
    pub approval: Approval,
}

/// The request record's `args`: the call's arguments and how long each decision lasts,
/// so a decider needs nothing but the key (no registry: the CLI decides too).
#[derive(Debug, Serialize, Deserialize)]
struct RequestDoc {
    approved_ttl_ms: u64,
    arguments: Value,
    /// The call's key (the operation id), for operators who list pending records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    call: Option<String>,
    denied_ttl_ms: u64,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What a call needing approval found, for the engine to act on.
pub(crate) enum Gate {
    /// Approved (or the call's own key is already claimed or completed): go on with the
    /// usual claim of the call's key.
    Proceed,
    /// Asked (now or earlier), not answered: nothing runs.
    Pending {
        /// How long the request stays open.
        expires_in: Duration,
    },
    /// Denied: replay the denial.
    Denied(Decision),
    /// The request was made with other arguments under the same key: `their_args`.
    Mismatch(Option<String>),
}

/// The gate a call needing approval passes before its key is claimed. `call` is the
/// call's own claim request.
pub(crate) async fn gate(
    store: &Arc<dyn Store>,
    spec: &ToolSpec,
    call: ClaimRequest<'_>,
    accepts: &(dyn Fn(&str) -> bool + Sync),
) -> Result<Gate, StoreError> {
    // A call already claimed or completed under its key was approved before (or is the
    // running approved call): the usual cycle replays, waits or reports it.
    if let Some(observed) = store.observe(call.key).await? {
        let live = match &observed.record.state {
            RecordState::Completed { .. } => observed.record.expires_at > observed.now,
            RecordState::InProgress { .. } => true,
        };
        if live {
            return Ok(Gate::Proceed);
        }
    }
    let key = approval_key(call.key).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let label = format!("{}{LABEL_SUFFIX}", spec.name);
    let doc = serde_json::to_string(&RequestDoc {
        approved_ttl_ms: millis(spec.approval_expires.min(spec.ttl)),
        arguments: serde_json::from_str(call.args).unwrap_or(Value::Null),
        call: Some(call.key.to_owned()),
        denied_ttl_ms: millis(spec.ttl),
    })
    .map_err(|e| StoreError::Corrupt(format!("approval request: {e}")))?;
    let request = ClaimRequest {
        key: &key,
        tool: &label,
        args: &doc,
        lease: spec.approval_expires,
        ttl: spec.approval_expires,
        ..call
    };
    let policy = Policy {
        on_busy: OnBusy::Report,
        // An expired request is asked again.
        take_over: true,
        accepts,
    };
    Ok(match lease::acquire(store, request, policy).await? {
        // Dropped unended: the claim stays, unrenewed, until a decision or its expiry.
        Acquired::Held(_request) => Gate::Pending {
            expires_in: spec.approval_expires,
        },
        Acquired::Busy { lease_remaining } => Gate::Pending {
            expires_in: lease_remaining,
        },
        Acquired::Abandoned => Gate::Pending {
            expires_in: Duration::ZERO,
        },
        Acquired::Completed(record) => {
            let decision =
                stored_decision(&record.state, record.updated_at).map_err(StoreError::Corrupt)?;
            match decision.verdict {
                Verdict::Approved => Gate::Proceed,
                Verdict::Denied => Gate::Denied(decision),
            }
        }
        Acquired::Mismatch { record, .. } => {
            let doc = match record {
                Some(record) => Some(record.args.clone()),
                None => store.lookup(&key).await?.map(|r| r.args),
            };
            Gate::Mismatch(doc.as_deref().and_then(request_arguments))
        }
    })
}

/// The call's arguments kept in a request record's `args`.
fn request_arguments(doc: &str) -> Option<String> {
    let doc: RequestDoc = serde_json::from_str(doc).ok()?;
    serde_json::to_string(&doc.arguments).ok()
}

/// The decision a completed approval record holds.
fn stored_decision(state: &RecordState, at: SystemTime) -> Result<Decision, String> {
    let RecordState::Completed { result, .. } = state else {
        return Err("the approval record holds no decision".to_owned());
    };
    let stored: Stored = serde_json::from_str(result).map_err(|e| {
        format!("the approval record's decision does not decode ({e}); the store holds a value this crate did not write")
    })?;
    Ok(Decision {
        verdict: stored.verdict,
        by: stored.by,
        channel: stored.channel,
        at,
        reason: stored.reason,
    })
}

/// The approval an approval record shows, by the store's clock: `None` for a decision
/// past its expiry (gone, as for a call).
pub(crate) fn from_observed(observed: &Observed) -> Result<Option<Approval>, String> {
    let record = &observed.record;
    Ok(Some(match &record.state {
        RecordState::InProgress {
            lease_expires_at, ..
        } => Approval {
            state: match *lease_expires_at > observed.now {
                true => ApprovalState::Pending,
                false => ApprovalState::Expired,
            },
            requested_at: record.updated_at,
            expires_at: *lease_expires_at,
            decision: None,
        },
        RecordState::Completed { .. } if record.expires_at <= observed.now => return Ok(None),
        state @ RecordState::Completed { .. } => {
            let decision = stored_decision(state, record.updated_at)?;
            Approval {
                state: match decision.verdict {
                    Verdict::Approved => ApprovalState::Approved,
                    Verdict::Denied => ApprovalState::Denied,
                },
                requested_at: record.created_at,
                expires_at: record.expires_at,
                decision: Some(decision),
            }
        }
    }))
}

/// Whether `record` is an approval request (its label), not a call.
pub(crate) fn is_request(record: &crate::store::Record) -> bool {
    record.tool.ends_with(LABEL_SUFFIX)
}

/// The call key an approval request was made for, as its record keeps it (for operators
/// listing pending records, who see the request's own key).
pub fn requested_call(record: &crate::store::Record) -> Option<String> {
    if !is_request(record) {
        return None;
    }
    serde_json::from_str::<RequestDoc>(&record.args)
        .ok()
        .and_then(|doc| doc.call)
}

/// The tool an approval record's label names.
pub(crate) fn tool_of(label: &str) -> &str {
    label.strip_suffix(LABEL_SUFFIX).unwrap_or(label)
}

/// How an approval record's history reads in its call's history: its claims are the
/// requests.
pub(crate) fn history_kind(kind: HistoryKind) -> HistoryKind {
    match kind {
        HistoryKind::Claimed | HistoryKind::TakenOver => HistoryKind::ApprovalRequested,
        other => other,
    }
}

/// Reads the approval record of `key` in the current scope (absent for another scope).
pub(crate) async fn observe(
    store: &Arc<dyn Store>,
    scope: Option<&str>,
    key: &str,
) -> Result<Option<(String, Observed)>, StoreError> {
    let Ok(approval) = approval_key(key) else {
        return Ok(None);
    };
    match store.observe(&approval).await? {
        Some(observed) if ambient::may_read(scope, observed.record.scope.as_deref()) => {
            Ok(Some((approval, observed)))
        }
        _ => Ok(None),
    }
}

/// The approval request of the call `key`, for the people asked: the tool, the
/// arguments and where it stands. `Ok(None)` if the call never asked (or asked in another
/// scope, or its decision expired). Reads only.
pub async fn approval_request(key: &str) -> Result<Option<ApprovalRequest>, Error> {
    Ok(request_with_scope(key).await?.map(|(request, _)| request))
}

/// [`approval_request`] and the scope the call was made in (the record's: the reader's,
/// or the reader's with a client's intent key): what a channel that continues the call
/// after approving it needs to make it under the same key.
pub(crate) async fn request_with_scope(
    key: &str,
) -> Result<Option<(ApprovalRequest, Option<String>)>, Error> {
    let scope = ambient::caller_scope("approval")?;
    let store = ambient::current_store();
    let Some((_, observed)) = observe(&store, scope.as_deref(), key)
        .await
        .map_err(|e| store_error(key, e))?
    else {
        return Ok(None);
    };
    let Some(approval) = from_observed(&observed).map_err(|m| codec(key, m))? else {
        return Ok(None);
    };
    let record = observed.record;
    let arguments = serde_json::from_str::<RequestDoc>(&record.args)
        .map(|doc| doc.arguments)
        .map_err(|e| codec(key, format!("the approval request does not decode ({e})")))?;
    let request = ApprovalRequest {
        key: key.to_owned(),
        tool: tool_of(&record.tool).to_owned(),
        version: record.version,
        arguments,
        approval,
    };
    Ok(Some((request, record.scope)))
}

/// Approves the call `key` (the operation id) as `by`, from Rust: its next attempt runs
/// once. See [`decide`].
pub async fn approve(key: &str, by: &str) -> Result<Decision, Error> {
    decide(key, Verdict::Approved, by, channel::RUST, None).await
}

/// Denies the call `key` as `by`, for `reason`: its attempts get the denial until it
/// expires (the tool's `ttl`). See [`decide`].
pub async fn deny(key: &str, by: &str, reason: &str) -> Result<Decision, Error> {
    decide(key, Verdict::Denied, by, channel::RUST, Some(reason)).await
}

/// Stores a decision on the pending approval request of the call `key`, in the current
/// scope and store: the first decision wins, in every process sharing the store.
///
/// The same verdict again answers the stored decision (a double click approves once);
/// the other verdict, a request that expired unanswered, or a key that never asked (or
/// asked in another scope) fail with [`Error::NoPendingApproval`], saying which. `by`
/// must be 1 to 256 characters without control characters; `reason` at most 1024.
pub async fn decide(
    key: &str,
    verdict: Verdict,
    by: &str,
    channel: &str,
    reason: Option<&str>,
) -> Result<Decision, Error> {
    check_text("by", by, 1, 256)?;
    check_text("channel", channel, 1, 64)?;
    if let Some(reason) = reason {
        check_text("reason", reason, 0, 1024)?;
    }
    let scope = ambient::caller_scope("approval")?;
    let store = ambient::current_store();
    let not_pending = |message: String| Error::NoPendingApproval {
        key: key.to_owned(),
        message,
    };
    // Twice at most: a decision that lost a race reads the winner's.
    for _ in 0..2 {
        let Some((approval, observed)) = observe(&store, scope.as_deref(), key)
            .await
            .map_err(|e| store_error(key, e))?
        else {
            return Err(not_pending(
                "no call is waiting for approval under this key (it never asked, asked in another scope, or its decision expired); nothing was decided".to_owned(),
            ));
        };
        let state = from_observed(&observed).map_err(|m| codec(key, m))?;
        match state {
            None => {
                return Err(not_pending(
                    "its decision expired; the call asks again on its next attempt".to_owned(),
                ))
            }
            Some(Approval {
                state: ApprovalState::Expired,
                expires_at,
                ..
            }) => {
                return Err(not_pending(format!(
                    "its approval request expired unanswered at {}; nothing was decided, and the call asks again on its next attempt",
                    crate::operation::rfc3339_text(expires_at)
                )))
            }
            Some(Approval {
                decision: Some(decision),
                ..
            }) => {
                if decision.verdict == verdict {
                    return Ok(decision);
                }
                return Err(not_pending(format!(
                    "it was already {} by {} via {}; the first decision stands",
                    decision.verdict, decision.by, decision.channel
                )));
            }
            Some(_) => {}
        }
        let doc: RequestDoc = serde_json::from_str(&observed.record.args)
            .map_err(|e| codec(key, format!("the approval request does not decode ({e})")))?;
        let ttl = Duration::from_millis(match verdict {
            Verdict::Approved => doc.approved_ttl_ms,
            Verdict::Denied => doc.denied_ttl_ms,
        });
        let stored = serde_json::to_string(&Stored {
            verdict,
            by: by.to_owned(),
            channel: channel.to_owned(),
            reason: reason.map(str::to_owned),
        })
        .map_err(|e| codec(key, e.to_string()))?;
        let worker = format!("{by} via {channel}");
        let request = ResolveRequest {
            key: &approval,
            resolution: Resolution::Complete {
                result: &stored,
                ttl,
            },
            kind: match verdict {
                Verdict::Approved => HistoryKind::Approved,
                Verdict::Denied => HistoryKind::Denied,
            },
            worker: &worker,
        };
        match store.resolve(request).await {
            Ok(()) => {
                tracing::info!(
                    key,
                    verdict = verdict.as_str(),
                    by,
                    channel,
                    "tool-contracts: approval decided"
                );
                let decided = observe(&store, scope.as_deref(), key)
                    .await
                    .map_err(|e| store_error(key, e))?
                    .and_then(|(_, o)| from_observed(&o).ok().flatten())
                    .and_then(|a| a.decision);
                return decided.ok_or_else(|| {
                    not_pending("the decision was stored but reads back absent (it expired at once: a ttl of 0?)".to_owned())
                });
            }
            // Decided (or expired and re-asked) between the read and the write: read again.
            Err(StoreError::NotPending) => continue,
            Err(e) => return Err(store_error(key, e)),
        }
    }
    Err(not_pending(
        "the request changed twice while deciding; read it again and retry".to_owned(),
    ))
}

fn check_text(field: &str, value: &str, min: usize, max: usize) -> Result<(), Error> {
    let chars = value.chars().count();
    let problem = if chars < min {
        Some(format!(
            "`{field}` is empty; name who decides (a person or a service)"
        ))
    } else if chars > max {
        Some(format!(
            "`{field}` has {chars} characters, over the limit of {max}"
        ))
    } else if value.chars().any(char::is_control) {
        Some(format!(
            "`{field}` holds a control character; send plain text"
        ))
    } else {
        None
    };
    match problem {
        Some(message) => Err(Error::InvalidArguments {
            tool: "approval".to_owned(),
            field: Some(field.to_owned()),
            message: format!("{message}; nothing was decided"),
        }),
        None => Ok(()),
    }
}

fn store_error(key: &str, source: StoreError) -> Error {
    Error::Store {
        tool: "approval".to_owned(),
        key: Some(key.to_owned()),
        source,
    }
}

fn codec(key: &str, message: String) -> Error {
    Error::Codec {
        tool: "approval".to_owned(),
        key: Some(key.to_owned()),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_approval_key_matches_its_documented_vector() {
        let key = approval_key("a63b2208f648767293039cca84fbe432812d89700f4e36a9b2b7f169ff420c5f");
        assert_eq!(
            key.ok().as_deref(),
            Some("1f1cea431801b1734c0ebfa0704cc419b599362966e66bde3a75d7a91cde3d20")
        );
    }
}
