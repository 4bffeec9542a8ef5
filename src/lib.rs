//! # tool-contracts
//!
//! Makes AI-agent tools safe to call twice. An agent whose call to `create_order` timed
//! out calls it again; with `#[mutating_tool]` the second call gets the first call's
//! stored result and nothing runs twice. The key is derived from the caller's *intent*
//! (the fields you name), never from a timestamp or a random value.
//!
//! ```no_run
//! use tool_contracts::mutating_tool;
//! # #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)] pub struct Cart { id: String }
//! # #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)] pub struct Order { id: u64 }
//! # #[derive(Debug, thiserror::Error)] pub enum ShopError { #[error(transparent)] Contract(#[from] tool_contracts::Error) }
//!
//! /// Place an order for the user's cart.
//! #[mutating_tool(idempotency_key_fields = [user_id, cart.id])]
//! async fn create_order(user_id: u64, cart: Cart, note: String) -> Result<Order, ShopError> {
//!     Ok(Order { id: 1 })
//! }
//! ```
//!
//! See the README for the options, `docs/key-spec.md` for the key, and the [`Error`]
//! variants for what a call can fail with.
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
