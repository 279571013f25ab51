use idempotent_runtime::{Error, idempotent};

// The key without `key =`: one error that says so, not also a missing `key`.
#[idempotent(order_id)]
async fn charge(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

fn main() {}
