//! OpenTelemetry: metrics of every dedup decision, of call latency, store round trips and
//! leases held, and one span per call (feature `otel`). The reference, with every
//! instrument, unit and attribute, is `docs/observability.md`; the names are constants here.
//!
//! The runtime depends on the `opentelemetry` **API** only: your application brings the SDK
//! and its exporters.
//!
//! - **Metrics** come from the global `MeterProvider`, under the instrumentation scope
//!   [`SCOPE`]. Install yours with `opentelemetry::global::set_meter_provider` **before
//!   the first tool call**: the instruments are created on first use from the provider
//!   installed at that moment (an OpenTelemetry meter never follows a provider installed
//!   later), so calls made before it are not counted.
//! - **Spans** are `tracing` spans (`execute_tool {tool}` per call, `step {run}/{step}` per
//!   run step) whose fields follow the names `tracing-opentelemetry` maps (`otel.name`,
//!   `otel.status_code`): add `tracing_opentelemetry::layer()` to your subscriber to export
//!   them. They are created only with this feature, so the output of a `tracing` subscriber
//!   without it is unchanged, and the engine's `tracing` events are the same either way.
//!
//! `examples/otel_stdout.rs` sets up both with the SDK and prints what a few calls export.
//!
//! | instrument | kind | unit | attributes |
//! |---|---|---|---|
//! | [`CALLS`] | counter | `{call}` | [`TOOL_NAME`], [`OUTCOME`], [`ERROR_TYPE`] (when the call failed) |
//! | [`CALL_DURATION`] | histogram | `s` | as [`CALLS`] |
//! | [`STORE_DURATION`] | histogram | `s` | [`STORE_OPERATION`], [`STORE_BACKEND`], [`ERROR_TYPE`] (when it failed) |
//! | [`LEASES_HELD`] | up-down counter | `{lease}` | [`LEASE_NAME`] |
//!
//! Metrics never carry a key, a scope or an argument value; spans carry the first
//! [`KEY_PREFIX_LEN`] hex digits of the key, never an argument value.

/// The instrumentation scope (the meter's name) of every instrument, with the runtime's
/// version.
pub const SCOPE: &str = "tool-contracts";

/// Counter of mutating tool calls by the engine's decision ([`OUTCOME`]), per tool.
pub const CALLS: &str = "tool_contracts.calls";
/// Histogram of a mutating call's duration in seconds, from the engine's first step (the
/// claim) to its last (the result stored, the key released or abandoned): waits for a
/// running duplicate included.
pub const CALL_DURATION: &str = "tool_contracts.call.duration";
/// Histogram of one store operation's duration in seconds (a round trip to the backend).
pub const STORE_DURATION: &str = "tool_contracts.store.duration";
/// Up-down counter of the leases this process holds (tool calls, runs, steps, journal
/// positions, recovery takeovers): it returns to 0 when nothing runs.
pub const LEASES_HELD: &str = "tool_contracts.leases.held";

/// The tool's name (`#[mutating_tool(name = ...)]` or the function's), as in the OpenTelemetry
/// semantic conventions for generative AI (`execute_tool` spans).
pub const TOOL_NAME: &str = "gen_ai.tool.name";
/// How a call ended: `executed`, `replayed`, `reconciled`, `rejected` or `unknown` (see
/// `docs/observability.md` for exactly which calls each counts).
pub const OUTCOME: &str = "tool_contracts.outcome";
/// Why a call or a store operation failed, as in the semantic conventions: for a call, the
/// [`Error::code`](crate::Error::code) of the crate's own error (`key_reused`,
/// `in_progress`, `outcome_unknown`, `store`, `invalid_arguments`, `codec`, ...),
/// `tool_error` for the tool's own `Err`, `cancelled` for a call dropped before it ended;
/// for a store operation `lease_lost`, `unavailable`, `not_pending` or `corrupt`.
/// Absent when it succeeded.
pub const ERROR_TYPE: &str = "error.type";
/// The store operation: `claim`, `takeover`, `complete`, `release`, `renew`, `abandon`,
/// `lookup`, `observe`, `pending`, `resolve`, `history` or `purge_expired`.
pub const STORE_OPERATION: &str = "tool_contracts.store.operation";
/// The store's backend, as [`Store::backend`](crate::Store::backend) names it: `memory`,
/// `sqlite`, `redis`, `postgresql`, or what a custom store says (`custom` by default).
pub const STORE_BACKEND: &str = "tool_contracts.store.backend";
/// The name a lease was claimed under: a tool's, a run's, or `run/step` for a step.
pub const LEASE_NAME: &str = "tool_contracts.lease.name";
/// On spans: the first [`KEY_PREFIX_LEN`] hex digits of the call's (or step's) key.
pub const KEY_PREFIX: &str = "tool_contracts.key.prefix";
/// On step spans: the run's name.
pub const RUN_NAME: &str = "tool_contracts.run.name";
/// On step spans: the step's name.
pub const STEP_NAME: &str = "tool_contracts.step.name";

