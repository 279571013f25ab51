//! What generated code calls. Not public API: it may change in any release.

use std::borrow::Cow;
use std::fmt::Display;
use std::future::Future;
use std::ops::Deref;
use std::sync::{OnceLock, PoisonError, RwLock};

use serde::Serialize;
use serde::de::DeserializeOwned;

pub use crate::call::{Call, MissingKey};
pub use crate::handler::steps::Steps;
pub use crate::key::DerivedKey;
use crate::operation::{Context, Given, Placement, Unchanged};
pub use crate::operation::{DetachedCall, Early, Options};
use crate::{Error, Idempotency, Operation};

// The checks below exist for the compile errors. Generated code calls each through its trait's path
// (`<Ret as IdempotentOutput>::check()`, `<_ as IdempotencyKey<Concrete>>::checked(&key)`), spanned on the
// user's tokens and ahead of the runtime call that needs the same bound there: rustc then reports the unmet
// bound once, with the trait's message and without a "required by a bound in" note naming this module.

/// How a check reports an unmet bound; the macro picks one per function.
///
/// With [`Concrete`], the check's impl is `do_not_recommend`: rustc reports the check itself, its message
/// and nothing else, rather than the impl's failing where clause (a bare serde error with a page of
/// notes). For a type parameter, though, it would then suggest bounding the parameter by the check; with
/// [`Generic`], the plain impl makes it suggest the bound that is missing (`T: serde::Serialize`).
pub struct Concrete;

/// See [`Concrete`]: for functions with type parameters.
pub struct Generic;

/// `Result<T, E>` (or an alias of it), taken apart; any `T` and `E`, which [`IdempotentValue`] and
/// [`IdempotentError`] check, each with its own message.
#[diagnostic::on_unimplemented(
    message = "`#[idempotent]` functions must return `Result<T, E>`; `{Self}` is not a `Result`",
    label = "expected `Result<T, E>`",
    note = "the `Ok` value is stored as JSON and replayed to duplicates (`T: Serialize + DeserializeOwned`), and the error type carries the idempotency errors too (`E: From<idempotent_runtime::Error>`), as in `Result<{Self}, idempotent_runtime::Error>`"
)]
pub trait IdempotentOutput: Sized {
    /// `T`.
    type Ok;
    /// `E`.
    type Err;
    /// Splits the result.
    fn split(self) -> Result<Self::Ok, Self::Err>;
    /// Joins the result.
    fn join(result: Result<Self::Ok, Self::Err>) -> Self;
    /// Checks that the return type is a `Result`.
    #[inline]
    fn check() {}
}

#[diagnostic::do_not_recommend]
impl<T, E> IdempotentOutput for Result<T, E> {
    type Ok = T;
    type Err = E;
    #[inline]
    fn split(self) -> Self {
        self
    }
    #[inline]
    fn join(result: Self) -> Self {
        result
    }
}

/// The `Ok` type: stored as JSON and read back for duplicates.
#[diagnostic::on_unimplemented(
    message = "`#[idempotent]` stores the `Ok` value as JSON and replays it: `{Self}` must implement `serde::Serialize` and `serde::de::DeserializeOwned`",
    label = "the `Ok` type `{Self}` cannot be stored and replayed",
    note = "for a type of your own, derive both: `#[derive(serde::Serialize, serde::Deserialize)]`"
)]
pub trait IdempotentValue<M = Concrete> {
    /// Checks the `Ok` type.
    #[inline]
    fn check() {}
}

#[diagnostic::do_not_recommend]
impl<T: Serialize + DeserializeOwned> IdempotentValue<Concrete> for T {}

impl<T: Serialize + DeserializeOwned> IdempotentValue<Generic> for T {}

