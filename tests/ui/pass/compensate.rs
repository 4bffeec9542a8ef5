//! `compensate = path`: the undo takes the tool's JSON parameters by reference (deref
//! coercion applies: `&str` for a `String`), its result by reference and the
//! `UndoContext`; `#[context]` parameters are not passed. The expansion depends on nothing
//! in scope, and parameters named like its private temporaries change nothing.
#![deny(warnings)]
#![allow(non_camel_case_types, dead_code)]

mod core {}
mod std {}
mod tool_contracts {}

mod shadowed {
    mod core {}
    mod std {}
    mod tool_contracts {}
    mod serde {}
    mod serde_json {}

    struct Result;
    struct Option;
    struct Some;
    struct None;
    struct Ok;
    struct Err;
    struct Box;
    struct String;

    #[derive(Debug, ::thiserror::Error)]
    pub enum ShopError {
        #[error(transparent)]
        Tool(#[from] ::tool_contracts::Error),
        #[error("refused")]
        Refused,
    }

    pub struct Db;

    pub async fn refund(
        id: &u64,
        note: &str,
        __tc_json: &u64,
        __tc_output: &u64,
        __tc_cx: &u64,
        __tc_undone: &u64,
        __tc_args: &u64,
        charged: &u64,
        cx: ::tool_contracts::UndoContext,
    ) -> ::core::result::Result<::std::string::String, ShopError> {
        let _ = (note, __tc_json, __tc_output, __tc_cx, __tc_undone, __tc_args, cx.key());
        if *charged == 0 {
            return ::core::result::Result::Err(ShopError::Refused);
        }
        ::core::result::Result::Ok(::std::format!("refunded {id}"))
    }

    /// Charges once per `id`; its undo refunds.
    #[::tool_contracts::mutating_tool(idempotency_key_fields = [id], compensate = refund)]
    pub async fn hygienic_charge(
        id: u64,
        note: ::std::string::String,
        __tc_json: u64,
        __tc_output: u64,
        __tc_cx: u64,
        __tc_undone: u64,
        __tc_args: u64,
        #[context] db: &Db,
    ) -> ::core::result::Result<u64, ShopError> {
        let _ = (note, __tc_json, __tc_output, __tc_cx, __tc_undone, __tc_args, db);
        ::core::result::Result::Ok(id)
    }

    /// An undo named by a qualified path, for a tool whose result is `()`.
    pub async fn forget(
        _id: &u64,
        _done: &(),
        _cx: ::tool_contracts::UndoContext,
    ) -> ::core::result::Result<(), ShopError> {
        ::core::result::Result::Ok(())
    }

    /// Remembers `id` once.
    #[::tool_contracts::mutating_tool(idempotency_key_fields = [id], compensate = self::forget)]
    pub async fn remember(id: u64) -> ::core::result::Result<(), ShopError> {
        let _ = id;
        ::core::result::Result::Ok(())
    }
}

fn main() {
    let registry = ::tool_contracts::registry();
    let charge = registry.get("hygienic_charge").expect("registered");
    ::core::assert!(charge.is_compensable());
    ::core::assert_eq!(charge.idempotency_meta()["compensable"], true);
    ::core::assert!(registry.get("remember").expect("registered").is_compensable());
}
