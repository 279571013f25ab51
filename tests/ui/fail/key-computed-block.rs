use idempotent_runtime::{Error, idempotent};

// A block whose value is a literal: every call would share one record.
#[idempotent(key = { "x" })]
async fn charge(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

fn main() {}
