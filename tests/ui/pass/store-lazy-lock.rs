//! `store = ..` takes anything that dereferences to an `Idempotency`, such as a `LazyLock` static.
#![deny(warnings)]

use std::sync::LazyLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use idempotent_runtime::{Error, Idempotency, idempotent};

static RUNS: AtomicUsize = AtomicUsize::new(0);
static IDEM: LazyLock<Idempotency> = LazyLock::new(Idempotency::in_memory);

#[idempotent(key = order_id, store = IDEM)]
async fn charge(order_id: u64) -> Result<u64, Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(order_id)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    assert_eq!(charge(1).await.unwrap(), 1);
    assert_eq!(charge(1).await.unwrap(), 1);
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);
}
