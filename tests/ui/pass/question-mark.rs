//! `?` inside the body converts into the tool's error type.
#![deny(warnings)]

use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
    #[error(transparent)]
    Parse(#[from] std::num::ParseIntError),
}

async fn lookup(id: &str) -> Result<u64, ShopError> {
    Ok(id.parse::<u64>()?)
}

#[mutating_tool(idempotency_key_fields = [order_id])]
pub async fn pay(order_id: String, amount: String) -> Result<u64, ShopError> {
    let id = lookup(&order_id).await?;
    let amount: u64 = amount.parse()?;
    Ok(id + amount)
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        assert_eq!(pay("4".into(), "6".into()).await.unwrap(), 10);
        assert!(matches!(
            pay("x".into(), "1".into()).await,
            Err(ShopError::Parse(_))
        ));
    });
}
