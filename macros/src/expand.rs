//! Code generation for a checked `Contract`. Nearly infallible: every rule
//! was enforced in `valid.rs`.
//!
//! Conventions: generated names start with `__tc_`/`__Tc`/`__TC_` and carry
//! `Span::mixed_site()`, so the user's body cannot name them (locals are
//! hygienic; items live in a block the body is not inside). Paths are
//! absolute (`::core`, `::std`, `::tool_contracts::__private`). Type checks
//! are emitted with `quote_spanned!` at the user's tokens, so a missing trait
//! lands on the type or key field the user wrote.

use crate::valid::{Context, Contract, ToolParam};
use crate::Kind;
use proc_macro2::{Delimiter, Group, Literal, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::{AttrStyle, Ident, Lifetime, Type};

/// A private name: hygienic for locals, and never written by users.
fn private(name: &str) -> Ident {
    Ident::new(name, Span::mixed_site())
}

/// The span of a type's first token, for `quote_spanned!`.
fn first_span(tokens: &impl ToTokens) -> Span {
    tokens
        .to_token_stream()
        .into_iter()
        .next()
        .map_or_else(Span::call_site, |tt| tt.span())
}

/// Whether the tool gets a registry entry point that replays a completed key before
/// making any future (`__private::replay_now`, `FastFn`; `Registry::call` and
/// `call_json`): a registered mutating tool whose call is made from its JSON arguments
/// alone (no approval policy, which may read context values; no `#[context]` parameter,
/// which the registry checks before anything else).
fn has_fast(c: &Contract) -> bool {
    c.registered()
        && matches!(c.kind, Kind::Mutating)
        && c.approval_policy.is_none()
        && c.params.iter().all(|p| p.context.is_none())
}

/// Generated names shared by the pieces of one expansion.
struct Names {
    spec: Ident,
    args: Ident,
    invoke: Ident,
    key_of: Ident,
    input_schema: Ident,
    /// The `static` caching the input schema for the members check.
    schema_cell: Ident,
    output_schema: Ident,
    call: Ident,
    builder: Ident,
    ops: Ident,
    reconcile: Ident,
    compensate: Ident,
}

impl Names {
    fn new() -> Self {
        Names {
            spec: private("__TC_SPEC"),
            args: private("__TcArgs"),
            invoke: private("__tc_invoke"),
            key_of: private("__tc_key_of"),
            input_schema: private("__tc_input_schema"),
            schema_cell: private("__TC_INPUT_SCHEMA"),
            output_schema: private("__tc_output_schema"),
            call: private("__tc_call"),
            builder: private("__tc_builder"),
            ops: private("__tc_ops"),
            reconcile: private("__tc_reconcile"),
            compensate: private("__tc_compensate"),
        }
    }
}

/// The whole output: the user's function with its signature verbatim
/// (`#[context]` markers removed) and a new body.
pub(crate) fn expand(c: &Contract) -> TokenStream {
    let func = crate::model::strip_context(c.model.func);
    let outer = func
        .attrs
        .iter()
        .filter(|a| matches!(a.style, AttrStyle::Outer));
    let inner = func
        .attrs
        .iter()
        .filter(|a| matches!(a.style, AttrStyle::Inner(_)));
    let vis = &func.vis;
    let sig = &func.sig;
    let names = Names::new();
    let body = match c.kind {
        Kind::Mutating => mutating_body(c, &names, &func.block),
        Kind::ReadOnly => read_only_body(c, &names, &func.block),
    };
    // The new body keeps the user's braces, so the item's span is still the
    // user's function (lints such as `missing_docs` point at it, not at the
    // attribute).
    let mut block = Group::new(Delimiter::Brace, quote!(#(#inner)* #body));
    block.set_span(func.block.brace_token.span.join());
    quote! {
        #(#outer)*
        #vis #sig #block
    }
}

fn mutating_body(c: &Contract, n: &Names, block: &syn::Block) -> TokenStream {
    let Names {
        spec,
        call,
        builder,
        ops,
        ..
    } = n;
    let spec_static = spec_static(c, n);
    let registration = if c.registered() {
        registration(c, n)
    } else {
        TokenStream::new()
    };
    let key_fields = key_field_calls(c, builder);
    let tail = key_tail(c);
    let arg_calls = c
        .params
        .iter()
        .filter(|p| p.context.is_none())
        .map(|p| arg_call(p, builder));
    let ops_statements = ops_statements(c, ops);
    let approval_call = match c.approval_policy {
        Some(path) => approval_call(c, path, builder),
        None => TokenStream::new(),
    };
    let ret_ty = c.ret;
    let ok = c.ok;
    let err = c.err;
    // The fake return edge (as in tracing's `#[instrument]`): the first
    // `return` the compiler sees in the async block has the declared type, so
    // the block's output is inferred from the signature, not from the body's
    // first `return`; a wrong `return` or tail is reported where it is
    // written, with a note at the return type. The body is then the block's
    // tail, untouched (binding it with `let` first would make clippy flag a
    // body ending in `return` as a diverging sub-expression).
    let fake = Ident::new(
        "__tc_fake_return",
        Span::mixed_site().located_at(first_span(ret_ty)),
    );
    let fake_return_edge = quote_spanned! {first_span(ret_ty)=>
        #[allow(
            unknown_lints,
            unreachable_code,
            clippy::diverging_sub_expression,
            clippy::empty_loop,
            clippy::let_unit_value,
            clippy::let_with_type_underscore,
            clippy::needless_return,
            clippy::unreachable
        )]
        if false {
            let #fake: #ret_ty = loop {};
            return #fake;
        }
    };
    // The body keeps its own `async move` block, so its `return` and `?` keep
    // their meaning and type whatever wraps it. The engine gets it behind a
    // `move` closure and builds it only if the body runs: a replay never
    // builds (or boxes) the body's future. The user's statements go in
    // as they are, not their block: a block as the tail expression makes
    // rustc's `unused_braces` flag a one-line body (`{ Ok(id) }`) and suggest
    // deleting the function's own braces.
    let stmts = &block.stmts;
    let future = quote! {
        async move {
            #fake_return_edge
            #(#stmts)*
        }
    };
    let run = if c.verify.is_none() && c.unknown_outcome_if.is_none() {
        quote_spanned! {first_span(ret_ty)=>
            ::tool_contracts::__private::execute::<#ok, #err, _, _>(#call, #ops, move || #future).await
        }
    } else {
        let p = quote!(::tool_contracts::__private);
        let verify = match c.verify {
            Some(path) => {
                let verdict = private("__tc_verdict");
                let value = private("__tc_value");
                let error = private("__tc_error");
                let verify_call = verify_call(c, path, &verdict);
                quote! {
                    if #p::reconciling() {
                        #verify_call
                        match #verdict {
                            ::core::result::Result::Ok(::core::option::Option::Some(#value)) => {
                                return #p::Attempt::Verified(#value);
                            }
                            ::core::result::Result::Err(#error) => {
                                return #p::Attempt::VerifyFailed(#error);
                            }
                            ::core::result::Result::Ok(::core::option::Option::None) => {}
                        }
                    }
                }
            }
            None => TokenStream::new(),
        };
        let unknown_if = match c.unknown_outcome_if {
            // A typed binding, spanned at the user's path: a classifier of the
            // wrong shape is a type mismatch on that path.
            Some(path) => {
                let classifier = private("__tc_unknown_if");
                let span = first_span(path);
                quote_spanned! {span=>
                    ::core::option::Option::Some({
                        let #classifier: fn(&#err) -> bool = #path;
                        #classifier
                    })
                }
            }
            None => quote!(::core::option::Option::None),
        };
        let has_verify = c.verify.is_some();
        let attempt = quote! {
            move || async move {
                #verify
                #p::Attempt::Ran(#future.await)
            }
        };
        quote_spanned! {first_span(ret_ty)=>
            ::tool_contracts::__private::execute_with::<#ok, #err, _, _>(
                #call, #ops, #attempt, #unknown_if, #has_verify,
            ).await
        }
    };
    let make_call = quote! {
        let mut #builder = ::tool_contracts::__private::CallBuilder::keyed(&#spec, #tail);
        #key_fields
        #(#arg_calls)*
        #approval_call
        #builder.finish()
    };
    if has_fast(c) {
        // Called through the registry's entry point that replays at once, the call is made
        // there already (from the same arguments, by the same statements): taken, not made
        // again. The engine's operations come from the one function that entry point uses
        // too (`__tc_ops_of`, in `registration`), so a missing bound is checked once.
        let prepared = private("__tc_prepared");
        let ops_of = private("__tc_ops_of");
        return quote! {
            let (#call, #ops) = {
                #spec_static
                #registration
                let #call = match ::tool_contracts::__private::take_prepared(&#spec) {
                    ::core::option::Option::Some(#prepared) => #prepared,
                    ::core::option::Option::None => { #make_call }
                };
                (#call, #ops_of())
            };
            #run
        };
    }
    quote! {
        let #call = {
            #spec_static
            #registration
            #make_call
        };
        #ops_statements
        #run
    }
}

