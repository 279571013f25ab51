use idempotent_runtime::{Error, idempotent};
use serde::Serialize;

#[derive(Serialize)]
struct Receipt {
    id: u64,
}

#[idempotent(key = order_id)]
async fn charge(order_id: u64) -> Result<Receipt, Error> {
    Ok(Receipt { id: order_id })
}

fn main() {}
