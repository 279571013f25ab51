//! The only place that emits code.

use proc_macro2::TokenStream;
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{AttrStyle, Expr, ItemFn, ReturnType};

use crate::args::{Args, DurationArg};

/// Rewrites `item` into claim → execute → complete/fail around its body.
pub(crate) fn expand(args: &Args, item: ItemFn) -> TokenStream {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = item;
    let (outer_attrs, inner_attrs): (Vec<_>, Vec<_>) = attrs
        .into_iter()
        .partition(|a| matches!(a.style, AttrStyle::Outer));
    let krate = args
        .krate
        .as_ref()
        .map_or_else(|| quote!(::idempotent_runtime), ToTokens::to_token_stream);
    let private = quote!(#krate::__private);
    let ReturnType::Type(_, output) = &sig.output else {
        unreachable!("checked in item::check")
    };
    let output_span = output.span();

    let ident = &sig.ident;
    let namespace = match &args.name {
        Some(name) => quote!(#name),
        None => quote!(::core::concat!(
            ::core::module_path!(),
            "::",
            ::core::stringify!(#ident)
        )),
    };
    let ttl = optional_duration(args.ttl.as_ref());
    let lease = optional_duration(args.lease.as_ref());
    let wait = optional_duration(args.wait.as_ref());

    let handle = match &args.store {
        Some(store) => quote!(#private::handle(&(#store))),
        None => quote!(#private::installed(&__IDEMPOTENT_CALL)),
    };
    let key = by_reference(args.key.as_ref().expect("checked in args::parse"));
    let fingerprint = match &args.payload {
        Some(payload) => {
            let payload = by_reference(payload);
            quote!(::core::option::Option::Some(#private::fingerprint(&__IDEMPOTENT_CALL, &(#payload))))
        }
        None => quote!(::core::option::Option::None),
    };
    let fake_return = quote_spanned! {output_span=>
        #[allow(unreachable_code, clippy::diverging_sub_expression, clippy::needless_return)]
        if false {
            let __idempotent_fake_return: #output = loop {};
            return __idempotent_fake_return;
        }
    };
    let assert_output = quote_spanned! {output_span=>
        #private::assert_output::<#output>();
    };
    let err = format_ident!("__idempotent_err");
    let describe = quote! {
        |#err| {
            #[allow(unused_imports)]
            use #private::{DescribeDisplay as _, DescribeOther as _};
            (&#private::Describe(#err)).describe()
        }
    };
    let stmts = &block.stmts;

    let common = quote! {
        __idempotent_handle,
        &__IDEMPOTENT_CALL,
        __idempotent_key,
        __idempotent_fingerprint,
    };
    let body = quote! {
        async move {
            #fake_return
            #(#stmts)*
        }
    };
    let execute = match &args.transact {
        None => quote! {
            #private::execute::<#output, _, _>(#common #describe, #body)
        },
        Some(tx) => quote! {
            let #tx = #private::transaction();
            #private::execute_transact::<#output, _, _>(
                #common
                ::core::clone::Clone::clone(&#tx),
                #describe,
                #body,
            )
        },
    };

    quote! {
        #(#outer_attrs)*
        #vis #sig {
            #(#inner_attrs)*
            static __IDEMPOTENT_CALL: #private::Call = #private::Call {
                namespace: #namespace,
                ttl: #ttl,
                lease: #lease,
                wait: #wait,
            };
            #assert_output
            let __idempotent_handle = #handle;
            let __idempotent_key = #private::key(&__IDEMPOTENT_CALL, &(#key));
            let __idempotent_fingerprint = #fingerprint;
            #execute
            .await
        }
    }
}

fn optional_duration(arg: Option<&DurationArg>) -> TokenStream {
    match arg {
        Some(d) => {
            let millis = u64::try_from(d.value.as_millis()).unwrap_or(u64::MAX);
            quote_spanned!(d.literal.span()=> ::core::option::Option::Some(::core::time::Duration::from_millis(#millis)))
        }
        None => quote!(::core::option::Option::None),
    }
}

/// Whether `expr` names a place (`req`, `req.order_id`, `self.tenant.id`): borrowing it moves nothing.
fn is_place(expr: &Expr) -> bool {
    match expr {
        Expr::Path(_) => true,
        Expr::Field(f) => is_place(&f.base),
        Expr::Paren(p) => is_place(&p.expr),
        _ => false,
    }
}

/// Makes a tuple or array of places borrow its elements instead of moving them, so
/// `key = (req.tenant, req.order_id)` does not move out of `req` before the body runs. A lone place is
/// already borrowed by the generated `&(..)`.
fn by_reference(expr: &Expr) -> TokenStream {
    let borrow = |e: &Expr| {
        if is_place(e) {
            quote_spanned!(e.span()=> &#e)
        } else {
            e.to_token_stream()
        }
    };
    match expr {
        Expr::Tuple(t) => {
            let elems = t.elems.iter().map(borrow);
            if t.elems.len() == 1 {
                quote!((#(#elems,)*))
            } else {
                quote!((#(#elems),*))
            }
        }
        Expr::Array(a) => {
            let elems = a.elems.iter().map(borrow);
            quote!([#(#elems),*])
        }
        other => other.to_token_stream(),
    }
}
