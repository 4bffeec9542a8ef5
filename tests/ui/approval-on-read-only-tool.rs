use tool_contracts::read_only_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

// A read-only tool changes nothing: there is nothing to approve.
#[read_only_tool(approval = "required")]
pub async fn order_status(order_id: u64) -> Result<u64, ShopError> {
    Ok(order_id)
}

fn main() {}
