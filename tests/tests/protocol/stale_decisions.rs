//! A decision taken on a record that another caller changes before the claim acting on it lands. A claim
//! with writes (`claim_with(take 3)`, `compensate_with(give_back 3)`) dies and its lease lapses; retry
//! B's transaction is refused (the writes are in effect), so B takes the key with a plain claim that
//! keeps them. Before that claim lands, retry C takes the key, fails, and its compensation releases the
//! writes. B's claim must not then run without the reservation (completed with stock 10), nor compensate
//! a second time when B fails (stock 13): it is refused, and B claims with its writes instead.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idempotent_runtime::store::conformance::{Delegating, Override};
use idempotent_runtime::store::{ClaimOutcome, ClaimRequest, TransactOutcome, Transition, Writes};
use idempotent_runtime::{Idempotency, Status, Store, StoreError};
use idempotent_tests::proxy::{Fault, Rule};
use idempotent_tests::{Backend, Forward, Harness, RequestCounter};

use super::shop::Shop;
use super::{AppError, Gate};
use idempotent_tests::on_both_stores;

const NAMESPACE: &str = "correctness::stale";

/// A store whose next plain claim is held until released: B's claim, in flight while C runs.
#[derive(Debug)]
struct HoldNextClaim {
    armed: AtomicBool,
    reached: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

#[async_trait::async_trait]
impl Override<Forward> for HoldNextClaim {
    fn kind(&self) -> &'static str {
        "hold-next-claim"
    }

