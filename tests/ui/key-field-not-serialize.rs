use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

#[derive(Default)]
pub struct Opaque(pub u64);

#[derive(serde::Serialize, serde::Deserialize, tool_contracts::schemars::JsonSchema)]
#[schemars(crate = "tool_contracts::schemars")]
pub struct Cart {
    // Not part of the JSON, so `Cart` derives fine; but a key field must be
    // `Serialize`, and the error points at it in the attribute.
    #[serde(skip)]
    #[schemars(skip)]
    pub id: Opaque,
    pub items: Vec<String>,
}

#[mutating_tool(idempotency_key_fields = [cart.id])]
pub async fn create_order(cart: Cart) -> Result<usize, ShopError> {
    Ok(cart.items.len() + cart.id.0 as usize)
}

fn main() {}
