//! Compensation: the undo a step declares ([`Run::step_with_undo`](super::Run::step_with_undo))
//! and the run's compensation ([`Run::compensate`](super::Run::compensate)), which runs the
//! undos of its completed steps in reverse order, each one journaled under a key of its own
//! derived from its step's key.
//!
//! The claim cycle of an undo is the lease layer's ([`crate::lease`]), as for a step: an
//! undo whose record is completed is never run again; one whose worker died mid-undo is an
//! unknown outcome, settled by the undo's `verify` when it has one, else left to an
//! operator (the run then needs intervention).

use core::future::Future;
use core::pin::Pin;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::Error;
use crate::spec::OnUnknown;

/// Contract string of undo keys (docs/key-spec.md, "Run, step and undo keys").
pub(crate) const UNDO_CONTRACT: &str = "tool-contracts/undo/v1";
/// Contract string of the record that marks a run as compensating.
pub(crate) const COMPENSATION_CONTRACT: &str = "tool-contracts/compensation/v1";

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type UndoFn = Box<dyn FnOnce(Done, UndoContext) -> BoxFuture<Result<Value, String>> + Send>;
type VerifyFn =
    Box<dyn FnOnce(Done, UndoContext) -> BoxFuture<Result<Option<Value>, String>> + Send>;

/// What compensation hands an undo about the entry it undoes, read from the entry's record:
/// its stored result, and the arguments stored with it (a tool call's JSON arguments; `{}`
/// for a step).
pub(crate) struct Done {
    pub(crate) result: Value,
    pub(crate) args: String,
}

/// The undo of a `#[mutating_tool(compensate = path)]`, as its expansion builds it: called
/// with the call's stored JSON arguments and stored result (JSON text) and the
/// [`UndoContext`]; decodes them, calls the user's undo, and answers its result as JSON or
/// its error's message. Not public API (the field of `ToolSpec` that holds it is hidden).
#[doc(hidden)]
pub type CompensateFn = fn(
    args: String,
    output: String,
    cx: UndoContext,
) -> Pin<Box<dyn Future<Output = Result<Value, String>> + Send>>;

/// What an undo is told about itself: its key, to forward downstream (a refund's own
/// idempotency key), and the step (or tool call, for a tool's `compensate` undo) it undoes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UndoContext {
    pub(crate) key: String,
    pub(crate) step: String,
    pub(crate) step_key: String,
}

impl UndoContext {
    /// The undo's key: derived from its step's key alone, the same in every process and
    /// every attempt. Send it as the downstream system's idempotency key, so that system
    /// deduplicates the undo too.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The name of the step being undone (the tool's name, for a tool call's undo).
    pub fn step(&self) -> &str {
        &self.step
    }

    /// The key of the step (or tool call) being undone.
    pub fn step_key(&self) -> &str {
        &self.step_key
    }
}

/// The undo of a step: what [`Run::compensate`](super::Run::compensate) runs if the run
/// fails after the step completed. It receives the step's stored result (decoded again as
/// `T`) and an [`UndoContext`].
pub struct Undo<T> {
    pub(crate) action: Option<UndoFn>,
    pub(crate) verify: Option<VerifyFn>,
    pub(crate) on_unknown: OnUnknown,
    _step: core::marker::PhantomData<fn(T)>,
}

impl<T> core::fmt::Debug for Undo<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Undo")
            .field("nothing_to_undo", &self.action.is_none())
            .field("verify", &self.verify.is_some())
            .field("on_unknown", &self.on_unknown)
            .finish()
    }
}

/// The step's stored result as `T`, or the message a failed undo stores.
fn decode<T: DeserializeOwned>(step: &Value) -> Result<T, String> {
    T::deserialize(step).map_err(|e| {
        format!("the step's stored result does not decode for its undo ({e}); bump the run's version when a step's type changes")
    })
}

