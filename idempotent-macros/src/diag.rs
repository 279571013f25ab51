//! Collects every semantic error so the user sees them all at once (as serde's `Ctxt` does).

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
