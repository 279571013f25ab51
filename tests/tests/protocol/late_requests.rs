//! Requests that land late or answer late: a dropped call's claim landing on a record that was
//! already there, a claim answered within the skew margin after its lease, a step's write applied
//! after a later one, a detached call's claim still on its way when the handle is drained. Each test names the scenario it proves, on both stores; the ones marked
//! `#[ignore = "reproduces: .."]` show defects still open (run them with `--ignored`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idempotent_runtime::store::conformance::{Delegating, Override};
use idempotent_runtime::store::{ClaimOutcome, ClaimRequest, Transition, WriteOutcome};
use idempotent_runtime::{Error, Idempotency, ManualClock, Store, StoreError};
use idempotent_tests::{
    AppError, Backend, ClaimAppliedLate, Forward, Harness, RequestCounter, Runs, backing,
};

const NS: &str = "late_requests::charge";

async fn charge(
    idem: &Idempotency,
    runs: &Runs,
    key: &str,
    lease: Duration,
) -> Result<usize, Error> {
    idem.operation(NS, key)
        .lease(lease)
        .run(|_| async {
            let run = runs.0.fetch_add(1, Ordering::SeqCst) + 1;
            Ok::<_, Error>(run)
        })
        .await
}

async fn declined(
    idem: &Idempotency,
    runs: &Runs,
    key: &str,
    lease: Duration,
) -> Result<usize, AppError> {
    idem.operation(NS, key)
        .lease(lease)
        .run(|_| async {
            runs.0.fetch_add(1, Ordering::SeqCst);
            Err::<usize, _>(AppError::Declined)
        })
        .await
}

