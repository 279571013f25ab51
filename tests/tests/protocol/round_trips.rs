//! Exact DynamoDB round trips per path, counted by an SDK interceptor on DynamoDB Local.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use idempotent_runtime::{Error, Idempotency, idempotent};
use idempotent_tests::{Backend, Harness};
use tokio::sync::{Notify, Semaphore};

#[derive(Debug)]
enum AppError {
    Refused,
    Idempotency(Error),
}

impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        AppError::Idempotency(e)
    }
}

#[idempotent(key = id, store = idem, name = "round-trips::work")]
async fn work(
    idem: &Idempotency,
    runs: &AtomicUsize,
    id: u64,
    ok: bool,
) -> Result<Vec<u64>, AppError> {
    runs.fetch_add(1, Ordering::SeqCst);
    if ok {
        Ok(vec![id; 3])
    } else {
        Err(AppError::Refused)
    }
}

#[idempotent(key = id, store = idem, name = "round-trips::held")]
async fn held(idem: &Idempotency, gate: &(Notify, Semaphore), id: u64) -> Result<u64, AppError> {
    gate.0.notify_one();
    gate.1.acquire().await.unwrap().forget();
    Ok(id)
}

#[tokio::test]
async fn a_first_call_takes_two_round_trips_and_a_completed_duplicate_one() {
    let h = Harness::new(Backend::DynamoDb).await;
    let runs = AtomicUsize::new(0);

    work(&h.idem, &runs, 1, true).await.unwrap();
    assert_eq!(h.requests.total(), 2, "claim + complete");
    assert_eq!(h.requests.of("UpdateItem"), 2);

    h.requests.reset();
    assert_eq!(work(&h.idem, &runs, 1, true).await.unwrap(), vec![1, 1, 1]);
    assert_eq!(
        h.requests.total(),
        1,
        "the failed claim returns the COMPLETED record"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_failing_first_call_takes_two_round_trips() {
    let h = Harness::new(Backend::DynamoDb).await;
    let runs = AtomicUsize::new(0);
    assert!(matches!(
        work(&h.idem, &runs, 2, false).await,
        Err(AppError::Refused)
    ));
    assert_eq!(h.requests.total(), 2, "claim + fail");
    h.requests.reset();
    work(&h.idem, &runs, 2, true).await.unwrap();
    assert_eq!(h.requests.total(), 2, "re-claim of a FAILED key + complete");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_duplicate_takes_one_round_trip() {
    let h = Harness::new(Backend::DynamoDb).await;
    let gate = Arc::new((Notify::new(), Semaphore::new(0)));
    let first = tokio::spawn({
        let (idem, gate) = (h.idem.clone(), gate.clone());
        async move { held(&idem, &gate, 3).await }
    });
    gate.0.notified().await;
    h.requests.reset();
    // From another process: a duplicate in the same one follows the first call and sends nothing
    // (`coalescing.rs`).
    let other = h.another_process(|b| b);
    let err = held(&other, &gate, 3).await.unwrap_err();
    assert!(
        matches!(err, AppError::Idempotency(Error::InProgress { .. })),
        "{err:?}"
    );
    assert_eq!(h.requests.total(), 1, "fail fast: one claim, no read");
    gate.1.add_permits(1);
    assert_eq!(first.await.unwrap().unwrap(), 3);
}

#[idempotent(key = id, payload = amount, store = idem, name = "round-trips::cached", ttl = "1h")]
async fn cached(
    idem: &Idempotency,
    runs: &AtomicUsize,
    id: u64,
    amount: u64,
) -> Result<u64, AppError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(id + amount)
}

#[tokio::test]
async fn with_the_local_cache_a_duplicate_takes_no_round_trip() {
    let h = Harness::with(Backend::DynamoDb, |b| b.local_cache(1_000)).await;
    let runs = AtomicUsize::new(0);
    assert_eq!(cached(&h.idem, &runs, 1, 10).await.unwrap(), 11);
    assert_eq!(h.requests.total(), 2);
    h.requests.reset();
    assert_eq!(cached(&h.idem, &runs, 1, 10).await.unwrap(), 11);
    assert_eq!(h.requests.total(), 0, "answered from the cache");
    // A payload mismatch is still caught, from the cache.
    let err = cached(&h.idem, &runs, 1, 99).await.unwrap_err();
    assert!(
        matches!(err, AppError::Idempotency(Error::PayloadMismatch { .. })),
        "{err:?}"
    );
    assert_eq!(h.requests.total(), 0);
    // Past the ttl (and the 1 s clock-skew margin) the cache does not answer, and the store says the key
    // is new.
    h.clock.advance(std::time::Duration::from_secs(3_603));
    assert_eq!(cached(&h.idem, &runs, 1, 10).await.unwrap(), 11);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(h.requests.total(), 2);
    // A replay from the store fills the cache too: a second process's cache is cold.
    let other = idempotent_runtime::Idempotency::builder_arc(h.store.clone())
        .clock(h.clock.clone())
        .local_cache(10)
        .build();
    h.requests.reset();
    assert_eq!(cached(&other, &runs, 1, 10).await.unwrap(), 11);
    assert_eq!(cached(&other, &runs, 1, 10).await.unwrap(), 11);
    assert_eq!(
        h.requests.total(),
        1,
        "one claim (replayed), then the cache"
    );
}