impl<T: DeserializeOwned + 'static> Undo<T> {
    /// An undo running `f`; its `Ok` value is stored as the undo's result, its `Err` is
    /// stored as a failure (the run then needs intervention; see [`UndoOutcome::Failed`]).
    pub fn new<F, Fut, R, E>(f: F) -> Self
    where
        F: FnOnce(T, UndoContext) -> Fut + Send + 'static,
        Fut: Future<Output = Result<R, E>> + Send + 'static,
        R: Serialize,
        E: core::fmt::Display,
    {
        let action: UndoFn = Box::new(move |done: Done, cx| match decode::<T>(&done.result) {
            Err(e) => Box::pin(async move { Err(e) }),
            Ok(step) => {
                let undo = f(step, cx);
                Box::pin(async move {
                    let out = undo.await.map_err(|e| e.to_string())?;
                    serde_json::to_value(out)
                        .map_err(|e| format!("the undo's result cannot be stored as JSON: {e}"))
                })
            }
        });
        Undo {
            action: Some(action),
            verify: None,
            on_unknown: OnUnknown::Fail,
            _step: core::marker::PhantomData,
        }
    }

    /// A step with nothing to undo (a read, a computation): compensation passes over it
    /// without making the run need intervention.
    pub fn nothing() -> Self {
        Undo {
            action: None,
            verify: None,
            on_unknown: OnUnknown::Fail,
            _step: core::marker::PhantomData,
        }
    }

    /// How to settle an undo whose worker died mid-undo (the effect may or may not have
    /// happened): `verify` asks the downstream system, by the undo's key, whether the undo
    /// took effect. `Ok(Some(result))` stores that result; `Ok(None)` runs the undo; `Err`
    /// leaves the outcome unknown (the run needs intervention).
    pub fn verify<F, Fut, R, E>(mut self, verify: F) -> Self
    where
        F: FnOnce(T, UndoContext) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Option<R>, E>> + Send + 'static,
        R: Serialize,
        E: core::fmt::Display,
    {
        self.verify = Some(Box::new(move |done: Done, cx| {
            match decode::<T>(&done.result) {
                Err(e) => Box::pin(async move { Err(e) }),
                Ok(step) => {
                    let check = verify(step, cx);
                    Box::pin(async move {
                        match check.await.map_err(|e| e.to_string())? {
                            Some(found) => serde_json::to_value(found).map(Some).map_err(|e| {
                                format!("the verified undo's result cannot be stored as JSON: {e}")
                            }),
                            None => Ok(None),
                        }
                    })
                }
            }
        }));
        self
    }

    /// Run the undo again when its worker died mid-undo, without asking: for undos that
    /// forward [`UndoContext::key`] to a downstream system that deduplicates by it.
    pub fn rerun_if_unknown(mut self) -> Self {
        self.on_unknown = OnUnknown::Rerun;
        self
    }
}

/// What [`Run::step_with_undo`](super::Run::step_with_undo) accepts as an undo: an
/// [`Undo`], or a closure `FnOnce(T, UndoContext) -> impl Future<Output = Result<R, E>>`
/// (the same as [`Undo::new`] of it).
pub trait IntoUndo<T> {
    /// The undo.
    fn into_undo(self) -> Undo<T>;
}

impl<T> IntoUndo<T> for Undo<T> {
    fn into_undo(self) -> Undo<T> {
        self
    }
}

impl<T, F, Fut, R, E> IntoUndo<T> for F
where
    T: DeserializeOwned + 'static,
    F: FnOnce(T, UndoContext) -> Fut + Send + 'static,
    Fut: Future<Output = Result<R, E>> + Send + 'static,
    R: Serialize,
    E: core::fmt::Display,
{
    fn into_undo(self) -> Undo<T> {
        Undo::new(self)
    }
}

/// An undo with its step type erased, registered with the run under its step's key.
pub(crate) struct Registered {
    pub(crate) action: Option<UndoFn>,
    pub(crate) verify: Option<VerifyFn>,
    pub(crate) on_unknown: OnUnknown,
}

