use idempotent_runtime::{Error, idempotent};

// Computed from a literal alone: every call would share one record.
#[idempotent(key = Some("order_id"))]
async fn charge(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

fn main() {}
