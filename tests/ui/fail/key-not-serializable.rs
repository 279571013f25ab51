use idempotent_runtime::{Error, idempotent};

struct OrderId(u64);

#[idempotent(key = order_id)]
async fn charge(order_id: OrderId) -> Result<u64, Error> {
    Ok(order_id.0)
}

fn main() {}
