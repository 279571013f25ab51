use idempotent_runtime::idempotent;

#[idempotent(key = id)]
struct Order {
    id: u64,
}

fn main() {}
