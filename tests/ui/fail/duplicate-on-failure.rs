use idempotent_runtime::{Error, idempotent};

#[idempotent(key = order_id, steps = s, on_failure = "resume", on_failure = "restart")]
async fn checkout(order_id: u64) -> Result<u64, Error> {
    s.run("reserve", || async { Ok::<_, Error>(order_id) }).await
}

fn main() {}
