//! `detach`: a body that owns what it uses (parameters by value, `Arc`s, a `self` by value) runs on a
//! task of its own; `&'static` parameters are fine too, and so are callbacks whose own arguments are
//! references (`fn(&str) -> String`, `Box<dyn Fn(&str) -> usize + Send + Sync>`), and a borrowed `self`
//! that only the attribute's arguments use.
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

#[idempotent(key = text, store = idem, name = "text::shout", detach)]
async fn shout(idem: Idempotency, text: String, upper: fn(&str) -> String) -> Result<String, Error> {
    Ok(upper(&text))
}

#[idempotent(key = text, store = idem, name = "text::measure", detach)]
async fn measure(
    idem: Idempotency,
    text: String,
    len: Box<dyn Fn(&str) -> usize + Send + Sync>,
) -> Result<usize, Error> {
    Ok(len(&text))
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

    /// `self` is borrowed, but only `store` reads it, before the body leaves.
    #[idempotent(key = order_id, store = self.idem, name = "payments::void", detach)]
    async fn void(&self, order_id: u64) -> Result<u64, Error> {
        Ok(order_id + 1)
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
    assert_eq!(
        shout(idem.clone(), "hi".into(), str::to_uppercase).await.unwrap(),
        "HI"
    );
    assert_eq!(
        measure(idem.clone(), "four".into(), Box::new(str::len)).await.unwrap(),
        4
    );
    let payments = Payments { idem };
    assert_eq!(payments.clone().refund(3).await.unwrap(), 3);
    assert_eq!(payments.void(3).await.unwrap(), 4);
}
