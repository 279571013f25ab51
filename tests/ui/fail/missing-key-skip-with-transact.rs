use idempotent_runtime::{Error, idempotent};

#[idempotent(key = order_id, transact = tx, missing_key = "skip")]
async fn reserve(order_id: Option<u64>) -> Result<u64, Error> {
    Ok(order_id.unwrap_or(0))
}

fn main() {}