    async fn claim(
        &self,
        inner: &Forward,
        request: &ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, StoreError> {
        if self.armed.swap(false, Ordering::SeqCst) {
            self.reached.notify_one();
            self.release.notified().await;
        }
        inner.claim(request).await
    }

    async fn claim_transaction(
        &self,
        inner: &Forward,
        request: &ClaimRequest<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        inner.claim_transaction(request, writes).await
    }

    async fn transact_transition(
        &self,
        inner: &Forward,
        transition: &Transition<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        inner.transact_transition(transition, writes).await
    }
}

/// The reservation with its compensation, through `idem`; the body fails when `fail`.
async fn reserve(idem: &Idempotency, shop: &Shop, fail: bool) -> Result<u64, AppError> {
    idem.operation(NAMESPACE, "order-1")
        .lease(Duration::from_secs(10))
        .claim_with([shop.take(3)])
        .compensate_with([shop.give_back(3)])
        .run(|_| async move { if fail { Err(AppError::Declined) } else { Ok(3) } })
        .await
}

/// A's claim reserves 3 and dies; its lease lapses.
async fn lapsed_reservation(
    idem: &Idempotency,
    shop: &Arc<Shop>,
    clock: &idempotent_runtime::ManualClock,
) {
    let gate = Arc::new(Gate::default());
    let crashed = tokio::spawn({
        let (idem, shop, gate) = (idem.clone(), shop.clone(), gate.clone());
        async move {
            idem.operation(NAMESPACE, "order-1")
                .lease(Duration::from_secs(10))
                .claim_with([shop.take(3)])
                .compensate_with([shop.give_back(3)])
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
    clock.advance(Duration::from_secs(12));
}

/// B's plain claim held in the store while C takes the key and fails; then B goes on, and succeeds
/// (`b_fails` false) or fails.
async fn stale_decision(backend: Backend, b_fails: bool) {
    let h = Harness::with(backend, |b| b.heartbeat(false)).await;
    let shop = Arc::new(Shop::new(&h, 10).await);
    let held = Arc::new(Delegating::new(
        Forward(h.store.clone()),
        HoldNextClaim {
            armed: AtomicBool::new(true),
            reached: tokio::sync::Notify::new(),
            release: tokio::sync::Notify::new(),
        },
    ));
    let clock = h.clock.clone();
    let through_hold = Harness::over(held.clone(), RequestCounter::default(), |b| {
        b.heartbeat(false).clock(clock)
    })
    .idem;
    lapsed_reservation(&h.idem, &shop, &h.clock).await;

    let b = tokio::spawn({
        let shop = shop.clone();
        async move { reserve(&through_hold, &shop, b_fails).await }
    });
    held.reached.notified().await;
    // C: refused transaction, plain claim, body fails, compensation commits with FAILED.
    assert!(matches!(
        reserve(&h.idem, &shop, true).await,
        Err(AppError::Declined)
    ));
    assert_eq!(
        shop.available().await,
        10,
        "C's compensation gave the 3 back"
    );
    let record = h.record(NAMESPACE, "order-1").await.unwrap();
    assert_eq!(record.status, Status::Failed);
    assert!(!record.claim_writes_in_effect);

    held.release.notify_one();
    let outcome = b.await.unwrap();
    let record = h.record(NAMESPACE, "order-1").await.unwrap();
    if b_fails {
        assert!(matches!(outcome, Err(AppError::Declined)), "{outcome:?}");
        assert_eq!(
            shop.available().await,
            10,
            "B's failure must not give back what C already gave back"
        );
        assert_eq!(record.status, Status::Failed);
        assert!(!record.claim_writes_in_effect);
    } else {
        assert_eq!(outcome.unwrap(), 3);
        assert_eq!(
            shop.available().await,
            7,
            "B must not complete without its reservation"
        );
        assert_eq!(record.status, Status::Completed);
        assert!(record.claim_writes_in_effect);
    }
}

async fn a_stale_decision_does_not_complete_without_the_reservation(backend: Backend) {
    stale_decision(backend, false).await;
}

async fn a_stale_decision_does_not_compensate_twice(backend: Backend) {
    stale_decision(backend, true).await;
}

on_both_stores!(
    a_stale_decision_does_not_complete_without_the_reservation,
    a_stale_decision_does_not_compensate_twice,
);

/// The same race on the wire: B's plain claim (its first `UpdateItem`) is held 1.5 s by the fault proxy
/// in front of DynamoDB Local, while C, on a direct client, takes the key and fails.
async fn on_the_wire(b_fails: bool) {
    let (hb, proxy) = Harness::behind_proxy(|b| b.heartbeat(false)).await;
    let shop = Arc::new(Shop::new(&hb, 10).await);
    let (direct, _) = idempotent_tests::client();
    let table = hb.dynamodb.as_ref().unwrap().table().to_owned();
    let direct = Idempotency::builder_arc(Arc::new(idempotent_runtime::DynamoDbStore::new(
        direct, table,
    )))
    .clock(hb.clock.clone())
    .heartbeat(false)
    .build();
    lapsed_reservation(&direct, &shop, &hb.clock).await;

    proxy.set_rules([Rule::new(Fault::Delay(Duration::from_millis(1500)))
        .operation("UpdateItem")
        .nth(1)]);
    let b = tokio::spawn({
        let (idem, shop) = (hb.idem.clone(), shop.clone());
        async move { reserve(&idem, &shop, b_fails).await }
    });
    while proxy
        .stats()
        .by_operation
        .get("UpdateItem")
        .map_or(0, |c| c.delayed)
        == 0
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(matches!(
        reserve(&direct, &shop, true).await,
        Err(AppError::Declined)
    ));
    assert_eq!(
        shop.available().await,
        10,
        "C's compensation gave the 3 back"
    );
    let outcome = b.await.unwrap();
    assert_eq!(
        proxy.stats().by_operation["UpdateItem"].delayed,
        1,
        "B's plain claim was held while C ran"
    );
    let record = hb.record(NAMESPACE, "order-1").await.unwrap();
    if b_fails {
        assert!(matches!(outcome, Err(AppError::Declined)), "{outcome:?}");
        assert_eq!(shop.available().await, 10, "compensated once");
        assert_eq!(record.status, Status::Failed);
    } else {
        assert_eq!(outcome.unwrap(), 3);
        assert_eq!(shop.available().await, 7, "completed with its reservation");
        assert_eq!(
            (record.status, record.claim_writes_in_effect),
            (Status::Completed, true)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_wire_a_stale_decision_does_not_complete_without_the_reservation() {
    on_the_wire(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_wire_a_stale_decision_does_not_compensate_twice() {
    on_the_wire(true).await;
}
