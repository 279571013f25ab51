use idempotent_runtime::idempotent;

#[idempotent(key = order_id)]
async fn charge(order_id: u64) -> Result<u64, Box<dyn std::error::Error>> {
    Ok(order_id)
}

fn main() {}
