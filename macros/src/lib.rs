//! Attribute macros for [`tool-contracts`](https://docs.rs/tool-contracts).
//! Use them through the facade, `tool_contracts::mutating_tool` and
//! `tool_contracts::read_only_tool`; this crate is an implementation detail
//! and its version is pinned by the facade.
//!
//! # `#[mutating_tool(...)]`
//!
//! ```ignore
//! /// Place an order for the user's cart.
//! #[mutating_tool(idempotency_key_fields = [user_id, cart.id])]
//! async fn create_order(user_id: u64, cart: Cart, note: String, #[context] db: &Db)
//!     -> Result<Order, ShopError> { /* ... */ }
//! ```
//!
//! The body runs at most once per idempotency key: a retry with the same key
//! replays the recorded result. The function keeps its signature; its body is
//! wrapped in an `async move` block handed to the dedup engine, after the key
//! and the argument fingerprint were computed by reference.
//!
//! Options (only `idempotency_key_fields` is required):
//!
//! | option | value | default |
//! | --- | --- | --- |
//! | `idempotency_key_fields` | `[user_id, cart.id]`: parameters or fields of parameters | required |
//! | `name` | `"create_order"` (1 to 128 of `A-Za-z0-9_.-`) | the function name |
//! | `description` | `"..."` | the doc comment (`#[doc = include_str!(..)]` kept) |
//! | `version` | integer `>= 1` | `1` |
//! | `ttl` | duration such as `"24h"`, `"1h30m"`, `"500ms"` (units `d h m s ms`) | `"24h"` |
//! | `lease` | duration | `"30s"` |
//! | `concurrent` | `"wait"` or `"reject"` | `"wait"` |
//! | `payload_mismatch` | `"reject"` or `"replay"` | `"reject"` |
//! | `on_unknown` | `"fail"` or `"rerun"` | `"fail"` |
//! | `cache_errors` | `true` or `false` | `false` |
//! | `destructive` | flag, or `= true` / `= false` | `false` |
//! | `open_world` | flag, or `= true` / `= false` | `false` |
//! | `verify` | path to an `async fn` that says whether an abandoned call's effect happened | none |
//! | `unknown_outcome_if` | path to a `fn(&E) -> bool` naming errors that leave the outcome unknown | none |
//! | `compensate` | path to the `async fn` that undoes a call made inside a run (below); free functions only | none |
//! | `task` | `"forbidden"`, `"optional"` or `"required"`: whether an MCP call becomes a task (SEP-2663) named by its key | `"forbidden"` |
//!
//! Unknown and duplicate options are errors.
//!
//! # Unknown outcomes: `verify` and `unknown_outcome_if`
//!
//! A call whose worker died mid-body, or that failed in a way that may have
//! had its effect anyway (a timeout after the request was sent), has an
//! *unknown outcome*. By default a retry then gets `Error::OutcomeUnknown`
//! (`on_unknown = "fail"`), or runs the body again (`on_unknown = "rerun"`).
//!
//! `verify = path` names an `async fn` that takes the tool's parameters by
//! reference, in declaration order (an owned `T` as `&T`, a `&T` as it is,
//! `#[context]` parameters included; a method's receiver comes first, so
//! `verify = Self::check` works), and returns `Result<Option<T>, E>` with the
//! tool's own `T` and `E`:
//!
//! ```ignore
//! #[mutating_tool(idempotency_key_fields = [intent], verify = charge_happened)]
//! async fn charge(intent: u64, note: String) -> Result<String, PayError> { /* ... */ }
//!
//! async fn charge_happened(intent: &u64, note: &str) -> Result<Option<String>, PayError> {
//!     Ok(ledger_lookup(*intent).await?)   // Some(receipt) if the charge went through
//! }
//! ```
//!
//! The next call of an abandoned key takes it over and asks `verify`:
//! `Some(result)` completes the key with that result (the body does not
//! run), `None` runs the body, and `Err(e)` is returned with the key still
//! unknown (the next call asks again). The registry's recovery task
//! (`recover_once`) asks it too, for keys nobody retries. `verify` is called
//! directly, so deref coercion applies (`&str` for a `String` parameter).
//! It cannot be combined with `on_unknown = "rerun"`.
//!
//! `unknown_outcome_if = path` names a `fn(&E) -> bool`: a tool error it
//! accepts keeps the key as an unknown outcome at once (no lease to wait
//! for), so the next call goes through `verify` (or gets `OutcomeUnknown`)
//! instead of running the body blindly. Other errors release the key as
//! usual.
//!
//! # Undo inside a run: `compensate`
//!
//! `compensate = path` names the call's undo, for calls made inside a run
//! (`Run::enter`): each is a journal entry of the run, and the run's
//! compensation (`Run::compensate`) runs its undo once, newest first, as it
//! runs a `Run::step_with_undo` step's. The undo takes the tool's JSON
//! parameters by reference in declaration order (`#[context]` ones are not
//! passed: the undo runs from the arguments the store kept), then the result
//! by reference and the `UndoContext` (whose `key()` it forwards downstream),
//! and returns `Result<R, E>` with `R: Serialize` and `E: Display`:
//!
//! ```ignore
//! #[mutating_tool(idempotency_key_fields = [order_id], compensate = refund)]
//! async fn charge(order_id: u64, cents: u64) -> Result<Charge, PayError> { /* ... */ }
//!
//! async fn refund(order_id: &u64, cents: &u64, charge: &Charge, cx: UndoContext)
//!     -> Result<Refund, PayError> { /* refund with idempotency key cx.key() */ }
//! ```
//!
//! An undo of the wrong shape is one error, on the path. Outside a run the
//! option changes nothing but the descriptor (`compensable` in the MCP
//! contract). Not on methods (the undo runs without the receiver) nor on
//! `#[read_only_tool]`.
//!
//! # `#[read_only_tool(...)]`
//!
//! Registers a tool that is never deduplicated (no key). Accepts `name`,
//! `description` and `open_world`. Its error type must implement `Display`.
//!
//! # Rules checked at compile time
//!
//! - The function is an `async fn` returning `Result<T, E>` written with both
//!   parameters (`io::Result<T>` is rejected: the error type must be visible).
//!   `T: Serialize + DeserializeOwned` (read-only tools: `T: Serialize`),
//!   `E: From<tool_contracts::Error>` for mutating tools, `E: Display` for
//!   registered tools, and `E: Serialize + DeserializeOwned` with
//!   `cache_errors = true`. Missing traits are reported on the type.
//! - Every key field starts at a parameter that is not `#[context]`; `self`
//!   is never part of the key; a field may not be listed twice, nor together
//!   with a path that already contains it. A parameter whose type is a clock
//!   (`SystemTime`, `Instant`, `DateTime`, ...) cannot be keyed on. Every key
//!   field must be `Serialize`; the error points at the field in the
//!   attribute.
//! - Parameters marked `#[context]` are injected by the registry
//!   (`Registry::with_context`): they are neither JSON arguments nor part of
//!   the key. Take them as `&T` or as an owned `T: Clone`; `&mut T` is
//!   rejected.
//!
//! # Free functions and methods
//!
//! Free functions are *registered*: they appear in the tool registry, which
//! decodes their arguments from JSON. So they cannot be generic (no type or
//! const parameters, no `impl Trait` arguments), and their non-context
//! parameters must be owned (`String`, not `&str`).
//!
//! Methods (any function with a `self` receiver) are deduplicated exactly the
//! same way but are **not registered**: the registration items are generated
//! inside the function, and a nested item cannot name `Self`. Methods may be
//! generic and may borrow their arguments; every non-context argument must
//! still be `Serialize` (it is fingerprinted). An associated function without
//! a receiver cannot be told apart from a free function and is not supported.
//! Every annotated function, method or not, still submits its contract to the
//! duplicate-name check: a call of a tool whose name another contract also
//! uses fails with `Error::DuplicateTool` before anything is claimed, so two
//! tools never share stored results.
//!
//! # Expansion
//!
//! The signature is kept verbatim (only `#[context]` markers are removed).
//! The body becomes the tail of an `async move` block handed to the runtime's
//! dedup engine, preceded by a "fake return edge" typed with the declared
//! return type, so `return` and `?` behave as in the original function and a
//! type error is reported where it is written. Generated names start with
//! `__tc_`/`__Tc`/`__TC_` and are not nameable from the body; do not use that
//! prefix for your own items. Every path the expansion emits is absolute.
//!
//! # Limitations
//!
//! - Types are unknown at macro time: the clock check only sees the type
//!   written on the parameter, so a dotted key field such as `order.created_at`
//!   is not checked for being a timestamp.
//! - Registration goes through `inventory`: a crate that nothing references
//!   may be dropped by the linker together with its tools (`use my_tools as _;`).
#![deny(missing_docs)]

