//! Two tools with one name must never share results. Both are refused, naming both
//! source locations, before anything is claimed: methods (which the registry cannot
//! list) and free functions called directly (which never go through the registry).
//! Written against the commit that had the defect (`Paypal.refund` returned Stripe's
//! stored result and its body never ran) and seen failing there.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use tool_contracts::{mutating_tool, recover_once, try_registry, with_store, Error, MemoryStore};

#[derive(Debug, thiserror::Error)]
pub enum PayError {
    #[error(transparent)]
    Contract(#[from] Error),
}

static STRIPE_RUNS: AtomicUsize = AtomicUsize::new(0);
static PAYPAL_RUNS: AtomicUsize = AtomicUsize::new(0);

/// One payment provider.
pub struct Stripe;
/// Another.
pub struct Paypal;

impl Stripe {
    /// Refunds a payment at Stripe.
    #[mutating_tool(idempotency_key_fields = [payment_id])]
    pub async fn refund(&self, payment_id: String) -> Result<String, PayError> {
        STRIPE_RUNS.fetch_add(1, SeqCst);
        Ok(format!("stripe refunded {payment_id}"))
    }
}

impl Paypal {
    /// Refunds a payment at PayPal.
    #[mutating_tool(idempotency_key_fields = [payment_id])]
    pub async fn refund(&self, payment_id: String) -> Result<String, PayError> {
        PAYPAL_RUNS.fetch_add(1, SeqCst);
        Ok(format!("paypal refunded {payment_id}"))
    }
}

static CLOSE_RUNS: AtomicUsize = AtomicUsize::new(0);

mod billing {
    use super::*;

    /// Closes a billing account.
    #[mutating_tool(idempotency_key_fields = [id], verify = close_verify)]
    pub async fn close(id: String) -> Result<String, PayError> {
        CLOSE_RUNS.fetch_add(1, SeqCst);
        Ok(format!("billing account {id} closed"))
    }

    /// Billing's own check: would claim any `close` record as a closed account.
    pub async fn close_verify(id: &String) -> Result<Option<String>, PayError> {
        Ok(Some(format!("billing account {id} closed")))
    }
}

mod support {
    use super::*;

    /// Closes a support ticket.
    #[mutating_tool(idempotency_key_fields = [id])]
    pub async fn close(id: String) -> Result<String, PayError> {
        CLOSE_RUNS.fetch_add(1, SeqCst);
        Ok(format!("support ticket {id} closed"))
    }
}

fn assert_duplicate(result: Result<String, PayError>, name: &str) {
    match result {
        Err(PayError::Contract(Error::DuplicateTool {
            name: found,
            first,
            second,
        })) => {
            assert_eq!(found, name);
            assert!(first.file.ends_with("duplicate_names.rs"), "{first:?}");
            assert!(second.file.ends_with("duplicate_names.rs"), "{second:?}");
            assert_ne!(first.line, second.line, "both locations are named");
        }
        other => panic!("expected DuplicateTool for `{name}`, got {other:?}"),
    }
}

#[tokio::test]
async fn methods_sharing_a_name_never_share_a_result() {
    let store = std::sync::Arc::new(MemoryStore::new());
    with_store(store.clone(), async {
        let stripe = Stripe.refund("pay-1".to_owned()).await;
        let paypal = Paypal.refund("pay-1".to_owned()).await;
        // On the defective commit: stripe ran, paypal replayed "stripe refunded pay-1".
        assert_ne!(
            paypal.as_ref().ok(),
            Some(&"stripe refunded pay-1".to_owned()),
            "PayPal's call got Stripe's stored result"
        );
        assert_duplicate(stripe, "refund");
        assert_duplicate(paypal, "refund");
    })
    .await;
    assert_eq!(STRIPE_RUNS.load(SeqCst) + PAYPAL_RUNS.load(SeqCst), 0);
    assert!(store.is_empty(), "nothing was claimed for a refused call");
}

#[tokio::test]
async fn free_functions_sharing_a_name_called_directly_never_share_a_result() {
    let store = std::sync::Arc::new(MemoryStore::new());
    with_store(store.clone(), async {
        let billing = billing::close("42".to_owned()).await;
        let support = support::close("42".to_owned()).await;
        assert_ne!(
            support.as_ref().ok(),
            Some(&"billing account 42 closed".to_owned()),
            "the support ticket call got the billing call's stored result"
        );
        assert_duplicate(billing, "close");
        assert_duplicate(support, "close");
    })
    .await;
    assert_eq!(CLOSE_RUNS.load(SeqCst), 0);
    assert!(store.is_empty());
}

#[test]
fn the_registry_knows_methods_too() {
    // `close` is shared by two free functions; `refund` by two methods, which the registry
    // cannot list but must still refuse.
    match try_registry() {
        Err(Error::DuplicateTool { name, .. }) => assert!(name == "close" || name == "refund"),
        other => panic!("expected DuplicateTool, got {other:?}"),
    }
}

#[tokio::test]
async fn recovery_refuses_to_guess_between_tools_of_one_name() {
    use tool_contracts::store::{ClaimOutcome, ClaimRequest};
    use tool_contracts::Store;
    // A registry built by hand from the `close` that has a `verify`: a record of `close`
    // may be the support ticket's, so recovery must not let billing's `verify` settle it.
    let billing = tool_contracts::__private::inventory::iter::<tool_contracts::ToolDescriptor>
        .into_iter()
        .find(|t| t.name() == "close" && t.has_verify())
        .expect("billing::close is linked");
    let registry = tool_contracts::Registry::from_tools([billing]).expect("one tool");
    let store = std::sync::Arc::new(MemoryStore::new());
    let claimed = store
        .claim(ClaimRequest {
            key: "k-close-42",
            tool: "close",
            version: 1,
            scope: None,
            fingerprint: "a1:00",
            args: r#"{"id":"42"}"#,
            lease: std::time::Duration::from_millis(1),
            ttl: std::time::Duration::from_secs(60),
            worker: "a worker that died",
        })
        .await
        .unwrap();
    assert!(matches!(claimed, ClaimOutcome::Acquired { .. }));
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let report = with_store(store.clone(), recover_once(&registry))
        .await
        .expect("pass");
    assert!(report.completed.is_empty(), "{report:?}");
    assert_eq!(
        report.unresolved,
        vec!["k-close-42".to_owned()],
        "{report:?}"
    );
}
