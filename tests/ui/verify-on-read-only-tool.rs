use tool_contracts::read_only_tool;

#[derive(Debug, thiserror::Error)]
#[error("lookup failed")]
pub struct LookupError;

impl LookupError {
    pub fn is_timeout(&self) -> bool {
        false
    }
}

pub async fn order_exists(order_id: &u64) -> Result<Option<u64>, LookupError> {
    Ok(Some(*order_id))
}

#[read_only_tool(verify = order_exists, unknown_outcome_if = LookupError::is_timeout)]
pub async fn get_order(order_id: u64) -> Result<u64, LookupError> {
    Ok(order_id)
}

fn main() {}