extern crate proc_macro;

mod args;
mod diag;
mod expand;
mod fallback;
mod model;
mod valid;

use proc_macro::TokenStream;

/// Makes an `async fn` tool safe to call twice: calls with the same
/// idempotency key run the body once and replay its result. See the crate
/// documentation for options and rules.
#[proc_macro_attribute]
pub fn mutating_tool(attr: TokenStream, item: TokenStream) -> TokenStream {
    tool(Kind::Mutating, attr.into(), item.into()).into()
}

/// Registers an `async fn` tool that changes nothing and is never
/// deduplicated. See the crate documentation for options and rules.
#[proc_macro_attribute]
pub fn read_only_tool(attr: TokenStream, item: TokenStream) -> TokenStream {
    tool(Kind::ReadOnly, attr.into(), item.into()).into()
}

/// Which attribute is being expanded.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    Mutating,
    ReadOnly,
}

impl Kind {
    pub(crate) fn attr(self) -> &'static str {
        match self {
            Kind::Mutating => "mutating_tool",
            Kind::ReadOnly => "read_only_tool",
        }
    }
}

/// Parse, validate, expand; on any error, the function unchanged plus every
/// error.
pub(crate) fn tool(
    kind: Kind,
    attr: proc_macro2::TokenStream,
    item: proc_macro2::TokenStream,
) -> proc_macro2::TokenStream {
    let func: syn::ItemFn = match syn::parse2(item.clone()) {
        Ok(func) => func,
        Err(_) => {
            let error = syn::Error::new(
                proc_macro2::Span::call_site(),
                format!("`#[{}]` goes on an `async fn` with a body", kind.attr()),
            );
            return fallback::not_a_function(item, error);
        }
    };
    let mut errors = diag::Errors::default();
    let args = args::parse(kind, attr, &mut errors);
    let model = model::Model::new(&func);
    match valid::check(kind, &args, &model, &mut errors) {
        Some(contract) => expand::expand(&contract),
        None => match errors.into_result() {
            Err(error) => fallback::emit(&func, error),
            // `check` returns `None` only with an error; stay total anyway.
            Ok(()) => fallback::emit(
                &func,
                syn::Error::new(proc_macro2::Span::call_site(), "invalid tool"),
            ),
        },
    }
}

/// Asserts that an error message contains `part`, showing the message when it does not.
#[cfg(test)]
pub(crate) fn assert_has(message: &str, part: &str) {
    assert!(
        message.contains(part),
        "{message:?} does not contain {part:?}"
    );
}
