//! OpenTelemetry from a few tool calls, printed to stdout: the application installs the
//! SDK (a meter provider and the tracing-opentelemetry layer), tool-contracts reports
//! through the `opentelemetry` API and `tracing`. Swap the stdout exporters for OTLP ones
//! to send the same data to a collector.
//!
//! Run: `cargo run -p tool-contracts-tests --example otel_stdout` (it builds in the tests
//! package, whose dev-dependencies hold the exporters, so the demo never compiles them)
//!
//! It prints one `execute_tool place_order` span per call (executed, replayed, rejected),
//! then the metrics: `tool_contracts.calls`, `tool_contracts.call.duration`,
//! `tool_contracts.store.duration` and `tool_contracts.leases.held`
//! (docs/observability.md describes each).

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde_json::json;
use tool_contracts::{mutating_tool, registry, set_default_store, MemoryStore};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Contract(#[from] tool_contracts::Error),
}

/// Places an order; the card never reaches a span or a metric.
#[mutating_tool(idempotency_key_fields = [order_id])]
pub async fn place_order(order_id: u64, card: String) -> Result<String, ShopError> {
    let _ = card;
    Ok(format!("order {order_id} placed"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Before the first call: tool-contracts takes its instruments from the global
    // provider the first time it needs them.
    let meters = SdkMeterProvider::builder()
        .with_reader(
            PeriodicReader::builder(opentelemetry_stdout::MetricExporter::default()).build(),
        )
        .build();
    opentelemetry::global::set_meter_provider(meters.clone());
    let tracers = SdkTracerProvider::builder()
        .with_simple_exporter(opentelemetry_stdout::SpanExporter::default())
        .build();
    tracing_subscriber::registry()
        .with(
            tracing_opentelemetry::layer()
                .with_tracer(tracers.tracer("otel_stdout"))
                .with_filter(LevelFilter::INFO),
        )
        .try_init()?;
    set_default_store(MemoryStore::new());

    let registry = registry();
    let order = json!({"order_id": 42, "card": "4111 1111 1111 1111"});
    let first = registry.call("place_order", order.clone()).await?;
    let retry = registry.call("place_order", order).await?;
    let reused = registry
        .call(
            "place_order",
            json!({"order_id": 42, "card": "another card"}),
        )
        .await;
    eprintln!(
        "calls: {} then {}, then another card: {}",
        first.outcome,
        retry.outcome,
        reused
            .err()
            .map_or("accepted".to_owned(), |e| e.code().to_owned()),
    );

    // Export what is left and stop: spans as they end, metrics now.
    tracers.shutdown()?;
    meters.shutdown()?;
    Ok(())
}
