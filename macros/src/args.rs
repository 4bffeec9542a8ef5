//! The attribute grammar: a closed, token-based list of `option = value` pairs.
//!
//! This phase is purely syntactic: it records which options were written, with
//! their tokens (for spans), and never decides whether a value makes sense
//! (`valid.rs` does). It recovers after every malformed option by skipping to
//! the next top-level comma, so every mistake in the attribute is reported at
//! once.

use crate::diag::{closest, Errors};
use crate::Kind;
use proc_macro2::{Span, TokenStream, TokenTree};
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::{bracketed, token, Ident, LitBool, LitInt, LitStr, Token};

/// The option keywords. `custom_keyword!` gives each a token type, so the
/// parser below peeks for them exactly and spans them precisely.
pub(crate) mod kw {
    syn::custom_keyword!(idempotency_key_fields);
    syn::custom_keyword!(name);
    syn::custom_keyword!(description);
    syn::custom_keyword!(version);
    syn::custom_keyword!(ttl);
    syn::custom_keyword!(lease);
    syn::custom_keyword!(max_wait);
    syn::custom_keyword!(concurrent);
    syn::custom_keyword!(payload_mismatch);
    syn::custom_keyword!(on_unknown);
    syn::custom_keyword!(cache_errors);
    syn::custom_keyword!(destructive);
    syn::custom_keyword!(open_world);
    syn::custom_keyword!(verify);
    syn::custom_keyword!(unknown_outcome_if);
}

/// Every option `#[mutating_tool]` accepts, in the order messages list them.
pub(crate) const MUTATING_OPTIONS: &[&str] = &[
    "idempotency_key_fields",
    "name",
    "description",
    "version",
    "ttl",
    "lease",
    "max_wait",
    "concurrent",
    "payload_mismatch",
    "on_unknown",
    "cache_errors",
    "destructive",
    "open_world",
    "verify",
    "unknown_outcome_if",
];

/// Every option `#[read_only_tool]` accepts.
pub(crate) const READ_ONLY_OPTIONS: &[&str] = &["name", "description", "open_world"];

/// One option as written: the keyword (for "duplicate"/"does not apply"
/// errors) and its value.
pub(crate) struct Opt<T> {
    pub kw: Ident,
    pub value: T,
}

/// A boolean option: `flag`, `flag = true` or `flag = false`.
pub(crate) struct Flag {
    pub value: bool,
}

/// `idempotency_key_fields = [a, b.c]`.
pub(crate) struct KeyFields {
    pub bracket: token::Bracket,
    pub fields: Vec<KeyField>,
}

/// One key field: a root identifier followed by zero or more `.member`s,
/// optionally marked `#[intent]` (a field whose name says time or per-attempt
/// randomness, which the user declares to be part of the intent all the same).
pub(crate) struct KeyField {
    /// The `intent` of an `#[intent]` marker, for spanning errors.
    pub intent: Option<Ident>,
    pub root: Ident,
    pub members: Vec<syn::Member>,
    /// The tokens as written, for spanning errors and generated code.
    pub tokens: TokenStream,
}

impl KeyField {
    /// The path as it appears in `ToolSpec::key_fields`: `cart.id`.
    pub(crate) fn path(&self) -> String {
        let mut out = self.root.unraw().to_string();
        for member in &self.members {
            out.push('.');
            match member {
                syn::Member::Named(ident) => out.push_str(&ident.unraw().to_string()),
                syn::Member::Unnamed(index) => out.push_str(&index.index.to_string()),
            }
        }
        out
    }
}

/// Everything written in the attribute.
#[derive(Default)]
pub(crate) struct Args {
    pub key_fields: Option<Opt<KeyFields>>,
    pub name: Option<Opt<LitStr>>,
    pub description: Option<Opt<LitStr>>,
    pub version: Option<Opt<LitInt>>,
    pub ttl: Option<Opt<LitStr>>,
    pub lease: Option<Opt<LitStr>>,
    pub max_wait: Option<Opt<LitStr>>,
    pub concurrent: Option<Opt<LitStr>>,
    pub payload_mismatch: Option<Opt<LitStr>>,
    pub on_unknown: Option<Opt<LitStr>>,
    pub cache_errors: Option<Opt<Flag>>,
    pub destructive: Option<Opt<Flag>>,
    pub open_world: Option<Opt<Flag>>,
    /// `verify = path::to::fn`.
    pub verify: Option<Opt<syn::ExprPath>>,
    /// `unknown_outcome_if = path::to::fn`.
    pub unknown_outcome_if: Option<Opt<syn::ExprPath>>,
}

