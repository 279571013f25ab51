//! A key that is the same for every call, said deliberately with a named constant (a run-once operation),
//! and a literal beside a parameter in a tuple key.
#![deny(warnings)]

use std::sync::atomic::{AtomicUsize, Ordering};

use idempotent_runtime::{Error, Idempotency, idempotent};

static SEEDS: AtomicUsize = AtomicUsize::new(0);
static CHARGES: AtomicUsize = AtomicUsize::new(0);

const SEED: &str = "seed-v1";

#[idempotent(key = SEED)]
async fn seed(rows: u64) -> Result<u64, Error> {
    SEEDS.fetch_add(1, Ordering::SeqCst);
    Ok(rows)
}

#[idempotent(key = ("charge", order_id))]
async fn charge(order_id: u64) -> Result<u64, Error> {
    CHARGES.fetch_add(1, Ordering::SeqCst);
    Ok(order_id)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    Idempotency::in_memory().install();
    assert_eq!(seed(10).await.unwrap(), 10);
    assert_eq!(seed(20).await.unwrap(), 10);
    assert_eq!(SEEDS.load(Ordering::SeqCst), 1);
    assert_eq!(charge(1).await.unwrap(), 1);
    assert_eq!(charge(2).await.unwrap(), 2);
    assert_eq!(CHARGES.load(Ordering::SeqCst), 2);
}
