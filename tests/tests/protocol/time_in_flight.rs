//! Time passes while a request is in flight: a claim answered after the lease it asked for, heartbeats
//! slow enough to eat into the lease they renew, a claim whose answer never comes, a value that does
//! not read back. In each, the body runs at most once per key, on both stores.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idempotent_runtime::store::conformance::{Delegating, Override};
use idempotent_runtime::store::{ClaimOutcome, ClaimRequest, Transition, WriteOutcome};
use idempotent_runtime::{Clock, Error, Idempotency, ManualClock, Status, Store, StoreError};
use idempotent_tests::{
    Backend, ClaimAppliedLate, Forward, Harness, RequestCounter, Runs, SharedOverride, backing,
};

/// `charge` under `key`, with `lease`: counts its runs, returns which run it was.
async fn charge(
    idem: &Idempotency,
    runs: &Runs,
    key: &str,
    lease: Duration,
    takes: Duration,
) -> Result<usize, Error> {
    idem.operation("time_in_flight::charge", key)
        .lease(lease)
        .run(|_| async {
            let run = runs.0.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::time::sleep(takes).await;
            Ok::<_, Error>(run)
        })
        .await
}

/// The first claim lands, and then its answer takes `late` (on the caller's clock) to come back; while
/// it is on the wire, `meanwhile` runs (a duplicate). `resend`: the answer is lost and the SDK sends the
/// claim again, which the store refuses with the caller's own record.
#[derive(Debug)]
struct LateAnswer {
    clock: ManualClock,
    late: Duration,
    resend: bool,
    first: AtomicBool,
    landed: tokio::sync::Notify,
    go: tokio::sync::Semaphore,
}

impl LateAnswer {
    fn new(clock: ManualClock, late: Duration, resend: bool) -> Self {
        Self {
            clock,
            late,
            resend,
            first: AtomicBool::new(true),
            landed: tokio::sync::Notify::new(),
            go: tokio::sync::Semaphore::new(0),
        }
    }
}

#[async_trait::async_trait]
impl Override<Forward> for LateAnswer {
    fn kind(&self) -> &'static str {
        "late-answer"
    }

    async fn claim(
        &self,
        inner: &Forward,
        request: &ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, StoreError> {
        let mut outcome = inner.claim(request).await?;
        if !self.first.swap(false, Ordering::SeqCst) {
            return Ok(outcome);
        }
        self.clock.advance(self.late);
        if self.resend {
            outcome = inner.claim(request).await?;
            assert!(
                matches!(&outcome, ClaimOutcome::Existing(r) if r.token == request.token),
                "the resent claim finds the caller's own record: {outcome:?}"
            );
        }
        self.landed.notify_one();
        self.go.acquire().await.unwrap().forget();
        Ok(outcome)
    }
}

/// A harness whose store answers the first claim late (see [`LateAnswer`]).
async fn late_harness(
    backend: Backend,
    late: Duration,
    resend: bool,
) -> (Harness, Arc<LateAnswer>) {
    let clock = ManualClock::starting_now();
    let late = Arc::new(LateAnswer::new(clock.clone(), late, resend));
    let store = Arc::new(Delegating::new(
        Forward(backing(backend).await),
        SharedOverride(late.clone()),
    ));
    let harness = Harness::over(store, RequestCounter::default(), |b| b.clock(clock));
    (harness, late)
}

/// A claim answered 3.5 s after it landed, on a 2 s lease: a duplicate took the key over meanwhile and
/// ran the body. The first caller must not run it too: it claims again and gets the duplicate's answer.
async fn check_a_claim_answered_after_its_lease_does_not_run_the_body(
    backend: Backend,
    resend: bool,
) {
    let lease = Duration::from_secs(2);
    let (harness, late) = late_harness(backend, Duration::from_millis(3_500), resend).await;
    let runs = Runs::default();
    let first = tokio::spawn({
        let (idem, runs) = (harness.idem.clone(), runs.clone());
        async move { charge(&idem, &runs, "order-1", lease, Duration::ZERO).await }
    });
    late.landed.notified().await;
    // From another process: in the first one's, the duplicate would wait for the first call's answer.
    let other = harness.another_process(|b| b.clock(late.clock.clone()));
    let duplicate = charge(&other, &runs, "order-1", lease, Duration::ZERO).await;
    assert_eq!(
        duplicate.unwrap(),
        1,
        "the duplicate took the lapsed claim over"
    );
    late.go.add_permits(1);
    let first = first.await.unwrap();
    assert_eq!(
        runs.count(),
        1,
        "the body ran on a claim whose lease had lapsed when its answer came: {first:?}"
    );
    assert_eq!(first.unwrap(), 1, "the first caller gets the stored answer");
    let record = harness
        .record("time_in_flight::charge", "order-1")
        .await
        .unwrap();
    assert_eq!(record.status, Status::Completed);
}

/// Heartbeat writes that each take 1.6 s before they reach the store (a throttled heartbeat the SDK
/// retries with backoff), while every other request is quick, on a 3 s lease and the default 1 s
/// clock-skew margin; the body takes 6 s. A duplicate trying every 250 ms must never take the live
/// worker over: heartbeats are scheduled from when they were sent, not from when they were answered.
#[derive(Debug)]
struct SlowHeartbeats(Duration);

