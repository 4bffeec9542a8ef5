//! Raw identifiers keep their unraw JSON names; `mut` parameters stay mutable
//! in the body; a tool may live in a nested module.
#![deny(warnings)]

mod tools {
    use tool_contracts::mutating_tool;

    #[derive(Debug, thiserror::Error)]
    pub enum ShopError {
        #[error(transparent)]
        Tool(#[from] tool_contracts::Error),
    }

    #[mutating_tool(idempotency_key_fields = [r#type, id])]
    pub async fn r#move(
        r#type: String,
        id: u64,
        mut steps: Vec<u64>,
    ) -> Result<Vec<u64>, ShopError> {
        steps.push(id);
        steps.push(r#type.len() as u64);
        Ok(steps)
    }
}

fn main() {
    let tool = tool_contracts::registry().get("move").unwrap();
    assert_eq!(tool.params(), ["type", "id", "steps"]);
    assert_eq!(tool.idempotency_key_fields(), ["id", "type"]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        assert_eq!(
            tools::r#move("ab".into(), 1, vec![9]).await.unwrap(),
            [9, 1, 2]
        );
        let out = tool_contracts::registry()
            .call(
                "move",
                serde_json::json!({ "type": "abc", "id": 2, "steps": [] }),
            )
            .await
            .unwrap();
        assert_eq!(out.value, serde_json::json!([2, 3]));
    });
}
