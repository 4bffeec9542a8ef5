//! The `otel` feature, seen through the OpenTelemetry SDK's in-memory exporters (the real
//! SDK and the real tracing-opentelemetry layer, as an application installs them): every
//! dedup decision is counted once under the right outcome, latency and store round trips
//! are measured, leases held return to zero, and spans carry the tool, the outcome and a
//! key prefix, never an argument value nor the whole key.
//!
//! One test: the meter provider and the tracing subscriber are process-wide, and the
//! figures below are exact.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use opentelemetry::trace::{Status, TracerProvider as _};
use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, Metric, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde_json::json;
use tool_contracts::otel;
use tool_contracts::{mutating_tool, registry, with_store, Error, MemoryStore, Outcome, Run};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Argument values that must never reach any exported attribute.
const CARD: &str = "4111-0000-otel-card-never-exported";
const ADDRESS: &str = "12 Secret Lane, never-exported";

#[derive(Debug, thiserror::Error)]
pub enum PayError {
    #[error(transparent)]
    Contract(#[from] Error),
    #[error("the carrier did not answer in time")]
    Timeout,
}

impl PayError {
    fn is_timeout(&self) -> bool {
        matches!(self, PayError::Timeout)
    }
}

struct Exporters {
    meters: SdkMeterProvider,
    metrics: InMemoryMetricExporter,
    spans: InMemorySpanExporter,
}

/// The SDK, installed once as an application would: a global meter provider with a
/// periodic reader (flushed by hand here) and a subscriber with the tracing-opentelemetry
/// layer at every level.
fn exporters() -> &'static Exporters {
    static EXPORTERS: OnceLock<Exporters> = OnceLock::new();
    EXPORTERS.get_or_init(|| {
        let metrics = InMemoryMetricExporter::default();
        let meters = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(metrics.clone()).build())
            .build();
        opentelemetry::global::set_meter_provider(meters.clone());
        let spans = InMemorySpanExporter::default();
        let tracers = SdkTracerProvider::builder()
            .with_simple_exporter(spans.clone())
            .build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(tracers.tracer("otel-test")));
        subscriber.try_init().expect("the only subscriber");
        Exporters {
            meters,
            metrics,
            spans,
        }
    })
}

/// The metrics as of now (the exporter is cumulative: the last export holds everything).
fn collect() -> ResourceMetrics {
    let exporters = exporters();
    exporters.meters.force_flush().expect("flush");
    exporters
        .metrics
        .get_finished_metrics()
        .expect("metrics")
        .pop()
        .expect("one export")
}

fn metric<'a>(metrics: &'a ResourceMetrics, name: &str) -> &'a Metric {
    metrics
        .scope_metrics()
        .filter(|scope| scope.scope().name() == otel::SCOPE)
        .flat_map(|scope| scope.metrics())
        .find(|m| m.name() == name)
        .unwrap_or_else(|| panic!("no metric {name}"))
}

type Attributes = BTreeMap<String, String>;

fn attributes<'a>(kvs: impl Iterator<Item = &'a KeyValue>) -> Attributes {
    kvs.map(|kv| (kv.key.to_string(), kv.value.to_string()))
        .collect()
}

/// Each data point's attributes with `value` (a sum's value, a histogram's count).
fn points(metric: &Metric) -> Vec<(Attributes, i64)> {
    match metric.data() {
        AggregatedMetrics::U64(MetricData::Sum(sum)) => sum
            .data_points()
            .map(|p| (attributes(p.attributes()), p.value() as i64))
            .collect(),
        AggregatedMetrics::I64(MetricData::Sum(sum)) => sum
            .data_points()
            .map(|p| (attributes(p.attributes()), p.value()))
            .collect(),
        AggregatedMetrics::F64(MetricData::Histogram(h)) => h
            .data_points()
            .map(|p| (attributes(p.attributes()), p.count() as i64))
            .collect(),
        other => panic!("{}: unexpected data {other:?}", metric.name()),
    }
}

