//! Claim-time writes (`claim_with`) are in effect at most once per key. A re-claim after the
//! body failed, or after a lease takeover, must not apply them again; compensating writes that commit
//! with FAILED release them, and only then does the next claim apply them again.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotent_runtime::{Clock as _, Status};
use idempotent_tests::{Backend, Harness};

use super::shop::Shop;
use super::{AppError, Gate};
use idempotent_tests::on_both_stores;

const NAMESPACE: &str = "correctness::reserve";

/// Reserves 3 units at claim time; the body fails when told to.
async fn reserve(
    h: &Harness,
    shop: &Shop,
    runs: &AtomicUsize,
    fail: bool,
) -> Result<u64, AppError> {
    h.idem
        .operation(NAMESPACE, "order-1")
        .claim_with([shop.take(3)])
        .run(|_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            if fail { Err(AppError::Declined) } else { Ok(3) }
        })
        .await
}

async fn a_retry_after_a_failure_does_not_reserve_again(backend: Backend) {
    let h = Harness::new(backend).await;
    let shop = Shop::new(&h, 10).await;
    let runs = AtomicUsize::new(0);

    assert!(matches!(
        reserve(&h, &shop, &runs, true).await,
        Err(AppError::Declined)
    ));
    assert_eq!(shop.available().await, 7, "reserved at claim time");
    let record = h.record(NAMESPACE, "order-1").await.unwrap();
    assert_eq!(record.status, Status::Failed);

    assert_eq!(reserve(&h, &shop, &runs, false).await.unwrap(), 3);
    assert_eq!(
        shop.available().await,
        7,
        "the re-claim of the FAILED record must not take the stock a second time"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let record = h.record(NAMESPACE, "order-1").await.unwrap();
    assert_eq!((record.status, record.attempt), (Status::Completed, 2));

    // A duplicate replays and takes nothing.
    assert_eq!(reserve(&h, &shop, &runs, false).await.unwrap(), 3);
    assert_eq!(shop.available().await, 7);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

async fn a_takeover_does_not_reserve_again(backend: Backend) {
    let h = Harness::with(backend, |b| b.heartbeat(false)).await;
    let shop = Arc::new(Shop::new(&h, 10).await);
    let gate = Arc::new(Gate::default());
    // The first caller claims, reserves, and dies while running the body.
    let crashed = tokio::spawn({
        let (idem, shop, gate) = (h.idem.clone(), shop.clone(), gate.clone());
        async move {
            idem.operation(NAMESPACE, "order-1")
                .lease(Duration::from_secs(10))
                .claim_with([shop.take(3)])
                .run(|_| async {
                    gate.enter().await?;
                    Ok::<_, AppError>(3)
                })
                .await
        }
    });
    gate.started().await;
    crashed.abort();
    assert!(crashed.await.unwrap_err().is_cancelled());
    assert_eq!(shop.available().await, 7);

    // After its lease (and the skew margin) another caller takes the key over.
    h.clock.advance(Duration::from_secs(12));
    let runs = AtomicUsize::new(0);
    assert_eq!(reserve(&h, &shop, &runs, false).await.unwrap(), 3);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        shop.available().await,
        7,
        "the takeover must not take the stock a second time"
    );
    let record = h.record(NAMESPACE, "order-1").await.unwrap();
    assert_eq!((record.status, record.attempt), (Status::Completed, 2));
}

async fn expiry_starts_a_new_operation_that_reserves_again(backend: Backend) {
    let h = Harness::new(backend).await;
    let shop = Shop::new(&h, 10).await;
    let runs = AtomicUsize::new(0);
    assert_eq!(reserve(&h, &shop, &runs, false).await.unwrap(), 3);
    assert_eq!(shop.available().await, 7);
    // Past the 24 h ttl the record counts as absent: the key is new, and so is its reservation.
    h.clock.advance(Duration::from_hours(25));
    assert_eq!(reserve(&h, &shop, &runs, false).await.unwrap(), 3);
    assert_eq!(shop.available().await, 4);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

on_both_stores!(
    a_retry_after_a_failure_does_not_reserve_again,
    a_takeover_does_not_reserve_again,
    expiry_starts_a_new_operation_that_reserves_again,
);

async fn compensating_writes_release_the_claim_writes_with_the_failure(backend: Backend) {
    let h = Harness::new(backend).await;
    let shop = Shop::new(&h, 10).await;
    let runs = &AtomicUsize::new(0);
    let call = |fail: bool| {
        h.idem
            .operation(NAMESPACE, "order-1")
            .claim_with([shop.take(3)])
            .compensate_with([shop.give_back(3)])
            .run(move |_| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                if fail { Err(AppError::Declined) } else { Ok(3) }
            })
    };
    assert!(matches!(call(true).await, Err(AppError::Declined)));
    assert_eq!(
        shop.available().await,
        10,
        "the compensation committed with FAILED"
    );
    let record = h.record(NAMESPACE, "order-1").await.unwrap();
    assert_eq!(record.status, Status::Failed);
    assert!(!record.claim_writes_in_effect);

    // Released: the next claim reserves again, once.
    assert_eq!(call(false).await.unwrap(), 3);
    assert_eq!(shop.available().await, 7);
    let record = h.record(NAMESPACE, "order-1").await.unwrap();
    assert_eq!(record.status, Status::Completed);
    assert!(record.claim_writes_in_effect);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// Compensation whose own condition fails: the failure is recorded without it, and the claim-time
/// writes stay in effect, so the retry does not reserve again.
async fn a_refused_compensation_keeps_the_claim_writes_in_effect(backend: Backend) {
    let h = Harness::new(backend).await;
    let shop = Shop::new(&h, 10).await;
    let runs = &AtomicUsize::new(0);
    let call = |fail: bool| {
        h.idem
            .operation(NAMESPACE, "order-2")
            .claim_with([shop.take(3)])
            // Gives back more than could have been taken: its condition (available >= 20) fails.
            .compensate_with([shop.take(20)])
            .run(move |_| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                if fail { Err(AppError::Declined) } else { Ok(3) }
            })
    };
    assert!(matches!(call(true).await, Err(AppError::Declined)));
    let record = h.record(NAMESPACE, "order-2").await.unwrap();
    assert_eq!(record.status, Status::Failed, "the key is free at once");
    assert!(record.claim_writes_in_effect);
    assert_eq!(shop.available().await, 7);
    assert_eq!(call(false).await.unwrap(), 3);
    assert_eq!(shop.available().await, 7, "not reserved twice");
}

on_both_stores!(
    compensating_writes_release_the_claim_writes_with_the_failure,
    a_refused_compensation_keeps_the_claim_writes_in_effect,
);

/// Round trips, on DynamoDB Local: a claim with writes is one `TransactWriteItems`; the retry of a key
/// whose writes are still in effect costs one more request (the refused transaction, then a plain claim).
#[tokio::test]
async fn round_trips_of_a_claim_with_writes_and_of_its_retry() {
    let h = Harness::new(Backend::DynamoDb).await;
    let shop = Shop::new(&h, 10).await;
    let runs = AtomicUsize::new(0);
    h.requests.reset();
    assert!(matches!(
        reserve(&h, &shop, &runs, true).await,
        Err(AppError::Declined)
    ));
    assert_eq!(
        (
            h.requests.of("TransactWriteItems"),
            h.requests.of("UpdateItem"),
            h.requests.total()
        ),
        (1, 1, 2),
        "the claim with its writes, then the FAILED write"
    );
    h.requests.reset();
    assert_eq!(reserve(&h, &shop, &runs, false).await.unwrap(), 3);
    assert_eq!(
        (
            h.requests.of("TransactWriteItems"),
            h.requests.of("UpdateItem"),
            h.requests.total()
        ),
        (1, 2, 3),
        "the refused transaction, the plain claim, the completion"
    );
    h.requests.reset();
    assert_eq!(reserve(&h, &shop, &runs, false).await.unwrap(), 3);
    assert_eq!(
        (h.requests.of("TransactWriteItems"), h.requests.total()),
        (1, 1),
        "a duplicate: the refused transaction returns the COMPLETED record"
    );
    assert_eq!(shop.available().await, 7);
}

/// The mark that the claim-time writes are in effect must outlive the FAILED
/// record's short expiry. Lambda retries an asynchronous invocation at 1 and 2 minutes: 120 s after a
/// failure without compensation (the FAILED record's `failed_ttl` is the 60 s lease), the retry must
/// still find the writes in effect.
async fn a_retry_after_the_failed_ttl_does_not_reserve_again(backend: Backend) {
    let h = Harness::new(backend).await;
    let shop = Shop::new(&h, 10).await;
    let runs = AtomicUsize::new(0);
    assert!(matches!(
        reserve(&h, &shop, &runs, true).await,
        Err(AppError::Declined)
    ));
    assert_eq!(shop.available().await, 7);
    h.clock.advance(Duration::from_mins(2));
    assert_eq!(reserve(&h, &shop, &runs, false).await.unwrap(), 3);
    assert_eq!(
        shop.available().await,
        7,
        "the retry 120 s after the failure must not take the stock a second time"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let record = h.record(NAMESPACE, "order-1").await.unwrap();
    assert_eq!(
        (record.status, record.attempt, record.claim_writes_in_effect),
        (Status::Completed, 2, true)
    );
}

/// The rule's bounds: a FAILED record whose claim-time writes are in effect lives the operation's `ttl`
/// and `retain` (here 24 h + 1 h), and past them the key is a new operation, which reserves again.
async fn a_failed_record_keeps_its_writes_for_the_ttl_and_retain(backend: Backend) {
    let h = Harness::with(backend, |b| b.retain(Duration::from_hours(1))).await;
    let shop = Shop::new(&h, 10).await;
    let runs = AtomicUsize::new(0);
    assert!(reserve(&h, &shop, &runs, true).await.is_err());
    let record = h.record(NAMESPACE, "order-1").await.unwrap();
    assert_eq!(record.status, Status::Failed);
    assert!(record.claim_writes_in_effect);
    let now_s = h.clock.now_ms() / 1000;
    assert!(
        record.expires_at_s >= now_s + 25 * 3600,
        "expires {} s from now, before the ttl and retain",
        record.expires_at_s.saturating_sub(now_s)
    );
    // Within the ttl and retain: the same operation.
    h.clock.advance(Duration::from_mins(24 * 60 + 59));
    assert!(reserve(&h, &shop, &runs, true).await.is_err());
    assert_eq!(shop.available().await, 7, "not reserved again");
    // A record that kept its writes is renewed by each failure; past the last one's ttl and retain
    // the key is a new operation.
    h.clock.advance(Duration::from_hours(26));
    assert_eq!(reserve(&h, &shop, &runs, false).await.unwrap(), 3);
    assert_eq!(shop.available().await, 4, "a new operation reserves again");
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

/// A lapsed claim (its worker died) keeps its writes in effect for the ttl and retain too.
async fn a_lapsed_claim_keeps_its_writes_for_the_ttl_and_retain(backend: Backend) {
    let h = Harness::with(backend, |b| {
        b.heartbeat(false).retain(Duration::from_hours(1))
    })
    .await;
    let shop = Arc::new(Shop::new(&h, 10).await);
    let gate = Arc::new(Gate::default());
    let crashed = tokio::spawn({
        let (idem, shop, gate) = (h.idem.clone(), shop.clone(), gate.clone());
        async move {
            idem.operation(NAMESPACE, "order-1")
                .lease(Duration::from_secs(10))
                .claim_with([shop.take(3)])
                .run(|_| async {
                    gate.enter().await?;
                    Ok::<_, AppError>(3)
                })
                .await
        }
    });
    gate.started().await;
    crashed.abort();
    assert!(crashed.await.unwrap_err().is_cancelled());
    assert_eq!(shop.available().await, 7);
    // Past the lease and the ttl, within the retain.
    h.clock
        .advance(Duration::from_secs(10) + Duration::from_mins(24 * 60 + 30));
    let runs = AtomicUsize::new(0);
    assert_eq!(reserve(&h, &shop, &runs, false).await.unwrap(), 3);
    assert_eq!(shop.available().await, 7, "not reserved a second time");
}

on_both_stores!(
    a_retry_after_the_failed_ttl_does_not_reserve_again,
    a_failed_record_keeps_its_writes_for_the_ttl_and_retain,
    a_lapsed_claim_keeps_its_writes_for_the_ttl_and_retain,
);

/// The same after an operator's `key release` of a stuck claim (whose FAILED record expires in an hour),
/// retried 3,700 s later.
async fn a_retry_after_an_operators_release_does_not_reserve_again(backend: Backend) {
    let h = Harness::with(backend, |b| b.heartbeat(false)).await;
    let shop = Arc::new(Shop::new(&h, 10).await);
    let gate = Arc::new(Gate::default());
    let stuck = tokio::spawn({
        let (idem, shop, gate) = (h.idem.clone(), shop.clone(), gate.clone());
        async move {
            idem.operation(NAMESPACE, "order-1")
                .claim_with([shop.take(3)])
                .run(|_| async {
                    gate.enter().await?;
                    Ok::<_, AppError>(3)
                })
                .await
        }
    });
    gate.started().await;
    stuck.abort();
    assert!(stuck.await.unwrap_err().is_cancelled());
    let record = h.record(NAMESPACE, "order-1").await.unwrap();
    let released = idempotent_runtime::admin::release(h.store.as_ref(), &record, h.clock.now_ms())
        .await
        .unwrap();
    assert_eq!(released, idempotent_runtime::admin::Released::Released);
    h.clock.advance(Duration::from_secs(3700));
    let runs = AtomicUsize::new(0);
    assert_eq!(reserve(&h, &shop, &runs, false).await.unwrap(), 3);
    assert_eq!(
        shop.available().await,
        7,
        "the retry after the release must not take the stock a second time"
    );
}

on_both_stores!(a_retry_after_an_operators_release_does_not_reserve_again);
