//! The `#[idempotent]` attribute. Use it through the `idempotent-runtime` crate, which re-exports it and
//! holds the runtime the generated code calls; its documentation is on `idempotent_runtime::idempotent`.

mod args;
mod diag;
mod expand;
mod item;

use proc_macro::TokenStream;

/// Turns an `async fn` into an exactly-once operation; see `idempotent_runtime::idempotent`.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    entry(args.into(), item.into()).into()
}

fn entry(args: proc_macro2::TokenStream, item: proc_macro2::TokenStream) -> proc_macro2::TokenStream {
    let mut diag = diag::Diagnostics::default();
    let parsed_args = args::Args::parse(args, &mut diag);
    let function = match syn::parse2::<syn::ItemFn>(item.clone()) {
        Ok(function) => function,
        Err(e) => {
            let mut error = syn::Error::new(
                e.span(),
                "#[idempotent] goes on an `async fn` with a body",
            );
            if let Err(args_error) = parsed_args {
                error.combine(args_error);
            }
            return diag::with_original(item, &error);
        }
    };
    item::check(&function, &mut diag);
    let args = match parsed_args {
        Ok(args) => args,
        Err(e) => {
            diag.push(e);
            return diag::with_original(item, &diag.finish().unwrap_err());
        }
    };
    match diag.finish() {
        Ok(()) => expand::expand(&args, function),
        Err(error) => diag::with_original(item, &error),
    }
}
