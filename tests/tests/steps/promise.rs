//! The promise of steps (`Operation::steps`), path by path: a finished step never runs again
//! while its record lives — not when its value could not be stored, not after an operator released
//! the key, not under `restart_steps_after_failure`, and not after code without steps claimed the key.
//! Each test runs on both stores.

use std::sync::Arc;
use std::time::Duration;

use idempotent_runtime::store::conformance::{Delegating, Override};
use idempotent_runtime::store::{ClaimOutcome, ClaimRequest, StepsClaim, Transition, WriteOutcome};
use idempotent_runtime::{Clock as _, Error, Idempotency, Status, Store, StoreError};
use idempotent_tests::{AppError, Backend, Effects, Forward, Harness, RequestCounter};
use serde::ser::SerializeStruct as _;
use tokio::sync::Notify;

const NAMESPACE: &str = "steps-promise::checkout";
const LEASE: Duration = Duration::from_secs(30);

/// A charge's value: an id and an amount. `bomb` makes its `Serialize` panic.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
struct Charge {
    id: String,
    amount: f64,
    #[serde(default)]
    bomb: bool,
}

impl serde::Serialize for Charge {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        assert!(!self.bomb, "the charge's Serialize panicked");
        let mut charge = serializer.serialize_struct("Charge", 2)?;
        charge.serialize_field("id", &self.id)?;
        charge.serialize_field("amount", &self.amount)?;
        charge.end()
    }
}

/// Why a charge's value cannot be stored.
#[derive(Debug, Clone, Copy)]
enum Unstorable {
    /// Too large for the record, even compressed.
    TooLarge,
    /// A NaN amount: JSON has no NaN.
    NotANumber,
    /// Its `Serialize` panics.
    Panics,
}

impl Unstorable {
    fn charge(self) -> Charge {
        match self {
            Unstorable::TooLarge => Charge {
                id: noise(1_000_000),
                amount: 1.0,
                bomb: false,
            },
            Unstorable::NotANumber => Charge {
                id: "ch_1".into(),
                amount: f64::NAN,
                bomb: false,
            },
            Unstorable::Panics => Charge {
                id: "ch_1".into(),
                amount: 1.0,
                bomb: true,
            },
        }
    }
}

/// `len` pseudo-random hex digits (xorshift), which compress about 2:1.
fn noise(len: usize) -> String {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            char::from_digit((state % 16) as u32, 16).unwrap()
        })
        .collect()
}

/// A checkout of three steps: reserve, charge (whose value is `charge`), email.
async fn checkout(
    idem: &Idempotency,
    order: &str,
    restart: bool,
    effects: &Arc<Effects>,
    charge: Charge,
) -> Result<String, AppError> {
    let operation = idem.operation(NAMESPACE, order).lease(LEASE);
    let operation = if restart {
        operation.restart_steps_after_failure()
    } else {
        operation
    };
    operation
        .steps()
        .run(|cx| async move {
            let (steps, ()) = cx.into_parts();
            steps
                .run("reserve", || async {
                    effects.happened("reserve");
                    Ok::<_, AppError>(17_u32)
                })
                .await?;
            let charged = steps
                .run("charge", || async {
                    effects.happened("charge");
                    Ok::<_, AppError>(charge)
                })
                .await?;
            steps
                .run("email", || async {
                    effects.happened("email");
                    Ok::<_, AppError>(())
                })
                .await?;
            Ok(charged.id)
        })
        .await
}

