//! Steps (`Operation::steps`) under attack: sequences that try to make a finished step run its
//! effect again, an at-most-once step run twice, or `Steps::key` change within one operation. Each
//! asserts how often each step's effect ran and what the record holds.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use idempotent_runtime::store::conformance::{Delegating, Override};
use idempotent_runtime::store::{
    Change, ClaimOutcome, ClaimRequest, StepsClaim, Transition, WriteOutcome,
};
use idempotent_runtime::{Clock as _, Error, MemoryStore, Operation, Status, Store, StoreError};
use idempotent_tests::{AppError, Backend, Effects, Harness, RequestCounter};
use tokio::sync::Notify;

const NAMESPACE: &str = "steps-attack::checkout";
const LEASE: Duration = Duration::from_secs(30);
/// Longer than the lease and the clock-skew margin: a lease taken at the start has lapsed.
const PAST_THE_LEASE: Duration = Duration::from_mins(2);
const FAILED_TTL: Duration = Duration::from_mins(5);

/// The operation of `order`, with the restart policy when `restart`.
fn operation<'a>(harness: &'a Harness, order: &str, restart: bool) -> Operation<'a> {
    let operation = harness.idem.operation(NAMESPACE, order).lease(LEASE);
    if restart {
        operation.restart_steps_after_failure()
    } else {
        operation
    }
}

/// How the checkout's "charge" step behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Charge {
    /// Succeeds.
    Succeeds,
    /// Never finishes: the call is dropped there (a crash after the reserve).
    Hangs,
}

/// A two-step checkout: "reserve" then "charge", each effect counted and each step's
/// `Steps::key` recorded; `then_fail`: the body returns its own `Err` after both steps.
async fn checkout(
    harness: &Harness,
    order: &str,
    restart: bool,
    effects: &Arc<Effects>,
    charge: Charge,
    then_fail: bool,
) -> Result<(u32, String), AppError> {
    operation(harness, order, restart)
        .steps()
        .run(|cx| async move {
            let (steps, ()) = cx.into_parts();
            effects.keyed("reserve", steps.key("reserve"));
            let hold = steps
                .run("reserve", || async {
                    effects.happened("reserve");
                    Ok::<_, AppError>(17_u32)
                })
                .await?;
            let key = steps.key("charge");
            effects.keyed("charge", key.clone());
            let id = steps
                .run("charge", || async {
                    if charge == Charge::Hangs {
                        std::future::pending::<()>().await;
                    }
                    effects.happened("charge");
                    Ok::<_, AppError>(format!("ch_{}", &key[..8]))
                })
                .await?;
            if then_fail {
                return Err(AppError::Declined);
            }
            Ok((hold, id))
        })
        .await
}

/// The checkout crashes in its charge, after its reserve was stored, and its lease lapses.
async fn crash_after_reserve(
    harness: &Harness,
    order: &str,
    restart: bool,
    effects: &Arc<Effects>,
) {
    let call = checkout(harness, order, restart, effects, Charge::Hangs, false);
    assert!(
        tokio::time::timeout(Duration::from_secs(2), call)
            .await
            .is_err(),
        "the charge hangs"
    );
    assert_eq!(effects.checkout().0, 1, "the reserve ran");
    harness.clock.advance(PAST_THE_LEASE);
}

/// The stored step names of `order`'s record: finished, not stored, interrupted.
async fn report(harness: &Harness, order: &str) -> (Status, Vec<String>, Vec<String>) {
    let record = harness.record(NAMESPACE, order).await.expect("the record");
    let report = record.steps_report().expect("steps").expect("steps decode");
    let not_stored = report.not_stored.into_iter().map(|(n, _)| n).collect();
    (record.status, report.finished, not_stored)
}

/// A call of code without steps on `order` (an older deploy, a job using `run`) while its operation
/// with steps lives on: refused with `StepsHeld`, its body never run, the record left as it was.
async fn refused_without_steps(
    harness: &Harness,
    order: &str,
    body: fn() -> Result<u32, AppError>,
) {
    let before = harness.record(NAMESPACE, order).await.expect("the record");
    let ran = AtomicBool::new(false);
    let plain = operation(harness, order, false)
        .run(|_| async {
            ran.store(true, Ordering::SeqCst);
            body()
        })
        .await;
    let err = idempotent_tests::idem_error(plain);
    assert!(matches!(err, Error::StepsHeld { .. }), "{err:?}");
    assert!(!ran.load(Ordering::SeqCst), "the body without steps ran");
    assert_eq!(
        harness.record(NAMESPACE, order).await.expect("the record"),
        before,
        "the refused call changed the record"
    );
}

/// A body without steps that fails.
fn declined() -> Result<u32, AppError> {
    Err(AppError::Declined)
}

async fn memory_harness() -> Harness {
    harness_on(Backend::Memory).await
}

async fn harness_on(backend: Backend) -> Harness {
    Harness::with(backend, |b| b.failed_ttl(FAILED_TTL)).await
}

/// Code without steps (an older deploy, a batch job using `run`) comes to a key whose operation
/// crashed after a finished step. Were it to take the key over, its body would run the finished
/// "reserve" again; and its failure, read by the restart policy as the steps body's own `Err`, would
/// start the operation over and run it a third time, with a new `Steps::key`. It is refused
/// (`StepsHeld`) and its body never runs; the next call with steps resumes.
#[tokio::test]
async fn a_failure_by_code_without_steps_does_not_restart_finished_steps() {
    a_failure_by_code_without_steps_does_not_restart_finished_steps_on(Backend::Memory).await;
}

/// [`a_failure_by_code_without_steps_does_not_restart_finished_steps`] on DynamoDB Local.
#[tokio::test]
async fn a_failure_by_code_without_steps_does_not_restart_finished_steps_on_dynamodb() {
    a_failure_by_code_without_steps_does_not_restart_finished_steps_on(Backend::DynamoDb).await;
}

async fn a_failure_by_code_without_steps_does_not_restart_finished_steps_on(backend: Backend) {
    let harness = harness_on(backend).await;
    let effects = Arc::new(Effects::default());
    crash_after_reserve(&harness, "order-1", true, &effects).await;

    refused_without_steps(&harness, "order-1", declined).await;
    let (status, finished, _) = report(&harness, "order-1").await;
    assert_eq!(status, Status::Pending);
    assert_eq!(
        finished,
        ["reserve"],
        "the steps survive the call without steps"
    );

    let receipt = checkout(&harness, "order-1", true, &effects, Charge::Succeeds, false)
        .await
        .unwrap();
    assert_eq!(receipt.0, 17);
    assert_eq!(
        effects.checkout(),
        (1, 1, 0),
        "the finished reserve ran again although no steps body failed"
    );
    let keys = effects.keys("reserve");
    assert_eq!(keys[0], keys[keys.len() - 1], "steps.key changed");
}

