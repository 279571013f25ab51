//! Doc comments, outer and inner attributes on the function are kept where they belong.
#![deny(warnings)]

use std::sync::atomic::{AtomicUsize, Ordering};

use idempotent_runtime::{Error, Idempotency, idempotent};

static RUNS: AtomicUsize = AtomicUsize::new(0);

/// Charges an order once.
///
/// `note` is only logged by callers; the inner attribute below must reach the function, or the
/// `#![deny(warnings)]` above rejects the unused parameter.
#[idempotent(key = order_id)]
#[must_use = "the receipt says whether the charge went through"]
#[inline]
async fn charge(order_id: u64, note: &str) -> Result<u64, Error> {
    //! Inner doc comments stay on the function as well.
    #![allow(unused_variables)]
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(order_id)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    Idempotency::in_memory().install();
    assert_eq!(charge(1, "first").await.unwrap(), 1);
    assert_eq!(charge(1, "retry").await.unwrap(), 1);
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);
}