#[async_trait::async_trait]
impl Override<Forward> for SlowHeartbeats {
    fn kind(&self) -> &'static str {
        "slow-heartbeats"
    }

    async fn transition(
        &self,
        inner: &Forward,
        transition: &Transition<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        if matches!(
            transition.change,
            idempotent_runtime::store::Change::ExtendLease { .. }
        ) {
            tokio::time::sleep(self.0).await;
        }
        inner.transition(transition).await
    }
}

async fn slow_heartbeats_keep_a_live_lease(backend: Backend) {
    let store = Arc::new(Delegating::new(
        Forward(backing(backend).await),
        SlowHeartbeats(Duration::from_millis(1_600)),
    ));
    let idem = Idempotency::builder_arc(store.clone()).build();
    let lease = Duration::from_secs(3);
    let runs = Runs::default();
    let first = tokio::spawn({
        let (idem, runs) = (idem.clone(), runs.clone());
        async move { charge(&idem, &runs, "order-1", lease, Duration::from_secs(6)).await }
    });
    while !first.is_finished() {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let quick = Runs::default();
        match charge(&idem, &quick, "order-1", lease, Duration::ZERO).await {
            Err(Error::InProgress { .. }) => {}
            // The first call finished between the check and this call.
            Ok(1) if quick.count() == 0 => {}
            other => panic!(
                "a duplicate got {other:?} (ran its body {} times) while the first call was alive",
                quick.count()
            ),
        }
    }
    assert_eq!(first.await.unwrap().unwrap(), 1);
    assert_eq!(runs.count(), 1);
}

/// A claim that lands but whose answer is lost on every attempt: the caller gives up with the store's
/// error, and releases what it may hold, so that the next caller runs the body at once instead of
/// waiting out the lease.
#[derive(Debug)]
struct LostClaimAnswers;

#[async_trait::async_trait]
impl Override<Forward> for LostClaimAnswers {
    fn kind(&self) -> &'static str {
        "lost-claim-answers"
    }

    async fn claim(
        &self,
        inner: &Forward,
        request: &ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, StoreError> {
        inner.claim(request).await?;
        Err(StoreError::Unavailable(
            "the answer was lost on every attempt".into(),
        ))
    }
}

async fn a_claim_whose_answer_never_came_is_released(backend: Backend) {
    let store = backing(backend).await;
    let lost = Arc::new(Delegating::new(Forward(store.clone()), LostClaimAnswers));
    let clock = ManualClock::starting_now();
    let giving_up = Idempotency::builder_arc(lost).clock(clock.clone()).build();
    let runs = Runs::default();
    let lease = Duration::from_mins(1);
    let err = charge(&giving_up, &runs, "order-1", lease, Duration::ZERO)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert_eq!(runs.count(), 0);
    // The release goes on a task of its own.
    assert_eq!(giving_up.drain(Duration::from_secs(10)).await, 0);
    let next = Idempotency::builder_arc(store).clock(clock).build();
    let answer = charge(&next, &runs, "order-1", lease, Duration::ZERO).await;
    assert_eq!(
        answer.unwrap(),
        1,
        "the key must be free at once, not held for the lease by a call that gave up"
    );
    assert_eq!(runs.count(), 1);
}

/// A caller that gives up at 50 ms on a claim the store applies at 150 ms: its release finds no record,
/// and its claim lands after the release. The release leaves a mark under the call's token that the
/// late claim respects, so the next caller runs the body at once rather than waiting out the lease.
async fn a_dropped_calls_release_does_not_lose_to_its_late_claim(backend: Backend) {
    let store = backing(backend).await;
    let late = Arc::new(Delegating::new(
        Forward(store.clone()),
        ClaimAppliedLate(Duration::from_millis(150)),
    ));
    let clock = ManualClock::starting_now();
    let dropped = Idempotency::builder_arc(late).clock(clock.clone()).build();
    let runs = Runs::default();
    let lease = Duration::from_mins(1);
    let gave_up = tokio::time::timeout(
        Duration::from_millis(50),
        charge(&dropped, &runs, "order-1", lease, Duration::ZERO),
    )
    .await;
    assert!(gave_up.is_err(), "the caller gave up: {gave_up:?}");
    // The release has been sent; then the claim lands.
    dropped.drain(Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let next = Idempotency::builder_arc(store).clock(clock).build();
    let answer = charge(&next, &runs, "order-1", lease, Duration::ZERO).await;
    assert_eq!(
        answer.unwrap(),
        1,
        "the key must be free: the dropped call's late claim must not hold it for the lease"
    );
    assert_eq!(runs.count(), 1);
}

/// A value serde writes but refuses to read: nested deeper than `serde_json`'s recursion limit.
fn too_deep() -> serde_json::Value {
    let mut value = serde_json::json!(1);
    for _ in 0..200 {
        value = serde_json::Value::Array(vec![value]);
    }
    value
}

/// A `u128` above `u64::MAX` inside an untagged enum: serde writes it, and cannot read it back.
#[derive(Debug, serde::Serialize, serde::Deserialize, PartialEq)]
#[serde(untagged)]
enum Amount {
    Big(u128),
}

async fn check_a_value_that_does_not_read_back_is_final_and_never_replayed<T>(
    backend: Backend,
    name: &str,
    value: impl Fn() -> T,
) where
    T: serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let harness = Harness::over(backing(backend).await, RequestCounter::default(), |b| b);
    let runs = Runs::default();
    let call = || {
        harness
            .idem
            .operation("time_in_flight::unreadable", name)
            .run(|_| async {
                runs.0.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(value())
            })
    };
    let first = call().await.unwrap_err();
    assert!(matches!(first, Error::Serialize { .. }), "{first:?}");
    for _ in 0..2 {
        let duplicate = call().await.unwrap_err();
        assert!(
            matches!(duplicate, Error::ResponseNotSerialized { .. }),
            "a duplicate must hear that the value was not stored, not fail to decode it: {duplicate:?}"
        );
    }
    assert_eq!(runs.count(), 1);
    let record = harness
        .record("time_in_flight::unreadable", name)
        .await
        .unwrap();
    assert_eq!(record.status, Status::Completed);
}

