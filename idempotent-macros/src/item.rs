//! Checks on the decorated function.

use syn::{ItemFn, ReturnType};

use crate::diag::Diagnostics;

/// Records every reason `item` cannot be made idempotent.
pub(crate) fn check(item: &ItemFn, diag: &mut Diagnostics) {
    let sig = &item.sig;
    if let Some(constness) = &sig.constness {
        diag.error(constness, "#[idempotent] cannot be used on a `const fn`");
    }
    if sig.asyncness.is_none() {
        diag.error(sig.fn_token, "#[idempotent] requires an `async fn`");
    }
    if let ReturnType::Default = sig.output {
        diag.error(
            &sig.ident,
            "#[idempotent] requires a return type `-> Result<T, E>` with `T: Serialize + DeserializeOwned` and `E: From<idempotent_runtime::Error>`",
        );
    }
    if let Some(variadic) = &sig.variadic {
        diag.error(variadic, "#[idempotent] cannot be used on a variadic function");
    }
}
