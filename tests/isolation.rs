//! Tenant isolation: a result stored under one scope is never returned under another,
//! whatever the arguments, and a client's own scope (nested inside its tenant's, as the MCP
//! server nests a client's intent key) can never reach another tenant's results.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::json;
use tool_contracts::{mutating_tool, registry, with_scope, with_store, Error, MemoryStore, Store};

#[derive(Debug, thiserror::Error)]
pub enum IsoError {
    #[error(transparent)]
    Contract(#[from] Error),
}

static SERIAL: AtomicU64 = AtomicU64::new(0);

/// Every run returns a fresh serial number, so a result identifies the run that made it.
#[mutating_tool(idempotency_key_fields = [account, order.id])]
pub async fn tenant_order(account: String, order: Order) -> Result<u64, IsoError> {
    let _ = (account, order);
    Ok(SERIAL.fetch_add(1, SeqCst))
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Order {
    pub id: serde_json::Value,
}

#[derive(Debug, Clone)]
struct Call {
    tenant: usize,
    /// A client scope nested inside the tenant's, possibly chosen to imitate another tenant.
    client: Option<String>,
    account: String,
    order_id: serde_json::Value,
}

fn order_id() -> impl Strategy<Value = serde_json::Value> {
    prop_oneof![
        (0u64..4).prop_map(|n| json!(n)),
        "[a-c]{1,2}".prop_map(|s| json!(s)),
        (0u64..3).prop_map(|n| json!([n])),
        Just(json!({"nested": "x"})),
        Just(json!(9_007_199_254_740_993u64)),
    ]
}

fn tenants() -> impl Strategy<Value = Vec<String>> {
    proptest::collection::vec("[a-zA-Z0-9:/_ü東-]{1,10}", 2..5)
}

fn calls(n_tenants: usize, names: Vec<String>) -> impl Strategy<Value = Vec<Call>> {
    let client = prop_oneof![
        3 => Just(None),
        1 => proptest::sample::select(names).prop_map(Some),
        1 => "[a-z]{1,4}".prop_map(Some),
    ];
    proptest::collection::vec(
        (0..n_tenants, client, "[a-b]{1,2}", order_id()).prop_map(
            |(tenant, client, account, order_id)| Call {
                tenant,
                client,
                account,
                order_id,
            },
        ),
        1..40,
    )
}

async fn run_case(tenants: &[String], calls: &[Call]) -> Result<(), TestCaseError> {
    let store = Arc::new(MemoryStore::new());
    // The scope each result was produced in, and what each (scope, args) call returned.
    let mut produced_in: HashMap<u64, String> = HashMap::new();
    let mut seen: HashMap<(String, String), u64> = HashMap::new();
    for (i, c) in calls.iter().enumerate() {
        let tenant = &tenants[c.tenant];
        let scope = match &c.client {
            Some(client) => format!("{tenant}\u{1f}{client}"),
            None => tenant.clone(),
        };
        let args = json!({"account": c.account, "order": {"id": c.order_id}});
        let call = registry().call("tenant_order", args.clone());
        let out = match &c.client {
            Some(client) => {
                with_store(
                    Arc::clone(&store),
                    with_scope(tenant.clone(), with_scope(client.clone(), call)),
                )
                .await
            }
            None => with_store(Arc::clone(&store), with_scope(tenant.clone(), call)).await,
        };
        let out = out.map_err(|e| TestCaseError::fail(format!("call {i} {c:?}: {e}")))?;
        let value = out
            .value
            .as_u64()
            .ok_or_else(|| TestCaseError::fail("not a serial"))?;
        let origin = produced_in.entry(value).or_insert_with(|| scope.clone());
        prop_assert_eq!(
            &*origin,
            &scope,
            "call {}: result {} made under scope {:?} was returned under {:?}",
            i,
            value,
            origin,
            scope
        );
        match seen.get(&(scope.clone(), args.to_string())) {
            Some(previous) => {
                prop_assert!(
                    out.outcome == tool_contracts::Outcome::Replayed,
                    "call {}: a retry in the same scope ran again",
                    i
                );
                prop_assert_eq!(*previous, value);
            }
            None => {
                prop_assert!(
                    out.outcome != tool_contracts::Outcome::Replayed,
                    "call {}: first call in scope {:?} was a replay",
                    i,
                    scope
                );
                seen.insert((scope.clone(), args.to_string()), value);
            }
        }
        let record = store
            .lookup(out.key.as_deref().unwrap_or_default())
            .await
            .map_err(|e| TestCaseError::fail(e.to_string()))?
            .ok_or_else(|| TestCaseError::fail("no record"))?;
        prop_assert_eq!(record.scope.as_deref(), Some(scope.as_str()));
    }
    Ok(())
}

#[test]
fn results_never_cross_tenants_whatever_the_arguments_or_client_scope() {
    let mut runner = TestRunner::new(Config {
        cases: 256,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = tenants()
        .prop_filter("distinct tenants", |t| {
            let mut d = t.clone();
            d.sort();
            d.dedup();
            d.len() == t.len()
        })
        .prop_flat_map(|t| {
            let n = t.len();
            (Just(t.clone()), calls(n, t))
        });
    let result = runner.run(&strategy, |(tenants, calls)| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        rt.block_on(run_case(&tenants, &calls))
    });
    if let Err(e) = result {
        panic!("isolation broken (minimal case):\n{e}");
    }
}

#[tokio::test]
async fn a_client_scope_cannot_spell_its_way_into_another_tenant() {
    let store = Arc::new(MemoryStore::new());
    let args = json!({"account": "acme", "order": {"id": 1}});
    let call = |args: serde_json::Value| registry().call("tenant_order", args);
    // Tenant "a", client "b" vs. the tenant literally named "a\u{1f}b" (refused) and vs.
    // tenant "a" with no client.
    let nested = with_store(
        Arc::clone(&store),
        with_scope("a", with_scope("b", call(args.clone()))),
    )
    .await
    .unwrap();
    let plain_a = with_store(Arc::clone(&store), with_scope("a", call(args.clone())))
        .await
        .unwrap();
    assert_ne!(nested.key, plain_a.key);
    assert_ne!(nested.value, plain_a.value);
    let forged = with_store(
        Arc::clone(&store),
        with_scope("a\u{1f}b", call(args.clone())),
    )
    .await
    .unwrap_err();
    assert!(matches!(forged, Error::InvalidArguments { .. }), "{forged}");
    // A client of tenant "b" naming itself "a" lands in "b/a", never in "a".
    let imitation = with_store(
        Arc::clone(&store),
        with_scope("b", with_scope("a", call(args.clone()))),
    )
    .await
    .unwrap();
    assert_ne!(imitation.outcome, tool_contracts::Outcome::Replayed);
    assert_ne!(imitation.value, plain_a.value);
    assert_ne!(imitation.value, nested.value);
    // The unscoped call is a scope of its own too.
    let unscoped = with_store(Arc::clone(&store), call(args.clone()))
        .await
        .unwrap();
    assert_ne!(unscoped.outcome, tool_contracts::Outcome::Replayed);
    assert_eq!(store.len(), 4);
}
