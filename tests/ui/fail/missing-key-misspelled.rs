use idempotent_runtime::{Error, idempotent};

#[idempotent(key = order_id, missing_key = "alow")]
async fn charge(order_id: Option<u64>) -> Result<u64, Error> {
    Ok(order_id.unwrap_or(0))
}

fn main() {}