/// The key holds an earlier attempt's FAILED record (its body returned an error; a retry is
/// expected). A retry's claim is slow to reach the store; the retry gives up at 50 ms (a client timeout)
/// and its release goes out. The release is refused (the record is neither absent nor PENDING under the
/// retry's token), so no tombstone is written; then the claim lands on the FAILED record, and the key is
/// held PENDING for a whole lease by a call that is gone. The promise: a drop before the body started
/// frees the key for a retry. The same scenario on an absent key is handled (the tombstone).
async fn a_dropped_retry_of_a_failed_key_frees_it(backend: Backend) {
    let store = backing(backend).await;
    let clock = ManualClock::starting_now();
    let direct = Idempotency::builder_arc(store.clone())
        .clock(clock.clone())
        .build();
    let runs = Runs::default();
    let lease = Duration::from_mins(1);
    // An earlier attempt failed: the key is FAILED, free for a retry.
    assert!(matches!(
        declined(&direct, &runs, "order-1", lease).await,
        Err(AppError::Declined)
    ));
    assert_eq!(runs.count(), 1);
    let late = Arc::new(Delegating::new(
        Forward(store.clone()),
        ClaimAppliedLate(Duration::from_millis(150)),
    ));
    let dropped = Idempotency::builder_arc(late).clock(clock.clone()).build();
    let gave_up = tokio::time::timeout(
        Duration::from_millis(50),
        charge(&dropped, &runs, "order-1", lease),
    )
    .await;
    assert!(gave_up.is_err(), "the caller gave up: {gave_up:?}");
    dropped.drain(Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let record = {
        let key = idempotent_runtime::derive_key(NS, "order-1").unwrap();
        store.get(&key).await.unwrap().unwrap()
    };
    let answer = charge(&direct, &runs, "order-1", lease).await;
    assert_eq!(
        answer.as_ref().ok(),
        Some(&2),
        "the key must be free after a dropped retry (record {:?} lease_until {:?}): got {answer:?}",
        record.status,
        record.lease_until_ms,
    );
}

/// The same, in another shape: the key holds a crashed call's lapsed claim. A caller finds it, sends its
/// takeover claim, which is slow to land, and gives up; its release is refused (the record is another
/// call's PENDING one), then its takeover lands and holds the key for another whole lease.
async fn a_dropped_takeover_frees_the_key(backend: Backend) {
    let store = backing(backend).await;
    let clock = ManualClock::starting_now();
    let direct = Idempotency::builder_arc(store.clone())
        .clock(clock.clone())
        .build();
    let runs = Runs::default();
    let lease = Duration::from_mins(1);
    // A worker claims and dies mid-body (its future is dropped while Running: the claim is kept).
    let crashed = tokio::time::timeout(
        Duration::from_millis(50),
        direct.operation(NS, "order-1").lease(lease).run(|_| async {
            std::future::pending::<()>().await;
            Ok::<usize, Error>(0)
        }),
    )
    .await;
    assert!(crashed.is_err());
    clock.advance(lease + Duration::from_secs(2));
    let late = Arc::new(Delegating::new(
        Forward(store.clone()),
        ClaimAppliedLate(Duration::from_millis(150)),
    ));
    let dropped = Idempotency::builder_arc(late).clock(clock.clone()).build();
    let gave_up = tokio::time::timeout(
        Duration::from_millis(50),
        charge(&dropped, &runs, "order-1", lease),
    )
    .await;
    assert!(gave_up.is_err(), "the caller gave up: {gave_up:?}");
    dropped.drain(Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answer = charge(&direct, &runs, "order-1", lease).await;
    assert_eq!(
        answer.as_ref().ok(),
        Some(&1),
        "the key must be free after a dropped takeover: got {answer:?}"
    );
}

/// Every claim and renewal lands, and its answer reaches the caller `late` later on the caller's clock.
#[derive(Debug)]
struct AlwaysLate {
    clock: ManualClock,
    late: Duration,
}

#[async_trait::async_trait]
impl Override<Forward> for AlwaysLate {
    fn kind(&self) -> &'static str {
        "always-late"
    }

    async fn claim(
        &self,
        inner: &Forward,
        request: &ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, StoreError> {
        let outcome = inner.claim(request).await?;
        self.clock.advance(self.late);
        Ok(outcome)
    }

    async fn transition(
        &self,
        inner: &Forward,
        transition: &Transition<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        let outcome = inner.transition(transition).await?;
        if matches!(
            transition.change,
            idempotent_runtime::store::Change::ExtendLease { .. }
        ) {
            self.clock.advance(self.late);
        }
        Ok(outcome)
    }
}

/// The first claim lands, and its answer reaches the caller `late` later on the caller's clock.
#[derive(Debug)]
struct LateAnswer {
    clock: ManualClock,
    late: Duration,
    first: AtomicBool,
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
        let outcome = inner.claim(request).await?;
        if self.first.swap(false, Ordering::SeqCst) {
            self.clock.advance(self.late);
        }
        Ok(outcome)
    }
}

/// A claim answered 2.5 s after it was sent on a 2 s lease, with the default 1 s skew margin, and
/// nobody else around: the call must not run on it, and renews it instead. A renewal by claim would be
/// judged at its clock less the margin, when the call's own live PENDING record is not claimable yet,
/// and refused by it on every attempt; the renewal is a fenced lease extension under the call's token,
/// which its own record accepts.
async fn a_claim_answered_just_after_its_lease_renews(backend: Backend) {
    let clock = ManualClock::starting_now();
    let late = Delegating::new(
        Forward(backing(backend).await),
        LateAnswer {
            clock: clock.clone(),
            late: Duration::from_millis(2_500),
            first: AtomicBool::new(true),
        },
    );
    let harness = Harness::over(Arc::new(late), RequestCounter::default(), |b| {
        b.clock(clock)
    });
    let runs = Runs::default();
    let answer = charge(&harness.idem, &runs, "order-1", Duration::from_secs(2)).await;
    harness.idem.drain(Duration::from_secs(10)).await;
    let record = harness.record(NS, "order-1").await;
    assert_eq!(
        answer.as_ref().ok(),
        Some(&1),
        "no one else took the key: the renewal must hold it and the body run; got {answer:?} (record: {:?})",
        record.map(|r| (r.status, r.attempt, r.error))
    );
    assert_eq!(runs.count(), 1);
}

/// Every answer (the claim's and each renewal's) comes after the lease it asked for: the call never
/// runs the body, and ends with `Contended`. Its last renewal may hold the key: it must be released,
/// so that the caller's own retry runs the body at once.
async fn a_call_that_gave_up_on_its_own_claim_releases_it(backend: Backend) {
    let clock = ManualClock::starting_now();
    let store = backing(backend).await;
    let late = Delegating::new(
        Forward(store.clone()),
        AlwaysLate {
            clock: clock.clone(),
            late: Duration::from_millis(2_500),
        },
    );
    let lease = Duration::from_secs(30);
    let giving_up = Idempotency::builder_arc(Arc::new(late))
        .clock(clock.clone())
        .build();
    let runs = Runs::default();
    // Every answer 2.5 s late on a 2 s lease.
    let first = charge(&giving_up, &runs, "order-1", Duration::from_secs(2)).await;
    assert!(matches!(first, Err(Error::Contended { .. })), "{first:?}");
    giving_up.drain(Duration::from_secs(10)).await;
    let direct = Idempotency::builder_arc(store).clock(clock).build();
    let retry = charge(&direct, &runs, "order-1", lease).await;
    assert_eq!(
        retry.as_ref().ok(),
        Some(&1),
        "the call gave up without running the body: its claim must be released, got {retry:?}"
    );
}

/// What the store answered the late copy of a step's write.
type LateOutcome = Arc<std::sync::Mutex<Option<Result<WriteOutcome, StoreError>>>>;

/// The first `SaveSteps` request times out at the caller (an `Unavailable` error, which the runtime
/// retries) but the store applies it `after` later, on a task of its own, whatever has happened since
/// (as `ClaimAppliedLate` models for claims), and keeps its answer in `outcome`. Every other request
/// goes straight through.
#[derive(Debug)]
struct FirstStepAppliedLate {
    after: Duration,
    first: AtomicBool,
    applied: Arc<tokio::sync::Notify>,
    outcome: LateOutcome,
}

#[async_trait::async_trait]
impl Override<Forward> for FirstStepAppliedLate {
    fn kind(&self) -> &'static str {
        "first-step-applied-late"
    }

    async fn transition(
        &self,
        inner: &Forward,
        transition: &Transition<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        if let idempotent_runtime::store::Change::SaveSteps { steps, previous } = transition.change
            && self.first.swap(false, Ordering::SeqCst)
        {
            let store = inner.0.clone();
            let (key, token, steps, previous) = (
                transition.key.to_owned(),
                transition.token.to_owned(),
                steps.to_vec(),
                previous.to_vec(),
            );
            let (after, applied, slot) = (self.after, self.applied.clone(), self.outcome.clone());
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                let late = Transition::new(
                    &key,
                    &token,
                    idempotent_runtime::store::Change::SaveSteps {
                        steps: &steps,
                        previous: &previous,
                    },
                );
                let outcome = store.transition(&late).await;
                *slot.lock().unwrap() = Some(outcome);
                applied.notify_one();
            });
            return Err(StoreError::Unavailable(
                "timed out; the request goes on".into(),
            ));
        }
        inner.transition(transition).await
    }
}