/// The error type: it also carries this crate's errors (in progress, payload mismatch, store failures).
#[diagnostic::on_unimplemented(
    message = "`#[idempotent]` returns its own errors through the function's error type: `{Self}` must implement `From<idempotent_runtime::Error>`",
    label = "the error type `{Self}` cannot carry an `idempotent_runtime::Error`",
    note = "add a variant that holds it and `impl From<idempotent_runtime::Error> for {Self}`, or return `idempotent_runtime::Error` itself"
)]
pub trait IdempotentError<M = Concrete> {
    /// Checks the error type.
    #[inline]
    fn check() {}
}

#[diagnostic::do_not_recommend]
impl<E: From<Error>> IdempotentError<Concrete> for E {}

impl<E: From<Error>> IdempotentError<Generic> for E {}

/// The error type, again: held while the record is marked FAILED and then returned, so a `!Send` error
/// would make the function's future `!Send`, reported far from here ("await occurs here") when the
/// future is spawned. Checked on the return type instead, with the fix.
#[diagnostic::on_unimplemented(
    message = "`#[idempotent]` holds an `Err` while it marks the record FAILED, then returns it: the error type `{Self}` must be `Send`",
    label = "the error type `{Self}` is not `Send`",
    note = "for a boxed error, add `+ Send + Sync`: `Box<dyn std::error::Error + Send + Sync>`"
)]
pub trait IdempotentErrorSend<M = Concrete> {
    /// Checks that the error type is `Send`.
    #[inline]
    fn check() {}
}

#[diagnostic::do_not_recommend]
impl<E: Send> IdempotentErrorSend<Concrete> for E {}

impl<E: Send> IdempotentErrorSend<Generic> for E {}

/// What the runtime needs of the return type: the checked parts of an [`IdempotentOutput`].
pub trait Output: Sized {
    /// The stored value.
    type Ok: Serialize + DeserializeOwned;
    /// The function's error.
    type Err: From<Error>;
    /// Splits the result.
    fn into_result(self) -> Result<Self::Ok, Self::Err>;
    /// Joins the result.
    fn from_result(result: Result<Self::Ok, Self::Err>) -> Self;
}

/// Blanket, so that each bound `execute` puts on its return type fails on the very bound that one of the
/// checks above already reported there, and rustc does not report it again.
impl<R> Output for R
where
    R: IdempotentOutput,
    R::Ok: Serialize + DeserializeOwned,
    R::Err: From<Error>,
{
    type Ok = R::Ok;
    type Err = R::Err;
    #[inline]
    fn into_result(self) -> Result<R::Ok, R::Err> {
        self.split()
    }
    #[inline]
    fn from_result(result: Result<R::Ok, R::Err>) -> Self {
        R::join(result)
    }
}

/// The `key = ..` expression.
#[diagnostic::on_unimplemented(
    message = "`key = ..` must implement `serde::Serialize`; `{Self}` does not",
    label = "the key is hashed from its serialized form",
    note = "for a type of your own, `#[derive(serde::Serialize)]`; or give the fields that identify the call, like `key = (req.tenant, req.order_id)`"
)]
pub trait IdempotencyKey<M = Concrete> {
    /// The key, checked.
    #[inline]
    fn checked(&self) -> &Self {
        self
    }
}

#[diagnostic::do_not_recommend]
impl<K: Serialize + ?Sized> IdempotencyKey<Concrete> for K {}

impl<K: Serialize + ?Sized> IdempotencyKey<Generic> for K {}

/// The `payload = ..` expression.
#[diagnostic::on_unimplemented(
    message = "`payload = ..` must implement `serde::Serialize`; `{Self}` does not",
    label = "the payload is fingerprinted from its serialized form",
    note = "for a type of your own, `#[derive(serde::Serialize)]`"
)]
pub trait IdempotencyPayload<M = Concrete> {
    /// The payload, checked.
    #[inline]
    fn checked(&self) -> &Self {
        self
    }
}

#[diagnostic::do_not_recommend]
impl<P: Serialize + ?Sized> IdempotencyPayload<Concrete> for P {}

impl<P: Serialize + ?Sized> IdempotencyPayload<Generic> for P {}

