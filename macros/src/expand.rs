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
use proc_macro2::{Literal, Span, TokenStream};
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

/// Generated names shared by the pieces of one expansion.
struct Names {
    spec: Ident,
    args: Ident,
    invoke: Ident,
    key_of: Ident,
    input_schema: Ident,
    output_schema: Ident,
    call: Ident,
    builder: Ident,
    ret: Ident,
}

impl Names {
    fn new() -> Self {
        Names {
            spec: private("__TC_SPEC"),
            args: private("__TcArgs"),
            invoke: private("__tc_invoke"),
            key_of: private("__tc_key_of"),
            input_schema: private("__tc_input_schema"),
            output_schema: private("__tc_output_schema"),
            call: private("__tc_call"),
            builder: private("__tc_builder"),
            ret: private("__tc_ret"),
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
    quote! {
        #(#outer)*
        #vis #sig {
            #(#inner)*
            #body
        }
    }
}

fn mutating_body(c: &Contract, n: &Names, block: &syn::Block) -> TokenStream {
    let Names {
        spec,
        call,
        builder,
        ret,
        ..
    } = n;
    let spec_static = spec_static(c, n);
    let registration = if c.registered() {
        registration(c, n)
    } else {
        TokenStream::new()
    };
    let key_fields = c.key_fields.iter().map(|field| {
        let span = first_span(&field.tokens);
        let path = Literal::string(&field.path());
        let tokens = &field.tokens;
        quote_spanned!(span=> #builder.key_field(#path, &#tokens);)
    });
    let arg_calls = c
        .params
        .iter()
        .filter(|p| p.context.is_none())
        .map(|p| arg_call(p, builder));
    let checks = bound_checks(c);
    let ret_ty = c.ret;
    let ok = c.ok;
    let err = c.err;
    let execute = if c.cache_errors {
        quote_spanned!(first_span(ret_ty)=> ::tool_contracts::__private::execute_caching_errors)
    } else {
        quote_spanned!(first_span(ret_ty)=> ::tool_contracts::__private::execute)
    };
    let run = quote_spanned! {first_span(ret_ty)=>
        #execute::<#ok, #err, _>(#call, async move {
            let #ret: #ret_ty = #block;
            #[allow(unreachable_code)]
            #ret
        })
    };
    quote! {
        let #call = {
            #spec_static
            #registration
            let mut #builder = ::tool_contracts::__private::CallBuilder::new(&#spec);
            #(#key_fields)*
            #(#arg_calls)*
            #builder.finish()
        };
        #checks
        #run.await
    }
}

fn read_only_body(c: &Contract, n: &Names, block: &syn::Block) -> TokenStream {
    let checks = bound_checks(c);
    let registration = if c.registered() {
        let spec_static = spec_static(c, n);
        let registration = registration(c, n);
        quote! {
            {
                #spec_static
                #registration
            }
        }
    } else {
        TokenStream::new()
    };
    quote! {
        #registration
        #checks
        #block
    }
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
    ty.to_token_stream()
        .to_string()
        .split_whitespace()
        .any(|t| t == "impl")
}

/// Trait-bound checks, each spanned at the type the user wrote.
fn bound_checks(c: &Contract) -> TokenStream {
    let ok = c.ok;
    let err = c.err;
    let ok_span = first_span(ok);
    let err_span = first_span(err);
    let mut out = TokenStream::new();
    match c.kind {
        Kind::Mutating => {
            out.extend(quote_spanned!(ok_span=> ::tool_contracts::__private::assert_output::<#ok>();));
            out.extend(quote_spanned!(err_span=> ::tool_contracts::__private::assert_error::<#err>();));
            if c.registered() {
                out.extend(quote_spanned!(err_span=> ::tool_contracts::__private::assert_error_display::<#err>();));
            }
            if c.cache_errors {
                out.extend(quote_spanned!(err_span=> ::tool_contracts::__private::assert_cacheable_error::<#err>();));
            }
        }
        Kind::ReadOnly => {
            out.extend(quote_spanned!(ok_span=> ::tool_contracts::__private::assert_read_only_output::<#ok>();));
            out.extend(quote_spanned!(err_span=> ::tool_contracts::__private::assert_error_display::<#err>();));
        }
    }
    out
}

fn spec_static(c: &Contract, n: &Names) -> TokenStream {
    let spec = &n.spec;
    let name = Literal::string(&c.name);
    let description = Literal::string(&c.description);
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
    let concurrent = format_ident!("{}", c.concurrent);
    let payload_mismatch = format_ident!("{}", c.payload_mismatch);
    let on_unknown = format_ident!("{}", c.on_unknown);
    let cache_errors = c.cache_errors;
    let destructive = c.destructive;
    let open_world = c.open_world;
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
            concurrent: ::tool_contracts::__private::Concurrent::#concurrent,
            payload_mismatch: ::tool_contracts::__private::Mismatch::#payload_mismatch,
            on_unknown: ::tool_contracts::__private::OnUnknown::#on_unknown,
            cache_errors: #cache_errors,
            destructive: #destructive,
            open_world: #open_world,
            location: ::tool_contracts::__private::SourceLocation {
                module_path: ::core::module_path!(),
                file: ::core::file!(),
                line: ::core::line!(),
                column: ::core::column!(),
            },
        };
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
    let lifetime = Lifetime::new("'__tc", Span::mixed_site());
    let ok = c.ok;
    let err = c.err;
    let ret_span = first_span(c.ret);
    let fn_name = &c.model.func.sig.ident;

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

    let key_fields = c.key_fields.iter().map(|field| {
        let span = first_span(&field.tokens);
        let path = Literal::string(&field.path());
        let tokens = &field.tokens;
        let located = Ident::new("__tc_args", Span::mixed_site().located_at(span));
        quote_spanned!(span=> #builder.key_field(#path, &#located.#tokens);)
    });
    let key_of_item = match c.kind {
        Kind::Mutating => quote! {
            fn #key_of(
                #value: &#p::serde_json::Value,
            ) -> ::core::result::Result<::std::string::String, #p::Error> {
                let #decoded: #args = #p::decode_args(&#spec, #value)?;
                let mut #builder = #p::CallBuilder::new(&#spec);
                #(#key_fields)*
                #builder.key()
            }
        },
        Kind::ReadOnly => TokenStream::new(),
    };
    let key_of_ref = match c.kind {
        Kind::Mutating => quote!(::core::option::Option::Some(#key_of as #p::KeyOfFn)),
        Kind::ReadOnly => quote!(::core::option::Option::None),
    };
    let boxed = quote_spanned! {fn_name.span()=>
        ::std::boxed::Box::pin
    };
    let encode = quote_spanned! {ret_span=>
        #p::encode_result::<#ok, #err>
    };

    quote! {
        #[derive(#p::serde::Deserialize, #p::schemars::JsonSchema)]
        #[serde(crate = "::tool_contracts::__private::serde", deny_unknown_fields)]
        #[schemars(crate = "::tool_contracts::__private::schemars")]
        struct #args {
            #(#field_idents: #field_tys,)*
        }

        fn #invoke<#lifetime>(
            #ctx: &#lifetime #p::Context,
            #value: #p::serde_json::Value,
        ) -> #p::BoxFuture<#lifetime, ::core::result::Result<#p::serde_json::Value, #p::Error>> {
            #boxed(async move {
                let #decoded: #args = #p::decode_args(&#spec, &#value)?;
                #lets
                #encode(&#spec, #fn_name(#(#call_args),*).await)
            })
        }

        #key_of_item

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
        }
    }
}