/// Holds back the answer to claims made without steps (`StepsClaim::Untouched`) that landed, while
/// `hold` is on: the call is still waiting on its claim when it is dropped.
#[derive(Debug, Default)]
struct HoldPlainClaims {
    hold: AtomicBool,
    landed: Notify,
}

#[async_trait::async_trait]
impl<S: Store> Override<S> for HoldPlainClaims {
    fn kind(&self) -> &'static str {
        "hold-plain-claims"
    }

    async fn claim(
        &self,
        inner: &S,
        request: &ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, StoreError> {
        let outcome = inner.claim(request).await?;
        if self.hold.load(Ordering::SeqCst)
            && request.steps == StepsClaim::Untouched
            && outcome == ClaimOutcome::Claimed
        {
            self.landed.notify_one();
            std::future::pending::<()>().await;
        }
        Ok(outcome)
    }
}

/// A call of code without steps comes to a lapsed key whose operation holds a finished step, its
/// claim's answer to be held back should it land, so that the call is dropped with it on its way (a
/// client that hung up) and releases it: a FAILED record (`released: ..`) that the restart policy
/// would read as a failure, running the finished "reserve" again. The claim never lands (the store
/// refuses a claim without steps on live steps), the call gets `StepsHeld`, and nothing is released.
#[tokio::test]
async fn a_dropped_claim_by_code_without_steps_does_not_restart_finished_steps() {
    a_dropped_claim_by_code_without_steps_does_not_restart_finished_steps_on(MemoryStore::new())
        .await;
}

/// [`a_dropped_claim_by_code_without_steps_does_not_restart_finished_steps`] on DynamoDB Local.
#[tokio::test]
async fn a_dropped_claim_by_code_without_steps_does_not_restart_finished_steps_on_dynamodb() {
    a_dropped_claim_by_code_without_steps_does_not_restart_finished_steps_on(
        idempotent_tests::dynamodb_store().await.0,
    )
    .await;
}

async fn a_dropped_claim_by_code_without_steps_does_not_restart_finished_steps_on<S: Store>(
    inner: S,
) {
    let store = Arc::new(Delegating::new(inner, HoldPlainClaims::default()));
    let harness = Harness::over(store.clone(), RequestCounter::default(), |b| {
        b.failed_ttl(FAILED_TTL)
    });
    let effects = Arc::new(Effects::default());
    crash_after_reserve(&harness, "order-1", true, &effects).await;

    store.with.hold.store(true, Ordering::SeqCst);
    let plain = operation(&harness, "order-1", false).run(|_| async { Ok::<_, AppError>(1_u32) });
    tokio::select! {
        plain = plain => {
            let err = idempotent_tests::idem_error(plain);
            assert!(matches!(err, Error::StepsHeld { .. }), "{err:?}");
        }
        () = store.with.landed.notified() => panic!("a claim without steps landed on live steps"),
    }
    store.with.hold.store(false, Ordering::SeqCst);
    assert_eq!(harness.idem.drain(Duration::from_secs(5)).await, 0);
    let (status, finished, _) = report(&harness, "order-1").await;
    assert_eq!(
        (status, finished),
        (Status::Pending, vec!["reserve".to_owned()]),
        "nothing released, steps kept"
    );

    checkout(&harness, "order-1", true, &effects, Charge::Succeeds, false)
        .await
        .unwrap();
    assert_eq!(
        effects.checkout(),
        (1, 1, 0),
        "the finished reserve ran again after a mere dropped call"
    );
}

/// Without the restart policy: an operation crashes after its reserve; code without steps comes to
/// the key. Had it taken the key over and failed, its failure (written with `failed_ttl`: it knows
/// no steps) would cut the record's life, steps and all, from the operation's `ttl` to
/// `failed_ttl`, and a retry after `failed_ttl` (well within the `ttl`, "the next morning") would
/// start a new operation, running the finished reserve again under new `Steps::key`s. It is
/// refused, and the steps live for the `ttl`.
#[tokio::test]
async fn a_failure_by_code_without_steps_keeps_the_steps_for_the_ttl() {
    a_failure_by_code_without_steps_keeps_the_steps_for_the_ttl_on(Backend::Memory).await;
}

/// [`a_failure_by_code_without_steps_keeps_the_steps_for_the_ttl`] on DynamoDB Local.
#[tokio::test]
async fn a_failure_by_code_without_steps_keeps_the_steps_for_the_ttl_on_dynamodb() {
    a_failure_by_code_without_steps_keeps_the_steps_for_the_ttl_on(Backend::DynamoDb).await;
}

async fn a_failure_by_code_without_steps_keeps_the_steps_for_the_ttl_on(backend: Backend) {
    let harness = harness_on(backend).await;
    let effects = Arc::new(Effects::default());
    crash_after_reserve(&harness, "order-1", false, &effects).await;

    refused_without_steps(&harness, "order-1", declined).await;
    harness.clock.advance(FAILED_TTL + Duration::from_mins(1));

    checkout(
        &harness,
        "order-1",
        false,
        &effects,
        Charge::Succeeds,
        false,
    )
    .await
    .unwrap();
    assert_eq!(
        effects.checkout(),
        (1, 1, 0),
        "the finished reserve ran again within the operation's ttl"
    );
    let keys = effects.keys("charge");
    assert_eq!(keys[0], keys[1], "steps.key changed within the ttl");
}

/// A body that panics.
fn explode() -> Result<u32, AppError> {
    panic!("boom")
}

/// Code without steps whose body would panic comes to the lapsed key: refused, its body never runs,
/// and the restart policy resumes.
#[tokio::test]
async fn a_panic_by_code_without_steps_resumes_the_steps() {
    let harness = memory_harness().await;
    let effects = Arc::new(Effects::default());
    crash_after_reserve(&harness, "order-1", true, &effects).await;

    refused_without_steps(&harness, "order-1", explode).await;

    checkout(&harness, "order-1", true, &effects, Charge::Succeeds, false)
        .await
        .unwrap();
    assert_eq!(effects.checkout(), (1, 1, 0));
}

/// An operator's `key release` of a crashed operation with steps, after code without steps was
/// refused on it: the lease lapses, the record stays PENDING with its steps, and the operation
/// resumes even under the restart policy.
#[tokio::test]
async fn an_operator_release_of_a_plain_claim_keeps_the_steps() {
    let harness = memory_harness().await;
    let effects = Arc::new(Effects::default());
    crash_after_reserve(&harness, "order-1", true, &effects).await;

    // Code without steps would take over and crash in turn: refused.
    refused_without_steps(&harness, "order-1", declined).await;
    let record = harness.record(NAMESPACE, "order-1").await.unwrap();
    let released =
        idempotent_runtime::admin::release(harness.store.as_ref(), &record, harness.clock.now_ms())
            .await
            .unwrap();
    assert!(matches!(
        released,
        idempotent_runtime::admin::Released::Lapsed
    ));

    checkout(&harness, "order-1", true, &effects, Charge::Succeeds, false)
        .await
        .unwrap();
    assert_eq!(effects.checkout(), (1, 1, 0));
    let keys = effects.keys("reserve");
    assert!(keys.windows(2).all(|w| w[0] == w[1]), "one steps.key");
}