/// A two-step body: "reserve", then "charge", which hangs when `hang` (the call is then dropped: a
/// crash after the reserve). Each run of the body records the downstream key of "charge".
async fn two_steps(
    idem: &Idempotency,
    order: &str,
    restart: bool,
    effects: &Arc<Effects>,
    hang: Option<&Notify>,
) -> Result<u32, AppError> {
    let operation = idem.operation(NAMESPACE, order).lease(LEASE);
    let operation = if restart {
        operation.restart_steps_after_failure()
    } else {
        operation
    };
    operation
        .steps()
        .run(|cx| async move {
            let (steps, ()) = cx.into_parts();
            let hold = steps
                .run("reserve", || async {
                    effects.happened("reserve");
                    Ok::<_, AppError>(17_u32)
                })
                .await?;
            effects.keyed("charge", steps.key("charge"));
            if let Some(reserved) = hang {
                reserved.notify_one();
                std::future::pending::<()>().await;
            }
            steps
                .run("charge", || async {
                    effects.happened("charge");
                    Ok::<_, AppError>(hold + 1)
                })
                .await
        })
        .await
}

/// Runs `two_steps` until the reserve is stored, then drops the call: PENDING with one finished step,
/// as a crash leaves it.
async fn crash_after_reserve(h: &Harness, order: &str, restart: bool, effects: &Arc<Effects>) {
    let reserved = Notify::new();
    tokio::select! {
        _ = two_steps(&h.idem, order, restart, effects, Some(&reserved)) => panic!("the charge hangs"),
        () = reserved.notified() => {}
    }
    let record = h.record(NAMESPACE, order).await.unwrap();
    assert_eq!(record.status, Status::Pending);
    assert!(record.steps.is_some());
}

/// A store that, while armed, fails the record under a resume's feet (its holder failed as the
/// resume was on its way) and holds back the answer of a fresh claim that landed.
#[derive(Debug)]
struct FailsUnderResume {
    armed: std::sync::atomic::AtomicBool,
    landed: Notify,
}

#[async_trait::async_trait]
impl Override<Forward> for FailsUnderResume {
    fn kind(&self) -> &'static str {
        "fails-under-resume"
    }

    async fn claim(
        &self,
        inner: &Forward,
        request: &ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, StoreError> {
        let armed = self.armed.load(std::sync::atomic::Ordering::SeqCst);
        if armed && matches!(request.steps, StepsClaim::Resume { .. }) {
            let record = inner.get(request.key).await?.expect("a record");
            let fail = Transition::new(
                request.key,
                &record.token,
                idempotent_runtime::store::Change::Fail {
                    error: "declined",
                    expires_at_s: record.expires_at_s,
                    release_claim_writes: false,
                },
            );
            let failed = inner.transition(&fail).await?;
            assert_eq!(failed, WriteOutcome::Applied);
        }
        let outcome = inner.claim(request).await?;
        if armed
            && matches!(request.steps, StepsClaim::Fresh { .. })
            && outcome == ClaimOutcome::Claimed
        {
            self.landed.notify_one();
            std::future::pending::<()>().await;
        }
        Ok(outcome)
    }
}

/// The store of `backend`, bare, with its request counter.
async fn bare_store(backend: Backend) -> (Arc<dyn Store>, RequestCounter) {
    match backend {
        Backend::Memory => (
            Arc::new(idempotent_runtime::MemoryStore::new()),
            RequestCounter::default(),
        ),
        Backend::DynamoDb => {
            let (store, counter) = idempotent_tests::dynamodb_store().await;
            (Arc::new(store), counter)
        }
    }
}

/// Runs `checkout` with a charge whose value cannot be stored (`why`) on its own task: its result, or
/// its panic's message.
async fn unstorable_checkout(
    h: &Harness,
    order: &str,
    restart: bool,
    effects: &Arc<Effects>,
    why: Unstorable,
) -> Result<Result<String, AppError>, String> {
    let (idem, order, effects) = (h.idem.clone(), order.to_owned(), effects.clone());
    let task =
        tokio::spawn(async move { checkout(&idem, &order, restart, &effects, why.charge()).await });
    task.await.map_err(|e| {
        let panic = e.into_panic();
        panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default()
    })
}

