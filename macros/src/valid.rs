//! Every semantic rule. Turns the attribute (`args.rs`) and the function
//! (`model.rs`) into a `Contract` that `expand.rs` can emit without further
//! checks, or reports every violation at once, each spanned at the token the
//! user must change.

use crate::args::{bracket_span, Args, Flag, KeyField, Opt, StrOrFnPath};
use crate::diag::{backticked, closest, type_to_string, Errors};
use crate::model::{Model, Param};
use crate::Kind;
use proc_macro2::{Span, TokenStream, TokenTree};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::{GenericArgument, Ident, LitStr, PathArguments, ReturnType, Type};

/// Default time a completed call's record is kept (24h).
pub(crate) const DEFAULT_TTL_MS: u64 = 24 * 60 * 60 * 1000;
/// Default lease a running call holds before another caller may take over (30s).
pub(crate) const DEFAULT_LEASE_MS: u64 = 30 * 1000;
/// Default time a duplicate waits for a running call before `InProgress` (30s).
pub(crate) const DEFAULT_MAX_WAIT_MS: u64 = 30 * 1000;

/// Type names that denote a point in time; keying on one defeats the point of
/// a key.
const CLOCK_TYPES: &[&str] = &[
    "SystemTime",
    "Instant",
    "DateTime",
    "NaiveDateTime",
    "NaiveTime",
    "OffsetDateTime",
    "PrimitiveDateTime",
    "UtcDateTime",
    "Timestamp",
    "Zoned",
];

/// How long an approval request stays open, and an approval usable, by default: a day,
/// so a request made in the evening is still there in the morning.
const DEFAULT_APPROVAL_EXPIRES_MS: u64 = 86_400_000;

const DURATION_HINT: &str = r#"write a duration like "30s", "15m", "24h" or "1h30m""#;
const NAME_RULE: &str =
    "tool names are 1 to 128 characters from `A-Z`, `a-z`, `0-9`, `_`, `-` and `.`";

/// A checked tool: everything `expand.rs` needs, already validated.
pub(crate) struct Contract<'a> {
    pub kind: Kind,
    pub model: &'a Model<'a>,
    pub name: String,
    /// A `&'static str` expression: a literal, or `concat!` around `include_str!`s.
    pub description: TokenStream,
    pub version: u32,
    pub ttl_ms: u64,
    pub lease_ms: u64,
    pub max_wait_ms: u64,
    /// Variant names of the runtime enums (`Wait`, `Reject`, ...).
    pub concurrent: &'static str,
    pub payload_mismatch: &'static str,
    pub on_unknown: &'static str,
    /// Variant of the runtime's `TaskSupport`.
    pub task: &'static str,
    pub cache_errors: bool,
    pub destructive: bool,
    pub open_world: bool,
    /// `verify = path`: reconciles abandoned calls.
    pub verify: Option<&'a syn::ExprPath>,
    /// `unknown_outcome_if = path`: errors that keep the claim for reconciliation.
    pub unknown_outcome_if: Option<&'a syn::ExprPath>,
    /// `approval = ...`: the runtime's `ApprovalRule` variant, and the policy function.
    pub approval: &'static str,
    pub approval_policy: Option<&'a syn::ExprPath>,
    pub approval_expires_ms: u64,
    /// `compensate = path`: the call's undo when it was made inside a run (free functions).
    pub compensate: Option<&'a syn::ExprPath>,
    /// Sorted in JCS order (UTF-16 code units of the path).
    pub key_fields: Vec<&'a KeyField>,
    pub params: Vec<ToolParam<'a>>,
    /// The whole return type, `Result<T, E>`.
    pub ret: &'a Type,
    pub ok: &'a Type,
    pub err: &'a Type,
}

impl Contract<'_> {
    /// Free functions are registered; methods are not (a nested item cannot
    /// name `Self`).
    pub(crate) fn registered(&self) -> bool {
        !self.model.is_method()
    }
}

/// A parameter whose pattern is a plain name.
pub(crate) struct ToolParam<'a> {
    pub ident: &'a Ident,
    pub ty: &'a Type,
    pub context: Option<Context<'a>>,
}

impl ToolParam<'_> {
    /// The JSON argument name.
    pub(crate) fn json_name(&self) -> String {
        self.ident.unraw().to_string()
    }
}

/// How a `#[context]` parameter is injected.
pub(crate) enum Context<'a> {
    /// `&T`: `Context::get::<T>`.
    Borrowed(&'a Type),
    /// `T`: `Context::get_cloned::<T>`.
    Owned,
}

