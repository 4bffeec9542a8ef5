//! How the suites call their tools: an error type whose text crosses a process boundary,
//! and a call dropped mid-body. A file of its own (not in `support/mod.rs`): it names
//! `tool_contracts`, which `runtime/tests` do not depend on.
#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tool_contracts::Error;

/// The error of a suite's tools: a contract error as its code and message
/// (`in_progress: ...`, `store: ...`), so a worker process can report it as text and the
/// parent can match its code; `Ledger` when the tool's record of its effect failed.
#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
pub enum ToolError {
    #[error("{0}")]
    Contract(String),
    #[error("ledger: {0}")]
    Ledger(String),
}

impl From<Error> for ToolError {
    fn from(e: Error) -> Self {
        ToolError::Contract(format!("{}: {e}", e.code()))
    }
}

/// Drops `call` mid-body (the caller gives up after 100 ms), then lets its 1 s lease run
/// out: the claim it left is abandoned, its outcome unknown. For paused time.
pub async fn abandon_first_call<F: Future>(call: F) {
    let first = tokio::time::timeout(Duration::from_millis(100), call).await;
    assert!(first.is_err(), "the first call was dropped mid-body");
    tokio::time::sleep(Duration::from_secs(2)).await;
}