/// The calls of `tool` by (outcome, error.type), from the counter or the histogram.
fn by_outcome(metric: &Metric, tool: &str) -> BTreeMap<(String, String), i64> {
    points(metric)
        .into_iter()
        .filter(|(a, _)| a.get(otel::TOOL_NAME).map(String::as_str) == Some(tool))
        .map(|(a, n)| {
            let outcome = a[otel::OUTCOME].clone();
            let error = a.get(otel::ERROR_TYPE).cloned().unwrap_or_default();
            ((outcome, error), n)
        })
        .collect()
}

fn expected(entries: &[(&str, &str, i64)]) -> BTreeMap<(String, String), i64> {
    entries
        .iter()
        .map(|(o, e, n)| ((o.to_string(), e.to_string()), *n))
        .collect()
}

fn leases_held(metrics: &ResourceMetrics, name: &str) -> Option<i64> {
    points(metric(metrics, otel::LEASES_HELD))
        .into_iter()
        .find(|(a, _)| a.get(otel::LEASE_NAME).map(String::as_str) == Some(name))
        .map(|(_, n)| n)
}

/// What the lease gauge said while `otel_charge`'s body ran.
static HELD_DURING_BODY: Mutex<Option<i64>> = Mutex::new(None);

/// Charges a card once per order.
#[mutating_tool(idempotency_key_fields = [order_id])]
pub async fn otel_charge(order_id: u64, card: String) -> Result<String, PayError> {
    // Reads the metrics from inside the body: a blocking flush, on a multi-thread runtime.
    let held = leases_held(&collect(), "otel_charge");
    *HELD_DURING_BODY.lock().unwrap() = held;
    Ok(format!("charged order {order_id} ({} digits)", card.len()))
}

static SHIP_RUNS: AtomicUsize = AtomicUsize::new(0);

/// The carrier takes the parcel, then the answer times out: the outcome is unknown until
/// `verify` finds the shipment.
#[mutating_tool(
    idempotency_key_fields = [parcel],
    verify = otel_ship_verify,
    unknown_outcome_if = PayError::is_timeout,
)]
pub async fn otel_ship(parcel: u64, address: String) -> Result<String, PayError> {
    SHIP_RUNS.fetch_add(1, SeqCst);
    let _ = address;
    Err(PayError::Timeout)
}

pub async fn otel_ship_verify(parcel: &u64, _address: &str) -> Result<Option<String>, PayError> {
    Ok(Some(format!("parcel {parcel} shipped")))
}

/// Never answers: its caller gives up.
#[mutating_tool(idempotency_key_fields = [job])]
pub async fn otel_hang(job: u64, note: String) -> Result<u64, PayError> {
    let _ = note;
    std::future::pending::<()>().await;
    Ok(job)
}

fn spans_named(spans: &[SpanData], name: &str) -> Vec<Attributes> {
    spans
        .iter()
        .filter(|s| s.name == name)
        .map(|s| attributes(s.attributes.iter()))
        .collect()
}

