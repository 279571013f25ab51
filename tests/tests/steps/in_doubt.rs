//! More sequences against the steps' promise: a finished step (or an interrupted at-most-once one)
//! never runs its effect again while the operation's record lives. Each asserts how often each
//! step's effect ran and what the record holds.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use idempotent_runtime::aws_sdk_dynamodb::types::{AttributeValue, ConditionCheck};
use idempotent_runtime::store::conformance::{Delegating, Override};
use idempotent_runtime::store::{Change, Transition, WriteOutcome};
use idempotent_runtime::{
    Clock, Error, ManualClock, MemoryStore, Operation, Status, Store, StoreError,
};
use idempotent_tests::{AppError, Effects, Harness, RequestCounter};

const NAMESPACE: &str = "steps-more::checkout";
const LEASE: Duration = Duration::from_secs(30);
const FAILED_TTL: Duration = Duration::from_mins(5);
/// Past the short `failed_ttl`, well within the operation's `ttl` (a day).
const PAST_THE_FAILED_TTL: Duration = Duration::from_mins(10);

/// The operation of `order`, with the restart policy when `restart`.
fn operation<'a>(harness: &'a Harness, order: &str, restart: bool) -> Operation<'a> {
    let operation = harness.idem.operation(NAMESPACE, order).lease(LEASE);
    if restart {
        operation.restart_steps_after_failure()
    } else {
        operation
    }
}

/// While armed, the step write numbered `held` (from 0, counted while armed) is held for a while
/// before it reaches the store: a call cut off meanwhile never sends it.
#[derive(Debug, Default)]
struct SlowWrite {
    armed: AtomicBool,
    writes: AtomicUsize,
    held: usize,
}

#[async_trait::async_trait]
impl<S: Store> Override<S> for SlowWrite {
    fn kind(&self) -> &'static str {
        "slow-write"
    }

    async fn transition(
        &self,
        inner: &S,
        transition: &Transition<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        if matches!(transition.change, Change::SaveSteps { .. })
            && self.armed.load(Ordering::SeqCst)
            && self.writes.fetch_add(1, Ordering::SeqCst) == self.held
        {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        inner.transition(transition).await
    }
}

/// An email sent at most once, beside a check that declines; `decline`: the check declines (after
/// the email's effect happened, while its value is being stored).
async fn confirm(
    harness: &Harness,
    order: &str,
    effects: &Arc<Effects>,
    decline: bool,
) -> Result<String, AppError> {
    operation(harness, order, true)
        .steps()
        .run(|cx| async move {
            let (steps, ()) = cx.into_parts();
            let sending = async {
                steps
                    .run_at_most_once("email", || async {
                        effects.happened("email");
                        Ok::<_, AppError>("250 OK".to_owned())
                    })
                    .await
            };
            let checking = async {
                if decline {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    return Err(AppError::Declined);
                }
                Ok(())
            };
            let (sent, ()) = tokio::try_join!(sending, checking)?;
            Ok(sent)
        })
        .await
}

/// Under the restart policy: an at-most-once email starts (its start stored) and sends; while its
/// value is being stored, the body's other branch declines and `try_join!` drops the email's future,
/// so the record keeps the email as interrupted. The record pins the operation (the next call stops
/// at the email with `StepInterrupted`), so it must be kept for the operation's `ttl`, as a pinned
/// failure is: judged from the call's own view of the steps (the email's finish, which never reached
/// the store), it got the short `failed_ttl`, and once that ran out the key was a new operation and
/// the email was sent a second time. A call with a step write in doubt now lets its claim lapse.
#[tokio::test]
async fn an_interrupted_email_is_not_sent_again_once_the_failed_ttl_ran_out() {
    interrupted_email_after_the_failed_ttl(MemoryStore::new()).await;
}

/// [`an_interrupted_email_is_not_sent_again_once_the_failed_ttl_ran_out`] on DynamoDB Local.
#[tokio::test]
async fn an_interrupted_email_is_not_sent_again_once_the_failed_ttl_ran_out_on_dynamodb() {
    interrupted_email_after_the_failed_ttl(idempotent_tests::dynamodb_store().await.0).await;
}

