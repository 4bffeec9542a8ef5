//! The expansion depends on nothing in scope at the call site (async-trait's
//! trick): every path it emits is absolute, so local modules named `core`,
//! `std`, `tool_contracts`, `serde`, ... and local items shadowing the prelude
//! (`Result`, `Option`, `Box`, `String`, ...) change nothing. Parameters named
//! like the expansion's private temporaries do not collide with them either.
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
    mod schemars {}
    mod inventory {}

    // Shadow the prelude.
    struct Result;
    struct Option;
    struct Some;
    struct None;
    struct Ok;
    struct Err;
    struct Box;
    struct String;
    struct Vec;
    struct Send;
    struct Sync;
    struct Clone;
    struct Default;
    struct From;
    struct Into;
    struct Drop;
    struct Fn;
    struct Iterator;
    struct ToString;

    #[derive(Debug, ::thiserror::Error)]
    pub enum HygieneError {
        #[error(transparent)]
        Tool(#[from] ::tool_contracts::Error),
    }

    pub struct Counter(pub ::std::sync::atomic::AtomicUsize);

    /// Adds to a counter, once per `id`.
    #[::tool_contracts::mutating_tool(idempotency_key_fields = [id, pair.0], ttl = "1h")]
    pub async fn hygienic_add(
        id: u64,
        pair: (u64, u64),
        __tc_builder: u64,
        __tc_call: ::std::string::String,
        #[context] counter: &Counter,
    ) -> ::core::result::Result<u64, HygieneError> {
        counter
            .0
            .fetch_add(1, ::std::sync::atomic::Ordering::SeqCst);
        if id == 0 {
            return ::core::result::Result::Ok(0);
        }
        ::core::result::Result::Ok(id + pair.0 + pair.1 + __tc_builder + __tc_call.len() as u64)
    }

    /// Reads without a key.
    #[::tool_contracts::read_only_tool]
    pub async fn hygienic_read(id: u64) -> ::core::result::Result<u64, HygieneError> {
        ::core::result::Result::Ok(id)
    }

    pub struct Shop;

    impl Shop {
        #[::tool_contracts::mutating_tool(idempotency_key_fields = [id])]
        pub async fn hygienic_method(&self, id: u64) -> ::core::result::Result<u64, HygieneError> {
            ::core::result::Result::Ok(id)
        }
    }
}

#[test]
fn expansion_ignores_what_is_in_scope() {
    let runtime = ::tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let counter = shadowed::Counter(::std::sync::atomic::AtomicUsize::new(0));
        let first = shadowed::hygienic_add(1, (2, 3), 4, "five".into(), &counter)
            .await
            .unwrap();
        let again = shadowed::hygienic_add(1, (2, 3), 4, "five".into(), &counter)
            .await
            .unwrap();
        ::std::assert_eq!(first, 14);
        ::std::assert_eq!(again, 14);
        ::std::assert_eq!(counter.0.load(::std::sync::atomic::Ordering::SeqCst), 1);
        ::std::assert_eq!(shadowed::hygienic_read(7).await.unwrap(), 7);
        ::std::assert_eq!(shadowed::Shop.hygienic_method(8).await.unwrap(), 8);

        let registry = ::tool_contracts::registry().with_context(shadowed::Counter(
            ::std::sync::atomic::AtomicUsize::new(0),
        ));
        let names: ::std::vec::Vec<&str> = registry.iter().map(|t| t.name()).collect();
        ::std::assert_eq!(names, ["hygienic_add", "hygienic_read"]);
        let tool = registry.get("hygienic_add").unwrap();
        ::std::assert_eq!(tool.params(), ["id", "pair", "__tc_builder", "__tc_call"]);
        ::std::assert_eq!(tool.idempotency_key_fields(), ["id", "pair.0"]);
        let out = registry
            .call(
                "hygienic_add",
                ::serde_json::json!({ "id": 2, "pair": [0, 0], "__tc_builder": 0, "__tc_call": "" }),
            )
            .await
            .unwrap();
        ::std::assert_eq!(out.value, ::serde_json::json!(2));
    });
}