/// The `store = ..` expression. One impl: a missing bound on [`Handle`] would be a bound the user
/// cannot name either way.
#[diagnostic::on_unimplemented(
    message = "`store = ..` must be an `Idempotency` handle (or a reference, `Box`, `Arc`, `LazyLock` or anything else that dereferences to one); `{Self}` is not",
    label = "expected an `Idempotency` here",
    note = "to use a store such as `MemoryStore` or `DynamoDbStore`, wrap it once: `Idempotency::builder(store).build()`, and pass that handle"
)]
pub trait IdempotencyHandle {
    /// The handle, checked.
    #[inline]
    fn checked(&self) -> &Self {
        self
    }
}

#[diagnostic::do_not_recommend]
impl<S: Handle + ?Sized> IdempotencyHandle for S {}

/// What `store = ..` accepts: an `Idempotency`, or anything that dereferences to one, through any
/// number of steps (`&Idempotency`, `Arc<Idempotency>`, a `static LazyLock<Idempotency>`). A trait of
/// its own (rather than `Borrow<Idempotency>`) so that a wrong expression, most often a store passed
/// where its handle belongs, gets a message that says what to pass.
#[diagnostic::on_unimplemented(
    message = "`store = ..` must be an `Idempotency` handle (or a reference, `Box`, `Arc`, `LazyLock` or anything else that dereferences to one); `{Self}` is not",
    label = "expected an `Idempotency` here",
    note = "to use a store such as `MemoryStore` or `DynamoDbStore`, wrap it once: `Idempotency::builder(store).build()`, and pass that handle"
)]
pub trait Handle {
    /// The handle.
    fn idempotency(&self) -> &Idempotency;
}

impl Handle for Idempotency {
    #[inline]
    fn idempotency(&self) -> &Idempotency {
        self
    }
}

/// Pointers and wrappers of a handle: `&`, `&mut`, `Box`, `Rc`, `Arc`, `LazyLock`, a user's own.
/// `Idempotency` itself is not `Deref`, so the two impls do not overlap.
impl<P> Handle for P
where
    P: Deref + ?Sized,
    P::Target: Handle,
{
    #[inline]
    fn idempotency(&self) -> &Idempotency {
        (**self).idempotency()
    }
}

/// The handle given with `store = ..`.
#[inline]
pub fn handle<S: Handle + ?Sized>(store: &S) -> Early<Idempotency> {
    Ok(store.idempotency().clone())
}

/// The [`Call`]s of a method without `name = ..`, one per instance of the method: its namespace is the
/// method's path as the compiler spells it, `Self` and the trait included (`shop::Card::charge` in an
/// inherent impl, `<shop::Card as shop::Gateway>::charge` in a trait impl or for a trait's default
/// method, `<shop::Desk as shop::Handle<shop::Order>>::handle`), read from the type name of a closure
/// in its body. Methods of one name on different types (trait impls in one module, a trait's default
/// method, instantiations of a generic impl), of different traits on one type, an inherent method and
/// a trait's, and the impls of a generic trait for one type never share records. The method's own type
/// parameters are left out: like a generic function's, its instantiations share records.
///
/// A `static` in the generated code, shared by every instantiation of the method. Each instance's
/// `Call` is made once, on its first call, and kept for the program's life (its namespace string is
/// leaked: one per instance); later calls look it up without allocating. The first instance seen is one
/// atomic load and a pointer comparison away; others are behind a read lock.
pub struct PerType {
    /// The method's settings; `namespace` is the method's name.
    call: Call,
    /// The first type's name and `Call`: the only one for a method of a non-generic impl.
    first: OnceLock<(&'static str, Call)>,
    /// The others, for a trait's default method or a generic impl.
    more: RwLock<Vec<(&'static str, &'static Call)>>,
}

impl PerType {
    /// The method's settings, its name as `namespace`.
    #[must_use]
    pub const fn new(call: Call) -> Self {
        Self {
            call,
            first: OnceLock::new(),
            more: RwLock::new(Vec::new()),
        }
    }

