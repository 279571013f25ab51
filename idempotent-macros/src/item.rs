//! Checks on the decorated function.

use quote::ToTokens as _;
use syn::{FnArg, GenericArgument, Ident, ItemFn, Pat, PathArguments, ReturnType, Type};

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
    } else if sig.asyncness.is_none()
        && let Some(runtime) = rewritten_by_runtime(item)
    {
        diag.error(
            sig.fn_token,
            format!(
                "#[idempotent] must be written above {runtime}: that attribute expanded first and has already turned this `async fn` into a plain `fn` that blocks on its body; put #[idempotent] first, or on an `async fn` of its own that this function calls"
            ),
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
    if let ReturnType::Type(_, output) = &sig.output
        && let Some(opaque) = impl_trait(output)
    {
        diag.error(
            opaque,
            "#[idempotent] cannot return `impl Trait`: a duplicate call reads the stored value back as its type, so the type must be named; expected `-> Result<T, E>` with a concrete `T: Serialize + DeserializeOwned`",
        );
    }
    for parameter in parameters(item) {
        if parameter
            .to_string()
            .to_ascii_lowercase()
            .starts_with("__idempotent")
        {
            diag.error(
                &parameter,
                format!(
                    "the parameter name `{parameter}` is reserved: names starting with `__idempotent` are the generated code's own; rename the parameter"
                ),
            );
        }
    }
    // The attribute's own expansion would carry a second one onto the generated function, which would
    // then claim the key inside its own claim and find it in progress on every call.
    if let Some(again) = item.attrs.iter().find(|attribute| {
        attribute
            .path()
            .segments
            .last()
            .is_some_and(|segment| segment.ident == "idempotent")
    }) {
        diag.error(
            again,
            "#[idempotent] is written twice on this function; keep one",
        );
    }
    if let Some(variadic) = &sig.variadic {
        diag.error(
            variadic,
            "#[idempotent] cannot be used on a variadic function",
        );
    }
}

/// The names the function's parameters bind, `self` included, through any pattern
/// (`Request { order_id, .. }: Request` binds `order_id`).
pub(crate) fn parameters(item: &ItemFn) -> Vec<Ident> {
    let mut out = Vec::new();
    for input in &item.sig.inputs {
        match input {
            FnArg::Receiver(receiver) => out.push(Ident::new("self", receiver.self_token.span)),
            FnArg::Typed(typed) => bind(&typed.pat, &mut out),
        }
    }
    out
}

/// The names `pat` binds, pushed onto `out`.
pub(crate) fn bind(pat: &Pat, out: &mut Vec<Ident>) {
    match pat {
        Pat::Ident(p) => {
            out.push(p.ident.clone());
            if let Some((_, sub)) = &p.subpat {
                bind(sub, out);
            }
        }
        Pat::Struct(p) => p.fields.iter().for_each(|f| bind(&f.pat, out)),
        Pat::TupleStruct(p) => p.elems.iter().for_each(|e| bind(e, out)),
        Pat::Tuple(p) => p.elems.iter().for_each(|e| bind(e, out)),
        Pat::Slice(p) => p.elems.iter().for_each(|e| bind(e, out)),
        Pat::Or(p) => p.cases.iter().for_each(|c| bind(c, out)),
        Pat::Reference(p) => bind(&p.pat, out),
        Pat::Paren(p) => bind(&p.pat, out),
        Pat::Type(p) => bind(&p.pat, out),
        _ => {}
    }
}

/// The first `impl Trait` in `ty`, at any depth (`Result<impl Serialize, E>`, `Vec<(u8, impl ..)>`).
fn impl_trait(ty: &Type) -> Option<&Type> {
    match ty {
        Type::ImplTrait(_) => Some(ty),
        Type::Path(path) => path.path.segments.iter().find_map(|segment| {
            let PathArguments::AngleBracketed(arguments) = &segment.arguments else {
                return None;
            };
            arguments.args.iter().find_map(|argument| match argument {
                GenericArgument::Type(ty) => impl_trait(ty),
                GenericArgument::AssocType(assoc) => impl_trait(&assoc.ty),
                _ => None,
            })
        }),
        Type::Reference(r) => impl_trait(&r.elem),
        Type::Tuple(tuple) => tuple.elems.iter().find_map(impl_trait),
        Type::Array(array) => impl_trait(&array.elem),
        Type::Slice(slice) => impl_trait(&slice.elem),
        Type::Paren(paren) => impl_trait(&paren.elem),
        Type::Group(group) => impl_trait(&group.elem),
        Type::Ptr(ptr) => impl_trait(&ptr.elem),
        _ => None,
    }
}

/// The attribute that rewrote an `async fn` into a `fn` blocking on its body before us, as an attribute
/// written above ours does (`#[tokio::test]` leaves `#[test]` behind and calls `block_on`; `#[tokio::main]`
/// calls `block_on`).
fn rewritten_by_runtime(item: &ItemFn) -> Option<&'static str> {
    fn blocks_on(tokens: proc_macro2::TokenStream) -> bool {
        tokens.into_iter().any(|tree| match tree {
            proc_macro2::TokenTree::Ident(ident) => ident == "block_on",
            proc_macro2::TokenTree::Group(group) => blocks_on(group.stream()),
            _ => false,
        })
    }
    let test = item.attrs.iter().any(|attribute| {
        attribute
            .path()
            .segments
            .last()
            .is_some_and(|segment| segment.ident == "test")
    });
    if !blocks_on(item.block.to_token_stream()) {
        return None;
    }
    Some(if test {
        "a test attribute such as `#[tokio::test]`"
    } else {
        "an attribute such as `#[tokio::main]`"
    })
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
