//! Generic functions with bounds inline and in a `where` clause; the return type names a type parameter.
#![deny(warnings)]

use std::fmt::Debug;
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

#[tokio::main(flavor = "current_thread")]
async fn main() {
    Idempotency::in_memory().install();
    let first: Result<Vec<u8>, Error> = store('k', "a".to_owned(), vec![1, 2]).await;
    let again: Result<Vec<u8>, Error> = store('k', "a".to_owned(), vec![9]).await;
    assert_eq!(first.unwrap(), vec![1, 2]);
    assert_eq!(again.unwrap(), vec![1, 2]);
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);
}