fn every_exported_text(spans: &[SpanData], metrics: &ResourceMetrics) -> Vec<String> {
    let mut texts = Vec::new();
    let mut kv = |kv: &KeyValue| texts.push(format!("{}={}", kv.key, kv.value));
    for span in spans {
        span.attributes.iter().for_each(&mut kv);
        for event in span.events.iter() {
            kv(&KeyValue::new(
                "event.name",
                Value::from(event.name.to_string()),
            ));
            event.attributes.iter().for_each(&mut kv);
        }
    }
    for scope in metrics.scope_metrics() {
        for m in scope.metrics() {
            for (attrs, _) in points(m) {
                texts.extend(attrs.into_iter().map(|(k, v)| format!("{k}={v}")));
            }
        }
    }
    texts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_decision_is_counted_timed_and_traced_without_argument_values() {
    let exporters = exporters();
    let charge = json!({"order_id": 7, "card": CARD});
    let (keys, outcomes) = with_store(MemoryStore::new(), async {
        let registry = registry();
        let mut keys = Vec::new();
        let mut outcomes = Vec::new();
        // One executed, two replayed.
        for _ in 0..3 {
            let out = registry.call("otel_charge", charge.clone()).await.unwrap();
            keys.push(out.key.clone().unwrap());
            outcomes.push(out.outcome);
        }
        // The same order with another card: rejected, nothing ran.
        let reused = registry
            .call(
                "otel_charge",
                json!({"order_id": 7, "card": "another card"}),
            )
            .await
            .unwrap_err();
        assert!(matches!(reused, Error::KeyReused { .. }), "{reused}");
        // Arguments that do not decode: refused by the registry before the engine.
        let malformed = registry
            .call("otel_charge", json!({"order_id": "seven", "card": CARD}))
            .await
            .unwrap_err();
        assert!(
            matches!(malformed, Error::InvalidArguments { .. }),
            "{malformed}"
        );

        // The shipment's outcome is unknown, then reconciled by `verify`.
        let ship = json!({"parcel": 3, "address": ADDRESS});
        let unknown = registry.call("otel_ship", ship.clone()).await.unwrap_err();
        assert!(matches!(unknown, Error::ToolFailed { .. }), "{unknown}");
        let out = registry.call("otel_ship", ship).await.unwrap();
        outcomes.push(out.outcome);
        assert_eq!(out.value, "parcel 3 shipped");

        // A caller that gives up mid-body: its lease is dropped with the call.
        let hung =
            tokio::time::timeout(Duration::from_millis(50), otel_hang(1, ADDRESS.to_owned())).await;
        assert!(hung.is_err(), "the call was dropped mid-body");

        // A run and its step.
        let run = Run::start("otel_run", &json!({"cart": 9})).await.unwrap();
        let reserved: Result<u32, Error> = run.step("reserve", || async { Ok(2) }).await;
        assert_eq!(reserved.unwrap(), 2);
        run.finish(&"done").await.unwrap();
        (keys, outcomes)
    })
    .await;
    assert_eq!(
        outcomes,
        [
            Outcome::Executed,
            Outcome::Replayed,
            Outcome::Replayed,
            Outcome::Reconciled
        ]
    );
    assert_eq!(SHIP_RUNS.load(SeqCst), 1, "verify, not a second run");
    let key = &keys[0];
    assert!(keys.iter().all(|k| k == key));

    let metrics = collect();

    // The counter, per tool and outcome.
    let calls = metric(&metrics, otel::CALLS);
    assert_eq!(calls.unit(), "{call}");
    assert_eq!(
        by_outcome(calls, "otel_charge"),
        expected(&[
            ("executed", "", 1),
            ("replayed", "", 2),
            ("rejected", "key_reused", 1),
            ("rejected", "invalid_arguments", 1)
        ])
    );
    assert_eq!(
        by_outcome(calls, "otel_ship"),
        expected(&[("unknown", "tool_error", 1), ("reconciled", "", 1)])
    );
    assert_eq!(
        by_outcome(calls, "otel_hang"),
        expected(&[("unknown", "cancelled", 1)])
    );

    // The latency histogram: one observation per call, under the same attributes.
    let duration = metric(&metrics, otel::CALL_DURATION);
    assert_eq!(duration.unit(), "s");
    for tool in ["otel_charge", "otel_ship", "otel_hang"] {
        assert_eq!(
            by_outcome(duration, tool),
            by_outcome(calls, tool),
            "{tool}"
        );
    }

    // Store round trips, per operation, all on the memory store: 4 + 2 + 1 claims, the
    // takeover by `verify`, the charge and the reconciled shipment completed, the
    // shipment's unknown outcome abandoned; run, step and journal position on top.
    let store = metric(&metrics, otel::STORE_DURATION);
    assert_eq!(store.unit(), "s");
    let mut by_operation: BTreeMap<String, i64> = BTreeMap::new();
    for (attrs, count) in points(store) {
        assert_eq!(attrs[otel::STORE_BACKEND], "memory", "{attrs:?}");
        assert!(!attrs.contains_key(otel::ERROR_TYPE), "{attrs:?}");
        *by_operation
            .entry(attrs[otel::STORE_OPERATION].clone())
            .or_default() += count;
    }
    let (run_claims, run_completes) = (3, 3); // the run, its step, the step's journal position
    assert_eq!(by_operation["claim"], 7 + run_claims, "{by_operation:?}");
    assert_eq!(by_operation["takeover"], 1, "{by_operation:?}");
    assert_eq!(
        by_operation["complete"],
        2 + run_completes,
        "{by_operation:?}"
    );
    assert_eq!(by_operation["abandon"], 1, "{by_operation:?}");

    // Leases: one held while the charge ran, none once everything ended (the hung call's
    // lease included, dropped with its call).
    assert_eq!(*HELD_DURING_BODY.lock().unwrap(), Some(1));
    for name in [
        "otel_charge",
        "otel_ship",
        "otel_hang",
        "otel_run",
        "otel_run/reserve",
    ] {
        assert_eq!(leases_held(&metrics, name), Some(0), "{name}");
    }
    assert_eq!(metric(&metrics, otel::LEASES_HELD).unit(), "{lease}");

    // Spans: one per call, with the tool, the outcome and a key prefix.
    let spans = exporters.spans.get_finished_spans().unwrap();
    let charges = spans_named(&spans, "execute_tool otel_charge");
    let outcomes: Vec<&str> = charges.iter().map(|a| a[otel::OUTCOME].as_str()).collect();
    assert_eq!(outcomes, ["executed", "replayed", "replayed", "rejected"]);
    for attrs in &charges {
        assert_eq!(attrs[otel::TOOL_NAME], "otel_charge");
        assert_eq!(attrs["gen_ai.operation.name"], "execute_tool");
        assert_eq!(attrs[otel::KEY_PREFIX], key[..otel::KEY_PREFIX_LEN]);
        assert!(
            attrs.values().all(|v| !v.contains(key.as_str())),
            "the whole key is not a span attribute: {attrs:?}"
        );
    }
    assert_eq!(charges[3][otel::ERROR_TYPE], "key_reused");
    let rejected = spans
        .iter()
        .filter(|s| s.name == "execute_tool otel_charge")
        .nth(3)
        .unwrap();
    assert!(matches!(rejected.status, Status::Error { .. }));
    let ships: Vec<(String, Option<String>)> = spans_named(&spans, "execute_tool otel_ship")
        .into_iter()
        .map(|a| (a[otel::OUTCOME].clone(), a.get(otel::ERROR_TYPE).cloned()))
        .collect();
    assert_eq!(
        ships,
        [
            ("unknown".to_owned(), Some("tool_error".to_owned())),
            ("reconciled".to_owned(), None)
        ]
    );
    let hung = spans_named(&spans, "execute_tool otel_hang");
    assert_eq!(hung.len(), 1);
    assert_eq!(hung[0][otel::OUTCOME], "unknown");
    assert_eq!(hung[0][otel::ERROR_TYPE], "cancelled");
    let steps = spans_named(&spans, "step otel_run/reserve");
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0][otel::OUTCOME], "executed");
    assert_eq!(steps[0][otel::RUN_NAME], "otel_run");
    assert_eq!(steps[0][otel::KEY_PREFIX].len(), otel::KEY_PREFIX_LEN);

    // No argument value anywhere: span attributes, span events (the engine's log events,
    // at every level) and metric attributes.
    let texts = every_exported_text(&spans, &metrics);
    assert!(
        texts.len() > 50,
        "the check sees what was exported: {texts:?}"
    );
    for secret in [CARD, ADDRESS, "another card"] {
        let leaked: Vec<&String> = texts.iter().filter(|t| t.contains(secret)).collect();
        assert!(leaked.is_empty(), "{secret:?} exported: {leaked:?}");
    }
}
