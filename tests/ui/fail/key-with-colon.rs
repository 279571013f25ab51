use idempotent_runtime::{Error, idempotent};

#[idempotent(key: order_id)]
async fn charge(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

fn main() {}
