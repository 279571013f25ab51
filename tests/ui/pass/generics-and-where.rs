//! Generic functions with bounds inline and in a `where` clause; the return type names a type parameter.
//! An error type that is a type parameter (the function's or its impl's) need not be `Send`: the future
//! is `Send` when the instantiation's is.
#![deny(warnings)]

use std::fmt::Debug;
use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};

use idempotent_runtime::{Error, Idempotency, idempotent};
use serde::Serialize;
use serde::de::DeserializeOwned;

static RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = (kind, &id), name = "generics::store")]
async fn store<K: Serialize + Copy, T, E>(kind: K, id: String, value: T) -> Result<T, E>
where
    T: Serialize + DeserializeOwned + Clone + Debug,
    E: From<Error>,
{
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(value)
}

struct Service<E> {
    error: PhantomData<E>,
}

impl<E: From<Error>> Service<E> {
    #[idempotent(key = id, name = "generics::service")]
    async fn run(&self, id: u64) -> Result<u64, E> {
        RUNS.fetch_add(1, Ordering::SeqCst);
        Ok(id)
    }
}

/// An error that is not `Send`.
struct LocalError(#[allow(dead_code)] Rc<Error>);

impl From<Error> for LocalError {
    fn from(e: Error) -> Self {
        LocalError(Rc::new(e))
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    Idempotency::in_memory().install();
    let first: Result<Vec<u8>, Error> = store('k', "a".to_owned(), vec![1, 2]).await;
    let again: Result<Vec<u8>, Error> = store('k', "a".to_owned(), vec![9]).await;
    assert_eq!(first.unwrap(), vec![1, 2]);
    assert_eq!(again.unwrap(), vec![1, 2]);
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);
    let service = Service::<LocalError> { error: PhantomData };
    assert!(matches!(service.run(5).await, Ok(5)));
    assert!(matches!(service.run(5).await, Ok(5)));
    assert_eq!(RUNS.load(Ordering::SeqCst), 2);
}
