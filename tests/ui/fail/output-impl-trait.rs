use idempotent_runtime::{Error, idempotent};
use serde::Serialize;
use serde::de::DeserializeOwned;

#[idempotent(key = order_id)]
async fn charge(order_id: u64) -> Result<impl Serialize + DeserializeOwned, Error> {
    Ok(order_id)
}

fn main() {}
