use idempotent_runtime::{Error, idempotent};

#[idempotent(key = order_id, wait = "5s", wait = "10s")]
async fn charge(order_id: u64, cents: u64) -> Result<u64, Error> {
    Ok(order_id + cents)
}

fn main() {}
