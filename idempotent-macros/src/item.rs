//! Checks on the decorated function.

use syn::{ItemFn, ReturnType};

use crate::diag::Diagnostics;

/// Records every reason `item` cannot be made idempotent.
pub(crate) fn check(item: &ItemFn, diag: &mut Diagnostics) {
    let sig = &item.sig;
    // A `const fn` cannot be `async`, so one error says both: remove `const`, add `async`.
    if let Some(constness) = &sig.constness {
        diag.error(
            constness,
            "#[idempotent] cannot be used on a `const fn`; expected an `async fn`",
        );
    } else if sig.asyncness.is_none() && rewritten_by_async_trait(item) {
        diag.error(
            sig.fn_token,
            "#[idempotent] cannot be used inside #[async_trait], which has already turned this `async fn` into a `fn` returning a boxed future; use a native `async fn` in the trait, or put #[idempotent] on an inherent `async fn` and call that from the trait method",
        );
    } else if sig.asyncness.is_none() {
        diag.error(sig.fn_token, "#[idempotent] requires an `async fn`");
    }
    if let ReturnType::Default = sig.output {
        diag.error(
            &sig.ident,
            "#[idempotent] requires a return type `-> Result<T, E>` with `T: Serialize + DeserializeOwned` and `E: From<idempotent_runtime::Error>`",
        );
    }
    if let Some(variadic) = &sig.variadic {
        diag.error(
            variadic,
            "#[idempotent] cannot be used on a variadic function",
        );
    }
}

/// Whether `#[async_trait]` on the enclosing impl rewrote this method before us: it expands first (an
/// attribute on an impl runs before those on its items) and adds the lifetime `'async_trait`.
fn rewritten_by_async_trait(item: &ItemFn) -> bool {
    item.sig
        .generics
        .lifetimes()
        .any(|param| param.lifetime.ident == "async_trait")
}

#[cfg(test)]
mod tests {
    use super::check;
    use crate::diag::Diagnostics;

    fn errors(item: &syn::ItemFn) -> Vec<String> {
        let mut diag = Diagnostics::default();
        check(item, &mut diag);
        diag.finish()
            .err()
            .map(|e| e.into_iter().map(|e| e.to_string()).collect())
            .unwrap_or_default()
    }

    /// What `#[async_trait]` leaves of `async fn charge(&self, id: u64) -> Result<u64, Error>` (a
    /// fail case would need async-trait in the UI tests' dependencies, so the shape is written out).
    #[test]
    fn names_async_trait_when_it_expanded_first() {
        let rewritten = syn::parse_quote! {
            fn charge<'life0, 'async_trait>(
                &'life0 self,
                id: u64,
            ) -> ::core::pin::Pin<Box<
                dyn ::core::future::Future<Output = Result<u64, Error>> + ::core::marker::Send + 'async_trait,
            >>
            where
                'life0: 'async_trait,
                Self: 'async_trait,
            {
                Box::pin(async move { Ok(id) })
            }
        };
        let errors = errors(&rewritten);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].contains("inside #[async_trait]"), "{errors:?}");
    }

    #[test]
    fn accepts_an_async_fn() {
        let item = syn::parse_quote! {
            async fn charge(id: u64) -> Result<u64, Error> { Ok(id) }
        };
        assert_eq!(errors(&item), Vec::<String>::new());
    }
}
