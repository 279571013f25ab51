use idempotent_runtime::{Error, idempotent};

#[idempotent(key = order_id, steps = s, transact = tx)]
async fn checkout(order_id: u64) -> Result<u64, Error> {
    let hold = s.run("reserve", || async { Ok::<_, Error>(order_id) }).await?;
    drop(tx);
    Ok(hold)
}

fn main() {}
