//! A release meets a transient store error: the loop in `handler/claim.rs`'s `release` sends the
//! write again after a pause, until the claim it gave up is over (`decide::release_retry`), rather
//! than stopping at the first error and leaving the claim free to land. Behind a `RoutedStore` the
//! same outage reaches the release as `StoreError::RegionUnavailable`, which it does not send again
//! (the two ignored tests reproduce it: a call given up while its claim is on the wire, and a claim
//! whose answer was lost).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotent_runtime::store::conformance::{Delegating, Override};
use idempotent_runtime::store::{ClaimOutcome, ClaimRequest, Transition, WriteOutcome};
use idempotent_runtime::{
    Error, Idempotency, ManualClock, MemoryStore, RoutedStore, Store, StoreError,
};
use idempotent_tests::{Backend, ClaimAppliedLate, Forward, Runs, dynamodb_store};

const NAMESPACE: &str = "release_faults::charge";
const KEY: &str = "order-1";
const LEASE: Duration = Duration::from_mins(1);

/// Fails the first `n` transitions with [`StoreError::Unavailable`], as DynamoDB's answer after the
/// SDK's own retries of a brief outage (HTTP 5xx, a broken connection) would; forwards the rest.
#[derive(Debug)]
struct TransitionsUnavailable(AtomicUsize);

#[async_trait::async_trait]
impl Override<Forward> for TransitionsUnavailable {
    fn kind(&self) -> &'static str {
        "transitions-unavailable"
    }

    async fn transition(
        &self,
        inner: &Forward,
        transition: &Transition<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        let failing = self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            return Err(StoreError::Unavailable("a brief outage".into()));
        }
        inner.transition(transition).await
    }
}

/// The operation on [`KEY`] with a one-minute lease: counts its runs, returns which run it was.
async fn charge(idem: &Idempotency, runs: &Runs) -> Result<usize, Error> {
    idem.operation(NAMESPACE, KEY)
        .lease(LEASE)
        .run(|_| async { Ok::<_, Error>(runs.0.fetch_add(1, Ordering::SeqCst) + 1) })
        .await
}

/// A new key; a call on a slow store (its claim lands 600 ms after it was sent) gives up after
/// 50 ms. Its release's first write (the fenced failure of a claim that may have landed) meets one
/// transient error. Had the release stopped there, having written nothing, the claim would land on
/// no record and hold the key for its minute with no body running (the next caller getting
/// `InProgress` instead of running): one brief blip of the store was enough. The release sends it
/// again, and its mark keeps the claim out.
async fn a_release_outlasts_a_transient_store_error(backend: Backend) {
    let store: Arc<dyn Store> = match backend {
        Backend::Memory => Arc::new(MemoryStore::new()),
        Backend::DynamoDb => Arc::new(dynamodb_store().await.0),
    };
    let clock = ManualClock::starting_now();
    let direct = Idempotency::builder_arc(store.clone())
        .clock(clock.clone())
        .build();
    let late: Arc<dyn Store> = Arc::new(Delegating::new(
        Forward(store.clone()),
        ClaimAppliedLate(Duration::from_millis(600)),
    ));
    let slow = Idempotency::builder_arc(Arc::new(Delegating::new(
        Forward(late),
        TransitionsUnavailable(AtomicUsize::new(1)),
    )))
    .clock(clock.clone())
    .build();
    let runs = Runs::default();
    let gave_up = tokio::time::timeout(Duration::from_millis(50), charge(&slow, &runs)).await;
    assert!(gave_up.is_err(), "the caller gave up: {gave_up:?}");
    slow.drain(Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(900)).await;
    let landed = store
        .get(&idempotent_runtime::derive_key(NAMESPACE, KEY).unwrap())
        .await
        .unwrap();
    let answer = charge(&direct, &runs).await;
    assert!(
        matches!(answer, Ok(1)),
        "the key is not held by a call that gave up: {answer:?}; record: {landed:?}"
    );
    assert_eq!(runs.count(), 1);
}