/// Checks everything. `errors` may already hold syntax errors from `args.rs`;
/// `None` is returned when there is any error at all.
pub(crate) fn check<'a>(
    kind: Kind,
    args: &'a Args,
    model: &'a Model<'a>,
    errors: &mut Errors,
) -> Option<Contract<'a>> {
    let func = model.func;
    let sig = &func.sig;
    let attr = kind.attr();
    let registered = !model.is_method();

    if sig.asyncness.is_none() {
        errors.push(syn::Error::new(
            sig.fn_token.span,
            format!(
                "`#[{attr}]` needs an `async fn`: write `async fn {}(...)`; synchronous tools are not supported",
                sig.ident
            ),
        ));
    }
    if registered {
        if let syn::Safety::Unsafe(unsafety) = &sig.safety {
            errors.push(syn::Error::new(
                unsafety.span,
                "registered tools cannot be `unsafe fn`: the registry calls them with arguments decoded from JSON",
            ));
        }
    }
    for other in &func.attrs {
        let last = other.path().segments.last().map(|s| s.ident.to_string());
        if matches!(last.as_deref(), Some("mutating_tool" | "read_only_tool")) {
            errors.push(syn::Error::new_spanned(
                other,
                "a function can carry only one `#[mutating_tool]` or `#[read_only_tool]` attribute",
            ));
        }
    }

    check_options_apply(kind, args, errors);
    check_verify_policy(args, errors);
    check_compensate(kind, args, model, errors);
    check_wait_policy(args, errors);
    let name = tool_name(args, model, errors);
    let description = match &args.description {
        Some(opt) => {
            let text = opt.value.value();
            quote::quote!(#text)
        }
        None => model.doc_tokens(),
    };
    let version = args.version.as_ref().map_or(1, |opt| version(opt, errors));
    let ttl_ms = args
        .ttl
        .as_ref()
        .map_or(DEFAULT_TTL_MS, |opt| duration(opt, errors));
    let lease_ms = args
        .lease
        .as_ref()
        .map_or(DEFAULT_LEASE_MS, |opt| duration(opt, errors));
    let max_wait_ms = args
        .max_wait
        .as_ref()
        .map_or(DEFAULT_MAX_WAIT_MS, |opt| duration(opt, errors));
    let concurrent = choice(
        &args.concurrent,
        &[("wait", "Wait"), ("reject", "Reject")],
        errors,
    );
    let payload_mismatch = choice(
        &args.payload_mismatch,
        &[("reject", "Reject"), ("replay", "Replay")],
        errors,
    );
    let on_unknown = choice(
        &args.on_unknown,
        &[("fail", "Fail"), ("rerun", "Rerun")],
        errors,
    );
    let task = choice(
        &args.task,
        &[
            ("forbidden", "Forbidden"),
            ("optional", "Optional"),
            ("required", "Required"),
        ],
        errors,
    );
    let flag = |opt: &Option<Opt<Flag>>| opt.as_ref().is_some_and(|o| o.value.value);
    let (approval, approval_policy) = approval_rule(args, errors);
    let approval_expires_ms = approval_expires(args, approval, errors);

    check_generics(model, errors);
    if let Some(receiver) = model.receiver {
        for a in receiver
            .attrs
            .iter()
            .filter(|a| crate::model::is_context(a))
        {
            errors.push(syn::Error::new_spanned(
                a,
                "`#[context]` marks injected parameters; the receiver cannot be one",
            ));
        }
    }
    let params = check_params(model, errors);
    let result = return_type(kind, model, errors);

    let key_fields = match kind {
        Kind::Mutating => check_key_fields(args, model, errors),
        Kind::ReadOnly => Vec::new(),
    };

    if !errors.is_empty() {
        return None;
    }
    let (ret, ok, err) = result?;
    Some(Contract {
        kind,
        model,
        name,
        description,
        version,
        ttl_ms,
        lease_ms,
        max_wait_ms,
        concurrent,
        payload_mismatch,
        on_unknown,
        task,
        cache_errors: flag(&args.cache_errors),
        destructive: flag(&args.destructive),
        open_world: flag(&args.open_world),
        verify: args.verify.as_ref().map(|o| &o.value),
        unknown_outcome_if: args.unknown_outcome_if.as_ref().map(|o| &o.value),
        approval,
        approval_policy,
        approval_expires_ms,
        compensate: args.compensate.as_ref().map(|o| &o.value),
        key_fields,
        params: params?,
        ret,
        ok,
        err,
    })
}

/// `#[read_only_tool]` accepts only `name`, `description` and `open_world`.
fn check_options_apply(kind: Kind, args: &Args, errors: &mut Errors) {
    if kind != Kind::ReadOnly {
        return;
    }
    if let Some(opt) = &args.key_fields {
        errors.push(syn::Error::new(
            opt.kw.span(),
            "read-only tools need no key: they run on every call and are never deduplicated; \
             remove `idempotency_key_fields`, or use `#[mutating_tool]` if this tool changes anything",
        ));
    }
    let mutating_only = [
        args.version.as_ref().map(|o| &o.kw),
        args.ttl.as_ref().map(|o| &o.kw),
        args.lease.as_ref().map(|o| &o.kw),
        args.max_wait.as_ref().map(|o| &o.kw),
        args.concurrent.as_ref().map(|o| &o.kw),
        args.payload_mismatch.as_ref().map(|o| &o.kw),
        args.on_unknown.as_ref().map(|o| &o.kw),
        args.cache_errors.as_ref().map(|o| &o.kw),
        args.destructive.as_ref().map(|o| &o.kw),
        args.verify.as_ref().map(|o| &o.kw),
        args.unknown_outcome_if.as_ref().map(|o| &o.kw),
        args.task.as_ref().map(|o| &o.kw),
        args.approval.as_ref().map(|o| &o.kw),
        args.approval_expires.as_ref().map(|o| &o.kw),
        args.compensate.as_ref().map(|o| &o.kw),
    ];
    for kw in mutating_only.into_iter().flatten() {
        errors.push(syn::Error::new(
            kw.span(),
            format!(
                "`{kw}` does not apply to `#[read_only_tool]`: read-only tools are never deduplicated; \
                 valid options are {} (use `#[mutating_tool]` if this tool changes anything)",
                backticked(crate::args::valid_options(Kind::ReadOnly))
            ),
        ));
    }
}

