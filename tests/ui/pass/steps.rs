//! `steps = s`: the body gets its `Steps` as `s`, alone, with `on_failure`, on a method, and with `detach`
//! (a body that owns what it uses). A failed call's retry resumes at the step that failed, unless
//! `on_failure = "restart"`.
#![deny(warnings)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use idempotent_runtime::{Error, Idempotency, Steps, idempotent};

#[derive(Debug)]
enum ShopError {
    Declined,
    Idempotency(Error),
}

impl From<Error> for ShopError {
    fn from(e: Error) -> Self {
        ShopError::Idempotency(e)
    }
}

#[derive(Default)]
struct Counts {
    reserve: AtomicUsize,
    email: AtomicUsize,
}

#[idempotent(key = order_id, store = idem, steps = s)]
async fn checkout(
    idem: &Idempotency,
    counts: &Counts,
    order_id: u64,
    decline: bool,
) -> Result<String, ShopError> {
    let steps: &Steps = &s; // the binding's type, named
    let hold = steps
        .run("reserve", || async {
            counts.reserve.fetch_add(1, Ordering::SeqCst);
            Ok::<_, ShopError>(order_id * 10)
        })
        .await?;
    let gateway_key = s.key("charge");
    s.run("email", || async {
        counts.email.fetch_add(1, Ordering::SeqCst);
        if decline {
            Err(ShopError::Declined)
        } else {
            Ok(())
        }
    })
    .await?;
    Ok(format!("{hold}:{}", gateway_key.len()))
}

#[idempotent(key = order_id, store = idem, steps = steps, on_failure = "restart")]
async fn restarting(
    idem: &Idempotency,
    counts: &Counts,
    order_id: u64,
    decline: bool,
) -> Result<u64, ShopError> {
    steps
        .run("reserve", || async {
            counts.reserve.fetch_add(1, Ordering::SeqCst);
            Ok::<_, ShopError>(order_id)
        })
        .await?;
    if decline {
        return Err(ShopError::Declined);
    }
    Ok(order_id)
}

struct Shop {
    idem: Idempotency,
}

impl Shop {
    #[idempotent(key = order_id, store = self.idem, steps = s, on_failure = "resume")]
    async fn ship(&self, order_id: u64) -> Result<u64, Error> {
        s.run("label", || async { Ok::<_, Error>(order_id + 1) }).await
    }
}

#[idempotent(key = order_id, store = idem, steps = s, detach)]
async fn detached(idem: Idempotency, order_id: u64, runs: Arc<AtomicUsize>) -> Result<u64, Error> {
    s.run("slow", || async move {
        runs.fetch_add(1, Ordering::SeqCst);
        tokio::task::yield_now().await;
        Ok::<_, Error>(order_id * 2)
    })
    .await
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let idem = Idempotency::in_memory();
    let counts = Counts::default();
    assert!(matches!(
        checkout(&idem, &counts, 1, true).await,
        Err(ShopError::Declined)
    ));
    assert_eq!(checkout(&idem, &counts, 1, false).await.unwrap(), "10:64");
    assert_eq!(counts.reserve.load(Ordering::SeqCst), 1, "resumed after the reserve");
    assert_eq!(counts.email.load(Ordering::SeqCst), 2);

    let counts = Counts::default();
    assert!(restarting(&idem, &counts, 2, true).await.is_err());
    assert_eq!(restarting(&idem, &counts, 2, false).await.unwrap(), 2);
    assert_eq!(counts.reserve.load(Ordering::SeqCst), 2, "restarted from the reserve");

    let shop = Shop { idem: idem.clone() };
    assert_eq!(shop.ship(3).await.unwrap(), 4);

    let runs = Arc::new(AtomicUsize::new(0));
    for _ in 0..2 {
        assert_eq!(detached(idem.clone(), 4, runs.clone()).await.unwrap(), 8);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