/// `builder.require_approval(policy(&a, b, ..));` with the parameters lent as `verify`
/// gets them, every token spanned at the user's `approval = path`: a policy of the wrong
/// shape is reported there.
fn approval_call(c: &Contract, path: &syn::ExprPath, builder: &Ident) -> TokenStream {
    let span = first_span(path);
    let refs = param_refs(c, span);
    let needed = private("__tc_needs_approval");
    quote_spanned! {span=>
        let #needed: bool = #path(#(#refs),*);
        #builder.require_approval(#needed);
    }
}

/// The tool's receiver and parameters by reference, spanned at `span`: what `verify` and
/// an approval policy receive.
fn param_refs(c: &Contract, span: Span) -> Vec<TokenStream> {
    let mut refs = Vec::new();
    if let Some(receiver) = c.model.receiver {
        let mut this = Ident::new("self", receiver.self_token.span);
        this.set_span(span);
        refs.push(receiver_by_reference(&this, &receiver.kind, span));
    }
    for param in &c.params {
        refs.push(by_reference(&respanned(param.ident, span), param.ty, span));
    }
    refs
}

/// `let __tc_verdict: Result<Option<T>, E> = verify(&a, b, ..).await;`, every
/// token spanned at the user's `verify = path`, so a verify function of the
/// wrong shape is reported there. The tokens are the same in the body and in
/// the registry's reconcile entry, so the same mistake yields one diagnostic.
fn verify_call(c: &Contract, path: &syn::ExprPath, verdict: &Ident) -> TokenStream {
    let span = first_span(path);
    let refs = param_refs(c, span);
    let ok = c.ok;
    let err = c.err;
    quote_spanned! {span=>
        let #verdict: ::core::result::Result<::core::option::Option<#ok>, #err> =
            #path(#(#refs),*).await;
    }
}

