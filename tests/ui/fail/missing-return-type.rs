use idempotent_runtime::idempotent;

#[idempotent(key = order_id)]
async fn charge(order_id: u64) {
    println!("charging {order_id}");
}

fn main() {}
