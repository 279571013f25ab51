//! A key that is the same for every call, said deliberately with a named constant (a run-once operation),
//! and keys that may differ between calls although they hold literals: a literal beside a parameter in a
//! tuple key, even one that spells the parameter's name (a tag).
#![deny(warnings)]

use std::sync::atomic::{AtomicUsize, Ordering};

use idempotent_runtime::{Error, Idempotency, idempotent};

static SEEDS: AtomicUsize = AtomicUsize::new(0);
static CHARGES: AtomicUsize = AtomicUsize::new(0);
static VISITS: AtomicUsize = AtomicUsize::new(0);

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

#[idempotent(key = ("user", user))]
async fn visit(user: String) -> Result<usize, Error> {
    Ok(VISITS.fetch_add(1, Ordering::SeqCst) + 1)
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
    // Two users, two records; the same user again, a replay.
    assert_eq!(visit("ann".into()).await.unwrap(), 1);
    assert_eq!(visit("bob".into()).await.unwrap(), 2);
    assert_eq!(visit("ann".into()).await.unwrap(), 1);
    assert_eq!(VISITS.load(Ordering::SeqCst), 2);
}