/// The sequence of [`an_interrupted_email_is_not_sent_again_once_the_failed_ttl_ran_out`] on `inner`.
async fn interrupted_email_after_the_failed_ttl<S: Store>(inner: S) {
    let slow = SlowWrite {
        held: 1,
        ..SlowWrite::default()
    };
    let store = Arc::new(Delegating::new(inner, slow));
    let harness = Harness::over(store.clone(), RequestCounter::default(), |b| {
        b.failed_ttl(FAILED_TTL)
    });
    let effects = Arc::new(Effects::default());

    store.with.armed.store(true, Ordering::SeqCst);
    let first = confirm(&harness, "order-1", &effects, true).await;
    store.with.armed.store(false, Ordering::SeqCst);
    assert!(matches!(first, Err(AppError::Declined)), "{first:?}");
    assert_eq!(effects.runs("email"), 1);
    let record = harness.record(NAMESPACE, "order-1").await.unwrap();
    // With a step write in doubt, the call cannot tell a pinned operation from one it may restart:
    // its claim lapses (PENDING, lease over) for the operation's lifetime.
    assert_eq!(
        (record.status, record.lease_until_ms),
        (Status::Pending, Some(0))
    );
    let report = record.steps_report().unwrap().unwrap();
    assert_eq!(report.interrupted, vec!["email".to_owned()], "{report:?}");
    let now_s = harness.clock.now_ms() / 1000;
    let lives_s = record.expires_at_s.saturating_sub(now_s);

    harness.clock.advance(PAST_THE_FAILED_TTL);
    let second = confirm(&harness, "order-1", &effects, false).await;
    assert_eq!(
        effects.runs("email"),
        1,
        "the interrupted email was sent again (its FAILED record lived {lives_s} s; second call {second:?})"
    );
    let err = idempotent_tests::idem_error(second);
    assert!(matches!(err, Error::StepInterrupted { .. }), "{err:?}");
}

/// The first deploy's checkout: "reserve" (a `u32`), then a charge that never finishes (the call is
/// cut off there, after the reserve was stored).
async fn checkout_cut_off(harness: &Harness, order: &str, effects: &Arc<Effects>) {
    let call = operation(harness, order, true)
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
                .run("charge", || async {
                    std::future::pending::<()>().await;
                    Ok::<_, AppError>(())
                })
                .await
        });
    assert!(
        tokio::time::timeout(Duration::from_secs(2), call)
            .await
            .is_err(),
        "the charge hangs"
    );
    assert_eq!(effects.runs("reserve"), 1);
}

/// The next deploy's checkout: the reserve's value is now a `String`; beside it, an email sent at
/// most once.
async fn checkout_with_email(
    harness: &Harness,
    order: &str,
    effects: &Arc<Effects>,
) -> Result<String, AppError> {
    operation(harness, order, true)
        .steps()
        .run(|cx| async move {
            let (steps, ()) = cx.into_parts();
            let sending = async {
                steps
                    .run_at_most_once("email", || async {
                        effects.happened("email");
                        Ok::<_, AppError>("250 OK".to_owned())
                    })
                    .await
            };
            let reserving = async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                steps
                    .run("reserve", || async {
                        effects.happened("reserve");
                        Ok::<_, AppError>("hold-17".to_owned())
                    })
                    .await
            };
            let (sent, hold) = tokio::try_join!(sending, reserving)?;
            Ok(format!("{hold} {sent}"))
        })
        .await
}

/// Under the restart policy: a checkout is cut off after its reserve (a `u32`); a deploy changes the
/// reserve's type to `String` and adds an email beside it. The next call's email is starting (its
/// start write on its way) when the reserve comes to `StepValue`, which the body passes up with `?`
/// (`try_join!` drops the email's future, so its start is never stored). The failure is the
/// library's, not the body's: the claim must lapse, not be recorded FAILED, or the next call starts
/// the operation over and runs the finished reserve again. The call judged the failure from its own
/// view of the steps (the email started, so pinned: no lapse), while the record holds no such mark.
#[tokio::test]
async fn a_library_error_beside_a_dropped_start_does_not_restart_the_steps() {
    library_error_beside_a_dropped_start(MemoryStore::new()).await;
}

/// [`a_library_error_beside_a_dropped_start_does_not_restart_the_steps`] on DynamoDB Local.
#[tokio::test]
async fn a_library_error_beside_a_dropped_start_does_not_restart_the_steps_on_dynamodb() {
    library_error_beside_a_dropped_start(idempotent_tests::dynamodb_store().await.0).await;
}