/// `verify` decides what happens to an abandoned call; `on_unknown = "rerun"` would decide
/// too, differently.
fn check_verify_policy(args: &Args, errors: &mut Errors) {
    let (Some(verify), Some(on_unknown)) = (&args.verify, &args.on_unknown) else {
        return;
    };
    if on_unknown.value.value() != "rerun" {
        return;
    }
    let path = crate::diag::tidy(&verify.value.to_token_stream().to_string());
    let kw = &on_unknown.kw;
    let lit = &on_unknown.value;
    errors.push(syn::Error::new_spanned(
        quote::quote!(#kw = #lit),
        format!(
            "`on_unknown = \"rerun\"` contradicts `verify = {path}`: with `verify`, an abandoned call is \
             reconciled by asking `{path}` whether its effect already happened, and the body runs again only \
             if it did not, while `rerun` runs it again without asking. Pick one: remove `on_unknown = \"rerun\"` \
             to verify first, or remove `verify` to rerun blindly"
        ),
    ));
}

/// `compensate` names the undo of a free function: the undo runs when a run is compensated,
/// from the arguments the store kept with the call, where no receiver exists (and a method's
/// types may name `Self`, which the undo's nested entry point cannot).
fn check_compensate(kind: Kind, args: &Args, model: &Model, errors: &mut Errors) {
    let Some(opt) = &args.compensate else {
        return;
    };
    if kind == Kind::Mutating && model.is_method() {
        errors.push(syn::Error::new(
            opt.kw.span(),
            format!(
                "`compensate` does not apply to methods: the undo runs when a run is compensated, from the \
                 arguments the store kept with the call, where there is no `self`; make `{}` a free function, \
                 or undo the call inside a step (`Run::step_with_undo`)",
                model.func.sig.ident
            ),
        ));
    }
}

/// `max_wait` bounds how long a duplicate waits; with `concurrent = "reject"` nobody waits.
fn check_wait_policy(args: &Args, errors: &mut Errors) {
    let (Some(max_wait), Some(concurrent)) = (&args.max_wait, &args.concurrent) else {
        return;
    };
    if concurrent.value.value() == "reject" {
        errors.push(syn::Error::new(
            max_wait.kw.span(),
            "`max_wait` does not apply with `concurrent = \"reject\"`: a duplicate is refused at once and never waits; \
             remove `max_wait`, or use `concurrent = \"wait\"`",
        ));
    }
}

/// `^[A-Za-z0-9_.-]{1,128}$`, the MCP tool-name rule.
pub(crate) fn valid_tool_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

fn tool_name(args: &Args, model: &Model, errors: &mut Errors) -> String {
    if let Some(opt) = &args.name {
        let name = opt.value.value();
        if !valid_tool_name(&name) {
            errors.push(syn::Error::new(
                opt.value.span(),
                format!("invalid tool name {name:?}: {NAME_RULE}"),
            ));
        }
        return name;
    }
    let ident = &model.func.sig.ident;
    let name = ident.unraw().to_string();
    if !valid_tool_name(&name) {
        errors.push(syn::Error::new(
            ident.span(),
            format!(
                "the tool name defaults to the function name {name:?}, which is not a valid tool name \
                 ({NAME_RULE}): set one with `name = \"...\"`"
            ),
        ));
    }
    name
}

fn version(opt: &Opt<syn::LitInt>, errors: &mut Errors) -> u32 {
    let lit = &opt.value;
    let suffix_ok = matches!(lit.suffix(), "" | "u32");
    match lit.base10_parse::<u32>() {
        Ok(v) if v >= 1 && suffix_ok => v,
        _ => {
            errors.push(syn::Error::new(
                lit.span(),
                "`version` is a schema version: an integer from 1 to 4294967295, like `version = 2`",
            ));
            1
        }
    }
}

/// Parses `<digits><unit>` groups (units `d`, `h`, `m`, `s`, `ms`, each at
/// most once, largest first) into milliseconds.
pub(crate) fn parse_duration(text: &str) -> Result<u64, &'static str> {
    const UNITS: &[(&str, u64)] = &[
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("ms", 1),
        ("m", 60_000),
        ("s", 1_000),
    ];
    fn rank(unit: &str) -> usize {
        ["d", "h", "m", "s", "ms"]
            .iter()
            .position(|u| *u == unit)
            .unwrap_or(usize::MAX)
    }
    if text.is_empty() {
        return Err("malformed");
    }
    let mut rest = text;
    let mut total: u64 = 0;
    let mut last_rank: Option<usize> = None;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err("malformed");
        }
        let (number, tail) = rest.split_at(digits);
        let Some((unit, factor)) = UNITS.iter().find(|(u, _)| tail.starts_with(u)) else {
            return Err("malformed");
        };
        let r = rank(unit);
        if last_rank.is_some_and(|last| r <= last) {
            return Err("malformed");
        }
        last_rank = Some(r);
        let n: u64 = number.parse().map_err(|_| "too large")?;
        total = n
            .checked_mul(*factor)
            .and_then(|ms| total.checked_add(ms))
            .ok_or("too large")?;
        rest = &tail[unit.len()..];
    }
    if total == 0 {
        return Err("zero");
    }
    Ok(total)
}

fn duration(opt: &Opt<LitStr>, errors: &mut Errors) -> u64 {
    let text = opt.value.value();
    let kw = &opt.kw;
    match parse_duration(&text) {
        Ok(ms) => ms,
        Err(problem) => {
            let message = match problem {
                "zero" => format!("`{kw}` must be longer than zero: {DURATION_HINT}"),
                "too large" => format!("`{kw}` = {text:?} is too large: {DURATION_HINT}"),
                _ => format!("`{kw}` = {text:?} is not a duration: {DURATION_HINT}"),
            };
            errors.push(syn::Error::new(opt.value.span(), message));
            1
        }
    }
}

/// `approval`: the runtime's `ApprovalRule` variant, and the policy function if one.
fn approval_rule<'a>(
    args: &'a Args,
    errors: &mut Errors,
) -> (&'static str, Option<&'a syn::ExprPath>) {
    let Some(opt) = &args.approval else {
        return ("Default", None);
    };
    match &opt.value {
        StrOrFnPath::FnPath(path) => ("Policy", Some(path)),
        StrOrFnPath::Str(lit) => match lit.value().as_str() {
            "required" => ("Required", None),
            "never" => ("Never", None),
            written => {
                errors.push(syn::Error::new(
                    lit.span(),
                    format!(
                        "`approval` must be \"required\", \"never\" or a path to a policy function \
                         (`approval = needs_approval`, a `fn` taking the tool's parameters by reference \
                         and returning `bool`), not {written:?}"
                    ),
                ));
                ("Default", None)
            }
        },
    }
}

/// `approval_expires`: only where a call can wait for approval.
fn approval_expires(args: &Args, approval: &str, errors: &mut Errors) -> u64 {
    let Some(opt) = &args.approval_expires else {
        return DEFAULT_APPROVAL_EXPIRES_MS;
    };
    let destructive = args.destructive.as_ref().is_some_and(|o| o.value.value);
    let asks = matches!(approval, "Required" | "Policy") || (approval == "Default" && destructive);
    if !asks {
        errors.push(syn::Error::new(
            opt.kw.span(),
            "`approval_expires` says how long an approval request stays open, but no call of this tool asks for one; \
             add `approval = \"required\"` (or a policy function), or remove `approval_expires`",
        ));
    }
    duration(opt, errors)
}

/// A string option with a closed set of values; returns the runtime variant.
fn choice(
    opt: &Option<Opt<LitStr>>,
    values: &[(&str, &'static str)],
    errors: &mut Errors,
) -> &'static str {
    let Some(opt) = opt else {
        return values[0].1;
    };
    let written = opt.value.value();
    if let Some((_, variant)) = values.iter().find(|(v, _)| *v == written) {
        return variant;
    }
    let list = values
        .iter()
        .map(|(v, _)| format!("\"{v}\""))
        .collect::<Vec<_>>()
        .join(" or ");
    errors.push(syn::Error::new(
        opt.value.span(),
        format!("`{}` must be {list}, not {written:?}", opt.kw),
    ));
    values[0].1
}

/// Registered tools are called with arguments decoded from JSON, so nothing
/// about their types can be left for the caller to choose.
fn check_generics(model: &Model, errors: &mut Errors) {
    if model.is_method() {
        return;
    }
    const WHY: &str = "methods may be generic: they are deduplicated but not registered";
    for param in &model.func.sig.generics.params {
        match param {
            syn::GenericParam::Type(t) => errors.push(syn::Error::new_spanned(
                t,
                format!(
                    "registered tools cannot be generic: a JSON call cannot choose `{}`; use a concrete type ({WHY})",
                    t.ident
                ),
            )),
            syn::GenericParam::Const(c) => errors.push(syn::Error::new_spanned(
                c,
                format!(
                    "registered tools cannot be generic: a JSON call cannot choose `{}`; use a constant ({WHY})",
                    c.ident
                ),
            )),
            syn::GenericParam::Lifetime(_) => {}
        }
    }
    for param in &model.params {
        if let Some(imp) = find_impl_trait(param.ty) {
            errors.push(syn::Error::new_spanned(
                imp,
                format!(
                    "registered tools cannot be generic: `{}` is a hidden type parameter a JSON call cannot choose; \
                     take a concrete type ({WHY})",
                    type_to_string(imp)
                ),
            ));
        }
    }
}

/// The first `impl Trait` inside a type, if any.
pub(crate) fn find_impl_trait(ty: &Type) -> Option<&Type> {
    // A walk of the syntax tree: `impl Trait` anywhere inside (generic arguments,
    // tuples, references, function pointer parameters...), never a match on text.
    struct Find<'ast>(Option<&'ast Type>);
    impl<'ast> syn::visit::Visit<'ast> for Find<'ast> {
        fn visit_type(&mut self, ty: &'ast Type) {
            match ty {
                Type::ImplTrait(_) => {
                    self.0.get_or_insert(ty);
                }
                _ => syn::visit::visit_type(self, ty),
            }
        }
    }
    let mut find = Find(None);
    syn::visit::Visit::visit_type(&mut find, ty);
    find.0
}

