use idempotent_runtime::idempotent;

#[idempotent(key = order_id)]
async fn charge(order_id: u64) -> u64 {
    order_id
}

fn main() {}
