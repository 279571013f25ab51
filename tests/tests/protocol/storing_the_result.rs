//! Once the body has run, its result is in memory and the claim is still ours, so a
//! transient fault while storing it (a transaction conflict, throttling, a server error that outlasts
//! the SDK's own retries) is retried with backoff for as long as the lease allows — never turned into
//! FAILED, never a reason to run the body again.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use idempotent_runtime::{Error, Idempotency, Status};
use idempotent_tests::proxy::{Fault, Rule};
use idempotent_tests::{Harness, RequestCounter};

use super::AppError;
use super::flaky::Flaky;
use super::shop::Shop;

const NAMESPACE: &str = "correctness::completion";

/// Takes 3 units at completion, in one transaction with the COMPLETED record.
async fn reserve(
    idem: &Idempotency,
    shop: &Arc<Shop>,
    runs: &Arc<AtomicUsize>,
) -> Result<u64, AppError> {
    let (shop, runs) = (shop.clone(), runs.clone());
    idem.operation(NAMESPACE, "order-1")
        .transact()
        .run(|cx| async move {
            let ((), tx) = cx.into_parts();
            runs.fetch_add(1, Ordering::SeqCst);
            tx.push(shop.take(3));
            Ok(3)
        })
        .await
}

async fn a_transient_cancellation_at_completion_is_retried(codes: &'static [&'static str]) {
    let (h, proxy) = Harness::behind_proxy(|b| b).await;
    let shop = Arc::new(Shop::new(&h, 10).await);
    let runs = Arc::new(AtomicUsize::new(0));
    proxy.set_rules([Rule::new(Fault::CancelTransaction(codes))
        .operation("TransactWriteItems")
        .first(2)]);

    let result = reserve(&h.idem, &shop, &runs).await;
    assert_eq!(
        result.map_err(AppError::idempotency).unwrap(),
        3,
        "a {codes:?} cancellation is transient: the completion is retried, not failed"
    );
    let stats = proxy.stats().operation("TransactWriteItems");
    assert_eq!((stats.canceled, stats.forwarded), (2, 1));
    assert_eq!(shop.available().await, 7);
    let record = h.record(NAMESPACE, "order-1").await.unwrap();
    assert_eq!(record.status, Status::Completed);

    // A duplicate replays: the body ran once.
    assert_eq!(reserve(&h.idem, &shop, &runs).await.unwrap(), 3);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(shop.available().await, 7);
}

#[tokio::test]
async fn a_transaction_conflict_at_completion_is_retried_on_dynamodb() {
    a_transient_cancellation_at_completion_is_retried(&["TransactionConflict", "None"]).await;
}

#[tokio::test]
async fn a_throttled_transaction_at_completion_is_retried_on_dynamodb() {
    a_transient_cancellation_at_completion_is_retried(&["None", "ThrottlingError"]).await;
}

async fn work(idem: &Idempotency, runs: &AtomicUsize, fail: bool) -> Result<String, AppError> {
    idem.operation(NAMESPACE, "job-1")
        .run(|_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            if fail {
                Err(AppError::Declined)
            } else {
                Ok("done".to_owned())
            }
        })
        .await
}

#[tokio::test]
async fn a_completion_that_outlasts_the_sdk_retries_is_retried_while_the_lease_allows() {
    let (h, proxy) = Harness::behind_proxy(|b| b).await;
    // Every one of the SDK's three attempts of the first completion fails.
    proxy.set_rules([Rule::new(Fault::ServerError)
        .operation("UpdateItem")
        .body_contains(":completed")
        .first(3)]);
    let runs = AtomicUsize::new(0);
    let result = work(&h.idem, &runs, false).await;
    assert_eq!(result.map_err(AppError::idempotency).unwrap(), "done");
    assert_eq!(proxy.stats().operation("UpdateItem").server_errors, 3);
    let record = h.record(NAMESPACE, "job-1").await.unwrap();
    assert_eq!(record.status, Status::Completed);
    assert_eq!(work(&h.idem, &runs, false).await.unwrap(), "done");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
}