/// An at-most-once step dropped mid-step, then every kind of retry: a takeover, the body's `Err`
/// under the restart policy, code without steps failing. The step's effect happened once, and every
/// call with steps stops at it with `StepInterrupted`.
#[tokio::test]
async fn an_interrupted_at_most_once_step_never_runs_again() {
    let harness = memory_harness().await;
    let sent = Arc::new(AtomicUsize::new(0));
    let email = |hang: bool| {
        let sent = sent.clone();
        operation(&harness, "order-1", true)
            .steps()
            .run(move |cx| async move {
                let (steps, ()) = cx.into_parts();
                steps
                    .run_at_most_once("email", || async {
                        sent.fetch_add(1, Ordering::SeqCst);
                        if hang {
                            std::future::pending::<()>().await;
                        }
                        Ok::<_, AppError>(250_u32)
                    })
                    .await
            })
    };
    assert!(
        tokio::time::timeout(Duration::from_millis(100), email(true))
            .await
            .is_err()
    );
    harness.clock.advance(PAST_THE_LEASE);
    for _ in 0..2 {
        let err = idempotent_tests::idem_error(email(false).await);
        assert!(matches!(err, Error::StepInterrupted { .. }), "{err:?}");
    }
    // Code without steps is refused on the key: still pinned.
    refused_without_steps(&harness, "order-1", declined).await;
    let err = idempotent_tests::idem_error(email(false).await);
    assert!(matches!(err, Error::StepInterrupted { .. }), "{err:?}");
    assert_eq!(sent.load(Ordering::SeqCst), 1, "the email went out once");
    let record = harness.record(NAMESPACE, "order-1").await.unwrap();
    let report = record.steps_report().unwrap().unwrap();
    assert_eq!(report.interrupted, ["email"]);
}