/// The sequence of [`a_library_error_beside_a_dropped_start_does_not_restart_the_steps`] on `inner`.
async fn library_error_beside_a_dropped_start<S: Store>(inner: S) {
    let slow = SlowWrite {
        held: 0,
        ..SlowWrite::default()
    };
    let store = Arc::new(Delegating::new(inner, slow));
    let harness = Harness::over(store.clone(), RequestCounter::default(), |b| {
        b.failed_ttl(FAILED_TTL)
    });
    let effects = Arc::new(Effects::default());
    checkout_cut_off(&harness, "order-1", &effects).await;
    harness.clock.advance(Duration::from_mins(2));

    store.with.armed.store(true, Ordering::SeqCst);
    let second = checkout_with_email(&harness, "order-1", &effects).await;
    store.with.armed.store(false, Ordering::SeqCst);
    let err = idempotent_tests::idem_error(second);
    assert!(matches!(err, Error::StepValue { .. }), "{err:?}");
    assert_eq!(
        effects.runs("email"),
        0,
        "the email's start was never stored"
    );
    let record = harness.record(NAMESPACE, "order-1").await.unwrap();
    let after_second = (record.status, record.error.clone(), record.steps_report());

    harness.clock.advance(Duration::from_mins(2));
    let third = checkout_with_email(&harness, "order-1", &effects).await;
    assert_eq!(
        effects.runs("reserve"),
        1,
        "the finished reserve ran again (second call left {after_second:?}; third {third:?})"
    );
}

/// While armed, the second step write fails in the store (not a transient fault); every lapse (a
/// fenced lease end of 0) is followed by a heartbeat of the same call sent before it and landing
/// after it, which extends the lease again.
#[derive(Debug, Default)]
struct FailedWriteThenLateBeat {
    clock: OnceLock<ManualClock>,
    armed: AtomicBool,
    writes: AtomicUsize,
    beats: AtomicUsize,
}

#[async_trait::async_trait]
impl<S: Store> Override<S> for FailedWriteThenLateBeat {
    fn kind(&self) -> &'static str {
        "failed-write-then-late-beat"
    }

    async fn transition(
        &self,
        inner: &S,
        transition: &Transition<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        if matches!(transition.change, Change::SaveSteps { .. })
            && self.armed.load(Ordering::SeqCst)
            && self.writes.fetch_add(1, Ordering::SeqCst) == 1
        {
            self.armed.store(false, Ordering::SeqCst);
            return Err(StoreError::Corrupt("the step write failed".into()));
        }
        let outcome = inner.transition(transition).await?;
        if matches!(
            transition.change,
            Change::ExtendLease {
                lease_until_ms: 0,
                ..
            }
        ) {
            let now_ms = self.clock.get().expect("the clock").now_ms();
            let beat = Transition::new(
                transition.key,
                transition.token,
                Change::ExtendLease {
                    lease_until_ms: now_ms + 30_000,
                    expires_at_s: now_ms / 1000 + 86_400,
                },
            );
            if matches!(inner.transition(&beat).await?, WriteOutcome::Applied) {
                self.beats.fetch_add(1, Ordering::SeqCst);
            }
        }
        Ok(outcome)
    }
}

/// The checkout of the restart policy's tests: "reserve" then "charge".
async fn checkout(
    harness: &Harness,
    order: &str,
    effects: &Arc<Effects>,
) -> Result<(u32, String), AppError> {
    operation(harness, order, true)
        .steps()
        .run(|cx| async move {
            let (steps, ()) = cx.into_parts();
            let hold = steps
                .run("reserve", || async {
                    effects.happened("reserve");
                    Ok::<_, AppError>(17_u32)
                })
                .await?;
            let charge = steps
                .run("charge", || async {
                    effects.happened("charge");
                    Ok::<_, AppError>("ch_1".to_owned())
                })
                .await?;
            Ok((hold, charge))
        })
        .await
}

