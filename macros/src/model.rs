//! A borrowed view of the annotated function: receiver, parameters (with
//! their `#[context]` markers), return type and doc comment.

use syn::{Attribute, FnArg, Ident, ItemFn, Pat, PatType, Receiver, Type};

/// The annotated function, as the later phases need to see it.
pub(crate) struct Model<'a> {
    pub func: &'a ItemFn,
    pub receiver: Option<&'a Receiver>,
    pub params: Vec<Param<'a>>,
}

/// One typed parameter (everything but the receiver).
pub(crate) struct Param<'a> {
    pub arg: &'a PatType,
    /// The binding, when the pattern is a plain name (`x` or `mut x`).
    pub ident: Option<&'a Ident>,
    pub ty: &'a Type,
    /// Every `#[context]` attribute on the parameter (more than one is an error).
    pub context: Vec<&'a Attribute>,
}

impl Param<'_> {
    pub(crate) fn is_context(&self) -> bool {
        !self.context.is_empty()
    }
}

impl<'a> Model<'a> {
    pub(crate) fn new(func: &'a ItemFn) -> Self {
        let mut receiver = None;
        let mut params = Vec::new();
        for input in &func.sig.inputs {
            match input {
                FnArg::Receiver(r) => receiver = Some(r),
                FnArg::Typed(arg) => params.push(Param {
                    arg,
                    ident: plain_ident(&arg.pat),
                    ty: &arg.ty,
                    context: arg.attrs.iter().filter(|a| is_context(a)).collect(),
                }),
            }
        }
        Model {
            func,
            receiver,
            params,
        }
    }

    /// Methods are deduplicated but never registered: a nested item cannot
    /// name `Self`.
    pub(crate) fn is_method(&self) -> bool {
        self.receiver.is_some()
    }

    /// The (outer) doc comment, each line trimmed of one leading space,
    /// joined with `\n`, trimmed. Non-literal `#[doc = ...]` attributes are
    /// left out here; [`doc_tokens`](Self::doc_tokens) keeps them.
    pub(crate) fn doc(&self) -> String {
        let mut lines = Vec::new();
        for part in self.doc_parts() {
            if let DocPart::Text(value) = part {
                push_lines(&mut lines, &value);
            }
        }
        lines.join("\n").trim().to_owned()
    }

    /// The doc comment as a `&'static str` expression: a literal (as
    /// [`doc`](Self::doc)) when every `#[doc]` is one, otherwise
    /// `::core::concat!(..)` of the lines and the other expressions as written
    /// (`#[doc = include_str!("tool.md")]`, as rmcp keeps them), joined by `\n`.
    pub(crate) fn doc_tokens(&self) -> proc_macro2::TokenStream {
        let parts = self.doc_parts();
        if parts.iter().all(|p| matches!(p, DocPart::Text(_))) {
            let doc = self.doc();
            return quote::quote!(#doc);
        }
        let mut pieces = Vec::new();
        for (i, part) in parts.into_iter().enumerate() {
            if i > 0 {
                pieces.push(quote::quote!("\n"));
            }
            match part {
                DocPart::Text(value) => {
                    let mut lines = Vec::new();
                    push_lines(&mut lines, &value);
                    let text = lines.join("\n");
                    pieces.push(quote::quote!(#text));
                }
                DocPart::Expr(expr) => pieces.push(quote::quote!(#expr)),
            }
        }
        quote::quote!(::core::concat!(#(#pieces),*))
    }

    fn doc_parts(&self) -> Vec<DocPart<'a>> {
        let mut parts = Vec::new();
        for attr in &self.func.attrs {
            if !attr.path().is_ident("doc") || !matches!(attr.style, syn::AttrStyle::Outer) {
                continue;
            }
            let syn::Meta::NameValue(nv) = &attr.meta else {
                continue;
            };
            match &nv.value {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) => parts.push(DocPart::Text(s.value())),
                other => parts.push(DocPart::Expr(other)),
            }
        }
        parts
    }
}

/// One `#[doc]` attribute: a literal, or an expression such as `include_str!(..)`.
enum DocPart<'a> {
    Text(String),
    Expr(&'a syn::Expr),
}

/// Appends `value`'s lines, each trimmed of a `\r` and one leading space.
fn push_lines(lines: &mut Vec<String>, value: &str) {
    for line in value.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        lines.push(line.strip_prefix(' ').unwrap_or(line).to_owned());
    }
}

/// `#[context]` (any form: validation rejects arguments to it).
pub(crate) fn is_context(attr: &Attribute) -> bool {
    attr.path().is_ident("context")
}

fn plain_ident(pat: &Pat) -> Option<&Ident> {
    match pat {
        Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => Some(&p.ident),
        _ => None,
    }
}

/// The function with every `#[context]` marker removed from its parameters;
/// everything else verbatim.
pub(crate) fn strip_context(func: &ItemFn) -> ItemFn {
    let mut func = func.clone();
    for input in &mut func.sig.inputs {
        match input {
            FnArg::Typed(arg) => arg.attrs.retain(|a| !is_context(a)),
            FnArg::Receiver(r) => r.attrs.retain(|a| !is_context(a)),
        }
    }
    func
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse_quote;

    #[test]
    fn sees_receiver_params_and_context() {
        let func: ItemFn = parse_quote! {
            async fn f(&self, mut a: u64, (b, c): (u8, u8), #[context] db: &Db) -> Result<(), E> {}
        };
        let model = Model::new(&func);
        assert!(model.is_method());
        assert_eq!(model.params.len(), 3);
        assert_eq!(
            model.params[0].ident.map(ToString::to_string).as_deref(),
            Some("a")
        );
        assert!(model.params[1].ident.is_none());
        assert!(model.params[2].is_context());
        assert!(!model.params[0].is_context());
    }

    #[test]
    fn doc_lines_are_trimmed_and_joined() {
        let func: ItemFn = parse_quote! {
            /// Place an order.
            ///
            ///   Indented stays indented.
            #[doc = " Last line. "]
            async fn f() {}
        };
        assert_eq!(
            Model::new(&func).doc(),
            "Place an order.\n\n  Indented stays indented.\nLast line."
        );
    }

    #[test]
    fn strip_context_keeps_other_attributes() {
        let func: ItemFn = parse_quote! {
            async fn f(#[context] #[allow(unused)] db: &Db) {}
        };
        let stripped = strip_context(&func);
        let FnArg::Typed(arg) = &stripped.sig.inputs[0] else {
            unreachable!()
        };
        assert_eq!(arg.attrs.len(), 1);
        assert!(arg.attrs[0].path().is_ident("allow"));
    }
}
