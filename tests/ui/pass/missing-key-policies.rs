//! `missing_key`: each value, and what it does with a `None` key.
#![deny(warnings)]

use std::sync::atomic::{AtomicUsize, Ordering};

use idempotent_runtime::{Error, Idempotency, idempotent};

#[idempotent(key = order_id, store = idem, missing_key = "reject")]
async fn reject(
    idem: &Idempotency,
    runs: &AtomicUsize,
    order_id: Option<u64>,
) -> Result<usize, Error> {
    Ok(runs.fetch_add(1, Ordering::SeqCst) + 1)
}

#[idempotent(key = order_id, store = idem, missing_key = "allow")]
async fn allow(
    idem: &Idempotency,
    runs: &AtomicUsize,
    order_id: Option<u64>,
) -> Result<usize, Error> {
    Ok(runs.fetch_add(1, Ordering::SeqCst) + 1)
}

#[idempotent(key = (tenant, order_id), store = idem, missing_key = "skip")]
async fn skip(
    idem: &Idempotency,
    runs: &AtomicUsize,
    tenant: &str,
    order_id: Option<u64>,
) -> Result<usize, Error> {
    Ok(runs.fetch_add(1, Ordering::SeqCst) + 1)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let idem = Idempotency::in_memory();

    let runs = AtomicUsize::new(0);
    let err = reject(&idem, &runs, None).await.unwrap_err();
    assert!(matches!(err, Error::MissingKey { .. }), "{err:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    let runs = AtomicUsize::new(0);
    assert_eq!(allow(&idem, &runs, None).await.unwrap(), 1);
    assert_eq!(allow(&idem, &runs, None).await.unwrap(), 1);

    let runs = AtomicUsize::new(0);
    assert_eq!(skip(&idem, &runs, "acme", None).await.unwrap(), 1);
    assert_eq!(skip(&idem, &runs, "acme", None).await.unwrap(), 2);
}