/// Under the restart policy: the charge's write fails in the store, and the body passes the error up
/// with `?`, so the claim lapses (PENDING, lease over) rather than failing. A heartbeat of the same
/// call, sent before the lapse, lands after it and extends the lease again. The key is then held
/// (the next call is told it is in progress), never restarted; once the lease ran out, the next call
/// resumes after the reserve.
#[tokio::test]
async fn a_lapse_overtaken_by_a_late_heartbeat_still_resumes() {
    let store = Arc::new(Delegating::new(
        MemoryStore::new(),
        FailedWriteThenLateBeat::default(),
    ));
    let harness = Harness::over(store.clone(), RequestCounter::default(), |b| {
        b.failed_ttl(FAILED_TTL)
    });
    store.with.clock.set(harness.clock.clone()).unwrap();
    let effects = Arc::new(Effects::default());

    store.with.armed.store(true, Ordering::SeqCst);
    let first = checkout(&harness, "order-1", &effects).await;
    let err = idempotent_tests::idem_error(first);
    assert!(matches!(err, Error::CorruptRecord { .. }), "{err:?}");
    assert_eq!(
        store.with.beats.load(Ordering::SeqCst),
        1,
        "the late beat landed"
    );
    let record = harness.record(NAMESPACE, "order-1").await.unwrap();
    assert_eq!(record.status, Status::Pending);
    assert!(record.lease_until_ms.unwrap() > harness.clock.now_ms());

    let held = checkout(&harness, "order-1", &effects).await;
    let err = idempotent_tests::idem_error(held);
    assert!(matches!(err, Error::InProgress { .. }), "{err:?}");

    harness.clock.advance(Duration::from_mins(2));
    let third = checkout(&harness, "order-1", &effects).await;
    assert_eq!(third.unwrap(), (17, "ch_1".to_owned()));
    assert_eq!((effects.runs("reserve"), effects.runs("charge")), (1, 2));
}

/// `bytes` characters that compress poorly (a 64-letter alphabet, pseudo-random from `seed`).
fn noise(bytes: usize, seed: u64) -> String {
    const LETTERS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut state = seed | 1;
    (0..bytes)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            LETTERS[usize::try_from(state % 64).unwrap()] as char
        })
        .collect()
}

/// Three scans run side by side from clones of the call's `Steps`, each with a value of `bytes`.
async fn scans(
    harness: &Harness,
    order: &str,
    effects: &Arc<Effects>,
    bytes: usize,
) -> Result<usize, AppError> {
    operation(harness, order, true)
        .steps()
        .run(|cx| async move {
            let (steps, ()) = cx.into_parts();
            let scan = |name: &'static str, seed: u64| {
                let steps = steps.clone();
                async move {
                    steps
                        .run(name, || async {
                            effects.happened(name);
                            tokio::task::yield_now().await;
                            Ok::<_, AppError>(noise(bytes, seed))
                        })
                        .await
                }
            };
            let (a, b, c) = tokio::join!(scan("front", 1), scan("back", 2), scan("side", 3));
            Ok(a?.len() + b?.len() + c?.len())
        })
        .await
}

/// Under the restart policy: three steps run side by side, each with a value of 45% of the record's
/// room for steps (less, compressed). Those that finish first are stored; the last does not fit, and
/// must still be recorded as finished without a value (the room for its mark was kept while the
/// others were stored), so that no call runs any of the three again: the record is FAILED (the body
/// passed `StepTooLarge` up), pinned, and the next calls stop at the unstored step.
#[tokio::test]
async fn side_by_side_steps_too_large_are_each_recorded_and_never_run_again() {
    let harness = Harness::with(idempotent_tests::Backend::Memory, |b| {
        b.failed_ttl(FAILED_TTL)
    })
    .await;
    let key = idempotent_runtime::derive_key(NAMESPACE, "order-1").unwrap();
    let budget = harness.store.steps_budget(&key, None);
    let effects = Arc::new(Effects::default());

    let first = scans(&harness, "order-1", &effects, budget * 45 / 100).await;
    let err = idempotent_tests::idem_error(first);
    assert!(matches!(err, Error::StepTooLarge { .. }), "{err:?}");
    let record = harness.record(NAMESPACE, "order-1").await.unwrap();
    let report = record.steps_report().unwrap().unwrap();
    assert_eq!(
        report.finished.len() + report.not_stored.len(),
        3,
        "{report:?}"
    );
    assert!(!report.not_stored.is_empty(), "{report:?}");

    for _ in 0..2 {
        harness.clock.advance(Duration::from_mins(2));
        let again = scans(&harness, "order-1", &effects, 10).await;
        let err = idempotent_tests::idem_error(again);
        assert!(matches!(err, Error::StepNotStored { .. }), "{err:?}");
    }
    assert_eq!(
        (
            effects.runs("front"),
            effects.runs("back"),
            effects.runs("side")
        ),
        (1, 1, 1)
    );
}

/// A checkout is cut off after its reserve; the clock is then set to the last instant at which its
/// record, expired by the unmargined clock, still lives by the clock less the skew margin (1 s),
/// which is what the stores' conditions read. Code without steps is refused there (`StepsHeld`) and
/// its body never runs, the record left as it was; a call with steps resumes it at the same instant
/// (the reserve does not run again).
#[tokio::test]
async fn code_without_steps_is_refused_at_the_expiry_boundary() {
    steps_held_at_the_expiry_boundary(idempotent_tests::Backend::Memory).await;
}

