use std::rc::Rc;

use idempotent_runtime::{Error, Idempotency, idempotent};

#[idempotent(key = order_id, store = idem, detach)]
async fn charge(idem: Idempotency, order_id: u64) -> Result<u64, Error> {
    let local = Rc::new(order_id);
    tokio::task::yield_now().await;
    Ok(*local)
}

fn main() {}