/// A step whose value is too large for the record, under the restart policy, with the body then
/// failing: the operation is pinned, never restarted, and the step's effect happened once.
#[tokio::test]
async fn an_unstorable_step_is_never_run_again_even_under_restart() {
    let harness = memory_harness().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let call = || {
        let runs = runs.clone();
        operation(&harness, "order-1", true)
            .steps()
            .run(move |cx| async move {
                let (steps, ()) = cx.into_parts();
                steps
                    .run("export", || async {
                        runs.fetch_add(1, Ordering::SeqCst);
                        // Random hex does not compress below the record's 400 KB.
                        let big: String = (0..60_000)
                            .map(|_| uuid::Uuid::new_v4().simple().to_string())
                            .collect();
                        Ok::<_, AppError>(big)
                    })
                    .await
                    .map(|s| s.len())
            })
    };
    let err = idempotent_tests::idem_error(call().await);
    assert!(matches!(err, Error::StepTooLarge { .. }), "{err:?}");
    for _ in 0..2 {
        let err = idempotent_tests::idem_error(call().await);
        assert!(matches!(err, Error::StepNotStored { .. }), "{err:?}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let (status, _, not_stored) = report(&harness, "order-1").await;
    assert_eq!(
        (status, not_stored),
        (Status::Failed, vec!["export".to_owned()])
    );
}

/// A step write held back: key, token, the steps it extends, the steps it stores.
type HeldWrite = (String, String, Vec<u8>, Vec<u8>);

/// Loses answers to step writes: the first `SaveSteps` of each step lands, but its answer is an
/// `Unavailable` (the SDK would resend it); with `late`, the first copy of a step write does not land
/// at first, the resent copy does, and the first copy is delivered after everything else.
#[derive(Debug, Default)]
struct LosesStepAnswers {
    late: bool,
    seen: AtomicUsize,
    /// The late first copy: (key, token, previous, steps).
    held: std::sync::Mutex<Option<HeldWrite>>,
}

#[async_trait::async_trait]
impl Override<MemoryStore> for LosesStepAnswers {
    fn kind(&self) -> &'static str {
        "loses-step-answers"
    }

    async fn transition(
        &self,
        inner: &MemoryStore,
        transition: &Transition<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        let Change::SaveSteps { steps, previous } = transition.change else {
            return inner.transition(transition).await;
        };
        let seen = self.seen.fetch_add(1, Ordering::SeqCst);
        if self.late {
            // Only the very first step write is late: held back, its resent copy goes through.
            if seen > 0 {
                return inner.transition(transition).await;
            }
            *self.held.lock().unwrap() = Some((
                transition.key.to_owned(),
                transition.token.to_owned(),
                previous.to_vec(),
                steps.to_vec(),
            ));
        } else {
            // Every other step write is a first copy: it lands, its answer is lost.
            if seen % 2 == 1 {
                return inner.transition(transition).await;
            }
            inner.transition(transition).await?;
        }
        Err(StoreError::Unavailable("answer lost".into()))
    }
}

/// Every step write's first answer is lost (it landed): the call recognises its own write, goes on,
/// and then crashes in a later step; the takeover replays both finished steps.
#[tokio::test]
async fn lost_answers_to_step_writes_do_not_run_steps_again() {
    let store = Arc::new(Delegating::new(
        MemoryStore::new(),
        LosesStepAnswers::default(),
    ));
    let harness = Harness::over(store.clone(), RequestCounter::default(), |b| b);
    let effects = Arc::new(Effects::default());
    let three = |hang: bool| {
        let effects = effects.clone();
        operation(&harness, "order-1", false)
            .steps()
            .run(move |cx| async move {
                let (steps, ()) = cx.into_parts();
                steps
                    .run("reserve", || async {
                        effects.happened("reserve");
                        Ok::<_, AppError>(1_u32)
                    })
                    .await?;
                steps
                    .run("charge", || async {
                        effects.happened("charge");
                        Ok::<_, AppError>(2_u32)
                    })
                    .await?;
                steps
                    .run("email", || async {
                        if hang {
                            std::future::pending::<()>().await;
                        }
                        effects.happened("email");
                        Ok::<_, AppError>(3_u32)
                    })
                    .await
            })
    };
    assert!(
        tokio::time::timeout(Duration::from_secs(2), three(true))
            .await
            .is_err()
    );
    assert_eq!(effects.checkout(), (1, 1, 0));
    harness.clock.advance(PAST_THE_LEASE);
    assert_eq!(three(false).await.unwrap(), 3);
    assert_eq!(effects.checkout(), (1, 1, 1));
}

/// The first copy of the reserve's write is late: the resent copy lands, the call crashes in the
/// charge and its lease lapses, and then the first copy lands. It must be refused (the steps it
/// extends are gone), and the takeover runs no finished step again.
#[tokio::test]
async fn a_late_first_copy_of_a_step_write_is_refused() {
    let store = Arc::new(Delegating::new(
        MemoryStore::new(),
        LosesStepAnswers {
            late: true,
            ..LosesStepAnswers::default()
        },
    ));
    let harness = Harness::over(store.clone(), RequestCounter::default(), |b| b);
    let effects = Arc::new(Effects::default());
    crash_after_reserve(&harness, "order-1", false, &effects).await;
    let before = harness.record(NAMESPACE, "order-1").await.unwrap();

    let (key, token, previous, steps) = store.with.held.lock().unwrap().take().unwrap();
    let late = Transition::new(
        &key,
        &token,
        Change::SaveSteps {
            steps: &steps,
            previous: &previous,
        },
    );
    let outcome = store.inner.transition(&late).await.unwrap();
    assert!(matches!(outcome, WriteOutcome::Rejected(_)));
    let after = harness.record(NAMESPACE, "order-1").await.unwrap();
    assert_eq!(before.steps, after.steps, "the late copy changed nothing");

    checkout(
        &harness,
        "order-1",
        false,
        &effects,
        Charge::Succeeds,
        false,
    )
    .await
    .unwrap();
    assert_eq!(effects.checkout(), (1, 1, 0));
}

/// `Steps::key` across one operation's runs: a crash, the body's `Err` and a resume all give the
/// same keys; the restart policy after the body's `Err` gives new ones; after expiry, new ones.
#[tokio::test]
async fn steps_key_is_stable_within_an_operation_and_new_after_expiry() {
    let harness = Harness::with(Backend::Memory, |b| {
        b.failed_ttl(FAILED_TTL)
            .default_ttl(Duration::from_hours(1))
    })
    .await;
    let effects = Arc::new(Effects::default());
    crash_after_reserve(&harness, "order-1", false, &effects).await;
    let failed = checkout(&harness, "order-1", false, &effects, Charge::Succeeds, true).await;
    assert!(matches!(failed, Err(AppError::Declined)));
    let receipt = checkout(
        &harness,
        "order-1",
        false,
        &effects,
        Charge::Succeeds,
        false,
    )
    .await
    .unwrap();
    assert_eq!(effects.checkout(), (1, 1, 0));
    let keys = effects.keys("charge");
    assert_eq!(keys.len(), 3);
    assert!(keys.windows(2).all(|w| w[0] == w[1]), "{keys:?}");
    assert_eq!(receipt.1, format!("ch_{}", &keys[0][..8]));

    // Expired: a new operation with new keys.
    harness.clock.advance(Duration::from_hours(2));
    checkout(
        &harness,
        "order-1",
        false,
        &effects,
        Charge::Succeeds,
        false,
    )
    .await
    .unwrap();
    let keys = effects.keys("charge");
    assert_ne!(keys[2], keys[3]);
    assert_eq!(effects.checkout(), (2, 2, 0));
}

/// A claim that starts over after a failure (`StepsClaim::Fresh` with `restarts`), as sent: what a
/// late copy of it carries.
#[derive(Debug, Clone)]
struct SentClaim {
    key: String,
    token: String,
    attempt: u32,
    now_ms: u64,
    lease_until_ms: u64,
    expires_at_s: u64,
    fingerprint: Option<String>,
    initial: Vec<u8>,
    restarts: Vec<u8>,
}

/// Forwards every request, and keeps a copy of the first claim that restarts after a failure: the
/// copy the SDK sent first, delayed in the network, while its resent copy landed.
#[derive(Debug, Default)]
struct DelaysRestartClaims {
    first: std::sync::Mutex<Option<SentClaim>>,
}

#[async_trait::async_trait]
impl Override<MemoryStore> for DelaysRestartClaims {
    fn kind(&self) -> &'static str {
        "delays-restart-claims"
    }

    async fn claim(
        &self,
        inner: &MemoryStore,
        request: &ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, StoreError> {
        if let StepsClaim::Fresh {
            initial,
            restarts: Some(restarts),
        } = request.steps
        {
            self.first.lock().unwrap().get_or_insert_with(|| SentClaim {
                key: request.key.to_owned(),
                token: request.token.to_owned(),
                attempt: request.attempt,
                now_ms: request.now_ms,
                lease_until_ms: request.lease_until_ms,
                expires_at_s: request.expires_at_s,
                fingerprint: request.fingerprint.map(str::to_owned),
                initial: initial.to_vec(),
                restarts: restarts.to_vec(),
            });
        }
        inner.claim(request).await
    }
}

/// A body of a reserve and an at-most-once email, each effect counted: `fail`, the body returns its
/// own `Err` after the reserve; `panic`, the email panics after its effect.
async fn reserve_and_email(
    harness: Harness,
    effects: Arc<Effects>,
    fail: bool,
    panic: bool,
) -> Result<u32, AppError> {
    operation(&harness, "order-1", true)
        .steps()
        .run(|cx| async move {
            let (steps, ()) = cx.into_parts();
            let hold = steps
                .run("reserve", || async {
                    effects.happened("reserve");
                    Ok::<_, AppError>(17_u32)
                })
                .await?;
            if fail {
                return Err(AppError::Declined);
            }
            steps
                .run_at_most_once("email", || async {
                    effects.happened("email");
                    if panic {
                        return explode();
                    }
                    Ok::<_, AppError>(250_u32)
                })
                .await?;
            Ok(hold)
        })
        .await
}

/// Under the restart policy, the body fails after its reserve (FAILED: the next call starts over).
/// The next call's claim that starts over is sent twice by the SDK: the first copy is delayed, the
/// resent one lands. That call runs the reserve again (as the policy says) and then its at-most-once
/// email, which panics after its effect: FAILED `panicked: ..`, the email marked interrupted, the
/// operation pinned. Then the delayed first copy of the restart claim lands. It must be refused (the
/// record is its own call's failure), leaving the steps as they were.
#[tokio::test]
async fn a_late_copy_of_a_restart_claim_does_not_wipe_the_steps() {
    let store = Arc::new(Delegating::new(
        MemoryStore::new(),
        DelaysRestartClaims::default(),
    ));
    let harness = Harness::over(store.clone(), RequestCounter::default(), |b| b);
    let effects = Arc::new(Effects::default());

    let failed = reserve_and_email(harness.clone(), effects.clone(), true, false).await;
    assert!(matches!(failed, Err(AppError::Declined)));
    let panicked = tokio::spawn(reserve_and_email(
        harness.clone(),
        effects.clone(),
        false,
        true,
    ))
    .await;
    assert!(panicked.unwrap_err().is_panic());
    assert_eq!(
        effects.checkout(),
        (2, 0, 1),
        "restarted once, emailed once"
    );
    let record = harness.record(NAMESPACE, "order-1").await.unwrap();
    assert_eq!(record.status, Status::Failed);
    assert_eq!(
        record.steps_report().unwrap().unwrap().interrupted,
        ["email"]
    );

    // The delayed first copy of the restart claim lands.
    let landed = deliver_late_restart_claim(&store).await;
    let record = harness.record(NAMESPACE, "order-1").await.unwrap();
    let report = record.steps_report().unwrap().unwrap();
    assert!(
        matches!(landed, ClaimOutcome::Existing(_)),
        "the late copy is refused: {landed:?}"
    );
    assert_eq!(
        (record.status, report.interrupted),
        (Status::Failed, vec!["email".to_owned()])
    );
}

/// Delivers the delayed first copy of the restart claim `store` kept.
async fn deliver_late_restart_claim(
    store: &Delegating<MemoryStore, DelaysRestartClaims>,
) -> ClaimOutcome {
    let sent = store
        .with
        .first
        .lock()
        .unwrap()
        .clone()
        .expect("a restart claim");
    let mut late = ClaimRequest::new(
        &sent.key,
        &sent.token,
        sent.now_ms,
        sent.lease_until_ms,
        sent.expires_at_s,
    );
    late.attempt = sent.attempt;
    late.fingerprint = sent.fingerprint.as_deref();
    late.steps = StepsClaim::Fresh {
        initial: &sent.initial,
        restarts: Some(&sent.restarts),
    };
    store.inner.claim(&late).await.unwrap()
}

/// The same late copy, followed through: the next call after its lease still stops at the email.
#[tokio::test]
async fn a_late_copy_of_a_restart_claim_never_runs_an_interrupted_step_again() {
    let store = Arc::new(Delegating::new(
        MemoryStore::new(),
        DelaysRestartClaims::default(),
    ));
    let harness = Harness::over(store.clone(), RequestCounter::default(), |b| b);
    let effects = Arc::new(Effects::default());
    let failed = reserve_and_email(harness.clone(), effects.clone(), true, false).await;
    assert!(matches!(failed, Err(AppError::Declined)));
    let panicked = tokio::spawn(reserve_and_email(
        harness.clone(),
        effects.clone(),
        false,
        true,
    ))
    .await;
    assert!(panicked.unwrap_err().is_panic());

    deliver_late_restart_claim(&store).await;
    harness.clock.advance(PAST_THE_LEASE);

    let third = reserve_and_email(harness.clone(), effects.clone(), false, false).await;
    let err = idempotent_tests::idem_error(third);
    assert!(matches!(err, Error::StepInterrupted { .. }), "{err:?}");
    assert_eq!(effects.checkout(), (2, 0, 1), "the email went out once");
}

/// As above, but another call fails on the key before the delayed copy lands. Under the restart
/// policy the body fails after its reserve (call 1); call 2's claim that starts over is sent twice,
/// its first copy delayed; call 2 runs the reserve again, then its at-most-once email panics after
/// its effect (FAILED `panicked`, the email marked interrupted: the operation is pinned). Call 3
/// resumes and stops at the email with `StepInterrupted` (FAILED again, now under call 3's token).
/// Now call 2's delayed restart claim lands: the record is FAILED under another token, and a
/// restart claim may take a FAILED record, so it claims the key and replaces the steps with an empty
/// start, wiping the interrupted mark. Once its lease lapses, call 4 finds no finished step: the
/// reserve runs a third time and the at-most-once email a second time.
#[tokio::test]
async fn a_late_copy_of_a_restart_claim_after_another_failure_keeps_the_pin() {
    let store = Arc::new(Delegating::new(
        MemoryStore::new(),
        DelaysRestartClaims::default(),
    ));
    let harness = Harness::over(store.clone(), RequestCounter::default(), |b| b);
    let effects = Arc::new(Effects::default());
    let failed = reserve_and_email(harness.clone(), effects.clone(), true, false).await;
    assert!(matches!(failed, Err(AppError::Declined)));
    let panicked = tokio::spawn(reserve_and_email(
        harness.clone(),
        effects.clone(),
        false,
        true,
    ))
    .await;
    assert!(panicked.unwrap_err().is_panic());
    let third = reserve_and_email(harness.clone(), effects.clone(), false, false).await;
    let err = idempotent_tests::idem_error(third);
    assert!(matches!(err, Error::StepInterrupted { .. }), "{err:?}");
    assert_eq!(effects.checkout(), (2, 0, 1));

    let landed = deliver_late_restart_claim(&store).await;
    harness.clock.advance(PAST_THE_LEASE);
    let fourth = reserve_and_email(harness.clone(), effects.clone(), false, false).await;
    assert_eq!(
        effects.checkout(),
        (2, 0, 1),
        "the email went out once (the late claim {landed:?}; call 4 got {fourth:?})"
    );
    assert!(matches!(landed, ClaimOutcome::Existing(_)), "{landed:?}");
    let err = idempotent_tests::idem_error(fourth);
    assert!(matches!(err, Error::StepInterrupted { .. }), "{err:?}");
}

/// `len` characters that compress poorly (a fixed pseudo-random sequence over 64 letters).
fn incompressible(len: usize) -> String {
    const LETTERS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            char::from(LETTERS[usize::try_from(state >> 58).unwrap()])
        })
        .collect()
}