/// A body of two steps: "reserve", then "email" at most once, which hangs when `hang` is given (the
/// call is then dropped mid-email: a crash inside the step), or fails when `fail`.
async fn confirm(
    idem: &Idempotency,
    order: &str,
    restart: bool,
    effects: &Arc<Effects>,
    hang: Option<&Notify>,
    fail: bool,
) -> Result<String, AppError> {
    let operation = idem.operation(NAMESPACE, order).lease(LEASE);
    let operation = if restart {
        operation.restart_steps_after_failure()
    } else {
        operation
    };
    operation
        .steps()
        .run(|cx| async move {
            let (steps, ()) = cx.into_parts();
            steps
                .run("reserve", || async {
                    effects.happened("reserve");
                    Ok::<_, AppError>(17_u32)
                })
                .await?;
            steps
                .run_at_most_once("email", || async {
                    effects.happened("email");
                    if let Some(sending) = hang {
                        sending.notify_one();
                        std::future::pending::<()>().await;
                    }
                    if fail {
                        return Err(AppError::Declined);
                    }
                    Ok::<_, AppError>("250 OK".to_owned())
                })
                .await
        })
        .await
}

async fn harness(backend: Backend) -> Harness {
    Harness::with(backend, |b| b.default_lease(LEASE)).await
}

/// A step whose closure returned `Ok` has had its effect: when its value cannot be
/// stored (too large, not JSON, a panicking `Serialize`), the step is recorded as
/// finished without a value. The first call gets the reason; every retry (whether the
/// operation resumes or restarts after a failure) gets `StepNotStored` for it, and its
/// effect never happens again.
async fn a_step_whose_value_cannot_be_stored_never_runs_again(backend: Backend) {
    let h = harness(backend).await;
    for why in [
        Unstorable::TooLarge,
        Unstorable::NotANumber,
        Unstorable::Panics,
    ] {
        for restart in [false, true] {
            let order = format!("{why:?}-{restart}");
            let effects = Arc::new(Effects::default());
            let first = unstorable_checkout(&h, &order, restart, &effects, why).await;
            match (why, &first) {
                (
                    Unstorable::TooLarge,
                    Ok(Err(AppError::Idempotency(Error::StepTooLarge { .. }))),
                )
                | (
                    Unstorable::NotANumber,
                    Ok(Err(AppError::Idempotency(Error::Serialize { .. }))),
                ) => {}
                (Unstorable::Panics, Err(message)) => {
                    assert_eq!(message, "the charge's Serialize panicked");
                }
                _ => panic!("{why:?}: {:?}", first.map(|r| r.map(|id| id.len()))),
            }
            assert_eq!(effects.checkout(), (1, 1, 0), "{why:?}");
            for _ in 0..2 {
                // A retry, even once `failed_ttl` is long past.
                h.clock.advance(Duration::from_hours(2));
                let retry = checkout(
                    &h.idem,
                    &order,
                    restart,
                    &effects,
                    Unstorable::NotANumber.charge(),
                )
                .await;
                assert!(
                    matches!(&retry, Err(AppError::Idempotency(Error::StepNotStored { step, .. })) if step == "charge"),
                    "{why:?} (restart: {restart}): {retry:?}"
                );
                assert_eq!(
                    effects.checkout(),
                    (1, 1, 0),
                    "{why:?} (restart: {restart}): a step ran again"
                );
            }
            let record = h.record(NAMESPACE, &order).await.unwrap();
            assert_eq!(record.status, Status::Failed);
            assert!(record.steps.is_some(), "the record lost the step");
        }
    }
}

