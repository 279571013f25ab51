use idempotent_runtime::{Error, Idempotency, idempotent};

#[idempotent(key = order_id, store = idem, store = idem)]
async fn charge(idem: &Idempotency, order_id: u64, cents: u64) -> Result<u64, Error> {
    Ok(order_id + cents)
}

fn main() {}
