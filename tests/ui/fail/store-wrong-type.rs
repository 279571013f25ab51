use idempotent_runtime::{Error, MemoryStore, idempotent};

#[idempotent(key = order_id, store = store)]
async fn charge(store: &MemoryStore, order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

fn main() {}