/// A body of a "fill" step returning `fill` characters and an "export" step returning `export`
/// characters, the export's runs counted.
async fn fill_and_export(
    harness: &Harness,
    order: &str,
    fill: usize,
    export: usize,
    exports: &AtomicUsize,
) -> Result<usize, AppError> {
    operation(harness, order, false)
        .steps()
        .run(|cx| async move {
            let (steps, ()) = cx.into_parts();
            let a = steps
                .run("fill", || async { Ok::<_, AppError>(incompressible(fill)) })
                .await?;
            let b = steps
                .run("export", || async {
                    exports.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, AppError>(incompressible(export))
                })
                .await?;
            Ok(a.len() + b.len())
        })
        .await
}

/// A step whose value does not fit, after earlier steps filled the record almost to its budget:
/// the step's effect happened, its value is refused (`StepTooLarge`), and the mark that records it as
/// finished without a value (its name and why, up to 512 bytes) does not fit either. The failure is
/// only logged; the record holds no trace of the step, and the next call resumes and runs its effect
/// again, where the promise is `StepNotStored` and no second run.
#[tokio::test]
async fn a_too_large_step_in_a_nearly_full_record_never_runs_again() {
    let harness = memory_harness().await;
    let none = AtomicUsize::new(0);
    // The largest fill that is stored, by bisection on fresh keys (no export: it returns nothing).
    let (mut fits, mut too_large) = (1_000, 1_000_000);
    while too_large - fits > 1 {
        let mid = usize::midpoint(fits, too_large);
        let order = format!("probe-{mid}");
        match fill_and_export(&harness, &order, mid, 0, &none).await {
            Ok(_) => fits = mid,
            Err(AppError::Idempotency(Error::StepTooLarge { .. })) => too_large = mid,
            Err(other) => panic!("{other:?}"),
        }
    }

    // A few characters under the largest: each call's origin token is new, and changes the
    // compressed steps by a few bytes.
    let fits = fits - 64;
    let exports = AtomicUsize::new(0);
    let first = fill_and_export(&harness, "order-1", fits, 1_000_000, &exports).await;
    let err = idempotent_tests::idem_error(first);
    assert!(matches!(err, Error::StepTooLarge { .. }), "{err:?}");
    let second = fill_and_export(&harness, "order-1", fits, 1_000_000, &exports).await;
    assert_eq!(
        exports.load(Ordering::SeqCst),
        1,
        "the export's effect ran again (fill of {fits} characters; the second call got {second:?})"
    );
    let err = idempotent_tests::idem_error(second);
    assert!(matches!(err, Error::StepNotStored { .. }), "{err:?}");
}

