//! Arbitrary JSON arguments never panic the argument decoder or a registry call: a call
//! either succeeds or fails with `Error::InvalidArguments`, and then nothing was claimed;
//! the same bytes given as text (`Registry::call_json`) get the same answer.
#![no_main]

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tool_contracts::__private::{decode_args, SourceLocation, ToolKind, ToolSpec};
use tool_contracts::{mutating_tool, registry, with_store, Error, MemoryStore, Secret};

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct Cart {
    pub id: String,
    pub items: Vec<Item>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct Item {
    pub sku: String,
    pub qty: u32,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Shipping {
    Standard,
    Express { days: u8 },
}

#[derive(Debug, thiserror::Error)]
pub enum FuzzError {
    #[error(transparent)]
    Contract(#[from] Error),
}

/// A tool with a few typed parameters, two of them key fields (`carts`: a map whose values
/// the members rule checks).
#[mutating_tool(idempotency_key_fields = [user_id, cart.id])]
pub async fn fuzz_order(
    user_id: u64,
    cart: Cart,
    amount: f64,
    shipping: Option<Shipping>,
    card: Secret<String>,
    meta: BTreeMap<String, i64>,
    carts: Option<BTreeMap<String, Cart>>,
) -> Result<String, FuzzError> {
    let _ = (amount, shipping, card, meta, carts);
    Ok(format!("{user_id}/{}", cart.id))
}

/// The same shapes decoded directly, with `deny_unknown_fields` like the generated struct.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct DirectArgs {
    user_id: u64,
    small: i8,
    cart: Cart,
    shipping: Option<Shipping>,
    tags: Vec<String>,
    card: Secret<String>,
    pair: (u16, bool),
}

static DIRECT: ToolSpec = ToolSpec {
    ttl: Duration::from_secs(60),
    ..ToolSpec::fixture(
        "direct",
        ToolKind::Mutating,
        &["user_id"],
        &[
            "user_id", "small", "cart", "shipping", "tags", "card", "pair",
        ],
        SourceLocation {
            module_path: "fuzz",
            file: "decode_args.rs",
            line: 1,
            column: 1,
        },
    )
};

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a tokio runtime")
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(args) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    match decode_args::<DirectArgs>(&DIRECT, &args) {
        Ok(_) | Err(Error::InvalidArguments { .. }) => {}
        Err(other) => panic!("decode_args: expected InvalidArguments, got {other:?}"),
    }

    let tool = registry()
        .get("fuzz_order")
        .expect("fuzz_order is registered");
    let key = tool.key(&args);
    let store = Arc::new(MemoryStore::new());
    let result = runtime().block_on(with_store(
        Arc::clone(&store),
        registry().call("fuzz_order", args.clone()),
    ));
    match &result {
        Ok(out) => {
            assert_eq!(out.outcome, tool_contracts::Outcome::Executed);
            assert_eq!(
                key.as_ref().ok().and_then(|k| k.as_deref()),
                out.key.as_deref(),
                "key() and call() disagree for {args}"
            );
            assert_eq!(store.len(), 1);
        }
        Err(Error::InvalidArguments { .. }) => {
            assert!(store.is_empty(), "invalid arguments claimed a key: {args}");
        }
        Err(other) => panic!("call: expected Ok or InvalidArguments, got {other:?} for {args}"),
    }
    if let Err(e) = key {
        assert!(matches!(e, Error::InvalidArguments { .. }), "key(): {e:?}");
    }

    // The same bytes as JSON text (`call_json`, no `Value` built when its one-pass checks
    // pass): the same answer, result or error, as the parsed `Value` gave.
    if let Ok(text) = std::str::from_utf8(data) {
        let store = Arc::new(MemoryStore::new());
        let from_text = runtime().block_on(with_store(
            Arc::clone(&store),
            registry().call_json("fuzz_order", text),
        ));
        let from_text = from_text.map(|out| {
            let value: Value = serde_json::from_str(&out.value).expect("call_json's result is JSON");
            (value, out.key, out.outcome)
        });
        let from_value = result.map(|out| (out.value, out.key, out.outcome));
        assert_eq!(from_text, from_value, "call_json and call disagree for {text}");
    }
});
