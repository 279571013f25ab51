//! Every argument but `transact` and `crate` at once; the payload fingerprint is enforced.
#![deny(warnings)]

use std::sync::atomic::{AtomicUsize, Ordering};

use idempotent_runtime::{Error, Idempotency, idempotent};
use serde::{Deserialize, Serialize};

static RUNS: AtomicUsize = AtomicUsize::new(0);

#[derive(Serialize)]
struct Charge {
    order_id: String,
    cents: u64,
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Receipt {
    order_id: String,
    cents: u64,
}

#[idempotent(
    key = req.order_id,
    ttl = "7d",
    lease = "1h30m",
    payload = &req,
    wait = "250ms",
    name = "charge-v1",
    store = idem,
    missing_key = "reject",
)]
async fn charge(idem: &Idempotency, req: Charge) -> Result<Receipt, Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(Receipt {
        order_id: req.order_id,
        cents: req.cents,
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let idem = Idempotency::in_memory();
    let req = || Charge {
        order_id: "order-1".to_owned(),
        cents: 500,
    };
    let first = charge(&idem, req()).await.unwrap();
    let again = charge(&idem, req()).await.unwrap();
    assert_eq!(first, again);
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);

    let other_payload = Charge {
        order_id: "order-1".to_owned(),
        cents: 900,
    };
    let mismatch = charge(&idem, other_payload).await.unwrap_err();
    assert!(
        matches!(mismatch, Error::PayloadMismatch { .. }),
        "{mismatch:?}"
    );
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);
}