const STEPS_NS: &str = "late_requests::checkout";

async fn checkout(idem: &Idempotency, charges: &Runs, hang: bool) -> Result<String, AppError> {
    idem.operation(STEPS_NS, "order-1")
        .lease(Duration::from_secs(30))
        .steps()
        .run(|cx| async move {
            let (steps, ()) = cx.into_parts();
            let hold = steps
                .run("reserve", || async { Ok::<_, AppError>(17_u32) })
                .await?;
            let charge = steps
                .run("charge", || async {
                    let n = charges.0.fetch_add(1, Ordering::SeqCst) + 1;
                    Ok::<_, AppError>(format!("ch_{n}"))
                })
                .await?;
            steps
                .run("email", || async {
                    if hang {
                        std::future::pending::<()>().await;
                    }
                    Ok::<_, AppError>(())
                })
                .await?;
            Ok(format!("{hold}/{charge}"))
        })
        .await
}

/// A late copy of an earlier step's write never moves the record's steps back. The first `SaveSteps`
/// ("reserve") times out at the caller and is retried (it lands), "charge" runs and its write lands;
/// then the first request, still on its way, reaches the store. Were it applied (a plain `SET` under
/// the claim's token), the record would say only "reserve" is done, and once the worker dies in
/// "email", the next call would resume and run "charge" a second time. A step's write is made only on
/// the steps it extends: the late copy is refused, and the record still holds "charge".
async fn a_late_step_write_never_moves_steps_back(backend: Backend) {
    let store = backing(backend).await;
    let clock = ManualClock::starting_now();
    let applied = Arc::new(tokio::sync::Notify::new());
    let outcome = LateOutcome::default();
    let late = Arc::new(Delegating::new(
        Forward(store.clone()),
        FirstStepAppliedLate {
            after: Duration::from_millis(300),
            first: AtomicBool::new(true),
            applied: applied.clone(),
            outcome: outcome.clone(),
        },
    ));
    let worker = Idempotency::builder_arc(late).clock(clock.clone()).build();
    let charges = Runs::default();
    let crashed = tokio::time::timeout(Duration::from_secs(2), async {
        tokio::join!(checkout(&worker, &charges, true), applied.notified()).0
    })
    .await;
    assert!(
        crashed.is_err(),
        "the worker hangs in its last step: {crashed:?}"
    );
    assert_eq!(charges.count(), 1);
    let late_copy = outcome.lock().unwrap().take();
    let Some(Ok(WriteOutcome::Rejected(Some(record)))) = late_copy else {
        panic!("the late copy of the first step's write must be refused: {late_copy:?}");
    };
    let finished = record.steps_report().unwrap().unwrap().finished;
    assert_eq!(
        finished,
        ["charge", "reserve"],
        "refused by the later steps"
    );
    clock.advance(Duration::from_secs(32));
    let next = Idempotency::builder_arc(store).clock(clock).build();
    let resumed = checkout(&next, &charges, false).await;
    assert!(resumed.is_ok(), "{resumed:?}");
    assert_eq!(
        charges.count(),
        1,
        "\"charge\" had finished and its value was stored: the resume ran it again ({resumed:?})"
    );
}

