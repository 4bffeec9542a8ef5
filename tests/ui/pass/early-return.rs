//! `return` inside the body returns from the tool (typed by the signature), and
//! closures inside the body keep their own `return`.
#![deny(warnings)]

use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
    #[error("empty cart")]
    Empty,
}

#[mutating_tool(idempotency_key_fields = [cart_id])]
pub async fn checkout(cart_id: u64, items: Vec<u64>) -> Result<u64, ShopError> {
    if items.is_empty() {
        return Err(ShopError::Empty);
    }
    let double = |x: u64| -> u64 {
        if x == 0 {
            return 0;
        }
        x * 2
    };
    if cart_id == 0 {
        return Ok(0);
    }
    Ok(items.into_iter().map(double).sum())
}

#[mutating_tool(idempotency_key_fields = [cart_id])]
pub async fn always_returns(cart_id: u64) -> Result<u64, ShopError> {
    return Ok(cart_id);
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        assert!(matches!(checkout(1, vec![]).await, Err(ShopError::Empty)));
        assert_eq!(checkout(0, vec![1]).await.unwrap(), 0);
        assert_eq!(checkout(2, vec![1, 0, 3]).await.unwrap(), 8);
        assert_eq!(always_returns(9).await.unwrap(), 9);
    });
}