/// Parses the attribute's tokens. Never fails outright: syntax errors are
/// pushed to `errors` and parsing resumes at the next option.
pub(crate) fn parse(kind: Kind, tokens: TokenStream, errors: &mut Errors) -> Args {
    let mut args = Args::default();
    let parser = |input: ParseStream| {
        parse_options(kind, input, &mut args, errors);
        Ok(())
    };
    if let Err(error) = parser.parse2(tokens) {
        // Unreachable in practice (the closure consumes everything), kept so the
        // macro can never panic.
        errors.push(error);
    }
    args
}

fn parse_options(kind: Kind, input: ParseStream, args: &mut Args, errors: &mut Errors) {
    while !input.is_empty() {
        if let Err(error) = parse_option(kind, input, args, errors) {
            errors.push(error);
            skip_to_comma(input);
        } else if !input.is_empty() && !input.peek(Token![,]) {
            errors.push(input.error("expected `,` between options"));
            skip_to_comma(input);
        }
        if input.peek(Token![,]) {
            let _ = input.parse::<Token![,]>();
        }
    }
}

/// Error recovery: drop tokens up to (not including) the next top-level comma.
fn skip_to_comma(input: ParseStream) {
    while !input.is_empty() && !input.peek(Token![,]) {
        if input.parse::<TokenTree>().is_err() {
            break;
        }
    }
}

/// Stores `value` in `slot`, or reports a duplicate at the second keyword.
fn store<T>(slot: &mut Option<Opt<T>>, kw: Ident, value: T, errors: &mut Errors) {
    if slot.is_some() {
        errors.push(syn::Error::new(
            kw.span(),
            format!(
                "duplicate option `{kw}`: it is already set earlier in this attribute; keep one"
            ),
        ));
    } else {
        *slot = Some(Opt { kw, value });
    }
}

fn parse_option(
    kind: Kind,
    input: ParseStream,
    args: &mut Args,
    errors: &mut Errors,
) -> syn::Result<()> {
    macro_rules! keyword {
        ($kw:ident) => {{
            let kw: kw::$kw = input.parse()?;
            Ident::new(stringify!($kw), kw.span)
        }};
    }
    if input.peek(kw::idempotency_key_fields) {
        let kw = keyword!(idempotency_key_fields);
        let value = parse_key_fields(input, errors)?;
        store(&mut args.key_fields, kw, value, errors);
    } else if input.peek(kw::name) {
        let kw = keyword!(name);
        let value = parse_str(input, &kw, "\"create_order\"")?;
        store(&mut args.name, kw, value, errors);
    } else if input.peek(kw::description) {
        let kw = keyword!(description);
        let value = parse_str(input, &kw, "\"Place an order for the user's cart.\"")?;
        store(&mut args.description, kw, value, errors);
    } else if input.peek(kw::version) {
        let kw = keyword!(version);
        let value = parse_int(input, &kw)?;
        store(&mut args.version, kw, value, errors);
    } else if input.peek(kw::ttl) {
        let kw = keyword!(ttl);
        let value = parse_str(input, &kw, "\"24h\"")?;
        store(&mut args.ttl, kw, value, errors);
    } else if input.peek(kw::lease) {
        let kw = keyword!(lease);
        let value = parse_str(input, &kw, "\"30s\"")?;
        store(&mut args.lease, kw, value, errors);
    } else if input.peek(kw::max_wait) {
        let kw = keyword!(max_wait);
        let value = parse_str(input, &kw, "\"30s\"")?;
        store(&mut args.max_wait, kw, value, errors);
    } else if input.peek(kw::concurrent) {
        let kw = keyword!(concurrent);
        let value = parse_str(input, &kw, "\"wait\"")?;
        store(&mut args.concurrent, kw, value, errors);
    } else if input.peek(kw::payload_mismatch) {
        let kw = keyword!(payload_mismatch);
        let value = parse_str(input, &kw, "\"reject\"")?;
        store(&mut args.payload_mismatch, kw, value, errors);
    } else if input.peek(kw::on_unknown) {
        let kw = keyword!(on_unknown);
        let value = parse_str(input, &kw, "\"fail\"")?;
        store(&mut args.on_unknown, kw, value, errors);
    } else if input.peek(kw::cache_errors) {
        let kw = keyword!(cache_errors);
        let value = parse_flag(input, &kw, false)?;
        store(&mut args.cache_errors, kw, value, errors);
    } else if input.peek(kw::destructive) {
        let kw = keyword!(destructive);
        let value = parse_flag(input, &kw, true)?;
        store(&mut args.destructive, kw, value, errors);
    } else if input.peek(kw::open_world) {
        let kw = keyword!(open_world);
        let value = parse_flag(input, &kw, true)?;
        store(&mut args.open_world, kw, value, errors);
    } else if input.peek(kw::verify) {
        let kw = keyword!(verify);
        let value = parse_fn_path(input, &kw, "verify_order")?;
        store(&mut args.verify, kw, value, errors);
    } else if input.peek(kw::unknown_outcome_if) {
        let kw = keyword!(unknown_outcome_if);
        let value = parse_fn_path(input, &kw, "is_timeout")?;
        store(&mut args.unknown_outcome_if, kw, value, errors);
    } else {
        return Err(unknown_option(kind, input));
    }
    Ok(())
}