/// How many hex digits of a key a span carries (48 bits): enough to find the call in the
/// logs and the store, where keys are whole, while a trace never holds an operation's id
/// (`docs/observability.md` says why).
pub const KEY_PREFIX_LEN: usize = 12;

/// The implementation behind `crate::telemetry` when the feature is on.
pub(crate) mod imp {
    use core::time::Duration;
    use std::sync::{Arc, OnceLock};
    use std::time::Instant;

    use opentelemetry::metrics::{Counter, Histogram, UpDownCounter};
    use opentelemetry::{InstrumentationScope, KeyValue, Value};
    use tracing::field::Empty;

    use super::*;
    use crate::store::{
        ClaimOutcome, ClaimRequest, Completion, HistoryEvent, Observed, Record, ResolveRequest,
        Store, StoreError, StoreResult,
    };
    use crate::telemetry::Decision;

    struct Instruments {
        calls: Counter<u64>,
        call_duration: Histogram<f64>,
        store_duration: Histogram<f64>,
        leases_held: UpDownCounter<i64>,
    }

    /// The instruments, made on first use from the global provider of that moment.
    fn instruments() -> &'static Instruments {
        static INSTRUMENTS: OnceLock<Instruments> = OnceLock::new();
        INSTRUMENTS.get_or_init(|| {
            let meter = opentelemetry::global::meter_with_scope(
                InstrumentationScope::builder(SCOPE)
                    .with_version(env!("CARGO_PKG_VERSION"))
                    .build(),
            );
            Instruments {
                calls: meter
                    .u64_counter(CALLS)
                    .with_unit("{call}")
                    .with_description("Mutating tool calls, by the dedup engine's decision")
                    .build(),
                // Bucket advice: the semantic conventions' HTTP request durations (5 ms to
                // 10 s), which tool calls resemble; a View overrides it.
                call_duration: meter
                    .f64_histogram(CALL_DURATION)
                    .with_unit("s")
                    .with_description("Duration of mutating tool calls, claim to record")
                    .with_boundaries(vec![
                        0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                        10.0,
                    ])
                    .build(),
                // From 100 µs (an in-process store answers far below) to 5 s (a timeout).
                store_duration: meter
                    .f64_histogram(STORE_DURATION)
                    .with_unit("s")
                    .with_description("Duration of store operations (round trips to the backend)")
                    .with_boundaries(vec![
                        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                        0.25, 0.5, 1.0, 2.5, 5.0,
                    ])
                    .build(),
                leases_held: meter
                    .i64_up_down_counter(LEASES_HELD)
                    .with_unit("{lease}")
                    .with_description("Leases this process holds")
                    .build(),
            }
        })
    }

    /// The first [`KEY_PREFIX_LEN`] characters of `key` (a key is ASCII hex; anything else
    /// is cut at a character boundary, never split).
    fn key_prefix(key: &str) -> &str {
        match key.char_indices().nth(KEY_PREFIX_LEN) {
            Some((end, _)) => &key[..end],
            None => key,
        }
    }

    /// One mutating call's telemetry: its span, and on drop its count and duration.
    pub(crate) struct CallTelemetry {
        tool: Value,
        started: Instant,
        span: tracing::Span,
        decision: Option<Decision>,
        error: Option<&'static str>,
        running: bool,
    }

    impl CallTelemetry {
        pub(crate) fn start(tool: Result<&'static str, &crate::Error>) -> Self {
            let tool: Value = match tool {
                Ok(name) => name.into(),
                Err(e) => match e {
                    crate::Error::DuplicateTool { name, .. } => name.clone().into(),
                    other => other.tool().unwrap_or("(unknown)").to_owned().into(),
                },
            };
            // Under the engine's target, beside its events.
            let span = tracing::info_span!(
                target: "tool_contracts_runtime::engine",
                "execute_tool",
                otel.name = %format_args!("execute_tool {}", tool.as_str()),
                gen_ai.operation.name = "execute_tool",
                gen_ai.tool.name = %tool.as_str(),
                tool_contracts.key.prefix = Empty,
                tool_contracts.outcome = Empty,
                error.type = Empty,
                otel.status_code = Empty,
            );
            Self {
                tool,
                started: Instant::now(),
                span,
                decision: None,
                error: None,
                running: false,
            }
        }

        pub(crate) fn span(&self) -> tracing::Span {
            self.span.clone()
        }

        pub(crate) fn key(&mut self, key: &str) {
            self.span.record(KEY_PREFIX, key_prefix(key));
        }

        pub(crate) fn running(&mut self) {
            self.running = true;
        }

        pub(crate) fn decided(&mut self, decision: Decision) {
            self.decision = Some(decision);
        }

        pub(crate) fn error(&mut self, code: &'static str) {
            self.error.get_or_insert(code);
        }
    }

    impl Drop for CallTelemetry {
        fn drop(&mut self) {
            // Dropped before a decision: the caller gave up on the call. If its body had
            // started, the key is left to run out into an unknown outcome.
            let (decision, error) = match self.decision {
                Some(decision) => (decision, self.error),
                None if self.running => (Decision::Unknown, Some("cancelled")),
                None => (Decision::Rejected, Some("cancelled")),
            };
            self.span.record(OUTCOME, decision.as_str());
            if let Some(error) = error {
                self.span.record(ERROR_TYPE, error);
                self.span.record("otel.status_code", "ERROR");
            }
            record_call(self.tool.clone(), decision, error, self.started);
        }
    }

    /// Counts one call in [`CALLS`] and [`CALL_DURATION`].
    fn record_call(tool: Value, decision: Decision, error: Option<&'static str>, started: Instant) {
        let seconds = started.elapsed().as_secs_f64();
        let tool = KeyValue::new(TOOL_NAME, tool);
        let outcome = KeyValue::new(OUTCOME, decision.as_str());
        let instruments = instruments();
        let record = |attributes: &[KeyValue]| {
            instruments.calls.add(1, attributes);
            instruments.call_duration.record(seconds, attributes);
        };
        match error {
            Some(error) => record(&[tool, outcome, KeyValue::new(ERROR_TYPE, error)]),
            None => record(&[tool, outcome]),
        }
    }

    /// A registry call of a mutating tool, for the refusals that happen before the engine
    /// (arguments that do not decode, a missing context value): counted as `rejected`.
    pub(crate) struct RegistryCall {
        tool: &'static str,
        started: Instant,
    }

    impl RegistryCall {
        pub(crate) fn start(tool: &'static str) -> Self {
            Self {
                tool,
                started: Instant::now(),
            }
        }

        pub(crate) fn refused(self, code: &'static str) {
            record_call(
                self.tool.into(),
                Decision::Rejected,
                Some(code),
                self.started,
            );
        }
    }

    /// A run step's span.
    pub(crate) struct StepTelemetry {
        span: tracing::Span,
    }

    impl StepTelemetry {
        pub(crate) fn start(run: &str, step: &str) -> Self {
            Self {
                span: tracing::info_span!(
                    target: "tool_contracts_runtime::run",
                    "step",
                    otel.name = %format_args!("step {run}/{step}"),
                    tool_contracts.run.name = run,
                    tool_contracts.step.name = step,
                    tool_contracts.key.prefix = Empty,
                    tool_contracts.outcome = Empty,
                    error.type = Empty,
                    otel.status_code = Empty,
                ),
            }
        }

        pub(crate) fn span(&self) -> tracing::Span {
            self.span.clone()
        }

        pub(crate) fn key(&self, key: &str) {
            self.span.record(KEY_PREFIX, key_prefix(key));
        }

        pub(crate) fn ended(&self, decision: Decision, error: Option<&'static str>) {
            self.span.record(OUTCOME, decision.as_str());
            if let Some(error) = error {
                self.span.record(ERROR_TYPE, error);
                self.span.record("otel.status_code", "ERROR");
            }
        }
    }

    /// Counts one lease in [`LEASES_HELD`] from its claim until dropped (a lease's
    /// complete, release and abandon consume it; a lease dropped without them counts too).
    pub(crate) struct LeaseHeld {
        /// `None` for the heartbeat's copy of a lease, which is not a lease of its own.
        name: Option<KeyValue>,
    }

    impl LeaseHeld {
        pub(crate) fn new(name: &str) -> Self {
            // Shared, so the decrement reuses the increment's attribute without a copy.
            let name = KeyValue::new(LEASE_NAME, Arc::<str>::from(name));
            instruments()
                .leases_held
                .add(1, core::slice::from_ref(&name));
            Self { name: Some(name) }
        }

        pub(crate) fn none() -> Self {
            Self { name: None }
        }
    }

    impl Drop for LeaseHeld {
        fn drop(&mut self) {
            if let Some(name) = &self.name {
                instruments()
                    .leases_held
                    .add(-1, core::slice::from_ref(name));
            }
        }
    }

    /// A store whose every operation (but [`Store::wait`], which waits for another worker,
    /// not for the backend) is timed in [`STORE_DURATION`].
    pub(crate) struct Measured<S> {
        inner: S,
    }

    pub(crate) fn measured<S: Store>(store: S) -> Arc<dyn Store> {
        Arc::new(Measured { inner: store })
    }

    fn error_type(e: &StoreError) -> &'static str {
        match e {
            StoreError::LeaseLost { .. } => "lease_lost",
            StoreError::Unavailable(_) => "unavailable",
            StoreError::NotPending => "not_pending",
            StoreError::Corrupt(_) => "corrupt",
        }
    }

    impl<S: Store> Measured<S> {
        async fn timed<T>(
            &self,
            operation: &'static str,
            call: impl core::future::Future<Output = StoreResult<T>>,
        ) -> StoreResult<T> {
            let started = Instant::now();
            let out = call.await;
            let seconds = started.elapsed().as_secs_f64();
            let operation = KeyValue::new(STORE_OPERATION, operation);
            let backend = KeyValue::new(STORE_BACKEND, self.inner.backend());
            let histogram = &instruments().store_duration;
            match &out {
                Ok(_) => histogram.record(seconds, &[operation, backend]),
                Err(e) => histogram.record(
                    seconds,
                    &[operation, backend, KeyValue::new(ERROR_TYPE, error_type(e))],
                ),
            }
            out
        }
    }

    #[async_trait::async_trait]
    impl<S: Store> Store for Measured<S> {
        async fn claim(&self, req: ClaimRequest<'_>) -> StoreResult<ClaimOutcome> {
            self.timed("claim", self.inner.claim(req)).await
        }
        async fn takeover(
            &self,
            req: ClaimRequest<'_>,
            stale_token: u64,
        ) -> StoreResult<ClaimOutcome> {
            self.timed("takeover", self.inner.takeover(req, stale_token))
                .await
        }
        async fn complete(&self, key: &str, token: u64, completion: Completion<'_>) -> StoreResult {
            self.timed("complete", self.inner.complete(key, token, completion))
                .await
        }
        async fn release(&self, key: &str, token: u64) -> StoreResult {
            self.timed("release", self.inner.release(key, token)).await
        }
        async fn renew(&self, key: &str, token: u64, lease: Duration) -> StoreResult {
            self.timed("renew", self.inner.renew(key, token, lease))
                .await
        }
        async fn abandon(&self, key: &str, token: u64) -> StoreResult {
            self.timed("abandon", self.inner.abandon(key, token)).await
        }
        async fn lookup(&self, key: &str) -> StoreResult<Option<Record>> {
            self.timed("lookup", self.inner.lookup(key)).await
        }
        async fn observe(&self, key: &str) -> StoreResult<Option<Observed>> {
            self.timed("observe", self.inner.observe(key)).await
        }
        async fn pending(&self, limit: usize) -> StoreResult<Vec<Record>> {
            self.timed("pending", self.inner.pending(limit)).await
        }
        async fn resolve(&self, request: ResolveRequest<'_>) -> StoreResult {
            self.timed("resolve", self.inner.resolve(request)).await
        }
        async fn history(&self, key: &str) -> StoreResult<Vec<HistoryEvent>> {
            self.timed("history", self.inner.history(key)).await
        }
        async fn purge_expired(&self) -> StoreResult<u64> {
            self.timed("purge_expired", self.inner.purge_expired())
                .await
        }
        async fn wait(&self, key: &str, timeout: Duration) {
            self.inner.wait(key, timeout).await
        }
        /// Timed as a `claim` when it answers: it stands for the claim it saves, so a
        /// replay counts one claim whether or not the store answered from memory.
        fn completed_now(&self, key: &str, scope: Option<&str>) -> Option<Arc<Record>> {
            let started = Instant::now();
            let record = self.inner.completed_now(key, scope)?;
            let seconds = started.elapsed().as_secs_f64();
            instruments().store_duration.record(
                seconds,
                &[
                    KeyValue::new(STORE_OPERATION, "claim"),
                    KeyValue::new(STORE_BACKEND, self.inner.backend()),
                ],
            );
            Some(record)
        }
        fn backend(&self) -> &'static str {
            self.inner.backend()
        }
    }

    #[cfg(test)]
    mod tests {
        use super::key_prefix;

        #[test]
        fn a_key_prefix_is_cut_at_a_character_boundary() {
            let key = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
            assert_eq!(key_prefix(key), "0123456789ab");
            assert_eq!(key_prefix("short"), "short");
            assert_eq!(key_prefix("ééééééééééééé"), "éééééééééééé");
        }
    }
}
