//! A key field whose name says time, which the caller chose and sends unchanged on every
//! retry (the slot of a booking), marked `#[intent]`.
use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum BookingError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

#[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Slot {
    pub room: String,
    pub starts_at: String,
}

#[mutating_tool(idempotency_key_fields = [user_id, slot.room, #[intent] slot.starts_at])]
pub async fn book(user_id: u64, slot: Slot) -> Result<String, BookingError> {
    Ok(format!("{user_id} booked {} at {}", slot.room, slot.starts_at))
}

#[mutating_tool(idempotency_key_fields = [#[intent] delivery_time])]
pub async fn schedule(delivery_time: String) -> Result<String, BookingError> {
    Ok(delivery_time)
}

fn main() {}