fn unknown_option(kind: Kind, input: ParseStream) -> syn::Error {
    let valid = match kind {
        Kind::Mutating => MUTATING_OPTIONS,
        Kind::ReadOnly => READ_ONLY_OPTIONS,
    };
    let list = valid
        .iter()
        .map(|o| format!("`{o}`"))
        .collect::<Vec<_>>()
        .join(", ");
    if input.peek(Ident::peek_any) {
        let Ok(ident) = input.call(Ident::parse_any) else {
            return input.error(format!("expected an option; valid options are {list}"));
        };
        let written = ident.unraw().to_string();
        let hint = match closest(&written, valid.iter().copied()) {
            Some(best) => format!("did you mean `{best}`? Valid"),
            None if kind == Kind::Mutating && written.contains("key") => {
                "did you mean `idempotency_key_fields`? Valid".to_owned()
            }
            None => "valid".to_owned(),
        };
        syn::Error::new(
            ident.span(),
            format!(
                "unknown option `{written}` for `#[{}]`; {hint} options are {list}",
                kind.attr()
            ),
        )
    } else {
        input.error(format!("expected an option; valid options are {list}"))
    }
}

fn expect_eq(input: ParseStream, kw: &Ident, example: &str) -> syn::Result<()> {
    if input.peek(Token![=]) {
        input.parse::<Token![=]>()?;
        Ok(())
    } else {
        Err(syn::Error::new(
            kw.span(),
            format!("expected `=` after `{kw}`: write `{kw} = {example}`"),
        ))
    }
}

fn parse_str(input: ParseStream, kw: &Ident, example: &str) -> syn::Result<LitStr> {
    expect_eq(input, kw, example)?;
    if input.peek(LitStr) {
        return input.parse();
    }
    let span = input
        .cursor()
        .token_tree()
        .map_or(input.span(), |(tt, _)| tt.span());
    Err(syn::Error::new(
        span,
        format!("expected a string literal: write `{kw} = {example}`"),
    ))
}

fn parse_int(input: ParseStream, kw: &Ident) -> syn::Result<LitInt> {
    expect_eq(input, kw, "2")?;
    if input.peek(LitInt) {
        return input.parse();
    }
    let span = input
        .cursor()
        .token_tree()
        .map_or(input.span(), |(tt, _)| tt.span());
    Err(syn::Error::new(
        span,
        format!("expected an integer: write `{kw} = 2`"),
    ))
}