/// Every `SaveSteps` request goes through, and a copy of it (the steps it extends, its own) is kept.
#[derive(Debug, Default)]
struct StepWrites(std::sync::Mutex<Vec<(Vec<u8>, Vec<u8>)>>);

#[async_trait::async_trait]
impl Override<Forward> for StepWrites {
    fn kind(&self) -> &'static str {
        "step-writes"
    }

    async fn transition(
        &self,
        inner: &Forward,
        transition: &Transition<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        if let idempotent_runtime::store::Change::SaveSteps { steps, previous } = transition.change
        {
            self.0
                .lock()
                .unwrap()
                .push((previous.to_vec(), steps.to_vec()));
        }
        inner.transition(transition).await
    }
}

/// An at-most-once step that returns `Err` clears the mark its start set: its second write undoes its
/// first. Were the steps after it the same bytes as before the mark, a late copy of the mark's write
/// (made on those steps) would land again, and the operation would be pinned on a step that said its
/// effect did not happen (every later call stopping with `StepInterrupted`). Each write's steps are
/// unlike every earlier one's, so the late copy is refused.
async fn a_late_copy_of_an_undone_step_mark_is_refused(backend: Backend) {
    let store = backing(backend).await;
    let writes = Arc::new(Delegating::new(
        Forward(store.clone()),
        StepWrites::default(),
    ));
    let idem = Idempotency::builder_arc(writes.clone()).build();
    let declined = tokio::time::timeout(
        Duration::from_millis(300),
        idem.operation(STEPS_NS, "order-2")
            .steps()
            .run(|cx| async move {
                let (steps, ()) = cx.into_parts();
                let sent = steps
                    .run_at_most_once("email", || async { Err::<(), _>(AppError::Declined) })
                    .await;
                assert!(matches!(sent, Err(AppError::Declined)), "{sent:?}");
                // The worker hangs: the record stays PENDING under its claim.
                std::future::pending::<()>().await;
                Ok::<u32, AppError>(0)
            }),
    )
    .await;
    assert!(declined.is_err(), "the worker hangs: {declined:?}");
    let sent = writes.with.0.lock().unwrap().clone();
    assert_eq!(sent.len(), 2, "the mark, and its removal");
    let (before, marked) = &sent[0];
    let key = idempotent_runtime::derive_key(STEPS_NS, "order-2").unwrap();
    let record = store.get(&key).await.unwrap().unwrap();
    let late = Transition::new(
        &key,
        &record.token,
        idempotent_runtime::store::Change::SaveSteps {
            steps: marked,
            previous: before,
        },
    );
    let outcome = store.transition(&late).await.unwrap();
    assert_eq!(
        outcome,
        WriteOutcome::Rejected(Some(record.clone())),
        "the mark's late copy"
    );
    let report = store.get(&key).await.unwrap().unwrap().steps_report();
    assert_eq!(
        report.unwrap().unwrap().interrupted,
        Vec::<String>::new(),
        "the step is not marked as interrupted"
    );
}

