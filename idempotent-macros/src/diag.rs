//! Collects every semantic error so the user sees them all at once (as serde's `Ctxt` does).

use proc_macro2::TokenStream;

/// Errors found so far.
#[derive(Default)]
pub(crate) struct Diagnostics {
    errors: Option<syn::Error>,
}

impl Diagnostics {
    /// Records an error at `tokens`' span.
    pub(crate) fn error(&mut self, tokens: impl quote::ToTokens, message: impl std::fmt::Display) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    /// Records an error.
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.errors {
            Some(errors) => errors.combine(error),
            None => self.errors = Some(error),
        }
    }

    /// `Ok` when nothing was recorded, else every error combined.
    pub(crate) fn finish(self) -> Result<(), syn::Error> {
        self.errors.map_or(Ok(()), Err)
    }
}

/// The original item followed by the errors: callers keep type-checking against the signature and IDEs
/// keep working while the attribute is wrong.
pub(crate) fn with_original(item: TokenStream, error: &syn::Error) -> TokenStream {
    let mut tokens = item;
    tokens.extend(error.to_compile_error());
    tokens
}
