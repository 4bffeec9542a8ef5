//! Shared diagnostics helpers: an error accumulator, "did you mean"
//! suggestions, and a readable rendering of types for messages.

use quote::ToTokens;
use syn::{GenericArgument, PathArguments, ReturnType, Type};

/// Collects every error so all of them are reported at once
/// (`syn::Error::combine`).
#[derive(Default)]
pub(crate) struct Errors {
    error: Option<syn::Error>,
}

impl Errors {
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.error {
            Some(existing) => existing.combine(error),
            None => self.error = Some(error),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.error.is_none()
    }

    pub(crate) fn into_result(self) -> Result<(), syn::Error> {
        match self.error {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}

/// The candidate closest to `written`, if it is close enough to be a typo:
/// at most a third of the longer name's characters differ (and at least one
/// edit is always tolerated), counting insertions, deletions, substitutions
/// and adjacent transpositions (`crat` is one edit from `cart`: strsim's
/// optimal string alignment). Ties go to the first candidate. The runtime's
/// "did you mean" for tool names (`Registry::call`) uses the same rule.
pub(crate) fn closest<'a>(
    written: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let mut best: Option<(usize, &str)> = None;
    for candidate in candidates {
        let distance = strsim::osa_distance(written, candidate);
        let longest = written.chars().count().max(candidate.chars().count());
        if distance == 0 || distance > (longest / 3).max(1) {
            continue;
        }
        if best.is_none_or(|(d, _)| distance < d) {
            best = Some((distance, candidate));
        }
    }
    best.map(|(_, name)| name)
}

/// `a`, `b`, `c` for messages.
pub(crate) fn backticked<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    names
        .into_iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Renders a type the way a person writes it (`Option<&str>`, not
/// `Option < & str >`).
pub(crate) fn type_to_string(ty: &Type) -> String {
    match ty {
        Type::Path(p) if p.qself.is_none() => path_to_string(&p.path),
        Type::Reference(r) => {
            let mut out = String::from("&");
            if let Some(lt) = &r.lifetime {
                out.push_str(&format!("'{} ", lt.ident));
            }
            if r.mutability.is_some() {
                out.push_str("mut ");
            }
            out.push_str(&type_to_string(&r.elem));
            out
        }
        Type::Slice(s) => format!("[{}]", type_to_string(&s.elem)),
        Type::Array(a) => format!(
            "[{}; {}]",
            type_to_string(&a.elem),
            tidy(&a.len.to_token_stream().to_string())
        ),
        Type::Tuple(t) => {
            let elems: Vec<String> = t.elems.iter().map(type_to_string).collect();
            if elems.len() == 1 {
                format!("({},)", elems[0])
            } else {
                format!("({})", elems.join(", "))
            }
        }
        Type::Paren(p) => format!("({})", type_to_string(&p.elem)),
        Type::Group(g) => type_to_string(&g.elem),
        other => tidy(&other.to_token_stream().to_string()),
    }
}

fn path_to_string(path: &syn::Path) -> String {
    let mut out = String::new();
    if path.leading_colon.is_some() {
        out.push_str("::");
    }
    for (i, segment) in path.segments.iter().enumerate() {
        if i > 0 {
            out.push_str("::");
        }
        out.push_str(&segment.ident.to_string());
        match &segment.arguments {
            PathArguments::None => {}
            PathArguments::AngleBracketed(args) => {
                let args: Vec<String> = args
                    .args
                    .iter()
                    .map(|arg| match arg {
                        GenericArgument::Type(t) => type_to_string(t),
                        GenericArgument::Lifetime(lt) => format!("'{}", lt.ident),
                        other => tidy(&other.to_token_stream().to_string()),
                    })
                    .collect();
                out.push('<');
                out.push_str(&args.join(", "));
                out.push('>');
            }
            PathArguments::Parenthesized(args) => {
                let inputs: Vec<String> = args
                    .inputs
                    .iter()
                    .map(|arg| type_to_string(&arg.ty))
                    .collect();
                out.push('(');
                out.push_str(&inputs.join(", "));
                out.push(')');
                if let ReturnType::Type(_, ty) = &args.output {
                    out.push_str(" -> ");
                    out.push_str(&type_to_string(ty));
                }
            }
        }
    }
    out
}

/// Best-effort cleanup of `TokenStream::to_string` spacing for the rare
/// types `type_to_string` does not render itself.
pub(crate) fn tidy(text: &str) -> String {
    text.replace(" :: ", "::")
        .replace(":: ", "::")
        .replace(" < ", "<")
        .replace("< ", "<")
        .replace(" >", ">")
        .replace(" ,", ",")
        .replace("& ", "&")
        .replace("' ", "'")
        .replace(" (", "(")
        .replace("( ", "(")
        .replace(" )", ")")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closest_ignores_far_candidates() {
        let params = ["user_id", "cart", "note"];
        assert_eq!(closest("user_idd", params), Some("user_id"));
        assert_eq!(closest("crat", params), Some("cart"));
        assert_eq!(closest("zzzzzz", params), None);
    }

    #[test]
    fn types_render_like_source() {
        let ty: Type = syn::parse_quote!(Option<&'a str>);
        assert_eq!(type_to_string(&ty), "Option<&'a str>");
        let ty: Type = syn::parse_quote!(&mut [::std::vec::Vec<(u8, String)>; 4]);
        assert_eq!(
            type_to_string(&ty),
            "&mut [::std::vec::Vec<(u8, String)>; 4]"
        );
    }
}
