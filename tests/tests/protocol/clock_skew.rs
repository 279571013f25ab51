//! Takeover and expiry decisions use the caller's clock, so each includes a clock-skew margin
//! (1 s by default). A caller whose clock runs ahead by less than the margin must not take over a live
//! claim; once the lease has passed by more than the margin, it may.

use std::sync::Arc;
use std::time::Duration;

use idempotent_runtime::{Clock, Error, Idempotency, ManualClock};
use idempotent_tests::{Backend, Harness};

use super::{AppError, Gate};
use idempotent_tests::on_both_stores;

const NAMESPACE: &str = "correctness::skew";

async fn call(idem: &Idempotency, gate: &Gate) -> Result<u64, AppError> {
    idem.operation(NAMESPACE, "order-1")
        .lease(Duration::from_secs(2))
        .run(|_| async {
            gate.enter().await?;
            Ok::<_, AppError>(1)
        })
        .await
}

async fn a_clock_ahead_by_less_than_the_margin_does_not_take_over(backend: Backend) {
    let h = Harness::with(backend, |b| b.heartbeat(false)).await;
    // A second worker whose clock runs 800 ms ahead of the first one's.
    let ahead = ManualClock::new(h.clock.now_ms() + 800);
    let skewed = Idempotency::builder_arc(h.store.clone())
        .clock(ahead.clone())
        .heartbeat(false)
        .build();

    let first = Arc::new(Gate::default());
    let holder = tokio::spawn({
        let (idem, gate) = (h.idem.clone(), first.clone());
        async move { call(&idem, &gate).await }
    });
    first.started().await;

    // 1.5 s into the 2 s lease the claim is live, but the skewed clock reads 2.3 s.
    h.clock.advance(Duration::from_millis(1500));
    ahead.advance(Duration::from_millis(1500));
    let second = Gate::default();
    second.release();
    let err = call(&skewed, &second).await.unwrap_err().idempotency();
    assert!(matches!(err, Error::InProgress { .. }), "{err:?}");
    assert_eq!(second.runs(), 0, "a live claim must not be taken over");

    // Once the lease has passed by more than the margin on the skewed clock, it may take over.
    h.clock.advance(Duration::from_secs(1));
    ahead.advance(Duration::from_secs(1));
    assert_eq!(call(&skewed, &second).await.unwrap(), 1);
    assert_eq!(second.runs(), 1);

    first.release();
    let err = holder.await.unwrap().unwrap_err().idempotency();
    assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");
}

on_both_stores!(a_clock_ahead_by_less_than_the_margin_does_not_take_over);