    /// The `Call` for the method's instance whose body holds a closure of type name `site` (what
    /// `std::any::type_name_of_val` says of it).
    #[inline]
    pub fn of(&'static self, site: &'static str) -> &'static Call {
        match self.first.get() {
            Some((name, call)) if same(name, site) => call,
            _ => self.of_another(site),
        }
    }

    #[cold]
    fn of_another(&'static self, site: &'static str) -> &'static Call {
        let (name, call) = self.first.get_or_init(|| (site, self.typed(site)));
        if same(name, site) {
            return call;
        }
        let find = |more: &[(&'static str, &'static Call)]| {
            more.iter()
                .find(|(name, _)| same(name, site))
                .map(|(_, call)| *call)
        };
        if let Some(call) = find(&self.more.read().unwrap_or_else(PoisonError::into_inner)) {
            return call;
        }
        let mut more = self.more.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(call) = find(&more) {
            return call;
        }
        let call: &'static Call = Box::leak(Box::new(self.typed(site)));
        more.push((site, call));
        call
    }

    /// The method's `Call` for the closure type name `site`: the method's path, without the closures
    /// the name ends with (the generated code's, the `async fn`'s body) and the method's own generic
    /// arguments.
    fn typed(&self, site: &str) -> Call {
        let namespace = method_path(site, self.call.namespace);
        Call {
            namespace: Box::leak(namespace.into_boxed_str()),
            ..self.call
        }
    }
}

