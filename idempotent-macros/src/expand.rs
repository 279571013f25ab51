//! The only place that emits code.

use proc_macro2::{Delimiter, Group, Span, TokenStream, TokenTree};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::ext::IdentExt as _;
use syn::spanned::Spanned;
use syn::{AttrStyle, Block, Expr, FnArg, Ident, ItemFn, ReturnType, Signature, Stmt, Type};

use crate::args::{Args, DurationArg, MissingKeyArg};

/// Rewrites `item` into claim → execute → complete/fail around its body.
///
/// Each runtime call that can fail to type-check is spanned on the user's tokens it checks (the return type,
/// `key`, `payload`, `store`, `transact`), so the error lands there instead of on the whole attribute, and
/// the several uses of the return type report one error between them.
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
    let ReturnType::Type(_, output) = &sig.output else {
        unreachable!("checked in item::check")
    };
    let method = is_method(&sig);
    let own: Vec<Ident> = sig
        .generics
        .type_params()
        .map(|p| p.ident.clone())
        .collect();
    let (ok, err) = result_parts(output);
    let emit = Emit {
        args,
        output,
        generic: Generic {
            // An impl's or a trait's type parameters and `Self` cannot be seen from here: a method
            // may have them.
            arguments: has_type_parameters(&sig) || method,
            ok: may_be_generic(ok.unwrap_or(output), &own),
            // `Result<T>`, an alias: its error type is the alias's own.
            err: match (ok, err) {
                (_, Some(err)) => may_be_generic(err, &own),
                (Some(_), None) => false,
                (None, None) => may_be_generic(output, &own),
            },
        },
        per_type: method && args.name.is_none(),
    };
    let private = emit.private(Span::call_site());
    let namespace = emit.namespace(&sig.ident);
    let ttl = optional_duration(args.ttl.as_ref());
    let lease = optional_duration(args.lease.as_ref());
    let wait = optional_duration(args.wait.as_ref());
    let missing_key = emit.missing_key();
    let check_output = emit.check_output();
    let handle = emit.handle();
    let key = emit.key();
    let fingerprint = emit.fingerprint();
    let execute = emit.execute(&block);
    let call = quote! {
        #private::Call {
            namespace: #namespace,
            ttl: #ttl,
            lease: #lease,
            wait: #wait,
            missing_key: #missing_key,
            deadline_ms: ::core::option::Option::None,
        }
    };
    // A method's namespace is its path, `Self` and the trait included, known once the impl is
    // instantiated (a generic impl, a trait's default method) and spelled by the type name of a closure
    // in its body: one `Call` per instance, made on its first call and then looked up.
    let call = if emit.per_type {
        quote! {
            static __IDEMPOTENT_CALL: #private::PerType = #private::PerType::new(#call);
            let __idempotent_call: &'static #private::Call =
                __IDEMPOTENT_CALL.of(::core::any::type_name_of_val(&|| {}));
        }
    } else {
        quote!(static __IDEMPOTENT_CALL: #private::Call = #call;)
    };

    quote! {
        #(#outer_attrs)*
        #vis #sig {
            #(#inner_attrs)*
            #call
            #check_output
            let __idempotent_handle = #handle;
            let __idempotent_key = #key;
            let __idempotent_fingerprint = #fingerprint;
            #execute
        }
    }
}

/// The item as written, followed by `error`: what the attribute expands to when it is wrong, so that the
/// user sees its errors and no others. Callers still type-check against the signature and IDEs keep
/// working; parameters that only the attribute would have used are not reported as unused meanwhile.
pub(crate) fn original(item: impl ToTokens, error: &syn::Error) -> TokenStream {
    let error = error.to_compile_error();
    quote! {
        #[allow(unused_variables)]
        #item
        #error
    }
}

/// The pieces of one expansion.
struct Emit<'a> {
    args: &'a Args,
    /// The function's return type.
    output: &'a Type,
    /// Which checks report an unmet bound as the bound itself ([`Emit::mode_for`]).
    generic: Generic,
    /// Whether the namespace is the receiver's type and the function's name, found at run time.
    per_type: bool,
}

