use idempotent_runtime::{Error, idempotent};

#[idempotent(key = order_id, lease = "60s", lease = "5m")]
async fn charge(order_id: u64, cents: u64) -> Result<u64, Error> {
    Ok(order_id + cents)
}

fn main() {}
