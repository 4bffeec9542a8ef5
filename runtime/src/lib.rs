//! Runtime of `tool-contracts`: the key spec, the store trait and its backends, the dedup
//! engine, tool descriptors and the registry.
//!
//! Users depend on the `tool-contracts` facade crate, which re-exports everything here;
//! the attribute macros reach this crate only through `tool_contracts::__private`.
#![deny(missing_docs)]
// docs.rs (nightly, `--cfg docsrs`) marks feature-gated items with the feature they need.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

/// `as_str` (the stable lowercase name a surface stores or prints: MCP `_meta`, the
/// journal, the CLI) and `Display` for enums of names, written once.
macro_rules! lowercase_names {
    ($($ty:ident { $($variant:ident => $name:literal),+ $(,)? })+) => {$(
        impl $ty {
            /// The stable lowercase name, as stored and printed.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $name,)+
                }
            }
        }

        impl core::fmt::Display for $ty {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    )+};
}
pub(crate) use lowercase_names;

mod ambient;
pub mod approval;
mod contracts;
mod decoded;
mod derived;
#[cfg(feature = "http-client")]
pub mod downstream;
mod engine;
mod error;
mod export;
#[cfg(feature = "http")]
pub mod http;
pub mod key;
mod key_paths;
mod lease;
#[cfg(feature = "mcp")]
pub mod mcp;
mod members;
mod operation;
#[cfg(feature = "otel")]
pub mod otel;
mod recovery;
mod registry;
mod run;
mod secret;
pub use secret::Secret;
mod spec;
pub mod store;
mod telemetry;

#[doc(hidden)]
pub mod __private;

pub use ambient::{
    current_key, current_key_uuid, max_argument_bytes, set_default_store, set_max_argument_bytes,
    with_scope, with_store, worker_id, DEFAULT_MAX_ARGUMENT_BYTES,
};
pub use approval::{
    approval_request, approve, decide, deny, require_approval_for_destructive, ApprovalRequest,
    Decision, Verdict,
};
pub use error::Error;
pub use operation::{operation, operation_with_history, Operation, OperationState};
pub use recovery::{recover, recover_once, RecoveryReport};
pub use registry::{
    registry, try_registry, Outcome, Registry, ToolDescriptor, ToolOutput, META_PREFIX,
};
pub use run::{
    Compensation, CompensationState, EntryKind, EntryStatus, EntryUndo, IntoUndo, JournalEntry,
    Run, RunInfo, RunOptions, RunState, RunStatus, StepCompensation, StepOptions, Undo,
    UndoContext, UndoOutcome, RUN_KEY_CONTRACT,
};
pub use spec::{
    ApprovalRule, Concurrent, Mismatch, OnUnknown, SourceLocation, TaskSupport, ToolKind,
};
pub use store::{MemoryStore, Store};

/// Re-exported: tool parameters implement `schemars::JsonSchema`.
pub use ::schemars;
/// Re-exported: [`current_key_uuid`] returns a `uuid::Uuid`.
pub use ::uuid;