/// An operator releases the claim a crash left behind, for an operation that restarts
/// after a failure: a release is no failure of its body, so the next call resumes: the
/// finished reserve does not run again, and the charge gets the operation's downstream
/// key, not a new one.
async fn an_operators_release_never_restarts_the_operation(backend: Backend) {
    let h = harness(backend).await;
    let effects = Arc::new(Effects::default());
    crash_after_reserve(&h, "r-release", true, &effects).await;
    let record = h.record(NAMESPACE, "r-release").await.unwrap();
    let released = idempotent_runtime::admin::release(h.store.as_ref(), &record, h.clock.now_ms())
        .await
        .unwrap();
    assert!(
        matches!(released, idempotent_runtime::admin::Released::Lapsed),
        "{released:?}"
    );
    // At once: the key is not blocked for the rest of the lease.
    let charged = two_steps(&h.idem, "r-release", true, &effects, None)
        .await
        .unwrap();
    assert_eq!(charged, 18);
    assert_eq!(effects.runs("reserve"), 1, "the finished reserve ran again");
    assert_eq!(effects.runs("charge"), 1);
    let keys = effects.keys("charge");
    assert_eq!(keys.len(), 2);
    assert_eq!(
        keys[0], keys[1],
        "the resumed charge got a new downstream key"
    );
}

/// Under the restart policy, a call whose resume was refused (the record failed as it
/// was on its way) claims the key afresh; dropped while that claim is on its way, it
/// releases it, so that the key is free at once rather than PENDING for the lease.
async fn a_dropped_fresh_claim_after_a_refused_resume_is_released(backend: Backend) {
    let (inner, counter) = bare_store(backend).await;
    let store = Arc::new(Delegating::new(
        Forward(inner),
        FailsUnderResume {
            armed: false.into(),
            landed: Notify::new(),
        },
    ));
    let h = Harness::over(store.clone(), counter, |b| b.default_lease(LEASE));
    let effects = Arc::new(Effects::default());
    crash_after_reserve(&h, "r-drop", true, &effects).await;
    h.clock.advance(LEASE * 2);
    store.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    tokio::select! {
        _ = two_steps(&h.idem, "r-drop", true, &effects, None) => {
            panic!("the fresh claim's answer was held back")
        }
        () = store.landed.notified() => {}
    }
    store
        .armed
        .store(false, std::sync::atomic::Ordering::SeqCst);
    h.idem.drain(Duration::from_secs(5)).await;
    let record = h.record(NAMESPACE, "r-drop").await.unwrap();
    assert_eq!(
        record.status,
        Status::Failed,
        "the dropped call's claim was not released: {record:?}"
    );
    // The key is free at once (no lease to wait out); the operation failed, so it
    // restarts.
    assert_eq!(
        two_steps(&h.idem, "r-drop", true, &effects, None)
            .await
            .unwrap(),
        18
    );
}

/// A claim from code without steps (another deploy of the function) takes the key
/// once its record expired: a new operation. It must not leave the old operation's
/// steps behind: a later call with steps starts afresh (its reserve runs, with a new
/// downstream key) rather than replaying the expired operation's.
async fn a_claim_without_steps_of_an_expired_record_removes_its_steps(backend: Backend) {
    let h = harness(backend).await;
    let effects = Arc::new(Effects::default());
    crash_after_reserve(&h, "r-plain", false, &effects).await;
    let record = h.record(NAMESPACE, "r-plain").await.unwrap();
    let expired_at_ms = (record.expires_at_s + 10) * 1000;
    h.clock
        .advance(Duration::from_millis(expired_at_ms - h.clock.now_ms()));
    let plain = h
        .idem
        .operation(NAMESPACE, "r-plain")
        .lease(LEASE)
        .run(|_| async { Err::<u32, _>(AppError::Declined) })
        .await;
    assert!(matches!(plain, Err(AppError::Declined)), "{plain:?}");
    let record = h.record(NAMESPACE, "r-plain").await.unwrap();
    assert_eq!(record.status, Status::Failed);
    assert_eq!(
        record.steps, None,
        "the expired operation's steps are still there"
    );

    assert_eq!(
        two_steps(&h.idem, "r-plain", false, &effects, None)
            .await
            .unwrap(),
        18
    );
    assert_eq!(
        effects.runs("reserve"),
        2,
        "the expired operation's reserve was replayed"
    );
    let keys = effects.keys("charge");
    assert_ne!(
        keys[0], keys[1],
        "a new operation repeated the old downstream key"
    );
}