/// [`code_without_steps_is_refused_at_the_expiry_boundary`] on DynamoDB Local.
#[tokio::test]
async fn code_without_steps_is_refused_at_the_expiry_boundary_on_dynamodb() {
    steps_held_at_the_expiry_boundary(idempotent_tests::Backend::DynamoDb).await;
}

/// The sequence of [`code_without_steps_is_refused_at_the_expiry_boundary`] on `backend`.
async fn steps_held_at_the_expiry_boundary(backend: idempotent_tests::Backend) {
    let harness = Harness::with(backend, |b| b.failed_ttl(FAILED_TTL)).await;
    let effects = Arc::new(Effects::default());
    checkout_cut_off(&harness, "order-1", &effects).await;
    let before = harness.record(NAMESPACE, "order-1").await.unwrap();
    let expires_ms = before.expires_at_s * 1000;
    harness.clock.set(expires_ms + 1_999);

    let ran = AtomicBool::new(false);
    let plain = operation(&harness, "order-1", false)
        .run(|_| async {
            ran.store(true, Ordering::SeqCst);
            Ok::<_, AppError>(1_u32)
        })
        .await;
    let err = idempotent_tests::idem_error(plain);
    assert!(matches!(err, Error::StepsHeld { .. }), "{err:?}");
    assert!(!ran.load(Ordering::SeqCst), "the body without steps ran");
    assert_eq!(harness.record(NAMESPACE, "order-1").await.unwrap(), before);

    let resumed = checkout(&harness, "order-1", &effects).await;
    assert_eq!(resumed.unwrap(), (17, "ch_1".to_owned()));
    assert_eq!((effects.runs("reserve"), effects.runs("charge")), (1, 1));
}

/// Under the restart policy: the charge's write fails in the store; the body catches that error and
/// then panics. The failure is a panic (recorded FAILED `panicked: ..`, not a lapse), after which the
/// operation resumes rather than starting over: the next call replays the reserve and runs only the
/// charge (whose write had failed) again.
#[tokio::test]
async fn a_panic_after_a_failed_step_write_resumes_under_the_restart_policy() {
    let store = Arc::new(Delegating::new(
        MemoryStore::new(),
        FailedWriteThenLateBeat::default(),
    ));
    let harness = Harness::over(store.clone(), RequestCounter::default(), |b| {
        b.failed_ttl(FAILED_TTL)
    });
    store.with.clock.set(harness.clock.clone()).unwrap();
    let effects = Arc::new(Effects::default());

    store.with.armed.store(true, Ordering::SeqCst);
    let body_effects = effects.clone();
    let first = tokio::spawn({
        let harness = harness.clone();
        async move {
            operation(&harness, "order-1", true)
                .steps()
                .run(|cx| async move {
                    let (steps, ()) = cx.into_parts();
                    steps
                        .run("reserve", || async {
                            body_effects.happened("reserve");
                            Ok::<_, AppError>(17_u32)
                        })
                        .await?;
                    let charged = steps
                        .run("charge", || async {
                            body_effects.happened("charge");
                            Ok::<_, AppError>("ch_1".to_owned())
                        })
                        .await;
                    assert!(charged.is_ok(), "the charge could not be stored");
                    Ok::<_, AppError>(0_u32)
                })
                .await
        }
    })
    .await;
    assert!(first.unwrap_err().is_panic());
    let record = harness.record(NAMESPACE, "order-1").await.unwrap();
    assert_eq!(record.status, Status::Failed);
    assert!(
        record.error.as_deref().unwrap().starts_with("panicked: "),
        "{record:?}"
    );
    assert_eq!(store.with.beats.load(Ordering::SeqCst), 0, "no lapse");

    let second = checkout(&harness, "order-1", &effects).await;
    assert_eq!(second.unwrap(), (17, "ch_1".to_owned()));
    assert_eq!((effects.runs("reserve"), effects.runs("charge")), (1, 2));
}

/// A check on an inventory item, staged for the completion's transaction.
fn in_stock() -> ConditionCheck {
    ConditionCheck::builder()
        .table_name("inventory")
        .key("sku", AttributeValue::S("apple".into()))
        .condition_expression("available > :zero")
        .expression_attribute_values(":zero", AttributeValue::N("0".into()))
        .build()
        .expect("a condition check")
}