/// Holds the next claim that restarts after a failure until released (a slow store answer: the
/// request is evaluated when it is let through).
#[derive(Debug, Default)]
struct HoldsARestartClaim {
    armed: AtomicBool,
    held: Notify,
    release: Notify,
}

#[async_trait::async_trait]
impl<S: Store> Override<S> for HoldsARestartClaim {
    fn kind(&self) -> &'static str {
        "holds-a-restart-claim"
    }

    async fn claim(
        &self,
        inner: &S,
        request: &ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, StoreError> {
        if matches!(
            request.steps,
            StepsClaim::Fresh {
                restarts: Some(_),
                ..
            }
        ) && self.armed.swap(false, Ordering::SeqCst)
        {
            self.held.notify_one();
            self.release.notified().await;
        }
        inner.claim(request).await
    }
}

/// Two retries of a failed operation under the restart policy, no request sent twice. Call 1 fails
/// after its reserve. Calls A and B both find the failure and restart; B's restart claim is slow to
/// reach the store. A's lands: A runs the reserve again, then its at-most-once email panics after
/// its effect (FAILED `panicked`, the email marked interrupted: the operation is pinned). B's claim
/// then lands: it is conditioned only on the record being FAILED, not on the failure B judged
/// restartable, so it takes the pinned record and starts over with no finished step: the email runs
/// a second time.
#[tokio::test]
async fn a_slow_restart_claim_does_not_restart_a_pinned_operation() {
    slow_restart_claim(MemoryStore::new()).await;
}

/// [`a_slow_restart_claim_does_not_restart_a_pinned_operation`] on DynamoDB Local.
#[tokio::test]
async fn a_slow_restart_claim_does_not_restart_a_pinned_operation_on_dynamodb() {
    slow_restart_claim(idempotent_tests::dynamodb_store().await.0).await;
}

/// The sequence of [`a_slow_restart_claim_does_not_restart_a_pinned_operation`] on `inner`.
async fn slow_restart_claim<S: Store>(inner: S) {
    let store = Arc::new(Delegating::new(inner, HoldsARestartClaim::default()));
    let harness = Harness::over(store.clone(), RequestCounter::default(), |b| b);
    let effects = Arc::new(Effects::default());
    let failed = reserve_and_email(harness.clone(), effects.clone(), true, false).await;
    assert!(matches!(failed, Err(AppError::Declined)));

    store.with.armed.store(true, Ordering::SeqCst);
    let b = tokio::spawn(reserve_and_email(
        harness.clone(),
        effects.clone(),
        false,
        false,
    ));
    store.with.held.notified().await;
    // Call A is in another process: in B's (one handle), it would follow B's held claim (coalescing)
    // and never reach the store.
    let other = Harness {
        idem: harness.another_process(|b| b),
        ..harness.clone()
    };
    let a = tokio::spawn(reserve_and_email(other, effects.clone(), false, true)).await;
    assert!(a.unwrap_err().is_panic());
    assert_eq!(effects.checkout(), (2, 0, 1));
    let record = harness.record(NAMESPACE, "order-1").await.unwrap();
    assert_eq!(
        record.steps_report().unwrap().unwrap().interrupted,
        ["email"]
    );

    store.with.release.notify_one();
    let b = b.await.unwrap();
    assert_eq!(
        effects.checkout(),
        (2, 0, 1),
        "the email went out once (call B got {b:?})"
    );
    let err = idempotent_tests::idem_error(b);
    assert!(matches!(err, Error::StepInterrupted { .. }), "{err:?}");
}

/// Step writes fail (`Unavailable`) while `down` is on: a store outage.
#[derive(Debug, Default)]
struct StepWritesDown {
    down: AtomicBool,
}

#[async_trait::async_trait]
impl<S: Store> Override<S> for StepWritesDown {
    fn kind(&self) -> &'static str {
        "step-writes-down"
    }

    async fn transition(
        &self,
        inner: &S,
        transition: &Transition<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        if self.down.load(Ordering::SeqCst) && matches!(transition.change, Change::SaveSteps { .. })
        {
            return Err(StoreError::Unavailable("step writes are down".into()));
        }
        inner.transition(transition).await
    }
}

