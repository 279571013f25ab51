use idempotent_runtime::{Error, idempotent};

// One mistake, one error: the misspelled `key` is not also reported missing.
#[idempotent(kye = order_id, ttl = "24h")]
async fn charge(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

fn main() {}
