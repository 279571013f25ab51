use idempotent_runtime::{Error, Idempotency, idempotent};

#[idempotent(key = order_id, store = idem, detach, detach)]
async fn charge(idem: Idempotency, order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

fn main() {}
