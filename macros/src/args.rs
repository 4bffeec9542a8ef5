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

/// The shape of an option's value, with the example its error messages show.
#[derive(Clone, Copy)]
enum Shape {
    /// `[a, b.c]`.
    KeyFields,
    /// A string literal: `"30s"`.
    Str(&'static str),
    /// An integer literal.
    Int,
    /// `true`/`false`; `bare`: the option alone means `true`.
    Flag { bare: bool },
    /// A path to a function: `verify_order`.
    FnPath(&'static str),
    /// A string literal from a closed set, or a path to a function: `approval`.
    StrOrFnPath(&'static str),
}

/// One option of the attributes: the one place that lists them, their value's shape,
/// and whether `#[read_only_tool]` takes them. Messages that list the valid options are
/// generated from it, in this order; defaults live with the rules in `valid.rs`.
struct OptionSpec {
    name: &'static str,
    shape: Shape,
    read_only: bool,
}

const OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        name: "idempotency_key_fields",
        shape: Shape::KeyFields,
        read_only: false,
    },
    OptionSpec {
        name: "name",
        shape: Shape::Str("\"create_order\""),
        read_only: true,
    },
    OptionSpec {
        name: "description",
        shape: Shape::Str("\"Place an order for the user's cart.\""),
        read_only: true,
    },
    OptionSpec {
        name: "version",
        shape: Shape::Int,
        read_only: false,
    },
    OptionSpec {
        name: "ttl",
        shape: Shape::Str("\"24h\""),
        read_only: false,
    },
    OptionSpec {
        name: "lease",
        shape: Shape::Str("\"30s\""),
        read_only: false,
    },
    OptionSpec {
        name: "max_wait",
        shape: Shape::Str("\"30s\""),
        read_only: false,
    },
    OptionSpec {
        name: "concurrent",
        shape: Shape::Str("\"wait\""),
        read_only: false,
    },
    OptionSpec {
        name: "payload_mismatch",
        shape: Shape::Str("\"reject\""),
        read_only: false,
    },
    OptionSpec {
        name: "on_unknown",
        shape: Shape::Str("\"fail\""),
        read_only: false,
    },
    OptionSpec {
        name: "cache_errors",
        shape: Shape::Flag { bare: false },
        read_only: false,
    },
    OptionSpec {
        name: "destructive",
        shape: Shape::Flag { bare: true },
        read_only: false,
    },
    OptionSpec {
        name: "open_world",
        shape: Shape::Flag { bare: true },
        read_only: true,
    },
    OptionSpec {
        name: "verify",
        shape: Shape::FnPath("verify_order"),
        read_only: false,
    },
    OptionSpec {
        name: "unknown_outcome_if",
        shape: Shape::FnPath("is_timeout"),
        read_only: false,
    },
    OptionSpec {
        name: "compensate",
        shape: Shape::FnPath("refund_order"),
        read_only: false,
    },
    OptionSpec {
        name: "task",
        shape: Shape::Str("\"optional\""),
        read_only: false,
    },
    OptionSpec {
        name: "approval",
        shape: Shape::StrOrFnPath("\"required\""),
        read_only: false,
    },
    OptionSpec {
        name: "approval_expires",
        shape: Shape::Str("\"24h\""),
        read_only: false,
    },
];

/// The options an attribute takes, in the order messages list them.
pub(crate) fn valid_options(kind: Kind) -> impl Iterator<Item = &'static str> {
    OPTIONS
        .iter()
        .filter(move |o| kind == Kind::Mutating || o.read_only)
        .map(|o| o.name)
}

/// A parsed option value, of its [`Shape`].
enum Value {
    KeyFields(KeyFields),
    Str(LitStr),
    Int(LitInt),
    Flag(Flag),
    FnPath(syn::ExprPath),
    StrOrFnPath(StrOrFnPath),
}

/// `approval = "required"` or `approval = path::to::policy`.
pub(crate) enum StrOrFnPath {
    Str(LitStr),
    FnPath(syn::ExprPath),
}

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
    /// `compensate = path::to::undo`: the call's undo inside a run.
    pub compensate: Option<Opt<syn::ExprPath>>,
    /// `task = "optional"`: MCP calls may become tasks.
    pub task: Option<Opt<LitStr>>,
    /// `approval = "required" | "never" | path::to::policy`.
    pub approval: Option<Opt<StrOrFnPath>>,
    /// `approval_expires = "24h"`.
    pub approval_expires: Option<Opt<LitStr>>,
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
    let known = input.fork().call(Ident::parse_any).ok().and_then(|ident| {
        let written = ident.unraw().to_string();
        OPTIONS.iter().find(|o| o.name == written)
    });
    let Some(spec) = known else {
        return Err(unknown_option(kind, input));
    };
    let kw = input.call(Ident::parse_any)?;
    let value = match spec.shape {
        Shape::KeyFields => Value::KeyFields(parse_key_fields(input, errors)?),
        Shape::Str(example) => Value::Str(parse_str(input, &kw, example)?),
        Shape::Int => Value::Int(parse_int(input, &kw)?),
        Shape::Flag { bare } => Value::Flag(parse_flag(input, &kw, bare)?),
        Shape::FnPath(example) => Value::FnPath(parse_fn_path(input, &kw, example)?),
        Shape::StrOrFnPath(example) => {
            let lit = input.peek(Token![=]) && input.peek2(LitStr);
            Value::StrOrFnPath(match lit {
                true => StrOrFnPath::Str(parse_str(input, &kw, example)?),
                false => StrOrFnPath::FnPath(parse_fn_path(input, &kw, "needs_approval")?),
            })
        }
    };
    args.set(spec.name, kw, value, errors);
    Ok(())
}

