//! The 4 KiB key field of `key_derivation` (and of `replay_profile key-4k`): a cart of 40
//! lines whose canonical JSON is about 4 KiB, its fields declared in Rust (unsorted) order.

use serde::Serialize;

/// One line of the cart.
#[derive(Serialize, Clone)]
pub struct Line {
    pub sku: String,
    pub qty: u32,
    pub price_cents: u64,
    pub note: String,
}

/// The cart.
#[derive(Serialize, Clone)]
pub struct Cart {
    pub id: String,
    pub currency: String,
    pub lines: Vec<Line>,
}

/// About 4 KiB of canonical JSON: 40 lines of ~100 bytes.
pub fn big_cart() -> Cart {
    Cart {
        id: "cart-8f14e45f".to_owned(),
        currency: "EUR".to_owned(),
        lines: (0..40)
            .map(|i| Line {
                sku: format!("SKU-{i:06}"),
                qty: i % 7 + 1,
                price_cents: 1999 + u64::from(i) * 13,
                note: format!("gift wrap, deliver after 6pm, line {i:02} ok"),
            })
            .collect(),
    }
}