/// Under the restart policy: the reserve is stored, then the store refuses step writes for longer
/// than the lease while the charge runs (an outage). The charge's value is not stored, and the body
/// returns the library's `ResultNotStored` through `?`; the handler records it as the body's failure
/// once the store is back. Recorded as FAILED, the next call would read that as the body's own `Err`
/// and start over: the finished reserve would run again, and the charge again under a new
/// `Steps::key` (a downstream gateway would charge twice). The body never failed: the store did, which
/// is no more a failure the body undid its steps after than a crash is. So the claim lapses (PENDING,
/// lease over) and the next call resumes: the reserve is replayed, and only the charge, whose value
/// was never stored, runs again, under the same key.
#[tokio::test]
async fn a_store_outage_in_a_step_write_does_not_restart_finished_steps() {
    let store = Arc::new(Delegating::new(
        MemoryStore::new(),
        StepWritesDown::default(),
    ));
    let harness = Harness::over(store.clone(), RequestCounter::default(), |b| b);
    let effects = Arc::new(Effects::default());
    let call = |outage: bool| {
        let (effects, store) = (effects.clone(), store.clone());
        harness
            .idem
            .operation(NAMESPACE, "order-1")
            .lease(idempotent_runtime::MIN_LEASE)
            .restart_steps_after_failure()
            .steps()
            .run(move |cx| async move {
                let (steps, ()) = cx.into_parts();
                steps
                    .run("reserve", || async {
                        effects.happened("reserve");
                        Ok::<_, AppError>(17_u32)
                    })
                    .await?;
                let key = steps.key("charge");
                effects.keyed("charge", key.clone());
                steps
                    .run("charge", || async {
                        effects.happened("charge");
                        store.with.down.store(outage, Ordering::SeqCst);
                        Ok::<_, AppError>(key)
                    })
                    .await
            })
    };
    let first = call(true).await;
    store.with.down.store(false, Ordering::SeqCst);
    // Written once the store is back: the lapse of the call's claim.
    let _ = harness.idem.drain(Duration::from_secs(5)).await;
    let err = idempotent_tests::idem_error(first);
    assert!(matches!(err, Error::ResultNotStored { .. }), "{err:?}");
    let record = harness.record(NAMESPACE, "order-1").await.unwrap();
    assert_eq!(
        (record.status, record.lease_until_ms),
        (Status::Pending, Some(0)),
        "{record:?}"
    );

    let second = call(false).await;
    assert_eq!(
        (effects.runs("reserve"), effects.runs("charge")),
        (1, 2),
        "the finished reserve ran again (second call got {second:?})"
    );
    let keys = effects.keys("charge");
    assert_eq!(keys[0], keys[1], "the charge ran again under a new key");
}

/// A value whose `Serialize` panics.
#[derive(Debug, serde::Deserialize)]
struct Bomb;

impl serde::Serialize for Bomb {
    fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        panic!("bomb went off while serializing")
    }
}

/// What the "export" step of [`unstorable`] returns.
#[derive(Debug, Clone, Copy)]
enum Unstorable {
    /// A value whose `Serialize` panics.
    PanickingSerialize,
    /// A NaN (JSON has none: it would not read back).
    NaN,
}

/// A reserve, then an "export" step returning a value that cannot be stored, each effect counted.
async fn unstorable(
    harness: Harness,
    restart: bool,
    effects: Arc<Effects>,
    what: Unstorable,
) -> Result<u32, AppError> {
    operation(&harness, "order-1", restart)
        .steps()
        .run(|cx| async move {
            let (steps, ()) = cx.into_parts();
            steps
                .run("reserve", || async {
                    effects.happened("reserve");
                    Ok::<_, AppError>(17_u32)
                })
                .await?;
            match what {
                Unstorable::PanickingSerialize => {
                    steps
                        .run("export", || async {
                            effects.happened("export");
                            Ok::<_, AppError>(Bomb)
                        })
                        .await?;
                }
                Unstorable::NaN => {
                    steps
                        .run("export", || async {
                            effects.happened("export");
                            Ok::<_, AppError>(f64::NAN)
                        })
                        .await?;
                }
            }
            Ok(1)
        })
        .await
}

/// A step whose value cannot be stored (a panicking `Serialize`, a NaN), with and without the restart
/// policy: the first call gets the panic or the error, every later one `StepNotStored`; the reserve
/// and the export each ran once, and the record says the export is not stored.
#[tokio::test]
async fn a_step_whose_value_cannot_be_stored_never_runs_again() {
    for what in [Unstorable::PanickingSerialize, Unstorable::NaN] {
        for restart in [false, true] {
            let harness = memory_harness().await;
            let effects = Arc::new(Effects::default());
            let first =
                tokio::spawn(unstorable(harness.clone(), restart, effects.clone(), what)).await;
            match what {
                Unstorable::PanickingSerialize => assert!(first.unwrap_err().is_panic()),
                Unstorable::NaN => {
                    let err = idempotent_tests::idem_error(first.unwrap());
                    assert!(matches!(err, Error::Serialize { .. }), "{err:?}");
                }
            }
            for _ in 0..2 {
                let later = unstorable(harness.clone(), restart, effects.clone(), what).await;
                let err = idempotent_tests::idem_error(later);
                assert!(
                    matches!(err, Error::StepNotStored { .. }),
                    "{what:?} {restart}: {err:?}"
                );
            }
            assert_eq!(
                (effects.runs("reserve"), effects.runs("export")),
                (1, 1),
                "{what:?}, restart {restart}"
            );
            let (status, finished, not_stored) = report(&harness, "order-1").await;
            assert_eq!(
                (status, finished, not_stored),
                (
                    Status::Failed,
                    vec!["reserve".to_owned()],
                    vec!["export".to_owned()]
                )
            );
        }
    }
}

/// A crash after the reserve, and a panic in the charge, with and without the restart policy: the
/// next call resumes, the reserve runs once, under one `Steps::key`.
#[tokio::test]
async fn a_crash_or_a_panic_resumes_under_either_policy() {
    for restart in [false, true] {
        let harness = memory_harness().await;
        let effects = Arc::new(Effects::default());
        crash_after_reserve(&harness, "order-1", restart, &effects).await;
        checkout(
            &harness,
            "order-1",
            restart,
            &effects,
            Charge::Succeeds,
            false,
        )
        .await
        .unwrap();
        assert_eq!(effects.checkout(), (1, 1, 0), "crash, restart {restart}");
        let keys = effects.keys("charge");
        assert!(keys.windows(2).all(|w| w[0] == w[1]), "{keys:?}");

        let effects = Arc::new(Effects::default());
        let panicking = {
            let (harness, effects) = (harness.clone(), effects.clone());
            tokio::spawn(async move {
                operation(&harness, "order-2", restart)
                    .steps()
                    .run(|cx| async move {
                        let (steps, ()) = cx.into_parts();
                        steps
                            .run("reserve", || async {
                                effects.happened("reserve");
                                Ok::<_, AppError>(17_u32)
                            })
                            .await?;
                        steps.run("charge", || async { explode() }).await
                    })
                    .await
            })
            .await
        };
        assert!(panicking.unwrap_err().is_panic());
        checkout(
            &harness,
            "order-2",
            restart,
            &effects,
            Charge::Succeeds,
            false,
        )
        .await
        .unwrap();
        assert_eq!(effects.checkout(), (1, 1, 0), "panic, restart {restart}");
    }
}

