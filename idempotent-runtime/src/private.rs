//! What generated code calls. Not public API: it may change in any release.

use std::borrow::Cow;
use std::fmt::Display;
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

pub use crate::handler::{Call, MissingKey};
pub use crate::key::DerivedKey;
use crate::{Error, Idempotency, Operation};

/// The return types `#[idempotent]` accepts: `Result<T, E>` (or an alias of it) with a storable `T` and an
/// `E` that can carry this crate's errors.
#[diagnostic::on_unimplemented(
    message = "`#[idempotent]` functions must return `Result<T, E>` where `T: Serialize + DeserializeOwned` and `E: From<idempotent_runtime::Error>`; `{Self}` is not such a type",
    label = "this return type cannot be stored and replayed",
    note = "the `Ok` value is stored as JSON and replayed to duplicates, so it must implement `serde::Serialize` and `serde::de::DeserializeOwned`; the error type receives `idempotent_runtime::Error` through `From`"
)]
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

impl<T, E> Output for Result<T, E>
where
    T: Serialize + DeserializeOwned,
    E: From<Error>,
{
    type Ok = T;
    type Err = E;
    #[inline]
    fn into_result(self) -> Result<T, E> {
        self
    }
    #[inline]
    fn from_result(result: Result<T, E>) -> Self {
        result
    }
}

/// Checks the return type where it is written, so the error lands on `-> ...`.
#[inline]
pub const fn assert_output<R: Output>() {}

/// What `store = ..` accepts: an `Idempotency`, or a reference, `Box`, `Rc` or `Arc` of one. A trait of
/// its own (rather than `Borrow<Idempotency>`) so that a wrong expression, most often a store passed
/// where its handle belongs, gets a message that says what to pass.
#[diagnostic::on_unimplemented(
    message = "`store = ..` must be an `Idempotency` handle (or a reference, `Box`, `Rc` or `Arc` of one); `{Self}` is not",
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

impl<T: Handle + ?Sized> Handle for &T {
    #[inline]
    fn idempotency(&self) -> &Idempotency {
        (**self).idempotency()
    }
}

impl<T: Handle + ?Sized> Handle for &mut T {
    #[inline]
    fn idempotency(&self) -> &Idempotency {
        (**self).idempotency()
    }
}

impl<T: Handle + ?Sized> Handle for Box<T> {
    #[inline]
    fn idempotency(&self) -> &Idempotency {
        (**self).idempotency()
    }
}

impl<T: Handle + ?Sized> Handle for Rc<T> {
    #[inline]
    fn idempotency(&self) -> &Idempotency {
        (**self).idempotency()
    }
}

impl<T: Handle + ?Sized> Handle for Arc<T> {
    #[inline]
    fn idempotency(&self) -> &Idempotency {
        (**self).idempotency()
    }
}

/// The handle given with `store = ..`.
#[inline]
pub fn handle<S: Handle + ?Sized>(store: &S) -> Result<Idempotency, Error> {
    Ok(store.idempotency().clone())
}

/// The installed default handle.
pub fn installed(call: &Call) -> Result<Idempotency, Error> {
    Idempotency::installed().ok_or_else(|| Error::NotInstalled {
        namespace: call.namespace.to_owned(),
    })
}

/// The record key for the attribute's `key` expression; whether it may be used is decided with the
/// call's [`MissingKey`] policy when the call runs.
pub fn key<K: Serialize + ?Sized>(call: &Call, key: &K) -> Result<DerivedKey, Error> {
    DerivedKey::for_call(call, key)
}

/// The fingerprint of the attribute's `payload` expression.
pub fn fingerprint<P: Serialize + ?Sized>(call: &Call, payload: &P) -> Result<String, Error> {
    crate::key::fingerprint_for(call, payload)
}

/// Runs the state machine around `body`, through [`Operation`](crate::Operation)'s one path. Errors
/// found before the body (no store, a key that does not serialize, a missing key the call rejects) come
/// back through `E: From<Error>`, and the body does not run. A missing key with [`MissingKey::Skip`]
/// runs the body alone, without the store.
pub async fn execute<R, F, D>(
    handle: Result<Idempotency, Error>,
    call: &Call,
    key: Result<DerivedKey, Error>,
    fingerprint: Option<Result<String, Error>>,
    describe: D,
    body: F,
) -> R
where
    R: Output,
    F: Future<Output = R>,
    D: FnOnce(&R::Err) -> String,
{
    let operation = Operation::from_parts(handle.map(Cow::Owned), *call, key, fingerprint);
    let body = async move { body.await.into_result() };
    R::from_result(operation.drive(None, describe, body).await)
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

/// A new staging handle for `transact = ..`.
#[cfg(feature = "dynamodb")]
#[must_use]
pub fn transaction() -> crate::Transaction {
    crate::Transaction::new()
}

/// [`execute`] for `transact = ..`: the writes staged on `transaction` commit with the COMPLETED record.
/// A missing key is rejected under [`MissingKey::Skip`] too: without a record, they could not commit
/// (the attribute refuses that combination at compile time).
#[cfg(feature = "dynamodb")]
pub async fn execute_transact<R, F, D>(
    handle: Result<Idempotency, Error>,
    call: &Call,
    key: Result<DerivedKey, Error>,
    fingerprint: Option<Result<String, Error>>,
    transaction: crate::Transaction,
    describe: D,
    body: F,
) -> R
where
    R: Output,
    F: Future<Output = R>,
    D: FnOnce(&R::Err) -> String,
{
    let operation = Operation::from_parts(handle.map(Cow::Owned), *call, key, fingerprint);
    let body = async move { body.await.into_result() };
    R::from_result(
        operation
            .drive(Some(transaction.staged()), describe, body)
            .await,
    )
}

/// Text stored for a FAILED record: the error's `Display` when it has one ([`DescribeDisplay`]), its type
/// name otherwise ([`DescribeOther`]); picked by method resolution on `(&Describe(e)).describe()`.
pub struct Describe<'a, E>(pub &'a E);

/// Chosen first, when `E: Display`.
pub trait DescribeDisplay {
    /// The error's text.
    fn describe(&self) -> String;
}

impl<E: Display> DescribeDisplay for Describe<'_, E> {
    fn describe(&self) -> String {
        self.0.to_string()
    }
}

/// The fallback, for error types without `Display`.
pub trait DescribeOther {
    /// The error's type name.
    fn describe(&self) -> String;
}

impl<E> DescribeOther for &Describe<'_, E> {
    fn describe(&self) -> String {
        format!("an error of type `{}`", std::any::type_name::<E>())
    }
}