/// Whether a type borrows: contains a reference or a lifetime other than
/// `'static` (token scan, so nothing is missed).
fn borrows(ty: &Type) -> bool {
    fn scan(tokens: TokenStream) -> bool {
        let mut tokens = tokens.into_iter().peekable();
        while let Some(tt) = tokens.next() {
            match tt {
                TokenTree::Punct(p) if p.as_char() == '&' => return true,
                TokenTree::Punct(p) if p.as_char() == '\'' => {
                    if let Some(TokenTree::Ident(i)) = tokens.peek() {
                        if i != "static" {
                            return true;
                        }
                    }
                }
                TokenTree::Group(g) if scan(g.stream()) => return true,
                _ => {}
            }
        }
        false
    }
    scan(ty.to_token_stream())
}

/// The owned type to suggest for a borrowed one: `&str` → `String`,
/// `&[T]` → `Vec<T>`, `&T` → `T`, recursively.
pub(crate) fn owned_suggestion(ty: &Type) -> String {
    match ty {
        Type::Reference(r) => match &*r.elem {
            Type::Path(p) if p.qself.is_none() && p.path.segments.len() == 1 => {
                let ident = p.path.segments[0].ident.to_string();
                match ident.as_str() {
                    "str" => "String".to_owned(),
                    "Path" => "PathBuf".to_owned(),
                    "OsStr" => "OsString".to_owned(),
                    "CStr" => "CString".to_owned(),
                    _ => owned_suggestion(&r.elem),
                }
            }
            Type::Slice(s) => format!("Vec<{}>", owned_suggestion(&s.elem)),
            Type::TraitObject(_) => format!("Box<{}>", type_to_string(&r.elem)),
            elem => owned_suggestion(elem),
        },
        Type::Path(p) if p.qself.is_none() => {
            let mut p = p.clone();
            for seg in &mut p.path.segments {
                if let PathArguments::AngleBracketed(a) = &mut seg.arguments {
                    for arg in &mut a.args {
                        match arg {
                            GenericArgument::Type(t) => {
                                let owned = owned_suggestion(t);
                                *t = Type::Verbatim(
                                    owned.parse().unwrap_or_else(|_| t.to_token_stream()),
                                );
                            }
                            GenericArgument::Lifetime(lt) => {
                                lt.ident = Ident::new("static", lt.ident.span());
                            }
                            _ => {}
                        }
                    }
                }
            }
            type_to_string(&Type::Path(p))
        }
        Type::Slice(s) => format!("[{}]", owned_suggestion(&s.elem)),
        Type::Array(a) => format!(
            "[{}; {}]",
            owned_suggestion(&a.elem),
            a.len.to_token_stream()
        ),
        Type::Tuple(t) => {
            let elems: Vec<String> = t.elems.iter().map(owned_suggestion).collect();
            if elems.len() == 1 {
                format!("({},)", elems[0])
            } else {
                format!("({})", elems.join(", "))
            }
        }
        Type::Paren(p) => format!("({})", owned_suggestion(&p.elem)),
        Type::Group(g) => owned_suggestion(&g.elem),
        other => type_to_string(other),
    }
}

fn check_params<'a>(model: &'a Model<'a>, errors: &mut Errors) -> Option<Vec<ToolParam<'a>>> {
    let registered = !model.is_method();
    let mut out = Vec::new();
    let mut ok = true;
    for param in &model.params {
        ok &= check_param_attrs(param, errors);
        let Some(ident) = param.ident else {
            errors.push(syn::Error::new_spanned(
                &param.arg.pat,
                "tool parameters must be plain names (the name is the JSON argument name): \
                 bind the whole value, like `pair: (u64, u64)`, and destructure it in the body",
            ));
            ok = false;
            continue;
        };
        let context = if param.is_context() {
            match param.ty {
                Type::Reference(r) if r.mutability.is_some() => {
                    errors.push(syn::Error::new_spanned(
                        param.ty,
                        format!(
                            "context values are shared by every call: take `&{}` (or an owned clone) instead of `{}`",
                            type_to_string(&r.elem),
                            type_to_string(param.ty)
                        ),
                    ));
                    ok = false;
                    None
                }
                Type::Reference(r) => Some(Context::Borrowed(&r.elem)),
                _ => Some(Context::Owned),
            }
        } else {
            if registered && borrows(param.ty) {
                let message = if matches!(param.ty, Type::Reference(_)) || has_reference(param.ty) {
                    format!(
                        "registered tools take owned arguments decoded from JSON; write `{}` instead of `{}` \
                         (or mark the parameter `#[context]` if the registry injects it)",
                        owned_suggestion(param.ty),
                        type_to_string(param.ty)
                    )
                } else {
                    format!(
                        "registered tools take owned arguments decoded from JSON; `{}` borrows: write `{}` instead",
                        type_to_string(param.ty),
                        owned_suggestion(param.ty)
                    )
                };
                errors.push(syn::Error::new_spanned(param.ty, message));
                ok = false;
            }
            None
        };
        out.push(ToolParam {
            ident,
            ty: param.ty,
            context,
        });
    }
    ok.then_some(out)
}

fn has_reference(ty: &Type) -> bool {
    ty.to_token_stream().to_string().contains('&')
}

/// `#[context]` takes no arguments and appears at most once; `#[cfg]` on a
/// tool parameter would leave the generated code naming a missing binding.
fn check_param_attrs(param: &Param, errors: &mut Errors) -> bool {
    let mut ok = true;
    for (i, attr) in param.context.iter().enumerate() {
        if !matches!(attr.meta, syn::Meta::Path(_)) {
            errors.push(syn::Error::new_spanned(
                &attr.meta,
                "`#[context]` takes no arguments: write `#[context]`",
            ));
            ok = false;
        }
        if i > 0 {
            errors.push(syn::Error::new_spanned(attr, "duplicate `#[context]`"));
            ok = false;
        }
    }
    for attr in &param.arg.attrs {
        if attr.path().is_ident("cfg") || attr.path().is_ident("cfg_attr") {
            errors.push(syn::Error::new_spanned(
                attr,
                "tool parameters cannot be conditional: a tool's arguments are part of its contract",
            ));
            ok = false;
        }
    }
    ok
}