/// How `verify` receives one parameter: `&T` as it is, `&mut T` reborrowed as
/// `&T`, an owned `T` as `&T`.
fn by_reference(ident: &Ident, ty: &Type, span: Span) -> TokenStream {
    match ty {
        Type::Reference(r) if r.mutability.is_some() => quote_spanned!(span=> &*#ident),
        Type::Reference(_) => quote_spanned!(span=> #ident),
        _ => quote_spanned!(span=> &#ident),
    }
}

/// How `verify` receives the receiver: `&self` as it is, `&mut self`
/// reborrowed as `&Self`, `self` as `&self`, `self: T` as [`by_reference`] says.
fn receiver_by_reference(this: &Ident, kind: &syn::ReceiverKind, span: Span) -> TokenStream {
    match kind {
        syn::ReceiverKind::Reference(_, _, Some(_)) => quote_spanned!(span=> &*#this),
        syn::ReceiverKind::Reference(_, _, None) => quote_spanned!(span=> #this),
        syn::ReceiverKind::Typed(_, ty) => by_reference(this, ty, span),
        // `self` by value, and any receiver form a later syn adds (`ReceiverKind` is
        // non-exhaustive): lent by shared reference, as an owned parameter is.
        _ => quote_spanned!(span=> &#this),
    }
}

/// The same name (raw or not, same hygiene as the user's tokens) at `span`.
fn respanned(ident: &Ident, span: Span) -> Ident {
    let mut ident = ident.clone();
    ident.set_span(span);
    ident
}

/// `let __tc_ops = ...;`: the engine's operations on `T` and `E`. Each one
/// comes from an `assert_*` helper spanned at the type the user wrote: the
/// helper's bound is the only check of that trait, so a missing one is
/// reported once, there (the engine's entry points have no bounds of their
/// own).
fn ops_statements(c: &Contract, ops: &Ident) -> TokenStream {
    let p = quote!(::tool_contracts::__private);
    let ok = c.ok;
    let err = c.err;
    let ok_span = first_span(ok);
    let err_span = first_span(err);
    let output = quote_spanned!(ok_span=> #p::assert_output::<#ok>());
    let contract_error = quote_spanned!(err_span=> #p::assert_error::<#err>());
    // `T: Clone` found by autoref, so a result type that is not `Clone` still compiles
    // (its replays decode every time).
    let mut out = quote! {
        let #ops = #p::Ops::new(#output, #contract_error).keeping({
            #[allow(unused_imports)]
            use #p::{KeepFallback as _, KeepViaClone as _};
            (&&#p::KeepProbe::<#ok>::new()).keeper()
        });
    };
    if c.registered() {
        // The registry shows errors through `Display` (`encode_result`, which
        // dispatches by autoref so that it does not report this again).
        out.extend(quote_spanned!(err_span=> #p::assert_error_display::<#err>();));
    }
    if c.cache_errors {
        let errors = quote_spanned!(err_span=> #p::assert_cacheable_error::<#err>());
        out.extend(quote!(let #ops = #ops.caching_errors(#errors);));
    }
    out
}

fn read_only_body(c: &Contract, n: &Names, block: &syn::Block) -> TokenStream {
    let checks = read_only_checks(c);
    let spec_static = spec_static(c, n);
    let registration = if c.registered() {
        registration(c, n)
    } else {
        TokenStream::new()
    };
    // The statements, not the block (see `mutating_body`).
    let stmts = &block.stmts;
    quote! {
        {
            #spec_static
            #registration
        }
        #checks
        #(#stmts)*
    }
}

/// The end of the tool's key document after its scope, `,"tool":"<name>","version":<n>}`
/// (`key::key_tail` in the runtime, which checks it in debug builds): written out here so a
/// call does not encode it. A tool name is `A-Z a-z 0-9 _ - .` only, which JSON never
/// escapes.
fn key_tail(c: &Contract) -> Literal {
    Literal::string(&format!(
        ",\"tool\":\"{}\",\"version\":{}}}",
        c.name, c.version
    ))
}

/// `CallBuilder::key_member` for every key field, in JCS order, each spanned at
/// the path in the attribute so a missing `Serialize` lands there.
fn key_field_calls(c: &Contract, builder: &Ident) -> TokenStream {
    c.key_fields
        .iter()
        .map(|field| {
            let span = first_span(&field.tokens);
            let path = field.path();
            // The member's canonical name, `"<path>":`: a path is Rust identifiers and
            // tuple indexes joined by `.`, none of which JSON escapes.
            let member = Literal::string(&format!("\"{path}\":"));
            let path = Literal::string(&path);
            let tokens = &field.tokens;
            quote_spanned!(span=> #builder.key_member(#member, #path, &#tokens);)
        })
        .collect()
}

/// `CallBuilder::arg` for one JSON argument, spanned at its type so a missing
/// `Serialize` lands there.
fn arg_call(p: &ToolParam, builder: &Ident) -> TokenStream {
    let name = Literal::string(&p.json_name());
    let ident = p.ident;
    let ty = p.ty;
    let span = first_span(ty);
    if contains_impl_trait(ty) {
        quote_spanned!(span=> #builder.arg(#name, &#ident);)
    } else {
        quote_spanned!(span=> #builder.arg::<#ty>(#name, &#ident);)
    }
}

fn contains_impl_trait(ty: &Type) -> bool {
    crate::valid::find_impl_trait(ty).is_some()
}

/// A read-only tool's trait-bound checks, each spanned at the type the user
/// wrote (mutating tools get theirs from `ops_statements`).
fn read_only_checks(c: &Contract) -> TokenStream {
    let ok = c.ok;
    let err = c.err;
    let ok_span = first_span(ok);
    let err_span = first_span(err);
    let mut out =
        quote_spanned!(ok_span=> ::tool_contracts::__private::assert_read_only_output::<#ok>(););
    out.extend(
        quote_spanned!(err_span=> ::tool_contracts::__private::assert_error_display::<#err>();),
    );
    out
}

fn spec_static(c: &Contract, n: &Names) -> TokenStream {
    let spec = &n.spec;
    let name = Literal::string(&c.name);
    let description = &c.description;
    let kind = match c.kind {
        Kind::Mutating => quote!(Mutating),
        Kind::ReadOnly => quote!(ReadOnly),
    };
    let key_fields = c.key_fields.iter().map(|f| Literal::string(&f.path()));
    let params = c
        .params
        .iter()
        .filter(|p| p.context.is_none())
        .map(|p| Literal::string(&p.json_name()));
    let version = Literal::u32_suffixed(c.version);
    let ttl = Literal::u64_suffixed(c.ttl_ms);
    let lease = Literal::u64_suffixed(c.lease_ms);
    let max_wait = Literal::u64_suffixed(c.max_wait_ms);
    let concurrent = format_ident!("{}", c.concurrent);
    let payload_mismatch = format_ident!("{}", c.payload_mismatch);
    let on_unknown = format_ident!("{}", c.on_unknown);
    let task = format_ident!("{}", c.task);
    let approval = format_ident!("{}", c.approval);
    let approval_expires = Literal::u64_suffixed(c.approval_expires_ms);
    let cache_errors = c.cache_errors;
    let destructive = c.destructive;
    let open_world = c.open_world;
    let compensate = compensate_ref(c, n);
    quote! {
        static #spec: ::tool_contracts::__private::ToolSpec = ::tool_contracts::__private::ToolSpec {
            name: #name,
            description: #description,
            kind: ::tool_contracts::__private::ToolKind::#kind,
            key_fields: &[#(#key_fields),*],
            params: &[#(#params),*],
            version: #version,
            ttl: ::core::time::Duration::from_millis(#ttl),
            lease: ::core::time::Duration::from_millis(#lease),
            max_wait: ::core::time::Duration::from_millis(#max_wait),
            concurrent: ::tool_contracts::__private::Concurrent::#concurrent,
            payload_mismatch: ::tool_contracts::__private::Mismatch::#payload_mismatch,
            on_unknown: ::tool_contracts::__private::OnUnknown::#on_unknown,
            cache_errors: #cache_errors,
            destructive: #destructive,
            open_world: #open_world,
            task: ::tool_contracts::__private::TaskSupport::#task,
            approval: ::tool_contracts::__private::ApprovalRule::#approval,
            approval_expires: ::core::time::Duration::from_millis(#approval_expires),
            compensate: #compensate,
            location: ::tool_contracts::__private::SourceLocation {
                module_path: ::core::module_path!(),
                file: ::core::file!(),
                line: ::core::line!(),
                column: ::core::column!(),
            },
        };
        // Every tool's contract, method or not, is known to the duplicate-name check.
        ::tool_contracts::__private::inventory::submit! {
            ::tool_contracts::__private::ContractEntry::new(&#spec)
        }
    }
}

/// The registry entry of a free function: argument struct, invoke, key_of,
/// schemas, and the `inventory` submission.
fn registration(c: &Contract, n: &Names) -> TokenStream {
    let Names {
        spec,
        args,
        invoke,
        key_of,
        input_schema,
        schema_cell,
        output_schema,
        builder,
        ..
    } = n;
    let p = quote!(::tool_contracts::__private);
    let json: Vec<&ToolParam> = c.params.iter().filter(|p| p.context.is_none()).collect();
    let field_idents = json.iter().map(|p| p.ident);
    let field_tys = json.iter().map(|p| p.ty);

    let ctx = private("__tc_ctx");
    let value = private("__tc_value");
    let decoded = private("__tc_args");
    let result = private("__tc_result");
    let text = private("__tc_text");
    let lifetime = Lifetime::new("'__tc", Span::mixed_site());
    let ok = c.ok;
    // The tool named with `mixed_site` hygiene: it resolves to the function item, never to
    // a parameter of the same name (`async fn refund(refund: Refund)`), which a nested fn
    // item cannot capture (E0434). Located at the user's name for messages.
    let user_name = &c.model.func.sig.ident;
    let mut fn_name = user_name.clone();
    fn_name.set_span(Span::mixed_site().located_at(user_name.span()));

    let mut lets = TokenStream::new();
    let mut call_args = Vec::new();
    for (i, param) in c.params.iter().enumerate() {
        match &param.context {
            None => {
                let ident = param.ident;
                call_args.push(quote!(#decoded.#ident));
            }
            Some(context) => {
                let local = private(&format!("__tc_context_{i}"));
                let name = Literal::string(&param.json_name());
                let lets_one = match context {
                    Context::Borrowed(inner) => quote_spanned! {first_span(param.ty)=>
                        let #local = #p::Context::get::<#inner>(#ctx, &#spec, #name)?;
                    },
                    Context::Owned => {
                        let ty = param.ty;
                        quote_spanned! {first_span(ty)=>
                            let #local = #p::Context::get_cloned::<#ty>(#ctx, &#spec, #name)?;
                        }
                    }
                };
                lets.extend(lets_one);
                call_args.push(local.to_token_stream());
            }
        }
    }

    // The arguments are bound under the user's own names, so the `key_member`
    // and `arg` calls below are token-for-token those of the function body: a
    // type that is not `Serialize` then yields one diagnostic, not two. Every
    // argument goes through `arg` as in a call, so `key` refuses what the call
    // refuses (the size limit, values without a JSON form).
    let arg_names: Vec<&Ident> = json.iter().map(|p| p.ident).collect();
    let key_fields = key_field_calls(c, builder);
    let tail = key_tail(c);
    let arg_calls: TokenStream = json.iter().map(|p| arg_call(p, builder)).collect();
    let key_of_item = match c.kind {
        Kind::Mutating => quote! {
            fn #key_of(
                #value: &#p::serde_json::Value,
            ) -> ::core::result::Result<::std::string::String, #p::Error> {
                let #decoded: #args = #p::decode_tool_args(&#spec, &#schema_cell, #input_schema, #value)?;
                let #args { #(#arg_names,)* } = #decoded;
                let mut #builder = #p::CallBuilder::keyed(&#spec, #tail);
                #key_fields
                #arg_calls
                #builder.key()
            }
        },
        Kind::ReadOnly => TokenStream::new(),
    };
    let key_of_ref = match c.kind {
        Kind::Mutating => quote!(::core::option::Option::Some(#key_of as #p::KeyOfFn)),
        Kind::ReadOnly => quote!(::core::option::Option::None),
    };
    let (reconcile_item, with_reconcile) = match c.verify {
        Some(path) => {
            let reconcile = &n.reconcile;
            let item = reconcile_item(c, n, path);
            (item, quote!(.with_reconcile(#reconcile as #p::ReconcileFn)))
        }
        None => (TokenStream::new(), TokenStream::new()),
    };
    let compensate_item = match c.compensate {
        Some(path) => compensate_item(c, n, path),
        None => TokenStream::new(),
    };
    let encoder = private("__TcEncode");
    let encode_checked = private("__TcEncodeChecked");
    let encode_unchecked = private("__TcEncodeUnchecked");
    let run_fn = private("__tc_run");
    let fast = private("__tc_fast");
    let prepared = private("__tc_prepared");
    let future = private("__tc_future");
    let report = private("__tc_report");
    let error = private("__tc_error");
    let stored = private("__tc_stored");
    let missed = private("__tc_missed");
    let call = &n.call;
    let fast_path = has_fast(c);
    // The tool's future, given the call its registry entry point made (if it made one).
    let (prepared_param, prepared_none, await_tool) = if fast_path {
        (
            quote!(#prepared: ::core::option::Option<::core::result::Result<#p::Call, #p::Error>>,),
            quote!(::core::option::Option::None,),
            quote! {
                let #future = #fn_name(#(#call_args),*);
                let #result = match #prepared {
                    ::core::option::Option::Some(#prepared) => #p::with_prepared(&#spec, #prepared, #future).await,
                    ::core::option::Option::None => #future.await,
                };
            },
        )
    } else {
        (
            TokenStream::new(),
            TokenStream::new(),
            quote!(let #result = #fn_name(#(#call_args),*).await;),
        )
    };
    // Spanned at the function's name: a registered tool's future must be
    // `Send`, and that error should name the tool, not the attribute. The one
    // future both entry points return, so that error is reported once.
    let run_body = quote_spanned! {fn_name.span()=>
        ::std::boxed::Box::pin(async move {
            #lets
            #await_tool
            (&&#encoder(::core::cell::Cell::new(::core::option::Option::Some(#result)))).__tc_encode(#text, ::core::option::Option::None)
        })
    };
    let invoke_body = quote_spanned! {fn_name.span()=>
        let #text = #p::CallArgs::is_text(&#value);
        match #p::decode_tool_input::<#args>(&#spec, &#schema_cell, #input_schema, &#value) {
            ::core::result::Result::Ok(#decoded) => #run_fn(#ctx, #decoded, #prepared_none #text),
            ::core::result::Result::Err(#error) => {
                ::std::boxed::Box::pin(::core::future::ready(::core::result::Result::Err(#error)))
            }
        }
    };
    let (fast_item, with_fast) = if fast_path {
        let ops = &n.ops;
        let ops_statements = ops_statements(c, ops);
        let ops_of = private("__tc_ops_of");
        let (ok, err) = (c.ok, c.err);
        let has_verify = c.verify.is_some();
        let item = quote_spanned! {fn_name.span()=>
            fn #fast<#lifetime>(
                #ctx: &#lifetime #p::Context,
                #value: #p::CallArgs<#lifetime>,
            ) -> #p::Fast<#lifetime> {
                let #text = #p::CallArgs::is_text(&#value);
                // The parameters, or `None` for a call this thread derived before from the
                // same arguments: then decoded only if the body must run.
                let (#call, #decoded): (_, ::core::option::Option<#args>) = match #p::recall_call(&#spec, &#value) {
                    #p::Recall::Kept(#call) => (::core::result::Result::Ok(#call), ::core::option::Option::None),
                    #p::Recall::Missed(#missed) => {
                        let #decoded: #args = match #p::decode_tool_input(&#spec, &#schema_cell, #input_schema, &#value) {
                            ::core::result::Result::Ok(#decoded) => #decoded,
                            ::core::result::Result::Err(#error) => return #p::Fast::Refused(#error),
                        };
                        let #args { #(#arg_names,)* } = #decoded;
                        let mut #builder = #p::CallBuilder::keyed(&#spec, #tail);
                        #key_fields
                        #arg_calls
                        let #call = #builder.finish();
                        #p::note_call(&#spec, &#value, #missed, &#call);
                        (#call, ::core::option::Option::Some(#args { #(#arg_names,)* }))
                    }
                };
                let #ops = #ops_of();
                match #p::replay_now(#call, #ops, #has_verify, #text, |#result, #stored| {
                    (&&#encoder(::core::cell::Cell::new(::core::option::Option::Some(#result)))).__tc_encode(#text, #stored)
                }) {
                    #p::Now::Done(#result, #report) => #p::Fast::Done(#result, #report),
                    #p::Now::Run(#call) => {
                        let #decoded = match #decoded {
                            ::core::option::Option::Some(#decoded) => #decoded,
                            ::core::option::Option::None => match #p::decode_tool_input(&#spec, &#schema_cell, #input_schema, &#value) {
                                ::core::result::Result::Ok(#decoded) => #decoded,
                                ::core::result::Result::Err(#error) => return #p::Fast::Refused(#error),
                            },
                        };
                        #p::Fast::Run(#run_fn(#ctx, #decoded, ::core::option::Option::Some(#call), #text))
                    }
                }
            }
        };
        // The engine's operations on `T` and `E`, for this entry point and the body alike.
        let ops_fn = quote! {
            fn #ops_of() -> #p::Ops<#ok, #err> {
                #ops_statements
                #ops
            }
        };
        (
            quote!(#item #ops_fn),
            quote!(.with_fast(#fast as #p::FastFn)),
        )
    } else {
        (TokenStream::new(), TokenStream::new())
    };

    quote! {
        #[derive(#p::serde::Deserialize, #p::schemars::JsonSchema)]
        #[serde(crate = "::tool_contracts::__private::serde", deny_unknown_fields)]
        #[schemars(crate = "::tool_contracts::__private::schemars")]
        struct #args {
            #(#field_idents: #field_tys,)*
        }

        static #schema_cell: #p::SchemaCell = #p::SchemaCell::new();

        fn #invoke<#lifetime>(
            #ctx: &#lifetime #p::Context,
            #value: #p::CallArgs<#lifetime>,
        ) -> #p::BoxFuture<#lifetime, ::core::result::Result<#p::CallResult, #p::Error>> {
            #invoke_body
        }

        fn #run_fn<#lifetime>(
            #ctx: &#lifetime #p::Context,
            #decoded: #args,
            #prepared_param
            #text: bool,
        ) -> #p::BoxFuture<#lifetime, ::core::result::Result<#p::CallResult, #p::Error>> {
            #run_body
        }

        #fast_item

        // `encode_result` needs `T: Serialize, E: Display`. Those bounds are
        // already checked (and reported, once, at the user's types) in the
        // function body; dispatching by autoref here keeps this separate body
        // from reporting them a second time.
        struct #encoder<T, E>(::core::cell::Cell<::core::option::Option<::core::result::Result<T, E>>>);
        #[allow(dead_code)]
        trait #encode_checked {
            fn __tc_encode(&self, text: bool, stored: ::core::option::Option<::std::string::String>) -> ::core::result::Result<#p::CallResult, #p::Error>;
        }
        impl<T: #p::serde::Serialize, E: ::core::fmt::Display> #encode_checked for &#encoder<T, E> {
            fn __tc_encode(&self, text: bool, stored: ::core::option::Option<::std::string::String>) -> ::core::result::Result<#p::CallResult, #p::Error> {
                match self.0.take() {
                    ::core::option::Option::Some(result) => #p::encode_result::<T, E>(&#spec, result, text, stored),
                    ::core::option::Option::None => ::core::unreachable!(),
                }
            }
        }
        #[allow(dead_code)]
        trait #encode_unchecked {
            fn __tc_encode(&self, _: bool, _: ::core::option::Option<::std::string::String>) -> ::core::result::Result<#p::CallResult, #p::Error>;
        }
        impl<T, E> #encode_unchecked for #encoder<T, E> {
            fn __tc_encode(&self, _: bool, _: ::core::option::Option<::std::string::String>) -> ::core::result::Result<#p::CallResult, #p::Error> {
                // Only selected when the bounds above fail, which is already a
                // compile error in the tool's body.
                ::core::unreachable!()
            }
        }

        #key_of_item

        #reconcile_item

        #compensate_item

        fn #input_schema() -> #p::serde_json::Value {
            #p::input_schema::<#args>()
        }

        fn #output_schema() -> ::core::option::Option<#p::serde_json::Value> {
            #[allow(unused_imports)]
            use #p::{OutputSchemaFallback as _, OutputSchemaViaJsonSchema as _};
            (&&#p::OutputSchemaProbe::<#ok>::new()).output_schema()
        }

        #p::inventory::submit! {
            #p::ToolDescriptor::new(
                &#spec,
                #key_of_ref,
                #invoke as #p::InvokeFn,
                #input_schema,
                #output_schema,
            )
            #with_reconcile
            #with_fast
        }
    }
}

/// The recovery task's entry point for a tool with `verify`: decode the
/// arguments the store kept, resolve context parameters as `invoke` does, and
/// ask `verify`. Arguments and context values are bound under the user's names
/// (respanned at the path, as in the body), so the `verify` call is
/// token-for-token the body's: a `verify` of the wrong shape is reported once.
fn reconcile_item(c: &Contract, n: &Names, path: &syn::ExprPath) -> TokenStream {
    let Names {
        spec,
        args,
        reconcile,
        ..
    } = n;
    let p = quote!(::tool_contracts::__private);
    let span = first_span(path);
    let ctx = private("__tc_ctx");
    let json = private("__tc_json");
    let decoded = private("__tc_args");
    let verdict = private("__tc_verdict");
    let lifetime = Lifetime::new("'__tc", Span::mixed_site());
    let mut fields = Vec::new();
    let mut lets = TokenStream::new();
    for param in &c.params {
        let local = respanned(param.ident, span);
        let name = Literal::string(&param.json_name());
        match &param.context {
            None => fields.push(local),
            Some(Context::Borrowed(inner)) => lets.extend(quote_spanned! {first_span(param.ty)=>
                let #local = #p::Context::get::<#inner>(#ctx, &#spec, #name)?;
            }),
            Some(Context::Owned) => {
                let ty = param.ty;
                lets.extend(quote_spanned! {first_span(ty)=>
                    let #local = #p::Context::get_cloned::<#ty>(#ctx, &#spec, #name)?;
                });
            }
        }
    }
    let verify_call = verify_call(c, path, &verdict);
    let ok = c.ok;
    let err = c.err;
    let output = quote_spanned!(first_span(ok)=> #p::assert_output::<#ok>());
    let display = quote_spanned!(first_span(err)=> #p::assert_error_display::<#err>());
    // Spanned at the path: the boxed future must be `Send`, and a `verify`
    // whose future is not should be told so there.
    let body = quote_spanned! {span=>
        ::std::boxed::Box::pin(async move {
            let #decoded: #args = #p::decode_args_str(&#spec, #json)?;
            let #args { #(#fields),* } = #decoded;
            #lets
            #verify_call
            #p::reconciled(&#spec, #verdict, #output, #display)
        })
    };
    quote! {
        fn #reconcile<#lifetime>(
            #ctx: &#lifetime #p::Context,
            #json: &#lifetime str,
        ) -> #p::BoxFuture<
            #lifetime,
            ::core::result::Result<
                ::core::option::Option<::std::string::String>,
                #p::Error,
            >,
        > {
            #body
        }
    }
}

/// The spec's `compensate` field: the undo entry point of a tool with `compensate = path`
/// (free functions only: `valid.rs` refuses the option on methods), else `None`.
fn compensate_ref(c: &Contract, n: &Names) -> TokenStream {
    let compensate = &n.compensate;
    match c.compensate {
        Some(_) if c.registered() => quote! {
            ::core::option::Option::Some(#compensate as ::tool_contracts::__private::CompensateFn)
        },
        _ => quote!(::core::option::Option::None),
    }
}

/// The undo of a tool with `compensate = path`, which a run's compensation calls for a call
/// made inside the run: decode the arguments and result the store kept, and call the undo
/// with the JSON parameters by reference (declaration order, as `verify` gets them;
/// `#[context]` ones are not kept with the call, so not passed), the result by reference
/// and the `UndoContext`. Every token of the call is spanned at the user's path, so an
/// undo of the wrong shape is reported once, there.
fn compensate_item(c: &Contract, n: &Names, path: &syn::ExprPath) -> TokenStream {
    let Names {
        spec,
        args,
        compensate,
        ..
    } = n;
    let p = quote!(::tool_contracts::__private);
    let span = first_span(path);
    // Private names located at the path (hygiene unchanged): they are arguments of the
    // undo's call, and a mistake about them is reported there, not at the attribute.
    let at_path = |name: &str| Ident::new(name, Span::mixed_site().located_at(span));
    let json = at_path("__tc_json");
    let output = at_path("__tc_output");
    let cx = at_path("__tc_cx");
    let decoded = at_path("__tc_args");
    let mut fields = Vec::new();
    let mut refs = Vec::new();
    for param in c.params.iter().filter(|p| p.context.is_none()) {
        let local = respanned(param.ident, span);
        refs.push(by_reference(&local, param.ty, span));
        fields.push(local);
    }
    // The undo's bounds (`R: Serialize`, `E: Display`) are checked by this call: spanned at
    // the path, so a missing one is reported there.
    let p_at_path = quote_spanned!(span=> ::tool_contracts::__private);
    let ok = c.ok;
    // Spanned at `T`, as in the body: a result type that is not `Serialize +
    // DeserializeOwned` is reported once.
    let codec = quote_spanned!(first_span(ok)=> #p::assert_output::<#ok>());
    // Spanned at the path: the boxed future must be `Send + 'static`, and an undo of
    // the wrong shape (arity, types, not `async`, not returning `Result<R, E>` with
    // `R: Serialize`, `E: Display`) should be told so there.
    let body = quote_spanned! {span=>
        ::std::boxed::Box::pin(async move {
            let #decoded: #args = #p::undo_args(&#spec, &#json)?;
            let #args { #(#fields),* } = #decoded;
            let #output: #ok = #p::undo_output(&#spec, &#output, #codec)?;
            #p_at_path::undone(#path(#(#refs,)* &#output, #cx).await)
        })
    };
    quote! {
        fn #compensate(
            #json: ::std::string::String,
            #output: ::std::string::String,
            #cx: #p::UndoContext,
        ) -> ::core::pin::Pin<::std::boxed::Box<
            dyn ::core::future::Future<
                Output = ::core::result::Result<#p::serde_json::Value, ::std::string::String>,
            > + ::core::marker::Send,
        >> {
            #body
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::Kind;
    use proc_macro2::TokenStream;
    use quote::quote;

    fn expand(kind: Kind, attr: TokenStream, item: TokenStream) -> (String, syn::File) {
        let out = crate::tool(kind, attr, item);
        let text = out.to_string();
        let file: syn::File = syn::parse2(out).expect("the expansion parses as items");
        (text, file)
    }

    #[test]
    fn mutating_free_fn_expands_to_one_fn_with_the_signature_verbatim() {
        let (text, file) = expand(
            Kind::Mutating,
            quote! { idempotency_key_fields = [user_id, cart.id] },
            quote! {
                /// Doc.
                pub async fn create_order(user_id: u64, cart: Cart, note: String, #[context] db: &Db)
                    -> Result<Order, ShopError> { body(db) }
            },
        );
        assert_eq!(file.items.len(), 1);
        let syn::Item::Fn(func) = &file.items[0] else {
            panic!("not a fn")
        };
        let sig = &func.sig;
        assert_eq!(
            quote!(#sig).to_string(),
            quote!(async fn create_order(user_id: u64, cart: Cart, note: String, db: &Db) -> Result<Order, ShopError>)
                .to_string()
        );
        // JCS order: `cart.id` before `user_id`, in the spec and in the calls.
        assert!(
            text.contains(r#"key_fields : & ["cart.id" , "user_id"]"#),
            "{text}"
        );
        assert!(
            text.contains(r#"params : & ["user_id" , "cart" , "note"]"#),
            "{text}"
        );
        // Each member's name and the document's end come encoded: `"cart.id":` and
        // `,"tool":"create_order","version":1}`.
        let cart = text
            .find(r#"key_member ("\"cart.id\":" , "cart.id""#)
            .unwrap();
        let user = text
            .find(r#"key_member ("\"user_id\":" , "user_id""#)
            .unwrap();
        assert!(cart < user);
        assert!(
            text.contains(
                r#"CallBuilder :: keyed (& __TC_SPEC , ",\"tool\":\"create_order\",\"version\":1}")"#
            ),
            "{text}"
        );
        assert!(
            text.contains("Context :: get :: < Db > (__tc_ctx , & __TC_SPEC , \"db\")"),
            "{text}"
        );
        assert!(text.contains("inventory :: submit !"));
        assert!(text.contains(
            ":: tool_contracts :: __private :: execute :: < Order , ShopError , _ , _ >"
        ));
        assert!(
            !text.contains("# [context]"),
            "#[context] is stripped: {text}"
        );
    }

    #[test]
    fn methods_are_not_registered() {
        let (text, _) = expand(
            Kind::Mutating,
            quote! { idempotency_key_fields = [id], cache_errors = true },
            quote! { async fn refund(&self, id: u64) -> Result<u64, E> { Ok(id) } },
        );
        assert!(!text.contains("ToolDescriptor :: new"));
        assert!(
            text.contains("ContractEntry :: new"),
            "the contract is known to the duplicate-name check: {text}"
        );
        assert!(!text.contains("__tc_invoke"));
        assert!(text.contains("caching_errors (:: tool_contracts :: __private :: assert_cacheable_error :: < E > ())"), "{text}");
        assert!(!text.contains("assert_error_display"));
    }

    #[test]
    fn verify_goes_through_execute_with_and_registers_a_reconcile_entry() {
        let (text, _) = expand(
            Kind::Mutating,
            quote! { idempotency_key_fields = [id], verify = checks::placed, unknown_outcome_if = E::is_timeout },
            quote! {
                async fn place(id: u64, note: String, #[context] db: &Db, #[context] cfg: Cfg)
                    -> Result<String, E> { Ok(note) }
            },
        );
        assert!(
            text.contains(
                ":: tool_contracts :: __private :: execute_with :: < String , E , _ , _ >"
            ),
            "{text}"
        );
        assert!(text.contains("if :: tool_contracts :: __private :: reconciling ()"));
        // Owned parameters by reference, references as they are, in declaration order.
        assert_eq!(
            text.matches("checks :: placed (& id , & note , db , & cfg) . await")
                .count(),
            2,
            "the body and the reconcile entry call verify with the same tokens: {text}"
        );
        assert!(text.contains("let __tc_unknown_if : fn (& E) -> bool = E :: is_timeout"));
        assert!(text.contains(", true ,) . await"), "has_verify: {text}");
        assert!(text.contains(
            ". with_reconcile (__tc_reconcile as :: tool_contracts :: __private :: ReconcileFn)"
        ));
        assert!(text.contains("decode_args_str (& __TC_SPEC , __tc_json)"));
        assert!(
            text.contains("let db = :: tool_contracts :: __private :: Context :: get :: < Db >")
        );
        assert!(text.contains(
            "let cfg = :: tool_contracts :: __private :: Context :: get_cloned :: < Cfg >"
        ));
    }

    #[test]
    fn compensate_puts_the_undo_in_the_spec_and_passes_json_params_result_and_context() {
        let (text, _) = expand(
            Kind::Mutating,
            quote! { idempotency_key_fields = [id], compensate = undo::refund },
            quote! {
                async fn charge(id: u64, note: String, #[context] db: &Db) -> Result<Charge, E> { body() }
            },
        );
        assert!(
            text.contains("compensate : :: core :: option :: Option :: Some (__tc_compensate as :: tool_contracts :: __private :: CompensateFn)"),
            "{text}"
        );
        assert!(text.contains("fn __tc_compensate (__tc_json : :: std :: string :: String , __tc_output : :: std :: string :: String , __tc_cx : :: tool_contracts :: __private :: UndoContext ,)"), "{text}");
        // JSON parameters by reference in declaration order (no `#[context]` one), then the
        // result by reference and the context.
        assert!(
            text.contains(
                "undone (undo :: refund (& id , & note , & __tc_output , __tc_cx) . await)"
            ),
            "{text}"
        );
        assert!(
            text.contains("let __TcArgs { id , note } = __tc_args ;"),
            "{text}"
        );
        assert!(text.contains("undo_output (& __TC_SPEC , & __tc_output , :: tool_contracts :: __private :: assert_output :: < Charge > ()) ?"), "{text}");
        // Without the option: `None`, no entry point.
        let (text, _) = expand(
            Kind::Mutating,
            quote! { idempotency_key_fields = [id] },
            quote! { async fn charge(id: u64) -> Result<u64, E> { Ok(id) } },
        );
        assert!(text.contains("compensate : :: core :: option :: Option :: None"));
        assert!(!text.contains("__tc_compensate"));
    }

    #[test]
    fn a_classifier_alone_does_not_verify() {
        let (text, _) = expand(
            Kind::Mutating,
            quote! { idempotency_key_fields = [id], unknown_outcome_if = is_timeout },
            quote! { async fn place(id: u64) -> Result<u64, E> { Ok(id) } },
        );
        assert!(text.contains("execute_with"));
        assert!(!text.contains("reconciling"));
        assert!(!text.contains("with_reconcile"));
        assert!(text.contains(", false ,) . await"), "{text}");
    }

    #[test]
    fn a_method_passes_its_receiver_to_verify_first() {
        let (text, _) = expand(
            Kind::Mutating,
            quote! { idempotency_key_fields = [id], verify = Self::refunded },
            quote! { async fn refund(&mut self, id: u64, why: &mut String) -> Result<u64, E> { Ok(id) } },
        );
        assert!(
            text.contains("Self :: refunded (& * self , & id , & * why) . await"),
            "{text}"
        );
        assert!(
            !text.contains("__tc_reconcile"),
            "methods are not registered"
        );
    }

    #[test]
    fn verify_borrows_every_receiver_form_as_a_shared_reference() {
        for (receiver, passed) in [
            (quote!(&self), "(self ,"),
            (quote!(&'a self), "(self ,"),
            (quote!(&mut self), "(& * self ,"),
            (quote!(self), "(& self ,"),
            (quote!(mut self), "(& self ,"),
            (quote!(self: &Self), "(self ,"),
            (quote!(self: &mut Self), "(& * self ,"),
            (quote!(self: Box<Self>), "(& self ,"),
        ] {
            let (text, _) = expand(
                Kind::Mutating,
                quote! { idempotency_key_fields = [id], verify = Self::done },
                quote! { async fn pay(#receiver, id: u64) -> Result<u64, E> { Ok(id) } },
            );
            assert!(
                text.contains(&format!("Self :: done {passed} & id) . await")),
                "receiver `{receiver}` should reach verify as `{passed}`: {text}"
            );
        }
    }

    #[test]
    fn read_only_keeps_the_body_and_registers_without_key() {
        let (text, _) = expand(
            Kind::ReadOnly,
            quote! {},
            quote! { async fn list(#[context] db: Db) -> Result<Vec<u8>, E> { Ok(vec![]) } },
        );
        assert!(text.contains(":: core :: option :: Option :: None"));
        assert!(text.contains("get_cloned :: < Db >"));
        assert!(!text.contains("execute"));
        assert!(text.contains("ToolKind :: ReadOnly"));
    }

    #[test]
    fn errors_keep_the_function_and_report_everything() {
        let (text, file) = expand(
            Kind::Mutating,
            quote! { idempotency_key_fields = [nope], tll = "1h" },
            quote! { fn f(a: &str, #[context] db: &Db) -> u64 { 1 } },
        );
        assert_eq!(text.matches("compile_error !").count(), 5, "{text}");
        let funcs = file
            .items
            .iter()
            .filter(|i| matches!(i, syn::Item::Fn(_)))
            .count();
        assert_eq!(funcs, 1);
        assert!(
            text.contains("fn f (a : & str , db : & Db) -> u64 { 1 }"),
            "{text}"
        );
    }

    #[test]
    fn not_a_function() {
        let out = crate::tool(Kind::Mutating, quote! {}, quote! { struct S; }).to_string();
        assert!(out.contains("goes on an `async fn` with a body"));
        assert!(out.ends_with("struct S ;"));
    }
}
