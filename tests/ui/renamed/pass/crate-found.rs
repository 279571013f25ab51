//! The runtime is a dependency named `idem`, and no `crate = ".."` is given: the attribute finds the
//! name in Cargo.toml.
#![deny(warnings)]

use std::sync::atomic::{AtomicUsize, Ordering};

use idem::{Error, Idempotency, idempotent};

static RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = order_id)]
async fn charge(order_id: u64) -> Result<u64, Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(order_id)
}

#[idempotent(key = order_id, store = idem, payload = order_id, ttl = "1h")]
async fn refund(idem: &Idempotency, order_id: u64) -> Result<u64, Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(order_id)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let handle = Idempotency::in_memory();
    handle.install();
    for _ in 0..2 {
        assert_eq!(charge(1).await.unwrap(), 1);
        assert_eq!(refund(&handle, 1).await.unwrap(), 1);
    }
    assert_eq!(RUNS.load(Ordering::SeqCst), 2);
}
