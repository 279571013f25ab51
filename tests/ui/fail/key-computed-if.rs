use idempotent_runtime::{Error, idempotent};

// Both branches and the condition are literals: at most one record for all calls.
#[idempotent(key = if true { 1 } else { 2 })]
async fn charge(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

fn main() {}