/// Under the restart policy, a body whose steps all finished returns `Ok` with a response too large
/// to store: the record is COMPLETED (not a failure to restart after), and the next call runs no
/// step again.
#[tokio::test]
async fn a_response_too_large_does_not_restart_finished_steps() {
    let harness = memory_harness().await;
    let effects = Arc::new(Effects::default());
    let call = || {
        let effects = effects.clone();
        operation(&harness, "order-1", true)
            .max_response_bytes(64)
            .steps()
            .run(move |cx| async move {
                let (steps, ()) = cx.into_parts();
                steps
                    .run("reserve", || async {
                        effects.happened("reserve");
                        Ok::<_, AppError>(17_u32)
                    })
                    .await?;
                Ok::<_, AppError>("x".repeat(1_000))
            })
    };
    let first = call().await;
    let record = harness.record(NAMESPACE, "order-1").await;
    let second = call().await;
    assert!(first.is_ok());
    let record = record.expect("the record");
    assert_eq!(
        (record.status, record.steps.is_some()),
        (Status::Completed, false)
    );
    assert_eq!(effects.runs("reserve"), 1, "second {second:?}");
}

/// The first claim that resumes steps lands, but its answer is lost (`Unavailable`).
#[derive(Debug, Default)]
struct LosesAResumeAnswer {
    armed: AtomicBool,
}

#[async_trait::async_trait]
impl<S: Store> Override<S> for LosesAResumeAnswer {
    fn kind(&self) -> &'static str {
        "loses-a-resume-answer"
    }

    async fn claim(
        &self,
        inner: &S,
        request: &ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, StoreError> {
        let outcome = inner.claim(request).await?;
        if matches!(request.steps, StepsClaim::Resume { .. })
            && self.armed.swap(false, Ordering::SeqCst)
        {
            return Err(StoreError::Unavailable("answer lost".into()));
        }
        Ok(outcome)
    }
}

/// A takeover after a crash whose resuming claim lands but whose answer is lost: whatever the call
/// then does, no finished step runs again, and the operation completes with one charge.
#[tokio::test]
async fn a_lost_answer_to_a_resuming_claim_runs_no_step_again() {
    for restart in [false, true] {
        let store = Arc::new(Delegating::new(
            MemoryStore::new(),
            LosesAResumeAnswer::default(),
        ));
        let harness = Harness::over(store.clone(), RequestCounter::default(), |b| b);
        let effects = Arc::new(Effects::default());
        crash_after_reserve(&harness, "order-1", restart, &effects).await;
        store.with.armed.store(true, Ordering::SeqCst);
        let second = checkout(
            &harness,
            "order-1",
            restart,
            &effects,
            Charge::Succeeds,
            false,
        )
        .await;
        let _ = harness.idem.drain(Duration::from_secs(5)).await;
        if second.is_err() {
            // Whatever became of the claim, the key is resumable once its lease lapsed.
            harness.clock.advance(PAST_THE_LEASE);
            checkout(
                &harness,
                "order-1",
                restart,
                &effects,
                Charge::Succeeds,
                false,
            )
            .await
            .unwrap();
        }
        assert_eq!(
            effects.checkout(),
            (1, 1, 0),
            "restart {restart}, second call {second:?}"
        );
        let record = harness.record(NAMESPACE, "order-1").await.unwrap();
        assert_eq!(record.status, Status::Completed);
    }
}

/// Holds the "charge" step's write until the next resuming claim is about to be sent, then lets it
/// land first: the slow write of a call whose lease lapsed reaches the store just before a takeover.
#[derive(Debug, Default)]
struct SlowChargeWrite {
    held: Notify,
    go: Notify,
    landed: Notify,
    holding: AtomicBool,
    handed: AtomicBool,
}

#[async_trait::async_trait]
impl<S: Store> Override<S> for SlowChargeWrite {
    fn kind(&self) -> &'static str {
        "slow-charge-write"
    }

    async fn transition(
        &self,
        inner: &S,
        transition: &Transition<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        let is_charge = matches!(transition.change, Change::SaveSteps { steps, .. }
            if probe(steps)
                .steps_report()
                .and_then(Result::ok)
                .is_some_and(|r| r.finished.iter().any(|n| n == "charge")));
        if is_charge && !self.holding.swap(true, Ordering::SeqCst) {
            self.held.notify_one();
            self.go.notified().await;
            let outcome = inner.transition(transition).await;
            self.landed.notify_one();
            return outcome;
        }
        inner.transition(transition).await
    }

    async fn claim(
        &self,
        inner: &S,
        request: &ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, StoreError> {
        if matches!(request.steps, StepsClaim::Resume { .. })
            && self.holding.load(Ordering::SeqCst)
            && !self.handed.swap(true, Ordering::SeqCst)
        {
            self.go.notify_one();
            self.landed.notified().await;
        }
        inner.claim(request).await
    }
}

/// A record holding `steps`, to read them through ([`Record::steps_report`]).
fn probe(steps: &[u8]) -> idempotent_runtime::Record {
    let mut record =
        idempotent_runtime::Record::new(String::new(), Status::Pending, String::new(), 0);
    record.steps = Some(steps.to_vec());
    record
}

/// Reserve, charge and email, each effect counted; `hang`: the email hangs before its effect.
async fn three_steps(harness: Harness, effects: Arc<Effects>, hang: bool) -> Result<u32, AppError> {
    operation(&harness, "order-1", false)
        .steps()
        .run(|cx| async move {
            let (steps, ()) = cx.into_parts();
            for name in ["reserve", "charge"] {
                steps
                    .run(name, || async {
                        effects.happened(name);
                        Ok::<_, AppError>(1_u32)
                    })
                    .await?;
            }
            steps
                .run("email", || async {
                    if hang {
                        std::future::pending::<()>().await;
                    }
                    effects.happened("email");
                    Ok::<_, AppError>(3_u32)
                })
                .await
        })
        .await
}

/// Call A's write of its charge is slow; A's lease lapses meanwhile. Call B reads the record (the
/// reserve stored, not the charge) and sends its resuming claim; A's write lands just before it. B's
/// claim, conditioned on the steps it read, is refused; B reads again and resumes after the charge:
/// the charge ran once.
#[tokio::test]
async fn a_slow_step_write_landing_before_a_takeover_is_not_run_again() {
    let store = Arc::new(Delegating::new(
        MemoryStore::new(),
        SlowChargeWrite::default(),
    ));
    let harness = Harness::over(store.clone(), RequestCounter::default(), |b| b);
    let effects = Arc::new(Effects::default());
    let a = tokio::spawn(three_steps(harness.clone(), effects.clone(), true));
    store.with.held.notified().await;
    harness.clock.advance(PAST_THE_LEASE);
    // B is another process: in A's, it would wait on A's call.
    let other = Harness {
        idem: harness.another_process(|b| b),
        ..harness.clone()
    };
    let b = three_steps(other, effects.clone(), false).await;
    a.abort();
    assert!(
        store.with.handed.load(Ordering::SeqCst),
        "A's write landed before B's claim"
    );
    assert_eq!(b.unwrap(), 3);
    assert_eq!(effects.checkout(), (1, 1, 1));
}