impl Registered {
    /// The undo of a tool call made inside a run, from its tool's `compensate`: no
    /// `verify`, and an unknown outcome stays unknown (the run then needs intervention).
    pub(crate) fn tool(compensate: CompensateFn) -> Self {
        Registered {
            action: Some(Box::new(move |done: Done, cx| {
                compensate(done.args, done.result.to_string(), cx)
            })),
            verify: None,
            on_unknown: OnUnknown::Fail,
        }
    }
}

impl<T> From<Undo<T>> for Registered {
    fn from(undo: Undo<T>) -> Self {
        Registered {
            action: undo.action,
            verify: undo.verify,
            on_unknown: undo.on_unknown,
        }
    }
}

/// How a run's compensation ended ([`Compensation::state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CompensationState {
    /// Every completed step was undone (or had nothing to undo).
    Compensated,
    /// At least one completed step could not be undone: it has no undo, its undo failed,
    /// or its undo's (or its own) outcome is unknown. An operator must finish the job;
    /// [`Compensation::steps`] says which.
    NeedsIntervention,
}

crate::lowercase_names! {
    CompensationState {
        Compensated => "compensated",
        NeedsIntervention => "needs_intervention",
    }
}

/// What compensation did with one journal entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
#[non_exhaustive]
pub enum UndoOutcome {
    /// The undo ran (now or in an earlier attempt) and its result is stored.
    Undone {
        /// The undo's stored result.
        result: Value,
    },
    /// The step declared it has nothing to undo ([`Undo::nothing`]), or a tool call whose
    /// tool has `compensate` ended with an error it stored (`cache_errors`): it failed, so
    /// there is no output to undo and its undo is not called.
    NothingToUndo,
    /// The step (or a tool call made in the run outside any step) completed and has no
    /// undo: needs intervention.
    NoUndo,
    /// The undo's worker died mid-undo and nothing settled it (no `verify`, or it failed),
    /// or the step's own outcome is unknown: needs intervention.
    Unknown,
    /// The undo returned an error, stored under its key (never retried by itself): needs
    /// intervention.
    Failed {
        /// The undo error's message.
        error: String,
    },
}

impl UndoOutcome {
    /// Whether an operator must act on this entry.
    pub fn needs_intervention(&self) -> bool {
        matches!(
            self,
            UndoOutcome::NoUndo | UndoOutcome::Unknown | UndoOutcome::Failed { .. }
        )
    }
}

/// One entry of a compensation, in the order compensation visited it (reverse journal
/// order).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StepCompensation {
    /// The entry's journal position.
    pub position: u32,
    /// Step or tool name.
    pub name: String,
    /// The step's (or tool call's) key.
    pub key: String,
    /// The undo's key, for steps that declared an undo.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub undo_key: Option<String>,
    /// What compensation did.
    #[serde(flatten)]
    pub outcome: UndoOutcome,
}

/// What [`Run::compensate`](super::Run::compensate) did, as stored in the run's record
/// (the `error` member of the run's operation document).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Compensation {
    /// Compensated, or needs intervention.
    pub state: CompensationState,
    /// Why the run was compensated, as its first `compensate` call said.
    pub reason: String,
    /// Every completed journal entry, newest first, with what was done about it.
    pub steps: Vec<StepCompensation>,
}

/// The compensation document stored as a compensated run's result: the [`Compensation`]
/// under one member, so a reader can tell it from a run's own result.
#[derive(Serialize, Deserialize)]
pub(crate) struct Stored {
    pub(crate) compensation: Compensation,
}

/// The undo context and a failure for an undo that has no registered closure.
pub(crate) fn not_replayed(run: &str, key: &str, kind: &str, step: &str) -> Error {
    Error::RunCompensating {
        run: run.to_owned(),
        key: key.to_owned(),
        message: format!("the {kind} `{step}` declared an undo, but this handle did not run or replay it before `compensate`; replay every step and tool call of the run (finished ones return their stored results) before compensating"),
    }
}
