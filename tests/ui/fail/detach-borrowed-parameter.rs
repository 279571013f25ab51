use idempotent_runtime::{Error, Idempotency, idempotent};

struct Order {
    id: u64,
}

#[idempotent(key = order.id, store = idem, detach)]
async fn charge(idem: Idempotency, order: &Order) -> Result<u64, Error> {
    Ok(order.id)
}

fn main() {}