/// `option = path::to::function`: a path, never a string or a call.
fn parse_fn_path(input: ParseStream, kw: &Ident, example: &str) -> syn::Result<syn::ExprPath> {
    expect_eq(input, kw, example)?;
    if input.peek(LitStr) {
        let lit: LitStr = input.parse()?;
        return Err(syn::Error::new(
            lit.span(),
            format!(
                "`{kw}` takes a path to a function, not a string: write `{kw} = {}` without quotes",
                lit.value()
            ),
        ));
    }
    let starts_path =
        input.peek(Ident::peek_any) || input.peek(Token![::]) || input.peek(Token![<]);
    if !starts_path {
        let span = input
            .cursor()
            .token_tree()
            .map_or(input.span(), |(tt, _)| tt.span());
        return Err(syn::Error::new(
            span,
            format!("expected a path to a function: write `{kw} = {example}`"),
        ));
    }
    let path: syn::ExprPath = input.parse()?;
    if input.peek(token::Paren) {
        let args = input
            .cursor()
            .token_tree()
            .map_or(input.span(), |(tt, _)| tt.span());
        return Err(syn::Error::new(
            args,
            format!(
                "`{kw}` names the function, it does not call it: remove the arguments and write `{kw} = {}`",
                crate::diag::tidy(&quote::ToTokens::to_token_stream(&path).to_string())
            ),
        ));
    }
    Ok(path)
}

/// `flag`, `flag = true` or `flag = false`; `bare` says whether the first form
/// is accepted.
fn parse_flag(input: ParseStream, kw: &Ident, bare: bool) -> syn::Result<Flag> {
    if bare && (input.is_empty() || input.peek(Token![,])) {
        return Ok(Flag { value: true });
    }
    expect_eq(input, kw, "true")?;
    if input.peek(LitBool) {
        let lit: LitBool = input.parse()?;
        return Ok(Flag { value: lit.value });
    }
    let span = input
        .cursor()
        .token_tree()
        .map_or(input.span(), |(tt, _)| tt.span());
    Err(syn::Error::new(
        span,
        format!("expected `true` or `false`: write `{kw} = true`"),
    ))
}

fn parse_key_fields(input: ParseStream, errors: &mut Errors) -> syn::Result<KeyFields> {
    const EXAMPLE: &str = "write the key fields as a list of parameter paths, like `idempotency_key_fields = [user_id, cart.id]`";
    if !input.peek(Token![=]) {
        return Err(input.error(format!("expected `=`: {EXAMPLE}")));
    }
    input.parse::<Token![=]>()?;
    if !input.peek(token::Bracket) {
        let span = input
            .cursor()
            .token_tree()
            .map_or(input.span(), |(tt, _)| tt.span());
        return Err(syn::Error::new(span, format!("expected `[`: {EXAMPLE}")));
    }
    let content;
    let bracket = bracketed!(content in input);
    let mut fields = Vec::new();
    while !content.is_empty() {
        match parse_key_field(&content, errors) {
            Ok(field) => fields.push(field),
            Err(error) => {
                errors.push(error);
                skip_to_comma(&content);
            }
        }
        if !content.is_empty() {
            if content.peek(Token![,]) {
                content.parse::<Token![,]>()?;
            } else {
                errors.push(content.error(
                    "expected `,` or `]` after a key field; key fields are field paths like `cart.id`, not expressions",
                ));
                skip_to_comma(&content);
                if content.peek(Token![,]) {
                    content.parse::<Token![,]>()?;
                }
            }
        }
    }
    Ok(KeyFields { bracket, fields })
}