/// What may be a type parameter, so that its checks report as the bound itself.
struct Generic {
    /// The types of `key` and `payload`, which cannot be seen: when the function has type parameters,
    /// written or `impl Trait`, or may have those of an impl.
    arguments: bool,
    /// The `Ok` type ([`may_be_generic`]).
    ok: bool,
    /// The error type: then whether it is `Send` is its instantiation's, and it is not checked.
    err: bool,
}

impl Emit<'_> {
    /// `<crate>::__private`: `crate = ".."`, or the name the caller's Cargo.toml gives the runtime, or
    /// `::idempotent_runtime`. The default path is spanned at `span`; a path given with `crate = ".."`
    /// keeps the span of its literal, so an unresolved crate is reported once, on that literal.
    fn private(&self, span: Span) -> TokenStream {
        match (&self.args.krate, &self.args.renamed) {
            (Some(path), _) => quote!(#path::__private),
            (None, Some(name)) => {
                let name = Ident::new(&name.to_string(), span);
                quote_spanned!(span=> ::#name::__private)
            }
            (None, None) => quote_spanned!(span=> ::idempotent_runtime::__private),
        }
    }

    fn namespace(&self, ident: &Ident) -> TokenStream {
        if self.per_type {
            // The method's path is found at run time (see `PerType`), in the compiler's spelling, which
            // writes a raw identifier without its `r#`: the name it ends with must match.
            let name = syn::LitStr::new(&ident.unraw().to_string(), ident.span());
            return quote!(#name);
        }
        self.args.name.as_ref().map_or_else(
            || {
                quote!(::core::concat!(
                    ::core::module_path!(),
                    "::",
                    ::core::stringify!(#ident)
                ))
            },
            |name| quote!(#name),
        )
    }

    /// Checks the return type where it is written, so that each error lands on `-> ...`: first that it is
    /// a `Result`, then its `Ok` type and its error type (`From<Error>`, and `Send`), each with its own
    /// message. The runtime's traits say why; `execute` needs the same bounds on the same span, so rustc
    /// reports each only once.
    fn check_output(&self) -> TokenStream {
        let output = self.output;
        let (first, last) = (output.span(), last_span(output).unwrap_or(output.span()));
        let private = self.private(first);
        let (ok_mode, err_mode) = (
            self.mode_for(self.generic.ok, first),
            self.mode_for(self.generic.err, first),
        );
        // `<Ret as IdempotentOutput>::Ok`, from the first token of `Ret` to its last: the span rustc gives
        // `Ret` itself, so that an `Ok` type that fails is reported there, as one error with `execute`'s.
        let part = |name: &str| {
            let name = Ident::new(name, last);
            quote_spanned!(first=> <#output as #private::IdempotentOutput>::#name)
        };
        let (ok, err) = (part("Ok"), part("Err"));
        let send = (!self.generic.err).then(
            || quote_spanned!(first=> <#err as #private::IdempotentErrorSend<#err_mode>>::check();),
        );
        quote_spanned! {first=>
            <#output as #private::IdempotentOutput>::check();
            <#ok as #private::IdempotentValue<#ok_mode>>::check();
            <#err as #private::IdempotentError<#err_mode>>::check();
            #send
        }
    }

    /// How the checks of `key` and `payload` report an unmet bound: see [`Self::mode_for`].
    fn mode(&self, span: Span) -> TokenStream {
        self.mode_for(self.generic.arguments, span)
    }

    /// How a check reports an unmet bound (see the runtime's `Concrete`): as the bound itself when the
    /// checked type may be a type parameter (`generic`), so that rustc suggests adding that bound and
    /// not the check; as the check's own message otherwise, one error without a list of other types.
    fn mode_for(&self, generic: bool, span: Span) -> TokenStream {
        let private = self.private(span);
        if generic {
            quote_spanned!(span=> #private::Generic)
        } else {
            quote_spanned!(span=> #private::Concrete)
        }
    }

    /// The `MissingKey` variant; a given one is spanned on its literal.
    fn missing_key(&self) -> TokenStream {
        let Some(MissingKeyArg { variant, literal }) = &self.args.missing_key else {
            let private = self.private(Span::call_site());
            return quote!(#private::MissingKey::Reject);
        };
        let private = self.private(literal.span());
        quote_spanned!(literal.span()=> #private::MissingKey::#variant)
    }

    fn handle(&self) -> TokenStream {
        let Some(store) = &self.args.store else {
            let private = self.private(Span::call_site());
            let call = self.call();
            return quote!(#private::installed(#call));
        };
        let private = self.private(store.span());
        let check = quote_spanned!(store.span()=> #private::IdempotencyHandle);
        let checked = checked(store, &check, store.to_token_stream());
        quote_spanned!(store.span()=> #private::handle(#checked))
    }

    fn key(&self) -> TokenStream {
        let key = self.args.key.as_ref().expect("checked in args::parse");
        let private = self.private(key.span());
        let mode = self.mode(key.span());
        let check = quote_spanned!(key.span()=> #private::IdempotencyKey::<#mode>);
        let checked = checked(key, &check, by_reference(key));
        let call = self.call();
        quote_spanned!(key.span()=> #private::key(#call, #checked))
    }

    fn fingerprint(&self) -> TokenStream {
        let Some(payload) = &self.args.payload else {
            return quote!(::core::option::Option::None);
        };
        let private = self.private(payload.span());
        let mode = self.mode(payload.span());
        let check = quote_spanned!(payload.span()=> #private::IdempotencyPayload::<#mode>);
        let checked = checked(payload, &check, by_reference(payload));
        let call = self.call();
        let fingerprint = quote_spanned!(payload.span()=>
            #private::fingerprint(#call, #checked)
        );
        quote!(::core::option::Option::Some(#fingerprint))
    }

    /// The call into the runtime, awaited: the attribute's operation with its options as builder calls
    /// (`.steps()`, `.restart_steps_after_failure()`, `.transact()`, `.detach()`), and the body as a
    /// closure that takes what the options give it and returns `async move { .. }`.
    ///
    /// rustc reports an unmet bound once per span. The checks of [`Self::check_output`] report a wrong
    /// return type on the whole return type; this call requires `Ret: Output` again and is reported on the
    /// call expression, which runs from the path to the closing parenthesis. Spanning the path on the
    /// return type's first token and the parentheses on its last makes that the same span, and the second
    /// report disappears.
    fn execute(&self, block: &Block) -> TokenStream {
        let output = self.output;
        let output_span = output.span();
        let at_output = self.private(output_span);
        let private = self.private(Span::call_site());
        let call = self.call();
        let options = self.options();
        let operation = quote! {
            #private::operation(
                __idempotent_handle,
                #call,
                __idempotent_key,
                __idempotent_fingerprint,
            ) #options
        };
        let describe = self.describe();
        let body = self.closure(&self.body(block));
        let last = last_span(output).unwrap_or(output_span);
        let arguments = group_at(
            Delimiter::Parenthesis,
            quote!(#operation, #describe, #body),
            last,
        );
        let execute = quote_spanned! {output_span=>
            #at_output::execute::<#output, _, _, _, _, _> #arguments .await
        };
        let Some(tx) = &self.args.transact else {
            return execute;
        };
        // `transact!` passes its input through when the runtime has the `dynamodb` feature and is a
        // compile error naming that feature otherwise: the macro cannot see the runtime's features.
        let guard = self.private(tx.span());
        // Called by a local name: the note rustc adds under the error of a `macro_rules!` macro names it as
        // it was called, and the runtime's path would show its hidden module.
        quote_spanned! {tx.span()=> {
            use #guard::transact as __idempotent_transact;
            __idempotent_transact! { #execute }
        }}
    }

    /// The attribute's options, as the builder calls a user would write on an `Operation`.
    fn options(&self) -> TokenStream {
        let mut options = TokenStream::new();
        if let Some(steps) = &self.args.steps {
            options.extend(quote_spanned!(steps.span()=> .steps()));
            if let Some(on_failure) = &self.args.on_failure
                && on_failure.restart
            {
                options.extend(
                    quote_spanned!(on_failure.literal.span()=> .restart_steps_after_failure()),
                );
            }
        }
        if let Some(tx) = &self.args.transact {
            options.extend(quote_spanned!(tx.span()=> .transact()));
        }
        if self.args.detach.is_some() {
            options.extend(quote!(.detach()));
        }
        options
    }

    /// The body as the closure the runtime calls with the body's context: it binds `steps = s` and
    /// `transact = tx` to what the context holds, then returns the body's future.
    fn closure(&self, body: &TokenStream) -> TokenStream {
        let context = format_ident!("__idempotent_context");
        if self.args.steps.is_none() && self.args.transact.is_none() {
            return quote!(move |_| #body);
        }
        let steps = self
            .args
            .steps
            .as_ref()
            .map_or_else(|| quote!(_), ToTokens::to_token_stream);
        let tx = self
            .args
            .transact
            .as_ref()
            .map_or_else(|| quote!(_), ToTokens::to_token_stream);
        quote! {
            move |#context| {
                let (#steps, #tx) = #context.into_parts();
                #body
            }
        }
    }

    /// The `&'static Call` of this function.
    fn call(&self) -> TokenStream {
        if self.per_type {
            quote!(__idempotent_call)
        } else {
            quote!(&__IDEMPOTENT_CALL)
        }
    }

    /// The closure that turns the body's error into the text stored on a FAILED record: its `Display`
    /// when it has one, its type name otherwise, chosen by autoref on `(&Describe(e)).describe()`. The only
    /// call by method syntax, so its method has a name no trait of the caller's would use.
    fn describe(&self) -> TokenStream {
        let output_span = self.output.span();
        let private = self.private(output_span);
        let err = format_ident!("__idempotent_err");
        quote_spanned! {output_span=>
            |#err| {
                #[allow(unused_imports)]
                use #private::{DescribeDisplay as _, DescribeOther as _};
                (&#private::Describe(#err)).idempotent_failure_text()
            }
        }
    }

    /// The body as written, behind a fake return edge typed as the return type (as tracing does), so
    /// that `return` and `?` in the body are checked against `-> ...` where the user wrote it. The block
    /// keeps the body's braces' span: a body that ends without a value (`Ok(x);`) is reported there.
    fn body(&self, block: &Block) -> TokenStream {
        // The items the body starts with (`use`, `const`, `fn`) stay first, before the fake return:
        // behind it they would be items after a statement (clippy's `items_after_statements`), a
        // lint on code the user did not write. Items are in scope in their whole block either way.
        let leading = block
            .stmts
            .iter()
            .take_while(|stmt| matches!(stmt, Stmt::Item(_)))
            .count();
        let (items, stmts) = block.stmts.split_at(leading);
        let output = self.output;
        let fake_return = quote_spanned! {output.span()=>
            #[allow(
                unknown_lints,
                unreachable_code,
                clippy::diverging_sub_expression,
                clippy::empty_loop,
                clippy::let_with_type_underscore,
                clippy::needless_return,
                clippy::unreachable
            )]
            if false {
                let __idempotent_fake_return: #output = loop {};
                return __idempotent_fake_return;
            }
        };
        let braces = block.brace_token.span.join();
        let body = group_at(
            Delimiter::Brace,
            quote! {
                #(#items)*
                #fake_return
                #(#stmts)*
            },
            braces,
        );
        quote_spanned!(braces=> async move #body)
    }
}

/// `Check::checked(&(value))`: `value`, through a runtime trait that reports a value of the wrong
/// type with its own message. Spanned from the first token of the user's `expr` to its last, as the
/// argument of the runtime call that needs the same bound, so that rustc reports it once, there.
fn checked(expr: &Expr, check: &TokenStream, value: TokenStream) -> TokenStream {
    let (first, last) = (expr.span(), last_span(expr).unwrap_or(expr.span()));
    let value = group_at(Delimiter::Parenthesis, value, last);
    let argument = group_at(
        Delimiter::Parenthesis,
        quote_spanned!(first=> &#value),
        last,
    );
    quote_spanned!(first=> #check::checked #argument)
}

fn optional_duration(arg: Option<&DurationArg>) -> TokenStream {
    let Some(duration) = arg else {
        return quote!(::core::option::Option::None);
    };
    let millis = u64::try_from(duration.value.as_millis()).unwrap_or(u64::MAX);
    quote_spanned! {duration.literal.span()=>
        ::core::option::Option::Some(::core::time::Duration::from_millis(#millis))
    }
}

/// Whether `sig` declares type parameters or takes `impl Trait` arguments. Those of an enclosing impl
/// cannot be seen from here.
fn has_type_parameters(sig: &Signature) -> bool {
    sig.generics.type_params().next().is_some()
        || sig.inputs.iter().any(|input| match input {
            FnArg::Typed(typed) => mentions_impl_trait(&typed.ty),
            FnArg::Receiver(_) => false,
        })
}

/// The type arguments of a `Result<T, E>` as written, `(Some(T), Some(E))`; `(Some(T), None)` for an
/// alias that names only its `Ok` type (`io::Result<T>`); `(None, None)` for anything else.
fn result_parts(output: &Type) -> (Option<&Type>, Option<&Type>) {
    let Type::Path(path) = output else {
        return (None, None);
    };
    let Some(syn::PathArguments::AngleBracketed(arguments)) =
        path.path.segments.last().map(|segment| &segment.arguments)
    else {
        return (None, None);
    };
    let mut types = arguments.args.iter().filter_map(|argument| match argument {
        syn::GenericArgument::Type(ty) => Some(ty),
        _ => None,
    });
    (types.next(), types.next())
}

/// Whether `ty` may be or hold a type parameter: it names `Self`, an `impl Trait`, one of the
/// function's own type parameters (`own`), or, since an impl's cannot be seen from here, a name spelled
/// as type parameters are, one capital letter and digits (`T`, `E`, `T2`), that is not a later segment of
/// a path. Only how errors are reported depends on it, and whether `E: Send` is checked.
fn may_be_generic(ty: &Type, own: &[Ident]) -> bool {
    fn walk(tokens: TokenStream, own: &[Ident]) -> bool {
        let mut after_colons = false;
        for tree in tokens {
            let found = match &tree {
                TokenTree::Ident(ident) => {
                    let name = ident.to_string();
                    let mut chars = name.chars();
                    let parameter_like = chars.next().is_some_and(|c| c.is_ascii_uppercase())
                        && chars.all(|c| c.is_ascii_digit());
                    name == "Self"
                        || name == "impl"
                        || own.contains(ident)
                        || (parameter_like && !after_colons)
                }
                TokenTree::Group(group) => walk(group.stream(), own),
                TokenTree::Punct(_) | TokenTree::Literal(_) => false,
            };
            if found {
                return true;
            }
            after_colons = matches!(&tree, TokenTree::Punct(p) if p.as_char() == ':');
        }
        false
    }
    walk(ty.to_token_stream(), own)
}

/// Whether `sig` is a method's: it takes `self`, or names `Self` (only an impl or a trait can), so the
/// body can name the type it is called on.
fn is_method(sig: &Signature) -> bool {
    fn names_self(tokens: TokenStream) -> bool {
        tokens.into_iter().any(|tree| match tree {
            TokenTree::Ident(ident) => ident == "Self",
            TokenTree::Group(group) => names_self(group.stream()),
            TokenTree::Punct(_) | TokenTree::Literal(_) => false,
        })
    }
    sig.receiver().is_some()
        || names_self(sig.inputs.to_token_stream())
        || names_self(sig.output.to_token_stream())
        || names_self(sig.generics.to_token_stream())
        || sig
            .generics
            .where_clause
            .as_ref()
            .is_some_and(|w| names_self(w.to_token_stream()))
}

/// Whether `ty` has an `impl Trait` anywhere in it (`impl Serialize`, `&impl Serialize`, `(u64, impl ..)`).
fn mentions_impl_trait(ty: &Type) -> bool {
    fn walk(tokens: TokenStream) -> bool {
        tokens.into_iter().any(|tree| match tree {
            TokenTree::Ident(ident) => ident == "impl",
            TokenTree::Group(group) => walk(group.stream()),
            TokenTree::Punct(_) | TokenTree::Literal(_) => false,
        })
    }
    walk(ty.to_token_stream())
}

/// Whether `expr` names a place (`req`, `req.order_id`, `self.tenant.id`), which `&` borrows as it is.
fn is_place(expr: &Expr) -> bool {
    match expr {
        Expr::Path(_) => true,
        Expr::Field(f) => is_place(&f.base),
        Expr::Group(g) => is_place(&g.expr),
        _ => false,
    }
}

/// Makes a tuple or array borrow each of its elements instead of moving them, so
/// `key = (req.tenant, req.order_id)` does not move out of `req` before the body runs. Every element is
/// borrowed, not only places, so that an array such as `[req.id, 0]` keeps one element type. A lone
/// expression is already borrowed by the generated `&(..)`; deeper nesting is left as written.
fn by_reference(expr: &Expr) -> TokenStream {
    let borrow = |e: &Expr| {
        if is_place(e) {
            quote_spanned!(e.span()=> &#e)
        } else {
            quote_spanned!(e.span()=> &(#e))
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

/// The span of the last token of `tokens`: with the first token's span (`Spanned::span` on stable Rust), it
/// lets generated code cover exactly the user's tokens.
fn last_span(tokens: impl ToTokens) -> Option<Span> {
    tokens
        .into_token_stream()
        .into_iter()
        .last()
        .map(|tree| tree.span())
}

/// `tokens` in `delimiter`s that carry `span`.
fn group_at(delimiter: Delimiter, tokens: TokenStream, span: Span) -> Group {
    let mut group = Group::new(delimiter, tokens);
    group.set_span(span);
    group
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use super::expand;
    use crate::args::Args;
    use crate::diag::Diagnostics;

    fn expanded(args: proc_macro2::TokenStream) -> String {
        let mut diag = Diagnostics::default();
        let args = Args::parse(args, &mut diag).expect("valid arguments");
        assert!(diag.finish().is_ok());
        let item = syn::parse_quote! {
            async fn charge(idem: &Idempotency, order_id: u64) -> Result<u64, Error> {
                Ok(order_id)
            }
        };
        expand(&args, item).to_string()
    }

    /// With `crate = ".."`, nothing in the expansion may still name the default path: in a crate that
    /// only has the renamed dependency, it would not resolve.
    #[test]
    fn renamed_crate_is_the_only_path_to_the_runtime() {
        let out = expanded(quote! {
            key = order_id, payload = order_id, store = idem, transact = tx, missing_key = "allow",
            crate = "idem"
        });
        assert!(!out.contains("idempotent_runtime"), "{out}");
        assert!(out.contains("idem :: __private :: execute"), "{out}");
        assert!(out.contains("idem :: __private :: operation"), "{out}");
    }

    #[test]
    fn default_crate_path_is_absolute() {
        let out = expanded(quote!(key = order_id));
        assert!(
            out.contains(":: idempotent_runtime :: __private :: execute"),
            "{out}"
        );
    }

    /// Each option is one builder call on the operation, in one order whatever the attribute's; one
    /// runtime function runs them all, and the body binds the names given to what its context holds.
    #[test]
    fn options_are_builder_calls() {
        let chain = |out: &str| {
            let from = out
                .find("__idempotent_fingerprint ,")
                .expect("the operation")
                + 26;
            let to = from + out[from..].find(", |").expect("the describe closure");
            out[from..to].split_whitespace().collect::<String>()
        };
        for (args, expected) in [
            (quote!(key = order_id), ")"),
            (quote!(key = order_id, steps = s), ").steps()"),
            (
                quote!(key = order_id, detach, steps = s),
                ").steps().detach()",
            ),
            (
                quote!(key = order_id, steps = s, on_failure = "restart"),
                ").steps().restart_steps_after_failure()",
            ),
            (
                quote!(key = order_id, steps = s, on_failure = "resume"),
                ").steps()",
            ),
            (
                quote!(key = order_id, transact = tx, steps = s),
                ").steps().transact()",
            ),
            (
                quote!(key = order_id, steps = s, transact = tx, detach),
                ").steps().transact().detach()",
            ),
        ] {
            let out = expanded(args.clone());
            assert_eq!(chain(&out), expected, "{args}");
            assert_eq!(out.matches(":: __private :: execute").count(), 1, "{out}");
        }
        let out = expanded(quote!(key = order_id, steps = checkpoint));
        assert!(
            out.contains("let (checkpoint , _) = __idempotent_context . into_parts () ;"),
            "{out}"
        );
        let out = expanded(quote!(key = order_id, steps = s, transact = tx));
        assert!(
            out.contains("let (s , tx) = __idempotent_context . into_parts () ;"),
            "{out}"
        );
        let out = expanded(quote!(key = order_id));
        assert!(out.contains("move | _ | async move"), "{out}");
    }

    /// The items a body starts with come before the generated fake return, the rest after it.
    #[test]
    fn leading_items_stay_first() {
        let mut diag = Diagnostics::default();
        let args = Args::parse(quote!(key = order_id), &mut diag).expect("valid arguments");
        let item = syn::parse_quote! {
            async fn charge(order_id: u64) -> Result<u64, Error> {
                use std::ops::Mul;
                const FACTOR: u64 = 3;
                let scaled = order_id.mul(FACTOR);
                fn late() {}
                Ok(scaled)
            }
        };
        let out = expand(&args, item).to_string();
        let at = |needle: &str| {
            out.find(needle)
                .unwrap_or_else(|| panic!("{needle}: {out}"))
        };
        assert!(
            at("use std :: ops :: Mul") < at("__idempotent_fake_return"),
            "{out}"
        );
        assert!(at("const FACTOR") < at("__idempotent_fake_return"), "{out}");
        assert!(at("__idempotent_fake_return") < at("let scaled"), "{out}");
        assert!(at("let scaled") < at("fn late"), "{out}");
    }

    /// Which checks report as the bound (`Generic`) and whether `E: Send` is checked, by what the
    /// return type names.
    #[test]
    fn the_return_types_parts_are_checked_by_what_they_name() {
        let own: Vec<proc_macro2::Ident> = vec![syn::parse_quote!(K)];
        for (ty, generic) in [
            (quote!(Receipt), false),
            (quote!(Vec<shop::Receipt>), false),
            (quote!(Box<dyn std::error::Error>), false),
            (quote!(T), true),
            (quote!(Vec<T2>), true),
            (quote!(Self::Error), true),
            (quote!(K), true),
            (quote!(<E as Trait>::Out), true),
            (quote!(io::E), false),
        ] {
            let ty: syn::Type = syn::parse2(ty.clone()).unwrap();
            assert_eq!(
                super::may_be_generic(&ty, &own),
                generic,
                "{}",
                quote::ToTokens::to_token_stream(&ty)
            );
        }
    }

    #[test]
    fn missing_key_is_rejected_unless_the_attribute_says_otherwise() {
        let policy = |out: String| {
            ["Reject", "Allow", "Skip"]
                .into_iter()
                .filter(|v| out.contains(&format!("MissingKey :: {v}")))
                .collect::<Vec<_>>()
        };
        assert_eq!(policy(expanded(quote!(key = order_id))), ["Reject"]);
        for (given, emitted) in [("reject", "Reject"), ("allow", "Allow"), ("skip", "Skip")] {
            let out = expanded(quote!(key = order_id, missing_key = #given));
            assert_eq!(policy(out), [emitted], "{given}");
        }
    }
}