/// The lease floor: a lease too short to be kept alive is refused before anything is sent.
async fn a_lease_under_the_floor_is_refused(backend: Backend) {
    let harness = Harness::over(backing(backend).await, RequestCounter::default(), |b| b);
    let runs = Runs::default();
    let err = charge(
        &harness.idem,
        &runs,
        "order-1",
        Duration::from_millis(300),
        Duration::ZERO,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, Error::LeaseTooShort { lease, .. } if lease == Duration::from_millis(300)),
        "{err:?}"
    );
    assert!(err.to_string().contains("at least 1 s"), "{err}");
    assert_eq!(runs.count(), 0);
    assert!(
        harness
            .record("time_in_flight::charge", "order-1")
            .await
            .is_none()
    );
    let refused = Idempotency::builder_in_memory()
        .default_lease(Duration::from_millis(999))
        .try_build()
        .unwrap_err();
    assert!(refused.to_string().contains("default_lease"), "{refused}");
}

async fn a_claim_answered_after_its_lease_does_not_run_the_body(backend: Backend) {
    check_a_claim_answered_after_its_lease_does_not_run_the_body(backend, false).await;
}

async fn a_resent_claim_recognised_as_ours_after_its_lease_does_not_run_the_body(backend: Backend) {
    check_a_claim_answered_after_its_lease_does_not_run_the_body(backend, true).await;
}

async fn a_value_nested_too_deep_to_read_back_is_final(backend: Backend) {
    check_a_value_that_does_not_read_back_is_final_and_never_replayed(backend, "deep", too_deep)
        .await;
}

async fn a_u128_in_an_untagged_enum_is_final(backend: Backend) {
    check_a_value_that_does_not_read_back_is_final_and_never_replayed(backend, "u128", || {
        Amount::Big(u128::MAX)
    })
    .await;
}

/// A deadline-bound call claims later than it was built (after a wait, or behind other work): its
/// claim asks for what is left until the deadline, not a whole lease counted from the build.
async fn a_claim_sent_after_its_deadline_was_set_ends_by_the_deadline(backend: Backend) {
    let h = Harness::new(backend).await;
    let runs = Runs::default();
    let deadline = std::time::SystemTime::now() + Duration::from_secs(3);
    let deadline_ms = h.clock.now_ms() + 3_000;
    let operation = h
        .idem
        .operation("time_in_flight::deadline", "order-1")
        .deadline(deadline);
    // The claim goes a second after the deadline was read.
    h.clock.advance(Duration::from_secs(1));
    let lease_until = operation
        .run(|_| async {
            runs.0.fetch_add(1, Ordering::SeqCst);
            let record = h
                .record("time_in_flight::deadline", "order-1")
                .await
                .unwrap();
            Ok::<_, Error>(record.lease_until_ms.unwrap())
        })
        .await
        .unwrap();
    assert_eq!(runs.0.load(Ordering::SeqCst), 1);
    assert!(
        lease_until <= deadline_ms,
        "the claim's lease ends by the deadline ({lease_until} > {deadline_ms})"
    );
    assert!(
        lease_until + 5 >= deadline_ms,
        "and holds all the time that is left: {lease_until} for {deadline_ms}"
    );
}

idempotent_tests::on_both_stores!(
    a_claim_answered_after_its_lease_does_not_run_the_body,
    a_resent_claim_recognised_as_ours_after_its_lease_does_not_run_the_body,
    slow_heartbeats_keep_a_live_lease,
    a_claim_whose_answer_never_came_is_released,
    a_value_nested_too_deep_to_read_back_is_final,
    a_u128_in_an_untagged_enum_is_final,
    a_lease_under_the_floor_is_refused,
    a_dropped_calls_release_does_not_lose_to_its_late_claim,
    a_claim_sent_after_its_deadline_was_set_ends_by_the_deadline,
);
