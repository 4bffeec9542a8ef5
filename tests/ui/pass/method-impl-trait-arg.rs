//! A method may take `impl Trait` arguments (it is not registered, so nothing
//! decodes them from JSON); they are still fingerprinted, so `Serialize`.
#![deny(warnings)]

use tool_contracts::mutating_tool;

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error(transparent)]
    Tool(#[from] tool_contracts::Error),
}

pub struct Notes;

impl Notes {
    #[mutating_tool(idempotency_key_fields = [id])]
    pub async fn add(
        &self,
        id: u64,
        text: impl serde::Serialize + std::fmt::Display + Send,
    ) -> Result<String, ShopError> {
        Ok(format!("{id}: {text}"))
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        assert_eq!(Notes.add(1, "hello").await.unwrap(), "1: hello");
        assert_eq!(Notes.add(1, "hello").await.unwrap(), "1: hello");
    });
}
