use idempotent_runtime::{Error, idempotent};

// `stringify!` makes a string of its tokens: the same for every call.
#[idempotent(key = stringify!(order_id))]
async fn charge(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

fn main() {}