/// An at-most-once step interrupted mid-way (the call dropped inside it, as a crash
/// would) is never run again: the call that takes the key over stops at it with
/// `StepInterrupted`, and so does every later call, even of an operation that restarts
/// after a failure. The record says which step, for the operator.
async fn an_interrupted_at_most_once_step_is_never_run_again(backend: Backend) {
    let h = harness(backend).await;
    for restart in [false, true] {
        let order = format!("once-{restart}");
        let effects = Arc::new(Effects::default());
        let sending = Notify::new();
        tokio::select! {
            _ = confirm(&h.idem, &order, restart, &effects, Some(&sending), false) => {
                panic!("the email hangs")
            }
            () = sending.notified() => {}
        }
        let record = h.record(NAMESPACE, &order).await.unwrap();
        let report = record.steps_report().unwrap().unwrap();
        assert_eq!(report.interrupted, ["email"]);
        assert_eq!(report.finished, ["reserve"]);
        for _ in 0..3 {
            h.clock.advance(LEASE * 2);
            let retry = confirm(&h.idem, &order, restart, &effects, None, false).await;
            assert!(
                matches!(&retry, Err(AppError::Idempotency(Error::StepInterrupted { step, .. })) if step == "email"),
                "restart: {restart}: {retry:?}"
            );
            assert_eq!(
                (effects.runs("reserve"), effects.runs("email")),
                (1, 1),
                "restart: {restart}: a step ran again"
            );
        }
        let record = h.record(NAMESPACE, &order).await.unwrap();
        assert_eq!(record.status, Status::Failed);
        assert!(
            record
                .error
                .as_deref()
                .is_some_and(|e| e.contains("`email` runs at most once and was interrupted")),
            "{:?}",
            record.error
        );
        let report = record.steps_report().unwrap().unwrap();
        assert!(report.needs_operator());
        assert_eq!(report.interrupted, ["email"]);
    }
}

/// An at-most-once step that returns `Err` has finished (its effect did not happen):
/// the next call runs it again, and stores its value.
async fn an_at_most_once_step_that_failed_runs_again(backend: Backend) {
    let h = harness(backend).await;
    let effects = Arc::new(Effects::default());
    let failed = confirm(&h.idem, "once-fails", false, &effects, None, true).await;
    assert!(matches!(failed, Err(AppError::Declined)), "{failed:?}");
    let record = h.record(NAMESPACE, "once-fails").await.unwrap();
    assert!(
        record
            .steps_report()
            .unwrap()
            .unwrap()
            .interrupted
            .is_empty()
    );
    let sent = confirm(&h.idem, "once-fails", false, &effects, None, false).await;
    assert_eq!(sent.unwrap(), "250 OK");
    assert_eq!((effects.runs("reserve"), effects.runs("email")), (1, 2));
    // A duplicate replays.
    let again = confirm(&h.idem, "once-fails", false, &effects, None, false).await;
    assert_eq!(again.unwrap(), "250 OK");
    assert_eq!(effects.runs("email"), 2);
}

/// A panic under the restart policy is a bug, not a failure the body undid its steps'
/// effects after: the next call resumes (the finished reserve is not run again, and the
/// charge keeps its downstream key), rather than starting over.
async fn a_panic_under_the_restart_policy_resumes(backend: Backend) {
    let h = harness(backend).await;
    let effects = Arc::new(Effects::default());
    let call = |panics: bool| {
        let (idem, effects) = (h.idem.clone(), effects.clone());
        tokio::spawn(async move {
            idem.operation(NAMESPACE, "r-panic")
                .lease(LEASE)
                .restart_steps_after_failure()
                .steps()
                .run(|cx| async move {
                    let (steps, ()) = cx.into_parts();
                    steps
                        .run("reserve", || async {
                            effects.happened("reserve");
                            Ok::<_, AppError>(17_u32)
                        })
                        .await?;
                    effects.keyed("charge", steps.key("charge"));
                    assert!(!panics, "a bug after the reserve");
                    Ok::<_, AppError>(18_u32)
                })
                .await
        })
    };
    assert!(call(true).await.is_err(), "the first call panics");
    let record = h.record(NAMESPACE, "r-panic").await.unwrap();
    assert_eq!(record.status, Status::Failed);
    assert_eq!(call(false).await.unwrap().unwrap(), 18);
    assert_eq!(
        effects.runs("reserve"),
        1,
        "the panic restarted the operation"
    );
    let keys = effects.keys("charge");
    assert_eq!(keys[0], keys[1]);
}