/// `Result<T, E>` with both parameters written out.
fn return_type<'a>(
    kind: Kind,
    model: &'a Model<'a>,
    errors: &mut Errors,
) -> Option<(&'a Type, &'a Type, &'a Type)> {
    let sig = &model.func.sig;
    let attr = kind.attr();
    let bound = match kind {
        Kind::Mutating => "E: From<tool_contracts::Error>",
        Kind::ReadOnly => "E: Display",
    };
    let ty = match &sig.output {
        ReturnType::Type(_, ty) => &**ty,
        ReturnType::Default => {
            errors.push(syn::Error::new(
                sig.paren_token.span.close(),
                format!("`#[{attr}]` needs a return type `Result<T, E>` where {bound}: write `-> Result<T, E>`"),
            ));
            return None;
        }
    };
    let found = match ty {
        Type::Path(p) if p.qself.is_none() => p.path.segments.last().and_then(|seg| {
            if seg.ident != "Result" {
                return None;
            }
            match &seg.arguments {
                PathArguments::AngleBracketed(a) => Some(a),
                _ => None,
            }
        }),
        _ => None,
    };
    let types: Vec<&Type> = found
        .map(|a| {
            a.args
                .iter()
                .filter_map(|arg| match arg {
                    GenericArgument::Type(t) => Some(t),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let all_types = found.is_some_and(|a| a.args.len() == types.len());
    if !(all_types && types.len() == 2) {
        let message = if all_types && types.len() == 1 {
            format!(
                "`{}` hides the error type: `#[{attr}]` needs the return type written as `Result<{}, E>` where {bound}",
                type_to_string(ty),
                type_to_string(types[0])
            )
        } else {
            format!(
                "`#[{attr}]` needs the return type `Result<T, E>` where {bound}: write `-> Result<{}, E>`",
                type_to_string(ty)
            )
        };
        errors.push(syn::Error::new_spanned(ty, message));
        return None;
    }
    let (ok, err) = (types[0], types[1]);
    let mut fine = true;
    for t in [ok, err] {
        if let Some(imp) = find_impl_trait(t) {
            errors.push(syn::Error::new_spanned(
                imp,
                "tools must name their output and error types: write a concrete type instead of `impl Trait`",
            ));
            fine = false;
        }
    }
    fine.then_some((ty, ok, err))
}

fn check_key_fields<'a>(
    args: &'a Args,
    model: &'a Model<'a>,
    errors: &mut Errors,
) -> Vec<&'a KeyField> {
    let json_params: Vec<String> = model
        .params
        .iter()
        .filter(|p| !p.is_context())
        .filter_map(|p| p.ident.map(|i| i.unraw().to_string()))
        .collect();
    let Some(opt) = &args.key_fields else {
        let example = json_params.first().map_or("order_id", String::as_str);
        errors.push(syn::Error::new(
            Span::call_site(),
            format!(
                "`#[mutating_tool]` needs `idempotency_key_fields`: list the arguments that identify one intended \
                 operation, e.g. `#[mutating_tool(idempotency_key_fields = [{example}])]`"
            ),
        ));
        return Vec::new();
    };
    let fields = &opt.value.fields;
    if fields.is_empty() {
        let example = json_params.first().map_or("order_id", String::as_str);
        errors.push(syn::Error::new(
            bracket_span(&opt.value),
            format!(
                "`idempotency_key_fields` is empty: a key with no fields would make every call look like a retry \
                 of the first; list at least one argument, e.g. `[{example}]`"
            ),
        ));
        return Vec::new();
    }
    let mut accepted: Vec<(&KeyField, String)> = Vec::new();
    for field in fields {
        let path = field.path();
        let root = field.root.unraw().to_string();
        if root == "self" {
            errors.push(syn::Error::new_spanned(
                &field.tokens,
                "`self` is never part of the key: the key says which operation the caller intends, so list \
                 arguments that identify it (an order id, a cart id, a client-supplied request id)",
            ));
            continue;
        }
        let Some(param) = model
            .params
            .iter()
            .find(|p| p.ident.is_some_and(|i| i.unraw() == root))
        else {
            let suggestion = closest(&root, json_params.iter().map(String::as_str))
                .map(|best| format!("did you mean `{best}`? "))
                .unwrap_or_default();
            let params = backticked(json_params.iter().map(String::as_str));
            let message = if json_params.is_empty() {
                format!("no parameter named `{root}`; this function has no arguments that can be part of the key")
            } else if suggestion.is_empty() {
                format!("no parameter named `{root}`; parameters are {params}")
            } else {
                format!("no parameter named `{root}`; {suggestion}Parameters are {params}")
            };
            errors.push(syn::Error::new_spanned(&field.root, message));
            continue;
        };
        if param.is_context() {
            errors.push(syn::Error::new_spanned(
                &field.tokens,
                format!(
                    "`{root}` is a `#[context]` parameter: it is injected by the registry, not sent by the caller, \
                     so it cannot be part of the key; key on the tool's arguments"
                ),
            ));
            continue;
        }
        if let Some(message) = time_like_name(field) {
            errors.push(syn::Error::new_spanned(&field.tokens, message));
            continue;
        }
        if let (Some(intent), None) = (&field.intent, time_word(field)) {
            errors.push(syn::Error::new_spanned(
                intent,
                format!(
                    "`#[intent]` is only for a key field whose name says time or randomness; `{path}` does not: remove `#[intent]`"
                ),
            ));
            continue;
        }
        if let Some(clock) = clock_type(param.ty) {
            errors.push(syn::Error::new_spanned(
                &field.tokens,
                format!(
                    "`{root}` is a `{clock}`: a key derived from time differs on every retry, which defeats the point \
                     of a key; key on the caller's intent (an order id, a cart id, a client-supplied request id)"
                ),
            ));
            continue;
        }
        if accepted.iter().any(|(_, p)| *p == path) {
            errors.push(syn::Error::new_spanned(
                &field.tokens,
                format!("`{path}` is listed twice in `idempotency_key_fields`; remove this one"),
            ));
            continue;
        }
        if let Some((_, wider)) = accepted
            .iter()
            .find(|(_, p)| covers(p, &path) || covers(&path, p))
        {
            let (narrow, wide) = if covers(wider, &path) {
                (path.clone(), wider.clone())
            } else {
                (wider.clone(), path.clone())
            };
            errors.push(syn::Error::new_spanned(
                &field.tokens,
                format!(
                    "`{narrow}` is already part of the key through `{wide}`; list only one of them"
                ),
            ));
            continue;
        }
        accepted.push((field, path));
    }
    accepted.sort_by(|(_, a), (_, b)| jcs_cmp(a, b));
    accepted.into_iter().map(|(f, _)| f).collect()
}

/// The last named segment of a key field, lowercased, split into `_` words with a
/// trailing unit (`created_at_ms` -> `created`, `at`), and the word that makes it
/// look derived from time or per-attempt randomness, if one does.
fn time_word(field: &KeyField) -> Option<&'static str> {
    const UNITS: &[&str] = &[
        "ms", "s", "us", "ns", "secs", "millis", "micros", "nanos", "seconds", "epoch", "utc",
    ];
    let last = match field.members.last() {
        None => field.root.unraw().to_string(),
        Some(syn::Member::Named(ident)) => ident.unraw().to_string(),
        Some(syn::Member::Unnamed(_)) => return None,
    };
    let last = last.to_lowercase();
    let mut words: Vec<&str> = last.split('_').filter(|w| !w.is_empty()).collect();
    if words.len() > 1 && words.last().is_some_and(|w| UNITS.contains(w)) {
        words.pop();
    }
    let word = *words.last()?;
    match word {
        "at" if words.len() > 1 => Some("_at"),
        "time" => Some("_time"),
        "ts" => Some("_ts"),
        "timestamp" => Some("timestamp"),
        "nonce" => Some("nonce"),
        "attempt" => Some("attempt"),
        _ => None,
    }
}

/// The error for a key field whose name says time or per-attempt randomness and that
/// is not marked `#[intent]`.
fn time_like_name(field: &KeyField) -> Option<String> {
    if field.intent.is_some() {
        return None;
    }
    let word = time_word(field)?;
    let path = field.path();
    Some(format!(
        "`{path}` looks derived from time or a per-attempt value (its name says `{word}`): such a value differs on \
         every retry, so each retry would run again. Key on the caller's intent (an order id, a cart id, a \
         client-supplied request id); if the caller chose this value and sends the same one on every retry \
         (a booking's start), mark it: `#[intent] {path}`"
    ))
}

/// Whether key path `wide` contains `narrow` (`cart` covers `cart.id`).
fn covers(wide: &str, narrow: &str) -> bool {
    narrow.len() > wide.len() && narrow.starts_with(wide) && narrow.as_bytes()[wide.len()] == b'.'
}

/// JCS (RFC 8785) orders object keys by their UTF-16 code units.
pub(crate) fn jcs_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    a.encode_utf16().cmp(b.encode_utf16())
}