/// As [`a_release_outlasts_a_transient_store_error`], on a handle whose store is a
/// [`RoutedStore`] (one region, `home`): the same brief outage of the region's store reaches the
/// release as [`StoreError::RegionUnavailable`], which the routed store documents as transient ("the
/// request may or may not have been applied"), and which a completion or a step's write
/// (`handler/settle.rs`) sends again. A release stops at it: the late claim lands on no record and
/// holds the key for its minute with no body running, and the next caller gets `InProgress`.
async fn a_release_through_a_routed_store_outlasts_a_brief_region_outage(backend: Backend) {
    let store: Arc<dyn Store> = match backend {
        Backend::Memory => Arc::new(MemoryStore::new()),
        Backend::DynamoDb => Arc::new(dynamodb_store().await.0),
    };
    let clock = ManualClock::starting_now();
    let direct = Idempotency::builder_arc(store.clone())
        .clock(clock.clone())
        .build();
    let late: Arc<dyn Store> = Arc::new(Delegating::new(
        Forward(store.clone()),
        ClaimAppliedLate(Duration::from_millis(600)),
    ));
    let region: Arc<dyn Store> = Arc::new(Delegating::new(
        Forward(late),
        TransitionsUnavailable(AtomicUsize::new(1)),
    ));
    let routed = RoutedStore::new([("home", region)]).unwrap();
    let slow = Idempotency::builder_arc(Arc::new(routed))
        .clock(clock.clone())
        .build();
    let runs = Runs::default();
    let gave_up = tokio::time::timeout(Duration::from_millis(50), charge(&slow, &runs)).await;
    assert!(gave_up.is_err(), "the caller gave up: {gave_up:?}");
    slow.drain(Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(900)).await;
    let landed = store
        .get(&idempotent_runtime::derive_key(NAMESPACE, KEY).unwrap())
        .await
        .unwrap();
    let answer = charge(&direct, &runs).await;
    assert!(
        matches!(answer, Ok(1)),
        "the key is not held by a call that gave up: {answer:?}; record: {landed:?}"
    );
    assert_eq!(runs.count(), 1);
}

/// A region's brief outage as a call sees it: its claim is applied but the answer is lost
/// ([`StoreError::Unavailable`], as DynamoDB's timeout after the SDK's own retries), and the first
/// transition meets the same outage; the rest is forwarded.
#[derive(Debug)]
struct ClaimAnswerLost(AtomicUsize);

#[async_trait::async_trait]
impl Override<Forward> for ClaimAnswerLost {
    fn kind(&self) -> &'static str {
        "claim-answer-lost"
    }

    async fn claim(
        &self,
        inner: &Forward,
        request: &ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, StoreError> {
        inner.claim(request).await?;
        Err(StoreError::Unavailable("the answer was lost".into()))
    }

    async fn transition(
        &self,
        inner: &Forward,
        transition: &Transition<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        let failing = self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            return Err(StoreError::Unavailable("a brief outage".into()));
        }
        inner.transition(transition).await
    }
}

/// A call through a [`RoutedStore`] (one region, `home`) whose claim lands but whose answer is lost
/// in a brief outage of the region: the call ends with `RegionUnavailable` (retryable, no body ran)
/// and releases its claim. The release's first write meets the same outage, as
/// [`StoreError::RegionUnavailable`], and the release stops there: the claim stays PENDING, and the
/// caller's retry, a moment later, gets `InProgress` for the claim's whole minute with no body
/// running. Had the region's store answered [`StoreError::Unavailable`] directly, the release would
/// have sent its write again ([`a_release_outlasts_a_transient_store_error`]).
async fn a_claim_answer_lost_in_a_region_outage_is_released(backend: Backend) {
    let store: Arc<dyn Store> = match backend {
        Backend::Memory => Arc::new(MemoryStore::new()),
        Backend::DynamoDb => Arc::new(dynamodb_store().await.0),
    };
    let clock = ManualClock::starting_now();
    let region: Arc<dyn Store> = Arc::new(Delegating::new(
        Forward(store.clone()),
        ClaimAnswerLost(AtomicUsize::new(1)),
    ));
    let routed = Idempotency::builder_arc(Arc::new(RoutedStore::new([("home", region)]).unwrap()))
        .clock(clock.clone())
        .build();
    let runs = Runs::default();
    let first = charge(&routed, &runs).await;
    assert!(
        matches!(first, Err(Error::RegionUnavailable { .. })),
        "the claim's answer was lost: {first:?}"
    );
    routed.drain(Duration::from_secs(10)).await;
    let left = store
        .get(&idempotent_runtime::derive_key(NAMESPACE, KEY).unwrap())
        .await
        .unwrap();
    let direct = Idempotency::builder_arc(store.clone())
        .clock(clock.clone())
        .build();
    let retry = charge(&direct, &runs).await;
    assert!(
        matches!(retry, Ok(1)),
        "the claim of a call that returned does not hold the key: {retry:?}; record: {left:?}"
    );
    assert_eq!(runs.count(), 1);
}

idempotent_tests::on_both_stores!(a_release_outlasts_a_transient_store_error,);
idempotent_tests::on_both_stores!(
    a_release_through_a_routed_store_outlasts_a_brief_region_outage,
    a_claim_answer_lost_in_a_region_outage_is_released,
);
