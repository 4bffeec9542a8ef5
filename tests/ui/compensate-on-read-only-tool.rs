use tool_contracts::{read_only_tool, UndoContext};

#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error("not found")]
    NotFound,
}

// A read changes nothing, so there is nothing to undo.
#[read_only_tool(compensate = forget_lookup)]
pub async fn get_order(order_id: u64) -> Result<String, LookupError> {
    Ok(order_id.to_string())
}

pub async fn forget_lookup(_order_id: &u64, _order: &String, _cx: UndoContext) -> Result<(), LookupError> {
    Ok(())
}

fn main() {}
