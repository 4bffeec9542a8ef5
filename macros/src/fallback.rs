//! What to emit when there are errors: the user's function unchanged (only
//! the `#[context]` markers removed, since nothing else would consume them)
//! next to the `compile_error!`s. Without the function, one mistake in the
//! attribute would cascade into "cannot find function" at every caller and
//! leave rust-analyzer blind.

use proc_macro2::TokenStream;
use quote::{quote, ToTokens};
use syn::ItemFn;

/// The function as written plus every error.
pub(crate) fn emit(func: &ItemFn, error: syn::Error) -> TokenStream {
    let func = crate::model::strip_context(func);
    let error = error.to_compile_error();
    quote! {
        #error
        #func
    }
}

/// The attribute was not placed on a function: emit the item untouched.
pub(crate) fn not_a_function(item: TokenStream, error: syn::Error) -> TokenStream {
    let mut out = error.to_compile_error();
    item.to_tokens(&mut out);
    out
}
