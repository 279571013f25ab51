use idempotent_runtime::{Error, idempotent};
use serde::de::DeserializeOwned;

// A type parameter: rustc suggests the missing bound itself.
#[idempotent(key = id)]
async fn load<T: DeserializeOwned + Default>(id: u64) -> Result<T, Error> {
    let _ = id;
    Ok(T::default())
}

fn main() {}
