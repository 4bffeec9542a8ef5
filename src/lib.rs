// The crate docs are the user's guide (docs.rs's front page), kept in a file of their own
// so their doctested examples read as one document; README.md is the same material in brief.
#![doc = include_str!("guide.md")]
#![deny(missing_docs)]
// docs.rs (nightly, `--cfg docsrs`) marks feature-gated items with the feature they need.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

pub use tool_contracts_macros::{mutating_tool, read_only_tool};
/// The runtime: key spec, stores, engine entry points, registry, runs and recovery.
pub use tool_contracts_runtime::*;

/// Not public API: what the attribute macros' expansions name. It may change in any
/// release; the facade pins the macro crate to the runtime's exact version.
#[doc(hidden)]
pub mod __private {
    pub use tool_contracts_runtime::__private::*;
}
