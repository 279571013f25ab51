use idempotent_runtime::{Error, idempotent};

#[idempotent(ttl = "24h")]
async fn charge(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

fn main() {}