#[tokio::test]
async fn a_failure_write_that_outlasts_the_sdk_retries_is_retried_so_the_key_is_free_at_once() {
    let (h, proxy) = Harness::behind_proxy(|b| b).await;
    proxy.set_rules([Rule::new(Fault::ServerError)
        .operation("UpdateItem")
        .body_contains(":er")
        .first(3)]);
    let runs = AtomicUsize::new(0);
    assert!(matches!(
        work(&h.idem, &runs, true).await,
        Err(AppError::Declined)
    ));
    assert_eq!(proxy.stats().operation("UpdateItem").server_errors, 3);
    assert_eq!(
        h.record(NAMESPACE, "job-1").await.unwrap().status,
        Status::Failed,
        "the FAILED write was retried until it landed"
    );
    // No wait for the lease: a retry runs at once.
    assert_eq!(work(&h.idem, &runs, false).await.unwrap(), "done");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn transient_cancellations_outlasting_the_lease_leave_the_key_pending_and_say_so() {
    let (h, proxy) = Harness::behind_proxy(|b| b).await;
    let shop = Arc::new(Shop::new(&h, 10).await);
    let runs = Arc::new(AtomicUsize::new(0));
    proxy.set_rules([
        Rule::new(Fault::CancelTransaction(&["TransactionConflict", "None"]))
            .operation("TransactWriteItems"),
    ]);
    let started = std::time::Instant::now();
    let err = h
        .idem
        .operation(NAMESPACE, "order-9")
        .lease(std::time::Duration::from_secs(2))
        .transact()
        .run(|cx| {
            let ((), tx) = cx.into_parts();
            let (shop, runs) = (shop.clone(), runs.clone());
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                tx.push(shop.take(3));
                Ok::<_, AppError>(3)
            }
        })
        .await
        .unwrap_err()
        .idempotency();
    assert!(matches!(&err, Error::ResultNotStored { .. }), "{err:?}");
    assert!(err.to_string().contains("could not be stored"), "{err}");
    assert!(
        started.elapsed() >= std::time::Duration::from_secs(2),
        "retried for the whole 2 s lease"
    );
    let attempts = proxy.stats().operation("TransactWriteItems").canceled;
    assert!(attempts > 3, "{attempts} attempts");
    let record = h.record(NAMESPACE, "order-9").await.unwrap();
    assert_eq!(
        record.status,
        Status::Pending,
        "left for its lease to free, not FAILED"
    );
    assert_eq!(shop.available().await, 10, "nothing was written");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The memory store, with the same faults scripted: a conflict at a transactional completion and an
/// unavailable store at a plain completion and at a failure are all retried.
#[tokio::test]
async fn transient_faults_at_completion_are_retried_on_the_memory_store() {
    let flaky = Arc::new(Flaky::default());
    let h = Harness {
        memory: Some(flaky.inner.clone()),
        ..Harness::over(flaky.clone(), RequestCounter::default(), |b| b)
    };
    let shop = Arc::new(Shop::new(&h, 10).await);
    let runs = Arc::new(AtomicUsize::new(0));

    flaky.script.lock().unwrap().conflicts = 2;
    assert_eq!(reserve(&h.idem, &shop, &runs).await.unwrap(), 3);
    assert_eq!(flaky.script.lock().unwrap().conflicts, 0, "both fired");
    assert_eq!(shop.available().await, 7);
    assert_eq!(reserve(&h.idem, &shop, &runs).await.unwrap(), 3);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let plain = AtomicUsize::new(0);
    flaky.script.lock().unwrap().unavailable = 3;
    assert_eq!(work(&h.idem, &plain, false).await.unwrap(), "done");
    assert_eq!(flaky.script.lock().unwrap().unavailable, 0);
    assert_eq!(
        h.record(NAMESPACE, "job-1").await.unwrap().status,
        Status::Completed
    );
    assert_eq!(work(&h.idem, &plain, false).await.unwrap(), "done");
    assert_eq!(plain.load(Ordering::SeqCst), 1);
}