/// `<shop::Card as shop::Gateway>::charge` from `<shop::Card as shop::Gateway>::charge<u8>::{{closure}}`.
/// Should the compiler spell the name in a way this does not take apart, the name as it is, followed by
/// the method's, still names that one instance.
fn method_path(site: &str, method: &str) -> String {
    let mut path = site;
    // The closures: `::{{closure}}` today; any segment in braces.
    while path.ends_with('}')
        && let Some(at) = path.rfind("::{")
    {
        path = &path[..at];
    }
    // The method's own generic arguments, `charge<u8>`.
    if path.ends_with('>') {
        let mut depth = 0_usize;
        for (at, c) in path.char_indices().rev() {
            match c {
                // Not the arrow of a function type's output (`fn(u8) -> u8`).
                '>' if !path[..at].ends_with('-') => depth += 1,
                '<' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        path = &path[..at];
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    if path.ends_with(&format!("::{method}")) {
        path.to_owned()
    } else {
        format!("{site}::{method}")
    }
}

/// Whether two type names are the same: the same string (most often at the same address).
#[inline]
fn same(a: &str, b: &str) -> bool {
    std::ptr::eq(a, b) || a == b
}

/// The installed default handle.
pub fn installed(call: &Call) -> Early<Idempotency> {
    Idempotency::installed().ok_or_else(|| {
        Box::new(Error::NotInstalled {
            namespace: call.namespace.to_owned(),
        })
    })
}

/// The record key for the attribute's `key` expression; whether it may be used is decided with the
/// call's [`MissingKey`] policy when the call runs.
pub fn key<K: Serialize + ?Sized>(call: &Call, key: &K) -> Early<DerivedKey> {
    DerivedKey::for_call(call, key).map_err(Box::new)
}

/// The fingerprint of the attribute's `payload` expression.
pub fn fingerprint<P: Serialize + ?Sized>(call: &Call, payload: &P) -> Early<String> {
    crate::key::fingerprint_for(call, payload).map_err(Box::new)
}

/// The operation of one call of an attributed function, before its options: the handle (or why there is
/// none), the call's settings, the key and the payload's fingerprint. The generated code adds the
/// attribute's options (`.steps()`, `.restart_steps_after_failure()`, `.transact()`, `.detach()`) as
/// a user would, then hands it to [`execute`].
pub fn operation(
    handle: Early<Idempotency>,
    call: &Call,
    key: Early<DerivedKey>,
    fingerprint: Option<Early<String>>,
) -> Operation<'static> {
    Operation::from_parts(handle.map(Cow::Owned), *call, key, fingerprint)
}

/// Runs the state machine around `body`, through [`Operation`]'s one path (its `run`, for a return
/// type that is any [`Output`] and an error described by `describe`). Errors found before the body (no
/// store, a key that does not serialize, a missing key the call rejects) come back through
/// `E: From<Error>`, and the body does not run. A missing key with [`MissingKey::Skip`] runs the body
/// alone, without the store.
///
/// A plain function returning `Map`s rather than an `async fn` around `async` blocks: those hold their
/// argument again beside each local it is moved into, and the body's future was three times in the
/// caller's (see the test below).
pub fn execute<R, S, W, P, F, Fut>(
    operation: Operation<'static, Unchanged, S, W, P>,
    describe: fn(&R::Err) -> String,
    body: F,
) -> impl Future<Output = R>
where
    R: Output,
    F: FnOnce(Context<S, W>) -> Fut,
    Fut: Future<Output = R>,
    S: Given,
    W: Given,
    P: Placement<R::Ok, R::Err, Split<Fut>, Unchanged>,
{
    let body = |context| Split {
        future: body(context),
    };
    Map {
        future: operation.launch(describe, body),
        map: R::from_result,
    }
}

pin_project_lite::pin_project! {
    /// The body's future, its output taken apart into the `Result` it is ([`Output::into_result`]).
    pub struct Split<Fut> {
        #[pin]
        future: Fut,
    }
}

impl<Fut> Future for Split<Fut>
where
    Fut: Future,
    Fut::Output: Output,
{
    type Output = Result<<Fut::Output as Output>::Ok, <Fut::Output as Output>::Err>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        self.project().future.poll(cx).map(Output::into_result)
    }
}

pin_project_lite::pin_project! {
    /// `future`, its output passed through `map`: a future with no state of its own.
    struct Map<Fut, M> {
        #[pin]
        future: Fut,
        map: M,
    }
}

impl<Fut: Future, M: Fn(Fut::Output) -> T, T> Future for Map<Fut, M> {
    type Output = T;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<T> {
        let this = self.project();
        this.future.poll(cx).map(|out| (this.map)(out))
    }
}

/// Wraps the code generated for `transact = ..`: passes it through when this crate has the `dynamodb`
/// feature, and is one compile error that names the feature otherwise (the macro cannot see this crate's
/// features).
#[cfg(feature = "dynamodb")]
#[doc(hidden)]
#[macro_export]
macro_rules! __idempotent_transact {
    ($($body:tt)*) => { $($body)* };
}

/// Wraps the code generated for `transact = ..`: this build has no `dynamodb` feature.
#[cfg(not(feature = "dynamodb"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __idempotent_transact {
    ($($body:tt)*) => {
        ::core::compile_error!(
            "`transact = ..` needs the `dynamodb` feature of `idempotent-runtime`, which this build does not enable; add `features = [\"dynamodb\"]` to the `idempotent-runtime` dependency in Cargo.toml (or keep its default features)"
        )
    };
}

pub use crate::__idempotent_transact as transact;

/// Text stored for a FAILED record: the error's `Display` when it has one ([`DescribeDisplay`]), its type
/// name otherwise ([`DescribeOther`]); picked by method resolution on
/// `(&Describe(e)).idempotent_failure_text()`.
pub struct Describe<'a, E>(pub &'a E);

/// Chosen first, when `E: Display`.
pub trait DescribeDisplay {
    /// The error's text. Named so that no trait of the caller's in scope has a method of that name.
    fn idempotent_failure_text(&self) -> String;
}

impl<E: Display> DescribeDisplay for Describe<'_, E> {
    fn idempotent_failure_text(&self) -> String {
        self.0.to_string()
    }
}

/// The fallback, for error types without `Display`.
pub trait DescribeOther {
    /// The error's type name.
    fn idempotent_failure_text(&self) -> String;
}

