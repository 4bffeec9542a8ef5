use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

#[mutating_tool(idempotency_key_fields = [path])]
pub async fn write_file(path: String) -> std::io::Result<u64> {
    Ok(path.len() as u64)
}

fn main() {}