impl Args {
    /// Stores a parsed option in its field (the name and shape come from [`OPTIONS`]).
    fn set(&mut self, name: &str, kw: Ident, value: Value, errors: &mut Errors) {
        match (name, value) {
            ("idempotency_key_fields", Value::KeyFields(v)) => {
                store(&mut self.key_fields, kw, v, errors)
            }
            ("name", Value::Str(v)) => store(&mut self.name, kw, v, errors),
            ("description", Value::Str(v)) => store(&mut self.description, kw, v, errors),
            ("version", Value::Int(v)) => store(&mut self.version, kw, v, errors),
            ("ttl", Value::Str(v)) => store(&mut self.ttl, kw, v, errors),
            ("lease", Value::Str(v)) => store(&mut self.lease, kw, v, errors),
            ("max_wait", Value::Str(v)) => store(&mut self.max_wait, kw, v, errors),
            ("concurrent", Value::Str(v)) => store(&mut self.concurrent, kw, v, errors),
            ("payload_mismatch", Value::Str(v)) => store(&mut self.payload_mismatch, kw, v, errors),
            ("on_unknown", Value::Str(v)) => store(&mut self.on_unknown, kw, v, errors),
            ("cache_errors", Value::Flag(v)) => store(&mut self.cache_errors, kw, v, errors),
            ("destructive", Value::Flag(v)) => store(&mut self.destructive, kw, v, errors),
            ("open_world", Value::Flag(v)) => store(&mut self.open_world, kw, v, errors),
            ("verify", Value::FnPath(v)) => store(&mut self.verify, kw, v, errors),
            ("unknown_outcome_if", Value::FnPath(v)) => {
                store(&mut self.unknown_outcome_if, kw, v, errors)
            }
            ("compensate", Value::FnPath(v)) => store(&mut self.compensate, kw, v, errors),
            ("task", Value::Str(v)) => store(&mut self.task, kw, v, errors),
            ("approval", Value::StrOrFnPath(v)) => store(&mut self.approval, kw, v, errors),
            ("approval_expires", Value::Str(v)) => store(&mut self.approval_expires, kw, v, errors),
            // The table and this match disagree: a bug here, reported, never a panic.
            (name, _) => errors.push(syn::Error::new(
                kw.span(),
                format!("internal error: option `{name}` has no field; please report it"),
            )),
        }
    }
}

fn unknown_option(kind: Kind, input: ParseStream) -> syn::Error {
    let valid: Vec<&str> = valid_options(kind).collect();
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

/// An error spanned at the next token (the one the user must change), or at the end.
fn at_next(input: ParseStream, message: String) -> syn::Error {
    let span = input
        .cursor()
        .token_tree()
        .map_or(input.span(), |(tt, _)| tt.span());
    syn::Error::new(span, message)
}

/// `= <literal>`, where `peek` says whether the next token is the literal expected (`what`).
fn parse_lit<T: syn::parse::Parse>(
    input: ParseStream,
    kw: &Ident,
    example: &str,
    peek: fn(ParseStream) -> bool,
    what: &str,
) -> syn::Result<T> {
    expect_eq(input, kw, example)?;
    if peek(input) {
        return input.parse();
    }
    Err(at_next(
        input,
        format!("expected {what}: write `{kw} = {example}`"),
    ))
}

fn parse_str(input: ParseStream, kw: &Ident, example: &str) -> syn::Result<LitStr> {
    parse_lit(input, kw, example, |i| i.peek(LitStr), "a string literal")
}

fn parse_int(input: ParseStream, kw: &Ident) -> syn::Result<LitInt> {
    parse_lit(input, kw, "2", |i| i.peek(LitInt), "an integer")
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
        return Err(at_next(
            input,
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
    let lit: LitBool = parse_lit(input, kw, "true", |i| i.peek(LitBool), "`true` or `false`")?;
    Ok(Flag { value: lit.value })
}

fn parse_key_fields(input: ParseStream, errors: &mut Errors) -> syn::Result<KeyFields> {
    const EXAMPLE: &str = "write the key fields as a list of parameter paths, like `idempotency_key_fields = [user_id, cart.id]`";
    if !input.peek(Token![=]) {
        return Err(input.error(format!("expected `=`: {EXAMPLE}")));
    }
    input.parse::<Token![=]>()?;
    if !input.peek(token::Bracket) {
        return Err(at_next(input, format!("expected `[`: {EXAMPLE}")));
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
    use crate::assert_has;
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
        assert_has(&errors[0], "did you mean `idempotency_key_fields`?");
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
        assert_has(&errors[1], "expected `=` after `name`");
        assert_has(&errors[2], "expected an integer");
        assert_has(&errors[3], "write `cache_errors = true`");
        assert_has(&errors[4], "expected `[`");
        assert_has(&errors[5], "expected `true` or `false`");
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
    fn compensate_is_a_path_to_a_function() {
        let args = parse_ok(
            Kind::Mutating,
            quote! { idempotency_key_fields = [id], compensate = crate::undo::refund },
        );
        assert_eq!(
            quote::ToTokens::to_token_stream(&args.compensate.unwrap().value).to_string(),
            "crate :: undo :: refund"
        );
        let errors = parse_errors(
            Kind::Mutating,
            quote! { compensate = "refund", compensate = refund(order) },
        );
        assert_eq!(
            errors,
            [
                "`compensate` takes a path to a function, not a string: write `compensate = refund` without quotes",
                "`compensate` names the function, it does not call it: remove the arguments and write `compensate = refund`",
            ]
        );
    }

    #[test]
    fn missing_comma_between_options() {
        let errors = parse_errors(Kind::Mutating, quote! { ttl = "1h" lease = "2s" });
        assert_eq!(errors, ["expected `,` between options"]);
    }
}