/// The clock type a parameter holds, looking through `&` and `Option<..>`.
fn clock_type(ty: &Type) -> Option<String> {
    match ty {
        Type::Reference(r) => clock_type(&r.elem),
        Type::Paren(p) => clock_type(&p.elem),
        Type::Group(g) => clock_type(&g.elem),
        Type::Path(p) => {
            let last = p.path.segments.last()?;
            let name = last.ident.to_string();
            if name == "Option" {
                if let PathArguments::AngleBracketed(a) = &last.arguments {
                    if let Some(GenericArgument::Type(inner)) = a.args.first() {
                        return clock_type(inner);
                    }
                }
                return None;
            }
            CLOCK_TYPES.contains(&name.as_str()).then_some(name)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args;
    use crate::assert_has;
    use proc_macro2::TokenStream;
    use quote::quote;

    /// Runs parsing and validation; the error messages, or the contract's
    /// key-field paths.
    fn run(kind: Kind, attr: TokenStream, item: TokenStream) -> Result<Vec<String>, Vec<String>> {
        let func: syn::ItemFn = syn::parse2(item).expect("test item is a fn");
        let mut errors = Errors::default();
        let args = args::parse(kind, attr, &mut errors);
        let model = Model::new(&func);
        match check(kind, &args, &model, &mut errors) {
            Some(contract) => Ok(contract.key_fields.iter().map(|f| f.path()).collect()),
            None => Err(errors
                .into_result()
                .err()
                .map(|e| e.into_iter().map(|e| e.to_string()).collect())
                .unwrap_or_default()),
        }
    }

    fn errs(attr: TokenStream, item: TokenStream) -> Vec<String> {
        run(Kind::Mutating, attr, item).expect_err("expected errors")
    }

    fn shop(params: TokenStream) -> TokenStream {
        quote! { async fn create_order(#params) -> Result<Order, ShopError> { todo!() } }
    }

    #[test]
    fn key_fields_named_like_time_or_attempts_need_the_intent_marker() {
        for name in [
            "created_at",
            "created_at_ms",
            "sent_time",
            "event_ts",
            "timestamp",
            "request_timestamp",
            "nonce",
            "request_nonce",
            "attempt",
            "retry_attempt",
            "Created_At_Secs",
        ] {
            let ident = syn::Ident::new(name, proc_macro2::Span::call_site());
            let e = errs(
                quote! { idempotency_key_fields = [#ident] },
                shop(quote! { #ident: i64 }),
            );
            assert!(e.len() == 1 && e[0].contains("#[intent]"), "{name}: {e:?}");
            assert!(
                run(
                    Kind::Mutating,
                    quote! { idempotency_key_fields = [#[intent] #ident] },
                    shop(quote! { #ident: i64 }),
                )
                .is_ok(),
                "{name} with the marker"
            );
        }
        for name in [
            "at",
            "user_id",
            "cart_id",
            "date",
            "format",
            "status",
            "attempts_left",
        ] {
            let ident = syn::Ident::new(name, proc_macro2::Span::call_site());
            assert!(
                run(
                    Kind::Mutating,
                    quote! { idempotency_key_fields = [#ident] },
                    shop(quote! { #ident: u64 }),
                )
                .is_ok(),
                "{name} is an ordinary name"
            );
        }
        // The nested path's last segment decides.
        assert!(errs(
            quote! { idempotency_key_fields = [order.created_at] },
            shop(quote! { order: Order }),
        )[0]
        .contains("`order.created_at`"));
    }

    #[test]
    fn impl_trait_is_found_anywhere_in_a_type() {
        for ty in [
            quote!(impl Fn()),
            quote!(Vec<impl Fn()>),
            quote!(&[impl core::fmt::Display]),
            quote!((u8, Option<Box<impl Send>>)),
        ] {
            let ty: Type = syn::parse2(ty.clone()).unwrap();
            assert!(find_impl_trait(&ty).is_some(), "{}", quote::quote!(#ty));
        }
        for ty in [
            quote!(Implementation<u8>),
            quote!(Box<dyn Fn()>),
            quote!(&'a str),
        ] {
            let ty: Type = syn::parse2(ty).unwrap();
            assert!(find_impl_trait(&ty).is_none(), "{}", quote::quote!(#ty));
        }
    }

    #[test]
    fn key_fields_are_sorted_in_jcs_order() {
        let keys = run(
            Kind::Mutating,
            quote! { idempotency_key_fields = [user_id, cart.id, Zed, a_b, ab] },
            shop(quote! { user_id: u64, cart: Cart, Zed: u8, a_b: u8, ab: u8 }),
        )
        .unwrap();
        assert_eq!(keys, ["Zed", "a_b", "ab", "cart.id", "user_id"]);
    }

    #[test]
    fn jcs_order_compares_utf16_code_units() {
        // U+FB01 sorts after U+1F600 in UTF-8/code points but before it in UTF-16.
        assert_eq!(
            jcs_cmp("\u{fb01}", "\u{1f600}"),
            std::cmp::Ordering::Greater
        );
        assert!("\u{fb01}" < "\u{1f600}");
    }

    #[test]
    fn unknown_root_suggests_and_lists_parameters() {
        let e = errs(
            quote! { idempotency_key_fields = [user_idd] },
            shop(quote! { user_id: u64, cart: Cart, note: String, #[context] db: &Db }),
        );
        assert_eq!(
            e,
            ["no parameter named `user_idd`; did you mean `user_id`? Parameters are `user_id`, `cart`, `note`"]
        );
    }

    #[test]
    fn missing_empty_duplicate_and_redundant_key_fields() {
        let e = errs(quote! {}, shop(quote! { user_id: u64 }));
        assert!(
            e[0].starts_with("`#[mutating_tool]` needs `idempotency_key_fields`"),
            "{e:?}"
        );
        assert!(e[0].contains("[user_id]"));
        let e = errs(
            quote! { idempotency_key_fields = [] },
            shop(quote! { user_id: u64 }),
        );
        assert!(
            e[0].starts_with("`idempotency_key_fields` is empty"),
            "{e:?}"
        );
        let e = errs(
            quote! { idempotency_key_fields = [a, a, b.x, b] },
            shop(quote! { a: u64, b: B }),
        );
        assert_eq!(
            e,
            [
                "`a` is listed twice in `idempotency_key_fields`; remove this one",
                "`b.x` is already part of the key through `b`; list only one of them",
            ]
        );
    }

    #[test]
    fn context_self_and_clock_key_fields() {
        let e = errs(
            quote! { idempotency_key_fields = [db, self.id, created, when, stamp.secs] },
            quote! {
                async fn f(&self, #[context] db: &Db, created: std::time::SystemTime,
                           when: Option<&chrono::DateTime<Utc>>, stamp: Timestamp) -> Result<(), E> { Ok(()) }
            },
        );
        assert_eq!(e.len(), 5, "{e:#?}");
        assert!(e[0].starts_with("`db` is a `#[context]` parameter"));
        assert!(e[1].starts_with("`self` is never part of the key"));
        assert!(e[2].starts_with("`created` is a `SystemTime`: a key derived from time"));
        assert!(e[3].starts_with("`when` is a `DateTime`"));
        assert!(e[4].starts_with("`stamp` is a `Timestamp`"));
    }

    #[test]
    fn sync_generic_borrowed_and_unsafe_free_functions() {
        let e = errs(
            quote! { idempotency_key_fields = [a] },
            quote! {
                unsafe fn f<T, const N: usize>(a: u64, b: &str, c: impl Into<String>, d: Vec<&'static [u8]>,
                    e: Cow<'a, str>, #[context] f: &mut Db) -> Result<(), E> { Ok(()) }
            },
        );
        assert_eq!(e.len(), 9, "{e:#?}");
        assert!(e[0].starts_with("`#[mutating_tool]` needs an `async fn`: write `async fn f(...)`"));
        assert!(e[1].starts_with("registered tools cannot be `unsafe fn`"));
        assert!(
            e[2].starts_with("registered tools cannot be generic: a JSON call cannot choose `T`")
        );
        assert!(
            e[3].starts_with("registered tools cannot be generic: a JSON call cannot choose `N`")
        );
        assert!(e[4].starts_with("registered tools cannot be generic: `impl Into<String>`"));
        assert!(
            e[5].contains("write `String` instead of `&str`"),
            "{}",
            e[5]
        );
        assert!(
            e[6].contains("write `Vec<Vec<u8>>` instead of `Vec<&'static [u8]>`"),
            "{}",
            e[6]
        );
        assert!(
            e[7].contains("`Cow<'a, str>` borrows: write `Cow<'static, str>` instead"),
            "{}",
            e[7]
        );
        assert!(
            e[8].starts_with("context values are shared by every call: take `&Db`"),
            "{}",
            e[8]
        );
    }

    #[test]
    fn methods_may_be_generic_and_borrow() {
        let keys = run(
            Kind::Mutating,
            quote! { idempotency_key_fields = [id] },
            quote! {
                async fn f<T: Serialize>(&mut self, id: &str, x: impl Serialize, t: T) -> Result<(), E> { Ok(()) }
            },
        )
        .unwrap();
        assert_eq!(keys, ["id"]);
    }

    #[test]
    fn return_type_must_be_a_two_argument_result() {
        let item = |ret: TokenStream| quote! { async fn f(a: u64) #ret { todo!() } };
        let attr = quote! { idempotency_key_fields = [a] };
        let e = errs(attr.clone(), item(quote! {}));
        assert!(e[0].starts_with("`#[mutating_tool]` needs a return type `Result<T, E>` where E: From<tool_contracts::Error>"));
        let e = errs(attr.clone(), item(quote! { -> u64 }));
        assert!(e[0].contains("write `-> Result<u64, E>`"), "{e:?}");
        let e = errs(attr.clone(), item(quote! { -> io::Result<u64> }));
        assert!(
            e[0].starts_with("`io::Result<u64>` hides the error type"),
            "{e:?}"
        );
        let e = errs(attr.clone(), item(quote! { -> Result<impl Serialize, E> }));
        assert!(
            e[0].starts_with("tools must name their output and error types"),
            "{e:?}"
        );
        for ok in [
            quote! { -> Result<u64, E> },
            quote! { -> ::core::result::Result<u64, E> },
            quote! { -> std::result::Result<Vec<u8>, my::Error> },
        ] {
            run(Kind::Mutating, attr.clone(), item(ok)).unwrap();
        }
    }

    #[test]
    fn option_values_are_checked() {
        let e = errs(
            quote! {
                idempotency_key_fields = [a], name = "has space", version = 0, ttl = "0s",
                lease = "1x", concurrent = "block", payload_mismatch = "warn", on_unknown = "retry",
                task = "yes",
            },
            shop(quote! { a: u64 }),
        );
        assert_eq!(e.len(), 8, "{e:#?}");
        assert!(e[0].starts_with("invalid tool name \"has space\""));
        assert!(e[1].starts_with("`version` is a schema version"));
        assert_eq!(
            e[2],
            r#"`ttl` must be longer than zero: write a duration like "30s", "15m", "24h" or "1h30m""#
        );
        assert!(e[3].starts_with(r#"`lease` = "1x" is not a duration"#));
        assert_eq!(
            e[4],
            r#"`concurrent` must be "wait" or "reject", not "block""#
        );
        assert_eq!(
            e[5],
            r#"`payload_mismatch` must be "reject" or "replay", not "warn""#
        );
        assert_eq!(
            e[6],
            r#"`on_unknown` must be "fail" or "rerun", not "retry""#
        );
        assert_eq!(
            e[7],
            r#"`task` must be "forbidden" or "optional" or "required", not "yes""#
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(500));
        assert_eq!(parse_duration("30s"), Ok(30_000));
        assert_eq!(parse_duration("1h30m"), Ok(5_400_000));
        assert_eq!(parse_duration("1d2h3m4s5ms"), Ok(93_784_005));
        assert_eq!(parse_duration("24h"), Ok(86_400_000));
        for bad in [
            "", "1", "h", "1 h", "30m1h", "1h1h", "1.5h", "-1s", "1hr", "1H",
        ] {
            assert_eq!(parse_duration(bad), Err("malformed"), "{bad:?}");
        }
        assert_eq!(parse_duration("0s"), Err("zero"));
        assert_eq!(parse_duration("0h0m"), Err("zero"));
        assert_eq!(parse_duration("99999999999999999999d"), Err("too large"));
        assert_eq!(parse_duration("999999999999999d"), Err("too large"));
    }

    #[test]
    fn tool_names_follow_the_mcp_rule() {
        assert!(valid_tool_name("create_order"));
        assert!(valid_tool_name("payments.charge-v2"));
        assert!(valid_tool_name(&"a".repeat(128)));
        assert!(!valid_tool_name(&"a".repeat(129)));
        assert!(!valid_tool_name(""));
        assert!(!valid_tool_name("créer"));
        assert!(!valid_tool_name("a/b"));
        let e = errs(
            quote! { idempotency_key_fields = [a] },
            quote! {
                async fn créer(a: u64) -> Result<(), E> { Ok(()) }
            },
        );
        assert!(
            e[0].starts_with("the tool name defaults to the function name \"créer\""),
            "{e:?}"
        );
    }

    #[test]
    fn verify_and_on_unknown_rerun_are_contradictory() {
        let e = errs(
            quote! { idempotency_key_fields = [a], verify = placed, on_unknown = "rerun" },
            shop(quote! { a: u64 }),
        );
        assert_eq!(e.len(), 1, "{e:#?}");
        assert!(
            e[0].starts_with("`on_unknown = \"rerun\"` contradicts `verify = placed`"),
            "{}",
            e[0]
        );
        assert_has(&e[0], "Pick one");
        // `fail` (the default) and the classifier combine with `verify`.
        run(
            Kind::Mutating,
            quote! {
                idempotency_key_fields = [a], verify = placed, on_unknown = "fail",
                unknown_outcome_if = E::is_timeout, cache_errors = true,
            },
            shop(quote! { a: u64 }),
        )
        .unwrap();
    }

    #[test]
    fn read_only_tools_reject_verify_and_classifier() {
        let e = run(
            Kind::ReadOnly,
            quote! { verify = placed, unknown_outcome_if = is_timeout },
            quote! { async fn f(a: u64) -> Result<u64, E> { Ok(a) } },
        )
        .unwrap_err();
        assert_eq!(e.len(), 2, "{e:#?}");
        assert!(e[0].starts_with("`verify` does not apply to `#[read_only_tool]`"));
        assert!(e[1].starts_with("`unknown_outcome_if` does not apply to `#[read_only_tool]`"));
        assert!(e[1].contains("valid options are `name`, `description`, `open_world`"));
    }

    #[test]
    fn read_only_tools_reject_mutating_options() {
        let e = run(
            Kind::ReadOnly,
            quote! { idempotency_key_fields = [a], ttl = "1h", destructive, open_world, task = "optional" },
            quote! { async fn f(a: u64) -> Result<u64, E> { Ok(a) } },
        )
        .unwrap_err();
        assert_eq!(e.len(), 4, "{e:#?}");
        assert!(e[0].starts_with("read-only tools need no key"));
        assert!(e[1].starts_with("`ttl` does not apply to `#[read_only_tool]`"));
        assert!(e[2].starts_with("`destructive` does not apply to `#[read_only_tool]`"));
        // A task is named by the call's key, which a read-only tool does not have.
        assert!(e[3].starts_with("`task` does not apply to `#[read_only_tool]`"));
        let e = run(Kind::ReadOnly, quote! {}, quote! { fn f() -> u64 { 1 } }).unwrap_err();
        assert!(e[0].starts_with("`#[read_only_tool]` needs an `async fn`"));
        assert!(e[1].starts_with(
            "`#[read_only_tool]` needs the return type `Result<T, E>` where E: Display"
        ));
    }

    #[test]
    fn parameters_must_be_plain_names_and_context_well_formed() {
        let e = errs(
            quote! { idempotency_key_fields = [a] },
            shop(
                quote! { a: u64, (b, c): (u8, u8), #[context(x)] d: &D, #[context] #[context] e: &E, #[cfg(test)] f: u8 },
            ),
        );
        assert_eq!(e.len(), 4, "{e:#?}");
        assert!(e[0].starts_with("tool parameters must be plain names"));
        assert_eq!(e[1], "`#[context]` takes no arguments: write `#[context]`");
        assert_eq!(e[2], "duplicate `#[context]`");
        assert!(e[3].starts_with("tool parameters cannot be conditional"));
    }

    #[test]
    fn owned_suggestions() {
        let s = |t: TokenStream| owned_suggestion(&syn::parse2(t).unwrap());
        assert_eq!(s(quote!(&str)), "String");
        assert_eq!(s(quote!(&'a [u8])), "Vec<u8>");
        assert_eq!(s(quote!(&Path)), "PathBuf");
        assert_eq!(s(quote!(&Cart)), "Cart");
        assert_eq!(s(quote!(Option<&str>)), "Option<String>");
        assert_eq!(s(quote!((&str, &[&str]))), "(String, Vec<String>)");
        assert_eq!(s(quote!(&dyn Fn())), "Box<dyn Fn()>");
    }
}
