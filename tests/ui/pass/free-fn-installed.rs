//! A free function using the installed handle: the second call with the same key replays the stored value.
#![deny(warnings)]

use std::sync::atomic::{AtomicUsize, Ordering};

use idempotent_runtime::{Error, Idempotency, idempotent};

static RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = order_id)]
async fn charge(order_id: u64, cents: u64) -> Result<u64, Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(order_id * 1000 + cents)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    Idempotency::in_memory().install();
    assert_eq!(charge(7, 500).await.unwrap(), 7500);
    assert_eq!(charge(7, 500).await.unwrap(), 7500);
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);
}