/// Under the restart policy, with `.steps().transact()` on a store without transactions: a "reserve"
/// step is stored; the body then gives an at-most-once email 300 ms (`select!`), and moves on
/// without it while its start write is on its way (that write never reaches the store); it stages a
/// check and returns `Ok`. The completion fails (`Unsupported`): no failure of the body's, so the
/// claim must lapse. The call judged from its own view of the steps (the email started, so pinned:
/// no lapse) and recorded FAILED, while the record holds no mark: the next call starts over and runs
/// the finished reserve again.
#[tokio::test]
async fn a_failed_completion_beside_a_dropped_start_does_not_restart_the_steps() {
    let slow = SlowWrite {
        held: 1,
        ..SlowWrite::default()
    };
    let store = Arc::new(Delegating::new(MemoryStore::new(), slow));
    let harness = Harness::over(store.clone(), RequestCounter::default(), |b| {
        b.failed_ttl(FAILED_TTL)
    });
    let effects = Arc::new(Effects::default());
    let call = || {
        let effects = effects.clone();
        operation(&harness, "order-1", true)
            .steps()
            .transact()
            .run(move |cx| async move {
                let (steps, tx) = cx.into_parts();
                steps
                    .run("reserve", || async {
                        effects.happened("reserve");
                        Ok::<_, AppError>(17_u32)
                    })
                    .await?;
                let email = steps.run_at_most_once("email", || async {
                    effects.happened("email");
                    Ok::<_, AppError>(())
                });
                tokio::select! {
                    sent = email => sent?,
                    () = tokio::time::sleep(Duration::from_millis(300)) => {}
                }
                tx.condition_check(in_stock());
                Ok::<_, AppError>(1_u32)
            })
    };

    store.with.armed.store(true, Ordering::SeqCst);
    let first = call().await;
    store.with.armed.store(false, Ordering::SeqCst);
    let err = idempotent_tests::idem_error(first);
    assert!(matches!(err, Error::Unsupported { .. }), "{err:?}");
    assert_eq!(
        effects.runs("email"),
        0,
        "the email's start was never stored"
    );
    let record = harness.record(NAMESPACE, "order-1").await.unwrap();
    let after_first = (record.status, record.error.clone(), record.steps_report());

    harness.clock.advance(Duration::from_mins(2));
    let second = call().await;
    assert_eq!(
        effects.runs("reserve"),
        1,
        "the finished reserve ran again (first call left {after_first:?}; second {second:?})"
    );
}

/// A deploy adds the restart policy to an operation: a call of the old deploy (no restart policy)
/// resumes a checkout cut off after its reserve, and its caller gives up while its resuming claim is
/// on its way, so the claim is released (FAILED `released: ..`), as the old policy allows. A call of
/// the new deploy then finds a FAILED record and starts the operation over: a release is no failure
/// of the body's, and the finished reserve runs again.
#[tokio::test]
async fn a_release_by_a_call_without_the_restart_policy_does_not_restart_the_steps() {
    let slow = Arc::new(idempotent_tests::SlowResume::new(Arc::new(
        MemoryStore::new(),
    )));
    let harness = Harness::over(slow.clone(), RequestCounter::default(), |b| {
        b.failed_ttl(FAILED_TTL)
    });
    let effects = Arc::new(Effects::default());
    checkout_cut_off(&harness, "order-1", &effects).await;
    harness.clock.advance(Duration::from_mins(2));

    slow.hold(true);
    let old_effects = effects.clone();
    let old_deploy = operation(&harness, "order-1", false)
        .steps()
        .run(|cx| async move {
            let (steps, ()) = cx.into_parts();
            steps
                .run("reserve", || async {
                    old_effects.happened("reserve");
                    Ok::<_, AppError>(17_u32)
                })
                .await
        });
    tokio::select! {
        _ = old_deploy => panic!("its claim is slow"),
        () = slow.landed() => {}
    }
    slow.hold(false);
    let _ = harness.idem.drain(Duration::from_secs(5)).await;
    let record = harness.record(NAMESPACE, "order-1").await.unwrap();
    let after_release = (record.status, record.error.clone());

    let third = checkout(&harness, "order-1", &effects).await;
    assert_eq!(
        effects.runs("reserve"),
        1,
        "the finished reserve ran again (the release left {after_release:?}; third call {third:?})"
    );
}
