//! `detach`: a body that owns what it uses (parameters by value, `Arc`s, a `self` by value) runs on a
//! task of its own; `&'static` parameters are fine too.
#![deny(warnings)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use idempotent_runtime::{Error, Idempotency, idempotent};

#[idempotent(key = order_id, store = idem, detach)]
async fn charge(idem: Idempotency, order_id: u64, runs: Arc<AtomicUsize>) -> Result<u64, Error> {
    runs.fetch_add(1, Ordering::SeqCst);
    tokio::task::yield_now().await;
    Ok(order_id * 100)
}

#[idempotent(key = currency, store = idem, name = "fx::rate", detach)]
async fn rate(idem: Idempotency, currency: &'static str) -> Result<String, Error> {
    Ok(format!("{currency}: 1.0"))
}

#[derive(Clone)]
struct Payments {
    idem: Idempotency,
}

impl Payments {
    #[idempotent(key = order_id, store = self.idem, name = "payments::refund", detach)]
    async fn refund(self, order_id: u64) -> Result<u64, Error> {
        Ok(order_id)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let idem = Idempotency::in_memory();
    let runs = Arc::new(AtomicUsize::new(0));
    assert_eq!(charge(idem.clone(), 7, runs.clone()).await.unwrap(), 700);
    assert_eq!(charge(idem.clone(), 7, runs.clone()).await.unwrap(), 700);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(rate(idem.clone(), "EUR").await.unwrap(), "EUR: 1.0");
    let payments = Payments { idem };
    assert_eq!(payments.clone().refund(3).await.unwrap(), 3);
}
