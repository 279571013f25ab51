use idempotent_runtime::{Error, idempotent};

const TTL: &str = "24h";

#[idempotent(key = order_id, ttl = TTL)]
async fn charge(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

fn main() {}