impl<E> DescribeOther for &Describe<'_, E> {
    fn idempotent_failure_text(&self) -> String {
        format!("an error of type `{}`", std::any::type_name::<E>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a call evaluates before it starts (its handle, key and fingerprint) is moved through several
    /// layers before the state machine takes it apart: a possible error is boxed, so that each value is
    /// no larger than what it holds on success plus a word (an `Error` is 64 bytes).
    #[test]
    fn what_a_call_evaluates_first_is_not_inflated_by_its_error() {
        use std::mem::size_of;
        assert!(size_of::<Error>() > 3 * size_of::<usize>());
        assert!(size_of::<Early<Idempotency>>() <= size_of::<Idempotency>() + 8);
        assert!(size_of::<Early<DerivedKey>>() <= size_of::<DerivedKey>() + 8);
        assert!(size_of::<Option<Early<String>>>() <= size_of::<String>() + 8);
    }

    /// A method's `Call` is made once per instance and then found again: the same `&'static Call` (no
    /// new namespace string) on every later call, whichever instances' calls interleave.
    #[test]
    fn a_methods_call_is_made_once_per_type() {
        static CALL: PerType = PerType::new(Call::new("charge"));
        let card = "shop::Card::charge::{{closure}}::{{closure}}";
        let cash = "<shop::Cash as shop::Gateway>::charge::{{closure}}::{{closure}}";
        let first_card = CALL.of(card);
        let first_cash = CALL.of(cash);
        assert_eq!(first_card.namespace, "shop::Card::charge");
        assert_eq!(
            first_cash.namespace,
            "<shop::Cash as shop::Gateway>::charge"
        );
        for _ in 0..3 {
            assert!(std::ptr::eq(CALL.of(card), first_card));
            assert!(std::ptr::eq(CALL.of(cash), first_cash));
            // The same name at another address (another codegen unit's copy) is the same instance.
            assert!(std::ptr::eq(
                CALL.of(&String::from(cash).leak()[..]),
                first_cash
            ));
        }
        assert_eq!(CALL.more.read().unwrap().len(), 1);
    }

    #[test]
    fn a_methods_path_is_its_closures_without_the_closures_and_its_own_arguments() {
        for (site, path) in [
            (
                "<a::L<u8> as a::H<a::O<u8>>>::h::{{closure}}::{{closure}}",
                "<a::L<u8> as a::H<a::O<u8>>>::h",
            ),
            ("a::Svc::h<u8, a::K<&str>>::{{closure}}", "a::Svc::h"),
            ("a::Svc::h<fn(u8) -> a::K<u8>>::{{closure}}", "a::Svc::h"),
            (
                "a::f::{{closure}}::S::h::{closure#0}",
                "a::f::{{closure}}::S::h",
            ),
            // Not spelled as expected: kept whole, the method's name after it.
            ("a::Svc::{{closure}}x", "a::Svc::{{closure}}x::h"),
        ] {
            assert_eq!(method_path(site, "h"), path, "{site}");
        }
    }

    /// The future a caller holds for an `#[idempotent]` call has the body's future in it once: a body
    /// 512 bytes larger makes it 512 bytes larger.
    #[test]
    fn a_callers_future_holds_the_body_once() {
        static CALL: Call = Call::new("x");
        fn missing<T>() -> Early<T> {
            Err(Box::new(Error::NotInstalled {
                namespace: String::new(),
            }))
        }
        fn size<B: Future<Output = Result<u32, Error>>>(body: B) -> usize {
            std::mem::size_of_val(&execute::<Result<u32, Error>, _, _, _, _, _>(
                operation(missing(), &CALL, missing(), None),
                |e: &Error| e.to_string(),
                |_| body,
            ))
        }
        let small = [1_u8; 96];
        let large = [1_u8; 96 + 512];
        let grew = size(async move { Ok(u32::from(large[0])) })
            - size(async move { Ok(u32::from(small[0])) });
        assert!(
            grew <= 512 + 16,
            "a body 512 bytes larger made the caller's future {grew} bytes larger"
        );
    }
}
