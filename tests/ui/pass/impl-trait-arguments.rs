//! `impl Trait` parameters, used in the key and consumed by the body.
#![deny(warnings)]

use std::fmt::Display;
use std::sync::atomic::{AtomicUsize, Ordering};

use idempotent_runtime::{Error, Idempotency, idempotent};

static RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = (tenant.to_string(), order_id.as_ref()))]
async fn total(
    tenant: impl Display,
    order_id: impl AsRef<str>,
    items: impl IntoIterator<Item = u64>,
) -> Result<u64, Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(items.into_iter().sum())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    Idempotency::in_memory().install();
    assert_eq!(total(7, "order-1", vec![1, 2, 3]).await.unwrap(), 6);
    assert_eq!(total(7, String::from("order-1"), [100]).await.unwrap(), 6);
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);
}