fn parse_key_field(input: ParseStream, errors: &mut Errors) -> syn::Result<KeyField> {
    if input.peek(LitStr) {
        let lit: LitStr = input.parse()?;
        return Err(syn::Error::new(
            lit.span(),
            format!(
                "key fields are paths, not strings: write `{}` without quotes",
                lit.value()
            ),
        ));
    }
    let intent = parse_intent_marker(input, errors)?;
    if !input.peek(Ident::peek_any) {
        return Err(input.error("expected a parameter name, like `user_id` or `cart.id`"));
    }
    let mut tokens = TokenStream::new();
    let root = input.call(Ident::parse_any)?;
    tokens.extend([TokenTree::Ident(root.clone())]);
    let mut members = Vec::new();
    while input.peek(Token![.]) {
        let dot: Token![.] = input.parse()?;
        tokens.extend(quote::quote!(#dot));
        let lookahead = input.lookahead1();
        if lookahead.peek(Ident::peek_any) {
            let ident = input.call(Ident::parse_any)?;
            tokens.extend([TokenTree::Ident(ident.clone())]);
            members.push(syn::Member::Named(ident));
        } else if lookahead.peek(LitInt) {
            let lit: LitInt = input.parse()?;
            members.push(tuple_index(&lit.to_string(), lit.span())?);
            tokens.extend([TokenTree::Literal(lit.token())]);
        } else if lookahead.peek(syn::LitFloat) {
            // `pair.0.1` lexes as `pair`, `.`, `0.1`.
            let lit: syn::LitFloat = input.parse()?;
            let text = lit.to_string();
            let mut parts = text.split('.');
            let (Some(a), Some(b), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(syn::Error::new(
                    lit.span(),
                    "expected a field name or a tuple index",
                ));
            };
            members.push(tuple_index(a, lit.span())?);
            members.push(tuple_index(b, lit.span())?);
            tokens.extend([TokenTree::Literal(lit.token())]);
        } else {
            return Err(lookahead.error());
        }
    }
    Ok(KeyField {
        intent,
        root,
        members,
        tokens,
    })
}

/// `#[intent]` before a key field. Any other attribute there is reported, and the
/// field is still parsed (so no "empty list" error follows).
fn parse_intent_marker(input: ParseStream, errors: &mut Errors) -> syn::Result<Option<Ident>> {
    if !input.peek(Token![#]) {
        return Ok(None);
    }
    let attrs = input.call(syn::Attribute::parse_outer)?;
    let mut intent = None;
    for attr in attrs {
        match (&attr.meta, attr.path().get_ident()) {
            (syn::Meta::Path(_), Some(ident)) if ident == "intent" && intent.is_none() => {
                intent = Some(ident.clone());
            }
            _ => errors.push(syn::Error::new_spanned(
                &attr,
                "the only marker a key field takes is `#[intent]` (once), for a field whose name says time or randomness but which the caller chose, e.g. `[#[intent] slot.starts_at]`",
            )),
        }
    }
    Ok(intent)
}

fn tuple_index(text: &str, span: Span) -> syn::Result<syn::Member> {
    match text.parse::<u32>() {
        Ok(index)
            if text.bytes().all(|b| b.is_ascii_digit())
                && (text == "0" || !text.starts_with('0')) =>
        {
            Ok(syn::Member::Unnamed(syn::Index { index, span }))
        }
        _ => Err(syn::Error::new(
            span,
            format!("expected a field name or a tuple index like `0`, found `{text}`"),
        )),
    }
}

/// The span of everything inside `[...]` (for "empty list" errors).
pub(crate) fn bracket_span(fields: &KeyFields) -> Span {
    fields.bracket.span.join()
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn parse_ok(kind: Kind, tokens: TokenStream) -> Args {
        let mut errors = Errors::default();
        let args = parse(kind, tokens, &mut errors);
        if let Err(e) = errors.into_result() {
            panic!("unexpected errors: {e}");
        }
        args
    }

    fn parse_errors(kind: Kind, tokens: TokenStream) -> Vec<String> {
        let mut errors = Errors::default();
        let _ = parse(kind, tokens, &mut errors);
        match errors.into_result() {
            Ok(()) => Vec::new(),
            Err(e) => e.into_iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn parses_every_option() {
        let args = parse_ok(
            Kind::Mutating,
            quote! {
                idempotency_key_fields = [user_id, cart.id, pair.0, r#type],
                name = "n", description = "d", version = 2, ttl = "1h", lease = "30s",
                max_wait = "10s", concurrent = "reject", payload_mismatch = "replay", on_unknown = "rerun",
                cache_errors = true, destructive, open_world = false,
                verify = crate::checks::placed, unknown_outcome_if = <E as Classify>::unknown,
            },
        );
        assert_eq!(
            quote::ToTokens::to_token_stream(&args.verify.as_ref().unwrap().value).to_string(),
            "crate :: checks :: placed"
        );
        assert!(args.unknown_outcome_if.is_some());
        let fields = &args.key_fields.as_ref().unwrap().value.fields;
        let paths: Vec<String> = fields.iter().map(KeyField::path).collect();
        assert_eq!(paths, ["user_id", "cart.id", "pair.0", "type"]);
        assert_eq!(args.name.unwrap().value.value(), "n");
        assert_eq!(
            args.version.unwrap().value.base10_parse::<u32>().unwrap(),
            2
        );
        assert_eq!(args.max_wait.unwrap().value.value(), "10s");
        assert!(args.cache_errors.unwrap().value.value);
        assert!(args.destructive.unwrap().value.value);
        assert!(!args.open_world.unwrap().value.value);
    }

    #[test]
    fn empty_attribute_is_fine_syntactically() {
        let args = parse_ok(Kind::Mutating, quote! {});
        assert!(args.key_fields.is_none());
    }

    #[test]
    fn float_literal_tuple_path_is_split() {
        let args = parse_ok(
            Kind::Mutating,
            quote! { idempotency_key_fields = [pair.0.1] },
        );
        let field = &args.key_fields.unwrap().value.fields[0];
        assert_eq!(field.path(), "pair.0.1");
        assert_eq!(field.members.len(), 2);
    }

    #[test]
    fn unknown_option_lists_valid_ones_and_suggests() {
        let errors = parse_errors(Kind::Mutating, quote! { tll = "1h" });
        assert_eq!(errors.len(), 1);
        assert!(errors[0].starts_with("unknown option `tll` for `#[mutating_tool]`; did you mean `ttl`? Valid options are `idempotency_key_fields`, `name`"), "{}", errors[0]);
        let errors = parse_errors(Kind::Mutating, quote! { idempotency_key = [a] });
        assert!(
            errors[0].contains("did you mean `idempotency_key_fields`?"),
            "{}",
            errors[0]
        );
        let errors = parse_errors(Kind::ReadOnly, quote! { zzz });
        assert_eq!(
            errors[0],
            "unknown option `zzz` for `#[read_only_tool]`; valid options are `name`, `description`, `open_world`"
        );
    }

    #[test]
    fn duplicate_option_is_reported_once_at_the_second() {
        let errors = parse_errors(
            Kind::Mutating,
            quote! { ttl = "1h", ttl = "2h", ttl = "3h" },
        );
        assert_eq!(errors.len(), 2);
        assert!(errors[0].starts_with("duplicate option `ttl`"));
    }

    #[test]
    fn every_malformed_option_is_reported() {
        let errors = parse_errors(
            Kind::Mutating,
            quote! { ttl = 24h, name, version = "2", cache_errors, idempotency_key_fields = user_id, destructive = 1 },
        );
        assert_eq!(errors.len(), 6, "{errors:#?}");
        assert!(
            errors[0].contains(r#"write `ttl = "24h"`"#),
            "{}",
            errors[0]
        );
        assert!(
            errors[1].contains("expected `=` after `name`"),
            "{}",
            errors[1]
        );
        assert!(errors[2].contains("expected an integer"), "{}", errors[2]);
        assert!(
            errors[3].contains("write `cache_errors = true`"),
            "{}",
            errors[3]
        );
        assert!(errors[4].contains("expected `[`"), "{}", errors[4]);
        assert!(
            errors[5].contains("expected `true` or `false`"),
            "{}",
            errors[5]
        );
    }

    #[test]
    fn key_fields_must_be_paths() {
        let errors = parse_errors(
            Kind::Mutating,
            quote! { idempotency_key_fields = ["user_id", cart.id(), a + b, x.] },
        );
        assert_eq!(errors.len(), 4, "{errors:#?}");
        assert_eq!(
            errors[0],
            "key fields are paths, not strings: write `user_id` without quotes"
        );
        assert!(errors[1].starts_with("expected `,` or `]` after a key field"));
        assert!(errors[2].starts_with("expected `,` or `]` after a key field"));
    }

    #[test]
    fn verify_and_classifier_are_paths_to_functions() {
        let errors = parse_errors(
            Kind::Mutating,
            quote! { verify = "placed", unknown_outcome_if = is_timeout(e), verify, unknown_outcome_if = 3 },
        );
        assert_eq!(
            errors,
            [
                "`verify` takes a path to a function, not a string: write `verify = placed` without quotes",
                "`unknown_outcome_if` names the function, it does not call it: remove the arguments and write `unknown_outcome_if = is_timeout`",
                "expected `=` after `verify`: write `verify = verify_order`",
                "expected a path to a function: write `unknown_outcome_if = is_timeout`",
            ]
        );
    }

    #[test]
    fn missing_comma_between_options() {
        let errors = parse_errors(Kind::Mutating, quote! { ttl = "1h" lease = "2s" });
        assert_eq!(errors, ["expected `,` between options"]);
    }
}
