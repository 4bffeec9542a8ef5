//! Key fields reach into parameters (`cart.owner.id`, tuple fields `pair.0`);
//! `spec.key_fields` is in JCS order whatever the attribute's order.
#![deny(warnings)]

use tool_contracts::mutating_tool;
use tool_contracts::schemars::JsonSchema;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

#[derive(serde::Serialize, serde::Deserialize, JsonSchema)]
#[schemars(crate = "tool_contracts::schemars")]
pub struct Owner {
    pub id: u64,
    pub name: String,
}

#[derive(serde::Serialize, serde::Deserialize, JsonSchema)]
#[schemars(crate = "tool_contracts::schemars")]
pub struct Cart {
    pub id: String,
    pub owner: Owner,
    pub items: Vec<String>,
}

#[mutating_tool(idempotency_key_fields = [pair.1, cart.owner.id, cart.id, pair.0])]
pub async fn create_order(cart: Cart, pair: (u8, u8), note: String) -> Result<usize, ShopError> {
    Ok(cart.items.len() + usize::from(pair.0) + note.len())
}

fn main() {
    let tool = tool_contracts::registry().get("create_order").unwrap();
    assert_eq!(
        tool.idempotency_key_fields(),
        ["cart.id", "cart.owner.id", "pair.0", "pair.1"]
    );
    let args = |name: &str, note: &str| {
        serde_json::json!({
            "cart": { "id": "c1", "owner": { "id": 5, "name": name }, "items": [] },
            "pair": [1, 2],
            "note": note,
        })
    };
    // Only key fields make the key: another owner name or note, same key.
    let a = tool.key(&args("ann", "x")).unwrap().unwrap();
    let b = tool.key(&args("bob", "y")).unwrap().unwrap();
    assert_eq!(a, b);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let cart = Cart {
            id: "c1".into(),
            owner: Owner {
                id: 5,
                name: "ann".into(),
            },
            items: vec!["x".into()],
        };
        assert_eq!(create_order(cart, (1, 2), "n".into()).await.unwrap(), 3);
    });
}