/// Every claim reaches the store `after` it was sent.
#[derive(Debug)]
struct SlowClaims(Duration);

#[async_trait::async_trait]
impl Override<Forward> for SlowClaims {
    fn kind(&self) -> &'static str {
        "slow-claims"
    }

    async fn claim(
        &self,
        inner: &Forward,
        request: &ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, StoreError> {
        tokio::time::sleep(self.0).await;
        inner.claim(request).await
    }
}

/// A graceful shutdown drains the handle while a detached call's claim is still on its way (the call
/// has started; its body has not). `drain` must wait for that call too: its body starts once the claim
/// lands, and a process that exits after `drain` returned would cut it off mid-way, leaving the key
/// PENDING for a lease (and the body to run again for the next caller). So when `drain` returns 0, the
/// body has run and its outcome is stored.
async fn drain_waits_for_a_detached_call_whose_claim_is_in_flight(backend: Backend) {
    let store = backing(backend).await;
    let slow = Arc::new(Delegating::new(
        Forward(store.clone()),
        SlowClaims(Duration::from_millis(300)),
    ));
    let idem = Idempotency::builder_arc(slow).build();
    let (runs, finished) = (Runs::default(), Arc::new(AtomicBool::new(false)));
    let call = {
        let (idem, runs, finished) = (idem.clone(), runs.clone(), finished.clone());
        tokio::spawn(async move {
            idem.operation(NS, "order-1")
                .detach()
                .run(move |_| async move {
                    runs.0.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    finished.store(true, Ordering::SeqCst);
                    Ok::<_, Error>(7_u32)
                })
                .await
        })
    };
    // The call has sent its claim, which is still on its way.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(runs.count(), 0, "the claim has not landed yet");
    let left = idem.drain(Duration::from_secs(10)).await;
    let (ran, done) = (runs.count(), finished.load(Ordering::SeqCst));
    let record = {
        let key = idempotent_runtime::derive_key(NS, "order-1").unwrap();
        store.get(&key).await.unwrap()
    };
    assert_eq!(
        (left, ran, done),
        (0, 1, true),
        "drain returned {left} with the detached call's body run {ran} times, finished: {done} \
         (record {:?})",
        record.as_ref().map(|r| r.status)
    );
    assert_eq!(
        record.map(|r| r.status),
        Some(idempotent_runtime::Status::Completed)
    );
    assert_eq!(call.await.unwrap().unwrap(), 7);
}

idempotent_tests::on_both_stores!(
    a_dropped_retry_of_a_failed_key_frees_it,
    a_dropped_takeover_frees_the_key,
    a_late_step_write_never_moves_steps_back,
    a_claim_answered_just_after_its_lease_renews,
    a_call_that_gave_up_on_its_own_claim_releases_it,
    drain_waits_for_a_detached_call_whose_claim_is_in_flight,
    a_late_copy_of_an_undone_step_mark_is_refused,
);
