//! What the engine, the lease layer, runs and the registry tell OpenTelemetry: one interface, two
//! implementations. With the `otel` feature it is `crate::otel`'s; without it every type
//! here is zero-sized and every method an empty inline function, so the instrumented code
//! compiles to what it was before (no clock read, no allocation, no span).

use core::future::Future;

/// How a mutating call (or a step) ended, as the `tool_contracts.outcome` attribute says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// The body ran (whatever it returned).
    Executed,
    /// A stored result (or stored error) was returned; nothing ran.
    Replayed,
    /// `verify` found the effect of an abandoned call; the body did not run.
    Reconciled,
    /// Refused before anything ran, and nothing was left unknown.
    Rejected,
    /// The call ended with the key's outcome unknown (abandoned).
    Unknown,
}

impl Decision {
    #[cfg_attr(not(feature = "otel"), allow(dead_code))]
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Decision::Executed => "executed",
            Decision::Replayed => "replayed",
            Decision::Reconciled => "reconciled",
            Decision::Rejected => "rejected",
            Decision::Unknown => "unknown",
        }
    }
}

/// `error.type` of the tool's own `Err` (returned, replayed or from `verify`).
pub(crate) const TOOL_ERROR: &str = "tool_error";

#[cfg(feature = "otel")]
pub(crate) use crate::otel::imp::{
    measured, CallTelemetry, LeaseHeld, RegistryCall, StepTelemetry,
};

/// Runs `future` inside `span` (the feature's spans are entered on every poll, so spans
/// and events inside the future are its children).
#[cfg(feature = "otel")]
pub(crate) fn instrument<F: Future>(
    span: tracing::Span,
    future: F,
) -> impl Future<Output = F::Output> {
    tracing::Instrument::instrument(future, span)
}

/// Runs `f` inside `span` (entered for its duration): the synchronous counterpart of
/// [`instrument`].
#[cfg(feature = "otel")]
pub(crate) fn in_span<R>(span: &tracing::Span, f: impl FnOnce() -> R) -> R {
    span.in_scope(f)
}

#[cfg(not(feature = "otel"))]
pub(crate) use off::{measured, CallTelemetry, LeaseHeld, RegistryCall, StepTelemetry};

/// `future` itself: no span without the feature.
#[cfg(not(feature = "otel"))]
#[inline(always)]
pub(crate) fn instrument<F: Future>(_: off::NoSpan, future: F) -> F {
    future
}

#[cfg(not(feature = "otel"))]
#[inline(always)]
pub(crate) fn in_span<R>(_: &off::NoSpan, f: impl FnOnce() -> R) -> R {
    f()
}

#[cfg(not(feature = "otel"))]
mod off {
    use std::sync::Arc;

    use super::Decision;
    use crate::store::Store;

    #[derive(Clone, Copy)]
    pub(crate) struct NoSpan;

    pub(crate) struct CallTelemetry;

    impl CallTelemetry {
        #[inline(always)]
        pub(crate) fn start(_: Result<&'static str, &crate::Error>) -> Self {
            CallTelemetry
        }
        #[inline(always)]
        pub(crate) fn span(&self) -> NoSpan {
            NoSpan
        }
        #[inline(always)]
        pub(crate) fn key(&mut self, _: &str) {}
        #[inline(always)]
        pub(crate) fn running(&mut self) {}
        #[inline(always)]
        pub(crate) fn decided(&mut self, _: Decision) {}
        #[inline(always)]
        pub(crate) fn error(&mut self, _: &'static str) {}
    }

    pub(crate) struct StepTelemetry;

    impl StepTelemetry {
        #[inline(always)]
        pub(crate) fn start(_: &str, _: &str) -> Self {
            StepTelemetry
        }
        #[inline(always)]
        pub(crate) fn span(&self) -> NoSpan {
            NoSpan
        }
        #[inline(always)]
        pub(crate) fn key(&self, _: &str) {}
        #[inline(always)]
        pub(crate) fn ended(&self, _: Decision, _: Option<&'static str>) {}
    }

    pub(crate) struct RegistryCall;

    impl RegistryCall {
        #[inline(always)]
        pub(crate) fn start(_: &'static str) -> Self {
            RegistryCall
        }
        #[inline(always)]
        pub(crate) fn refused(self, _: &'static str) {}
    }

    pub(crate) struct LeaseHeld;

    impl LeaseHeld {
        #[inline(always)]
        pub(crate) fn new(_: &str) -> Self {
            LeaseHeld
        }
        #[inline(always)]
        pub(crate) fn none() -> Self {
            LeaseHeld
        }
    }

    #[inline(always)]
    pub(crate) fn measured<S: Store>(store: S) -> Arc<dyn Store> {
        Arc::new(store)
    }
}
