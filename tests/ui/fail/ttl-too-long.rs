use idempotent_runtime::{Error, idempotent};

// The runtime supports durations up to 100 years (`MAX_DURATION`, "36500d").
#[idempotent(key = order_id, ttl = "36501d")]
async fn charge(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

fn main() {}
