//! The `verify` / `unknown_outcome_if` expansion depends on nothing in scope:
//! local `core`, `std` and `tool_contracts` modules, a shadowed prelude, and
//! parameters named like the expansion's private temporaries change nothing.
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
    pub enum HygieneError {
        #[error(transparent)]
        Tool(#[from] ::tool_contracts::Error),
        #[error("timed out")]
        Timeout,
    }

    pub fn is_timeout(e: &HygieneError) -> bool {
        ::core::matches!(e, HygieneError::Timeout)
    }

    pub struct Counter(pub ::std::sync::atomic::AtomicUsize);

    pub async fn done(
        id: &u64,
        __tc_verdict: &u64,
        __tc_json: &u64,
        __tc_ctx: &u64,
        __tc_args: &u64,
        counter: &Counter,
    ) -> ::core::result::Result<::core::option::Option<u64>, HygieneError> {
        let _ = (__tc_verdict, __tc_json, __tc_ctx, __tc_args, counter);
        ::core::result::Result::Ok(::core::option::Option::Some(*id))
    }

    /// Adds once per `id`.
    #[::tool_contracts::mutating_tool(idempotency_key_fields = [id], verify = done, unknown_outcome_if = is_timeout)]
    pub async fn hygienic_verify(
        id: u64,
        __tc_verdict: u64,
        __tc_json: u64,
        __tc_ctx: u64,
        __tc_args: u64,
        #[context] counter: &Counter,
    ) -> ::core::result::Result<u64, HygieneError> {
        counter
            .0
            .fetch_add(1, ::std::sync::atomic::Ordering::SeqCst);
        ::core::result::Result::Ok(id + __tc_verdict + __tc_json + __tc_ctx + __tc_args)
    }

    pub struct Shop;

    impl Shop {
        #[::tool_contracts::mutating_tool(idempotency_key_fields = [id], verify = Self::check)]
        pub async fn hygienic_method(&self, id: u64) -> ::core::result::Result<u64, HygieneError> {
            ::core::result::Result::Ok(id)
        }

        async fn check(
            &self,
            id: &u64,
        ) -> ::core::result::Result<::core::option::Option<u64>, HygieneError> {
            ::core::result::Result::Ok(::core::option::Option::Some(*id))
        }
    }
}

fn main() {
    let runtime = ::tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let counter = shadowed::Counter(::std::sync::atomic::AtomicUsize::new(0));
        let first = shadowed::hygienic_verify(1, 2, 3, 4, 5, &counter)
            .await
            .unwrap();
        let again = shadowed::hygienic_verify(1, 2, 3, 4, 5, &counter)
            .await
            .unwrap();
        ::std::assert_eq!((first, again), (15, 15));
        ::std::assert_eq!(counter.0.load(::std::sync::atomic::Ordering::SeqCst), 1);
        ::std::assert_eq!(shadowed::Shop.hygienic_method(8).await.unwrap(), 8);
        ::std::assert!(::tool_contracts::registry()
            .get("hygienic_verify")
            .unwrap()
            .has_verify());
    });
}