/// A step whose stored value no longer reads as the step's type (changed in a deploy)
/// is not run again; the error says how to migrate without running it again.
async fn a_changed_step_type_is_an_error_that_says_how_to_migrate(backend: Backend) {
    let h = harness(backend).await;
    let effects = Arc::new(Effects::default());
    crash_after_reserve(&h, "r-type", false, &effects).await;
    h.clock.advance(LEASE * 2);
    let counted = effects.clone();
    let changed = h
        .idem
        .operation(NAMESPACE, "r-type")
        .lease(LEASE)
        .steps()
        .run(|cx| async move {
            let (steps, ()) = cx.into_parts();
            steps
                .run("reserve", || async {
                    counted.happened("reserve");
                    Ok::<_, AppError>("hold-17".to_owned())
                })
                .await
        })
        .await;
    let error = idempotent_tests::idem_error(changed);
    assert!(matches!(error, Error::StepValue { .. }), "{error:?}");
    assert!(error.to_string().contains("accepts both"), "{error}");
    assert!(!error.to_string().contains("new name"), "{error}");
    assert_eq!(effects.runs("reserve"), 1);
}

idempotent_tests::on_both_stores! {
    mod memory, mod dynamodb;
    #[tokio::test]
    a_step_whose_value_cannot_be_stored_never_runs_again,
    #[tokio::test]
    an_operators_release_never_restarts_the_operation,
    #[tokio::test]
    a_dropped_fresh_claim_after_a_refused_resume_is_released,
    #[tokio::test]
    a_claim_without_steps_of_an_expired_record_removes_its_steps,
    #[tokio::test]
    an_interrupted_at_most_once_step_is_never_run_again,
    #[tokio::test]
    an_at_most_once_step_that_failed_runs_again,
    #[tokio::test]
    a_panic_under_the_restart_policy_resumes,
    #[tokio::test]
    a_changed_step_type_is_an_error_that_says_how_to_migrate,
}

/// Round trips on DynamoDB: an at-most-once step costs one more `UpdateItem` (its start) than a step
/// run with `run`; the other steps cost what they did.
#[tokio::test]
async fn an_at_most_once_step_costs_one_more_write() {
    let h = Harness::with(Backend::DynamoDb, |b| b.default_lease(LEASE)).await;
    let effects = Arc::new(Effects::default());
    // Two steps run with `run`: the claim, one write per step, the completion.
    two_steps(&h.idem, "rt-run", false, &effects, None)
        .await
        .unwrap();
    assert_eq!(h.requests.of("UpdateItem"), 4, "claim + 2 steps + complete");
    assert_eq!(h.requests.total(), 4);
    h.requests.reset();
    // The second of two steps at most once: one write more.
    confirm(&h.idem, "rt-once", false, &effects, None, false)
        .await
        .unwrap();
    assert_eq!(
        h.requests.of("UpdateItem"),
        5,
        "claim + reserve + email's start + email + complete"
    );
    assert_eq!(h.requests.total(), 5);
    h.requests.reset();
    confirm(&h.idem, "rt-once", false, &effects, None, false)
        .await
        .unwrap();
    assert_eq!(h.requests.total(), 1, "a duplicate is its claim");
}
